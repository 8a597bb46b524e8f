/*
 * The xorshift generator the benchmark programs share (fixed seeds, so
 * that runs repeat).  Their clock is core/base/clock.h's iv_now_s.
 */
#ifndef IV_BENCH_UTIL_H
#define IV_BENCH_UTIL_H

#include <stdint.h>

/* The next value of the xorshift64 sequence in *state (never 0). */
static inline uint64_t bench_rnd(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

#endif
