/*
 * Cell x cell matrices: the elements of a .h5ad file's obsp group
 * (connectivities, distances, ...), listed and read as the subset
 * P[sel][:, sel] that numpy and scipy give.
 *
 * iv_obsp_list() names every element with its format, shape, dtype and
 * stored entries, and why it cannot be served when it cannot.  Served are
 * what anndata writes for obsp: csr_matrix and csc_matrix groups (data,
 * indices, indptr; attributes encoding-type and shape; integer pointers
 * and indices of any width, integer or float values) and dense 2-D
 * numeric datasets, each n_obs x n_obs.
 *
 * iv_obsp_read() reads the subset of one element for a list of cells:
 * rows in the list's order, a cell listed twice repeated as a row and as
 * a column, indices sorted within each row, explicit zeros kept.  Only the
 * selected rows are read (the major slices of a csc_matrix, which are the
 * rows of its transpose: P[s][:, s] is the transpose of P^T[s][:, s]).
 * Reads run in a child process (h5iso.h: HDF5 is not safe on damaged
 * input), one per call, and every pointer, index and length that comes
 * back is checked before use.
 *
 * Thread rules: every function here may run on any thread, concurrently;
 * results belong to the caller.
 */
#ifndef IV_OBSP_H
#define IV_OBSP_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"

/* Most stored entries a read may hold (the selected rows' entries, and
 * the answer's): 2^28 entries are 3 GiB of int64 indices and float32
 * values.  A larger subset is IV_ETOO_LARGE. */
#define IV_OBSP_MAX_NNZ ((uint64_t)1 << 28)

typedef enum iv_obsp_kind {
    IV_OBSP_CSR = 0,
    IV_OBSP_CSC = 1,
    IV_OBSP_DENSE = 2,
    IV_OBSP_OTHER = 3,        /* listed, not served */
} iv_obsp_kind_t;

typedef struct iv_obsp_elem {
    char *name;
    iv_obsp_kind_t kind;
    char format[32];          /* "csr_matrix", "csc_matrix", "array" or the encoding found */
    int64_t n_rows, n_cols;   /* -1 when unknown */
    iv_dtype_t dtype;         /* the values' dtype (served elements) */
    int64_t nnz;              /* stored entries (a dense array: rows x cols); -1 unknown */
    char why[160];            /* why it is not served ("" when it is) */
} iv_obsp_elem_t;

typedef struct iv_obsp_list {
    size_t n;
    iv_obsp_elem_t *e;        /* in name order */
} iv_obsp_list_t;

/* Lists path's obsp (no group: an empty list); n_obs is the size each
 * element must have.  0 or a negative error (the child's: IV_EBAD_FILE
 * for a damaged file, IV_ENOMEM). */
int iv_obsp_list(const char *path, int64_t n_obs, iv_obsp_list_t **out, iv_err_t *err);
void iv_obsp_list_free(iv_obsp_list_t *l);

/* A CSR matrix with int64 pointers and indices; values in dtype. */
typedef struct iv_obsp_csr {
    int64_t n_rows, n_cols, nnz;
    iv_dtype_t dtype;
    int64_t *indptr;          /* n_rows + 1 */
    int64_t *indices;         /* nnz */
    void *data;               /* nnz values of dtype */
} iv_obsp_csr_t;

void iv_obsp_csr_free(iv_obsp_csr_t *m);

/*
 * Reads element `name` of path's obsp for the cells sel[0..n) (every cell,
 * in order, when sel is NULL) into *out, a CSR n x n (n_obs x n_obs for
 * all cells) as above.  max_nnz bounds both the entries read and the
 * answer's (0: IV_OBSP_MAX_NNZ).  Errors: IV_ENOT_FOUND (no such element),
 * IV_EUNSERVABLE (listed but not served, with the reason),
 * IV_EOUT_OF_RANGE (a cell outside 0..n_obs-1), IV_ETOO_LARGE, IV_EBAD_FILE
 * (the element contradicts itself: pointers not monotone or past the
 * entries, an index outside the cells, a wrong shape), IV_ENOMEM.
 */
int iv_obsp_read(const char *path, const char *name, int64_t n_obs, const int64_t *sel, int64_t n,
                 uint64_t max_nnz, iv_obsp_csr_t *out, iv_err_t *err);

/*
 * The subset step, on rows already in memory: src holds some rows of an
 * n_cols-column matrix (src->n_cols is the cell count); output row k is
 * src row row_of[k] restricted to the columns cols[0..n), entry q of the
 * output row being column cols[q] (columns listed twice repeat the
 * entry), indices sorted.  Checks src (pointers from 0, monotone, ending
 * at nnz; indices inside its columns) and row_of / cols: IV_EBAD_FILE
 * or IV_EOUT_OF_RANGE, IV_ETOO_LARGE past max_nnz answer entries,
 * IV_ENOMEM.  The reference is a dense walk of cols per row (the unit
 * test's), which this equals entry for entry.
 */
int iv_obsp_subset(const iv_obsp_csr_t *src, const int64_t *row_of, const int64_t *cols, int64_t n,
                   uint64_t max_nnz, iv_obsp_csr_t *out, iv_err_t *err);

/* The transpose of a checked CSR m (as iv_obsp_subset gives) as a CSR,
 * indices sorted.  0 or IV_ENOMEM. */
int iv_obsp_transpose(const iv_obsp_csr_t *m, iv_obsp_csr_t *out, iv_err_t *err);

#endif /* IV_OBSP_H */
