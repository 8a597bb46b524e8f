/* Two datasets answering alike (see same_answers.h). */
#include "same_answers.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rs = 777;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

int iv_test_run_query(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var, iv_out_axis_t axis,
                      iv_block_t **out, int64_t *n_out, iv_err_t *err)
{
    iv_query_t *q;
    iv_query_opts_t qo = {.block_nnz = 500, .axis = axis};
    *out = NULL;
    *n_out = 0;
    IV_TRY(iv_query_new(ds, obs, var, &qo, &q, err));
    int rc = iv_query_prepare(q, NULL, err);
    int64_t n = rc == 0 ? iv_query_n_blocks(q) : 0;
    *out = calloc((size_t)(n ? n : 1), sizeof **out);
    for (int64_t b = 0; b < n && rc == 0; b++) {
        rc = iv_query_decode_block(q, b, &(*out)[b], err);
        if (rc == 0) (*n_out)++;
    }
    iv_query_free(q);
    return rc;
}

void iv_test_free_blocks(iv_block_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) iv_block_free(&b[i]);
    free(b);
}

/* n bytes equal at a and b (an empty block's arrays may be NULL). */
static int same_mem(const void *a, const void *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}

void iv_test_same_answer(iv_dataset_t *ref, iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                         iv_out_axis_t axis)
{
    iv_block_t *a, *b;
    int64_t na, nb;
    iv_err_t err = {0};
    ck_assert_msg(iv_test_run_query(ref, obs, var, axis, &a, &na, &err) == 0, "%s", err.msg);
    ck_assert_msg(iv_test_run_query(ds, obs, var, axis, &b, &nb, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(na, nb);
    for (int64_t i = 0; i < na; i++) {
        ck_assert_int_eq(a[i].row0, b[i].row0);
        ck_assert_int_eq(a[i].n_rows, b[i].n_rows);
        ck_assert_int_eq(a[i].nnz, b[i].nnz);
        ck_assert_int_eq(a[i].index_size, b[i].index_size);
        ck_assert(same_mem(a[i].ids, b[i].ids, (size_t)a[i].n_rows * 8));
        ck_assert(same_mem(a[i].indptr, b[i].indptr, (size_t)(a[i].n_rows + 1) * 8));
        ck_assert(same_mem(a[i].indices, b[i].indices, (size_t)a[i].nnz * (size_t)a[i].index_size));
        ck_assert(same_mem(a[i].data, b[i].data, (size_t)a[i].nnz * iv_dtype_size(a[i].dtype)));
    }
    iv_test_free_blocks(a, na);
    iv_test_free_blocks(b, nb);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void iv_test_same_answers(iv_dataset_t *ref, iv_dataset_t *ds, int rounds)
{
    const iv_dataset_info_t *in = iv_dataset_info(ref);
    for (int r = 0; r < rounds; r++) {
        int64_t no = 1 + (int64_t)(rnd() % 300), nv = 1 + (int64_t)(rnd() % 200);
        int64_t *oi = malloc((size_t)no * 8), *vi = malloc((size_t)nv * 8);
        for (int64_t k = 0; k < no; k++) oi[k] = (int64_t)(rnd() % (uint64_t)in->n_rows);
        for (int64_t k = 0; k < nv; k++) vi[k] = (int64_t)(rnd() % (uint64_t)in->n_cols);
        if (r % 3 == 1) {   /* ascending and distinct */
            qsort(vi, (size_t)nv, 8, cmp_i64);
            int64_t m = 0;
            for (int64_t k = 0; k < nv; k++)
                if (m == 0 || vi[k] != vi[m - 1]) vi[m++] = vi[k];
            nv = m;
        }
        iv_sel_t obs = {.n = no, .idx = oi}, var = {.all = r % 3 == 0, .n = nv, .idx = vi};
        iv_test_same_answer(ref, ds, &obs, &var, r % 2 ? IV_OUT_VARS : IV_OUT_ROWS);
        free(oi);
        free(vi);
    }
    iv_sel_t all = {.all = 1};
    iv_test_same_answer(ref, ds, &all, &all, IV_OUT_ROWS);
}
