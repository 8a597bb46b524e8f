/*
 * Engine-only time of one selection, the baseline that the HTTP
 * benchmarks set their numbers against: the same selection, planned,
 * prepared and decoded block by block on a pool of T threads, the blocks
 * kept in memory until the run ends (as the server holds blocks ahead),
 * best of R runs, warm (the start-up pass leaves the chunks in the cache
 * when the budget holds the stream).
 *
 *   bench_select FILE.h5ad [--threads T] [--reps R] [--cache-mb M] [--seed S]
 *                [--obs SEL | --obs-file F | --obs-random N]
 *                [--var SEL | --var-file F | --var-random N] [--label TEXT]
 *                [--other [--checksum] [--tp-chunk N]] [--pick auto|cells|genes]
 *                [--by obs|var] [--wide DIR]
 *
 * SEL is the command line's selection syntax (5,3,3,10:20; absent = all);
 * a file holds whitespace-separated indices; --*-random N draws N indices
 * uniformly with replacement from a fixed seed.  --other builds the other
 * orientation in memory first (as the server does after a load; its build
 * time is printed on a line of its own) and --pick forces the orientation
 * that serves the query (default: the planner's); with --other, two more
 * lines give the build's phases (value ids, count, fill, encode, move,
 * finish) and their total, in wall seconds and in CPU seconds of all
 * threads; --checksum (with --other) adds a hash of the copy's pointers,
 * values and stream, equal for equal copies; --tp-chunk sets the entries
 * a chunk of the build's fill (transpose.h's chunk_entries); --by var
 * decodes the result by gene (a query's "by": "var").  --wide takes the
 * matrix's wide copy (widefile.h) from the cache folder DIR, writing it
 * there first when none is kept, and runs the selection both ways in
 * turn, the packed stream ("packed") and the wide copy ("wide"), with a
 * hash of each answer (equal answers hash equal) and the ratio.  Prints
 * one line per selection (and way):
 *   select LABEL rows R nnz Z best_ms B median_ms M threads T served_by cells|genes
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset.h"
#include "dataset_impl.h"
#include "pool.h"
#include "query.h"
#include "transpose.h"
#include "widefile.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *msg, const char *what)
{
    fprintf(stderr, "bench_select: %s%s%s\n", msg, what ? ": " : "", what ? what : "");
    exit(1);
}

/* Appends v to the growing array *a (capacity doubles). */
static void push(int64_t **a, size_t *n, size_t *cap, int64_t v)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        int64_t *na = realloc(*a, *cap * sizeof **a);
        if (!na) die("out of memory", NULL);
        *a = na;
    }
    (*a)[(*n)++] = v;
}

static void sel_text(const char *s, iv_sel_t *sel)
{
    int64_t *v = NULL;
    size_t n = 0, cap = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long a = strtoll(p, &end, 10), b;
        if (end == p || errno || a < 0) die("bad selection", s);
        b = a + 1;
        if (*end == ':') {
            const char *q = end + 1;
            b = strtoll(q, &end, 10);
            if (end == q || errno || b < a) die("bad selection", s);
        }
        for (long long x = a; x < b; x++) push(&v, &n, &cap, x);
        if (*end == ',') p = end + 1;
        else if (*end == '\0') p = end;
        else die("bad selection", s);
    }
    sel->all = 0;
    sel->n = (int64_t)n;
    sel->idx = v;
}

static void sel_file(const char *path, iv_sel_t *sel)
{
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open", path);
    int64_t *v = NULL;
    size_t n = 0, cap = 0;
    long long x;
    while (fscanf(f, "%lld", &x) == 1) {
        if (x < 0) die("negative index in", path);
        push(&v, &n, &cap, x);
    }
    if (!feof(f)) die("not a list of integers", path);
    fclose(f);
    sel->all = 0;
    sel->n = (int64_t)n;
    sel->idx = v;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void sel_random(int64_t count, int64_t extent, uint64_t seed, iv_sel_t *sel)
{
    int64_t *v = malloc((size_t)(count > 0 ? count : 1) * sizeof *v);
    if (!v) die("out of memory", NULL);
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < count; i++) v[i] = (int64_t)(rng_next(&s) % (uint64_t)extent);
    sel->all = 0;
    sel->n = count;
    sel->idx = v;
}

struct run {
    iv_query_t *q;
    iv_block_t *blocks;
    int *rcs;
};

static void decode_one(void *arg, size_t i)
{
    struct run *r = arg;
    iv_err_t err;
    r->rcs[i] = iv_query_decode_block(r->q, (int64_t)i, &r->blocks[i], &err);
}

/* FNV-1a over n bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* One hash of the built copy's pointers, values and packed stream, to
 * show that two builds (two commits) made the same copy byte for byte. */
static uint64_t copy_checksum(iv_dataset_t *ds)
{
    iv_dataset_t *c = iv_dataset_other(ds);
    const iv_h5matrix_t *m = &c->m;
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv(h, m->major_ptr, (size_t)(m->n_major + 1) * sizeof *m->major_ptr);
    h = fnv(h, m->value_ptr, (size_t)(m->n_unique + 1) * sizeof *m->value_ptr);
    h = fnv(h, m->values, (size_t)m->n_unique * iv_dtype_size(m->value_dtype));
    iv_err_t err;
    for (uint64_t k = 0; k < iv_stream_n_chunks(c->stream); k++) {
        const uint8_t *d;
        size_t len;
        if (iv_stream_acquire(c->stream, k, &d, &len, NULL, &err) < 0) die("reading the copy", err.msg);
        h = fnv(h, d, len);
        iv_stream_release(c->stream, k);
    }
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) die("usage: bench_select FILE.h5ad [options] (see the source's header)", NULL);
    const char *path = argv[1], *label = "selection", *wide_dir = NULL;
    const char *obs_s = NULL, *obs_f = NULL, *var_s = NULL, *var_f = NULL;
    int64_t obs_r = -1, var_r = -1;
    unsigned threads = 1;
    int reps = 5;
    long cache_mb = -1;
    uint64_t seed = 1;
    int other = 0, checksum = 0;
    uint32_t tp_chunk = 0;
    iv_pick_t pick = IV_PICK_AUTO;
    iv_out_axis_t axis = IV_OUT_ROWS;
    for (int i = 2; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--other") == 0 || strcmp(a, "--checksum") == 0) {
            if (strcmp(a, "--other") == 0) other = 1;
            else checksum = 1;
            i--;
            continue;
        }
        if (!v) die("missing value after", a);
        if (strcmp(a, "--threads") == 0) threads = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--reps") == 0) reps = atoi(v);
        else if (strcmp(a, "--cache-mb") == 0) cache_mb = atol(v);
        else if (strcmp(a, "--seed") == 0) seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--obs") == 0) obs_s = v;
        else if (strcmp(a, "--obs-file") == 0) obs_f = v;
        else if (strcmp(a, "--obs-random") == 0) obs_r = atoll(v);
        else if (strcmp(a, "--var") == 0) var_s = v;
        else if (strcmp(a, "--var-file") == 0) var_f = v;
        else if (strcmp(a, "--var-random") == 0) var_r = atoll(v);
        else if (strcmp(a, "--label") == 0) label = v;
        else if (strcmp(a, "--wide") == 0) wide_dir = v;
        else if (strcmp(a, "--tp-chunk") == 0) tp_chunk = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--pick") == 0) {
            if (strcmp(v, "auto") == 0) pick = IV_PICK_AUTO;
            else if (strcmp(v, "cells") == 0) pick = IV_PICK_CELLS;
            else if (strcmp(v, "genes") == 0) pick = IV_PICK_GENES;
            else die("--pick takes auto, cells or genes", v);
        }
        else if (strcmp(a, "--by") == 0) {
            if (strcmp(v, "obs") == 0) axis = IV_OUT_ROWS;
            else if (strcmp(v, "var") == 0) axis = IV_OUT_VARS;
            else die("--by takes obs or var", v);
        }
        else die("unknown option", a);
    }
    if (threads < 1) threads = 1;
    if (reps < 1) reps = 1;

    /* T threads: the caller and T - 1 workers; one thread runs without a
     * pool (iv_pool_create(0) would start one worker per core). */
    iv_pool_t *pool = threads > 1 ? iv_pool_create(threads - 1, 0) : NULL;
    if (threads > 1 && !pool) die("cannot create the pool", NULL);
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.pool = pool;
    if (cache_mb >= 0) o.cache_bytes = (size_t)cache_mb << 20;
    iv_dataset_t *ds;
    iv_err_t err = {0};
    if (iv_dataset_open(path, &o, &ds, &err) < 0) die("cannot open", err.msg);
    const iv_dataset_info_t *info = iv_dataset_info(ds);
    if (other) {
        double ph[IV_TRANSPOSE_PHASES], pc[IV_TRANSPOSE_PHASES];
        iv_transpose_opts_t to = {.budget = UINT64_MAX / 2, .pool = pool, .phase_seconds = ph,
                                  .phase_cpu_seconds = pc, .chunk_entries = tp_chunk};
        double t0 = now_s();
        if (iv_dataset_build_other(ds, &to, &err) < 0) die("cannot build the other orientation", err.msg);
        double total = now_s() - t0;
        iv_orient_status_t os;
        iv_dataset_orientations(ds, &os);
        printf("other %s built in %.3f s, %.1f MB (the file's stream %.1f MB)\n",
               info->orient == IV_IVCSR ? "gene-major" : "cell-major", total,
               (double)os.bytes[info->orient == IV_IVCSR ? IV_IVCSC : IV_IVCSR] / 1e6,
               (double)info->stream_bytes / 1e6);
        /* Wall seconds, then CPU seconds of every thread: on a shared
         * machine the CPU line is the steadier measure of the work. */
        static const char *names[IV_TRANSPOSE_PHASES] = {"values", "count", "fill", "encode",
                                                         "move", "finish"};
        double cpu = 0;
        printf("other phases s:");
        for (int k = 0; k < IV_TRANSPOSE_PHASES; k++) printf(" %s %.3f", names[k], ph[k]);
        printf(" total %.3f\nother phases cpu_s:", total);
        for (int k = 0; k < IV_TRANSPOSE_PHASES; k++) {
            printf(" %s %.3f", names[k], pc[k]);
            cpu += pc[k];
        }
        printf(" total %.3f\n", cpu);
        if (checksum) printf("other checksum %016" PRIx64 "\n", copy_checksum(ds));
    }

    iv_sel_t obs = {.all = 1}, var = {.all = 1};
    if (obs_s) sel_text(obs_s, &obs);
    else if (obs_f) sel_file(obs_f, &obs);
    else if (obs_r >= 0) sel_random(obs_r, info->n_rows, seed, &obs);
    if (var_s) sel_text(var_s, &var);
    else if (var_f) sel_file(var_f, &var);
    else if (var_r >= 0) sel_random(var_r, info->n_cols, seed + 1, &var);

    if (wide_dir) {
        iv_dataset_opts_t wo = o;
        wo.index_dir = wide_dir;
        double t0 = now_s();
        int rc = iv_dataset_use_wide(ds, &wo, 1, &err);
        if (rc < 0) die("cannot take or write the wide copy", err.msg);
        printf("wide copy %s in %.3f s\n", rc == 1 ? "kept" : "written", now_s() - t0);
    }
    int ways = wide_dir ? 2 : 1;
    double *times = malloc((size_t)reps * 2 * sizeof *times);
    if (!times) die("out of memory", NULL);
    int64_t rows = 0, nnz = 0;
    uint64_t hash[2] = {0, 0};
    const char *served = "?";
    for (int rep = 0; rep < reps; rep++)
        for (int way = 0; way < ways; way++) {
            struct run r = {0};
            iv_query_set_wide(way);
            double t0 = now_s();
            iv_query_opts_t qo = {.axis = axis, .pick = pick};
            if (iv_query_new(ds, &obs, &var, &qo, &r.q, &err) < 0 || iv_query_prepare(r.q, pool, &err) < 0)
                die("query failed", err.msg);
            size_t nb = (size_t)iv_query_n_blocks(r.q);
            r.blocks = calloc(nb ? nb : 1, sizeof *r.blocks);
            r.rcs = calloc(nb ? nb : 1, sizeof *r.rcs);
            if (!r.blocks || !r.rcs) die("out of memory", NULL);
            iv_pool_parallel_for(pool, nb, 0, decode_one, &r);
            times[way * reps + rep] = now_s() - t0;
            rows = iv_query_n_rows(r.q);
            served = iv_query_orient(r.q) == IV_IVCSR ? "cells" : "genes";
            nnz = 0;
            uint64_t h = 1469598103934665603ull;
            size_t isz = iv_query_index_size(r.q), esz = iv_dtype_size(iv_query_dtype(r.q));
            for (size_t b = 0; b < nb; b++) {
                if (r.rcs[b] < 0) die("decode failed", NULL);
                iv_block_t *bk = &r.blocks[b];
                nnz += bk->nnz;
                h = fnv(h, bk->indptr, (size_t)(bk->n_rows + 1) * sizeof *bk->indptr);
                h = fnv(h, bk->indices, (size_t)bk->nnz * isz);
                h = fnv(h, bk->data, (size_t)bk->nnz * esz);
                iv_block_free(bk);
            }
            hash[way] = h;
            free(r.blocks);
            free(r.rcs);
            iv_query_free(r.q);
        }
    for (int way = 0; way < ways; way++) {
        double *t = times + way * reps;
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        printf("select %s%s rows %" PRId64 " nnz %" PRId64 " best_ms %.3f median_ms %.3f threads %u "
               "served_by %s",
               label, ways == 1 ? "" : way ? " wide" : " packed", rows, nnz, t[0] * 1e3, t[reps / 2] * 1e3,
               threads, served);
        printf(ways == 1 ? "\n" : " answer %016" PRIx64 "\n", hash[way]);
    }
    if (ways == 2)
        printf("wide / packed: best %.2fx median %.2fx, answers %s\n", times[0] / times[reps],
               times[reps / 2] / times[reps + reps / 2], hash[0] == hash[1] ? "equal" : "DIFFER");
    free(times);
    free((void *)obs.idx);
    free((void *)var.idx);
    iv_dataset_close(ds);
    iv_pool_destroy(pool);
    return 0;
}
