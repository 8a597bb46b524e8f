/* Tests of proto/index_arrays.c: the index arrays read ahead of cJSON,
 * and request parsing with and without them giving the same result. */
#include <check.h>

#include "check_main.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index_arrays.h"
#include "request.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* What iv_index_arrays_take makes of s: the copy (freed) compared with s
 * outside the arrays, and the arrays' lengths in n[] (-1: not taken). */
static int take(const char *s, int64_t n[2], int64_t first[2])
{
    iv_index_array_t pre[2];
    size_t len = strlen(s);
    char *copy = iv_index_arrays_take(s, len, pre);
    for (int a = 0; a < 2; a++) {
        n[a] = pre[a].taken ? pre[a].n : -1;
        first[a] = pre[a].taken && pre[a].n > 0 ? pre[a].v[0] : -1;
    }
    if (copy) {
        /* Only the insides of brackets differ, and only to spaces. */
        for (size_t i = 0; i < len; i++)
            if (copy[i] != s[i]) ck_assert_int_eq(copy[i], ' ');
    }
    iv_index_arrays_free(pre);
    free(copy);
    return copy != NULL;
}

START_TEST(takes_plain_arrays)
{
    int64_t n[2], f[2];
    ck_assert(take("{\"obs\": {\"index\": [3, 1,1 ,0]}, \"var\":{\"where\":\"x > [1]\", \"index\":[ -2 ]}}", n, f));
    ck_assert_int_eq(n[0], 4);
    ck_assert_int_eq(f[0], 3);
    ck_assert_int_eq(n[1], 1);
    ck_assert_int_eq(f[1], -2);
    ck_assert(take("{\"format\":\"json\",\"var\":{\"index\":[]},\"by\":\"var\"}", n, f));
    ck_assert_int_eq(n[0], -1);
    ck_assert_int_eq(n[1], 0);
    /* A string's escaped quote does not end it: no key inside it is taken. */
    ck_assert(take("{\"obs\":{\"where\":\"x\\\", \\\"index\\\": [5], \\\"y\",\"index\":[1]}}", n, f));
    ck_assert_int_eq(n[0], 1);
    ck_assert_int_eq(f[0], 1);
    ck_assert(take(" {\"obs\":{\"index\":[999999999999999,-0]}} ", n, f));
    ck_assert_int_eq(n[0], 2);
    ck_assert_int_eq(f[0], 999999999999999);
}
END_TEST

/* Arrays that go to cJSON as they are: numbers it reads otherwise, other
 * elements, keys with escapes, bodies not understood. */
START_TEST(leaves_what_it_cannot_read)
{
    static const char *const whole[] = {
        "{\"obs\":{\"index\":[1.0]}}",
        "{\"obs\":{\"index\":[1e2]}}",
        "{\"obs\":{\"index\":[1E2]}}",
        "{\"obs\":{\"index\":[01]}}",
        "{\"obs\":{\"index\":[1000000000000000]}}",   /* 16 digits */
        "{\"obs\":{\"index\":[\"1\"]}}",
        "{\"obs\":{\"index\":[[1]]}}",
        "{\"obs\":{\"index\":[1,]}}",
        "{\"obs\":{\"index\":[1 2]}}",
        "{\"obs\":{\"index\":[-]}}",
        "{\"obs\":{\"index\":[+1]}}",
        "{\"obs\":{\"index\":[true]}}",
        "{\"obs\":{\"index\":[1]",
        "{\"obs\":{\"ind\\u0065x\":[1]}}",
        "{\"o\\u0062s\":{\"index\":[1]}}",
        "{\"obs\":{\"range\":[1,2]}}",
        "{\"obs\":[{\"index\":[1]}]}",
        "{\"x\":{\"obs\":{\"index\":[1]}}}",
        "[{\"obs\":{\"index\":[1]}}]",
        "{\"obs\":{\"index\":[1]} \"var\":{}}",
        "",
        "{",
    };
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++) {
        int64_t n[2], f[2];
        if (take(whole[i], n, f)) ck_abort_msg("took an array of %s", whole[i]);
    }
    /* The first "index" of an axis only; a later one is cJSON's (which
     * refuses the two). */
    int64_t n[2], f[2];
    ck_assert(take("{\"obs\":{\"index\":[4],\"index\":[5,6]}}", n, f));
    ck_assert_int_eq(n[0], 1);
    ck_assert_int_eq(f[0], 4);
    ck_assert(!take("{\"obs\":{\"index\":7,\"index\":[5,6]}}", n, f));
    /* Turned off, nothing is taken. */
    iv_index_arrays_enable(0);
    ck_assert(!take("{\"obs\":{\"index\":[1]}}", n, f));
    iv_index_arrays_enable(1);
}
END_TEST

/* ---- random bodies, parsed with and without the arrays read ahead ---- */

struct body {
    char *s;
    size_t n, cap;
};

static void put(struct body *b, const char *t)
{
    size_t k = strlen(t);
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        ck_assert_ptr_nonnull(b->s);
    }
    memcpy(b->s + b->n, t, k + 1);
    b->n += k;
}

/* White space, now and then bytes that cJSON skips as such but JSON
 * does not (vertical tab, form feed, other control bytes). */
static void ws(struct body *b)
{
    static const char *const w[] = {"", "", "", " ", "\n", "\t ", "\r\n  ", "", "", " ",
                                    "\v", "\f ", "\x01"};
    put(b, w[rnd() % (rnd() % 40 == 0 ? 13 : 10)]);
}

static void element(struct body *b)
{
    char t[64];
    switch (rnd() % 24) {
    case 0: put(b, "1.5"); break;
    case 1: put(b, "2e1"); break;
    case 2: put(b, "\"3\""); break;
    case 3: put(b, "007"); break;
    case 4: put(b, "-0"); break;
    case 5: put(b, "1234567890123456"); break;
    case 6: put(b, "-999999999999999"); break;
    case 7: put(b, "null"); break;
    case 8: put(b, "[1]"); break;
    case 9: put(b, "4.0"); break;
    default:
        snprintf(t, sizeof t, "%s%u", rnd() % 20 == 0 ? "-" : "", (unsigned)(rnd() % 70));
        put(b, t);
    }
}

static void int_array(struct body *b, int plain)
{
    put(b, "[");
    int n = (int)(rnd() % 12);
    for (int i = 0; i < n; i++) {
        ws(b);
        if (plain) {
            char t[32];
            snprintf(t, sizeof t, "%u", (unsigned)(rnd() % 70));
            put(b, t);
        } else {
            element(b);
        }
        ws(b);
        if (i + 1 < n) put(b, ",");
    }
    if (n > 0 && rnd() % 40 == 0) put(b, ",");   /* a trailing comma */
    put(b, "]");
}

static void key(struct body *b, const char *k)
{
    put(b, "\"");
    if (rnd() % 30 == 0 && k[0]) {   /* the same key, its first letter escaped */
        char t[16];
        snprintf(t, sizeof t, "\\u%04x", (unsigned)k[0]);
        put(b, t);
        put(b, k + 1);
    } else {
        put(b, k);
    }
    put(b, "\"");
    ws(b);
    put(b, ":");
    ws(b);
}

static void axis_object(struct body *b)
{
    static const char *const keys[] = {"index", "index", "index", "range", "names", "where", "by",
                                       "mask", "bogus"};
    put(b, "{");
    int n = (int)(rnd() % 3);
    for (int i = 0; i < n; i++) {
        ws(b);
        const char *k = keys[rnd() % 9];
        key(b, k);
        if (!strcmp(k, "index")) int_array(b, rnd() % 3 != 0);
        else if (!strcmp(k, "range")) put(b, "[1, 5]");
        else if (!strcmp(k, "names")) put(b, rnd() % 2 ? "[\"a\", \"[b]\"]" : "[\"a\\\\\", \"\\\"]\"]");
        else if (!strcmp(k, "where")) put(b, "\"n > 1\"");
        else if (!strcmp(k, "by")) put(b, "\"sample\"");
        else if (!strcmp(k, "mask")) put(b, "[true, false]");
        else put(b, "{\"index\": [1]}");
        ws(b);
        if (i + 1 < n) put(b, ",");
    }
    put(b, "}");
}

static void request(struct body *b)
{
    static const char *const keys[] = {"obs", "var", "obs", "var", "format", "by", "dense", "x"};
    put(b, "{");
    int n = (int)(rnd() % 4);
    for (int i = 0; i < n; i++) {
        ws(b);
        const char *k = keys[rnd() % 8];
        key(b, k);
        if (!strcmp(k, "obs") || !strcmp(k, "var")) {
            if (rnd() % 10 == 0) int_array(b, 1);   /* an array, not an object */
            else axis_object(b);
        } else if (!strcmp(k, "format")) {
            put(b, "\"json\"");
        } else if (!strcmp(k, "by")) {
            put(b, "\"var\"");
        } else if (!strcmp(k, "dense")) {
            put(b, "false");
        } else {
            put(b, "[\"obs\", {\"index\": [1]}]");
        }
        ws(b);
        if (i + 1 < n) put(b, ",");
    }
    put(b, "}");
}

static void same_sel(const iv_psel_t *a, const iv_psel_t *b, const char *body)
{
    if (a->kind != b->kind || a->n != b->n) ck_abort_msg("%s: selections differ", body);
    if (a->idx || b->idx) {
        int64_t n = a->kind == IV_PSEL_INDEX ? a->n : 0;
        for (int64_t i = 0; i < n; i++)
            if (a->idx[i] != b->idx[i]) ck_abort_msg("%s: index %lld differs", body, (long long)i);
    }
}

START_TEST(same_as_cjson_alone)
{
    int taken = 0, parsed = 0;
    for (int it = 0; it < 20000; it++) {
        struct body b = {NULL, 0, 0};
        if (rnd() % 50 == 0) put(&b, "\xef\xbb\xbf");   /* a byte-order mark */
        ws(&b);
        request(&b);
        ws(&b);
        if (rnd() % 30 == 0) put(&b, rnd() % 2 ? "x" : "{\"obs\": {\"index\": [1]}}");   /* after the root */
        size_t len = b.n;
        if (rnd() % 10 == 0 && len > 1) len = (size_t)(rnd() % len);   /* cut short */
        if (rnd() % 20 == 0 && len > 1) b.s[rnd() % len] = "{}[],:\" 9"[rnd() % 9];
        iv_index_array_t pre[2];
        char *copy = iv_index_arrays_take(b.s, len, pre);
        taken += copy != NULL;
        iv_index_arrays_free(pre);
        free(copy);

        iv_qreq_t q1, q2;
        iv_err_t e1, e2;
        iv_err_clear(&e1);
        iv_err_clear(&e2);
        int r1 = iv_qreq_parse_json(b.s, len, 60, 50, &q1, &e1);
        iv_index_arrays_enable(0);
        int r2 = iv_qreq_parse_json(b.s, len, 60, 50, &q2, &e2);
        iv_index_arrays_enable(1);
        if (r1 != r2 || e1.code != e2.code || strcmp(e1.msg, e2.msg))
            ck_abort_msg("%.*s: %d '%s' read ahead, %d '%s' by cJSON", (int)len, b.s, r1, e1.msg, r2,
                         e2.msg);
        if (r1 == 0) {
            parsed++;
            same_sel(&q1.obs, &q2.obs, b.s);
            same_sel(&q1.var, &q2.var, b.s);
            ck_assert_int_eq(q1.format, q2.format);
            ck_assert_int_eq(q1.by_var, q2.by_var);
            ck_assert_int_eq(q1.dense, q2.dense);
            iv_qreq_free(&q1);
            iv_qreq_free(&q2);
        }
        free(b.s);
    }
    /* The generator reaches both paths often. */
    printf("test_index_arrays: %d of 20000 bodies had an array read ahead, %d parsed\n", taken, parsed);
    ck_assert_int_gt(taken, 1000);
    ck_assert_int_gt(parsed, 1000);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("index_arrays");
    TCase *tc = tcase_create("index_arrays");
    tcase_add_test(tc, takes_plain_arrays);
    tcase_add_test(tc, leaves_what_it_cannot_read);
    tcase_add_test(tc, same_as_cjson_alone);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
