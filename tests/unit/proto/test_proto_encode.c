/* Tests of proto/encode.c: the binary framing byte by byte, NDJSON and JSON documents. */
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "encode.h"

static int64_t rd_i64(const char *p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd_u32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Two rows: row 0 has (col 1 = 1.5, col 4 = NaN), row 1 is empty. */
static int64_t ids[2] = {7, 3};
static int64_t indptr[3] = {0, 2, 2};
static int32_t indices[2] = {1, 4};
static float values[2];

static iv_block_t make_block(void)
{
    values[0] = 1.5f;
    values[1] = NAN;
    iv_block_t b = {.row0 = 0, .n_rows = 2, .ids = ids, .indptr = indptr, .indices = indices,
                    .data = values, .nnz = 2, .index_size = 4, .dtype = IV_DT_FLOAT32};
    return b;
}

START_TEST(test_binary_layout)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_stream_hdr_t h = {.n_rows = 2, .n_cols = 5, .dtype = IV_DT_FLOAT32, .index_size = 4};
    iv_enc_header(&b, IV_FMT_BINARY, &h);
    ck_assert_uint_eq(b.len, IV_WIRE_HEADER_BYTES);
    ck_assert_int_eq(memcmp(b.data, "IVQS", 4), 0);
    ck_assert_uint_eq(rd_u32(b.data + 4), 1);
    ck_assert_int_eq(rd_i64(b.data + 8), 2);
    ck_assert_int_eq(rd_i64(b.data + 16), 5);
    ck_assert_str_eq(b.data + 24, "<f4");
    ck_assert_str_eq(b.data + 32, "<i4");
    iv_block_t blk = make_block();
    iv_enc_block(&b, IV_FMT_BINARY, &blk);
    const char *f = b.data + 40;
    ck_assert_uint_eq(rd_u32(f), IV_WIRE_BLOCK);
    ck_assert_int_eq(rd_i64(f + 8), 2);
    ck_assert_int_eq(rd_i64(f + 16), 2);
    ck_assert_int_eq(rd_i64(f + 24), 7);
    ck_assert_int_eq(rd_i64(f + 32), 3);
    ck_assert_int_eq(rd_i64(f + 40 + 8), 2);  /* indptr[1] */
    ck_assert_uint_eq(rd_u32(f + 64), 1);     /* indices[0] */
    ck_assert_uint_eq(rd_u32(f + 68), 4);
    float v0;
    memcpy(&v0, f + 72, 4);
    ck_assert(v0 == 1.5f);
    size_t before = b.len;
    ck_assert_uint_eq(before, 40 + 24 + 16 + 24 + 8 + 8);
    iv_enc_trailer(&b, IV_FMT_BINARY, 0, NULL, NULL, 2, 2);
    ck_assert_uint_eq(b.len - before, 28);
    ck_assert_uint_eq(rd_u32(b.data + before), IV_WIRE_TRAILER);
    ck_assert_uint_eq(rd_u32(b.data + before + 4), 0);
    /* The size formula agrees with what was written (one block). */
    ck_assert_int_eq(iv_enc_binary_size(2, 1, 2, 4, IV_DT_FLOAT32), (int64_t)b.len);

    /* An error trailer carries the status and a JSON error object. */
    size_t at = b.len;
    iv_enc_trailer(&b, IV_FMT_BINARY, 500, "corrupt_data", "bad \"chunk\"", 1, 2);
    ck_assert_uint_eq(rd_u32(b.data + at + 4), 500);
    uint32_t ml = rd_u32(b.data + at + 24);
    ck_assert_uint_eq(b.len, at + 28 + ml);
    cJSON *j = cJSON_ParseWithLength(b.data + at + 28, ml);
    ck_assert_ptr_nonnull(j);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItem(e, "message")->valuestring, "bad \"chunk\"");
    cJSON_Delete(j);
    ck_assert_int_eq(b.oom, 0);
    iv_buf_free(&b);
}
END_TEST

START_TEST(test_ndjson_lines)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_stream_hdr_t h = {.n_rows = 2, .n_cols = 5, .dtype = IV_DT_FLOAT32, .index_size = 4};
    iv_block_t blk = make_block();
    iv_enc_header(&b, IV_FMT_NDJSON, &h);
    iv_enc_block(&b, IV_FMT_NDJSON, &blk);
    iv_enc_trailer(&b, IV_FMT_NDJSON, 0, NULL, NULL, 2, 2);
    iv_buf_append(&b, "", 1);
    char *save = NULL;
    char *l1 = strtok_r(b.data, "\n", &save), *l2 = strtok_r(NULL, "\n", &save),
         *l3 = strtok_r(NULL, "\n", &save);
    ck_assert_ptr_null(strtok_r(NULL, "\n", &save));
    cJSON *a = cJSON_Parse(l1), *c = cJSON_Parse(l2), *d = cJSON_Parse(l3);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(cJSON_GetObjectItem(a, "dtype")->valuestring, "float32");
    ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "obs"), 0)->valueint, 7);
    cJSON *data = cJSON_GetObjectItem(c, "data");
    ck_assert(cJSON_GetArrayItem(data, 0)->valuedouble == 1.5);
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(data, 1)));
    ck_assert_str_eq(cJSON_GetObjectItem(d, "status")->valuestring, "ok");
    cJSON_Delete(a);
    cJSON_Delete(c);
    cJSON_Delete(d);
    iv_buf_free(&b);
}
END_TEST

START_TEST(test_json_document_joins_blocks)
{
    iv_jdoc_t d;
    iv_jdoc_init(&d);
    iv_block_t b1 = make_block();
    int64_t ids2[1] = {9};
    int64_t ip2[2] = {0, 1};
    int64_t ix2[1] = {2};
    double v2[1] = {0.1};
    iv_block_t b2 = {.row0 = 2, .n_rows = 1, .ids = ids2, .indptr = ip2, .indices = ix2,
                     .data = v2, .nnz = 1, .index_size = 8, .dtype = IV_DT_FLOAT64};
    iv_jdoc_add(&d, &b1);
    iv_jdoc_add(&d, &b2);
    iv_buf_t out;
    iv_buf_init(&out);
    iv_stream_hdr_t h = {.n_rows = 3, .n_cols = 5, .dtype = IV_DT_FLOAT64, .index_size = 8};
    iv_jdoc_finish(&d, &h, &out);
    cJSON *j = cJSON_ParseWithLength(out.data, out.len);
    ck_assert_ptr_nonnull(j);
    cJSON *ip = cJSON_GetObjectItem(j, "indptr");
    ck_assert_int_eq(cJSON_GetArraySize(ip), 4);
    ck_assert_int_eq(cJSON_GetArrayItem(ip, 3)->valueint, 3);
    ck_assert_int_eq(cJSON_GetArrayItem(ip, 2)->valueint, 2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "obs")), 3);
    ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "indices"), 2)->valueint, 2);
    /* %.17g round-trips 0.1 exactly. */
    ck_assert(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 2)->valuedouble == 0.1);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "nnz")->valueint, 3);
    cJSON_Delete(j);
    iv_buf_free(&out);
    iv_jdoc_free(&d);
}
END_TEST

/* Gene rows: the same block as two genes (ids 7 and 3) over 5 selected
 * cells; dense frames spell out every cell, zero where nothing is stored. */
START_TEST(test_gene_rows_and_dense)
{
    iv_block_t blk = make_block();
    iv_stream_hdr_t h = {.n_rows = 5, .n_cols = 2, .dtype = IV_DT_FLOAT32, .index_size = 4,
                         .by_var = 1};
    iv_buf_t b;
    iv_buf_init(&b);
    iv_enc_block_h(&b, IV_FMT_BINARY, &h, &blk);
    ck_assert_uint_eq(rd_u32(b.data), IV_WIRE_VAR_BLOCK);
    ck_assert_int_eq(rd_i64(b.data + 8), 2);
    ck_assert_int_eq(rd_i64(b.data + 24), 7);
    iv_buf_free(&b);

    h.dense = 1;
    iv_buf_init(&b);
    iv_enc_block_h(&b, IV_FMT_BINARY, &h, &blk);
    ck_assert_uint_eq(b.len, 24 + 2 * 8 + 2 * 5 * 4);
    ck_assert_uint_eq(rd_u32(b.data), IV_WIRE_DENSE_BLOCK);
    ck_assert_int_eq(rd_i64(b.data + 8), 2);
    ck_assert_int_eq(rd_i64(b.data + 16), 5);
    ck_assert_int_eq(rd_i64(b.data + 24), 7);
    ck_assert_int_eq(rd_i64(b.data + 32), 3);
    float row[10];
    memcpy(row, b.data + 40, sizeof row);
    ck_assert(row[0] == 0 && row[1] == 1.5f && row[2] == 0 && row[3] == 0 && isnan(row[4]));
    for (int k = 5; k < 10; k++) ck_assert(row[k] == 0 && !signbit(row[k]));
    iv_buf_free(&b);

    iv_buf_init(&b);
    iv_enc_header(&b, IV_FMT_NDJSON, &h);
    iv_enc_block_h(&b, IV_FMT_NDJSON, &h, &blk);
    iv_buf_append(&b, "", 1);
    ck_assert_ptr_nonnull(strstr(b.data, "\"by\":\"var\",\"dense\":true"));
    ck_assert_ptr_nonnull(strstr(b.data, "\"var\":[7,3],\"data\":[[0,1.5,0,0,null],[0,0,0,0,0]]"));
    iv_buf_free(&b);

    iv_jdoc_t d;
    iv_jdoc_init(&d);
    iv_jdoc_add_h(&d, &h, &blk);
    iv_buf_init(&b);
    iv_jdoc_finish(&d, &h, &b);
    iv_buf_append(&b, "", 1);
    cJSON *doc = cJSON_Parse(b.data);
    ck_assert_ptr_nonnull(doc);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(doc, "dense")));
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "data")), 2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "data"), 1)), 5);
    ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "var"), 1)->valueint, 3);
    cJSON_Delete(doc);
    iv_buf_free(&b);
    iv_jdoc_free(&d);
}
END_TEST

START_TEST(test_error_document_escapes)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_enc_error(&b, "bad_json", "line\nbreak \\ \x01");
    cJSON *j = cJSON_ParseWithLength(b.data, b.len);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring,
                     "line\nbreak \\ \x01");
    cJSON_Delete(j);
    iv_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto_encode");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_binary_layout);
    tcase_add_test(tc, test_ndjson_lines);
    tcase_add_test(tc, test_json_document_joins_blocks);
    tcase_add_test(tc, test_error_document_escapes);
    tcase_add_test(tc, test_gene_rows_and_dense);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
