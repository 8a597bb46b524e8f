/*
 * Small HDF5 helpers shared by the readers (matrix, metadata, embeddings,
 * which run in the reader child process) and the writers (pack, export).
 */
#include "h5util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

int iv_h5_dtype_of(hid_t t, iv_dtype_t *out)
{
    H5T_class_t cls = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    if (cls == H5T_INTEGER) {
        int sgn = H5Tget_sign(t) == H5T_SGN_2;
        switch (sz) {
        case 1: *out = sgn ? IV_DT_INT8 : IV_DT_UINT8; return 0;
        case 2: *out = sgn ? IV_DT_INT16 : IV_DT_UINT16; return 0;
        case 4: *out = sgn ? IV_DT_INT32 : IV_DT_UINT32; return 0;
        case 8: *out = sgn ? IV_DT_INT64 : IV_DT_UINT64; return 0;
        }
    } else if (cls == H5T_FLOAT) {
        /* Only IEEE binary32/64 map exactly onto float/double. */
        if (sz == 4 && H5Tget_precision(t) == 32) { *out = IV_DT_FLOAT32; return 0; }
        if (sz == 8 && H5Tget_precision(t) == 64) { *out = IV_DT_FLOAT64; return 0; }
    }
    return -1;
}

hid_t iv_h5_native(iv_dtype_t t)
{
    switch (t) {
    case IV_DT_INT8: return H5T_NATIVE_INT8;
    case IV_DT_INT16: return H5T_NATIVE_INT16;
    case IV_DT_INT32: return H5T_NATIVE_INT32;
    case IV_DT_INT64: return H5T_NATIVE_INT64;
    case IV_DT_UINT8: return H5T_NATIVE_UINT8;
    case IV_DT_UINT16: return H5T_NATIVE_UINT16;
    case IV_DT_UINT32: return H5T_NATIVE_UINT32;
    case IV_DT_UINT64: return H5T_NATIVE_UINT64;
    case IV_DT_FLOAT32: return H5T_NATIVE_FLOAT;
    case IV_DT_FLOAT64: return H5T_NATIVE_DOUBLE;
    default: return -1;
    }
}

/* Attribute a's one variable-length string (file type t) into buf; *mt
 * gets the memory type, for the caller to close.  0 or -1. */
static int read_vl_str(hid_t a, hid_t t, hid_t *mt, char *buf, size_t cap)
{
    char *s = NULL;
    *mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(*mt, H5T_VARIABLE);
    H5Tset_cset(*mt, H5Tget_cset(t));
    if (H5Aread(a, *mt, &s) < 0) return -1;
    if (s) {
        snprintf(buf, cap, "%s", s);
        H5free_memory(s);
    }
    return 0;
}

/* read_vl_str for a fixed-length string. */
static int read_fixed_str(hid_t a, hid_t t, hid_t *mt, char *buf, size_t cap)
{
    size_t n = H5Tget_size(t);
    char *tmp = calloc(1, n + 1);
    if (!tmp) return -1;
    *mt = H5Tcopy(t);
    int rc = H5Aread(a, *mt, tmp) < 0 ? -1 : 0;
    if (rc == 0) snprintf(buf, cap, "%s", tmp);
    free(tmp);
    return rc;
}

int iv_h5_read_str_attr(hid_t obj, const char *name, char *buf, size_t cap)
{
    int rc = -1;
    hid_t a = -1, t = -1, mt = -1, sp = -1;
    buf[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return -1;
    if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0) goto done;
    if ((t = H5Aget_type(a)) < 0 || H5Tget_class(t) != H5T_STRING) goto done;
    if ((sp = H5Aget_space(a)) < 0 || H5Sget_simple_extent_npoints(sp) != 1) goto done;
    rc = H5Tis_variable_str(t) > 0 ? read_vl_str(a, t, &mt, buf, cap)
                                    : read_fixed_str(a, t, &mt, buf, cap);
done:
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* No codec the writers of .h5ad files use reaches this ratio: deflate
 * stops near 1,032:1, zstd's run-length blocks near 32,768:1, LZ4 and
 * Blosc's at a few hundred. */
#define MAX_PLAUSIBLE_RATIO 65536.0

/* A dataset's declared size against what it stores. */
typedef struct stored {
    const char *where;
    hid_t d, sp, dcpl;
    int rank, vlen;
    hsize_t dims[H5S_MAX_RANK];
    double declared;       /* bytes the shape declares */
    haddr_t stored;        /* bytes the file stores */
    char shape[160];       /* "D0 x D1 ..." for messages */
} stored_t;

static void format_shape(stored_t *st)
{
    int len = 0;
    for (int i = 0; i < st->rank && len < (int)sizeof st->shape - 24; i++)
        len += snprintf(st->shape + len, sizeof st->shape - (size_t)len, "%s%llu", i ? " x " : "",
                        (unsigned long long)st->dims[i]);
}

/* A contiguous dataset must store at least its declared bytes. */
static int check_contiguous(const stored_t *st, iv_err_t *err)
{
    if (!st->vlen && (double)st->stored < st->declared)
        return FAILF(IV_EBAD_FILE, "%s: declares %s values (%.0f bytes) but stores %llu bytes; "
                     "the shape is not what the file holds", st->where, st->shape, st->declared,
                     (unsigned long long)st->stored);
    return 0;
}

/* The number of chunks the shape needs, into *expected. */
static int expected_chunks(const stored_t *st, double *expected, iv_err_t *err)
{
    hsize_t cdims[H5S_MAX_RANK];
    if (H5Pget_chunk(st->dcpl, st->rank, cdims) != st->rank)
        return FAILF(IV_EBAD_FILE, "%s: chunk shape unreadable", st->where);
    *expected = 1;
    for (int i = 0; i < st->rank; i++) {
        if (cdims[i] == 0) return FAILF(IV_EBAD_FILE, "%s: a chunk dimension of 0", st->where);
        *expected *= (double)((st->dims[i] + cdims[i] - 1) / cdims[i]);
    }
    return 0;
}

/* A chunked dataset must store every chunk its shape needs, in no fewer
 * bytes than any codec could. */
static int check_chunked(const stored_t *st, iv_err_t *err)
{
    double expected = 1;
    IV_TRY(expected_chunks(st, &expected, err));
    hsize_t have = 0;
    if (H5Dget_num_chunks(st->d, st->sp, &have) < 0)
        return FAILF(IV_EBAD_FILE, "%s: chunk index unreadable", st->where);
    if ((double)have < expected)
        return FAILF(IV_EBAD_FILE, "%s: declares %s values but stores %llu of its %.0f chunks; "
                     "the shape is not what the file holds", st->where, st->shape,
                     (unsigned long long)have, expected);
    if (!st->vlen && st->declared > MAX_PLAUSIBLE_RATIO * (double)(st->stored ? st->stored : 1))
        return FAILF(IV_EBAD_FILE, "%s: declares %s values (%.0f bytes) in %llu stored bytes, "
                     "a compression ratio past any codec's; the shape is not what the file "
                     "holds", st->where, st->shape, st->declared, (unsigned long long)st->stored);
    return 0;
}

/* Reads the dataspace into st, and its number of elements into *n. */
static int read_extent(stored_t *st, double *n, iv_err_t *err)
{
    st->rank = H5Sget_simple_extent_ndims(st->sp);
    if (st->rank < 0 || st->rank > H5S_MAX_RANK ||
        (st->rank > 0 && H5Sget_simple_extent_dims(st->sp, st->dims, NULL) < 0))
        return FAILF(IV_EBAD_FILE, "%s: dataspace unreadable", st->where);
    *n = 1;
    for (int i = 0; i < st->rank; i++) *n *= (double)st->dims[i];
    return 0;
}

/* The checks on a dataset with its header open; an empty one passes. */
static int check_extent_stored(stored_t *st, hid_t ft, iv_err_t *err)
{
    double n = 0;
    IV_TRY(read_extent(st, &n, err));
    if (n == 0) return 0;
    st->vlen = H5Tdetect_class(ft, H5T_VLEN) > 0 || H5Tis_variable_str(ft) > 0;
    st->declared = n * (double)H5Tget_size(ft);
    format_shape(st);
    H5D_layout_t layout = H5Pget_layout(st->dcpl);
    st->stored = H5Dget_storage_size(st->d);
    if (layout == H5D_CONTIGUOUS) return check_contiguous(st, err);
    if (layout == H5D_CHUNKED) return check_chunked(st, err);
    return 0;
}

int iv_h5_check_stored(hid_t d, const char *where, iv_err_t *err)
{
    stored_t st;
    memset(&st, 0, sizeof st);
    st.where = where;
    st.d = d;
    st.sp = H5Dget_space(d);
    hid_t ft = H5Dget_type(d);
    st.dcpl = H5Dget_create_plist(d);
    int rc;
    if (st.sp < 0 || ft < 0 || st.dcpl < 0)
        rc = FAILF(IV_EBAD_FILE, "%s: dataset header unreadable", where);
    else
        rc = check_extent_stored(&st, ft, err);
    if (st.dcpl >= 0) H5Pclose(st.dcpl);
    if (ft >= 0) H5Tclose(ft);
    if (st.sp >= 0) H5Sclose(st.sp);
    return rc;
}

/* ---- filter pipelines ----------------------------------------------------- */

/* Names of the registered HDF5 filter ids a .h5ad file may carry (the
 * HDF Group's registry); the name a file stores is used for the rest. */
static const char *filter_name(int id)
{
    switch (id) {
    case 1: return "deflate";
    case 2: return "shuffle";
    case 3: return "fletcher32";
    case 4: return "szip";
    case 5: return "nbit";
    case 6: return "scaleoffset";
    case 307: return "bzip2";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32008: return "bitshuffle";
    case 32013: return "zfp";
    case 32015: return "zstd";
    case 32017: return "sz";
    case 32026: return "blosc2";
    default: return NULL;
    }
}

typedef struct filter_walk {
    const char *path;
    char base[512];  /* loc's own name in the file, ending in '/' */
    iv_err_t *err;
    int rc;
} filter_walk_t;

/* The file's own name of a filter, cut to printable ASCII. */
static void clean_name(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in && n + 1 < cap; in++)
        out[n++] = (*in >= 0x20 && *in < 0x7f) ? *in : '?';
    out[n] = '\0';
}

static int check_dataset_filters(hid_t d, const char *name, filter_walk_t *w)
{
    iv_err_t *err = w->err;
    hid_t dcpl = H5Dget_create_plist(d);
    if (dcpl < 0) return 0;
    int rc = 0;
    int n = H5Pget_nfilters(dcpl);
    for (int i = 0; i < n && rc == 0; i++) {
        unsigned flags = 0, cd[16], conf = 0;
        size_t ncd = sizeof cd / sizeof *cd;
        char stored[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof stored,
                                         stored, &conf);
        if (id < 0) continue;
        stored[sizeof stored - 1] = '\0';
        if (H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &conf) >= 0 &&
            (conf & H5Z_FILTER_CONFIG_DECODE_ENABLED))
            continue;
        char shown[64];
        const char *known = filter_name((int)id);
        clean_name(known ? known : stored[0] ? stored : "unknown", shown, sizeof shown);
        rc = FAILF(IV_EUNSUPPORTED,
                   "%s:%s%s: HDF5 filter %d (%s) is not available; ivserve reads deflate "
                   "(gzip), shuffle, fletcher32, lzf, zstd (32015), Blosc2 (32026) and filters "
                   "installed as HDF5 plugins: write the element with one of them",
                   w->path, w->base, name, (int)id, shown);
    }
    H5Pclose(dcpl);
    return rc;
}

static herr_t filter_visit(hid_t loc, const char *name, const H5O_info_t *info, void *arg)
{
    filter_walk_t *w = arg;
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0) return 0;  /* the readers name a header they cannot read */
    w->rc = check_dataset_filters(d, name, w);
    H5Dclose(d);
    return w->rc < 0 ? 1 : 0;
}

int iv_h5_check_filters(hid_t loc, const char *path, iv_err_t *err)
{
    filter_walk_t w = {path ? path : "", "", err, 0};
    H5E_BEGIN_TRY
    {
        /* Names the walk gives are relative to loc: messages put loc's
         * own name ("/" for the file, "/obs") before them. */
        ssize_t n = H5Iget_name(loc, w.base, sizeof w.base - 1);
        if (n <= 0 || (size_t)n >= sizeof w.base - 1) snprintf(w.base, sizeof w.base, "/");
        else if (w.base[n - 1] != '/') snprintf(w.base + n, sizeof w.base - (size_t)n, "/");
        H5Ovisit2(loc, H5_INDEX_NAME, H5_ITER_INC, filter_visit, &w, H5O_INFO_BASIC);
    }
    H5E_END_TRY;
    return w.rc;
}
