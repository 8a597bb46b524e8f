/*
 * Selections resolved to positions (see select.h).
 *
 * Names are looked up first (iv_meta_find_names); unknown names, where
 * allowed, are dropped from the list.  A filter is compiled and evaluated
 * to a bitmap over the whole axis (O(rows) word operations), then either
 * turned into the position list (every element selected) or used to
 * sieve the list, which keeps its order and duplicates.
 */
#include "select.h"

#include <stdlib.h>
#include <string.h>

#include "bitmap.h"

static const char *axis_name(iv_axis_t axis)
{
    return axis == IV_AXIS_OBS ? "obs" : "var";
}

static int eval_filter(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e, iv_bitmap_t *bits,
                       iv_err_t *err)
{
    iv_fprog_t *prog = NULL;
    IV_TRY(iv_filter_compile(m, axis, e, &prog, err));
    if (iv_bitmap_init(bits, iv_filter_n_rows(prog)) != 0) {
        iv_filter_free(prog);
        return iv_fail(err, IV_ENOMEM, "out of memory for the %s filter", axis_name(axis));
    }
    int rc = iv_filter_eval(prog, bits, err);
    iv_filter_free(prog);
    if (rc != 0) iv_bitmap_free(bits);
    return rc;
}

/* The listed names' positions, unknown ones (only possible with
 * missing_ignore) dropped; the report goes to rep when given. */
static int name_positions(iv_meta_t *m, iv_axis_t axis, const iv_axis_sel_t *s, int64_t **idx_out,
                          int64_t *n_out, iv_names_report_t *rep, iv_err_t *err)
{
    int64_t *idx = malloc((size_t)(s->n ? s->n : 1) * sizeof *idx), n = 0;
    if (!idx) return iv_fail(err, IV_ENOMEM, "out of memory");
    iv_names_report_t r;
    memset(&r, 0, sizeof r);
    int rc = iv_meta_find_names(m, axis, s->by, s->names, s->n, s->missing_ignore, idx, &r, err);
    if (rc != 0) {
        iv_names_report_free(&r);
        free(idx);
        return rc;
    }
    if (rep) *rep = r;
    else iv_names_report_free(&r);
    for (int64_t i = 0; i < s->n; i++)
        if (idx[i] >= 0) idx[n++] = idx[i];
    *idx_out = idx;
    *n_out = n;
    return 0;
}

/* The listed positions, copied. */
static int copy_positions(const iv_axis_sel_t *s, int64_t **idx_out, int64_t *n_out,
                          iv_err_t *err)
{
    int64_t *idx = malloc((size_t)(s->n ? s->n : 1) * sizeof *idx);
    if (!idx) return iv_fail(err, IV_ENOMEM, "out of memory");
    memcpy(idx, s->idx, (size_t)s->n * sizeof *idx);
    *idx_out = idx;
    *n_out = s->n;
    return 0;
}

/* The positions listed by name or by number, if any. */
static int listed_positions(iv_meta_t *m, iv_axis_t axis, const iv_axis_sel_t *s, int64_t **idx,
                            int64_t *n, iv_names_report_t *rep, iv_err_t *err)
{
    if (s->names) return name_positions(m, axis, s, idx, n, rep, err);
    if (s->idx) return copy_positions(s, idx, n, err);
    return 0;
}

/* Every element, in file order. */
static int all_positions(const iv_meta_t *m, iv_axis_t axis, int64_t **idx_out, int64_t *n_out,
                         iv_err_t *err)
{
    int64_t rows = iv_meta_n_rows(m, axis);
    int64_t *idx = malloc((size_t)(rows ? rows : 1) * sizeof *idx);
    if (!idx) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++) idx[i] = i;
    *idx_out = idx;
    *n_out = rows;
    return 0;
}

/* Sieves the listed positions through the filter, or (nothing listed)
 * makes them from it. */
static int apply_filter(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *filter, int listed,
                        int64_t **idx, int64_t *n, iv_err_t *err)
{
    iv_bitmap_t bits;
    int rc = eval_filter(m, axis, filter, &bits, err);
    if (rc != 0) return rc;
    if (listed) *n = iv_bitmap_filter_index(&bits, *idx, *n, *idx);
    else rc = iv_bitmap_to_index(&bits, idx, n);
    iv_bitmap_free(&bits);
    if (rc != 0)
        return iv_fail(err, IV_ENOMEM, "out of memory applying the %s filter", axis_name(axis));
    return 0;
}

int iv_meta_resolve(iv_meta_t *m, iv_axis_t axis, const iv_axis_sel_t *s, int64_t **idx_out,
                    int64_t *n_out, iv_names_report_t *rep, iv_err_t *err)
{
    *idx_out = NULL;
    *n_out = 0;
    if (rep) memset(rep, 0, sizeof *rep);
    if (!m)
        return iv_fail(err, IV_ENO_METADATA,
                       "names and filters need the dataset's %s metadata, which could not be loaded",
                       axis_name(axis));
    int64_t *idx = NULL, n = 0;
    int listed = s->names || s->idx;
    int rc = listed_positions(m, axis, s, &idx, &n, rep, err);
    if (rc != 0) return rc;
    if (s->filter) rc = apply_filter(m, axis, s->filter, listed, &idx, &n, err);
    else if (!listed && (rc = all_positions(m, axis, &idx, &n, err)) != 0) return rc;
    /* An empty result may come back without an array; callers want one. */
    if (rc == 0 && !idx && !(idx = malloc(sizeof *idx)))
        rc = iv_fail(err, IV_ENOMEM, "out of memory");
    if (rc != 0) {
        free(idx);
        if (rep) iv_names_report_free(rep);
        return rc;
    }
    *idx_out = idx;
    *n_out = n;
    return 0;
}

static int pos_cmp(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* first[k] = the position where idx[k]'s id is first listed, sorting
 * (id, position) pairs in pairs (2n); the number of distinct ids. */
static int64_t first_listings(const int64_t *idx, int64_t n, int64_t *pairs, int64_t *first)
{
    for (int64_t k = 0; k < n; k++) {
        pairs[2 * k] = idx[k];
        pairs[2 * k + 1] = k;
    }
    qsort(pairs, (size_t)n, 2 * sizeof *pairs, pos_cmp);
    int64_t lead = 0, nu = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * (i - 1)]) {
            lead = pairs[2 * i + 1];
            nu++;
        }
        first[pairs[2 * i + 1]] = lead;
    }
    return nu;
}

int iv_sel_distinct(const int64_t *idx, int64_t n, int64_t **uniq, int64_t **where,
                    int64_t *n_uniq, iv_err_t *err)
{
    *uniq = *where = NULL;
    *n_uniq = n;
    int rising = 1;
    for (int64_t k = 1; k < n && rising; k++) rising = idx[k - 1] < idx[k];
    if (n < 2 || rising) return 0;
    /* (id, position) sorted: each id's first position leads its run. */
    int64_t *pairs = malloc((size_t)n * 2 * sizeof *pairs);
    int64_t *first = malloc((size_t)n * sizeof *first);
    if (!pairs || !first) {
        free(pairs);
        free(first);
        return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    }
    int64_t nu = first_listings(idx, n, pairs, first);
    free(pairs);
    if (nu == n) {
        free(first);
        return 0;
    }
    int64_t *u = malloc((size_t)nu * sizeof *u);
    if (!u) {
        free(first);
        return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    }
    /* first[] becomes where[]: a first listing takes the next distinct
     * position, a repeat the one its first listing took. */
    int64_t m = 0;
    for (int64_t k = 0; k < n; k++) {
        if (first[k] == k) {
            u[m] = idx[k];
            first[k] = m++;
        } else {
            first[k] = first[first[k]];
        }
    }
    *uniq = u;
    *where = first;
    *n_uniq = nu;
    return 0;
}
