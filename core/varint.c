/*
 * Varint kernels (see varint.h).
 *
 * The counting and skipping kernels look at the high bit of 16 bytes at a
 * time with SSE2's movemask (x86-64 baseline) or, elsewhere, at 8 bytes of
 * a little-endian word; the scalar versions are the reference.
 */
#include "varint.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#define IV_HAVE_SSE2 1
#endif
/* The SSSE3 and AVX2 kernels are compiled for x86-64 with GCC or clang
 * whatever the build's -march, and chosen at run time. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define IV_X86_KERNELS 1
#else
#define IV_X86_KERNELS 0
#endif

size_t iv_varint_count_ends_scalar(const uint8_t *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] < 0x80;
    return c;
}

size_t iv_varint_count_ends(const uint8_t *p, size_t n)
{
    size_t c = 0, i = 0;
    for (; i + 64 <= n; i += 64) c += 64 - (size_t)__builtin_popcountll(iv_varint_cont64(p + i));
    return c + iv_varint_count_ends_scalar(p + i, n - i);
}

size_t iv_varint_skip_scalar(const uint8_t *p, size_t n, uint64_t k, uint64_t *skipped)
{
    uint64_t found = 0;
    size_t i = 0;
    while (found < k && i < n) {
        if (p[i] < 0x80) found++;
        i++;
    }
    *skipped = found;
    return i;
}

size_t iv_varint_skip(const uint8_t *p, size_t n, uint64_t k, uint64_t *skipped)
{
    uint64_t found = 0;
    size_t i = 0;
    if (k == 0) {
        *skipped = 0;
        return 0;
    }
    for (; i + 64 <= n; i += 64) {
        uint64_t ends = ~iv_varint_cont64(p + i);
        uint64_t c = (uint64_t)__builtin_popcountll(ends);
        if (found + c >= k) {
            /* The target terminator is in this block: drop the lower ones. */
            for (uint64_t drop = k - found - 1; drop > 0; drop--) ends &= ends - 1;
            *skipped = k;
            return i + (size_t)__builtin_ctzll(ends) + 1;
        }
        found += c;
    }
    uint64_t rest;
    size_t used = iv_varint_skip_scalar(p + i, n - i, k - found, &rest);
    *skipped = found + rest;
    return i + used;
}

uint64_t iv_varint_sum3_portable(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                                 uint64_t *sum)
{
    uint64_t got = 0, s = 0;
    size_t i = 0;
    while (got < k && end - (p + i) >= 16) {
        uint64_t d = p[i] & 0x7f;
        size_t n = 1;
        while (n <= 3 && p[i + n - 1] >= 0x80) {
            if (n == 3) break;
            d |= (uint64_t)(p[i + n] & 0x7f) << (7 * n);
            n++;
        }
        if (p[i + n - 1] >= 0x80) break;   /* four bytes or more */
        s += d + 1;
        i += n;
        got++;
    }
    *used = i;
    *sum += s;
    return got;
}

#if IV_X86_KERNELS
/* 32 bytes of 0xff then 32 of zero: loadu(ones_then_zeros + W - n) keeps
 * the first n bytes of a W-byte vector. */
static const uint8_t ones_then_zeros[64] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
};
#endif

#if IV_X86_KERNELS

/*
 * Blocks of 16 bytes are summed with byte masks: a byte's weight is 1, 2^7
 * or 2^14 by how many continuation bytes precede it inside its varint
 * (found by shifting the continuation mask, carried from the previous
 * block), and psadbw adds each weight class.  Blocks do not depend on each
 * other's loads, so the loop runs at load speed; only the last block, the
 * one holding the k-th terminator or a varint longer than 3 bytes, is cut
 * at a terminator.  If the call ends between blocks, the bytes of the
 * varint left open at the end of the last block were added and are taken
 * back out.
 */
__attribute__((target("ssse3,popcnt"))) uint64_t
iv_varint_sum3_ssse3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used, uint64_t *sum)
{
    const __m128i low7 = _mm_set1_epi8(0x7f), zero = _mm_setzero_si128();
    __m128i s0 = zero, s1 = zero, s2 = zero, prev = zero;
    uint64_t got = 0;
    const uint8_t *q = p;
    unsigned open = 0;          /* continuation bytes at the end of the last whole block */
    while (got < k && end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
        __m128i cont = _mm_cmplt_epi8(v, zero);
        __m128i sh1 = _mm_alignr_epi8(cont, prev, 15);
        __m128i sh2 = _mm_and_si128(_mm_alignr_epi8(cont, prev, 14), sh1);
        __m128i sh3 = _mm_and_si128(_mm_alignr_epi8(cont, prev, 13), sh2);
        unsigned cm = (unsigned)_mm_movemask_epi8(cont);
        unsigned tm = ~cm & 0xffffu;
        unsigned c3 = (unsigned)_mm_movemask_epi8(sh3);
        unsigned nt = (unsigned)__builtin_popcount(tm);
        __m128i lo = _mm_and_si128(v, low7);
        if (c3 || got + nt >= k) {
            /* Last block: keep terminators before a long varint's byte
             * and no more than k - got of them. */
            if (c3) tm &= (1u << __builtin_ctz(c3)) - 1;
            uint64_t left = k - got;
            if ((uint64_t)__builtin_popcount(tm) > left) {
                unsigned rest = tm;
                for (uint64_t i = 0; i < left; i++) rest &= rest - 1;
                tm ^= rest;
            }
            if (tm) {
                unsigned len = 32 - (unsigned)__builtin_clz(tm);
                __m128i keep =
                    _mm_loadu_si128((const __m128i *)(const void *)(ones_then_zeros + 32 - len));
                lo = _mm_and_si128(lo, keep);
                s0 = _mm_add_epi64(s0, _mm_sad_epu8(_mm_andnot_si128(sh1, lo), zero));
                s1 = _mm_add_epi64(s1, _mm_sad_epu8(_mm_and_si128(_mm_andnot_si128(sh2, sh1), lo), zero));
                s2 = _mm_add_epi64(s2, _mm_sad_epu8(_mm_and_si128(sh2, lo), zero));
                got += (unsigned)__builtin_popcount(tm);
                q += len;
                open = 0;
            }
            break;
        }
        s0 = _mm_add_epi64(s0, _mm_sad_epu8(_mm_andnot_si128(sh1, lo), zero));
        s1 = _mm_add_epi64(s1, _mm_sad_epu8(_mm_and_si128(_mm_andnot_si128(sh2, sh1), lo), zero));
        s2 = _mm_add_epi64(s2, _mm_sad_epu8(_mm_and_si128(sh2, lo), zero));
        got += nt;
        prev = cont;
        q += 16;
        /* tm != 0 here: a block without a terminator has a byte after
         * three continuation bytes. */
        open = 15 - (31 - (unsigned)__builtin_clz(tm));
    }
    __m128i t = _mm_add_epi64(_mm_add_epi64(s0, _mm_slli_epi64(s1, 7)), _mm_slli_epi64(s2, 14));
    uint64_t lanes[2];
    _mm_storeu_si128((__m128i *)(void *)lanes, t);
    uint64_t total = lanes[0] + lanes[1];
    /* Take back the open varint's first bytes (at most 3, as a fourth
     * continuation byte would have ended the loop). */
    for (unsigned i = 0; i < open; i++) total -= (uint64_t)(q[(int)i - (int)open] & 0x7f) << (7 * i);
    q -= open;
    *used = (size_t)(q - p);
    *sum += total + got;
    return got;
}

/* The same as the SSSE3 kernel on 32-byte blocks; the byte shifts cross
 * the two 128-bit lanes through a permute. */
__attribute__((target("avx2,popcnt"))) uint64_t
iv_varint_sum3_avx2(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used, uint64_t *sum)
{
    const __m256i low7 = _mm256_set1_epi8(0x7f), zero = _mm256_setzero_si256();
    __m256i s0 = zero, s1 = zero, s2 = zero, prev = zero;
    uint64_t got = 0;
    const uint8_t *q = p;
    unsigned open = 0;
    while (got < k && end - q >= 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)q);
        __m256i cont = _mm256_cmpgt_epi8(zero, v);
        __m256i x = _mm256_permute2x128_si256(prev, cont, 0x21);   /* prev.hi, cont.lo */
        __m256i sh1 = _mm256_alignr_epi8(cont, x, 15);
        __m256i sh2 = _mm256_and_si256(_mm256_alignr_epi8(cont, x, 14), sh1);
        __m256i sh3 = _mm256_and_si256(_mm256_alignr_epi8(cont, x, 13), sh2);
        uint32_t tm = ~(uint32_t)_mm256_movemask_epi8(cont);
        uint32_t c3 = (uint32_t)_mm256_movemask_epi8(sh3);
        unsigned nt = (unsigned)__builtin_popcount(tm);
        __m256i lo = _mm256_and_si256(v, low7);
        if (c3 || got + nt >= k) {
            if (c3) tm &= (1u << __builtin_ctz(c3)) - 1;
            uint64_t left = k - got;
            if ((uint64_t)__builtin_popcount(tm) > left) {
                uint32_t rest = tm;
                for (uint64_t i = 0; i < left; i++) rest &= rest - 1;
                tm ^= rest;
            }
            if (tm) {
                unsigned len = 32 - (unsigned)__builtin_clz(tm);
                __m256i keep =
                    _mm256_loadu_si256((const __m256i *)(const void *)(ones_then_zeros + 32 - len));
                lo = _mm256_and_si256(lo, keep);
                s0 = _mm256_add_epi64(s0, _mm256_sad_epu8(_mm256_andnot_si256(sh1, lo), zero));
                s1 = _mm256_add_epi64(
                    s1, _mm256_sad_epu8(_mm256_and_si256(_mm256_andnot_si256(sh2, sh1), lo), zero));
                s2 = _mm256_add_epi64(s2, _mm256_sad_epu8(_mm256_and_si256(sh2, lo), zero));
                got += (unsigned)__builtin_popcount(tm);
                q += len;
                open = 0;
            }
            break;
        }
        s0 = _mm256_add_epi64(s0, _mm256_sad_epu8(_mm256_andnot_si256(sh1, lo), zero));
        s1 = _mm256_add_epi64(
            s1, _mm256_sad_epu8(_mm256_and_si256(_mm256_andnot_si256(sh2, sh1), lo), zero));
        s2 = _mm256_add_epi64(s2, _mm256_sad_epu8(_mm256_and_si256(sh2, lo), zero));
        got += nt;
        prev = cont;
        q += 32;
        open = (unsigned)__builtin_clz(tm);
    }
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(s0, _mm256_slli_epi64(s1, 7)),
                                 _mm256_slli_epi64(s2, 14));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)(void *)lanes, t);
    uint64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (unsigned i = 0; i < open; i++) total -= (uint64_t)(q[(int)i - (int)open] & 0x7f) << (7 * i);
    q -= open;
    *used = (size_t)(q - p);
    *sum += total + got;
    return got;
}
#endif

int iv_varint_have_ssse3(void)
{
#if IV_X86_KERNELS
    return __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("popcnt");
#else
    return 0;
#endif
}

int iv_varint_have_avx2(void)
{
#if IV_X86_KERNELS
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#else
    return 0;
#endif
}

uint64_t iv_varint_sum3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                        uint64_t *sum)
{
#if IV_X86_KERNELS
    if (iv_varint_have_avx2()) return iv_varint_sum3_avx2(p, end, k, used, sum);
    if (iv_varint_have_ssse3()) return iv_varint_sum3_ssse3(p, end, k, used, sum);
#endif
    return iv_varint_sum3_portable(p, end, k, used, sum);
}

size_t iv_varint_read_slow(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (size_t i = 0; i < IV_VARINT_MAX; i++) {
        if (p + i >= end) return 0;
        uint64_t b = p[i];
        if (i == 9 && b > 1) return 0; /* more than 64 bits */
        x |= (b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

size_t iv_varint_write(uint64_t v, uint8_t *out)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}
