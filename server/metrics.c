/*
 * Metrics (see metrics.h).  Latency buckets are fixed (1 ms to 60 s) so
 * the histogram is a small array and rendering needs no allocation
 * besides the output buffer.
 */
#include "metrics.h"

#include <inttypes.h>
#include <string.h>

static const double lat_bounds[IV_LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 60.0};

static const char *const route_names[IV_R_COUNT_] = {
    "healthz", "readyz", "metrics", "datasets", "dataset", "query", "count", "other",
};

static const char *const mem_part_names[IV_MEM_N] = {
    "pointers", "values", "index", "cache", "stream", "other_orientation", "scratch", "metadata", "obsm",
    "search",
};

const char *iv_mem_part_name(iv_mem_part_t p)
{
    return (unsigned)p < IV_MEM_N ? mem_part_names[p] : "other";
}

const char *iv_route_name(iv_route_t r)
{
    return (unsigned)r < IV_R_COUNT_ ? route_names[r] : "other";
}

void iv_metrics_init(iv_metrics_t *m)
{
    memset(m, 0, sizeof *m);
}

void iv_metrics_request(iv_metrics_t *m, iv_route_t r, int status, double seconds, uint64_t bytes)
{
    if ((unsigned)r >= IV_R_COUNT_) r = IV_R_OTHER;
    int cls = status / 100;
    if (cls < 1 || cls > 5) cls = 5;
    m->requests[r][cls]++;
    if (status >= 0 && status < 600) m->by_status[status]++;
    int b = 0;
    while (b < IV_LAT_BUCKETS && seconds > lat_bounds[b]) b++;
    m->lat_bucket[b]++;
    m->lat_sum += seconds;
    m->lat_count++;
    m->bytes_sent += bytes;
}

void iv_metrics_add(iv_metrics_t *dst, const iv_metrics_t *src)
{
    for (int r = 0; r < IV_R_COUNT_; r++)
        for (int k = 0; k < 6; k++) dst->requests[r][k] += src->requests[r][k];
    for (int k = 0; k < 600; k++) dst->by_status[k] += src->by_status[k];
    for (int k = 0; k <= IV_LAT_BUCKETS; k++) dst->lat_bucket[k] += src->lat_bucket[k];
    dst->lat_sum += src->lat_sum;
    dst->lat_count += src->lat_count;
    dst->bytes_sent += src->bytes_sent;
    dst->decode_seconds += src->decode_seconds;
    dst->blocks_decoded += src->blocks_decoded;
    dst->overloaded += src->overloaded;
    dst->connections_total += src->connections_total;
    dst->jobs_cancelled += src->jobs_cancelled;
    dst->compute_timeouts += src->compute_timeouts;
    dst->budget_cuts += src->budget_cuts;
}

/* Requests by route and status class, and responses by code. */
static void render_requests(const iv_metrics_t *m, iv_buf_t *o)
{
    iv_buf_puts(o, "# HELP ivserve_requests_total Requests answered, by route and status class.\n"
                   "# TYPE ivserve_requests_total counter\n");
    for (int r = 0; r < IV_R_COUNT_; r++)
        for (int c = 1; c <= 5; c++)
            if (m->requests[r][c])
                iv_buf_printf(o, "ivserve_requests_total{route=\"%s\",status=\"%dxx\"} %" PRIu64 "\n",
                              route_names[r], c, m->requests[r][c]);
    iv_buf_puts(o, "# HELP ivserve_responses_total Responses by exact status code.\n"
                   "# TYPE ivserve_responses_total counter\n");
    for (int s = 0; s < 600; s++)
        if (m->by_status[s])
            iv_buf_printf(o, "ivserve_responses_total{code=\"%d\"} %" PRIu64 "\n", s, m->by_status[s]);
}

/* The latency histogram and the other counters. */
static void render_counters(const iv_metrics_t *m, iv_buf_t *o)
{
    iv_buf_puts(o, "# HELP ivserve_request_seconds Request latency, first byte parsed to last byte queued.\n"
                   "# TYPE ivserve_request_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < IV_LAT_BUCKETS; b++) {
        cum += m->lat_bucket[b];
        iv_buf_printf(o, "ivserve_request_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", lat_bounds[b], cum);
    }
    cum += m->lat_bucket[IV_LAT_BUCKETS];
    iv_buf_printf(o, "ivserve_request_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
    iv_buf_printf(o, "ivserve_request_seconds_sum %.6f\nivserve_request_seconds_count %" PRIu64 "\n",
                  m->lat_sum, m->lat_count);
    iv_buf_printf(o,
                  "# TYPE ivserve_bytes_sent_total counter\nivserve_bytes_sent_total %" PRIu64 "\n"
                  "# TYPE ivserve_decode_seconds_total counter\nivserve_decode_seconds_total %.6f\n"
                  "# TYPE ivserve_blocks_decoded_total counter\nivserve_blocks_decoded_total %" PRIu64 "\n"
                  "# TYPE ivserve_overloaded_total counter\nivserve_overloaded_total %" PRIu64 "\n"
                  "# TYPE ivserve_connections_total counter\nivserve_connections_total %" PRIu64 "\n",
                  m->bytes_sent, m->decode_seconds, m->blocks_decoded, m->overloaded,
                  m->connections_total);
    iv_buf_printf(o,
                  "# TYPE ivserve_jobs_cancelled_total counter\nivserve_jobs_cancelled_total %" PRIu64 "\n"
                  "# TYPE ivserve_compute_timeouts_total counter\nivserve_compute_timeouts_total %" PRIu64 "\n"
                  "# TYPE ivserve_write_budget_cuts_total counter\nivserve_write_budget_cuts_total %" PRIu64 "\n",
                  m->jobs_cancelled, m->compute_timeouts, m->budget_cuts);
}

/* The gauges of the moment: queue, connections, caches, datasets. */
static void render_gauges(const iv_metrics_gauges_t *g, iv_buf_t *o)
{
    double hr = g->cache_hits + g->cache_misses
                    ? (double)g->cache_hits / (double)(g->cache_hits + g->cache_misses)
                    : 0.0;
    iv_buf_printf(o,
                  "# TYPE ivserve_queue_depth gauge\nivserve_queue_depth %zu\n"
                  "# TYPE ivserve_open_connections gauge\nivserve_open_connections %zu\n"
                  "# TYPE ivserve_active_streams gauge\nivserve_active_streams %zu\n"
                  "# TYPE ivserve_queued_write_bytes gauge\nivserve_queued_write_bytes %zu\n"
                  "# TYPE ivserve_cache_bytes gauge\nivserve_cache_bytes %zu\n"
                  "# TYPE ivserve_cache_hit_ratio gauge\nivserve_cache_hit_ratio %.6f\n"
                  "# TYPE ivserve_datasets gauge\nivserve_datasets{state=\"ready\"} %zu\n"
                  "ivserve_datasets{state=\"failed\"} %zu\nivserve_datasets{state=\"loading\"} %zu\n",
                  g->queue_depth, g->open_connections, g->active_streams, g->queued_write_bytes,
                  g->cache_bytes, hr,
                  g->datasets_ready, g->datasets_failed, g->datasets_loading);
    iv_buf_printf(o, "# HELP ivserve_cache_budget_bytes The decompressed-chunk cache budget of the process.\n"
                     "# TYPE ivserve_cache_budget_bytes gauge\nivserve_cache_budget_bytes %zu\n",
                  g->cache_budget);
}

/* Memory: the budget's parts, the process, each dataset's. */
static void render_memory(const iv_metrics_gauges_t *g, iv_buf_t *o)
{
    if (g->n_mem_parts) {
        iv_buf_puts(o, "# HELP ivserve_memory_budget_bytes The process's memory budget (memory_bytes) "
                       "and each part's share of it.\n# TYPE ivserve_memory_budget_bytes gauge\n");
        for (size_t i = 0; i < g->n_mem_parts; i++)
            iv_buf_printf(o, "ivserve_memory_budget_bytes{part=\"%s\"} %" PRIu64 "\n",
                          g->mem_parts[i].name, g->mem_parts[i].budget);
        iv_buf_puts(o, "# HELP ivserve_memory_used_bytes What each part of the memory budget holds "
                       "now.\n# TYPE ivserve_memory_used_bytes gauge\n");
        for (size_t i = 0; i < g->n_mem_parts; i++)
            iv_buf_printf(o, "ivserve_memory_used_bytes{part=\"%s\"} %" PRIu64 "\n",
                          g->mem_parts[i].name, g->mem_parts[i].used);
    }
    if (g->process_rss)
        iv_buf_printf(o, "# HELP ivserve_process_resident_bytes Resident memory of the process: all, anonymous, "
                         "and freed lazily (the kernel takes those back when it needs them).\n"
                         "# TYPE ivserve_process_resident_bytes gauge\n"
                         "ivserve_process_resident_bytes{kind=\"all\"} %" PRIu64 "\n"
                         "ivserve_process_resident_bytes{kind=\"anonymous\"} %" PRIu64 "\n"
                         "ivserve_process_resident_bytes{kind=\"lazy_free\"} %" PRIu64 "\n",
                      g->process_rss, g->process_anon, g->process_lazyfree);
    iv_buf_puts(o, "# HELP ivserve_dataset_memory_bytes Memory a ready dataset holds, by part.\n"
                   "# TYPE ivserve_dataset_memory_bytes gauge\n");
    /* Dataset ids are [A-Za-z0-9._-]+ (config.h): nothing to escape in a label. */
    for (size_t i = 0; i < g->n_ds_mem; i++)
        for (int p = 0; p < IV_MEM_N; p++)
            iv_buf_printf(o, "ivserve_dataset_memory_bytes{dataset=\"%s\",part=\"%s\"} %zu\n",
                          g->ds_mem[i].id, mem_part_names[p], g->ds_mem[i].part[p]);
    iv_buf_puts(o, "# HELP ivserve_cache_budget_evictions_total Chunks evicted to keep the process within its cache budget, by dataset.\n"
                   "# TYPE ivserve_cache_budget_evictions_total counter\n");
    for (size_t i = 0; i < g->n_ds_mem; i++)
        iv_buf_printf(o, "ivserve_cache_budget_evictions_total{dataset=\"%s\"} %" PRIu64 "\n",
                      g->ds_mem[i].id, g->ds_mem[i].budget_evictions);
    iv_buf_puts(o, "# HELP ivserve_dataset_zarr_kept_bytes X's Zarr chunks served from the cache folder, by "
                   "orientation (0: decoded on request).\n# TYPE ivserve_dataset_zarr_kept_bytes gauge\n");
    for (size_t i = 0; i < g->n_ds_mem; i++)
        for (int csr = 1; csr >= 0; csr--)
            iv_buf_printf(o, "ivserve_dataset_zarr_kept_bytes{dataset=\"%s\",orientation=\"%s\"} %" PRIu64 "\n",
                          g->ds_mem[i].id, csr ? "csr" : "csc", g->ds_mem[i].zarr_kept[csr]);
}

void iv_metrics_render(const iv_metrics_t *m, const iv_metrics_gauges_t *g, iv_buf_t *o)
{
    render_requests(m, o);
    render_counters(m, o);
    render_gauges(g, o);
    render_memory(g, o);
}
