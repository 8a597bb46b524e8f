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
 * When the output rows are the serving orientation's major slices (cells
 * of a cell-major copy asked by obs, genes of a gene-major copy asked by
 * var, or IV_OUT_MAJOR) they are decoded directly.  Otherwise
 * iv_query_new plans a transpose; iv_query_prepare() decodes the selected
 * major slices once and builds the output rows over the distinct elements
 * of each selection (a cell or gene listed many times is held once and
 * repeated as blocks are copied out), so its memory is bounded by the
 * distinct sub-matrix, and by max_work_bytes when set.  Blocks of a
 * direct decode are planned from each slice's entries times the most
 * times a minor element is listed, so a block stays near block_nnz
 * whatever the duplicates.
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
    IV_OUT_MAJOR = 1,     /* blocks of the serving orientation's major slices */
    IV_OUT_VARS = 2,      /* blocks of gene rows: the CSC of the result; columns are
                           * positions in the obs selection */
} iv_out_axis_t;

/* Which orientation serves a query (see iv_query_new). */
typedef enum iv_pick {
    IV_PICK_AUTO = 0,     /* the planner's choice */
    IV_PICK_CELLS = 1,    /* cell-major (IVCSR) */
    IV_PICK_GENES = 2,    /* gene-major (IVCSC) */
} iv_pick_t;

typedef struct iv_query_opts {
    iv_out_axis_t axis;
    int64_t block_nnz;    /* target stored entries per block; 0 = default (262144) */
    int64_t block_rows;   /* max rows per block; 0 = default (65536) */
    iv_pick_t pick;       /* orientation; AUTO = the planner's (the file's with IV_OUT_MAJOR) */
    int64_t max_work_bytes; /* the most a transpose may hold before its first block (prepare
                             * fails with IV_ETOO_LARGE past it); 0 = no bound */
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
 * The planner.  A dataset may have both orientations (iv_dataset_other).
 * The one chosen is the one whose decode reads fewer bytes, estimated from
 * the pointer arrays alone: the stored entries of the selected major
 * slices (cells for cell-major, genes for gene-major; all of them when the
 * axis is wholly selected) times that stream's bytes per entry, plus,
 * when the orientation has to be turned around for the asked output axis,
 * what the transpose adds: 4 bytes per output row for its counters and 8
 * per output entry (estimated as the decoded entries times the share of
 * the output axis selected), since it holds the whole output before the
 * first block goes out.  Ties keep the file's orientation.  Results are identical whichever serves a query.
 * Sets *bytes_est per orientation (index IV_IVCSR / IV_IVCSC; -1 when
 * absent) when bytes_est is not NULL, and returns the chosen orientation.
 */
iv_orient_t iv_plan_orient(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                           iv_out_axis_t axis, double bytes_est[2]);

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
/* An upper bound of the output nnz without decoding: the hint when known,
 * else the stored entries the decode visits, counted until past cap (a
 * result above cap says only that). */
int64_t iv_query_stored_bound(const iv_query_t *q, int64_t cap);
int iv_query_index_size(const iv_query_t *q);
iv_dtype_t iv_query_dtype(const iv_query_t *q);
/* The orientation serving q, and whether its rows are genes (IV_OUT_VARS). */
iv_orient_t iv_query_orient(const iv_query_t *q);
int iv_query_by_var(const iv_query_t *q);

/* Decodes block b into *out (fields allocated; free with iv_block_free).
 * Thread-safe.  Returns IV_ECANCELLED after iv_query_cancel(). */
int iv_query_decode_block(iv_query_t *q, int64_t b, iv_block_t *out, iv_err_t *err);
void iv_block_free(iv_block_t *blk);

/* Asks running and later decode_block calls to stop early (any thread). */
void iv_query_cancel(iv_query_t *q);

/* Bytes decompressed on behalf of this query (cache misses), for metrics. */
uint64_t iv_query_bytes_decompressed(const iv_query_t *q);

/* Datasets of at least this many major slices get a table of entries per
 * slice on their first query (default 65,536); tests lower it to run the
 * planner through the table on small files. */
void iv_query_set_nnz_table_min(int64_t slices);

/* Cell queries decode their slices' varints with the AVX-512 kernel
 * where the CPU has it (on, the default), or one varint at a time (off);
 * tests run both and compare.  Read when a query is made. */
void iv_query_set_vector(int on);
/* Whether queries made from now on read a dataset's wide copy when it has
 * one (widefile.h; on by default): off, the packed stream, for tests and
 * benchmarks that compare the two. */
void iv_query_set_wide(int on);

/* The dense decode's bitmaps and tags (a byte per output column) are kept
 * between queries up to this many bytes in all (default 64 MiB), so that
 * a gene over millions of cells does not fault a fresh tag array in each
 * time; 0 keeps none.  iv_query_scratch_kept: the bytes kept now. */
void iv_query_set_scratch_keep(size_t bytes);
size_t iv_query_scratch_kept(void);

#endif /* IV_QUERY_H */
