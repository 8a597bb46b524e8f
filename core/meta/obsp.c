/*
 * obsp elements: the list and subsets (see obsp.h).
 *
 * Design.  A cell graph of a large atlas is large (10 million cells with
 * 15 neighbours each: 150 million entries), and a request wants the graph
 * among a few thousand cells, so nothing is held: each request reads the
 * element's pointer array and then only the entries of the selected rows,
 * one read per run of consecutive rows, in a child process (h5iso.h).
 * The child sends those rows as a compact CSR (the distinct selected rows
 * in file order); the parent checks every length and pointer and computes
 * the subset (iv_obsp_subset): each output row is its source row with the
 * columns remapped through an inverse of the selection (old column -> the
 * new positions it takes, several when a cell is listed twice), then
 * sorted.  The inverse is a table over all cells when the selection is a
 * fair share of them, else a binary search in the selection sorted by
 * cell, so that a few cells of a large graph cost no cell-sized table.
 * A csc_matrix is the CSR of the transpose: its selected columns are read
 * as rows, the same subset is computed and the result is transposed,
 * which keeps the memory to what the answer holds.  A dense array is read
 * row by row and every value becomes an entry (zeros included), so that
 * the client's dense copy has the file's exact values.
 */
#include "obsp.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "h5iso.h"
#include "h5util.h"

/* A child's answer that does not parse. */
#define MALFORMED 1

void iv_obsp_csr_free(iv_obsp_csr_t *m)
{
    if (!m) return;
    free(m->indptr);
    free(m->indices);
    free(m->data);
    memset(m, 0, sizeof *m);
}

void iv_obsp_list_free(iv_obsp_list_t *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e);
    free(l);
}

/* ---- the subset (pure) ------------------------------------------------------ */

/* Checks a CSR's structure: pointers from 0, monotone, ending at nnz;
 * indices inside its columns. */
static int check_csr(const iv_obsp_csr_t *m, iv_err_t *err)
{
    IV_RETURN_IF(m->n_rows < 0 || m->n_cols < 0 || m->nnz < 0 || iv_dtype_size(m->dtype) == 0, err,
                 IV_EBAD_FILE, "obsp rows: a negative size or an unknown dtype");
    IV_RETURN_IF(m->indptr[0] != 0, err, IV_EBAD_FILE, "obsp rows: the row pointers do not start at 0");
    for (int64_t r = 0; r < m->n_rows; r++)
        IV_RETURN_IF(m->indptr[r + 1] < m->indptr[r] || m->indptr[r + 1] > m->nnz, err, IV_EBAD_FILE,
                     "obsp rows: row pointer %lld (%lld) is below the one before or past the %lld entries",
                     (long long)(r + 1), (long long)m->indptr[r + 1], (long long)m->nnz);
    IV_RETURN_IF(m->indptr[m->n_rows] != m->nnz, err, IV_EBAD_FILE,
                 "obsp rows: the row pointers end at %lld, not at the %lld entries",
                 (long long)m->indptr[m->n_rows], (long long)m->nnz);
    for (int64_t j = 0; j < m->nnz; j++)
        IV_RETURN_IF(m->indices[j] < 0 || m->indices[j] >= m->n_cols, err, IV_EBAD_FILE,
                     "obsp rows: column index %lld is outside the %lld cells", (long long)m->indices[j],
                     (long long)m->n_cols);
    return 0;
}

/* The inverse of a column selection: where each old column goes. */
typedef struct colmap {
    int64_t *pos;             /* the selection's positions sorted by (column, position) */
    int64_t *col;             /* their columns (binary search), or NULL */
    int64_t *start;           /* n_cols + 1 starts into pos per column (table), or NULL */
    int64_t n;
    int identity;             /* every column in order (all cells): nothing built */
} colmap_t;

typedef struct colpair {
    int64_t col, pos;
} colpair_t;

static int cmp_colpair(const void *a, const void *b)
{
    const colpair_t *x = a, *y = b;
    if (x->col != y->col) return x->col < y->col ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static void colmap_free(colmap_t *c)
{
    free(c->pos);
    free(c->col);
    free(c->start);
}

static int colmap_build(const int64_t *cols, int64_t n, int64_t n_cols, colmap_t *c, iv_err_t *err)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->identity = n == n_cols;
    for (int64_t k = 0; c->identity && k < n; k++) c->identity = cols[k] == k;
    if (c->identity) return 0;
    colpair_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    c->pos = malloc((size_t)(n ? n : 1) * sizeof *c->pos);
    /* A table over all columns when the selection is a fair share of
     * them: one load an entry; else a binary search per entry. */
    int table = n_cols <= 4 * n || n_cols <= ((int64_t)1 << 16);
    if (table) c->start = calloc((size_t)n_cols + 1, sizeof *c->start);
    else c->col = malloc((size_t)(n ? n : 1) * sizeof *c->col);
    if (!p || !c->pos || (table ? !c->start : !c->col)) {
        free(p);
        colmap_free(c);
        return iv_fail(err, IV_ENOMEM, "out of memory for the inverse of %lld cells", (long long)n);
    }
    int sorted = 1;
    for (int64_t k = 0; k < n; k++) {
        p[k] = (colpair_t){cols[k], k};
        if (k && cols[k] < cols[k - 1]) sorted = 0;
    }
    /* Listed in cell order (all cells, a range, a mask): already sorted. */
    if (!sorted) qsort(p, (size_t)n, sizeof *p, cmp_colpair);
    for (int64_t k = 0; k < n; k++) {
        c->pos[k] = p[k].pos;
        if (table) c->start[p[k].col + 1]++;
        else c->col[k] = p[k].col;
    }
    if (table)
        for (int64_t j = 0; j < n_cols; j++) c->start[j + 1] += c->start[j];
    free(p);
    return 0;
}

/* The positions column j takes: pos[*lo .. *hi). */
static void colmap_find(const colmap_t *c, int64_t j, int64_t *lo, int64_t *hi)
{
    if (c->identity) {
        *lo = j;
        *hi = j + 1;
        return;
    }
    if (c->start) {
        *lo = c->start[j];
        *hi = c->start[j + 1];
        return;
    }
    int64_t a = 0, b = c->n;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (c->col[m] < j) a = m + 1;
        else b = m;
    }
    *lo = a;
    while (b < c->n && c->col[b] == j) b++;
    *hi = b;
}

/* An output entry before sorting: its position and its source entry. */
typedef struct outpair {
    int64_t pos, src;
} outpair_t;

static int cmp_outpair(const void *a, const void *b)
{
    const outpair_t *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Pass 1: each output row's entries into out->indptr; IV_ETOO_LARGE past
 * max_nnz; *longest the longest row. */
static int count_rows(const iv_obsp_csr_t *src, const int64_t *row_of, int64_t n, const colmap_t *c,
                      uint64_t max_nnz, iv_obsp_csr_t *out, int64_t *longest, iv_err_t *err)
{
    out->indptr[0] = 0;
    *longest = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = row_of[k], cnt = 0, lo, hi;
        for (int64_t j = src->indptr[r]; j < src->indptr[r + 1]; j++) {
            colmap_find(c, src->indices[j], &lo, &hi);
            cnt += hi - lo;
        }
        out->indptr[k + 1] = out->indptr[k] + cnt;
        if (cnt > *longest) *longest = cnt;
        IV_RETURN_IF((uint64_t)out->indptr[k + 1] > max_nnz, err, IV_ETOO_LARGE,
                     "the obsp subset of %lld cells holds more than %llu entries; select fewer cells",
                     (long long)n, (unsigned long long)max_nnz);
    }
    return 0;
}

/* One value of esz bytes: a fixed-size copy the compiler makes a move. */
static inline void copy_value(char *dst, const char *src, size_t esz)
{
    switch (esz) {
    case 8: memcpy(dst, src, 8); break;
    case 4: memcpy(dst, src, 4); break;
    case 2: memcpy(dst, src, 2); break;
    default: memcpy(dst, src, esz); break;
    }
}

/* Pass 2: each output row's entries, sorted by position. */
static void fill_rows(const iv_obsp_csr_t *src, const int64_t *row_of, int64_t n, const colmap_t *c,
                      outpair_t *tmp, iv_obsp_csr_t *out)
{
    size_t esz = iv_dtype_size(src->dtype);
    const char *sv = src->data;
    char *ov = out->data;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = row_of[k], m = 0, lo, hi;
        int sorted = 1;
        for (int64_t j = src->indptr[r]; j < src->indptr[r + 1]; j++) {
            colmap_find(c, src->indices[j], &lo, &hi);
            for (int64_t q = lo; q < hi; q++) {
                tmp[m] = (outpair_t){c->identity ? q : c->pos[q], j};
                if (m && tmp[m].pos < tmp[m - 1].pos) sorted = 0;
                m++;
            }
        }
        if (!sorted) qsort(tmp, (size_t)m, sizeof *tmp, cmp_outpair);
        int64_t base = out->indptr[k];
        for (int64_t i = 0; i < m; i++) {
            out->indices[base + i] = tmp[i].pos;
            copy_value(ov + (size_t)(base + i) * esz, sv + (size_t)tmp[i].src * esz, esz);
        }
    }
}

int iv_obsp_subset(const iv_obsp_csr_t *src, const int64_t *row_of, const int64_t *cols, int64_t n,
                   uint64_t max_nnz, iv_obsp_csr_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (!max_nnz) max_nnz = IV_OBSP_MAX_NNZ;
    IV_TRY(check_csr(src, err));
    IV_RETURN_IF(n < 0, err, IV_EINVALID_ARG, "a negative number of cells");
    for (int64_t k = 0; k < n; k++) {
        IV_RETURN_IF(row_of[k] < 0 || row_of[k] >= src->n_rows, err, IV_EINTERNAL,
                     "obsp subset: row %lld of %lld read", (long long)row_of[k], (long long)src->n_rows);
        IV_RETURN_IF(cols[k] < 0 || cols[k] >= src->n_cols, err, IV_EOUT_OF_RANGE,
                     "cell %lld is outside the %lld cells", (long long)cols[k], (long long)src->n_cols);
    }
    colmap_t c;
    IV_TRY(colmap_build(cols, n, src->n_cols, &c, err));
    int rc = 0;
    int64_t longest = 0;
    out->n_rows = out->n_cols = n;
    out->dtype = src->dtype;
    out->indptr = malloc((size_t)(n + 1) * sizeof *out->indptr);
    if (!out->indptr) rc = iv_fail(err, IV_ENOMEM, "out of memory for %lld rows", (long long)n);
    if (rc == 0) rc = count_rows(src, row_of, n, &c, max_nnz, out, &longest, err);
    outpair_t *tmp = NULL;
    if (rc == 0) {
        out->nnz = out->indptr[n];
        out->indices = malloc((size_t)(out->nnz ? out->nnz : 1) * sizeof *out->indices);
        out->data = malloc((size_t)(out->nnz ? out->nnz : 1) * iv_dtype_size(out->dtype));
        tmp = malloc((size_t)(longest ? longest : 1) * sizeof *tmp);
        if (!out->indices || !out->data || !tmp)
            rc = iv_fail(err, IV_ENOMEM, "out of memory for %lld obsp entries", (long long)out->nnz);
    }
    if (rc == 0) fill_rows(src, row_of, n, &c, tmp, out);
    free(tmp);
    colmap_free(&c);
    if (rc != 0) iv_obsp_csr_free(out);
    return rc;
}

int iv_obsp_transpose(const iv_obsp_csr_t *m, iv_obsp_csr_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    size_t esz = iv_dtype_size(m->dtype);
    out->n_rows = m->n_cols;
    out->n_cols = m->n_rows;
    out->nnz = m->nnz;
    out->dtype = m->dtype;
    out->indptr = calloc((size_t)out->n_rows + 1, sizeof *out->indptr);
    out->indices = malloc((size_t)(m->nnz ? m->nnz : 1) * sizeof *out->indices);
    out->data = malloc((size_t)(m->nnz ? m->nnz : 1) * esz);
    int64_t *next = malloc((size_t)(out->n_rows ? out->n_rows : 1) * sizeof *next);
    if (!out->indptr || !out->indices || !out->data || !next) {
        free(next);
        iv_obsp_csr_free(out);
        return iv_fail(err, IV_ENOMEM, "out of memory transposing %lld obsp entries", (long long)m->nnz);
    }
    for (int64_t j = 0; j < m->nnz; j++) out->indptr[m->indices[j] + 1]++;
    for (int64_t r = 0; r < out->n_rows; r++) {
        out->indptr[r + 1] += out->indptr[r];
        next[r] = out->indptr[r];
    }
    /* Rows of m in order: each column of the result fills in sorted order. */
    for (int64_t r = 0; r < m->n_rows; r++)
        for (int64_t j = m->indptr[r]; j < m->indptr[r + 1]; j++) {
            int64_t d = next[m->indices[j]]++;
            out->indices[d] = r;
            memcpy((char *)out->data + (size_t)d * esz, (const char *)m->data + (size_t)j * esz, esz);
        }
    free(next);
    return 0;
}

/* ---- child: describing and reading elements --------------------------------- */

/* A 1-D dataset's length, or -1. */
static int64_t len_1d(hid_t d)
{
    hid_t sp = H5Dget_space(d);
    hsize_t n = 0;
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (nd == 1) H5Sget_simple_extent_dims(sp, &n, NULL);
    if (sp >= 0) H5Sclose(sp);
    return nd == 1 ? (int64_t)n : -1;
}

/* The dtype of dataset d's values, or -1 when not integer or float. */
static int dset_dtype(hid_t d, iv_dtype_t *out)
{
    hid_t t = H5Dget_type(d);
    int rc = t >= 0 ? iv_h5_dtype_of(t, out) : -1;
    if (t >= 0) H5Tclose(t);
    return rc;
}

/* The shape attribute of a sparse group (two integers), or -1. */
static int read_shape(hid_t g, int64_t shape[2])
{
    if (H5Aexists(g, "shape") <= 0) return -1;
    hid_t a = H5Aopen(g, "shape", H5P_DEFAULT);
    if (a < 0) return -1;
    hid_t sp = H5Aget_space(a), t = H5Aget_type(a);
    int rc = -1;
    if (sp >= 0 && t >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Sget_simple_extent_npoints(sp) == 2 &&
        H5Aread(a, H5T_NATIVE_INT64, shape) >= 0)
        rc = 0;
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

/* The three arrays of a sparse group, opened (or -1). */
typedef struct sparse {
    hid_t data, indices, indptr;
} sparse_t;

static void sparse_close(sparse_t *s)
{
    if (s->data >= 0) H5Dclose(s->data);
    if (s->indices >= 0) H5Dclose(s->indices);
    if (s->indptr >= 0) H5Dclose(s->indptr);
    s->data = s->indices = s->indptr = -1;
}

static hid_t open_member(hid_t g, const char *name)
{
    if (H5Lexists(g, name, H5P_DEFAULT) <= 0) return -1;
    H5O_info_t oi;
    if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET)
        return -1;
    return H5Dopen2(g, name, H5P_DEFAULT);
}

/* Describes a sparse group e (kind and format already set); s receives
 * its arrays (open when e is servable). */
static void describe_sparse(hid_t g, int64_t n_obs, iv_obsp_elem_t *e, sparse_t *s)
{
    int64_t shape[2];
    iv_dtype_t pt, it;
    s->data = open_member(g, "data");
    s->indices = open_member(g, "indices");
    s->indptr = open_member(g, "indptr");
    if (read_shape(g, shape) != 0) {
        snprintf(e->why, sizeof e->why, "no shape attribute of two integers");
        return;
    }
    e->n_rows = shape[0];
    e->n_cols = shape[1];
    if (s->data < 0 || s->indices < 0 || s->indptr < 0) {
        snprintf(e->why, sizeof e->why, "a %s group without data, indices and indptr datasets", e->format);
        return;
    }
    int64_t nd = len_1d(s->data), ni = len_1d(s->indices), np = len_1d(s->indptr);
    e->nnz = nd;
    int64_t major = e->kind == IV_OBSP_CSR ? shape[0] : shape[1];
    if (shape[0] != n_obs || shape[1] != n_obs)
        snprintf(e->why, sizeof e->why, "shape %lld x %lld where the dataset has %lld cells",
                 (long long)shape[0], (long long)shape[1], (long long)n_obs);
    else if (nd < 0 || ni < 0 || np < 0)
        snprintf(e->why, sizeof e->why, "data, indices or indptr is not one-dimensional");
    else if (nd != ni)
        snprintf(e->why, sizeof e->why, "%lld values but %lld indices", (long long)nd, (long long)ni);
    else if (np != major + 1)
        snprintf(e->why, sizeof e->why, "indptr has %lld entries where %lld are due", (long long)np,
                 (long long)(major + 1));
    else if (dset_dtype(s->data, &e->dtype) != 0)
        snprintf(e->why, sizeof e->why, "values are not integers or floats");
    else if (dset_dtype(s->indices, &it) != 0 || dset_dtype(s->indptr, &pt) != 0 ||
             it == IV_DT_FLOAT32 || it == IV_DT_FLOAT64 || pt == IV_DT_FLOAT32 || pt == IV_DT_FLOAT64)
        snprintf(e->why, sizeof e->why, "indices or indptr are not integers");
}

/* Describes a dense dataset element e. */
static void describe_dense(hid_t d, int64_t n_obs, iv_obsp_elem_t *e)
{
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (nd == 2) H5Sget_simple_extent_dims(sp, dims, NULL);
    if (sp >= 0) H5Sclose(sp);
    if (nd != 2) {
        snprintf(e->why, sizeof e->why, "a %d-dimensional array (2 served)", nd);
        return;
    }
    e->n_rows = (int64_t)dims[0];
    e->n_cols = (int64_t)dims[1];
    e->nnz = e->n_rows * e->n_cols;
    if (e->n_rows != n_obs || e->n_cols != n_obs)
        snprintf(e->why, sizeof e->why, "shape %lld x %lld where the dataset has %lld cells",
                 (long long)e->n_rows, (long long)e->n_cols, (long long)n_obs);
    else if (dset_dtype(d, &e->dtype) != 0)
        snprintf(e->why, sizeof e->why, "values are not integers or floats");
}

/* Describes object o (an obsp member); s gets a sparse element's arrays
 * (all -1 for others). */
static void describe(hid_t o, int64_t n_obs, iv_obsp_elem_t *e, sparse_t *s)
{
    s->data = s->indices = s->indptr = -1;
    e->n_rows = e->n_cols = e->nnz = -1;
    e->kind = IV_OBSP_OTHER;
    iv_h5_read_str_attr(o, "encoding-type", e->format, sizeof e->format);
    H5I_type_t ty = H5Iget_type(o);
    if (ty == H5I_DATASET) {
        if (!e->format[0]) snprintf(e->format, sizeof e->format, "array");
        e->kind = IV_OBSP_DENSE;
        describe_dense(o, n_obs, e);
    } else if (!strcmp(e->format, "csr_matrix") || !strcmp(e->format, "csc_matrix")) {
        e->kind = e->format[1] == 's' && e->format[2] == 'r' ? IV_OBSP_CSR : IV_OBSP_CSC;
        describe_sparse(o, n_obs, e, s);
    } else {
        snprintf(e->why, sizeof e->why, "a %s element (csr_matrix, csc_matrix and dense arrays are served)",
                 e->format[0] ? e->format : "group");
    }
    if (e->why[0]) e->kind = IV_OBSP_OTHER;
}

/* The file's obsp group, or -1 (*absent set when the file has none). */
static hid_t open_obsp(hid_t file, int *absent)
{
    *absent = H5Lexists(file, "obsp", H5P_DEFAULT) <= 0;
    return *absent ? -1 : H5Gopen2(file, "obsp", H5P_DEFAULT);
}

static int put_str(iv_h5iso_out_t *o, const char *s)
{
    return iv_h5iso_put_blob(o, s, strlen(s));
}

typedef struct list_walk {
    iv_h5iso_out_t *o;
    int64_t n_obs;
    uint64_t n;
    int bad;
} list_walk_t;

static herr_t list_visit(hid_t g, const char *name, const H5L_info_t *info, void *arg)
{
    (void)info;
    list_walk_t *w = arg;
    iv_obsp_elem_t e;
    memset(&e, 0, sizeof e);
    sparse_t s = {-1, -1, -1};
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        e.n_rows = e.n_cols = e.nnz = -1;
        e.kind = IV_OBSP_OTHER;
        snprintf(e.why, sizeof e.why, "cannot be opened");
    } else {
        describe(o, w->n_obs, &e, &s);
        sparse_close(&s);
        H5Oclose(o);
    }
    w->n++;
    w->bad |= put_str(w->o, name) | put_str(w->o, e.format) | put_str(w->o, e.why) |
              iv_h5iso_put_u64(w->o, (uint64_t)e.kind) | iv_h5iso_put_u64(w->o, (uint64_t)e.dtype) |
              iv_h5iso_put_u64(w->o, (uint64_t)e.n_rows) | iv_h5iso_put_u64(w->o, (uint64_t)e.n_cols) |
              iv_h5iso_put_u64(w->o, (uint64_t)e.nnz);
    return w->bad ? -1 : 0;
}

typedef struct list_ctx {
    const char *path;
    int64_t n_obs;
} list_ctx_t;

/* The list's records follow; their count comes last (u64). */
static int list_child(void *vctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    list_ctx_t *c = vctx;
    iv_h5iso_stage(o, "obsp");
    IV_RETURN_IF(iv_h5filters_register() < 0, err, IV_EINTERNAL, "%s: cannot register HDF5 filters", c->path);
    list_walk_t w = {o, c->n_obs, 0, 0};
    int rc = 0, absent = 0;
    H5E_BEGIN_TRY
    {
        hid_t f = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t g = f >= 0 ? open_obsp(f, &absent) : -1;
        if (f < 0) rc = iv_fail(err, IV_EBAD_FILE, "%s: cannot open as HDF5", c->path);
        else if (g < 0 && !absent) rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp cannot be opened", c->path);
        if (g >= 0) {
            hsize_t idx = 0;
            if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_visit, &w) < 0 && !w.bad)
                rc = iv_fail(err, IV_EBAD_FILE, "%s: the members of obsp cannot be listed", c->path);
            H5Gclose(g);
        }
        if (f >= 0) H5Fclose(f);
    }
    H5E_END_TRY;
    if (rc == 0 && (w.bad || iv_h5iso_put_u64(o, w.n)))
        rc = iv_fail(err, IV_EIO, "%s: cannot pass obsp's list to the server", c->path);
    return rc;
}

static int take_elem(iv_h5iso_rd_t *r, iv_obsp_elem_t *e)
{
    char name[1024];
    if (iv_h5iso_rd_str(r, name, sizeof name) < 0 || iv_h5iso_rd_str(r, e->format, sizeof e->format) < 0 ||
        iv_h5iso_rd_str(r, e->why, sizeof e->why) < 0)
        return MALFORMED;
    uint64_t kind = iv_h5iso_rd_u64(r), dt = iv_h5iso_rd_u64(r);
    e->n_rows = (int64_t)iv_h5iso_rd_u64(r);
    e->n_cols = (int64_t)iv_h5iso_rd_u64(r);
    e->nnz = (int64_t)iv_h5iso_rd_u64(r);
    if (r->bad || kind > IV_OBSP_OTHER || dt >= IV_DT_COUNT) return MALFORMED;
    e->kind = (iv_obsp_kind_t)kind;
    e->dtype = (iv_dtype_t)dt;
    e->name = strdup(name);
    return e->name ? 0 : -1;
}

int iv_obsp_list(const char *path, int64_t n_obs, iv_obsp_list_t **out, iv_err_t *err)
{
    *out = NULL;
    list_ctx_t c = {path, n_obs};
    iv_h5iso_result_t res;
    IV_TRY(iv_h5iso_run(path, list_child, &c, NULL, NULL, &res, err));
    iv_obsp_list_t *l = calloc(1, sizeof *l);
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    int rc = 0;
    uint64_t n = 0;
    /* The count is the answer's last 8 bytes. */
    if (res.len < 8) rc = MALFORMED;
    else memcpy(&n, res.data + res.len - 8, 8);
    if (rc == 0 && n > res.len / 8) rc = MALFORMED;
    if (rc == 0 && l) l->e = calloc(n ? (size_t)n : 1, sizeof *l->e);
    if (rc == 0 && (!l || !l->e)) rc = -1;
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        rc = take_elem(&r, &l->e[i]);
        if (rc == 0) l->n++;
    }
    if (rc == 0 && r.pos + 8 != r.len) rc = MALFORMED;
    iv_h5iso_result_free(&res);
    if (rc != 0) {
        iv_obsp_list_free(l);
        return rc == MALFORMED ? iv_fail(err, IV_EINTERNAL, "%s: the obsp reader's answer is malformed", path)
                               : iv_fail(err, IV_ENOMEM, "%s: out of memory listing obsp", path);
    }
    *out = l;
    return 0;
}

/* ---- child: reading the selected rows --------------------------------------- */

/* Rows whose entries are at most SPAN_GAP apart are read in one call, up
 * to SPAN_MAX entries (read_spans). */
#define SPAN_GAP 4096
#define SPAN_MAX ((int64_t)1 << 20)
/* Pointers of rows at most PTR_GAP apart are read in one call, up to
 * PTR_PIECE pointers (read_row_ptrs). */
#define PTR_GAP 8192
#define PTR_PIECE ((int64_t)1 << 20)

typedef struct read_ctx {
    const char *path, *name;
    int64_t n_obs;
    const int64_t *rows;      /* distinct rows (majors) to read, ascending */
    int64_t m;
    uint64_t max_nnz;
} read_ctx_t;

/* Reads elements [a, b) of 1-D dataset d as mem type mt into buf. */
static int read_range(hid_t d, hid_t mt, int64_t a, int64_t b, void *buf)
{
    if (b <= a) return 0;
    hsize_t off = (hsize_t)a, cnt = (hsize_t)(b - a);
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, &cnt, NULL);
    int rc = -1;
    if (fs >= 0 && ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, &off, NULL, &cnt, NULL) >= 0 &&
        H5Dread(d, mt, ms, fs, H5P_DEFAULT, buf) >= 0)
        rc = 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return rc;
}

/* Checks pointers buf[0..n) = indptr[first .. first + n): from 0 when
 * first is 0, never falling, never past the entries (scipy's reading:
 * entries past the last pointer are dropped). */
static int check_ptrs(const read_ctx_t *c, const int64_t *buf, int64_t first, int64_t n, int64_t nnz,
                      iv_err_t *err)
{
    IV_RETURN_IF(first == 0 && n && buf[0] != 0, err, IV_EBAD_FILE, "%s: obsp/%s/indptr starts at %lld, not 0",
                 c->path, c->name, (long long)buf[0]);
    for (int64_t i = 0; i < n; i++)
        IV_RETURN_IF(buf[i] < 0 || buf[i] > nnz || (i && buf[i] < buf[i - 1]), err, IV_EBAD_FILE,
                     "%s: obsp/%s/indptr[%lld] = %lld is below the one before or past the %lld entries",
                     c->path, c->name, (long long)(first + i), (long long)buf[i], (long long)nnz);
    return 0;
}

/*
 * The selected rows' pointers: lo[k] = indptr[rows[k]], hi[k] =
 * indptr[rows[k] + 1].  Read in pieces of at most PTR_PIECE pointers,
 * each covering rows at most PTR_GAP apart, so that a few cells of ten
 * million cost a few small reads, not the 80 MB array; every pointer read
 * is checked (check_ptrs).  Pieces of rows in a row share their boundary
 * pointer, so all cells check the whole array, monotone throughout.
 */
static int read_row_ptrs(const read_ctx_t *c, hid_t d, int64_t nnz, int64_t *lo, int64_t *hi, iv_err_t *err)
{
    int64_t want = c->m ? c->rows[c->m - 1] - c->rows[0] + 2 : 1;
    int64_t cap = want < PTR_PIECE ? want : PTR_PIECE;
    int64_t *buf = malloc((size_t)cap * sizeof *buf);
    IV_RETURN_IF(!buf, err, IV_ENOMEM, "%s: out of memory for obsp/%s's pointers", c->path, c->name);
    int rc = 0;
    for (int64_t k = 0; rc == 0 && k < c->m;) {
        int64_t first = c->rows[k], end = k + 1;
        while (end < c->m && c->rows[end] - c->rows[end - 1] <= PTR_GAP && c->rows[end] + 2 - first <= cap) end++;
        int64_t n = c->rows[end - 1] + 2 - first;
        if (read_range(d, H5T_NATIVE_INT64, first, first + n, buf) < 0)
            rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp/%s/indptr cannot be read", c->path, c->name);
        if (rc == 0) rc = check_ptrs(c, buf, first, n, nnz, err);
        for (int64_t q = k; rc == 0 && q < end; q++) {
            lo[q] = buf[c->rows[q] - first];
            hi[q] = buf[c->rows[q] + 1 - first];
        }
        k = end;
    }
    free(buf);
    return rc;
}

/* The end of the span of rows starting at k: runs of consecutive rows
 * whose entries lie within SPAN_GAP of the run before, SPAN_MAX entries
 * in all (a single run may be longer); *runs of them, entries [*a, *b). */
static int64_t span_end(const read_ctx_t *c, const int64_t *lo, const int64_t *hi, int64_t k, int *runs,
                        int64_t *a, int64_t *b)
{
    int64_t end = k;
    *runs = 0;
    *a = *b = lo[k];
    while (end < c->m) {
        int64_t k2 = end + 1;
        while (k2 < c->m && c->rows[k2] == c->rows[k2 - 1] + 1) k2++;
        int64_t ra = lo[end], rb = hi[k2 - 1];
        if (*runs && (ra - *b > SPAN_GAP || rb - *a > SPAN_MAX)) break;
        *b = rb;
        (*runs)++;
        end = k2;
    }
    return end;
}

/*
 * Reads the selected rows' entries into ind / val at their places rp.
 * A read call costs far more than the bytes between near rows (10 % of a
 * million cells is a row every ten, 150 entries apart): rows close
 * together are read as one span into scratch and copied out, a span of
 * one run straight into place (a whole graph is one read).
 */
static int read_spans(const read_ctx_t *c, const iv_obsp_elem_t *e, sparse_t *s, const int64_t *lo,
                      const int64_t *hi, const int64_t *rp, int64_t *ind, char *val, iv_err_t *err)
{
    size_t esz = iv_dtype_size(e->dtype);
    hid_t vt = iv_h5_native(e->dtype);
    int64_t *sind = NULL;
    char *sval = NULL;
    int rc = 0;
    for (int64_t k = 0; rc == 0 && k < c->m;) {
        int runs;
        int64_t a, b, end = span_end(c, lo, hi, k, &runs, &a, &b);
        if (runs == 1) {
            if (read_range(s->indices, H5T_NATIVE_INT64, a, b, ind + rp[k]) < 0 ||
                read_range(s->data, vt, a, b, val + (size_t)rp[k] * esz) < 0)
                rc = -1;
        } else {
            if (!sind) sind = malloc((size_t)SPAN_MAX * sizeof *sind);
            if (!sval) sval = malloc((size_t)SPAN_MAX * esz);
            if (!sind || !sval) {
                rc = iv_fail(err, IV_ENOMEM, "%s: out of memory", c->path);
                break;
            }
            if (read_range(s->indices, H5T_NATIVE_INT64, a, b, sind) < 0 || read_range(s->data, vt, a, b, sval) < 0)
                rc = -1;
            for (int64_t q = k; rc == 0 && q < end; q++) {
                int64_t from = lo[q] - a, len = rp[q + 1] - rp[q];
                memcpy(ind + rp[q], sind + from, (size_t)len * sizeof *ind);
                memcpy(val + (size_t)rp[q] * esz, sval + (size_t)from * esz, (size_t)len * esz);
            }
        }
        if (rc == -1)
            rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp/%s: entries %lld..%lld cannot be read", c->path, c->name,
                         (long long)a, (long long)b);
        k = end;
    }
    free(sind);
    free(sval);
    return rc;
}

/* Sends the selected rows of a sparse element: u64 entries, then the
 * rows' pointers (m + 1, from 0), indices (int64) and values. */
static int send_sparse(const read_ctx_t *c, const iv_obsp_elem_t *e, sparse_t *s, iv_h5iso_out_t *o,
                       iv_err_t *err)
{
    char where[300];
    snprintf(where, sizeof where, "%s:/obsp/%s", c->path, c->name);
    IV_TRY(iv_h5_check_stored(s->indptr, where, err));
    IV_TRY(iv_h5_check_stored(s->indices, where, err));
    IV_TRY(iv_h5_check_stored(s->data, where, err));
    size_t mm = (size_t)(c->m ? c->m : 1);
    int64_t *lo = malloc(mm * sizeof *lo), *hi = malloc(mm * sizeof *hi);
    int64_t *rp = malloc((size_t)(c->m + 1) * sizeof *rp);
    int rc = 0;
    if (!rp || !lo || !hi) rc = iv_fail(err, IV_ENOMEM, "%s: out of memory", c->path);
    if (rc == 0) rc = read_row_ptrs(c, s->indptr, e->nnz, lo, hi, err);
    for (int64_t k = 0; rc == 0 && k <= c->m; k++) {
        rp[k] = k ? rp[k - 1] + hi[k - 1] - lo[k - 1] : 0;
        if ((uint64_t)rp[k] > c->max_nnz)
            rc = iv_fail(err, IV_ETOO_LARGE, "the selected rows of obsp/%s hold more than %llu entries; "
                         "select fewer cells", c->name, (unsigned long long)c->max_nnz);
    }
    int64_t tot = rc == 0 ? rp[c->m] : 0;
    size_t esz = iv_dtype_size(e->dtype);
    int64_t *ind = rc == 0 ? malloc((size_t)(tot ? tot : 1) * sizeof *ind) : NULL;
    char *val = rc == 0 ? malloc((size_t)(tot ? tot : 1) * esz) : NULL;
    if (rc == 0 && (!ind || !val)) rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for %lld entries", c->path, (long long)tot);
    if (rc == 0) rc = read_spans(c, e, s, lo, hi, rp, ind, val, err);
    if (rc == 0 && (iv_h5iso_put_u64(o, (uint64_t)tot) | iv_h5iso_put_blob(o, rp, (uint64_t)(c->m + 1) * 8) |
                    iv_h5iso_put_blob(o, ind, (uint64_t)tot * 8) | iv_h5iso_put_blob(o, val, (uint64_t)tot * esz)))
        rc = iv_fail(err, IV_EIO, "%s: cannot pass obsp/%s to the server", c->path, c->name);
    free(lo);
    free(hi);
    free(rp);
    free(ind);
    free(val);
    return rc;
}

/* Sends the selected rows of a dense element: their values, row-major. */
static int send_dense(const read_ctx_t *c, const iv_obsp_elem_t *e, hid_t d, iv_h5iso_out_t *o, iv_err_t *err)
{
    char where[300];
    snprintf(where, sizeof where, "%s:/obsp/%s", c->path, c->name);
    IV_TRY(iv_h5_check_stored(d, where, err));
    int64_t n = c->n_obs;
    IV_RETURN_IF(c->m && (uint64_t)n > c->max_nnz / (uint64_t)c->m, err, IV_ETOO_LARGE,
                 "%lld rows of the dense obsp/%s hold more than %llu values; select fewer cells",
                 (long long)c->m, c->name, (unsigned long long)c->max_nnz);
    size_t esz = iv_dtype_size(e->dtype);
    int64_t cnt_all = c->m * n;
    char *val = malloc((size_t)(cnt_all > 0 ? cnt_all : 1) * esz);
    IV_RETURN_IF(!val, err, IV_ENOMEM, "%s: out of memory", c->path);
    int rc = 0;
    hid_t fs = H5Dget_space(d);
    for (int64_t k = 0; rc == 0 && k < c->m;) {
        int64_t k2 = k + 1;
        while (k2 < c->m && c->rows[k2] == c->rows[k2 - 1] + 1) k2++;
        hsize_t off[2] = {(hsize_t)c->rows[k], 0}, cnt[2] = {(hsize_t)(k2 - k), (hsize_t)n};
        hid_t ms = H5Screate_simple(2, cnt, NULL);
        if (fs < 0 || ms < 0 || (n && (H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0 ||
                                       H5Dread(d, iv_h5_native(e->dtype), ms, fs, H5P_DEFAULT,
                                               val + (size_t)(k * n) * esz) < 0)))
            rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp/%s: rows %lld..%lld cannot be read", c->path, c->name,
                         (long long)c->rows[k], (long long)c->rows[k2 - 1]);
        if (ms >= 0) H5Sclose(ms);
        k = k2;
    }
    if (fs >= 0) H5Sclose(fs);
    if (rc == 0 && iv_h5iso_put_blob(o, val, (uint64_t)(c->m * n) * esz))
        rc = iv_fail(err, IV_EIO, "%s: cannot pass obsp/%s to the server", c->path, c->name);
    free(val);
    return rc;
}

/* The element's description, then its rows (send_sparse / send_dense). */
static int read_elem(const read_ctx_t *c, hid_t g, iv_h5iso_out_t *o, iv_err_t *err)
{
    IV_RETURN_IF(H5Lexists(g, c->name, H5P_DEFAULT) <= 0, err, IV_ENOT_FOUND,
                 "the dataset has no obsp element '%.100s'", c->name);
    hid_t ob = H5Oopen(g, c->name, H5P_DEFAULT);
    IV_RETURN_IF(ob < 0, err, IV_EBAD_FILE, "%s: obsp/%s cannot be opened", c->path, c->name);
    iv_obsp_elem_t e;
    memset(&e, 0, sizeof e);
    sparse_t s;
    describe(ob, c->n_obs, &e, &s);
    int rc = 0;
    if (e.kind == IV_OBSP_OTHER)
        rc = iv_fail(err, IV_EUNSERVABLE, "obsp/%.100s is not served: %s", c->name, e.why);
    else if (iv_h5iso_put_u64(o, (uint64_t)e.kind) | iv_h5iso_put_u64(o, (uint64_t)e.dtype))
        rc = iv_fail(err, IV_EIO, "%s: cannot pass obsp/%s to the server", c->path, c->name);
    else if (e.kind == IV_OBSP_DENSE)
        rc = send_dense(c, &e, ob, o, err);
    else
        rc = send_sparse(c, &e, &s, o, err);
    sparse_close(&s);
    H5Oclose(ob);
    return rc;
}

static int read_child(void *vctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    read_ctx_t *c = vctx;
    char stage[IV_H5ISO_STAGE_MAX];
    snprintf(stage, sizeof stage, "obsp/%.200s", c->name);
    iv_h5iso_stage(o, stage);
    IV_RETURN_IF(iv_h5filters_register() < 0, err, IV_EINTERNAL, "%s: cannot register HDF5 filters", c->path);
    int rc = 0, absent = 0;
    H5E_BEGIN_TRY
    {
        hid_t f = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t g = f >= 0 ? open_obsp(f, &absent) : -1;
        if (f < 0) rc = iv_fail(err, IV_EBAD_FILE, "%s: cannot open as HDF5", c->path);
        else if (absent) rc = iv_fail(err, IV_ENOT_FOUND, "the dataset has no obsp element '%.100s'", c->name);
        else if (g < 0) rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp cannot be opened", c->path);
        else rc = read_elem(c, g, o, err);
        if (g >= 0) H5Gclose(g);
        if (f >= 0) H5Fclose(f);
    }
    H5E_END_TRY;
    return rc;
}

/* ---- parent: the read -------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The distinct cells of sel ascending (*rows, *m) and where each listed
 * cell is among them (*row_of). */
static int distinct_rows(const int64_t *sel, int64_t n, int64_t **rows, int64_t *m, int64_t **row_of,
                         iv_err_t *err)
{
    int64_t *u = malloc((size_t)(n ? n : 1) * sizeof *u), *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    if (!u || !w) {
        free(u);
        free(w);
        return iv_fail(err, IV_ENOMEM, "out of memory for %lld cells", (long long)n);
    }
    memcpy(u, sel, (size_t)n * sizeof *u);
    qsort(u, (size_t)n, sizeof *u, cmp_i64);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (!k || u[i] != u[k - 1]) u[k++] = u[i];
    for (int64_t i = 0; i < n; i++) {
        const int64_t *hit = bsearch(&sel[i], u, (size_t)k, sizeof *u, cmp_i64);
        w[i] = hit - u;
    }
    *rows = u;
    *m = k;
    *row_of = w;
    return 0;
}

/* A dense element's m rows (the rest of r) as a CSR with every column. */
static int take_dense(iv_h5iso_rd_t *r, int64_t m, int64_t n_obs, size_t esz, iv_obsp_csr_t *src)
{
    if (m && (uint64_t)n_obs > IV_OBSP_MAX_NNZ / (uint64_t)m) return MALFORMED;
    src->nnz = m * n_obs;
    const void *v = iv_h5iso_rd_blob(r, (size_t)src->nnz * esz, NULL);
    if (!v || r->pos != r->len) return MALFORMED;
    src->indptr = malloc((size_t)(m + 1) * sizeof *src->indptr);
    src->indices = malloc((size_t)(src->nnz ? src->nnz : 1) * sizeof *src->indices);
    src->data = malloc((size_t)(src->nnz ? src->nnz : 1) * esz);
    if (!src->indptr || !src->indices || !src->data) return -1;
    for (int64_t i = 0; i <= m; i++) src->indptr[i] = i * n_obs;
    for (int64_t i = 0; i < src->nnz; i++) src->indices[i] = i % (n_obs ? n_obs : 1);
    memcpy(src->data, v, (size_t)src->nnz * esz);
    return 0;
}

/* A sparse element's m rows (the rest of r): its arrays read where they
 * lie in the mapped answer (*borrowed) when aligned, else copied. */
static int take_sparse(iv_h5iso_rd_t *r, int64_t m, size_t esz, iv_obsp_csr_t *src, int *borrowed)
{
    uint64_t tot = iv_h5iso_rd_u64(r);
    if (r->bad || tot > IV_OBSP_MAX_NNZ) return MALFORMED;
    src->nnz = (int64_t)tot;
    const void *p = iv_h5iso_rd_blob(r, (size_t)(m + 1) * 8, NULL);
    const void *ix = iv_h5iso_rd_blob(r, (size_t)tot * 8, NULL);
    const void *v = iv_h5iso_rd_blob(r, (size_t)tot * esz, NULL);
    if (!p || !ix || !v || r->pos != r->len) return MALFORMED;
    /* Every blob before them is a multiple of 8 bytes, so they normally
     * lie 8-byte aligned. */
    if (!((uintptr_t)p % 8) && !((uintptr_t)ix % 8) && !((uintptr_t)v % esz)) {
        src->indptr = (int64_t *)(uintptr_t)p;
        src->indices = (int64_t *)(uintptr_t)ix;
        src->data = (void *)(uintptr_t)v;
        *borrowed = 1;
        return 0;
    }
    src->indptr = malloc((size_t)(m + 1) * sizeof *src->indptr);
    src->indices = malloc((size_t)(tot ? tot : 1) * sizeof *src->indices);
    src->data = malloc((size_t)(tot ? tot : 1) * esz);
    if (!src->indptr || !src->indices || !src->data) return -1;
    memcpy(src->indptr, p, (size_t)(m + 1) * 8);
    memcpy(src->indices, ix, (size_t)tot * 8);
    memcpy(src->data, v, (size_t)tot * esz);
    return 0;
}

/* The child's rows as a CSR of m rows and n_obs columns (src). */
static int take_rows(const iv_h5iso_result_t *res, int64_t m, int64_t n_obs, iv_obsp_kind_t *kind,
                     iv_obsp_csr_t *src, int *borrowed)
{
    *borrowed = 0;
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, res);
    uint64_t k = iv_h5iso_rd_u64(&r), dt = iv_h5iso_rd_u64(&r);
    if (r.bad || k > IV_OBSP_DENSE || dt >= IV_DT_COUNT) return MALFORMED;
    *kind = (iv_obsp_kind_t)k;
    src->n_rows = m;
    src->n_cols = n_obs;
    src->dtype = (iv_dtype_t)dt;
    size_t esz = iv_dtype_size(src->dtype);
    return *kind == IV_OBSP_DENSE ? take_dense(&r, m, n_obs, esz, src) : take_sparse(&r, m, esz, src, borrowed);
}

/* Runs the child for the distinct rows and computes the subset. */
static int read_subset(const char *path, const char *name, int64_t n_obs, const int64_t *sel, int64_t n,
                       uint64_t max_nnz, iv_obsp_csr_t *out, iv_err_t *err)
{
    int64_t *rows = NULL, *row_of = NULL, m = 0;
    IV_TRY(distinct_rows(sel, n, &rows, &m, &row_of, err));
    read_ctx_t c = {path, name, n_obs, rows, m, max_nnz};
    iv_h5iso_result_t res;
    int rc = iv_h5iso_run(path, read_child, &c, NULL, NULL, &res, err);
    iv_obsp_csr_t src;
    memset(&src, 0, sizeof src);
    iv_obsp_kind_t kind = IV_OBSP_CSR;
    int borrowed = 0, have_res = rc == 0;
    if (rc == 0) {
        rc = take_rows(&res, m, n_obs, &kind, &src, &borrowed);
        if (rc == MALFORMED) rc = iv_fail(err, IV_EINTERNAL, "%s: the obsp reader's answer is malformed", path);
        else if (rc < 0) rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for obsp/%s", path, name);
    }
    if (rc == 0) {
        rc = iv_obsp_subset(&src, row_of, sel, n, max_nnz, out, err);
        /* The element's own pointers and indices were wrong: say which. */
        if (rc == IV_EBAD_FILE) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            iv_err_clear(err);
            rc = iv_fail(err, IV_EBAD_FILE, "%s: obsp/%s: %s", path, name, msg);
        }
    }
    if (borrowed) memset(&src, 0, sizeof src);
    if (have_res) iv_h5iso_result_free(&res);
    if (rc == 0 && kind == IV_OBSP_CSC) {
        iv_obsp_csr_t t;
        rc = iv_obsp_transpose(out, &t, err);
        iv_obsp_csr_free(out);
        if (rc == 0) *out = t;
    }
    iv_obsp_csr_free(&src);
    free(rows);
    free(row_of);
    return rc;
}

int iv_obsp_read(const char *path, const char *name, int64_t n_obs, const int64_t *sel, int64_t n,
                 uint64_t max_nnz, iv_obsp_csr_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (!max_nnz || max_nnz > IV_OBSP_MAX_NNZ) max_nnz = IV_OBSP_MAX_NNZ;
    int64_t *all = NULL;
    if (!sel) {
        all = malloc((size_t)(n_obs ? n_obs : 1) * sizeof *all);
        IV_RETURN_IF(!all, err, IV_ENOMEM, "out of memory for %lld cells", (long long)n_obs);
        for (int64_t i = 0; i < n_obs; i++) all[i] = i;
        sel = all;
        n = n_obs;
    }
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k++)
        if (sel[k] < 0 || sel[k] >= n_obs)
            rc = iv_fail(err, IV_EOUT_OF_RANGE, "cell %lld is outside the %lld cells", (long long)sel[k],
                         (long long)n_obs);
    if (rc == 0) rc = read_subset(path, name, n_obs, sel, n, max_nnz, out, err);
    free(all);
    return rc;
}
