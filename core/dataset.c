/*
 * Dataset: the HDF5 load, the stream with its cache, and the row index,
 * held together for the lifetime of the server (see dataset.h).
 */
#include "dataset.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset_impl.h"

void iv_dataset_opts_init(iv_dataset_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->group = "X";
    o->cache_bytes = (size_t)1 << 30;
}

/*
 * The cache arena faulted in ahead of the row-index pass: as soon as the
 * load knows the stream's extent, the arena is mapped and the pool's idle
 * workers write to its pages while this thread loads the pointer arrays
 * and the chunk table (single-threaded HDF5 work).  The pass then
 * decompresses into memory that is already there, instead of waiting on
 * the kernel to zero each page as it first touches it.
 */
#define PREFAULT_PARTS 16
#define PREFAULT_STEP ((size_t)2 << 20)

struct prefault;
struct prefault_part {
    struct prefault *pf;
    size_t from, to;
    int claimed;           /* (mu) by a job, or by the opener when it stops waiting */
};

/* On the heap: a job may run after the opener is done with the prefault
 * (the pool was busy); it then finds its part claimed and only lets go. */
struct prefault {
    iv_pool_t *pool;
    size_t budget;
    iv_stream_arena_t *arena;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    unsigned refs;         /* the opener + jobs queued (mu) */
    unsigned running;      /* parts being touched by jobs (mu) */
    unsigned n_parts;
    struct prefault_part parts[PREFAULT_PARTS];
};

static void prefault_unref(struct prefault *pf)
{
    pthread_mutex_lock(&pf->mu);
    unsigned left = --pf->refs;
    pthread_mutex_unlock(&pf->mu);
    if (left == 0) {
        pthread_cond_destroy(&pf->idle);
        pthread_mutex_destroy(&pf->mu);
        free(pf);
    }
}

static void prefault_touch(struct prefault *pf, const struct prefault_part *pp)
{
    for (size_t at = pp->from; at < pp->to && !atomic_load(&pf->stop); at += PREFAULT_STEP)
        iv_stream_arena_touch(pf->arena, at, at + PREFAULT_STEP < pp->to ? at + PREFAULT_STEP : pp->to);
}

static void prefault_job(void *arg)
{
    struct prefault_part *pp = arg;
    struct prefault *pf = pp->pf;
    pthread_mutex_lock(&pf->mu);
    int mine = !pp->claimed;
    pp->claimed = 1;
    if (mine) pf->running++;
    pthread_mutex_unlock(&pf->mu);
    if (mine) {
        prefault_touch(pf, pp);
        pthread_mutex_lock(&pf->mu);
        if (--pf->running == 0) pthread_cond_signal(&pf->idle);
        pthread_mutex_unlock(&pf->mu);
    }
    prefault_unref(pf);
}

static void prefault_start(void *ctx, uint64_t length, uint64_t chunk_len)
{
    struct prefault *pf = ctx;
    if (!pf || !pf->pool || pf->arena) return;
    pf->arena = iv_stream_arena_new(length, chunk_len, pf->budget);
    size_t bytes = iv_stream_arena_bytes(pf->arena);
    if (bytes == 0) return;
    unsigned n = iv_pool_threads(pf->pool);
    if (n > PREFAULT_PARTS) n = PREFAULT_PARTS;
    size_t per = (bytes / n + PREFAULT_STEP - 1) / PREFAULT_STEP * PREFAULT_STEP;
    for (unsigned i = 0; i < n && (size_t)i * per < bytes; i++) {
        struct prefault_part *pp = &pf->parts[pf->n_parts++];
        pp->pf = pf;
        pp->from = (size_t)i * per;
        pp->to = pp->from + per < bytes ? pp->from + per : bytes;
        pthread_mutex_lock(&pf->mu);
        pf->refs++;
        pthread_mutex_unlock(&pf->mu);
        if (iv_pool_try_submit(pf->pool, prefault_job, pp) != 0) {
            pthread_mutex_lock(&pf->mu);
            pf->refs--;
            pthread_mutex_unlock(&pf->mu);
            /* Queue full: the part stays unclaimed, for the opener. */
        }
    }
}

/*
 * The opener's end of the prefault.  Parts no job has started are taken
 * here: touched on this thread, or skipped when stop is set (the load
 * failed).  Then it waits for the parts jobs are touching (with stop, they
 * end at their next 2 MiB step), never for a job still queued, so it
 * cannot wait on a pool whose workers are all busy, itself included.
 * Returns the arena, which no job touches any more.
 */
static iv_stream_arena_t *prefault_finish(struct prefault *pf, int stop)
{
    if (!pf) return NULL;
    if (stop) atomic_store(&pf->stop, 1);
    for (unsigned i = 0; i < pf->n_parts; i++) {
        struct prefault_part *pp = &pf->parts[i];
        pthread_mutex_lock(&pf->mu);
        int mine = !pp->claimed;
        pp->claimed = 1;
        pthread_mutex_unlock(&pf->mu);
        if (mine && !stop) prefault_touch(pf, pp);
    }
    pthread_mutex_lock(&pf->mu);
    while (pf->running > 0) pthread_cond_wait(&pf->idle, &pf->mu);
    pthread_mutex_unlock(&pf->mu);
    iv_stream_arena_t *arena = pf->arena;
    prefault_unref(pf);
    return arena;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int iv_dataset_open(const char *path, const iv_dataset_opts_t *opts, iv_dataset_t **out,
                    iv_err_t *err)
{
    iv_dataset_opts_t defaults;
    if (!opts) {
        iv_dataset_opts_init(&defaults);
        opts = &defaults;
    }
    *out = NULL;
    double t0 = now_s();
    iv_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    snprintf(ds->group, sizeof ds->group, "%s", opts->group && *opts->group ? opts->group : "X");
    snprintf(ds->where, sizeof ds->where, "%s:/%s", ds->path, ds->group);

    size_t budget = opts->cache_bytes == (size_t)-1 ? (size_t)1 << 30 : opts->cache_bytes;
    struct prefault *pf = opts->pool ? calloc(1, sizeof *pf) : NULL;
    if (pf) {
        pf->pool = opts->pool;
        pf->budget = budget;
        pf->refs = 1;
        atomic_init(&pf->stop, 0);
        pthread_mutex_init(&pf->mu, NULL);
        pthread_cond_init(&pf->idle, NULL);
    }
    int rc = iv_h5matrix_load_notify(path, ds->group, prefault_start, pf, &ds->m, err);
    /* The pass then starts on memory that is there.  When the prefault
     * outlasts the load (2 MiB pages under memory pressure can take
     * reclaim and compaction), the load's time shows the wait: the pass
     * would have paid it anyway, page by page. */
    iv_stream_arena_t *arena = prefault_finish(pf, rc < 0);
    if (rc < 0) {
        iv_stream_arena_free(arena);
        goto fail_alloc;
    }

    char label[sizeof ds->where + 32];
    snprintf(label, sizeof label, "%s/packed_indices", ds->where);
    ds->m.stream.label = label;
    iv_stream_desc_t desc = ds->m.stream;
    /* The stream owns the chunk table and any owned buffer from here on. */
    memset(&ds->m.stream, 0, sizeof ds->m.stream);
    rc = iv_stream_create_in(&desc, budget, arena, &ds->stream, err);
    if (rc < 0) goto fail_matrix;
    double t1 = now_s();

    iv_rowindex_src_t src = {
        .s = ds->stream, .major_ptr = ds->m.major_ptr, .value_ptr = ds->m.value_ptr,
        .n_major = ds->m.n_major, .n_unique = ds->m.n_unique, .nnz = ds->m.nnz,
        .n_minor = ds->m.n_minor, .where = ds->where,
    };
    rc = iv_rowindex_build(&src, opts->index_stride, opts->pool, &ds->ri, err);
    if (rc < 0) goto fail_stream;
    double t2 = now_s();

    iv_dataset_info_t *in = &ds->info;
    in->path = ds->path;
    in->group = ds->group;
    in->orient = ds->m.orient;
    in->n_rows = ds->m.n_rows;
    in->n_cols = ds->m.n_cols;
    in->n_major = ds->m.n_major;
    in->n_minor = ds->m.n_minor;
    in->nnz = ds->m.nnz;
    in->n_unique = ds->m.n_unique;
    in->value_dtype = ds->m.value_dtype;
    in->indices_dtype = ds->m.indices_dtype;
    snprintf(in->codec, sizeof in->codec, "%s", ds->m.codec);
    in->chunked = desc.chunked;
    in->stream_bytes = iv_stream_length(ds->stream);
    in->stored_bytes = ds->m.stored_bytes;
    in->n_chunks = iv_stream_n_chunks(ds->stream);
    in->chunk_len = iv_stream_chunk_len(ds->stream);
    in->index_stride = ds->ri.stride;
    in->index_bytes = iv_rowindex_bytes(&ds->ri);
    in->open_seconds = t1 - t0;
    in->index_seconds = t2 - t1;
    *out = ds;
    return 0;

fail_stream:
    iv_stream_destroy(ds->stream);
fail_matrix:
    iv_h5matrix_free(&ds->m);
fail_alloc:
    free(ds);
    return rc;
}

void iv_dataset_close(iv_dataset_t *ds)
{
    if (!ds) return;
    iv_rowindex_free(&ds->ri);
    iv_stream_destroy(ds->stream);
    iv_h5matrix_free(&ds->m);
    free(ds);
}

const iv_dataset_info_t *iv_dataset_info(const iv_dataset_t *ds) { return &ds->info; }
const int64_t *iv_dataset_major_ptr(const iv_dataset_t *ds) { return ds->m.major_ptr; }
const int64_t *iv_dataset_value_ptr(const iv_dataset_t *ds) { return ds->m.value_ptr; }
const void *iv_dataset_values(const iv_dataset_t *ds) { return ds->m.values; }

int64_t iv_dataset_major_nnz(const iv_dataset_t *ds, int64_t i)
{
    return ds->m.value_ptr[ds->m.major_ptr[i + 1]] - ds->m.value_ptr[ds->m.major_ptr[i]];
}

void iv_dataset_cache_stats(iv_dataset_t *ds, iv_cache_stats_t *out)
{
    iv_stream_stats_t st;
    iv_stream_stats(ds->stream, &st);
    out->budget = st.budget;
    out->used = st.used;
    out->pinned_over_budget = st.pinned_over_budget;
    out->hits = st.hits;
    out->misses = st.misses;
    out->evictions = st.evictions;
    out->bytes_decompressed = st.bytes_decompressed;
}

void iv_dataset_cache_drop(iv_dataset_t *ds)
{
    iv_stream_drop_cache(ds->stream);
}
