/*
 * The cost of reading a query body: iv_qreq_parse_json on bodies of N
 * random cell indices and G random gene indices (the 10,000 x 2,000 load
 * of the scale benchmark by default), with the index arrays read ahead of
 * cJSON (proto/index_arrays.c) against cJSON alone, the baseline, in the
 * same run and alternating.  Prints, for each, the best and median
 * microseconds a body over R rounds of B bodies, and the ratio.
 *
 *   bench_request_body [--cells N] [--genes G] [--rounds R] [--bodies B] [--threads T]
 *
 * With T threads each parses its own bodies at once (the server's workers
 * parse on their own threads: allocator and C library costs that grow
 * with threads show there).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "clock.h"
#include "index_arrays.h"
#include "request.h"

enum { N_AXIS = 2 };
static const int64_t n_obs = 10000000, n_var = 33000;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return bench_rnd(&rng); }

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* {"obs": {"index": [sorted N]}, "var": {"index": [sorted G]}}, as the
 * scale benchmark's bodies are written (json.dump's ", " separators). */
static char *make_body(int64_t n, int64_t g)
{
    size_t cap = (size_t)(n + g) * 12 + 64, len = 0;
    char *s = malloc(cap);
    int64_t *v = malloc((size_t)(n > g ? n : g) * sizeof *v);
    if (!s || !v) exit(1);
    const int64_t counts[N_AXIS] = {n, g}, lens[N_AXIS] = {n_obs, n_var};
    const char *names[N_AXIS] = {"obs", "var"};
    len += (size_t)sprintf(s + len, "{");
    for (int a = 0; a < N_AXIS; a++) {
        for (int64_t i = 0; i < counts[a]; i++) v[i] = (int64_t)(rnd() % (uint64_t)lens[a]);
        qsort(v, (size_t)counts[a], sizeof *v, cmp_i64);
        len += (size_t)sprintf(s + len, "%s\"%s\": {\"index\": [", a ? ", " : "", names[a]);
        for (int64_t i = 0; i < counts[a]; i++)
            len += (size_t)sprintf(s + len, "%s%lld", i ? ", " : "", (long long)v[i]);
        len += (size_t)sprintf(s + len, "]}");
    }
    sprintf(s + len, "}");
    free(v);
    return s;
}

struct job {
    char **bodies;
    int n_bodies;
    double secs;
};

static void *parse_all(void *arg)
{
    struct job *j = arg;
    double t0 = iv_now_s();
    for (int b = 0; b < j->n_bodies; b++) {
        iv_qreq_t q;
        iv_err_t e;
        iv_err_clear(&e);
        if (iv_qreq_parse_json(j->bodies[b], strlen(j->bodies[b]), n_obs, n_var, &q, &e) != 0) {
            fprintf(stderr, "bench_request_body: %s\n", e.msg);
            exit(1);
        }
        iv_qreq_free(&q);
    }
    j->secs = iv_now_s() - t0;
    return NULL;
}

/* Microseconds a body: T threads parse B bodies each, at once. */
static double round_us(char ***bodies, int threads, int n_bodies)
{
    pthread_t th[64];
    struct job jobs[64];
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct job){bodies[t], n_bodies, 0};
        pthread_create(&th[t], NULL, parse_all, &jobs[t]);
    }
    double worst = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (jobs[t].secs > worst) worst = jobs[t].secs;
    }
    return worst * 1e6 / n_bodies;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int64_t cells = 10000, genes = 2000;
    int rounds = 9, n_bodies = 20, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--cells")) cells = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--genes")) genes = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bodies")) n_bodies = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (threads < 1 || threads > 64 || rounds < 1 || rounds > 1000 || n_bodies < 1) {
        fprintf(stderr, "bench_request_body: threads 1-64, rounds 1-1000, bodies >= 1\n");
        return 2;
    }
    char **bodies[64];
    for (int t = 0; t < threads; t++) {
        bodies[t] = malloc((size_t)n_bodies * sizeof *bodies[t]);
        if (!bodies[t]) return 1;
        for (int b = 0; b < n_bodies; b++) bodies[t][b] = make_body(cells, genes);
    }
    double us[2][1000];
    for (int r = 0; r < rounds; r++) {
        for (int ahead = 0; ahead < 2; ahead++) {
            iv_index_arrays_enable(ahead);
            us[ahead][r] = round_us(bodies, threads, n_bodies);
        }
    }
    const char *what[2] = {"cJSON alone (baseline)", "index arrays read ahead"};
    double med[2];
    for (int a = 0; a < 2; a++) {
        qsort(us[a], (size_t)rounds, sizeof us[a][0], cmp_d);
        med[a] = us[a][rounds / 2];
        printf("body %lld cells x %lld genes, %d threads: %-24s best %.1f us, median %.1f us\n",
               (long long)cells, (long long)genes, threads, what[a], us[a][0], med[a]);
    }
    printf("ratio (baseline / read ahead), median: %.2fx\n", med[0] / med[1]);
    return 0;
}
