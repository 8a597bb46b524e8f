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

typedef struct iv_metrics_gauges {
    size_t queue_depth;
    size_t open_connections;
    size_t active_streams;
    size_t queued_write_bytes;   /* bytes waiting to be written, all connections */
    size_t cache_bytes;
    uint64_t cache_hits, cache_misses;
    size_t datasets_ready, datasets_failed, datasets_loading;
} iv_metrics_gauges_t;

void iv_metrics_init(iv_metrics_t *m);
void iv_metrics_request(iv_metrics_t *m, iv_route_t r, int status, double seconds, uint64_t bytes);
void iv_metrics_render(const iv_metrics_t *m, const iv_metrics_gauges_t *g, iv_buf_t *out);

#endif
