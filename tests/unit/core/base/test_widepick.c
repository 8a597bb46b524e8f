/* The wide copy's kernel (widepick.h): the portable loop and the AVX-512
 * one against a reference written here, on random runs of indices and
 * random selections, at every length up to IV_WIDE_PICK_MAX, unaligned,
 * with an index at or past the limit refused. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"
#include "widepick.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The kept of idx[0..n), by the definition: bit set, in order. */
static size_t reference(const uint16_t *idx, size_t n, const uint64_t *bits, uint32_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (bits[idx[i] / 64] & ((uint64_t)1 << (idx[i] % 64))) out[k++] = idx[i];
    return k;
}

/* Runs both kernels on the n indices (copied to an odd address, into a
 * buffer of exactly their bytes) and checks them against want (-1: the
 * run holds an index >= limit). */
static void check_both(const uint16_t *idx, size_t n, uint32_t limit, const uint64_t *bits, int64_t want,
                       const uint32_t *ref)
{
    uint8_t *raw = malloc(2 * n + 1);
    uint32_t *out = malloc((n + 16) * sizeof *out);
    ck_assert(raw && out);
    memcpy(raw + 1, idx, 2 * n);
    for (int k = 0; k < 2; k++) {
        if (k == 1 && !iv_varint_have_avx512()) break;
        memset(out, 0xee, (n + 16) * sizeof *out);
        int64_t got = k ? iv_wide_pick_avx512(raw + 1, n, limit, bits, out)
                        : iv_wide_pick(raw + 1, n, limit, bits, out);
        ck_assert_msg(got == want, "kernel %d: %lld kept, want %lld (n %zu, limit %u)", k, (long long)got,
                      (long long)want, n, limit);
        for (int64_t i = 0; i < want; i++) ck_assert_uint_eq(out[i], ref[i]);
    }
    free(raw);
    free(out);
}

START_TEST(kernels_keep_what_the_bitmap_selects)
{
    if (!iv_varint_have_avx512()) printf("test_widepick: no AVX-512 on this CPU, the portable loop alone\n");
    for (int iter = 0; iter < 4000; iter++) {
        size_t n = iter < IV_WIDE_PICK_MAX + 1 ? (size_t)iter : (size_t)(rnd() % (IV_WIDE_PICK_MAX + 1));
        uint32_t limit = rnd() % 4 == 0 ? 65536 : 1 + (uint32_t)(rnd() % 65536);
        size_t n_words = (limit + 63) / 64;   /* no more than a kernel may read */
        uint64_t *bits = malloc(n_words * sizeof *bits);
        uint16_t *idx = malloc((n ? n : 1) * sizeof *idx);
        uint32_t *ref = malloc((n + 1) * sizeof *ref);
        ck_assert(bits && idx && ref);
        /* Each bit set with probability 1/2^ands, none to all. */
        unsigned ands = (unsigned)(rnd() % 6);
        for (size_t w = 0; w < n_words; w++) {
            uint64_t v = ands == 5 ? 0 : ~(uint64_t)0;
            for (unsigned a = 0; a < ands && ands < 5; a++) v &= rnd();
            bits[w] = v;
        }
        for (size_t i = 0; i < n; i++) idx[i] = (uint16_t)(rnd() % limit);
        size_t k = reference(idx, n, bits, ref);
        check_both(idx, n, limit, bits, (int64_t)k, ref);
        /* One index at or past the limit, anywhere: refused. */
        if (n > 0 && limit < 65536) {
            idx[rnd() % n] = (uint16_t)(limit + rnd() % (65536 - limit));
            check_both(idx, n, limit, bits, -1, ref);
        }
        free(bits);
        free(idx);
        free(ref);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("widepick");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, kernels_keep_what_the_bitmap_selects);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
