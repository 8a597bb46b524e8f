/*
 * Metadata routes (see meta_doc.h).
 *
 * Design.  Everything here reads the immutable in-memory metadata and
 * writes into a caller-owned buffer, so the server can call it from the
 * loop or a worker alike.  Names and filters are resolved to positions
 * by the engine (core/meta/select.h); this file renders what the request
 * asked for and what it dropped.  Tables are
 * bounded by offset/limit rather than streamed: a page of at most
 * IV_TABLE_LIMIT_MAX rows is a few megabytes, which is cheaper to build
 * at once than to schedule block by block.
 */
#include "meta_doc.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "select.h"
#include "where.h"

static const char *axis_name(iv_axis_t axis)
{
    return axis == IV_AXIS_OBS ? "obs" : "var";
}

/* ---- selections ---------------------------------------------------------- */

int iv_rmeta_resolve_query(iv_meta_t *m, iv_meta_t *var_meta, iv_qreq_t *qr, char **dropped, iv_err_t *err)
{
    iv_buf_t drop[2], fold[2];
    for (int a = 0; a < 2; a++) {
        iv_buf_init(&drop[a]);
        iv_buf_init(&fold[a]);
    }
    int show = qr->obs.missing_ignore || qr->var.missing_ignore;
    int rc = iv_psel_resolve(&qr->obs, m, IV_AXIS_OBS, &drop[0], &fold[0], err);
    if (rc == 0) rc = iv_psel_resolve(&qr->var, var_meta, IV_AXIS_VAR, &drop[1], &fold[1], err);
    if (rc == 0 && (show || fold[0].len || fold[1].len)) {
        char *doc = iv_psel_dropped_doc(drop, fold, fold[0].len || fold[1].len);
        if (doc) *dropped = doc;
    }
    for (int a = 0; a < 2; a++) {
        iv_buf_free(&drop[a]);
        iv_buf_free(&fold[a]);
    }
    return rc;
}

int iv_rmeta_total_counts(const iv_meta_t *m, iv_axis_t axis, const int64_t *idx, int64_t n,
                          double *out)
{
    const iv_meta_col_t *c = NULL;
    size_t nc = iv_meta_n_cols(m, axis);
    for (size_t i = 0; i < nc; i++) {
        const iv_meta_col_t *x = iv_meta_col(m, axis, i);
        if (x->computed && x->type == IV_COL_FLOAT &&
            (!strcmp(x->name, "total_counts") || !strcmp(x->name, "iv_total_counts")))
            c = x;
    }
    if (!c) return -1;
    double s = 0;
    if (!idx) {
        for (int64_t i = 0; i < c->n; i++) s += c->f64[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            if (idx[i] >= 0 && idx[i] < c->n) s += c->f64[idx[i]];
    }
    *out = s;
    return 0;
}

/* ---- values -------------------------------------------------------------- */

static void put_num(iv_buf_t *b, double v)
{
    /* JSON has no NaN or infinities; NaN is a missing value in the metadata
     * model, infinities are written the way Python's json module reads them. */
    if (isnan(v)) iv_buf_puts(b, "null");
    else if (isinf(v)) iv_buf_puts(b, v > 0 ? "Infinity" : "-Infinity");
    else iv_buf_printf(b, "%.17g", v);
}

static int is_missing(const iv_meta_col_t *c, int64_t r)
{
    return (c->mask && c->mask[r]) || (c->type == IV_COL_CATEGORICAL && c->codes[r] < 0);
}

static void put_json_value(iv_buf_t *b, const iv_meta_col_t *c, int64_t r)
{
    if (is_missing(c, r)) {
        iv_buf_puts(b, "null");
        return;
    }
    switch (c->type) {
    case IV_COL_CATEGORICAL:
        if (c->cats_numeric && c->cat_num) put_num(b, c->cat_num[c->codes[r]]);
        else iv_buf_json_str(b, iv_meta_col_cat(c, c->codes[r]));
        break;
    case IV_COL_INT: iv_buf_printf(b, "%" PRId64, c->i64[r]); break;
    case IV_COL_FLOAT: put_num(b, c->f64[r]); break;
    case IV_COL_BOOL: iv_buf_puts(b, c->b[r] ? "true" : "false"); break;
    case IV_COL_STRING: iv_buf_json_str(b, iv_meta_col_str(c, r)); break;
    }
}

static void put_csv_str(iv_buf_t *b, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        iv_buf_puts(b, s);
        return;
    }
    iv_buf_puts(b, "\"");
    for (const char *p = s; *p; p++) {
        if (*p == '"') iv_buf_puts(b, "\"\"");
        else iv_buf_append(b, p, 1);
    }
    iv_buf_puts(b, "\"");
}

static void put_csv_value(iv_buf_t *b, const iv_meta_col_t *c, int64_t r)
{
    if (is_missing(c, r)) return;  /* an empty field, as pandas writes missing values */
    switch (c->type) {
    case IV_COL_CATEGORICAL:
        if (c->cats_numeric && c->cat_num) iv_buf_printf(b, "%.17g", c->cat_num[c->codes[r]]);
        else put_csv_str(b, iv_meta_col_cat(c, c->codes[r]));
        break;
    case IV_COL_INT: iv_buf_printf(b, "%" PRId64, c->i64[r]); break;
    case IV_COL_FLOAT:
        if (!isnan(c->f64[r])) iv_buf_printf(b, "%.17g", c->f64[r]);
        break;
    case IV_COL_BOOL: iv_buf_puts(b, c->b[r] ? "True" : "False"); break;
    case IV_COL_STRING: put_csv_str(b, iv_meta_col_str(c, r)); break;
    }
}

/* ---- schema -------------------------------------------------------------- */

void iv_rmeta_schema(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis)
{
    const iv_meta_col_t *ix = iv_meta_index(m, axis);
    iv_buf_puts(b, "{\"index\":");
    if (ix) iv_buf_json_str(b, ix->name);
    else iv_buf_puts(b, "null");
    iv_buf_printf(b, ",\"n_rows\":%" PRId64 ",\"columns\":[", iv_meta_n_rows(m, axis));
    size_t n = iv_meta_n_cols(m, axis);
    for (size_t i = 0; i < n; i++) {
        const iv_meta_col_t *c = iv_meta_col(m, axis, i);
        iv_buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        iv_buf_json_str(b, c->name);
        iv_buf_printf(b, ",\"type\":\"%s\",\"encoding\":", iv_col_type_name(c->type));
        iv_buf_json_str(b, c->encoding ? c->encoding : "");
        iv_buf_printf(b, ",\"computed\":%s,\"null_count\":%" PRId64, c->computed ? "true" : "false",
                      c->null_count);
        /* The stored width, so that a client rebuilds float32 or int8
         * columns as they are in the file rather than widened. */
        if (c->type == IV_COL_INT || c->type == IV_COL_FLOAT)
            iv_buf_printf(b, ",\"dtype\":\"%s\"", iv_dtype_name(c->dtype));
        if (c->type == IV_COL_CATEGORICAL) {
            iv_buf_printf(b, ",\"ordered\":%s,\"categories\":[", c->ordered ? "true" : "false");
            for (int64_t k = 0; k < c->n_cats; k++) {
                iv_buf_puts(b, k ? ",{\"name\":" : "{\"name\":");
                iv_buf_json_str(b, iv_meta_col_cat(c, k));
                iv_buf_printf(b, ",\"count\":%" PRId64 "}", c->cat_counts ? c->cat_counts[k] : -1);
            }
            iv_buf_puts(b, "]");
        }
        iv_buf_puts(b, "}");
    }
    iv_buf_puts(b, "]}");
}

/* ---- query-string parameters ---------------------------------------------- */

typedef struct tparams {
    char *columns;        /* comma list or NULL */
    char *where;          /* NULL when absent */
    char *format;
    int64_t offset, limit;
    int values;
} tparams_t;

static void tparams_free(tparams_t *t)
{
    free(t->columns);
    free(t->where);
    free(t->format);
}

static int parse_count(const char *key, const char *v, int64_t *out, iv_err_t *err)
{
    int64_t x = 0;
    if (!*v || strlen(v) > 15)
        return iv_fail(err, IV_EBAD_REQUEST, "%s=%.40s is not a non-negative integer", key, v);
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9')
            return iv_fail(err, IV_EBAD_REQUEST, "%s=%.40s is not a non-negative integer", key, v);
        x = x * 10 + (*p - '0');
    }
    *out = x;
    return 0;
}

static int tparam(tparams_t *t, const char *key, char *val, int table, iv_err_t *err)
{
    char **slot = NULL;
    if (!strcmp(key, "where")) slot = &t->where;
    else if (table && !strcmp(key, "columns")) slot = &t->columns;
    else if (table && !strcmp(key, "format")) slot = &t->format;
    if (slot) {
        if (*slot) {
            free(val);
            return iv_fail(err, IV_EBAD_REQUEST, "%s is given more than once", key);
        }
        *slot = val;
        return 0;
    }
    int rc;
    if (!strcmp(key, "offset")) rc = parse_count(key, val, &t->offset, err);
    else if (!strcmp(key, "limit")) rc = parse_count(key, val, &t->limit, err);
    else if (!table && !strcmp(key, "values")) {
        t->values = !strcmp(val, "true") || !strcmp(val, "1");
        rc = 0;
    } else
        rc = iv_fail(err, IV_EBAD_REQUEST, "unknown query parameter '%.60s' (expected %s)", key,
                     table ? "columns, where, offset, limit, format" : "where, offset, limit, values");
    free(val);
    return rc;
}

struct tparams_target {
    tparams_t *t;
    int table;
};

static int tparam_each(void *arg, const char *key, char *val, iv_err_t *err)
{
    struct tparams_target *x = arg;
    return tparam(x->t, key, val, x->table, err);
}

static int tparams_parse(tparams_t *t, const char *qs, size_t len, int table, iv_err_t *err)
{
    memset(t, 0, sizeof *t);
    t->limit = -1;
    /* No value here is base64, so '+' is always a space, as forms write it. */
    struct tparams_target x = {t, table};
    int rc = iv_qs_each(qs, len, NULL, tparam_each, &x, err);
    if (rc != 0) tparams_free(t);
    return rc;
}

/* Rows matching where (all rows without one), in file order. */
static int select_rows(const iv_meta_t *m, iv_axis_t axis, const char *where, int64_t **idx,
                       int64_t *n, iv_err_t *err)
{
    iv_expr_t *e = NULL;
    if (where) {
        iv_err_t we;
        iv_err_clear(&we);
        int rc = iv_where_parse(where, strlen(where), &e, &we);
        if (rc != 0) return iv_fail(err, rc, "%s", we.msg);
    }
    iv_axis_sel_t s = {.filter = e};
    /* Not const only for name lookups, which build their tables lazily:
     * a filter alone changes nothing. */
    int rc = iv_meta_resolve((iv_meta_t *)m, axis, &s, idx, n, NULL, err);
    iv_expr_free(e);
    return rc;
}

/* ---- tables -------------------------------------------------------------- */

enum { TF_JSON, TF_NDJSON, TF_CSV };

static int table_format(const char *format, const char *accept, int *out, iv_err_t *err)
{
    if (format) {
        if (!strcmp(format, "json")) *out = TF_JSON;
        else if (!strcmp(format, "ndjson")) *out = TF_NDJSON;
        else if (!strcmp(format, "csv")) *out = TF_CSV;
        else
            return iv_fail(err, IV_ENOT_ACCEPTABLE, "format=%.40s: expected json, ndjson or csv", format);
        return 0;
    }
    *out = TF_JSON;
    if (accept && strstr(accept, "text/csv")) *out = TF_CSV;
    else if (accept && strstr(accept, "application/x-ndjson")) *out = TF_NDJSON;
    return 0;
}

/* Appends the column named name to cols. */
static int add_named_col(const iv_meta_t *m, iv_axis_t axis, const char *name, const iv_meta_col_t **cols,
                         size_t *n, iv_err_t *err)
{
    const iv_meta_col_t *c = iv_meta_find_col(m, axis, name);
    if (!c) return iv_fail(err, IV_EBAD_SELECTION, "%s has no column '%.80s'", axis_name(axis), name);
    cols[(*n)++] = c;
    return 0;
}

/* The table's columns: the named ones, in the order given, either
 * comma-separated in csv (split in place; empty names skipped, as GET's
 * columns= reads them) or the n_list names of list; else every column.
 * *out is owned by the caller, also on failure. */
static int table_columns(const iv_meta_t *m, iv_axis_t axis, char *csv, const char *const *list, size_t n_list,
                         const iv_meta_col_t ***out, size_t *n, iv_err_t *err)
{
    size_t cap = list ? n_list + 1 : iv_meta_n_cols(m, axis) + 1;
    if (csv) {
        cap = 1;
        for (const char *p = csv; *p; p++) cap += *p == ',';
    }
    const iv_meta_col_t **cols = calloc(cap, sizeof *cols);
    if (!cols) return iv_fail(err, IV_ENOMEM, "out of memory");
    *out = cols;
    *n = 0;
    if (csv) {
        for (char *s = csv; s;) {
            char *comma = strchr(s, ',');
            if (comma) *comma = '\0';
            if (*s) IV_TRY(add_named_col(m, axis, s, cols, n, err));
            s = comma ? comma + 1 : NULL;
        }
    } else if (list) {
        for (size_t i = 0; i < n_list; i++) IV_TRY(add_named_col(m, axis, list[i], cols, n, err));
    } else {
        for (size_t i = 0; i < cap - 1; i++) cols[(*n)++] = iv_meta_col(m, axis, i);
    }
    return 0;
}

/* A page of a table: its rows [lo, hi) of idx (n rows in all). */
typedef struct tpage {
    iv_axis_t axis;
    int fmt;
    const iv_meta_col_t *const *cols;
    size_t ncols;
    const iv_meta_col_t *ix;   /* the names index, or NULL */
    const int64_t *idx;
    int64_t n, lo, hi;
} tpage_t;

/* What comes before the rows, and the media type. */
static void table_head(iv_buf_t *b, const tpage_t *pg, const tparams_t *t, const char **ctype)
{
    if (pg->fmt == TF_JSON) {
        *ctype = "application/json";
        iv_buf_printf(b, "{\"axis\":\"%s\",\"total\":%" PRId64 ",\"offset\":%" PRId64
                         ",\"limit\":%" PRId64 ",\"columns\":[\"_index\"",
                      axis_name(pg->axis), pg->n, t->offset, t->limit);
        for (size_t k = 0; k < pg->ncols; k++) {
            iv_buf_puts(b, ",");
            iv_buf_json_str(b, pg->cols[k]->name);
        }
        iv_buf_puts(b, "],\"rows\":[");
    } else if (pg->fmt == TF_CSV) {
        *ctype = "text/csv; charset=utf-8";
        iv_buf_puts(b, "_index");
        for (size_t k = 0; k < pg->ncols; k++) {
            iv_buf_puts(b, ",");
            put_csv_str(b, pg->cols[k]->name);
        }
        iv_buf_puts(b, "\n");
    } else {
        *ctype = "application/x-ndjson";
    }
}

static void put_csv_row(iv_buf_t *b, const tpage_t *pg, int64_t r)
{
    if (pg->ix) put_csv_str(b, iv_meta_col_str(pg->ix, r));
    for (size_t k = 0; k < pg->ncols; k++) {
        iv_buf_puts(b, ",");
        put_csv_value(b, pg->cols[k], r);
    }
    iv_buf_puts(b, "\n");
}

/* Row r as a JSON object (an element of "rows", or an NDJSON line). */
static void put_json_row(iv_buf_t *b, const tpage_t *pg, int64_t r)
{
    iv_buf_puts(b, "{\"_index\":");
    if (pg->ix) put_json_value(b, pg->ix, r);
    else iv_buf_printf(b, "\"%" PRId64 "\"", r);
    for (size_t k = 0; k < pg->ncols; k++) {
        iv_buf_puts(b, ",");
        iv_buf_json_str(b, pg->cols[k]->name);
        iv_buf_puts(b, ":");
        put_json_value(b, pg->cols[k], r);
    }
    iv_buf_puts(b, pg->fmt == TF_JSON ? "}" : "}\n");
}

static void table_rows(iv_buf_t *b, const tpage_t *pg)
{
    for (int64_t i = pg->lo; i < pg->hi && !b->oom; i++) {
        if (pg->fmt == TF_CSV) {
            put_csv_row(b, pg, pg->idx[i]);
            continue;
        }
        if (pg->fmt == TF_JSON && i > pg->lo) iv_buf_puts(b, ",");
        put_json_row(b, pg, pg->idx[i]);
    }
    if (pg->fmt == TF_JSON) iv_buf_puts(b, "]}");
}

/* The page's parameters: format, limit (defaulted, at most
 * IV_TABLE_LIMIT_MAX). */
static int check_table_limit(tparams_t *t, iv_err_t *err)
{
    if (t->limit < 0) t->limit = IV_TABLE_LIMIT_DEFAULT;
    if (t->limit > IV_TABLE_LIMIT_MAX)
        return iv_fail(err, IV_EBAD_REQUEST, "limit=%" PRId64 " exceeds the maximum of %d rows a page",
                       t->limit, IV_TABLE_LIMIT_MAX);
    return 0;
}

static int check_table_page(tparams_t *t, const char *accept, int *fmt, iv_err_t *err)
{
    IV_TRY(table_format(t->format, accept, fmt, err));
    return check_table_limit(t, err);
}

/* Writes the page [offset, offset + limit) of rows idx[0..n) with the
 * columns cols: the one renderer of the GET and POST table answers. */
static int table_emit(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const tparams_t *t, int fmt,
                      const iv_meta_col_t *const *cols, size_t ncols, const int64_t *idx, int64_t n,
                      const char **ctype, iv_err_t *err)
{
    tpage_t pg = {.axis = axis, .fmt = fmt, .cols = cols, .ncols = ncols, .ix = iv_meta_index(m, axis),
                  .idx = idx, .n = n};
    pg.lo = t->offset < pg.n ? t->offset : pg.n;
    pg.hi = pg.n - pg.lo < t->limit ? pg.n : pg.lo + t->limit;
    table_head(b, &pg, t, ctype);
    table_rows(b, &pg);
    if (b->oom) return iv_fail(err, IV_ENOMEM, "out of memory building the table");
    return 0;
}

int iv_rmeta_table(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *qs, size_t qlen,
                   const char *accept, const char **ctype, iv_err_t *err)
{
    tparams_t t;
    IV_TRY(tparams_parse(&t, qs, qlen, 1, err));
    int fmt = TF_JSON;
    size_t ncols = 0;
    const iv_meta_col_t **cols = NULL;
    int64_t *idx = NULL, n = 0;
    int rc = check_table_page(&t, accept, &fmt, err);
    if (rc == 0) rc = table_columns(m, axis, t.columns, NULL, 0, &cols, &ncols, err);
    if (rc == 0) rc = select_rows(m, axis, t.where, &idx, &n, err);
    if (rc == 0) rc = table_emit(b, m, axis, &t, fmt, cols, ncols, idx, n, ctype, err);
    free(idx);
    free(cols);
    tparams_free(&t);
    return rc;
}

/* ---- rows chosen by a selection (POST) ------------------------------------ */

/* The rows of a POST answer: idx[0..n) checked against the axis (the
 * resolver gives positions in range; a caller's bug must not become an
 * out-of-bounds read), or every row when n < 0 (*all to free). */
static int rows_checked(const iv_meta_t *m, iv_axis_t axis, const int64_t **idx, int64_t *n, int64_t **all,
                        iv_err_t *err)
{
    *all = NULL;
    if (*n < 0) {
        IV_TRY(select_rows(m, axis, NULL, all, n, err));
        *idx = *all;
        return 0;
    }
    int64_t rows = iv_meta_n_rows(m, axis);
    for (int64_t i = 0; i < *n; i++)
        if ((*idx)[i] < 0 || (*idx)[i] >= rows)
            return iv_fail(err, IV_EOUT_OF_RANGE, "%s row %" PRId64 " is out of range [0, %" PRId64 ")",
                           axis_name(axis), (*idx)[i], rows);
    return 0;
}

/* A POST's page parameters as the GET form's (limit defaulted and bounded). */
static int page_params(const iv_rmeta_page_t *pg, tparams_t *t, iv_err_t *err)
{
    memset(t, 0, sizeof *t);
    t->offset = pg->offset;
    t->limit = pg->limit;
    t->values = pg->values;
    if (t->offset < 0) return iv_fail(err, IV_EBAD_REQUEST, "offset must be a non-negative integer");
    return 0;
}

int iv_rmeta_table_rows(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const int64_t *idx, int64_t n,
                        const iv_rmeta_page_t *pg, const char *accept, const char **ctype, iv_err_t *err)
{
    tparams_t t;
    int fmt = TF_JSON;
    IV_TRY(page_params(pg, &t, err));
    IV_TRY(table_format(pg->format, accept, &fmt, err));
    IV_TRY(check_table_limit(&t, err));
    char *csv = pg->columns_csv ? strdup(pg->columns_csv) : NULL;
    if (pg->columns_csv && !csv) return iv_fail(err, IV_ENOMEM, "out of memory");
    const iv_meta_col_t **cols = NULL;
    size_t ncols = 0;
    int rc = table_columns(m, axis, csv, pg->columns, pg->n_columns, &cols, &ncols, err);
    free(csv);
    int64_t *all = NULL;
    if (rc == 0) rc = rows_checked(m, axis, &idx, &n, &all, err);
    if (rc == 0) rc = table_emit(b, m, axis, &t, fmt, cols, ncols, idx, n, ctype, err);
    free(all);
    free(cols);
    return rc;
}

/* ---- one column ---------------------------------------------------------- */

/* A categorical column's categories with their counts; with a where,
 * counts are those of the selected rows. */
static int put_category_counts(iv_buf_t *b, const iv_meta_col_t *c, const int64_t *idx, int64_t n,
                               iv_err_t *err)
{
    int64_t *cnt = calloc((size_t)(c->n_cats ? c->n_cats : 1), sizeof *cnt);
    if (!cnt) return iv_fail(err, IV_ENOMEM, "out of memory");
    int64_t nulls = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t k = c->codes[idx[i]];
        if (k >= 0 && k < c->n_cats && !(c->mask && c->mask[idx[i]])) cnt[k]++;
        else nulls++;
    }
    iv_buf_printf(b, ",\"selected\":%" PRId64 ",\"selected_null_count\":%" PRId64
                     ",\"ordered\":%s,\"categories\":[",
                  n, nulls, c->ordered ? "true" : "false");
    for (int64_t k = 0; k < c->n_cats; k++) {
        iv_buf_puts(b, k ? ",{\"name\":" : "{\"name\":");
        iv_buf_json_str(b, iv_meta_col_cat(c, k));
        iv_buf_printf(b, ",\"count\":%" PRId64 "}", cnt[k]);
    }
    iv_buf_puts(b, "]");
    free(cnt);
    return 0;
}

/* The page of the selected rows' values (offset, limit), up to max_bytes
 * of document. */
static int put_column_values(iv_buf_t *b, const iv_meta_col_t *c, const int64_t *idx, int64_t n,
                             const tparams_t *t, size_t max_bytes, iv_err_t *err)
{
    int64_t lo = t->offset < n ? t->offset : n;
    int64_t hi = t->limit < 0 || n - lo < t->limit ? n : lo + t->limit;
    if (c->type != IV_COL_CATEGORICAL) iv_buf_printf(b, ",\"selected\":%" PRId64, n);
    iv_buf_printf(b, ",\"offset\":%" PRId64 ",\"values\":[", lo);
    for (int64_t i = lo; i < hi && !b->oom; i++) {
        if (i > lo) iv_buf_puts(b, ",");
        put_json_value(b, c, idx[i]);
        if (b->len > max_bytes)
            return iv_fail(err, IV_ETOO_LARGE,
                           "the column exceeds the JSON limit of %zu bytes; page with offset and limit",
                           max_bytes);
    }
    iv_buf_puts(b, "]");
    return 0;
}

/* The column answer over rows idx[0..n): the one renderer of the GET and
 * POST forms. */
static int column_emit(iv_buf_t *b, const iv_meta_col_t *c, const int64_t *idx, int64_t n, const tparams_t *t,
                       size_t max_bytes, iv_err_t *err)
{
    int rc = 0;
    iv_buf_puts(b, "{\"name\":");
    iv_buf_json_str(b, c->name);
    iv_buf_printf(b, ",\"type\":\"%s\",\"n_rows\":%" PRId64 ",\"null_count\":%" PRId64,
                  iv_col_type_name(c->type), c->n, c->null_count);
    int want_values = c->type != IV_COL_CATEGORICAL || t->values;
    if (c->type == IV_COL_CATEGORICAL) rc = put_category_counts(b, c, idx, n, err);
    if (rc == 0 && want_values) rc = put_column_values(b, c, idx, n, t, max_bytes, err);
    if (rc == 0) {
        iv_buf_puts(b, "}");
        if (b->oom) rc = iv_fail(err, IV_ENOMEM, "out of memory building the column");
    }
    return rc;
}

int iv_rmeta_column(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *column,
                    const char *qs, size_t qlen, size_t max_bytes, iv_err_t *err)
{
    const iv_meta_col_t *c = iv_meta_find_col(m, axis, column);
    if (!c) return iv_fail(err, IV_EBAD_SELECTION, "%s has no column '%.80s'", axis_name(axis), column);
    tparams_t t;
    IV_TRY(tparams_parse(&t, qs, qlen, 0, err));
    int64_t *idx = NULL, n = 0;
    int rc = select_rows(m, axis, t.where, &idx, &n, err);
    if (rc == 0) rc = column_emit(b, c, idx, n, &t, max_bytes, err);
    free(idx);
    tparams_free(&t);
    return rc;
}

int iv_rmeta_column_rows(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *column,
                         const int64_t *idx, int64_t n, const iv_rmeta_page_t *pg, size_t max_bytes,
                         iv_err_t *err)
{
    const iv_meta_col_t *c = iv_meta_find_col(m, axis, column);
    if (!c) return iv_fail(err, IV_EBAD_SELECTION, "%s has no column '%.80s'", axis_name(axis), column);
    tparams_t t;
    IV_TRY(page_params(pg, &t, err));
    int64_t *all = NULL;
    int rc = rows_checked(m, axis, &idx, &n, &all, err);
    if (rc == 0) rc = column_emit(b, c, idx, n, &t, max_bytes, err);
    free(all);
    return rc;
}
