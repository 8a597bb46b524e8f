/*
 * Grouped statistics over a sparse selection: for every (group of cells,
 * gene) pair the sum, mean, variance, number of cells expressing (value
 * != 0), fraction expressing and maximum, the way pandas computes them on
 * the dense matrix (implicit zeros count as cells with value 0).
 *
 * The accumulator takes CSR blocks from any source, in either
 * orientation: cell rows with gene columns (iv_agg_add_rows: an IVCSR
 * decode), or gene rows with cell columns (iv_agg_add_cols: an IVCSC
 * decode or a gene-major copy).  Sums are float64; values are read in
 * their stored dtype.  Work is split into partials, each fed by one
 * thread at a time and merged in partial order at the end, so a result
 * does not depend on thread timing.
 *
 * Exactness: sum, nnz, max and (for integer data below 2^53) mean are
 * exact.  var is computed from the float64 sum and sum of squares in long
 * double at the end: for integer data it agrees with numpy's two-pass
 * variance to a few ulp; for floating-point data sums are taken in block
 * order, not numpy's pairwise order, so expect a relative difference of
 * order n * 2^-53.
 */
#ifndef IV_AGGREGATE_H
#define IV_AGGREGATE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"

enum {
    IV_STAT_SUM = 1 << 0,
    IV_STAT_MEAN = 1 << 1,
    IV_STAT_VAR = 1 << 2,
    IV_STAT_NNZ = 1 << 3,
    IV_STAT_FRAC = 1 << 4,
    IV_STAT_MAX = 1 << 5,
};
#define IV_STAT_COUNT 6

/* "sum", "mean", "var", "nnz", "frac_nonzero", "max" for bit i; the bit of
 * a name (0 if unknown). */
const char *iv_stat_name(int bit);
int iv_stat_parse(const char *name);

typedef struct iv_agg iv_agg_t;

/*
 * An accumulator for n_groups x n_genes results of the stats in mask, fed
 * through n_parts partials (one thread at a time each).  Memory: about
 * n_parts * n_groups * n_genes * 8 bytes per array kept (sum, sum of
 * squares, nnz, stored count and max, as the stats need).
 */
int iv_agg_new(int64_t n_groups, int64_t n_genes, unsigned mask, unsigned n_parts, iv_agg_t **out,
               iv_err_t *err);
void iv_agg_free(iv_agg_t *a);
/* Bytes one partial takes (to choose n_parts within a budget). */
size_t iv_agg_part_bytes(int64_t n_groups, int64_t n_genes, unsigned mask);

/*
 * Cell-major block: n_rows cells; row_group[r] is the group of row r
 * (-1: not counted); indptr[n_rows + 1] from 0; indices (int32 when
 * index_size is 4, else int64) are gene positions < n_genes; data has the
 * block's dtype.
 */
void iv_agg_add_rows(iv_agg_t *a, unsigned part, int64_t n_rows, const int32_t *row_group,
                     const int64_t *indptr, const void *indices, int index_size, const void *data,
                     iv_dtype_t dtype);

/*
 * Gene-major block: rows are genes gene0 .. gene0 + n_rows - 1; indices
 * are cell positions whose group is cell_group[position] (-1: not
 * counted).
 */
void iv_agg_add_cols(iv_agg_t *a, unsigned part, int64_t gene0, int64_t n_rows,
                     const int32_t *cell_group, const int64_t *indptr, const void *indices,
                     int index_size, const void *data, iv_dtype_t dtype);

/*
 * Merges the partials and writes stat `bit` (one of mask) into out
 * (n_groups * n_genes doubles, group-major).  n_cells[g] is the number
 * of cells of group g in the selection (duplicates counted); ddof is the
 * variance's delta degrees of freedom (pandas: 1, numpy: 0); a group with
 * n_cells <= ddof gets NaN for var, and an empty group NaN for mean, var,
 * frac_nonzero and max.  May be called once per stat after all adds.
 */
void iv_agg_result(iv_agg_t *a, int bit, const int64_t *n_cells, int ddof, double *out);

#endif
