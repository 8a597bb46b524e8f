/* Tests of proto/request.c's "matrix" field: the matrix's axis lengths
 * bound the selections whatever the key order, the resolver's error is the
 * parse's error, and the fixed-shape parsers refuse any matrix but X. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

/* X is 60 x 50; "raw/X" 60 x 80; anything else is unknown. */
typedef struct calls {
    int n;
    char last[64];
} calls_t;

static int shape_of(void *ctx, const char *name, int64_t *n_obs, int64_t *n_var, iv_err_t *err)
{
    calls_t *c = ctx;
    c->n++;
    snprintf(c->last, sizeof c->last, "%s", name ? name : "(null)");
    if (!name || !strcmp(name, "X")) {
        *n_obs = 60;
        *n_var = 50;
        return 0;
    }
    if (!strcmp(name, "raw/X")) {
        *n_obs = 60;
        *n_var = 80;
        return 0;
    }
    return iv_fail(err, IV_EUNKNOWN_MATRIX, "no matrix '%s'; available: X, raw/X", name);
}

static int pj(const char *s, calls_t *c, iv_qreq_t *q, iv_err_t *e)
{
    iv_err_clear(e);
    return iv_qreq_parse_json_m(s, strlen(s), shape_of, c, q, e);
}

static int pq(const char *s, calls_t *c, iv_qreq_t *q, iv_err_t *e)
{
    iv_err_clear(e);
    return iv_qreq_parse_query_m(s, strlen(s), shape_of, c, q, e);
}

START_TEST(test_matrix_bounds_selections_in_any_key_order)
{
    iv_qreq_t q;
    iv_err_t e;
    calls_t c = {0};
    /* Gene 70 exists in raw/X only, and "var" comes before "matrix". */
    ck_assert_int_eq(pj("{\"var\":{\"index\":[70,1]},\"matrix\":\"raw/X\"}", &c, &q, &e), 0);
    ck_assert_str_eq(q.matrix, "raw/X");
    ck_assert_int_eq(q.var.n, 2);
    ck_assert_int_eq(q.var.idx[0], 70);
    ck_assert_int_eq(c.n, 1);
    iv_qreq_free(&q);
    ck_assert_ptr_null(q.matrix);
    ck_assert_int_eq(pj("{\"var\":{\"index\":[70]}}", &c, &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_str_eq(c.last, "(null)");
    ck_assert_int_eq(pj("{\"var\":{\"range\":[0,80]},\"matrix\":\"X\"}", &c, &q, &e),
                     IV_EOUT_OF_RANGE);
    /* The query string: matrix= after the selection still bounds it. */
    ck_assert_int_eq(pq("var=79,0&matrix=raw%2FX", &c, &q, &e), 0);
    ck_assert_str_eq(q.matrix, "raw/X");
    ck_assert_int_eq(q.var.idx[0], 79);
    iv_qreq_free(&q);
    ck_assert_int_eq(pq("var=79", &c, &q, &e), IV_EOUT_OF_RANGE);
    /* An empty body reads X, and asks the resolver for it. */
    c.n = 0;
    ck_assert_int_eq(pj("", &c, &q, &e), 0);
    ck_assert_int_eq(c.n, 1);
    ck_assert_ptr_null(q.matrix);
    iv_qreq_free(&q);
}
END_TEST

START_TEST(test_matrix_errors)
{
    iv_qreq_t q;
    iv_err_t e;
    calls_t c = {0};
    ck_assert_int_eq(pj("{\"matrix\":\"layers/nope\"}", &c, &q, &e), IV_EUNKNOWN_MATRIX);
    ck_assert_ptr_nonnull(strstr(e.msg, "layers/nope"));
    ck_assert_int_eq(pq("matrix=layers/nope&obs=1", &c, &q, &e), IV_EUNKNOWN_MATRIX);
    ck_assert_int_eq(pj("{\"matrix\":5}", &c, &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(pj("{\"matrix\":\"\"}", &c, &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(pj("{\"matrix\":\"X\",\"matrix\":\"X\"}", &c, &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(pq("matrix=X&matrix=raw/X", &c, &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(pq("matrix=", &c, &q, &e), IV_EBAD_REQUEST);
    char big[400];
    memset(big, 'a', sizeof big);
    memcpy(big, "{\"matrix\":\"", 11);
    memcpy(big + sizeof big - 3, "\"}", 3);
    ck_assert_int_eq(pj(big, &c, &q, &e), IV_EBAD_REQUEST);
    /* A bad selection after a good matrix leaves nothing to free (ASan). */
    ck_assert_int_eq(pj("{\"matrix\":\"raw/X\",\"obs\":{\"index\":[-1]}}", &c, &q, &e),
                     IV_EOUT_OF_RANGE);
}
END_TEST

START_TEST(test_fixed_shape_routes_read_x_only)
{
    iv_qreq_t q;
    iv_err_t e;
    iv_err_clear(&e);
    const char *b = "{\"matrix\":\"layers/counts\"}";
    ck_assert_int_eq(iv_qreq_parse_json(b, strlen(b), 60, 50, &q, &e), IV_EBAD_REQUEST);
    ck_assert_ptr_nonnull(strstr(e.msg, "serves X only"));
    iv_err_clear(&e);
    const char *s = "matrix=raw/X";
    ck_assert_int_eq(iv_qreq_parse_query(s, strlen(s), 60, 50, &q, &e), IV_EBAD_REQUEST);
    b = "{\"matrix\":\"X\",\"var\":{\"index\":[49]}}";
    ck_assert_int_eq(iv_qreq_parse_json(b, strlen(b), 60, 50, &q, &e), 0);
    ck_assert_str_eq(q.matrix, "X");
    iv_qreq_free(&q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto_request_matrix");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_matrix_bounds_selections_in_any_key_order);
    tcase_add_test(tc, test_matrix_errors);
    tcase_add_test(tc, test_fixed_shape_routes_read_x_only);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
