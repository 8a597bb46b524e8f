/*
 * Grouped statistics (see aggregate.h).
 *
 * Design.  Every statistic asked for derives from five sums over the
 * stored entries of a (group, gene) cell: the sum, the sum of squares,
 * the count of non-zero values, the count of stored entries and the
 * maximum; the group sizes supply the implicit zeros.  So one pass over
 * the decoded selection suffices, whichever orientation the blocks have,
 * and only the arrays the request needs are allocated.  Partials are
 * plain arrays indexed group * n_genes + gene: a dot plot (tens of
 * groups, tens of genes) fits in L1, a pseudobulk table (33,000 genes) in
 * a few megabytes per partial.  The value dtype is switched on once per
 * block; the loop inside is specialised per dtype and index width.
 */
#include "aggregate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const STAT_NAMES[IV_STAT_COUNT] = {"sum", "mean", "var", "nnz", "frac_nonzero",
                                                      "max"};

const char *iv_stat_name(int bit)
{
    for (int i = 0; i < IV_STAT_COUNT; i++)
        if (bit == 1 << i) return STAT_NAMES[i];
    return "";
}

int iv_stat_parse(const char *name)
{
    for (int i = 0; i < IV_STAT_COUNT; i++)
        if (!strcmp(name, STAT_NAMES[i])) return 1 << i;
    return 0;
}

typedef struct part {
    double *sum, *sq, *mx;
    int64_t *nz, *st;
} part_t;

struct iv_agg {
    int64_t n_groups, n_genes;
    unsigned mask, n_parts;
    int need_sum, need_sq, need_nz, need_max;
    int merged;
    part_t *parts;
};

static void need(unsigned mask, int *sum, int *sq, int *nz, int *mx)
{
    *sum = (mask & (IV_STAT_SUM | IV_STAT_MEAN | IV_STAT_VAR)) != 0;
    *sq = (mask & IV_STAT_VAR) != 0;
    *nz = (mask & (IV_STAT_NNZ | IV_STAT_FRAC)) != 0;
    *mx = (mask & IV_STAT_MAX) != 0;
}

size_t iv_agg_part_bytes(int64_t n_groups, int64_t n_genes, unsigned mask)
{
    int s, q, z, m;
    need(mask, &s, &q, &z, &m);
    return (size_t)n_groups * (size_t)n_genes * 8 * (size_t)(s + q + z + 2 * m);
}

static void part_free(part_t *p)
{
    free(p->sum);
    free(p->sq);
    free(p->mx);
    free(p->nz);
    free(p->st);
}

/* The arrays of one partial of n cells that the statistics need; the
 * maxima start at -inf.  0 or -1. */
static int part_alloc(const iv_agg_t *a, part_t *p, size_t n)
{
    if ((a->need_sum && !(p->sum = calloc(n, sizeof *p->sum))) ||
        (a->need_sq && !(p->sq = calloc(n, sizeof *p->sq))) ||
        (a->need_nz && !(p->nz = calloc(n, sizeof *p->nz))))
        return -1;
    if (!a->need_max) return 0;
    if (!(p->st = calloc(n, sizeof *p->st)) || !(p->mx = malloc(n * sizeof *p->mx))) return -1;
    for (size_t k = 0; k < n; k++) p->mx[k] = -INFINITY;
    return 0;
}

int iv_agg_new(int64_t n_groups, int64_t n_genes, unsigned mask, unsigned n_parts, iv_agg_t **out,
               iv_err_t *err)
{
    *out = NULL;
    IV_RETURN_IF(n_groups < 0 || n_genes < 0 || n_parts == 0 || mask == 0 ||
                     (mask >> IV_STAT_COUNT) != 0,
                 err, IV_EINVALID_ARG, "aggregate: bad arguments");
    size_t cells = (size_t)n_groups * (size_t)n_genes;
    IV_RETURN_IF(n_genes && cells / (size_t)n_genes != (size_t)n_groups, err, IV_ETOO_LARGE,
                 "aggregate: %lld groups x %lld genes is too large", (long long)n_groups,
                 (long long)n_genes);
    iv_agg_t *a = calloc(1, sizeof *a);
    IV_RETURN_IF(!a, err, IV_ENOMEM, "aggregate: out of memory");
    a->n_groups = n_groups;
    a->n_genes = n_genes;
    a->mask = mask;
    a->n_parts = n_parts;
    need(mask, &a->need_sum, &a->need_sq, &a->need_nz, &a->need_max);
    a->parts = calloc(n_parts, sizeof *a->parts);
    if (!a->parts) goto oom;
    size_t n = cells ? cells : 1;
    for (unsigned i = 0; i < n_parts; i++)
        if (part_alloc(a, &a->parts[i], n) < 0) goto oom;
    *out = a;
    return 0;
oom:
    iv_agg_free(a);
    return iv_fail(err, IV_ENOMEM, "aggregate: out of memory for %lld groups x %lld genes",
                   (long long)n_groups, (long long)n_genes);
}

void iv_agg_free(iv_agg_t *a)
{
    if (!a) return;
    for (unsigned i = 0; a->parts && i < a->n_parts; i++) part_free(&a->parts[i]);
    free(a->parts);
    free(a);
}

/* One stored value v at accumulator cell k. */
static inline void acc_one(const iv_agg_t *a, part_t *p, size_t k, double v)
{
    if (a->need_sum) p->sum[k] += v;
    if (a->need_sq) p->sq[k] += v * v;
    if (a->need_nz) p->nz[k] += v != 0;  /* NaN != 0: counted, as numpy's (x != 0) */
    if (a->need_max) {
        p->st[k]++;
        /* NaN wins and stays, as numpy's max propagates it. */
        if (!isnan(p->mx[k]) && (isnan(v) || v > p->mx[k])) p->mx[k] = v;
    }
}

#define ROWS_LOOP(T, IT)                                                                  \
    for (int64_t r = 0; r < n_rows; r++) {                                                \
        int32_t g = row_group[r];                                                         \
        if (g < 0) continue;                                                              \
        size_t base = (size_t)g * (size_t)a->n_genes;                                     \
        for (int64_t e = indptr[r]; e < indptr[r + 1]; e++)                               \
            acc_one(a, p, base + (size_t)((const IT *)indices)[e], (double)((const T *)data)[e]); \
    }

#define COLS_LOOP(T, IT)                                                                  \
    for (int64_t r = 0; r < n_rows; r++) {                                                \
        size_t gene = (size_t)(gene0 + r);                                                \
        for (int64_t e = indptr[r]; e < indptr[r + 1]; e++) {                             \
            int32_t g = cell_group[((const IT *)indices)[e]];                             \
            if (g >= 0)                                                                   \
                acc_one(a, p, (size_t)g * (size_t)a->n_genes + gene, (double)((const T *)data)[e]); \
        }                                                                                 \
    }

#define BY_DTYPE(LOOP, IT)                                  \
    switch (dtype) {                                        \
    case IV_DT_INT8: LOOP(int8_t, IT) break;                \
    case IV_DT_INT16: LOOP(int16_t, IT) break;              \
    case IV_DT_INT32: LOOP(int32_t, IT) break;              \
    case IV_DT_INT64: LOOP(int64_t, IT) break;              \
    case IV_DT_UINT8: LOOP(uint8_t, IT) break;              \
    case IV_DT_UINT16: LOOP(uint16_t, IT) break;            \
    case IV_DT_UINT32: LOOP(uint32_t, IT) break;            \
    case IV_DT_UINT64: LOOP(uint64_t, IT) break;            \
    case IV_DT_FLOAT32: LOOP(float, IT) break;              \
    case IV_DT_FLOAT64: LOOP(double, IT) break;             \
    default: break;                                         \
    }

void iv_agg_add_rows(iv_agg_t *a, unsigned part, int64_t n_rows, const int32_t *row_group,
                     const int64_t *indptr, const void *indices, int index_size, const void *data,
                     iv_dtype_t dtype)
{
    part_t *p = &a->parts[part % a->n_parts];
    if (index_size == 4) {
        BY_DTYPE(ROWS_LOOP, int32_t)
    } else {
        BY_DTYPE(ROWS_LOOP, int64_t)
    }
}

void iv_agg_add_cols(iv_agg_t *a, unsigned part, int64_t gene0, int64_t n_rows,
                     const int32_t *cell_group, const int64_t *indptr, const void *indices,
                     int index_size, const void *data, iv_dtype_t dtype)
{
    part_t *p = &a->parts[part % a->n_parts];
    if (index_size == 4) {
        BY_DTYPE(COLS_LOOP, int32_t)
    } else {
        BY_DTYPE(COLS_LOOP, int64_t)
    }
}

/* Folds partials 1.. into partial 0, in partial order. */
static void merge(iv_agg_t *a)
{
    if (a->merged) return;
    a->merged = 1;
    size_t n = (size_t)a->n_groups * (size_t)a->n_genes;
    part_t *d = &a->parts[0];
    for (unsigned i = 1; i < a->n_parts; i++) {
        part_t *s = &a->parts[i];
        for (size_t k = 0; k < n; k++) {
            if (a->need_sum) d->sum[k] += s->sum[k];
            if (a->need_sq) d->sq[k] += s->sq[k];
            if (a->need_nz) d->nz[k] += s->nz[k];
            if (a->need_max) {
                d->st[k] += s->st[k];
                double v = s->mx[k];
                if (!isnan(d->mx[k]) && (isnan(v) || v > d->mx[k])) d->mx[k] = v;
            }
        }
    }
}

/* The variance of cell k over n cells (ddof as numpy's), NaN for too
 * few cells or a NaN sum. */
static inline double cell_var(const part_t *p, size_t k, int64_t n, int ddof)
{
    if (n <= ddof) return NAN;
    /* Long double keeps the cancellation of sum of squares minus
     * n * mean^2 small next to float64's rounding. */
    long double s = p->sum[k], q = p->sq[k];
    long double m2 = q - s * s / (long double)n;
    if (m2 < 0) m2 = 0;
    double v = (double)(m2 / (long double)(n - ddof));
    return isnan(p->sum[k]) ? NAN : v;
}

/* The maximum of cell k over n cells: cells without a stored entry hold
 * an implicit 0. */
static inline double cell_max(const part_t *p, size_t k, int64_t n)
{
    if (n <= 0) return NAN;
    double v = p->mx[k];
    if (p->st[k] < n && !isnan(v) && v < 0) v = 0;
    if (p->st[k] == 0) v = 0;
    return v;
}

/* Statistic bit of cell k over a group of n cells. */
static inline double cell_stat(const part_t *p, int bit, size_t k, int64_t n, int ddof)
{
    switch (bit) {
    case IV_STAT_SUM: return p->sum[k];
    case IV_STAT_MEAN: return n > 0 ? p->sum[k] / (double)n : NAN;
    case IV_STAT_VAR: return cell_var(p, k, n, ddof);
    case IV_STAT_NNZ: return (double)p->nz[k];
    case IV_STAT_FRAC: return n > 0 ? (double)p->nz[k] / (double)n : NAN;
    case IV_STAT_MAX: return cell_max(p, k, n);
    default: return NAN;
    }
}

void iv_agg_result(iv_agg_t *a, int bit, const int64_t *n_cells, int ddof, double *out)
{
    merge(a);
    const part_t *p = &a->parts[0];
    for (int64_t g = 0; g < a->n_groups; g++) {
        for (int64_t j = 0; j < a->n_genes; j++) {
            size_t k = (size_t)g * (size_t)a->n_genes + (size_t)j;
            out[k] = cell_stat(p, bit, k, n_cells[g], ddof);
        }
    }
}
