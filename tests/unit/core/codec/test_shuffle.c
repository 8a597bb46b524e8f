/*
 * Tests of core/codec/shuffle.c: the fast byte unshuffle equals the scalar
 * reference bit for bit for every element size and length; both invert
 * the forward shuffle; bit unshuffle matches hand-derived planes and
 * inverts the documented bitshuffle layout, leftovers included.
 */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>

#include "blosc2_enc.h"
#include "codec.h"

static uint32_t seed = 12345;

static uint8_t rb(void)
{
    seed = seed * 1103515245u + 12345u;
    return (uint8_t)(seed >> 16);
}

START_TEST(test_unshuffle_fast_equals_scalar)
{
    for (size_t ts = 1; ts <= 17; ts++) {
        for (size_t n = 0; n < 700; n += (n < 80 ? 1 : 37)) {
            uint8_t *src = malloc(n + 1), *a = malloc(n + 1), *b = malloc(n + 1);
            for (size_t i = 0; i < n; i++) src[i] = rb();
            memset(a, 0x5A, n + 1);
            memset(b, 0xA5, n + 1);
            iv_unshuffle(src, a, n, ts);
            iv_unshuffle_scalar(src, b, n, ts);
            ck_assert_msg(memcmp(a, b, n) == 0, "ts %zu n %zu", ts, n);
            /* Neither writes past n. */
            ck_assert_uint_eq(a[n], 0x5A);
            ck_assert_uint_eq(b[n], 0xA5);
            free(src);
            free(a);
            free(b);
        }
    }
    /* A large buffer through the vector loops. */
    size_t n = (1 << 20) + 13;
    uint8_t *src = malloc(n), *a = malloc(n), *b = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = rb();
    const size_t tss[] = {2, 4, 8};
    for (int k = 0; k < 3; k++) {
        iv_unshuffle(src, a, n, tss[k]);
        iv_unshuffle_scalar(src, b, n, tss[k]);
        ck_assert(memcmp(a, b, n) == 0);
    }
    free(src);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_unshuffle_inverts_shuffle)
{
    /* Known layout: 3 elements of 4 bytes. */
    const uint8_t planes[12] = {0x01, 0x11, 0x21, 0x02, 0x12, 0x22,
                                0x03, 0x13, 0x23, 0x04, 0x14, 0x24};
    const uint8_t elems[12] = {0x01, 0x02, 0x03, 0x04, 0x11, 0x12,
                               0x13, 0x14, 0x21, 0x22, 0x23, 0x24};
    uint8_t out[14];
    iv_unshuffle_scalar(planes, out, 12, 4);
    ck_assert(memcmp(out, elems, 12) == 0);
    iv_unshuffle(planes, out, 12, 4);
    ck_assert(memcmp(out, elems, 12) == 0);
    /* Trailing bytes are copied unchanged. */
    uint8_t p2[14], e2[14];
    memcpy(p2, planes, 12);
    p2[12] = 0xEE;
    p2[13] = 0xFF;
    iv_unshuffle(p2, e2, 14, 4);
    ck_assert(memcmp(e2, elems, 12) == 0);
    ck_assert_uint_eq(e2[12], 0xEE);
    ck_assert_uint_eq(e2[13], 0xFF);
    for (size_t ts = 1; ts <= 9; ts++) {
        size_t n = 1000 + ts;
        uint8_t *src = malloc(n), *sh = malloc(n), *back = malloc(n);
        for (size_t i = 0; i < n; i++) src[i] = rb();
        iv_b2e_shuffle(src, sh, n, ts);
        iv_unshuffle(sh, back, n, ts);
        ck_assert(memcmp(src, back, n) == 0);
        free(src);
        free(sh);
        free(back);
    }
}
END_TEST

/* Bit by bit inverse of the documented layout (independent of the
 * transpose trick the decoder uses). */
static void naive_bitunshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts)
{
    size_t ne = n / ts, ne8 = ne - ne % 8, nrow = ne8 / 8;
    memset(dst, 0, ne8 * ts);
    for (size_t j = 0; j < ts; j++)
        for (size_t k = 0; k < 8; k++)
            for (size_t e = 0; e < ne8; e++) {
                unsigned bit = (src[(j * 8 + k) * nrow + e / 8] >> (e % 8)) & 1u;
                dst[e * ts + j] |= (uint8_t)(bit << k);
            }
    memcpy(dst + ne8 * ts, src + ne8 * ts, n - ne8 * ts);
}

START_TEST(test_bitunshuffle_known_planes)
{
    /* Eight 1-byte elements 0..7: plane 0 (bit 0) holds elements 1,3,5,7
     * = 0xAA, plane 1 elements 2,3,6,7 = 0xCC, plane 2 4..7 = 0xF0. */
    const uint8_t planes[8] = {0xAA, 0xCC, 0xF0, 0, 0, 0, 0, 0};
    uint8_t out[8];
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_bitunshuffle(planes, out, 8, 1, &e), 0);
    for (int i = 0; i < 8; i++) ck_assert_uint_eq(out[i], i);
    /* 2-byte elements: element 0 = 0x8001 gives plane 0 (byte 0 bit 0)
     * and plane 15 (byte 1 bit 7) bit 0 set. */
    uint8_t p2[16] = {0};
    p2[0] = 0x01;
    p2[15] = 0x01;
    uint8_t o2[16];
    ck_assert_int_eq(iv_bitunshuffle(p2, o2, 16, 2, &e), 0);
    ck_assert_uint_eq(o2[0], 0x01);
    ck_assert_uint_eq(o2[1], 0x80);
    for (int i = 2; i < 16; i++) ck_assert_uint_eq(o2[i], 0);
    ck_assert_int_eq(iv_bitunshuffle(p2, o2, 16, 0, &e), IV_EINVALID_ARG);
}
END_TEST

START_TEST(test_bitunshuffle_equals_naive)
{
    for (size_t ts = 1; ts <= 16; ts++)
        for (size_t n = 0; n < 600; n += 7) {
            uint8_t *src = malloc(n + 1), *a = malloc(n + 1), *b = malloc(n + 1), *c = malloc(n + 1);
            for (size_t i = 0; i < n; i++) src[i] = rb();
            iv_err_t e;
            iv_err_clear(&e);
            ck_assert_int_eq(iv_bitunshuffle(src, a, n, ts, &e), 0);
            naive_bitunshuffle(src, b, n, ts);
            ck_assert_msg(memcmp(a, b, n) == 0, "ts %zu n %zu", ts, n);
            /* And the forward transform of the result gives src back. */
            iv_b2e_bitshuffle(a, c, n, ts);
            ck_assert_msg(memcmp(c, src, n) == 0, "ts %zu n %zu", ts, n);
            free(src);
            free(a);
            free(b);
            free(c);
        }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("shuffle");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_unshuffle_fast_equals_scalar);
    tcase_add_test(tc, test_unshuffle_inverts_shuffle);
    tcase_add_test(tc, test_bitunshuffle_known_planes);
    tcase_add_test(tc, test_bitunshuffle_equals_naive);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
