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
