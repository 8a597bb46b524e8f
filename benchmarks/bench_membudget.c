/*
 * How one cache budget is best split among datasets: the shared budget
 * (core/base/membudget.c, the LRU of every dataset merged by last use) against
 * the baseline of fixed equal shares (each dataset's own LRU capped at
 * budget / N, what per-dataset caches give), on the same access traces,
 * in the same run.
 *
 *   bench_membudget [--datasets N] [--chunks C] [--budget-chunks B] [--accesses A]
 *
 * Twelve datasets of 64 chunks of 64 KiB (stored chunks, so a miss costs
 * a copy, not a decompression: the figure compared is the hit ratio,
 * which is what a miss's decompression time multiplies), a budget of 192
 * chunks (a quarter of all), three traces:
 *   skewed   dataset k drawn with weight 1/(k+1), chunks uniform in it;
 *   shift    the first half of the accesses go to datasets 0-5, the second
 *            half to 6-11 (a lab's interest moving);
 *   uniform  every dataset and chunk alike.
 * Prints the hit ratio of each policy, and of the better one's misses
 * saved.  Build: cmake -DIV_BENCH=ON, target bench_membudget.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "membudget.h"
#include "stream.h"

#define CHUNK ((uint64_t)64 << 10)

static iv_stream_t *fake_stream(const uint8_t *map, uint64_t n_chunks, size_t cap)
{
    iv_stream_desc_t d;
    memset(&d, 0, sizeof d);
    d.length = n_chunks * CHUNK;
    d.chunked = 1;
    d.chunk_len = CHUNK;
    d.n_chunks = n_chunks;
    d.map = map;
    d.map_len = d.length;
    d.chunk_addr = malloc(n_chunks * sizeof *d.chunk_addr);
    d.chunk_size = malloc(n_chunks * sizeof *d.chunk_size);
    d.chunk_mask = calloc(n_chunks, sizeof *d.chunk_mask);
    if (!d.chunk_addr || !d.chunk_size || !d.chunk_mask) exit(1);
    for (uint64_t c = 0; c < n_chunks; c++) {
        d.chunk_addr[c] = c * CHUNK;
        d.chunk_size[c] = CHUNK;
    }
    d.label = "bench";
    iv_stream_t *s = NULL;
    iv_err_t err = {0};
    if (iv_stream_create(&d, cap, &s, &err) < 0) {
        fprintf(stderr, "stream: %s\n", err.msg);
        exit(1);
    }
    return s;
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

enum trace { SKEWED, SHIFT, UNIFORM };
static const char *const trace_names[] = {"skewed", "shift", "uniform"};

static int pick_dataset(enum trace t, int n, long i, long total, const double *cum)
{
    if (t == UNIFORM) return (int)(rnd() % (uint64_t)n);
    if (t == SHIFT) {
        int half = n / 2;
        int k = (int)(rnd() % (uint64_t)half);
        return i < total / 2 ? k : half + k;
    }
    double u = (double)(rnd() >> 11) / 9007199254740992.0;
    int k = 0;
    while (k < n - 1 && u > cum[k]) k++;
    return k;
}

/* Runs trace t against n streams; shared != 0: one budget, else equal caps.
 * Returns the hit ratio and the seconds taken. */
static double run(enum trace t, int shared, int n, uint64_t nc, uint64_t budget_chunks, long accesses,
                  const uint8_t *map, double *secs)
{
    iv_membudget_t *mb = shared ? iv_membudget_new(budget_chunks * CHUNK) : NULL;
    iv_stream_t **s = calloc((size_t)n, sizeof *s);
    for (int k = 0; k < n; k++) {
        s[k] = fake_stream(map, nc, shared ? SIZE_MAX : budget_chunks / (uint64_t)n * CHUNK);
        if (shared) iv_stream_join_budget(s[k], mb, 0);
    }
    double *cum = malloc((size_t)n * sizeof *cum), w = 0;
    for (int k = 0; k < n; k++) w += 1.0 / (k + 1);
    double acc = 0;
    for (int k = 0; k < n; k++) cum[k] = (acc += 1.0 / (k + 1) / w);
    rnd_state = 0x9e3779b97f4a7c15ull;
    uint64_t hits = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < accesses; i++) {
        int k = pick_dataset(t, n, i, accesses, cum);
        uint64_t c = rnd() % nc;
        const uint8_t *p;
        size_t len;
        uint64_t dec;
        iv_err_t err = {0};
        if (iv_stream_acquire(s[k], c, &p, &len, &dec, &err) < 0) {
            fprintf(stderr, "acquire: %s\n", err.msg);
            exit(1);
        }
        hits += dec == 0;
        iv_stream_release(s[k], c);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int k = 0; k < n; k++) iv_stream_destroy(s[k]);
    free(s);
    free(cum);
    iv_membudget_free(mb);
    return (double)hits / (double)accesses;
}

int main(int argc, char **argv)
{
    int n = 12;
    uint64_t nc = 64, budget_chunks = 192;
    long accesses = 400000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--datasets")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunks")) nc = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--budget-chunks")) budget_chunks = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--accesses")) accesses = atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_membudget [--datasets N] [--chunks C] [--budget-chunks B] "
                            "[--accesses A]\n");
            return 2;
        }
    }
    if (n < 2 || nc == 0 || budget_chunks < (uint64_t)n) {
        fprintf(stderr, "bench_membudget: need 2+ datasets, chunks, and a budget of one chunk a dataset\n");
        return 2;
    }
    uint8_t *map = malloc(nc * CHUNK);
    if (!map) return 1;
    memset(map, 1, nc * CHUNK);
    printf("%d datasets x %llu chunks of 64 KiB, budget %llu chunks (%.0f%% of all), %ld accesses\n", n,
           (unsigned long long)nc, (unsigned long long)budget_chunks,
           100.0 * (double)budget_chunks / (double)(nc * (uint64_t)n), accesses);
    printf("%-8s %22s %22s %14s\n", "trace", "shared budget (hits)", "equal shares (hits)",
           "misses saved");
    for (int t = SKEWED; t <= UNIFORM; t++) {
        double s1, s2;
        double a = run((enum trace)t, 1, n, nc, budget_chunks, accesses, map, &s1);
        double b = run((enum trace)t, 0, n, nc, budget_chunks, accesses, map, &s2);
        printf("%-8s %14.4f (%.2f s) %14.4f (%.2f s) %13.1f%%\n", trace_names[t], a, s1, b, s2,
               b < 1.0 ? 100.0 * (a - b) / (1.0 - b) : 0.0);
    }
    free(map);
    return 0;
}
