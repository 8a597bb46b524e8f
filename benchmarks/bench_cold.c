/*
 * Cold selections, on one thread, in CPU seconds: the cost of reading
 * stored chunks from the file.  Each query is a fresh random set of
 * cells, all genes, decoded block by block after the cache was dropped,
 * so every chunk it touches is read from the file (the OS page cache
 * still holds it) and decompressed.  One thread and CPU time make the
 * number steady on a shared machine, where the wall clock is not.
 *
 * Built against two trees' libivcore.a it compares two commits' read
 * paths (e.g. chunks read through a mapping against chunks read with
 * pread and checked, filecheck.h); printed names carry the label.
 *
 * Not built by CMake.  Build from a repository root (after building its
 * libraries in BUILD):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore benchmarks/bench_cold.c \
 *      BUILD/libivcore.a $(pkg-config --cflags --libs hdf5) \
 *      -lzstd -llz4 -lz -lpthread -lm -o bench_cold
 * Run:  ./bench_cold LABEL ATLAS.h5ad [QUERIES [CELLS [ROUNDS]]]
 * (defaults 20 queries of 200 cells, 5 rounds; prints the best and the
 * median round, per query).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "dataset.h"
#include "query.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void)
{
    struct rusage a;
    getrusage(RUSAGE_SELF, &a);
    return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec) +
           (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec) * 1e-6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return bench_rnd(&rng); }

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s LABEL ATLAS.h5ad [QUERIES [CELLS [ROUNDS]]]\n", argv[0]);
        return 2;
    }
    const char *label = argv[1], *path = argv[2];
    int nq = argc > 3 ? atoi(argv[3]) : 20, cells = argc > 4 ? atoi(argv[4]) : 200;
    int rounds = argc > 5 ? atoi(argv[5]) : 5;
    if (nq < 1 || cells < 1 || rounds < 1) return 2;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    iv_dataset_t *ds = NULL;
    if (iv_dataset_open(path, &o, &ds, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int64_t n_rows = iv_dataset_info(ds)->n_rows;
    int64_t *idx = malloc((size_t)cells * sizeof *idx);
    double *c_round = calloc((size_t)rounds, sizeof *c_round);
    double *w_round = calloc((size_t)rounds, sizeof *w_round);
    if (!idx || !c_round || !w_round) return 1;
    uint64_t bytes = 0, nnz = 0;
    for (int r = 0; r < rounds; r++) {
        rng = 0x9e3779b97f4a7c15ull;   /* the same queries every round */
        double c = 0, w = 0;
        for (int q = 0; q < nq; q++) {
            for (int i = 0; i < cells; i++) idx[i] = (int64_t)(rnd() % (uint64_t)n_rows);
            iv_sel_t obs = {.all = 0, .n = cells, .idx = idx}, var = {.all = 1};
            iv_dataset_cache_drop(ds);
            iv_cache_stats_t st0, st1;
            iv_dataset_cache_stats(ds, &st0);
            double c0 = cpu(), t0 = now();
            iv_query_t *qq = NULL;
            if (iv_query_new(ds, &obs, &var, NULL, &qq, &err) != 0 ||
                iv_query_prepare(qq, NULL, &err) != 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            for (int64_t b = 0; b < iv_query_n_blocks(qq); b++) {
                iv_block_t blk;
                if (iv_query_decode_block(qq, b, &blk, &err) != 0) {
                    fprintf(stderr, "%s\n", err.msg);
                    return 1;
                }
                if (r == 0) nnz += (uint64_t)blk.nnz;
                iv_block_free(&blk);
            }
            iv_query_free(qq);
            w += now() - t0;
            c += cpu() - c0;
            iv_dataset_cache_stats(ds, &st1);
            if (r == 0) bytes += st1.bytes_decompressed - st0.bytes_decompressed;
        }
        c_round[r] = c / nq;
        w_round[r] = w / nq;
    }
    qsort(c_round, (size_t)rounds, sizeof *c_round, cmp);
    qsort(w_round, (size_t)rounds, sizeof *w_round, cmp);
    printf("%-10s cold %d cells x all genes, 1 thread: CPU best %.2f ms median %.2f ms, "
           "wall best %.2f ms median %.2f ms per query (%d queries x %d rounds; "
           "%.1f MB decompressed, %.0f nnz per query)\n",
           label, cells, c_round[0] * 1e3, c_round[rounds / 2] * 1e3, w_round[0] * 1e3,
           w_round[rounds / 2] * 1e3, nq, rounds, (double)bytes / nq / 1e6, (double)nnz / nq);
    free(idx);
    free(c_round);
    free(w_round);
    iv_dataset_close(ds);
    return 0;
}
