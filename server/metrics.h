/*
 * Request metrics and their Prometheus text rendering.
 *
 * Counters are plain integers updated on the loop thread only (request
 * completions, job completions handed back to the loop), so no atomics
 * or locks are needed; gauges that live elsewhere (pool queue, caches,
 * connections) are passed in when rendering.
 */
#ifndef IV_METRICS_H
#define IV_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

typedef enum iv_route {
    IV_R_HEALTHZ, IV_R_READYZ, IV_R_METRICS, IV_R_DATASETS, IV_R_DATASET, IV_R_QUERY, IV_R_COUNT,
    IV_R_OTHER, IV_R_COUNT_
} iv_route_t;

const char *iv_route_name(iv_route_t r);

#define IV_LAT_BUCKETS 14

typedef struct iv_metrics {
    uint64_t requests[IV_R_COUNT_][6];   /* by route and status class 1xx..5xx (index 1..5) */
    uint64_t by_status[600];
    uint64_t lat_bucket[IV_LAT_BUCKETS + 1];
    double lat_sum;
    uint64_t lat_count;
    uint64_t bytes_sent;
    double decode_seconds;
    uint64_t blocks_decoded;
    uint64_t overloaded;
    uint64_t connections_total;
    uint64_t jobs_cancelled;     /* jobs that stopped early: their client left or the server stops */
    uint64_t compute_timeouts;   /* answers cut by limits.compute_timeout_ms */
    uint64_t budget_cuts;        /* slow readers cut to keep the write budget */
} iv_metrics_t;

/* The parts of a dataset's resident memory, as the dataset document and
 * /metrics name them (see iv_dataset_memory for the matrix's parts). */
typedef enum iv_mem_part {
    IV_MEM_POINTERS, IV_MEM_VALUES, IV_MEM_INDEX, IV_MEM_CACHE, IV_MEM_STREAM, IV_MEM_OTHER,
    IV_MEM_SCRATCH, IV_MEM_METADATA, IV_MEM_OBSM, IV_MEM_SEARCH, IV_MEM_N
} iv_mem_part_t;

const char *iv_mem_part_name(iv_mem_part_t p);

typedef struct iv_metrics_ds_mem {
    const char *id;
    size_t part[IV_MEM_N];
    uint64_t budget_evictions;    /* its chunks taken for other datasets or itself by the shared budget */
    uint64_t zarr_kept[2];        /* bytes of X's Zarr chunks served from the cache folder ([1] csr,
                                   * [0] csc; 0: none, or dropped after a failed check) */
} iv_metrics_ds_mem_t;

typedef struct iv_metrics_mem_part {
    const char *name;
    uint64_t budget, used;
} iv_metrics_mem_part_t;

typedef struct iv_metrics_gauges {
    size_t queue_depth;
    size_t open_connections;
    size_t active_streams;
    size_t queued_write_bytes;   /* bytes waiting to be written, all connections */
    size_t cache_bytes;
    uint64_t cache_hits, cache_misses;
    size_t datasets_ready, datasets_failed, datasets_loading;
    size_t cache_budget;          /* the process-wide cache budget */
    uint64_t process_rss, process_anon;   /* 0 = unknown */
    uint64_t process_lazyfree;            /* of those, freed lazily (MADV_FREE) */
    /* The memory budget's parts (server.c start_memory): budget and use. */
    iv_metrics_mem_part_t mem_parts[6];
    size_t n_mem_parts;
    const iv_metrics_ds_mem_t *ds_mem;    /* per ready dataset */
    size_t n_ds_mem;
} iv_metrics_gauges_t;

void iv_metrics_init(iv_metrics_t *m);
void iv_metrics_request(iv_metrics_t *m, iv_route_t r, int status, double seconds, uint64_t bytes);
/* dst += src, counter by counter (the loops' metrics summed). */
void iv_metrics_add(iv_metrics_t *dst, const iv_metrics_t *src);
void iv_metrics_render(const iv_metrics_t *m, const iv_metrics_gauges_t *g, iv_buf_t *out);

#endif
