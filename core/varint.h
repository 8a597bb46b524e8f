/*
 * LEB128 varint kernels over the packed index stream.
 *
 * A byte with the high bit clear ends a varint, so counting such bytes
 * counts varints and the stream can be entered at any varint boundary.
 * Each kernel has a scalar reference (`_scalar`) that the fast version is
 * tested against bit for bit.  All functions are pure and thread-safe.
 */
#ifndef IV_VARINT_H
#define IV_VARINT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Maximum encoded length of a 64-bit value. */
#define IV_VARINT_MAX 10

/* Bit i set = byte p[i] has the high bit set (a continuation byte), for
 * the 64 bytes at p (all must be readable). */
static inline uint64_t iv_varint_cont64(const uint8_t *p)
{
#if defined(__SSE2__)
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

/* Number of bytes in [p, p+n) with the high bit clear. */
size_t iv_varint_count_ends(const uint8_t *p, size_t n);
size_t iv_varint_count_ends_scalar(const uint8_t *p, size_t n);

/*
 * Skips up to k varint terminators in [p, p+n): returns the number of bytes
 * up to and including the k-th terminator, or n when fewer than k were
 * found; *skipped receives how many were found (k or fewer).
 */
size_t iv_varint_skip(const uint8_t *p, size_t n, uint64_t k, uint64_t *skipped);
size_t iv_varint_skip_scalar(const uint8_t *p, size_t n, uint64_t k, uint64_t *skipped);

/*
 * Sums d + 1 over up to k varints from p (a varint boundary), the way the
 * row index checks a value group: the sum is the group's last index + 1.
 * Handles varints of 1 to 3 bytes only and stops early, leaving the rest
 * to a checked one-by-one decode, at a longer varint or when fewer than 16
 * bytes remain before end.  Returns the number of varints consumed; adds
 * their bytes to *used (set to 0 first) and their sum to *sum.  At most k
 * terminators are consumed; with 3-byte varints a sum cannot exceed
 * k * 2^21, so callers checking *sum after each call cannot see it wrap.
 */
uint64_t iv_varint_sum3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                        uint64_t *sum);

/*
 * The variants iv_varint_sum3 chooses from, for tests: portable C always;
 * SSSE3 and AVX2 on x86-64, callable only when iv_varint_have_ssse3() or
 * iv_varint_have_avx2() says the CPU has them.  All give the same results.
 */
uint64_t iv_varint_sum3_portable(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                                 uint64_t *sum);
uint64_t iv_varint_sum3_ssse3(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                              uint64_t *sum);
uint64_t iv_varint_sum3_avx2(const uint8_t *p, const uint8_t *end, uint64_t k, size_t *used,
                             uint64_t *sum);
int iv_varint_have_ssse3(void);
int iv_varint_have_avx2(void);

/*
 * Decodes one varint from [p, end).  Returns the number of bytes used
 * (1..10), or 0 when the input ends before a terminator or the value does
 * not fit 64 bits.  The one-byte case is inlined; the rest is out of line.
 */
size_t iv_varint_read_slow(const uint8_t *p, const uint8_t *end, uint64_t *v);

static inline size_t iv_varint_read(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
    if (p < end && *p < 0x80) {
        *v = *p;
        return 1;
    }
    return iv_varint_read_slow(p, end, v);
}

/* Encodes v into out (at least IV_VARINT_MAX bytes); returns bytes written. */
size_t iv_varint_write(uint64_t v, uint8_t *out);

#endif
