/*
 * A viewer route's own parameters (dtype, q, group_by, ...), taken out of
 * the query string or JSON body before the rest goes to the query route's
 * selection parser, and the helpers every handler shares: the answer's
 * format, whether an axis is selected, raw/var's metadata.
 */
#include "viewer_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void vr_params_free(params_t *p)
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
int vr_params_parse(params_t *p, const iv_vreq_t *r, int64_t n_obs, int64_t n_var, iv_err_t *err)
{
    return r->is_post ? params_parse_body(p, r, n_obs, n_var, err) : params_parse_query(p, r, n_obs, n_var, err);
}

/* Parameter i as a string (a JSON string, or the query-string value). */
int vr_param_str(params_t *p, size_t i, const char **out, iv_err_t *err)
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
int vr_param_int(params_t *p, size_t i, int64_t lo, int64_t hi, int64_t *out, iv_err_t *err)
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
int vr_param_list(params_t *p, size_t i, const char ***out, size_t *n, iv_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (p->vals[i]) return list_from_query(p->vals[i], out, n, err);
    if (p->items[i]) return list_from_json(p->items[i], p->keys[i], out, n, err);
    return 0;
}

/* The output format: the format parameter, else Accept (extra: this
 * route's own binary media type, which also means binary). */
int vr_pick_format(const iv_vreq_t *r, iv_fmt_t given, const char *own_media, iv_fmt_t dflt,
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

const char *vr_fmt_media(iv_fmt_t f, const char *own_media)
{
    return f == IV_FMT_BINARY ? own_media : f == IV_FMT_NDJSON ? "application/x-ndjson" : "application/json";
}

int vr_has_selection(const iv_psel_t *p)
{
    return p->kind != IV_PSEL_ALL || p->filter != NULL;
}

/* raw/X's genes (raw/var) for the raw/var routes: 404 (unknown_matrix)
 * when the dataset has no servable raw/X, 404 when its file has no
 * raw/var. */
int vr_raw_var_meta(iv_vreq_t *r, iv_meta_t **m, iv_err_t *err)
{
    iv_dataset_t *rds;
    if (!r->matrix_open) return iv_fail(err, IV_ENOT_FOUND, "the dataset has no raw/X");
    IV_TRY(r->matrix_open(r->matrix_ctx, "raw/X", &rds, m, err));
    if (!*m) return iv_fail(err, IV_ENOT_FOUND, "the file has no raw/var (raw/X's genes are 0..n-1)");
    return 0;
}
