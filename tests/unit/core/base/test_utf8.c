/* Well-formed UTF-8 (core/base/utf8.h): the offset of the first byte that
 * does not start a well-formed sequence, on each kind of ill-formed input
 * and on well-formed text of every sequence length. */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "utf8.h"

static size_t bad_at(const char *s) { return iv_utf8_bad_at(s, strlen(s)); }

START_TEST(well_formed)
{
    ck_assert_uint_eq(bad_at(""), 0);
    ck_assert_uint_eq(bad_at("CD3E"), 4);
    /* 2, 3 and 4 bytes: é, the edges of the 3-byte range around the
     * surrogates, U+10FFFF. */
    const char *ok = "\xC3\xA9\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
    ck_assert_uint_eq(bad_at(ok), strlen(ok));
}
END_TEST

START_TEST(ill_formed)
{
    ck_assert_uint_eq(bad_at("ab\x80"), 2);             /* lone continuation */
    ck_assert_uint_eq(bad_at("a\xC0\x80"), 1);          /* overlong NUL */
    ck_assert_uint_eq(bad_at("a\xC1\xBF"), 1);          /* overlong */
    ck_assert_uint_eq(bad_at("a\xE0\x9F\xBF"), 1);      /* overlong 3-byte */
    ck_assert_uint_eq(bad_at("a\xED\xA0\x80"), 1);      /* surrogate U+D800 */
    ck_assert_uint_eq(bad_at("a\xF0\x8F\xBF\xBF"), 1);  /* overlong 4-byte */
    ck_assert_uint_eq(bad_at("a\xF4\x90\x80\x80"), 1);  /* past U+10FFFF */
    ck_assert_uint_eq(bad_at("a\xF5\x80\x80\x80"), 1);
    ck_assert_uint_eq(bad_at("ab\xC3"), 2);             /* cut short */
    ck_assert_uint_eq(bad_at("ab\xE2\x82"), 2);
    ck_assert_uint_eq(bad_at("\xE2\x82x"), 0);          /* continuation missing */
    /* n bounds the look: a sequence cut by n is ill-formed there. */
    ck_assert_uint_eq(iv_utf8_bad_at("x\xC3\xA9", 2), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("utf8");
    TCase *tc = tcase_create("bad_at");
    tcase_add_test(tc, well_formed);
    tcase_add_test(tc, ill_formed);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
