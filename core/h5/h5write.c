/*
 * HDF5 writing helpers (see h5write.h).
 *
 * A growing array keeps two sets of chunk slots: while the pool compresses
 * one set, the caller fills the other; when the filling set is full, the
 * caller waits for the set in flight, writes its chunks in order and hands
 * the full set to the pool.  So compression overlaps with whatever the
 * caller does between appends (reading and encoding the input), memory is
 * 2 x batch x (chunk + bound), and chunks reach the file in order, which
 * is what keeps the extent-growing rule simple: chunk k is written after
 * the extent has grown to cover it, never past the data appended.
 */
#include "h5util.h"
#include "h5write.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
/* ZSTD_estimateCCtxSize_usingCParams (iv_h5w_ctx_bytes): exported by the
 * shared library, declared in its advanced part. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "codec.h"
#include "h5guard.h"

/* ---- codecs --------------------------------------------------------------- */

/* The codecs by name, with the level each takes when none is given. */
static const struct codec_name {
    const char *name;
    iv_h5w_codec_kind_t kind;
    int dflt;
} CODEC_NAMES[] = {
    {"zstd", IV_H5W_ZSTD, 1},
    {"deflate", IV_H5W_DEFLATE, 4},
    {"none", IV_H5W_NONE, 0},
};

/* Whether a codec takes the level (none takes none). */
static int level_ok(iv_h5w_codec_kind_t kind, int level)
{
    switch (kind) {
    case IV_H5W_ZSTD: return level >= ZSTD_minCLevel() && level <= ZSTD_maxCLevel() && level != 0;
    case IV_H5W_DEFLATE: return level >= 0 && level <= 9;
    default: return 1;
    }
}

int iv_h5w_codec_parse(const char *s, iv_h5w_codec_t *c)
{
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    long level = 0;
    if (colon) {
        char *end;
        level = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end) return -1;
    }
    for (size_t i = 0; i < sizeof CODEC_NAMES / sizeof CODEC_NAMES[0]; i++) {
        const struct codec_name *cn = &CODEC_NAMES[i];
        if (strlen(cn->name) != n || strncmp(s, cn->name, n) != 0) continue;
        if (cn->kind == IV_H5W_NONE && colon) return -1;
        c->kind = cn->kind;
        c->level = colon ? (int)level : cn->dflt;
        return level_ok(cn->kind, c->level) ? 0 : -1;
    }
    return -1;
}

void iv_h5w_codec_describe(const iv_h5w_codec_t *c, char *buf, size_t cap)
{
    switch (c->kind) {
    case IV_H5W_ZSTD: snprintf(buf, cap, "zstd-%d", c->level); break;
    case IV_H5W_DEFLATE: snprintf(buf, cap, "deflate-%d", c->level); break;
    default: snprintf(buf, cap, "none"); break;
    }
}

size_t iv_h5w_bound(const iv_h5w_codec_t *c, size_t n)
{
    switch (c->kind) {
    case IV_H5W_ZSTD: return ZSTD_compressBound(n);
    case IV_H5W_DEFLATE: return (size_t)compressBound((uLong)n);
    default: return n;
    }
}

/* One compression context per thread, freed when the thread exits. */
static pthread_key_t cctx_key;
static pthread_once_t cctx_once = PTHREAD_ONCE_INIT;
static int cctx_key_ok;

static void cctx_free(void *p)
{
    ZSTD_freeCCtx(p);
}

static void cctx_init_key(void)
{
    cctx_key_ok = pthread_key_create(&cctx_key, cctx_free) == 0;
}

static ZSTD_CCtx *thread_cctx(void)
{
    pthread_once(&cctx_once, cctx_init_key);
    if (!cctx_key_ok) return NULL;
    ZSTD_CCtx *c = pthread_getspecific(cctx_key);
    if (c) return c;
    if (!(c = ZSTD_createCCtx())) return NULL;
    if (pthread_setspecific(cctx_key, c) != 0) {
        ZSTD_freeCCtx(c);
        return NULL;
    }
    return c;
}

size_t iv_h5w_ctx_bytes(const iv_h5w_codec_t *c, size_t n)
{
    if (c->kind != IV_H5W_ZSTD) return 0;
    return ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(c->level, n, 0));
}

size_t iv_h5w_compress(const iv_h5w_codec_t *c, const void *src, size_t n, void *dst, size_t cap)
{
    if (c->kind == IV_H5W_ZSTD) {
        /* ZSTD_compressCCtx writes the content size into the frame header,
         * as the HDF5 plugin's ZSTD_compress does: readers size their
         * output from it. */
        ZSTD_CCtx *cc = thread_cctx();
        if (!cc) return 0;
        size_t r = ZSTD_compressCCtx(cc, dst, cap, src, n, c->level);
        return ZSTD_isError(r) ? 0 : r;
    }
    if (c->kind == IV_H5W_DEFLATE) {
        uLongf out = (uLongf)cap;
        if (compress2(dst, &out, src, (uLong)n, c->level) != Z_OK) return 0;
        return (size_t)out;
    }
    if (cap < n) return 0;
    memcpy(dst, src, n);
    return n;
}

/* ---- types ---------------------------------------------------------------- */


/* The little-endian file type numpy's "<i4" etc. map to. */
static hid_t file_type(iv_dtype_t t)
{
    switch (t) {
    case IV_DT_INT8: return H5T_STD_I8LE;
    case IV_DT_INT16: return H5T_STD_I16LE;
    case IV_DT_INT32: return H5T_STD_I32LE;
    case IV_DT_INT64: return H5T_STD_I64LE;
    case IV_DT_UINT8: return H5T_STD_U8LE;
    case IV_DT_UINT16: return H5T_STD_U16LE;
    case IV_DT_UINT32: return H5T_STD_U32LE;
    case IV_DT_UINT64: return H5T_STD_U64LE;
    case IV_DT_FLOAT32: return H5T_IEEE_F32LE;
    case IV_DT_FLOAT64: return H5T_IEEE_F64LE;
    default: return -1;
    }
}


/* ---- growing arrays ------------------------------------------------------- */

struct slot {
    uint8_t *raw, *comp;
    size_t comp_len;
};

struct slot_set {
    struct iv_h5w_array *a;
    struct slot *s;
    unsigned n_full;
    iv_pool_for_t *h;
};

struct iv_h5w_array {
    hid_t d;
    iv_dtype_t dt;
    size_t esz;
    uint64_t chunk_elems;
    size_t chunk_bytes, bound;
    iv_h5w_codec_t codec;
    iv_pool_t *pool;
    unsigned batch;
    struct slot_set sets[2];
    int fill;                 /* the set being filled */
    size_t fill_bytes;        /* bytes in the slot being filled */
    uint64_t length;          /* elements appended */
    uint64_t chunks_written;
    uint64_t stored;
    char label[512];
};

/* An empty extensible dataset of chunks of chunk_elems, through the
 * codec's filter; -1 when HDF5 refuses. */
static hid_t create_dataset(hid_t loc, const char *name, iv_dtype_t dt, uint64_t chunk_elems,
                            const iv_h5w_codec_t *codec)
{
    hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, cdims[1] = {chunk_elems};
    hid_t sp = H5Screate_simple(1, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t d = -1;
    int ok = sp >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, 1, cdims) >= 0;
    if (ok && codec->kind == IV_H5W_ZSTD) {
        unsigned cd[1] = {(unsigned)codec->level};
        ok = H5Pset_filter(dcpl, IV_FILTER_ZSTD, H5Z_FLAG_OPTIONAL, 1, cd) >= 0;
    } else if (ok && codec->kind == IV_H5W_DEFLATE) {
        ok = H5Pset_deflate(dcpl, (unsigned)codec->level) >= 0;
    }
    if (ok) d = H5Dcreate2(loc, name, file_type(dt), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return d;
}

int iv_h5w_array_create(hid_t loc, const char *name, iv_dtype_t dt, uint64_t chunk_elems,
                        const iv_h5w_codec_t *codec, iv_pool_t *pool, unsigned batch,
                        const char *label, iv_h5w_array_t **out, iv_err_t *err)
{
    *out = NULL;
    if (chunk_elems == 0) chunk_elems = 1;
    size_t esz = iv_dtype_size(dt);
    if (chunk_elems > (UINT32_MAX - 65536) / esz)
        return iv_fail(err, IV_EINVALID_ARG, "%s/%s: chunks of %llu elements exceed HDF5's 4 GiB",
                       label, name, (unsigned long long)chunk_elems);
    iv_h5w_array_t *a = calloc(1, sizeof *a);
    if (!a) return iv_fail(err, IV_ENOMEM, "out of memory");
    a->d = -1;
    a->dt = dt;
    a->esz = esz;
    a->chunk_elems = chunk_elems;
    a->chunk_bytes = (size_t)chunk_elems * esz;
    a->codec = *codec;
    a->bound = iv_h5w_bound(codec, a->chunk_bytes);
    a->pool = pool;
    a->batch = batch ? batch : (pool ? 2 * iv_pool_threads(pool) + 2 : 1);
    snprintf(a->label, sizeof a->label, "%s/%s", label, name);
    for (int k = 0; k < 2; k++) {
        a->sets[k].a = a;
        a->sets[k].s = calloc(a->batch, sizeof(struct slot));
        if (!a->sets[k].s) goto nomem;
    }
    a->d = create_dataset(loc, name, dt, chunk_elems, codec);
    if (a->d < 0) {
        iv_fail(err, IV_EIO, "%s: cannot create the dataset", a->label);
        iv_h5w_array_free(a);
        return IV_EIO;
    }
    *out = a;
    return 0;
nomem:
    iv_h5w_array_free(a);
    return iv_fail(err, IV_ENOMEM, "out of memory");
}

static void compress_slot(void *arg, size_t i)
{
    struct slot_set *set = arg;
    struct iv_h5w_array *a = set->a;
    struct slot *s = &set->s[i];
    if (a->codec.kind == IV_H5W_NONE) {
        s->comp_len = a->chunk_bytes;
        return;
    }
    s->comp_len = iv_h5w_compress(&a->codec, s->raw, a->chunk_bytes, s->comp, a->bound);
}

/* Waits for the set's compression and writes its chunks in order. */
static int drain_set(iv_h5w_array_t *a, struct slot_set *set, iv_err_t *err)
{
    if (set->h) {
        iv_pool_for_finish(set->h);
        set->h = NULL;
    }
    int rc = 0;
    for (unsigned i = 0; i < set->n_full && rc == 0; i++) {
        struct slot *s = &set->s[i];
        uint64_t k = a->chunks_written;
        if (s->comp_len == 0) {
            rc = iv_fail(err, IV_EINTERNAL, "%s: compressing chunk %llu failed", a->label,
                         (unsigned long long)k);
            break;
        }
        uint64_t end = (k + 1) * a->chunk_elems;
        hsize_t ext[1] = {end < a->length ? end : a->length}, off[1] = {k * a->chunk_elems};
        const void *bytes = a->codec.kind == IV_H5W_NONE ? s->raw : s->comp;
        if (H5Dset_extent(a->d, ext) < 0 ||
            H5Dwrite_chunk(a->d, H5P_DEFAULT, 0, off, s->comp_len, bytes) < 0) {
            rc = iv_fail(err, IV_EIO, "%s: writing chunk %llu failed (disk full?)", a->label,
                         (unsigned long long)k);
            break;
        }
        a->stored += s->comp_len;
        a->chunks_written++;
    }
    set->n_full = 0;
    return rc;
}

static void start_set(iv_h5w_array_t *a, struct slot_set *set)
{
    set->h = iv_pool_for_start(a->pool, set->n_full, compress_slot, set);
}

static int slot_ready(iv_h5w_array_t *a, struct slot *s)
{
    if (!s->raw) {
        s->raw = malloc(a->chunk_bytes);
        if (!s->raw) return -1;
    }
    if (!s->comp && a->codec.kind != IV_H5W_NONE) {
        s->comp = malloc(a->bound);
        if (!s->comp) return -1;
    }
    return 0;
}

int iv_h5w_array_append(iv_h5w_array_t *a, const void *data, uint64_t n, iv_err_t *err)
{
    const uint8_t *p = data;
    size_t left = (size_t)n * a->esz;
    a->length += n;
    while (left > 0) {
        struct slot_set *set = &a->sets[a->fill];
        struct slot *s = &set->s[set->n_full];
        if (slot_ready(a, s) < 0) return iv_fail(err, IV_ENOMEM, "%s: out of memory", a->label);
        size_t take = a->chunk_bytes - a->fill_bytes;
        if (take > left) take = left;
        memcpy(s->raw + a->fill_bytes, p, take);
        p += take;
        left -= take;
        a->fill_bytes += take;
        if (a->fill_bytes == a->chunk_bytes) {
            a->fill_bytes = 0;
            if (++set->n_full == a->batch) {
                struct slot_set *other = &a->sets[1 - a->fill];
                IV_TRY(drain_set(a, other, err));
                start_set(a, set);
                a->fill = 1 - a->fill;
            }
        }
    }
    return 0;
}

int iv_h5w_array_finish(iv_h5w_array_t *a, iv_err_t *err)
{
    IV_TRY(drain_set(a, &a->sets[1 - a->fill], err));
    struct slot_set *set = &a->sets[a->fill];
    if (a->fill_bytes > 0) {
        struct slot *s = &set->s[set->n_full];
        memset(s->raw + a->fill_bytes, 0, a->chunk_bytes - a->fill_bytes);
        set->n_full++;
        a->fill_bytes = 0;
    }
    start_set(a, set);
    IV_TRY(drain_set(a, set, err));
    if (iv_h5w_attr_encoding(a->d, "array", "0.2.0") < 0)
        return iv_fail(err, IV_EIO, "%s: cannot write attributes", a->label);
    return 0;
}

void iv_h5w_array_free(iv_h5w_array_t *a)
{
    if (!a) return;
    for (int k = 0; k < 2; k++) {
        struct slot_set *set = &a->sets[k];
        if (set->h) iv_pool_for_finish(set->h);
        if (!set->s) continue;
        for (unsigned i = 0; i < a->batch; i++) {
            free(set->s[i].raw);
            free(set->s[i].comp);
        }
        free(set->s);
    }
    if (a->d >= 0) H5Dclose(a->d);
    free(a);
}

uint64_t iv_h5w_array_length(const iv_h5w_array_t *a)
{
    return a->length;
}

uint64_t iv_h5w_array_stored(const iv_h5w_array_t *a)
{
    return a->stored;
}

/* ---- attributes ----------------------------------------------------------- */

int iv_h5w_attr_str(hid_t obj, const char *name, const char *value)
{
    int rc = -1;
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1;
    if (t < 0 || sp < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0)
        goto done;
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    if ((a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto done;
    if (H5Awrite(a, t, &value) < 0) goto done;
    rc = 0;
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    return rc;
}

int iv_h5w_attr_i64(hid_t obj, const char *name, const int64_t *v, size_t n)
{
    int rc = -1;
    hsize_t dims[1] = {n};
    hid_t sp = H5Screate_simple(1, dims, NULL), a = -1;
    if (sp < 0) return -1;
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    if ((a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto done;
    if (H5Awrite(a, H5T_NATIVE_INT64, v) < 0) goto done;
    rc = 0;
done:
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

int iv_h5w_attr_encoding(hid_t obj, const char *type, const char *version)
{
    if (iv_h5w_attr_str(obj, "encoding-type", type) < 0) return -1;
    return iv_h5w_attr_str(obj, "encoding-version", version);
}


/* Writes attribute a's values (memory type mt, dataspace sp) to a new
 * attribute `name` of dst of file type ft, replacing one there. */
static herr_t write_attr_copy(hid_t a, hid_t dst, const char *name, hid_t ft, hid_t mt, hid_t sp)
{
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    if (n < 0) return -1;
    size_t bytes = (size_t)n * H5Tget_size(mt);
    void *buf = calloc(1, bytes ? bytes : 1);
    if (!buf) return -1;
    herr_t rc = -1;
    if (H5Aexists(dst, name) > 0) H5Adelete(dst, name);
    hid_t b = H5Acreate2(dst, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (b < 0) goto done;
    if (n > 0) {
        if (H5Aread(a, mt, buf) < 0) goto done;
        herr_t w = H5Awrite(b, mt, buf);
        if (H5Tdetect_class(mt, H5T_VLEN) > 0 || H5Tis_variable_str(mt) > 0)
            H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, buf);
        if (w < 0) goto done;
    }
    rc = 0;
done:
    free(buf);
    if (b >= 0) H5Aclose(b);
    return rc;
}

/* Copies one attribute: read in its own type, write the same type. */
static herr_t copy_attr_cb(hid_t src, const char *name, const H5A_info_t *info, void *arg)
{
    (void)info;
    hid_t dst = *(hid_t *)arg;
    herr_t rc = -1;
    hid_t a = -1, ft = -1, mt = -1, sp = -1;
    if ((a = H5Aopen(src, name, H5P_DEFAULT)) < 0) goto done;
    if ((ft = H5Aget_type(a)) < 0 || (sp = H5Aget_space(a)) < 0) goto done;
    if (H5Tget_class(ft) == H5T_REFERENCE) {
        /* A reference holds an address in the source file: meaningless
         * in another one.  Objects copied with H5Ocopy keep theirs. */
        rc = 0;
        goto done;
    }
    if ((mt = H5Tget_native_type(ft, H5T_DIR_ASCEND)) < 0 && (mt = H5Tcopy(ft)) < 0) goto done;
    rc = write_attr_copy(a, dst, name, ft, mt, sp);
done:
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    return rc;
}

int iv_h5w_copy_attrs(hid_t src, hid_t dst)
{
    hsize_t idx = 0;
    return H5Aiterate2(src, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, copy_attr_cb, &dst) < 0 ? -1 : 0;
}

int iv_h5w_copy_object(hid_t src_loc, const char *name, hid_t dst_loc, const char *dst_name)
{
    char loc[512] = "";
    ssize_t n = H5Iget_name(src_loc, loc, sizeof loc);
    if (n < 0 || (size_t)n >= sizeof loc || strcmp(loc, "/") == 0) loc[0] = '\0';
    iv_h5guard_stage("copying %s/%s", loc, name);
    hid_t ocp = H5Pcreate(H5P_OBJECT_COPY);
    if (ocp < 0) return -1;
    /* References inside the copied tree (anndata 0.7 categoricals) are
     * remapped to the copies instead of being nulled. */
    H5Pset_copy_object(ocp, H5O_COPY_EXPAND_REFERENCE_FLAG);
    herr_t rc = H5Ocopy(src_loc, name, dst_loc, dst_name, ocp, H5P_DEFAULT);
    H5Pclose(ocp);
    return rc < 0 ? -1 : 0;
}
