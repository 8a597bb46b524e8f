/*
 * Writes a standard AnnData .h5ad (what anndata.read_h5ad opens) from a
 * query result: X as a csr_matrix in the result's dtype, obs / var rows
 * subset in the selection's order, obsm / varm rows subset, uns copied.
 *
 * The source file is read with HDF5 (metadata only); X comes from memory
 * as the query's blocks, written without concatenating them.  Data frame
 * columns are subset by encoding: plain arrays and string arrays row by
 * row, categoricals by their codes, keeping only the categories the
 * selected rows use (as anndata's subset does, uns's "{col}_colors" of obs
 * and var columns trimmed alike), nullable arrays by values and mask.  Elements this writer cannot subset (a sparse
 * matrix in obsm, an unknown encoding) are left out and named in
 * `skipped`; obsp, varp, layers and raw are not exported.
 *
 * The file is written under a temporary name beside out_path and renamed
 * at the end.  One call, one thread.
 */
#ifndef IV_ANNDATA_WRITE_H
#define IV_ANNDATA_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"
#include "query.h"

typedef struct iv_adw_x {
    int64_t n_rows, n_cols, nnz;      /* the result's shape */
    int64_t src_rows, src_cols;       /* the source matrix's shape (obs, var lengths) */
    const int64_t *indptr;            /* n_rows + 1 */
    size_t n_parts;                   /* blocks, in row order */
    const void *const *indices;       /* per part */
    const size_t *indices_bytes;
    int index_size;                   /* 4 or 8 */
    const void *const *data;
    const size_t *data_bytes;
    iv_dtype_t dtype;
    /* indptr and indices in the file: 0 = int32 while every pointer and
     * index fits, int64 otherwise (as scipy); 32 or 64 = that type (32 is
     * refused when something does not fit). */
    int index_bits;
} iv_adw_x_t;

/* obs / var: the selections the result was made with (all or indices). */
int iv_anndata_write(const char *src_path, const char *out_path, const iv_adw_x_t *x,
                     const iv_sel_t *obs, const iv_sel_t *var, char *skipped, size_t skipped_cap,
                     iv_err_t *err);

#endif /* IV_ANNDATA_WRITE_H */
