/*
 * The packer (see pack.h).
 *
 * Three parts.  A source reads the input matrix in its own orientation as
 * slabs of consecutive major slices (rows of CSR and dense, columns of
 * CSC, the major axis of IVCSR/IVCSC), optionally keeping only the minor
 * indices of a band.  An encoder turns output slices into the four arrays
 * of the format, in parallel on the pool over the slices of a slab, and
 * appends them in order to growing HDF5 arrays that compress their chunks
 * on the pool as well.  A driver connects the two: straight through when
 * the orientation is kept, or through counted bands when it changes.
 *
 * Encoding one slice: entries sorted by minor index (checked; sorted when
 * they are not, and a repeated index is refused: a matrix cannot hold two
 * values in one cell), then a stable radix sort by a key that orders
 * values (floats by the usual sign-flip of their bits; all NaNs last), so
 * each value group holds its indices ascending.  Groups are made of equal
 * bit patterns, so -0.0 and 0.0 stay apart and every NaN is a group of its
 * own with its payload: the packed file holds exactly the input's values.
 */
#include "pack.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"
#include "cursor.h"
#include "h5guard.h"
#include "h5matrix.h"
#include "h5util.h"
#include "membudget.h"
#include "stream.h"
#include "transpose.h"
#include "varint.h"

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

/* Entries read per slab: 4 Mi, 32 MB of indices plus the values. */
#define SLAB_ENTRIES ((int64_t)1 << 22)
/* The format's shape limit (the loader refuses larger). */
#define MAX_DIM ((int64_t)1 << 40)
/* Pointer and value arrays: chunks of 64 Ki elements. */
#define PTR_CHUNK 65536

void iv_pack_opts_init(iv_pack_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->orient = IV_IVCSR;
    o->codec.kind = IV_H5W_ZSTD;
    o->codec.level = 1;
    o->transpose_engine = 1;
}

/* ---- sources -------------------------------------------------------------- */

enum src_kind { SRC_CSR, SRC_CSC, SRC_DENSE, SRC_IV };

typedef struct slab {
    int64_t first, n;         /* major slices [first, first + n) */
    int64_t *ptr;             /* n + 1 entry offsets */
    int64_t *idx;             /* minor index of each entry */
    int32_t *idx32;           /* a transpose band's instead, when every index fits (narrow) */
    uint8_t *val;             /* value bytes of each entry */
    size_t cap_slices, cap_entries;
    uint8_t *dense;           /* dense sources: the hyperslab read */
    size_t dense_cap;
} slab_t;

typedef struct src {
    enum src_kind kind;
    char where[1024];         /* "IN:/X" for messages */
    int64_t n_rows, n_cols, n_major, n_minor;
    iv_dtype_t vdt;
    size_t esz;
    int64_t nnz;              /* -1 when unknown (dense) */
    hid_t file, didx, ddata, ddense;
    int64_t *indptr;          /* sparse: n_major + 1 */
    iv_h5matrix_t m;          /* IV */
    iv_stream_t *stream;
    iv_cursor_t cur;
    int have_cursor;
    int64_t next;             /* next slice of the pass */
    int64_t band0, band1;
    int skip_values;          /* sparse sources: read indices only (a count pass) */
    uint64_t bytes_read;
    /* A packed input turned around by the transpose engine: opened as a
     * dataset before anything else (then m holds its orientation only);
     * or why it could not be (engine_note). */
    iv_dataset_t *ds;
    const char *in_path, *path;
    char engine_note[320];
} src_t;

static void slab_free(slab_t *s)
{
    free(s->ptr);
    free(s->idx);
    free(s->idx32);
    free(s->val);
    free(s->dense);
    memset(s, 0, sizeof *s);
}

/* Large entry buffers are scattered into at random: ask for transparent
 * huge pages, which cut the TLB misses and page faults of the fill pass. */
static void *big_realloc(void *p, size_t bytes)
{
    void *q = realloc(p, bytes);
#ifdef MADV_HUGEPAGE
    if (q && bytes >= ((size_t)64 << 20)) {
        uintptr_t a = ((uintptr_t)q + 4095) & ~(uintptr_t)4095;
        uintptr_t b = ((uintptr_t)q + bytes) & ~(uintptr_t)4095;
        if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE);
    }
#endif
    return q;
}

static int slab_reserve_as(slab_t *s, int64_t slices, int64_t entries, size_t esz, int narrow)
{
    if ((size_t)slices + 1 > s->cap_slices) {
        size_t cap = (size_t)slices + 1;
        int64_t *p = realloc(s->ptr, cap * sizeof *p);
        if (!p) return -1;
        s->ptr = p;
        s->cap_slices = cap;
    }
    if ((size_t)entries > s->cap_entries) {
        size_t cap = (size_t)entries;
        if (narrow) {
            int32_t *i = big_realloc(s->idx32, (cap ? cap : 1) * sizeof *i);
            if (!i) return -1;
            s->idx32 = i;
        } else {
            int64_t *i = big_realloc(s->idx, (cap ? cap : 1) * sizeof *i);
            if (!i) return -1;
            s->idx = i;
        }
        uint8_t *v = big_realloc(s->val, (cap ? cap : 1) * esz);
        if (!v) return -1;
        s->val = v;
        s->cap_entries = cap;
    }
    return 0;
}

static int slab_reserve(slab_t *s, int64_t slices, int64_t entries, size_t esz)
{
    return slab_reserve_as(s, slices, entries, esz, 0);
}

static void src_close(src_t *s)
{
    if (s->have_cursor) iv_cursor_done(&s->cur);
    s->have_cursor = 0;
    if (s->stream) iv_stream_destroy(s->stream);
    s->stream = NULL;
    iv_dataset_close(s->ds);
    s->ds = NULL;
    iv_h5matrix_free(&s->m);
    if (s->didx >= 0) H5Dclose(s->didx);
    if (s->ddata >= 0) H5Dclose(s->ddata);
    if (s->ddense >= 0) H5Dclose(s->ddense);
    s->didx = s->ddata = s->ddense = -1;
    free(s->indptr);
    s->indptr = NULL;
}

/* A dataset access list with a chunk cache large enough that slab reads
 * never decompress one input chunk twice. */
static hid_t big_cache_dapl(void)
{
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (dapl >= 0) H5Pset_chunk_cache(dapl, 12421, (size_t)64 << 20, 1.0);
    return dapl;
}

static int open_1d(hid_t g, const char *where, const char *name, hid_t *d, int64_t *len,
                   iv_err_t *err)
{
    if (H5Lexists(g, name, H5P_DEFAULT) <= 0)
        return FAILF(IV_EBAD_FILE, "%s: dataset '%s' is missing", where, name);
    hid_t dapl = big_cache_dapl();
    *d = H5Dopen2(g, name, dapl);
    if (dapl >= 0) H5Pclose(dapl);
    if (*d < 0) return FAILF(IV_EBAD_FILE, "%s: '%s' is not a dataset", where, name);
    hid_t sp = H5Dget_space(*d);
    hsize_t dims[1];
    int rank = H5Sget_simple_extent_ndims(sp);
    if (rank == 1) H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    if (rank != 1) return FAILF(IV_EBAD_FILE, "%s/%s: expected a 1-D array, found rank %d", where, name, rank);
    *len = (int64_t)dims[0];
    return 0;
}

static int read_shape_attr(hid_t g, const char *name, int64_t shape[2])
{
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a < 0) return -1;
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    int ok = H5Tget_class(t) == H5T_INTEGER && H5Sget_simple_extent_npoints(sp) == 2 &&
             H5Aread(a, H5T_NATIVE_INT64, shape) >= 0;
    H5Tclose(t);
    H5Sclose(sp);
    H5Aclose(a);
    return ok ? 0 : -1;
}

static int check_shape(const char *where, int64_t r, int64_t c, iv_err_t *err)
{
    if (r < 0 || c < 0 || r > MAX_DIM || c > MAX_DIM)
        return FAILF(IV_EUNSUPPORTED, "%s: shape (%" PRId64 ", %" PRId64 ") is past the format's "
                     "limit of 2^40 rows or columns", where, r, c);
    return 0;
}

static int open_sparse(src_t *s, hid_t g, int csc, iv_err_t *err)
{
    int64_t shape[2];
    if (read_shape_attr(g, "shape", shape) < 0 && read_shape_attr(g, "h5sparse_shape", shape) < 0)
        return FAILF(IV_EBAD_FILE, "%s: attribute 'shape' missing or not two integers", s->where);
    IV_TRY(check_shape(s->where, shape[0], shape[1], err));
    s->kind = csc ? SRC_CSC : SRC_CSR;
    s->n_rows = shape[0];
    s->n_cols = shape[1];
    s->n_major = csc ? shape[1] : shape[0];
    s->n_minor = csc ? shape[0] : shape[1];
    int64_t n_ptr, n_idx, n_dat;
    hid_t dptr;
    IV_TRY(open_1d(g, s->where, "indptr", &dptr, &n_ptr, err));
    int rc = 0;
    hid_t t = H5Dget_type(dptr);
    if (H5Tget_class(t) != H5T_INTEGER)
        rc = FAILF(IV_EBAD_FILE, "%s/indptr: not an integer array", s->where);
    else if (n_ptr != s->n_major + 1)
        rc = FAILF(IV_EBAD_FILE, "%s/indptr has %" PRId64 " entries, expected %" PRId64, s->where,
                   n_ptr, s->n_major + 1);
    H5Tclose(t);
    char what[1200];
    snprintf(what, sizeof what, "%s/indptr", s->where);
    iv_h5guard_stage("reading %s", what);
    if (rc == 0) rc = iv_h5_check_stored(dptr, what, err);
    if (rc == 0 && !(s->indptr = malloc((size_t)n_ptr * sizeof(int64_t))))
        rc = FAILF(IV_ENOMEM, "%s/indptr: out of memory", s->where);
    if (rc == 0 && H5Dread(dptr, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->indptr) < 0)
        rc = FAILF(IV_EBAD_FILE, "%s/indptr: read failed (truncated file or unsupported "
                   "compression)", s->where);
    H5Dclose(dptr);
    IV_TRY(rc);
    IV_TRY(open_1d(g, s->where, "indices", &s->didx, &n_idx, err));
    IV_TRY(open_1d(g, s->where, "data", &s->ddata, &n_dat, err));
    snprintf(what, sizeof what, "%s/indices", s->where);
    IV_TRY(iv_h5_check_stored(s->didx, what, err));
    snprintf(what, sizeof what, "%s/data", s->where);
    IV_TRY(iv_h5_check_stored(s->ddata, what, err));
    t = H5Dget_type(s->didx);
    int idx_int = H5Tget_class(t) == H5T_INTEGER;
    H5Tclose(t);
    if (!idx_int) return FAILF(IV_EBAD_FILE, "%s/indices: not an integer array", s->where);
    t = H5Dget_type(s->ddata);
    int ok = iv_h5_dtype_of(t, &s->vdt) == 0;
    H5Tclose(t);
    if (!ok)
        return FAILF(IV_EUNSUPPORTED, "%s/data: element type is not an integer or float32/64 "
                     "(bool, float16, complex and strings cannot be packed)", s->where);
    s->esz = iv_dtype_size(s->vdt);
    if (s->indptr[0] != 0)
        return FAILF(IV_EBAD_FILE, "%s/indptr[0] is %" PRId64 ", not 0", s->where, s->indptr[0]);
    for (int64_t i = 0; i < s->n_major; i++)
        if (s->indptr[i + 1] < s->indptr[i])
            return FAILF(IV_EBAD_FILE, "%s/indptr goes backwards at %" PRId64, s->where, i + 1);
    s->nnz = s->indptr[s->n_major];
    if (n_idx != s->nnz || n_dat != s->nnz)
        return FAILF(IV_EBAD_FILE, "%s: indptr ends at %" PRId64 " but indices has %" PRId64
                     " and data %" PRId64 " entries", s->where, s->nnz, n_idx, n_dat);
    return 0;
}

static int open_dense(src_t *s, hid_t file, const char *path, iv_err_t *err)
{
    hid_t dapl = big_cache_dapl();
    s->ddense = H5Dopen2(file, path, dapl);
    if (dapl >= 0) H5Pclose(dapl);
    if (s->ddense < 0) return FAILF(IV_EBAD_FILE, "%s: cannot open the dataset", s->where);
    hid_t t = H5Dget_type(s->ddense), sp = H5Dget_space(s->ddense);
    H5T_class_t cls = H5Tget_class(t);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[2] = {0, 0};
    if (rank == 2) H5Sget_simple_extent_dims(sp, dims, NULL);
    int ok = iv_h5_dtype_of(t, &s->vdt) == 0;
    H5Sclose(sp);
    H5Tclose(t);
    if (cls == H5T_STRING)
        return FAILF(IV_EUNSUPPORTED, "%s: a dense array of strings cannot be packed (only "
                     "integers and floats)", s->where);
    if (!ok)
        return FAILF(IV_EUNSUPPORTED, "%s: dense element type is not an integer or float32/64 "
                     "(bool, float16, compound and strings cannot be packed)", s->where);
    if (rank != 2)
        return FAILF(IV_EUNSUPPORTED, "%s: a dense matrix must be 2-D, found rank %d", s->where, rank);
    IV_TRY(check_shape(s->where, (int64_t)dims[0], (int64_t)dims[1], err));
    IV_TRY(iv_h5_check_stored(s->ddense, s->where, err));
    s->kind = SRC_DENSE;
    s->esz = iv_dtype_size(s->vdt);
    s->n_rows = s->n_major = (int64_t)dims[0];
    s->n_cols = s->n_minor = (int64_t)dims[1];
    s->nnz = -1;
    return 0;
}

static int open_iv(src_t *s, const char *in_path, const char *group, iv_err_t *err)
{
    /* The input is open here already (its encoding was read): load in
     * process, not through a forked reader that would copy that state. */
    IV_TRY(iv_h5matrix_load_inproc(in_path, group, &s->m, err));
    s->kind = SRC_IV;
    s->n_rows = s->m.n_rows;
    s->n_cols = s->m.n_cols;
    s->n_major = s->m.n_major;
    s->n_minor = s->m.n_minor;
    s->vdt = s->m.value_dtype;
    s->esz = iv_dtype_size(s->vdt);
    s->nnz = s->m.nnz;
    char label[1100];
    snprintf(label, sizeof label, "%s/packed_indices", s->where);
    s->m.stream.label = label;
    /* A small cache: a pass reads the stream front to back once. */
    int rc = iv_stream_create(&s->m.stream, (size_t)64 << 20, &s->stream, err);
    memset(&s->m.stream, 0, sizeof s->m.stream); /* handed over, even on failure */
    return rc;
}

/* The engine's input dataset: its decompressed-chunk cache (bands read
 * the stream front to back, a few chunks each at a time). */
#define ENGINE_CACHE_BYTES ((size_t)64 << 20)

/*
 * The input matrix for the transpose engine, when the engine is on,
 * layers are not packed and the matrix is a top-level IVCSR/IVCSC group
 * of the other orientation: opened as a dataset (pointers and values
 * loaded, the row index built in one parallel pass).  That load forks a
 * reader process (dataset.h), so it comes before this process opens any
 * file with HDF5: a child would share the parent's open file state.  A
 * dataset that does not open leaves the input to the usual path, which
 * gives its own error or packs it; engine_note says why.
 */
static void open_engine_input(src_t *s, const char *in_path, const char *matrix, const iv_pack_opts_t *o)
{
    iv_h5mx_entry_t e;
    iv_err_t e2;
    iv_err_clear(&e2);
    if (!o->transpose_engine || o->layers || strchr(matrix, '/') ||
        iv_h5matrix_describe(in_path, matrix, &e, &e2) != 0 || !e.packed)
        return;
    iv_orient_t orient = strcmp(e.encoding, "ivcsc") == 0 ? IV_IVCSC : IV_IVCSR;
    if (orient == o->orient) return;
    iv_dataset_opts_t dopts;
    iv_dataset_opts_init(&dopts);
    dopts.group = matrix;
    dopts.pool = o->pool;
    dopts.cache_bytes = ENGINE_CACHE_BYTES;
    /* Read what the server kept at its load (at ten million cells the
     * row-index pass alone is 8 s of 16 cores); keep nothing new. */
    dopts.index_dir = o->index_dir;
    dopts.index_min_bytes = UINT64_MAX;
    if (iv_dataset_open(in_path, &dopts, &s->ds, &e2) < 0) {
        snprintf(s->engine_note, sizeof s->engine_note, "the engine could not open the input: %.260s", e2.msg);
        s->ds = NULL;
    }
}

/* s's shape and dtype from the engine's dataset. */
static void src_from_dataset(src_t *s)
{
    const iv_dataset_info_t *in = iv_dataset_info(s->ds);
    s->kind = SRC_IV;
    s->m.orient = in->orient;
    s->n_rows = in->n_rows;
    s->n_cols = in->n_cols;
    s->n_major = in->n_major;
    s->n_minor = in->n_minor;
    s->vdt = in->value_dtype;
    s->esz = iv_dtype_size(s->vdt);
    s->nnz = in->nnz;
    s->bytes_read = in->stream_bytes;
}

/* Opens the matrix element `path` of the input. */
static int src_open(src_t *s, hid_t file, const char *in_path, const char *path, iv_err_t *err)
{
    s->in_path = in_path;
    s->path = path;
    snprintf(s->where, sizeof s->where, "%s:/%s", in_path, path);
    iv_h5guard_stage("reading %s", path);
    if (H5Lexists(file, path, H5P_DEFAULT) <= 0)
        return FAILF(IV_EBAD_FILE, "%s: no such element in the input", s->where);
    H5O_info_t oi;
    if (H5Oget_info_by_name(file, path, &oi, H5P_DEFAULT) < 0)
        return FAILF(IV_EBAD_FILE, "%s: cannot read the object header (truncated file?)", s->where);
    if (oi.type == H5O_TYPE_DATASET) return open_dense(s, file, path, err);
    if (oi.type != H5O_TYPE_GROUP)
        return FAILF(IV_EUNSUPPORTED, "%s: neither a group nor a dataset", s->where);
    hid_t g = H5Gopen2(file, path, H5P_DEFAULT);
    if (g < 0) return FAILF(IV_EBAD_FILE, "%s: cannot open the group", s->where);
    char enc[64] = "";
    if (iv_h5_read_str_attr(g, "encoding-type", enc, sizeof enc) < 0)
        iv_h5_read_str_attr(g, "h5sparse_format", enc, sizeof enc); /* anndata 0.7 */
    int rc;
    if (strcmp(enc, "csr_matrix") == 0 || strcmp(enc, "csr") == 0) rc = open_sparse(s, g, 0, err);
    else if (strcmp(enc, "csc_matrix") == 0 || strcmp(enc, "csc") == 0) rc = open_sparse(s, g, 1, err);
    else if (strcmp(enc, "ivcsr") == 0 || strcmp(enc, "ivcsc") == 0) {
        if (strchr(path, '/'))
            rc = FAILF(IV_EUNSUPPORTED, "%s: an %s input must be a top-level group", s->where, enc);
        else if (s->ds) {
            src_from_dataset(s);
            rc = 0;
        } else {
            rc = open_iv(s, in_path, path, err);
        }
    } else if (!enc[0])
        rc = FAILF(IV_EUNSUPPORTED, "%s: group without an encoding-type attribute (not an "
                   "anndata sparse matrix)", s->where);
    else
        rc = FAILF(IV_EUNSUPPORTED, "%s: unsupported encoding '%s' (pack reads csr_matrix, "
                   "csc_matrix, ivcsr, ivcsc and dense arrays)", s->where, enc);
    H5Gclose(g);
    return rc;
}

static const char *src_kind_name(const src_t *s)
{
    switch (s->kind) {
    case SRC_CSR: return "csr_matrix";
    case SRC_CSC: return "csc_matrix";
    case SRC_DENSE: return "dense";
    default: return s->m.orient == IV_IVCSR ? "ivcsr" : "ivcsc";
    }
}

static int src_begin(src_t *s, int64_t band0, int64_t band1, iv_err_t *err)
{
    s->next = 0;
    s->band0 = band0;
    s->band1 = band1;
    if (s->kind == SRC_IV) {
        if (!s->have_cursor) {
            iv_cursor_init(&s->cur, s->stream);
            s->have_cursor = 1;
        }
        IV_TRY(iv_cursor_seek(&s->cur, 0, err));
    }
    return 0;
}

/* Keeps the entries of [band0, band1) (sparse sources), rebuilding ptr. */
static void slab_band(slab_t *sl, size_t esz, int64_t b0, int64_t b1)
{
    int64_t w = 0, start = 0;
    for (int64_t i = 0; i < sl->n; i++) {
        int64_t end = sl->ptr[i + 1];
        for (int64_t e = start; e < end; e++) {
            int64_t x = sl->idx[e];
            if (x < b0 || x >= b1) continue;
            sl->idx[w] = x;
            if (w != e) memcpy(sl->val + (size_t)w * esz, sl->val + (size_t)e * esz, esz);
            w++;
        }
        start = end;
        sl->ptr[i + 1] = w;
    }
}

static int next_sparse(src_t *s, slab_t *sl, iv_err_t *err)
{
    int64_t a = s->next, e = a;
    while (e < s->n_major && (e == a || s->indptr[e + 1] - s->indptr[a] <= SLAB_ENTRIES)) e++;
    int64_t n0 = s->indptr[a], n1 = s->indptr[e], n = n1 - n0;
    if (slab_reserve(sl, e - a, n, s->esz) < 0) return FAILF(IV_ENOMEM, "%s: out of memory", s->where);
    sl->first = a;
    sl->n = e - a;
    for (int64_t i = a; i <= e; i++) sl->ptr[i - a] = s->indptr[i] - n0;
    if (n > 0) {
        hsize_t off[1] = {(hsize_t)n0}, cnt[1] = {(hsize_t)n};
        hid_t ms = H5Screate_simple(1, cnt, NULL);
        hid_t fs = H5Dget_space(s->didx);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
        herr_t r1 = H5Dread(s->didx, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, sl->idx);
        H5Sclose(fs);
        fs = H5Dget_space(s->ddata);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
        herr_t r2 = r1 < 0 ? -1 : s->skip_values ? 0 :
                    H5Dread(s->ddata, iv_h5_native(s->vdt), ms, fs, H5P_DEFAULT, sl->val);
        H5Sclose(fs);
        H5Sclose(ms);
        if (r1 < 0 || r2 < 0)
            return FAILF(IV_EBAD_FILE, "%s/%s: read of entries %" PRId64 "..%" PRId64 " failed "
                         "(truncated file or unsupported compression)", s->where,
                         r1 < 0 ? "indices" : "data", n0, n1);
        for (int64_t k = 0; k < n; k++)
            if ((uint64_t)sl->idx[k] >= (uint64_t)s->n_minor) {
                int64_t sl_i = a;
                while (s->indptr[sl_i + 1] <= n0 + k) sl_i++;
                return FAILF(IV_EBAD_FILE, "%s/indices[%" PRId64 "] = %" PRId64 " is outside 0..%"
                             PRId64 " (%s %" PRId64 ")", s->where, n0 + k, sl->idx[k],
                             s->n_minor - 1, s->kind == SRC_CSR ? "row" : "column", sl_i);
            }
    }
    s->bytes_read += (uint64_t)n * (8 + (s->skip_values ? 0 : s->esz));
    if (s->band0 > 0 || s->band1 < s->n_minor) slab_band(sl, s->esz, s->band0, s->band1);
    s->next = e;
    return 0;
}

static int next_dense(src_t *s, slab_t *sl, iv_err_t *err)
{
    int64_t bw = s->band1 - s->band0;
    int64_t rows = bw > 0 ? SLAB_ENTRIES / bw : SLAB_ENTRIES;
    if (rows < 1) rows = 1;
    if (rows > s->n_major - s->next) rows = s->n_major - s->next;
    int64_t cells = rows * bw;
    if (slab_reserve(sl, rows, cells, s->esz) < 0) return FAILF(IV_ENOMEM, "%s: out of memory", s->where);
    size_t need = (size_t)(cells ? cells : 1) * s->esz;
    if (sl->dense_cap < need) {
        uint8_t *p = realloc(sl->dense, need);
        if (!p) return FAILF(IV_ENOMEM, "%s: out of memory", s->where);
        sl->dense = p;
        sl->dense_cap = need;
    }
    sl->first = s->next;
    sl->n = rows;
    sl->ptr[0] = 0;
    if (cells > 0) {
        hsize_t off[2] = {(hsize_t)s->next, (hsize_t)s->band0}, cnt[2] = {(hsize_t)rows, (hsize_t)bw};
        hid_t ms = H5Screate_simple(2, cnt, NULL), fs = H5Dget_space(s->ddense);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
        herr_t r = H5Dread(s->ddense, iv_h5_native(s->vdt), ms, fs, H5P_DEFAULT, sl->dense);
        H5Sclose(fs);
        H5Sclose(ms);
        if (r < 0)
            return FAILF(IV_EBAD_FILE, "%s: read of rows %" PRId64 "..%" PRId64 " failed "
                         "(truncated file or unsupported compression)", s->where, s->next,
                         s->next + rows);
    }
    /* An entry is stored unless all its bits are zero: -0.0 is kept, so
     * that the packed matrix densifies to exactly the input. */
    int64_t w = 0;
    size_t esz = s->esz;
    static const uint8_t zero[8];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = sl->dense + (size_t)(r * bw) * esz;
        for (int64_t j = 0; j < bw; j++) {
            const uint8_t *v = row + (size_t)j * esz;
            if (memcmp(v, zero, esz) == 0) continue;
            sl->idx[w] = s->band0 + j;
            memcpy(sl->val + (size_t)w * esz, v, esz);
            w++;
        }
        sl->ptr[r + 1] = w;
    }
    s->bytes_read += (uint64_t)cells * esz;
    s->next += rows;
    return 0;
}

static int next_iv(src_t *s, slab_t *sl, iv_err_t *err)
{
    const int64_t *mp = s->m.major_ptr, *vp = s->m.value_ptr;
    int64_t a = s->next, e = a;
    while (e < s->n_major && (e == a || vp[mp[e + 1]] - vp[mp[a]] <= SLAB_ENTRIES)) e++;
    int64_t n = vp[mp[e]] - vp[mp[a]];
    if (slab_reserve(sl, e - a, n, s->esz) < 0) return FAILF(IV_ENOMEM, "%s: out of memory", s->where);
    sl->first = a;
    sl->n = e - a;
    sl->ptr[0] = 0;
    int64_t w = 0;
    const uint8_t *values = s->m.values;
    int banded = s->band0 > 0 || s->band1 < s->n_minor;
    for (int64_t i = a; i < e; i++) {
        for (int64_t g = mp[i]; g < mp[i + 1]; g++) {
            int64_t cnt = vp[g + 1] - vp[g];
            uint64_t prev = UINT64_MAX; /* -1: the first index is d0 */
            for (int64_t k = 0; k < cnt; k++) {
                uint64_t d;
                IV_TRY(iv_cursor_read(&s->cur, &d, err));
                uint64_t x = prev + 1 + d;
                if (d >= (uint64_t)s->n_minor || x >= (uint64_t)s->n_minor || x < prev + 1)
                    return FAILF(IV_EBAD_FILE, "%s/packed_indices: slice %" PRId64 " holds an "
                                 "index >= n_minor (%" PRId64 ")", s->where, i, s->n_minor);
                prev = x;
                if (banded && ((int64_t)x < s->band0 || (int64_t)x >= s->band1)) continue;
                sl->idx[w] = (int64_t)x;
                memcpy(sl->val + (size_t)w * s->esz, values + (size_t)g * s->esz, s->esz);
                w++;
            }
        }
        sl->ptr[i - a + 1] = w;
    }
    s->bytes_read += (uint64_t)n * (8 + s->esz);
    s->next = e;
    if (e == s->n_major && iv_cursor_tell(&s->cur) != iv_stream_length(s->stream))
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: %" PRIu64 " bytes follow the last of the "
                     "%" PRId64 " varints value_ptr promises", s->where,
                     iv_stream_length(s->stream) - iv_cursor_tell(&s->cur), s->nnz);
    return 0;
}

/* Reads the next slab of the pass; 1 = got one, 0 = pass over. */
static int src_next(src_t *s, slab_t *sl, iv_err_t *err)
{
    if (s->next >= s->n_major) return 0;
    switch (s->kind) {
    case SRC_CSR: case SRC_CSC: IV_TRY(next_sparse(s, sl, err)); break;
    case SRC_DENSE: IV_TRY(next_dense(s, sl, err)); break;
    default: IV_TRY(next_iv(s, sl, err)); break;
    }
    return 1;
}

/* ---- encoding ------------------------------------------------------------- */

typedef struct rec {
    uint64_t key, pos;
} rec_t;

/* Stable LSD radix sort of n records by key, over the key bytes that
 * differ at all (counts take one or two passes). */
static void radix_sort(rec_t *a, rec_t *tmp, size_t n)
{
    if (n < 2) return;
    if (n <= 24) {
        for (size_t i = 1; i < n; i++) {
            rec_t x = a[i];
            size_t j = i;
            while (j > 0 && a[j - 1].key > x.key) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = x;
        }
        return;
    }
    uint64_t diff = 0, k0 = a[0].key;
    for (size_t i = 1; i < n; i++) diff |= a[i].key ^ k0;
    rec_t *src = a, *dst = tmp;
    for (int b = 0; b < 8; b++) {
        unsigned sh = 8u * (unsigned)b;
        if (((diff >> sh) & 0xff) == 0) continue;
        size_t cnt[256] = {0};
        for (size_t i = 0; i < n; i++) cnt[(src[i].key >> sh) & 0xff]++;
        size_t sum = 0;
        for (int v = 0; v < 256; v++) {
            size_t c = cnt[v];
            cnt[v] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[cnt[(src[i].key >> sh) & 0xff]++] = src[i];
        rec_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

#define NAN_KEY UINT64_MAX

/* Sort key of a value: the order of the numbers; float NaNs get NAN_KEY
 * (the walk makes each a group of one; integer keys may equal it). */
static uint64_t value_key(iv_dtype_t t, const uint8_t *v)
{
    switch (t) {
    case IV_DT_INT8: { int8_t x; memcpy(&x, v, 1); return (uint64_t)(int64_t)x ^ (1ull << 63); }
    case IV_DT_INT16: { int16_t x; memcpy(&x, v, 2); return (uint64_t)(int64_t)x ^ (1ull << 63); }
    case IV_DT_INT32: { int32_t x; memcpy(&x, v, 4); return (uint64_t)(int64_t)x ^ (1ull << 63); }
    case IV_DT_INT64: { int64_t x; memcpy(&x, v, 8); return (uint64_t)x ^ (1ull << 63); }
    case IV_DT_UINT8: return v[0];
    case IV_DT_UINT16: { uint16_t x; memcpy(&x, v, 2); return x; }
    case IV_DT_UINT32: { uint32_t x; memcpy(&x, v, 4); return x; }
    case IV_DT_UINT64: { uint64_t x; memcpy(&x, v, 8); return x; }
    case IV_DT_FLOAT32: {
        uint32_t b;
        memcpy(&b, v, 4);
        if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu)) return NAN_KEY;
        return (b & 0x80000000u) ? (uint64_t)(~b) : (uint64_t)(b | 0x80000000u);
    }
    default: {
        uint64_t b;
        memcpy(&b, v, 8);
        if ((b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0x000fffffffffffffull))
            return NAN_KEY;
        /* Numbers map to at most 0xfff0...0 (+inf), below NAN_KEY. */
        return (b & (1ull << 63)) ? ~b : (b | (1ull << 63));
    }
    }
}

/* Keys of n values into rec (pos = i), the dtype switch outside the loop. */
static void fill_keys(iv_dtype_t t, const uint8_t *val, size_t n, rec_t *rec)
{
    size_t esz = iv_dtype_size(t);
#define KEYS(expr)                                  \
    for (size_t i = 0; i < n; i++) {                \
        const uint8_t *v = val + i * esz;           \
        rec[i].key = (expr);                        \
        rec[i].pos = i;                             \
    }
    switch (t) {
    case IV_DT_FLOAT32: KEYS(value_key(IV_DT_FLOAT32, v)); break;
    case IV_DT_FLOAT64: KEYS(value_key(IV_DT_FLOAT64, v)); break;
    case IV_DT_INT32: KEYS(value_key(IV_DT_INT32, v)); break;
    case IV_DT_INT64: KEYS(value_key(IV_DT_INT64, v)); break;
    default: KEYS(value_key(t, v)); break;
    }
#undef KEYS
}

/*
 * Stable sort of rec by key.  Counts hold a handful of distinct values per
 * slice, so the distinct keys are collected first (a small hash set, at
 * most 64 of them) and the records placed by a counting sort over their
 * ranks: two passes.  More distinct keys fall back to the radix sort.
 */
#define FEW_KEYS 64
static void sort_by_value(rec_t *rec, rec_t *tmp, size_t n)
{
    if (n < 2) return;
    uint64_t slot_key[2 * FEW_KEYS];
    int slot_used[2 * FEW_KEYS];
    uint32_t slot_cnt[2 * FEW_KEYS];
    memset(slot_used, 0, sizeof slot_used);
    size_t distinct = 0;
    uint64_t last = rec[0].key + 1;
    size_t last_slot = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = rec[i].key;
        if (k == last) {
            slot_cnt[last_slot]++;
            continue;
        }
        size_t h = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 57); /* 0..127 */
        while (slot_used[h] && slot_key[h] != k) h = (h + 1) & (2 * FEW_KEYS - 1);
        if (!slot_used[h]) {
            if (++distinct > FEW_KEYS) {
                radix_sort(rec, tmp, n);
                return;
            }
            slot_used[h] = 1;
            slot_key[h] = k;
            slot_cnt[h] = 0;
        }
        slot_cnt[h]++;
        last = k;
        last_slot = h;
    }
    if (distinct == 1) return;
    /* Rank the distinct keys (insertion sort of at most 64), then give each
     * slot its first output position. */
    uint64_t keys[FEW_KEYS];
    size_t nk = 0;
    for (size_t h = 0; h < 2 * FEW_KEYS; h++) {
        if (!slot_used[h]) continue;
        size_t j = nk++;
        while (j > 0 && keys[j - 1] > slot_key[h]) {
            keys[j] = keys[j - 1];
            j--;
        }
        keys[j] = slot_key[h];
    }
    size_t start[2 * FEW_KEYS];
    size_t sum = 0;
    for (size_t r = 0; r < nk; r++) {
        size_t h = (size_t)((keys[r] * 0x9e3779b97f4a7c15ull) >> 57);
        while (slot_key[h] != keys[r] || !slot_used[h]) h = (h + 1) & (2 * FEW_KEYS - 1);
        start[h] = sum;
        sum += slot_cnt[h];
    }
    last = rec[0].key + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = rec[i].key;
        if (k != last) {
            last_slot = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 57);
            while (slot_key[last_slot] != k || !slot_used[last_slot])
                last_slot = (last_slot + 1) & (2 * FEW_KEYS - 1);
            last = k;
        }
        tmp[start[last_slot]++] = rec[i];
    }
    memcpy(rec, tmp, n * sizeof *rec);
}

/* Output of one part of a slab, encoded by one thread. */
typedef struct part {
    int64_t s0, s1;           /* slab-local slices */
    int64_t *groups;          /* per slice: groups in it */
    uint8_t *values;          /* group values */
    int64_t *vend;            /* per group: entries up to its end, part-relative */
    uint8_t *packed;
    size_t n_groups, cap_groups, n_packed, cap_packed;
    size_t cap_slices;
    int64_t nnz;
    rec_t *rec, *tmp;
    int64_t *sidx;
    uint8_t *sval;
    size_t cap_rec;
    int64_t *wide;            /* a narrow band's slice, widened for encode_slice */
    size_t cap_wide;
    int rc;
    iv_err_t err;
} part_t;

typedef struct encoder {
    iv_orient_t orient;       /* output */
    int64_t n_major, n_minor; /* output */
    iv_dtype_t vdt;
    size_t esz;
    const char *where;        /* input, for messages */
    iv_h5w_array_t *values, *vptr, *packed;
    int64_t *major_ptr;
    int64_t done;             /* output slices encoded */
    int64_t n_groups, nnz;
    part_t *parts;
    unsigned n_parts;
    /* the slab being encoded */
    const slab_t *sl;
    int64_t slab_first;       /* output slice of sl's slice 0 */
} encoder_t;

static void part_free(part_t *p)
{
    free(p->groups);
    free(p->values);
    free(p->vend);
    free(p->packed);
    free(p->rec);
    free(p->tmp);
    free(p->sidx);
    free(p->sval);
    free(p->wide);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* rec, tmp and the sorted copies of part p hold at least n entries (they
 * share one capacity).  0 or -1 when out of memory. */
static int reserve_rec(part_t *p, size_t n, size_t esz)
{
    if (n <= p->cap_rec) return 0;
    size_t cap = p->cap_rec ? p->cap_rec : 256;
    while (cap < n) cap *= 2;
    rec_t *r = realloc(p->rec, cap * sizeof *r);
    if (!r) return -1;
    p->rec = r;
    rec_t *t = realloc(p->tmp, cap * sizeof *t);
    if (!t) return -1;
    p->tmp = t;
    int64_t *si = realloc(p->sidx, cap * sizeof *si);
    if (!si) return -1;
    p->sidx = si;
    uint8_t *sv = realloc(p->sval, cap * esz);
    if (!sv) return -1;
    p->sval = sv;
    p->cap_rec = cap;
    return 0;
}

/* The slice's entries ordered by minor index: *idx and *val as they are
 * when already ascending, else sorted copies in p->sidx / p->sval. */
static void order_by_index(part_t *p, const int64_t **idx, const uint8_t **val, size_t n, size_t esz)
{
    const int64_t *x = *idx;
    size_t i = 1;
    while (i < n && x[i] > x[i - 1]) i++;
    if (i >= n) return;
    for (size_t k = 0; k < n; k++) {
        p->rec[k].key = (uint64_t)x[k];
        p->rec[k].pos = k;
    }
    radix_sort(p->rec, p->tmp, n);
    for (size_t k = 0; k < n; k++) {
        p->sidx[k] = x[p->rec[k].pos];
        memcpy(p->sval + k * esz, *val + p->rec[k].pos * esz, esz);
    }
    *idx = p->sidx;
    *val = p->sval;
}

/* A matrix holds one value per cell: a repeated index (idx ascending) is
 * refused, naming the cell. */
static int check_no_repeat(const encoder_t *en, iv_err_t *err, int64_t slice, const int64_t *idx,
                           int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        if (idx[i] == idx[i - 1]) {
            int64_t r = en->orient == IV_IVCSR ? slice : idx[i];
            int64_t c = en->orient == IV_IVCSR ? idx[i] : slice;
            return iv_fail(err, IV_EBAD_FILE, "%s: entry (row %" PRId64 ", column %" PRId64 ") is "
                           "stored twice; a packed matrix holds one value per cell (sum or drop "
                           "the duplicates first)", en->where, r, c);
        }
    return 0;
}

/* Room for one more group in p's values and vend (they grow together). */
static int reserve_group(part_t *p, size_t esz)
{
    if (p->n_groups < p->cap_groups) return 0;
    size_t c = p->cap_groups ? 2 * p->cap_groups : 256;
    uint8_t *nv = realloc(p->values, c * esz);
    if (!nv) return -1;
    p->values = nv;
    int64_t *ne = realloc(p->vend, c * sizeof *ne);
    if (!ne) return -1;
    p->vend = ne;
    p->cap_groups = c;
    return 0;
}

/* Appends the group of records rec[i, j) (one value) to part p: its value,
 * its end, and its indices as delta varints. */
static void emit_group(part_t *p, const rec_t *rec, size_t i, size_t j, const int64_t *idx,
                       const uint8_t *val, size_t esz)
{
    memcpy(p->values + p->n_groups * esz, val + rec[i].pos * esz, esz);
    int64_t prev = -1;
    uint8_t *out = p->packed + p->n_packed;
    for (size_t q = i; q < j; q++) {
        int64_t x = idx[rec[q].pos];
        uint64_t dv = (uint64_t)(x - prev - 1);
        if (dv < 0x80) *out++ = (uint8_t)dv;
        else out += iv_varint_write(dv, out);
        prev = x;
    }
    p->n_packed = (size_t)(out - p->packed);
    p->nnz += (int64_t)(j - i);
    p->vend[p->n_groups++] = p->nnz;
}

/* Encodes one output slice of n entries into part p. */
static int encode_slice(encoder_t *en, part_t *p, int64_t slice, const int64_t *idx,
                        const uint8_t *val, int64_t n)
{
    iv_err_t *err = &p->err;
    size_t esz = en->esz, un = (size_t)n;
    int is_float = en->vdt == IV_DT_FLOAT32 || en->vdt == IV_DT_FLOAT64;
    int64_t *groups = &p->groups[slice - en->slab_first - p->s0];
    *groups = 0;
    if (n == 0) return 0;
    if (reserve_rec(p, un, esz) < 0) goto nomem;
    order_by_index(p, &idx, &val, un, esz);
    IV_TRY(check_no_repeat(en, err, slice, idx, n));
    fill_keys(en->vdt, val, un, p->rec);
    sort_by_value(p->rec, p->tmp, un);
    if (grow((void **)&p->packed, &p->cap_packed, p->n_packed + un * IV_VARINT_MAX, 1) < 0) goto nomem;
    for (size_t i = 0; i < un;) {
        size_t j = i + 1;
        uint64_t k = p->rec[i].key;
        if (!is_float || k != NAN_KEY)
            while (j < un && p->rec[j].key == k) j++;
        if (reserve_group(p, esz) < 0) goto nomem;
        emit_group(p, p->rec, i, j, idx, val, esz);
        ++*groups;
        i = j;
    }
    return 0;
nomem:
    return iv_fail(err, IV_ENOMEM, "out of memory encoding slice %" PRId64, slice);
}

static void encode_part(void *arg, size_t k)
{
    encoder_t *en = arg;
    part_t *p = &en->parts[k];
    const slab_t *sl = en->sl;
    p->n_groups = p->n_packed = 0;
    p->nnz = 0;
    p->rc = 0;
    size_t ns = (size_t)(p->s1 - p->s0);
    if (grow((void **)&p->groups, &p->cap_slices, ns ? ns : 1, sizeof(int64_t)) < 0) {
        p->rc = iv_fail(&p->err, IV_ENOMEM, "out of memory");
        return;
    }
    for (int64_t s = p->s0; s < p->s1 && p->rc == 0; s++) {
        int64_t a = sl->ptr[s], b = sl->ptr[s + 1];
        const int64_t *idx = sl->idx + a;
        if (sl->idx32) {
            if (grow((void **)&p->wide, &p->cap_wide, (size_t)(b - a) + 1, sizeof(int64_t)) < 0) {
                p->rc = iv_fail(&p->err, IV_ENOMEM, "out of memory");
                return;
            }
            for (int64_t e = a; e < b; e++) p->wide[e - a] = sl->idx32[e];
            idx = p->wide;
        }
        p->rc = encode_slice(en, p, en->slab_first + s, idx, sl->val + (size_t)a * en->esz, b - a);
    }
}

/* Where part k of np ends (part k + 1 begins) when slices [0, n) with
 * entry offsets ptr are cut into parts of about equal entries, part k
 * beginning at slice s; the last part ends at n. */
static int64_t part_end(const int64_t *ptr, int64_t n, int64_t s, unsigned k, unsigned np)
{
    if (k + 1 == np) return n;
    int64_t want = ptr[n] / (int64_t)np * (int64_t)(k + 1);
    while (s < n && ptr[s + 1] <= want) s++;
    return s;
}

/* Encodes output slices [slab_first, slab_first + sl->n) from sl. */
static int encode_slab(encoder_t *en, iv_pool_t *pool, const slab_t *sl, iv_err_t *err)
{
    en->sl = sl;
    en->slab_first = en->done;
    /* Split the slab into parts of about equal entries. */
    unsigned np = en->n_parts;
    if ((int64_t)np > sl->n) np = (unsigned)(sl->n ? sl->n : 1);
    int64_t s = 0;
    for (unsigned k = 0; k < np; k++) {
        part_t *p = &en->parts[k];
        p->s0 = s;
        p->s1 = s = part_end(sl->ptr, sl->n, s, k, np);
    }
    iv_pool_parallel_for(pool, np, 0, encode_part, en);
    for (unsigned k = 0; k < np; k++)
        if (en->parts[k].rc < 0) return iv_fail(err, en->parts[k].rc, "%s", en->parts[k].err.msg);
    /* Append the parts in order, making their pointers global. */
    for (unsigned k = 0; k < np; k++) {
        part_t *p = &en->parts[k];
        for (int64_t q = p->s0; q < p->s1; q++) {
            int64_t out = en->slab_first + q;
            en->n_groups += p->groups[q - p->s0];
            en->major_ptr[out + 1] = en->n_groups;
        }
        for (size_t g = 0; g < p->n_groups; g++) p->vend[g] += en->nnz;
        en->nnz += p->nnz;
        IV_TRY(iv_h5w_array_append(en->values, p->values, p->n_groups, err));
        IV_TRY(iv_h5w_array_append(en->vptr, p->vend, p->n_groups, err));
        IV_TRY(iv_h5w_array_append(en->packed, p->packed, p->n_packed, err));
    }
    en->done += sl->n;
    return 0;
}

/* ---- driver --------------------------------------------------------------- */

typedef struct progress {
    const iv_pack_opts_t *o;
    src_t *src;
    encoder_t *en;
    int pass, n_passes;
    uint64_t bytes_before;
} progress_t;

static void report(progress_t *pr)
{
    iv_h5guard_beat();
    if (!pr->o->progress) return;
    iv_pack_progress_t p;
    double in_pass = pr->src->n_major ? (double)pr->src->next / (double)pr->src->n_major : 1.0;
    p.fraction = ((double)(pr->pass - 1) + in_pass) / (double)pr->n_passes;
    p.slices_done = pr->en->done;
    p.n_slices = pr->en->n_major;
    p.bytes_read = pr->src->bytes_read;
    p.pass = pr->pass;
    p.n_passes = pr->n_passes;
    pr->o->progress(pr->o->progress_ctx, &p);
}

/* Output orientation equals the input's: slabs go straight through. */
static int run_direct(src_t *s, encoder_t *en, const iv_pack_opts_t *o, iv_err_t *err)
{
    slab_t sl = {0};
    progress_t pr = {o, s, en, 1, 1, 0};
    int rc = src_begin(s, 0, s->n_minor, err);
    while (rc == 0) {
        int got = src_next(s, &sl, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        rc = encode_slab(en, o->pool, &sl, err);
        report(&pr);
    }
    slab_free(&sl);
    return rc;
}

/*
 * The transpose's count and scatter, on the pool.  A slab is cut into
 * parts of consecutive input slices with about equal entries.  Part p
 * counts its entries per output slice into its own row of counters; for
 * the scatter, the rows then become each part's first free position in
 * every output slice, parts in input order, so that an output slice still
 * lists its entries by ascending input slice, exactly as one thread
 * walking the slab would; each part then moves its entries to positions
 * no other part touches.  The counters take parts x output slices; when
 * that passes SPREAD_MAX_COUNTERS (matrices of billions of columns) fewer
 * parts are used, down to one thread.
 */
#define SPREAD_MAX_COUNTERS ((int64_t)1 << 24)
/* Entries a part gets at least: below, the pool's hand-off costs more
 * than the part's work. */
#define SPREAD_MIN_PART ((int64_t)4096)

typedef struct spread {
    const slab_t *sl;
    slab_t *band;
    int64_t *fill;            /* next free position per output slice (absolute slice) */
    int64_t t0, nb;           /* output slices [t0, t0 + nb): the band */
    size_t esz;
    unsigned np, max_parts;
    int64_t cut[65];          /* np + 1 input-slice bounds of the parts */
    int64_t *cnt;             /* max_parts rows of nb counters */
} spread_t;

static void spread_init(spread_t *sp, iv_pool_t *pool, int64_t nb, size_t esz)
{
    memset(sp, 0, sizeof *sp);
    unsigned parts = pool ? iv_pool_threads(pool) + 1 : 1;
    if (parts > 64) parts = 64;
    while (parts > 1 && (int64_t)parts * nb > SPREAD_MAX_COUNTERS) parts--;
    sp->max_parts = parts;
    sp->nb = nb;
    sp->esz = esz;
    if (parts < 2) return;
    sp->cnt = calloc((size_t)parts * (size_t)nb, sizeof *sp->cnt);
    if (!sp->cnt) sp->max_parts = 1; /* the serial walk needs no counters */
}

/* Cuts the slab into parts of about equal entries (one part for a small
 * slab or without counters). */
static void spread_cut(spread_t *sp, const slab_t *sl)
{
    int64_t total = sl->ptr[sl->n];
    unsigned np = sp->max_parts;
    if (total < SPREAD_MIN_PART * (int64_t)np) np = (unsigned)(total / SPREAD_MIN_PART);
    if (np < 1) np = 1;
    if ((int64_t)np > sl->n) np = (unsigned)(sl->n ? sl->n : 1);
    sp->cut[0] = 0;
    for (unsigned k = 0; k < np; k++) sp->cut[k + 1] = part_end(sl->ptr, sl->n, sp->cut[k], k, np);
    sp->np = np;
    sp->sl = sl;
}

static void count_part(void *arg, size_t p)
{
    spread_t *sp = arg;
    const slab_t *sl = sp->sl;
    int64_t *c = sp->cnt + p * (size_t)sp->nb, t0 = sp->t0;
    for (int64_t e = sl->ptr[sp->cut[p]]; e < sl->ptr[sp->cut[p + 1]]; e++) c[sl->idx[e] - t0]++;
}

/* Pass 1: adds the slab's entries to the parts' counters (summed at the end by spread_sum). */
static void spread_count(spread_t *sp, iv_pool_t *pool, const slab_t *sl, int64_t *counts)
{
    if (sp->max_parts < 2) {
        for (int64_t e = 0; e < sl->ptr[sl->n]; e++) counts[sl->idx[e]]++;
        return;
    }
    spread_cut(sp, sl);
    iv_pool_parallel_for(pool, sp->np, 0, count_part, sp);
}

static void spread_sum(spread_t *sp, int64_t *counts)
{
    for (unsigned p = 0; p < sp->max_parts && sp->cnt; p++)
        for (int64_t t = 0; t < sp->nb; t++) counts[t] += sp->cnt[p * (size_t)sp->nb + t];
}

static void zero_count_part(void *arg, size_t p)
{
    spread_t *sp = arg;
    memset(sp->cnt + p * (size_t)sp->nb, 0, (size_t)sp->nb * sizeof *sp->cnt);
    count_part(arg, p);
}

/* Counters to first positions, for output slices [t * step, ...) of the band. */
static void place_range(void *arg, size_t r)
{
    spread_t *sp = arg;
    int64_t step = (sp->nb + 63) / 64, a = (int64_t)r * step, b = a + step;
    if (b > sp->nb) b = sp->nb;
    for (int64_t t = a; t < b; t++) {
        int64_t pos = sp->fill[sp->t0 + t];
        for (unsigned p = 0; p < sp->np; p++) {
            int64_t *c = sp->cnt + p * (size_t)sp->nb + t;
            int64_t n = *c;
            *c = pos;
            pos += n;
        }
        sp->fill[sp->t0 + t] = pos;
    }
}

/* Moves the entries of input slices [i0, i1) of the slab to their output
 * slices' next free positions (next[slice - t0]).  The value copy has a
 * constant size in each case, so that it compiles to one load and one
 * store instead of a call. */
static void scatter_rows(const slab_t *sl, slab_t *band, int64_t *next, int64_t t0, size_t esz,
                         int64_t i0, int64_t i1)
{
#define SCATTER(T, IDX, IT)                                                  \
    for (int64_t i = i0; i < i1; i++) {                                      \
        int64_t major = sl->first + i;                                       \
        for (int64_t e = sl->ptr[i]; e < sl->ptr[i + 1]; e++) {              \
            int64_t pos = next[sl->idx[e] - t0]++;                           \
            band->IDX[pos] = (IT)major;                                      \
            memcpy(band->val + (size_t)pos * sizeof(T), sl->val + (size_t)e * sizeof(T), \
                   sizeof(T));                                               \
        }                                                                    \
    }
#define SCATTER_ALL(IDX, IT)                        \
    switch (esz) {                                  \
    case 1: SCATTER(uint8_t, IDX, IT); break;       \
    case 2: SCATTER(uint16_t, IDX, IT); break;      \
    case 4: SCATTER(uint32_t, IDX, IT); break;      \
    default: SCATTER(uint64_t, IDX, IT); break;     \
    }
    if (band->idx32) SCATTER_ALL(idx32, int32_t)
    else SCATTER_ALL(idx, int64_t)
#undef SCATTER_ALL
#undef SCATTER
}

static void scatter_part(void *arg, size_t p)
{
    spread_t *sp = arg;
    scatter_rows(sp->sl, sp->band, sp->cnt + p * (size_t)sp->nb, sp->t0, sp->esz, sp->cut[p],
                 sp->cut[p + 1]);
}

/* Pass 2: moves the slab's entries into the band ([t0, t0 + nb) of `fill`). */
static void spread_scatter(spread_t *sp, iv_pool_t *pool, const slab_t *sl, slab_t *band,
                           int64_t *fill, int64_t t0)
{
    sp->band = band;
    sp->fill = fill;
    sp->t0 = t0;
    if (sp->max_parts < 2) {
        scatter_rows(sl, band, fill, 0, sp->esz, 0, sl->n);
        return;
    }
    spread_cut(sp, sl);
    iv_pool_parallel_for(pool, sp->np, 0, zero_count_part, sp);
    iv_pool_parallel_for(pool, 64, 0, place_range, sp);
    iv_pool_parallel_for(pool, sp->np, 0, scatter_part, sp);
}

/* The memory budget of a pack: --memory-mb, or by default half of the
 * memory available (cgroup limits included), at least 2 GiB: each band is
 * one more read of the whole input, and a fixed 2 GiB made a 914 M-value
 * matrix take 7 passes on a machine with 128 GB (78 s where 2 take about
 * a third of that). */
static size_t pack_budget(const iv_pack_opts_t *o)
{
    size_t budget = o->memory_budget;
    if (!budget) {
        budget = iv_membudget_default(50, (size_t)2 << 30, NULL, NULL);
        if (budget < ((size_t)2 << 30)) budget = (size_t)2 << 30;
    }
    return budget;
}

/* The arrays a pack keeps for every output slice, whatever the data: the
 * output's major_ptr and the input's indptr, and when the orientation
 * changes the entry counts and fill positions of run_transpose and the
 * spread's counters.  A declared shape is checked against the budget
 * with this before any of them is allocated. */
static double slice_arrays_bytes(int64_t n_major, int same)
{
    double per = same ? 16.0 : 24.0, spread = 65.0 * ((double)n_major + 1);
    if (spread > (double)SPREAD_MAX_COUNTERS) spread = (double)SPREAD_MAX_COUNTERS;
    return per * ((double)n_major + 1) + (same ? 0.0 : 8.0 * spread);
}

/* Pass 1: the entries of every output slice into counts (the values are
 * not read). */
static int count_pass(src_t *s, const encoder_t *en, const iv_pack_opts_t *o, progress_t *pr,
                      slab_t *sl, int64_t *counts, iv_err_t *err)
{
    spread_t sp;
    spread_init(&sp, o->pool, en->n_major, en->esz);
    int rc = src_begin(s, 0, s->n_minor, err);
    s->skip_values = 1;
    while (rc == 0) {
        int got = src_next(s, sl, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        spread_count(&sp, o->pool, sl, counts);
        report(pr);
    }
    s->skip_values = 0;
    if (rc == 0) spread_sum(&sp, counts);
    free(sp.cnt);
    return rc;
}

/* The end of the band that starts at output slice t0: as many output
 * slices as fit budget bytes of entries (at least one); *n gets its
 * entries. */
static int64_t band_end(const int64_t *counts, int64_t nt, int64_t t0, size_t entry, size_t budget,
                        int64_t *n)
{
    int64_t t1 = t0;
    *n = 0;
    while (t1 < nt && (t1 == t0 || (uint64_t)(*n + counts[t1]) * entry <= budget)) *n += counts[t1++];
    return t1;
}

/* Pass 2 for output slices [t0, t1) (n entries): the band filled from a
 * whole read of the input, checked against the counts, and encoded. */
static int fill_band(src_t *s, encoder_t *en, const iv_pack_opts_t *o, progress_t *pr, slab_t *sl,
                     slab_t *band, const int64_t *counts, int64_t *fill, int64_t t0, int64_t t1,
                     int64_t n, int narrow, iv_err_t *err)
{
    if (slab_reserve_as(band, t1 - t0, n, en->esz, narrow) < 0)
        return FAILF(IV_ENOMEM, "out of memory for a band of %" PRId64 " entries", n);
    band->first = t0;
    band->n = t1 - t0;
    band->ptr[0] = 0;
    for (int64_t t = t0; t < t1; t++) {
        fill[t] = band->ptr[t - t0];
        band->ptr[t - t0 + 1] = band->ptr[t - t0] + counts[t];
    }
    pr->pass++;
    spread_t sp;
    spread_init(&sp, o->pool, t1 - t0, en->esz);
    int rc = src_begin(s, t0, t1, err);
    while (rc == 0) {
        int got = src_next(s, sl, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        spread_scatter(&sp, o->pool, sl, band, fill, t0);
        report(pr);
    }
    free(sp.cnt);
    IV_TRY(rc);
    for (int64_t t = t0; t < t1; t++)
        if (fill[t] != band->ptr[t - t0 + 1])
            return FAILF(IV_EBAD_FILE, "%s: the input changed between passes", s->where);
    IV_TRY(encode_slab(en, o->pool, band, err));
    report(pr);
    return 0;
}

/* Output orientation differs: count, then fill bands under the budget. */
static int run_transpose(src_t *s, encoder_t *en, const iv_pack_opts_t *o, int *n_passes,
                         iv_err_t *err)
{
    int64_t nt = en->n_major; /* output slices = the input's minor axis */
    /* A band's entries keep the input slice they came from: 4 bytes when
     * every input slice number fits (a third fewer passes at 4-byte
     * values), else 8. */
    int narrow = s->n_major <= INT32_MAX;
    size_t entry = (narrow ? sizeof(int32_t) : sizeof(int64_t)) + en->esz;
    /* What write_packed charged for the per-slice arrays is not there for
     * the bands. */
    size_t budget = pack_budget(o), fixed = (size_t)slice_arrays_bytes(en->n_major, 0);
    budget = budget > fixed ? budget - fixed : 0;
    int64_t *counts = calloc((size_t)(nt ? nt : 1), sizeof *counts);
    int64_t *fill = malloc((size_t)(nt ? nt : 1) * sizeof *fill);
    slab_t sl = {0}, band = {0};
    progress_t pr = {o, s, en, 1, 2, 0};
    int rc = counts && fill ? 0 : FAILF(IV_ENOMEM, "out of memory for %" PRId64 " counters", nt);
    if (rc == 0) rc = count_pass(s, en, o, &pr, &sl, counts, err);
    if (rc == 0) {
        /* The bands: as many output slices as fit the budget (at least one). */
        int n_bands = 0;
        for (int64_t t = 0, n; t < nt; n_bands++) t = band_end(counts, nt, t, entry, budget, &n);
        pr.n_passes = 1 + n_bands;
        *n_passes = pr.n_passes;
    }
    for (int64_t t0 = 0, n; rc == 0 && t0 < nt;) {
        int64_t t1 = band_end(counts, nt, t0, entry, budget, &n);
        rc = fill_band(s, en, o, &pr, &sl, &band, counts, fill, t0, t1, n, narrow, err);
        t0 = t1;
    }
    s->skip_values = 0;
    slab_free(&sl);
    slab_free(&band);
    free(counts);
    free(fill);
    return rc;
}

/* ---- the transpose engine ------------------------------------------------- */

/*
 * A packed input turned around goes through the in-memory transpose's
 * engine (transpose.h): value ids, a count pass when its entries do not
 * fit the temporary at once, then windows of output slices, each filled
 * from one read of the input, sorted by counting and encoded in
 * parallel.  Each window is appended here to the same growing arrays as
 * encode_slab's output, so the file is what run_transpose writes.
 *
 * Two orders differ: the engine puts 0.0 before -0.0 and groups NaNs by
 * their bits, this writer puts -0.0 first and each NaN in a group of its
 * own, in index order, after the numbers (see encode_slice).  A window
 * holding either is rewritten slice by slice to this writer's order
 * (window_fix); the others are appended as they come.
 */
typedef struct nan_entry {
    uint64_t index, bits;
} nan_entry_t;

typedef struct engine_sink {
    src_t *s;
    encoder_t *en;
    const iv_pack_opts_t *o;
    int windows, count_pass;
    /* window_fix's rewritten window */
    uint8_t *bytes, *values;
    uint64_t *sizes, *slice_bytes;
    uint32_t *slice_groups;
    size_t cap_bytes, cap_groups, cap_slices;
    nan_entry_t *nan;
    size_t cap_nan;
    int64_t *vend;            /* value_ptr of a window's groups */
    size_t cap_vend;
} engine_sink_t;

static void engine_sink_free(engine_sink_t *k)
{
    free(k->bytes);
    free(k->values);
    free(k->sizes);
    free(k->slice_bytes);
    free(k->slice_groups);
    free(k->nan);
    free(k->vend);
}

/* What this writer orders apart in a float value: 1 for -0.0, 2 for
 * +0.0, 3 for a NaN, else 0 (and always 0 for integer dtypes). */
static int float_kind(iv_dtype_t t, const uint8_t *v)
{
    if (t == IV_DT_FLOAT32) {
        uint32_t b;
        memcpy(&b, v, 4);
        if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu)) return 3;
        return b == 0x80000000u ? 1 : b == 0 ? 2 : 0;
    }
    if (t == IV_DT_FLOAT64) {
        uint64_t b;
        memcpy(&b, v, 8);
        if ((b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0x000fffffffffffffull)) return 3;
        return b == 0x8000000000000000ull ? 1 : b == 0 ? 2 : 0;
    }
    return 0;
}

static int cmp_nan_entry(const void *a, const void *b)
{
    uint64_t x = ((const nan_entry_t *)a)->index, y = ((const nan_entry_t *)b)->index;
    return (x > y) - (x < y);
}

/* Whether window w holds a -0.0 or a NaN group; *n_nan gets the entries
 * of its NaN groups. */
static int window_needs_fix(const encoder_t *en, const iv_transpose_window_t *w, uint64_t *n_nan)
{
    int any = 0;
    *n_nan = 0;
    if (en->vdt != IV_DT_FLOAT32 && en->vdt != IV_DT_FLOAT64) return 0;
    for (uint64_t x = 0; x < w->n_groups; x++) {
        int kind = float_kind(en->vdt, (const uint8_t *)w->values + x * en->esz);
        if (kind == 1 || kind == 3) any = 1;
        if (kind == 3) *n_nan += w->group_sizes[x];
    }
    return any;
}

/* Room for a rewritten window of `bytes`, `groups` and `slices`. */
static int fix_reserve(engine_sink_t *k, size_t bytes, size_t groups, size_t slices, size_t esz)
{
    if (grow((void **)&k->bytes, &k->cap_bytes, bytes ? bytes : 1, 1) < 0) return -1;
    size_t cg = k->cap_groups;
    if (grow((void **)&k->values, &cg, groups ? groups : 1, esz) < 0) return -1;
    cg = k->cap_groups;
    if (grow((void **)&k->sizes, &cg, groups ? groups : 1, sizeof *k->sizes) < 0) return -1;
    k->cap_groups = cg;
    size_t cs = k->cap_slices;
    if (grow((void **)&k->slice_bytes, &cs, slices ? slices : 1, sizeof *k->slice_bytes) < 0) return -1;
    cs = k->cap_slices;
    if (grow((void **)&k->slice_groups, &cs, slices ? slices : 1, sizeof *k->slice_groups) < 0) return -1;
    k->cap_slices = cs;
    return 0;
}

/* The byte length of a group of n varints at p (before end); its indices
 * go to k->nan with `bits` when nan is set.  0 when the bytes end early. */
static uint64_t group_walk(engine_sink_t *k, const uint8_t *p, const uint8_t *end, uint64_t n, int nan,
                           uint64_t bits, size_t *n_nan)
{
    const uint8_t *q = p;
    uint64_t prev = UINT64_MAX;   /* -1: the first delta is the index itself */
    for (uint64_t i = 0; i < n; i++) {
        uint64_t d;
        size_t used = iv_varint_read(q, end, &d);
        if (used == 0) return 0;
        q += used;
        prev += d + 1;
        if (nan) k->nan[(*n_nan)++] = (nan_entry_t){prev, bits};
    }
    return (uint64_t)(q - p);
}

/*
 * One slice of window_fix: its ng groups from group gi and byte bp of w
 * appended to the rewritten window at *og (groups) and *ow (bytes): the
 * others as they are, a -0.0 group moved before the +0.0 group just
 * before it, each NaN entry a group of one at the end in index order.
 * Returns the slice's groups, or -1 when its bytes end early.
 */
static int64_t fix_slice(engine_sink_t *k, const iv_transpose_window_t *w, uint64_t gi, uint32_t ng,
                         uint64_t *bp, size_t *og, size_t *ow)
{
    const size_t esz = k->en->esz;
    const iv_dtype_t vdt = k->en->vdt;
    const uint8_t *end = w->bytes + w->n_bytes;
    size_t n_nan = 0, out_ng = 0, last_at = 0;
    int last_kind = 0;
    for (uint64_t x = gi; x < gi + ng; x++) {
        const uint8_t *val = (const uint8_t *)w->values + x * esz;
        int kind = float_kind(vdt, val);
        uint64_t bits = 0;
        memcpy(&bits, val, esz);
        uint64_t len = group_walk(k, w->bytes + *bp, end, w->group_sizes[x], kind == 3, bits, &n_nan);
        if (len == 0) return -1;
        if (kind != 3) {
            if (kind == 1 && last_kind == 2) {
                /* -0.0 goes before the +0.0 group just written. */
                memmove(k->bytes + last_at + len, k->bytes + last_at, *ow - last_at);
                memcpy(k->bytes + last_at, w->bytes + *bp, len);
                memcpy(k->values + *og * esz, k->values + (*og - 1) * esz, esz);
                k->sizes[*og] = k->sizes[*og - 1];
                memcpy(k->values + (*og - 1) * esz, val, esz);
                k->sizes[*og - 1] = w->group_sizes[x];
                last_kind = 0;
            } else {
                memcpy(k->bytes + *ow, w->bytes + *bp, len);
                memcpy(k->values + *og * esz, val, esz);
                k->sizes[*og] = w->group_sizes[x];
                last_kind = kind;
                last_at = *ow;
            }
            *ow += len;
            ++*og;
            out_ng++;
        }
        *bp += len;
    }
    qsort(k->nan, n_nan, sizeof *k->nan, cmp_nan_entry);
    for (size_t i = 0; i < n_nan; i++) {
        *ow += iv_varint_write(k->nan[i].index, k->bytes + *ow);
        memcpy(k->values + *og * esz, &k->nan[i].bits, esz);
        k->sizes[(*og)++] = 1;
        out_ng++;
    }
    return (int64_t)out_ng;
}

/* w rewritten to this writer's order (see the top of this part) into k's
 * buffers; *w then points at them.  0, or an error. */
static int window_fix(engine_sink_t *k, iv_transpose_window_t *w, uint64_t n_nan, iv_err_t *err)
{
    size_t slices = (size_t)(w->g1 - w->g0);
    if (fix_reserve(k, (size_t)w->n_bytes + (size_t)n_nan * IV_VARINT_MAX, (size_t)(w->n_groups + n_nan),
                    slices, k->en->esz) < 0 ||
        grow((void **)&k->nan, &k->cap_nan, (size_t)(n_nan ? n_nan : 1), sizeof *k->nan) < 0)
        return FAILF(IV_ENOMEM, "%s: out of memory rewriting a window's NaN groups", k->s->where);
    uint64_t gi = 0, bp = 0;
    size_t og = 0, ow = 0;
    for (size_t i = 0; i < slices; i++) {
        size_t ow0 = ow;
        int64_t ng = fix_slice(k, w, gi, w->slice_groups[i], &bp, &og, &ow);
        if (ng < 0)
            return FAILF(IV_EINTERNAL, "%s: the transpose's slice %" PRId64 " ends early", k->s->where,
                         w->g0 + (int64_t)i);
        gi += w->slice_groups[i];
        k->slice_bytes[i] = ow - ow0;
        k->slice_groups[i] = (uint32_t)ng;
    }
    w->bytes = k->bytes;
    w->n_bytes = ow;
    w->values = k->values;
    w->group_sizes = k->sizes;
    w->n_groups = og;
    w->slice_bytes = k->slice_bytes;
    w->slice_groups = k->slice_groups;
    return 0;
}

/* The window's slices appended to the encoder's arrays, as encode_slab
 * appends a slab's: major_ptr, values, value_ptr and packed_indices. */
static int append_window(engine_sink_t *k, const iv_transpose_window_t *w, iv_err_t *err)
{
    encoder_t *en = k->en;
    if (w->g0 != en->done)
        return FAILF(IV_EINTERNAL, "%s: the transpose gave slice %" PRId64 " after %" PRId64, k->s->where, w->g0,
                     en->done);
    if (grow((void **)&k->vend, &k->cap_vend, (size_t)(w->n_groups ? w->n_groups : 1), sizeof *k->vend) < 0)
        return FAILF(IV_ENOMEM, "%s: out of memory for a window's value_ptr", k->s->where);
    for (int64_t g = w->g0; g < w->g1; g++) {
        en->n_groups += w->slice_groups[g - w->g0];
        en->major_ptr[g + 1] = en->n_groups;
    }
    int64_t run = en->nnz;
    for (uint64_t x = 0; x < w->n_groups; x++) k->vend[x] = run += (int64_t)w->group_sizes[x];
    IV_TRY(iv_h5w_array_append(en->values, w->values, w->n_groups, err));
    IV_TRY(iv_h5w_array_append(en->vptr, k->vend, w->n_groups, err));
    IV_TRY(iv_h5w_array_append(en->packed, w->bytes, w->n_bytes, err));
    en->nnz = run;
    en->done = w->g1;
    return 0;
}

/* The engine's sink: a window put in this writer's order, appended, and
 * the progress told. */
static int engine_window(void *ctx, const iv_transpose_window_t *win, iv_err_t *err)
{
    engine_sink_t *k = ctx;
    iv_transpose_window_t w = *win;
    uint64_t n_nan;
    if (window_needs_fix(k->en, &w, &n_nan)) IV_TRY(window_fix(k, &w, n_nan, err));
    IV_TRY(append_window(k, &w, err));
    /* A window's first piece: one more read of the input. */
    if (w.window != k->windows) k->s->bytes_read += iv_dataset_info(k->s->ds)->stream_bytes;
    k->windows = w.window;
    k->count_pass = w.count_pass;
    iv_h5guard_beat();
    if (k->o->progress) {
        iv_pack_progress_t p = {
            .fraction = w.nnz ? (double)w.entries_done / (double)w.nnz : 1.0, .slices_done = k->en->done,
            .n_slices = k->en->n_major, .bytes_read = k->s->bytes_read, .pass = k->windows,
            .n_passes = k->windows + (w.entries_done < w.nnz),
        };
        k->o->progress(k->o->progress_ctx, &p);
    }
    return 0;
}

/* Entries' bytes the window's pieces and the temporary take a stored
 * value (4-byte entries, a quarter more for their chains, up to 3 bytes
 * of varint for an eighth of the window at a time), and the bound on
 * both past which the windows are not made smaller. */
#define ENGINE_ENTRY_BYTES 5.5
#define ENGINE_MIN_WINDOW ((uint64_t)16 << 20)
#define ENGINE_KEEP_BACK 0.85

/*
 * The engine's bound on its temporary and window buffer: the memory
 * budget less what the pack holds whatever the windows (the output's
 * major_ptr, the engine's per-slice arrays and per-band counters, the
 * input's pointers, values and value ids, its chunk cache), shared with
 * a window's groups in the proportion of the input's groups to entries
 * (each group of a window takes about 28 bytes and a value).
 */
static uint64_t engine_window_bytes(const src_t *s, const encoder_t *en, const iv_pack_opts_t *o)
{
    if (o->engine_window_bytes) return o->engine_window_bytes;
    const iv_dataset_info_t *in = iv_dataset_info(s->ds);
    double G = (double)en->n_major, S = (double)s->n_major, U = (double)in->n_unique;
    double bands = 4.0 * (o->pool ? iv_pool_threads(o->pool) + 1 : 1);
    if (bands > S) bands = S > 1 ? S : 1;
    double counters = bands * G * 8;
    if (counters > (double)(256u << 20)) counters = (double)(256u << 20);
    double fixed = 8 * (G + 1) + 44 * G + counters + 8 * (S + 1) + U * (8 + 4 + (double)s->esz) +
                   (double)ENGINE_CACHE_BYTES +
                   (o->no_replica ? 0 : (double)IV_TRANSPOSE_REPLICA_CACHE + bands * IV_TRANSPOSE_REPLICA_CHUNK);
    double left = (double)pack_budget(o) - fixed;
    double per_group = 28 + (double)s->esz, groups = s->nnz > 0 ? U / (double)s->nnz : 0;
    left *= ENGINE_ENTRY_BYTES / (ENGINE_ENTRY_BYTES + groups * per_group);
    /* Kept back: what grows with the output and is not counted above
     * (HDF5's chunk index and caches of the arrays being written, the
     * allocator's), 30-36 MB over the windows of a 1.26 M-cell atlas at
     * 512 MiB, and the temporary is touched whole where the windows'
     * varints took less than their bound. */
    left *= ENGINE_KEEP_BACK;
    return left > (double)ENGINE_MIN_WINDOW ? (uint64_t)left : ENGINE_MIN_WINDOW;
}

/*
 * Output orientation differs, packed input: the engine, window by
 * window.  When it refuses the input (IV_EUNSUPPORTED: too many distinct
 * values to pack an entry in 64 bits) before any window, the input is
 * loaded again the usual way and run_transpose takes over; rep says
 * which ran.
 */
static int run_engine(src_t *s, encoder_t *en, const iv_pack_opts_t *o, const char *out_path, int *n_passes,
                      iv_pack_report_t *rep, iv_err_t *err)
{
    engine_sink_t k = {.s = s, .en = en, .o = o};
    iv_transpose_sink_t sink = {.window = engine_window, .ctx = &k};
    /* The output's folder holds the engine's replica of the input (an
     * unlinked file, see transpose.h) while the windows run. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out_path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
    else snprintf(dir, sizeof dir, ".");
    int reused = 0;
    iv_transpose_opts_t to = {.tmp_bytes = engine_window_bytes(s, en, o), .pool = o->pool,
                              .replica_dir = o->no_replica ? NULL : dir,
                              .replica_from = o->no_replica ? NULL : o->replica_from,
                              .replica_reused = &reused};
    iv_err_t e2;
    iv_err_clear(&e2);
    int rc = iv_transpose_to_sink(s->ds, &to, &sink, &e2);
    engine_sink_free(&k);
    if (rc == 0) {
        /* The dataset's row-index pass (none when it was kept), the
         * count pass, one read a window. */
        int kept = iv_dataset_info(s->ds)->index_kept;
        *n_passes = !kept + k.count_pass + k.windows;
        snprintf(rep->transpose, sizeof rep->transpose, "engine, %d window%s%s%s", k.windows,
                 k.windows == 1 ? "" : "s", reused ? ", input read from its plain copy" : "",
                 kept ? ", its row index read from the cache folder" : "");
        return 0;
    }
    if (rc != IV_EUNSUPPORTED || k.windows > 0) {
        *err = e2;
        return rc;
    }
    snprintf(rep->transpose, sizeof rep->transpose, "count and bands (the engine refused: %.400s)", e2.msg);
    iv_dataset_close(s->ds);
    s->ds = NULL;
    IV_TRY(open_iv(s, s->in_path, s->path, err));
    return run_transpose(s, en, o, n_passes, err);
}

/* ---- copying the rest ----------------------------------------------------- */

typedef struct copy_ctx {
    hid_t dst;
    const char *skip[8];
    size_t n_skip;
    const char *layer;        /* copy "layers" without this child */
    const char *replaced;     /* the matrix packed in place: not reported */
    int members;              /* --layers: leave layers and raw to pack_members */
    char *dropped;
    size_t dropped_cap;
    int rc;
    char what[600];
} copy_ctx_t;

static void add_dropped(copy_ctx_t *c, const char *name)
{
    size_t n = strlen(c->dropped);
    snprintf(c->dropped + n, c->dropped_cap - n, "%s%s", n ? ", " : "", name);
}

static int copy_group_except(hid_t src, const char *name, hid_t dst, const char *except)
{
    hid_t sg = H5Gopen2(src, name, H5P_DEFAULT);
    if (sg < 0) return -1;
    hid_t gcpl = H5Gget_create_plist(sg);
    hid_t dg = H5Gcreate2(dst, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    int rc = dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0 ? -1 : 0;
    H5G_info_t gi;
    if (rc == 0 && H5Gget_info(sg, &gi) < 0) rc = -1;
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[1024];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child,
                               H5P_DEFAULT) < 0)
            rc = -1;
        else if (strcmp(child, except) != 0 && iv_h5w_copy_object(sg, child, dg, child) < 0)
            rc = -1;
    }
    if (dg >= 0) H5Gclose(dg);
    if (gcpl >= 0) H5Pclose(gcpl);
    H5Gclose(sg);
    return rc;
}

static herr_t copy_root_cb(hid_t src, const char *name, const H5L_info_t *info, void *arg)
{
    (void)info;
    copy_ctx_t *c = arg;
    for (size_t i = 0; i < c->n_skip; i++)
        if (strcmp(name, c->skip[i]) == 0) {
            if (!c->replaced || strcmp(name, c->replaced) != 0) add_dropped(c, name);
            return 0;
        }
    /* --layers: layers and raw are written member by member afterwards. */
    if (c->members && (strcmp(name, "layers") == 0 || strcmp(name, "raw") == 0)) return 0;
    int rc;
    if (c->layer && strcmp(name, "layers") == 0) rc = copy_group_except(src, name, c->dst, c->layer);
    else rc = iv_h5w_copy_object(src, name, c->dst, name);
    if (rc < 0) {
        snprintf(c->what, sizeof c->what, "%s", name);
        c->rc = -1;
        return -1;
    }
    return 0;
}

/* ---- the whole job -------------------------------------------------------- */

static const char *indices_dtype_name(int64_t n_minor)
{
    if (n_minor <= INT16_MAX) return "int16";
    if (n_minor <= INT32_MAX) return "int32";
    return "int64";
}

/* Whether packing s into o->orient keeps its orientation (no transpose). */
static int keeps_orientation(const src_t *s, const iv_pack_opts_t *o)
{
    int cell_major = s->kind == SRC_CSR || s->kind == SRC_DENSE ||
                     (s->kind == SRC_IV && s->m.orient == IV_IVCSR);
    return cell_major ? o->orient == IV_IVCSR : o->orient == IV_IVCSC;
}

static void encoder_free(encoder_t *en)
{
    iv_h5w_array_free(en->values);
    iv_h5w_array_free(en->vptr);
    iv_h5w_array_free(en->packed);
    if (en->parts)
        for (unsigned k = 0; k < en->n_parts; k++) part_free(&en->parts[k]);
    free(en->parts);
    free(en->major_ptr);
}

/* The encoder of s's matrix in o's orientation, its per-slice arrays
 * checked against the memory budget before they are allocated. */
static int encoder_init(encoder_t *en, const src_t *s, const iv_pack_opts_t *o, int same,
                        iv_err_t *err)
{
    memset(en, 0, sizeof *en);
    en->orient = o->orient;
    en->n_major = o->orient == IV_IVCSR ? s->n_rows : s->n_cols;
    en->n_minor = o->orient == IV_IVCSR ? s->n_cols : s->n_rows;
    en->vdt = s->vdt;
    en->esz = s->esz;
    en->where = s->where;
    en->n_parts = (o->pool ? iv_pool_threads(o->pool) + 1 : 1) * 4;
    double need = slice_arrays_bytes(en->n_major, same), budget = (double)pack_budget(o);
    if (need > budget)
        return FAILF(IV_ETOO_LARGE, "%s: the output's %" PRId64 " %s need %.0f MiB of per-%s "
                     "arrays, more than the memory budget of %.0f MiB (--memory-mb)", s->where,
                     en->n_major, o->orient == IV_IVCSR ? "rows" : "columns", need / 1048576.0,
                     o->orient == IV_IVCSR ? "row" : "column", budget / 1048576.0);
    en->parts = calloc(en->n_parts, sizeof *en->parts);
    en->major_ptr = calloc((size_t)en->n_major + 1, sizeof *en->major_ptr);
    if (!en->parts || !en->major_ptr) return FAILF(IV_ENOMEM, "out of memory");
    return 0;
}

/* The output group with the format's attributes.  0 with *g open. */
static int create_group(hid_t out, const char *gname, const char *label, const src_t *s,
                        const encoder_t *en, hid_t *g, iv_err_t *err)
{
    if ((*g = H5Gcreate2(out, gname, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0)
        return FAILF(IV_EIO, "%s: cannot create the group", label);
    int64_t shape[2] = {s->n_rows, s->n_cols};
    if (iv_h5w_attr_encoding(*g, en->orient == IV_IVCSR ? "ivcsr" : "ivcsc", "0.1.0") < 0 ||
        iv_h5w_attr_i64(*g, "shape", shape, 2) < 0 ||
        iv_h5w_attr_str(*g, "indices_dtype", indices_dtype_name(en->n_minor)) < 0)
        return FAILF(IV_EIO, "%s: cannot write attributes", label);
    return 0;
}

/* The three arrays the encoder appends to (values, value_ptr starting
 * with its 0, packed_indices), with chunks no longer than the array can
 * get, so that small matrices do not carry a mostly padded chunk (it
 * matters for codec none). */
static int create_arrays(hid_t g, const char *label, const src_t *s, const iv_pack_opts_t *o,
                         encoder_t *en, iv_err_t *err)
{
    uint64_t nnz_bound = s->nnz >= 0 ? (uint64_t)s->nnz : (uint64_t)s->n_rows * (uint64_t)s->n_cols;
    uint64_t pchunk = o->chunk_bytes ? o->chunk_bytes : IV_PACK_DEFAULT_CHUNK;
    if (pchunk > nnz_bound * IV_VARINT_MAX) pchunk = nnz_bound * IV_VARINT_MAX;
    uint64_t vchunk = PTR_CHUNK < nnz_bound + 1 ? PTR_CHUNK : nnz_bound + 1;
    if (pchunk == 0) pchunk = 1;
    if (vchunk == 0) vchunk = 1;
    IV_TRY(iv_h5w_array_create(g, "values", s->vdt, vchunk, &o->codec, o->pool, 0, label, &en->values, err));
    IV_TRY(iv_h5w_array_create(g, "value_ptr", IV_DT_INT64, vchunk, &o->codec, o->pool, 0, label,
                               &en->vptr, err));
    IV_TRY(iv_h5w_array_create(g, "packed_indices", IV_DT_UINT8, pchunk, &o->codec, o->pool, 0, label,
                               &en->packed, err));
    int64_t zero = 0;
    return iv_h5w_array_append(en->vptr, &zero, 1, err);
}

/* After the last slice: major_ptr written whole, every array finished
 * (*mp is the caller's to free). */
static int finish_arrays(hid_t g, const char *label, const iv_pack_opts_t *o, encoder_t *en,
                         iv_h5w_array_t **mp, iv_err_t *err)
{
    if (en->done != en->n_major)
        return FAILF(IV_EINTERNAL, "%s: %" PRId64 " of %" PRId64 " slices written", label, en->done,
                     en->n_major);
    uint64_t mchunk = (uint64_t)en->n_major + 1 < PTR_CHUNK ? (uint64_t)en->n_major + 1 : PTR_CHUNK;
    IV_TRY(iv_h5w_array_create(g, "major_ptr", IV_DT_INT64, mchunk, &o->codec, o->pool, 0, label, mp, err));
    IV_TRY(iv_h5w_array_append(*mp, en->major_ptr, (uint64_t)en->n_major + 1, err));
    IV_TRY(iv_h5w_array_finish(*mp, err));
    IV_TRY(iv_h5w_array_finish(en->values, err));
    IV_TRY(iv_h5w_array_finish(en->vptr, err));
    return iv_h5w_array_finish(en->packed, err);
}

static void fill_report(iv_pack_report_t *rep, const src_t *s, const encoder_t *en,
                        iv_h5w_array_t *mp, int n_passes)
{
    rep->n_rows = s->n_rows;
    rep->n_cols = s->n_cols;
    rep->nnz = en->nnz;
    rep->n_unique = en->n_groups;
    rep->dtype = s->vdt;
    rep->stream_bytes = iv_h5w_array_length(en->packed);
    rep->stored_bytes = iv_h5w_array_stored(en->packed) + iv_h5w_array_stored(en->values) +
                        iv_h5w_array_stored(en->vptr) + iv_h5w_array_stored(mp);
    rep->input_bytes = s->bytes_read;
    rep->n_passes = n_passes;
}

static int write_packed(src_t *s, hid_t out, const char *out_path, const iv_pack_opts_t *o,
                        iv_pack_report_t *rep, iv_err_t *err)
{
    const char *gname = o->group && *o->group ? o->group : "X";
    char label[1200];
    snprintf(label, sizeof label, "%s:/%s", out_path, gname);
    iv_h5guard_stage("packing %s", s->where);
    int same = keeps_orientation(s, o), n_passes = 1, rc;
    encoder_t en;
    hid_t g = -1;
    iv_h5w_array_t *mp = NULL;
    if ((rc = encoder_init(&en, s, o, same, err)) == 0 &&
        (rc = create_group(out, gname, label, s, &en, &g, err)) == 0 &&
        (rc = create_arrays(g, label, s, o, &en, err)) == 0 &&
        (rc = same     ? run_direct(s, &en, o, err)
              : s->ds  ? run_engine(s, &en, o, out_path, &n_passes, rep, err)
                       : run_transpose(s, &en, o, &n_passes, err)) == 0 &&
        (rc = finish_arrays(g, label, o, &en, &mp, err)) == 0) {
        fill_report(rep, s, &en, mp, n_passes);
        if (!same && s->kind == SRC_IV && !rep->transpose[0])
            snprintf(rep->transpose, sizeof rep->transpose, "count and bands (%s)",
                     s->engine_note[0] ? s->engine_note : o->layers ? "with --layers" : "the engine off");
    }
    iv_h5w_array_free(mp);
    encoder_free(&en);
    if (g >= 0) H5Gclose(g);
    return rc;
}

/* One member (child, at path) of layers or raw: packed into the same path
 * when pack reads it as a matrix (raw's X only), else copied from sg to
 * dg as it is (an IVCSR/IVCSC group already packed included). */
static int pack_member(hid_t in, const char *in_path, hid_t sg, hid_t dg, hid_t out,
                       const char *out_path, const char *child, const char *path, int is_raw,
                       const iv_pack_opts_t *o, iv_pack_report_t *rep, iv_err_t *err)
{
    src_t s;
    memset(&s, 0, sizeof s);
    s.didx = s.ddata = s.ddense = -1;
    iv_err_t e2;
    iv_err_clear(&e2);
    int packable = !is_raw || strcmp(child, "X") == 0;
    int rc = packable ? src_open(&s, in, in_path, path, &e2) : IV_EUNSUPPORTED;
    if (rc == IV_EUNSUPPORTED) {
        src_close(&s);
        return iv_h5w_copy_object(sg, child, dg, child) < 0
                   ? FAILF(IV_EBAD_FILE, "%s:/%s: cannot copy the element", in_path, path)
                   : 0;
    }
    if (rc < 0) {
        src_close(&s);
        *err = e2;
        return rc;
    }
    iv_pack_opts_t mo = *o;
    mo.group = path;
    iv_pack_report_t mrep;
    memset(&mrep, 0, sizeof mrep);
    rc = write_packed(&s, out, out_path, &mo, &mrep, err);
    src_close(&s);
    if (rc == 0) {
        size_t n = strlen(rep->packed);
        snprintf(rep->packed + n, sizeof rep->packed - n, "%s%s", n ? ", " : "", path);
    }
    return rc;
}

/*
 * --layers: the group `gname` of the input ("layers" or "raw") into the
 * output member by member.  Each member that pack can read as a matrix
 * (csr_matrix, csc_matrix, a dense 2-D array; raw's X only, raw/var and
 * raw/varm are not matrices of cells) is packed into a group of the same
 * path in the orientation of X; anything else, an IVCSR/IVCSC group
 * already packed included, is copied as it is.  The group's own
 * attributes are kept.  rep->packed lists the members packed.
 */
static int pack_members(hid_t in, const char *in_path, hid_t out, const char *out_path,
                        const char *gname, const iv_pack_opts_t *o, iv_pack_report_t *rep,
                        iv_err_t *err)
{
    H5O_info_t oi;
    if (H5Lexists(in, gname, H5P_DEFAULT) <= 0) return 0;
    if (H5Oget_info_by_name(in, gname, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_GROUP)
        return iv_h5w_copy_object(in, gname, out, gname) < 0
                   ? FAILF(IV_EBAD_FILE, "%s:/%s: cannot copy", in_path, gname)
                   : 0;
    hid_t sg = H5Gopen2(in, gname, H5P_DEFAULT);
    if (sg < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: cannot open the group", in_path, gname);
    hid_t gcpl = H5Gget_create_plist(sg);
    hid_t dg = H5Gcreate2(out, gname, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    int rc = 0;
    if (dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0)
        rc = FAILF(IV_EIO, "%s:/%s: cannot create the group", out_path, gname);
    H5G_info_t gi;
    if (rc == 0 && H5Gget_info(sg, &gi) < 0)
        rc = FAILF(IV_EBAD_FILE, "%s:/%s: cannot list the group", in_path, gname);
    int is_raw = strcmp(gname, "raw") == 0;
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[512], path[600];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child,
                               H5P_DEFAULT) < 0) {
            rc = FAILF(IV_EBAD_FILE, "%s:/%s: cannot list the group", in_path, gname);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", gname, child);
        rc = pack_member(in, in_path, sg, dg, out, out_path, child, path, is_raw, o, rep, err);
    }
    if (dg >= 0) H5Gclose(dg);
    if (gcpl >= 0) H5Pclose(gcpl);
    H5Gclose(sg);
    return rc;
}

void iv_pack_temp_name(const char *out_path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.tmp%ld", out_path, (long)getpid());
}

/* The options that exclude each other, before anything is opened. */
static int check_pack_opts(const iv_pack_opts_t *o, const char *matrix, const char *gname,
                           iv_err_t *err)
{
    if (strchr(gname, '/'))
        return FAILF(IV_EINVALID_ARG, "output group '%s' must be a top-level name", gname);
    if (o->layers && (strcmp(matrix, "X") != 0 || strcmp(gname, "X") != 0))
        return FAILF(IV_EINVALID_ARG, "--layers packs X with its layers and raw/X: it goes with "
                     "matrix X into group X");
    if (o->layers && o->matrix_only)
        return FAILF(IV_EINVALID_ARG, "--layers and --matrix-only exclude each other");
    return 0;
}

/* The output's folder must exist: said before anything is read. */
static int check_out_folder(const char *out_path, iv_err_t *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out_path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return FAILF(IV_EIO, "%s: cannot write: folder '%s' does not exist", out_path, dir);
    return 0;
}

/* Opens the input read-only once it is known to be HDF5 with filters
 * this build decodes.  0 with *in open, or an error. */
static int open_input(const char *in_path, hid_t *in, iv_err_t *err)
{
    htri_t is = H5Fis_hdf5(in_path);
    if (is <= 0) {
        if (access(in_path, R_OK) != 0)
            return FAILF(IV_EIO, "%s: cannot open: %s", in_path, strerror(errno));
        return FAILF(IV_EBAD_FILE, "%s: not an HDF5 file", in_path);
    }
    *in = H5Fopen(in_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (*in < 0) return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file (truncated?)", in_path);
    iv_h5guard_stage("checking the filter pipelines");
    if (iv_h5_check_filters(*in, in_path, err) < 0) {
        H5Fclose(*in);
        return err->code;
    }
    return 0;
}

/* raw/X has raw/var's genes: the output takes raw's var and varm (the
 * root copy left out what describes the other gene set). */
static int copy_raw_axes(hid_t in, const char *in_path, hid_t out, iv_err_t *err)
{
    static const char *const from[] = {"raw/var", "raw/varm"}, *const to[] = {"var", "varm"};
    for (size_t i = 0; i < 2; i++)
        if (H5Lexists(in, from[i], H5P_DEFAULT) > 0 && iv_h5w_copy_object(in, from[i], out, to[i]) < 0)
            return FAILF(IV_EBAD_FILE, "%s:/%s: cannot copy", in_path, from[i]);
    return 0;
}

/* What the copy of the root leaves out: the output group, the matrix
 * packed (unless nested), for a layer its entry in layers, for raw/X the
 * elements that describe X's genes.  Returns whether the matrix is raw/X. */
static int copy_plan(copy_ctx_t *c, hid_t out, const iv_pack_opts_t *o, const char *matrix,
                     const char *gname, iv_pack_report_t *rep)
{
    memset(c, 0, sizeof *c);
    c->dst = out;
    c->dropped = rep->dropped;
    c->dropped_cap = sizeof rep->dropped;
    c->skip[c->n_skip++] = gname;
    c->members = o->layers;
    if (!strchr(matrix, '/')) c->skip[c->n_skip++] = matrix;
    if (strcmp(matrix, gname) == 0) c->replaced = gname;
    else if (strncmp(matrix, "layers/", 7) == 0 && !strchr(matrix + 7, '/')) c->layer = matrix + 7;
    if (strcmp(matrix, "raw/X") != 0) return 0;
    static const char *const other[] = {"var", "varm", "varp", "layers", "raw"};
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) c->skip[c->n_skip++] = other[i];
    return 1;
}

/* The root's attributes and everything else of the input into out, except
 * the matrix packed and what the output group replaces (--matrix-only:
 * the attributes alone).  Dropped elements are listed in rep->dropped. */
static int copy_rest(hid_t in, const char *in_path, hid_t out, const iv_pack_opts_t *o,
                     const char *matrix, const char *gname, iv_pack_report_t *rep, iv_err_t *err)
{
    hid_t rin = H5Gopen2(in, "/", H5P_DEFAULT), rout = H5Gopen2(out, "/", H5P_DEFAULT);
    int ok = rin >= 0 && rout >= 0 && iv_h5w_copy_attrs(rin, rout) >= 0;
    if (rin >= 0) H5Gclose(rin);
    if (rout >= 0) H5Gclose(rout);
    if (!ok) return FAILF(IV_EIO, "%s: cannot copy the root attributes", in_path);
    if (o->matrix_only) return 0;
    copy_ctx_t c;
    int raw = copy_plan(&c, out, o, matrix, gname, rep);
    hsize_t idx = 0;
    if (H5Literate(in, H5_INDEX_NAME, H5_ITER_INC, &idx, copy_root_cb, &c) < 0 || c.rc < 0)
        return FAILF(IV_EBAD_FILE, "%s:/%s: cannot copy the element (truncated file?)", in_path,
                     c.what[0] ? c.what : "?");
    return raw ? copy_raw_axes(in, in_path, out, err) : 0;
}

/* The packed matrix, then with --layers each member of layers and raw. */
static int write_matrices(src_t *s, hid_t in, const char *in_path, hid_t out, const char *out_path,
                          const iv_pack_opts_t *o, iv_pack_report_t *rep, iv_err_t *err)
{
    IV_TRY(write_packed(s, out, out_path, o, rep, err));
    if (!o->layers) return 0;
    IV_TRY(pack_members(in, in_path, out, out_path, "layers", o, rep, err));
    return pack_members(in, in_path, out, out_path, "raw", o, rep, err);
}

int iv_pack_file(const char *in_path, const char *out_path, const iv_pack_opts_t *o,
                 iv_pack_report_t *rep, iv_err_t *err)
{
    iv_pack_report_t local;
    if (!rep) rep = &local;
    memset(rep, 0, sizeof *rep);
    const char *matrix = o->matrix && *o->matrix ? o->matrix : "X";
    const char *gname = o->group && *o->group ? o->group : "X";
    IV_TRY(check_pack_opts(o, matrix, gname, err));
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    IV_TRY(check_out_folder(out_path, err));
    src_t s;
    memset(&s, 0, sizeof s);
    s.didx = s.ddata = s.ddense = -1;
    open_engine_input(&s, in_path, matrix, o);
    hid_t in = -1;
    int rc = open_input(in_path, &in, err);
    if (rc < 0) {
        src_close(&s);
        return rc;
    }

    char tmp[4200];
    iv_pack_temp_name(out_path, tmp, sizeof tmp);
    hid_t out = -1;
    rc = src_open(&s, in, in_path, matrix, err);
    if (rc < 0) goto fail;
    snprintf(rep->input_kind, sizeof rep->input_kind, "%s", src_kind_name(&s));
    iv_h5guard_temp(tmp);
    if ((out = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
        rc = FAILF(IV_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    if ((rc = copy_rest(in, in_path, out, o, matrix, gname, rep, err)) < 0 ||
        (rc = write_matrices(&s, in, in_path, out, out_path, o, rep, err)) < 0)
        goto fail;
    herr_t closed = H5Fclose(out);
    out = -1;
    if (closed < 0) {
        rc = FAILF(IV_EIO, "%s: closing the file failed (disk full?)", tmp);
        goto fail;
    }
    iv_h5guard_stage("closing %s", in_path);
    src_close(&s);
    H5Fclose(in);
    if (iv_h5guard_commit(tmp, out_path) != 0) {
        int e = errno;
        unlink(tmp);
        iv_h5guard_temp(NULL);
        return FAILF(IV_EIO, "%s: cannot rename the finished file into place: %s", out_path,
                     strerror(e));
    }
    iv_h5guard_temp(NULL);
    return 0;
fail:
    if (out >= 0) H5Fclose(out);
    unlink(tmp);
    iv_h5guard_temp(NULL);
    src_close(&s);
    H5Fclose(in);
    return rc < 0 ? rc : IV_EINTERNAL;
}
