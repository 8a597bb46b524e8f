/*
 * obs/var metadata in memory (see meta.h).
 *
 * Why everything is read at start-up into plain arrays: filters scan
 * whole columns, and a million-cell obs of twenty columns is a few
 * hundred megabytes at most once widened to int64/double/int32 codes,
 * while HDF5 serialises every call behind one global lock and decodes
 * filters single-threaded.  Reading once and never touching HDF5 again
 * keeps the query path lock-free and predictable.
 *
 * Widening (every integer to int64, every float to double, codes to
 * int32) costs memory but lets the evaluator have one loop per type
 * instead of one per stored dtype; strings live in one arena per column
 * with 64-bit offsets, so a column is three allocations, not a million.
 *
 * Encodings are recognised by the element's encoding-type attribute and,
 * for files without one (anndata 0.7), by the HDF5 datatype class and by
 * a `categories` attribute holding an object reference.
 */
#include "meta.h"

#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "cachedir.h"
#include "codec.h"
#include "h5iso.h"
#include "h5util.h"
#include "metafile.h"
#include "names.h"
#include "pool.h"
#include "clock.h"
#include "utf8.h"

struct mcol {
    iv_meta_col_t c;       /* public view; its pointers are owned here, but
                              for those inside [lo, hi): arrays used in place
                              in the reader's answer the meta keeps mapped */
    /* Names index, built on first lookup (column_hash) and published
     * atomically: lookups and iv_meta_stats read it without the lock. */
    iv_names_t *_Atomic hash;
    uintptr_t lo, hi;      /* the kept answer's bytes (0, 0: none) */
};

struct frame {
    int64_t n;
    size_t n_cols;
    struct mcol **cols;
    struct mcol *index;
};

struct iv_meta {
    struct frame ax[2];
    pthread_mutex_t lock;  /* guards lazy names-index builds */
    iv_meta_stats_t stats;
    /* The reader's answer (its memfd mapped, or a kept file's map) whose
     * arrays the columns use in place; unmapped with the meta. */
    void *map;
    size_t map_len;
};

/* A load in progress: the file and what error messages should name. */
typedef struct rd {
    const char *path;
    iv_err_t *err;
    iv_h5iso_out_t *o;     /* the reader process's channel (stages) */
    /* The first element in an encoding this reader does not read: the
     * load goes on past it, so that a damaged element after it is still
     * found (and reported instead: damage is what anndata cannot read). */
    iv_err_t unsupported;
} rd_t;

const char *iv_col_type_name(iv_col_type_t t)
{
    switch (t) {
    case IV_COL_CATEGORICAL: return "categorical";
    case IV_COL_INT: return "int";
    case IV_COL_FLOAT: return "float";
    case IV_COL_BOOL: return "bool";
    case IV_COL_STRING: return "string";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- columns */

/* Frees p unless it lies in the answer mc's arrays are used in place in. */
static void col_free_owned(const struct mcol *mc, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if (!(a >= mc->lo && a < mc->hi)) free((void *)p);
}

static void col_free(struct mcol *mc)
{
    if (!mc) return;
    iv_meta_col_t *c = &mc->c;
    free((void *)c->name);
    col_free_owned(mc, c->mask);
    col_free_owned(mc, c->i64);
    col_free_owned(mc, c->f64);
    col_free_owned(mc, c->b);
    col_free_owned(mc, c->codes);
    col_free_owned(mc, c->str_data);
    col_free_owned(mc, c->str_off);
    col_free_owned(mc, c->cat_data);
    col_free_owned(mc, c->cat_off);
    col_free_owned(mc, c->cat_num);
    free((void *)c->cat_counts);
    iv_names_free(atomic_load(&mc->hash));
    free(mc);
}

static struct mcol *col_new(const char *name, const char *encoding)
{
    struct mcol *mc = calloc(1, sizeof(*mc));
    if (!mc) return NULL;
    mc->c.name = strdup(name);
    mc->c.encoding = encoding;
    if (!mc->c.name) {
        free(mc);
        return NULL;
    }
    return mc;
}

static size_t col_bytes(const iv_meta_col_t *c)
{
    size_t n = (size_t)c->n, b = 0;
    if (c->mask) b += n;
    if (c->i64) b += n * 8;
    if (c->f64) b += n * 8;
    if (c->b) b += n;
    if (c->codes) b += n * 4;
    /* An empty column's offsets array is a 1-byte placeholder: no read. */
    if (c->str_off && n) b += n * 8 + (size_t)c->str_off[n - 1] + 64;
    if (c->cat_off) b += (size_t)c->n_cats * 24;
    return b;
}

/* Growable string arena with offsets; the common form of string
 * columns, categories and the index. */
typedef struct sarena {
    char *data;
    size_t len, cap;
    int64_t *off;
    int64_t n;
} sarena_t;

static int sarena_init(sarena_t *a, int64_t n)
{
    memset(a, 0, sizeof(*a));
    a->off = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    a->cap = 64;
    a->data = malloc(a->cap);
    if (!a->off || !a->data) {
        free(a->off);
        free(a->data);
        return IV_ENOMEM;
    }
    return 0;
}

static int sarena_push(sarena_t *a, const char *s, size_t len)
{
    if (a->len + len + 1 > a->cap) {
        size_t cap = a->cap * 2;
        while (cap < a->len + len + 1) cap *= 2;
        char *d = realloc(a->data, cap);
        if (!d) return IV_ENOMEM;
        a->data = d;
        a->cap = cap;
    }
    a->off[a->n++] = (int64_t)a->len;
    memcpy(a->data + a->len, s, len);
    a->data[a->len + len] = '\0';
    a->len += len + 1;
    return 0;
}

static void sarena_drop(sarena_t *a)
{
    free(a->data);
    free(a->off);
    memset(a, 0, sizeof(*a));
}

/* ------------------------------------------------------------ validation */

/*
 * What anndata (and pandas) cannot read is refused here, naming the
 * element: strings that are not UTF-8 (h5py decodes every name, category
 * and value as UTF-8, and the server's JSON needs them so), categories
 * that repeat (a pandas Categorical's categories are unique), codes past
 * the categories (read_codes).  Each check is one pass over bytes already
 * in memory.
 */

/* Checks the n strings of an arena; kind names one ("row", "category",
 * "column name"). */
static int check_utf8(rd_t *r, const char *what, const char *kind, const char *data,
                      const int64_t *off, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const char *str = data + off[i];
        size_t len = strlen(str), at = iv_utf8_bad_at(str, len);
        if (at < len)
            return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: %s %lld is not valid UTF-8 (byte 0x%02x "
                           "at offset %zu); anndata cannot read it", r->path, what, kind,
                           (long long)i, (unsigned)(unsigned char)str[at], at);
    }
    return 0;
}

/* s cut to at most 60 bytes on a character boundary, for a message. */
static void label_for_msg(const char *str, char *out, size_t cap)
{
    size_t n = strlen(str), keep = n < 60 ? n : 60;
    while (keep > 0 && keep < n && ((unsigned char)str[keep] & 0xC0) == 0x80) keep--;
    snprintf(out, cap, "%.*s%s", (int)keep, str, keep < n ? "..." : "");
}

static const char *cat_label(const void *ctx, int64_t k)
{
    return iv_meta_col_cat(ctx, k);
}

/* Categories are unique: a hash of them finds each at its own place. */
static int check_unique_categories(rd_t *r, const char *what, const iv_meta_col_t *c)
{
    if (c->n_cats < 2) return 0;
    iv_names_t *h = NULL;
    IV_TRY(iv_names_build(c->n_cats, cat_label, c, &h, r->err));
    int rc = 0;
    for (int64_t k = 0; k < c->n_cats; k++) {
        const char *lab = iv_meta_col_cat(c, k);
        int64_t first = iv_names_find(h, lab, strlen(lab));
        if (first != k) {
            char shown[80];
            label_for_msg(lab, shown, sizeof shown);
            rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: category '%s' appears twice (at %lld and "
                         "%lld); anndata cannot read it", r->path, what, shown, (long long)first,
                         (long long)k);
            break;
        }
    }
    iv_names_free(h);
    return rc;
}

/* An unsupported element is set aside (the first one kept) and the load
 * goes on; any other error stops it.  Returns 0 or that error. */
static int set_aside_unsupported(rd_t *r, int rc)
{
    if (rc != IV_EUNSUPPORTED) return rc;
    if (!r->unsupported.code) r->unsupported = *r->err;
    iv_err_clear(r->err);
    return 0;
}

/* ------------------------------------------------------------ HDF5 helpers */

/* Closes an HDF5 identifier of any kind if it is valid. */
static void h5close(hid_t id)
{
    if (id < 0) return;
    switch (H5Iget_type(id)) {
    case H5I_FILE: H5Fclose(id); break;
    case H5I_GROUP: H5Gclose(id); break;
    case H5I_DATASET: H5Dclose(id); break;
    case H5I_ATTR: H5Aclose(id); break;
    case H5I_DATATYPE: H5Tclose(id); break;
    case H5I_DATASPACE: H5Sclose(id); break;
    default: break;
    }
}

/* Opens the child `name` of loc (group or dataset); -1 when absent. */
static hid_t open_child(hid_t loc, const char *name)
{
    if (H5Lexists(loc, name, H5P_DEFAULT) <= 0) return -1;
    return H5Oopen(loc, name, H5P_DEFAULT);
}

/* Reads n variable-length strings of obj (type ftype, dataspace space)
 * into the arena out. */
static int read_vl_strings(rd_t *r, hid_t obj, int is_attr, const char *what, hid_t ftype,
                           hid_t space, int64_t n, sarena_t *out)
{
    hid_t mtype = H5Tcopy(H5T_C_S1);
    H5Tset_size(mtype, H5T_VARIABLE);
    H5Tset_cset(mtype, H5Tget_cset(ftype));
    char **vl = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    if (!vl) {
        h5close(mtype);
        return iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
    }
    herr_t st = is_attr ? H5Aread(obj, mtype, vl) : H5Dread(obj, mtype, H5S_ALL, H5S_ALL,
                                                             H5P_DEFAULT, vl);
    if (st < 0) {
        free(vl);
        h5close(mtype);
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: cannot read strings (a compression "
                       "filter may be unavailable)", r->path, what);
    }
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const char *s = vl[i] ? vl[i] : "";
        if (sarena_push(out, s, strlen(s)) < 0)
            rc = iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
    }
    H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, vl);
    free(vl);
    h5close(mtype);
    return rc;
}

/* Reads n fixed-length strings of obj (type ftype) into the arena out:
 * each ends at its first NUL and loses trailing spaces when the type is
 * space-padded. */
static int read_fixed_strings(rd_t *r, hid_t obj, int is_attr, const char *what, hid_t ftype,
                              int64_t n, sarena_t *out)
{
    size_t L = H5Tget_size(ftype);
    if (L == 0 || (n > 0 && L > ((size_t)1 << 40) / (size_t)n))
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: bad string size %zu", r->path, what, L);
    hid_t mtype = H5Tcopy(ftype);
    char *fx = malloc((size_t)(n > 0 ? n : 1) * L);
    int rc = 0;
    if (!fx) {
        rc = iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
        goto done;
    }
    herr_t st = is_attr ? H5Aread(obj, mtype, fx) : H5Dread(obj, mtype, H5S_ALL, H5S_ALL,
                                                             H5P_DEFAULT, fx);
    if (st < 0) {
        rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: cannot read strings", r->path, what);
        goto done;
    }
    int spacepad = H5Tget_strpad(ftype) == H5T_STR_SPACEPAD;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const char *s = fx + (size_t)i * L;
        size_t len = strnlen(s, L);
        if (spacepad)
            while (len > 0 && s[len - 1] == ' ') len--;
        if (sarena_push(out, s, len) < 0)
            rc = iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
    }
done:
    free(fx);
    h5close(mtype);
    return rc;
}

/* The string type and one-dimensional shape of obj, checked against n
 * (n < 0: any); its number of elements, or a negative error. */
static int64_t check_string_shape(rd_t *r, hid_t ftype, hid_t space, const char *what, int64_t n)
{
    if (ftype < 0 || space < 0)
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: cannot read its type", r->path, what);
    if (H5Tget_class(ftype) != H5T_STRING)
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: expected strings", r->path, what);
    int rank = H5Sget_simple_extent_ndims(space);
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (rank > 1 || np < 0 || (n >= 0 && np != n))
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: has %lld elements, expected %lld", r->path,
                       what, (long long)np, (long long)n);
    return (int64_t)np;
}

/*
 * Reads strings of a dataset or attribute (is_attr) of n elements (n < 0:
 * whatever its size is; *n_out receives it) into an arena.  Handles
 * variable-length and fixed-length strings; fixed ones end at the first
 * NUL and lose trailing spaces when space-padded.  A NULL variable-length
 * string reads as "" and is flagged in nulls (when nulls is given).
 */
static int read_strings(rd_t *r, hid_t obj, int is_attr, const char *what, int64_t n,
                        sarena_t *out, int64_t *n_out)
{
    hid_t ftype = is_attr ? H5Aget_type(obj) : H5Dget_type(obj);
    hid_t space = is_attr ? H5Aget_space(obj) : H5Dget_space(obj);
    memset(out, 0, sizeof(*out));
    int64_t rc = check_string_shape(r, ftype, space, what, n);
    if (rc < 0) goto done;
    n = rc;
    if (sarena_init(out, n) < 0) {
        rc = iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
        goto done;
    }
    htri_t var = H5Tis_variable_str(ftype);
    if (var > 0)
        rc = read_vl_strings(r, obj, is_attr, what, ftype, space, n, out);
    else if (var == 0)
        rc = read_fixed_strings(r, obj, is_attr, what, ftype, n, out);
    else
        rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: unreadable string type", r->path, what);
    if (rc == 0) *n_out = n;
done:
    if (rc < 0) sarena_drop(out);
    h5close(space);
    h5close(ftype);
    return rc < 0 ? (int)rc : 0;
}

/* Scalar or one-element string attribute; 1 when read, 0 when absent. */
static int read_attr_str(rd_t *r, hid_t obj, const char *name, char *buf, size_t cap)
{
    if (H5Aexists(obj, name) <= 0) return 0;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return 0;
    hid_t t = H5Aget_type(a);
    int is_str = t >= 0 && H5Tget_class(t) == H5T_STRING;
    h5close(t);
    if (!is_str) {
        h5close(a);
        return 0;
    }
    sarena_t s;
    int64_t n = 0;
    int rc = read_strings(r, a, 1, name, -1, &s, &n);
    h5close(a);
    if (rc < 0) return rc;
    if (n < 1) {
        sarena_drop(&s);
        return 0;
    }
    snprintf(buf, cap, "%s", s.data + s.off[0]);
    sarena_drop(&s);
    return 1;
}

/* A numpy-bool or integer attribute (h5py writes bools as an enum). */
static int read_attr_bool(hid_t obj, const char *name, int dflt)
{
    if (H5Aexists(obj, name) <= 0) return dflt;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t nt = t >= 0 ? H5Tget_native_type(t, H5T_DIR_ASCEND) : -1;
    int v = dflt;
    unsigned char buf[16] = {0};
    if (nt >= 0 && H5Tget_size(nt) <= sizeof(buf) && H5Aread(a, nt, buf) >= 0) {
        v = 0;
        for (size_t i = 0; i < H5Tget_size(nt); i++) v |= buf[i] != 0;
    }
    h5close(nt);
    h5close(t);
    h5close(a);
    return v;
}

/* Checks a dataset is 1-D (or scalar-free) with n elements. */
static int check_len(rd_t *r, hid_t ds, const char *what, int64_t n)
{
    hid_t sp = H5Dget_space(ds);
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    h5close(sp);
    IV_RETURN_IF(rank != 1, r->err, IV_EUNSUPPORTED, "%s: %s: %d-dimensional, expected 1",
                 r->path, what, rank);
    IV_RETURN_IF(np != n, r->err, IV_EBAD_FILE, "%s: %s: has %lld elements, expected %lld",
                 r->path, what, (long long)np, (long long)n);
    return 0;
}

static int read_num(rd_t *r, hid_t ds, const char *what, int64_t n, hid_t mtype, void *buf)
{
    IV_TRY(check_len(r, ds, what, n));
    if (n == 0) return 0;
    IV_RETURN_IF(H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0, r->err,
                 IV_EBAD_FILE, "%s: %s: cannot read (a compression filter may be unavailable)",
                 r->path, what);
    return 0;
}

/* n values of es bytes each to 0/1 (any bit set is true). */
static void bytes_to_bool(const uint8_t *raw, size_t es, int64_t n, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        uint8_t v = 0;
        for (size_t k = 0; k < es; k++) v |= raw[(size_t)i * es + k];
        out[i] = v != 0;
    }
}

/* Reads a bool dataset (numpy bool is an HDF5 enum over int8; integers
 * and bitfields are accepted too) into n bytes of 0/1. */
static int read_bool(rd_t *r, hid_t ds, const char *what, int64_t n, uint8_t *out)
{
    IV_TRY(check_len(r, ds, what, n));
    hid_t ft = H5Dget_type(ds);
    hid_t nt = ft >= 0 ? H5Tget_native_type(ft, H5T_DIR_ASCEND) : -1;
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    size_t es = nt >= 0 ? H5Tget_size(nt) : 0;
    int rc = 0;
    if ((cls != H5T_ENUM && cls != H5T_INTEGER && cls != H5T_BITFIELD) || es < 1 || es > 8) {
        rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: expected booleans", r->path, what);
    } else if (n > 0) {
        uint8_t *raw = malloc((size_t)n * es);
        if (!raw) {
            rc = iv_fail(r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
        } else if (H5Dread(ds, nt, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0) {
            rc = iv_fail(r->err, IV_EBAD_FILE,
                         "%s: %s: cannot read (a compression filter may be unavailable)",
                         r->path, what);
        } else {
            bytes_to_bool(raw, es, n, out);
        }
        free(raw);
    }
    h5close(nt);
    h5close(ft);
    return rc;
}

/* Sets the column's mask (taking ownership of m) and null count;
 * frees m when nothing is missing. */
static void set_mask(iv_meta_col_t *c, uint8_t *m)
{
    int64_t k = 0;
    for (int64_t i = 0; m && i < c->n; i++) k += m[i] != 0;
    c->null_count = k;
    if (k == 0) {
        free(m);
        c->mask = NULL;
    } else {
        c->mask = m;
    }
}

/* -------------------------------------------------------- element readers */

static int read_string_col(rd_t *r, hid_t ds, const char *what, int64_t n, iv_meta_col_t *c)
{
    sarena_t s;
    int64_t got = 0;
    IV_TRY(read_strings(r, ds, 0, what, n, &s, &got));
    c->type = IV_COL_STRING;
    c->str_data = s.data;
    c->str_off = s.off;
    return check_utf8(r, what, "row", s.data, s.off, got);
}

/* Formats a number the way pandas prints category labels: integers
 * without a fraction, floats with the shortest round-tripping digits. */
static void fmt_num(char *buf, size_t cap, double v, int is_int)
{
    if (is_int) {
        snprintf(buf, cap, "%lld", (long long)v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strchr(buf, '.') && !strchr(buf, 'e') && !strchr(buf, 'n') && !strchr(buf, 'i'))
        strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* The k numbers of a numeric (or boolean enum) categories dataset. */
static int read_category_numbers(rd_t *r, hid_t cds, const char *what, int64_t k,
                                 H5T_class_t cls, double *num)
{
    if (cls != H5T_ENUM) return read_num(r, cds, what, k, H5T_NATIVE_DOUBLE, num);
    uint8_t *b = malloc((size_t)(k ? k : 1));
    int rc = b ? read_bool(r, cds, what, k, b) : iv_fail(r->err, IV_ENOMEM, "out of memory");
    for (int64_t i = 0; rc == 0 && i < k; i++) num[i] = b[i];
    free(b);
    return rc;
}

/* Labels for k category numbers, as pandas prints them, into s. */
static int label_category_numbers(rd_t *r, const double *num, int64_t k, H5T_class_t cls,
                                  sarena_t *s)
{
    if (sarena_init(s, k) < 0) return iv_fail(r->err, IV_ENOMEM, "out of memory");
    for (int64_t i = 0; i < k; i++) {
        char buf[64];
        if (cls == H5T_ENUM)
            snprintf(buf, sizeof buf, "%s", num[i] != 0 ? "True" : "False");
        else
            fmt_num(buf, sizeof buf, num[i], cls == H5T_INTEGER);
        if (sarena_push(s, buf, strlen(buf)) < 0) {
            sarena_drop(s);
            return iv_fail(r->err, IV_ENOMEM, "out of memory");
        }
    }
    return 0;
}

/* String categories: k labels, valid UTF-8 and unique. */
static int read_string_categories(rd_t *r, hid_t cds, const char *what, int64_t k,
                                  iv_meta_col_t *c)
{
    sarena_t s;
    int64_t got;
    IV_TRY(read_strings(r, cds, 0, what, k, &s, &got));
    c->cat_data = s.data;
    c->cat_off = s.off;
    c->n_cats = k;
    IV_TRY(check_utf8(r, what, "category", s.data, s.off, k));
    return check_unique_categories(r, what, c);
}

/* Numeric categories: kept as doubles and as their printed labels. */
static int read_numeric_categories(rd_t *r, hid_t cds, const char *what, int64_t k,
                                   H5T_class_t cls, iv_meta_col_t *c)
{
    double *num = malloc((size_t)(k ? k : 1) * sizeof(double));
    IV_RETURN_IF(!num, r->err, IV_ENOMEM, "%s: %s: out of memory", r->path, what);
    sarena_t s;
    int rc = read_category_numbers(r, cds, what, k, cls, num);
    if (rc == 0) rc = label_category_numbers(r, num, k, cls, &s);
    if (rc < 0) {
        free(num);
        return rc;
    }
    c->cat_data = s.data;
    c->cat_off = s.off;
    c->cat_num = num;
    c->cats_numeric = 1;
    c->n_cats = k;
    /* Numbers repeat when their labels do (1 and 1.0 of one dtype, True). */
    return check_unique_categories(r, what, c);
}

/* Categories element: strings, or numbers (kept also as doubles). */
static int read_categories(rd_t *r, hid_t cds, const char *what, iv_meta_col_t *c)
{
    hid_t ft = H5Dget_type(cds);
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    h5close(ft);
    hid_t sp = H5Dget_space(cds);
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    h5close(sp);
    IV_RETURN_IF(np < 0 || np > INT32_MAX, r->err, IV_EBAD_FILE, "%s: %s: bad categories",
                 r->path, what);
    if (cls == H5T_STRING) return read_string_categories(r, cds, what, (int64_t)np, c);
    IV_RETURN_IF(cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM, r->err,
                 IV_EUNSUPPORTED, "%s: %s: categories of this type are not supported",
                 r->path, what);
    return read_numeric_categories(r, cds, what, (int64_t)np, cls, c);
}

/* Checks n codes against n_cats (-1: missing, marked in mask) and
 * counts each category's rows. */
static int count_categories(rd_t *r, const char *what, const int32_t *codes, int64_t n,
                            int64_t n_cats, int64_t *counts, uint8_t *mask)
{
    for (int64_t i = 0; i < n; i++) {
        int32_t v = codes[i];
        if (v == -1) {
            mask[i] = 1;
        } else if (v < -1 || v >= n_cats) {
            return iv_fail(r->err, IV_EBAD_FILE,
                           "%s: %s: code %d at row %lld is outside the %lld categories", r->path,
                           what, (int)v, (long long)i, (long long)n_cats);
        } else {
            counts[v]++;
        }
    }
    return 0;
}

/* Codes (any signed int; -1 missing) validated against n_cats, with
 * per-category counts and the missing mask. */
static int read_codes(rd_t *r, hid_t ds, const char *what, int64_t n, iv_meta_col_t *c)
{
    hid_t ft = H5Dget_type(ds);
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    h5close(ft);
    IV_RETURN_IF(cls != H5T_INTEGER, r->err, IV_EBAD_FILE, "%s: %s: codes are not integers",
                 r->path, what);
    int32_t *codes = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    int64_t *counts = calloc((size_t)(c->n_cats ? c->n_cats : 1), sizeof(int64_t));
    uint8_t *mask = calloc((size_t)(n ? n : 1), 1);
    int rc = (codes && counts && mask) ? 0 : iv_fail(r->err, IV_ENOMEM, "out of memory");
    if (rc == 0) rc = read_num(r, ds, what, n, H5T_NATIVE_INT32, codes);
    if (rc == 0) rc = count_categories(r, what, codes, n, c->n_cats, counts, mask);
    if (rc < 0) {
        free(codes);
        free(counts);
        free(mask);
        return rc;
    }
    c->type = IV_COL_CATEGORICAL;
    c->codes = codes;
    c->cat_counts = counts;
    c->dtype = IV_DT_INT32;
    c->nullable = 1;
    set_mask(c, mask);
    return 0;
}

static iv_dtype_t dtype_of(hid_t ft)
{
    H5T_class_t cls = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    if (cls == H5T_FLOAT) return sz <= 4 ? IV_DT_FLOAT32 : IV_DT_FLOAT64;
    int sgn = H5Tget_sign(ft) == H5T_SGN_2;
    switch (sz) {
    case 1: return sgn ? IV_DT_INT8 : IV_DT_UINT8;
    case 2: return sgn ? IV_DT_INT16 : IV_DT_UINT16;
    case 4: return sgn ? IV_DT_INT32 : IV_DT_UINT32;
    default: return sgn ? IV_DT_INT64 : IV_DT_UINT64;
    }
}

/* A float column; without a mask of its own (ext_mask), NaN is pandas'
 * missing value for floats: it is folded into the mask so that filters
 * and null counts treat it like any other null. */
static int read_float_col(rd_t *r, hid_t ds, const char *what, int64_t n, iv_meta_col_t *c,
                          iv_dtype_t dt, const uint8_t *ext_mask)
{
    size_t cnt = (size_t)(n ? n : 1);
    double *v = malloc(cnt * sizeof(double));
    if (!v) return iv_fail(r->err, IV_ENOMEM, "out of memory");
    int rc = read_num(r, ds, what, n, H5T_NATIVE_DOUBLE, v);
    c->type = IV_COL_FLOAT;
    c->f64 = v;
    c->dtype = dt;
    if (rc != 0 || ext_mask) return rc;
    uint8_t *m = calloc(cnt, 1);
    if (!m) return iv_fail(r->err, IV_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) m[i] = isnan(v[i]) != 0;
    set_mask(c, m);
    c->nullable = 1;
    return 0;
}

/* A plain dataset column: by its datatype class. */
static int read_plain(rd_t *r, hid_t ds, const char *what, int64_t n, iv_meta_col_t *c,
                      uint8_t *ext_mask)
{
    hid_t ft = H5Dget_type(ds);
    IV_RETURN_IF(ft < 0, r->err, IV_EBAD_FILE, "%s: %s: no datatype", r->path, what);
    H5T_class_t cls = H5Tget_class(ft);
    iv_dtype_t dt = (cls == H5T_INTEGER || cls == H5T_FLOAT) ? dtype_of(ft) : IV_DT_UINT8;
    h5close(ft);
    c->n = n;
    size_t cnt = (size_t)(n ? n : 1);
    int rc;
    switch (cls) {
    case H5T_STRING:
        rc = read_string_col(r, ds, what, n, c);
        break;
    case H5T_INTEGER: {
        int64_t *v = malloc(cnt * sizeof(int64_t));
        if (!v) return iv_fail(r->err, IV_ENOMEM, "out of memory");
        rc = read_num(r, ds, what, n, H5T_NATIVE_INT64, v);
        c->type = IV_COL_INT;
        c->i64 = v;
        c->dtype = dt;
        break;
    }
    case H5T_FLOAT:
        rc = read_float_col(r, ds, what, n, c, dt, ext_mask);
        break;
    case H5T_ENUM:
    case H5T_BITFIELD: {
        uint8_t *v = malloc(cnt);
        if (!v) return iv_fail(r->err, IV_ENOMEM, "out of memory");
        rc = read_bool(r, ds, what, n, v);
        c->type = IV_COL_BOOL;
        c->b = v;
        break;
    }
    default:
        rc = iv_fail(r->err, IV_EUNSUPPORTED, "%s: %s: datatype class %d is not supported",
                     r->path, what, (int)cls);
    }
    return rc;
}

/* anndata 0.7: a codes dataset whose `categories` attribute references
 * the categories dataset.  Returns 1 when it was one. */
static int try_old_categorical(rd_t *r, hid_t ds, const char *what, int64_t n,
                               iv_meta_col_t *c)
{
    if (H5Aexists(ds, "categories") <= 0) return 0;
    hid_t a = H5Aopen(ds, "categories", H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    int is_ref = t >= 0 && H5Tget_class(t) == H5T_REFERENCE;
    h5close(t);
    if (!is_ref) {
        h5close(a);
        return 0;
    }
    hobj_ref_t ref;
    herr_t st = H5Aread(a, H5T_STD_REF_OBJ, &ref);
    h5close(a);
    IV_RETURN_IF(st < 0, r->err, IV_EBAD_FILE, "%s: %s: unreadable categories reference",
                 r->path, what);
    hid_t cds = H5Rdereference2(ds, H5P_DEFAULT, H5R_OBJECT, &ref);
    IV_RETURN_IF(cds < 0 || H5Iget_type(cds) != H5I_DATASET, r->err, IV_EBAD_FILE,
                 "%s: %s: categories reference does not lead to a dataset", r->path, what);
    int rc = read_categories(r, cds, what, c);
    h5close(cds);
    if (rc < 0) return rc;
    c->ordered = read_attr_bool(ds, "ordered", 0);
    c->encoding = "categorical";
    IV_TRY(read_codes(r, ds, what, n, c));
    return 1;
}

/* Whether both identifiers are open datasets. */
static int both_datasets(hid_t a, hid_t b)
{
    return a >= 0 && b >= 0 && H5Iget_type(a) == H5I_DATASET && H5Iget_type(b) == H5I_DATASET;
}

/* A dataset element: an anndata 0.7 categorical, or a plain array. */
static int read_dataset_element(rd_t *r, hid_t o, const char *what, const char *enc, int64_t n,
                                iv_meta_col_t *c)
{
    int rc = try_old_categorical(r, o, what, n, c);
    if (rc != 0) return rc;
    c->encoding = enc[0] ? (strcmp(enc, "string-array") == 0 ? "string-array" : "array")
                         : "array";
    return read_plain(r, o, what, n, c, NULL);
}

/* A categorical group: its categories and codes datasets. */
static int read_categorical_group(rd_t *r, hid_t o, const char *what, int64_t n,
                                  iv_meta_col_t *c)
{
    hid_t cd = open_child(o, "categories"), cc = open_child(o, "codes");
    int rc;
    if (!both_datasets(cd, cc)) {
        rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: categorical without codes/categories",
                     r->path, what);
    } else {
        char w2[600];
        snprintf(w2, sizeof w2, "%s/categories", what);
        rc = read_categories(r, cd, w2, c);
        snprintf(w2, sizeof w2, "%s/codes", what);
        if (rc == 0) rc = read_codes(r, cc, w2, n, c);
        c->ordered = read_attr_bool(o, "ordered", 0);
        c->encoding = "categorical";
    }
    h5close(cd);
    h5close(cc);
    return rc;
}

/* The nullable encodings and the column type each one's values hold. */
typedef struct nullable_enc {
    const char *name;
    iv_col_type_t want;
} nullable_enc_t;

static const nullable_enc_t NULLABLE[] = {
    {"nullable-integer", IV_COL_INT},
    {"nullable-boolean", IV_COL_BOOL},
    {"nullable-string-array", IV_COL_STRING},
};

static const nullable_enc_t *find_nullable(const char *enc)
{
    for (size_t i = 0; i < sizeof NULLABLE / sizeof NULLABLE[0]; i++)
        if (strcmp(enc, NULLABLE[i].name) == 0) return &NULLABLE[i];
    return NULL;
}

/* The mask and values datasets of a nullable group; values must be of
 * the encoding's type (integers may have been stored as floats). */
static int read_mask_values(rd_t *r, hid_t vd, hid_t md, const char *what,
                            const nullable_enc_t *ne, int64_t n, iv_meta_col_t *c, uint8_t *mask)
{
    char w2[600];
    snprintf(w2, sizeof w2, "%s/mask", what);
    IV_TRY(read_bool(r, md, w2, n, mask));
    snprintf(w2, sizeof w2, "%s/values", what);
    IV_TRY(read_plain(r, vd, w2, n, c, mask));
    if (c->type != ne->want && !(ne->want == IV_COL_INT && c->type == IV_COL_FLOAT))
        return iv_fail(r->err, IV_EBAD_FILE, "%s: %s: %s with values of type %s", r->path, what,
                       ne->name, iv_col_type_name(c->type));
    return 0;
}

/* A nullable-integer, -boolean or -string-array group. */
static int read_nullable_group(rd_t *r, hid_t o, const char *what, const nullable_enc_t *ne,
                               int64_t n, iv_meta_col_t *c)
{
    hid_t vd = open_child(o, "values"), md = open_child(o, "mask");
    uint8_t *mask = calloc((size_t)(n ? n : 1), 1);
    int rc;
    if (!mask)
        rc = iv_fail(r->err, IV_ENOMEM, "out of memory");
    else if (!both_datasets(vd, md))
        rc = iv_fail(r->err, IV_EBAD_FILE, "%s: %s: %s without values/mask", r->path, what,
                     ne->name);
    else
        rc = read_mask_values(r, vd, md, what, ne, n, c, mask);
    if (rc == 0) {
        c->encoding = ne->name;
        c->nullable = 1;
        set_mask(c, mask);
    } else {
        free(mask);
    }
    h5close(vd);
    h5close(md);
    return rc;
}

/* A group element, by its encoding. */
static int read_group_element(rd_t *r, hid_t o, const char *what, const char *enc, int64_t n,
                              iv_meta_col_t *c)
{
    if (strcmp(enc, "categorical") == 0) return read_categorical_group(r, o, what, n, c);
    const nullable_enc_t *ne = find_nullable(enc);
    if (ne) return read_nullable_group(r, o, what, ne, n, c);
    return iv_fail(r->err, IV_EUNSUPPORTED, "%s: %s: encoding '%s' is not supported", r->path,
                   what, enc[0] ? enc : "(none)");
}

/*
 * Reads element `name` of frame group g (n rows) into c.  The encoding
 * names the element's layout; the datatype decides the rest.
 */
static int read_element(rd_t *r, hid_t g, const char *gname, const char *name, int64_t n,
                        iv_meta_col_t *c)
{
    char what[512];
    snprintf(what, sizeof what, "%s/%s", gname, name);
    iv_h5iso_stage(r->o, what);
    hid_t o = open_child(g, name);
    IV_RETURN_IF(o < 0, r->err, IV_EBAD_FILE, "%s: %s: listed but not present", r->path, what);
    char enc[64] = "";
    int rc = read_attr_str(r, o, "encoding-type", enc, sizeof enc);
    c->n = n;
    if (rc >= 0) {
        H5I_type_t kind = H5Iget_type(o);
        if (kind == H5I_DATASET)
            rc = read_dataset_element(r, o, what, enc, n, c);
        else if (kind == H5I_GROUP)
            rc = read_group_element(r, o, what, enc, n, c);
        else
            rc = iv_fail(r->err, IV_EUNSUPPORTED, "%s: %s: neither dataset nor group", r->path,
                         what);
    }
    h5close(o);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------- data frames */

static void frame_free(struct frame *f)
{
    for (size_t i = 0; i < f->n_cols; i++) col_free(f->cols[i]);
    free(f->cols);
    col_free(f->index);
    memset(f, 0, sizeof(*f));
}

static int frame_push(struct frame *f, struct mcol *mc)
{
    struct mcol **p = realloc(f->cols, (f->n_cols + 1) * sizeof(*p));
    if (!p) return IV_ENOMEM;
    f->cols = p;
    f->cols[f->n_cols++] = mc;
    return 0;
}

/* The most rows given a made-up index (see read_frame). */
#define RANGE_INDEX_MAX ((int64_t)1 << 27)

/* An index "0".."n-1", what anndata gives a frame without one. */
static int range_index(struct frame *f, int64_t n, iv_err_t *err)
{
    struct mcol *mc = col_new("_index", "string-array");
    sarena_t s;
    if (!mc || sarena_init(&s, n) < 0) {
        col_free(mc);
        return iv_fail(err, IV_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) {
        char buf[24];
        int len = snprintf(buf, sizeof buf, "%lld", (long long)i);
        if (sarena_push(&s, buf, (size_t)len) < 0) {
            sarena_drop(&s);
            col_free(mc);
            return iv_fail(err, IV_ENOMEM, "out of memory");
        }
    }
    mc->c.type = IV_COL_STRING;
    mc->c.n = n;
    mc->c.is_index = 1;
    mc->c.str_data = s.data;
    mc->c.str_off = s.off;
    f->index = mc;
    f->n = n;
    return 0;
}

/* Row count of a frame: the length of its index element. */
static int64_t element_len(hid_t g, const char *name)
{
    hid_t o = open_child(g, name);
    if (o < 0) return -1;
    hid_t ds = o;
    if (H5Iget_type(o) == H5I_GROUP) ds = open_child(o, "values");
    hssize_t np = -1;
    if (ds >= 0 && H5Iget_type(ds) == H5I_DATASET) {
        hid_t sp = H5Dget_space(ds);
        np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
        h5close(sp);
    }
    if (ds != o) h5close(ds);
    h5close(o);
    return (int64_t)np;
}

/* The frame group is absent: an index "0".."n-1" for the matrix's rows. */
static int frame_without_group(rd_t *r, const char *gname, int64_t expect_n, struct frame *f)
{
    /* Names "0".."n-1" take about 10 bytes a row: past this many rows
     * (a synthetic shape, not an atlas) they are not built, and the
     * matrix is served without names rather than the load running out
     * of memory. */
    if (expect_n > RANGE_INDEX_MAX)
        return iv_fail(r->err, IV_EUNSUPPORTED, "%s: no %s frame, and %lld rows are too many "
                       "to name 0..n-1 (at most %lld)", r->path, gname, (long long)expect_n,
                       (long long)RANGE_INDEX_MAX);
    return range_index(f, expect_n < 0 ? 0 : expect_n, r->err);
}

/* The name of the frame's index element (its _index attribute, if any). */
static int read_index_name(rd_t *r, hid_t g, const char *gname, char *idx_name, size_t cap)
{
    IV_TRY(read_attr_str(r, g, "_index", idx_name, cap));
    int64_t zero = 0;
    char w[300];
    snprintf(w, sizeof w, "%s.attrs['_index']", gname);
    return check_utf8(r, w, "name", idx_name, &zero, 1);
}

/* The index element: its length is the frame's rows, which must be the
 * matrix's (expect_n < 0: any), and it must hold strings. */
static int read_index(rd_t *r, hid_t g, const char *gname, const char *idx_name,
                      int64_t expect_n, struct frame *f)
{
    int64_t n = element_len(g, idx_name);
    IV_RETURN_IF(n < 0, r->err, IV_EBAD_FILE, "%s: %s: index '%s' is missing", r->path, gname,
                 idx_name);
    IV_RETURN_IF(expect_n >= 0 && n != expect_n, r->err, IV_EBAD_FILE,
                 "%s: %s has %lld rows but the matrix has %lld", r->path, gname, (long long)n,
                 (long long)expect_n);
    f->n = n;
    f->index = col_new(idx_name, "string-array");
    IV_RETURN_IF(!f->index, r->err, IV_ENOMEM, "out of memory");
    IV_TRY(read_element(r, g, gname, idx_name, n, &f->index->c));
    f->index->c.is_index = 1;
    IV_RETURN_IF(f->index->c.type != IV_COL_STRING, r->err, IV_EUNSUPPORTED,
                 "%s: %s/%s: a %s index is not supported", r->path, gname, idx_name,
                 iv_col_type_name(f->index->c.type));
    return 0;
}

/* column-order lists the columns; an empty list is written by h5py as an
 * empty float array, hence the class check. */
static int read_column_order(rd_t *r, hid_t g, const char *gname, sarena_t *order,
                             int64_t *n_order)
{
    if (H5Aexists(g, "column-order") <= 0) return 0;
    hid_t a = H5Aopen(g, "column-order", H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    int is_str = t >= 0 && H5Tget_class(t) == H5T_STRING;
    h5close(t);
    char w[300];
    snprintf(w, sizeof w, "%s.attrs['column-order']", gname);
    int rc = 0;
    if (is_str) rc = read_strings(r, a, 1, w, -1, order, n_order);
    h5close(a);
    if (rc == 0) rc = check_utf8(r, w, "column name", order->data, order->off, *n_order);
    return rc;
}

/* Each listed column, an unsupported one set aside. */
static int read_columns(rd_t *r, hid_t g, const char *gname, const sarena_t *order,
                        int64_t n_order, struct frame *f)
{
    for (int64_t i = 0; i < n_order; i++) {
        const char *name = order->data + order->off[i];
        struct mcol *mc = col_new(name, "array");
        if (!mc || frame_push(f, mc) < 0) {
            col_free(mc);
            return iv_fail(r->err, IV_ENOMEM, "out of memory");
        }
        IV_TRY(set_aside_unsupported(r, read_element(r, g, gname, name, f->n, &mc->c)));
    }
    return 0;
}

static int read_frame(rd_t *r, hid_t file, const char *gname, int64_t expect_n,
                      struct frame *f)
{
    memset(f, 0, sizeof(*f));
    iv_h5iso_stage(r->o, gname);
    hid_t g = open_child(file, gname);
    if (g < 0) return frame_without_group(r, gname, expect_n, f);
    int rc = 0;
    sarena_t order = {0};
    int64_t n_order = 0;
    char idx_name[256] = "_index";
    if (H5Iget_type(g) != H5I_GROUP) {
        rc = iv_fail(r->err, IV_EUNSUPPORTED, "%s: %s is not a group (pre-0.7 compound "
                     "data frames are not supported)", r->path, gname);
        goto done;
    }
    if ((rc = read_index_name(r, g, gname, idx_name, sizeof idx_name)) < 0) goto done;
    if ((rc = read_index(r, g, gname, idx_name, expect_n, f)) < 0) goto done;
    if ((rc = read_column_order(r, g, gname, &order, &n_order)) < 0) goto done;
    rc = read_columns(r, g, gname, &order, n_order, f);
done:
    sarena_drop(&order);
    h5close(g);
    if (rc < 0) frame_free(f);
    return rc;
}

static size_t frame_bytes(const struct frame *f)
{
    size_t b = f->index ? col_bytes(&f->index->c) + iv_names_bytes(atomic_load(&f->index->hash)) : 0;
    for (size_t i = 0; i < f->n_cols; i++)
        b += col_bytes(&f->cols[i]->c) + iv_names_bytes(atomic_load(&f->cols[i]->hash));
    return b;
}

/* ------------------------------------------------------------- public API */

/* Shape attribute of the matrix group; 1 when found. */
static int read_shape(hid_t file, const char *group, int64_t shape[2])
{
    hid_t g = open_child(file, group);
    if (g < 0) return 0;
    int ok = 0;
    if (H5Aexists(g, "shape") > 0) {
        hid_t a = H5Aopen(g, "shape", H5P_DEFAULT);
        hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
        if (sp >= 0 && H5Sget_simple_extent_npoints(sp) == 2 &&
            H5Aread(a, H5T_NATIVE_INT64, shape) >= 0)
            ok = 1;
        h5close(sp);
        h5close(a);
    }
    h5close(g);
    return ok;
}

static const char *index_get(const void *ctx, int64_t i)
{
    const iv_meta_col_t *c = ctx;
    if (c->mask && c->mask[i]) return NULL;
    return iv_meta_col_str(c, i);
}

static const char *cat_get(const void *ctx, int64_t i)
{
    const iv_meta_col_t *c = ctx;
    int32_t k = c->codes[i];
    return k < 0 ? NULL : iv_meta_col_cat(c, k);
}

/* ------------------------------------------ the load, across the process line */

/*
 * The frames are read in a reader process (see h5iso.h) and cross to the
 * server as bytes: per frame its row count, column count, the index and
 * the columns; per column its name, kind, flags and arrays (the mask, the
 * values of its type, the string arenas with their offsets).  The server
 * checks every length against the row count, every code against the
 * categories and every string offset against its arena before a column
 * is used: the bytes are trusted no more than the file.
 */
#define META_MAGIC 0x3154454d35485649ull   /* "IVH5MET1" */

static const char *const ENCODINGS[] = {"array", "categorical", "nullable-integer",
                                        "nullable-boolean", "nullable-string-array",
                                        "string-array", "computed"};
#define N_ENCODINGS (sizeof ENCODINGS / sizeof ENCODINGS[0])

/* Bytes of a sequential arena of n strings (sarena_push appends). */
static uint64_t arena_len(const char *data, const int64_t *off, int64_t n)
{
    return n > 0 ? (uint64_t)off[n - 1] + strlen(data + off[n - 1]) + 1 : 0;
}

static int put_arena(iv_h5iso_out_t *o, const char *data, const int64_t *off, int64_t n)
{
    IV_TRY(iv_h5iso_put_blob(o, data, arena_len(data, off, n)));
    return iv_h5iso_put_blob(o, off, (uint64_t)n * 8);
}

static int put_col(iv_h5iso_out_t *o, const iv_meta_col_t *c)
{
    uint64_t enc = 0;
    for (size_t i = 0; c->encoding && i < N_ENCODINGS; i++)
        if (strcmp(c->encoding, ENCODINGS[i]) == 0) enc = i;
    IV_TRY(iv_h5iso_put_blob(o, c->name, strlen(c->name) + 1));
    uint64_t h[] = {(uint64_t)c->type, enc, (uint64_t)c->dtype, (uint64_t)c->nullable,
                    (uint64_t)c->is_index, (uint64_t)c->n, (uint64_t)c->ordered,
                    (uint64_t)c->cats_numeric, (uint64_t)c->n_cats};
    IV_TRY(iv_h5iso_put(o, h, sizeof h));
    IV_TRY(iv_h5iso_put_blob(o, c->mask, c->mask ? (uint64_t)c->n : 0));
    switch (c->type) {
    case IV_COL_INT: return iv_h5iso_put_blob(o, c->i64, (uint64_t)c->n * 8);
    case IV_COL_FLOAT: return iv_h5iso_put_blob(o, c->f64, (uint64_t)c->n * 8);
    case IV_COL_BOOL: return iv_h5iso_put_blob(o, c->b, (uint64_t)c->n);
    case IV_COL_STRING: return put_arena(o, c->str_data, c->str_off, c->n);
    case IV_COL_CATEGORICAL:
        IV_TRY(iv_h5iso_put_blob(o, c->codes, (uint64_t)c->n * 4));
        IV_TRY(put_arena(o, c->cat_data, c->cat_off, c->n_cats));
        return iv_h5iso_put_blob(o, c->cat_num, c->cat_num ? (uint64_t)c->n_cats * 8 : 0);
    }
    return IV_EINTERNAL;
}

static int put_frame(iv_h5iso_out_t *o, const struct frame *f)
{
    IV_TRY(iv_h5iso_put_u64(o, (uint64_t)f->n));
    IV_TRY(iv_h5iso_put_u64(o, (uint64_t)f->n_cols));
    IV_TRY(put_col(o, &f->index->c));
    for (size_t i = 0; i < f->n_cols; i++) IV_TRY(put_col(o, &f->cols[i]->c));
    return 0;
}

struct meta_ctx {
    const char *path, *x_group;
    const char *frame[2];     /* the obs and var groups; NULL: an empty frame */
};

/* A column behind a filter this process cannot decode is named with its
 * filter before a read fails on it (IV_EUNSUPPORTED: the matrix's load,
 * and pack's and export's own check, refuse the file). */
static int check_frame_filters(hid_t file, const struct meta_ctx *mc, iv_err_t *err)
{
    int rc = 0;
    for (int a = 0; a < 2 && rc == 0; a++) {
        hid_t g = -1;
        H5E_BEGIN_TRY
        {
            if (mc->frame[a]) g = H5Gopen2(file, mc->frame[a], H5P_DEFAULT);
        }
        H5E_END_TRY;
        if (g >= 0) rc = iv_h5_check_filters(g, mc->path, err);
        h5close(g);
    }
    return rc;
}

/* Both frames, each sized by the matrix's shape when it has one; an
 * absent frame (NULL name) is an empty index. */
static int read_frames(rd_t *r, hid_t file, const struct meta_ctx *mc, struct frame ax[2])
{
    int64_t shape[2] = {-1, -1};
    iv_h5iso_stage(r->o, mc->x_group);
    if (!read_shape(file, mc->x_group, shape)) shape[0] = shape[1] = -1;
    int rc = 0;
    /* Library error stacks would be printed for every optional probe
     * that fails; messages go into err instead. */
    H5E_BEGIN_TRY
    {
        for (int a = 0; a < 2 && rc == 0; a++)
            rc = set_aside_unsupported(r, mc->frame[a] ? read_frame(r, file, mc->frame[a], shape[a], &ax[a])
                                                       : range_index(&ax[a], 0, r->err));
    }
    H5E_END_TRY;
    return rc;
}

/* The HDF5 side of iv_meta_load; runs in the reader process. */
static int meta_child(void *vctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    const struct meta_ctx *mc = vctx;
    const char *path = mc->path;
    rd_t r = {path, err, o, {0}};
    /* No HDF5 error stack on stderr: messages go into err, and stdio is
     * best left alone in a forked child. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* Compressed metadata columns read through the project's own zstd and
     * Blosc2 decoders; registering is idempotent. */
    if (iv_h5filters_register() < 0)
        return iv_fail(err, IV_EINTERNAL, "%s: cannot register HDF5 filters", path);
    struct frame ax[2];
    memset(ax, 0, sizeof ax);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    hid_t file = -1;
    H5E_BEGIN_TRY
    {
        file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    }
    H5E_END_TRY;
    h5close(fapl);
    if (file < 0) return iv_fail(err, IV_EIO, "%s: cannot open as HDF5", path);
    iv_h5iso_stage(o, "the filter pipelines");
    int rc = check_frame_filters(file, mc, err);
    if (rc < 0) {
        h5close(file);
        return rc;
    }
    rc = read_frames(&r, file, mc, ax);
    h5close(file);
    if (rc == 0 && r.unsupported.code) rc = iv_fail(err, r.unsupported.code, "%s", r.unsupported.msg);
    iv_h5iso_stage(o, "the metadata's results");
    if (rc == 0 && (iv_h5iso_put_u64(o, META_MAGIC) < 0 || put_frame(o, &ax[0]) < 0 || put_frame(o, &ax[1]) < 0))
        rc = iv_fail(err, IV_EIO, "%s: cannot pass the metadata to the server", path);
    frame_free(&ax[0]);
    frame_free(&ax[1]);
    return rc;
}

/* Whether p lies inside the answer r reads (an array used in place). */
static int in_answer(const iv_h5iso_rd_t *r, const void *p)
{
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)r->p;
    return r->p && a >= lo && a < lo + r->len;
}

/* The bytes at p (inside the answer): used in place when borrow (the
 * answer outlives the meta) and p is 8-aligned (iv_h5iso_put_blob pads
 * blobs), else copied (one byte at least allocated); NULL with *oom when
 * out of memory. */
static const void *keep_bytes(const iv_h5iso_rd_t *r, const void *p, size_t bytes, int borrow,
                              int *oom)
{
    if (borrow && ((uintptr_t)p & 7) == 0 && in_answer(r, p)) return p;
    void *a = malloc(bytes ? bytes : 1);
    if (!a) *oom = 1;
    else if (bytes) memcpy(a, p, bytes);
    return a;
}

/* Frees what keep_bytes copied (not what it left in the answer). */
static void drop_bytes(const iv_h5iso_rd_t *r, const void *p)
{
    if (!in_answer(r, p)) free((void *)p);
}

/* A blob of exactly n elements of esz bytes, kept (keep_bytes); NULL
 * with r->bad on a malformed answer or *oom on memory. */
static const void *take_array(iv_h5iso_rd_t *r, uint64_t n, size_t esz, int borrow, int *oom)
{
    if (n > ((uint64_t)1 << 48)) {
        r->bad = 1;
        return NULL;
    }
    size_t bytes = (size_t)n * esz;
    const void *p = iv_h5iso_rd_blob(r, bytes, NULL);
    if (!p) return NULL;
    return keep_bytes(r, p, bytes, borrow, oom);
}

/* An arena of n strings and its offsets; every offset must fall inside
 * the arena, which must end with a NUL, so that each string ends in it. */
static int take_arena(iv_h5iso_rd_t *r, int64_t n, const char **data, const int64_t **off,
                      int borrow, int *oom)
{
    size_t len = 0;
    const char *d = iv_h5iso_rd_blob(r, (size_t)-1, &len);
    const int64_t *o = take_array(r, (uint64_t)n, 8, borrow, oom);
    int bad = r->bad || *oom || (n > 0) != (len > 0) || (len > 0 && d[len - 1] != '\0');
    for (int64_t i = 0; !bad && i < n; i++)
        bad = o[i] < 0 || (uint64_t)o[i] >= len;
    if (bad) {
        drop_bytes(r, o);
        if (!*oom) r->bad = 1;
        return -1;
    }
    const char *copy = len ? keep_bytes(r, d, len, borrow, oom) : calloc(1, 1);
    if (!copy) {
        drop_bytes(r, o);
        *oom = 1;
        return -1;
    }
    *data = copy;
    *off = o;
    return 0;
}

static int bytes_are_bool(const uint8_t *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 1) return 0;
    return 1;
}

/* A column's name and nine-word header, checked against n rows: the
 * name, or NULL with r->bad. */
static const char *take_col_header(iv_h5iso_rd_t *r, int64_t n, uint64_t h[9])
{
    size_t nl = 0;
    const char *name = iv_h5iso_rd_blob(r, (size_t)-1, &nl);
    const uint64_t *hp = iv_h5iso_rd_raw(r, 9 * 8);
    if (!name || !hp || nl == 0 || name[nl - 1] != '\0') {
        r->bad = 1;
        return NULL;
    }
    memcpy(h, hp, 9 * 8);
    if (h[0] > IV_COL_STRING || h[1] >= N_ENCODINGS || h[2] >= IV_DT_COUNT ||
        h[5] != (uint64_t)n || h[8] > INT32_MAX) {
        r->bad = 1;
        return NULL;
    }
    return name;
}

/* The missing mask: empty, or n bytes of 0 and 1. */
static void take_mask(iv_h5iso_rd_t *r, iv_meta_col_t *c, int64_t n, int borrow, int *oom)
{
    size_t ml = 0;
    const uint8_t *mask = iv_h5iso_rd_blob(r, (size_t)-1, &ml);
    if (!mask || (ml != 0 && ml != (size_t)n) || !bytes_are_bool(mask, (int64_t)ml)) {
        r->bad = 1;
        return;
    }
    if (!ml) return;
    int64_t k = 0;
    for (size_t i = 0; i < ml; i++) k += mask[i];
    c->null_count = k;
    if (k) c->mask = keep_bytes(r, mask, ml, borrow, oom);
}

/* The categories' numbers: n_cats doubles when they are numeric, else
 * an empty blob. */
static void take_cat_numbers(iv_h5iso_rd_t *r, iv_meta_col_t *c, int borrow, int *oom)
{
    size_t cl = 0;
    const void *num = iv_h5iso_rd_blob(r, (size_t)-1, &cl);
    if (!num || cl != (c->cats_numeric ? (size_t)c->n_cats * 8 : 0)) {
        r->bad = 1;
        return;
    }
    if (!c->cats_numeric) return;
    c->cat_num = keep_bytes(r, num, cl, borrow, oom);
}

/* Codes index the categories: each is checked, and the counts are made
 * here rather than taken. */
static void count_codes(iv_h5iso_rd_t *r, iv_meta_col_t *c, int *oom)
{
    int64_t *counts = calloc((size_t)(c->n_cats ? c->n_cats : 1), sizeof(int64_t));
    if (!counts) {
        *oom = 1;
        return;
    }
    c->cat_counts = counts;
    for (int64_t i = 0; i < c->n; i++) {
        if (c->codes[i] < -1 || c->codes[i] >= c->n_cats) {
            r->bad = 1;
            return;
        }
        if (c->codes[i] >= 0) counts[c->codes[i]]++;
    }
}

/* A categorical's codes, categories and their numbers. */
static void take_categorical(iv_h5iso_rd_t *r, iv_meta_col_t *c, int64_t n_cats, int borrow,
                             int *oom)
{
    c->n_cats = n_cats;
    c->codes = take_array(r, (uint64_t)c->n, 4, borrow, oom);
    if (!c->codes || take_arena(r, c->n_cats, &c->cat_data, &c->cat_off, borrow, oom) < 0) return;
    take_cat_numbers(r, c, borrow, oom);
    if (!r->bad && !*oom) count_codes(r, c, oom);
}

/* The column's values, by its type. */
static void take_values(iv_h5iso_rd_t *r, iv_meta_col_t *c, int64_t n_cats, int borrow, int *oom)
{
    int64_t n = c->n;
    switch (c->type) {
    case IV_COL_INT: c->i64 = take_array(r, (uint64_t)n, 8, borrow, oom); break;
    case IV_COL_FLOAT: c->f64 = take_array(r, (uint64_t)n, 8, borrow, oom); break;
    case IV_COL_BOOL:
        c->b = take_array(r, (uint64_t)n, 1, borrow, oom);
        if (c->b && !bytes_are_bool(c->b, n)) r->bad = 1;
        break;
    case IV_COL_STRING: take_arena(r, n, &c->str_data, &c->str_off, borrow, oom); break;
    case IV_COL_CATEGORICAL: take_categorical(r, c, n_cats, borrow, oom); break;
    }
}

/* One column of n rows; NULL on a malformed answer (r->bad) or *oom. */
static struct mcol *take_col(iv_h5iso_rd_t *r, int64_t n, int borrow, int *oom)
{
    uint64_t h[9];
    const char *name = take_col_header(r, n, h);
    if (!name) return NULL;
    struct mcol *mc = col_new(name, ENCODINGS[h[1]]);
    if (!mc) {
        *oom = 1;
        return NULL;
    }
    if (borrow) {
        mc->lo = (uintptr_t)r->p;
        mc->hi = (uintptr_t)r->p + r->len;
    }
    iv_meta_col_t *c = &mc->c;
    c->type = (iv_col_type_t)h[0];
    c->dtype = (iv_dtype_t)h[2];
    c->nullable = h[3] != 0;
    c->is_index = h[4] != 0;
    c->n = n;
    c->ordered = h[6] != 0;
    c->cats_numeric = h[7] != 0;
    take_mask(r, c, n, borrow, oom);
    if (!r->bad && !*oom) take_values(r, c, (int64_t)h[8], borrow, oom);
    if (!r->bad && !*oom) return mc;
    col_free(mc);
    return NULL;
}

/* The frame's n_cols columns after its index; stops at a malformed
 * answer (r->bad) or *oom. */
static void take_cols(iv_h5iso_rd_t *r, uint64_t n_cols, struct frame *f, int borrow, int *oom)
{
    for (uint64_t i = 0; !r->bad && !*oom && i < n_cols; i++) {
        struct mcol *mc = take_col(r, f->n, borrow, oom);
        if (mc && frame_push(f, mc) < 0) {
            col_free(mc);
            *oom = 1;
        }
    }
}

static int take_frame(iv_h5iso_rd_t *r, const char *path, const char *gname, struct frame *f,
                      int borrow, iv_err_t *err)
{
    memset(f, 0, sizeof *f);
    uint64_t n = iv_h5iso_rd_u64(r), n_cols = iv_h5iso_rd_u64(r);
    int oom = 0;
    if (r->bad || n > ((uint64_t)1 << 40) || n_cols > r->len) r->bad = 1;
    else f->n = (int64_t)n;
    if (!r->bad) f->index = take_col(r, f->n, borrow, &oom);
    if (f->index && (f->index->c.type != IV_COL_STRING || !f->index->c.is_index)) r->bad = 1;
    if (!r->bad) take_cols(r, n_cols, f, borrow, &oom);
    if (!r->bad && !oom) return 0;
    frame_free(f);
    if (oom) return iv_fail(err, IV_ENOMEM, "%s: %s: out of memory", path, gname);
    return iv_fail(err, IV_EBAD_FILE, "%s: %s: the HDF5 reader's answer is malformed", path,
                   gname);
}

static int take_meta(const char *path, const iv_h5iso_result_t *res, iv_meta_t *m, int borrow,
                     iv_err_t *err);

int iv_meta_load(const char *path, const char *x_group, iv_meta_t **out, iv_err_t *err)
{
    return iv_meta_load_groups(path, x_group, "obs", "var", out, err);
}

static iv_meta_t *meta_new(void)
{
    iv_meta_t *m = calloc(1, sizeof(*m));
    if (m) pthread_mutex_init(&m->lock, NULL);
    return m;
}

/* The reader process's answer for path's frames, in *res (mapped). */
static int read_answer(const char *path, const char *x_group, const char *obs_group,
                       const char *var_group, iv_h5iso_result_t *res, iv_err_t *err)
{
    struct meta_ctx mc = {path, x_group && *x_group ? x_group : "X", {obs_group, var_group}};
    return iv_h5iso_run(path, meta_child, &mc, NULL, NULL, res, err);
}

/* A meta over the answer at map (map_len bytes, answer inside it), which
 * it takes over: its arrays are used in place and the map is unmapped
 * with the meta (or here, on error). */
static int meta_adopt(const char *path, void *map, size_t map_len, const iv_h5iso_result_t *answer,
                      double t0, iv_meta_t **out, iv_err_t *err)
{
    *out = NULL;
    iv_meta_t *m = meta_new();
    if (!m) {
        if (map) munmap(map, map_len);
        return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    }
    m->map = map;
    m->map_len = map_len;
    int rc = take_meta(path, answer, m, 1, err);
    if (rc < 0) {
        iv_meta_free(m);
        return rc;
    }
    m->stats.load_seconds = iv_now_s() - t0;
    *out = m;
    return 0;
}

int iv_meta_load_groups(const char *path, const char *x_group, const char *obs_group,
                        const char *var_group, iv_meta_t **out, iv_err_t *err)
{
    double t0 = iv_now_s();
    *out = NULL;
    iv_h5iso_result_t res;
    IV_TRY(read_answer(path, x_group, obs_group, var_group, &res, err));
    return meta_adopt(path, (void *)res.data, res.len, &res, t0, out, err);
}

/* The source's identity as stat gives it now, for a kept answer. */
static int source_id(const char *path, iv_file_id_t *id)
{
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    iv_file_id_of(&st, id);
    return 0;
}

int iv_meta_load_kept(const char *path, const char *x_group, iv_meta_keep_t *keep,
                      iv_meta_t **out, iv_err_t *err)
{
    double t0 = iv_now_s();
    *out = NULL;
    const char *group = x_group && *x_group ? x_group : "X";
    char key[IV_CACHEDIR_KEY_LEN], at[4400], kind[300];
    iv_file_id_t id;
    iv_err_t e;
    iv_err_clear(&e);
    snprintf(kind, sizeof kind, "%s.meta", group);
    for (char *p = kind; *p; p++)
        if (*p == '/') *p = '_';
    int can_keep = keep && keep->dir && keep->dir[0] && source_id(path, &id) == 0 &&
                   iv_cachedir_key(path, key, &e) == 0 &&
                   iv_cachedir_path(keep->dir, path, key, kind, at, sizeof at, &e) == 0;
    if (keep) snprintf(keep->note, sizeof keep->note, "read (none kept)");
    const char *why = "none kept";   /* why a kept answer was passed over */
    if (can_keep) {
        iv_metafile_t mf;
        int got = iv_metafile_open(at, &id, group, &mf, &why, err);
        if (got < 0) return got;
        if (got == 1) {
            iv_h5iso_result_t kept = {mf.answer, mf.answer_len};
            int rc = meta_adopt(path, mf.map, mf.len, &kept, t0, out, &e);
            if (rc == 0) {
                snprintf(keep->note, sizeof keep->note, "mapped from the cache folder");
                return 0;
            }
            if (rc == IV_ENOMEM) return iv_fail(err, rc, "%s", e.msg);
            why = "damaged";
        }
    }
    iv_h5iso_result_t res;
    IV_TRY(read_answer(path, group, "obs", "var", &res, err));
    IV_TRY(meta_adopt(path, (void *)res.data, res.len, &res, t0, out, err));
    /* Kept once taken (what the checks refuse is not kept); the take
     * leaves the answer as it was. */
    if (!can_keep || res.len < keep->min_bytes) return 0;
    int kept = iv_cachedir_prepare(keep->dir, &e) == 0 &&
               iv_cachedir_note(at, path, key, &e) == 0 &&
               iv_metafile_save(at, &id, group, res.data, res.len, &e) == 0;
    if (!kept)
        snprintf(keep->note, sizeof keep->note, "read (not kept: %.120s)", e.msg);
    else if (strcmp(why, "none kept") == 0)
        snprintf(keep->note, sizeof keep->note, "read and kept in the cache folder");
    else
        snprintf(keep->note, sizeof keep->note, "read (kept one %s) and kept again", why);
    return 0;
}

int iv_meta_validate_file(const char *path, const char *x_group, iv_err_t *err)
{
    iv_meta_t *m = NULL;
    /* The load reports a damaged element before an unsupported one, and
     * reads on past the latter: unsupported alone means nothing it reads
     * is damaged. */
    int rc = iv_meta_load(path, x_group, &m, err);
    iv_meta_free(m);
    if (rc == IV_EUNSUPPORTED) {
        iv_err_clear(err);
        rc = 0;
    }
    return rc;
}

int iv_meta_from_bytes(const char *path, const uint8_t *data, size_t len, iv_meta_t **out,
                       iv_err_t *err)
{
    *out = NULL;
    iv_meta_t *m = meta_new();
    IV_RETURN_IF(!m, err, IV_ENOMEM, "%s: out of memory", path);
    iv_h5iso_result_t res = {data, len};
    int rc = take_meta(path, &res, m, 0, err);
    if (rc < 0) {
        iv_meta_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* The reader's answer into m's frames, its arrays used in place when
 * borrow (the answer outlives m), else copied.  The var index's names
 * hash is built here; obs's, ten million names at an atlas's size, on
 * first use or by iv_meta_warm. */
static int take_meta(const char *path, const iv_h5iso_result_t *res, iv_meta_t *m, int borrow,
                     iv_err_t *err)
{
    int rc = 0;
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, res);
    if (iv_h5iso_rd_u64(&r) != META_MAGIC)
        rc = iv_fail(err, IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed", path);
    if (rc == 0) rc = take_frame(&r, path, "obs", &m->ax[IV_AXIS_OBS], borrow, err);
    if (rc == 0) rc = take_frame(&r, path, "var", &m->ax[IV_AXIS_VAR], borrow, err);
    if (rc == 0 && r.pos != r.len)
        rc = iv_fail(err, IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed", path);
    if (rc == 0) {
        struct mcol *ix = m->ax[IV_AXIS_VAR].index;
        iv_names_t *h = NULL;
        rc = iv_names_build(ix->c.n, index_get, &ix->c, &h, err);
        atomic_store(&ix->hash, h);
    }
    return rc;
}

void iv_meta_free(iv_meta_t *m)
{
    if (!m) return;
    frame_free(&m->ax[0]);
    frame_free(&m->ax[1]);
    if (m->map) munmap(m->map, m->map_len);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

int64_t iv_meta_n_rows(const iv_meta_t *m, iv_axis_t axis)
{
    return m->ax[axis == IV_AXIS_VAR].n;
}

size_t iv_meta_n_cols(const iv_meta_t *m, iv_axis_t axis)
{
    return m->ax[axis == IV_AXIS_VAR].n_cols;
}

const iv_meta_col_t *iv_meta_col(const iv_meta_t *m, iv_axis_t axis, size_t i)
{
    const struct frame *f = &m->ax[axis == IV_AXIS_VAR];
    return i < f->n_cols ? &f->cols[i]->c : NULL;
}

static struct mcol *find_mcol(const iv_meta_t *m, iv_axis_t axis, const char *name)
{
    const struct frame *f = &m->ax[axis == IV_AXIS_VAR];
    for (size_t i = 0; i < f->n_cols; i++)
        if (strcmp(f->cols[i]->c.name, name) == 0) return f->cols[i];
    if (f->index && strcmp(f->index->c.name, name) == 0) return f->index;
    return NULL;
}

const iv_meta_col_t *iv_meta_find_col(const iv_meta_t *m, iv_axis_t axis, const char *name)
{
    struct mcol *mc = find_mcol(m, axis, name);
    return mc ? &mc->c : NULL;
}

const iv_meta_col_t *iv_meta_index(const iv_meta_t *m, iv_axis_t axis)
{
    const struct frame *f = &m->ax[axis == IV_AXIS_VAR];
    return f->index ? &f->index->c : NULL;
}

void iv_meta_stats(const iv_meta_t *m, iv_meta_stats_t *out)
{
    *out = m->stats;
    out->bytes = sizeof(*m) + frame_bytes(&m->ax[0]) + frame_bytes(&m->ax[1]);
}

/* ------------------------------------------------------- computed columns */

static int64_t get_i64(iv_dtype_t t, const void *base, int64_t i)
{
    const char *p = (const char *)base + (size_t)i * iv_dtype_size(t);
    switch (t) {
    case IV_DT_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
    case IV_DT_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case IV_DT_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case IV_DT_INT64: { int64_t v; memcpy(&v, p, 8); return v; }
    case IV_DT_UINT8: { uint8_t v; memcpy(&v, p, 1); return v; }
    case IV_DT_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case IV_DT_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case IV_DT_UINT64: { uint64_t v; memcpy(&v, p, 8); return v > INT64_MAX ? INT64_MAX : (int64_t)v; }
    default: return 0;
    }
}

static int add_computed_col(struct frame *f, const char *base, iv_col_type_t type,
                            void *vals, uint8_t *mask, iv_dtype_t dt, iv_err_t *err)
{
    char name[64];
    snprintf(name, sizeof name, "%s", base);
    for (size_t i = 0; i < f->n_cols; i++) {
        if (strcmp(f->cols[i]->c.name, name) == 0) {
            snprintf(name, sizeof name, "iv_%s", base);
            break;
        }
    }
    struct mcol *mc = col_new(name, "computed");
    if (!mc || frame_push(f, mc) < 0) {
        col_free(mc);
        free(vals);
        free(mask);
        return iv_fail(err, IV_ENOMEM, "computed column %s: out of memory", base);
    }
    mc->c.type = type;
    mc->c.n = f->n;
    mc->c.computed = 1;
    mc->c.dtype = dt;
    if (type == IV_COL_INT) mc->c.i64 = vals;
    else mc->c.f64 = vals;
    if (type == IV_COL_FLOAT) mc->c.nullable = 1;
    set_mask(&mc->c, mask);
    return 0;
}

/* The computed columns' arrays, one entry a major slice; the masks only
 * for float values. */
typedef struct computed {
    void *tot, *mx;
    int64_t *nnz;
    uint8_t *tmask, *mmask;
} computed_t;

static void computed_free(computed_t *c)
{
    free(c->tot), free(c->mx), free(c->nnz), free(c->tmask), free(c->mmask);
}

static int computed_alloc(computed_t *c, int64_t n_major, int is_float)
{
    size_t cnt = (size_t)(n_major ? n_major : 1);
    c->tot = malloc(cnt * 8);
    c->mx = malloc(cnt * 8);
    c->nnz = malloc(cnt * 8);
    c->tmask = is_float ? calloc(cnt, 1) : NULL;
    c->mmask = is_float ? calloc(cnt, 1) : NULL;
    if (c->tot && c->mx && c->nnz && (!is_float || (c->tmask && c->mmask))) return 0;
    computed_free(c);
    return IV_ENOMEM;
}

/* Total and maximum of float slice i, unique values [g0, g1).  max_count
 * is the maximum of the dense slice: implicit zeros take part unless
 * every minor position is stored. */
static inline void float_slice(computed_t *c, int64_t i, iv_dtype_t vt, const void *values,
                               const int64_t *value_ptr, int64_t g0, int64_t g1, int dense,
                               int64_t n_minor)
{
    double s = 0, best = dense ? -INFINITY : 0;
    int nan = 0;
    for (int64_t k = g0; k < g1; k++) {
        double v = iv_dtype_get_f64(vt, values, (size_t)k);
        s += v * (double)(value_ptr[k + 1] - value_ptr[k]);
        if (isnan(v)) nan = 1;
        else if (v > best) best = v;
    }
    if (n_minor == 0 || (dense && g0 == g1)) best = 0;
    ((double *)c->tot)[i] = s;
    ((double *)c->mx)[i] = nan ? NAN : best;
    c->tmask[i] = isnan(s) != 0;
    c->mmask[i] = (uint8_t)nan;
}

/* float_slice for integer values. */
static inline void int_slice(computed_t *c, int64_t i, iv_dtype_t vt, const void *values,
                             const int64_t *value_ptr, int64_t g0, int64_t g1, int dense,
                             int64_t n_minor)
{
    int64_t s = 0, best = dense ? INT64_MIN : 0;
    for (int64_t k = g0; k < g1; k++) {
        int64_t v = get_i64(vt, values, k);
        s += v * (value_ptr[k + 1] - value_ptr[k]);
        if (v > best) best = v;
    }
    if (n_minor == 0 || (dense && g0 == g1)) best = 0;
    ((int64_t *)c->tot)[i] = s;
    ((int64_t *)c->mx)[i] = best;
}

/* The slices of one block of compute_slices, on any thread. */
typedef struct slice_blocks {
    computed_t *c;
    int64_t n_major, n_minor, n_unique;
    const int64_t *major_ptr, *value_ptr;
    const void *values;
    iv_dtype_t vt;
    int is_float;
    _Atomic int64_t bad;      /* the lowest slice whose pointers are wrong; n_major: none */
} slice_blocks_t;

#define SLICE_BLOCK 65536

static void slice_block(void *arg, size_t b)
{
    slice_blocks_t *sb = arg;
    computed_t *c = sb->c;
    int64_t i0 = (int64_t)b * SLICE_BLOCK;
    int64_t i1 = i0 + SLICE_BLOCK < sb->n_major ? i0 + SLICE_BLOCK : sb->n_major;
    const int64_t *major_ptr = sb->major_ptr, *value_ptr = sb->value_ptr;
    for (int64_t i = i0; i < i1; i++) {
        int64_t g0 = major_ptr[i], g1 = major_ptr[i + 1];
        if (g0 < 0 || g1 < g0 || g1 > sb->n_unique || value_ptr[g1] < value_ptr[g0]) {
            int64_t seen = atomic_load(&sb->bad);
            while (i < seen && !atomic_compare_exchange_weak(&sb->bad, &seen, i)) {}
            return;
        }
        int64_t cnt_i = value_ptr[g1] - value_ptr[g0];
        c->nnz[i] = cnt_i;
        int dense = cnt_i >= sb->n_minor;
        if (sb->is_float)
            float_slice(c, i, sb->vt, sb->values, value_ptr, g0, g1, dense, sb->n_minor);
        else
            int_slice(c, i, sb->vt, sb->values, value_ptr, g0, g1, dense, sb->n_minor);
    }
}

/* Every slice's stored count, total and maximum, in blocks of slices on
 * pool's workers (NULL: this thread). */
static int compute_slices(computed_t *c, int64_t n_major, int64_t n_minor,
                          const int64_t *major_ptr, const int64_t *value_ptr, int64_t n_unique,
                          const void *values, iv_dtype_t vt, int is_float, iv_pool_t *pool,
                          iv_err_t *err)
{
    slice_blocks_t sb = {c, n_major, n_minor, n_unique, major_ptr, value_ptr, values, vt,
                         is_float, n_major};
    size_t blocks = (size_t)((n_major + SLICE_BLOCK - 1) / SLICE_BLOCK);
    iv_pool_parallel_for(pool, blocks, 0, slice_block, &sb);
    int64_t bad = atomic_load(&sb.bad);
    if (bad < n_major)
        return iv_fail(err, IV_EBAD_FILE, "computed columns: pointers of slice %lld are "
                       "not monotone", (long long)bad);
    return 0;
}

/* Adds the three columns to f, which takes the arrays (freed on error). */
static int attach_computed(struct frame *f, computed_t *c, iv_orient_t orient, int is_float,
                           iv_err_t *err)
{
    iv_col_type_t vtype = is_float ? IV_COL_FLOAT : IV_COL_INT;
    iv_dtype_t vdt = is_float ? IV_DT_FLOAT64 : IV_DT_INT64;
    int rc = add_computed_col(f, "total_counts", vtype, c->tot, c->tmask, vdt, err);
    if (rc == 0)
        rc = add_computed_col(f, orient == IV_IVCSC ? "n_cells" : "n_genes", IV_COL_INT, c->nnz,
                              NULL, IV_DT_INT64, err);
    else
        free(c->nnz);
    if (rc == 0) rc = add_computed_col(f, "max_count", vtype, c->mx, c->mmask, vdt, err);
    else free(c->mx), free(c->mmask);
    return rc;
}

static int add_computed(iv_meta_t *m, iv_orient_t orient, int64_t n_major, int64_t n_minor,
                        const int64_t *major_ptr, const int64_t *value_ptr, int64_t n_unique,
                        const void *values, iv_dtype_t vt, iv_pool_t *pool, iv_err_t *err)
{
    double t0 = iv_now_s();
    struct frame *f = &m->ax[orient == IV_IVCSC ? IV_AXIS_VAR : IV_AXIS_OBS];
    IV_RETURN_IF(f->n != n_major, err, IV_EBAD_FILE,
                 "computed columns: %s has %lld rows but the matrix has %lld major slices",
                 orient == IV_IVCSC ? "var" : "obs", (long long)f->n, (long long)n_major);
    IV_RETURN_IF(vt >= IV_DT_COUNT, err, IV_EINVALID_ARG, "computed columns: bad dtype");
    /* The dataset validated these pointers already; checking again costs
     * one pass and keeps this function safe on its own. */
    IV_RETURN_IF(major_ptr[0] != 0 || major_ptr[n_major] != n_unique || value_ptr[0] != 0,
                 err, IV_EBAD_FILE, "computed columns: pointer arrays do not span the values");
    int is_float = vt == IV_DT_FLOAT32 || vt == IV_DT_FLOAT64;
    computed_t c;
    IV_RETURN_IF(computed_alloc(&c, n_major, is_float) < 0, err, IV_ENOMEM,
                 "computed columns: out of memory");
    int rc = compute_slices(&c, n_major, n_minor, major_ptr, value_ptr, n_unique, values, vt,
                            is_float, pool, err);
    if (rc < 0) {
        computed_free(&c);
        return rc;
    }
    rc = attach_computed(f, &c, orient, is_float, err);
    m->stats.computed_seconds += iv_now_s() - t0;
    return rc;
}

int iv_meta_add_computed_arrays(iv_meta_t *m, iv_orient_t orient, int64_t n_major,
                                int64_t n_minor, const int64_t *major_ptr,
                                const int64_t *value_ptr, int64_t n_unique,
                                const void *values, iv_dtype_t vt, iv_err_t *err)
{
    return add_computed(m, orient, n_major, n_minor, major_ptr, value_ptr, n_unique, values, vt,
                        NULL, err);
}

int iv_meta_add_computed(iv_meta_t *m, const iv_dataset_t *ds, iv_pool_t *pool, iv_err_t *err)
{
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    return add_computed(m, in->orient, in->n_major, in->n_minor, iv_dataset_major_ptr(ds),
                        iv_dataset_value_ptr(ds), in->n_unique, iv_dataset_values(ds),
                        in->value_dtype, pool, err);
}

/* ----------------------------------------------------------- name lookups */

void iv_names_report_free(iv_names_report_t *r)
{
    if (!r) return;
    free(r->missing);
    free(r->folded);
    free(r->ambiguous);
    memset(r, 0, sizeof(*r));
}

/* The names index of a column, built on first use under the lock. */
static int column_hash(iv_meta_t *m, struct mcol *mc, const iv_names_t **out, iv_err_t *err)
{
    /* Built once: the lock keeps two first lookups from building it
     * twice; a lookup that finds it built takes no lock, and one that
     * waits is a lookup of the same column, never /metrics or a
     * document (iv_meta_stats reads the published pointer). */
    iv_names_t *h = atomic_load_explicit(&mc->hash, memory_order_acquire);
    int rc = 0;
    if (!h) {
        pthread_mutex_lock(&m->lock);
        h = atomic_load_explicit(&mc->hash, memory_order_relaxed);
        if (!h) {
            iv_names_get_fn get = mc->c.type == IV_COL_CATEGORICAL ? cat_get : index_get;
            rc = iv_names_build(mc->c.n, get, &mc->c, &h, err);
            if (rc == 0) atomic_store_explicit(&mc->hash, h, memory_order_release);
        }
        pthread_mutex_unlock(&m->lock);
    }
    *out = h;
    return rc;
}

int iv_meta_warm(iv_meta_t *m, iv_err_t *err)
{
    const iv_names_t *h;
    for (int a = 0; a < 2; a++)
        IV_TRY(column_hash(m, m->ax[a].index, &h, err));
    return 0;
}

/* The column names are looked up in: the index, or a string or
 * categorical column; NULL with an error otherwise. */
static struct mcol *names_column(iv_meta_t *m, iv_axis_t axis, const char *by_column,
                                 iv_err_t *err)
{
    const char *axname = axis == IV_AXIS_VAR ? "var" : "obs";
    struct mcol *mc = by_column ? find_mcol(m, axis, by_column) : m->ax[axis == IV_AXIS_VAR].index;
    if (!mc) {
        iv_fail(err, IV_EBAD_SELECTION, "unknown %s column '%s' for names lookup", axname,
                by_column);
        return NULL;
    }
    if (mc->c.type != IV_COL_STRING && mc->c.type != IV_COL_CATEGORICAL) {
        iv_fail(err, IV_EBAD_SELECTION, "%s column '%s' holds %s values, not names", axname,
                mc->c.name, iv_col_type_name(mc->c.type));
        return NULL;
    }
    return mc;
}

/* Finds each name, exactly or else case-folded, noting in R which were
 * folded, ambiguous or missing (-1 in out_idx). */
static void look_up_names(const iv_names_t *h, const char *const *names, int64_t n,
                          int64_t *out_idx, iv_names_report_t *R)
{
    for (int64_t i = 0; i < n; i++) {
        const char *s = names[i] ? names[i] : "";
        size_t len = strlen(s);
        int64_t row = iv_names_find(h, s, len);
        if (row < 0) {
            row = iv_names_find_fold(h, s, len);
            if (row >= 0) R->folded[R->n_folded++] = i;
            else if (row == -2) R->ambiguous[R->n_ambiguous++] = i;
        }
        if (row < 0) {
            R->missing[R->n_missing++] = i;
            row = -1;
        } else {
            R->n_found++;
        }
        out_idx[i] = row;
    }
}

/* The first missing names, quoted, for a message of cap bytes. */
static void list_missing(char *list, size_t cap, const char *const *names,
                         const iv_names_report_t *R)
{
    size_t len = 0;
    list[0] = '\0';
    for (int64_t k = 0; k < R->n_missing && len < cap - 40; k++) {
        int w = snprintf(list + len, cap - len, "%s'%.60s'", k ? ", " : "",
                         names[R->missing[k]] ? names[R->missing[k]] : "");
        if (w < 0) break;
        len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
        if (k + 1 < R->n_missing && len >= cap - 40) {
            snprintf(list + len, cap - len, ", ...");
            break;
        }
    }
}

/* The error for names not found. */
static int names_missing(iv_axis_t axis, const char *by_column, const char *const *names,
                         int64_t n, const iv_names_report_t *R, iv_err_t *err)
{
    char list[400];
    list_missing(list, sizeof list, names, R);
    if (by_column)
        return iv_fail(err, IV_EUNKNOWN_NAME, "%lld of %lld names not found in %s column "
                       "'%s': %s", (long long)R->n_missing, (long long)n,
                       axis == IV_AXIS_VAR ? "var" : "obs", by_column, list);
    return iv_fail(err, IV_EUNKNOWN_NAME, "%lld of %lld %s names not found: %s",
                   (long long)R->n_missing, (long long)n, axis == IV_AXIS_VAR ? "gene" : "cell",
                   list);
}

int iv_meta_find_names(iv_meta_t *m, iv_axis_t axis, const char *by_column,
                       const char *const *names, int64_t n, int allow_missing,
                       int64_t *out_idx, iv_names_report_t *rep, iv_err_t *err)
{
    iv_names_report_t local = {0};
    iv_names_report_t *R = rep ? rep : &local;
    memset(R, 0, sizeof(*R));
    struct mcol *mc = names_column(m, axis, by_column, err);
    if (!mc) return IV_EBAD_SELECTION;
    const iv_names_t *h = NULL;
    IV_TRY(column_hash(m, mc, &h, err));
    size_t cap = (size_t)(n > 0 ? n : 1);
    R->missing = malloc(cap * sizeof(int64_t));
    R->folded = malloc(cap * sizeof(int64_t));
    R->ambiguous = malloc(cap * sizeof(int64_t));
    if (!R->missing || !R->folded || !R->ambiguous) {
        iv_names_report_free(R);
        return iv_fail(err, IV_ENOMEM, "names lookup: out of memory");
    }
    look_up_names(h, names, n, out_idx, R);
    int rc = 0;
    if (R->n_missing > 0 && !allow_missing) rc = names_missing(axis, by_column, names, n, R, err);
    if (!rep) iv_names_report_free(&local);
    return rc;
}
