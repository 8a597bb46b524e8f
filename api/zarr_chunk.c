/*
 * The Zarr store's chunks (see zarr.h): the bytes zarr-python writes for
 * the same array, chunking and compressor.
 *
 * Design.  A chunk is built whole into the response buffer: its size is
 * bounded by the chunking (IV_ZARR_X_CHUNK entries of X,
 * IV_ZARR_COL_CHUNK_BYTES of a column or embedding; strings are one chunk
 * a column, as clients read them whole).  Edge chunks are padded with the
 * fill value 0 to the whole chunk shape, as zarr-python stores them, so a
 * client comparing bytes or decoding by the chunk shape sees the same.
 *
 * X.  Entry e of X/indices and X/data is the e-th stored entry of the
 * orientation's order (gene-major for csc_matrix, cell-major for
 * csr_matrix), which is also what the pointer array X/indptr counts.
 * Chunk k covers [k*C, (k+1)*C): the major slices that hold it are found
 * by binary search on the pointers and decoded through the query engine
 * (query.h: every minor element selected, rows the major slices, indices
 * sorted within a slice, stored zeros kept), and the entries of the range
 * are copied out.  A chunk costs the decode of at most C entries plus the
 * two slices it cuts, whatever the matrix size; a cut slice of C entries
 * or more is decoded once for all the chunks it spans and kept
 * (zarr_slices.h), as a gene's chunks are asked for together.
 */
#include <stdlib.h>
#include <string.h>


#include "filecheck.h"
#include "h5write.h"
#include "query.h"
#include "zarr_cache.h"
#include "zarr_impl.h"

/* Appends n zero bytes to out and returns where they start (NULL: oom). */
static uint8_t *grow_zero(iv_buf_t *out, size_t n)
{
    if (iv_buf_reserve(out, n) != 0) return NULL;
    uint8_t *p = (uint8_t *)out->data + out->len;
    memset(p, 0, n);
    out->len += n;
    return p;
}

/* Stores v (an integer or a double, per is_float) at dst as type t. */
static void put_num(uint8_t *dst, iv_dtype_t t, int64_t iv, double dv, int is_float)
{
    if (t == IV_DT_FLOAT32) {
        float f = is_float ? (float)dv : (float)iv;
        memcpy(dst, &f, 4);
        return;
    }
    if (t == IV_DT_FLOAT64) {
        double d = is_float ? dv : (double)iv;
        memcpy(dst, &d, 8);
        return;
    }
    int64_t x = is_float ? (int64_t)dv : iv;
    switch (iv_dtype_size(t)) {
    case 1: { int8_t v = (int8_t)x; memcpy(dst, &v, 1); break; }
    case 2: { int16_t v = (int16_t)x; memcpy(dst, &v, 2); break; }
    case 4: { int32_t v = (int32_t)x; memcpy(dst, &v, 4); break; }
    default: memcpy(dst, &x, 8); break;
    }
}

/* ---- X ------------------------------------------------------------------------ */

/* The orientation an X array is read from, or why there is none. */
static int x_orient(const zarr_arr_t *a, iv_dataset_t **md, iv_err_t *err)
{
    iv_orient_t want = a->csr ? IV_IVCSR : IV_IVCSC;
    const char *what = a->csr ? "cell-major" : "gene-major";
    iv_dataset_t *ds = a->mx;
    *md = iv_dataset_info(ds)->orient == want ? ds : iv_dataset_other(ds);
    if (*md) return 0;
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    if (st.other_state == IV_OTHER_NONE || st.other_state == IV_OTHER_BUILDING)
        return iv_fail(err, IV_ENOT_READY, "X's %s orientation is being built; retry later", what);
    return iv_fail(err, IV_EUNKNOWN_MATRIX, "X has no %s orientation (%s)%s", what,
                   st.other_state == IV_OTHER_SKIPPED ? "over its memory budget" : "its build failed",
                   a->csr ? "" : "; the csr/ store serves X from the other one");
}

/* The CSR/CSC pointers of an orientation are composed: slice j owns the
 * (slice, value) groups major_ptr[j].. and group g the entries
 * value_ptr[g].. (FORMAT.md), so slice j starts at entry
 * value_ptr[major_ptr[j]]. */
typedef struct ptrs {
    const int64_t *major, *value;
} ptrs_t;

static inline int64_t entry_at(const ptrs_t *p, int64_t j)
{
    return p->value[p->major[j]];
}

/* First j in [0, n) with entry_at(j) > v (n when none). */
static int64_t upper_bound(const ptrs_t *p, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (entry_at(p, mid) <= v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* First j in [0, n) with entry_at(j) >= v (n when none). */
static int64_t lower_bound(const ptrs_t *p, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (entry_at(p, mid) < v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* One chunk's decode: both parts, indices and values. */
typedef struct xfill {
    iv_dataset_t *ds;         /* the matrix (its shape, the query engine's entry) */
    iv_dataset_t *md;         /* its orientation read */
    int csr;
    int64_t C, k;
    int zstd;
    iv_dtype_t idx_vt, val_vt;
    iv_zarr_slices_t *slices; /* decoded long slices (zarr_slices.h), or NULL */
} xfill_t;

/* Copies the entries of one decoded block that fall in [lo, hi) into the
 * chunk's parts (entry lo at idx[0], val[0]). */
static int copy_block(const xfill_t *f, const iv_block_t *blk, const ptrs_t *p, int64_t lo,
                      int64_t hi, uint8_t *idx, uint8_t *val, iv_err_t *err)
{
    size_t isz = iv_dtype_size(f->idx_vt), vsz = iv_dtype_size(f->val_vt);
    if (blk->dtype != f->val_vt)
        return iv_fail(err, IV_ECORRUPT, "X: decoded values are %s, not %s", iv_dtype_name(blk->dtype),
                       iv_dtype_name(f->val_vt));
    for (int64_t r = 0; r < blk->n_rows; r++) {
        int64_t j = blk->ids[r];
        int64_t n = blk->indptr[r + 1] - blk->indptr[r];
        int64_t start = entry_at(p, j), end = entry_at(p, j + 1);
        if (n != end - start)
            return iv_fail(err, IV_ECORRUPT, "X: slice %lld decoded %lld entries, its pointers say %lld",
                           (long long)j, (long long)n, (long long)(end - start));
        int64_t s = start > lo ? start : lo, e = end < hi ? end : hi;
        if (e <= s) continue;
        int64_t t = blk->indptr[r] + s - start;
        size_t n_copy = (size_t)(e - s);
        memcpy(val + (size_t)(s - lo) * vsz, (const uint8_t *)blk->data + (size_t)t * vsz, n_copy * vsz);
        uint8_t *d = idx + (size_t)(s - lo) * isz;
        if ((size_t)blk->index_size == isz) {
            memcpy(d, (const uint8_t *)blk->indices + (size_t)t * isz, n_copy * isz);
        } else {
            for (size_t i = 0; i < n_copy; i++) {
                int64_t ix = blk->index_size == 4 ? ((const int32_t *)blk->indices)[t + (int64_t)i]
                                                  : ((const int64_t *)blk->indices)[t + (int64_t)i];
                put_num(d + i * isz, f->idx_vt, ix, 0, 0);
            }
        }
    }
    return 0;
}

/* The major slices [*j0, *j1) holding entries [lo, hi): the last one
 * starting at or before lo, up to the first one starting at or after hi. */
static int x_slices(const ptrs_t *p, int64_t n_major, int64_t nnz, int64_t lo, int64_t hi,
                    int64_t *j0, int64_t *j1, iv_err_t *err)
{
    if (entry_at(p, 0) != 0 || entry_at(p, n_major) != nnz)
        return iv_fail(err, IV_ECORRUPT, "X: the pointers do not span the %lld entries", (long long)nnz);
    *j0 = upper_bound(p, n_major + 1, lo) - 1;
    *j1 = lower_bound(p, n_major + 1, hi);
    if (*j0 < 0 || *j1 > n_major || *j1 <= *j0)
        return iv_fail(err, IV_ECORRUPT, "X: no slices hold entries %lld..%lld (%lld..%lld of %lld)",
                       (long long)lo, (long long)hi, (long long)*j0, (long long)*j1,
                       (long long)n_major);
    return 0;
}

/* The query decoding major slices [j0, j1) whole (every minor element),
 * prepared. */
static int x_query_new(const xfill_t *f, int64_t j0, int64_t j1, iv_query_t **q, iv_err_t *err)
{
    int64_t n = j1 - j0;
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    for (int64_t i = 0; i < n; i++) ids[i] = j0 + i;
    iv_sel_t all = {.all = 1}, major = {.n = n, .idx = ids};
    iv_query_opts_t o = {
        .axis = f->csr ? IV_OUT_ROWS : IV_OUT_VARS,
        .pick = f->csr ? IV_PICK_CELLS : IV_PICK_GENES,
    };
    *q = NULL;
    int rc = iv_query_new(f->ds, f->csr ? &major : &all, f->csr ? &all : &major, &o, q, err);
    free(ids);
    if (rc == 0) rc = iv_query_prepare(*q, NULL, err);
    return rc;
}

/* Decodes major slices [j0, j1) and copies their entries in [lo, hi). */
static int x_query(const xfill_t *f, int64_t j0, int64_t j1, const ptrs_t *p, int64_t lo, int64_t hi,
                   uint8_t *idx, uint8_t *val, iv_err_t *err)
{
    iv_query_t *q = NULL;
    int rc = x_query_new(f, j0, j1, &q, err);
    for (int64_t b = 0; rc == 0 && b < iv_query_n_blocks(q); b++) {
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        rc = iv_query_decode_block(q, b, &blk, err);
        if (rc == 0) rc = copy_block(f, &blk, p, lo, hi, idx, val, err);
        iv_block_free(&blk);
    }
    iv_query_free(q);
    return rc;
}

/* iv_zarr_slice_fn (ctx: the chunk's xfill_t): slice j alone, as one block. */
static int x_slice_block(void *ctx, int64_t j, iv_block_t *out, iv_err_t *err)
{
    iv_query_t *q = NULL;
    int rc = x_query_new(ctx, j, j + 1, &q, err);
    if (rc == 0 && iv_query_n_blocks(q) != 1)
        rc = iv_fail(err, IV_EINTERNAL, "X: slice %lld decoded as %lld blocks", (long long)j,
                     (long long)iv_query_n_blocks(q));
    if (rc == 0) rc = iv_query_decode_block(q, 0, out, err);
    if (rc != 0) iv_block_free(out);  /* nothing half-made goes back */
    iv_query_free(q);
    return rc;
}

/* Copies slice j's part of [lo, hi) from its decode kept in f's memo
 * (zarr_slices.h), decoding it there first when no chunk has. */
static int x_kept_slice(const xfill_t *f, int64_t j, const ptrs_t *p, int64_t lo, int64_t hi,
                        uint8_t *idx, uint8_t *val, iv_err_t *err)
{
    size_t bytes = (size_t)(entry_at(p, j + 1) - entry_at(p, j)) *
                   (iv_dtype_size(f->val_vt) + sizeof(int64_t));
    iv_block_t scratch;
    const iv_block_t *b = NULL;
    int rc = iv_zarr_slices_get(f->slices, f->ds, f->csr, j, bytes, x_slice_block, (void *)f, &scratch,
                                &b, err);
    if (rc == 0) rc = copy_block(f, b, p, lo, hi, idx, val, err);
    iv_zarr_slices_release(f->slices, b, &scratch);
    return rc;
}

/* Whether slice j, cut by the chunk, is worth keeping for the chunks
 * after it: it holds a chunk's worth of entries, so it spans at least two. */
static int x_long(const xfill_t *f, const ptrs_t *p, int64_t j)
{
    return entry_at(p, j + 1) - entry_at(p, j) >= f->C;
}

/* Decodes chunk f->k of X into idx and val (zeroed past the end): the
 * major slices holding its entries, through the query engine.  A long
 * slice the chunk cuts at either end comes from the memo (decoded once
 * for all the chunks it spans); the slices between are decoded here. */
static int x_decode(const xfill_t *f, uint8_t *idx, uint8_t *val, iv_err_t *err)
{
    /* The shape from the matrix's own info: both orientations share it. */
    const iv_dataset_info_t *in = iv_dataset_info(f->ds);
    ptrs_t p = {iv_dataset_major_ptr(f->md), iv_dataset_value_ptr(f->md)};
    int64_t C = f->C, j0 = 0, j1 = 0;
    int64_t lo = f->k * C, hi = lo + C < in->nnz ? lo + C : in->nnz;
    memset(idx, 0, (size_t)C * iv_dtype_size(f->idx_vt));
    memset(val, 0, (size_t)C * iv_dtype_size(f->val_vt));
    IV_TRY(x_slices(&p, f->csr ? in->n_rows : in->n_cols, in->nnz, lo, hi, &j0, &j1, err));
    /* The cut slices: the first when it starts before lo, the last when
     * it ends after hi (one slice may be both). */
    int head = entry_at(&p, j0) < lo && x_long(f, &p, j0);
    int tail = entry_at(&p, j1) > hi && (!head || j1 - 1 > j0) && x_long(f, &p, j1 - 1);
    if (head) IV_TRY(x_kept_slice(f, j0, &p, lo, hi, idx, val, err));
    if (tail) IV_TRY(x_kept_slice(f, j1 - 1, &p, lo, hi, idx, val, err));
    int64_t a = j0 + head, b = j1 - tail;
    return a < b ? x_query(f, a, b, &p, lo, hi, idx, val, err) : 0;
}

/* Appends a chunk's n raw bytes to out as the array's compressor encodes
 * them: as they are, or zstd at IV_ZARR_ZSTD_LEVEL through the packer's
 * compressor (h5write.h: one context a thread, ZSTD_compressCCtx, the
 * bytes of ZSTD_compress, which numcodecs' Zstd calls: zarr-python's). */
static int encode_chunk(int zstd, const uint8_t *raw, size_t n, iv_buf_t *out, iv_err_t *err)
{
    if (!zstd) {
        iv_buf_append(out, raw, n);
        return out->oom ? iv_fail(err, IV_ENOMEM, "out of memory for a chunk") : 0;
    }
    static const iv_h5w_codec_t zstd_codec = {IV_H5W_ZSTD, IV_ZARR_ZSTD_LEVEL};
    size_t cap = iv_h5w_bound(&zstd_codec, n);
    if (iv_buf_reserve(out, cap) != 0) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    size_t z = iv_h5w_compress(&zstd_codec, raw, n, out->data + out->len, cap);
    if (z == 0) return iv_fail(err, IV_EINTERNAL, "zstd could not compress a chunk of %zu bytes", n);
    out->len += z;
    return 0;
}

/* iv_zarr_fill_fn: chunk f->k's two parts, decoded then encoded. */
static int x_fill(void *ctx, iv_buf_t parts[2], iv_err_t *err)
{
    const xfill_t *f = ctx;
    size_t n_idx = (size_t)f->C * iv_dtype_size(f->idx_vt);
    size_t n_val = (size_t)f->C * iv_dtype_size(f->val_vt);
    uint8_t *raw = malloc(n_idx + n_val);
    if (!raw) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    int rc = x_decode(f, raw, raw + n_idx, err);
    if (rc == 0) rc = encode_chunk(f->zstd, raw, n_idx, &parts[0], err);
    if (rc == 0) rc = encode_chunk(f->zstd, raw + n_idx, n_val, &parts[1], err);
    free(raw);
    return rc;
}

/* X/indptr of orientation md, its first n entries (n_major + 1 for the
 * whole), allocated; NULL when out of memory. */
static int64_t *x_indptr(iv_dataset_t *md, size_t n)
{
    ptrs_t p = {iv_dataset_major_ptr(md), iv_dataset_value_ptr(md)};
    int64_t *d = malloc(n * sizeof *d);
    if (d)
        for (size_t j = 0; j < n; j++) d[j] = entry_at(&p, (int64_t)j);
    return d;
}

/* The fill of chunk k of matrix mx's orientation md (csr: cell-major),
 * C entries a chunk. */
static xfill_t xfill_of(const iv_zarr_src_t *src, iv_dataset_t *mx, iv_dataset_t *md, int csr, int64_t C,
                        int64_t k)
{
    const iv_dataset_info_t *in = iv_dataset_info(mx);
    int64_t n_minor = csr ? in->n_cols : in->n_rows;
    return (xfill_t){
        .ds = mx, .md = md, .csr = csr, .C = C, .k = k, .zstd = IV_ZARR_ZSTD_LEVEL != 0,
        .idx_vt = n_minor <= INT32_MAX ? IV_DT_INT32 : IV_DT_INT64, .val_vt = in->value_dtype,
        .slices = iv_zarr_cache_slices(src->cache),
    };
}

static int x_entries(const iv_zarr_src_t *src, const zarr_arr_t *a, iv_dataset_t *md, int64_t k,
                     iv_buf_t *out, iv_err_t *err)
{
    int want_val = a->src == ZS_X_DATA;
    int rc = iv_zarr_cache_kept_read(src->cache, a->mx, a->csr, a->chunks[0], k, want_val, out, err);
    if (rc != 0) return rc < 0 ? rc : 0;
    xfill_t f = xfill_of(src, a->mx, md, a->csr, a->chunks[0], k);
    f.zstd = a->zstd;
    return iv_zarr_cache_get(src->cache, a->mx, a->csr, f.C, k, want_val, out, x_fill, &f, err);
}

int zarr_x_orient(iv_dataset_t *mx, int csr, iv_dataset_t **md, iv_err_t *err)
{
    zarr_arr_t a = {.csr = csr, .mx = mx};
    return x_orient(&a, md, err);
}

int zarr_x_parts(const iv_zarr_src_t *src, iv_dataset_t *mx, iv_dataset_t *md, int csr, int64_t C,
                 int64_t k, iv_buf_t parts[2], iv_err_t *err)
{
    xfill_t f = xfill_of(src, mx, md, csr, C, k);
    return x_fill(&f, parts, err);
}

uint64_t zarr_x_ptr_sum(iv_dataset_t *md, int64_t n_major)
{
    int64_t *d = x_indptr(md, (size_t)n_major + 1);
    if (!d) return 0;
    uint64_t s = iv_file_sum(d, ((size_t)n_major + 1) * sizeof *d);
    free(d);
    return s;
}

static int x_chunk(const iv_zarr_src_t *src, const zarr_arr_t *a, int64_t k, iv_buf_t *out,
                   iv_err_t *err)
{
    iv_dataset_t *md;
    IV_TRY(x_orient(a, &md, err));
    if (a->src != ZS_X_INDPTR) return x_entries(src, a, md, k, out, err);
    /* One chunk: the whole pointer array. */
    size_t n = (size_t)a->shape[0];
    int64_t *d = x_indptr(md, n);
    if (!d) return iv_fail(err, IV_ENOMEM, "out of memory for X/indptr");
    int rc = encode_chunk(a->zstd, (const uint8_t *)d, n * sizeof *d, out, err);
    free(d);
    return rc;
}

/* ---- columns and arrays -------------------------------------------------------- */

static int col_chunk(const zarr_arr_t *a, int64_t k, iv_buf_t *out, iv_err_t *err)
{
    const iv_meta_col_t *c = a->col;
    int64_t C = a->chunks[0], lo = k * C, hi = lo + C < a->shape[0] ? lo + C : a->shape[0];
    size_t isz = a->is_bool ? 1 : iv_dtype_size(a->vt);
    uint8_t *dst = grow_zero(out, (size_t)C * isz);
    if (!dst) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    for (int64_t i = lo; i < hi; i++) {
        uint8_t *d = dst + (size_t)(i - lo) * isz;
        if (a->src == ZS_COL_MASK) *d = c->mask && c->mask[i] ? 1 : 0;
        else if (a->src == ZS_CATS_NUM) put_num(d, a->vt, 0, c->cat_num[i], 1);
        else if (c->type == IV_COL_CATEGORICAL) put_num(d, a->vt, c->codes[i], 0, 0);
        else if (c->type == IV_COL_BOOL) *d = c->b[i] ? 1 : 0;
        else if (c->type == IV_COL_INT) put_num(d, a->vt, c->mask && c->mask[i] ? 0 : c->i64[i], 0, 0);
        else put_num(d, a->vt, 0, c->f64[i], 1);
    }
    return 0;
}

static void put_u32(iv_buf_t *out, size_t v)
{
    iv_buf_u32le(out, (uint32_t)v);
}

/* numcodecs' vlen-utf8: the item count, then each item's byte length and
 * bytes (little-endian 32-bit lengths).  A missing string is "". */
static int str_chunk(const zarr_arr_t *a, iv_buf_t *out, iv_err_t *err)
{
    const iv_meta_col_t *c = a->col;
    int64_t n = a->shape[0];
    for (int64_t i = 0; i < n; i++) {
        const char *s = a->src == ZS_CATS_STR ? iv_meta_col_cat(c, i) : iv_meta_col_str(c, i);
        if (strlen(s) > UINT32_MAX) return iv_fail(err, IV_ETOO_LARGE, "a string over 4 GiB");
    }
    put_u32(out, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const char *s = a->src == ZS_CATS_STR ? iv_meta_col_cat(c, i) : iv_meta_col_str(c, i);
        if (a->src == ZS_COL_STR && c->mask && c->mask[i]) s = "";
        size_t l = strlen(s);
        put_u32(out, l);
        iv_buf_append(out, s, l);
    }
    return 0;
}

static int marray_chunk(const zarr_arr_t *a, int64_t k, iv_buf_t *out, iv_err_t *err)
{
    const iv_marray_t *m = a->ma;
    size_t row = iv_dtype_size(m->dtype) * (size_t)m->n_cols;
    int64_t R = a->chunks[0], lo = k * R, hi = lo + R < m->n_rows ? lo + R : m->n_rows;
    uint8_t *dst = grow_zero(out, (size_t)R * row);
    if (!dst) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    memcpy(dst, (const uint8_t *)m->data + (size_t)lo * row, (size_t)(hi - lo) * row);
    return 0;
}

/* ---- uns ------------------------------------------------------------------------ */

/* numpy's "<UN" scalar: the code points in UTF-32LE, padded with zeros to
 * the width (uns.h checked that the string is UTF-8). */
static int ustr_chunk(const zarr_arr_t *a, iv_buf_t *out, iv_err_t *err)
{
    size_t len;
    const unsigned char *s = (const unsigned char *)iv_uns_str(a->ue, 0, &len);
    uint8_t *dst = grow_zero(out, (size_t)a->ustr_width * 4);
    if (!dst) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    for (size_t i = 0, n = 0; i < len && n < (size_t)a->ustr_width; n++) {
        unsigned c = s[i], k = c < 0x80 ? 0 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
        uint32_t cp = k == 0 ? c : c & (0x3fu >> k);
        for (unsigned j = 1; j <= k && i + j < len; j++) cp = (cp << 6) | (s[i + j] & 0x3fu);
        i += k + 1;
        uint8_t le[4] = {(uint8_t)cp, (uint8_t)(cp >> 8), (uint8_t)(cp >> 16), (uint8_t)(cp >> 24)};
        memcpy(dst + n * 4, le, 4);
    }
    return 0;
}

static int uns_chunk(const zarr_arr_t *a, int64_t k, iv_buf_t *out, iv_err_t *err)
{
    const iv_uns_entry_t *e = a->ue;
    if (a->ustr_width) return ustr_chunk(a, out, err);
    if (e->kind == IV_UNS_STR) {
        put_u32(out, (size_t)e->n);
        for (int64_t i = 0; i < e->n; i++) {
            size_t len;
            const char *str = iv_uns_str(e, i, &len);
            put_u32(out, len);
            iv_buf_append(out, str, len);
        }
        return 0;
    }
    size_t isz = e->kind == IV_UNS_BOOL ? 1 : iv_dtype_size(e->dtype);
    int64_t C = a->ndim ? a->chunks[0] : 1, lo = k * C, hi = lo + C < e->n ? lo + C : e->n;
    uint8_t *dst = grow_zero(out, (size_t)C * isz);
    if (!dst) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    if (hi > lo) memcpy(dst, (const uint8_t *)e->data + (size_t)lo * isz, (size_t)(hi - lo) * isz);
    return 0;
}

int zarr_chunk(const iv_zarr_src_t *src, const zarr_arr_t *a, const int64_t idx[2], iv_buf_t *out,
               iv_err_t *err)
{
    switch (a->src) {
    case ZS_X_INDPTR:
    case ZS_X_INDICES:
    case ZS_X_DATA: return x_chunk(src, a, idx[0], out, err);
    case ZS_COL:
    case ZS_COL_MASK:
    case ZS_CATS_NUM: return col_chunk(a, idx[0], out, err);
    case ZS_COL_STR:
    case ZS_CATS_STR: return str_chunk(a, out, err);
    case ZS_MARRAY: return marray_chunk(a, idx[0], out, err);
    case ZS_UNS: return uns_chunk(a, idx[0], out, err);
    }
    return iv_fail(err, IV_ENOT_FOUND, "no such chunk");
}
