/*
 * Tests of api/meta_doc.c's renderers over given rows (the POST
 * forms, iv_rmeta_table_rows / iv_rmeta_column_rows): the same bytes as
 * the GET form for the rows a where selects, rows in the given order with
 * duplicates, every row for n < 0 and none for an empty list (whatever its
 * pointer), and positions outside the axis refused before any read (the
 * HTTP tests cannot reach that check: the resolver never gives them).
 */
#include <check.h>

#include "check_main.h"
#include "tiny_meta.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "meta_doc.h"

/* The tiny fixture's metadata, or NULL when the fixtures are absent. */
static iv_meta_t *tiny(void) { return iv_test_tiny_meta(); }

static char *table(const iv_meta_t *m, const int64_t *idx, int64_t n, const iv_rmeta_page_t *pg, int *rc)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_err_t e = {0};
    const char *ctype = NULL;
    *rc = iv_rmeta_table_rows(&b, m, IV_AXIS_OBS, idx, n, pg, NULL, &ctype, &e);
    iv_buf_append(&b, "", 1);
    char *s = *rc ? NULL : iv_buf_steal(&b, NULL);
    iv_buf_free(&b);
    return s;
}

START_TEST(test_rows_match_the_get_form)
{
    iv_meta_t *m = tiny();
    if (!m) {
        fprintf(stderr, "test_meta_doc: fixtures absent, skipped\n");
        return;
    }
    const char qs[] = "columns=age,sample&where=age%20%3E%2040&limit=100";
    iv_buf_t g;
    iv_buf_init(&g);
    iv_err_t e = {0};
    const char *ctype = NULL;
    ck_assert_int_eq(iv_rmeta_table(&g, m, IV_AXIS_OBS, qs, strlen(qs), NULL, &ctype, &e), 0);
    iv_buf_append(&g, "", 1);
    /* The rows the where keeps, by hand. */
    const iv_meta_col_t *age = iv_meta_find_col(m, IV_AXIS_OBS, "age");
    int64_t idx[60], n = 0;
    for (int64_t r = 0; r < iv_meta_n_rows(m, IV_AXIS_OBS); r++)
        if (age->i64[r] > 40) idx[n++] = r;
    ck_assert_int_gt(n, 1);
    const char *cols[] = {"age", "sample"};
    iv_rmeta_page_t pg = {.columns = cols, .n_columns = 2, .limit = 100};
    int rc;
    char *p = table(m, idx, n, &pg, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(p, g.data);
    free(p);
    iv_buf_free(&g);
    iv_meta_free(m);
}
END_TEST

START_TEST(test_order_duplicates_all_and_none)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    const char *cols[] = {"age"};
    iv_rmeta_page_t pg = {.columns = cols, .n_columns = 1, .limit = -1};
    const iv_meta_col_t *age = iv_meta_find_col(m, IV_AXIS_OBS, "age");
    int64_t idx[] = {7, 2, 7, 59, 0};
    int rc;
    char *p = table(m, idx, 5, &pg, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(p, "\"total\":5,"));
    const char *at = p;
    for (int i = 0; i < 5; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"age\":%lld}", (long long)age->i64[idx[i]]);
        at = strstr(at, want);
        ck_assert_msg(at != NULL, "row %d (%s) not after the previous one in %s", i, want, p);
        at += strlen(want);
    }
    free(p);
    p = table(m, NULL, -1, &pg, &rc);
    ck_assert_ptr_nonnull(strstr(p, "\"total\":60,"));
    free(p);
    p = table(m, NULL, 0, &pg, &rc);
    ck_assert_ptr_nonnull(strstr(p, "\"total\":0,"));
    ck_assert_ptr_nonnull(strstr(p, "\"rows\":[]}"));
    free(p);
    iv_meta_free(m);
}
END_TEST

START_TEST(test_out_of_range_refused)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    iv_rmeta_page_t pg = {.limit = -1};
    int64_t bad[][2] = {{0, 60}, {-1, 0}, {5, INT64_MAX}};
    for (int i = 0; i < 3; i++) {
        int rc;
        ck_assert_ptr_null(table(m, bad[i], 2, &pg, &rc));
        ck_assert_int_eq(rc, IV_EOUT_OF_RANGE);
        iv_buf_t b;
        iv_buf_init(&b);
        iv_err_t e = {0};
        ck_assert_int_eq(iv_rmeta_column_rows(&b, m, IV_AXIS_OBS, "age", bad[i], 2, &pg, 1 << 20, &e),
                         IV_EOUT_OF_RANGE);
        iv_buf_free(&b);
    }
    iv_meta_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("meta_doc");
    TCase *tc = tcase_create("rows");
    tcase_add_test(tc, test_rows_match_the_get_form);
    tcase_add_test(tc, test_order_duplicates_all_and_none);
    tcase_add_test(tc, test_out_of_range_refused);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
