/*
 * The Zarr store without a socket (api/zarr.h), on the shared fixtures:
 * X read chunk by chunk from the csr/ store (cell-major, the file's
 * orientation) and from the root store (gene-major, a copy built in
 * memory) with chunks of a few entries, so that boundaries fall inside
 * slices everywhere; the two must be the same matrix.  Then every node of
 * .zmetadata parses and every chunk's length is its .zarray's chunk
 * shape; absent keys are IV_ENOT_FOUND.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <zstd.h>

#include "check_main.h"
#include "dataset.h"
#include "fixtures.h"
#include "transpose.h"
#include "zarr.h"
#include "zarr_cache.h"

static iv_dataset_t *open_fixture(const char *name)
{
    const char *path = iv_test_fixture(name);
    if (!path) return NULL;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(path, &o, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

static int get(const iv_zarr_src_t *src, const char *key, iv_buf_t *out, iv_zarr_kind_t *kind)
{
    iv_err_t err = {0};
    out->len = 0;
    return iv_zarr_get(src, key, out, kind, &err);
}

/* Replaces a zstd-compressed chunk in b by its bytes (the sparse
 * matrices' arrays are zstd, api/zarr.h IV_ZARR_ZSTD_LEVEL). */
static void unzstd(iv_buf_t *b)
{
    unsigned long long n = ZSTD_getFrameContentSize(b->data, b->len);
    ck_assert(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN);
    char *raw = malloc(n ? n : 1);
    size_t got = ZSTD_decompress(raw, n, b->data, b->len);
    ck_assert(!ZSTD_isError(got) && got == n);
    b->len = 0;
    iv_buf_append(b, raw, got);
    free(raw);
}

/* A chunk of X, decompressed. */
static int get_x(const iv_zarr_src_t *src, const char *key, iv_buf_t *out, iv_zarr_kind_t *kind)
{
    int rc = get(src, key, out, kind);
    if (rc == 0 && IV_ZARR_ZSTD_LEVEL > 0) unzstd(out);
    return rc;
}

/* The matrix of one store as dense doubles (n_rows x n_cols, cells x genes). */
static double *read_x(const iv_zarr_src_t *src, const char *pre, int csr, int64_t n_rows,
                      int64_t n_cols)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_zarr_kind_t kind;
    char key[128];
    int64_t n_major = csr ? n_rows : n_cols;
    snprintf(key, sizeof key, "%sX/indptr/0", pre);
    ck_assert_int_eq(get_x(src, key, &b, &kind), 0);
    ck_assert_int_eq(kind, IV_ZARR_CHUNK);
    ck_assert_uint_eq(b.len, (size_t)(n_major + 1) * 8);
    int64_t *ptr = malloc(b.len);
    memcpy(ptr, b.data, b.len);
    int64_t nnz = ptr[n_major], C = src->x_chunk;
    int32_t *idx = malloc((size_t)(nnz + C) * 4);
    float *val = malloc((size_t)(nnz + C) * 4);
    for (int64_t k = 0; k * C < nnz; k++) {
        snprintf(key, sizeof key, "%sX/indices/%lld", pre, (long long)k);
        ck_assert_int_eq(get_x(src, key, &b, &kind), 0);
        ck_assert_uint_eq(b.len, (size_t)C * 4);
        memcpy(idx + k * C, b.data, b.len);
        snprintf(key, sizeof key, "%sX/data/%lld", pre, (long long)k);
        ck_assert_int_eq(get_x(src, key, &b, &kind), 0);
        ck_assert_uint_eq(b.len, (size_t)C * 4);
        memcpy(val + k * C, b.data, b.len);
        /* Padding past the end is the fill value. */
        for (int64_t e = nnz; e < (k + 1) * C; e++) ck_assert_int_eq(idx[e], 0);
    }
    snprintf(key, sizeof key, "%sX/indices/%lld", pre, (long long)((nnz + C - 1) / C));
    ck_assert_int_eq(get(src, key, &b, &kind), IV_ENOT_FOUND);
    double *dense = calloc((size_t)(n_rows * n_cols), sizeof *dense);
    for (int64_t j = 0; j < n_major; j++)
        for (int64_t e = ptr[j]; e < ptr[j + 1]; e++) {
            ck_assert(idx[e] >= 0 && idx[e] < (csr ? n_cols : n_rows));
            if (e > ptr[j]) ck_assert(idx[e] > idx[e - 1]);  /* sorted, no duplicates */
            int64_t r = csr ? j : idx[e], c = csr ? idx[e] : j;
            dense[r * n_cols + c] = val[e];
        }
    free(ptr);
    free(idx);
    free(val);
    iv_buf_free(&b);
    return dense;
}

START_TEST(both_orientations_same_matrix)
{
    iv_dataset_t *ds = open_fixture("floaty.ivcsr.blosc2-zstd.h5ad");
    if (!ds) return;
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    ck_assert_int_eq(in->value_dtype, IV_DT_FLOAT32);
    iv_zarr_src_t src = {.ds = ds, .x_chunk = 7};
    iv_buf_t b;
    iv_buf_init(&b);
    iv_zarr_kind_t kind;
    /* Before the gene-major copy: csc chunks wait, metadata does not. */
    ck_assert_int_eq(get(&src, "X/indices/0", &b, &kind), IV_ENOT_READY);
    ck_assert_int_eq(get(&src, "X/indices/.zarray", &b, &kind), 0);
    iv_transpose_opts_t to = {.budget = UINT64_MAX};
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "%s", err.msg);
    double *a = read_x(&src, "csr/", 1, in->n_rows, in->n_cols);
    double *c = read_x(&src, "", 0, in->n_rows, in->n_cols);
    ck_assert(memcmp(a, c, (size_t)(in->n_rows * in->n_cols) * sizeof *a) == 0);
    /* Through the cache of decoded chunks (zarr_cache.h), twice: misses,
     * then hits, each part of a chunk from the other's decode. */
    src.cache = iv_zarr_cache_new();
    ck_assert_ptr_nonnull(src.cache);
    for (int pass = 0; pass < 2; pass++) {
        double *h = read_x(&src, pass ? "csr/" : "", pass, in->n_rows, in->n_cols);
        ck_assert(memcmp(a, h, (size_t)(in->n_rows * in->n_cols) * sizeof *a) == 0);
        free(h);
        h = read_x(&src, pass ? "csr/" : "", pass, in->n_rows, in->n_cols);
        ck_assert(memcmp(a, h, (size_t)(in->n_rows * in->n_cols) * sizeof *a) == 0);
        free(h);
    }
    iv_zarr_cache_free(src.cache);
    free(a);
    free(c);
    iv_buf_free(&b);
    iv_dataset_close(ds);
}
END_TEST

START_TEST(metadata_nodes_and_chunk_sizes)
{
    iv_dataset_t *ds = open_fixture("chunky.ivcsr.zstd.h5ad");
    iv_meta_t *meta = iv_test_meta("chunky.ivcsr.zstd.h5ad");
    if (!ds || !meta) return;
    iv_transpose_opts_t to = {.budget = UINT64_MAX};
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "%s", err.msg);
    iv_zarr_src_t src = {.ds = ds, .meta = meta};
    iv_buf_t b;
    iv_buf_init(&b);
    iv_zarr_kind_t kind;
    ck_assert_int_eq(get(&src, ".zmetadata", &b, &kind), 0);
    ck_assert_int_eq(kind, IV_ZARR_JSON);
    cJSON *doc = cJSON_ParseWithLength(b.data, b.len);
    ck_assert_msg(doc != NULL, "%.*s", (int)(b.len < 300 ? b.len : 300), b.data);
    cJSON *md = cJSON_GetObjectItem(doc, "metadata");
    int n_arrays = 0;
    for (cJSON *it = md ? md->child : NULL; it; it = it->next) {
        size_t kl = strlen(it->string);
        /* Each node answers its own key with the same document. */
        ck_assert_int_eq(get(&src, it->string, &b, &kind), 0);
        cJSON *one = cJSON_ParseWithLength(b.data, b.len);
        ck_assert_msg(one && cJSON_Compare(one, it, 1), "%s", it->string);
        cJSON_Delete(one);
        if (kl < 8 || strcmp(it->string + kl - 8, "/.zarray")) continue;
        n_arrays++;
        cJSON *shape = cJSON_GetObjectItem(it, "shape"), *chunks = cJSON_GetObjectItem(it, "chunks");
        const char *dt = cJSON_GetObjectItem(it, "dtype")->valuestring;
        char key[600];
        snprintf(key, sizeof key, "%.*s/0%s", (int)(kl - 8), it->string,
                 cJSON_GetArraySize(shape) == 2 ? ".0" : "");
        if (cJSON_GetArrayItem(shape, 0)->valuedouble == 0) continue;
        ck_assert_msg(get(&src, key, &b, &kind) == 0, "%s", key);
        ck_assert_int_eq(kind, IV_ZARR_CHUNK);
        if (!strcmp(dt, "|O")) continue;  /* vlen-utf8: lengths vary */
        cJSON *comp = cJSON_GetObjectItem(it, "compressor");
        if (cJSON_IsObject(comp)) {
            ck_assert_str_eq(cJSON_GetObjectItem(comp, "id")->valuestring, "zstd");
            ck_assert_msg(!strncmp(it->string, "X/", 2), "%s", it->string);  /* X's arrays only */
            unzstd(&b);
        }
        size_t want = (size_t)atoi(dt + 2) * (dt[1] == 'U' ? 4 : 1);  /* <UN: N UTF-32 code units */
        for (int d = 0; d < cJSON_GetArraySize(chunks); d++)
            want *= (size_t)cJSON_GetArrayItem(chunks, d)->valuedouble;
        ck_assert_msg(b.len == want, "%s: %zu bytes, want %zu", key, b.len, want);
    }
    ck_assert_int_ge(n_arrays, 4);
    cJSON_Delete(doc);
    static const char *const absent[] = {"", "X", "nope/.zattrs", "X/.zarray", "X/indptr/.zgroup",
                                         "X/indptr/1", "X/indptr/0.0", "X/indptr/-1", "X/indptr/01x",
                                         "obs/_index/99999999999999999999", "csr/csr/.zgroup",
                                         "obsm/.zarray", "X/indptr/0/"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        ck_assert_msg(get(&src, absent[i], &b, &kind) == IV_ENOT_FOUND, "'%s'", absent[i]);
    iv_buf_free(&b);
    iv_meta_free(meta);
    iv_dataset_close(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zarr");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, both_orientations_same_matrix);
    tcase_add_test(tc, metadata_nodes_and_chunk_sizes);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
