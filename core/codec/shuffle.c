/*
 * Byte and bit unshuffle (the inverse of the shuffle filters used by HDF5
 * and Blosc2).
 *
 * Design: the scalar byte unshuffle is the reference; the fast path
 * (SSE2 on x86-64, which every x86-64 CPU has, so no run-time dispatch is
 * needed) handles the element sizes real data uses (2, 4, 8) with
 * unpack-based transposes of 16 elements at a time and falls back to the
 * scalar loop for the remainder.  Tests compare the two bit for bit.
 *
 * Bit unshuffle follows the bitshuffle layout Blosc2 uses: after the
 * forward transform, the block holds ts*8 bit planes of ne/8 bytes each;
 * plane (j*8 + k) byte r bit m is bit k of byte j of element 8r + m.  The
 * inverse gathers the eight planes of one byte position, transposes an
 * 8x8 bit matrix held in a 64-bit word, and scatters eight bytes.
 */
#include "codec.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

void iv_unshuffle_scalar(const uint8_t *src, uint8_t *dst, size_t n, size_t ts)
{
    if (ts <= 1 || n < ts) {
        if (n) memcpy(dst, src, n);
        return;
    }
    size_t ne = n / ts;
    for (size_t i = 0; i < ne; i++)
        for (size_t j = 0; j < ts; j++) dst[i * ts + j] = src[j * ne + i];
    size_t done = ne * ts;
    if (n > done) memcpy(dst + done, src + done, n - done);
}

/* Scalar unshuffle of elements [from, ne) only; planes are ne long. */
static void unshuffle_tail(const uint8_t *src, uint8_t *dst, size_t ne, size_t ts,
                           size_t from)
{
    for (size_t i = from; i < ne; i++)
        for (size_t j = 0; j < ts; j++) dst[i * ts + j] = src[j * ne + i];
}

#if defined(__SSE2__)
static size_t unshuffle2_sse2(const uint8_t *src, uint8_t *dst, size_t ne)
{
    size_t i = 0;
    for (; i + 16 <= ne; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + ne + i));
        _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(a, b));
        _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(a, b));
    }
    return i;
}

static size_t unshuffle4_sse2(const uint8_t *src, uint8_t *dst, size_t ne)
{
    size_t i = 0;
    for (; i + 16 <= ne; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + ne + i));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 2 * ne + i));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 3 * ne + i));
        __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
        __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
        uint8_t *o = dst + 4 * i;
        _mm_storeu_si128((__m128i *)(o + 0), _mm_unpacklo_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
        _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
        _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
    return i;
}

/* Interleaves 4-byte groups q (bytes 0-3) and r (bytes 4-7) of 4 elements. */
static void store8x4(uint8_t *o, __m128i q, __m128i r)
{
    _mm_storeu_si128((__m128i *)(o + 0), _mm_unpacklo_epi32(q, r));
    _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi32(q, r));
}

static size_t unshuffle8_sse2(const uint8_t *src, uint8_t *dst, size_t ne)
{
    size_t i = 0;
    for (; i + 16 <= ne; i += 16) {
        __m128i p[8];
        for (int k = 0; k < 8; k++)
            p[k] = _mm_loadu_si128((const __m128i *)(src + (size_t)k * ne + i));
        __m128i p01l = _mm_unpacklo_epi8(p[0], p[1]), p01h = _mm_unpackhi_epi8(p[0], p[1]);
        __m128i p23l = _mm_unpacklo_epi8(p[2], p[3]), p23h = _mm_unpackhi_epi8(p[2], p[3]);
        __m128i p45l = _mm_unpacklo_epi8(p[4], p[5]), p45h = _mm_unpackhi_epi8(p[4], p[5]);
        __m128i p67l = _mm_unpacklo_epi8(p[6], p[7]), p67h = _mm_unpackhi_epi8(p[6], p[7]);
        uint8_t *o = dst + 8 * i;
        /* Elements 0-7 come from the low halves, 8-15 from the high ones. */
        store8x4(o + 0, _mm_unpacklo_epi16(p01l, p23l), _mm_unpacklo_epi16(p45l, p67l));
        store8x4(o + 32, _mm_unpackhi_epi16(p01l, p23l), _mm_unpackhi_epi16(p45l, p67l));
        store8x4(o + 64, _mm_unpacklo_epi16(p01h, p23h), _mm_unpacklo_epi16(p45h, p67h));
        store8x4(o + 96, _mm_unpackhi_epi16(p01h, p23h), _mm_unpackhi_epi16(p45h, p67h));
    }
    return i;
}
#endif

void iv_unshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts)
{
    if (ts <= 1 || n < ts) {
        if (n) memcpy(dst, src, n);
        return;
    }
    size_t ne = n / ts;
    size_t done = 0;
#if defined(__SSE2__)
    switch (ts) {
    case 2: done = unshuffle2_sse2(src, dst, ne); break;
    case 4: done = unshuffle4_sse2(src, dst, ne); break;
    case 8: done = unshuffle8_sse2(src, dst, ne); break;
    default: break;
    }
#endif
    if (done == 0 && ts != 2 && ts != 4 && ts != 8) {
        /* Plane-major order reads each plane sequentially, which is kinder
         * to the cache than element-major order for odd element sizes. */
        for (size_t j = 0; j < ts; j++) {
            const uint8_t *plane = src + j * ne;
            uint8_t *o = dst + j;
            for (size_t i = 0; i < ne; i++) o[i * ts] = plane[i];
        }
        done = ne;
    }
    unshuffle_tail(src, dst, ne, ts, done);
    size_t tail = ne * ts;
    if (n > tail) memcpy(dst + tail, src + tail, n - tail);
}

/*
 * Transposes the 8x8 bit matrix in x, where bit 8*r + c is row r column c,
 * with three delta swaps (2x2, then 4x4, then 8x8 blocks).
 */
static uint64_t transpose8x8(uint64_t x)
{
    uint64_t t;
    t = (x ^ (x >> 7)) & UINT64_C(0x00AA00AA00AA00AA);
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & UINT64_C(0x0000CCCC0000CCCC);
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & UINT64_C(0x00000000F0F0F0F0);
    x ^= t ^ (t << 28);
    return x;
}

int iv_bitunshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts, iv_err_t *err)
{
    if (ts == 0) return iv_fail(err, IV_EINVALID_ARG, "bitunshuffle: element size 0");
    size_t ne = n / ts;
    size_t ne8 = ne - ne % 8;
    size_t nrow = ne8 / 8; /* bytes per bit plane */
    for (size_t j = 0; j < ts; j++) {
        const uint8_t *planes = src + j * 8 * nrow;
        for (size_t r = 0; r < nrow; r++) {
            uint64_t x = 0;
            for (unsigned k = 0; k < 8; k++) x |= (uint64_t)planes[k * nrow + r] << (8 * k);
            x = transpose8x8(x);
            uint8_t *o = dst + 8 * r * ts + j;
            for (unsigned m = 0; m < 8; m++) o[m * ts] = (uint8_t)(x >> (8 * m));
        }
    }
    size_t done = ne8 * ts;
    if (n > done) memcpy(dst + done, src + done, n - done);
    return 0;
}
