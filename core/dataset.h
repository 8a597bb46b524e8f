/*
 * A dataset: one IVCSR/IVCSC matrix of one .h5ad file, opened read-only,
 * validated, memory-mapped and indexed at start-up.
 *
 * iv_dataset_open() does every HDF5 call this matrix will ever need:
 * attributes, pointer and value arrays, the chunk table of
 * packed_indices, all in a reader process (h5iso.h) whose crash on a
 * damaged file is this open's error and nobody else's.  Then it builds the row index in one parallel pass over
 * the packed stream (see rowindex.h).  After open returns, a dataset is
 * immutable apart from its chunk cache (internally locked), so any number
 * of threads may query it concurrently.  The hot path reads only the file
 * mapping and memory.
 */
#ifndef IV_DATASET_H
#define IV_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"
#include "pool.h"

typedef enum iv_orient { IV_IVCSR = 0, IV_IVCSC = 1 } iv_orient_t;

typedef struct iv_dataset iv_dataset_t;

typedef struct iv_dataset_opts {
    const char *group;        /* top-level group of the matrix; NULL = "X" */
    uint32_t index_stride;    /* row-index checkpoint every K major slices; 0 = default */
    size_t cache_bytes;       /* decompressed-chunk cache budget; (size_t)-1 = default */
    iv_pool_t *pool;          /* workers for the start-up pass; NULL = caller only */
} iv_dataset_opts_t;

/* Sets defaults (group X, stride 0, cache 1 GiB). */
void iv_dataset_opts_init(iv_dataset_opts_t *o);

typedef struct iv_dataset_info {
    const char *path;         /* as given to open */
    const char *group;
    iv_orient_t orient;
    int64_t n_rows, n_cols;   /* shape: cells x genes, whatever the orientation */
    int64_t n_major, n_minor; /* n_rows/n_cols for IVCSR, swapped for IVCSC */
    int64_t nnz;
    int64_t n_unique;         /* number of (slice, value) groups */
    iv_dtype_t value_dtype;
    iv_dtype_t indices_dtype; /* the file's indices_dtype attribute */
    char codec[64];           /* pipeline description of packed_indices */
    int chunked;              /* 0 = contiguous packed stream */
    uint64_t stream_bytes;    /* decompressed packed_indices length */
    uint64_t stored_bytes;    /* compressed bytes of packed_indices in the file */
    uint64_t n_chunks;
    uint64_t chunk_len;       /* decompressed bytes per chunk (last may be shorter) */
    uint32_t index_stride;
    size_t index_bytes;       /* memory of the row index */
    double open_seconds;      /* validation + loading */
    double index_seconds;     /* row-index build pass */
} iv_dataset_info_t;

int iv_dataset_open(const char *path, const iv_dataset_opts_t *opts, iv_dataset_t **out,
                    iv_err_t *err);
void iv_dataset_close(iv_dataset_t *ds);

const iv_dataset_info_t *iv_dataset_info(const iv_dataset_t *ds);

/* Pointer arrays, loaded at open (read-only, lifetime of ds). */
const int64_t *iv_dataset_major_ptr(const iv_dataset_t *ds);  /* n_major + 1 */
const int64_t *iv_dataset_value_ptr(const iv_dataset_t *ds);  /* n_unique + 1 */
const void *iv_dataset_values(const iv_dataset_t *ds);        /* n_unique, value_dtype */

/* Stored entries of major slice i (from the pointers; no decode). */
int64_t iv_dataset_major_nnz(const iv_dataset_t *ds, int64_t i);

typedef struct iv_cache_stats {
    size_t budget, used, pinned_over_budget;
    uint64_t hits, misses, evictions;
    uint64_t bytes_decompressed;   /* since open */
} iv_cache_stats_t;
void iv_dataset_cache_stats(iv_dataset_t *ds, iv_cache_stats_t *out);
/* Drops every unpinned cached chunk (benchmarks: cold runs). */
void iv_dataset_cache_drop(iv_dataset_t *ds);

#endif /* IV_DATASET_H */
