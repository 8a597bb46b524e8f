/*
 * Drives an iv_varint_walk3 variant the way the row index drives it, for
 * the unit test and the fuzz target: marks at the walk's position are
 * taken from it, the kernel runs up to the next ones, and a varint it
 * leaves is decoded one by one.  Checked against a plain decode:
 * ref_sum[k] and ref_pos[k] are the running sum of d + 1 and the byte
 * offset after k varints from buf (k = 0..nv; ref_sum[0] is the walk's
 * starting sum), and marks are varint counts from base_n.  The walk must
 * never pass a mark, stop exactly at the last one, read no byte past end,
 * and give every mark the plain decode's sum and position.
 * Returns NULL, or what went wrong (a static buffer).
 */
#ifndef IV_WALK_DRIVE_H
#define IV_WALK_DRIVE_H

#include <stdio.h>

#include "varint.h"

typedef size_t (*iv_walk_fn)(iv_varint_walk_t *, const uint8_t *, const uint64_t *, size_t,
                             uint64_t *, const uint8_t **);

static inline const char *iv_walk_drive(iv_walk_fn fn, const uint8_t *buf, const uint8_t *end,
                                        uint64_t base_n, const uint64_t *ref_sum,
                                        const size_t *ref_pos, uint64_t nv, const uint64_t *marks,
                                        size_t nm, uint64_t *sum_at, const uint8_t **p_at)
{
    static char msg[160];
    iv_varint_walk_t w = {.p = buf, .n = base_n, .sum = ref_sum[0]};
    size_t i = 0;
    while (i < nm) {
        if (marks[i] == w.n) {
            sum_at[i] = w.sum;
            p_at[i] = w.p;
            i++;
            continue;
        }
        iv_varint_walk_t before = w;
        size_t r = fn(&w, end, marks + i, nm - i, sum_at + i, p_at + i);
        if (r > nm - i || w.p > end || w.p < before.p || w.n < before.n || w.n - base_n > nv)
            return "walk went wrong";
        if (w.p != buf + ref_pos[w.n - base_n] || w.sum != ref_sum[w.n - base_n]) {
            snprintf(msg, sizeof msg, "walk state off after %llu varints",
                     (unsigned long long)(w.n - base_n));
            return msg;
        }
        i += r;
        if (r > 0 && i == nm && w.n != marks[nm - 1]) return "walk went past the last mark";
        if (i < nm) {
            if (marks[i] <= w.n) return "walk passed a mark";
            /* The kernel stopped before a varint: decode it one by one. */
            uint64_t d;
            size_t u = iv_varint_read(w.p, end, &d);
            if (u == 0) return "the varint after the walk does not decode";
            w.p += u;
            w.n++;
            w.sum += d + 1;
        }
    }
    for (size_t m = 0; m < nm; m++) {
        uint64_t k = marks[m] - base_n;
        if (sum_at[m] != ref_sum[k] || p_at[m] != buf + ref_pos[k]) {
            snprintf(msg, sizeof msg, "mark %zu (%llu varints): sum %llu want %llu, at %td want %zu",
                     m, (unsigned long long)k, (unsigned long long)sum_at[m],
                     (unsigned long long)ref_sum[k], p_at[m] - buf, ref_pos[k]);
            return msg;
        }
    }
    return NULL;
}

#endif
