/*
 * Metadata benchmark: start-up (iv_meta_load) time and memory, and
 * microseconds per filter evaluation on a large obs, for `in` with 1, 100
 * and 10,000 labels, numeric ranges, and a four-term combination; then,
 * given a matrix file, the time of a query decoding 1% of 1.26 million
 * cells' worth of rows, so the filter's share of such a query can be
 * stated.
 *
 * Not built by CMake.  Build from the repository root (after building the
 * libraries in build-meta):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore -Iproto benchmarks/bench_meta.c \
 *      build-meta/libivcore.a $(pkg-config --cflags --libs hdf5) \
 *      -lzstd -llz4 -lz -lpthread -lm -o bench_meta
 * Data: /usr/bin/python3 benchmarks/bench_meta_gen.py -o META.h5ad
 * Run:  ./bench_meta META.h5ad [ATLAS.h5ad [CELLS]]
 *   ATLAS: an IVCSR file (benchmarks/gen_atlas.py); CELLS (default 12600)
 *   consecutive-by-stride cells are decoded, single-threaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset.h"
#include "filter.h"
#include "meta.h"
#include "query.h"
#include "where.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median microseconds of evaluating e over obs; prints the row. */
static double bench(iv_meta_t *m, const char *label, iv_expr_t *e)
{
    iv_err_t err = {0};
    iv_fprog_t *p = NULL;
    double t0 = now();
    if (iv_filter_compile(m, IV_AXIS_OBS, e, &p, &err) < 0) {
        fprintf(stderr, "%s: %s\n", label, err.msg);
        exit(1);
    }
    double tc = (now() - t0) * 1e6;
    iv_bitmap_t b;
    iv_bitmap_init(&b, iv_filter_n_rows(p));
    double runs[15];
    for (int r = 0; r < 15; r++) {
        t0 = now();
        iv_filter_eval(p, &b, &err);
        runs[r] = (now() - t0) * 1e6;
    }
    qsort(runs, 15, sizeof(double), cmpd);
    printf("| %-34s | %9lld | %10.0f | %10.0f |\n", label, (long long)iv_bitmap_count(&b),
           tc, runs[7]);
    iv_bitmap_free(&b);
    iv_filter_free(p);
    return runs[7];
}

static iv_expr_t *where(const char *s)
{
    iv_err_t err = {0};
    iv_expr_t *e = NULL;
    if (iv_where_parse(s, strlen(s), &e, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return e;
}

static iv_expr_t *in_labels(const iv_meta_t *m, const char *col, int n)
{
    const iv_meta_col_t *c = iv_meta_find_col(m, IV_AXIS_OBS, col);
    iv_expr_t *e = iv_expr_new(IV_EXPR_IN, col);
    for (int i = 0; i < n && i < c->n_cats; i++) {
        iv_lit_t l = {.kind = IV_LIT_STR, .str = (char *)iv_meta_col_cat(c, (i * 7) % c->n_cats)};
        iv_expr_add_lit(e, &l);
    }
    return e;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s META.h5ad [ATLAS.h5ad [CELLS]]\n", argv[0]);
        return 2;
    }
    iv_err_t err = {0};
    iv_meta_t *m = NULL;
    if (iv_meta_load(argv[1], NULL, &m, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    iv_meta_stats_t st;
    iv_meta_stats(m, &st);
    printf("obs rows %lld, obs columns %zu; load %.3f s; metadata memory %.1f MiB\n\n",
           (long long)iv_meta_n_rows(m, IV_AXIS_OBS), iv_meta_n_cols(m, IV_AXIS_OBS),
           st.load_seconds, (double)st.bytes / 1048576.0);
    printf("| %-34s | %9s | %10s | %10s |\n", "filter", "matches", "compile us", "eval us");
    printf("|------------------------------------|-----------|------------|------------|\n");
    double t[8];
    iv_expr_t *e;
    t[0] = bench(m, "in, 1 label (clone)", e = in_labels(m, "clone", 1)), iv_expr_free(e);
    t[1] = bench(m, "in, 100 labels (clone)", e = in_labels(m, "clone", 100)), iv_expr_free(e);
    t[2] = bench(m, "in, 10,000 labels (clone)", e = in_labels(m, "clone", 10000)),
    iv_expr_free(e);
    t[3] = bench(m, "int range 1900 <= x < 2100", e = where("total_counts >= 1900 and "
                                                               "total_counts < 2100")),
    iv_expr_free(e);
    t[4] = bench(m, "float range (NaN present)", e = where("pct_counts_mt < 5")), iv_expr_free(e);
    t[5] = bench(m, "string in (2 labels)", e = where("barcode_suffix in ['-1', '-3']")),
    iv_expr_free(e);
    t[6] = bench(m, "four-term combination",
                 e = where("cell_type in ['type1', 'type2', 'type3'] and total_counts >= 500 "
                           "and pct_counts_mt < 10 and not is_doublet")),
    iv_expr_free(e);
    if (argc >= 3) {
        int64_t want = argc >= 4 ? atoll(argv[3]) : 12600;
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        iv_dataset_t *ds = NULL;
        if (iv_dataset_open(argv[2], &o, &ds, &err) < 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int64_t nr = iv_dataset_info(ds)->n_rows;
        if (want > nr) want = nr;
        int64_t *idx = malloc((size_t)want * sizeof(int64_t));
        for (int64_t i = 0; i < want; i++) idx[i] = i * (nr / want);
        iv_sel_t obs = {0, want, idx}, var = {1, 0, NULL};
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            iv_query_t *q = NULL;
            if (iv_query_new(ds, &obs, &var, NULL, &q, &err) < 0 ||
                iv_query_prepare(q, NULL, &err) < 0) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            for (int64_t k = 0; k < iv_query_n_blocks(q); k++) {
                iv_block_t blk;
                if (iv_query_decode_block(q, k, &blk, &err) < 0) {
                    fprintf(stderr, "%s\n", err.msg);
                    return 1;
                }
                iv_block_free(&blk);
            }
            iv_query_free(q);
            double dt = (now() - t0) * 1e6;
            if (dt < best) best = dt;
        }
        printf("\nquery decoding %lld cells (all genes, 1 thread, warm): %.0f us\n",
               (long long)want, best);
        printf("filter share of filter + that query: in-1 %.1f%%, in-10000 %.1f%%, "
               "range %.1f%%, four-term %.1f%%\n", 100 * t[0] / (t[0] + best),
               100 * t[2] / (t[2] + best), 100 * t[3] / (t[3] + best),
               100 * t[6] / (t[6] + best));
        free(idx);
        iv_dataset_close(ds);
    }
    iv_meta_free(m);
    return 0;
}
