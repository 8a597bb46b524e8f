/*
 * Filter cost benchmark: what one request body of up to 8 MiB (the default
 * body limit) can make a worker do in the query set-up, the part the
 * server runs before any matrix decode: parse the JSON (iv_qreq_parse_json,
 * which also parses a where string) and, for the obs filter, compile and
 * evaluate it over the file's obs (iv_filter_compile + iv_filter_select).
 *
 * Bodies, generated here so that the run needs nothing else:
 *   or_terms   {"or":[{"column":C,"eq":LABEL}, ...]} filling 8 MiB
 *   where_or   "where": "N == 0 or N == 1 or ..." filling 8 MiB
 *   in_list    {"column":N,"in":[0,1,2,...]} filling 8 MiB
 *   in_900k    the same with 900,000 values (under the list limit)
 *   or_1300    1,300 eq terms (near the cost limit on 200,000 rows)
 *   or_4000    4,000 eq terms (past it)
 * C is a categorical obs column, N an integer one (defaults: cell_type
 * and total_counts, which benchmarks/gen_atlas.py writes).  Times are CPU
 * seconds of this process, so a busy machine changes them little.  The
 * baseline printed first is the cheapest useful filter on the same table
 * (one eq term), the floor every row count pays.
 *
 * Not built by CMake.  Build from the repository root after building the
 * libraries in build/:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore -Iproto benchmarks/bench_filter_body.c \
 *      build/libivproto.a build/libivcore.a $(pkg-config --cflags --libs hdf5) \
 *      -lcjson -lzstd -llz4 -lz -lpthread -lm -o bench_filter_body
 * Data: /usr/bin/python3 benchmarks/gen_atlas.py --cells 200000 -o ATLAS.h5ad
 * Run:  ./bench_filter_body ATLAS.h5ad [CATEGORICAL_COLUMN [INT_COLUMN]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "filter.h"
#include "meta.h"
#include "request.h"

#define BODY_MAX (8u << 20)

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct body {
    char *s;
    size_t len;
    long items;
} body_t;

/* prefix, then items from fmt (with i) joined by sep while they fit in
 * max bytes (or until limit items), then suffix. */
static body_t make(const char *prefix, const char *fmt, const char *arg, const char *sep,
                   const char *suffix, size_t max, long limit)
{
    body_t b = {malloc(max + 64), 0, 0};
    if (!b.s) exit(1);
    b.len = (size_t)sprintf(b.s, "%s", prefix);
    size_t tail = strlen(suffix);
    char item[256];
    for (long i = 0; limit < 0 || i < limit; i++) {
        int n = arg ? snprintf(item, sizeof item, fmt, arg, i) : snprintf(item, sizeof item, fmt, i);
        size_t need = (i ? strlen(sep) : 0) + (size_t)n;
        if (b.len + need + tail > max) break;
        if (i) b.len += (size_t)sprintf(b.s + b.len, "%s", sep);
        memcpy(b.s + b.len, item, (size_t)n);
        b.len += (size_t)n;
        b.items++;
    }
    memcpy(b.s + b.len, suffix, tail + 1);
    b.len += tail;
    return b;
}

static void run(const iv_meta_t *m, const char *name, body_t b)
{
    iv_qreq_t q;
    iv_err_t e;
    iv_err_clear(&e);
    double t0 = cpu_s();
    int rc = iv_qreq_parse_json(b.s, b.len, iv_meta_n_rows(m, IV_AXIS_OBS), 1, &q, &e);
    double t1 = cpu_s(), t2 = t1;
    long long rows = -1;
    if (rc == 0 && q.obs.filter) {
        iv_fprog_t *p = NULL;
        rc = iv_filter_compile(m, IV_AXIS_OBS, q.obs.filter, &p, &e);
        if (rc == 0) {
            int64_t *idx = NULL, n = 0;
            rc = iv_filter_select(p, &idx, &n, &e);
            rows = (long long)n;
            free(idx);
            iv_filter_free(p);
        }
        t2 = cpu_s();
    }
    if (rc == 0) iv_qreq_free(&q);
    printf("%-10s %9zu %9ld %6d %9.3f %13.3f %10lld  %.70s\n", name, b.len, b.items,
           rc ? iv_error_status(rc) : 200, t1 - t0, t2 - t1, rows, rc ? e.msg : "");
    free(b.s);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s ATLAS.h5ad [CATEGORICAL_COLUMN [INT_COLUMN]]\n", argv[0]);
        return 2;
    }
    const char *cat = argc > 2 ? argv[2] : "cell_type", *num = argc > 3 ? argv[3] : "total_counts";
    iv_meta_t *m = NULL;
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_meta_load(argv[1], NULL, &m, &e) != 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const iv_meta_col_t *c = iv_meta_find_col(m, IV_AXIS_OBS, cat);
    if (!c || c->type != IV_COL_CATEGORICAL || c->n_cats < 1 || !iv_meta_find_col(m, IV_AXIS_OBS, num)) {
        fprintf(stderr, "need a categorical obs column '%s' and an obs column '%s'\n", cat, num);
        return 1;
    }
    const char *label = iv_meta_col_cat(c, 0);
    char pre[256], leaf[512];
    /* Built against a tree without the limits (to measure a baseline
     * before them), the line says so. */
#ifdef IV_FILTER_MAX_COST
    printf("obs rows: %lld; limits: %d terms, %d in-list values, cost %lld row visits\n",
           (long long)iv_meta_n_rows(m, IV_AXIS_OBS), IV_FILTER_MAX_NODES, IV_FILTER_MAX_IN,
           (long long)IV_FILTER_MAX_COST);
#else
    printf("obs rows: %lld; no filter limits\n", (long long)iv_meta_n_rows(m, IV_AXIS_OBS));
#endif
    printf("%-10s %9s %9s %6s %9s %13s %10s  %s\n", "body", "bytes", "items", "status",
           "parse_s", "compile+eval", "rows", "error");
    snprintf(leaf, sizeof leaf, "{\"column\":\"%%s\",\"eq\":\"%s\"}", label);
    run(m, "baseline", make("{\"obs\":{\"filter\":", leaf, cat, ",", "}}", BODY_MAX, 1));
    run(m, "or_terms", make("{\"obs\":{\"filter\":{\"or\":[", leaf, cat, ",", "]}}}", BODY_MAX, -1));
    snprintf(pre, sizeof pre, "{\"obs\":{\"where\":\"");
    run(m, "where_or", make(pre, "%s == %ld", num, " or ", "\"}}", BODY_MAX, -1));
    snprintf(pre, sizeof pre, "{\"obs\":{\"filter\":{\"column\":\"%s\",\"in\":[", num);
    run(m, "in_list", make(pre, "%ld", NULL, ",", "]}}}", BODY_MAX, -1));
    run(m, "in_900k", make(pre, "%ld", NULL, ",", "]}}}", BODY_MAX, 900000));
    run(m, "or_1300", make("{\"obs\":{\"filter\":{\"or\":[", leaf, cat, ",", "]}}}", BODY_MAX, 1300));
    run(m, "or_4000", make("{\"obs\":{\"filter\":{\"or\":[", leaf, cat, ",", "]}}}", BODY_MAX, 4000));
    iv_meta_free(m);
    return 0;
}
