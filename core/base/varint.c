/*
 * Varint kernels (see varint.h).
 *
 * The counting and skipping kernels look at the high bit of 16 bytes at a
 * time with SSE2's movemask (x86-64 baseline) or, elsewhere, at 8 bytes of
 * a little-endian word; the scalar versions are the reference.
 */
#include "varint.h"

#include <string.h>

/* The AVX2 kernels are compiled for x86-64 with GCC or clang
 * whatever the build's -march, and chosen at run time. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define IV_X86_KERNELS 1
#else
#define IV_X86_KERNELS 0
#endif

int iv_varint_have_avx2(void)
{
#if IV_X86_KERNELS
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
#else
    return 0;
#endif
}

size_t iv_varint_count_ends_scalar(const uint8_t *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] < 0x80;
    return c;
}

#if IV_X86_KERNELS
/* Terminators counted as bytes > -1 (signed): the compare's -1 per byte is
 * subtracted into byte counters, summed with psadbw every 255 blocks. */
__attribute__((target("avx2"))) static size_t count_ends_avx2(const uint8_t *p, size_t n)
{
    const __m256i zero = _mm256_setzero_si256(), minus1 = _mm256_set1_epi8(-1);
    size_t c = 0, i = 0;
    while (n - i >= 64) {
        size_t blocks = (n - i) / 64;
        if (blocks > 127) blocks = 127;
        __m256i a = zero, b = zero;
        for (size_t k = 0; k < blocks; k++, i += 64) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32));
            a = _mm256_sub_epi8(a, _mm256_cmpgt_epi8(v0, minus1));
            b = _mm256_sub_epi8(b, _mm256_cmpgt_epi8(v1, minus1));
        }
        __m256i s = _mm256_add_epi64(_mm256_sad_epu8(a, zero), _mm256_sad_epu8(b, zero));
        __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        c += (size_t)_mm_cvtsi128_si64(h) + (size_t)_mm_extract_epi64(h, 1);
    }
    return c + iv_varint_count_ends_scalar(p + i, n - i);
}
#endif

size_t iv_varint_count_ends(const uint8_t *p, size_t n)
{
#if IV_X86_KERNELS
    if (n >= 256 && iv_varint_have_avx2()) return count_ends_avx2(p, n);
#endif
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

size_t iv_varint_walk3_portable(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                                size_t n_marks, uint64_t *sum_at, const uint8_t **p_at)
{
    const uint8_t *p = w->p;
    uint64_t n = w->n, s = w->sum;
    size_t i = 0;
    while (i < n_marks && p < end) {
        uint64_t d = p[0] & 0x7f;
        size_t len = 1;
        if (p[0] >= 0x80) {
            if (end - p < 2) break;
            d |= (uint64_t)(p[1] & 0x7f) << 7;
            len = 2;
            if (p[1] >= 0x80) {
                if (end - p < 3 || p[2] >= 0x80) break;   /* four bytes or more */
                d |= (uint64_t)p[2] << 14;
                len = 3;
            }
        }
        p += len;
        n++;
        s += d + 1;
        for (; i < n_marks && marks[i] == n; i++) {
            sum_at[i] = s;
            p_at[i] = p;
        }
    }
    w->p = p;
    w->n = n;
    w->sum = s;
    return i;
}

#if IV_X86_KERNELS
/* 32 bytes of 0xff then 32 of zero: loadu(ones_then_zeros + 32 - n) keeps
 * the first n bytes of a 32-byte vector. */
static const uint8_t ones_then_zeros[64] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
};

#define IV_AVX2 __attribute__((target("avx2,popcnt,bmi,bmi2")))

/* s0 + 2^7 s1 + 2^14 s2, over the four 64-bit lanes. */
static inline IV_AVX2 uint64_t weighted_total(__m256i s0, __m256i s1, __m256i s2)
{
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(s0, _mm256_slli_epi64(s1, 7)),
                                 _mm256_slli_epi64(s2, 14));
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return (uint64_t)_mm_cvtsi128_si64(h) + (uint64_t)_mm_extract_epi64(h, 1);
}

/* Position of the (k+1)-th set bit of x (k < popcount(x)). */
static inline IV_AVX2 unsigned select_bit(uint32_t x, unsigned k, int pdep)
{
    if (pdep) return (unsigned)__builtin_ctz(_pdep_u32(1u << k, x));
    for (; k > 0; k--) x &= x - 1;
    return (unsigned)__builtin_ctz(x);
}

/*
 * Blocks of 32 bytes are summed with byte masks: a byte's weight is 1, 2^7
 * or 2^14 by how many continuation bytes precede it inside its varint
 * (found by shifting the continuation mask, carried from the previous
 * block), and psadbw adds each weight class into 64-bit lanes.  Blocks do
 * not depend on each other's loads, so the loop runs at load speed.  A
 * mark that falls in a block is found by selecting its terminator among
 * the block's, and the block cut after it is added to the running lanes
 * for that mark's sum; the block is still added whole afterwards.  A
 * varint longer than 3 bytes (a byte with 3 continuation bytes before it)
 * cuts the block before it and ends the call there.  When the call ends
 * between blocks, the bytes of the varint left open at the end of the
 * last block were added and are taken back out; the last bytes, fewer
 * than a block, go through the portable loop.
 */
static inline IV_AVX2 __attribute__((always_inline)) size_t
walk3_avx2(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks, size_t n_marks,
           uint64_t *sum_at, const uint8_t **p_at, int pdep)
{
    const __m256i low7 = _mm256_set1_epi8(0x7f), zero = _mm256_setzero_si256();
    __m256i s0 = zero, s1 = zero, s2 = zero, prev = zero;
    const uint8_t *q = w->p;
    const uint64_t n0 = w->n, sum0 = w->sum;
    uint64_t got = n0;
    unsigned open = 0;
    size_t i = 0;
    int long_varint = 0;
    if (n_marks == 0) return 0;
    while (end - q >= 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)q);
        __m256i cont = _mm256_cmpgt_epi8(zero, v);
        __m256i x = _mm256_permute2x128_si256(prev, cont, 0x21);   /* prev.hi, cont.lo */
        __m256i sh1 = _mm256_alignr_epi8(cont, x, 15);
        __m256i sh2 = _mm256_and_si256(_mm256_alignr_epi8(cont, x, 14), sh1);
        __m256i sh3 = _mm256_and_si256(_mm256_alignr_epi8(cont, x, 13), sh2);
        uint32_t tm = ~(uint32_t)_mm256_movemask_epi8(cont);
        uint32_t c3 = (uint32_t)_mm256_movemask_epi8(sh3);
        if (c3) tm &= (1u << __builtin_ctz(c3)) - 1;
        uint64_t nt = (uint64_t)__builtin_popcount(tm);
        __m256i lo = _mm256_and_si256(v, low7);
        __m256i a0 = _mm256_andnot_si256(sh1, lo);
        __m256i a1 = _mm256_and_si256(_mm256_andnot_si256(sh2, sh1), lo);
        __m256i a2 = _mm256_and_si256(sh2, lo);
        while (got + nt >= marks[i]) {
            unsigned pos = select_bit(tm, (unsigned)(marks[i] - got - 1), pdep);
            __m256i keep =
                _mm256_loadu_si256((const __m256i *)(const void *)(ones_then_zeros + 31 - pos));
            uint64_t t = weighted_total(
                _mm256_add_epi64(s0, _mm256_sad_epu8(_mm256_and_si256(a0, keep), zero)),
                _mm256_add_epi64(s1, _mm256_sad_epu8(_mm256_and_si256(a1, keep), zero)),
                _mm256_add_epi64(s2, _mm256_sad_epu8(_mm256_and_si256(a2, keep), zero)));
            sum_at[i] = sum0 + t + (marks[i] - n0);
            p_at[i] = q + pos + 1;
            if (++i == n_marks) {
                w->p = p_at[i - 1];
                w->n = marks[i - 1];
                w->sum = sum_at[i - 1];
                return i;
            }
        }
        if (c3) {
            /* Stop before the long varint: keep the block up to the last
             * terminator ahead of it, if any. */
            if (tm) {
                unsigned len = 32 - (unsigned)__builtin_clz(tm);
                __m256i keep =
                    _mm256_loadu_si256((const __m256i *)(const void *)(ones_then_zeros + 32 - len));
                s0 = _mm256_add_epi64(s0, _mm256_sad_epu8(_mm256_and_si256(a0, keep), zero));
                s1 = _mm256_add_epi64(s1, _mm256_sad_epu8(_mm256_and_si256(a1, keep), zero));
                s2 = _mm256_add_epi64(s2, _mm256_sad_epu8(_mm256_and_si256(a2, keep), zero));
                got += nt;
                q += len;
                open = 0;
            }
            long_varint = 1;
            break;
        }
        s0 = _mm256_add_epi64(s0, _mm256_sad_epu8(a0, zero));
        s1 = _mm256_add_epi64(s1, _mm256_sad_epu8(a1, zero));
        s2 = _mm256_add_epi64(s2, _mm256_sad_epu8(a2, zero));
        got += nt;
        prev = cont;
        q += 32;
        open = (unsigned)__builtin_clz(tm);   /* tm != 0: no c3 means no 32-byte varint */
    }
    uint64_t total = weighted_total(s0, s1, s2);
    for (unsigned k = 0; k < open; k++) total -= (uint64_t)(q[(int)k - (int)open] & 0x7f) << (7 * k);
    w->p = q - open;
    w->n = got;
    w->sum = sum0 + total + (got - n0);
    if (long_varint) return i;
    return i + iv_varint_walk3_portable(w, end, marks + i, n_marks - i, sum_at + i, p_at + i);
}

IV_AVX2 size_t iv_varint_walk3_avx2(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                                    size_t n_marks, uint64_t *sum_at, const uint8_t **p_at)
{
    return walk3_avx2(w, end, marks, n_marks, sum_at, p_at, 0);
}

IV_AVX2 size_t iv_varint_walk3_avx2_pdep(iv_varint_walk_t *w, const uint8_t *end,
                                         const uint64_t *marks, size_t n_marks, uint64_t *sum_at,
                                         const uint8_t **p_at)
{
    return walk3_avx2(w, end, marks, n_marks, sum_at, p_at, 1);
}
#endif

int iv_varint_have_fast_pdep(void)
{
#if IV_X86_KERNELS
    /* AMD before family 19h (Zen 3) runs pdep in microcode, slower than
     * the bit-clearing loop; everyone else with BMI2 does it in 3 cycles. */
    return iv_varint_have_avx2() &&
           !(__builtin_cpu_is("amdfam15h") || __builtin_cpu_is("amdfam17h"));
#else
    return 0;
#endif
}

size_t iv_varint_walk3(iv_varint_walk_t *w, const uint8_t *end, const uint64_t *marks,
                       size_t n_marks, uint64_t *sum_at, const uint8_t **p_at)
{
#if IV_X86_KERNELS
    static int pick = -1;   /* 0 portable, 1 avx2, 2 avx2 with pdep; racy but idempotent */
    int k = __atomic_load_n(&pick, __ATOMIC_RELAXED);
    if (k < 0) {
        k = iv_varint_have_fast_pdep() ? 2 : iv_varint_have_avx2() ? 1 : 0;
        __atomic_store_n(&pick, k, __ATOMIC_RELAXED);
    }
    if (k == 2) return iv_varint_walk3_avx2_pdep(w, end, marks, n_marks, sum_at, p_at);
    if (k == 1) return iv_varint_walk3_avx2(w, end, marks, n_marks, sum_at, p_at);
#endif
    return iv_varint_walk3_portable(w, end, marks, n_marks, sum_at, p_at);
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

size_t iv_varint_write(uint64_t v, uint8_t *out) { return iv_varint_put(out, v); }
