/* obsp subsets: iv_obsp_subset against a naive reference on random
 * inputs (each output row walks the selection in order and looks its
 * column up in the source row), with duplicated and unsorted cells,
 * explicit zeros, empty rows and selections, all cells in order and
 * sorted subsets (the inverses that skip work), compact sources (distinct
 * rows only, as the reader sends them), both inverses of the selection
 * (a table over the cells and, past 65536 cells, a binary search) and
 * two value dtypes; the transpose against the same walk; and the checks:
 * pointers that do not start at 0, fall or pass the entries, an index
 * outside the cells, a cell outside them, and the entry bound. */
#include <check.h>

#include "check_main.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "obsp.h"

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int64_t rnd_below(int64_t n)
{
    return n > 0 ? (int64_t)(rnd() % (uint64_t)n) : 0;
}

/* A random CSR of rows x n_cols, distinct sorted indices per row (about
 * density of the columns, at most max_row), values of dtype dt with
 * about one in five a zero. */
static iv_obsp_csr_t random_csr(int64_t rows, int64_t n_cols, double density, int64_t max_row, iv_dtype_t dt)
{
    iv_obsp_csr_t m;
    memset(&m, 0, sizeof m);
    m.n_rows = rows;
    m.n_cols = n_cols;
    m.dtype = dt;
    m.indptr = calloc((size_t)rows + 1, sizeof *m.indptr);
    size_t cap = 16;
    m.indices = malloc(cap * sizeof *m.indices);
    m.data = malloc(cap * 8);
    for (int64_t r = 0; r < rows; r++) {
        int64_t k = 0;
        for (int64_t j = 0; j < n_cols && k < max_row; j++) {
            if ((double)(rnd() % 1000000) / 1e6 >= density) continue;
            if ((size_t)m.nnz == cap) {
                cap *= 2;
                m.indices = realloc(m.indices, cap * sizeof *m.indices);
                m.data = realloc(m.data, cap * 8);
            }
            m.indices[m.nnz] = j;
            int64_t v = rnd() % 5 == 0 ? 0 : (int64_t)(rnd() % 2001) - 1000;
            if (dt == IV_DT_FLOAT64) ((double *)m.data)[m.nnz] = (double)v / 8.0;
            else ((int16_t *)m.data)[m.nnz] = (int16_t)v;
            m.nnz++;
            k++;
        }
        m.indptr[r + 1] = m.nnz;
    }
    return m;
}

/* Value i of m as a double. */
static double val(const iv_obsp_csr_t *m, int64_t i)
{
    return m->dtype == IV_DT_FLOAT64 ? ((const double *)m->data)[i] : (double)((const int16_t *)m->data)[i];
}

/* The naive subset's entries compared with got: output row k walks q =
 * 0..n-1 and takes src row row_of[k]'s entry at column cols[q], if any. */
static void check_against_walk(const iv_obsp_csr_t *src, const int64_t *row_of, const int64_t *cols, int64_t n,
                               const iv_obsp_csr_t *got)
{
    ck_assert_int_eq(got->n_rows, n);
    ck_assert_int_eq(got->n_cols, n);
    ck_assert_int_eq(got->dtype, src->dtype);
    ck_assert_int_eq(got->indptr[0], 0);
    int64_t e = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = row_of[k];
        for (int64_t q = 0; q < n; q++) {
            for (int64_t j = src->indptr[r]; j < src->indptr[r + 1]; j++) {
                if (src->indices[j] != cols[q]) continue;
                ck_assert_int_lt(e, got->nnz);
                ck_assert_int_eq(got->indices[e], q);
                ck_assert(val(got, e) == val(src, j));
                e++;
            }
        }
        ck_assert_int_eq(got->indptr[k + 1], e);
    }
    ck_assert_int_eq(got->nnz, e);
}

/* n random cells of n_cells, with repeats and in no order. */
static int64_t *random_cells(int64_t n, int64_t n_cells)
{
    int64_t *c = malloc((size_t)(n ? n : 1) * sizeof *c);
    for (int64_t k = 0; k < n; k++)
        c[k] = k && rnd() % 4 == 0 ? c[rnd_below(k)] : rnd_below(n_cells);
    return c;
}

START_TEST(subset_equals_the_walk_on_whole_matrices)
{
    iv_err_t err = {0};
    for (int round = 0; round < 60; round++) {
        int64_t n_cells = 1 + rnd_below(40);
        iv_dtype_t dt = round % 2 ? IV_DT_INT16 : IV_DT_FLOAT64;
        iv_obsp_csr_t src = random_csr(n_cells, n_cells, round % 3 ? 0.3 : 0.9, n_cells, dt);
        int64_t n = round % 10 == 0 ? 0 : rnd_below(2 * n_cells + 1);
        int64_t *cells = random_cells(n, n_cells);
        if (round % 4 == 1) {
            /* Every cell in order (the identity inverse), or some in order
             * (a mask: sorted, no duplicates). */
            int some = round % 8 == 5;
            free(cells);
            cells = malloc((size_t)n_cells * sizeof *cells);
            n = 0;
            for (int64_t i = 0; i < n_cells; i++)
                if (!some || rnd() % 2) cells[n++] = i;
        }
        iv_obsp_csr_t got;
        ck_assert_msg(iv_obsp_subset(&src, cells, cells, n, 0, &got, &err) == 0, "%s", err.msg);
        check_against_walk(&src, cells, cells, n, &got);
        /* The transpose is the walk with rows and columns swapped. */
        iv_obsp_csr_t t;
        ck_assert_int_eq(iv_obsp_transpose(&got, &t, &err), 0);
        ck_assert_int_eq(t.nnz, got.nnz);
        for (int64_t c = 0; c < n; c++)
            for (int64_t j = t.indptr[c]; j < t.indptr[c + 1]; j++) {
                int64_t r = t.indices[j], hit = -1;
                if (j > t.indptr[c]) ck_assert_int_gt(r, t.indices[j - 1]);
                for (int64_t i = got.indptr[r]; i < got.indptr[r + 1]; i++)
                    if (got.indices[i] == c) hit = i;
                ck_assert_int_ge(hit, 0);
                ck_assert(val(&t, j) == val(&got, hit));
            }
        iv_obsp_csr_free(&t);
        iv_obsp_csr_free(&got);
        iv_obsp_csr_free(&src);
        free(cells);
    }
}
END_TEST

START_TEST(subset_of_compact_rows_and_many_cells)
{
    /* The reader's form: the distinct rows only, row_of into them; with
     * 200000 cells and a few selected the inverse is a binary search. */
    iv_err_t err = {0};
    for (int round = 0; round < 20; round++) {
        int64_t n_cells = round % 2 ? 200000 : 300;
        int64_t m = 1 + rnd_below(12), n = m + rnd_below(20);
        int64_t *cols = malloc((size_t)n * sizeof *cols), *row_of = malloc((size_t)n * sizeof *row_of);
        /* Columns among a few cells so that rows hit them. */
        int64_t pool[16];
        for (int i = 0; i < 16; i++) pool[i] = rnd_below(n_cells);
        for (int64_t k = 0; k < n; k++) {
            cols[k] = pool[rnd_below(16)];
            row_of[k] = k < m ? k : rnd_below(m);
        }
        iv_obsp_csr_t src;
        memset(&src, 0, sizeof src);
        src.n_rows = m;
        src.n_cols = n_cells;
        src.dtype = IV_DT_FLOAT64;
        src.indptr = calloc((size_t)m + 1, sizeof *src.indptr);
        src.indices = malloc((size_t)m * 16 * sizeof *src.indices);
        src.data = malloc((size_t)m * 16 * 8);
        for (int64_t r = 0; r < m; r++) {
            /* Sorted distinct columns: some of the pool, some others. */
            int64_t k = 0, at = 0;
            while (k < 12) {
                at += 1 + rnd_below(n_cells / 12);
                if (at >= n_cells) break;
                src.indices[src.nnz] = at;
                ((double *)src.data)[src.nnz++] = (double)(rnd() % 7);
                k++;
            }
            src.indptr[r + 1] = src.nnz;
        }
        /* Make a few pool cells stored entries of each row, keeping order. */
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = src.indptr[r]; j < src.indptr[r + 1]; j++)
                if (rnd() % 2) {
                    int64_t lo = j > src.indptr[r] ? src.indices[j - 1] : -1;
                    int64_t hi = j + 1 < src.indptr[r + 1] ? src.indices[j + 1] : n_cells;
                    for (int i = 0; i < 16; i++)
                        if (pool[i] > lo && pool[i] < hi) src.indices[j] = pool[i];
                }
        iv_obsp_csr_t got;
        ck_assert_msg(iv_obsp_subset(&src, row_of, cols, n, 0, &got, &err) == 0, "%s", err.msg);
        check_against_walk(&src, row_of, cols, n, &got);
        iv_obsp_csr_free(&got);
        iv_obsp_csr_free(&src);
        free(cols);
        free(row_of);
    }
}
END_TEST

START_TEST(lying_rows_are_refused)
{
    iv_err_t err = {0};
    iv_obsp_csr_t src = random_csr(6, 6, 1.0, 6, IV_DT_FLOAT64), got;
    int64_t cells[3] = {4, 0, 4};
    ck_assert_int_eq(src.nnz, 36);
    src.indptr[3] = src.indptr[2] - 1;  /* falls */
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 0, &got, &err), IV_EBAD_FILE);
    ck_assert_ptr_nonnull(strstr(err.msg, "pointer"));
    src.indptr[3] = 18;
    iv_err_clear(&err);
    src.indptr[6] = src.nnz + 1;  /* past the entries */
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 0, &got, &err), IV_EBAD_FILE);
    src.indptr[6] = src.nnz;
    iv_err_clear(&err);
    src.indptr[0] = 1;  /* not from 0 */
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 0, &got, &err), IV_EBAD_FILE);
    src.indptr[0] = 0;
    iv_err_clear(&err);
    src.indices[5] = 6;  /* outside the cells */
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 0, &got, &err), IV_EBAD_FILE);
    ck_assert_ptr_nonnull(strstr(err.msg, "outside"));
    src.indices[5] = 5;
    iv_err_clear(&err);
    int64_t far[2] = {1, 6};
    ck_assert_int_eq(iv_obsp_subset(&src, cells, far, 2, 0, &got, &err), IV_EOUT_OF_RANGE);
    iv_err_clear(&err);
    /* All 36 entries, then cell 4 twice: 3 x 3 = 9 entries; a bound of 8 refuses. */
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 8, &got, &err), IV_ETOO_LARGE);
    iv_err_clear(&err);
    ck_assert_int_eq(iv_obsp_subset(&src, cells, cells, 3, 9, &got, &err), 0);
    ck_assert_int_eq(got.nnz, 9);
    iv_obsp_csr_free(&got);
    iv_obsp_csr_free(&src);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("obsp");
    TCase *tc = tcase_create("obsp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, subset_equals_the_walk_on_whole_matrices);
    tcase_add_test(tc, subset_of_compact_rows_and_many_cells);
    tcase_add_test(tc, lying_rows_are_refused);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
