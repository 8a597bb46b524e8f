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
 * How.  The bytes go sixteen at a time, each block right after the one
 * before (a two-byte varint may straddle two blocks), so that no block
 * waits for the one before it but through the running sum.  A block is
 * widened to 16 lanes of 32 bits.  A byte's weight is its low 7 bits,
 * times 2^7 when the byte before it is a continuation byte (the second
 * byte of a two-byte varint), plus 1 on a terminator (the d + 1 of each
 * varint).  A prefix sum over the lanes, plus the sum of every byte
 * before the block, then holds at each terminator the running sum after
 * that varint: the index is that minus one.  The terminators' lanes are
 * the indices, compressed into out.  The last block is cut after its
 * last terminator: before a varint of three bytes, or after the n-th
 * varint.  The selection bitmap then tests the indices sixteen at a
 * time, their bitmap words gathered.
 *
 * Measured on synthetic cells shaped like the atlas's (725 entries in 7
 * value groups, 2,000 of 33,000 genes selected), against the kernel
 * before (each block starting where the last one's last varint ended,
 * the bitmap tested one index at a time, in place): the same on the AMD
 * EPYC of the 2-core machines (1.26-1.37 ns a varint against 1.28-1.39);
 * on the 16-core machine's Xeon 1.63-1.68 ns against 2.56-2.59 (the
 * gather alone: 1.16-1.25 ns against 1.49-1.53 on another machine of the
 * kind).  On the Xeon the blocks back to back gained 22% without a
 * selection; on the EPYC the gather is no faster than the loads.
 */
#include "varint.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "pick_avx512.h"

int iv_varint_have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
}

/* Lanes shifted up by k (lane i gets lane i - k; the first k get 0). */
#define LANES_UP(v, k) _mm512_alignr_epi32((v), _mm512_setzero_si512(), 16 - (k))

/* Keeps, in place and in order, the n indices of out whose bit is set in
 * bits, sixteen at a time: each index's 32-bit word of the bitmap
 * gathered, its bit shifted down.  Returns how many it kept. */
IV_AVX512 static size_t keep_selected(uint32_t *out, size_t n, const uint64_t *bits)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)_bzhi_u32(0xffffu, (unsigned)(n - i < 16 ? n - i : 16));
        kept += iv_keep16(_mm512_maskz_loadu_epi32(m, out + i), m, bits, out + kept);
    }
    return kept;
}

IV_AVX512 size_t iv_varint_pick_avx512(const uint8_t **p, const uint8_t *end, size_t n,
                                       uint64_t limit, uint64_t *sum, const uint64_t *bits,
                                       uint32_t *out, size_t *n_out)
{
    const __m512i low7 = _mm512_set1_epi32(0x7f), one = _mm512_set1_epi32(1);
    const __m512i lim = _mm512_set1_epi32((int)(uint32_t)limit);
    const uint8_t *q = *p;
    uint64_t acc = *sum;    /* the sum of every byte before q, an open varint's first included */
    uint32_t open = 0;      /* 1: the byte before q is a varint's first, its second at q */
    size_t k = 0;
    while (k < n && end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
        uint32_t cont = (uint32_t)_mm_movemask_epi8(v);
        uint32_t after = ((cont << 1) | open) & 0xffffu;   /* lanes after a continuation byte */
        uint32_t ends = ~cont & 0xffffu;
        uint32_t cut = ends;
        uint32_t third = cont & after;   /* a continuation byte after another */
        if (third) cut &= (1u << __builtin_ctz(third)) - 1;
        if (cut == 0) break;             /* a long varint first */
        size_t want = n - k;
        int last_block = third != 0;
        if ((size_t)__builtin_popcount(cut) >= want) {
            last_block = 1;
            cut &= (2u << __builtin_ctz(_pdep_u32(1u << (want - 1), cut))) - 1;
        }
        __m512i lo = _mm512_and_si512(_mm512_cvtepu8_epi32(v), low7);
        __m512i w = _mm512_mask_slli_epi32(lo, (__mmask16)after, lo, 7);
        w = _mm512_mask_add_epi32(w, (__mmask16)ends, w, one);
        w = _mm512_add_epi32(w, LANES_UP(w, 1));
        w = _mm512_add_epi32(w, LANES_UP(w, 2));
        w = _mm512_add_epi32(w, LANES_UP(w, 4));
        w = _mm512_add_epi32(w, LANES_UP(w, 8));
        /* Lanes wrap modulo 2^32: acc - 1 is all ones at a group's start,
         * and every terminator's lane is at least 1. */
        __m512i idx = _mm512_add_epi32(w, _mm512_set1_epi32((int)(uint32_t)(acc - 1)));
        if (_mm512_mask_cmpge_epu32_mask((__mmask16)cut, idx, lim)) break;  /* would reach limit */
        _mm512_storeu_si512((void *)(out + k), _mm512_maskz_compress_epi32((__mmask16)cut, idx));
        k += (size_t)__builtin_popcount(cut);
        if (last_block) {
            /* The last block: end after its last varint. */
            unsigned last = 31u - (unsigned)__builtin_clz(cut);
            acc += (uint32_t)_mm_cvtsi128_si32(
                _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set1_epi32((int)last), w)));
            q += last + 1;
            open = 0;
            break;
        }
        acc += (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(w, 3), 3);
        q += 16;
        open = cont >> 15;
    }
    if (open) {   /* back to the open varint's first byte */
        q--;
        acc -= *q & 0x7f;
    }
    *p = q;
    *sum = acc;
    *n_out = bits ? keep_selected(out, k, bits) : k;
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
