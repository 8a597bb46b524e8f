/*
 * Core engine benchmark: start-up, full decode and selective decode of one
 * IVCSR .h5ad, with the baselines measured in the same run.
 *
 *   bench_engine FILE.h5ad [--threads T] [--reps R] [--seed S] [--cache-mb M]
 *                [--strides 1,4,16,64] [--stride-queries Q]
 *                [--csr CSR.h5ad --baseline SCRIPT [--python PY]]
 *                [--sel-dir DIR] [--no-subset-baseline] [--startup-only]
 *                [--stride-only] [--stride-frac F] [--orient-only]
 *
 * What is measured, and why it is measured this way:
 *
 *  - Start-up.  The row-index pass (info->index_seconds of iv_dataset_open
 *    with a pool of T threads) decompresses every chunk and walks every
 *    varint.  Its floor is decompression alone, so it is set next to a
 *    bare pass over the very same stored chunks (addresses from the
 *    engine's own HDF5 loader, bytes from a copy of the file in memory, decoded with
 *    iv_pipeline_decode into per-thread buffers that are reused), on the
 *    same pool and thread count.  A second reference pass goes through
 *    iv_stream_acquire with a 0-byte cache budget: decompression plus the
 *    cache bookkeeping and one allocation per chunk.
 *  - Full decode: every cell and gene as sorted CSR blocks
 *    (iv_query_decode_block over iv_pool_parallel_for), 1 thread and T
 *    threads, cold (engine cache dropped) and warm (cache filled by a full
 *    pass).  Throughput is packed stream bytes / seconds / threads.
 *  - Selections: random 0.1%, 1%, 10% of the cells (random order, as a
 *    user passes them) and a 1% contiguous run (one or a few samples,
 *    since the generator stores cells sample by sample), each with all
 *    genes and with 2,000 random genes, cold and warm.  A measurement is
 *    planning plus decoding every block, the result kept in memory as a
 *    user of anndata would hold it.  Peak RSS is the process high-water
 *    mark after resetting it (writing 5 to /proc/self/clear_refs), so it
 *    is per case without forking; growth is peak minus RSS at the start.
 *  - Baselines: anndata backed mode on a standard CSR copy, and anndata
 *    loading the whole matrix then subsetting it (a Python script run by
 *    this program after the engine measurements, reading the same
 *    selections from files); and the engine's full decode kept in memory
 *    followed by a subset in C.  Every result carries a checksum (nnz, sum
 *    of values, position-weighted index hash) and all of them must agree,
 *    so the benchmark also checks that every path computed the same
 *    matrix (exit status 1 otherwise).
 *  - Row-index stride K: the dataset is reopened with each K and random
 *    0.1% selections are timed warm and cold, next to the index size.
 *
 * Every time is the best of R runs: on a machine shared with other work
 * the fastest run is the least disturbed, hence the most repeatable.  The
 * load average is printed so that a disturbed run can be recognised.
 *
 * "Cold" means the engine's decompressed-chunk cache is empty; the OS page
 * cache still holds the file (dropping it needs root), so cold numbers
 * exclude disk reads for the engine and anndata alike.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "dataset.h"
#include "h5matrix.h"
#include "pool.h"
#include "query.h"
#include "stream.h"
#include "transpose.h"

#define MAX_STRIDES 8
#define N_GENES_SUBSET 2000

/* ---- small helpers ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const iv_err_t *e)
{
    fprintf(stderr, "bench_engine: %s: %s\n", what, e && e->msg[0] ? e->msg : "failed");
    exit(1);
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "bench_engine: out of memory\n");
        exit(1);
    }
    return p;
}

static uint64_t rng_state;

/* splitmix64: a tiny seeded generator, so the selections are reproducible. */
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t rng_below(int64_t n)
{
    return (int64_t)(rng_next() % (uint64_t)n);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Best of n runs: on a machine shared with other work, the fastest run
 * is the one least disturbed, so it is the most repeatable statistic. */
static double best(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[0];
}

/* A value in kB from /proc/self/status ("VmRSS", "VmHWM"); -1 if absent. */
static long proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = atol(line + kl + 1);
            break;
        }
    fclose(f);
    return v;
}

/* Resets the RSS high-water mark to the current RSS (Linux >= 4.0);
 * returns 0, or -1 when the kernel refuses (peaks are then process-wide). */
static int reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The 1-minute load average, to tell a quiet run from a disturbed one. */
static double load_avg(void)
{
    double v = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* ---- bare decompression of the stored chunks ---- */

/* Per-participant output buffers of one pass.  A thread claims a slot on
 * its first item of a pass (the pass number tells a stale claim from a
 * fresh one), so buffers are reused across items as a real reader would
 * reuse them, and no more slots are needed than threads take part. */
struct bare_pass {
    const iv_stream_desc_t *d;
    unsigned gen;
    atomic_uint next_slot;
    unsigned n_slots;
    uint8_t **dst, **scratch;
    size_t cap;
    atomic_int failed;
    iv_err_t err;
};

static _Thread_local unsigned tl_gen;
static _Thread_local unsigned tl_slot;

static void bare_one(void *arg, size_t c)
{
    struct bare_pass *b = arg;
    if (tl_gen != b->gen) {
        tl_slot = atomic_fetch_add(&b->next_slot, 1);
        tl_gen = b->gen;
    }
    if (tl_slot >= b->n_slots) {
        atomic_store(&b->failed, 1);
        return;
    }
    const iv_stream_desc_t *d = b->d;
    if (d->chunk_addr[c] == UINT64_MAX) return;   /* fill chunk: nothing stored */
    size_t got = 0;
    iv_err_t e = {0};
    int rc = iv_pipeline_decode(&d->pipe, d->chunk_mask[c], d->map + d->chunk_addr[c],
                                (size_t)d->chunk_size[c], b->dst[tl_slot], b->cap,
                                b->scratch[tl_slot], b->cap, (size_t)d->chunk_len, &got, &e);
    if (rc < 0 && !atomic_exchange(&b->failed, 1)) b->err = e;
}

struct acquire_pass {
    iv_stream_t *s;
    atomic_int failed;
    iv_err_t err;
};

static void acquire_one(void *arg, size_t c)
{
    struct acquire_pass *a = arg;
    const uint8_t *data;
    size_t len;
    iv_err_t e = {0};
    if (iv_stream_acquire(a->s, c, &data, &len, NULL, &e) < 0) {
        if (!atomic_exchange(&a->failed, 1)) a->err = e;
        return;
    }
    iv_stream_release(a->s, c);
}

/* ---- query runs ---- */

/* A decoded result with the numbers that identify it. */
struct result {
    int64_t rows, nnz;
    double sum;           /* sum of all values */
    uint64_t hash;        /* sum over entries of row * 1000003 + col, mod 2^64 */
    uint64_t decompressed;
    double seconds;
    long anon_kb;         /* RssAnon with the result still held */
};

struct decode_job {
    iv_query_t *q;
    iv_block_t *blocks;
    int keep;             /* keep blocks (the result held in memory) */
    atomic_int failed;
    iv_err_t err;
};

static void decode_one(void *arg, size_t b)
{
    struct decode_job *j = arg;
    iv_block_t blk;
    iv_err_t e = {0};
    if (iv_query_decode_block(j->q, (int64_t)b, &blk, &e) < 0) {
        if (!atomic_exchange(&j->failed, 1)) j->err = e;
        memset(&j->blocks[b], 0, sizeof j->blocks[b]);
        return;
    }
    if (j->keep) {
        j->blocks[b] = blk;
    } else {
        /* Streaming consumer: only the shape survives. */
        j->blocks[b].row0 = blk.row0;
        j->blocks[b].n_rows = blk.n_rows;
        j->blocks[b].nnz = blk.nnz;
        iv_block_free(&blk);
    }
}

static void checksum_blocks(const iv_block_t *blocks, int64_t nb, struct result *r)
{
    r->nnz = 0;
    r->sum = 0;
    r->hash = 0;
    for (int64_t b = 0; b < nb; b++) {
        const iv_block_t *k = &blocks[b];
        for (int64_t i = 0; i < k->n_rows; i++) {
            uint64_t row = (uint64_t)(k->row0 + i);
            for (int64_t p = k->indptr[i]; p < k->indptr[i + 1]; p++) {
                int64_t col = k->index_size == 4 ? ((const int32_t *)k->indices)[p]
                                                 : ((const int64_t *)k->indices)[p];
                r->hash += row * 1000003u + (uint64_t)col;
                r->sum += iv_dtype_get_f64(k->dtype, k->data, (size_t)p);
            }
        }
        r->nnz += k->nnz;
    }
}

/*
 * Plans and decodes obs x var on `width` threads of pool.  keep != 0 holds
 * the whole result until the end (then checksums it and, unless out_blocks
 * takes it, frees it); keep == 0 frees each block as soon as it is decoded.
 */
static void run_query_with(iv_dataset_t *ds, iv_pool_t *pool, unsigned width, const iv_sel_t *obs,
                           const iv_sel_t *var, const iv_query_opts_t *qo, int keep,
                           struct result *r, iv_block_t **out_blocks, int64_t *out_nb)
{
    iv_err_t err = {0};
    iv_query_t *q = NULL;
    double t0 = now_s();
    if (iv_query_new(ds, obs, var, qo, &q, &err) < 0) die("query", &err);
    if (iv_query_prepare(q, pool, &err) < 0) die("prepare", &err);
    int64_t nb = iv_query_n_blocks(q);
    struct decode_job j = {.q = q, .keep = keep};
    j.blocks = xcalloc((size_t)nb, sizeof *j.blocks);
    atomic_init(&j.failed, 0);
    iv_pool_parallel_for(pool, (size_t)nb, width, decode_one, &j);
    double t1 = now_s();
    if (atomic_load(&j.failed)) die("decode", &j.err);
    memset(r, 0, sizeof *r);
    r->seconds = t1 - t0;
    r->anon_kb = proc_status_kb("RssAnon");
    r->rows = iv_query_n_rows(q);
    r->decompressed = iv_query_bytes_decompressed(q);
    if (keep && !out_blocks) {
        checksum_blocks(j.blocks, nb, r);
    } else {
        for (int64_t b = 0; b < nb; b++) r->nnz += j.blocks[b].nnz;
    }
    iv_query_free(q);
    if (out_blocks) {
        *out_blocks = j.blocks;
        *out_nb = nb;
        return;
    }
    if (keep)
        for (int64_t b = 0; b < nb; b++) iv_block_free(&j.blocks[b]);
    free(j.blocks);
}

static void run_query(iv_dataset_t *ds, iv_pool_t *pool, unsigned width, const iv_sel_t *obs,
                      const iv_sel_t *var, int keep, struct result *r, iv_block_t **out_blocks,
                      int64_t *out_nb)
{
    run_query_with(ds, pool, width, obs, var, NULL, keep, r, out_blocks, out_nb);
}

static void free_blocks(iv_block_t *blocks, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++) iv_block_free(&blocks[b]);
    free(blocks);
}

/* ---- the in-memory "full decode, then subset" baseline ---- */

/* Rows of the full result, looked up through its blocks (each block a
 * run of consecutive rows), and subset to (obs, genes) as a user would
 * subset an in-memory CSR matrix: gather rows, then keep the selected
 * columns through a dense gene -> positions table. */
static void subset_in_memory(const iv_block_t *full, int64_t nb, int64_t n_cols,
                             const iv_sel_t *obs, const iv_sel_t *var, struct result *r)
{
    double t0 = now_s();
    int64_t *pos_ptr = NULL, *pos = NULL;
    if (!var->all) {
        pos_ptr = xcalloc((size_t)n_cols + 1, sizeof *pos_ptr);
        pos = xcalloc((size_t)var->n, sizeof *pos);
        for (int64_t k = 0; k < var->n; k++) pos_ptr[var->idx[k] + 1]++;
        for (int64_t g = 0; g < n_cols; g++) pos_ptr[g + 1] += pos_ptr[g];
        int64_t *fill = xcalloc((size_t)n_cols, sizeof *fill);
        memcpy(fill, pos_ptr, (size_t)n_cols * sizeof *fill);
        for (int64_t k = 0; k < var->n; k++) pos[fill[var->idx[k]]++] = k;
        free(fill);
    }
    /* Output CSR built in two passes (count, fill) like scipy does. */
    int64_t n_rows = obs->n;
    int64_t *indptr = xcalloc((size_t)n_rows + 1, sizeof *indptr);
    const iv_block_t **rb = xcalloc((size_t)n_rows, sizeof *rb);
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t row = obs->idx[i], lo = 0, hi = nb - 1;
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (full[mid].row0 <= row) lo = mid;
            else hi = mid - 1;
        }
        rb[i] = &full[lo];
        const iv_block_t *k = rb[i];
        int64_t a = k->indptr[row - k->row0], z = k->indptr[row - k->row0 + 1], n = 0;
        if (var->all) {
            n = z - a;
        } else {
            for (int64_t p = a; p < z; p++) {
                int32_t g = ((const int32_t *)k->indices)[p];
                n += pos_ptr[g + 1] - pos_ptr[g];
            }
        }
        indptr[i + 1] = indptr[i] + n;
    }
    int64_t nnz = indptr[n_rows];
    int32_t *ind = xcalloc((size_t)nnz, sizeof *ind);
    size_t esz = iv_dtype_size(full[0].dtype);
    uint8_t *dat = xcalloc((size_t)nnz, esz);
    for (int64_t i = 0; i < n_rows; i++) {
        const iv_block_t *k = rb[i];
        int64_t row = obs->idx[i];
        int64_t a = k->indptr[row - k->row0], z = k->indptr[row - k->row0 + 1], o = indptr[i];
        for (int64_t p = a; p < z; p++) {
            int32_t g = ((const int32_t *)k->indices)[p];
            if (var->all) {
                ind[o] = g;
                memcpy(dat + (size_t)o * esz, (const uint8_t *)k->data + (size_t)p * esz, esz);
                o++;
            } else {
                for (int64_t m = pos_ptr[g]; m < pos_ptr[g + 1]; m++) {
                    ind[o] = (int32_t)pos[m];
                    memcpy(dat + (size_t)o * esz, (const uint8_t *)k->data + (size_t)p * esz, esz);
                    o++;
                }
            }
        }
    }
    /* Columns of a gene subset come out in gene order, not position order;
     * a CSR user sorts them (scipy's has_sorted_indices), and so do we. */
    if (!var->all) {
        for (int64_t i = 0; i < n_rows; i++)
            for (int64_t p = indptr[i] + 1; p < indptr[i + 1]; p++) {
                int32_t c = ind[p];
                uint8_t v[8];
                memcpy(v, dat + (size_t)p * esz, esz);
                int64_t q = p - 1;
                while (q >= indptr[i] && ind[q] > c) {
                    ind[q + 1] = ind[q];
                    memcpy(dat + (size_t)(q + 1) * esz, dat + (size_t)q * esz, esz);
                    q--;
                }
                ind[q + 1] = c;
                memcpy(dat + (size_t)(q + 1) * esz, v, esz);
            }
    }
    double t1 = now_s();
    iv_block_t one = {.row0 = 0, .n_rows = n_rows, .indptr = indptr, .indices = ind,
                      .data = dat, .nnz = nnz, .index_size = 4, .dtype = full[0].dtype};
    memset(r, 0, sizeof *r);
    checksum_blocks(&one, 1, r);
    r->rows = n_rows;
    r->seconds = t1 - t0;
    free(indptr);
    free(rb);
    free(ind);
    free(dat);
    free(pos_ptr);
    free(pos);
}

/* ---- selections ---- */

struct selection {
    char name[32];
    iv_sel_t obs;
};

/* n distinct random indices in [0, n_all), in random order (a partial
 * Fisher-Yates shuffle). */
static int64_t *random_subset(int64_t n_all, int64_t n)
{
    int64_t *perm = xcalloc((size_t)n_all, sizeof *perm);
    for (int64_t i = 0; i < n_all; i++) perm[i] = i;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i + rng_below(n_all - i);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t *out = xcalloc((size_t)n, sizeof *out);
    memcpy(out, perm, (size_t)n * sizeof *out);
    free(perm);
    return out;
}

static int write_i64(const char *dir, const char *name, const iv_sel_t *s)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.i64", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(s->idx, sizeof(int64_t), (size_t)s->n, f);
    int rc = fclose(f);
    return w == (size_t)s->n && rc == 0 ? 0 : -1;
}

/* ---- the anndata baseline (Python, run as a child process) ---- */

struct ad_result {
    char name[48];
    double seconds;
    long peak_kb;
    int64_t nnz;
    double sum;
    uint64_t hash;
    int have;
    /* Whole matrix loaded in memory, then subset (subset time only). */
    double mem_seconds, mem_sum;
    int64_t mem_nnz;
    uint64_t mem_hash;
    int have_mem;
};

struct ad_run {
    double open_s;        /* read_h5ad(backed='r') */
    double memload_s;     /* read_h5ad() of the whole matrix, -1 if not run */
    long mem_peak_kb;
};

#define MAX_AD 32

static struct ad_result *ad_slot(struct ad_result *res, int *n_res, const char *name)
{
    for (int i = 0; i < *n_res; i++)
        if (strcmp(res[i].name, name) == 0) return &res[i];
    if (*n_res == MAX_AD) return NULL;
    struct ad_result *a = &res[(*n_res)++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    return a;
}

static int run_baseline(const char *python, const char *script, const char *csr,
                        const char *dir, int reps, struct ad_result *res, int *n_res,
                        struct ad_run *run)
{
    char out_path[4200], reps_s[16];
    snprintf(out_path, sizeof out_path, "%s/anndata_results.txt", dir);
    snprintf(reps_s, sizeof reps_s, "%d", reps);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl(python, python, script, "--csr", csr, "--sel-dir", dir, "--reps", reps_s, "--out",
              out_path, (char *)NULL);
        fprintf(stderr, "bench_engine: cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_engine: the anndata baseline failed (status %d)\n", st);
        return -1;
    }
    FILE *f = fopen(out_path, "r");
    if (!f) return -1;
    char line[512];
    *n_res = 0;
    run->open_s = run->memload_s = -1;
    run->mem_peak_kb = -1;
    while (fgets(line, sizeof line, f)) {
        char name[48];
        double secs, sum;
        long peak;
        int64_t nnz;
        uint64_t hash;
        struct ad_result *a;
        if (strncmp(line, "open ", 5) == 0) {
            sscanf(line + 5, "%lf", &run->open_s);
        } else if (strncmp(line, "memload ", 8) == 0) {
            sscanf(line + 8, "%lf", &run->memload_s);
        } else if (strncmp(line, "mempeak ", 8) == 0) {
            sscanf(line + 8, "%ld", &run->mem_peak_kb);
        } else if (strncmp(line, "memory ", 7) == 0) {
            if (sscanf(line + 7, "%47s %lf %" SCNd64 " %lf %" SCNu64, name, &secs, &nnz, &sum,
                       &hash) == 5 && (a = ad_slot(res, n_res, name))) {
                a->mem_seconds = secs;
                a->mem_nnz = nnz;
                a->mem_sum = sum;
                a->mem_hash = hash;
                a->have_mem = 1;
            }
        } else if (sscanf(line, "%47s %lf %ld %" SCNd64 " %lf %" SCNu64, name, &secs, &peak, &nnz,
                          &sum, &hash) == 6 && (a = ad_slot(res, n_res, name))) {
            a->seconds = secs;
            a->peak_kb = peak;
            a->nnz = nnz;
            a->sum = sum;
            a->hash = hash;
            a->have = 1;
        }
    }
    fclose(f);
    return 0;
}

static const struct ad_result *find_ad(const struct ad_result *res, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(res[i].name, name) == 0 && res[i].have) return &res[i];
    return NULL;
}

/* ---- main ---- */

struct opts {
    const char *file, *csr, *python, *script, *sel_dir;
    unsigned threads;
    int reps, stride_queries, subset_baseline, startup_only, stride_only, orient_only;
    double stride_frac;
    uint64_t seed;
    long cache_mb;
    unsigned strides[MAX_STRIDES];
    int n_strides;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_engine FILE.h5ad [--threads T] [--reps R] [--seed S] [--cache-mb M]\n"
            "                    [--strides 1,4,16,64] [--stride-queries Q]\n"
            "                    [--csr CSR.h5ad --baseline SCRIPT [--python PY]]\n"
            "                    [--sel-dir DIR] [--no-subset-baseline] [--startup-only]\n"
            "                    [--stride-only] [--stride-frac F] [--orient-only]\n");
    exit(2);
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->python = "/usr/bin/python3";
    o->reps = 3;
    o->stride_queries = 20;
    o->stride_frac = 0.001;
    o->subset_baseline = 1;
    o->seed = 20240611;
    o->cache_mb = -1;
    unsigned def[] = {1, 4, 16, 64};
    o->n_strides = 4;
    memcpy(o->strides, def, sizeof def);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = n > 0 ? (unsigned)n : 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-subset-baseline") == 0) {
            o->subset_baseline = 0;
            continue;
        }
        if (strcmp(a, "--startup-only") == 0) {
            o->startup_only = 1;
            continue;
        }
        if (strcmp(a, "--stride-only") == 0) {
            o->stride_only = 1;
            continue;
        }
        if (strcmp(a, "--orient-only") == 0) {
            o->orient_only = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o->file) usage();
            o->file = a;
            continue;
        }
        if (!v) usage();
        i++;
        if (strcmp(a, "--threads") == 0) o->threads = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--reps") == 0) o->reps = atoi(v);
        else if (strcmp(a, "--seed") == 0) o->seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--cache-mb") == 0) o->cache_mb = atol(v);
        else if (strcmp(a, "--stride-queries") == 0) o->stride_queries = atoi(v);
        else if (strcmp(a, "--stride-frac") == 0) o->stride_frac = atof(v);
        else if (strcmp(a, "--csr") == 0) o->csr = v;
        else if (strcmp(a, "--baseline") == 0) o->script = v;
        else if (strcmp(a, "--python") == 0) o->python = v;
        else if (strcmp(a, "--sel-dir") == 0) o->sel_dir = v;
        else if (strcmp(a, "--strides") == 0) {
            o->n_strides = 0;
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t && o->n_strides < MAX_STRIDES; t = strtok(NULL, ","))
                o->strides[o->n_strides++] = (unsigned)strtoul(t, NULL, 10);
        } else usage();
    }
    if (!o->file || o->threads < 1 || o->reps < 1 || o->stride_queries < 1 ||
        !(o->stride_frac > 0 && o->stride_frac <= 1))
        usage();
}

static double mb(uint64_t bytes) { return (double)bytes / 1e6; }

/* CPU seconds of the whole process (every thread), user + system: on a
 * machine shared with other work it says what a run cost, which the wall
 * time under contention does not. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* ---- both orientations ---- */

/*
 * The gene-major copy built in memory (iv_dataset_build_other, best of
 * R builds, each on a freshly opened dataset whose cache holds the whole
 * stream) and its memory next to the packed stream's length; then the
 * queries web viewers make most, each through the cell-major file, the
 * gene-major copy and the planner's choice, warm, result kept, answers
 * as cell rows (by obs) and as gene rows (by var).  Every path of a case
 * must give the same checksum.
 */
static void orient_bench(const struct opts *o, const iv_dataset_opts_t *dopts, iv_pool_t *pool)
{
    iv_err_t err = {0};
    iv_dataset_t *ds = NULL;
    double *t = xcalloc((size_t)o->reps, sizeof *t);
    double cpu_build = -1, cpu_index = -1;
    for (int k = 0; k < o->reps; k++) {
        iv_dataset_close(ds);
        double c0 = cpu_s();
        if (iv_dataset_open(o->file, dopts, &ds, &err) < 0) die("open", &err);
        double c1 = cpu_s();
        if (cpu_index < 0 || c1 - c0 < cpu_index) cpu_index = c1 - c0;
        iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
        reset_peak_rss();
        long rss0 = proc_status_kb("VmRSS");
        double t0 = now_s();
        c0 = cpu_s();
        if (iv_dataset_build_other(ds, &to, &err) < 0) die("transpose", &err);
        t[k] = now_s() - t0;
        c1 = cpu_s();
        if (cpu_build < 0 || c1 - c0 < cpu_build) cpu_build = c1 - c0;
        if (k == 0) {
            long peak = proc_status_kb("VmHWM");
            printf("  build %d: peak RSS +%.1f MB during the build\n", k, (double)(peak - rss0) / 1024.0);
        }
    }
    const iv_dataset_info_t *info = iv_dataset_info(ds);
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    const iv_dataset_info_t *ci = iv_dataset_info(iv_dataset_other(ds));
    double build_s = best(t, o->reps);
    printf("\n[both orientations: gene-major copy built in memory, %u threads, best of %d]\n",
           o->threads, o->reps);
    printf("  row-index pass of the file (open)          %8.3f s\n", info->index_seconds);
    printf("  gene-major copy build                      %8.3f s   (%.2fx the row-index pass)\n",
           build_s, build_s / info->index_seconds);
    printf("  CPU seconds (all threads): open incl. row-index pass %.3f, copy build %.3f (%.2fx)\n",
           cpu_index, cpu_build, cpu_build / cpu_index);
    printf("  packed stream (cell-major)                 %8.1f MB\n", mb(info->stream_bytes));
    printf("  copy: stream %.1f MB + pointers/values/index = %.1f MB   (%.3fx the packed stream)\n",
           mb(ci->stream_bytes), (double)st.bytes[IV_IVCSC] / 1e6,
           (double)st.bytes[IV_IVCSC] / (double)info->stream_bytes);
    printf("  copy: %" PRId64 " value groups (file: %" PRId64 ")\n", ci->n_unique, info->n_unique);
    free(t);

    int64_t N = info->n_rows, G = info->n_cols;
    int64_t gene1 = rng_below(G);
    int64_t *genes50 = random_subset(G, 50);
    int64_t *cells10 = random_subset(N, N / 10);
    int64_t cell1 = rng_below(N);
    iv_sel_t all = {.all = 1}, g1 = {.n = 1, .idx = &gene1}, g50 = {.n = 50, .idx = genes50},
             c10 = {.n = N / 10, .idx = cells10}, c1 = {.n = 1, .idx = &cell1};
    struct {
        const char *name;
        const iv_sel_t *obs, *var;
    } cases[] = {
        {"1 gene x all cells", &all, &g1},
        {"50 genes x all cells", &all, &g50},
        {"50 genes x 10% cells", &c10, &g50},
        {"1 cell x all genes", &c1, &all},
    };
    const char *pick_name[3] = {"auto", "cells", "genes"};
    printf("\n[gene and cell queries, warm, %u threads, best of %d; ms = plan + prepare + decode, "
           "result kept]\n", o->threads, o->reps);
    printf("  %-22s %-4s %10s %10s %10s %10s  %-26s %s\n", "query", "by", "nnz", "cells ms",
           "genes ms", "auto ms", "auto picks / cells:genes", "CPU ms cells/genes/auto");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int by = 0; by < 2; by++) {
            double ms[3], cpu_ms[3];
            struct result ref = {0};
            iv_orient_t chosen = IV_IVCSR;
            for (int p = 0; p < 3; p++) {
                iv_query_opts_t qo = {.axis = by ? IV_OUT_VARS : IV_OUT_ROWS, .pick = (iv_pick_t)p};
                double *tt = xcalloc((size_t)o->reps, sizeof *tt);
                struct result r;
                cpu_ms[p] = -1;
                for (int k = 0; k < o->reps; k++) {
                    double c0 = cpu_s();
                    run_query_with(ds, pool, 0, cases[c].obs, cases[c].var, &qo, 1, &r, NULL, NULL);
                    double used = (cpu_s() - c0) * 1e3;
                    if (cpu_ms[p] < 0 || used < cpu_ms[p]) cpu_ms[p] = used;
                    tt[k] = r.seconds;
                }
                ms[p] = best(tt, o->reps) * 1e3;
                free(tt);
                if (p == 0) {
                    ref = r;
                    chosen = iv_plan_orient(ds, cases[c].obs, cases[c].var, qo.axis, NULL);
                } else if (r.nnz != ref.nnz || r.sum != ref.sum || r.hash != ref.hash) {
                    fprintf(stderr, "bench_engine: %s by %s: orientation %s differs\n",
                            cases[c].name, by ? "var" : "obs", pick_name[p]);
                    exit(1);
                }
            }
            char pk[40];
            snprintf(pk, sizeof pk, "%s / %.1fx", chosen == IV_IVCSR ? "cells" : "genes",
                     ms[1] / ms[2]);
            printf("  %-22s %-4s %10" PRId64 " %10.2f %10.2f %10.2f  %-26s %.1f / %.1f / %.1f\n",
                   cases[c].name, by ? "var" : "obs", ref.nnz, ms[1], ms[2], ms[0], pk, cpu_ms[1],
                   cpu_ms[2], cpu_ms[0]);
        }
    }
    free(genes50);
    free(cells10);
    iv_dataset_close(ds);
}

/* ---- row-index stride sweep ---- */

struct stride_row {
    unsigned k;
    size_t index_bytes;
    double index_s, warm_ms, cold_ms;
};

/* Reopens the file at each stride and times the same random selections
 * (o->stride_frac of the cells, all genes), warm then cold. */
static void stride_sweep(const struct opts *o, const iv_dataset_opts_t *dopts, iv_pool_t *pool,
                         int64_t N, struct stride_row *sw)
{
    iv_err_t err = {0};
    iv_sel_t all = {.all = 1};
    int64_t nq = (int64_t)((double)N * o->stride_frac + 0.5);
    if (nq < 1) nq = 1;
    iv_sel_t *qs = xcalloc((size_t)o->stride_queries, sizeof *qs);
    for (int k = 0; k < o->stride_queries; k++)
        qs[k] = (iv_sel_t){.n = nq, .idx = random_subset(N, nq)};
    for (int si = 0; si < o->n_strides; si++) {
        iv_dataset_opts_t so = *dopts;
        so.index_stride = o->strides[si];
        iv_dataset_t *d2 = NULL;
        if (iv_dataset_open(o->file, &so, &d2, &err) < 0) die("open (stride sweep)", &err);
        sw[si].k = iv_dataset_info(d2)->index_stride;
        sw[si].index_bytes = iv_dataset_info(d2)->index_bytes;
        sw[si].index_s = iv_dataset_info(d2)->index_seconds;
        struct result r;
        run_query(d2, pool, 0, &all, &all, 0, &r, NULL, NULL);
        /* Best of reps passes over the same queries, warm then cold. */
        double tw = 1e300, tc = 1e300;
        for (int rep = 0; rep < o->reps; rep++) {
            double t = 0;
            for (int k = 0; k < o->stride_queries; k++) {
                run_query(d2, pool, 0, &qs[k], &all, 1, &r, NULL, NULL);
                t += r.seconds;
            }
            if (t < tw) tw = t;
        }
        for (int rep = 0; rep < o->reps; rep++) {
            double t = 0;
            for (int k = 0; k < o->stride_queries; k++) {
                iv_dataset_cache_drop(d2);
                run_query(d2, pool, 0, &qs[k], &all, 1, &r, NULL, NULL);
                t += r.seconds;
            }
            if (t < tc) tc = t;
        }
        sw[si].warm_ms = 1e3 * tw / o->stride_queries;
        sw[si].cold_ms = 1e3 * tc / o->stride_queries;
        iv_dataset_close(d2);
    }
    for (int k = 0; k < o->stride_queries; k++) free((void *)qs[k].idx);
    free(qs);
}

static void print_sweep(const struct opts *o, int64_t N, const struct stride_row *sw)
{
    printf("\n[row-index stride K: %d random %g%% selections (%" PRId64 " cells), all genes, best of %d passes]\n",
           o->stride_queries, o->stride_frac * 100, (int64_t)((double)N * o->stride_frac + 0.5),
           o->reps);
    printf("      K   index KB   build s   warm ms/query   cold ms/query\n");
    for (int si = 0; si < o->n_strides; si++)
        printf("  %5u  %9.1f  %8.3f  %14.3f  %14.3f\n", sw[si].k, sw[si].index_bytes / 1024.0,
               sw[si].index_s, sw[si].warm_ms, sw[si].cold_ms);
}


/* One line of the selection table. */
struct case_row {
    const struct selection *sel;
    int genes;            /* 0 = all genes, 1 = the 2,000-gene subset */
    struct result cold, warm;
    long cold_peak_kb, cold_growth_kb, warm_peak_kb, warm_growth_kb;
    struct result subset; /* full decode + in-memory subset (subset part only) */
    int have_subset;
};

/* Best time of reps runs; peak RSS over them; the last run's result. */
static void measure_case(iv_dataset_t *ds, iv_pool_t *pool, const iv_sel_t *obs,
                         const iv_sel_t *var, int cold, int reps, struct result *r,
                         long *peak_kb, long *growth_kb)
{
    double *t = xcalloc((size_t)reps, sizeof *t);
    *peak_kb = *growth_kb = 0;
    for (int k = 0; k < reps; k++) {
        if (cold) iv_dataset_cache_drop(ds);
        reset_peak_rss();
        long base = proc_status_kb("VmRSS");
        run_query(ds, pool, 0, obs, var, 1, r, NULL, NULL);
        long peak = proc_status_kb("VmHWM");
        t[k] = r->seconds;
        if (peak > *peak_kb) *peak_kb = peak;
        if (peak - base > *growth_kb) *growth_kb = peak - base;
    }
    r->seconds = best(t, reps);
    free(t);
}


int main(int argc, char **argv)
{
    struct opts o;
    parse_args(argc, argv, &o);
    rng_state = o.seed;
    unsigned T = o.threads;
    /* parallel_for runs on the workers plus the caller: T - 1 workers make
     * T threads in all, the same count for every pass below. */
    iv_pool_t *pool = T > 1 ? iv_pool_create(T - 1, 0) : NULL;
    if (T > 1 && !pool) {
        fprintf(stderr, "bench_engine: cannot create the pool\n");
        return 1;
    }
    int peak_ok = reset_peak_rss() == 0;
    double load_start = load_avg();
    iv_err_t err = {0};

    /* ---- start-up: index build vs bare decompression ---- */
    iv_dataset_opts_t dopts;
    iv_dataset_opts_init(&dopts);
    dopts.pool = pool;
    if (o.cache_mb >= 0) dopts.cache_bytes = (size_t)o.cache_mb << 20;
    double *t_index = xcalloc((size_t)o.reps, sizeof(double));
    double *t_open = xcalloc((size_t)o.reps, sizeof(double));
    iv_dataset_t *ds = NULL;
    for (int k = 0; k < o.reps; k++) {
        iv_dataset_close(ds);
        if (iv_dataset_open(o.file, &dopts, &ds, &err) < 0) die("open", &err);
        t_index[k] = iv_dataset_info(ds)->index_seconds;
        t_open[k] = iv_dataset_info(ds)->open_seconds;
    }
    const iv_dataset_info_t *info = iv_dataset_info(ds);
    if (info->orient != IV_IVCSR) {
        fprintf(stderr, "bench_engine: %s is not IVCSR; this benchmark times cell rows\n", o.file);
        return 1;
    }
    double index_s = best(t_index, o.reps), open_s = best(t_open, o.reps);
    if (o.orient_only) {
        /* Both orientations alone. */
        iv_dataset_close(ds);
        orient_bench(&o, &dopts, pool);
        iv_pool_destroy(pool);
        return 0;
    }

    iv_h5matrix_t m;
    memset(&m, 0, sizeof m);
    if (iv_h5matrix_load(o.file, "X", &m, &err) < 0) die("load", &err);
    double bare_s = -1, acquire_s = -1;
    if (m.stream.chunked) {
        /* The engine reads stored chunks with pread (filecheck.h); the bare
         * pass decodes them from a copy of the file in memory, as it did
         * from the file mapping: decompression alone. */
        iv_stream_desc_t bare_desc = m.stream;
        uint8_t *image = xcalloc((size_t)m.file_len + 1, 1);
        {
            FILE *fh = fopen(o.file, "rb");
            if (!fh || fread(image, 1, (size_t)m.file_len, fh) != (size_t)m.file_len) {
                fprintf(stderr, "bench_engine: cannot read %s\n", o.file);
                return 1;
            }
            fclose(fh);
        }
        bare_desc.map = image;
        bare_desc.map_len = m.file_len;
        struct bare_pass b = {.d = &bare_desc, .n_slots = T};
        b.cap = (size_t)m.stream.chunk_len + 64;
        b.dst = xcalloc(T, sizeof *b.dst);
        b.scratch = xcalloc(T, sizeof *b.scratch);
        for (unsigned s = 0; s < T; s++) {
            b.dst[s] = xcalloc(b.cap, 1);
            b.scratch[s] = xcalloc(b.cap, 1);
        }
        atomic_init(&b.failed, 0);
        double *t = xcalloc((size_t)o.reps, sizeof *t);
        for (int k = 0; k < o.reps; k++) {
            b.gen = (unsigned)k + 1;
            atomic_store(&b.next_slot, 0);
            double t0 = now_s();
            iv_pool_parallel_for(pool, (size_t)m.stream.n_chunks, 0, bare_one, &b);
            t[k] = now_s() - t0;
            if (atomic_load(&b.failed)) die("bare zstd pass", &b.err);
        }
        bare_s = best(t, o.reps);
        for (unsigned s = 0; s < T; s++) {
            free(b.dst[s]);
            free(b.scratch[s]);
        }
        free(b.dst);
        free(b.scratch);
        free(image);

        /* The same chunks through the engine's stream with no cache. */
        iv_stream_desc_t desc = m.stream;
        memset(&m.stream, 0, sizeof m.stream);
        iv_stream_t *s = NULL;
        if (iv_stream_create(&desc, 0, &s, &err) < 0) die("stream", &err);
        struct acquire_pass a = {.s = s};
        atomic_init(&a.failed, 0);
        for (int k = 0; k < o.reps; k++) {
            double t0 = now_s();
            iv_pool_parallel_for(pool, (size_t)iv_stream_n_chunks(s), 0, acquire_one, &a);
            t[k] = now_s() - t0;
            if (atomic_load(&a.failed)) die("acquire pass", &a.err);
        }
        acquire_s = best(t, o.reps);
        iv_stream_destroy(s);
        free(t);
    }
    iv_h5matrix_free(&m);
    if (o.startup_only) {
        /* The start-up comparison alone, for iterating on the index pass. */
        printf("threads %u, reps %d (best), cache budget %.0f MB, index runs:", T, o.reps,
               (double)dopts.cache_bytes / 1048576.0);
        for (int k = 0; k < o.reps; k++) printf(" %.3f", t_index[k]);
        printf("\n  HDF5 load + validation %8.3f s\n  row-index build   %8.3f s\n", open_s, index_s);
        if (bare_s > 0)
            printf("  bare zstd pass    %8.3f s   index/bare %.2fx\n"
                   "  acquire, 0 cache  %8.3f s   index/acquire %.2fx\n",
                   bare_s, index_s / bare_s, acquire_s, index_s / acquire_s);
        iv_dataset_close(ds);
        iv_pool_destroy(pool);
        return 0;
    }
    if (o.stride_only) {
        /* The stride sweep alone, on the threads given. */
        struct stride_row sw[MAX_STRIDES];
        stride_sweep(&o, &dopts, pool, info->n_rows, sw);
        print_sweep(&o, info->n_rows, sw);
        iv_dataset_close(ds);
        iv_pool_destroy(pool);
        return 0;
    }

    /* ---- full decode ---- */
    iv_sel_t all = {.all = 1};
    struct result full[2][2];   /* [threads 1 / T][cold / warm] */
    unsigned widths[2] = {1, T};
    for (int w = 0; w < 2; w++)
        for (int warm = 0; warm < 2; warm++) {
            double *t = xcalloc((size_t)o.reps, sizeof *t);
            /* One untimed full pass fills the cache for the warm runs. */
            if (warm) run_query(ds, pool, 0, &all, &all, 0, &full[w][warm], NULL, NULL);
            for (int k = 0; k < o.reps; k++) {
                if (!warm) iv_dataset_cache_drop(ds);
                run_query(ds, pool, widths[w], &all, &all, 0, &full[w][warm], NULL, NULL);
                t[k] = full[w][warm].seconds;
            }
            full[w][warm].seconds = best(t, o.reps);
            free(t);
        }

    /* ---- selections ---- */
    int64_t N = info->n_rows, G = info->n_cols;
    struct selection sels[4];
    const double frac[3] = {0.001, 0.01, 0.1};
    const char *fname[3] = {"random_0.1pct", "random_1pct", "random_10pct"};
    for (int i = 0; i < 3; i++) {
        int64_t n = (int64_t)((double)N * frac[i] + 0.5);
        if (n < 1) n = 1;
        snprintf(sels[i].name, sizeof sels[i].name, "%s", fname[i]);
        sels[i].obs = (iv_sel_t){.n = n, .idx = random_subset(N, n)};
    }
    {
        int64_t n = (N + 50) / 100;
        if (n < 1) n = 1;
        int64_t start = rng_below(N - n + 1);
        int64_t *idx = xcalloc((size_t)n, sizeof *idx);
        for (int64_t i = 0; i < n; i++) idx[i] = start + i;
        snprintf(sels[3].name, sizeof sels[3].name, "clustered_1pct");
        sels[3].obs = (iv_sel_t){.n = n, .idx = idx};
    }
    int64_t n_genes = G < N_GENES_SUBSET ? G : N_GENES_SUBSET;
    iv_sel_t genes = {.n = n_genes, .idx = random_subset(G, n_genes)};

    struct case_row rows[8];
    int n_rows = 0;
    for (int s = 0; s < 4; s++)
        for (int g = 0; g < 2; g++) {
            memset(&rows[n_rows], 0, sizeof rows[n_rows]);
            rows[n_rows].sel = &sels[s];
            rows[n_rows].genes = g;
            n_rows++;
        }
    /* Warm first: one full pass fills the cache, and no warm case evicts
     * when the cache holds the stream.  Then cold, dropping before each. */
    {
        struct result tmp;
        run_query(ds, pool, 0, &all, &all, 0, &tmp, NULL, NULL);
    }
    for (int i = 0; i < n_rows; i++)
        measure_case(ds, pool, &rows[i].sel->obs, rows[i].genes ? &genes : &all, 0, o.reps,
                     &rows[i].warm, &rows[i].warm_peak_kb, &rows[i].warm_growth_kb);
    for (int i = 0; i < n_rows; i++)
        measure_case(ds, pool, &rows[i].sel->obs, rows[i].genes ? &genes : &all, 1, o.reps,
                     &rows[i].cold, &rows[i].cold_peak_kb, &rows[i].cold_growth_kb);

    /* ---- full decode, then subset in memory ---- */
    struct result full_kept = {0};
    if (o.subset_baseline) {
        iv_block_t *fb = NULL;
        int64_t fnb = 0;
        run_query(ds, pool, 0, &all, &all, 0, &full_kept, NULL, NULL);   /* warm the cache */
        run_query(ds, pool, 0, &all, &all, 1, &full_kept, &fb, &fnb);
        for (int i = 0; i < n_rows; i++) {
            subset_in_memory(fb, fnb, G, &rows[i].sel->obs, rows[i].genes ? &genes : &all,
                             &rows[i].subset);
            rows[i].have_subset = 1;
        }
        free_blocks(fb, fnb);
    }

    /* ---- row-index stride sweep ---- */
    struct stride_row sw[MAX_STRIDES];
    stride_sweep(&o, &dopts, pool, N, sw);

    /* ---- anndata backed baseline ---- */
    struct ad_result ad[MAX_AD];
    int n_ad = 0;
    struct ad_run adr = {-1, -1, -1};
    if (o.csr && o.script) {
        char dir[4000];
        if (o.sel_dir) snprintf(dir, sizeof dir, "%s", o.sel_dir);
        else snprintf(dir, sizeof dir, "%s.sel", o.file);
        mkdir(dir, 0755);
        int bad = write_i64(dir, "genes", &genes) < 0;
        for (int s = 0; s < 4; s++) bad |= write_i64(dir, sels[s].name, &sels[s].obs) < 0;
        /* The engine's memory is given back first so the two do not share
         * the machine's RAM while anndata runs. */
        iv_dataset_cache_drop(ds);
        if (bad) fprintf(stderr, "bench_engine: cannot write selections to %s\n", dir);
        else if (run_baseline(o.python, o.script, o.csr, dir, o.reps, ad, &n_ad, &adr) < 0)
            n_ad = 0;
    }

    /* ---- the table ---- */
    printf("\nivserve engine benchmark\n");
    printf("file      %s\n", o.file);
    printf("matrix    %" PRId64 " cells x %" PRId64 " genes, nnz %" PRId64 " (%.1f per cell), "
           "%" PRId64 " value groups\n", N, G, info->nnz, (double)info->nnz / (double)(N ? N : 1),
           info->n_unique);
    printf("stream    %.1f MB packed, %.1f MB stored (%s), %" PRIu64 " chunks of %.1f KB\n",
           mb(info->stream_bytes), mb(info->stored_bytes), info->codec, info->n_chunks,
           (double)info->chunk_len / 1e3);
    printf("threads   %u (pool of %u workers + caller); best of %d runs; cache budget %.0f MB\n",
           T, T - 1, o.reps, (double)dopts.cache_bytes / 1048576.0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("load      1-min load average %.2f at start, %.2f at end, %ld CPUs online\n",
           load_start, load_avg(), ncpu);
    printf("cold      = engine chunk cache dropped before the run (OS page cache stays warm)\n");
    if (info->chunked && dopts.cache_bytes < info->stream_bytes)
        printf("warning   the cache budget is smaller than the stream: \"warm\" runs still decompress;\n"
               "          pass --cache-mb %.0f or more for fully warm numbers\n",
               (double)info->stream_bytes / 1048576.0 + 1);

    printf("\n[start-up]                                   seconds   ratio\n");
    printf("  HDF5 load + validation (open_seconds)       %8.3f\n", open_s);
    printf("  row-index build, stride %-3u (index_seconds) %8.3f\n", info->index_stride, index_s);
    if (bare_s > 0) {
        printf("  bare zstd pass, same chunks & threads       %8.3f   index/bare %.2fx (target <= 1.5)\n",
               bare_s, index_s / bare_s);
        printf("  stream acquire pass, 0-byte cache           %8.3f   index/acquire %.2fx\n",
               acquire_s, index_s / acquire_s);
        printf("  (bare: iv_pipeline_decode of each stored chunk from memory into reused\n"
               "   per-thread buffers; acquire: iv_stream_acquire/release, decompression + one\n"
               "   allocation + cache bookkeeping per chunk)\n");
    } else {
        printf("  packed stream is contiguous: no decompression pass to compare with\n");
    }

    printf("\n[full decode: all cells x all genes, sorted CSR blocks, freed as decoded]\n");
    printf("  threads  cache   seconds   MB/s/thread   Mnnz/s   scaling\n");
    for (int w = 0; w < 2; w++)
        for (int warm = 0; warm < 2; warm++) {
            const struct result *r = &full[w][warm];
            double per = mb(info->stream_bytes) / r->seconds / (double)widths[w];
            double sc = w ? full[0][warm].seconds / r->seconds : 1.0;
            printf("  %7u  %-5s  %8.3f   %11.0f   %6.1f   %6.2fx%s\n", widths[w],
                   warm ? "warm" : "cold", r->seconds, per,
                   (double)r->nnz / r->seconds / 1e6, sc,
                   w && warm ? "   (target >= 300 MB/s/thread)" : "");
        }

    printf("\n[selections: %d threads; genes: all or %" PRId64 " random; time = plan + decode, result kept]\n",
           T, n_genes);
    printf("  %-15s %-5s %-4s %7s %10s %9s %8s %8s %8s %8s", "selection", "genes", "cach", "rows",
           "nnz", "seconds", "MB dec", "peakRSS", "RSS+", "anon");
    printf(" %10s %8s %10s %8s\n", "anndata s", "ad/this", "full+sub s", "fs/this");
    for (int i = 0; i < n_rows; i++) {
        const struct case_row *c = &rows[i];
        char key[64];
        snprintf(key, sizeof key, "%s%s", c->sel->name, c->genes ? "_genes" : "");
        const struct ad_result *a = find_ad(ad, n_ad, key);
        double fs = c->have_subset ? full_kept.seconds + c->subset.seconds : -1;
        for (int warm = 0; warm < 2; warm++) {
            const struct result *r = warm ? &c->warm : &c->cold;
            long peak = warm ? c->warm_peak_kb : c->cold_peak_kb;
            long grow = warm ? c->warm_growth_kb : c->cold_growth_kb;
            printf("  %-15s %-5s %-4s %7" PRId64 " %10" PRId64 " %9.4f %8.1f %8.0f %8.0f %8.0f",
                   c->sel->name, c->genes ? "2000" : "all", warm ? "warm" : "cold", r->rows,
                   r->nnz, r->seconds, mb(r->decompressed), peak / 1024.0, grow / 1024.0,
                   r->anon_kb / 1024.0);
            if (a) printf(" %10.3f %7.1fx", a->seconds, a->seconds / r->seconds);
            else printf(" %10s %8s", "-", "-");
            if (fs > 0) printf(" %10.3f %7.1fx", fs, fs / r->seconds);
            else printf(" %10s %8s", "-", "-");
            printf("\n");
        }
    }
    if (!peak_ok) printf("  (peak RSS could not be reset per case: numbers are process-wide)\n");
    printf("  MB dec = bytes decompressed for the query; peakRSS = process high-water mark during\n"
           "  the case (file pages mapped so far included); RSS+ = peak minus RSS at its start;\n"
           "  anon = RssAnon (heap, cache, result; no file pages) with the result still held\n");

    printf("\n[baselines, same selections; seconds are best of the runs]\n");
    printf("  %-15s %-5s %11s %9s %14s %13s %13s\n", "selection", "genes", "ad backed s",
           "peak MB", "ad mem load+s", "(subset s)", "full+subset s");
    for (int i = 0; i < n_rows; i++) {
        const struct case_row *c = &rows[i];
        char key[64];
        snprintf(key, sizeof key, "%s%s", c->sel->name, c->genes ? "_genes" : "");
        const struct ad_result *a = find_ad(ad, n_ad, key);
        const struct ad_result *am = NULL;
        for (int k = 0; k < n_ad; k++)
            if (strcmp(ad[k].name, key) == 0 && ad[k].have_mem) am = &ad[k];
        printf("  %-15s %-5s", c->sel->name, c->genes ? "2000" : "all");
        if (a) printf(" %11.3f %9.0f", a->seconds, a->peak_kb / 1024.0);
        else printf(" %11s %9s", "-", "-");
        if (am && adr.memload_s >= 0)
            printf(" %14.3f %13.4f", adr.memload_s + am->mem_seconds, am->mem_seconds);
        else printf(" %14s %13s", "-", "-");
        if (c->have_subset) printf(" %13.3f", full_kept.seconds + c->subset.seconds);
        else printf(" %13s", "-");
        printf("\n");
    }
    if (adr.open_s >= 0)
        printf("  ad backed: read_h5ad(backed='r') once (%.3f s, not in the times), then per case\n"
               "    X[sorted idx], rows put back in the asked order, [:, genes]; one forked child\n"
               "    per run, peak = its ru_maxrss (inherited pages included)\n", adr.open_s);
    if (adr.memload_s >= 0)
        printf("  ad mem: read_h5ad() of the whole matrix (%.3f s, peak %.0f MB) + X[idx][:, genes]\n",
               adr.memload_s, adr.mem_peak_kb / 1024.0);
    if (o.subset_baseline)
        printf("  full+subset: the engine's full decode kept in memory (%.3f s, %u threads, warm)\n"
               "    + gathering the rows/genes from that CSR in C\n", full_kept.seconds, T);
    if (o.csr) {
        struct stat st;
        if (stat(o.csr, &st) == 0)
            printf("  CSR copy: %s, %.1f MB (IVCSR file: %.1f MB stored packed indices)\n", o.csr,
                   (double)st.st_size / 1e6, mb(info->stored_bytes));
    }

    /* Every way of computing a case must give the same matrix. */
    int mismatches = 0, checked_ad = 0, checked_mem = 0;
    for (int i = 0; i < n_rows; i++) {
        const struct case_row *c = &rows[i];
        char key[64];
        snprintf(key, sizeof key, "%s%s", c->sel->name, c->genes ? "_genes" : "");
        const struct result *r = &c->cold;
        int same_cw = c->warm.nnz == r->nnz && c->warm.hash == r->hash && c->warm.sum == r->sum;
        int same_sub = !c->have_subset || (c->subset.nnz == r->nnz && c->subset.hash == r->hash &&
                                           c->subset.sum == r->sum);
        const struct ad_result *a = NULL;
        for (int k = 0; k < n_ad; k++)
            if (strcmp(ad[k].name, key) == 0) a = &ad[k];
        int same_ad = !a || !a->have || (a->nnz == r->nnz && a->hash == r->hash && a->sum == r->sum);
        int same_mem = !a || !a->have_mem ||
                       (a->mem_nnz == r->nnz && a->mem_hash == r->hash && a->mem_sum == r->sum);
        checked_ad += a && a->have;
        checked_mem += a && a->have_mem;
        if (!same_cw || !same_sub || !same_ad || !same_mem) {
            mismatches++;
            printf("  MISMATCH %s: engine nnz %" PRId64 " sum %.17g hash %" PRIu64 "%s%s%s%s\n",
                   key, r->nnz, r->sum, r->hash, same_cw ? "" : "; cold != warm",
                   same_sub ? "" : "; full+subset differs", same_ad ? "" : "; anndata backed differs",
                   same_mem ? "" : "; anndata in memory differs");
        }
    }
    printf("  check: every case equal (nnz, value sum, index hash) cold = warm%s%s%s: %d mismatches\n",
           o.subset_baseline ? " = full+subset" : "", checked_ad ? " = ad backed" : "",
           checked_mem ? " = ad mem" : "", mismatches);

    printf("\n[ratios]\n");
    double full_warm = full[1][1].seconds;
    printf("  1%% random warm / full decode warm:   %.4f   (target <= 0.03)\n",
           rows[2].warm.seconds / full_warm);
    printf("  full decode MB/s per thread (%u thr): %.0f   (target >= 300)\n", T,
           mb(info->stream_bytes) / full_warm / (double)T);
    printf("  index build / bare zstd:             %s", bare_s > 0 ? "" : "-\n");
    if (bare_s > 0) printf("%.2f   (target <= 1.5)\n", index_s / bare_s);
    const struct ad_result *a1 = find_ad(ad, n_ad, "random_1pct");
    if (a1)
        printf("  anndata backed / 1%% random:          %.1fx cold, %.1fx warm   (target >= 10)\n",
               a1->seconds / rows[2].cold.seconds, a1->seconds / rows[2].warm.seconds);
    else printf("  anndata backed / 1%% random:          - (baseline not run)\n");

    print_sweep(&o, N, sw);

    for (int s = 0; s < 4; s++) free((void *)sels[s].obs.idx);
    free((void *)genes.idx);
    free(t_index);
    free(t_open);
    iv_dataset_close(ds);
    iv_pool_destroy(pool);
    return mismatches ? 1 : 0;
}
