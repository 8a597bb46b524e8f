/* Tests of core/base/sha256.c against FIPS 180-4's examples (the one-block
 * "abc", the two-block 448-bit message, one million 'a') and messages
 * whose lengths sit on the padding's edges (55, 56, 63, 64 bytes...). */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

static void hex_of(const void *m, size_t n, char out[65])
{
    unsigned char d[IV_SHA256_BYTES];
    iv_sha256(m, n, d);
    iv_sha256_hex(d, out);
}

START_TEST(test_fips_examples)
{
    char h[65];
    hex_of("abc", 3, h);
    ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m2, strlen(m2), h);
    ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m3 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                     "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    hex_of(m3, strlen(m3), h);
    ck_assert_str_eq(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    hex_of("", 0, h);
    ck_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
END_TEST

START_TEST(test_million_a_in_odd_pieces)
{
    /* Fed in pieces of 1 to 97 bytes, so that updates straddle blocks. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    iv_sha256_t s;
    iv_sha256_init(&s);
    size_t off = 0, step = 1;
    while (off < 1000000) {
        size_t n = step < 1000000 - off ? step : 1000000 - off;
        iv_sha256_update(&s, a + off, n);
        off += n;
        step = step % 97 + 1;
    }
    unsigned char d[IV_SHA256_BYTES];
    char h[65];
    iv_sha256_final(&s, d);
    iv_sha256_hex(d, h);
    ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}
END_TEST

START_TEST(test_padding_edges)
{
    /* Messages 0, 1, 2, ... n-1 (bytes): 55 is the longest with padding
     * in one block, 56 the shortest that needs a second. */
    static const struct { size_t n; const char *hex; } v[] = {
        {55, "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"},
        {56, "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"},
        {63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"},
        {64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"},
        {65, "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781"},
        {119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"},
        {120, "f52b23db1fbb6ded89ef42a23ce0c8922c45f25c50b568a93bf1c075420bbb7c"},
    };
    unsigned char m[128];
    for (size_t i = 0; i < sizeof m; i++) m[i] = (unsigned char)i;
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        char h[65];
        hex_of(m, v[k].n, h);
        ck_assert_msg(!strcmp(h, v[k].hex), "length %zu: %s", v[k].n, h);
    }
}
END_TEST

START_TEST(test_hex_round_trip)
{
    unsigned char d[IV_SHA256_BYTES], e[IV_SHA256_BYTES];
    char h[65];
    iv_sha256("abc", 3, d);
    iv_sha256_hex(d, h);
    ck_assert_int_eq(iv_sha256_from_hex(h, 64, e), 0);
    ck_assert(!memcmp(d, e, sizeof d));
    ck_assert_int_eq(iv_sha256_from_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", 64, e), 0);
    ck_assert(!memcmp(d, e, sizeof d));
    ck_assert_int_eq(iv_sha256_from_hex(h, 63, e), -1);
    h[10] = 'g';
    ck_assert_int_eq(iv_sha256_from_hex(h, 64, e), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sha256");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_fips_examples);
    tcase_add_test(tc, test_million_a_in_odd_pieces);
    tcase_add_test(tc, test_padding_edges);
    tcase_add_test(tc, test_hex_round_trip);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
