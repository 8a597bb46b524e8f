/*
 * The pick kernel alone (core/base/varint_pick.c): a value group's
 * selected indices from its varints, on synthetic cells shaped like
 * gen_atlas.py's (725 entries a cell in 7 value groups of 435, 145, 72,
 * 36, 20, 10 and 7 random genes of 33,000; 2,000 genes selected), driven
 * as decode_slice drives it (calls of at most 512 varints, the plain
 * decode where it stops).  The baseline, in the same run: the plain
 * decode of every varint, one at a time, with its bitmap test (the
 * tests' reference step, tests/support/pick_step.h).  Prints
 * ns a varint, best of R rounds over C cells, and the ratio.
 *
 *   bench_varint_pick [--cells C] [--rounds R] [--all]    (--all: no selection)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/support/pick_step.h"
#include "bench_util.h"
#include "clock.h"
#include "varint.h"

enum { N_GENES = 33000, N_GROUPS = 7, BATCH = 512 };
static const int group_size[N_GROUPS] = {435, 145, 72, 36, 20, 10, 7};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { return bench_rnd(&rng); }

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Every group of the stream, decoded: returns the sum of kept indices + 1
 * (a check that both ways agree), the count in *n_kept. */
static uint64_t run(const uint8_t *buf, const uint8_t *end, const int *len, size_t n_groups,
                    const uint64_t *bits, int use_kernel, uint64_t *n_kept)
{
    uint32_t out[BATCH + 16];
    const uint8_t *p = buf;
    uint64_t chk = 0, nk = 0;
    for (size_t g = 0; g < n_groups; g++) {
        uint64_t acc = 0;
        int64_t left = len[g];
        while (left > 0) {
            if (use_kernel) {
                size_t k;
                size_t got = iv_varint_pick_avx512(&p, end, left < BATCH ? (size_t)left : BATCH, N_GENES,
                                                   &acc, bits, out, &k);
                if (got > 0) {
                    left -= (int64_t)got;
                    nk += k;
                    for (size_t i = 0; i < k; i++) chk += out[i] + 1;
                    continue;
                }
            }
            uint32_t j;
            int r = iv_pick_plain_step(&p, end, N_GENES, &acc, bits, &j);
            if (r < 0) exit(1);
            left--;
            if (r) {
                nk++;
                chk += (uint64_t)j + 1;
            }
        }
    }
    *n_kept = nk;
    return chk;
}

int main(int argc, char **argv)
{
    int cells = 10000, rounds = 9, all = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cells") && i + 1 < argc) cells = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--all")) all = 1;
    }
    if (!iv_varint_have_avx512()) {
        printf("bench_varint_pick: no AVX-512 on this CPU; the kernel is not used here\n");
        return 0;
    }
    if (cells < 1 || rounds < 1) return 2;
    size_t n_groups = (size_t)cells * N_GROUPS, cap = (size_t)cells * 725 * 3 + 64, len = 0;
    uint8_t *buf = malloc(cap);
    int *glen = malloc(n_groups * sizeof *glen);
    static unsigned char used[N_GENES];
    int genes[435];
    if (!buf || !glen) return 1;
    for (int c = 0; c < cells; c++) {
        memset(used, 0, sizeof used);
        for (int g = 0; g < N_GROUPS; g++) {
            int k = 0;
            while (k < group_size[g]) {
                int j = (int)(rnd() % N_GENES);
                if (!used[j]) {
                    used[j] = 1;
                    genes[k++] = j;
                }
            }
            qsort(genes, (size_t)k, sizeof *genes, cmp_int);
            for (int a = 0, prev = -1; a < k; prev = genes[a], a++)
                len += iv_varint_write((uint64_t)(genes[a] - prev - 1), buf + len);
            glen[(size_t)c * N_GROUPS + (size_t)g] = k;
        }
    }
    uint64_t bits[N_GENES / 64 + 1] = {0};
    for (int i = 0; i < 2000; i++) {
        uint64_t j = rnd() % N_GENES;
        bits[j >> 6] |= (uint64_t)1 << (j & 63);
    }
    const uint64_t *sel = all ? NULL : bits;
    double best[2] = {1e30, 1e30};
    uint64_t chk[2] = {0, 0}, nk[2] = {0, 0};
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            double t0 = iv_now_s();
            chk[k] = run(buf, buf + len, glen, n_groups, sel, k, &nk[k]);
            double t = iv_now_s() - t0;
            if (t < best[k]) best[k] = t;
        }
    }
    if (chk[0] != chk[1] || nk[0] != nk[1]) {
        fprintf(stderr, "bench_varint_pick: the kernel and the plain decode disagree\n");
        return 1;
    }
    double nv = (double)cells * 725;
    printf("%d cells, %s: plain decode (baseline) %.3f ns a varint, kernel %.3f ns a varint, "
           "ratio %.2fx (%llu kept)\n",
           cells, all ? "every gene" : "2,000 of 33,000 genes", best[0] * 1e9 / nv, best[1] * 1e9 / nv,
           best[0] / best[1], (unsigned long long)nk[0]);
    free(buf);
    free(glen);
    return 0;
}
