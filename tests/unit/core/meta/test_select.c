/*
 * Selections resolved to positions (core/meta/select.h), on the tiny
 * fixture's obs: names in the client's order with duplicates, unknown
 * names dropped and reported or refused, names matched by ignoring case
 * reported, filters kept over the whole axis or over a list (its order
 * and duplicates kept), and a missing metadata refused.  Each filtered
 * answer is checked against the filter's own bitmap.
 */
#include <check.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "check_main.h"
#include "filter.h"
#include "fixtures.h"
#include "meta.h"
#include "select.h"
#include "where.h"

static iv_meta_t *tiny(void) { return iv_test_meta("tiny.ivcsr.raw.h5ad"); }

static iv_expr_t *where(const char *w)
{
    iv_expr_t *x = NULL;
    iv_err_t e = {0};
    ck_assert_msg(iv_where_parse(w, strlen(w), &x, &e) == 0, "%s: %s", w, e.msg);
    return x;
}

/* The filter's bitmap over obs, the oracle of the filtered answers. */
static void bits_of(iv_meta_t *m, const iv_expr_t *x, iv_bitmap_t *b)
{
    iv_fprog_t *p = NULL;
    iv_err_t e = {0};
    ck_assert_msg(iv_filter_compile(m, IV_AXIS_OBS, x, &p, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(iv_bitmap_init(b, iv_filter_n_rows(p)), 0);
    ck_assert_msg(iv_filter_eval(p, b, &e) == 0, "%s", e.msg);
    iv_filter_free(p);
}

START_TEST(test_names)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    const iv_meta_col_t *ix = iv_meta_index(m, IV_AXIS_OBS);
    int64_t n_obs = iv_meta_n_rows(m, IV_AXIS_OBS);
    ck_assert_int_ge(n_obs, 3);
    const char *a = iv_meta_col_str(ix, 2), *b = iv_meta_col_str(ix, 0);
    const char *names[] = {a, "no-such-cell", b, a};
    iv_axis_sel_t s = {.names = names, .n = 4, .missing_ignore = 1};
    int64_t *idx = NULL, n = -1;
    iv_names_report_t rep;
    iv_err_t e = {0};
    ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &s, &idx, &n, &rep, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(idx[0], 2);
    ck_assert_int_eq(idx[1], 0);
    ck_assert_int_eq(idx[2], 2);
    ck_assert_int_eq(rep.n_missing, 1);
    ck_assert_int_eq(rep.missing[0], 1);
    ck_assert_int_eq(rep.n_folded, 0);
    iv_names_report_free(&rep);
    free(idx);

    /* Refused without missing_ignore; nothing is handed back. */
    s.missing_ignore = 0;
    idx = (int64_t *)1;
    ck_assert_int_eq(iv_meta_resolve(m, IV_AXIS_OBS, &s, &idx, &n, &rep, &e), IV_EUNKNOWN_NAME);
    ck_assert_ptr_null(idx);
    ck_assert(strstr(e.msg, "no-such-cell") != NULL);

    /* A name matched only by ignoring case is reported as folded (when
     * the index has a letter whose other case is not also a name). */
    char folded[256];
    snprintf(folded, sizeof folded, "%s", a);
    int changed = 0;
    for (char *c = folded; *c; c++)
        if (isalpha((unsigned char)*c)) {
            *c = (char)(islower((unsigned char)*c) ? toupper((unsigned char)*c) : tolower((unsigned char)*c));
            changed = 1;
        }
    if (changed) {
        const char *one[] = {folded};
        iv_axis_sel_t f = {.names = one, .n = 1};
        ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &f, &idx, &n, &rep, &e) == 0, "%s", e.msg);
        ck_assert_int_eq(n, 1);
        ck_assert_int_eq(idx[0], 2);
        ck_assert_int_eq(rep.n_folded, 1);
        iv_names_report_free(&rep);
        free(idx);
    }
    iv_meta_free(m);
}
END_TEST

START_TEST(test_filters)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    int64_t n_obs = iv_meta_n_rows(m, IV_AXIS_OBS);
    const iv_meta_col_t *tc = iv_meta_find_col(m, IV_AXIS_OBS, "total_counts");
    const char *w = tc ? "total_counts > 0" : "not (_index == '')";
    iv_expr_t *x = where(w);
    iv_bitmap_t bits;
    bits_of(m, x, &bits);
    iv_err_t e = {0};
    int64_t *idx = NULL, n = -1;

    /* Every row, then the filter: the set rows, ascending. */
    iv_axis_sel_t all = {.filter = x};
    ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &all, &idx, &n, NULL, &e) == 0, "%s", e.msg);
    int64_t k = 0;
    for (int64_t r = 0; r < n_obs; r++)
        if (iv_bitmap_get(&bits, r)) {
            ck_assert_int_lt(k, n);
            ck_assert_int_eq(idx[k++], r);
        }
    ck_assert_int_eq(k, n);
    free(idx);

    /* A list keeps its order and duplicates; out-of-range entries go. */
    int64_t list[] = {n_obs - 1, 0, n_obs - 1, 1, 0, n_obs + 5};
    iv_axis_sel_t ls = {.idx = list, .n = 6, .filter = x};
    ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &ls, &idx, &n, NULL, &e) == 0, "%s", e.msg);
    k = 0;
    for (int i = 0; i < 6; i++)
        if (list[i] < n_obs && iv_bitmap_get(&bits, list[i])) {
            ck_assert_int_lt(k, n);
            ck_assert_int_eq(idx[k++], list[i]);
        }
    ck_assert_int_eq(k, n);
    free(idx);

    /* No filter and no list: every row. */
    iv_axis_sel_t none = {0};
    ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &none, &idx, &n, NULL, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(n, n_obs);
    for (int64_t r = 0; r < n_obs; r++) ck_assert_int_eq(idx[r], r);
    free(idx);

    /* A filter that selects nothing still gives an array. */
    iv_expr_t *nothing = where("_index == 'no-such-cell'");
    iv_axis_sel_t z = {.filter = nothing};
    ck_assert_msg(iv_meta_resolve(m, IV_AXIS_OBS, &z, &idx, &n, NULL, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(n, 0);
    ck_assert_ptr_nonnull(idx);
    free(idx);
    iv_expr_free(nothing);

    /* A filter on a column that does not exist is refused. */
    iv_expr_t *bad = where("no_such_column > 1");
    iv_axis_sel_t bs = {.filter = bad};
    ck_assert_int_eq(iv_meta_resolve(m, IV_AXIS_OBS, &bs, &idx, &n, NULL, &e), IV_EBAD_FILTER);
    ck_assert_ptr_null(idx);
    iv_expr_free(bad);

    iv_bitmap_free(&bits);
    iv_expr_free(x);
    iv_meta_free(m);
}
END_TEST

START_TEST(test_no_metadata)
{
    const char *names[] = {"a"};
    iv_axis_sel_t s = {.names = names, .n = 1};
    int64_t *idx = NULL, n = 0;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_meta_resolve(NULL, IV_AXIS_VAR, &s, &idx, &n, NULL, &e), IV_ENO_METADATA);
    ck_assert(strstr(e.msg, "var") != NULL);
    ck_assert_ptr_null(idx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("select");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_filters);
    tcase_add_test(tc, test_no_metadata);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
