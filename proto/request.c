/*
 * Query request parsing (see request.h).
 *
 * Both syntaxes (JSON body and query string) end in the same helpers
 * (sel_from_*), so a selection means the same thing whichever way it came.
 * Validation happens while parsing and stops at the first bad value, with
 * a message a person can act on ("obs.index[3] = 70 is out of range
 * [0, 60)").  Arrays are sized from the request and bounded by it (index
 * lists) or by the axis length (ranges, masks), never by a number in the
 * request alone.
 */
#include "request.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base64.h"
#include "filter_json.h"
#include "index_arrays.h"
#include "where.h"

/* Largest integer a double holds exactly: a JSON index or range bound past
 * it is past every axis (out of range). */
#define IV_MAX_EXACT 9007199254740992.0

/* Frees the primary selection (index, range, mask or names) only. */
static void psel_clear_primary(iv_psel_t *p)
{
    free(p->idx);
    if (p->names) {
        for (int64_t i = 0; i < p->n; i++) free(p->names[i]);
        free(p->names);
    }
    p->idx = NULL;
    p->names = NULL;
    p->n = 0;
    p->kind = IV_PSEL_ALL;
}

static void psel_clear(iv_psel_t *p)
{
    psel_clear_primary(p);
    free(p->by);
    iv_expr_free(p->filter);
    memset(p, 0, sizeof *p);
}

/* Adds e (taken in every case) to p's filter, and-ing with one already there. */
static int psel_add_filter(iv_psel_t *p, const char *axis, iv_expr_t *e, iv_err_t *err)
{
    if (!p->filter) {
        p->filter = e;
        return 0;
    }
    iv_expr_t *both = iv_expr_new(IV_EXPR_AND, NULL);
    if (!both || iv_expr_add_kid(both, p->filter) != 0) {
        iv_expr_free(both);
        iv_expr_free(e);
        return iv_fail(err, IV_ENOMEM, "out of memory for the %s filter", axis);
    }
    p->filter = both;
    if (iv_expr_add_kid(both, e) != 0) {
        iv_expr_free(e);
        return iv_fail(err, IV_ENOMEM, "out of memory for the %s filter", axis);
    }
    return 0;
}

/* Parses a where string into p's filter; the message gets the axis prefixed. */
static int psel_add_where(iv_psel_t *p, const char *axis, const char *s, size_t len, iv_err_t *err)
{
    iv_expr_t *e = NULL;
    iv_err_t we;
    iv_err_clear(&we);
    int rc = iv_where_parse(s, len, &e, &we);
    if (rc != 0) return iv_fail(err, rc, "%s.%s", axis, we.msg);
    return psel_add_filter(p, axis, e, err);
}

static int psel_set_missing(iv_psel_t *p, const char *axis, const char *v, iv_err_t *err)
{
    if (!strcmp(v, "ignore")) p->missing_ignore = 1;
    else if (!strcmp(v, "error")) p->missing_ignore = 0;
    else
        return iv_fail(err, IV_EBAD_SELECTION, "%s.missing must be \"error\" or \"ignore\", not '%.40s'",
                       axis, v);
    return 0;
}

void iv_qreq_free(iv_qreq_t *q)
{
    if (!q) return;
    psel_clear(&q->obs);
    psel_clear(&q->var);
    free(q->matrix);
    q->matrix = NULL;
    q->format = IV_FMT_NONE;
    q->by_var = q->dense = 0;
}

/* ---- the matrix a request reads ------------------------------------------ */

/* The longest matrix name a request may give ("layers/" and a layer name). */
#define MATRIX_NAME_MAX 255

/* Checks a requested matrix name and keeps a copy in out->matrix. */
static int set_matrix(iv_qreq_t *out, const char *v, size_t len, iv_err_t *err)
{
    if (out->matrix) return iv_fail(err, IV_EBAD_REQUEST, "\"matrix\" is given more than once");
    if (len == 0 || len > MATRIX_NAME_MAX || memchr(v, '\0', len))
        return iv_fail(err, IV_EBAD_REQUEST, "\"matrix\" must name a matrix of the dataset "
                       "(\"X\", \"layers/NAME\" or \"raw/X\", at most %d bytes)", MATRIX_NAME_MAX);
    out->matrix = strndup(v, len);
    return out->matrix ? 0 : iv_fail(err, IV_ENOMEM, "out of memory");
}

/* The axis lengths of the matrix the request names (NULL: X), from the
 * caller's resolver, or the fixed lengths of a route that serves X only. */
typedef struct shape_src {
    iv_qreq_matrix_fn fn;
    void *ctx;
    int64_t n_obs, n_var;
} shape_src_t;

static int resolve_shape(const shape_src_t *src, const iv_qreq_t *q, int64_t *n_obs,
                         int64_t *n_var, iv_err_t *err)
{
    if (src->fn) return src->fn(src->ctx, q->matrix, n_obs, n_var, err);
    if (q->matrix && strcmp(q->matrix, "X") != 0)
        return iv_fail(err, IV_EBAD_REQUEST, "\"matrix\": \"%.80s\": this route serves X only "
                       "(other matrices are read by /query and /count)", q->matrix);
    *n_obs = src->n_obs;
    *n_var = src->n_var;
    return 0;
}

iv_sel_t iv_psel_view(const iv_psel_t *p)
{
    iv_sel_t s;
    s.all = p->kind == IV_PSEL_ALL;
    s.n = s.all ? 0 : p->n;
    s.idx = p->idx;
    return s;
}

void iv_psel_set_indices(iv_psel_t *p, int64_t *idx, int64_t n)
{
    psel_clear_primary(p);
    p->kind = IV_PSEL_INDEX;
    p->idx = idx;
    p->n = n;
}

iv_fmt_t iv_fmt_parse(const char *name)
{
    if (!name) return IV_FMT_NONE;
    if (!strcmp(name, "binary") || !strcmp(name, "csr")) return IV_FMT_BINARY;
    if (!strcmp(name, "ndjson")) return IV_FMT_NDJSON;
    if (!strcmp(name, "json")) return IV_FMT_JSON;
    return IV_FMT_NONE;
}

const char *iv_fmt_name(iv_fmt_t f)
{
    switch (f) {
    case IV_FMT_BINARY: return "binary";
    case IV_FMT_NDJSON: return "ndjson";
    case IV_FMT_JSON: return "json";
    default: return "none";
    }
}

const char *iv_fmt_media_type(iv_fmt_t f)
{
    switch (f) {
    case IV_FMT_BINARY: return "application/vnd.ivserve.csr";
    case IV_FMT_NDJSON: return "application/x-ndjson";
    case IV_FMT_JSON: return "application/json";
    default: return "application/octet-stream";
    }
}

/* The media types the server encodes, and the wildcards, which pick NDJSON
 * so that a terminal never receives binary. */
static const struct {
    const char *type;
    iv_fmt_t fmt;
} accept_types[] = {
    {"application/vnd.ivserve.csr", IV_FMT_BINARY},
    {"application/x-ndjson", IV_FMT_NDJSON},
    {"application/json", IV_FMT_JSON},
    {"*/*", IV_FMT_NDJSON},
    {"application/*", IV_FMT_NDJSON},
};

/* The format of the media range [s, s+n), case-insensitive; NONE if unknown. */
static iv_fmt_t accept_type(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof accept_types / sizeof accept_types[0]; i++)
        if (strlen(accept_types[i].type) == n && strncasecmp(s, accept_types[i].type, n) == 0)
            return accept_types[i].fmt;
    return IV_FMT_NONE;
}

/* The q of one entry's parameters [semi, end) (semi NULL: none): 1 unless given. */
static double accept_q(const char *semi, const char *end)
{
    double q = 1.0;
    for (const char *a = semi; a && a < end;) {
        a++;
        while (a < end && isspace((unsigned char)*a)) a++;
        if (end - a >= 2 && (a[0] == 'q' || a[0] == 'Q') && a[1] == '=') {
            char tmp[16] = {0};
            size_t l = (size_t)(end - a - 2);
            if (l > sizeof tmp - 1) l = sizeof tmp - 1;
            memcpy(tmp, a + 2, l);
            q = strtod(tmp, NULL);
        }
        a = memchr(a, ';', (size_t)(end - a));
    }
    return q;
}

/* One entry [p, end) of an Accept list: its format and its q. */
static iv_fmt_t accept_entry(const char *p, const char *end, double *q)
{
    /* media range up to ';' or the end of the entry, trimmed */
    const char *semi = memchr(p, ';', (size_t)(end - p));
    const char *te = semi ? semi : end;
    const char *ts = p;
    while (ts < te && isspace((unsigned char)*ts)) ts++;
    while (te > ts && isspace((unsigned char)te[-1])) te--;
    *q = accept_q(semi, end);
    return accept_type(ts, (size_t)(te - ts));
}

iv_fmt_t iv_fmt_from_accept(const char *accept)
{
    if (!accept) return IV_FMT_NDJSON;
    const char *p = accept;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0') return IV_FMT_NDJSON;
    iv_fmt_t best = IV_FMT_NONE;
    double best_q = 0.0;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        double q;
        iv_fmt_t f = accept_entry(p, end, &q);
        if (f != IV_FMT_NONE && q > 0.0 && q > best_q) {
            best = f;
            best_q = q;
        }
        p = *end ? end + 1 : end;
    }
    return best;
}

static char *url_decode(const char *src, size_t n, int plus_space)
{
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '%') {
            if (n - i < 3 || !isxdigit((unsigned char)src[i + 1]) ||
                !isxdigit((unsigned char)src[i + 2])) {
                free(out);
                return NULL;
            }
            char hx[3] = {src[i + 1], src[i + 2], 0};
            c = (char)strtol(hx, NULL, 16);
            i += 2;
        } else if (c == '+' && plus_space) {
            c = ' ';
        }
        if (c == '\0') {
            free(out);
            return NULL;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

char *iv_url_decode(const char *src, size_t n)
{
    return url_decode(src, n, 0);
}

char *iv_url_decode_form(const char *src, size_t n)
{
    return url_decode(src, n, 1);
}

/* ---- selections from JSON ---------------------------------------------- */

/* A JSON number as an integer: 0; -1 when it is not an integer; -2 when
 * it is one too large for a double to hold exactly (past 2^53, so past
 * any axis: 18446744073709551615 is read as 2^64), *big its value. */
static int json_int(const cJSON *v, int64_t *out, double *big)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return -1;
    if (fabs(d) > IV_MAX_EXACT) {
        if (big) *big = d;
        return -2;
    }
    *out = (int64_t)d;
    return 0;
}

static int check_index(const char *axis, const char *what, int64_t pos, int64_t v, int64_t n,
                       iv_err_t *err)
{
    if (v < 0 || v >= n)
        return iv_fail(err, IV_EOUT_OF_RANGE, "%s.%s[%lld] = %lld is out of range [0, %lld)",
                       axis, what, (long long)pos, (long long)v, (long long)n);
    return 0;
}

/* The same message for an index past what an int64 holds; the value is
 * the one the JSON number was read as (its text is not kept). */
static int huge_index(const char *axis, int64_t pos, double v, int64_t n, iv_err_t *err)
{
    return iv_fail(err, IV_EOUT_OF_RANGE, "%s.index[%lld] = %.17g is out of range [0, %lld)", axis,
                   (long long)pos, v, (long long)n);
}

static int check_range(const char *axis, int64_t start, int64_t stop, int64_t n, iv_err_t *err)
{
    if (start < 0 || stop < start || stop > n)
        return iv_fail(err, IV_EOUT_OF_RANGE,
                       "%s.range [%lld, %lld) is not within [0, %lld) with start <= stop", axis,
                       (long long)start, (long long)stop, (long long)n);
    return 0;
}

static int sel_from_range(iv_psel_t *p, const char *axis, int64_t start, int64_t stop, int64_t n,
                          iv_err_t *err)
{
    IV_TRY(check_range(axis, start, stop, n, err));
    int64_t cnt = stop - start;
    p->idx = malloc((size_t)(cnt ? cnt : 1) * sizeof *p->idx);
    if (!p->idx) return iv_fail(err, IV_ENOMEM, "out of memory for %s.range", axis);
    for (int64_t i = 0; i < cnt; i++) p->idx[i] = start + i;
    p->n = cnt;
    p->kind = IV_PSEL_RANGE;
    return 0;
}

/* Bitmap of nbytes bytes (LSB first) over an axis of n elements. */
static int sel_from_bitmap(iv_psel_t *p, const char *axis, const uint8_t *bits, size_t nbytes,
                           int64_t n, iv_err_t *err)
{
    size_t want = (size_t)((n + 7) / 8);
    if (nbytes != want)
        return iv_fail(err, IV_EBAD_SELECTION,
                       "%s.mask decodes to %zu bytes; an axis of %lld elements needs %zu", axis,
                       nbytes, (long long)n, want);
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++) cnt += (bits[i >> 3] >> (i & 7)) & 1;
    for (int64_t i = n; i < (int64_t)want * 8; i++)
        if ((bits[i >> 3] >> (i & 7)) & 1)
            return iv_fail(err, IV_EOUT_OF_RANGE, "%s.mask sets bit %lld past the axis length %lld",
                           axis, (long long)i, (long long)n);
    p->idx = malloc((size_t)(cnt ? cnt : 1) * sizeof *p->idx);
    if (!p->idx) return iv_fail(err, IV_ENOMEM, "out of memory for %s.mask", axis);
    int64_t o = 0;
    for (int64_t i = 0; i < n; i++)
        if ((bits[i >> 3] >> (i & 7)) & 1) p->idx[o++] = i;
    p->n = cnt;
    p->kind = IV_PSEL_MASK;
    return 0;
}

static int sel_from_b64(iv_psel_t *p, const char *axis, const char *s, size_t len, int64_t n,
                        iv_err_t *err)
{
    size_t cap = iv_base64_decoded_max(len);
    uint8_t *bits = malloc(cap ? cap : 1);
    if (!bits) return iv_fail(err, IV_ENOMEM, "out of memory for %s.mask", axis);
    long got = iv_base64_decode(s, len, bits, cap);
    int rc;
    if (got < 0)
        rc = iv_fail(err, IV_EBAD_SELECTION, "%s.mask is not valid base64", axis);
    else
        rc = sel_from_bitmap(p, axis, bits, (size_t)got, n, err);
    free(bits);
    return rc;
}

static int sel_names_alloc(iv_psel_t *p, const char *axis, int64_t cnt, iv_err_t *err)
{
    p->names = calloc((size_t)(cnt ? cnt : 1), sizeof *p->names);
    if (!p->names) return iv_fail(err, IV_ENOMEM, "out of memory for %s.names", axis);
    p->kind = IV_PSEL_NAMES;
    return 0;
}

/* Index of k in keys[0..n), or -1. */
static int key_index(const char *k, const char *const *keys, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(k, keys[i])) return i;
    return -1;
}

/* The keys of one axis' selection object; the first four are the primary
 * selection, of which one at most is given. */
static const char *const sel_keys[] = {"index", "range", "mask", "names",
                                       "filter", "where", "by", "missing"};

/* Refuses unknown and repeated keys, and more than one primary selection. */
static int check_sel_keys(const char *axis, const cJSON *o, iv_err_t *err)
{
    const cJSON *kv = NULL;
    int seen = 0;
    unsigned dup = 0;
    cJSON_ArrayForEach(kv, o)
    {
        const char *k = kv->string;
        int ki = key_index(k, sel_keys, 8);
        if (ki < 0)
            return iv_fail(err, IV_EBAD_SELECTION,
                           "%s has unknown key '%.60s' (expected index, range, mask, names, filter, "
                           "where, by or missing)",
                           axis, k);
        /* A parser keeps one of two equal keys and drops the other without
         * a word; which one differs between parsers, so refuse both. */
        if (dup & (1u << ki))
            return iv_fail(err, IV_EBAD_REQUEST, "%s: key '%s' is given more than once", axis, k);
        dup |= 1u << ki;
        if (ki < 4 && ++seen > 1)
            return iv_fail(err, IV_EBAD_SELECTION,
                           "%s names more than one of index, range, mask, names", axis);
    }
    return 0;
}

/* "filter" and "where" of a selection object, and-ed into p's filter. */
static int sel_filters_from_json(iv_psel_t *p, const char *axis, const cJSON *o, iv_err_t *err)
{
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "filter"))) {
        iv_expr_t *e = NULL;
        iv_err_t fe;
        iv_err_clear(&fe);
        int rc = iv_filter_json_parse(v, &e, &fe);
        if (rc != 0) return iv_fail(err, rc, "%s.%s", axis, fe.msg);
        IV_TRY(psel_add_filter(p, axis, e, err));
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "where"))) {
        if (!cJSON_IsString(v))
            return iv_fail(err, IV_EBAD_REQUEST, "%s.where must be a string", axis);
        IV_TRY(psel_add_where(p, axis, v->valuestring, strlen(v->valuestring), err));
    }
    return 0;
}

/* "by" and "missing", which go with "names" only. */
static int sel_name_opts_from_json(iv_psel_t *p, const char *axis, const cJSON *o, iv_err_t *err)
{
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(o, "by");
    const cJSON *miss = cJSON_GetObjectItemCaseSensitive(o, "missing");
    if ((by || miss) && !cJSON_GetObjectItemCaseSensitive(o, "names"))
        return iv_fail(err, IV_EBAD_SELECTION, "%s: \"by\" and \"missing\" go with \"names\"", axis);
    if (by) {
        if (!cJSON_IsString(by))
            return iv_fail(err, IV_EBAD_SELECTION, "%s.by must be a column name", axis);
        p->by = strdup(by->valuestring);
        if (!p->by) return iv_fail(err, IV_ENOMEM, "out of memory for %s.by", axis);
    }
    if (miss) {
        if (!cJSON_IsString(miss))
            return iv_fail(err, IV_EBAD_SELECTION, "%s.missing must be \"error\" or \"ignore\"", axis);
        IV_TRY(psel_set_missing(p, axis, miss->valuestring, err));
    }
    return 0;
}

/* An index array read ahead of cJSON (index_arrays.h): its integers
 * handed to p and checked as cJSON's would be. */
static int sel_index_taken(iv_psel_t *p, const char *axis, iv_index_array_t *pre, int64_t n,
                           iv_err_t *err)
{
    p->kind = IV_PSEL_INDEX;
    p->idx = pre->v;
    pre->v = NULL;
    p->n = pre->n;
    for (int64_t i = 0; i < p->n; i++) IV_TRY(check_index(axis, "index", i, p->idx[i], n, err));
    return 0;
}

static int sel_index_from_json(iv_psel_t *p, const char *axis, const cJSON *v, int64_t n,
                               iv_index_array_t *pre, iv_err_t *err)
{
    if (!cJSON_IsArray(v))
        return iv_fail(err, IV_EBAD_SELECTION, "%s.index must be an array of integers", axis);
    if (pre && pre->taken) return sel_index_taken(p, axis, pre, n, err);
    int64_t cnt = cJSON_GetArraySize(v);
    p->idx = malloc((size_t)(cnt ? cnt : 1) * sizeof *p->idx);
    if (!p->idx) return iv_fail(err, IV_ENOMEM, "out of memory for %s.index", axis);
    p->kind = IV_PSEL_INDEX;
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        int64_t x;
        double big;
        int jrc = json_int(e, &x, &big);
        if (jrc == -2) return huge_index(axis, i, big, n, err);
        if (jrc != 0)
            return iv_fail(err, IV_EBAD_SELECTION, "%s.index[%lld] is not an integer%s", axis,
                           (long long)i,
                           cJSON_IsString(e) ? "; names go in {\"names\": [...]}" : "");
        IV_TRY(check_index(axis, "index", i, x, n, err));
        p->idx[i++] = x;
        p->n = i;
    }
    return 0;
}

static int sel_range_from_json(iv_psel_t *p, const char *axis, const cJSON *v, int64_t n,
                               iv_err_t *err)
{
    int64_t a = 0, b = 0;
    double ba = 0, bb = 0;
    int ra = -1, rb = -1;
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2) {
        ra = json_int(cJSON_GetArrayItem(v, 0), &a, &ba);
        rb = json_int(cJSON_GetArrayItem(v, 1), &b, &bb);
    }
    if (ra == -1 || rb == -1)
        return iv_fail(err, IV_EBAD_SELECTION, "%s.range must be [start, stop] integers", axis);
    if (ra || rb)
        return iv_fail(err, IV_EOUT_OF_RANGE,
                       "%s.range [%.17g, %.17g) is not within [0, %lld) with start <= stop",
                       axis, ra ? ba : (double)a, rb ? bb : (double)b, (long long)n);
    return sel_from_range(p, axis, a, b, n, err);
}

/* A mask as an array of n booleans. */
static int sel_bool_mask_from_json(iv_psel_t *p, const char *axis, const cJSON *v, int64_t n,
                                   iv_err_t *err)
{
    int64_t cnt = cJSON_GetArraySize(v);
    if (cnt != n)
        return iv_fail(err, IV_EBAD_SELECTION, "%s.mask has %lld booleans; the axis has %lld",
                       axis, (long long)cnt, (long long)n);
    uint8_t *bits = calloc((size_t)((n + 7) / 8 + 1), 1);
    if (!bits) return iv_fail(err, IV_ENOMEM, "out of memory for %s.mask", axis);
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        if (!cJSON_IsBool(e)) {
            free(bits);
            return iv_fail(err, IV_EBAD_SELECTION, "%s.mask[%lld] is not a boolean", axis,
                           (long long)i);
        }
        if (cJSON_IsTrue(e)) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        i++;
    }
    int rc = sel_from_bitmap(p, axis, bits, (size_t)((n + 7) / 8), n, err);
    free(bits);
    return rc;
}

static int sel_mask_from_json(iv_psel_t *p, const char *axis, const cJSON *v, int64_t n,
                              iv_err_t *err)
{
    if (cJSON_IsString(v)) return sel_from_b64(p, axis, v->valuestring, strlen(v->valuestring), n, err);
    if (!cJSON_IsArray(v))
        return iv_fail(err, IV_EBAD_SELECTION,
                       "%s.mask must be a base64 string or an array of booleans", axis);
    return sel_bool_mask_from_json(p, axis, v, n, err);
}

static int sel_names_from_json(iv_psel_t *p, const char *axis, const cJSON *v, iv_err_t *err)
{
    if (!cJSON_IsArray(v))
        return iv_fail(err, IV_EBAD_SELECTION, "%s.names must be an array of strings", axis);
    int64_t cnt = cJSON_GetArraySize(v);
    IV_TRY(sel_names_alloc(p, axis, cnt, err));
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        if (!cJSON_IsString(e))
            return iv_fail(err, IV_EBAD_SELECTION, "%s.names[%lld] is not a string", axis,
                           (long long)p->n);
        p->names[p->n] = strdup(e->valuestring);
        if (!p->names[p->n]) return iv_fail(err, IV_ENOMEM, "out of memory for %s.names", axis);
        p->n++;
    }
    return 0;
}

/* One axis' selection object: keys checked, filters and name options
 * read, then the primary selection (absent or {}: everything). */
static int sel_from_json(iv_psel_t *p, const char *axis, const cJSON *o, int64_t n,
                         iv_index_array_t *pre, iv_err_t *err)
{
    if (o == NULL || cJSON_IsNull(o)) return 0;
    if (!cJSON_IsObject(o))
        return iv_fail(err, IV_EBAD_SELECTION, "%s must be an object such as {\"index\":[...]}", axis);
    IV_TRY(check_sel_keys(axis, o, err));
    IV_TRY(sel_filters_from_json(p, axis, o, err));
    IV_TRY(sel_name_opts_from_json(p, axis, o, err));
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "index"))) return sel_index_from_json(p, axis, v, n, pre, err);
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "range"))) return sel_range_from_json(p, axis, v, n, err);
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "mask"))) return sel_mask_from_json(p, axis, v, n, err);
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "names"))) return sel_names_from_json(p, axis, v, err);
    return 0;
}

/* Byte offset of the first \u0000 escape inside a JSON string of
 * [s, s+len), or -1.  cJSON decodes it into a C string, which then ends
 * there: "a\u0000b" would silently select "a".  Strings are tracked so
 * that an escaped backslash ("\\u0000", text) is not taken for one. */
static int64_t json_nul_escape(const char *s, size_t len)
{
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!in_str) {
            in_str = c == '"';
        } else if (c == '\0') {
            return (int64_t)i;  /* a raw NUL, invalid JSON that cJSON would keep */
        } else if (c == '"') {
            in_str = 0;
        } else if (c == '\\') {
            if (len - i >= 6 && !memcmp(s + i + 1, "u0000", 5)) return (int64_t)i;
            i++;  /* the escaped character, so that \\ and \" are skipped whole */
        }
    }
    return -1;
}

/* "by": which axis the result's block rows follow.  -1 until given, so
 * that dense can tell an explicit "obs" from the default. */
static int set_by(iv_qreq_t *out, const char *v, iv_err_t *err)
{
    if (v && !strcmp(v, "obs")) out->by_var = -1;
    else if (v && !strcmp(v, "var")) out->by_var = 1;
    else return iv_fail(err, IV_EBAD_REQUEST, "\"by\" must be \"obs\" or \"var\"");
    return 0;
}

/* Dense vectors are gene rows: by var is implied, by obs refused. */
static int check_by(iv_qreq_t *out, iv_err_t *err)
{
    if (out->dense && out->by_var < 0)
        return iv_fail(err, IV_EBAD_REQUEST, "\"dense\" gives one vector per gene: it needs "
                       "\"by\": \"var\" (or no \"by\")");
    if (out->dense) out->by_var = 1;
    if (out->by_var < 0) out->by_var = 0;
    return 0;
}

static int parse_json(const char *body, size_t len, const shape_src_t *src, iv_qreq_t *out,
                      iv_err_t *err);

int iv_qreq_parse_json(const char *body, size_t len, int64_t n_obs, int64_t n_var,
                       iv_qreq_t *out, iv_err_t *err)
{
    shape_src_t src = {NULL, NULL, n_obs, n_var};
    return parse_json(body, len, &src, out, err);
}

int iv_qreq_parse_json_m(const char *body, size_t len, iv_qreq_matrix_fn fn, void *ctx,
                         iv_qreq_t *out, iv_err_t *err)
{
    shape_src_t src = {fn, ctx, 0, 0};
    return parse_json(body, len, &src, out, err);
}

/* Refuses unknown and repeated keys at the top of a request body. */
static int check_top_keys(const cJSON *root, iv_err_t *err)
{
    static const char *const keys[] = {"obs", "var", "format", "by", "dense", "matrix"};
    unsigned dup = 0;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, root)
    {
        int ki = key_index(kv->string, keys, 6);
        if (ki < 0) {
            int w = !strcmp(kv->string, "where") || !strcmp(kv->string, "filter");
            return iv_fail(err, IV_EBAD_SELECTION,
                           "unknown key '%.60s' in the request (expected obs, var, format, by, "
                           "dense, matrix)%s",
                           kv->string, w ? "; a filter goes in \"obs\": {\"where\": \"...\"}" : "");
        }
        if (dup & (1u << ki))
            return iv_fail(err, IV_EBAD_REQUEST, "key '%s' is given more than once in the request",
                           kv->string);
        dup |= 1u << ki;
    }
    return 0;
}

/* "by", "dense", "format" and "matrix" of a request body. */
static int options_from_json(iv_qreq_t *out, const cJSON *root, iv_err_t *err)
{
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(root, "by");
    if (by) IV_TRY(set_by(out, cJSON_IsString(by) ? by->valuestring : NULL, err));
    const cJSON *dn = cJSON_GetObjectItemCaseSensitive(root, "dense");
    if (dn) {
        if (!cJSON_IsBool(dn)) return iv_fail(err, IV_EBAD_REQUEST, "\"dense\" must be true or false");
        out->dense = cJSON_IsTrue(dn);
    }
    IV_TRY(check_by(out, err));
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (f) {
        out->format = cJSON_IsString(f) ? iv_fmt_parse(f->valuestring) : IV_FMT_NONE;
        if (out->format == IV_FMT_NONE)
            return iv_fail(err, IV_ENOT_ACCEPTABLE,
                           "format must be \"binary\", \"ndjson\" or \"json\"");
    }
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(root, "matrix");
    if (mx) {
        if (!cJSON_IsString(mx)) return iv_fail(err, IV_EBAD_REQUEST, "\"matrix\" must be a string");
        IV_TRY(set_matrix(out, mx->valuestring, strlen(mx->valuestring), err));
    }
    return 0;
}

/* The body parsed: keys checked, options read, the matrix's axis lengths
 * resolved (they bound the selections), then obs and var. */
static int request_from_json(const cJSON *root, const shape_src_t *src, iv_index_array_t pre[2],
                             iv_qreq_t *out, iv_err_t *err)
{
    int64_t n_obs = 0, n_var = 0;
    if (!cJSON_IsObject(root)) return iv_fail(err, IV_EBAD_JSON, "request body must be a JSON object");
    IV_TRY(check_top_keys(root, err));
    IV_TRY(options_from_json(out, root, err));
    IV_TRY(resolve_shape(src, out, &n_obs, &n_var, err));
    IV_TRY(sel_from_json(&out->obs, "obs", cJSON_GetObjectItemCaseSensitive(root, "obs"), n_obs,
                         &pre[0], err));
    return sel_from_json(&out->var, "var", cJSON_GetObjectItemCaseSensitive(root, "var"), n_var,
                         &pre[1], err);
}

static int parse_json(const char *body, size_t len, const shape_src_t *src, iv_qreq_t *out,
                      iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    int64_t n_obs = 0, n_var = 0;
    /* An empty body selects the whole of X. */
    if (len == 0) return resolve_shape(src, out, &n_obs, &n_var, err);
    /* No name, label or where string can hold a NUL, so one is an error
     * rather than a string cut short. */
    int64_t nul = json_nul_escape(body, len);
    if (nul >= 0)
        return iv_fail(err, IV_EBAD_JSON,
                       "request body: \\u0000 (a NUL character) in a string at byte %lld; "
                       "strings cannot hold NUL", (long long)nul);
    /* The index arrays are read ahead, cJSON reads the rest: a copy of
     * the body with those arrays blanked, of the same length. */
    iv_index_array_t pre[2];
    char *blanked = iv_index_arrays_take(body, len, pre);
    const char *text = blanked ? blanked : body;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc;
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        rc = iv_fail(err, IV_EBAD_JSON, "request body is not valid JSON (near byte %zu)", at);
    } else {
        rc = request_from_json(root, src, pre, out, err);
        cJSON_Delete(root);
        if (rc != 0) iv_qreq_free(out);
    }
    iv_index_arrays_free(pre);
    free(blanked);
    return rc;
}

/* ---- selections from a query string ------------------------------------ */

/* Decimal digits [s, e) to a non-negative int64: 0, -1 when not digits,
 * -2 when the value passes INT64_MAX (checked before each step, so that
 * "9999999999999999999" is an error rather than signed overflow). */
static int parse_i64(const char *s, const char *e, int64_t *out)
{
    if (s == e) return -1;
    int64_t v = 0;
    int big = 0;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9') return -1;
        int d = *p - '0';
        if (v > (INT64_MAX - d) / 10) big = 1;
        else v = v * 10 + d;
    }
    if (big) return -2;
    *out = v;
    return 0;
}

/* Item i of a position list, [c, e), as the half-open span [*a, *b): an
 * index "I" or a range "START:STOP", checked against the axis length n. */
static int list_span(const char *axis, const char *c, const char *e, int64_t i, int64_t n,
                     int64_t *a, int64_t *b, iv_err_t *err)
{
    const char *colon = memchr(c, ':', (size_t)(e - c));
    if (colon) {
        int w = (int)(e - c > 80 ? 80 : e - c);
        int ra = parse_i64(c, colon, a), rb = parse_i64(colon + 1, e, b);
        if (ra == -1 || rb == -1)
            return iv_fail(err, IV_EBAD_SELECTION, "%s=%.*s is not START:STOP", axis, w, c);
        if (ra || rb)
            return iv_fail(err, IV_EOUT_OF_RANGE, "%s=%.*s is not within [0, %lld)", axis, w, c,
                           (long long)n);
        return check_range(axis, *a, *b, n, err);
    }
    int w = (int)(e - c > 40 ? 40 : e - c);
    int prc = parse_i64(c, e, a);
    if (prc == -2)
        return iv_fail(err, IV_EOUT_OF_RANGE, "%s.index[%lld] = %.*s is out of range [0, %lld)",
                       axis, (long long)i, w, c, (long long)n);
    if (prc)
        return iv_fail(err, IV_EBAD_SELECTION,
                       "%s: item %lld ('%.*s') is not an integer; %s= takes positions, "
                       "%s_names= takes %s names (%s_names=%.*s)",
                       axis, (long long)i, w, c, axis, axis, axis[0] == 'o' ? "cell" : "gene",
                       axis, w, c);
    IV_TRY(check_index(axis, "index", i, *a, n, err));
    *b = *a + 1;  /* after the check: *a < n, so no overflow */
    return 0;
}

/* The end of the list item that starts at c. */
static const char *item_end(const char *c)
{
    const char *e = strchr(c, ',');
    return e ? e : c + strlen(c);
}

/* The number of positions a list selects (every item checked), so that
 * its array is sized once; a sum past what memory holds is IV_ENOMEM. */
static int list_count(const char *axis, const char *s, int64_t n, int64_t *total, iv_err_t *err)
{
    *total = 0;
    const char *c = s;
    for (int64_t i = 0; *s; i++) {
        const char *e = item_end(c);
        int64_t a, b;
        IV_TRY(list_span(axis, c, e, i, n, &a, &b, err));
        if (b - a > (int64_t)(SIZE_MAX / 2 / sizeof(int64_t)) - *total)
            return iv_fail(err, IV_ENOMEM, "out of memory for %s", axis);
        *total += b - a;
        if (!*e) break;
        c = e + 1;
    }
    return 0;
}

/* A position list (request.h, iv_psel_parse_list): "1,5,2", "10:20", or
 * indices and ranges mixed ("5,3,3,10:20"), in order with duplicates; ""
 * selects nothing.  One range alone is a RANGE selection. */
static int sel_from_list(iv_psel_t *p, const char *axis, const char *s, int64_t n, iv_err_t *err)
{
    int64_t a, b, total;
    if (strchr(s, ':') && !strchr(s, ',')) {
        IV_TRY(list_span(axis, s, s + strlen(s), 0, n, &a, &b, err));
        return sel_from_range(p, axis, a, b, n, err);
    }
    IV_TRY(list_count(axis, s, n, &total, err));
    p->idx = malloc((size_t)(total ? total : 1) * sizeof *p->idx);
    if (!p->idx) return iv_fail(err, IV_ENOMEM, "out of memory for %s", axis);
    p->kind = IV_PSEL_INDEX;
    const char *c = s;
    for (int64_t i = 0; *s; i++) {
        const char *e = item_end(c);
        list_span(axis, c, e, i, n, &a, &b, err);  /* checked by list_count */
        while (a < b) p->idx[p->n++] = a++;
        if (!*e) break;
        c = e + 1;
    }
    return 0;
}

static int sel_names_from_list(iv_psel_t *p, const char *axis, const char *s, iv_err_t *err)
{
    int64_t cnt = 1;
    for (const char *c = s; *c; c++) cnt += *c == ',';
    IV_TRY(sel_names_alloc(p, axis, cnt, err));
    const char *c = s;
    for (int64_t i = 0; i < cnt; i++) {
        const char *e = strchr(c, ',');
        if (!e) e = c + strlen(c);
        p->names[i] = strndup(c, (size_t)(e - c));
        if (!p->names[i]) return iv_fail(err, IV_ENOMEM, "out of memory for %s names", axis);
        p->n = i + 1;
        c = *e ? e + 1 : e;
    }
    return 0;
}

/* The parameter a newcomer most likely meant by an unknown key, as text to
 * append to the error ("" when none comes to mind). */
static const char *qs_hint(const char *key)
{
    static const struct {
        const char *key, *hint;
    } hints[] = {
        {"where", "; use obs_where= to filter cells (var_where= for genes)"},
        {"filter", "; use obs_where= to filter cells (var_where= for genes)"},
        {"obs_filter", "; use obs_where="},
        {"var_filter", "; use var_where="},
        {"genes", "; use var_names= for gene names, var= for positions"},
        {"gene", "; use var_names= for gene names, var= for positions"},
        {"cells", "; use obs_names= for cell names, obs= for positions"},
        {"names", "; use obs_names= (cells) or var_names= (genes)"},
        {"obs_name", "; use obs_names="},
        {"var_name", "; use var_names="},
        {"obs_index", "; use obs= (positions: 1,5,2 or 10:20)"},
        {"var_index", "; use var= (positions: 1,5,2 or 10:20)"},
    };
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
        if (!strcmp(key, hints[i].key)) return hints[i].hint;
    return "";
}

/* matrix=, by=, dense= and format=: 1 when key is none of them. */
static int qs_option(iv_qreq_t *out, const char *key, const char *val, iv_err_t *err)
{
    if (!strcmp(key, "matrix")) return 0;  /* taken by the first pass (qs_matrix) */
    if (!strcmp(key, "by")) return set_by(out, val, err);
    if (!strcmp(key, "dense")) {
        if (!strcmp(val, "true") || !strcmp(val, "1")) out->dense = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "0")) out->dense = 0;
        else return iv_fail(err, IV_EBAD_REQUEST, "dense=%s: expected true or false", val);
        return 0;
    }
    if (!strcmp(key, "format")) {
        out->format = iv_fmt_parse(val);
        if (out->format == IV_FMT_NONE)
            return iv_fail(err, IV_ENOT_ACCEPTABLE, "format=%s: expected binary, ndjson or json", val);
        return 0;
    }
    return 1;
}

/* One obs... or var... parameter; suffix is the key past the axis. */
static int qs_axis_param(iv_psel_t *p, const char *axis, const char *key, const char *suffix,
                         const char *val, int64_t n, iv_err_t *err)
{
    if (!strcmp(suffix, "_where")) return psel_add_where(p, axis, val, strlen(val), err);
    if (!strcmp(suffix, "_by")) {
        if (p->by) return iv_fail(err, IV_EBAD_SELECTION, "%s_by is given more than once", axis);
        p->by = strdup(val);
        return p->by ? 0 : iv_fail(err, IV_ENOMEM, "out of memory for %s_by", axis);
    }
    if (!strcmp(suffix, "_missing")) return psel_set_missing(p, axis, val, err);
    if (p->kind != IV_PSEL_ALL)
        return iv_fail(err, IV_EBAD_SELECTION, "%s is selected more than once", axis);
    if (!strcmp(suffix, "")) return sel_from_list(p, axis, val, n, err);
    if (!strcmp(suffix, "_mask")) return sel_from_b64(p, axis, val, strlen(val), n, err);
    if (!strcmp(suffix, "_names")) return sel_names_from_list(p, axis, val, err);
    return iv_fail(err, IV_EBAD_SELECTION, "unknown query parameter '%s'%s", key, qs_hint(key));
}

static int qs_param(iv_qreq_t *out, const char *key, const char *val, int64_t n_obs,
                    int64_t n_var, iv_err_t *err)
{
    int rc = qs_option(out, key, val, err);
    if (rc <= 0) return rc;
    if (!strncmp(key, "obs", 3)) return qs_axis_param(&out->obs, "obs", key, key + 3, val, n_obs, err);
    if (!strncmp(key, "var", 3)) return qs_axis_param(&out->var, "var", key, key + 3, val, n_var, err);
    return iv_fail(err, IV_EBAD_SELECTION, "unknown query parameter '%s'%s", key, qs_hint(key));
}

int iv_qs_each(const char *qs, size_t len, int (*plus_is_space)(const char *key),
               iv_qs_param_fn fn, void *arg, iv_err_t *err)
{
    size_t i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        size_t j = i;
        while (j < len && qs[j] != '&') j++;
        if (j > i) {
            const char *eq = memchr(qs + i, '=', j - i);
            size_t klen = eq ? (size_t)(eq - (qs + i)) : j - i;
            char *key = iv_url_decode(qs + i, klen);
            int form = key && (!plus_is_space || plus_is_space(key));
            char *val = !eq ? strdup("")
                        : form ? iv_url_decode_form(eq + 1, (size_t)(qs + j - eq - 1))
                               : iv_url_decode(eq + 1, (size_t)(qs + j - eq - 1));
            if (!key || !val) {
                free(val);
                rc = iv_fail(err, IV_EBAD_REQUEST, "bad percent-escape in the query string");
            } else {
                rc = fn(arg, key, val, err);
            }
            free(key);
        }
        i = j + 1;
    }
    return rc;
}

/* A where string is text, so '+' is a space; elsewhere '+' stays, because
 * base64 masks use it. */
static int where_key(const char *key)
{
    size_t n = strlen(key);
    return n > 6 && !strcmp(key + n - 6, "_where");
}

struct qs_target {
    iv_qreq_t *out;
    int64_t n_obs, n_var;
};

static int qs_param_owned(void *arg, const char *key, char *val, iv_err_t *err)
{
    struct qs_target *t = arg;
    int rc = qs_param(t->out, key, val, t->n_obs, t->n_var, err);
    free(val);
    return rc;
}

/* The first pass over a query string: only matrix=, whose axis lengths
 * bound the selections read by the second pass. */
static int qs_matrix(void *arg, const char *key, char *val, iv_err_t *err)
{
    int rc = !strcmp(key, "matrix") ? set_matrix(arg, val, strlen(val), err) : 0;
    free(val);
    return rc;
}

/* obs_by and obs_missing (var_...) go with a names selection only. */
static int check_name_opts(const iv_psel_t *p, const char *axis, iv_err_t *err)
{
    if ((p->by || p->missing_ignore) && p->kind != IV_PSEL_NAMES)
        return iv_fail(err, IV_EBAD_SELECTION, "%s_by and %s_missing go with %s_names", axis, axis,
                       axis);
    return 0;
}

static int parse_query(const char *qs, size_t len, const shape_src_t *src, iv_qreq_t *out,
                       iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    struct qs_target t = {out, 0, 0};
    int rc = iv_qs_each(qs, len, where_key, qs_matrix, out, err);
    if (rc == 0) rc = resolve_shape(src, out, &t.n_obs, &t.n_var, err);
    if (rc == 0) rc = iv_qs_each(qs, len, where_key, qs_param_owned, &t, err);
    if (rc == 0) rc = check_name_opts(&out->obs, "obs", err);
    if (rc == 0) rc = check_name_opts(&out->var, "var", err);
    if (rc == 0) rc = check_by(out, err);
    if (rc != 0) iv_qreq_free(out);
    return rc;
}

int iv_qreq_parse_query(const char *qs, size_t len, int64_t n_obs, int64_t n_var,
                        iv_qreq_t *out, iv_err_t *err)
{
    shape_src_t src = {NULL, NULL, n_obs, n_var};
    return parse_query(qs, len, &src, out, err);
}

int iv_qreq_parse_query_m(const char *qs, size_t len, iv_qreq_matrix_fn fn, void *ctx,
                          iv_qreq_t *out, iv_err_t *err)
{
    shape_src_t src = {fn, ctx, 0, 0};
    return parse_query(qs, len, &src, out, err);
}

/* ---- selections from a command line ------------------------------------ */

/* A SEL of digits, commas and colons alone is positions (checked by
 * sel_from_list); any other is names. */
static int is_position_list(const char *s)
{
    return s[strspn(s, "0123456789,:")] == '\0';
}

int iv_psel_parse_list(iv_psel_t *p, const char *axis, const char *sel, const char *where,
                       int64_t n, iv_err_t *err)
{
    memset(p, 0, sizeof *p);
    int rc = 0;
    if (sel && strcmp(sel, "*") != 0)
        rc = is_position_list(sel) ? sel_from_list(p, axis, sel, n, err)
                                   : sel_names_from_list(p, axis, sel, err);
    if (rc == 0 && where) rc = psel_add_where(p, axis, where, strlen(where), err);
    if (rc != 0) psel_clear(p);
    return rc;
}

/* The engine's lookup of p (which needs one: names or a filter): *idx
 * (n of them, to free) and rep, p unchanged, so that rep's positions
 * still index p->names. */
static int psel_lookup(const iv_psel_t *p, iv_meta_t *m, iv_axis_t axis, int64_t **idx, int64_t *n,
                       iv_names_report_t *rep, iv_err_t *err)
{
    iv_axis_sel_t s = {
        .names = p->kind == IV_PSEL_NAMES ? (const char *const *)p->names : NULL,
        .idx = p->kind == IV_PSEL_NAMES || p->kind == IV_PSEL_ALL ? NULL : p->idx,
        .n = p->kind == IV_PSEL_ALL ? 0 : p->n,
        .by = p->by,
        .missing_ignore = p->missing_ignore,
        .filter = p->filter,
    };
    return iv_meta_resolve(m, axis, &s, idx, n, rep, err);
}

/* Appends the JSON array of p's names at positions pos[0..n). */
static void put_name_list(iv_buf_t *b, const iv_psel_t *p, const int64_t *pos, int64_t n)
{
    iv_buf_puts(b, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i) iv_buf_puts(b, ",");
        iv_buf_json_str(b, p->names[pos[i]]);
    }
    iv_buf_puts(b, "]");
}

int iv_psel_resolve(iv_psel_t *p, iv_meta_t *m, iv_axis_t axis, iv_buf_t *dropped, iv_buf_t *folded,
                    iv_err_t *err)
{
    if (p->kind != IV_PSEL_NAMES && !p->filter) return 0;
    int64_t *idx, n;
    iv_names_report_t rep;
    IV_TRY(psel_lookup(p, m, axis, &idx, &n, &rep, err));
    /* The names go into the lists while p still holds them. */
    if (p->kind == IV_PSEL_NAMES) {
        if (dropped) put_name_list(dropped, p, rep.missing, rep.n_missing);
        if (folded && rep.n_folded) put_name_list(folded, p, rep.folded, rep.n_folded);
    }
    iv_names_report_free(&rep);
    iv_psel_set_indices(p, idx, n);
    return 0;
}

void iv_psel_free(iv_psel_t *p)
{
    psel_clear(p);
}

/* Appends a reported list, "[]" when empty (lists are not NUL-terminated). */
static void put_list(iv_buf_t *b, const iv_buf_t *list)
{
    if (list->len) iv_buf_append(b, list->data, list->len);
    else iv_buf_puts(b, "[]");
}

char *iv_psel_dropped_doc(const iv_buf_t dropped[2], const iv_buf_t folded_lists[2], int folded)
{
    char *s = NULL;
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "{\"obs\":");
    put_list(&b, &dropped[0]);
    iv_buf_puts(&b, ",\"var\":");
    put_list(&b, &dropped[1]);
    if (folded) {
        iv_buf_puts(&b, ",\"folded\":{\"obs\":");
        put_list(&b, &folded_lists[0]);
        iv_buf_puts(&b, ",\"var\":");
        put_list(&b, &folded_lists[1]);
        iv_buf_puts(&b, "}");
    }
    iv_buf_append(&b, "}", 2);  /* the NUL makes it a C string */
    if (!b.oom) s = iv_buf_steal(&b, NULL);
    iv_buf_free(&b);
    return s;
}
