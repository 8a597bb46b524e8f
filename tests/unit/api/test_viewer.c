/*
 * The viewer routes without a socket (api/viewer.h): the route table, a
 * name search run through iv_vreq_run on the tiny fixture (its answer
 * names the gene searched for), the ETag's 304, and the errors a bad
 * request gets (no q, a selection the route does not take, POST).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check_main.h"
#include "dataset.h"
#include "fixtures.h"
#include "meta.h"
#include "viewer.h"

typedef struct fx {
    iv_dataset_t *ds;
    iv_meta_t *meta;
    iv_vds_t *vx;
    const char *path;
} fx_t;

static int fx_open(fx_t *f)
{
    memset(f, 0, sizeof *f);
    f->path = iv_test_fixture("tiny.ivcsr.blosc2-lz4.h5ad");
    if (!f->path) return 0;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(f->path, &o, &f->ds, &err) == 0, "%s", err.msg);
    ck_assert_msg(iv_meta_load(f->path, NULL, &f->meta, &err) == 0, "%s", err.msg);
    f->vx = iv_vds_load(f->path, f->ds, f->meta);
    ck_assert_ptr_nonnull(f->vx);
    return 1;
}

static void fx_close(fx_t *f)
{
    iv_vds_free(f->vx);
    iv_meta_free(f->meta);
    iv_dataset_close(f->ds);
}

/* A GET of route with query q, ready to run on f. */
static iv_vreq_t *vreq(const fx_t *f, int route, const char *sub, int post, const char *q)
{
    int bad = 0;
    char *body = post ? strdup("{}") : NULL;
    iv_vreq_t *r = iv_vreq_new(route, sub, post, q, body, body ? 2 : 0, "application/json", &bad);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(bad, 0);
    r->ds = f->ds;
    r->meta = f->meta;
    r->vx = f->vx;
    r->json_bytes = 1 << 20;
    return r;
}

START_TEST(route_table)
{
    ck_assert_int_eq(iv_vroute_match("/var/search"), IV_VR_VAR_SEARCH);
    ck_assert_int_eq(iv_vroute_match("/obs/search"), IV_VR_OBS_SEARCH);
    ck_assert_int_eq(iv_vroute_match("/obs"), IV_VR_OBS_TABLE);
    ck_assert_int_eq(iv_vroute_match("/obs/cell_type"), IV_VR_OBS_COLUMN);
    ck_assert_int_eq(iv_vroute_match("/obsm/X_umap"), IV_VR_OBSM);
    ck_assert_int_eq(iv_vroute_match("/raw/var/search"), IV_VR_RAW_VAR_SEARCH);
    ck_assert_int_eq(iv_vroute_match("/raw/var/gene_ids"), IV_VR_RAW_VAR_COLUMN);
    /* A zarr key keeps its slashes; other names are one segment. */
    ck_assert_int_eq(iv_vroute_match("/zarr/X/indices/0"), IV_VR_ZARR);
    ck_assert_int_eq(iv_vroute_match("/obsm/a/b"), IV_VR_NONE);
    ck_assert_int_eq(iv_vroute_match("/obsm/"), IV_VR_NONE);
    ck_assert_int_eq(iv_vroute_match("/nope"), IV_VR_NONE);
    ck_assert(iv_vroute_allows_post(IV_VR_AGGREGATE));
    ck_assert(!iv_vroute_allows_post(IV_VR_VAR_SEARCH));
    ck_assert(!iv_vroute_allows_post(IV_VR_ZARR));
}
END_TEST

START_TEST(search_names_a_gene_and_revalidates)
{
    fx_t f;
    if (!fx_open(&f)) return;  /* iv_test_fixture said the checks are skipped */
    const iv_meta_col_t *ix = iv_meta_index(f.meta, IV_AXIS_VAR);
    ck_assert_ptr_nonnull(ix);
    const char *gene = iv_meta_col_str(ix, ix->n - 1);
    ck_assert_ptr_nonnull(gene);
    char q[300];
    snprintf(q, sizeof q, "q=%s&limit=5", gene);
    iv_vreq_t *r = vreq(&f, IV_VR_VAR_SEARCH, "/var/search", 0, q);
    iv_err_t err = {0};
    ck_assert_msg(iv_vreq_run(r, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(r->status, 200);
    ck_assert_str_eq(r->ctype, "application/json");
    cJSON *doc = cJSON_ParseWithLength(r->out.data, r->out.len);
    ck_assert_ptr_nonnull(doc);
    ck_assert_str_eq(cJSON_GetObjectItem(doc, "axis")->valuestring, "var");
    cJSON *res = cJSON_GetObjectItem(doc, "results");
    ck_assert(cJSON_GetArraySize(res) >= 1);
    int found = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, res) {
        if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, gene)) {
            ck_assert_int_eq((int)cJSON_GetObjectItem(it, "index")->valuedouble, (int)(ix->n - 1));
            found = 1;
        }
    }
    ck_assert_msg(found, "the search for %s did not return it", gene);
    cJSON_Delete(doc);
    /* The ETag it sent answers a revalidation with 304 and no body. */
    const char *e = strstr(r->extra, "ETag: ");
    ck_assert_ptr_nonnull(e);
    char tag[64];
    ck_assert_int_eq(sscanf(e, "ETag: %63s", tag), 1);
    iv_vreq_t *again = vreq(&f, IV_VR_VAR_SEARCH, "/var/search", 0, q);
    again->if_none_match = strdup(tag);
    ck_assert_int_eq(iv_vreq_run(again, &err), 0);
    ck_assert_int_eq(again->status, 304);
    ck_assert_uint_eq(again->out.len, 0);
    /* Another query is another tag. */
    iv_vreq_t *other = vreq(&f, IV_VR_VAR_SEARCH, "/var/search", 0, "q=zz");
    other->if_none_match = strdup(tag);
    ck_assert_int_eq(iv_vreq_run(other, &err), 0);
    ck_assert_int_eq(other->status, 200);
    iv_vreq_free(other);
    iv_vreq_free(again);
    iv_vreq_free(r);
    fx_close(&f);
}
END_TEST

/* Runs a request that must fail with code; its message names what. */
static void fails(const fx_t *f, int route, const char *sub, int post, const char *q, int code,
                  const char *what)
{
    iv_vreq_t *r = vreq(f, route, sub, post, q);
    iv_err_t err = {0};
    ck_assert_int_lt(iv_vreq_run(r, &err), 0);
    ck_assert_int_eq(err.code, code);
    ck_assert_msg(strstr(err.msg, what), "'%s' does not say '%s'", err.msg, what);
    iv_vreq_free(r);
}

START_TEST(bad_requests_are_errors)
{
    fx_t f;
    if (!fx_open(&f)) return;  /* iv_test_fixture said the checks are skipped */
    fails(&f, IV_VR_VAR_SEARCH, "/var/search", 0, "limit=3", IV_EBAD_REQUEST, "q (the text");
    fails(&f, IV_VR_VAR_SEARCH, "/var/search", 0, "q=a&obs=1", IV_EBAD_REQUEST, "q, limit and by only");
    fails(&f, IV_VR_VAR_SEARCH, "/var/search", 1, "q=a", IV_EMETHOD, "GET");
    fails(&f, IV_VR_VAR_SEARCH, "/var/search", 0, "q=a&limit=0", IV_EBAD_REQUEST, "limit");
    fails(&f, IV_VR_VAR_SEARCH, "/var/search", 0, "q=a&by=no_such", IV_EBAD_SELECTION, "no_such");
    fails(&f, IV_VR_UNS, "/uns", 0, "x=1", IV_EBAD_REQUEST, "no query parameters");
    fx_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("viewer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, route_table);
    tcase_add_test(tc, search_names_a_gene_and_revalidates);
    tcase_add_test(tc, bad_requests_are_errors);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
