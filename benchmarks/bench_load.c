/*
 * Start-up load benchmark: the time of a dataset's load (iv_dataset_open:
 * HDF5 load and validation, then the row-index pass) and of its metadata
 * (iv_meta_load), run N times in turn on one file, printing the best and
 * the median of each, in wall-clock and in CPU seconds (this process and
 * its reader processes).  Built against two trees' libivcore.a it compares
 * the loads of two commits (e.g. before and after the HDF5 reads moved
 * into a reader process); printed names carry the label given.
 *
 * Not built by CMake.  Build from a repository root (after building its
 * libraries in BUILD):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore benchmarks/bench_load.c \
 *      BUILD/libivcore.a $(pkg-config --cflags --libs hdf5) \
 *      -lzstd -llz4 -lz -lpthread -lm -o bench_load
 * Run:  ./bench_load LABEL ATLAS.h5ad [N [THREADS]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "dataset.h"
#include "meta.h"
#include "pool.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of this process and its waited-for children: on a busy
 * machine a steadier measure than the wall clock. */
static double cpu(void)
{
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    getrusage(RUSAGE_CHILDREN, &b);
    return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec + b.ru_stime.tv_sec) +
           (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec +
                    b.ru_stime.tv_usec) * 1e-6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *label, const char *what, double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("%-10s %-22s best %8.4f s  median %8.4f s  (n=%d)\n", label, what, v[0], v[n / 2], n);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s LABEL ATLAS.h5ad [N [THREADS]]\n", argv[0]);
        return 2;
    }
    const char *label = argv[1], *path = argv[2];
    int n = argc > 3 ? atoi(argv[3]) : 5;
    unsigned threads = argc > 4 ? (unsigned)atoi(argv[4]) : 2;
    if (n < 1 || n > 1000) n = 5;
    iv_pool_t *pool = threads > 1 ? iv_pool_create(threads - 1, 0) : NULL;
    double *load = calloc((size_t)n, sizeof *load), *index = calloc((size_t)n, sizeof *index);
    double *open = calloc((size_t)n, sizeof *open), *meta = calloc((size_t)n, sizeof *meta);
    double *copen = calloc((size_t)n, sizeof *copen), *cmeta = calloc((size_t)n, sizeof *cmeta);
    if (!load || !index || !open || !meta || !copen || !cmeta) return 1;
    for (int i = 0; i < n; i++) {
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        o.pool = pool;
        iv_err_t err = {0};
        iv_dataset_t *ds = NULL;
        double c0 = cpu(), t0 = now();
        if (iv_dataset_open(path, &o, &ds, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double t1 = now(), c1 = cpu();
        iv_meta_t *m = NULL;
        if (iv_meta_load(path, NULL, &m, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double t2 = now(), c2 = cpu();
        copen[i] = c1 - c0;
        cmeta[i] = c2 - c1;
        load[i] = iv_dataset_info(ds)->open_seconds;
        index[i] = iv_dataset_info(ds)->index_seconds;
        open[i] = t1 - t0;
        meta[i] = t2 - t1;
        iv_meta_free(m);
        iv_dataset_close(ds);
    }
    report(label, "matrix load+validate", load, n);
    report(label, "row index", index, n);
    report(label, "dataset open (all)", open, n);
    report(label, "metadata load", meta, n);
    report(label, "dataset open, CPU", copen, n);
    report(label, "metadata load, CPU", cmeta, n);
    iv_pool_destroy(pool);
    free(load);
    free(index);
    free(open);
    free(meta);
    free(copen);
    free(cmeta);
    return 0;
}
