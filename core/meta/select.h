/*
 * A request's selection of one axis resolved to positions: the engine's
 * half of "obs" and "var" (names looked up, a filter evaluated over the
 * axis and intersected with the selection).  The positions then go to
 * the query as an index list, in the client's order with its duplicates.
 *
 * Threads: a meta is immutable after loading, so any thread may call
 * this; the selection and the results belong to the caller.
 */
#ifndef IV_SELECT_H
#define IV_SELECT_H

#include <stdint.h>

#include "error.h"
#include "filter.h"
#include "meta.h"

typedef struct iv_axis_sel {
    /* The elements: names (when names is not NULL, n of them), else
     * positions idx (n of them), else every element of the axis. */
    const char *const *names;
    const int64_t *idx;
    int64_t n;
    const char *by;           /* names: the column they are looked up in (NULL: the index) */
    int missing_ignore;       /* names: unknown ones are dropped (and reported), not an error */
    const iv_expr_t *filter;  /* NULL, or kept where it holds: file order for every
                               * element, else the list's order */
} iv_axis_sel_t;

/*
 * Resolves s on m's axis into *idx_out (an owned array, never NULL on
 * success; free it) of *n_out positions.  rep, when not NULL, receives
 * which names matched nothing or matched only by ignoring ASCII case, as
 * positions in s->names (free with iv_names_report_free; zeroed when no
 * names were given).  0, or an error code with err set: IV_ENO_METADATA
 * (m is NULL), IV_EUNKNOWN_NAME, IV_EBAD_SELECTION (an unknown by-column),
 * IV_EBAD_FILTER (the filter does not compile), IV_ENOMEM.
 */
int iv_meta_resolve(iv_meta_t *m, iv_axis_t axis, const iv_axis_sel_t *s, int64_t **idx_out,
                    int64_t *n_out, iv_names_report_t *rep, iv_err_t *err);

/*
 * The distinct elements of idx[0..n) in the order each is first listed:
 * *uniq (n_uniq of them) and where[k], the position in *uniq of idx[k].
 * Both NULL (and *n_uniq = n) when no element repeats.  Owned by the
 * caller.  A route that computes per element (an aggregate's genes)
 * computes once per distinct one and repeats the results, so that a body
 * listing one gene a million times costs one gene's work.
 */
int iv_sel_distinct(const int64_t *idx, int64_t n, int64_t **uniq, int64_t **where,
                    int64_t *n_uniq, iv_err_t *err);

#endif /* IV_SELECT_H */
