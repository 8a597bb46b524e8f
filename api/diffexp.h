/*
 * POST /v1/datasets/{id}/diffexp: marker genes, one group of cells
 * against another or against the rest, or every category of an obs
 * column against the rest (or against one category) in one pass.
 *
 *   {"group1": SEL, "group2": SEL | "rest", "method": "t-test" | "wilcoxon",
 *    "top_n": N, "log1p": "auto" | true | false, "var": SEL, "min_frac": f,
 *    "dry_run": true}
 *   {"group_by": "cell_type", "reference": "rest" | "<category>",
 *    "groups": ["B", ...], ...the same method, top_n, log1p, var, min_frac}
 *
 * SEL is the query route's selection object (proto/request.h): index,
 * range, mask, names, filter, where.  The answer is JSON (docs/diffexp.md).
 *
 * Socket-free: the server copies the request, calls iv_api_diffexp on a
 * worker and sends out.  The pass over the matrix runs on pool (the
 * caller takes part) and stops at the next block once *cancel is set.
 */
#ifndef IV_API_DIFFEXP_H
#define IV_API_DIFFEXP_H

#include <stdatomic.h>
#include <stddef.h>

#include "buf.h"
#include "dataset.h"
#include "error.h"
#include "meta.h"
#include "pool.h"

typedef struct iv_api_diffexp_in {
    const char *body;         /* the JSON body (need not be NUL terminated) */
    size_t body_len;
    iv_dataset_t *ds;         /* the matrix (X) */
    iv_meta_t *meta;          /* its obs and var */
    iv_pool_t *pool;          /* NULL: the caller computes alone */
    const atomic_int *cancel; /* NULL: never cancelled */
    size_t json_bytes;        /* the most a JSON answer may take (0: no bound) */
    const char *accept;       /* the Accept header, or NULL: IV_DIFFEXP_MEDIA asks for binary */
} iv_api_diffexp_in_t;

/* The binary answer: "IVDE", u32 version 1, i64 json_len, the JSON answer
 * with "n_genes": N in place of each "genes" list (json_len bytes), zero
 * padding to a multiple of 8, then per gene list in document order
 * int64 index[N] and float64 score, logfoldchange, pval, pval_adj,
 * mean1, mean2, frac1, frac2 [N] each; little-endian; an infinite score
 * stays infinite. */
#define IV_DIFFEXP_MEDIA "application/vnd.ivserve.diffexp"


/*
 * Answers the request into out; *ctype (static) is application/json or
 * IV_DIFFEXP_MEDIA.  0, or an error whose
 * iv_error_status is the HTTP status: 400 a malformed body or parameter,
 * 422 an unknown column, category or name, an empty group or groups that
 * overlap, 413 over json_bytes, 499 cancelled.
 */
int iv_api_diffexp(const iv_api_diffexp_in_t *in, iv_buf_t *out, const char **ctype, iv_err_t *err);

#endif
