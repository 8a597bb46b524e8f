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
 * A walk along the varints of the index stream that reports, at given
 * points, the running sum of d + 1: the row index's checks need each
 * value group's sum (its last index + 1) and the byte offset of some
 * varints, never the values one by one.
 *
 * iv_varint_walk3() advances *w (p at a varint boundary; n varints passed;
 * sum of their d + 1) over varints of 1 to 3 bytes.  marks[0..n_marks) are
 * non-decreasing counts of varints, all greater than w->n on entry: when
 * w->n reaches marks[i], sum_at[i] gets w->sum and p_at[i] gets w->p.
 * Returns how many marks were reached; then *w stands at the last of them,
 * or, when fewer were reached, just before the first varint of 4 bytes or
 * more, or at end, or before a varint that end cuts short (w->p <= end in
 * every case).  The caller decodes that varint with its own checks and
 * walks on.  One call adds at most 2^21 per varint to w->sum.
 */
typedef struct iv_varint_walk {
    const uint8_t *p;
    uint64_t n;
    uint64_t sum;
} iv_varint_walk_t;

size_t iv_varint_walk3(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                       size_t n_marks, uint64_t *sum_at, const uint8_t **p_at);

/*
 * The variants iv_varint_walk3 chooses from, for tests: portable C always;
 * AVX2 on x86-64, callable only when iv_varint_have_avx2() says the CPU
 * has AVX2, POPCNT, BMI1 and BMI2.  The _pdep one finds a mark's
 * terminator with pdep, which iv_varint_walk3 uses only where
 * iv_varint_have_fast_pdep() says pdep is fast.  All give the same results.
 */
size_t iv_varint_walk3_portable(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                                size_t n_marks, uint64_t *sum_at, const uint8_t **p_at);
size_t iv_varint_walk3_avx2(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                            size_t n_marks, uint64_t *sum_at, const uint8_t **p_at);
size_t iv_varint_walk3_avx2_pdep(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                                 size_t n_marks, uint64_t *sum_at, const uint8_t **p_at);
int iv_varint_have_avx2(void);
int iv_varint_have_fast_pdep(void);

/*
 * A value group's selected minor indices, sixteen bytes at a time
 * (varint_pick.c).  Decodes up to n varints of one or two bytes from *p,
 * each minor index the running sum of d + 1 minus one, the sum kept in
 * *sum (0 at a group's start, as the slice decoders keep it), and writes
 * to out the indices whose bit is set in bits (a bitmap over the minor
 * axis of at least (limit + 63) / 64 words, read as little-endian 32-bit
 * words; every index when bits is NULL), in order; *n_out gets how many.
 * out needs room for n + 16.  Returns how many varints it decoded, with
 * *p and *sum moved past them.
 *
 * It stops early, for the caller to decode the next varint its own way
 * and call again: before a varint of three bytes or more, with fewer than
 * 16 bytes left before end, or before a block of 16 bytes whose indices
 * would reach limit (so no index it writes or tests is >= limit, and the
 * caller's own decode finds the bad one).  limit < 2^31.
 *
 * Callable only when iv_varint_have_avx512() says the CPU has AVX-512 F,
 * BW, VL and DQ with BMI2.  The scalar decoders are its reference.
 */
size_t iv_varint_pick_avx512(const uint8_t **p, const uint8_t *end, size_t n, uint64_t limit,
                             uint64_t *sum, const uint64_t *bits, uint32_t *out, size_t *n_out);
int iv_varint_have_avx512(void);

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

/* iv_varint_write inline, for encoders' inner loops: exactly v's bytes. */
static inline size_t iv_varint_put(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/*
 * iv_varint_put for a buffer with a byte of slack past the varint (it
 * may write one byte more than it returns): one- and two-byte varints,
 * most of a packed stream and mixed, without a branch on which.
 */
static inline size_t iv_varint_put_slack(uint8_t *p, uint64_t v)
{
    if (v < ((uint64_t)1 << 14)) {
        uint64_t two = v >= 0x80;
        p[0] = (uint8_t)(v | two << 7);
        p[1] = (uint8_t)(v >> 7);
        return (size_t)(1 + two);
    }
    return iv_varint_put(p, v);
}

#endif
