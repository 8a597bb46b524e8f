/*
 * Viewer routes (see routes_viewer.h).
 *
 * Design.  Every route here answers with one body built on a worker, of
 * a size the request bounds (an embedding is at most the array; a search
 * is `limit` rows; an aggregate is groups x genes x stats), so nothing is
 * streamed block by block: the server sends the finished buffer with a
 * Content-Length.  The expensive part of an aggregate, the decode of the
 * selection, is spread over the pool with iv_pool_parallel_for from the
 * worker that runs the request; the caller takes part, so it cannot
 * deadlock on a busy pool.
 *
 * Selections reuse the query route's parser and name/filter resolution
 * unchanged, so "any selection form the query route takes" is literally
 * the same code: the route's own parameters (dtype, q, group_by, ...) are
 * taken out of the query string or JSON body first and the rest goes to
 * iv_qreq_parse_*.
 *
 * Every answer here depends only on the dataset's content and the
 * request, which is what makes HTTP caching sound: the ETag is a hash of
 * the file's identity and the request's bytes, computed before any work,
 * so a revalidation costs a hash.  Compression runs on the same worker
 * over the finished body.  The obs/var metadata pages are routed here too
 * (built by routes_meta.c) to get the same caching and encoding.
 */
#include "routes_viewer.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "aggregate.h"
#include "coding.h"
#include "../api/diffexp.h"
#include "../api/obsp_answer.h"
#include "../api/uns_doc.h"
#include "enc_viewer.h"
#include "encode.h"
#include "obsm.h"
#include "query.h"
#include "request.h"
#include "routes_meta.h"
#include "search.h"
#include "select.h"
#include "zarr.h"
#include "zarr_cache.h"

#define SEARCH_LIMIT_DEFAULT 20
#define SEARCH_LIMIT_MAX 1000
/* Most group combinations an aggregate may span, and the memory its
 * partial accumulators may take together. */
#define AGG_MAX_COMBOS ((int64_t)1 << 20)
#define AGG_PART_BUDGET ((size_t)512 << 20)
#define AGG_MAX_GROUP_BY 8

/* The gzip level of a document (br's quality is coding.c's), from the
 * per-thread cost table in benchmarks/README.md. */
#define GZIP_LEVEL 1

#define MEDIA_ARRAY "application/vnd.ivserve.array"
#define MEDIA_AGG "application/vnd.ivserve.aggregate"
static const char MEDIA_ZARR_CHUNK[] = "application/octet-stream";
static const char MEDIA_ZARR_META[] = "application/json";

/* ---- per-dataset state -------------------------------------------------- */

typedef struct sidx {
    iv_axis_t axis;
    const iv_meta_col_t *col;
    iv_search_t *s;
} sidx_t;

struct iv_vds {
    char identity[96];        /* content identity for ETags (iv_vds_identity) */
    iv_marrays_t *arrays;
    char arrays_err[256];
    iv_meta_t *meta;
    pthread_mutex_t mu;       /* guards idx (lazy search indexes) */
    sidx_t *idx;
    size_t n_idx, cap_idx;
    size_t search_bytes;
    iv_zarr_cache_t *zcache;  /* X chunks decoded last (api/zarr_cache.h), or NULL */
};

static const char *col_get(const void *ctx, int64_t i)
{
    const iv_meta_col_t *c = ctx;
    if (c->mask && c->mask[i]) return NULL;
    if (c->type == IV_COL_CATEGORICAL) {
        int32_t k = c->codes[i];
        return k >= 0 && k < c->n_cats ? iv_meta_col_cat(c, k) : NULL;
    }
    return iv_meta_col_str(c, i);
}

/* Adds the built index s of col to v, which takes it (lock held by
 * caller); on error (out of memory) s is still the caller's and *out
 * NULL. */
static int search_add_locked(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                             iv_search_t *s, const iv_search_t **out, iv_err_t *err)
{
    *out = NULL;
    if (v->n_idx == v->cap_idx) {
        size_t nc = v->cap_idx ? v->cap_idx * 2 : 8;
        sidx_t *n = realloc(v->idx, nc * sizeof *n);
        if (!n) return iv_fail(err, IV_ENOMEM, "out of memory for a search index");
        v->idx = n;
        v->cap_idx = nc;
    }
    v->idx[v->n_idx++] = (sidx_t){axis, col, s};
    v->search_bytes += iv_search_bytes(s);
    *out = s;
    return 0;
}

/* The search index of a column, built on first use (lock held by caller;
 * the load's, before the dataset is shared). */
static int search_index_locked(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                               const iv_search_t **out, iv_err_t *err)
{
    for (size_t i = 0; i < v->n_idx; i++)
        if (v->idx[i].col == col) {
            *out = v->idx[i].s;
            return 0;
        }
    iv_search_t *s = NULL;
    IV_TRY(iv_search_build(col->n, col_get, col, &s, err));
    int rc = search_add_locked(v, axis, col, s, out, err);
    if (rc < 0) iv_search_free(s);
    return rc;
}

/* The column's index in v, or NULL (lock held by caller). */
static const iv_search_t *search_found_locked(const iv_vds_t *v, const iv_meta_col_t *col)
{
    for (size_t i = 0; i < v->n_idx; i++)
        if (v->idx[i].col == col) return v->idx[i].s;
    return NULL;
}

/* search_index_locked for a worker: a missing index is built outside the
 * lock (ten million obs names take seconds, and the loop takes the lock
 * for the memory figures), then added unless another thread added one
 * meanwhile. */
static int search_index(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                        const iv_search_t **out, iv_err_t *err)
{
    pthread_mutex_lock(&v->mu);
    *out = search_found_locked(v, col);
    pthread_mutex_unlock(&v->mu);
    if (*out) return 0;
    iv_search_t *built = NULL;
    IV_TRY(iv_search_build(col->n, col_get, col, &built, err));
    pthread_mutex_lock(&v->mu);
    int rc = 0;
    *out = search_found_locked(v, col);
    if (!*out) rc = search_add_locked(v, axis, col, built, out, err);
    pthread_mutex_unlock(&v->mu);
    if (*out != built) iv_search_free(built);
    return rc;
}

static int is_text(const iv_meta_col_t *c)
{
    return c->type == IV_COL_STRING || c->type == IV_COL_CATEGORICAL;
}

iv_vds_t *iv_vds_load(const char *path, const iv_dataset_t *ds, iv_meta_t *meta)
{
    iv_vds_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    pthread_mutex_init(&v->mu, NULL);
    v->meta = meta;
    v->zcache = iv_zarr_cache_new();  /* NULL: every zarr chunk request decodes */
    struct stat st;
    if (stat(path, &st) == 0)
        snprintf(v->identity, sizeof v->identity, "%llx-%llx-%llx-%lld.%09ld",
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                 (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_marrays_load(path, in->n_rows, in->n_cols, &v->arrays, &e) != 0)
        snprintf(v->arrays_err, sizeof v->arrays_err, "%.250s", e.msg);
    if (meta) {
        /* var's names index and text columns are searched most and are
         * small enough to index ahead (a gene table's columns take a few
         * MB); obs's names (ten million at an atlas's size, seconds to
         * index) by iv_vds_warm once the dataset serves, other obs
         * columns on first use. */
        const iv_search_t *s;
        pthread_mutex_lock(&v->mu);
        const iv_meta_col_t *ix = iv_meta_index(meta, IV_AXIS_VAR);
        if (ix) search_index_locked(v, IV_AXIS_VAR, ix, &s, &e);
        for (size_t i = 0; i < iv_meta_n_cols(meta, IV_AXIS_VAR); i++) {
            const iv_meta_col_t *c = iv_meta_col(meta, IV_AXIS_VAR, i);
            if (is_text(c)) search_index_locked(v, IV_AXIS_VAR, c, &s, &e);
        }
        pthread_mutex_unlock(&v->mu);
    }
    return v;
}

void iv_vds_warm(iv_vds_t *v)
{
    const iv_meta_col_t *ix = v && v->meta ? iv_meta_index(v->meta, IV_AXIS_OBS) : NULL;
    const iv_search_t *s;
    iv_err_t e;
    iv_err_clear(&e);
    if (ix) search_index(v, IV_AXIS_OBS, ix, &s, &e);
}

const char *iv_vds_identity(const iv_vds_t *v)
{
    return v ? v->identity : "";
}

void iv_vds_free(iv_vds_t *v)
{
    if (!v) return;
    iv_marrays_free(v->arrays);
    iv_zarr_cache_free(v->zcache);
    for (size_t i = 0; i < v->n_idx; i++) iv_search_free(v->idx[i].s);
    free(v->idx);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

/* One obsm/varm element of the dataset document: its shape, dtype and
 * size when it is served, else why not. */
static void put_marray_entry(iv_buf_t *b, const iv_marray_t *a)
{
    iv_buf_json_str(b, a->name);
    iv_buf_puts(b, ",\"encoding\":");
    iv_buf_json_str(b, a->encoding);
    if (a->data) {
        iv_buf_printf(b, ",\"shape\":[%" PRId64 ",%" PRId64 "],\"dtype\":\"%s\",\"bytes\":%zu"
                         ",\"servable\":true}",
                      a->n_rows, a->n_cols, iv_dtype_name(a->dtype),
                      (size_t)a->n_rows * (size_t)a->n_cols * iv_dtype_size(a->dtype));
    } else {
        iv_buf_puts(b, ",\"servable\":false,\"reason\":");
        iv_buf_json_str(b, a->why);
        iv_buf_puts(b, "}");
    }
}

void iv_vds_doc(iv_buf_t *b, const iv_vds_t *v)
{
    const iv_marrays_t *s = v ? v->arrays : NULL;
    for (int ax = 0; ax < 2; ax++) {
        iv_axis_t axis = ax ? IV_AXIS_VAR : IV_AXIS_OBS;
        iv_buf_puts(b, ax ? ",\"varm\":[" : ",\"obsm\":[");
        int first = 1;
        for (size_t i = 0; s && i < s->n; i++) {
            if (s->a[i].axis != axis) continue;
            iv_buf_puts(b, first ? "{\"name\":" : ",{\"name\":");
            first = 0;
            put_marray_entry(b, &s->a[i]);
        }
        iv_buf_puts(b, "]");
    }
    if (v && v->arrays_err[0]) {
        iv_buf_puts(b, ",\"obsm_error\":");
        iv_buf_json_str(b, v->arrays_err);
    }
    size_t arrays = 0, search = 0;
    iv_vds_memory(v, &arrays, &search);
    iv_buf_printf(b, ",\"viewer_bytes\":{\"arrays\":%zu,\"search\":%zu}", s ? s->bytes : 0,
                  search);
}

void iv_vds_memory(const iv_vds_t *v, size_t *arrays, size_t *search)
{
    *arrays = v && v->arrays ? v->arrays->bytes : 0;
    *search = 0;
    if (!v) return;
    pthread_mutex_t *mu = (pthread_mutex_t *)&v->mu;   /* guards search_bytes */
    pthread_mutex_lock(mu);
    *search = v->search_bytes;
    pthread_mutex_unlock(mu);
}

/* ---- routing ------------------------------------------------------------ */

/* Routes whose path is the whole sub-path. */
static const struct exact_route {
    const char *path;
    int route;
} exact_routes[] = {
    {"/aggregate", IV_VR_AGGREGATE},
    {"/diffexp", IV_VR_DIFFEXP},
    {"/uns", IV_VR_UNS},
    {"/obsp", IV_VR_OBSP_LIST},
    {"/var/search", IV_VR_VAR_SEARCH},
    {"/obs/search", IV_VR_OBS_SEARCH},
    {"/raw/var", IV_VR_RAW_VAR_TABLE},
    {"/raw/var/search", IV_VR_RAW_VAR_SEARCH},
    {"/obs", IV_VR_OBS_TABLE},
    {"/var", IV_VR_VAR_TABLE},
};

/* Routes whose path ends in a name (an array, a column, a zarr key): the
 * prefix before it.  A zarr key may hold slashes (any_rest); the other
 * names are one non-empty segment. */
static const struct named_route {
    const char *prefix;
    int route;
    int any_rest;
} named_routes[] = {
    {"/zarr/", IV_VR_ZARR, 1},
    {"/raw/var/", IV_VR_RAW_VAR_COLUMN, 0},
    {"/obsm/", IV_VR_OBSM, 0},
    {"/varm/", IV_VR_VARM, 0},
    {"/obsp/", IV_VR_OBSP, 0},
    {"/obs/", IV_VR_OBS_COLUMN, 0},
    {"/var/", IV_VR_VAR_COLUMN, 0},
};

#define N_OF(a) (sizeof(a) / sizeof(a)[0])

static int named_route_match(const struct named_route *nr, const char *sub)
{
    size_t n = strlen(nr->prefix);
    if (strncmp(sub, nr->prefix, n) != 0) return 0;
    return nr->any_rest || (sub[n] && !strchr(sub + n, '/'));
}

int iv_vroute_match(const char *sub)
{
    for (size_t i = 0; i < N_OF(exact_routes); i++)
        if (!strcmp(sub, exact_routes[i].path)) return exact_routes[i].route;
    for (size_t i = 0; i < N_OF(named_routes); i++)
        if (named_route_match(&named_routes[i], sub)) return named_routes[i].route;
    return IV_VR_NONE;
}

/* The name in sub of a route that has one, else NULL. */
static const char *route_name(int route, const char *sub)
{
    for (size_t i = 0; i < N_OF(named_routes); i++)
        if (named_routes[i].route == route) return sub + strlen(named_routes[i].prefix);
    return NULL;
}

int iv_vroute_allows_post(int route)
{
    return route == IV_VR_OBSM || route == IV_VR_VARM || route == IV_VR_AGGREGATE || route == IV_VR_DIFFEXP ||
           route == IV_VR_OBS_TABLE || route == IV_VR_VAR_TABLE || route == IV_VR_RAW_VAR_TABLE ||
           route == IV_VR_OBS_COLUMN || route == IV_VR_VAR_COLUMN || route == IV_VR_RAW_VAR_COLUMN ||
           route == IV_VR_OBSP;
}

iv_vreq_t *iv_vreq_new(int route, const char *sub, int is_post, const char *query, char *body,
                       size_t body_len, const char *accept, int *bad_name)
{
    *bad_name = 0;
    iv_vreq_t *r = calloc(1, sizeof *r);
    if (!r) {
        free(body);
        return NULL;
    }
    iv_buf_init(&r->out);
    r->route = route;
    r->is_post = is_post;
    r->body = body;
    r->body_len = body_len;
    r->query = strdup(query ? query : "");
    if (accept) r->accept = strdup(accept);
    const char *nm = route_name(route, sub);
    if (nm) {
        r->name = iv_url_decode(nm, strlen(nm));
        if (!r->name) *bad_name = 1;
    }
    if (!r->query || (accept && !r->accept) || *bad_name) {
        iv_vreq_free(r);
        return NULL;
    }
    return r;
}

void iv_vreq_free(iv_vreq_t *r)
{
    if (!r) return;
    free(r->name);
    free(r->query);
    free(r->body);
    free(r->accept);
    free(r->if_none_match);
    free(r->accept_encoding);
    free(r->dropped);
    iv_buf_free(&r->out);
    free(r);
}

/* ---- parameters ---------------------------------------------------------- */

/* A route's own parameters, taken out of the request before the rest goes
 * to the selection parser.  vals[i] is the value of keys[i] (owned) or
 * NULL; for a JSON body, items[i] is the detached JSON value instead. */
typedef struct params {
    const char *const *keys;
    size_t n;
    char *vals[8];
    cJSON *items[8];
    iv_qreq_t qr;
    int have_qr;
    int with_matrix;   /* the route reads any selectable matrix ("matrix"), not X alone */
} params_t;

static void params_free(params_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->vals[i]);
        cJSON_Delete(p->items[i]);
    }
    if (p->have_qr) iv_qreq_free(&p->qr);
}

struct qs_split {
    params_t *p;
    iv_buf_t *rest;
};

static int key_slot(const params_t *p, const char *key)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->keys[i], key)) return (int)i;
    return -1;
}

/* One key=value pair of the query string: a route key's value taken into
 * p, anything else appended to rest for the selection parser. */
static int take_query_pair(params_t *p, const char *pair, size_t len, iv_buf_t *rest, iv_err_t *err)
{
    const char *eq = memchr(pair, '=', len);
    size_t klen = eq ? (size_t)(eq - pair) : len;
    char *key = iv_url_decode(pair, klen);
    if (!key) return iv_fail(err, IV_EBAD_REQUEST, "bad percent-escape in the query string");
    int slot = key_slot(p, key), rc = 0;
    if (slot < 0) {
        if (rest->len) iv_buf_append(rest, "&", 1);
        iv_buf_append(rest, pair, len);
    } else if (p->vals[slot]) {
        rc = iv_fail(err, IV_EBAD_REQUEST, "%s is given more than once", key);
    } else {
        p->vals[slot] = eq ? iv_url_decode_form(eq + 1, (size_t)(pair + len - eq - 1)) : strdup("");
        if (!p->vals[slot]) rc = iv_fail(err, IV_EBAD_REQUEST, "bad percent-escape in %s", key);
    }
    free(key);
    return rc;
}

/* The selection: a query string (json 0) or a JSON object, against the
 * matrix "matrix" names where the route reads one, else X's axes. */
static int parse_selection(params_t *p, const iv_vreq_t *r, int json, const char *s, size_t len,
                           int64_t n_obs, int64_t n_var, iv_err_t *err)
{
    int rc;
    if (p->with_matrix && r->matrix_shape)
        rc = json ? iv_qreq_parse_json_m(s, len, r->matrix_shape, r->matrix_ctx, &p->qr, err)
                  : iv_qreq_parse_query_m(s, len, r->matrix_shape, r->matrix_ctx, &p->qr, err);
    else
        rc = json ? iv_qreq_parse_json(s, len, n_obs, n_var, &p->qr, err)
                  : iv_qreq_parse_query(s, len, n_obs, n_var, &p->qr, err);
    p->have_qr = rc == 0;
    return rc;
}

static int params_parse_query(params_t *p, const iv_vreq_t *r, int64_t n_obs, int64_t n_var, iv_err_t *err)
{
    iv_buf_t rest;
    iv_buf_init(&rest);
    const char *qs = r->query;
    size_t len = strlen(qs), i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        size_t j = i;
        while (j < len && qs[j] != '&') j++;
        if (j > i) rc = take_query_pair(p, qs + i, j - i, &rest, err);
        i = j + 1;
    }
    if (rc == 0 && rest.oom) rc = iv_fail(err, IV_ENOMEM, "out of memory");
    if (rc == 0) rc = parse_selection(p, r, 0, rest.data ? rest.data : "", rest.len, n_obs, n_var, err);
    iv_buf_free(&rest);
    return rc;
}

static int params_parse_body(params_t *p, const iv_vreq_t *r, int64_t n_obs, int64_t n_var, iv_err_t *err)
{
    cJSON *root = cJSON_ParseWithLength(r->body ? r->body : "", r->body_len);
    if (!root && r->body_len == 0) root = cJSON_CreateObject();
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return iv_fail(err, IV_EBAD_JSON, "the request body must be a JSON object");
    }
    for (size_t i = 0; i < p->n; i++)
        p->items[i] = cJSON_DetachItemFromObjectCaseSensitive(root, p->keys[i]);
    char *restj = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!restj) return iv_fail(err, IV_ENOMEM, "out of memory");
    int rc = parse_selection(p, r, 1, restj, strlen(restj), n_obs, n_var, err);
    free(restj);
    return rc;
}

/*
 * Parses the request's parameters: the route's keys are taken out (from
 * the query string, or from the JSON body of a POST), and the remainder
 * is parsed as a query selection against axis lengths n_obs / n_var.
 */
static int params_parse(params_t *p, const iv_vreq_t *r, int64_t n_obs, int64_t n_var, iv_err_t *err)
{
    return r->is_post ? params_parse_body(p, r, n_obs, n_var, err) : params_parse_query(p, r, n_obs, n_var, err);
}

/* Parameter i as a string (a JSON string, or the query-string value). */
static int param_str(params_t *p, size_t i, const char **out, iv_err_t *err)
{
    *out = NULL;
    if (p->vals[i]) {
        *out = p->vals[i];
    } else if (p->items[i]) {
        if (!cJSON_IsString(p->items[i]))
            return iv_fail(err, IV_EBAD_REQUEST, "%s must be a string", p->keys[i]);
        *out = p->items[i]->valuestring;
    }
    return 0;
}

/* Parameter i as an integer in [lo, hi]; *out keeps its value when absent. */
static int param_int(params_t *p, size_t i, int64_t lo, int64_t hi, int64_t *out, iv_err_t *err)
{
    if (p->items[i]) {
        const cJSON *v = p->items[i];
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
            v->valuedouble > (double)hi)
            return iv_fail(err, IV_EBAD_REQUEST, "%s must be an integer in [%" PRId64 ", %" PRId64 "]",
                           p->keys[i], lo, hi);
        *out = (int64_t)v->valuedouble;
        return 0;
    }
    if (!p->vals[i]) return 0;
    const char *s = p->vals[i];
    char *end = NULL;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi)
        return iv_fail(err, IV_EBAD_REQUEST, "%s=%.40s must be an integer in [%" PRId64 ", %" PRId64 "]",
                       p->keys[i], s, lo, hi);
    *out = x;
    return 0;
}

/* A comma-separated list, split in place: an owned array of the
 * non-empty items (borrowed strings), *n of them. */
static int list_from_query(char *s, const char ***out, size_t *n, iv_err_t *err)
{
    size_t cap = 1;
    for (char *q = s; *q; q++) cap += *q == ',';
    const char **v = calloc(cap, sizeof *v);
    if (!v) return iv_fail(err, IV_ENOMEM, "out of memory");
    size_t cnt = 0;
    for (char *tok = s; tok;) {
        char *comma = strchr(tok, ',');
        if (comma) *comma = '\0';
        if (*tok) v[cnt++] = tok;
        tok = comma ? comma + 1 : NULL;
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* A JSON string or array of strings as an owned array of borrowed
 * strings; key names the parameter in errors. */
static int list_from_json(const cJSON *it, const char *key, const char ***out, size_t *n, iv_err_t *err)
{
    if (!cJSON_IsString(it) && !cJSON_IsArray(it))
        return iv_fail(err, IV_EBAD_REQUEST, "%s must be a string or a list of strings", key);
    size_t cap = cJSON_IsString(it) ? 1 : (size_t)cJSON_GetArraySize(it) + 1;
    const char **v = calloc(cap, sizeof *v);
    if (!v) return iv_fail(err, IV_ENOMEM, "out of memory");
    size_t cnt = 0;
    if (cJSON_IsString(it)) {
        v[cnt++] = it->valuestring;
    } else {
        const cJSON *e;
        cJSON_ArrayForEach(e, it)
        {
            if (!cJSON_IsString(e)) {
                free(v);
                return iv_fail(err, IV_EBAD_REQUEST, "%s must be a list of strings", key);
            }
            v[cnt++] = e->valuestring;
        }
    }
    *out = v;
    *n = cnt;
    return 0;
}

/*
 * Parameter i as a list of strings: a JSON array of strings or a string,
 * or a comma-separated query-string value.  *out is an owned array of n
 * borrowed strings (into p), or NULL when absent.
 */
static int param_list(params_t *p, size_t i, const char ***out, size_t *n, iv_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (p->vals[i]) return list_from_query(p->vals[i], out, n, err);
    if (p->items[i]) return list_from_json(p->items[i], p->keys[i], out, n, err);
    return 0;
}

/* The output format: the format parameter, else Accept (extra: this
 * route's own binary media type, which also means binary). */
static int pick_format(const iv_vreq_t *r, iv_fmt_t given, const char *own_media, iv_fmt_t dflt,
                       iv_fmt_t *out, iv_err_t *err)
{
    if (given != IV_FMT_NONE) {
        *out = given;
        return 0;
    }
    const char *a = r->accept;
    if (!a || !*a) {
        *out = dflt;
        return 0;
    }
    if (strstr(a, own_media)) {
        *out = IV_FMT_BINARY;
        return 0;
    }
    /* A browser's fetch() sends a wildcard: give it the route's default. */
    if (!strstr(a, "application/json") && !strstr(a, "application/x-ndjson") &&
        !strstr(a, "application/vnd.ivserve.csr") && (strstr(a, "*/*") || strstr(a, "application/*"))) {
        *out = dflt;
        return 0;
    }
    *out = iv_fmt_from_accept(a);
    if (*out == IV_FMT_NONE)
        return iv_fail(err, IV_ENOT_ACCEPTABLE, "acceptable encodings: %s, application/x-ndjson, "
                       "application/json", own_media);
    return 0;
}

static const char *fmt_media(iv_fmt_t f, const char *own_media)
{
    return f == IV_FMT_BINARY ? own_media : f == IV_FMT_NDJSON ? "application/x-ndjson" : "application/json";
}

static int has_selection(const iv_psel_t *p)
{
    return p->kind != IV_PSEL_ALL || p->filter != NULL;
}

/* ---- obsm / varm ---------------------------------------------------------- */

/* The dtype an obsm/varm answer is in: dtype=float32 or float64, else the
 * stored one. */
static int marray_dtype(params_t *p, const iv_marray_t *a, iv_dtype_t *to, iv_err_t *err)
{
    const char *dt = NULL;
    *to = a->dtype;
    IV_TRY(param_str(p, 0, &dt, err));
    if (!dt) return 0;
    if (!strcmp(dt, "float32")) *to = IV_DT_FLOAT32;
    else if (!strcmp(dt, "float64")) *to = IV_DT_FLOAT64;
    else if (strcmp(dt, iv_dtype_name(a->dtype)) != 0)
        return iv_fail(err, IV_EBAD_REQUEST, "dtype=%.40s: expected float32, float64 or %s", dt,
                       iv_dtype_name(a->dtype));
    return 0;
}

/* An obsm/varm request: its parameters, a selection of the array's own
 * axis only (names resolved), and the answer's format. */
static int marray_request(iv_vreq_t *r, params_t *p, const iv_marray_t *a, iv_axis_t axis, iv_dtype_t *to,
                          iv_fmt_t *fmt, iv_err_t *err)
{
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(params_parse(p, r, in->n_rows, in->n_cols, err));
    IV_TRY(marray_dtype(p, a, to, err));
    if (has_selection(axis == IV_AXIS_OBS ? &p->qr.var : &p->qr.obs))
        return iv_fail(err, IV_EBAD_SELECTION, "%sm/%.100s takes a %s selection only", axn, r->name, axn);
    IV_TRY(iv_rmeta_resolve_query(r->meta, r->meta, &p->qr, &r->dropped, err));
    return pick_format(r, p->qr.format, MEDIA_ARRAY, IV_FMT_BINARY, fmt, err);
}

/* Refuses n rows too large before any work: a JSON document past the
 * JSON limit, or past both max_answer_bytes and the whole array. */
static int check_marray_size(const iv_vreq_t *r, const iv_marray_t *a, const char *axn, iv_fmt_t fmt,
                             int64_t n, iv_dtype_t to, iv_err_t *err)
{
    if (fmt != IV_FMT_BINARY && (uint64_t)n * (uint64_t)(a->n_cols + 1) * 2 > r->json_bytes) {
        /* At two bytes a number ("0,") the document would already be too big. */
        return iv_fail(err, IV_ETOO_LARGE,
                       "%" PRId64 " rows of %sm/%.100s exceed the JSON limit of %zu bytes; ask for "
                       MEDIA_ARRAY " or a smaller selection",
                       n, axn, r->name, r->json_bytes);
    }
    /* Never more than the whole array or max_answer_bytes, whichever is
     * larger: a body that lists rows again cannot multiply the answer. */
    uint64_t body = (uint64_t)n * (uint64_t)a->n_cols * iv_dtype_size(to);
    uint64_t whole = (uint64_t)a->n_rows * (uint64_t)a->n_cols * iv_dtype_size(to);
    if (r->answer_bytes && 2 * body > r->answer_bytes && body > whole)
        return iv_fail(err, IV_ETOO_LARGE,
                       "%" PRId64 " rows of %sm/%.100s take %" PRIu64 " bytes, gathered and then "
                       "encoded: more than the %zu an answer may hold (max_answer_bytes) and more "
                       "than the whole array; select fewer %s",
                       n, axn, r->name, body, r->answer_bytes, axn);
    return 0;
}

/* The rows of sel (all of them when it selects all), gathered in dtype
 * `to` unless they go out as they lie, and encoded. */
static int marray_encode(iv_vreq_t *r, const iv_marray_t *a, const iv_psel_t *sel, const char *axn,
                         iv_fmt_t fmt, iv_dtype_t to, iv_err_t *err)
{
    int all = sel->kind == IV_PSEL_ALL;
    int64_t n = all ? a->n_rows : sel->n;
    void *vals = NULL;
    const void *src = a->data;
    if (!all || to != a->dtype) {
        vals = malloc((size_t)n * (size_t)a->n_cols * iv_dtype_size(to) + 1);
        if (!vals) return iv_fail(err, IV_ENOMEM, "out of memory for %" PRId64 " rows", n);
        iv_marray_gather(a, all ? NULL : sel->idx, n, to, vals);
        src = vals;
    }
    iv_dense_t d = {a->name, axn, n, a->n_cols, to, src, all ? NULL : sel->idx};
    iv_enc_dense(&r->out, fmt, &d);
    free(vals);
    r->ctype = fmt_media(fmt, MEDIA_ARRAY);
    if (r->out.oom) return iv_fail(err, IV_ENOMEM, "out of memory encoding %sm/%.100s", axn, r->name);
    if (fmt != IV_FMT_BINARY && r->out.len > r->json_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "the result exceeds the JSON limit of %zu bytes; ask for "
                       MEDIA_ARRAY " or a smaller selection", r->json_bytes);
    return 0;
}

static int run_marray(iv_vreq_t *r, iv_err_t *err)
{
    iv_axis_t axis = r->route == IV_VR_OBSM ? IV_AXIS_OBS : IV_AXIS_VAR;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    const iv_marray_t *a = iv_marrays_find(r->vx ? r->vx->arrays : NULL, axis, r->name);
    if (!a) return iv_fail(err, IV_ENOT_FOUND, "the dataset has no %sm element '%.100s'", axn, r->name);
    if (!a->data)
        return iv_fail(err, IV_EBAD_SELECTION, "%sm/%.100s is not served: %s", axn, r->name, a->why);
    static const char *const keys[] = {"dtype"};
    params_t p;
    memset(&p, 0, sizeof p);
    p.keys = keys;
    p.n = 1;
    iv_dtype_t to = a->dtype;
    iv_fmt_t fmt = IV_FMT_NONE;
    const iv_psel_t *sel = axis == IV_AXIS_OBS ? &p.qr.obs : &p.qr.var;
    int rc = marray_request(r, &p, a, axis, &to, &fmt, err);
    if (rc == 0)
        rc = check_marray_size(r, a, axn, fmt, sel->kind == IV_PSEL_ALL ? a->n_rows : sel->n, to, err);
    if (rc == 0) rc = marray_encode(r, a, sel, axn, fmt, to, err);
    params_free(&p);
    return rc;
}

/* ---- search ------------------------------------------------------------- */

/* raw/X's genes (raw/var) for the raw/var routes: 404 (unknown_matrix)
 * when the dataset has no servable raw/X, 404 when its file has no
 * raw/var. */
static int raw_var_meta(iv_vreq_t *r, iv_meta_t **m, iv_err_t *err)
{
    iv_dataset_t *rds;
    if (!r->matrix_open) return iv_fail(err, IV_ENOT_FOUND, "the dataset has no raw/X");
    IV_TRY(r->matrix_open(r->matrix_ctx, "raw/X", &rds, m, err));
    if (!*m) return iv_fail(err, IV_ENOT_FOUND, "the file has no raw/var (raw/X's genes are 0..n-1)");
    return 0;
}

/* A search's parameters: q (required), limit and by, and nothing else. */
static int search_request(iv_vreq_t *r, params_t *p, const char **q, const char **by, int64_t *limit,
                          iv_err_t *err)
{
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(params_parse(p, r, in->n_rows, in->n_cols, err));
    /* Only q, limit and by are known: anything left is a selection the
     * search does not take. */
    if (has_selection(&p->qr.obs) || has_selection(&p->qr.var) || p->qr.format != IV_FMT_NONE)
        return iv_fail(err, IV_EBAD_REQUEST, "search takes the parameters q, limit and by only");
    IV_TRY(param_str(p, 0, q, err));
    IV_TRY(param_str(p, 2, by, err));
    IV_TRY(param_int(p, 1, 1, SEARCH_LIMIT_MAX, limit, err));
    if (!*q || !**q) return iv_fail(err, IV_EBAD_REQUEST, "q (the text to search for) is required");
    return 0;
}

/* The column searched: by, else the names index; a text column. */
static int search_column(const iv_meta_t *m, iv_axis_t axis, const char *axn, const char *by,
                         const iv_meta_col_t **out, iv_err_t *err)
{
    const iv_meta_col_t *col = by ? iv_meta_find_col(m, axis, by) : iv_meta_index(m, axis);
    if (!col) return iv_fail(err, IV_EBAD_SELECTION, "%s has no column '%.80s'", axn, by);
    if (!is_text(col))
        return iv_fail(err, IV_EBAD_SELECTION, "%s column '%.80s' holds %s values, not names", axn,
                       col->name, iv_col_type_name(col->type));
    *out = col;
    return 0;
}

/* The answer: each hit's row, its name (ix), and the value matched when
 * the column searched is not the names index. */
static void put_search_hits(iv_buf_t *b, const char *q, const char *axn, const iv_meta_col_t *col,
                            const iv_meta_col_t *ix, const iv_search_hit_t *hits, int64_t k, int64_t total)
{
    iv_buf_puts(b, "{\"q\":");
    iv_buf_json_str(b, q);
    iv_buf_printf(b, ",\"axis\":\"%s\",\"by\":", axn);
    iv_buf_json_str(b, col->name);
    iv_buf_printf(b, ",\"total\":%" PRId64 ",\"results\":[", total);
    for (int64_t i = 0; i < k; i++) {
        int64_t row = hits[i].row;
        iv_buf_printf(b, i ? ",{\"index\":%" PRId64 ",\"name\":" : "{\"index\":%" PRId64 ",\"name\":", row);
        const char *nm = ix ? col_get(ix, row) : NULL;
        if (nm) iv_buf_json_str(b, nm);
        else iv_buf_puts(b, "null");
        if (col != ix) {
            iv_buf_puts(b, ",\"value\":");
            iv_buf_json_str(b, col_get(col, row));
        }
        iv_buf_printf(b, ",\"match\":\"%s\"}", iv_match_name(hits[i].kind));
    }
    iv_buf_puts(b, "]}");
}

/* Runs the search of col for q, at most limit hits, into r->out. */
static int search_answer(iv_vreq_t *r, const iv_meta_t *m, iv_axis_t axis, const char *axn,
                         const iv_meta_col_t *col, const char *q, int64_t limit, iv_err_t *err)
{
    const iv_search_t *s = NULL;
    IV_TRY(search_index(r->vx, axis, col, &s, err));
    iv_search_hit_t *hits = malloc((size_t)limit * sizeof *hits);
    if (!hits) return iv_fail(err, IV_ENOMEM, "out of memory");
    int64_t total = 0, k = iv_search_run(s, q, strlen(q), limit, hits, &total);
    if (k < 0) {
        free(hits);
        return iv_fail(err, IV_ENOMEM, "out of memory searching");
    }
    put_search_hits(&r->out, q, axn, col, iv_meta_index(m, axis), hits, k, total);
    free(hits);
    r->ctype = "application/json";
    if (r->out.oom) return iv_fail(err, IV_ENOMEM, "out of memory");
    return 0;
}

static int run_search(iv_vreq_t *r, iv_err_t *err)
{
    iv_axis_t axis = r->route == IV_VR_OBS_SEARCH ? IV_AXIS_OBS : IV_AXIS_VAR;
    int raw = r->route == IV_VR_RAW_VAR_SEARCH;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : raw ? "raw/var" : "var";
    if (r->is_post) return iv_fail(err, IV_EMETHOD, "search takes GET");
    iv_meta_t *m = r->meta;   /* the names searched: obs, var or raw/var */
    if (raw) IV_TRY(raw_var_meta(r, &m, err));
    if (!m || !r->vx)
        return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    static const char *const keys[] = {"q", "limit", "by"};
    params_t p;
    memset(&p, 0, sizeof p);
    p.keys = keys;
    p.n = 3;
    const char *q = NULL, *by = NULL;
    int64_t limit = SEARCH_LIMIT_DEFAULT;
    const iv_meta_col_t *col = NULL;
    int rc = search_request(r, &p, &q, &by, &limit, err);
    if (rc == 0) rc = search_column(m, axis, axn, by, &col, err);
    if (rc == 0) rc = search_answer(r, m, axis, axn, col, q, limit, err);
    params_free(&p);
    return rc;
}

/* ---- metadata pages --------------------------------------------------------- */

/*
 * POST of a metadata page: the rows a selection of the route's axis picks
 * (the body's "obs" or "var", the query route's selection object,
 * resolved by the same code: rows in its order, duplicates repeated), with
 * the GET form's parameters as members: columns (a list of names, or a
 * comma-separated string), format, offset and limit for a table; values,
 * offset and limit for a column.  Long index lists do not fit a URL.
 */
static const char *const meta_keys[] = {"columns", "format", "offset", "limit", "values"};
enum { MK_COLUMNS, MK_FORMAT, MK_OFFSET, MK_LIMIT, MK_VALUES };

typedef struct meta_post {
    params_t p;
    iv_rmeta_page_t pg;
    const char **cols;   /* a "columns" list's names (into p's items) */
} meta_post_t;

static void meta_post_free(meta_post_t *mp)
{
    params_free(&mp->p);
    free(mp->cols);
}

/* "columns": a JSON list of names, or one comma-separated string as GET
 * takes it (a name holding a comma needs the list; routes_meta.c splits
 * the string as it splits GET's). */
static int meta_post_columns(meta_post_t *mp, iv_err_t *err)
{
    const cJSON *v = mp->p.items[MK_COLUMNS];
    size_t n = 0;
    if (!v) return 0;
    if (cJSON_IsString(v)) {
        mp->pg.columns_csv = v->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return iv_fail(err, IV_EBAD_REQUEST, "columns must be a list of column names or a comma-separated string");
    mp->cols = calloc((size_t)cJSON_GetArraySize(v) + 1, sizeof *mp->cols);
    if (!mp->cols) return iv_fail(err, IV_ENOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) return iv_fail(err, IV_EBAD_REQUEST, "columns must be a list of strings");
        mp->cols[n++] = it->valuestring;
    }
    mp->pg.columns = mp->cols;
    mp->pg.n_columns = n;
    return 0;
}

/* The body's members past the selection, each where its route takes it. */
static int meta_post_params(meta_post_t *mp, int table, iv_err_t *err)
{
    params_t *p = &mp->p;
    static const int table_only[] = {MK_COLUMNS, MK_FORMAT};
    for (size_t i = 0; i < N_OF(table_only); i++)
        if (!table && p->items[table_only[i]])
            return iv_fail(err, IV_EBAD_REQUEST, "a column takes values, offset and limit, not %s",
                           meta_keys[table_only[i]]);
    if (table && p->items[MK_VALUES])
        return iv_fail(err, IV_EBAD_REQUEST, "a table takes columns, format, offset and limit, not values");
    const cJSON *vals = p->items[MK_VALUES];
    if (vals && !cJSON_IsBool(vals)) return iv_fail(err, IV_EBAD_REQUEST, "values must be true or false");
    mp->pg.values = cJSON_IsTrue(vals);
    IV_TRY(param_str(p, MK_FORMAT, &mp->pg.format, err));
    IV_TRY(param_int(p, MK_OFFSET, 0, INT64_MAX / 2, &mp->pg.offset, err));
    IV_TRY(param_int(p, MK_LIMIT, 0, INT64_MAX / 2, &mp->pg.limit, err));
    return meta_post_columns(mp, err);
}

/* The selection: of the route's axis only, and nothing of a matrix query. */
static int meta_post_selection(meta_post_t *mp, iv_meta_t *m, iv_axis_t axis, char **dropped, iv_err_t *err)
{
    iv_qreq_t *q = &mp->p.qr;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    if (has_selection(axis == IV_AXIS_OBS ? &q->var : &q->obs))
        return iv_fail(err, IV_EBAD_SELECTION, "the %s rows take a selection of %s only", axn, axn);
    if (q->by_var || q->dense)
        return iv_fail(err, IV_EBAD_REQUEST, "a metadata page takes no by or dense");
    return iv_rmeta_resolve_query(m, m, q, dropped, err);
}

static int run_meta_post(iv_vreq_t *r, iv_meta_t *m, iv_axis_t axis, int table, iv_err_t *err)
{
    meta_post_t mp = {.p = {.keys = meta_keys, .n = N_OF(meta_keys)}, .pg = {.limit = -1}};
    int rc = params_parse(&mp.p, r, iv_meta_n_rows(m, IV_AXIS_OBS), iv_meta_n_rows(m, IV_AXIS_VAR), err);
    if (rc == 0) rc = meta_post_params(&mp, table, err);
    if (rc == 0) rc = meta_post_selection(&mp, m, axis, &r->dropped, err);
    if (rc == 0) {
        iv_sel_t s = iv_psel_view(axis == IV_AXIS_OBS ? &mp.p.qr.obs : &mp.p.qr.var);
        int64_t n = s.all ? -1 : s.n;
        r->ctype = "application/json";
        rc = table ? iv_rmeta_table_rows(&r->out, m, axis, s.idx, n, &mp.pg, r->accept, &r->ctype, err)
                   : iv_rmeta_column_rows(&r->out, m, axis, r->name, s.idx, n, &mp.pg, r->json_bytes, err);
    }
    meta_post_free(&mp);
    return rc;
}

static int run_meta(iv_vreq_t *r, iv_err_t *err)
{
    iv_meta_t *m = r->meta;
    int raw = r->route == IV_VR_RAW_VAR_TABLE || r->route == IV_VR_RAW_VAR_COLUMN;
    if (raw) IV_TRY(raw_var_meta(r, &m, err));
    if (!m) return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    iv_axis_t axis = r->route == IV_VR_OBS_TABLE || r->route == IV_VR_OBS_COLUMN ? IV_AXIS_OBS : IV_AXIS_VAR;
    int table = r->route == IV_VR_OBS_TABLE || r->route == IV_VR_VAR_TABLE || r->route == IV_VR_RAW_VAR_TABLE;
    const char *q = r->query;
    r->ctype = "application/json";
    if (r->is_post && q[0])
        return iv_fail(err, IV_EBAD_REQUEST, "a POST of a metadata page takes its parameters in the JSON body");
    /* An unknown column in the path is a missing resource, before the
     * body's selection is read (whose errors keep their own status). */
    if (!table && !iv_meta_find_col(m, axis, r->name))
        return iv_fail(err, IV_ENOT_FOUND, "%s has no column '%.80s'", axis == IV_AXIS_OBS ? "obs" : "var",
                       r->name);
    if (r->is_post) return run_meta_post(r, m, axis, table, err);
    if (table) return iv_rmeta_table(&r->out, m, axis, q, strlen(q), r->accept, &r->ctype, err);
    int rc = iv_rmeta_column(&r->out, m, axis, r->name, q, strlen(q), r->json_bytes, err);
    /* An unknown column in the path is a missing resource. */
    if (rc == IV_EBAD_SELECTION) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        rc = iv_fail(err, IV_ENOT_FOUND, "%s", msg);
    }
    return rc;
}

/* ---- aggregate ------------------------------------------------------------ */

typedef struct aggrun {
    iv_query_t *q;
    iv_agg_t *acc;
    const int32_t *cell_group;   /* group of each position of the obs selection */
    int cell_major;              /* blocks are cell rows (IVCSR) */
    int64_t n_blocks;
    unsigned n_parts;
    const atomic_int *cancel;    /* the request's (iv_vreq_t.cancel), or NULL */
    atomic_int failed;
    pthread_mutex_t mu;
    int rc;
    iv_err_t err;
} aggrun_t;

/* Partial p takes blocks p, p + n_parts, ...: a fixed assignment, so the
 * float sums do not depend on which thread ran what. */
static void agg_part(void *arg, size_t part)
{
    aggrun_t *ar = arg;
    for (int64_t b = (int64_t)part; b < ar->n_blocks && !atomic_load(&ar->failed); b += ar->n_parts) {
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        iv_err_t e;
        iv_err_clear(&e);
        int rc = ar->cancel && atomic_load_explicit(ar->cancel, memory_order_relaxed)
                     ? iv_fail(&e, IV_ECANCELLED, "aggregate cancelled")
                     : iv_query_decode_block(ar->q, b, &blk, &e);
        if (rc != 0) {
            pthread_mutex_lock(&ar->mu);
            if (ar->rc == 0) {
                ar->rc = rc;
                ar->err = e;
            }
            pthread_mutex_unlock(&ar->mu);
            atomic_store(&ar->failed, 1);
            iv_block_free(&blk);
            return;
        }
        if (ar->cell_major)
            iv_agg_add_rows(ar->acc, (unsigned)part, blk.n_rows, ar->cell_group + blk.row0, blk.indptr,
                            blk.indices, blk.index_size, blk.data, blk.dtype);
        else
            iv_agg_add_cols(ar->acc, (unsigned)part, blk.row0, blk.n_rows, ar->cell_group, blk.indptr,
                            blk.indices, blk.index_size, blk.data, blk.dtype);
        iv_block_free(&blk);
    }
}

/* IV_ECANCELLED once the request's cancel flag is set, between phases. */
static int vreq_cancelled(const iv_vreq_t *r, iv_err_t *err)
{
    if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed))
        return iv_fail(err, IV_ECANCELLED, "request cancelled");
    return 0;
}

/* An aggregate through its stages: the request, the groups, the decode
 * and the result.  What it owns is freed by agg_free. */
typedef struct agg {
    params_t p;
    iv_dataset_t *mds;            /* the matrix aggregated: X, a layer or raw/X */
    iv_meta_t *var_meta;          /* its genes: var, or raw/var for raw/X */
    const iv_dataset_info_t *in;  /* mds's */
    const char **gb, **st;        /* group_by and stats as given (owned arrays) */
    size_t n_gb, n_st;
    int64_t ddof;                 /* 1 unless the request says 0 */
    const iv_meta_col_t *gcols[AGG_MAX_GROUP_BY];
    int stat_bits[IV_STAT_COUNT];  /* the stats in the order given */
    unsigned mask;
    int64_t n_combos;             /* category combinations of the group_by columns */
    iv_fmt_t fmt;
    iv_sel_t so, sv;              /* sv lists each distinct gene once (agg_distinct_genes) */
    int64_t n_obs, n_var;         /* cells and genes selected (genes as listed) */
    int32_t *cell_group;          /* group of each position of the obs selection, or -1 */
    int64_t *combo_dense;         /* group of each combination, or -1 */
    int64_t *n_cells, *combo_of_group;  /* each group's cells and combination */
    int64_t n_groups;
    int64_t *ugenes, *gene_at, n_ug;    /* the distinct genes, and where each listed one is among them */
    int64_t n_dv;                 /* genes decoded */
    size_t part;                  /* bytes of one partial accumulator */
    iv_query_t *q;
    iv_agg_t *acc;
    double *vals, *dvals;         /* the result (per stat, group-major); dvals: per distinct gene */
} agg_t;

static void agg_free(agg_t *a)
{
    iv_agg_free(a->acc);
    iv_query_free(a->q);
    free(a->vals);
    free(a->dvals);
    free(a->ugenes);
    free(a->gene_at);
    free(a->cell_group);
    free(a->combo_dense);
    free(a->combo_of_group);
    free(a->n_cells);
    free(a->gb);
    free(a->st);
    params_free(&a->p);
}

/* The route's parameters, and the matrix "matrix" names. */
static int agg_parse(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(params_parse(&a->p, r, a->in->n_rows, a->in->n_cols, err));
    IV_TRY(param_list(&a->p, 0, &a->gb, &a->n_gb, err));
    IV_TRY(param_list(&a->p, 1, &a->st, &a->n_st, err));
    IV_TRY(param_int(&a->p, 2, 0, 1, &a->ddof, err));
    if (a->p.qr.matrix && r->matrix_open) {
        IV_TRY(r->matrix_open(r->matrix_ctx, a->p.qr.matrix, &a->mds, &a->var_meta, err));
        a->in = iv_dataset_info(a->mds);
    }
    return 0;
}

static int check_agg_lists(const agg_t *a, iv_err_t *err)
{
    if (a->n_gb == 0 || a->n_gb > AGG_MAX_GROUP_BY)
        return iv_fail(err, IV_EBAD_REQUEST, "group_by must name 1 to %d categorical obs columns",
                       AGG_MAX_GROUP_BY);
    if (a->n_st == 0)
        return iv_fail(err, IV_EBAD_REQUEST, "stats must name at least one of sum, mean, var, nnz, "
                       "frac_nonzero, max");
    return 0;
}

/* The statistics named, each once. */
static int agg_stats(agg_t *a, iv_err_t *err)
{
    for (size_t i = 0; i < a->n_st; i++) {
        int bit = iv_stat_parse(a->st[i]);
        if (!bit)
            return iv_fail(err, IV_EBAD_REQUEST, "unknown statistic '%.40s' (expected sum, mean, var, "
                           "nnz, frac_nonzero, max)", a->st[i]);
        if (a->mask & (unsigned)bit)
            return iv_fail(err, IV_EBAD_REQUEST, "statistic '%s' is named twice", a->st[i]);
        a->mask |= (unsigned)bit;
        a->stat_bits[i] = bit;
    }
    return 0;
}

/* The group_by columns: categorical obs columns spanning at most
 * AGG_MAX_COMBOS category combinations. */
static int agg_group_cols(const iv_meta_t *meta, agg_t *a, iv_err_t *err)
{
    a->n_combos = 1;
    for (size_t i = 0; i < a->n_gb; i++) {
        const iv_meta_col_t *c = iv_meta_find_col(meta, IV_AXIS_OBS, a->gb[i]);
        if (!c) return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs has no column '%.80s'", a->gb[i]);
        if (c->type != IV_COL_CATEGORICAL)
            return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs column '%.80s' is %s, not categorical",
                           a->gb[i], iv_col_type_name(c->type));
        a->gcols[i] = c;
        a->n_combos *= c->n_cats > 0 ? c->n_cats : 1;
        if (a->n_combos > AGG_MAX_COMBOS)
            return iv_fail(err, IV_ETOO_LARGE, "group_by spans more than %" PRId64 " category combinations",
                           AGG_MAX_COMBOS);
    }
    return 0;
}

/* The selection's names and filters, and the answer's format. */
static int agg_resolve(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(vreq_cancelled(r, err));
    IV_TRY(iv_rmeta_resolve_query(r->meta, a->var_meta, &a->p.qr, &r->dropped, err));
    IV_TRY(vreq_cancelled(r, err));
    IV_TRY(pick_format(r, a->p.qr.format, MEDIA_AGG, IV_FMT_JSON, &a->fmt, err));
    if (a->fmt == IV_FMT_NDJSON)
        return iv_fail(err, IV_ENOT_ACCEPTABLE, "aggregate answers application/json or " MEDIA_AGG);
    a->so = iv_psel_view(&a->p.qr.obs);
    a->sv = iv_psel_view(&a->p.qr.var);
    a->n_obs = a->so.all ? a->in->n_rows : a->so.n;
    a->n_var = a->sv.all ? a->in->n_cols : a->sv.n;
    return 0;
}

/* The parse of an aggregate request, in order. */
static int agg_request(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(agg_parse(r, a, err));
    IV_TRY(check_agg_lists(a, err));
    IV_TRY(agg_stats(a, err));
    IV_TRY(agg_group_cols(r->meta, a, err));
    return agg_resolve(r, a, err);
}

/* The combination of the group_by categories of a row (mixed radix), or
 * -1: a cell missing any group value is left out, as pandas' groupby
 * drops NaN keys. */
static inline int64_t cell_combo(const agg_t *a, int64_t row)
{
    int64_t code = 0;
    for (size_t g = 0; g < a->n_gb; g++) {
        const iv_meta_col_t *c = a->gcols[g];
        int32_t k = c->codes[row];
        if (k < 0 || k >= c->n_cats || (c->mask && c->mask[row])) return -1;
        code = code * c->n_cats + k;
    }
    return code;
}

/* Observed combinations only, in category order (pandas observed=True):
 * combo_dense counts a combination's cells on entry and holds its group
 * (or -1) on return, and cell_group goes from combinations to groups. */
static int agg_number_groups(agg_t *a, iv_err_t *err)
{
    a->n_groups = 0;
    for (int64_t k = 0; k < a->n_combos; k++)
        if (a->combo_dense[k]) a->n_groups++;
    a->n_cells = malloc((size_t)(a->n_groups ? a->n_groups : 1) * sizeof *a->n_cells);
    a->combo_of_group = malloc((size_t)(a->n_groups ? a->n_groups : 1) * sizeof *a->combo_of_group);
    if (!a->n_cells || !a->combo_of_group) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int64_t k = 0, g = 0; k < a->n_combos; k++) {
        if (!a->combo_dense[k]) {
            a->combo_dense[k] = -1;
            continue;
        }
        a->n_cells[g] = a->combo_dense[k];
        a->combo_of_group[g] = k;
        a->combo_dense[k] = g++;
    }
    for (int64_t i = 0; i < a->n_obs; i++)
        if (a->cell_group[i] >= 0) a->cell_group[i] = (int32_t)a->combo_dense[a->cell_group[i]];
    return 0;
}

/* The obs selection as positions -> rows, and each position's group. */
static int agg_group_cells(agg_t *a, iv_err_t *err)
{
    a->cell_group = malloc((size_t)(a->n_obs ? a->n_obs : 1) * sizeof *a->cell_group);
    a->combo_dense = malloc((size_t)a->n_combos * sizeof *a->combo_dense);
    if (!a->cell_group || !a->combo_dense) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int64_t k = 0; k < a->n_combos; k++) a->combo_dense[k] = 0;
    for (int64_t i = 0; i < a->n_obs; i++) {
        int64_t code = cell_combo(a, a->so.all ? i : a->so.idx[i]);
        a->cell_group[i] = (int32_t)code;
        if (code >= 0) a->combo_dense[code]++;
    }
    return agg_number_groups(a, err);
}

/* Output size: refuse early rather than after the decode. */
static int check_agg_size(const iv_vreq_t *r, const agg_t *a, iv_err_t *err)
{
    uint64_t cells = (uint64_t)a->n_groups * (uint64_t)a->n_var * a->n_st;
    if (a->fmt == IV_FMT_JSON && cells * 2 > r->json_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes x %zu stats exceed the "
                       "JSON limit of %zu bytes; ask for " MEDIA_AGG,
                       a->n_groups, a->n_var, a->n_st, r->json_bytes);
    /* As for an embedding: never past what every gene once would take,
     * or max_answer_bytes, whichever is larger. */
    /* The values, each gene's entry of the document (about 40 bytes),
     * and the body they are copied into. */
    uint64_t every = (uint64_t)a->n_groups * (uint64_t)a->in->n_cols * a->n_st;
    uint64_t holds = 2 * (cells * sizeof(double) + (uint64_t)a->n_var * 40);
    if (r->answer_bytes && holds > r->answer_bytes && cells > every)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes x %zu stats need %"
                       PRIu64 " bytes, more than the %zu an answer may hold (max_answer_bytes) and "
                       "more than every gene once; select fewer genes or groups",
                       a->n_groups, a->n_var, a->n_st, holds, r->answer_bytes);
    return 0;
}

/* Each distinct gene is decoded and accumulated once; a gene listed
 * again repeats its results (a body naming one gene a million times
 * costs one gene's work).  The accumulators must fit AGG_PART_BUDGET. */
static int agg_distinct_genes(agg_t *a, iv_err_t *err)
{
    if (!a->sv.all) IV_TRY(iv_sel_distinct(a->sv.idx, a->sv.n, &a->ugenes, &a->gene_at, &a->n_ug, err));
    if (a->ugenes) {
        a->sv.n = a->n_ug;
        a->sv.idx = a->ugenes;
    }
    a->n_dv = a->sv.all ? a->in->n_cols : a->sv.n;
    a->part = iv_agg_part_bytes(a->n_groups, a->n_dv, a->mask);
    if (a->part > AGG_PART_BUDGET)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes need %zu bytes of "
                       "accumulators, more than the %zu allowed",
                       a->n_groups, a->n_var, a->part, AGG_PART_BUDGET);
    return 0;
}

/* The query's blocks accumulated in n_parts partials on the pool. */
static int agg_accumulate(iv_vreq_t *r, agg_t *a, int64_t nb, unsigned n_parts, iv_err_t *err)
{
    aggrun_t ar;
    memset(&ar, 0, sizeof ar);
    ar.q = a->q;
    ar.acc = a->acc;
    ar.cell_group = a->cell_group;
    ar.cell_major = iv_query_orient(a->q) == IV_IVCSR;
    ar.n_blocks = nb;
    ar.n_parts = n_parts;
    ar.cancel = r->cancel;
    atomic_init(&ar.failed, 0);
    pthread_mutex_init(&ar.mu, NULL);
    iv_err_clear(&ar.err);
    iv_pool_parallel_for(r->pool, n_parts, 0, agg_part, &ar);
    pthread_mutex_destroy(&ar.mu);
    if (ar.rc != 0) {
        *err = ar.err;
        return ar.rc;
    }
    return 0;
}

/*
 * The decode.  Blocks in the serving orientation's own slices, whichever
 * it is: the planner picks the copy that decodes fewer bytes (the
 * gene-major one for a few genes over many cells), and the accumulation
 * follows it.  The pick is explicit: IV_OUT_MAJOR left to the query keeps
 * the file's orientation (50 genes over 1.26 M cells scanned every cell:
 * 328 ms where the gene-major copy takes a few).
 */
static int agg_decode(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    iv_orient_t served = iv_plan_orient(a->mds, &a->so, &a->sv, IV_OUT_MAJOR, NULL);
    iv_query_opts_t qo = {.axis = IV_OUT_MAJOR,
                          .pick = served == IV_IVCSR ? IV_PICK_CELLS : IV_PICK_GENES};
    IV_TRY(iv_query_new(a->mds, &a->so, &a->sv, &qo, &a->q, err));
    int64_t nb = iv_query_n_blocks(a->q);
    unsigned n_parts = r->pool ? iv_pool_threads(r->pool) + 1 : 1;
    if ((int64_t)n_parts > nb) n_parts = nb > 0 ? (unsigned)nb : 1;
    while (n_parts > 1 && a->part * n_parts > AGG_PART_BUDGET) n_parts--;
    IV_TRY(iv_agg_new(a->n_groups, a->n_dv, a->mask, n_parts, &a->acc, err));
    return agg_accumulate(r, a, nb, n_parts, err);
}

/* Each stat's values, per listed gene: a gene listed again repeats its
 * distinct gene's results. */
static int agg_results(agg_t *a, iv_err_t *err)
{
    size_t per = (size_t)a->n_groups * (size_t)a->n_var, dper = (size_t)a->n_groups * (size_t)a->n_dv;
    a->vals = malloc((per ? per : 1) * a->n_st * sizeof *a->vals);
    a->dvals = a->ugenes ? malloc((dper ? dper : 1) * sizeof *a->dvals) : NULL;
    if (!a->vals || (a->ugenes && !a->dvals)) return iv_fail(err, IV_ENOMEM, "out of memory for the result");
    for (size_t s = 0; s < a->n_st; s++) {
        double *out = a->vals + s * per;
        if (!a->ugenes) {
            iv_agg_result(a->acc, a->stat_bits[s], a->n_cells, (int)a->ddof, out);
            continue;
        }
        iv_agg_result(a->acc, a->stat_bits[s], a->n_cells, (int)a->ddof, a->dvals);
        for (int64_t g = 0; g < a->n_groups; g++)
            for (int64_t j = 0; j < a->n_var; j++)
                out[(size_t)(g * a->n_var + j)] = a->dvals[(size_t)(g * a->n_dv + a->gene_at[j])];
    }
    return 0;
}

/* The computation: groups, the size checks, the decode and the result. */
static int agg_compute(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(agg_group_cells(a, err));
    IV_TRY(check_agg_size(r, a, err));
    IV_TRY(agg_distinct_genes(a, err));
    IV_TRY(agg_decode(r, a, err));
    return agg_results(a, err);
}

/* Group g's key: its mixed-radix combination decoded back into category
 * labels. */
static void put_group_key(iv_buf_t *doc, const agg_t *a, int64_t g)
{
    int64_t k = a->combo_of_group[g];
    int64_t div = 1;
    for (size_t i = 1; i < a->n_gb; i++) div *= a->gcols[i]->n_cats;
    for (size_t i = 0; i < a->n_gb; i++) {
        int64_t code = k / div;
        k %= div;
        if (i + 1 < a->n_gb) div /= a->gcols[i + 1]->n_cats;
        if (i) iv_buf_puts(doc, ",");
        iv_buf_json_str(doc, iv_meta_col_cat(a->gcols[i], code));
    }
}

static void put_agg_genes(iv_buf_t *doc, const agg_t *a)
{
    const iv_meta_col_t *vix = a->var_meta ? iv_meta_index(a->var_meta, IV_AXIS_VAR) : NULL;
    for (int64_t j = 0; j < a->n_var && !doc->oom; j++) {
        int64_t gi = a->sv.all ? j : a->ugenes ? a->ugenes[a->gene_at[j]] : a->sv.idx[j];
        iv_buf_printf(doc, j ? ",{\"index\":%" PRId64 ",\"name\":" : "{\"index\":%" PRId64 ",\"name\":", gi);
        const char *nm = vix ? col_get(vix, gi) : NULL;
        if (nm) iv_buf_json_str(doc, nm);
        else iv_buf_puts(doc, "null");
        iv_buf_puts(doc, "}");
    }
}

/* The document without its values: groups, then genes. */
static void agg_document(iv_buf_t *doc, const agg_t *a)
{
    iv_buf_puts(doc, "{\"group_by\":[");
    for (size_t g = 0; g < a->n_gb; g++) {
        if (g) iv_buf_puts(doc, ",");
        iv_buf_json_str(doc, a->gcols[g]->name);
    }
    iv_buf_puts(doc, "],\"stats\":[");
    for (size_t s = 0; s < a->n_st; s++)
        iv_buf_printf(doc, s ? ",\"%s\"" : "\"%s\"", iv_stat_name(a->stat_bits[s]));
    iv_buf_puts(doc, "],\"matrix\":");
    iv_buf_json_str(doc, a->p.qr.matrix ? a->p.qr.matrix : "X");
    iv_buf_printf(doc, ",\"ddof\":%d,\"served_by\":\"%s\",\"n_cells\":%" PRId64 ",\"groups\":[",
                  (int)a->ddof, iv_query_orient(a->q) == IV_IVCSR ? "cells" : "genes", a->n_obs);
    for (int64_t g = 0; g < a->n_groups; g++) {
        iv_buf_puts(doc, g ? ",{\"key\":[" : "{\"key\":[");
        put_group_key(doc, a, g);
        iv_buf_printf(doc, "],\"n_cells\":%" PRId64 "}", a->n_cells[g]);
    }
    iv_buf_puts(doc, "],\"genes\":[");
    put_agg_genes(doc, a);
    iv_buf_puts(doc, "]");
}

/* The answer: the document and the values, in JSON or the binary form
 * (enc_viewer.h). */
static int agg_encode(iv_vreq_t *r, const agg_t *a, iv_err_t *err)
{
    iv_buf_t doc;
    iv_buf_init(&doc);
    agg_document(&doc, a);
    const char *names[IV_STAT_COUNT];
    for (size_t s = 0; s < a->n_st; s++) names[s] = iv_stat_name(a->stat_bits[s]);
    iv_agg_table_t t = {.doc = doc.data, .doc_len = doc.len, .n_stats = a->n_st, .stats = names,
                        .n_groups = a->n_groups, .n_genes = a->n_var, .values = a->vals};
    iv_enc_agg(&r->out, a->fmt, &t, r->json_bytes);
    r->ctype = a->fmt == IV_FMT_BINARY ? MEDIA_AGG : "application/json";
    int rc = 0;
    if (doc.oom || r->out.oom) rc = iv_fail(err, IV_ENOMEM, "out of memory building the result");
    else if (a->fmt == IV_FMT_JSON && r->out.len > r->json_bytes)
        rc = iv_fail(err, IV_ETOO_LARGE, "the result exceeds the JSON limit of %zu bytes; ask for " MEDIA_AGG,
                     r->json_bytes);
    iv_buf_free(&doc);
    return rc;
}

static int run_aggregate(iv_vreq_t *r, iv_err_t *err)
{
    if (!r->meta) return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    static const char *const keys[] = {"group_by", "stats", "ddof"};
    agg_t a;
    memset(&a, 0, sizeof a);
    a.p.keys = keys;
    a.p.n = 3;
    a.p.with_matrix = 1;
    a.mds = r->ds;
    a.var_meta = r->meta;
    a.in = iv_dataset_info(r->ds);
    a.ddof = 1;
    int rc = agg_request(r, &a, err);
    if (rc == 0) rc = agg_compute(r, &a, err);
    if (rc == 0) rc = agg_encode(r, &a, err);
    agg_free(&a);
    return rc;
}

/* ---- zarr store (api/zarr.h) ---------------------------------------------- */

static int run_zarr(iv_vreq_t *r, iv_err_t *err)
{
    iv_zarr_src_t src = {.ds = r->ds, .meta = r->meta, .arrays = r->vx ? r->vx->arrays : NULL,
                         .cache = r->vx ? r->vx->zcache : NULL,
                         .matrix_name = r->matrix_name, .matrix_open = r->matrix_open,
                         .matrix_ctx = r->matrix_ctx};
    iv_zarr_kind_t kind;
    IV_TRY(iv_zarr_get(&src, r->name, &r->out, &kind, err));
    r->ctype = kind == IV_ZARR_CHUNK ? MEDIA_ZARR_CHUNK : MEDIA_ZARR_META;
    return 0;
}

/* ---- diffexp (api/diffexp.c) ---------------------------------------------- */

static int run_diffexp(iv_vreq_t *r, iv_err_t *err)
{
    if (!r->is_post) return iv_fail(err, IV_EMETHOD, "diffexp takes POST with a JSON body");
    iv_api_diffexp_in_t in = {.body = r->body, .body_len = r->body_len, .ds = r->ds, .meta = r->meta,
                              .pool = r->pool, .cancel = r->cancel, .json_bytes = r->json_bytes,
                              .accept = r->accept};
    return iv_api_diffexp(&in, &r->out, &r->ctype, err);
}

/* ---- uns (api/uns_doc.c) -------------------------------------------------- */

/* The file's uns, read on the first request (on this worker: the read
 * forks a child and waits) and kept with the dataset's Zarr state, which
 * serves the same entries; a uns that cannot be read is an error answer
 * here, where the store serves an empty one. */
static int run_uns(iv_vreq_t *r, iv_err_t *err)
{
    IV_RETURN_IF(r->query[0], err, IV_EBAD_REQUEST, "uns takes no query parameters");
    const iv_uns_t *u;
    IV_TRY(iv_zarr_cache_uns_get(r->vx ? r->vx->zcache : NULL, iv_dataset_info(r->ds)->path, &u, err));
    r->ctype = "application/json";
    return iv_api_uns_doc(u, r->json_bytes, &r->out, err);
}

/* ---- obsp (core/meta/obsp.c, api/obsp_answer.c) -------------------------- */

/* The file's obsp elements, listed on each request (a child reads the
 * group; the ETag spares a repeat). */
static int run_obsp_list(iv_vreq_t *r, iv_err_t *err)
{
    IV_RETURN_IF(r->query[0], err, IV_EBAD_REQUEST, "obsp takes no query parameters");
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    iv_obsp_list_t *l;
    IV_TRY(iv_obsp_list(in->path, in->n_rows, &l, err));
    r->ctype = "application/json";
    int rc = iv_api_obsp_list_doc(l, &r->out, err);
    iv_obsp_list_free(l);
    return rc;
}

/* The request: the query route's cell selection (names and filters
 * resolved) and the answer's format; no genes, matrix or orientation. */
static int obsp_request(iv_vreq_t *r, params_t *p, iv_fmt_t *fmt, iv_err_t *err)
{
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(params_parse(p, r, in->n_rows, in->n_cols, err));
    if (has_selection(&p->qr.var) || p->qr.matrix || p->qr.by_var || p->qr.dense)
        return iv_fail(err, IV_EBAD_SELECTION, "obsp/%.100s takes an obs selection only", r->name);
    IV_TRY(iv_rmeta_resolve_query(r->meta, r->meta, &p->qr, &r->dropped, err));
    return pick_format(r, p->qr.format, "application/vnd.ivserve.csr", IV_FMT_BINARY, fmt, err);
}

/* P[sel][:, sel] of an obsp element, read on this worker (a child reads
 * the selected rows) and sent as a /query answer. */
static int run_obsp(iv_vreq_t *r, iv_err_t *err)
{
    params_t p;
    memset(&p, 0, sizeof p);
    iv_fmt_t fmt = IV_FMT_NONE;
    iv_obsp_csr_t m;
    memset(&m, 0, sizeof m);
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    int rc = obsp_request(r, &p, &fmt, err);
    int all = p.qr.obs.kind == IV_PSEL_ALL;
    if (rc == 0)
        rc = iv_obsp_read(in->path, r->name, in->n_rows, all ? NULL : p.qr.obs.idx, all ? 0 : p.qr.obs.n,
                          IV_OBSP_MAX_NNZ, &m, err);
    if (rc == 0) rc = iv_api_obsp_encode(&m, all ? NULL : p.qr.obs.idx, fmt, r->json_bytes, &r->out, err);
    if (rc == 0) r->ctype = fmt_media(fmt, "application/vnd.ivserve.csr");
    iv_obsp_csr_free(&m);
    params_free(&p);
    return rc;
}

/* ---- caching and compression ---------------------------------------------- */

static int etag_listed(const char *inm, const char *etag)
{
    const char *p = inm;
    size_t el = strlen(etag);
    while (p && *p) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == '*') return 1;
        if (!strncmp(p, "W/", 2)) p += 2;  /* If-None-Match compares weakly */
        if (!strncmp(p, etag, el) && (p[el] == '\0' || p[el] == ',' || p[el] == ' ')) return 1;
        p = strchr(p, ',');
    }
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    /* The NUL separates fields, so "ab"+"c" and "a"+"bc" differ. */
    return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1);
}

/* Two tags: the identity body's and the encoded body's.  Which one a
 * response gets is known only after the work (a body may not be worth
 * encoding), so a conditional request matching either is answered 304
 * with the tag it matched: both bodies stand for this request. */
static void vreq_etags(const iv_vreq_t *r, iv_coding_t coding, char tag_id[24], char tag_coded[24])
{
    static const char *const suffix[] = {"", "-gz", "-br"};
    uint64_t h = 1469598103934665603ull;
    h = fnv_str(h, iv_vds_identity(r->vx));
    h = fnv(h, &r->route, sizeof r->route);
    if (r->route == IV_VR_ZARR) {
        /* The store's bytes also depend on its format and chunking. */
        static const int64_t zarr_format[3] = {IV_ZARR_STORE_FORMAT, IV_ZARR_X_CHUNK, IV_ZARR_ZSTD_LEVEL};
        h = fnv(h, zarr_format, sizeof zarr_format);
    }
    if (r->route == IV_VR_UNS) {
        static const int uns_format = IV_API_UNS_FORMAT;
        h = fnv(h, &uns_format, sizeof uns_format);
    }
    h = fnv_str(h, r->name);
    h = fnv_str(h, r->query);
    h = fnv(h, r->body ? r->body : "", r->body_len);
    h = fnv_str(h, r->accept);
    snprintf(tag_id, 24, "\"%016llx\"", (unsigned long long)h);
    snprintf(tag_coded, 24, "\"%016llx%s\"", (unsigned long long)(h ^ (uint64_t)coding), suffix[coding]);
}

/* The tag of If-None-Match that stands for this request, or NULL. */
static const char *vreq_match(const iv_vreq_t *r, iv_coding_t coding, const char *tag_id,
                              const char *tag_coded)
{
    if (!r->if_none_match) return NULL;
    if (coding && etag_listed(r->if_none_match, tag_coded)) return tag_coded;
    if (etag_listed(r->if_none_match, tag_id)) return tag_id;
    return NULL;
}

typedef int (*route_run_fn)(iv_vreq_t *r, iv_err_t *err);

/* Each route's handler. */
static const route_run_fn route_runs[] = {
    [IV_VR_OBSM] = run_marray,
    [IV_VR_VARM] = run_marray,
    [IV_VR_OBS_SEARCH] = run_search,
    [IV_VR_VAR_SEARCH] = run_search,
    [IV_VR_RAW_VAR_SEARCH] = run_search,
    [IV_VR_AGGREGATE] = run_aggregate,
    [IV_VR_DIFFEXP] = run_diffexp,
    [IV_VR_OBS_TABLE] = run_meta,
    [IV_VR_VAR_TABLE] = run_meta,
    [IV_VR_OBS_COLUMN] = run_meta,
    [IV_VR_VAR_COLUMN] = run_meta,
    [IV_VR_RAW_VAR_TABLE] = run_meta,
    [IV_VR_RAW_VAR_COLUMN] = run_meta,
    [IV_VR_ZARR] = run_zarr,
    [IV_VR_UNS] = run_uns,
    [IV_VR_OBSP_LIST] = run_obsp_list,
    [IV_VR_OBSP] = run_obsp,
};

/* Encodes r->out with the coding where that pays; 1 when it did.  Float
 * arrays (embeddings) shrink by under 10% at a cost of 10 to 300 MB/s a
 * thread: they go out as they are, compressible bodies (JSON, NDJSON, the
 * aggregate's binary with its JSON prelude) are encoded.  Zarr chunks go
 * as they are too (docs/zarr.md): their metadata is encoded. */
static int encode_body(iv_vreq_t *r, iv_coding_t coding)
{
    int worth = r->route == IV_VR_ZARR ? r->ctype == MEDIA_ZARR_META : strcmp(r->ctype, MEDIA_ARRAY) != 0;
    if (!coding || !worth || r->out.len < 1024) return 0;
    return iv_coding_encode(&r->out, coding, GZIP_LEVEL, r->pool);
}

int iv_vreq_run(iv_vreq_t *r, iv_err_t *err)
{
    /* The coding is chosen before the work so that the ETag (which names
     * it) is known before it, and a match costs nothing more. */
    iv_coding_t coding = iv_coding_pick(r->accept_encoding, IV_ANSWER_DOCUMENT, GZIP_LEVEL);
    char tag_id[24], tag_coded[24];
    vreq_etags(r, coding, tag_id, tag_coded);
    char cc[80];
    if (r->max_age)
        snprintf(cc, sizeof cc, "Cache-Control: %s, max-age=%u\r\n", r->private_cache ? "private" : "public",
                 (unsigned)r->max_age);
    else
        snprintf(cc, sizeof cc, "Cache-Control: no-cache\r\n");
    r->status = 200;
    const char *match = vreq_match(r, coding, tag_id, tag_coded);
    if (match) {
        snprintf(r->extra, sizeof r->extra, "ETag: %s\r\n%sVary: Accept, Accept-Encoding\r\n", match, cc);
        r->status = 304;
        return 0;
    }
    route_run_fn run = r->route > 0 && (size_t)r->route < N_OF(route_runs) ? route_runs[r->route] : NULL;
    if (!run) return iv_fail(err, IV_ENOT_FOUND, "no such path");
    IV_TRY(run(r, err));
    int encoded = encode_body(r, coding);
    snprintf(r->extra, sizeof r->extra, "ETag: %s\r\n%sVary: Accept, Accept-Encoding\r\n%s%s%s",
             encoded ? tag_coded : tag_id, cc, encoded ? "Content-Encoding: " : "",
             encoded ? iv_coding_name(coding) : "", encoded ? "\r\n" : "");
    return 0;
}
