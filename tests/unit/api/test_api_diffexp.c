/*
 * The diffexp handler without a socket (api/diffexp.h), on a shared
 * fixture: a group of cells against the rest with every gene listed,
 * against moments computed here from the whole matrix decoded densely;
 * every category against the rest, each group equal to the same group
 * asked for by a filter; the binary answer equal to the JSON one; and
 * each kind of bad request mapped to its status with nothing answered.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check_main.h"
#include "dataset.h"
#include "../../../api/diffexp.h"
#include "buf.h"
#include "dtype.h"
#include "fixtures.h"
#include "query.h"

#define FIXTURE "chunky.ivcsr.zstd.h5ad"

typedef struct fx {
    iv_dataset_t *ds;
    iv_meta_t *meta;
    int64_t n_obs, n_var;
    double *dense;            /* n_obs x n_var, row-major */
} fx_t;

/* The fixture and its whole matrix, decoded through the query engine. */
static int fx_open(fx_t *f)
{
    memset(f, 0, sizeof *f);
    const char *path = iv_test_fixture(FIXTURE);
    if (!path) return 0;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(path, &o, &f->ds, &err) == 0, "%s", err.msg);
    f->meta = iv_test_meta(FIXTURE);
    ck_assert_ptr_nonnull(f->meta);
    const iv_dataset_info_t *in = iv_dataset_info(f->ds);
    f->n_obs = in->n_rows;
    f->n_var = in->n_cols;
    f->dense = calloc((size_t)(f->n_obs * f->n_var), sizeof *f->dense);
    ck_assert_ptr_nonnull(f->dense);
    iv_sel_t all = {.all = 1};
    iv_query_opts_t qo = {0};
    iv_query_t *q = NULL;
    ck_assert_msg(iv_query_new(f->ds, &all, &all, &qo, &q, &err) == 0, "%s", err.msg);
    ck_assert_msg(iv_query_prepare(q, NULL, &err) == 0, "%s", err.msg);
    for (int64_t b = 0; b < iv_query_n_blocks(q); b++) {
        iv_block_t blk;
        ck_assert_msg(iv_query_decode_block(q, b, &blk, &err) == 0, "%s", err.msg);
        for (int64_t r = 0; r < blk.n_rows; r++)
            for (int64_t e = blk.indptr[r]; e < blk.indptr[r + 1]; e++) {
                int64_t j = blk.index_size == 4 ? ((int32_t *)blk.indices)[e] : ((int64_t *)blk.indices)[e];
                f->dense[(blk.row0 + r) * f->n_var + j] = iv_dtype_get_f64(blk.dtype, blk.data, (size_t)e);
            }
        iv_block_free(&blk);
    }
    iv_query_free(q);
    return 1;
}

static void fx_close(fx_t *f)
{
    free(f->dense);
    iv_meta_free(f->meta);
    iv_dataset_close(f->ds);
}

/* Calls the handler on body; returns the handler's code, the answer in
 * *out (empty on failure) and its media type in *ctype. */
static int call(const fx_t *f, const char *body, const char *accept, size_t json_bytes,
                const atomic_int *cancel, iv_buf_t *out, const char **ctype, iv_err_t *err)
{
    iv_api_diffexp_in_t in = {.body = body, .body_len = strlen(body), .ds = f->ds, .meta = f->meta,
                              .json_bytes = json_bytes, .accept = accept, .cancel = cancel};
    out->len = 0;
    *ctype = NULL;
    memset(err, 0, sizeof *err);
    return iv_api_diffexp(&in, out, ctype, err);
}

static cJSON *call_json(const fx_t *f, const char *body)
{
    iv_buf_t out;
    iv_buf_init(&out);
    const char *ctype;
    iv_err_t err;
    int rc = call(f, body, NULL, 0, NULL, &out, &ctype, &err);
    ck_assert_msg(rc == 0, "%s: %s", body, err.msg);
    ck_assert_str_eq(ctype, "application/json");
    cJSON *doc = cJSON_ParseWithLength(out.data, out.len);
    ck_assert_msg(doc != NULL, "the answer to %s is not JSON", body);
    iv_buf_free(&out);
    return doc;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    ck_assert_msg(v != NULL, "no member %s", k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;  /* null: an infinite score */
}

static void near(double got, double want, double rtol, const char *what, int64_t gene)
{
    ck_assert_msg(fabs(got - want) <= rtol * fabs(want) + 1e-12, "gene %lld %s: got %.17g want %.17g",
                  (long long)gene, what, got, want);
}

/* Welch's t and the moments of gene j over the cells with in1[i] (side 1)
 * and the others (side 2), computed the plain way. */
static void moments(const fx_t *f, const int *in1, int64_t j, double *m1, double *m2, double *fr1,
                    double *fr2, double *t)
{
    double s[2] = {0}, nz[2] = {0}, n[2] = {0};
    for (int64_t i = 0; i < f->n_obs; i++) {
        double v = f->dense[i * f->n_var + j];
        int k = in1[i] ? 0 : 1;
        s[k] += v;
        nz[k] += v != 0;
        n[k]++;
    }
    double mean[2] = {s[0] / n[0], s[1] / n[1]}, ss[2] = {0};
    for (int64_t i = 0; i < f->n_obs; i++) {
        double d = f->dense[i * f->n_var + j] - mean[in1[i] ? 0 : 1];
        ss[in1[i] ? 0 : 1] += d * d;
    }
    double v1 = ss[0] / (n[0] - 1) / n[0], v2 = ss[1] / (n[1] - 1) / n[1];
    *m1 = mean[0];
    *m2 = mean[1];
    *fr1 = nz[0] / n[0];
    *fr2 = nz[1] / n[1];
    *t = v1 + v2 > 0 ? (mean[0] - mean[1]) / sqrt(v1 + v2) : 0;
}

START_TEST(group_against_rest_every_gene)
{
    fx_t f;
    if (!fx_open(&f)) return;
    /* Side 1: every third cell of the first 900, listed in reverse order. */
    int *in1 = calloc((size_t)f.n_obs, sizeof *in1);
    char *body = malloc(16 * 400 + 256);
    size_t len = (size_t)sprintf(body, "{\"group1\":{\"index\":[");
    int64_t n1 = 0;
    for (int64_t i = 897; i >= 0; i -= 3) {
        in1[i] = 1;
        len += (size_t)sprintf(body + len, "%s%lld", n1++ ? "," : "", (long long)i);
    }
    sprintf(body + len, "]},\"group2\":\"rest\",\"method\":\"t-test\",\"log1p\":false,\"top_n\":%lld}",
            (long long)f.n_var);
    cJSON *doc = call_json(&f, body);
    ck_assert_int_eq((int64_t)num(doc, "n_group1"), n1);
    ck_assert_int_eq((int64_t)num(doc, "n_group2"), f.n_obs - n1);
    const cJSON *genes = cJSON_GetObjectItemCaseSensitive(doc, "genes");
    ck_assert_int_eq(cJSON_GetArraySize(genes), f.n_var);
    char *seen = calloc((size_t)f.n_var, 1);
    double last = INFINITY;
    const cJSON *g;
    cJSON_ArrayForEach(g, genes)
    {
        int64_t j = (int64_t)num(g, "index");
        ck_assert(j >= 0 && j < f.n_var && !seen[j]);
        seen[j] = 1;
        double m1, m2, fr1, fr2, t;
        moments(&f, in1, j, &m1, &m2, &fr1, &fr2, &t);
        near(num(g, "mean1"), m1, 1e-12, "mean1", j);
        near(num(g, "mean2"), m2, 1e-12, "mean2", j);
        near(num(g, "frac1"), fr1, 1e-15, "frac1", j);
        near(num(g, "frac2"), fr2, 1e-15, "frac2", j);
        double score = num(g, "score");
        if (!isnan(score)) {
            near(score, t, 1e-9, "score", j);
            /* Genes come by score, highest first. */
            ck_assert_msg(score <= last, "gene %lld out of order", (long long)j);
            last = score;
        }
        double p = num(g, "pval"), pa = num(g, "pval_adj");
        ck_assert(p >= 0 && p <= 1 && pa >= p && pa <= 1);
    }
    free(seen);
    cJSON_Delete(doc);
    free(body);
    free(in1);
    fx_close(&f);
}
END_TEST

START_TEST(every_category_equals_its_filter)
{
    fx_t f;
    if (!fx_open(&f)) return;
    cJSON *all = call_json(&f, "{\"group_by\":\"cell_type\",\"reference\":\"rest\",\"method\":\"wilcoxon\","
                               "\"top_n\":7}");
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(all, "groups"), *g;
    ck_assert_int_ge(cJSON_GetArraySize(groups), 2);
    int64_t cells = 0;
    cJSON_ArrayForEach(g, groups)
    {
        const char *key = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "key"), 0)->valuestring;
        char body[512];
        snprintf(body, sizeof body, "{\"group1\":{\"where\":\"cell_type == '%s'\"},\"group2\":\"rest\","
                 "\"method\":\"wilcoxon\",\"top_n\":7}", key);
        cJSON *one = call_json(&f, body);
        ck_assert_int_eq((int64_t)num(g, "n_cells"), (int64_t)num(one, "n_group1"));
        cells += (int64_t)num(g, "n_cells");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(g, "genes");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(one, "genes");
        /* top_n: the 7 highest and the 7 lowest scores. */
        ck_assert_int_eq(cJSON_GetArraySize(a), 14);
        ck_assert_int_eq(cJSON_GetArraySize(b), 14);
        for (int k = 0; k < 14; k++) {
            const cJSON *x = cJSON_GetArrayItem(a, k), *y = cJSON_GetArrayItem(b, k);
            ck_assert_int_eq((int64_t)num(x, "index"), (int64_t)num(y, "index"));
            static const char *const cols[] = {"score", "pval", "mean1", "mean2", "frac1", "frac2"};
            for (size_t c = 0; c < 6; c++)
                near(num(x, cols[c]), num(y, cols[c]), 1e-12, cols[c], (int64_t)num(x, "index"));
        }
        cJSON_Delete(one);
    }
    ck_assert_int_le(cells, f.n_obs);
    cJSON_Delete(all);
    fx_close(&f);
}
END_TEST

START_TEST(binary_equals_json)
{
    fx_t f;
    if (!fx_open(&f)) return;
    const char *body = "{\"group1\":{\"range\":[0,500]},\"group2\":{\"range\":[500,1000]},\"top_n\":40}";
    cJSON *doc = call_json(&f, body);
    iv_buf_t out;
    iv_buf_init(&out);
    const char *ctype;
    iv_err_t err;
    ck_assert_int_eq(call(&f, body, IV_DIFFEXP_MEDIA, 0, NULL, &out, &ctype, &err), 0);
    ck_assert_str_eq(ctype, IV_DIFFEXP_MEDIA);
    ck_assert(out.len >= 16 && !memcmp(out.data, "IVDE", 4));
    uint32_t version;
    int64_t jlen;
    memcpy(&version, out.data + 4, 4);
    memcpy(&jlen, out.data + 8, 8);
    ck_assert_int_eq(version, 1);
    cJSON *head = cJSON_ParseWithLength(out.data + 16, (size_t)jlen);
    ck_assert_ptr_nonnull(head);
    int64_t n = (int64_t)num(head, "n_genes");
    ck_assert_int_eq(n, 80);  /* the 40 highest and the 40 lowest */
    size_t pos = (size_t)(16 + jlen + 7) / 8 * 8;
    ck_assert_uint_eq(out.len, pos + (size_t)n * 8 * 9);
    const cJSON *genes = cJSON_GetObjectItemCaseSensitive(doc, "genes");
    static const char *const cols[] = {"score", "logfoldchange", "pval", "pval_adj",
                                       "mean1", "mean2", "frac1", "frac2"};
    for (int64_t k = 0; k < n; k++) {
        const cJSON *g = cJSON_GetArrayItem(genes, (int)k);
        int64_t idx;
        memcpy(&idx, out.data + pos + (size_t)k * 8, 8);
        ck_assert_int_eq(idx, (int64_t)num(g, "index"));
        for (int c = 0; c < 8; c++) {
            double v;
            memcpy(&v, out.data + pos + (size_t)n * 8 * (size_t)(1 + c) + (size_t)k * 8, 8);
            double w = num(g, cols[c]);
            /* JSON prints 17 significant digits: the same double. */
            ck_assert_msg(v == w || (isnan(w) && isinf(v)), "gene %lld %s: %.17g vs %.17g",
                          (long long)idx, cols[c], v, w);
        }
    }
    cJSON_Delete(head);
    cJSON_Delete(doc);
    iv_buf_free(&out);
    fx_close(&f);
}
END_TEST

START_TEST(bad_requests_answer_nothing)
{
    fx_t f;
    if (!fx_open(&f)) return;
    static const struct {
        const char *body;
        int status;
    } bad[] = {
        {"{not json", 400},
        {"[]", 400},
        {"{}", 400},
        {"{\"group1\":{\"index\":[1]},\"method\":\"anova\"}", 400},
        {"{\"group1\":{\"index\":[1]},\"top_n\":-1}", 400},
        {"{\"group1\":{\"index\":[1]},\"log1p\":\"maybe\"}", 400},
        {"{\"group1\":{\"index\":[1]},\"colour\":\"red\"}", 400},
        {"{\"group1\":{\"index\":[1]},\"group_by\":\"cell_type\"}", 400},
        {"{\"group_by\":\"no_such_column\"}", 422},
        {"{\"group_by\":\"cell_type\",\"reference\":\"no_such_type\"}", 422},
        {"{\"group1\":{\"index\":[1,2]},\"group2\":{\"index\":[2,3]}}", 422},
        {"{\"group1\":{\"index\":[99999999]}}", 422},
        {"{\"group1\":{\"where\":\"cell_type == 'nope'\"}}", 422},
    };
    iv_buf_t out;
    iv_buf_init(&out);
    const char *ctype;
    iv_err_t err;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = call(&f, bad[i].body, NULL, 0, NULL, &out, &ctype, &err);
        ck_assert_msg(rc != 0 && iv_error_status(rc) == bad[i].status, "%s: status %d (%s)", bad[i].body,
                      rc ? iv_error_status(rc) : 200, err.msg);
        ck_assert_msg(err.msg[0] != '\0', "%s: no message", bad[i].body);
    }
    /* A JSON answer past json_bytes is 413; a cancelled request 499. */
    const char *body = "{\"group_by\":\"cell_type\",\"top_n\":4000}";
    int rc = call(&f, body, NULL, 1000, NULL, &out, &ctype, &err);
    ck_assert_msg(iv_error_status(rc) == 413, "json_bytes: %d %s", rc, err.msg);
    atomic_int stop;
    atomic_init(&stop, 1);
    rc = call(&f, body, NULL, 0, &stop, &out, &ctype, &err);
    ck_assert_msg(iv_error_status(rc) == 499, "cancelled: %d %s", rc, err.msg);
    iv_buf_free(&out);
    fx_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_diffexp");
    TCase *tc = tcase_create("handler");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, group_against_rest_every_gene);
    tcase_add_test(tc, every_category_equals_its_filter);
    tcase_add_test(tc, binary_equals_json);
    tcase_add_test(tc, bad_requests_answer_nothing);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
