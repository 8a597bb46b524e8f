/*
 * The one clock of the engine: seconds on CLOCK_MONOTONIC, for phase
 * timings and timeouts (never wall time).  Any thread.
 */
#ifndef IV_CLOCK_H
#define IV_CLOCK_H

#include <time.h>

static inline double iv_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* IV_CLOCK_H */
