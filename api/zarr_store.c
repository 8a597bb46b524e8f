/*
 * The Zarr store's layout and its metadata nodes (see zarr.h).
 *
 * Design.  The store is a tree computed from the dataset, never held:
 * zarr_walk() visits its nodes (groups and arrays, parents first) in one
 * fixed order, and every answer is a walk.  A metadata key is a walk that
 * stops at the node of that path; .zmetadata is a walk that renders every
 * node; a chunk key is a walk to its array followed by zarr_chunk().  A
 * walk costs a pass over the columns' and arrays' names, microseconds
 * next to an HTTP round trip, and keeps one description of the layout
 * that the metadata and the chunks cannot disagree on.
 *
 * The layout is what anndata 0.8 writes with write_elem: encoding-type and
 * encoding-version attributes on every element, the data frames'
 * "_index" and "column-order", categoricals as codes + categories,
 * nullable columns as values + mask, sparse X as indptr/indices/data with
 * a "shape" attribute.  Names that cannot be a key (empty, containing
 * '/', starting with '.', or the frame's "_index") are left out.
 */
#include "zarr.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zarr_cache.h"
#include "zarr_impl.h"

#define PATH_MAX_LEN 600
#define CSR_PREFIX "csr/"

typedef int (*visit_fn)(void *ctx, const zarr_node_t *n);

typedef struct walker {
    const iv_zarr_src_t *src;
    int csr;
    visit_fn fn;
    void *ctx;
    iv_buf_t attrs;
    const iv_uns_t *uns;      /* NULL: an empty uns */
    char path[PATH_MAX_LEN];
    int stop;                 /* what fn returned, once nonzero */
} walker_t;

static const char ENC_ARRAY[] = "{\"encoding-type\":\"array\",\"encoding-version\":\"0.2.0\"}";
static const char ENC_STRINGS[] = "{\"encoding-type\":\"string-array\",\"encoding-version\":\"0.2.0\"}";
static const char ENC_DICT[] = "{\"encoding-type\":\"dict\",\"encoding-version\":\"0.1.0\"}";

static int name_ok(const char *s)
{
    return s && s[0] && s[0] != '.' && !strchr(s, '/') && strcmp(s, "_index") != 0 &&
           strlen(s) < 200;
}

static void emit(walker_t *w, const char *path, int is_group, const char *attrs, const zarr_arr_t *a)
{
    if (w->stop) return;
    zarr_node_t n = {.path = path, .is_group = is_group, .attrs = attrs ? attrs : "{}"};
    if (a) n.a = *a;
    w->stop = w->fn(w->ctx, &n);
}

static void group(walker_t *w, const char *path, const char *attrs)
{
    emit(w, path, 1, attrs, NULL);
}

static void set_numeric(zarr_arr_t *a, iv_dtype_t t)
{
    a->vt = t;
    snprintf(a->dtype, sizeof a->dtype, "%s", iv_dtype_descr(t));
}

/* A 1-D array of n elements; numeric chunks hold up to
 * IV_ZARR_COL_CHUNK_BYTES, strings are one chunk (clients read them whole). */
static void shape_1d(zarr_arr_t *a, int64_t n, int64_t chunk)
{
    a->ndim = 1;
    a->shape[0] = n;
    a->chunks[0] = chunk > 0 ? chunk : 1;
    a->shape[1] = a->chunks[1] = 1;
}

static int64_t col_chunk(int64_t n, int64_t itemsize)
{
    int64_t c = IV_ZARR_COL_CHUNK_BYTES / (itemsize > 0 ? itemsize : 1);
    return n < c ? n : c;
}

static void array_1d(walker_t *w, const char *path, zarr_arr_t *a, int64_t n, const char *attrs)
{
    if (a->is_str) {
        snprintf(a->dtype, sizeof a->dtype, "|O");
        shape_1d(a, n, n);
    } else {
        if (a->is_bool) snprintf(a->dtype, sizeof a->dtype, "|b1");
        shape_1d(a, n, col_chunk(n, a->is_bool ? 1 : (int64_t)iv_dtype_size(a->vt)));
    }
    emit(w, path, 0, attrs, a);
}

/* The path parent/name in w->path's storage after the parent's length;
 * NULL when too long. */
static const char *child(walker_t *w, size_t base, const char *name)
{
    int n = snprintf(w->path + base, sizeof w->path - base, "%s%s", base ? "/" : "", name);
    return n > 0 && (size_t)n < sizeof w->path - base ? w->path : NULL;
}

/* A sparse matrix at w->path (X, layers/NAME, raw/X) as anndata writes
 * a csr_matrix or csc_matrix: indptr, indices, data. */
static void walk_matrix(walker_t *w, iv_dataset_t *ds, int csr)
{
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    iv_buf_t *b = &w->attrs;
    b->len = 0;
    iv_buf_printf(b,
                  "{\"encoding-type\":\"%s\",\"encoding-version\":\"0.1.0\",\"shape\":[%" PRId64
                  ",%" PRId64 "]}",
                  csr ? "csr_matrix" : "csc_matrix", in->n_rows, in->n_cols);
    iv_buf_append(b, "", 1);
    size_t base = strlen(w->path);
    group(w, w->path, b->data);
    int64_t n_major = csr ? in->n_rows : in->n_cols, n_minor = csr ? in->n_cols : in->n_rows;
    zarr_arr_t a = {.csr = csr, .mx = ds, .zstd = IV_ZARR_ZSTD_LEVEL > 0};
    a.src = ZS_X_INDPTR;
    set_numeric(&a, IV_DT_INT64);
    shape_1d(&a, n_major + 1, n_major + 1);
    if (child(w, base, "indptr")) emit(w, w->path, 0, NULL, &a);
    w->path[base] = '\0';
    a.src = ZS_X_INDICES;
    set_numeric(&a, n_minor <= INT32_MAX ? IV_DT_INT32 : IV_DT_INT64);
    int64_t c = zarr_x_chunk(w->src);
    shape_1d(&a, in->nnz, in->nnz < c ? in->nnz : c);
    if (child(w, base, "indices")) emit(w, w->path, 0, NULL, &a);
    w->path[base] = '\0';
    a.src = ZS_X_DATA;
    set_numeric(&a, in->value_dtype);
    if (child(w, base, "data")) emit(w, w->path, 0, NULL, &a);
    w->path[base] = '\0';
}

static void walk_x(walker_t *w)
{
    snprintf(w->path, sizeof w->path, "X");
    walk_matrix(w, w->src->ds, w->csr);
}

/* Opens the other matrix name; NULL when the dataset has none or it is
 * not servable (a layer that is not packed is left out of the store). */
static iv_dataset_t *open_matrix(const iv_zarr_src_t *src, const char *name, iv_meta_t **var_meta)
{
    iv_dataset_t *ds = NULL;
    iv_err_t e = {0};
    *var_meta = NULL;
    if (!src->matrix_open || src->matrix_open(src->matrix_ctx, name, &ds, var_meta, &e) != 0)
        return NULL;
    return ds;
}

/* A matrix in the orientation it is stored in (layers and raw/X have no
 * second one). */
static int is_csr(iv_dataset_t *ds)
{
    return iv_dataset_info(ds)->orient == IV_IVCSR;
}

static void walk_layers(walker_t *w)
{
    group(w, "layers", ENC_DICT);
    const char *name;
    for (size_t i = 0; !w->stop && w->src->matrix_name &&
                       (name = w->src->matrix_name(w->src->matrix_ctx, i)) != NULL;
         i++) {
        iv_meta_t *vm;
        iv_dataset_t *ds;
        if (strncmp(name, "layers/", 7) != 0 || !name_ok(name + 7)) continue;
        if (!(ds = open_matrix(w->src, name, &vm))) continue;
        snprintf(w->path, sizeof w->path, "%s", name);
        walk_matrix(w, ds, is_csr(ds));
    }
}

static void walk_frame(walker_t *w, const iv_meta_t *m, iv_axis_t axis, const char *name);

/* raw: X and var (raw/var; raw/X without it is left out: anndata cannot
 * read a raw without var), varm empty. */
static void walk_raw(walker_t *w)
{
    iv_meta_t *vm;
    iv_dataset_t *ds = open_matrix(w->src, "raw/X", &vm);
    if (!ds || !vm || !iv_meta_index(vm, IV_AXIS_VAR)) return;
    group(w, "raw", "{\"encoding-type\":\"raw\",\"encoding-version\":\"0.1.0\"}");
    snprintf(w->path, sizeof w->path, "raw/X");
    walk_matrix(w, ds, is_csr(ds));
    walk_frame(w, vm, IV_AXIS_VAR, "raw/var");
    group(w, "raw/varm", ENC_DICT);
}

static iv_dtype_t int_dtype(iv_dtype_t t)
{
    return t <= IV_DT_UINT64 ? t : IV_DT_INT64;
}

static iv_dtype_t codes_dtype(const iv_meta_col_t *c)
{
    /* pandas' choice, which anndata stores: the smallest signed type
     * holding every code and -1 (the meta holds codes as int32 whatever
     * the file's width). */
    return c->n_cats < 128 ? IV_DT_INT8 : c->n_cats < 32768 ? IV_DT_INT16 : IV_DT_INT32;
}

/* A categorical column at w->path: codes and categories. */
static void walk_categorical(walker_t *w, const iv_meta_col_t *c)
{
    char attrs[128];
    size_t len = strlen(w->path);
    snprintf(attrs, sizeof attrs,
             "{\"encoding-type\":\"categorical\",\"encoding-version\":\"0.2.0\",\"ordered\":%s}",
             c->ordered ? "true" : "false");
    group(w, w->path, attrs);
    zarr_arr_t a = {.col = c, .src = ZS_COL};
    set_numeric(&a, codes_dtype(c));
    if (child(w, len, "codes")) array_1d(w, w->path, &a, c->n, ENC_ARRAY);
    w->path[len] = '\0';
    zarr_arr_t k = {.col = c};
    if (c->cats_numeric && c->cat_num) {
        k.src = ZS_CATS_NUM;
        set_numeric(&k, IV_DT_FLOAT64);
    } else {
        k.src = ZS_CATS_STR;
        k.is_str = 1;
    }
    if (child(w, len, "categories"))
        array_1d(w, w->path, &k, c->n_cats, k.is_str ? ENC_STRINGS : ENC_ARRAY);
    w->path[len] = '\0';
}

/* A nullable column at w->path: values (a) and mask. */
static void walk_nullable(walker_t *w, const iv_meta_col_t *c, zarr_arr_t *a)
{
    size_t len = strlen(w->path);
    group(w, w->path, c->type == IV_COL_INT
                          ? "{\"encoding-type\":\"nullable-integer\",\"encoding-version\":\"0.1.0\"}"
                          : "{\"encoding-type\":\"nullable-boolean\",\"encoding-version\":\"0.1.0\"}");
    if (child(w, len, "values")) array_1d(w, w->path, a, c->n, NULL);
    w->path[len] = '\0';
    zarr_arr_t m = {.col = c, .src = ZS_COL_MASK, .is_bool = 1, .vt = IV_DT_UINT8};
    if (child(w, len, "mask")) array_1d(w, w->path, &m, c->n, NULL);
    w->path[len] = '\0';
}

/* One column of a data frame, at w->path. */
static void walk_col(walker_t *w, const iv_meta_col_t *c)
{
    if (c->type == IV_COL_CATEGORICAL) {
        walk_categorical(w, c);
        return;
    }
    int nullable = c->encoding && !strncmp(c->encoding, "nullable-", 9) &&
                   (c->type == IV_COL_INT || c->type == IV_COL_BOOL);
    zarr_arr_t a = {.col = c, .src = ZS_COL};
    if (c->type == IV_COL_STRING) a.is_str = 1, a.src = ZS_COL_STR;
    else if (c->type == IV_COL_BOOL) a.is_bool = 1, a.vt = IV_DT_UINT8;
    else if (c->type == IV_COL_INT) set_numeric(&a, int_dtype(c->dtype));
    else set_numeric(&a, c->dtype == IV_DT_FLOAT32 ? IV_DT_FLOAT32 : IV_DT_FLOAT64);
    if (nullable) walk_nullable(w, c, &a);
    else array_1d(w, w->path, &a, c->n, a.is_str ? ENC_STRINGS : ENC_ARRAY);
}

static void walk_frame(walker_t *w, const iv_meta_t *m, iv_axis_t axis, const char *name)
{
    const iv_meta_col_t *ix = m ? iv_meta_index(m, axis) : NULL;
    size_t n = m ? iv_meta_n_cols(m, axis) : 0;
    iv_buf_t *b = &w->attrs;
    b->len = 0;
    iv_buf_puts(b, "{\"_index\":\"_index\",\"column-order\":[");
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        const iv_meta_col_t *c = iv_meta_col(m, axis, i);
        if (c->computed || c->is_index || !name_ok(c->name)) continue;
        if (!first) iv_buf_puts(b, ",");
        first = 0;
        iv_buf_json_str(b, c->name);
    }
    iv_buf_puts(b, "],\"encoding-type\":\"dataframe\",\"encoding-version\":\"0.2.0\"}");
    iv_buf_append(b, "", 1);
    if (b->oom) {
        w->stop = -1;
        return;
    }
    snprintf(w->path, sizeof w->path, "%s", name);
    group(w, w->path, b->data);
    size_t base = strlen(name);
    if (ix) {
        zarr_arr_t a = {.src = ZS_COL_STR, .is_str = 1, .col = ix};
        if (child(w, base, "_index")) array_1d(w, w->path, &a, ix->n, ENC_STRINGS);
    }
    for (size_t i = 0; i < n; i++) {
        const iv_meta_col_t *c = iv_meta_col(m, axis, i);
        if (c->computed || c->is_index || !name_ok(c->name)) continue;
        w->path[base] = '\0';
        if (child(w, base, c->name)) walk_col(w, c);
    }
    w->path[base] = '\0';
}

static void walk_marrays(walker_t *w, iv_axis_t axis, const char *name)
{
    group(w, name, ENC_DICT);
    const iv_marrays_t *s = w->src->arrays;
    size_t base = strlen(name);
    for (size_t i = 0; s && i < s->n; i++) {
        const iv_marray_t *ma = &s->a[i];
        if (ma->axis != axis || !ma->data || !name_ok(ma->name)) continue;
        snprintf(w->path, sizeof w->path, "%s", name);
        if (!child(w, base, ma->name)) continue;
        zarr_arr_t a = {.src = ZS_MARRAY, .ma = ma, .ndim = 2};
        set_numeric(&a, ma->dtype);
        int64_t row = (int64_t)iv_dtype_size(ma->dtype) * (ma->n_cols > 0 ? ma->n_cols : 1);
        int64_t rc = col_chunk(ma->n_rows, row);
        a.shape[0] = ma->n_rows;
        a.shape[1] = ma->n_cols;
        a.chunks[0] = rc > 0 ? rc : 1;
        a.chunks[1] = ma->n_cols > 0 ? ma->n_cols : 1;
        emit(w, w->path, 0, ENC_ARRAY, &a);
    }
}

/* An uns path ("neighbors/params/method") whose parts can all be keys. */
static int uns_path_ok(const char *p)
{
    if (strlen(p) >= PATH_MAX_LEN - 8) return 0;
    for (const char *part = p;;) {
        /* A part may not be empty nor start with '.'. */
        if (*part == '\0' || *part == '/' || *part == '.') return 0;
        const char *slash = strchr(part, '/');
        if (!slash) return 1;
        part = slash + 1;
    }
}

/* Code points of a UTF-8 string (valid: uns.h checked it). */
static int64_t n_code_points(const char *s, size_t len)
{
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

/* One uns entry at w->path as anndata writes it: a scalar is a 0-d array
 * (numeric-scalar, or string with numpy's "<UN" dtype), an array a 1-D
 * one (array, or string-array in vlen-utf8). */
static void walk_uns_entry(walker_t *w, const iv_uns_entry_t *e)
{
    if (e->kind == IV_UNS_DICT) {
        group(w, w->path, ENC_DICT);
        return;
    }
    zarr_arr_t a = {.src = ZS_UNS, .ue = e};
    if (e->kind == IV_UNS_NUM) set_numeric(&a, e->dtype);
    a.is_bool = e->kind == IV_UNS_BOOL;
    a.vt = a.is_bool ? IV_DT_UINT8 : a.vt;
    a.is_str = e->kind == IV_UNS_STR;
    if (!e->scalar) {
        array_1d(w, w->path, &a, e->n, a.is_str ? ENC_STRINGS : ENC_ARRAY);
        return;
    }
    a.ndim = 0;
    a.shape[0] = a.chunks[0] = a.shape[1] = a.chunks[1] = 1;
    if (a.is_bool) snprintf(a.dtype, sizeof a.dtype, "|b1");
    if (a.is_str) {
        size_t len;
        const char *s = iv_uns_str(e, 0, &len);
        int64_t cp = n_code_points(s, len);
        a.ustr_width = cp > 0 ? (int)cp : 1;  /* numpy's dtype of "" is <U1 */
        a.is_str = 0;
        snprintf(a.dtype, sizeof a.dtype, "<U%d", a.ustr_width);
    }
    emit(w, w->path, 0,
         a.ustr_width ? "{\"encoding-type\":\"string\",\"encoding-version\":\"0.2.0\"}"
                      : "{\"encoding-type\":\"numeric-scalar\",\"encoding-version\":\"0.2.0\"}",
         &a);
}

static void walk_uns(walker_t *w)
{
    group(w, "uns", ENC_DICT);
    const iv_uns_t *u = w->uns;
    for (size_t i = 0; u && i < u->n && !w->stop; i++) {
        const iv_uns_entry_t *e = &u->e[i];
        if (!uns_path_ok(e->path)) continue;
        snprintf(w->path, sizeof w->path, "uns/%s", e->path);
        walk_uns_entry(w, e);
    }
}

/* Visits every node, parents first; returns what fn returned to stop it
 * (nonzero), 0 when every node was visited, -1 out of memory. */
static int zarr_walk(const iv_zarr_src_t *src, int csr, visit_fn fn, void *ctx)
{
    walker_t w = {.src = src, .csr = csr, .fn = fn, .ctx = ctx};
    w.uns = iv_zarr_cache_uns(src->cache, iv_dataset_info(src->ds)->path);
    iv_buf_init(&w.attrs);
    group(&w, "", "{\"encoding-type\":\"anndata\",\"encoding-version\":\"0.1.0\"}");
    if (!w.stop) walk_x(&w);
    if (!w.stop) walk_frame(&w, src->meta, IV_AXIS_OBS, "obs");
    if (!w.stop) walk_frame(&w, src->meta, IV_AXIS_VAR, "var");
    if (!w.stop) walk_marrays(&w, IV_AXIS_OBS, "obsm");
    if (!w.stop) walk_marrays(&w, IV_AXIS_VAR, "varm");
    if (!w.stop) walk_layers(&w);
    if (!w.stop) walk_raw(&w);
    if (!w.stop) walk_uns(&w);
    int oom = w.attrs.oom;
    iv_buf_free(&w.attrs);
    return oom ? -1 : w.stop;
}

/* ---- metadata documents ---------------------------------------------------- */

/* [d0,d1] for the array's dimensions ([] for a scalar). */
static void render_dims(iv_buf_t *b, const zarr_arr_t *a, const int64_t *v)
{
    iv_buf_puts(b, "[");
    for (int d = 0; d < a->ndim; d++) iv_buf_printf(b, "%s%" PRId64, d ? "," : "", v[d]);
    iv_buf_puts(b, "]");
}

static void render_zarray(iv_buf_t *b, const zarr_arr_t *a)
{
    iv_buf_puts(b, "{\"chunks\":");
    render_dims(b, a, a->chunks);
    if (a->zstd) iv_buf_printf(b, ",\"compressor\":{\"id\":\"zstd\",\"level\":%d}", IV_ZARR_ZSTD_LEVEL);
    else iv_buf_puts(b, ",\"compressor\":null");
    iv_buf_printf(b, ",\"dtype\":\"%s\",\"fill_value\":", a->dtype);
    if (a->ustr_width) iv_buf_puts(b, "\"\"");
    else if (a->is_str) iv_buf_puts(b, "null");
    else if (a->is_bool) iv_buf_puts(b, "false");
    else if (a->vt == IV_DT_FLOAT32 || a->vt == IV_DT_FLOAT64) iv_buf_puts(b, "0.0");
    else iv_buf_puts(b, "0");
    iv_buf_printf(b, ",\"filters\":%s,\"order\":\"C\",\"shape\":",
                  a->is_str ? "[{\"id\":\"vlen-utf8\"}]" : "null");
    render_dims(b, a, a->shape);
    iv_buf_puts(b, ",\"zarr_format\":2}");
}

static const char ZGROUP[] = "{\"zarr_format\":2}";

typedef struct consolidate {
    iv_buf_t *out;
    int first;
} consolidate_t;

static void meta_key(consolidate_t *c, const char *path, const char *leaf)
{
    iv_buf_puts(c->out, c->first ? "\n" : ",\n");
    c->first = 0;
    char key[PATH_MAX_LEN + 16];
    snprintf(key, sizeof key, "%s%s%s", path, path[0] ? "/" : "", leaf);
    iv_buf_json_str(c->out, key);
    iv_buf_puts(c->out, ":");
}

static int consolidate_node(void *ctx, const zarr_node_t *n)
{
    consolidate_t *c = ctx;
    meta_key(c, n->path, n->is_group ? ".zgroup" : ".zarray");
    if (n->is_group) iv_buf_puts(c->out, ZGROUP);
    else render_zarray(c->out, &n->a);
    meta_key(c, n->path, ".zattrs");
    iv_buf_puts(c->out, n->attrs);
    return 0;
}

/* ---- key lookup -------------------------------------------------------------- */

typedef struct finder {
    const char *path;
    int found;
    int is_group;
    iv_buf_t *attrs;          /* a copy of the node's attrs (they do not outlive the visit) */
    zarr_arr_t a;
} finder_t;

static int find_node(void *ctx, const zarr_node_t *n)
{
    finder_t *f = ctx;
    if (strcmp(n->path, f->path) != 0) return 0;
    f->found = 1;
    f->is_group = n->is_group;
    f->a = n->a;
    iv_buf_puts(f->attrs, n->attrs);
    return 1;
}

/* Parses a chunk id "k" or "k.l" against the array's grid. */
static int chunk_id(const zarr_arr_t *a, const char *s, int64_t idx[2])
{
    idx[0] = idx[1] = 0;
    if (a->ndim == 0) return strcmp(s, "0") == 0 ? 0 : -1;  /* a scalar's one chunk */
    for (int d = 0; d < a->ndim; d++) {
        if (*s < '0' || *s > '9') return -1;
        int64_t v = 0;
        while (*s >= '0' && *s <= '9') {
            if (v > (INT64_MAX - 9) / 10) return -1;
            v = v * 10 + (*s++ - '0');
        }
        int64_t n = a->shape[d] == 0 ? 0 : (a->shape[d] + a->chunks[d] - 1) / a->chunks[d];
        if (v >= n) return -1;
        idx[d] = v;
        if (d + 1 < a->ndim && *s++ != '.') return -1;
    }
    return *s ? -1 : 0;
}

static int consolidated(const iv_zarr_src_t *src, int csr, iv_buf_t *out, iv_err_t *err)
{
    consolidate_t c = {.out = out, .first = 1};
    iv_buf_puts(out, "{\"metadata\":{");
    if (zarr_walk(src, csr, consolidate_node, &c) < 0 || out->oom)
        return iv_fail(err, IV_ENOMEM, "out of memory for .zmetadata");
    iv_buf_puts(out, "\n},\"zarr_consolidated_format\":1}");
    return out->oom ? iv_fail(err, IV_ENOMEM, "out of memory for .zmetadata") : 0;
}

/* The value of leaf (".zattrs", ".zgroup", ".zarray" or a chunk id) of
 * the node f found. */
static int answer_leaf(const iv_zarr_src_t *src, const finder_t *f, const char *leaf,
                       const char *key, iv_buf_t *out, iv_zarr_kind_t *kind, iv_err_t *err)
{
    int64_t idx[2];
    if (!strcmp(leaf, ".zattrs")) {
        iv_buf_append(out, f->attrs->data, f->attrs->len);
    } else if (!strcmp(leaf, ".zgroup") && f->is_group) {
        iv_buf_puts(out, ZGROUP);
    } else if (!strcmp(leaf, ".zarray") && !f->is_group) {
        render_zarray(out, &f->a);
    } else if (f->is_group || chunk_id(&f->a, leaf, idx) != 0) {
        return iv_fail(err, IV_ENOT_FOUND, "no key '%.200s' in the store", key);
    } else {
        *kind = IV_ZARR_CHUNK;
        return zarr_chunk(src, &f->a, idx, out, err);
    }
    return 0;
}

int iv_zarr_get(const iv_zarr_src_t *src, const char *key, iv_buf_t *out, iv_zarr_kind_t *kind,
                iv_err_t *err)
{
    *kind = IV_ZARR_JSON;
    int csr = !strncmp(key, CSR_PREFIX, sizeof CSR_PREFIX - 1);
    if (csr) key += sizeof CSR_PREFIX - 1;
    if (!strcmp(key, ".zmetadata")) return consolidated(src, csr, out, err);
    const char *slash = strrchr(key, '/');
    const char *leaf = slash ? slash + 1 : key;
    char path[PATH_MAX_LEN];
    size_t plen = slash ? (size_t)(slash - key) : 0;
    if (plen >= sizeof path || !leaf[0]) return iv_fail(err, IV_ENOT_FOUND, "no key '%.200s' in the store", key);
    memcpy(path, key, plen);
    path[plen] = '\0';
    iv_buf_t attrs;
    iv_buf_init(&attrs);
    finder_t f = {.path = path, .attrs = &attrs};
    int rc = zarr_walk(src, csr, find_node, &f);
    if (rc < 0 || attrs.oom) rc = iv_fail(err, IV_ENOMEM, "out of memory");
    else if (!f.found) rc = iv_fail(err, IV_ENOT_FOUND, "no key '%.200s' in the store", key);
    else rc = answer_leaf(src, &f, leaf, key, out, kind, err);
    iv_buf_free(&attrs);
    if (rc == 0 && out->oom) rc = iv_fail(err, IV_ENOMEM, "out of memory");
    return rc;
}
