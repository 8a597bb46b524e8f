/*
 * The wide copy's kernel (see widepick.h).
 */
#include "widepick.h"

#include <string.h>

int64_t iv_wide_pick(const uint8_t *p, size_t n, uint32_t limit, const uint64_t *bits, uint32_t *out)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t j;
        memcpy(&j, p + 2 * i, 2);
        if (j >= limit) return -1;
        out[kept] = j;
        kept += (bits[j >> 6] >> (j & 63)) & 1;
    }
    return (int64_t)kept;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "pick_avx512.h"

/* Sixteen indices widened to 32-bit lanes, checked below limit, tested
 * (a lane past n gathers nothing). */
IV_AVX512 int64_t iv_wide_pick_avx512(const uint8_t *p, size_t n, uint32_t limit, const uint64_t *bits,
                                      uint32_t *out)
{
    const __m512i lim = _mm512_set1_epi32((int)limit);
    size_t kept = 0;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)_bzhi_u32(0xffffu, (unsigned)(n - i < 16 ? n - i : 16));
        __m512i j = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + 2 * i));
        if (_mm512_mask_cmpge_epu32_mask(m, j, lim)) return -1;
        kept += iv_keep16(j, m, bits, out + kept);
    }
    return (int64_t)kept;
}

#else

int64_t iv_wide_pick_avx512(const uint8_t *p, size_t n, uint32_t limit, const uint64_t *bits,
                            uint32_t *out)
{
    return iv_wide_pick(p, n, limit, bits, out);
}

#endif
