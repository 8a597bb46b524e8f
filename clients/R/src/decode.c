/* The binary result stream (application/vnd.ivserve.csr) decoded in one
 * pass of C into the slots of a dgCMatrix.
 *
 * Why C: the stream is a sequence of CSR blocks (cells x genes) and R
 * wants the matrix column-compressed.  Reading it with readBin and
 * building triplets left R to sort tens of millions of (i, j) pairs; here
 * the blocks are walked twice over the bytes already in memory (the HTTP
 * body): the first walk checks every length, pointer and index against
 * the header and counts the values of each column, the second puts each
 * value at its column's cursor.  Rows are visited in order, so the row
 * numbers within a column come out sorted, as a dgCMatrix needs them.
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
#include <string.h>

#include <R.h>
#include <Rinternals.h>
#include <R_ext/Rdynload.h>

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

/* Little-endian loads, whatever the host's byte order. */
static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int take(struct cursor *c, size_t n, const unsigned char **out)
{
    if (c->left < n) return 0;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return 1;
}

static double value_at(const unsigned char *p, enum value_kind kind)
{
    switch (kind) {
    case V_I1: return (double)(int8_t)p[0];
    case V_U1: return (double)p[0];
    case V_I2: return (double)(int16_t)(uint16_t)(p[0] | p[1] << 8);
    case V_U2: return (double)(uint16_t)(p[0] | p[1] << 8);
    case V_I4: return (double)(int32_t)le32(p);
    case V_U4: return (double)le32(p);
    case V_I8: return (double)(int64_t)le64(p);
    case V_U8: return (double)le64(p);
    case V_F4: {
        uint32_t w = le32(p);
        float f;
        memcpy(&f, &w, sizeof f);
        return (double)f;
    }
    case V_F8: {
        uint64_t w = le64(p);
        double d;
        memcpy(&d, &w, sizeof d);
        return d;
    }
    }
    return NA_REAL;
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

static int64_t index_at(const unsigned char *p, int isize)
{
    return isize == 4 ? (int64_t)(int32_t)le32(p) : (int64_t)le64(p);
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

/* What a walk fills: pass 0 checks every frame and counts values per
 * column (col_n, for the column-compressed output) and the longest row;
 * pass 1 writes the values, either at each column's cursor (cur, csc) or
 * row after row (rowp, compressed by rows, each row sorted by column). */
struct out {
    int csc;
    int *col_n, *last_row, *cur, *rowp, *ri;
    double *rx, *obs;
    struct pair *tmp;
    int64_t nnz, max_row;
};

/* Walks the frames for pass 0 or 1 (struct out).  Returns an error list or
 * R_NilValue. */
static SEXP walk(const struct stream *s, int pass, struct out *o)
{
    int *col_n = o->col_n, *last_row = o->last_row, *cur = o->cur, *ri = o->ri;
    double *rx = o->rx, *obs_out = o->obs;
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
        for (int64_t r = 0; r < bk.n; r++) {
            int row = (int)(seen + r);
            int64_t a = (int64_t)le64(bk.indptr + 8 * r), b = (int64_t)le64(bk.indptr + 8 * (r + 1));
            if (pass == 0) {
                if (b - a > o->max_row) o->max_row = b - a;
                int64_t id = (int64_t)le64(bk.obs + 8 * r);
                if (id < 0) return fail("bad_stream", "a negative row id", 0);
                obs_out[row] = (double)id;
                for (int64_t k = a; k < b; k++) {
                    int64_t j = index_at(bk.idx + (size_t)k * s->isize, s->isize);
                    if (j < 0 || j >= s->cols) return fail("bad_stream", "a column index is outside the result", 0);
                    if (last_row[j] == row) return fail("bad_stream", "a row lists one column twice", 0);
                    last_row[j] = row;
                    col_n[j]++;
                }
            } else if (o->csc) {
                for (int64_t k = a; k < b; k++) {
                    int64_t j = index_at(bk.idx + (size_t)k * s->isize, s->isize);
                    int at = cur[j]++;
                    ri[at] = row;
                    rx[at] = value_at(bk.val + (size_t)k * s->vsize, s->vkind);
                }
            } else {
                int start = o->rowp[row], at = start, sorted = 1;
                int64_t prev = -1;
                for (int64_t k = a; k < b; k++, at++) {
                    int64_t j = index_at(bk.idx + (size_t)k * s->isize, s->isize);
                    if (j < prev) sorted = 0;
                    prev = j;
                    ri[at] = (int)j;
                    rx[at] = value_at(bk.val + (size_t)k * s->vsize, s->vkind);
                }
                o->rowp[row + 1] = at;
                if (!sorted) sort_row(ri + start, rx + start, at - start, o->tmp);
            }
        }
        seen += bk.n;
        nnz_seen += bk.nnz;
    }
}

/* .Call entry: body (a raw vector), csc (TRUE: compressed by columns, a
 * dgCMatrix of cells x genes; FALSE: by rows, which is also the dgCMatrix
 * of genes x cells) -> list(p, i, x, obs, dim) or an error list (error,
 * message, status). */
SEXP ivs_decode_csr(SEXP body, SEXP csc);
SEXP ivs_decode_csr(SEXP body, SEXP csc)
{
    if (TYPEOF(body) != RAWSXP) return fail("bad_stream", "the body is not a raw vector", 0);
    const unsigned char *b = RAW(body);
    struct stream s;
    const char *err = read_header(b, (size_t)XLENGTH(body), &s);
    if (err) return fail(strcmp(err, "truncated") == 0 ? "truncated" : "bad_stream",
                         strcmp(err, "truncated") == 0 ? "the result stream was cut in its header" : err, 0);
    int cols = (int)s.cols, rows = (int)s.rows;
    struct out o = {asLogical(csc) == TRUE, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    int outer = o.csc ? cols : rows;
    SEXP p = PROTECT(allocVector(INTSXP, (R_xlen_t)outer + 1));
    SEXP obs = PROTECT(allocVector(REALSXP, rows));
    SEXP last = PROTECT(allocVector(INTSXP, cols));
    SEXP counts = PROTECT(allocVector(INTSXP, (R_xlen_t)cols + 1));
    int *pp = INTEGER(p);
    memset(pp, 0, sizeof(int) * ((size_t)outer + 1));
    memset(INTEGER(counts), 0, sizeof(int) * ((size_t)cols + 1));
    o.col_n = INTEGER(counts) + 1;
    o.last_row = INTEGER(last);
    o.obs = REAL(obs);
    for (int j = 0; j < cols; j++) o.last_row[j] = -1;
    SEXP res = walk(&s, 0, &o);
    if (res != R_NilValue) {
        UNPROTECT(4);
        return res;
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
    } else {
        o.rowp = pp;
        o.tmp = (struct pair *)R_alloc((size_t)o.max_row + 1, sizeof(struct pair));
    }
    SEXP i = PROTECT(allocVector(INTSXP, (R_xlen_t)o.nnz));
    SEXP x = PROTECT(allocVector(REALSXP, (R_xlen_t)o.nnz));
    o.ri = INTEGER(i);
    o.rx = REAL(x);
    walk(&s, 1, &o);
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

static const R_CallMethodDef call_methods[] = {
    {"ivs_decode_csr", (DL_FUNC)&ivs_decode_csr, 2},
    {NULL, NULL, 0},
};

void R_init_ivserve(DllInfo *dll);
void R_init_ivserve(DllInfo *dll)
{
    R_registerRoutines(dll, NULL, call_methods, NULL, NULL);
    R_useDynamicSymbols(dll, FALSE);
}
