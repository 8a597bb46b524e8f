/* Tests of proto/enc_dataset.c: the dataset summary, orientations and
 * count documents, parsed back as JSON member by member. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "enc_dataset.h"
#include "encode.h"

/* b's bytes plus suffix, parsed (the caller frees it). */
static cJSON *parse(iv_buf_t *b, const char *suffix)
{
    iv_buf_puts(b, suffix);
    ck_assert(!b->oom);
    cJSON *j = cJSON_ParseWithLength(b->data, b->len);
    ck_assert_msg(j != NULL, "not JSON: %.*s", (int)b->len, b->data);
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    ck_assert_msg(cJSON_IsNumber(v), "member %s", k);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    ck_assert_msg(cJSON_IsString(v), "member %s", k);
    return v->valuestring;
}

START_TEST(test_summary_members)
{
    iv_dataset_info_t in;
    memset(&in, 0, sizeof in);
    in.orient = IV_IVCSC;
    in.n_rows = 120;
    in.n_cols = 33;
    in.nnz = 999;
    in.value_dtype = IV_DT_FLOAT32;
    in.indices_dtype = IV_DT_INT64;
    snprintf(in.codec, sizeof in.codec, "zstd");
    iv_buf_t b;
    iv_buf_init(&b);
    /* A title defaults to the id; quotes in either are escaped. */
    iv_enc_ds_summary(&b, "a\"b", NULL, &in, 1);
    cJSON *j = parse(&b, "}");
    ck_assert_str_eq(str(j, "id"), "a\"b");
    ck_assert_str_eq(str(j, "title"), "a\"b");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    ck_assert_int_eq(cJSON_GetArraySize(shape), 2);
    ck_assert_int_eq((int)cJSON_GetArrayItem(shape, 0)->valuedouble, 120);
    ck_assert_int_eq((int)cJSON_GetArrayItem(shape, 1)->valuedouble, 33);
    ck_assert_str_eq(str(j, "orientation"), "ivcsc");
    ck_assert_int_eq((int)num(j, "nnz"), 999);
    ck_assert_str_eq(str(j, "dtype"), "float32");
    ck_assert_str_eq(str(j, "indices_dtype"), "int64");
    ck_assert_str_eq(str(j, "codec"), "zstd");
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ready")));
    cJSON_Delete(j);
    iv_buf_free(&b);

    /* The list's form: its own title, no indices dtype. */
    iv_buf_init(&b);
    in.orient = IV_IVCSR;
    iv_enc_ds_summary(&b, "x", "The X", &in, 0);
    j = parse(&b, "}");
    ck_assert_str_eq(str(j, "title"), "The X");
    ck_assert_str_eq(str(j, "orientation"), "ivcsr");
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "indices_dtype"));
    cJSON_Delete(j);
    iv_buf_free(&b);
}
END_TEST

/* The tiny fixture, or NULL (the test says it skipped). */
static iv_dataset_t *open_tiny(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", IV_FIXTURES, "tiny.ivcsr.raw.h5ad");
    if (access(path, R_OK) != 0) {
        printf("SKIP: fixtures folder %s is absent\n", IV_FIXTURES);
        return NULL;
    }
    iv_dataset_t *ds;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(path, NULL, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

START_TEST(test_count_document)
{
    iv_dataset_t *ds = open_tiny();
    if (!ds) return;
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    int64_t cells[] = {3, 1};
    int64_t genes[] = {0, 2, 4};
    iv_sel_t obs = {.n = 2, .idx = cells}, var = {.n = 3, .idx = genes};
    for (int by_var = 0; by_var < 2; by_var++) {
        iv_query_opts_t qo = {.axis = by_var ? IV_OUT_VARS : IV_OUT_ROWS, .pick = IV_PICK_AUTO};
        iv_query_t *q;
        iv_err_t err = {0};
        ck_assert_msg(iv_query_new(ds, &obs, &var, &qo, &q, &err) == 0, "%s", err.msg);
        iv_buf_t b;
        iv_buf_init(&b);
        iv_enc_count(&b, q, 5, 2.5, ds, "{\"obs\":[\"x\"],\"var\":[]}");
        cJSON *j = parse(&b, "");
        /* The shape is cells x genes whatever the rows of the blocks are. */
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
        ck_assert_int_eq((int)cJSON_GetArrayItem(shape, 0)->valuedouble, 2);
        ck_assert_int_eq((int)cJSON_GetArrayItem(shape, 1)->valuedouble, 3);
        ck_assert_int_eq((int)num(j, "n_cells"), 2);
        ck_assert_int_eq((int)num(j, "n_genes"), 3);
        ck_assert_int_eq((int)num(j, "nnz"), 5);
        ck_assert(num(j, "total_counts") == 2.5);
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(j, "bytes");
        int64_t nb = iv_query_n_blocks(q);
        ck_assert(num(bytes, "binary") == (double)iv_enc_binary_size(iv_query_n_rows(q), nb, 5,
                                                                     iv_query_index_size(q),
                                                                     iv_query_dtype(q)));
        ck_assert_int_eq((int)num(j, "blocks"), (int)nb);
        ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "exact")));
        ck_assert_str_eq(str(j, "orientation"), iv_query_orient(q) == IV_IVCSR ? "cells" : "genes");
        const cJSON *or = cJSON_GetObjectItemCaseSensitive(j, "orientations");
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(or, in->orient == IV_IVCSR ? "cells" : "genes");
        ck_assert_str_eq(str(own, "state"), "ready");
        ck_assert_str_eq(str(own, "source"), "file");
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(or, in->orient == IV_IVCSR ? "genes" : "cells");
        ck_assert_str_eq(str(other, "state"), "none");
        const cJSON *dropped = cJSON_GetObjectItemCaseSensitive(j, "dropped");
        ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(dropped, "obs"), 0)->valuestring, "x");
        cJSON_Delete(j);
        iv_buf_free(&b);

        /* Without a dataset or dropped names, neither member. */
        iv_buf_init(&b);
        iv_enc_count(&b, q, 0, 0, NULL, NULL);
        j = parse(&b, "");
        ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "orientations"));
        ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "dropped"));
        cJSON_Delete(j);
        iv_buf_free(&b);
        iv_query_free(q);
    }
    iv_dataset_close(ds);
}
END_TEST

START_TEST(test_file_state_ok)
{
    iv_dataset_t *ds = open_tiny();
    if (!ds) return;
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "{\"a\":1");
    iv_enc_file_state(&b, ds);
    cJSON *j = parse(&b, "}");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "file");
    ck_assert_str_eq(str(f, "state"), "ok");
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(f, "message"));
    cJSON_Delete(j);
    iv_buf_free(&b);
    iv_dataset_close(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("enc_dataset");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_summary_members);
    tcase_add_test(tc, test_count_document);
    tcase_add_test(tc, test_file_state_ok);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
