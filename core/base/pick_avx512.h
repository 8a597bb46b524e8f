/*
 * What the AVX-512 pick kernels share (varint_pick.c, widepick.c): their
 * target attribute, and the test of sixteen indices against a selection
 * bitmap.  Include only where __x86_64__ and GCC or Clang.
 */
#ifndef IV_PICK_AVX512_H
#define IV_PICK_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define IV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi,bmi2,popcnt")))

/* Of the sixteen 32-bit indices in j (the lanes in m), those whose bit is
 * set in bits (read as little-endian 32-bit words: each index's word
 * gathered, its bit shifted down), in order, at out: a whole block is
 * stored there, the kept first.  Returns how many it kept. */
IV_AVX512 static inline size_t iv_keep16(__m512i j, __mmask16 m, const uint64_t *bits, uint32_t *out)
{
    __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, _mm512_srli_epi32(j, 5),
                                               (const void *)bits, 4);
    __m512i bit = _mm512_srlv_epi32(word, _mm512_and_si512(j, _mm512_set1_epi32(31)));
    __mmask16 hit = _mm512_mask_test_epi32_mask(m, bit, _mm512_set1_epi32(1));
    _mm512_storeu_si512((void *)out, _mm512_maskz_compress_epi32(hit, j));
    return (size_t)__builtin_popcount(hit);
}

#endif
