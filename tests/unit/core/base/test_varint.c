/* Varint kernels: fast paths against the scalar references, bit for bit. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"
#include "pick_step.h"
#include "walk_drive.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A random buffer whose bytes are continuation bytes with probability p/256. */
static void fill(uint8_t *b, size_t n, unsigned p)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t v = (uint8_t)(rnd() & 0x7f);
        b[i] = (rnd() & 0xff) < p ? (uint8_t)(v | 0x80) : v;
    }
}

START_TEST(count_matches_scalar)
{
    /* Past 8 KiB too: the AVX2 count sums its byte counters in batches. */
    static uint8_t buf[20000];
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = rnd() % sizeof buf;
        size_t off = rnd() % 8;
        fill(buf, sizeof buf, (unsigned)(rnd() % 257));
        if (off + n > sizeof buf) n = sizeof buf - off;
        ck_assert_uint_eq(iv_varint_count_ends(buf + off, n), iv_varint_count_ends_scalar(buf + off, n));
    }
}
END_TEST

START_TEST(skip_matches_scalar)
{
    uint8_t buf[700];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = rnd() % sizeof buf;
        fill(buf, n, (unsigned)(rnd() % 257));
        uint64_t k = rnd() % (n + 3);
        uint64_t s1, s2;
        size_t a = iv_varint_skip(buf, n, k, &s1);
        size_t b = iv_varint_skip_scalar(buf, n, k, &s2);
        ck_assert_uint_eq(a, b);
        ck_assert_uint_eq(s1, s2);
    }
}
END_TEST

START_TEST(roundtrip_all_lengths)
{
    uint8_t buf[IV_VARINT_MAX + 4];
    for (int bits = 0; bits <= 64; bits++) {
        for (int t = 0; t < 50; t++) {
            uint64_t v = bits == 0 ? 0 : (bits == 64 ? rnd() : rnd() & ((1ULL << bits) - 1));
            size_t n = iv_varint_write(v, buf);
            uint64_t got = ~v;
            ck_assert_uint_eq(iv_varint_read(buf, buf + n, &got), n);
            ck_assert_uint_eq(got, v);
            /* Truncated: never a read past the end. */
            if (n > 1) ck_assert_uint_eq(iv_varint_read(buf, buf + n - 1, &got), 0);
        }
    }
}
END_TEST

START_TEST(rejects_overlong)
{
    uint8_t buf[11];
    memset(buf, 0xff, sizeof buf);
    uint64_t v;
    ck_assert_uint_eq(iv_varint_read(buf, buf + sizeof buf, &v), 0);
    /* 10th byte may carry only one bit. */
    memset(buf, 0x80, 9);
    buf[9] = 0x02;
    ck_assert_uint_eq(iv_varint_read(buf, buf + 10, &v), 0);
    buf[9] = 0x01;
    ck_assert_uint_eq(iv_varint_read(buf, buf + 10, &v), 10);
    ck_assert_uint_eq(v, 1ULL << 63);
}
END_TEST

/* Random streams and marks, walked as the row index walks them
 * (iv_walk_drive). */
static void check_walk(iv_walk_fn fn, const char *name)
{
    enum { MAX_MARKS = 64 };
    for (int iter = 0; iter < 4000; iter++) {
        size_t nv = (size_t)(rnd() % 400);
        unsigned long_pct = (unsigned)(rnd() % 4 == 0 ? rnd() % 60 : rnd() % 3);
        unsigned three_pct = (unsigned)(rnd() % 3 == 0 ? rnd() % 40 : 0);
        unsigned two_pct = (unsigned)(rnd() % 101);
        uint8_t *tmp = malloc(nv * IV_VARINT_MAX + 1);
        uint64_t *ref_sum = malloc((nv + 1) * sizeof *ref_sum);
        size_t *ref_pos = malloc((nv + 1) * sizeof *ref_pos);
        ck_assert(tmp && ref_sum && ref_pos);
        uint64_t base_n = rnd() % 2 ? rnd() >> 24 : 0, base_sum = rnd() % 2 ? rnd() >> 20 : 0;
        size_t len = 0;
        ref_sum[0] = base_sum;
        ref_pos[0] = 0;
        for (size_t i = 0; i < nv; i++) {
            uint64_t v;
            unsigned r = (unsigned)(rnd() % 100);
            if (r < long_pct) v = rnd() >> (rnd() % 64);           /* any length */
            else if (r < long_pct + three_pct) v = rnd() % (1u << 21);
            else if (r < long_pct + three_pct + two_pct) v = rnd() % (1u << 14);
            else v = rnd() % 128;
            len += iv_varint_write(v, tmp + len);
            ref_sum[i + 1] = ref_sum[i] + v + 1;
            ref_pos[i + 1] = len;
        }
        /* An exact-size copy, so that a read past the end is caught. */
        uint8_t *buf = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(buf);
        memcpy(buf, tmp, len);
        free(tmp);

        /* Non-decreasing marks in [0, nv], repeats allowed, some dense. */
        uint64_t marks[MAX_MARKS], sum_at[MAX_MARKS];
        const uint8_t *p_at[MAX_MARKS];
        size_t nm = nv ? (size_t)(rnd() % MAX_MARKS) : 0;
        for (size_t i = 0; i < nm; i++) marks[i] = rnd() % (nv + 1);
        for (size_t i = 1; i < nm; i++)
            for (size_t j = i; j > 0 && marks[j - 1] > marks[j]; j--) {
                uint64_t t = marks[j];
                marks[j] = marks[j - 1];
                marks[j - 1] = t;
            }
        for (size_t i = 0; i < nm; i++) marks[i] += base_n;

        const char *bad = iv_walk_drive(fn, buf, buf + len, base_n, ref_sum, ref_pos, nv, marks,
                                        nm, sum_at, p_at);
        if (bad) ck_abort_msg("%s, iter %d: %s", name, iter, bad);
        free(buf);
        free(ref_sum);
        free(ref_pos);
    }
}

START_TEST(walk_matches_decode)
{
    check_walk(iv_varint_walk3, "dispatched");
    check_walk(iv_varint_walk3_portable, "portable");
    if (iv_varint_have_avx2()) {
        check_walk(iv_varint_walk3_avx2, "avx2");
        check_walk(iv_varint_walk3_avx2_pdep, "avx2 with pdep");
    } else {
        printf("test_varint: no AVX2/BMI2 on this CPU, its kernels not tested here\n");
    }
}
END_TEST

/*
 * The pick kernel against a one-varint-at-a-time decode.  Random groups
 * of varints (short ones mostly, with runs of three bytes and more), an
 * exact-size buffer (a read past end is caught by the sanitizers), a
 * limit that some groups pass, and a bitmap or none.  The kernel is
 * driven as decode_slice drives it: call it, and where it stops decode
 * one varint the plain way and call again.  Every index it writes must
 * be the reference's, in order, and the walk must end where the
 * reference's does.  On short-varint input with room to spare it must
 * not stop at once.
 */
START_TEST(pick_matches_decode)
{
    if (!iv_varint_have_avx512()) {
        printf("test_varint: no AVX-512 on this CPU, the pick kernel not tested here\n");
        return;
    }
    for (int iter = 0; iter < 3000; iter++) {
        size_t nv = (size_t)(rnd() % 700);
        unsigned three_pct = (unsigned)(rnd() % 3 == 0 ? rnd() % 30 : 0);
        unsigned two_pct = (unsigned)(rnd() % 101);
        /* One group in five starts its sum just under the largest limit
         * (2^31 - 1), with no bitmap (it would be 256 MiB): the lanes'
         * 32-bit arithmetic at its edge. */
        int high = rnd() % 5 == 0;
        uint64_t limit = high ? ((uint64_t)1 << 31) - 1 - rnd() % 1000
                       : rnd() % 4 == 0 ? 1 + rnd() % 5000 : (uint64_t)1 << 21;
        uint64_t sum0 = high ? limit - 1 - rnd() % (nv * 300 + 1) : 0;
        size_t n_words = high ? 1 : (size_t)((limit + 63) / 64);   /* no more than the kernel may read */
        uint8_t *tmp = malloc(nv * IV_VARINT_MAX + 1);
        uint32_t *ref = malloc((nv + 1) * sizeof *ref);
        uint32_t *out = malloc((nv + 17) * sizeof *out);
        uint32_t *got_idx = malloc((nv + 1) * sizeof *got_idx);
        uint64_t *bits = calloc(n_words, sizeof *bits);
        ck_assert(tmp && ref && out && got_idx && bits);
        int use_bits = high ? 0 : (int)(rnd() % 3);
        /* Each bit set with probability 1/2^ands (an "and" of random words). */
        unsigned ands = (unsigned)(rnd() % 5);
        for (size_t wd = 0; wd < n_words; wd++) {
            uint64_t x = ~(uint64_t)0;
            for (unsigned a = 0; a < ands; a++) x &= rnd();
            bits[wd] = x;
        }
        size_t len = 0;
        for (size_t i = 0; i < nv; i++) {
            uint64_t v;
            unsigned r = (unsigned)(rnd() % 100);
            if (r < three_pct) v = rnd() >> (rnd() % 64) | ((uint64_t)1 << 14);
            else if (r < three_pct + two_pct) v = rnd() % (1u << 14);
            else v = rnd() % 128;
            len += iv_varint_write(v, tmp + len);
        }
        uint8_t *buf = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(buf);
        memcpy(buf, tmp, len);
        free(tmp);

        /* The reference: the group's kept indices, up to the first bad one. */
        const uint8_t *p = buf, *end = buf + len;
        uint64_t sum = sum0;
        size_t n_ref = 0, n_ok = 0;
        for (; n_ok < nv; n_ok++) {
            uint32_t j;
            int r = iv_pick_plain_step(&p, end, limit, &sum, use_bits ? bits : NULL, &j);
            if (r < 0) break;
            if (r) ref[n_ref++] = j;
        }
        const uint8_t *ref_end = p;
        uint64_t ref_sum = sum;

        /* The kernel, with the plain decode where it stops. */
        p = buf;
        sum = sum0;
        size_t n_got = 0, done = 0, calls_with_room = 0, stopped_at_once = 0;
        while (done < nv) {
            size_t want = 1 + (size_t)(rnd() % (nv - done + 40));
            if (want > nv - done) want = nv - done;
            size_t kept;
            const uint8_t *before = p;
            size_t k = iv_varint_pick_avx512(&p, end, want, limit, &sum, use_bits ? bits : NULL, out,
                                             &kept);
            if (k > want || kept > k) ck_abort_msg("iter %d: %zu of %zu decoded, %zu kept", iter, k, want, kept);
            if (k == 0 && p != before) ck_abort_msg("iter %d: moved without decoding", iter);
            for (size_t i = 0; i < kept; i++) {
                if (out[i] >= limit) ck_abort_msg("iter %d: index %u >= limit", iter, out[i]);
                got_idx[n_got++] = out[i];
            }
            done += k;
            if (three_pct == 0 && end - before >= 32 && want >= 16 && done + 16 <= n_ok &&
                sum + 16 * 16384 < limit) {
                calls_with_room++;
                if (k == 0) stopped_at_once++;
            }
            if (k == 0) {
                /* The plain way, which finds a bad index. */
                uint32_t j;
                int r = iv_pick_plain_step(&p, end, limit, &sum, use_bits ? bits : NULL, &j);
                if (r < 0) break;
                if (r) got_idx[n_got++] = j;
                done++;
            }
        }
        if (done != n_ok) ck_abort_msg("iter %d: %zu varints walked, reference %zu", iter, done, n_ok);
        if (n_got != n_ref) ck_abort_msg("iter %d: %zu indices kept, reference %zu", iter, n_got, n_ref);
        for (size_t i = 0; i < n_ref; i++)
            if (got_idx[i] != ref[i]) ck_abort_msg("iter %d: index %zu is %u, reference %u", iter, i, got_idx[i], ref[i]);
        if (p != ref_end) ck_abort_msg("iter %d: ended at byte %td, reference %td", iter, p - buf, ref_end - buf);
        if (sum != ref_sum) ck_abort_msg("iter %d: sum %llu, reference %llu", iter, (unsigned long long)sum,
                                         (unsigned long long)ref_sum);
        if (stopped_at_once) ck_abort_msg("iter %d: stopped at once %zu of %zu times with room", iter, stopped_at_once, calls_with_room);
        free(buf);
        free(ref);
        free(out);
        free(got_idx);
        free(bits);
    }
}
END_TEST

/* The limit at its edge: indices 0..15 in a block are in for a limit of
 * 16 and the block is refused for 15. */
START_TEST(pick_stops_at_the_limit)
{
    if (!iv_varint_have_avx512()) {
        printf("test_varint: no AVX-512 on this CPU, the pick kernel not tested here\n");
        return;
    }
    uint8_t buf[32] = {0};   /* 32 varints of d = 0: indices 0, 1, 2, ... */
    uint32_t out[48];
    for (uint64_t limit = 14; limit <= 17; limit++) {
        const uint8_t *p = buf;
        uint64_t sum = 0;
        size_t kept;
        size_t k = iv_varint_pick_avx512(&p, buf + 32, 32, limit, &sum, NULL, out, &kept);
        size_t want = limit >= 16 ? 16 : 0;
        if (limit == 17) want = 16;   /* the second block would reach 32 */
        ck_assert_uint_eq(k, want);
        ck_assert_uint_eq(kept, want);
        ck_assert_uint_eq(sum, want);
        ck_assert_ptr_eq(p, buf + want);
        for (size_t i = 0; i < kept; i++) ck_assert_uint_eq(out[i], i);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("varint");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, count_matches_scalar);
    tcase_add_test(tc, skip_matches_scalar);
    tcase_add_test(tc, roundtrip_all_lengths);
    tcase_add_test(tc, rejects_overlong);
    tcase_add_test(tc, walk_matches_decode);
    tcase_add_test(tc, pick_matches_decode);
    tcase_add_test(tc, pick_stops_at_the_limit);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
