/*
 * Codec throughput: Blosc2 lz4+shuffle frame decode (and zstd, blosclz
 * for comparison) on realistic buffers, single thread, in MB/s of output.
 *
 *   packed:  LEB128 varints of sparse-row gaps (typesize 1), the bulk of
 *            an IVCSR file;
 *   ptr64:   monotone int64 pointers (typesize 8, shuffle helps most);
 *   counts:  small uint16 counts with many zeros (typesize 2).
 *
 * Not built by CMake.  Build from the repository root:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore -Itests/support benchmarks/bench_codecs.c \
 *      core/codec/blosc2.c core/codec/blosclz.c core/codec/codec.c core/codec/shuffle.c core/base/error.c \
 *      tests/support/blosc2_enc.c -llz4 -lzstd -lz -lpthread -o bench_codecs
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blosc2_enc.h"
#include "codec.h"

static uint64_t st = 88172645463325252ull;

static uint32_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (uint32_t)st;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void make(const char *kind, uint8_t *d, size_t n, size_t *ts)
{
    if (strcmp(kind, "packed") == 0) {
        *ts = 1;
        size_t i = 0;
        while (i < n) {
            /* gap ~ geometric, mean ~12 with a tail past 128 */
            uint32_t g = rnd() % 16;
            if (rnd() % 20 == 0) g += rnd() % 3000;
            do {
                uint8_t b = g & 0x7f;
                g >>= 7;
                d[i++] = (uint8_t)(b | (g ? 0x80 : 0));
            } while (g && i < n);
        }
    } else if (strcmp(kind, "ptr64") == 0) {
        *ts = 8;
        uint64_t v = 0;
        for (size_t i = 0; i + 8 <= n; i += 8) {
            v += rnd() % 3000;
            memcpy(d + i, &v, 8);
        }
    } else {
        *ts = 2;
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t v = rnd() % 3 ? 0 : (uint16_t)(1 + rnd() % 20);
            memcpy(d + i, &v, 2);
        }
    }
}

static void bench(const char *kind, int compcode, const char *cname)
{
    size_t n = 1 << 20, ts;
    uint8_t *d = calloc(1, n), *f = malloc(2 * n + 65536), *out = malloc(n);
    make(kind, d, n, &ts);
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = compcode;
    o.typesize = ts;
    o.blocksize = 32768;
    o.filters[5] = 1;
    size_t fl = iv_b2e_frame(d, n, n, &o, NULL, f, 2 * n + 65536);
    if (!fl) {
        fprintf(stderr, "encode failed\n");
        exit(1);
    }
    size_t got;
    iv_err_t e = {0};
    if (iv_blosc2_frame_decode(f, fl, out, n, &got, &e) || memcmp(out, d, n)) {
        fprintf(stderr, "decode failed: %s\n", e.msg);
        exit(1);
    }
    int reps = 0;
    double t0 = now(), t;
    do {
        iv_blosc2_frame_decode(f, fl, out, n, &got, &e);
        reps++;
    } while ((t = now() - t0) < 1.0);
    printf("%-7s %-8s+shuffle ratio %5.2f  %8.0f MB/s\n", kind, cname, (double)n / fl,
           reps * (double)n / t / 1e6);
    free(d);
    free(f);
    free(out);
}

int main(void)
{
    const char *kinds[] = {"packed", "ptr64", "counts"};
    for (int k = 0; k < 3; k++) {
        bench(kinds[k], IV_B2E_LZ4, "lz4");
        bench(kinds[k], IV_B2E_ZSTD, "zstd");
        bench(kinds[k], IV_B2E_BLOSCLZ, "blosclz");
    }
    /* Unshuffle alone, 1 MiB of int64. */
    size_t n = 1 << 20;
    uint8_t *a = malloc(n), *b = malloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)rnd();
    const size_t tss[] = {2, 4, 8};
    for (int k = 0; k < 3; k++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            iv_unshuffle(a, b, n, tss[k]);
            reps++;
        } while ((t = now() - t0) < 0.5);
        double fast = reps * (double)n / t / 1e6;
        reps = 0;
        t0 = now();
        do {
            iv_unshuffle_scalar(a, b, n, tss[k]);
            reps++;
        } while ((t = now() - t0) < 0.5);
        printf("unshuffle ts=%zu: fast %6.0f MB/s, scalar %6.0f MB/s\n", tss[k], fast,
               reps * (double)n / t / 1e6);
    }
    free(a);
    free(b);
    return 0;
}
