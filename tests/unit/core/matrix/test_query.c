/*
 * The engine against the fixtures' expected matrices: whole-matrix and
 * random selections (unsorted or ascending, duplicates, gene subsets) decoded under
 * different thread counts, row-index strides, cache budgets, block sizes
 * and varint decoders (AVX-512 or one at a time) must equal a simple
 * gather from the expected CSR.
 */
#include <check.h>

#include "check_main.h"
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset.h"
#include "query.h"

/* libcheck reports every passing ck_assert through a pipe; inner loops
 * use this instead, which only reports failures. */
#define EXPECT(cond, ...)                          \
    do {                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);    \
    } while (0)

struct csr {
    int64_t n_rows, n_cols;
    int64_t *indptr;
    int32_t *indices;
    double *data;
};

static int read_expected(const char *path, struct csr *m)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return -1;
    int64_t shape[2];
    hid_t a = H5Aopen(f, "shape", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, shape);
    H5Aclose(a);
    m->n_rows = shape[0];
    m->n_cols = shape[1];
    const char *names[3] = {"indptr", "indices", "data"};
    void **dst[3] = {(void **)&m->indptr, (void **)&m->indices, (void **)&m->data};
    hid_t types[3] = {H5T_NATIVE_INT64, H5T_NATIVE_INT32, H5T_NATIVE_DOUBLE};
    size_t sizes[3] = {8, 4, 8};
    for (int i = 0; i < 3; i++) {
        hid_t d = H5Dopen2(f, names[i], H5P_DEFAULT);
        hid_t sp = H5Dget_space(d);
        hssize_t n = H5Sget_simple_extent_npoints(sp);
        *dst[i] = malloc((size_t)(n ? n : 1) * sizes[i]);
        if (n > 0) H5Dread(d, types[i], H5S_ALL, H5S_ALL, H5P_DEFAULT, *dst[i]);
        H5Sclose(sp);
        H5Dclose(d);
    }
    H5Fclose(f);
    return 0;
}

static void csr_free(struct csr *m)
{
    free(m->indptr);
    free(m->indices);
    free(m->data);
}

static uint64_t rs = 12345;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Drops repeats from a sorted list; returns the new length. */
static int64_t uniq(int64_t *v, int64_t n)
{
    int64_t m = 0;
    for (int64_t k = 0; k < n; k++)
        if (m == 0 || v[m - 1] != v[k]) v[m++] = v[k];
    return m;
}

/* Decodes everything and checks it against the reference gather. */
static void check_query(iv_dataset_t *ds, iv_pool_t *pool, const struct csr *m, const iv_sel_t *obs,
                        const iv_sel_t *var, int64_t block_nnz, const char *label)
{
    iv_err_t err = {0};
    iv_query_t *q;
    iv_query_opts_t qo = {.block_nnz = block_nnz};
    ck_assert_msg(iv_query_new(ds, obs, var, &qo, &q, &err) == 0, "%s: %s", label, err.msg);
    ck_assert_msg(iv_query_prepare(q, pool, &err) == 0, "%s: %s", label, err.msg);
    int64_t nr = obs->all ? m->n_rows : obs->n, nc = var->all ? m->n_cols : var->n;
    ck_assert_int_eq(iv_query_n_rows(q), nr);
    ck_assert_int_eq(iv_query_n_cols(q), nc);
    /* Inverse of the var selection: column -> positions, via a dense list. */
    int64_t *col_first = malloc((size_t)(m->n_cols + 1) * sizeof(int64_t));
    int64_t *col_pos = malloc((size_t)(nc ? nc : 1) * sizeof(int64_t));
    memset(col_first, 0, (size_t)(m->n_cols + 1) * sizeof(int64_t));
    for (int64_t k = 0; k < nc; k++) col_first[(var->all ? k : var->idx[k]) + 1]++;
    for (int64_t j = 0; j < m->n_cols; j++) col_first[j + 1] += col_first[j];
    int64_t *fill = malloc((size_t)(m->n_cols + 1) * sizeof(int64_t));
    memcpy(fill, col_first, (size_t)(m->n_cols + 1) * sizeof(int64_t));
    for (int64_t k = 0; k < nc; k++) col_pos[fill[var->all ? k : var->idx[k]]++] = k;
    free(fill);
    double *dense = malloc((size_t)(nc ? nc : 1) * sizeof(double));
    char *has = malloc((size_t)(nc ? nc : 1));

    int64_t row = 0, total = 0;
    for (int64_t b = 0; b < iv_query_n_blocks(q); b++) {
        iv_block_t blk;
        ck_assert_msg(iv_query_decode_block(q, b, &blk, &err) == 0, "%s: %s", label, err.msg);
        ck_assert_int_eq(blk.row0, row);
        for (int64_t r = 0; r < blk.n_rows; r++, row++) {
            int64_t src = obs->all ? row : obs->idx[row];
            EXPECT(blk.ids[r] == src, "%s: row id", label);
            memset(has, 0, (size_t)nc);
            int64_t want = 0;
            for (int64_t t = m->indptr[src]; t < m->indptr[src + 1]; t++) {
                int64_t j = m->indices[t];
                for (int64_t u = col_first[j]; u < col_first[j + 1]; u++) {
                    has[col_pos[u]] = 1;
                    dense[col_pos[u]] = m->data[t];
                    want++;
                }
            }
            int64_t a = blk.indptr[r], e = blk.indptr[r + 1];
            EXPECT(e - a == want, "%s: row %ld has %ld entries, expected %ld", label,
                          (long)row, (long)(e - a), (long)want);
            int64_t prev = -1;
            for (int64_t t = a; t < e; t++) {
                int64_t c = blk.index_size == 4 ? ((int32_t *)blk.indices)[t] : ((int64_t *)blk.indices)[t];
                EXPECT(c > prev && c < nc && has[c], "%s: row %ld bad column %ld", label,
                              (long)row, (long)c);
                prev = c;
                double v = iv_dtype_get_f64(blk.dtype, blk.data, (size_t)t);
                EXPECT((isnan(v) && isnan(dense[c])) || v == dense[c],
                              "%s: row %ld col %ld: %g != %g", label, (long)row, (long)c, v, dense[c]);
            }
        }
        total += blk.nnz;
        iv_block_free(&blk);
    }
    ck_assert_int_eq(row, nr);
    if (iv_query_nnz_hint(q) >= 0) ck_assert_int_eq(iv_query_nnz_hint(q), total);
    free(dense);
    free(has);
    free(col_first);
    free(col_pos);
    iv_query_free(q);
}

static const char *fixtures[][2] = {
    {"tiny.ivcsr.blosc2-lz4.h5ad", "expected/tiny.csr.h5"},
    {"tiny.ivcsc.blosc2-lz4.h5ad", "expected/tiny.csr.h5"},
    {"tiny.ivcsr.raw.h5ad", "expected/tiny.csr.h5"},
    {"wide.ivcsr.zstd.h5ad", "expected/wide.csr.h5"},
    {"wide.ivcsc.zstd.h5ad", "expected/wide.csr.h5"},
    {"floaty.ivcsr.gzip.h5ad", "expected/floaty.csr.h5"},
    {"floaty.ivcsr.blosc2-zstd.h5ad", "expected/floaty.csr.h5"},
    {"chunky.ivcsr.zstd.h5ad", "expected/chunky.csr.h5"},
    {"chunky.ivcsc.blosc2-lz4.h5ad", "expected/chunky.csr.h5"},
    {"real/pbmc_small.ivcsr.h5ad", "real/expected/pbmc_small.csr.h5"},
};

/* Random selections per fixture and setting.  The sanitizer builds run a
 * third of them: the same paths (every fourth kind of selection, blocks
 * big and small) at a fraction of the time, the release build all. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RANDOM_ROUNDS 4
#else
#define RANDOM_ROUNDS 12
#endif

START_TEST(fixtures_under_all_settings)
{
    char path[4096], exp[4096];
    snprintf(path, sizeof path, "%s/%s", IV_FIXTURES, fixtures[_i][0]);
    snprintf(exp, sizeof exp, "%s/%s", IV_FIXTURES, fixtures[_i][1]);
    if (access(path, R_OK) != 0) {
        printf("SKIP %s: fixtures folder %s is absent\n", fixtures[_i][0], IV_FIXTURES);
        return;
    }
    struct csr m;
    ck_assert_int_eq(read_expected(exp, &m), 0);
    const uint32_t strides[] = {1, 7, 16};
    const size_t caches[] = {0, (size_t)1 << 30};
    for (int t = 0; t < 2; t++) {
        iv_pool_t *pool = t ? iv_pool_create(3, 0) : NULL;
        /* With the pool, plan through the per-slice entry table too. */
        iv_query_set_nnz_table_min(t ? 0 : (int64_t)1 << 16);
        for (int si = 0; si < 3; si++) {
            /* The AVX-512 decode and the one-varint-at-a-time decode, each
             * under both pool settings (where the CPU has AVX-512). */
            iv_query_set_vector((si + t) % 2);
            iv_dataset_opts_t o;
            iv_dataset_opts_init(&o);
            o.index_stride = strides[si];
            o.cache_bytes = caches[si % 2];
            o.pool = pool;
            iv_dataset_t *ds;
            iv_err_t err = {0};
            ck_assert_msg(iv_dataset_open(path, &o, &ds, &err) == 0, "%s", err.msg);
            iv_sel_t all = {.all = 1};
            check_query(ds, pool, &m, &all, &all, 0, "all");
            check_query(ds, pool, &m, &all, &all, 50, "all, tiny blocks");
            for (int it = 0; it < RANDOM_ROUNDS; it++) {
                int64_t no = (int64_t)(rnd() % (uint64_t)(2 * m.n_rows + 1));
                int64_t nv = (int64_t)(rnd() % (uint64_t)(m.n_cols + 3));
                int64_t *oi = malloc((size_t)(no + 1) * sizeof(int64_t));
                int64_t *vi = malloc((size_t)(nv + 1) * sizeof(int64_t));
                for (int64_t k = 0; k < no; k++) oi[k] = m.n_rows ? (int64_t)(rnd() % (uint64_t)m.n_rows) : 0;
                for (int64_t k = 0; k < nv; k++) vi[k] = (int64_t)(rnd() % (uint64_t)m.n_cols);
                if (it % 4 == 1 || it % 4 == 3) {
                    /* Ascending with repeats: the lookup tables skip their
                     * sort.  Strictly ascending, as filters and masks give:
                     * positions are ranks in the selection's bitmap. */
                    qsort(oi, (size_t)no, sizeof *oi, cmp_i64);
                    qsort(vi, (size_t)nv, sizeof *vi, cmp_i64);
                    if (it % 4 == 3) {
                        no = uniq(oi, no);
                        nv = uniq(vi, nv);
                    }
                }
                iv_sel_t obs = {.n = no, .idx = oi}, var = {.n = nv, .idx = vi};
                check_query(ds, pool, &m, &obs, it % 3 ? &var : &all, it % 2 ? 0 : 300, "random");
                free(oi);
                free(vi);
            }
            iv_cache_stats_t cs;
            iv_dataset_cache_stats(ds, &cs);
            ck_assert_uint_le(cs.used, cs.budget);
            /* Dropping the cache (which resets the chunk arena) and decoding
             * again must give the same matrix, from freshly decompressed
             * chunks. */
            iv_dataset_cache_drop(ds);
            iv_dataset_cache_stats(ds, &cs);
            ck_assert_uint_eq(cs.used, 0);
            check_query(ds, pool, &m, &all, &all, 0, "all, after a cache drop");
            iv_dataset_close(ds);
        }
        iv_pool_destroy(pool);
    }
    iv_query_set_vector(1);
    csr_free(&m);
}
END_TEST

START_TEST(out_of_range_selection_is_422)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", IV_FIXTURES, "tiny.ivcsr.raw.h5ad");
    if (access(path, R_OK) != 0) {
        printf("SKIP: fixtures folder %s is absent\n", IV_FIXTURES);
        return;
    }
    iv_dataset_t *ds;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_dataset_open(path, NULL, &ds, &err), 0);
    int64_t bad[] = {0, 60};
    iv_sel_t obs = {.n = 2, .idx = bad}, all = {.all = 1};
    iv_query_t *q;
    ck_assert_int_eq(iv_query_new(ds, &obs, &all, NULL, &q, &err), IV_EOUT_OF_RANGE);
    ck_assert_int_eq(iv_error_status(err.code), 422);
    ck_assert_ptr_nonnull(strstr(err.msg, "60"));
    iv_err_clear(&err);
    int64_t neg[] = {-1};
    iv_sel_t var = {.n = 1, .idx = neg};
    ck_assert_int_eq(iv_query_new(ds, &all, &var, NULL, &q, &err), IV_EOUT_OF_RANGE);
    iv_dataset_close(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("query");
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, fixtures_under_all_settings, 0,
                        (int)(sizeof fixtures / sizeof fixtures[0]));
    tcase_add_test(tc, out_of_range_selection_is_422);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
