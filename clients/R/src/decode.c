/* The binary result stream (application/vnd.ivserve.csr) decoded by C
 * into the slots of a dgCMatrix.
 *
 * Why C: the stream is a sequence of CSR blocks (cells x genes) and R
 * wants the matrix column-compressed.  Reading it with readBin and
 * building triplets left R to sort tens of millions of (i, j) pairs; here
 * the blocks are walked twice over the bytes already in memory (the HTTP
 * body, a raw vector or a sink, see sink.c): the first walk checks every
 * length, pointer and index against the header and counts the values of
 * each column, the second puts each value at its column's cursor.  Rows
 * are visited in order, so the row numbers within a column come out
 * sorted, as a dgCMatrix needs them.  When every row's columns are sorted
 * (any selection of genes in the file's order) the second walk only lists
 * the blocks, and gather_tiles places the values a tile of columns at a
 * time, so that the columns' cursors stay in cache; scatter_block, value
 * by value in stream order, is kept for unsorted rows and as the
 * reference the tiles are tested against.  Read as genes x cells (csc FALSE)
 * the stream is already in dgCMatrix order: the second walk copies each
 * block whole and sorts only rows whose genes came unsorted (a permuted
 * gene selection).
 *
 * Speed: the second walk converts each block's indices and values in
 * tight loops (one per stored dtype, chosen once per block) before
 * scattering them, rather than dispatching on the dtype per value; the
 * first walk checks a row's indices for range and order in one pass and
 * looks for repeated columns only in rows that are not strictly
 * increasing (a sorted row cannot repeat one).  The output vectors are
 * advised to use huge pages before their first touch (sink.c says why).
 *
 * The bytes are untrusted: every read is checked against the body's end
 * before it happens, every count against the header's shape, and a bad
 * or cut stream is reported as an error list for R to signal, never a
 * read past the body or an allocation sized by an unchecked number.
 *
 *   header  40 B: "IVQS" | u32 version | i64 rows | i64 cols | char[8] value dtype | char[8] index dtype
 *   block:  u32 1 | u32 0 | i64 n | i64 nnz | i64 obs[n] | i64 indptr[n+1] | indices[nnz] | values[nnz]
 *   trailer: u32 2 | u32 status | i64 rows | i64 nnz | u32 len | JSON error (len bytes)
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ivserve.h"

enum value_kind { V_I1, V_U1, V_I2, V_U2, V_I4, V_U4, V_I8, V_U8, V_F4, V_F8 };

static const struct {
    const char *name;
    enum value_kind kind;
    int size;
} value_dtypes[] = {
    {"|i1", V_I1, 1}, {"|u1", V_U1, 1}, {"<i2", V_I2, 2}, {"<u2", V_U2, 2},
    {"<i4", V_I4, 4}, {"<u4", V_U4, 4}, {"<i8", V_I8, 8}, {"<u8", V_U8, 8},
    {"<f4", V_F4, 4}, {"<f8", V_F8, 8},
};

struct cursor {
    const unsigned char *p;
    size_t left;
};

/* Little-endian loads, whatever the host's byte order (compilers make
 * each one load on little-endian hosts). */
static inline uint64_t le64(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint16_t le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static int take(struct cursor *c, size_t n, const unsigned char **out)
{
    if (c->left < n) return 0;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return 1;
}

/* n stored values from src to doubles; one loop per dtype. */
static void values_to_double(double *dst, const unsigned char *src, int64_t n, enum value_kind kind)
{
    switch (kind) {
    case V_I1: for (int64_t k = 0; k < n; k++) dst[k] = (double)(int8_t)src[k]; break;
    case V_U1: for (int64_t k = 0; k < n; k++) dst[k] = (double)src[k]; break;
    case V_I2: for (int64_t k = 0; k < n; k++) dst[k] = (double)(int16_t)le16(src + 2 * k); break;
    case V_U2: for (int64_t k = 0; k < n; k++) dst[k] = (double)le16(src + 2 * k); break;
    case V_I4: for (int64_t k = 0; k < n; k++) dst[k] = (double)(int32_t)le32(src + 4 * k); break;
    case V_U4: for (int64_t k = 0; k < n; k++) dst[k] = (double)le32(src + 4 * k); break;
    case V_I8: for (int64_t k = 0; k < n; k++) dst[k] = (double)(int64_t)le64(src + 8 * k); break;
    case V_U8: for (int64_t k = 0; k < n; k++) dst[k] = (double)le64(src + 8 * k); break;
    case V_F4:
        for (int64_t k = 0; k < n; k++) {
            uint32_t w = le32(src + 4 * k);
            float f;
            memcpy(&f, &w, sizeof f);
            dst[k] = (double)f;
        }
        break;
    case V_F8:
        for (int64_t k = 0; k < n; k++) {
            uint64_t w = le64(src + 8 * k);
            double d;
            memcpy(&d, &w, sizeof d);
            dst[k] = d;
        }
        break;
    }
}

/* n column indices (already checked to lie in [0, cols)) to ints. */
static void indices_to_int(int *dst, const unsigned char *src, int64_t n, int isize)
{
    if (isize == 4) {
        for (int64_t k = 0; k < n; k++) dst[k] = (int)(int32_t)le32(src + 4 * k);
    } else {
        for (int64_t k = 0; k < n; k++) dst[k] = (int)(int64_t)le64(src + 8 * k);
    }
}

static inline int64_t index_at(const unsigned char *p, int isize)
{
    return isize == 4 ? (int64_t)(int32_t)le32(p) : (int64_t)le64(p);
}

/* An error for R to signal: list(error = code, message, status). */
static SEXP fail(const char *code, const char *message, int status)
{
    SEXP out = PROTECT(allocVector(VECSXP, 3));
    SEXP names = PROTECT(allocVector(STRSXP, 3));
    SET_STRING_ELT(names, 0, mkChar("error"));
    SET_STRING_ELT(names, 1, mkChar("message"));
    SET_STRING_ELT(names, 2, mkChar("status"));
    SET_VECTOR_ELT(out, 0, mkString(code));
    SET_VECTOR_ELT(out, 1, mkString(message));
    SET_VECTOR_ELT(out, 2, ScalarInteger(status == 0 ? NA_INTEGER : status));
    setAttrib(out, R_NamesSymbol, names);
    UNPROTECT(2);
    return out;
}

struct stream {
    int64_t rows, cols;
    enum value_kind vkind;
    int vsize, isize;
    const unsigned char *blocks;   /* first frame */
    size_t blocks_len;
};

static const char *read_header(const unsigned char *b, size_t n, struct stream *s)
{
    if (n < 40) return "truncated";
    if (memcmp(b, "IVQS", 4) != 0 || le32(b + 4) != 1) return "not an ivserve binary stream (version 1)";
    s->rows = (int64_t)le64(b + 8);
    s->cols = (int64_t)le64(b + 16);
    if (s->rows < 0 || s->cols < 0 || s->rows > INT_MAX || s->cols > INT_MAX - 1)
        return "the header's shape does not fit an R sparse matrix";
    char vdt[9] = {0}, idt[9] = {0};
    memcpy(vdt, b + 24, 8);
    memcpy(idt, b + 32, 8);
    s->vsize = 0;
    for (size_t k = 0; k < sizeof value_dtypes / sizeof value_dtypes[0]; k++) {
        if (strcmp(vdt, value_dtypes[k].name) == 0) {
            s->vkind = value_dtypes[k].kind;
            s->vsize = value_dtypes[k].size;
        }
    }
    if (!s->vsize) return "unknown value dtype in the stream header";
    if (strcmp(idt, "<i4") == 0) s->isize = 4;
    else if (strcmp(idt, "<i8") == 0) s->isize = 8;
    else return "unknown index dtype in the stream header";
    s->blocks = b + 40;
    s->blocks_len = n - 40;
    return NULL;
}

/* One block frame's parts, its lengths checked against the bytes left. */
struct block {
    int64_t n, nnz;
    const unsigned char *obs, *indptr, *idx, *val;
};

static const char *next_block(struct cursor *c, const struct stream *s, int64_t seen,
                              struct block *bk)
{
    int64_t n = bk->n, nnz = bk->nnz;
    if (n < 0 || nnz < 0 || n > s->rows - seen) return "a block does not fit the announced rows";
    if (s->cols == 0 ? nnz != 0 : nnz / s->cols > n) return "a block holds more values than its rows can";
    /* Sizes below are products of checked counts: no size_t overflow. */
    if ((uint64_t)nnz > c->left / (uint64_t)(s->isize + s->vsize)) return "truncated";
    if (!take(c, (size_t)n * 8, &bk->obs) || !take(c, (size_t)(n + 1) * 8, &bk->indptr) ||
        !take(c, (size_t)nnz * (size_t)s->isize, &bk->idx) ||
        !take(c, (size_t)nnz * (size_t)s->vsize, &bk->val))
        return "truncated";
    int64_t prev = 0;
    if (le64(bk->indptr) != 0) return "a block's row pointers do not start at 0";
    for (int64_t r = 1; r <= n; r++) {
        int64_t q = (int64_t)le64(bk->indptr + 8 * r);
        if (q < prev || q > nnz) return "a block's row pointers are not monotone within its values";
        prev = q;
    }
    if (prev != nnz) return "a block's row pointers do not end at its value count";
    return NULL;
}

struct pair {
    int j;
    double x;
};

static int pair_cmp(const void *a, const void *b)
{
    int ja = ((const struct pair *)a)->j, jb = ((const struct pair *)b)->j;
    return (ja > jb) - (ja < jb);
}

/* One row's values in column order (the server sends them in the order of
 * the genes' selection, which a permuted selection makes unsorted). */
static void sort_row(int *j, double *x, int n, struct pair *tmp)
{
    for (int k = 0; k < n; k++) tmp[k] = (struct pair){j[k], x[k]};
    qsort(tmp, (size_t)n, sizeof *tmp, pair_cmp);
    for (int k = 0; k < n; k++) {
        j[k] = tmp[k].j;
        x[k] = tmp[k].x;
    }
}

/* What a walk fills: pass 0 checks every frame, counts values per column
 * (col_n, for the column-compressed output) and finds the longest row and
 * the largest block; pass 1 writes the values, either at each column's
 * cursor (cur, csc) or block after block (rowp, compressed by rows, each
 * row sorted by column). */
struct out {
    int csc;
    int *col_n, *last_row, *cur, *rowp, *ri;
    double *rx, *obs;
    int *tj;            /* csc: one block's column indices */
    double *tx;         /* csc: one block's values */
    struct pair *tmp;
    int64_t nnz, max_row, max_block;
    int unsorted;       /* pass 0: some row lists its columns out of order */
    int tile;           /* csc: columns per tile (gather_tiles), 0 for scatter_block */
    int64_t n_blocks;   /* pass 0 counts the frames, pass 1 lists them in blk */
    struct block *blk;
    int *blk_row;       /* the first row of each listed block */
};

/* Pass 0 for one row's indices [a, b): each within the result's columns,
 * no column twice; counts them per column when col_n is set. */
static const char *check_row(const struct stream *s, const unsigned char *idx, int64_t a, int64_t b,
                             int row, struct out *o)
{
    int64_t prev = -1;
    int sorted = 1;
    for (int64_t k = a; k < b; k++) {
        int64_t j = index_at(idx + (size_t)k * s->isize, s->isize);
        if (j < 0 || j >= s->cols) return "a column index is outside the result";
        if (j <= prev) sorted = 0;
        prev = j;
        if (o->col_n) o->col_n[j]++;
    }
    if (sorted) return NULL;
    o->unsorted = 1;
    for (int64_t k = a; k < b; k++) {
        int64_t j = index_at(idx + (size_t)k * s->isize, s->isize);
        if (o->last_row[j] == row) return "a row lists one column twice";
        o->last_row[j] = row;
    }
    return NULL;
}

static const char *check_block(const struct stream *s, const struct block *bk, int64_t seen,
                               struct out *o)
{
    for (int64_t r = 0; r < bk->n; r++) {
        int64_t id = (int64_t)le64(bk->obs + 8 * r);
        if (id < 0) return "a negative row id";
        o->obs[seen + r] = (double)id;
        int64_t a = (int64_t)le64(bk->indptr + 8 * r), b = (int64_t)le64(bk->indptr + 8 * (r + 1));
        if (b - a > o->max_row) o->max_row = b - a;
        const char *err = check_row(s, bk->idx, a, b, (int)(seen + r), o);
        if (err) return err;
    }
    if (bk->nnz > o->max_block) o->max_block = bk->nnz;
    o->n_blocks++;
    return NULL;
}

/* Pass 1, cells x genes: the block's values scattered to their columns. */
static void scatter_block(const struct stream *s, const struct block *bk, int64_t seen, struct out *o)
{
    int *tj = o->tj, *cur = o->cur, *ri = o->ri;
    double *tx = o->tx, *rx = o->rx;
    indices_to_int(tj, bk->idx, bk->nnz, s->isize);
    values_to_double(tx, bk->val, bk->nnz, s->vkind);
    for (int64_t r = 0; r < bk->n; r++) {
        int row = (int)(seen + r);
        int64_t a = (int64_t)le64(bk->indptr + 8 * r), b = (int64_t)le64(bk->indptr + 8 * (r + 1));
        for (int64_t k = a; k < b; k++) {
            int at = cur[tj[k]]++;
            ri[at] = row;
            rx[at] = tx[k];
        }
    }
}

/* Pass 1, genes x cells: the block copied whole at the values written so
 * far (base), its rows sorted where they are not. */
static void copy_block(const struct stream *s, const struct block *bk, int64_t seen, int64_t base,
                       struct out *o)
{
    int *ri = o->ri + base;
    double *rx = o->rx + base;
    indices_to_int(ri, bk->idx, bk->nnz, s->isize);
    values_to_double(rx, bk->val, bk->nnz, s->vkind);
    for (int64_t r = 0; r < bk->n; r++) {
        int a = (int)le64(bk->indptr + 8 * r), b = (int)le64(bk->indptr + 8 * (r + 1));
        o->rowp[seen + r + 1] = (int)base + b;
        for (int k = a + 1; k < b; k++) {
            if (ri[k] < ri[k - 1]) {
                sort_row(ri + a, rx + a, b - a, o->tmp);
                break;
            }
        }
    }
}

/* Pass 1, cells x genes, every row sorted: the same placement as
 * scatter_block, reordered for the caches.  scatter_block sends each value
 * to its column's cursor, one of tens of thousands spread over the output,
 * so nearly every store misses L2 (two lines a column, 4 MB of them for
 * 33,000 genes).  Here the columns are taken in tiles of o->tile: for each
 * tile every row in turn gives up its values below the tile's end (its
 * columns are sorted, so they are the next ones at its cursor), and the
 * tile's cursors and output lines stay in L2.  Rows are still visited in
 * order within each column, so the result is bit for bit scatter_block's;
 * the stream's bytes are read once in all, straight from the body (the
 * indices were checked in pass 0), with one function per index and value
 * dtype so that no dtype is dispatched per value. */
static inline int64_t idx_4(const unsigned char *p, int64_t k) { return (int32_t)le32(p + 4 * k); }
static inline int64_t idx_8(const unsigned char *p, int64_t k) { return (int64_t)le64(p + 8 * k); }
static inline double val_I1(const unsigned char *p, int64_t k) { return (double)(int8_t)p[k]; }
static inline double val_U1(const unsigned char *p, int64_t k) { return (double)p[k]; }
static inline double val_I2(const unsigned char *p, int64_t k) { return (double)(int16_t)le16(p + 2 * k); }
static inline double val_U2(const unsigned char *p, int64_t k) { return (double)le16(p + 2 * k); }
static inline double val_I4(const unsigned char *p, int64_t k) { return (double)(int32_t)le32(p + 4 * k); }
static inline double val_U4(const unsigned char *p, int64_t k) { return (double)le32(p + 4 * k); }
static inline double val_I8(const unsigned char *p, int64_t k) { return (double)(int64_t)le64(p + 8 * k); }
static inline double val_U8(const unsigned char *p, int64_t k) { return (double)le64(p + 8 * k); }
static inline double val_F4(const unsigned char *p, int64_t k)
{
    uint32_t w = le32(p + 4 * k);
    float f;
    memcpy(&f, &w, sizeof f);
    return (double)f;
}
static inline double val_F8(const unsigned char *p, int64_t k)
{
    uint64_t w = le64(p + 8 * k);
    double d;
    memcpy(&d, &w, sizeof d);
    return d;
}

/* Each row's next values lie a few KiB past the previous row's, a stride
 * the hardware prefetcher does not follow: the loop asks for the lines of
 * the row GATHER_AHEAD rows on (measured: about a quarter less CPU). */
#define GATHER_AHEAD 8
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif
enum { VSIZE_I1 = 1, VSIZE_U1 = 1, VSIZE_I2 = 2, VSIZE_U2 = 2, VSIZE_I4 = 4, VSIZE_U4 = 4,
       VSIZE_I8 = 8, VSIZE_U8 = 8, VSIZE_F4 = 4, VSIZE_F8 = 8 };

/* One block's rows for the tile ending at column c1: at[row] and end[row]
 * are each row's cursor and end within the block's values. */
typedef void gather_fn(const struct block *bk, int row0, int c1, int *at, const int *end,
                       struct out *o);

#define GATHER(IDX, VAL)                                                                     \
    static void gather_##IDX##_##VAL(const struct block *bk, int row0, int c1, int *at,       \
                                     const int *end, struct out *o)                           \
    {                                                                                         \
        const unsigned char *idx = bk->idx, *val = bk->val;                                   \
        int *cur = o->cur, *ri = o->ri;                                                       \
        double *rx = o->rx;                                                                   \
        int last = row0 + (int)bk->n;                                                         \
        for (int row = row0; row < last; row++) {                                             \
            if (row + GATHER_AHEAD < last) {                                                  \
                PREFETCH(idx + (size_t)at[row + GATHER_AHEAD] * IDX);                         \
                PREFETCH(val + (size_t)at[row + GATHER_AHEAD] * VSIZE_##VAL);                 \
            }                                                                                 \
            int k = at[row], e = end[row];                                                    \
            for (; k < e; k++) {                                                              \
                int64_t j = idx_##IDX(idx, k);                                                \
                if (j >= c1) break;                                                           \
                int p = cur[j]++;                                                             \
                ri[p] = row;                                                                  \
                rx[p] = val_##VAL(val, k);                                                    \
            }                                                                                 \
            at[row] = k;                                                                      \
        }                                                                                     \
    }
#define GATHER_BOTH(VAL) GATHER(4, VAL) GATHER(8, VAL)
GATHER_BOTH(I1) GATHER_BOTH(U1) GATHER_BOTH(I2) GATHER_BOTH(U2) GATHER_BOTH(I4)
GATHER_BOTH(U4) GATHER_BOTH(I8) GATHER_BOTH(U8) GATHER_BOTH(F4) GATHER_BOTH(F8)

static gather_fn *const gathers[][2] = {
    [V_I1] = {gather_4_I1, gather_8_I1}, [V_U1] = {gather_4_U1, gather_8_U1},
    [V_I2] = {gather_4_I2, gather_8_I2}, [V_U2] = {gather_4_U2, gather_8_U2},
    [V_I4] = {gather_4_I4, gather_8_I4}, [V_U4] = {gather_4_U4, gather_8_U4},
    [V_I8] = {gather_4_I8, gather_8_I8}, [V_U8] = {gather_4_U8, gather_8_U8},
    [V_F4] = {gather_4_F4, gather_8_F4}, [V_F8] = {gather_4_F8, gather_8_F8},
};

static void gather_tiles(const struct stream *s, struct out *o)
{
    int rows = (int)s->rows, cols = (int)s->cols;
    int *at = (int *)R_alloc((size_t)rows + 1, sizeof(int));
    int *end = (int *)R_alloc((size_t)rows + 1, sizeof(int));
    for (int64_t b = 0; b < o->n_blocks; b++) {
        const struct block *bk = &o->blk[b];
        for (int64_t r = 0; r < bk->n; r++) {
            at[o->blk_row[b] + r] = (int)le64(bk->indptr + 8 * r);
            end[o->blk_row[b] + r] = (int)le64(bk->indptr + 8 * (r + 1));
        }
    }
    gather_fn *fn = gathers[s->vkind][s->isize == 8];
    for (int c0 = 0; c0 < cols; c0 += o->tile) {
        int c1 = cols - c0 > o->tile ? c0 + o->tile : cols;
        for (int64_t b = 0; b < o->n_blocks; b++) fn(&o->blk[b], o->blk_row[b], c1, at, end, o);
    }
}

/* Walks the frames for pass 0 or 1 (struct out).  Returns an error list or
 * R_NilValue. */
static SEXP walk(const struct stream *s, int pass, struct out *o)
{
    struct cursor c = {s->blocks, s->blocks_len};
    int64_t seen = 0, nnz_seen = 0;
    for (;;) {
        const unsigned char *f;
        if (!take(&c, 24, &f)) return fail("truncated", "the result stream was cut (no trailer)", 0);
        uint32_t kind = le32(f), status = le32(f + 4);
        struct block bk = {(int64_t)le64(f + 8), (int64_t)le64(f + 16), NULL, NULL, NULL, NULL};
        if (kind == 2) {
            const unsigned char *lp, *msg;
            if (!take(&c, 4, &lp)) return fail("truncated", "the result stream was cut in its trailer", 0);
            uint32_t len = le32(lp);
            if (!take(&c, len, &msg)) return fail("truncated", "the result stream was cut in its trailer", 0);
            if (status != 0) {
                /* The server's JSON error; R parses it. */
                SEXP text = PROTECT(allocVector(RAWSXP, len));
                if (len) memcpy(RAW(text), msg, len);
                SEXP out = PROTECT(fail("stream_error", "", (int)status));
                SET_VECTOR_ELT(out, 1, text);
                UNPROTECT(2);
                return out;
            }
            if (bk.n != seen || bk.nnz != nnz_seen || seen != s->rows)
                return fail("bad_stream", "the trailer's counts differ from the stream's", 0);
            o->nnz = nnz_seen;
            return R_NilValue;
        }
        if (kind != 1 || status != 0) return fail("bad_stream", "unknown frame kind", 0);
        const char *err = next_block(&c, s, seen, &bk);
        if (err) {
            int cut = strcmp(err, "truncated") == 0;
            return fail(cut ? "truncated" : "bad_stream",
                        cut ? "the result stream was cut inside a block" : err, 0);
        }
        if (bk.nnz > (int64_t)INT_MAX - nnz_seen)
            return fail("bad_stream", "more values than an R sparse matrix holds (2^31 - 1)", 0);
        if (pass == 0) {
            err = check_block(s, &bk, seen, o);
            if (err) return fail("bad_stream", err, 0);
        } else if (o->csc && o->tile) {
            o->blk[o->n_blocks] = bk;   /* gather_tiles reads them after the walk */
            o->blk_row[o->n_blocks++] = (int)seen;
        } else if (o->csc) {
            scatter_block(s, &bk, seen, o);
        } else {
            copy_block(s, &bk, seen, nnz_seen, o);
        }
        seen += bk.n;
        nnz_seen += bk.nnz;
    }
}

/* A vector for the output, advised to huge pages before it is touched. */
static SEXP alloc_out(SEXPTYPE type, R_xlen_t n)
{
    SEXP v = allocVector(type, n);
    if (type == INTSXP) advise_huge(INTEGER(v), (size_t)n * sizeof(int));
    else advise_huge(REAL(v), (size_t)n * sizeof(double));
    return v;
}

/* Columns per tile of gather_tiles: a tile's cursors (4 B a column), the
 * two output lines each column is filling (64 B each) and the rows'
 * cursors fit in a core's L2 (1 MiB on the machine measured) with room for
 * the stream's lines.  On the 37,843 x 33,000 benchmark answer, CPU of
 * the decode (best / median of 6, alternating, load about 9 on 2 cores):
 * 512 columns 0.47 / 0.55 s, 1024 0.44 / 0.49, 2048 0.30 / 0.48, 4096
 * 0.39 / 0.46; scatter_block 0.76 / 0.96. */
#define TILE_COLS 2048

/* .Call entry: body (a raw vector, or a sink holding the answer), csc
 * (TRUE: compressed by columns, a dgCMatrix of cells x genes; FALSE: by
 * rows, which is also the dgCMatrix of genes x cells), tile (csc only:
 * NA for the default, 0 for scatter_block, the reference gather_tiles is
 * tested against, else columns per tile; any unsorted row means
 * scatter_block) -> list(p, i, x, obs, dim) or an error list (error,
 * message, status). */
SEXP ivs_decode_csr(SEXP body, SEXP csc, SEXP tile)
{
    const unsigned char *b;
    size_t blen;
    if (TYPEOF(body) == RAWSXP) {
        b = RAW(body);
        blen = (size_t)XLENGTH(body);
    } else if (TYPEOF(body) == EXTPTRSXP) {
        b = sink_bytes(body, &blen);
    } else {
        return fail("bad_stream", "the body is not a raw vector or a receive buffer", 0);
    }
    struct stream s;
    const char *err = read_header(b, blen, &s);
    if (err) return fail(strcmp(err, "truncated") == 0 ? "truncated" : "bad_stream",
                         strcmp(err, "truncated") == 0 ? "the result stream was cut in its header" : err, 0);
    int cols = (int)s.cols, rows = (int)s.rows;
    struct out o;
    memset(&o, 0, sizeof o);
    o.csc = asLogical(csc) == TRUE;
    int outer = o.csc ? cols : rows;
    SEXP p = PROTECT(allocVector(INTSXP, (R_xlen_t)outer + 1));
    SEXP obs = PROTECT(allocVector(REALSXP, rows));
    SEXP last = PROTECT(allocVector(INTSXP, cols));
    SEXP counts = PROTECT(allocVector(INTSXP, (R_xlen_t)cols + 1));
    int *pp = INTEGER(p);
    memset(pp, 0, sizeof(int) * ((size_t)outer + 1));
    memset(INTEGER(counts), 0, sizeof(int) * ((size_t)cols + 1));
    o.col_n = o.csc ? INTEGER(counts) + 1 : NULL;
    o.last_row = INTEGER(last);
    o.obs = REAL(obs);
    for (int j = 0; j < cols; j++) o.last_row[j] = -1;
    SEXP res = walk(&s, 0, &o);
    if (res != R_NilValue) {
        UNPROTECT(4);
        return res;
    }
    int want_tile = asInteger(tile);
    o.tile = want_tile == NA_INTEGER ? TILE_COLS : want_tile > 0 ? want_tile : 0;
    if (!o.csc || o.unsorted) o.tile = 0;
    if (o.tile) {
        o.blk = (struct block *)R_alloc((size_t)o.n_blocks + 1, sizeof(struct block));
        o.blk_row = (int *)R_alloc((size_t)o.n_blocks + 1, sizeof(int));
        o.n_blocks = 0;
    }
    if (o.csc) {
        /* Column counts to pointers; cursors (reusing last_row) at each column's start. */
        int *cn = INTEGER(counts);
        for (int j = 0; j < cols; j++) {
            cn[j + 1] += cn[j];
            pp[j + 1] = cn[j + 1];
            o.last_row[j] = cn[j];
        }
        o.cur = o.last_row;
        if (!o.tile) {
            o.tj = (int *)R_alloc((size_t)o.max_block + 1, sizeof(int));
            o.tx = (double *)R_alloc((size_t)o.max_block + 1, sizeof(double));
        }
    } else {
        o.rowp = pp;
        o.tmp = (struct pair *)R_alloc((size_t)o.max_row + 1, sizeof(struct pair));
    }
    SEXP i = PROTECT(alloc_out(INTSXP, (R_xlen_t)o.nnz));
    SEXP x = PROTECT(alloc_out(REALSXP, (R_xlen_t)o.nnz));
    o.ri = INTEGER(i);
    o.rx = REAL(x);
    walk(&s, 1, &o);
    if (o.tile) gather_tiles(&s, &o);
    SEXP dim = PROTECT(allocVector(INTSXP, 2));
    INTEGER(dim)[0] = o.csc ? rows : cols;
    INTEGER(dim)[1] = o.csc ? cols : rows;
    SEXP out = PROTECT(allocVector(VECSXP, 5));
    SEXP names = PROTECT(allocVector(STRSXP, 5));
    const char *nm[] = {"p", "i", "x", "obs", "dim"};
    SEXP parts[] = {p, i, x, obs, dim};
    for (int k = 0; k < 5; k++) {
        SET_VECTOR_ELT(out, k, parts[k]);
        SET_STRING_ELT(names, k, mkChar(nm[k]));
    }
    setAttrib(out, R_NamesSymbol, names);
    UNPROTECT(9);
    return out;
}
