/* Varint kernels: fast paths against the scalar references, bit for bit. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

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
    uint8_t buf[1000];
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

typedef uint64_t (*sum3_fn)(const uint8_t *, const uint8_t *, uint64_t, size_t *, uint64_t *);

/*
 * A group-sum kernel, finished by one-by-one decoding wherever it stops,
 * must give the plain decode's sum of d + 1 over the first k varints and
 * end on the same byte.  Streams mix 1- to 10-byte varints in random
 * proportions; buffers are exact-size heap blocks so that a read past the
 * end is caught by the sanitizers.
 */
static void check_sum3(sum3_fn fn, const char *name)
{
    for (int iter = 0; iter < 3000; iter++) {
        size_t nv = (size_t)(rnd() % 300);
        unsigned long_pct = (unsigned)(rnd() % 4 == 0 ? rnd() % 60 : rnd() % 3);
        unsigned two_pct = (unsigned)(rnd() % 101);
        uint8_t *tmp = malloc(nv * IV_VARINT_MAX + 1);
        ck_assert_ptr_nonnull(tmp);
        size_t len = 0;
        for (size_t i = 0; i < nv; i++) {
            uint64_t v;
            unsigned r = (unsigned)(rnd() % 100);
            if (r < long_pct) v = rnd() >> (rnd() % 64);           /* any length */
            else if (r < long_pct + two_pct) v = rnd() % (1u << 14);
            else v = rnd() % 128;
            len += iv_varint_write(v, tmp + len);
        }
        uint8_t *buf = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(buf);
        memcpy(buf, tmp, len);
        free(tmp);
        const uint8_t *end = buf + len;
        uint64_t k = nv ? rnd() % (nv + 1) : 0;

        uint64_t want = 0;
        const uint8_t *p = buf;
        for (uint64_t i = 0; i < k; i++) {
            uint64_t d;
            size_t u = iv_varint_read(p, end, &d);
            ck_assert_uint_gt(u, 0);
            want += d + 1;
            p += u;
        }

        uint64_t sum = 0, done = 0;
        const uint8_t *q = buf;
        while (done < k) {
            size_t used = 0;
            uint64_t got = fn(q, end, k - done, &used, &sum);
            if (got > k - done)
                ck_abort_msg("%s: consumed %llu of %llu varints", name, (unsigned long long)got,
                             (unsigned long long)(k - done));
            q += used;
            done += got;
            if (done == k) break;
            uint64_t d;
            size_t u = iv_varint_read(q, end, &d);
            ck_assert_uint_gt(u, 0);
            sum += d + 1;
            q += u;
            done++;
        }
        if (sum != want || q != p)
            ck_abort_msg("%s, iter %d: sum %llu want %llu, end at %td want %td", name, iter,
                         (unsigned long long)sum, (unsigned long long)want, q - buf, p - buf);
        free(buf);
    }
}

START_TEST(sum3_matches_decode)
{
    check_sum3(iv_varint_sum3, "dispatched");
    check_sum3(iv_varint_sum3_portable, "portable");
    if (iv_varint_have_ssse3()) check_sum3(iv_varint_sum3_ssse3, "ssse3");
    else printf("test_varint: no SSSE3 on this CPU, its kernel not tested here\n");
    if (iv_varint_have_avx2()) check_sum3(iv_varint_sum3_avx2, "avx2");
    else printf("test_varint: no AVX2 on this CPU, its kernel not tested here\n");
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
    tcase_add_test(tc, sum3_matches_decode);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
