/* Tests of the selection-list grammar shared by the query string and the
 * command line (proto/request.c sel_from_list, iv_psel_parse_list,
 * iv_psel_resolve and the names it reports; docs/selection-lists.md). */
#include <check.h>

#include "check_main.h"
#include "tiny_meta.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "request.h"

static void expect_idx(const iv_psel_t *p, const int64_t *want, int64_t n)
{
    ck_assert_int_eq(p->n, n);
    for (int64_t i = 0; i < n; i++) ck_assert_int_eq(p->idx[i], want[i]);
}

START_TEST(test_query_string_mixed_list)
{
    iv_qreq_t q;
    iv_err_t e = {0};
    const char *qs = "obs=5,3,3,10:13&var=7:9";
    ck_assert_int_eq(iv_qreq_parse_query(qs, strlen(qs), 60, 50, &q, &e), 0);
    static const int64_t want[] = {5, 3, 3, 10, 11, 12};
    ck_assert_int_eq(q.obs.kind, IV_PSEL_INDEX);
    expect_idx(&q.obs, want, 6);
    /* One range alone stays a range selection. */
    static const int64_t want_var[] = {7, 8};
    ck_assert_int_eq(q.var.kind, IV_PSEL_RANGE);
    expect_idx(&q.var, want_var, 2);
    iv_qreq_free(&q);
}
END_TEST

START_TEST(test_query_string_list_errors)
{
    static const struct {
        const char *qs;
        int code;
        const char *msg;
    } cases[] = {
        {"obs=1,70", IV_EOUT_OF_RANGE, "obs.index[1] = 70 is out of range [0, 60)"},
        {"obs=1,5:3", IV_EOUT_OF_RANGE, "obs.range [5, 3) is not within [0, 60)"},
        {"obs=1,58:61", IV_EOUT_OF_RANGE, "obs.range [58, 61) is not within [0, 60)"},
        {"obs=1,5:", IV_EBAD_SELECTION, "obs=5: is not START:STOP"},
        {"obs=1,,2", IV_EBAD_SELECTION, "obs: item 1 ('') is not an integer"},
        {"obs=1:99999999999999999999", IV_EOUT_OF_RANGE, "is not within [0, 60)"},
        {"var=CD3E", IV_EBAD_SELECTION, "var_names=CD3E"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        iv_qreq_t q;
        iv_err_t e = {0};
        int rc = iv_qreq_parse_query(cases[k].qs, strlen(cases[k].qs), 60, 50, &q, &e);
        ck_assert_msg(rc == cases[k].code, "%s: rc %d", cases[k].qs, rc);
        ck_assert_msg(strstr(e.msg, cases[k].msg) != NULL, "%s: message '%s'", cases[k].qs, e.msg);
    }
}
END_TEST

START_TEST(test_command_line_forms)
{
    iv_psel_t p;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", NULL, NULL, 60, &e), 0);
    ck_assert_int_eq(p.kind, IV_PSEL_ALL);
    ck_assert_int_eq(iv_psel_view(&p).all, 1);
    iv_psel_free(&p);
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "*", NULL, 60, &e), 0);
    ck_assert_int_eq(p.kind, IV_PSEL_ALL);
    iv_psel_free(&p);
    /* "" is the empty selection, not everything. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "", NULL, 60, &e), 0);
    ck_assert_int_eq(p.kind, IV_PSEL_INDEX);
    ck_assert_int_eq(p.n, 0);
    ck_assert_int_eq(iv_psel_view(&p).all, 0);
    iv_psel_free(&p);
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "59,0:2", NULL, 60, &e), 0);
    static const int64_t want[] = {59, 0, 1};
    expect_idx(&p, want, 3);
    iv_psel_free(&p);
    /* Anything but digits, commas and colons is names, kept verbatim. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "var", "CD3E,MS4A1,-1", NULL, 50, &e), 0);
    ck_assert_int_eq(p.kind, IV_PSEL_NAMES);
    ck_assert_int_eq(p.n, 3);
    ck_assert_str_eq(p.names[0], "CD3E");
    ck_assert_str_eq(p.names[2], "-1");
    iv_psel_free(&p);
    /* A where filter goes with everything or with a list. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", NULL, "n_genes > 5", 60, &e), 0);
    ck_assert_int_eq(p.kind, IV_PSEL_ALL);
    ck_assert_ptr_nonnull(p.filter);
    iv_psel_free(&p);
}
END_TEST

START_TEST(test_command_line_errors_leave_nothing)
{
    iv_psel_t p;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "3,60", NULL, 60, &e), IV_EOUT_OF_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "obs.index[1] = 60 is out of range [0, 60)"));
    ck_assert_ptr_null(p.idx);
    ck_assert_int_eq(p.kind, IV_PSEL_ALL);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "5,", NULL, 60, &e), IV_EBAD_SELECTION);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_psel_parse_list(&p, "var", "1:2", "x ==", 50, &e), IV_EBAD_REQUEST);
    ck_assert_ptr_nonnull(strstr(e.msg, "var.where: syntax error"));
    ck_assert_ptr_null(p.idx);
    ck_assert_ptr_null(p.filter);
}
END_TEST

START_TEST(test_resolve_leaves_positions_and_needs_metadata)
{
    iv_psel_t p;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "4,2", NULL, 60, &e), 0);
    int64_t *before = p.idx;
    /* Positions alone need no metadata: left as they are. */
    ck_assert_int_eq(iv_psel_resolve(&p, NULL, IV_AXIS_OBS, NULL, NULL, &e), 0);
    ck_assert_ptr_eq(p.idx, before);
    static const int64_t want[] = {4, 2};
    expect_idx(&p, want, 2);
    iv_psel_free(&p);
    /* Names do: without it the engine's resolver says so. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "AAAC,TTTG", NULL, 60, &e), 0);
    ck_assert_int_eq(iv_psel_resolve(&p, NULL, IV_AXIS_OBS, NULL, NULL, &e), IV_ENO_METADATA);
    ck_assert_int_eq(p.kind, IV_PSEL_NAMES);
    iv_psel_free(&p);
}
END_TEST

/* The tiny fixture's metadata, or NULL when the fixtures are absent. */
static iv_meta_t *tiny(void) { return iv_test_tiny_meta(); }

static void expect_list(iv_buf_t *b, const char *want)
{
    iv_buf_append(b, "", 1);
    ck_assert_str_eq(b->data, want);
    iv_buf_free(b);
    iv_buf_init(b);
}

START_TEST(test_resolve_reports_dropped_and_folded_names)
{
    iv_meta_t *m = tiny();
    if (!m) {
        fprintf(stderr, "test_sel_list: fixtures absent, skipped\n");
        return;
    }
    iv_psel_t p;
    iv_err_t e = {0};
    iv_buf_t dropped, folded;
    iv_buf_init(&dropped);
    iv_buf_init(&folded);
    /* An unknown name is dropped and listed; one matched only by ignoring
     * case is kept and listed apart. */
    const char *sel = "AAAC80585129-1,nope,aaacf7c9af85-0,\"q\"";
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", sel, NULL, 60, &e), 0);
    p.missing_ignore = 1;
    ck_assert_msg(iv_psel_resolve(&p, m, IV_AXIS_OBS, &dropped, &folded, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(p.kind, IV_PSEL_INDEX);
    static const int64_t want[] = {1, 0};
    expect_idx(&p, want, 2);
    expect_list(&dropped, "[\"nope\",\"\\\"q\\\"\"]");
    expect_list(&folded, "[\"aaacf7c9af85-0\"]");
    iv_psel_free(&p);
    /* Exact matches only: an empty dropped list, nothing for folded. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "AAAC1A11EB05-3", NULL, 60, &e), 0);
    ck_assert_int_eq(iv_psel_resolve(&p, m, IV_AXIS_OBS, &dropped, &folded, &e), 0);
    static const int64_t want3[] = {3};
    expect_idx(&p, want3, 1);
    expect_list(&dropped, "[]");
    ck_assert_uint_eq(folded.len, 0);
    iv_psel_free(&p);
    /* Without missing_ignore an unknown name is an error, lists untouched. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "nope", NULL, 60, &e), 0);
    ck_assert_int_eq(iv_psel_resolve(&p, m, IV_AXIS_OBS, &dropped, &folded, &e), IV_EUNKNOWN_NAME);
    ck_assert_uint_eq(dropped.len + folded.len, 0);
    iv_psel_free(&p);
    /* A filter over positions reports no names. */
    ck_assert_int_eq(iv_psel_parse_list(&p, "obs", "0,1,2", "age > 1000", 60, &e), 0);
    ck_assert_msg(iv_psel_resolve(&p, m, IV_AXIS_OBS, &dropped, &folded, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(p.kind, IV_PSEL_INDEX);
    ck_assert_int_eq(p.n, 0);
    ck_assert_uint_eq(dropped.len + folded.len, 0);
    iv_psel_free(&p);
    iv_buf_free(&dropped);
    iv_buf_free(&folded);
    iv_meta_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sel_list");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_query_string_mixed_list);
    tcase_add_test(tc, test_query_string_list_errors);
    tcase_add_test(tc, test_command_line_forms);
    tcase_add_test(tc, test_command_line_errors_leave_nothing);
    tcase_add_test(tc, test_resolve_leaves_positions_and_needs_metadata);
    tcase_add_test(tc, test_resolve_reports_dropped_and_folded_names);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
