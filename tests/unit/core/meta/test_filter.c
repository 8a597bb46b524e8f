/*
 * Tests of core/meta/filter.c, proto/where.c, core/base/bitmap.c and
 * proto/filter_json.c.
 *
 * Second mode, used by tests/python/test_meta_filter.py for the
 * differential test against pandas:
 *   test_filter --eval FILE.h5ad obs|var FILTERS.txt
 * reads one filter a line ("W <where string>" or "J <json>") and prints
 * one line each: "OK <count> <hex bitmap, 64 rows a word, word order>" or
 * "ERR <http status> <message>".
 */
#include <check.h>

#include "check_main.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "filter.h"
#include "filter_json.h"
#include "fixtures.h"
#include "meta.h"
#include "where.h"

static iv_meta_t *tiny(void) { return iv_test_meta("tiny.ivcsr.raw.h5ad"); }

/* Parses and evaluates a where string; returns the rc, fills *b. */
static int run_where(iv_meta_t *m, const char *w, iv_bitmap_t *b, iv_err_t *e)
{
    iv_expr_t *x = NULL;
    int rc = iv_where_parse(w, strlen(w), &x, e);
    if (rc < 0) return rc;
    iv_fprog_t *p = NULL;
    rc = iv_filter_compile(m, IV_AXIS_OBS, x, &p, e);
    iv_expr_free(x);
    if (rc < 0) return rc;
    iv_bitmap_init(b, iv_filter_n_rows(p));
    rc = iv_filter_eval(p, b, e);
    iv_filter_free(p);
    return rc;
}

START_TEST(test_bitmap_ops)
{
    iv_bitmap_t a, b;
    ck_assert_int_eq(iv_bitmap_init(&a, 130), 0);
    ck_assert_int_eq(iv_bitmap_init(&b, 130), 0);
    iv_bitmap_set(&a, 0);
    iv_bitmap_set(&a, 64);
    iv_bitmap_set(&a, 129);
    iv_bitmap_set(&b, 64);
    iv_bitmap_set(&b, 100);
    ck_assert_int_eq(iv_bitmap_count(&a), 3);
    iv_bitmap_not(&a);
    ck_assert_int_eq(iv_bitmap_count(&a), 127); /* tail bits stay clear */
    ck_assert_int_eq(iv_bitmap_get(&a, 64), 0);
    iv_bitmap_not(&a);
    iv_bitmap_or(&b, &a);
    ck_assert_int_eq(iv_bitmap_count(&b), 4);
    iv_bitmap_and(&a, &b);
    ck_assert_int_eq(iv_bitmap_count(&a), 3);
    int64_t *idx, n;
    ck_assert_int_eq(iv_bitmap_to_index(&b, &idx, &n), 0);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(idx[1], 64);
    ck_assert_int_eq(idx[2], 100);
    ck_assert_int_eq(idx[3], 129);
    free(idx);
    /* An index list keeps its order and duplicates; out-of-range drops. */
    int64_t want[] = {129, 5, 0, 129, -1, 500, 64}, got[7];
    ck_assert_int_eq(iv_bitmap_filter_index(&b, want, 7, got), 4);
    ck_assert_int_eq(got[0], 129);
    ck_assert_int_eq(got[1], 0);
    ck_assert_int_eq(got[2], 129);
    ck_assert_int_eq(got[3], 64);
    iv_bitmap_fill(&b, 1);
    ck_assert_int_eq(iv_bitmap_count(&b), 130);
    iv_bitmap_free(&a);
    iv_bitmap_free(&b);
}
END_TEST

/* Filter results equal a direct loop over the columns. */
START_TEST(test_filter_matches_loops)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    const iv_meta_col_t *ct = iv_meta_find_col(m, IV_AXIS_OBS, "cell_type");
    const iv_meta_col_t *age = iv_meta_find_col(m, IV_AXIS_OBS, "age");
    const iv_meta_col_t *dbl = iv_meta_find_col(m, IV_AXIS_OBS, "is_doublet");
    const iv_meta_col_t *batch = iv_meta_find_col(m, IV_AXIS_OBS, "batch");
    const iv_meta_col_t *nc = iv_meta_find_col(m, IV_AXIS_OBS, "n_counts_reported");
    int64_t kB = -1, kNK = -1;
    for (int64_t k = 0; k < ct->n_cats; k++) {
        if (strcmp(iv_meta_col_cat(ct, k), "B cell") == 0) kB = k;
        if (strcmp(iv_meta_col_cat(ct, k), "NK cell") == 0) kNK = k;
    }
    ck_assert(kB >= 0 && kNK >= 0);
    iv_bitmap_t b;
    iv_err_t e = {0};
    ck_assert_msg(run_where(m, "cell_type in ['B cell', 'NK cell'] and age >= 40 and not "
                               "is_doublet", &b, &e) == 0, "%s", e.msg);
    int64_t cnt = 0;
    for (int64_t i = 0; i < 60; i++) {
        int want = (ct->codes[i] == kB || ct->codes[i] == kNK) && age->i64[i] >= 40 && !dbl->b[i];
        cnt += want;
        ck_assert_int_eq(iv_bitmap_get(&b, i), want);
    }
    ck_assert_int_gt(cnt, 0);
    iv_bitmap_free(&b);
    /* Missing values never match a comparison, not even != ... */
    ck_assert_int_eq(run_where(m, "batch != 1", &b, &e), 0);
    for (int64_t i = 0; i < 60; i++) {
        int miss = batch->mask && batch->mask[i];
        ck_assert_int_eq(iv_bitmap_get(&b, i), !miss && batch->i64[i] != 1);
    }
    iv_bitmap_free(&b);
    /* ... but `not` is the complement, and is null tests the mask. */
    ck_assert_int_eq(run_where(m, "not (batch == 1) and batch is null", &b, &e), 0);
    ck_assert_int_eq(iv_bitmap_count(&b), batch->null_count);
    iv_bitmap_free(&b);
    /* Reversed operands and float comparisons. */
    ck_assert_int_eq(run_where(m, "1800.5 < n_counts_reported", &b, &e), 0);
    for (int64_t i = 0; i < 60; i++) ck_assert_int_eq(iv_bitmap_get(&b, i), nc->f64[i] > 1800.5);
    iv_bitmap_free(&b);
    /* The same as JSON. */
    cJSON *j = cJSON_Parse("{\"and\":[{\"column\":\"cell_type\",\"in\":[\"B cell\",\"NK cell\"]},"
                           "{\"column\":\"age\",\"ge\":40},{\"column\":\"is_doublet\",\"eq\":false}]}");
    iv_expr_t *x = NULL;
    ck_assert_int_eq(iv_filter_json_parse(j, &x, &e), 0);
    cJSON_Delete(j);
    iv_fprog_t *p = NULL;
    ck_assert_int_eq(iv_filter_compile(m, IV_AXIS_OBS, x, &p, &e), 0);
    iv_expr_free(x);
    int64_t *idx, n;
    ck_assert_int_eq(iv_filter_select(p, &idx, &n, &e), 0);
    ck_assert_int_eq(n, cnt);
    for (int64_t k = 1; k < n; k++) ck_assert_int_lt(idx[k - 1], idx[k]);
    free(idx);
    iv_filter_free(p);
    iv_meta_free(m);
}
END_TEST

static void expect_err(iv_meta_t *m, const char *w, int code, const char *a, const char *b2)
{
    iv_bitmap_t b = {0};
    iv_err_t e = {0};
    int rc = run_where(m, w, &b, &e);
    ck_assert_msg(rc == code, "'%s': rc %d, want %d (%s)", w, rc, code, e.msg);
    ck_assert_msg(strstr(e.msg, a), "'%s': message '%s' lacks '%s'", w, e.msg, a);
    if (b2) ck_assert_msg(strstr(e.msg, b2), "'%s': message '%s' lacks '%s'", w, e.msg, b2);
    iv_bitmap_free(&b);
}

START_TEST(test_filter_errors)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    expect_err(m, "cel_type == 'B cell'", IV_EBAD_FILTER, "unknown obs column 'cel_type'",
               "did you mean 'cell_type'");
    expect_err(m, "cell_type == 'B cells'", IV_EBAD_FILTER, "unknown category 'B cells'",
               "did you mean 'B cell'");
    expect_err(m, "cell_type in ['B cell', 'nk cell']", IV_EBAD_FILTER, "'nk cell'",
               "'NK cell'");
    /* A name equal but for case is offered alone; with nothing near, a
     * short list of categories is given whole. */
    expect_err(m, "cell_type == 'b CELL'", IV_EBAD_FILTER, "unknown category 'b CELL'",
               "did you mean 'B cell'?");
    expect_err(m, "cell_type == 'macrophage'", IV_EBAD_FILTER, "its categories are ",
               "'NK cell'");
    expect_err(m, "age == 'old'", IV_EBAD_FILTER, "'age' holds int values", "string");
    expect_err(m, "note > 3", IV_EBAD_FILTER, "'note' holds string", "number");
    expect_err(m, "cell_type < 'B cell'", IV_EBAD_FILTER, "unordered categorical", "'<'");
    expect_err(m, "age and is_doublet", IV_EBAD_FILTER, "'age' holds int values, not booleans",
               NULL);
    expect_err(m, "age >= ", IV_EBAD_REQUEST, "position 7", "a value after '>='");
    expect_err(m, "age >= 3 and (is_doublet", IV_EBAD_REQUEST, "position 24", "')'");
    expect_err(m, "cell_type in 'B cell'", IV_EBAD_REQUEST, "position 13", "'['");
    expect_err(m, "age >= 3 oor is_doublet", IV_EBAD_REQUEST, "position 9", "'or'");
    expect_err(m, "name == 'unterminated", IV_EBAD_REQUEST, "unterminated string", "position 8");
    expect_err(m, "", IV_EBAD_REQUEST, "position 0", NULL);
    expect_err(m, "age # 3", IV_EBAD_REQUEST, "unexpected character '#'", NULL);
    /* Deep nesting is refused, not a stack overflow. */
    char deep[4000];
    size_t k = 0;
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    memcpy(deep + k, "is_doublet", 10);
    k += 10;
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    deep[k] = '\0';
    expect_err(m, deep, IV_EBAD_REQUEST, "nested deeper", NULL);
    iv_meta_free(m);
}
END_TEST

/* A where string of `levels` nested groups: "((...(age >= 0)...))" (kind
 * 0), "age >= 0 and (age >= 0 and (...))" (kind 1), "not not ... age < 0"
 * (kind 2).  Owned by the caller. */
static char *nested(int levels, int kind)
{
    static const char *const open[] = {"(", "age >= 0 and (", "not "};
    static const char *const leaf[] = {"age >= 0", "age >= 0", "age < 0"};
    size_t ol = strlen(open[kind]);
    char *s = malloc((size_t)levels * (ol + 1) + 16);
    size_t k = 0;
    for (int i = 0; i < levels; i++, k += ol) memcpy(s + k, open[kind], ol);
    k += (size_t)sprintf(s + k, "%s", leaf[kind]);
    for (int i = 0; kind < 2 && i < levels; i++) s[k++] = ')';
    s[k] = '\0';
    return s;
}

/* Each level of nesting counts once against IV_FILTER_MAX_DEPTH (issue
 * 30: a parenthesis counted twice, so 128 were "deeper than 256"). */
START_TEST(test_where_nesting_levels)
{
    iv_meta_t *m = tiny();
    if (!m) return;
    for (int kind = 0; kind < 3; kind++) {
        int ok[] = {128, 200, IV_FILTER_MAX_DEPTH};
        for (int i = 0; i < 3; i++) {
            char *w = nested(ok[i], kind);
            iv_bitmap_t b = {0};
            iv_err_t e = {0};
            int rc = run_where(m, w, &b, &e);
            ck_assert_msg(rc == 0, "kind %d, %d levels: %s", kind, ok[i], e.msg);
            /* age >= 0 holds for every row with an age; an even number of
             * nots leaves age < 0, which none has. */
            ck_assert_int_gt(b.n, 0);
            if (kind == 2) ck_assert_int_eq(iv_bitmap_count(&b), 0);
            iv_bitmap_free(&b);
            free(w);
        }
        char *w = nested(IV_FILTER_MAX_DEPTH + 1, kind);
        expect_err(m, w, IV_EBAD_REQUEST, "nested deeper than 256", NULL);
        free(w);
    }
    iv_meta_free(m);
}
END_TEST

START_TEST(test_where_parse_and_format)
{
    const char *cases[][2] = {
        {"a == 1", "(a == 1)"},
        {"a = 1.5 && b != 'x'", "((a == 1.5) and (b != 'x'))"},
        {"NOT a OR b and c", "(not a or (b and c))"},
        {"x in [1, 2.5, 'q', true,]", "(x in [1, 2.5, 'q', true])"},
        {"x not in ('a')", "(x not in ['a'])"},
        {"not (x in [1])", "not (x in [1])"},
        {"`my col` is not null", "not (`my col` is null)"},
        {"3 <= y", "(y >= 3)"},
        {"y < -inf or y > +inf or y == nan", "((y < -inf) or (y > inf) or (y == nan))"},
        {"z == \"it's\"", "(z == 'it\\'s')"},
        {"RNA_snn_res.0.8 >= 1e3", "(RNA_snn_res.0.8 >= 1e+03)"},
        {"true", "true"},
        {"!(b)", "not b"},
        {"`and` == 1", "(`and` == 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        iv_err_t e = {0};
        iv_expr_t *x = NULL;
        ck_assert_msg(iv_where_parse(cases[i][0], strlen(cases[i][0]), &x, &e) == 0, "%s: %s",
                      cases[i][0], e.msg);
        char buf[256];
        iv_expr_format(x, buf, sizeof buf);
        ck_assert_str_eq(buf, cases[i][1]);
        /* The formatted string parses back to the same tree. */
        iv_expr_t *y = NULL;
        ck_assert_int_eq(iv_where_parse(buf, strlen(buf), &y, &e), 0);
        char buf2[256];
        iv_expr_format(y, buf2, sizeof buf2);
        ck_assert_str_eq(buf, buf2);
        iv_expr_free(x);
        iv_expr_free(y);
    }
    /* Not NUL-terminated input: only len bytes are read. */
    iv_expr_t *x = NULL;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_where_parse("a == 1 garbage", 6, &x, &e), 0);
    iv_expr_free(x);
}
END_TEST

START_TEST(test_json_errors)
{
    const char *cases[][2] = {
        {"[1]", "filter: expected a filter object"},
        {"{\"and\": 3}", "filter.and: expected an array"},
        {"{\"and\": [{\"column\": \"a\", \"eq\": 1}, {\"column\": 5}]}", "filter.and[1].column"},
        {"{\"column\": \"a\", \"gte\": 1}", "filter.gte: unknown operator"},
        {"{\"column\": \"a\", \"in\": [1, null]}", "filter.in[1]: expected a string"},
        {"{\"column\": \"a\"}", "needs an operator"},
        {"{\"and\": [], \"or\": []}", "exactly one of"},
        {"{\"not\": {\"column\": \"a\", \"is_null\": 1}}", "filter.not.is_null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = cJSON_Parse(cases[i][0]);
        ck_assert_ptr_nonnull(j);
        iv_expr_t *x = NULL;
        iv_err_t e = {0};
        ck_assert_int_eq(iv_filter_json_parse(j, &x, &e), IV_EBAD_REQUEST);
        ck_assert_msg(strstr(e.msg, cases[i][1]), "%s: '%s'", cases[i][0], e.msg);
        ck_assert_ptr_null(x);
        cJSON_Delete(j);
    }
    cJSON *j = cJSON_Parse("{\"column\": \"t\", \"ge\": 500, \"lt\": 10000}");
    iv_expr_t *x = NULL;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_filter_json_parse(j, &x, &e), 0);
    char buf[128];
    iv_expr_format(x, buf, sizeof buf);
    ck_assert_str_eq(buf, "((t >= 500) and (t < 10000))");
    iv_expr_free(x);
    cJSON_Delete(j);
}
END_TEST

/* `in` with many labels over a large categorical takes the hash path. */
START_TEST(test_in_many_labels)
{
    iv_meta_t *m = NULL;
    iv_err_t e = {0};
    const char *path = iv_test_fixture("wide.ivcsr.zstd.h5ad");
    if (!path) return;
    ck_assert_int_eq(iv_meta_load(path, NULL, &m, &e), 0);
    const iv_meta_col_t *note = iv_meta_find_col(m, IV_AXIS_OBS, "note");
    ck_assert_int_gt(note->n_cats, 16);
    iv_expr_t *x = iv_expr_new(IV_EXPR_IN, "note");
    for (int64_t k = 0; k < note->n_cats; k += 2) {
        iv_lit_t l = {.kind = IV_LIT_STR, .str = (char *)iv_meta_col_cat(note, k)};
        ck_assert_int_eq(iv_expr_add_lit(x, &l), 0);
    }
    iv_fprog_t *p;
    ck_assert_int_eq(iv_filter_compile(m, IV_AXIS_OBS, x, &p, &e), 0);
    iv_expr_free(x);
    iv_bitmap_t b;
    iv_bitmap_init(&b, iv_filter_n_rows(p));
    ck_assert_int_eq(iv_filter_eval(p, &b, &e), 0);
    for (int64_t i = 0; i < note->n; i++)
        ck_assert_int_eq(iv_bitmap_get(&b, i), note->codes[i] >= 0 && note->codes[i] % 2 == 0);
    iv_bitmap_free(&b);
    iv_filter_free(p);
    iv_meta_free(m);
}
END_TEST

/* Limits: terms and in-list values stop the parsers with IV_ETOO_LARGE
 * (413) before more is built; arrays grow geometrically; the cost of an
 * evaluation is estimated from rows and leaves. */
START_TEST(test_limits_and_growth)
{
    iv_err_t e = {0};
    iv_expr_t *x = NULL;
    /* An `in` list of exactly the limit parses, with capacity for it
     * grown by doubling (not one element per realloc). */
    size_t cap = 16 + 2 * (size_t)IV_FILTER_MAX_IN + 16;
    char *w = malloc(cap);
    size_t k = (size_t)snprintf(w, cap, "age in [");
    for (int i = 0; i < IV_FILTER_MAX_IN; i++) w[k++] = '0', w[k++] = ',';
    w[k++] = ']';
    ck_assert_msg(iv_where_parse(w, k, &x, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(x->op, IV_EXPR_IN);
    ck_assert_uint_eq(x->n_lits, IV_FILTER_MAX_IN);
    ck_assert_uint_ge(x->cap_lits, x->n_lits);
    ck_assert_uint_lt(x->cap_lits, 2 * x->n_lits + 8);
    iv_expr_free(x);
    x = NULL;
    /* One more value is refused. */
    k--;
    w[k++] = '0';
    w[k++] = ']';
    iv_err_clear(&e);
    ck_assert_int_eq(iv_where_parse(w, k, &x, &e), IV_ETOO_LARGE);
    ck_assert_ptr_null(x);
    ck_assert_ptr_nonnull(strstr(e.msg, "more than 1000000 values"));
    ck_assert_int_eq(iv_error_status(IV_ETOO_LARGE), 413);
    free(w);

    /* More terms than the limit, as a where chain and as JSON. */
    size_t n = IV_FILTER_MAX_NODES + 1;
    cap = n * 32 + 64;
    w = malloc(cap);
    k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)snprintf(w + k, cap - k, "%sa == 1", i ? " or " : "");
    iv_err_clear(&e);
    ck_assert_int_eq(iv_where_parse(w, k, &x, &e), IV_ETOO_LARGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "more than 100000 terms"));
    /* Half as many parse, into one n-ary node with geometric capacity. */
    k = 0;
    for (size_t i = 0; i < n / 2; i++) k += (size_t)snprintf(w + k, cap - k, "%sa == 1", i ? " or " : "");
    iv_err_clear(&e);
    ck_assert_msg(iv_where_parse(w, k, &x, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(x->op, IV_EXPR_OR);
    ck_assert_uint_eq(x->n_kids, n / 2);
    ck_assert_uint_lt(x->cap_kids, 2 * x->n_kids + 8);
    ck_assert_uint_eq(iv_expr_count(x), n / 2 + 1);
    iv_expr_free(x);
    x = NULL;
    k = (size_t)snprintf(w, cap, "{\"or\":[");
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(w + k, cap - k, "%s{\"column\":\"a\",\"eq\":1}", i ? "," : "");
    snprintf(w + k, cap - k, "]}");
    cJSON *j = cJSON_Parse(w);
    ck_assert_ptr_nonnull(j);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_filter_json_parse(j, &x, &e), IV_ETOO_LARGE);
    ck_assert_ptr_null(x);
    ck_assert_ptr_nonnull(strstr(e.msg, "more than 100000 terms"));
    cJSON_Delete(j);
    free(w);

    /* Cost: each leaf visits every row (plus a word per 64 rows for the
     * inner node), so two leaves over a million rows cost about two
     * million visits. */
    ck_assert_int_eq(iv_where_parse("a == 1 or b in [1, 2]", 21, &x, &e), 0);
    int64_t c = iv_filter_cost(NULL, IV_AXIS_OBS, x, 1000000);
    ck_assert_int_ge(c, 2000000);
    ck_assert_int_le(c, 2100000);
    ck_assert_int_eq(iv_filter_cost(NULL, IV_AXIS_OBS, x, INT64_MAX), INT64_MAX);
    iv_expr_free(x);
}
END_TEST

/* A JSON leaf repeating a key is an error naming it, not one of two
 * meanings; not_in is its own leaf, not (in). */
START_TEST(test_json_duplicates_and_not_in)
{
    const char *dups[] = {
        "{\"column\":\"a\",\"eq\":1,\"eq\":2}",
        "{\"column\":\"a\",\"column\":\"b\",\"eq\":1}",
        "{\"column\":\"a\",\"in\":[1],\"in\":[2]}",
    };
    for (size_t i = 0; i < 3; i++) {
        cJSON *j = cJSON_Parse(dups[i]);
        iv_expr_t *x = NULL;
        iv_err_t e = {0};
        ck_assert_msg(iv_filter_json_parse(j, &x, &e) == IV_EBAD_REQUEST, "%s", dups[i]);
        ck_assert_msg(strstr(e.msg, "more than once"), "%s: %s", dups[i], e.msg);
        ck_assert_ptr_null(x);
        cJSON_Delete(j);
    }
    cJSON *j = cJSON_Parse("{\"column\":\"Parent\",\"not_in\":[\"x\"],\"ne\":\"y\"}");
    iv_expr_t *x = NULL;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_filter_json_parse(j, &x, &e), 0);
    char buf[128];
    iv_expr_format(x, buf, sizeof buf);
    ck_assert_str_eq(buf, "((Parent not in ['x']) and (Parent != 'y'))");
    ck_assert_int_eq(x->kids[0]->op, IV_EXPR_NOT_IN);
    iv_expr_free(x);
    cJSON_Delete(j);
}
END_TEST

/* ------------------------------------------------------------ --eval mode */

static int eval_mode(const char *path, const char *axis, const char *filters)
{
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    if (iv_meta_load(path, NULL, &m, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    iv_axis_t ax = strcmp(axis, "var") == 0 ? IV_AXIS_VAR : IV_AXIS_OBS;
    FILE *f = fopen(filters, "r");
    if (!f) return 2;
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    while (fgets(line, (int)cap, f)) {
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len < 2) continue;
        iv_err_clear(&e);
        iv_expr_t *x = NULL;
        int rc;
        if (line[0] == 'J') {
            cJSON *j = cJSON_Parse(line + 2);
            rc = j ? iv_filter_json_parse(j, &x, &e) : iv_fail(&e, IV_EBAD_JSON, "bad json");
            cJSON_Delete(j);
        } else {
            rc = iv_where_parse(line + 2, len - 2, &x, &e);
        }
        iv_fprog_t *p = NULL;
        if (rc == 0) rc = iv_filter_compile(m, ax, x, &p, &e);
        iv_expr_free(x);
        iv_bitmap_t b = {0};
        if (rc == 0) {
            iv_bitmap_init(&b, iv_filter_n_rows(p));
            rc = iv_filter_eval(p, &b, &e);
        }
        if (rc < 0) {
            printf("ERR %d %s\n", iv_error_status(rc), e.msg);
        } else {
            printf("OK %lld ", (long long)iv_bitmap_count(&b));
            for (size_t w = 0; w < iv_bitmap_words(&b); w++)
                printf("%016llx", (unsigned long long)b.w[w]);
            printf("\n");
        }
        iv_bitmap_free(&b);
        iv_filter_free(p);
    }
    free(line);
    fclose(f);
    iv_meta_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--eval") == 0) return eval_mode(argv[2], argv[3], argv[4]);
    Suite *s = suite_create("filter");
    TCase *tc = tcase_create("filter");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bitmap_ops);
    tcase_add_test(tc, test_filter_matches_loops);
    tcase_add_test(tc, test_filter_errors);
    tcase_add_test(tc, test_where_parse_and_format);
    tcase_add_test(tc, test_where_nesting_levels);
    tcase_add_test(tc, test_json_errors);
    tcase_add_test(tc, test_in_many_labels);
    tcase_add_test(tc, test_limits_and_growth);
    tcase_add_test(tc, test_json_duplicates_and_not_in);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
