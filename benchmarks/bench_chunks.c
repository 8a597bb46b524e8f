/*
 * Chunk size against compression and cold selection cost, for choosing
 * `ivserve pack`'s default --chunk-bytes (benchmarks/bench_pack.sh runs
 * it on the same atlas packed with each chunk size).
 *
 *   bench_chunks FILE.h5ad... [--threads T] [--reps R] [--seed S]
 *
 * For each file: packed_indices' chunk length, number of chunks, stream
 * and stored bytes (their ratio), then cold selections of cells with all
 * genes: 1% and 0.1% random cells (random order), and a 1% contiguous run
 * of cells (a sample: the generator stores cells sample by sample).  Cold
 * = the engine's decompressed-chunk cache dropped before each run (the OS
 * page cache stays warm: dropping it needs root).  Each time is the best
 * of R runs, next to the bytes the query decompressed; the same cell sets
 * are used for every file, so rows compare chunk sizes only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset.h"
#include "pool.h"
#include "query.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

struct job {
    iv_query_t *q;
    int rc;
};

static void decode_one(void *arg, size_t i)
{
    struct job *j = arg;
    iv_block_t b;
    iv_err_t e = {0};
    memset(&b, 0, sizeof b);
    if (iv_query_decode_block(j->q, (int64_t)i, &b, &e) < 0) j->rc = -1;
    iv_block_free(&b);
}

/* One cold run: returns seconds, sets *dec to the bytes decompressed. */
static double run_cold(iv_dataset_t *ds, iv_pool_t *pool, const iv_sel_t *obs, uint64_t *dec)
{
    iv_sel_t all = {.all = 1};
    iv_query_opts_t qo = {0};
    iv_err_t err = {0};
    iv_query_t *q = NULL;
    iv_dataset_cache_drop(ds);
    double t0 = now_s();
    if (iv_query_new(ds, obs, &all, &qo, &q, &err) < 0 || iv_query_prepare(q, pool, &err) < 0) {
        fprintf(stderr, "bench_chunks: %s\n", err.msg);
        exit(1);
    }
    struct job j = {q, 0};
    iv_pool_parallel_for(pool, (size_t)iv_query_n_blocks(q), 0, decode_one, &j);
    double t = now_s() - t0;
    if (j.rc < 0) {
        fprintf(stderr, "bench_chunks: decode failed\n");
        exit(1);
    }
    *dec = iv_query_bytes_decompressed(q);
    iv_query_free(q);
    return t;
}

int main(int argc, char **argv)
{
    unsigned threads = 2;
    int reps = 5;
    const char *files[32];
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state ^= strtoull(argv[++i], NULL, 10);
        else if (n_files < 32) files[n_files++] = argv[i];
    }
    if (!n_files) {
        fprintf(stderr, "usage: bench_chunks FILE.h5ad... [--threads T] [--reps R] [--seed S]\n");
        return 2;
    }
    iv_pool_t *pool = threads > 1 ? iv_pool_create(threads - 1, 0) : NULL;
    int64_t *sel[3] = {NULL, NULL, NULL};
    int64_t n_sel[3] = {0, 0, 0};
    int64_t n_rows = -1;
    printf("%-10s %8s %12s %12s %6s | %-24s | %-24s | %-24s\n", "chunk", "chunks", "stream B",
           "stored B", "ratio", "1% random: ms, MB dec", "0.1% random: ms, MB dec",
           "1% clustered: ms, MB dec");
    for (int f = 0; f < n_files; f++) {
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        o.pool = pool;
        iv_dataset_t *ds;
        iv_err_t err = {0};
        if (iv_dataset_open(files[f], &o, &ds, &err) < 0) {
            fprintf(stderr, "bench_chunks: %s\n", err.msg);
            return 1;
        }
        const iv_dataset_info_t *in = iv_dataset_info(ds);
        if (n_rows < 0) {
            n_rows = in->n_rows;
            /* The same cell sets for every file. */
            int64_t pct = n_rows / 100 ? n_rows / 100 : 1, permil = n_rows / 1000 ? n_rows / 1000 : 1;
            n_sel[0] = pct;
            n_sel[1] = permil;
            n_sel[2] = pct;
            for (int k = 0; k < 3; k++) sel[k] = malloc((size_t)n_sel[k] * sizeof(int64_t));
            for (int64_t i = 0; i < pct; i++) sel[0][i] = (int64_t)(rng_next() % (uint64_t)n_rows);
            for (int64_t i = 0; i < permil; i++) sel[1][i] = (int64_t)(rng_next() % (uint64_t)n_rows);
            int64_t start = (int64_t)(rng_next() % (uint64_t)(n_rows - pct + 1));
            for (int64_t i = 0; i < pct; i++) sel[2][i] = start + i;
        } else if (in->n_rows != n_rows) {
            fprintf(stderr, "bench_chunks: %s has %" PRId64 " rows, not %" PRId64 "\n", files[f],
                    in->n_rows, n_rows);
            return 1;
        }
        char cols[3][64];
        for (int k = 0; k < 3; k++) {
            iv_sel_t s = {.all = 0, .n = n_sel[k], .idx = sel[k]};
            double best = 1e30;
            uint64_t dec = 0;
            for (int r = 0; r < reps; r++) {
                double t = run_cold(ds, pool, &s, &dec);
                if (t < best) best = t;
            }
            snprintf(cols[k], sizeof cols[k], "%8.2f ms %8.1f MB", best * 1e3, (double)dec / 1e6);
        }
        printf("%-10" PRIu64 " %8" PRIu64 " %12" PRIu64 " %12" PRIu64 " %6.3f | %-24s | %-24s | %-24s\n",
               in->chunk_len, in->n_chunks, in->stream_bytes, in->stored_bytes,
               in->stored_bytes ? (double)in->stream_bytes / (double)in->stored_bytes : 0.0,
               cols[0], cols[1], cols[2]);
        fflush(stdout);
        iv_dataset_close(ds);
    }
    for (int k = 0; k < 3; k++) free(sel[k]);
    iv_pool_destroy(pool);
    return 0;
}
