/*
 * Name-search benchmark: microseconds per iv_search_run() (median and
 * minimum of the runs; the minimum is the figure least disturbed by other
 * load on a shared machine) over 60,000
 * gene-like names and 33,000 names (the goal: under 1 ms), and
 * over 1,260,000 cell barcodes, for fragments that match one name, a
 * family (CD3, RPL), thousands of names (a single letter) and nothing.
 * Baseline, measured in the same run: a per-name strcasestr() scan that
 * collects every match and sorts them all (what a simple implementation
 * would do).
 *
 * Built with -DIV_BENCH=ON (target bench_search), or by hand from the
 * repository root after building the libraries in build:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore benchmarks/bench_search.c \
 *      build/libivcore.a $(pkg-config --cflags --libs hdf5) -lzstd -llz4 -lz -lpthread -lm
 * Run: ./bench_search   (no data files: the names are generated)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "search.h"

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

typedef struct names {
    int64_t n;
    char **s;
} names_t;

static const char *get(const void *ctx, int64_t i)
{
    return ((const names_t *)ctx)->s[i];
}

/* Gene-like names: symbols of 3-8 letters and digits, RP11-... clone
 * names, LINC and MT- genes, and the families a viewer searches. */
static void gen_genes(names_t *nm, int64_t n, unsigned seed)
{
    srand(seed);
    nm->n = n;
    nm->s = malloc((size_t)n * sizeof *nm->s);
    static const char *fam[] = {"CD3E", "CD3D", "CD3G", "CD4", "CD8A", "MS4A1", "NKG7", "GNLY", "LYZ"};
    for (int64_t i = 0; i < n; i++) {
        char b[32];
        int kind = rand() % 10;
        if (i < 9) snprintf(b, sizeof b, "%s", fam[i]);
        else if (kind < 3) snprintf(b, sizeof b, "RP%d-%d%c%d.%d", 1 + rand() % 11, rand() % 999,
                                    'A' + rand() % 26, rand() % 30, 1 + rand() % 3);
        else if (kind < 4) snprintf(b, sizeof b, "LINC%05d", rand() % 3000);
        else if (kind < 5) snprintf(b, sizeof b, "RPL%d%c", rand() % 40, 'A' + rand() % 3);
        else {
            int len = 3 + rand() % 5, k = 0;
            for (; k < len; k++) b[k] = k < 2 || rand() % 3 ? (char)('A' + rand() % 26) : (char)('0' + rand() % 10);
            b[k] = '\0';
        }
        nm->s[i] = strdup(b);
    }
}

static void gen_barcodes(names_t *nm, int64_t n, unsigned seed)
{
    srand(seed);
    nm->n = n;
    nm->s = malloc((size_t)n * sizeof *nm->s);
    for (int64_t i = 0; i < n; i++) {
        char b[32];
        for (int k = 0; k < 16; k++) b[k] = "ACGT"[rand() % 4];
        snprintf(b + 16, sizeof b - 16, "-%d", 1 + (int)(i % 8));
        nm->s[i] = strdup(b);
    }
}

typedef struct bhit {
    int kind;
    size_t len;
    int64_t row;
} bhit_t;

static int cmp_bhit(const void *a, const void *b)
{
    const bhit_t *x = a, *y = b;
    if (x->kind != y->kind) return x->kind - y->kind;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* The baseline: strcasestr on each name, every match kept, all sorted. */
static int64_t baseline(const names_t *nm, const char *q, bhit_t *buf, int64_t limit)
{
    int64_t k = 0;
    size_t ql = strlen(q);
    for (int64_t i = 0; i < nm->n; i++) {
        const char *p = strcasestr(nm->s[i], q);
        if (!p) continue;
        size_t len = strlen(nm->s[i]);
        buf[k].kind = p > nm->s[i] ? 2 : len == ql ? 0 : 1;
        buf[k].len = len;
        buf[k++].row = i;
    }
    qsort(buf, (size_t)k, sizeof *buf, cmp_bhit);
    return k < limit ? k : limit;
}

static void run(const char *label, const names_t *nm, const char *const *qs, size_t nq, int reps)
{
    iv_search_t *s = NULL;
    iv_err_t err = {0};
    double t0 = now();
    if (iv_search_build(nm->n, get, nm, &s, &err) != 0) {
        fprintf(stderr, "build: %s\n", err.msg);
        exit(1);
    }
    double tb = now() - t0;
    printf("%s: %lld names, index %.1f MB built in %.1f ms\n", label, (long long)nm->n,
           (double)iv_search_bytes(s) / 1e6, tb * 1e3);
    printf("  %-12s %10s %12s %10s %14s %8s\n", "q", "matches", "search_us", "(min)", "baseline_us",
           "speedup");
    iv_search_hit_t hits[20];
    bhit_t *buf = malloc((size_t)nm->n * sizeof *buf);
    double *ts = malloc((size_t)reps * sizeof *ts), *tb2 = malloc((size_t)reps * sizeof *tb2);
    for (size_t i = 0; i < nq; i++) {
        int64_t total = 0;
        for (int r = 0; r < reps; r++) {
            double a = now();
            iv_search_run(s, qs[i], strlen(qs[i]), 20, hits, &total);
            ts[r] = now() - a;
            a = now();
            baseline(nm, qs[i], buf, 20);
            tb2[r] = now() - a;
        }
        qsort(ts, (size_t)reps, sizeof *ts, cmpd);
        qsort(tb2, (size_t)reps, sizeof *tb2, cmpd);
        printf("  %-12s %10lld %12.1f %10.1f %14.1f %7.1fx\n", qs[i], (long long)total, ts[reps / 2] * 1e6,
               ts[0] * 1e6, tb2[reps / 2] * 1e6, tb2[reps / 2] / ts[reps / 2]);
    }
    free(ts);
    free(tb2);
    free(buf);
    iv_search_free(s);
}

static void names_free(names_t *nm)
{
    for (int64_t i = 0; i < nm->n; i++) free(nm->s[i]);
    free(nm->s);
}

int main(void)
{
    static const char *const gq[] = {"CD3", "cd3e", "rpl", "RP11-", "a", "LINC0", "zzzz"};
    static const char *const cq[] = {"AAACCTGAG", "acgtac", "-3", "A", "ZZZ"};
    names_t nm;
    gen_genes(&nm, 60000, 1);
    run("genes", &nm, gq, sizeof gq / sizeof *gq, 201);
    names_free(&nm);
    gen_genes(&nm, 33000, 2);
    run("genes", &nm, gq, sizeof gq / sizeof *gq, 201);
    names_free(&nm);
    gen_barcodes(&nm, 1260000, 3);
    run("cells", &nm, cq, sizeof cq / sizeof *cq, 11);
    names_free(&nm);
    return 0;
}
