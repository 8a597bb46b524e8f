/*
 * obsm / varm arrays (see obsm.h).
 *
 * Why at start-up and whole: an embedding is small next to the matrix
 * (X_umap of 1.26 million cells: 10 MB as float32; X_pca of 50
 * components: 250 MB) and a viewer asks for all of it at once, so holding
 * it in memory makes a request a gather and a memcpy, with no HDF5 call
 * (one global lock, single-threaded filters) on the query path.  Values
 * keep their stored dtype; float32 output of float64 arrays is converted
 * per request, which costs less than a second copy held for ever.
 */
#include "h5iso.h"
#include "h5util.h"
#include "obsm.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "clock.h"

/* Largest array read (elements): beyond it the element is listed, not held. */
#define MARRAY_MAX_BYTES ((uint64_t)1 << 34)

typedef struct load {
    const char *path;
    iv_err_t *err;
    iv_marrays_t *s;
    size_t cap;
    iv_axis_t axis;
    int64_t n_axis;
    int rc;
} load_t;

static void read_encoding(hid_t obj, char *out, size_t cap)
{
    out[0] = '\0';
    if (H5Aexists(obj, "encoding-type") <= 0) return;
    hid_t a = H5Aopen(obj, "encoding-type", H5P_DEFAULT);
    if (a < 0) return;
    hid_t t = H5Aget_type(a);
    if (t >= 0 && H5Tget_class(t) == H5T_STRING) {
        if (H5Tis_variable_str(t) > 0) {
            char *s = NULL;
            hid_t mt = H5Tcopy(t);
            if (H5Aread(a, mt, &s) >= 0 && s) {
                snprintf(out, cap, "%s", s);
                H5free_memory(s);
            }
            H5Tclose(mt);
        } else {
            size_t n = H5Tget_size(t);
            char *buf = calloc(1, n + 1);
            if (buf && H5Aread(a, t, buf) >= 0) snprintf(out, cap, "%s", buf);
            free(buf);
        }
    }
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
}

static int numeric_dtype(hid_t ft, iv_dtype_t *out)
{
    H5T_class_t cls = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    if (cls == H5T_FLOAT) {
        if (sz != 4 && sz != 8) return -1;
        *out = sz == 4 ? IV_DT_FLOAT32 : IV_DT_FLOAT64;
        return 0;
    }
    if (cls != H5T_INTEGER) return -1;
    int sgn = H5Tget_sign(ft) == H5T_SGN_2;
    switch (sz) {
    case 1: *out = sgn ? IV_DT_INT8 : IV_DT_UINT8; return 0;
    case 2: *out = sgn ? IV_DT_INT16 : IV_DT_UINT16; return 0;
    case 4: *out = sgn ? IV_DT_INT32 : IV_DT_UINT32; return 0;
    case 8: *out = sgn ? IV_DT_INT64 : IV_DT_UINT64; return 0;
    default: return -1;
    }
}

/* Whether dataset element a (dataspace sp, type ft) can be served: a
 * one- or two-dimensional numeric array with a row per axis entry, of at
 * most MARRAY_MAX_BYTES (*bytes); the reason in a->why when not. */
static int servable(const load_t *L, hid_t sp, hid_t ft, iv_marray_t *a, uint64_t *bytes)
{
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t dims[2] = {0, 1};
    if (nd < 1 || nd > 2) {
        snprintf(a->why, sizeof a->why, "a %d-dimensional array (1 or 2 served)", nd);
        return 0;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if (nd == 1) dims[1] = 1;
    a->n_rows = (int64_t)dims[0];
    a->n_cols = (int64_t)dims[1];
    if (ft < 0 || numeric_dtype(ft, &a->dtype) != 0) {
        snprintf(a->why, sizeof a->why, "not an integer or floating-point array");
        return 0;
    }
    if (a->n_rows != L->n_axis) {
        snprintf(a->why, sizeof a->why, "%lld rows where the axis has %lld",
                 (long long)a->n_rows, (long long)L->n_axis);
        return 0;
    }
    *bytes = (uint64_t)dims[0] * (uint64_t)dims[1] * iv_dtype_size(a->dtype);
    if (dims[1] && *bytes / dims[1] / iv_dtype_size(a->dtype) != dims[0]) *bytes = UINT64_MAX;
    if (*bytes > MARRAY_MAX_BYTES) {
        snprintf(a->why, sizeof a->why, "larger than the %llu bytes an array may hold",
                 (unsigned long long)MARRAY_MAX_BYTES);
        return 0;
    }
    return 1;
}

/* Reads one dataset element into a (servable or with a reason). */
static int read_array(load_t *L, hid_t d, iv_marray_t *a)
{
    int rc = 0;
    hid_t sp = H5Dget_space(d), ft = H5Dget_type(d);
    uint64_t bytes = 0;
    if (!servable(L, sp, ft, a, &bytes)) goto out;
    a->data = malloc(bytes ? (size_t)bytes : 1);
    if (!a->data) {
        rc = iv_fail(L->err, IV_ENOMEM, "%s: out of memory reading %sm/%s", L->path,
                     L->axis == IV_AXIS_OBS ? "obs" : "var", a->name);
        goto out;
    }
    if (bytes && H5Dread(d, iv_h5_native(a->dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, a->data) < 0) {
        rc = iv_fail(L->err, IV_EIO, "%s: cannot read %sm/%s", L->path,
                     L->axis == IV_AXIS_OBS ? "obs" : "var", a->name);
        free(a->data);
        a->data = NULL;
        goto out;
    }
    L->s->bytes += (size_t)bytes;
out:
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

static herr_t visit(hid_t g, const char *name, const H5L_info_t *info, void *arg)
{
    (void)info;
    load_t *L = arg;
    if (L->s->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 8;
        iv_marray_t *na = realloc(L->s->a, nc * sizeof *na);
        if (!na) {
            L->rc = iv_fail(L->err, IV_ENOMEM, "%s: out of memory listing obsm/varm", L->path);
            return -1;
        }
        L->s->a = na;
        L->cap = nc;
    }
    iv_marray_t *a = &L->s->a[L->s->n];
    memset(a, 0, sizeof *a);
    a->axis = L->axis;
    a->name = strdup(name);
    if (!a->name) {
        L->rc = iv_fail(L->err, IV_ENOMEM, "%s: out of memory listing obsm/varm", L->path);
        return -1;
    }
    L->s->n++;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        snprintf(a->why, sizeof a->why, "cannot be opened");
        return 0;
    }
    read_encoding(o, a->encoding, sizeof a->encoding);
    H5I_type_t ty = H5Iget_type(o);
    if (ty == H5I_DATASET) {
        if (!a->encoding[0]) snprintf(a->encoding, sizeof a->encoding, "array");
        L->rc = read_array(L, o, a);
    } else {
        snprintf(a->why, sizeof a->why, "a %s element (dense arrays are served)",
                 a->encoding[0] ? a->encoding : "group");
    }
    H5Oclose(o);
    return L->rc == 0 ? 0 : -1;
}

/* Reads obsm and varm with HDF5: in the child process only (see
 * iv_marrays_load). */
static int load_here(const char *path, int64_t n_obs, int64_t n_var, iv_marrays_t **out,
                     iv_err_t *err)
{
    double t0 = iv_now_s();
    *out = NULL;
    iv_marrays_t *s = calloc(1, sizeof *s);
    IV_RETURN_IF(!s, err, IV_ENOMEM, "%s: out of memory", path);
    if (iv_h5filters_register() < 0) {
        free(s);
        return iv_fail(err, IV_EINTERNAL, "%s: cannot register HDF5 filters", path);
    }
    load_t L = {path, err, s, 0, IV_AXIS_OBS, n_obs, 0};
    hid_t file = -1;
    H5E_BEGIN_TRY
    {
        file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        for (int ax = 0; file >= 0 && ax < 2 && L.rc == 0; ax++) {
            const char *gname = ax == 0 ? "obsm" : "varm";
            L.axis = ax == 0 ? IV_AXIS_OBS : IV_AXIS_VAR;
            L.n_axis = ax == 0 ? n_obs : n_var;
            if (H5Lexists(file, gname, H5P_DEFAULT) <= 0) continue;
            hid_t g = H5Gopen(file, gname, H5P_DEFAULT);
            if (g < 0) continue;
            hsize_t idx = 0;
            H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, visit, &L);
            H5Gclose(g);
        }
    }
    H5E_END_TRY;
    if (file < 0) {
        iv_marrays_free(s);
        return iv_fail(err, IV_EIO, "%s: cannot open as HDF5", path);
    }
    H5Fclose(file);
    if (L.rc != 0) {
        iv_marrays_free(s);
        return L.rc;
    }
    s->load_seconds = iv_now_s() - t0;
    *out = s;
    return 0;
}

/* ---- through a child process ---------------------------------------------
 *
 * HDF5 is not safe on damaged input (see h5iso.h): the arrays are read in
 * a child, which sends each element as (axis, name, encoding, why, dtype,
 * rows, cols, values), and the parent checks every length as it takes
 * them back.  This also keeps HDF5 out of the parent, where a call in
 * flight during another load's fork would leave the child's copy of the
 * library locked. */

struct marrays_ctx {
    const char *path;
    int64_t n_obs, n_var;
};

static int put_str(iv_h5iso_out_t *o, const char *s)
{
    return iv_h5iso_put_blob(o, s, strlen(s));
}

static int marrays_child(void *vctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    struct marrays_ctx *c = vctx;
    iv_marrays_t *s;
    iv_h5iso_stage(o, "obsm/varm");
    int rc = load_here(c->path, c->n_obs, c->n_var, &s, err);
    if (rc != 0) return rc;
    int bad = iv_h5iso_put_u64(o, s->n);
    for (size_t i = 0; !bad && i < s->n; i++) {
        const iv_marray_t *a = &s->a[i];
        size_t bytes = a->data ? (size_t)a->n_rows * (size_t)a->n_cols * iv_dtype_size(a->dtype) : 0;
        bad |= iv_h5iso_put_u64(o, (uint64_t)a->axis) | put_str(o, a->name) |
               put_str(o, a->encoding) | put_str(o, a->why) |
               iv_h5iso_put_u64(o, (uint64_t)a->dtype) | iv_h5iso_put_u64(o, (uint64_t)a->n_rows) |
               iv_h5iso_put_u64(o, (uint64_t)a->n_cols) | iv_h5iso_put_u64(o, a->data ? 1 : 0);
        if (a->data) bad |= iv_h5iso_put_blob(o, a->data, bytes);
    }
    iv_marrays_free(s);
    return bad ? iv_fail(err, IV_EIO, "%s: cannot pass obsm/varm to the server", c->path) : 0;
}

/* What the take_* steps return for an answer that does not parse. */
#define MALFORMED 1

/* An element's axis, name, encoding and reason; MALFORMED, 0 or an
 * error. */
static int take_labels(iv_h5iso_rd_t *r, iv_marray_t *a, const char *path, iv_err_t *err)
{
    char name[1024];
    uint64_t axis = iv_h5iso_rd_u64(r);
    if (r->bad || axis > 1 || iv_h5iso_rd_str(r, name, sizeof name) < 0 ||
        iv_h5iso_rd_str(r, a->encoding, sizeof a->encoding) < 0 || iv_h5iso_rd_str(r, a->why, sizeof a->why) < 0)
        return MALFORMED;
    a->name = strdup(name);
    if (!a->name) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    a->axis = axis ? IV_AXIS_VAR : IV_AXIS_OBS;
    return 0;
}

/* An element's values: as many rows as its axis (n_axis) and no more
 * than an array may hold. */
static int take_data(iv_h5iso_rd_t *r, iv_marray_t *a, int64_t n_axis, iv_marrays_t *s,
                     const char *path, iv_err_t *err)
{
    uint64_t rows = (uint64_t)a->n_rows, cols = (uint64_t)a->n_cols;
    size_t esz = iv_dtype_size(a->dtype);
    if (esz == 0 || a->n_rows != n_axis || (cols && rows > MARRAY_MAX_BYTES / esz / cols))
        return MALFORMED;
    size_t bytes = (size_t)(rows * cols) * esz;
    const void *p = iv_h5iso_rd_blob(r, bytes, NULL);
    if (!p) return MALFORMED;
    a->data = malloc(bytes ? bytes : 1);
    if (!a->data) return iv_fail(err, IV_ENOMEM, "%s: out of memory for %sm/%s", path,
                                 a->axis == IV_AXIS_OBS ? "obs" : "var", a->name);
    memcpy(a->data, p, bytes);
    s->bytes += bytes;
    return 0;
}

/* An element's dtype and shape, and its values when it has them. */
static int take_values(iv_h5iso_rd_t *r, iv_marray_t *a, int64_t n_axis, iv_marrays_t *s,
                       const char *path, iv_err_t *err)
{
    uint64_t dt = iv_h5iso_rd_u64(r), rows = iv_h5iso_rd_u64(r), cols = iv_h5iso_rd_u64(r);
    uint64_t has = iv_h5iso_rd_u64(r);
    if (r->bad || has > 1 || rows > (uint64_t)INT64_MAX || cols > (uint64_t)INT64_MAX)
        return MALFORMED;
    a->dtype = (iv_dtype_t)dt;
    a->n_rows = (int64_t)rows;
    a->n_cols = (int64_t)cols;
    return has ? take_data(r, a, n_axis, s, path, err) : 0;
}

static int take_marrays(const char *path, const iv_h5iso_result_t *res, int64_t n_obs,
                        int64_t n_var, iv_marrays_t *s, iv_err_t *err)
{
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, res);
    uint64_t n = iv_h5iso_rd_u64(&r);
    if (r.bad || n > res->len) goto bad;
    s->a = calloc(n ? (size_t)n : 1, sizeof *s->a);
    if (!s->a) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n; i++) {
        iv_marray_t *a = &s->a[i];
        int rc = take_labels(&r, a, path, err);
        if (rc == 0) {
            s->n = (size_t)i + 1;
            rc = take_values(&r, a, a->axis == IV_AXIS_OBS ? n_obs : n_var, s, path, err);
        }
        if (rc == MALFORMED) goto bad;
        if (rc < 0) return rc;
    }
    if (r.pos != r.len) goto bad;
    return 0;
bad:
    return iv_fail(err, IV_EINTERNAL, "%s: the obsm/varm reader's answer is malformed", path);
}

int iv_marrays_load(const char *path, int64_t n_obs, int64_t n_var, iv_marrays_t **out,
                    iv_err_t *err)
{
    double t0 = iv_now_s();
    *out = NULL;
    iv_marrays_t *s = calloc(1, sizeof *s);
    IV_RETURN_IF(!s, err, IV_ENOMEM, "%s: out of memory", path);
    struct marrays_ctx c = {path, n_obs, n_var};
    iv_h5iso_result_t res;
    int rc = iv_h5iso_run(path, marrays_child, &c, NULL, NULL, &res, err);
    if (rc < 0) {
        iv_marrays_free(s);
        return rc;
    }
    rc = take_marrays(path, &res, n_obs, n_var, s, err);
    iv_h5iso_result_free(&res);
    if (rc < 0) {
        iv_marrays_free(s);
        return rc;
    }
    s->load_seconds = iv_now_s() - t0;
    *out = s;
    return 0;
}

void iv_marrays_free(iv_marrays_t *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->a[i].name);
        free(s->a[i].data);
    }
    free(s->a);
    free(s);
}

const iv_marray_t *iv_marrays_find(const iv_marrays_t *s, iv_axis_t axis, const char *name)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (s->a[i].axis == axis && !strcmp(s->a[i].name, name)) return &s->a[i];
    return NULL;
}

void iv_marray_gather(const iv_marray_t *a, const int64_t *idx, int64_t n, iv_dtype_t to, void *out)
{
    int64_t rows = idx ? n : a->n_rows, k = a->n_cols;
    size_t esz = iv_dtype_size(a->dtype), rsz = (size_t)k * esz;
    const char *src = a->data;
    if (to == a->dtype) {
        if (!idx) {
            memcpy(out, src, (size_t)rows * rsz);
            return;
        }
        char *o = out;
        for (int64_t r = 0; r < rows; r++) memcpy(o + (size_t)r * rsz, src + (size_t)idx[r] * rsz, rsz);
        return;
    }
    if (a->dtype == IV_DT_FLOAT64 && to == IV_DT_FLOAT32) {
        /* The common conversion gets a plain loop the compiler vectorises. */
        const double *s = (const double *)a->data;
        float *o = out;
        for (int64_t r = 0; r < rows; r++) {
            const double *row = s + (size_t)(idx ? idx[r] : r) * (size_t)k;
            for (int64_t j = 0; j < k; j++) o[r * k + j] = (float)row[j];
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        size_t base = (size_t)(idx ? idx[r] : r) * (size_t)k;
        for (int64_t j = 0; j < k; j++) {
            double v = iv_dtype_get_f64(a->dtype, a->data, base + (size_t)j);
            if (to == IV_DT_FLOAT32) ((float *)out)[r * k + j] = (float)v;
            else ((double *)out)[r * k + j] = v;
        }
    }
}
