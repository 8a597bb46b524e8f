/*
 * Selective decode: X[obs_idx, :][:, var_idx] with numpy semantics.
 *
 * A query is planned once (iv_query_new: selections validated, gene lookup
 * table built, output split into blocks of bounded nnz) and then decoded
 * block by block, by any threads, in any order: iv_query_decode_block() is
 * thread-safe and a block's content does not depend on which thread or how
 * many threads decode it.  Each block is a CSR slab of consecutive output
 * rows, owned by the caller.
 *
 * Output rows are in the requested order with duplicates repeated; output
 * columns are positions in var_idx (a gene listed twice is two columns);
 * indices are sorted within each row; values keep the file's dtype;
 * explicit stored zeros are kept.
 *
 * IVCSR: rows are the major axis, decoded directly.  IVCSC: iv_query_new
 * with IV_OUT_ROWS plans a transpose; iv_query_prepare() decodes the
 * selected gene columns once and builds the cell rows (memory bounded by
 * the output); with IV_OUT_MAJOR the blocks are gene columns (CSC blocks,
 * "rows" of the block are genes) streamed without a transpose.
 */
#ifndef IV_QUERY_H
#define IV_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"

/* A selection on one axis.  all != 0 selects every element in order. */
typedef struct iv_sel {
    int all;
    int64_t n;            /* number of selected elements (when !all) */
    const int64_t *idx;   /* n indices, any order, duplicates allowed; caller-owned */
} iv_sel_t;

typedef enum iv_out_axis {
    IV_OUT_ROWS = 0,      /* blocks of cell rows (CSR), the default */
    IV_OUT_MAJOR = 1,     /* blocks of the file's major slices (CSC blocks for IVCSC) */
} iv_out_axis_t;

typedef struct iv_query_opts {
    iv_out_axis_t axis;
    int64_t block_nnz;    /* target stored entries per block; 0 = default (262144) */
    int64_t block_rows;   /* max rows per block; 0 = default (65536) */
} iv_query_opts_t;

typedef struct iv_query iv_query_t;

/* One decoded block: rows [row0, row0 + n_rows) of the output. */
typedef struct iv_block {
    int64_t row0, n_rows;
    int64_t *ids;         /* n_rows: original index of each output row (obs, or var for CSC) */
    int64_t *indptr;      /* n_rows + 1, starting at 0 */
    void *indices;        /* nnz, int32 when index_size == 4, else int64 */
    void *data;           /* nnz values of value_dtype */
    int64_t nnz;
    int index_size;       /* 4 or 8 */
    iv_dtype_t dtype;
} iv_block_t;

/*
 * Validates obs/var against the shape (an index out of range is
 * IV_EOUT_OF_RANGE naming the axis, position and value) and plans blocks.
 * The selections are copied; the caller may free them afterwards.
 */
int iv_query_new(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                 const iv_query_opts_t *opts, iv_query_t **out, iv_err_t *err);
void iv_query_free(iv_query_t *q);

/* Work that must precede decode_block (IVCSC transposes); no-op otherwise.
 * May use pool (NULL = caller only).  Not thread-safe with itself. */
int iv_query_prepare(iv_query_t *q, iv_pool_t *pool, iv_err_t *err);

int64_t iv_query_n_blocks(const iv_query_t *q);
int64_t iv_query_n_rows(const iv_query_t *q);   /* output rows */
int64_t iv_query_n_cols(const iv_query_t *q);   /* output columns */
/* Exact output nnz when known without decoding (all genes selected, or
 * after prepare); -1 otherwise. */
int64_t iv_query_nnz_hint(const iv_query_t *q);
int iv_query_index_size(const iv_query_t *q);
iv_dtype_t iv_query_dtype(const iv_query_t *q);

/* Decodes block b into *out (fields allocated; free with iv_block_free).
 * Thread-safe.  Returns IV_ECANCELLED after iv_query_cancel(). */
int iv_query_decode_block(iv_query_t *q, int64_t b, iv_block_t *out, iv_err_t *err);
void iv_block_free(iv_block_t *blk);

/* Asks running and later decode_block calls to stop early (any thread). */
void iv_query_cancel(iv_query_t *q);

/* Bytes decompressed on behalf of this query (cache misses), for metrics. */
uint64_t iv_query_bytes_decompressed(const iv_query_t *q);

#endif /* IV_QUERY_H */
