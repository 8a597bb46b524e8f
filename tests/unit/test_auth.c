/* Tests of server/auth.c: constant-time bearer-token sets. */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>

#include "auth.h"

static int check_tok(const iv_tokens_t *t, const char *tok)
{
    unsigned char *buf = malloc(t->len + 1);
    size_t clen = iv_tokens_candidate(buf, t->len, tok);
    int ok = iv_tokens_match(t, buf, clen);
    free(buf);
    return ok;
}

START_TEST(test_match_exact_only)
{
    char *toks[] = {"alpha", "be", "gamma-long-token"};
    iv_tokens_t t;
    size_t len = iv_tokens_max_len(toks, 3);
    ck_assert_uint_eq(len, 16);
    ck_assert_int_eq(iv_tokens_init(&t, toks, 3, len), 0);
    ck_assert(check_tok(&t, "alpha"));
    ck_assert(check_tok(&t, "be"));
    ck_assert(check_tok(&t, "gamma-long-token"));
    /* Prefixes, extensions, padding look-alikes and case differ. */
    ck_assert(!check_tok(&t, "alph"));
    ck_assert(!check_tok(&t, "alphaa"));
    ck_assert(!check_tok(&t, "b"));
    ck_assert(!check_tok(&t, ""));
    ck_assert(!check_tok(&t, "ALPHA"));
    ck_assert(!check_tok(&t, "gamma-long-token-and-more"));
    ck_assert(!check_tok(&t, "gamma-long-toke"));
    iv_tokens_free(&t);
}
END_TEST

START_TEST(test_longer_than_every_token)
{
    /* A candidate longer than the padded length keeps its real length and
     * fails even when its first len bytes are a token. */
    char *toks[] = {"abc"};
    iv_tokens_t t;
    ck_assert_int_eq(iv_tokens_init(&t, toks, 1, 3), 0);
    ck_assert(check_tok(&t, "abc"));
    ck_assert(!check_tok(&t, "abcd"));
    iv_tokens_free(&t);
}
END_TEST

START_TEST(test_empty_set)
{
    iv_tokens_t t;
    ck_assert_int_eq(iv_tokens_init(&t, NULL, 0, 0), 0);
    ck_assert(!check_tok(&t, ""));
    ck_assert(!check_tok(&t, "x"));
    iv_tokens_free(&t);
    /* A set padded longer than its tokens (another set is longer). */
    char *toks[] = {"k"};
    ck_assert_int_eq(iv_tokens_init(&t, toks, 1, 40), 0);
    ck_assert(check_tok(&t, "k"));
    ck_assert(!check_tok(&t, "k\x01"));
    iv_tokens_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_match_exact_only);
    tcase_add_test(tc, test_longer_than_every_token);
    tcase_add_test(tc, test_empty_set);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
