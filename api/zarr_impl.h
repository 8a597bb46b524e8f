/*
 * Internals shared by zarr_store.c (the layout and the metadata nodes)
 * and zarr_chunk.c (the chunks' bytes); see zarr.h.
 */
#ifndef IV_ZARR_IMPL_H
#define IV_ZARR_IMPL_H

#include <stdint.h>

#include "uns.h"
#include "zarr.h"

/* Where an array's values come from. */
typedef enum zarr_src {
    ZS_X_INDPTR = 0,          /* X's major-slice pointers (int64) */
    ZS_X_INDICES,             /* X's minor indices, entries in major order */
    ZS_X_DATA,                /* X's values, likewise */
    ZS_COL,                   /* a column's numbers, bools or category codes */
    ZS_COL_MASK,              /* a nullable column's mask (bool, 1 = missing) */
    ZS_COL_STR,               /* a string column or index (vlen-utf8) */
    ZS_CATS_STR,              /* a categorical column's categories, strings */
    ZS_CATS_NUM,              /* ... numbers (float64) */
    ZS_MARRAY,                /* an obsm/varm array */
    ZS_UNS,                   /* an uns entry (scalar or 1-D) */
} zarr_src_t;

typedef struct zarr_arr {
    zarr_src_t src;
    int csr;                  /* a matrix from its cell-major orientation (else gene-major) */
    iv_dataset_t *mx;         /* ZS_X_*: the matrix (X, a layer, raw/X) */
    char dtype[16];           /* Zarr dtype: "<i8", "|b1", "|O" (vlen-utf8) */
    iv_dtype_t vt;            /* element type of numeric arrays */
    int is_bool;
    int is_str;
    int ustr_width;           /* > 0: a fixed-width string "<UN" (N code points, UTF-32) */
    int ndim;                 /* 0 (a scalar), 1 or 2 */
    int zstd;                 /* chunks compressed with zstd at IV_ZARR_ZSTD_LEVEL (else none) */
    int64_t shape[2], chunks[2];
    const iv_meta_col_t *col; /* ZS_COL*, ZS_CATS_* */
    const iv_marray_t *ma;    /* ZS_MARRAY */
    const iv_uns_entry_t *ue; /* ZS_UNS */
} zarr_arr_t;

typedef struct zarr_node {
    const char *path;         /* "obs/cell_type/codes"; "" for the root; no "csr/" */
    int is_group;
    const char *attrs;        /* the .zattrs JSON object */
    zarr_arr_t a;             /* arrays */
} zarr_node_t;

/* Entries per X chunk of a source. */
static inline int64_t zarr_x_chunk(const iv_zarr_src_t *src)
{
    return src->x_chunk > 0 ? src->x_chunk : IV_ZARR_X_CHUNK;
}

/* Appends chunk idx (idx[1] is 0 for 1-D arrays) of array a to out, the
 * bytes zarr-python writes for it; the caller checked that idx is a chunk
 * of the array.  Errors as iv_zarr_get's. */
int zarr_chunk(const iv_zarr_src_t *src, const zarr_arr_t *a, const int64_t idx[2], iv_buf_t *out,
               iv_err_t *err);

/* X's orientation csr (cell-major, else gene-major) of matrix mx: *md,
 * or why there is none (IV_ENOT_READY while it is built). */
int zarr_x_orient(iv_dataset_t *mx, int csr, iv_dataset_t **md, iv_err_t *err);

/* Chunk k of X/indices and X/data of mx's orientation md (C entries a
 * chunk), encoded as served, into parts (empty): the bytes the store's
 * chunks hold. */
int zarr_x_parts(const iv_zarr_src_t *src, iv_dataset_t *mx, iv_dataset_t *md, int csr, int64_t C,
                 int64_t k, iv_buf_t parts[2], iv_err_t *err);

/* iv_file_sum of X/indptr of orientation md (n_major slices), 0 when out
 * of memory. */
uint64_t zarr_x_ptr_sum(iv_dataset_t *md, int64_t n_major);

#endif
