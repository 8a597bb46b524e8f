/*
 * A value group's selected indices with AVX-512 (see varint.h,
 * iv_varint_pick_avx512).
 *
 * Why.  A cell query of a few thousand genes decodes every stored entry
 * of its cells to find the few it keeps: at 10,000 cells x 2,000 of
 * 33,000 genes, 7.25 M varints for 0.45 M kept.  One varint at a time
 * costs about seven cycles (the walk, the sum, the test).  Sixteen
 * bytes at a time, with no dependency between a block's varints but
 * the running sum, it costs about one.
 *
 * How.  A block of 16 bytes is widened to 16 lanes of 32 bits.  A byte's
 * weight is its low 7 bits, times 2^7 when the byte before it is a
 * continuation byte (the second byte of a two-byte varint), plus 1 on a
 * terminator (the d + 1 of each varint).  A prefix sum over the lanes
 * then holds, at each terminator, the running sum after that varint: the
 * index is that minus one.  The block is cut after its last terminator
 * (the varint left open is the next block's first), before a varint of
 * three bytes, and after the n-th varint.  The terminators' lanes are
 * the indices, compressed into out; only the running sum carries from
 * block to block.  The selection bitmap then tests them one by one, in
 * place (a gather of its words measured no faster).
 */
#include "varint.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

int iv_varint_have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
}

#define IV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi,bmi2,popcnt")))

/* Lanes shifted up by k (lane i gets lane i - k; the first k get 0). */
#define LANES_UP(v, k) _mm512_alignr_epi32((v), _mm512_setzero_si512(), 16 - (k))

IV_AVX512 size_t iv_varint_pick_avx512(const uint8_t **p, const uint8_t *end, size_t n,
                                       uint64_t limit, uint64_t *sum, const uint64_t *bits,
                                       uint32_t *out, size_t *n_out)
{
    const __m512i low7 = _mm512_set1_epi32(0x7f), one = _mm512_set1_epi32(1);
    const uint8_t *q = *p;
    uint64_t acc = *sum;
    size_t k = 0;
    while (k < n && end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
        uint32_t cont = (uint32_t)_mm_movemask_epi8(v);
        uint32_t ends = ~cont & 0xffffu;
        uint32_t third = cont & (cont << 1);   /* a continuation byte after another */
        if (third) ends &= (1u << __builtin_ctz(third)) - 1;
        if (ends == 0) break;
        size_t want = n - k;
        if ((size_t)__builtin_popcount(ends) > want) {
            unsigned at = (unsigned)__builtin_ctz(_pdep_u32(1u << (want - 1), ends));
            ends &= (2u << at) - 1;
        }
        unsigned last = 31u - (unsigned)__builtin_clz(ends);
        __m512i lo = _mm512_and_si512(_mm512_cvtepu8_epi32(v), low7);
        __m512i w = _mm512_mask_slli_epi32(lo, (__mmask16)(cont << 1), lo, 7);
        w = _mm512_mask_add_epi32(w, (__mmask16)ends, w, one);
        w = _mm512_add_epi32(w, LANES_UP(w, 1));
        w = _mm512_add_epi32(w, LANES_UP(w, 2));
        w = _mm512_add_epi32(w, LANES_UP(w, 4));
        w = _mm512_add_epi32(w, LANES_UP(w, 8));
        uint64_t total = (uint32_t)_mm_cvtsi128_si32(
            _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set1_epi32((int)last), w)));
        if (acc + total > limit) break;
        /* Lanes wrap modulo 2^32: acc - 1 is all ones at a group's start,
         * and every terminator's lane is at least 1. */
        __m512i idx = _mm512_add_epi32(w, _mm512_set1_epi32((int)(uint32_t)(acc - 1)));
        _mm512_storeu_si512((void *)(out + k), _mm512_maskz_compress_epi32((__mmask16)ends, idx));
        k += (size_t)__builtin_popcount(ends);
        acc += total;
        q += last + 1;
    }
    *p = q;
    *sum = acc;
    if (!bits) {
        *n_out = k;
        return k;
    }
    /* The test, in place and without a branch on its outcome: a gather of
     * the bitmap's words costs more than these loads on the CPUs measured. */
    size_t h = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t j = out[i];
        out[h] = j;
        h += (size_t)((bits[j >> 6] >> (j & 63)) & 1);
    }
    *n_out = h;
    return k;
}

#else

int iv_varint_have_avx512(void) { return 0; }

size_t iv_varint_pick_avx512(const uint8_t **p, const uint8_t *end, size_t n, uint64_t limit,
                             uint64_t *sum, const uint64_t *bits, uint32_t *out, size_t *n_out)
{
    (void)p, (void)end, (void)n, (void)limit, (void)sum, (void)bits, (void)out;
    *n_out = 0;
    return 0;
}

#endif
