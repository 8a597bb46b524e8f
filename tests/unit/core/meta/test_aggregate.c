/* Grouped statistics: random CSR data in every value dtype and both index
 * widths, fed as cell rows and as gene rows, through one or several
 * partials, against a dense reference computed here; implicit zeros,
 * explicit zeros, negative values (max), NaN, empty groups, cells left
 * out (group -1). */
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "aggregate.h"

#define NC 60
#define NG 7
#define NGR 4

typedef struct data {
    double dense[NC][NG];
    int stored[NC][NG];
    int32_t group[NC];
} data_t;

static void make(data_t *d, unsigned seed, int negative, int with_nan)
{
    srand(seed);
    memset(d, 0, sizeof *d);
    for (int c = 0; c < NC; c++) {
        d->group[c] = c % 11 == 3 ? -1 : rand() % (NGR - 1);  /* group NGR-1 stays empty */
        for (int g = 0; g < NG; g++) {
            if (rand() % 3) continue;
            d->stored[c][g] = 1;
            int v = rand() % 9;  /* 0: an explicit stored zero */
            d->dense[c][g] = negative ? v - 5 : v;
        }
    }
    if (with_nan) {
        d->stored[0][1] = 1;
        d->dense[0][1] = NAN;
    }
}

/* CSR of d in the given orientation, values as double (converted by the caller). */
static void to_csr(const data_t *d, int cell_major, int64_t *indptr, int64_t *indices, double *vals)
{
    int64_t k = 0;
    int nr = cell_major ? NC : NG, nm = cell_major ? NG : NC;
    indptr[0] = 0;
    for (int r = 0; r < nr; r++) {
        for (int m = 0; m < nm; m++) {
            int c = cell_major ? r : m, g = cell_major ? m : r;
            if (!d->stored[c][g]) continue;
            indices[k] = m;
            vals[k++] = d->dense[c][g];
        }
        indptr[r + 1] = k;
    }
}

static void reference(const data_t *d, int bit, int ddof, double *out, int64_t *n_cells)
{
    for (int gr = 0; gr < NGR; gr++) {
        n_cells[gr] = 0;
        for (int c = 0; c < NC; c++) n_cells[gr] += d->group[c] == gr;
        for (int g = 0; g < NG; g++) {
            double s = 0, mx = -INFINITY, nz = 0;
            int nan = 0;
            for (int c = 0; c < NC; c++) {
                if (d->group[c] != gr) continue;
                double v = d->dense[c][g];
                s += v;
                nz += v != 0;
                if (isnan(v)) nan = 1;
                if (v > mx) mx = v;
            }
            double n = (double)n_cells[gr], m = s / n, q = 0;
            for (int c = 0; c < NC; c++)
                if (d->group[c] == gr) q += (d->dense[c][g] - m) * (d->dense[c][g] - m);
            double v = NAN;
            switch (bit) {
            case IV_STAT_SUM: v = s; break;
            case IV_STAT_MEAN: v = n > 0 ? m : NAN; break;
            case IV_STAT_VAR: v = n > ddof ? q / (n - ddof) : NAN; break;
            case IV_STAT_NNZ: v = nz; break;
            case IV_STAT_FRAC: v = n > 0 ? nz / n : NAN; break;
            case IV_STAT_MAX: v = n > 0 ? (nan ? NAN : mx) : NAN; break;
            }
            out[gr * NG + g] = v;
        }
    }
}

static void store(iv_dtype_t t, void *base, int64_t i, double v)
{
    switch (t) {
    case IV_DT_INT8: ((int8_t *)base)[i] = (int8_t)v; break;
    case IV_DT_INT16: ((int16_t *)base)[i] = (int16_t)v; break;
    case IV_DT_INT32: ((int32_t *)base)[i] = (int32_t)v; break;
    case IV_DT_INT64: ((int64_t *)base)[i] = (int64_t)v; break;
    case IV_DT_UINT8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case IV_DT_UINT16: ((uint16_t *)base)[i] = (uint16_t)v; break;
    case IV_DT_UINT32: ((uint32_t *)base)[i] = (uint32_t)v; break;
    case IV_DT_UINT64: ((uint64_t *)base)[i] = (uint64_t)v; break;
    case IV_DT_FLOAT32: ((float *)base)[i] = (float)v; break;
    default: ((double *)base)[i] = v; break;
    }
}

static void check_close(double got, double want, int bit)
{
    if (isnan(want)) {
        ck_assert_msg(isnan(got), "stat %s: got %g want NaN", iv_stat_name(bit), got);
        return;
    }
    double tol = bit == IV_STAT_VAR ? 1e-12 * fabs(want) + 1e-12 : 0;
    ck_assert_msg(fabs(got - want) <= tol, "stat %s: got %.17g want %.17g", iv_stat_name(bit), got, want);
}

static void run_case(iv_dtype_t t, int index_size, int cell_major, unsigned parts, int negative,
                     int with_nan, unsigned seed)
{
    data_t d;
    make(&d, seed, negative, with_nan);
    int64_t indptr[NC + 1], idx64[NC * NG];
    int32_t idx32[NC * NG];
    double vals[NC * NG];
    to_csr(&d, cell_major, indptr, idx64, vals);
    int nr = cell_major ? NC : NG;
    int64_t nnz = indptr[nr];
    void *data = malloc((size_t)(nnz ? nnz : 1) * 8);
    for (int64_t k = 0; k < nnz; k++) {
        store(t, data, k, vals[k]);
        idx32[k] = (int32_t)idx64[k];
    }
    iv_agg_t *a = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    unsigned mask = (1u << IV_STAT_COUNT) - 1;
    ck_assert_int_eq(iv_agg_new(NGR, NG, mask, parts, &a, &err), 0);
    /* Rows split into slabs spread over the partials, as the pool does. */
    for (int r0 = 0, slab = 0; r0 < nr; r0 += 9, slab++) {
        int n = nr - r0 < 9 ? nr - r0 : 9;
        int64_t ip[10];
        for (int i = 0; i <= n; i++) ip[i] = indptr[r0 + i] - indptr[r0];
        const void *ix = index_size == 4 ? (const void *)(idx32 + indptr[r0]) : (const void *)(idx64 + indptr[r0]);
        const char *dv = (const char *)data + (size_t)indptr[r0] * iv_dtype_size(t);
        if (cell_major)
            iv_agg_add_rows(a, (unsigned)slab, n, d.group + r0, ip, ix, index_size, dv, t);
        else
            iv_agg_add_cols(a, (unsigned)slab, r0, n, d.group, ip, ix, index_size, dv, t);
    }
    double got[NGR * NG], want[NGR * NG];
    int64_t n_cells[NGR];
    for (int i = 0; i < IV_STAT_COUNT; i++) {
        int bit = 1 << i;
        for (int ddof = 0; ddof <= 1; ddof++) {
            reference(&d, bit, ddof, want, n_cells);
            iv_agg_result(a, bit, n_cells, ddof, got);
            for (int k = 0; k < NGR * NG; k++) check_close(got[k], want[k], bit);
        }
    }
    iv_agg_free(a);
    free(data);
}

START_TEST(every_dtype_and_orientation)
{
    static const iv_dtype_t dts[] = {IV_DT_INT8, IV_DT_INT16, IV_DT_INT32, IV_DT_INT64, IV_DT_UINT8,
                                     IV_DT_UINT16, IV_DT_UINT32, IV_DT_UINT64, IV_DT_FLOAT32, IV_DT_FLOAT64};
    for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
        for (int is = 4; is <= 8; is += 4)
            for (int cm = 0; cm <= 1; cm++)
                for (unsigned parts = 1; parts <= 3; parts++) {
                    int signed_ok = dts[i] <= IV_DT_INT64 || dts[i] >= IV_DT_FLOAT32;
                    run_case(dts[i], is, cm, parts, signed_ok, 0, 100 + (unsigned)i);
                }
}
END_TEST

START_TEST(nan_propagates)
{
    run_case(IV_DT_FLOAT64, 4, 1, 2, 1, 1, 5);
    run_case(IV_DT_FLOAT32, 8, 0, 3, 0, 1, 6);
}
END_TEST

START_TEST(names_and_arguments)
{
    for (int i = 0; i < IV_STAT_COUNT; i++) ck_assert_int_eq(iv_stat_parse(iv_stat_name(1 << i)), 1 << i);
    ck_assert_int_eq(iv_stat_parse("median"), 0);
    iv_agg_t *a = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_ne(iv_agg_new(2, 2, 0, 1, &a, &err), 0);
    ck_assert_int_ne(iv_agg_new(2, 2, IV_STAT_SUM, 0, &a, &err), 0);
    ck_assert_int_ne(iv_agg_new(-1, 2, IV_STAT_SUM, 1, &a, &err), 0);
    ck_assert_ptr_null(a);
    /* Only the arrays the stats need: mean needs the sum alone. */
    ck_assert_uint_eq(iv_agg_part_bytes(3, 5, IV_STAT_MEAN), 3 * 5 * 8);
    ck_assert_uint_eq(iv_agg_part_bytes(3, 5, IV_STAT_MAX | IV_STAT_VAR), 3 * 5 * 8 * 4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("aggregate");
    TCase *tc = tcase_create("aggregate");
    tcase_add_test(tc, every_dtype_and_orientation);
    tcase_add_test(tc, nan_propagates);
    tcase_add_test(tc, names_and_arguments);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
