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

size_t iv_varint_count_ends_scalar(const uint8_t *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] < 0x80;
    return c;
}

/* Bit i set = byte i has the high bit set (continuation). */
static inline uint64_t cont_mask64(const uint8_t *p)
{
#ifdef IV_HAVE_SSE2
    uint64_t m0 = (uint32_t)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)p));
    uint64_t m1 = (uint32_t)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
    uint64_t m2 = (uint32_t)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 32)));
    uint64_t m3 = (uint32_t)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + 48)));
    return m0 | m1 << 16 | m2 << 32 | m3 << 48;
#else
    uint64_t m = 0;
    for (int w = 0; w < 8; w++) {
        uint64_t x;
        memcpy(&x, p + 8 * w, 8);
        x &= 0x8080808080808080ULL;
        /* Gather the 8 high bits into one byte. */
        uint64_t b = (x >> 7) * 0x0102040810204080ULL >> 56;
        m |= (b & 0xff) << (8 * w);
    }
    return m;
#endif
}

size_t iv_varint_count_ends(const uint8_t *p, size_t n)
{
    size_t c = 0, i = 0;
    for (; i + 64 <= n; i += 64) c += 64 - (size_t)__builtin_popcountll(cont_mask64(p + i));
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
        uint64_t ends = ~cont_mask64(p + i);
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

#if !defined(__SSE2__)
uint64_t iv_varint_sum3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
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
#else
/* 16 bytes of 0xff then 16 of zero: loadu(ones_then_zeros + 16 - n) keeps
 * the first n bytes of a vector. */
static const uint8_t ones_then_zeros[32] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
};

/*
 * Each step loads 16 bytes at a varint boundary and sums whole varints in
 * them with byte masks: a byte's weight is 1, 2^7 or 2^14 by how many
 * continuation bytes precede it inside its varint, and psadbw adds each
 * weight class.  The step then moves to the byte after its last whole
 * varint, so no state crosses steps.
 */
uint64_t iv_varint_sum3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                        uint64_t *sum)
{
    const __m128i low7 = _mm_set1_epi8(0x7f), zero = _mm_setzero_si128();
    __m128i s0 = zero, s1 = zero, s2 = zero;
    uint64_t got = 0;
    const uint8_t *q = p;
    while (got < k && end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
        unsigned cm = (unsigned)_mm_movemask_epi8(v);
        unsigned tm = ~cm & 0xffffu;
        /* Bytes preceded by three continuation bytes belong to a varint of
         * four bytes or more: stop at the last terminator before one. */
        unsigned c3 = (cm << 1) & (cm << 2) & (cm << 3) & 0xffffu;
        if (c3) tm &= (1u << __builtin_ctz(c3)) - 1;
        if (!tm) break;
        uint64_t left = k - got;
        unsigned nt = (unsigned)__builtin_popcount(tm);
        if (nt > left) {
            /* Keep the lowest `left` terminators. */
            unsigned rest = tm;
            for (uint64_t i = 0; i < left; i++) rest &= rest - 1;
            tm ^= rest;
            nt = (unsigned)left;
        }
        unsigned len = 32 - (unsigned)__builtin_clz(tm);   /* bytes up to the last kept terminator */
        __m128i keep = _mm_loadu_si128((const __m128i *)(const void *)(ones_then_zeros + 16 - len));
        __m128i cont = _mm_cmplt_epi8(v, zero);
        __m128i sh1 = _mm_slli_si128(cont, 1);
        __m128i sh2 = _mm_and_si128(_mm_slli_si128(cont, 2), sh1);
        __m128i lo = _mm_and_si128(_mm_and_si128(v, low7), keep);
        s0 = _mm_add_epi64(s0, _mm_sad_epu8(_mm_andnot_si128(sh1, lo), zero));
        s1 = _mm_add_epi64(s1, _mm_sad_epu8(_mm_and_si128(_mm_andnot_si128(sh2, sh1), lo), zero));
        s2 = _mm_add_epi64(s2, _mm_sad_epu8(_mm_and_si128(sh2, lo), zero));
        got += nt;
        q += len;
    }
    __m128i t = _mm_add_epi64(_mm_add_epi64(s0, _mm_slli_epi64(s1, 7)), _mm_slli_epi64(s2, 14));
    uint64_t lanes[2];
    _mm_storeu_si128((__m128i *)(void *)lanes, t);
    *used = (size_t)(q - p);
    *sum += lanes[0] + lanes[1] + got;
    return got;
}
#endif

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
