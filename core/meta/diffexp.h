/*
 * Differential expression: for every gene, one group of cells against
 * another (or against the rest of a universe of cells), by Welch's t-test
 * or by the Wilcoxon rank-sum test, with the numbers scanpy's
 * rank_genes_groups reports (score, log2 fold change, p-value,
 * Benjamini-Hochberg adjusted p-value) and each side's mean and fraction
 * of cells expressing.
 *
 * The caller labels the cells of the universe 0 .. n_labels - 1 (cells
 * outside it are not fed).  Labels 0 .. n_tested - 1 are tested, each
 * against `reference` (a label) or, with reference -1, against every
 * other cell of the universe.  Two groups compared directly are labels 0
 * and 1 with n_tested 1 and reference -1.
 *
 * The input is gene rows: one gene's stored entries (positions in the
 * universe and values, any dtype), fed once per gene by any thread, each
 * thread with its own iv_de_work_t.  Implicit zeros are never
 * materialised: they enter the t-test as counts and the rank sum as one
 * tie block.  A gene's results do not depend on which thread computed it.
 *
 * Exactness: the t-test's moments are two-pass per group (mean, then the
 * squared deviations, the implicit zeros added as a count), and a "rest"
 * is combined from the groups' moments with Chan's formula, so scores
 * agree with scipy.stats.ttest_ind(equal_var=False) to about 1e-13.  Rank
 * sums are multiples of 1/2 below 2^52, hence exact.  p-values come from
 * erfc and the regularised incomplete beta function written here.
 * Where scipy gives NaN (a group of one cell for the t-test, no variance,
 * a rest that is empty) the score is 0 and the p-value 1, as scanpy
 * reports them; a t of +-infinity (both groups constant and different)
 * has p-value 0, as scipy.
 *
 * Threads: iv_de_gene may run concurrently for different genes, each
 * caller with its own work; iv_de_finish runs once after all genes.
 */
#ifndef IV_DIFFEXP_H
#define IV_DIFFEXP_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"

typedef enum iv_de_method {
    IV_DE_TTEST = 1,
    IV_DE_WILCOXON = 2,
} iv_de_method_t;

typedef struct iv_de_spec {
    iv_de_method_t method;
    int log1p;                 /* values are replaced by log1p(value) first */
    int32_t n_labels;
    int32_t n_tested;          /* labels 0 .. n_tested - 1 are tested */
    int32_t reference;         /* a label >= n_tested, or -1: the rest of the universe */
    const int64_t *n_cells;    /* n_labels: cells of each label (borrowed) */
    const int32_t *label;      /* label of each universe position: copied as bytes by
                                * iv_de_new when n_labels <= 127 (then the caller may
                                * free it), else borrowed for de's lifetime */
    int64_t n_universe;        /* positions 0 .. n_universe - 1 */
    int64_t n_genes;
} iv_de_spec_t;

/* One (tested group, gene) result; side 1 is the group, side 2 the
 * reference or the rest. */
typedef struct iv_de_row {
    double score, lfc, pval, pval_adj;
    double mean1, mean2, frac1, frac2;
} iv_de_row_t;

typedef struct iv_de iv_de_t;
typedef struct iv_de_work iv_de_work_t;

/* Bytes of the results (n_tested * n_genes rows). */
size_t iv_de_result_bytes(const iv_de_spec_t *s);
/* 0, or IV_EINVALID_ARG / IV_ENOMEM. The spec's arrays must outlive de. */
int iv_de_new(const iv_de_spec_t *s, iv_de_t **out, iv_err_t *err);
void iv_de_free(iv_de_t *de);
/* Changes the spec's log1p before the first gene (a caller deciding it
 * from the data's first block). */
void iv_de_set_log1p(iv_de_t *de, int on);

/* A thread's work state (NULL when out of memory).  Its sort scratch
 * grows to the largest gene fed: iv_de_scratch_bytes(nnz) more bytes. */
iv_de_work_t *iv_de_work_new(const iv_de_t *de);
void iv_de_work_free(iv_de_work_t *w);
size_t iv_de_scratch_bytes(const iv_de_t *de, int64_t nnz);
/* The scratch the work holds now, and dropping it (a memory gate
 * releases it before waiting for a larger one). */
size_t iv_de_work_held(const iv_de_work_t *w);
/* Grows the scratch to n entries now (0 or IV_ENOMEM). */
int iv_de_work_reserve(iv_de_work_t *w, int64_t n);
/* With gated set, iv_de_gene never allocates scratch: a gene that needs
 * more than the work holds returns IV_DE_NEED_SCRATCH (nothing written),
 * for the caller to reserve nnz entries within its budget and call again.
 * Most genes need none (see diffexp.c). */
void iv_de_work_set_gated(iv_de_work_t *w, int gated);
#define IV_DE_NEED_SCRATCH 1
void iv_de_work_drop(iv_de_work_t *w);

/*
 * Computes gene j (0 <= j < n_genes) from its nnz stored entries:
 * indices are universe positions (int32 when index_size is 4, else
 * int64; each at most once), data has dtype.  IV_ENOMEM when the sort
 * scratch cannot grow, IV_DE_NEED_SCRATCH (gated work) when it would have
 * to (the gene's results are then left unset).
 */
int iv_de_gene(iv_de_t *de, iv_de_work_t *w, int64_t j, int64_t nnz, const void *indices,
               int index_size, const void *data, iv_dtype_t dtype);

/* Benjamini-Hochberg adjusted p-values of every tested group; call once
 * after every gene. */
int iv_de_finish(iv_de_t *de, iv_err_t *err);
/* The result of tested group g, gene j. */
const iv_de_row_t *iv_de_row(const iv_de_t *de, int32_t g, int64_t j);

/* ---- the special functions, public for their tests ------------------ */

/* erfc(x) to a few ulp relative, any x. */
double iv_de_erfc(double x);
/* Two-sided p-value of a standard normal z: erfc(|z| / sqrt 2). */
double iv_de_norm_p2(double z);
/* Regularised incomplete beta I_x(a, b), a, b > 0, 0 <= x <= 1. */
double iv_de_betainc(double a, double b, double x);
/* Two-sided p-value of Student's t with df degrees of freedom (df > 0,
 * not necessarily an integer). */
double iv_de_t_p2(double t, double df);
/* Benjamini-Hochberg: adj[i] for p[0..n) (adj may be p); 0 or IV_ENOMEM. */
int iv_de_bh(const double *p, int64_t n, double *adj);

#endif
