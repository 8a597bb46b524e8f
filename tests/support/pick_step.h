/*
 * One varint of a value group the plain way, the reference the pick
 * kernel (iv_varint_pick_avx512) is checked against, for the unit test
 * and the fuzz target: -1 (and *p left) when it cannot be read or its
 * index would reach limit; else *p and *sum move past it, *j is its
 * index, and the result is 1 when it is kept (its bit set in bits, or no
 * bitmap), 0 when not.
 */
#ifndef IV_PICK_STEP_H
#define IV_PICK_STEP_H

#include "varint.h"

static inline int iv_pick_plain_step(const uint8_t **p, const uint8_t *end, uint64_t limit,
                                     uint64_t *sum, const uint64_t *bits, uint32_t *j)
{
    uint64_t d;
    size_t used = iv_varint_read(*p, end, &d);
    if (used == 0 || d >= limit || *sum + d + 1 > limit) return -1;
    *p += used;
    *sum += d + 1;
    *j = (uint32_t)(*sum - 1);
    return !bits || ((bits[*j >> 6] >> (*j & 63)) & 1);
}

#endif
