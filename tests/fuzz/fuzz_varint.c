/*
 * libFuzzer target: the varint kernels on arbitrary bytes.  The first byte
 * picks the spacing of the marks a walk is asked for (and k for the skip
 * kernel); the rest is the stream.  Every iv_varint_walk3 variant the CPU
 * runs is driven as the row index drives it (marks at the walk's position
 * taken from it, a varint the kernel leaves decoded one by one) and must
 * agree with a plain decode of the same stream on the sum of d + 1 and the
 * position at every mark, never pass a mark, and read nothing past the end
 * (the input is an exact-size copy).  The counting and skipping kernels
 * are checked against their scalar references on the same bytes, the
 * pick kernel (check_pick) against a plain decode of them, and the wide
 * copy's kernels (check_wide) against each other on the bytes read as
 * two-byte indices.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"
#include "widepick.h"
#include "../support/pick_step.h"
#include "../support/walk_drive.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_MARKS = 512 };

/* One variant on the stream: abort on anything iv_walk_drive finds. */
static void check(iv_walk_fn fn, const uint8_t *buf, const uint8_t *end, const uint64_t *marks,
                  size_t nm, const uint64_t *ref_sum, const size_t *ref_pos, uint64_t nv)
{
    uint64_t sum_at[MAX_MARKS];
    const uint8_t *p_at[MAX_MARKS];
    if (iv_walk_drive(fn, buf, end, 0, ref_sum, ref_pos, nv, marks, nm, sum_at, p_at)) abort();
}

/* The pick kernel (where the CPU has AVX-512) on the stream as one value
 * group, driven as decode_slice drives it (calls of `batch` varints, the
 * plain decode where it stops), with and without a bitmap (every third
 * index): the same indices, in order, as the plain decode's up to its
 * first bad varint, and the same end.  The bitmap has no more words than
 * the kernel may read. */
static void check_pick(const uint8_t *buf, const uint8_t *end, uint64_t k, uint64_t nv)
{
    if (!iv_varint_have_avx512()) return;
    uint64_t limit = k % 2 ? 1 + k * 37 % 5000 : (uint64_t)1 << 20;
    size_t n_words = (size_t)((limit + 63) / 64), batch = 1 + (size_t)(k * 13 % 300);
    uint64_t *bits = malloc(n_words * sizeof *bits);
    uint32_t *ref = malloc((nv + 1) * sizeof *ref), *out = malloc((batch + 16) * sizeof *out);
    for (size_t w = 0; w < n_words; w++) bits[w] = 0x9249249249249249ull;   /* every third bit */
    for (int use = 0; use < 2; use++) {
        const uint64_t *b = use ? bits : NULL;
        const uint8_t *p = buf;
        uint64_t sum = 0, n_ref = 0;
        uint32_t j;
        int r;
        while ((r = iv_pick_plain_step(&p, end, limit, &sum, b, &j)) >= 0)
            if (r) ref[n_ref++] = j;
        const uint8_t *ref_end = p;
        p = buf;
        sum = 0;
        uint64_t got = 0;
        for (;;) {
            size_t kept, n = iv_varint_pick_avx512(&p, end, batch, limit, &sum, b, out, &kept);
            for (size_t i = 0; i < kept; i++)
                if (got >= n_ref || out[i] != ref[got++]) abort();
            if (n > 0) continue;
            if ((r = iv_pick_plain_step(&p, end, limit, &sum, b, &j)) < 0) break;
            if (r && (got >= n_ref || j != ref[got++])) abort();
        }
        if (got != n_ref || p != ref_end) abort();
    }
    free(bits);
    free(ref);
    free(out);
}

/* The stream's bytes as two-byte indices (an odd tail left out), in runs
 * of at most IV_WIDE_PICK_MAX, below a limit from k, tested against a
 * bitmap of exactly the limit's words: both kernels keep the same indices
 * or both refuse the run, and the portable one keeps exactly the indices
 * whose bit is set. */
static void check_wide(const uint8_t *buf, size_t size, uint64_t k)
{
    uint32_t limit = k % 4 == 0 ? 65536 : 1 + (uint32_t)(k * 2621 % 65536);
    size_t n_words = (limit + 63) / 64, n = size / 2;
    uint64_t *bits = malloc(n_words * sizeof *bits);
    uint32_t *a = malloc((IV_WIDE_PICK_MAX + 16) * sizeof *a), *b = malloc((IV_WIDE_PICK_MAX + 16) * sizeof *b);
    for (size_t w = 0; w < n_words; w++) bits[w] = 0x9249249249249249ull >> (w % 3);
    for (size_t i = 0; i < n; i += IV_WIDE_PICK_MAX) {
        size_t m = n - i < IV_WIDE_PICK_MAX ? n - i : IV_WIDE_PICK_MAX;
        int64_t ka = iv_wide_pick(buf + 2 * i, m, limit, bits, a);
        int64_t kb = iv_varint_have_avx512() ? iv_wide_pick_avx512(buf + 2 * i, m, limit, bits, b) : ka;
        if (ka != kb) abort();
        if (iv_varint_have_avx512() && ka > 0 && memcmp(a, b, (size_t)ka * sizeof *a) != 0) abort();
        int64_t want = 0;
        for (size_t j = 0; j < m; j++) {
            uint16_t x;
            memcpy(&x, buf + 2 * (i + j), 2);
            if (x >= limit) {
                want = -1;
                break;
            }
            if ((bits[x / 64] >> (x % 64)) & 1) {
                if (a[want] != x) abort();
                want++;
            }
        }
        if (want != ka) abort();
    }
    free(bits);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint64_t k = data[0];
    data++;
    size--;
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    const uint8_t *end = buf + size;

    /* The plain decode, up to the end or the first varint it rejects. */
    uint64_t *ref_sum = malloc((size + 1) * sizeof *ref_sum);
    size_t *ref_pos = malloc((size + 1) * sizeof *ref_pos);
    uint64_t nv = 0;
    ref_sum[0] = 0;
    ref_pos[0] = 0;
    for (;;) {
        uint64_t d;
        size_t u = iv_varint_read(buf + ref_pos[nv], end, &d);
        if (u == 0) break;
        ref_sum[nv + 1] = ref_sum[nv] + d + 1;
        ref_pos[nv + 1] = ref_pos[nv] + u;
        nv++;
    }
    /* Marks every (k % 8) varints, with repeats when that is 0, and the last. */
    uint64_t marks[MAX_MARKS];
    size_t nm = 0;
    uint64_t step = k % 8, at = k % 3;
    while (nm < MAX_MARKS - 1 && at <= nv) {
        marks[nm++] = at;
        at += step ? step : (nm % 3 == 0);
    }
    if (nv > 0 && nm < MAX_MARKS && (nm == 0 || marks[nm - 1] < nv)) marks[nm++] = nv;

    check(iv_varint_walk3, buf, end, marks, nm, ref_sum, ref_pos, nv);
    check(iv_varint_walk3_portable, buf, end, marks, nm, ref_sum, ref_pos, nv);
    if (iv_varint_have_avx2()) {
        check(iv_varint_walk3_avx2, buf, end, marks, nm, ref_sum, ref_pos, nv);
        check(iv_varint_walk3_avx2_pdep, buf, end, marks, nm, ref_sum, ref_pos, nv);
    }
    check_pick(buf, end, k, nv);
    check_wide(buf, size, k);
    if (iv_varint_count_ends(buf, size) != iv_varint_count_ends_scalar(buf, size)) abort();
    uint64_t s1, s2;
    if (iv_varint_skip(buf, size, k, &s1) != iv_varint_skip_scalar(buf, size, k, &s2) || s1 != s2)
        abort();
    free(ref_sum);
    free(ref_pos);
    free(buf);
    return 0;
}
