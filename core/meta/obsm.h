/*
 * Embeddings and other per-cell / per-gene arrays: the elements of a
 * .h5ad file's obsm and varm groups (X_umap, X_pca, PCs, ...).
 *
 * iv_marrays_load() lists every element of obsm and varm and reads the
 * dense numeric ones (1-D or 2-D datasets whose first dimension is the
 * axis length) into memory, row-major, in their stored dtype.  Other
 * elements (sparse matrices, data frames, arrays of a wrong length) are
 * listed with the reason they cannot be served.  Reading happens at
 * start-up, like the metadata: HDF5 serialises every call behind one
 * global lock and runs filters single-threaded, so it stays off the query
 * path.  A two-column embedding of 1.26 million cells is 10 MB in float32
 * and reads in milliseconds; what is held is reported (bytes).
 *
 * After loading the set is immutable: any thread may read it.
 */
#ifndef IV_OBSM_H
#define IV_OBSM_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"
#include "meta.h"

typedef struct iv_marray {
    char *name;
    iv_axis_t axis;           /* IV_AXIS_OBS for obsm, IV_AXIS_VAR for varm */
    char encoding[32];        /* the element's encoding-type ("array", "csr_matrix", ...) */
    int64_t n_rows, n_cols;   /* a 1-D array is n_rows x 1 */
    iv_dtype_t dtype;         /* stored dtype (servable arrays) */
    void *data;               /* n_rows * n_cols values, row-major; NULL when not servable */
    char why[160];            /* why it is not servable ("" when it is) */
} iv_marray_t;

typedef struct iv_marrays {
    size_t n;
    iv_marray_t *a;           /* obsm elements first, then varm, each in name order */
    size_t bytes;             /* memory of the values held */
    double load_seconds;
} iv_marrays_t;

/* Reads obsm and varm of the file at path; n_obs / n_var are the axis
 * lengths the arrays must have.  A file without those groups gives an
 * empty set.  Errors (IV_EIO, IV_ENOMEM) name the file and element. */
int iv_marrays_load(const char *path, int64_t n_obs, int64_t n_var, iv_marrays_t **out,
                    iv_err_t *err);
void iv_marrays_free(iv_marrays_t *s);

/* The element of that axis and name, servable or not; NULL if absent. */
const iv_marray_t *iv_marrays_find(const iv_marrays_t *s, iv_axis_t axis, const char *name);

/*
 * Copies rows idx[0..n) (all rows when idx is NULL; n is then ignored) of
 * a servable array into out, row-major, converting to dtype `to` (the
 * stored dtype or IV_DT_FLOAT32 / IV_DT_FLOAT64).  Indices must be in
 * range (the caller validated them).  out holds n * n_cols values of `to`.
 */
void iv_marray_gather(const iv_marray_t *a, const int64_t *idx, int64_t n, iv_dtype_t to, void *out);

#endif
