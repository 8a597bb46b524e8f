/*
 * Dataset: the HDF5 load, the stream with its cache, and the row index,
 * held together for the lifetime of the server (see dataset.h).
 */
#include "dataset.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cachedir.h"
#include "dataset_impl.h"
#include "indexfile.h"
#include "plainfile.h"
#include "widefile.h"
#include "transpose.h"
#include "clock.h"

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
#define PREFAULT_STEP ((size_t)2 << 20)

struct prefault {
    int skip;              /* a kept index will spare the pass: nothing to fault in */
    iv_pool_t *pool;
    size_t budget;
    iv_membudget_t *mb;
    size_t reserved;       /* bytes of mb reserved for the prefault */
    iv_stream_arena_t *arena;
    iv_pool_for_t *run;    /* 2 MiB steps of the arena, one item each */
    atomic_int stop;       /* the load failed: steps not yet begun are skipped */
};

static void prefault_step(void *arg, size_t i)
{
    struct prefault *pf = arg;
    if (!atomic_load(&pf->stop))
        iv_stream_arena_touch(pf->arena, i * PREFAULT_STEP, (i + 1) * PREFAULT_STEP);
}

static void prefault_start(void *ctx, uint64_t length, uint64_t chunk_len)
{
    struct prefault *pf = ctx;
    if (pf->skip || !pf->pool || pf->arena) return;
    pf->arena = iv_stream_arena_new(length, chunk_len, pf->budget);
    size_t bytes = iv_stream_arena_bytes(pf->arena);
    if (pf->mb) {
        /* Only what the shared budget has free now: faulting in memory
         * the cache would not be allowed to keep would only raise the
         * process's resident size.  The reservation keeps datasets that
         * load at the same time from each counting the same free bytes. */
        bytes = pf->reserved = iv_membudget_reserve(pf->mb, bytes);
    }
    if (bytes > 0)
        pf->run = iv_pool_for_start(pf->pool, (bytes + PREFAULT_STEP - 1) / PREFAULT_STEP,
                                    prefault_step, pf);
}

/* The opener's end: steps no worker has begun run here (skipped when the
 * load failed), then it waits for the steps being run, never for a job
 * still queued.  Returns the arena, which nothing touches any more. */
static iv_stream_arena_t *prefault_finish(struct prefault *pf, int stop)
{
    if (stop) atomic_store(&pf->stop, 1);
    iv_pool_for_finish(pf->run);
    return pf->arena;
}

/* dir/STEM-KEY.GROUP.WHAT (GROUP with '/' as '_'; WHAT "index" or
 * "arrays"): where the index or arrays of path's matrix group are kept.
 * -1 when the key cannot be taken. */
static int kept_path(const char *dir, const char *path, const char *group, const char *what,
                     char key[IV_CACHEDIR_KEY_LEN], char *out, size_t cap)
{
    char kind[300];
    iv_err_t e;
    iv_err_clear(&e);
    snprintf(kind, sizeof kind, "%s.%s", group, what);
    for (char *p = kind; *p; p++)
        if (*p == '/') *p = '_';
    if (iv_cachedir_key(path, key, &e) != 0 ||
        iv_cachedir_path(dir, path, key, kind, out, cap, &e) != 0) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

static void keep_index(const char *dir, const char *at, const char *path, const char *key,
                       const iv_indexfile_for_t *kf, const iv_stream_t *s, const iv_rowindex_t *ri)
{
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_cachedir_prepare(dir, &e) == 0 && iv_cachedir_note(at, path, key, &e) == 0)
        iv_indexfile_save(at, kf, s, ri, &e);
}

/* Where a dataset's index and arrays are kept between runs
 * (opts->index_dir). */
struct kept {
    char at[4400];                       /* "" when none is kept */
    char arrays_at[4400];                /* "" when none is kept */
    char key[IV_CACHEDIR_KEY_LEN];
    int skip_pass;                       /* the file exists: no pass expected */
};

/* The matrix's arrays go: unmapped when they are a kept file's, freed
 * with the rest of the load otherwise. */
static void release_matrix(iv_dataset_t *ds)
{
    if (ds->arrays.map) {
        ds->m.major_ptr = ds->m.value_ptr = NULL;
        ds->m.values = NULL;
        iv_arraysfile_unmap(&ds->arrays);
    }
    iv_h5matrix_free(&ds->m);
}

/* Why the kept arrays a do not fit the bare load in ds->m (they were
 * made for the same file and group, so only a file changed between the
 * header check and the load, or a bug, gets here); NULL when they fit
 * and the pointers pass the load's own checks. */
static const char *arrays_mismatch(iv_dataset_t *ds, const iv_arraysfile_t *a,
                                   const iv_file_id_t *was)
{
    const iv_h5matrix_t *m = &ds->m;
    const iv_file_id_t *now = iv_file_loaded_id(m->stream.file);
    if (now->dev != was->dev || now->ino != was->ino || now->size != was->size ||
        now->mtime_s != was->mtime_s || now->mtime_ns != was->mtime_ns)
        return "made for another file or matrix";
    if (a->n_major != (uint64_t)m->n_major || a->n_unique != (uint64_t)m->n_unique ||
        a->nnz != (uint64_t)m->nnz || a->value_dtype != (int)m->value_dtype)
        return "made for another shape";
    ds->m.major_ptr = a->major_ptr;
    ds->m.value_ptr = a->value_ptr;
    ds->m.values = a->values;
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_h5matrix_check_pointers(m, ds->where, &e) != 0) {
        ds->m.major_ptr = ds->m.value_ptr = NULL;
        ds->m.values = NULL;
        return "its pointers fail the load's checks";
    }
    return NULL;
}

/* The kept arrays' checksums, one block an item, on the pool's idle
 * workers while the reader process loads the rest. */
struct sums_check {
    const iv_arraysfile_t *a;
    atomic_int bad;
};

static void check_sum_block(void *arg, size_t i)
{
    struct sums_check *sc = arg;
    if (!atomic_load(&sc->bad) && !iv_arraysfile_check_block(sc->a, i)) atomic_store(&sc->bad, 1);
}

/*
 * The matrix: with kept arrays made for this file, a bare load (no arrays
 * cross from the reader process) while the pool checks their sums, and
 * the map adopted when the sums hold and the arrays fit; anything else
 * the whole load as before.  info.arrays_note says which and why.
 */
static int load_matrix(iv_dataset_t *ds, const char *path, const struct kept *k, iv_pool_t *pool,
                       struct prefault *pf, iv_err_t *err)
{
    const char *why = NULL;
    struct stat st;
    iv_indexfile_for_t af = {.group = ds->group};
    if (k->arrays_at[0] && stat(path, &st) == 0) {
        iv_file_id_of(&st, &af.file);
        int rc = iv_arraysfile_open(k->arrays_at, &af, &ds->arrays, &why, err);
        if (rc < 0) return rc;
        if (rc == 1) {
            struct sums_check sc = {.a = &ds->arrays};
            atomic_init(&sc.bad, 0);
            iv_pool_for_t *run = iv_pool_for_start(pool, ds->arrays.n_blocks, check_sum_block, &sc);
            rc = iv_h5matrix_load_bare(path, ds->group, prefault_start, pf, &ds->m, err);
            iv_pool_for_finish(run);
            if (rc < 0) {
                iv_arraysfile_unmap(&ds->arrays);
                return rc;
            }
            if (atomic_load(&sc.bad)) why = "damaged";
            else why = arrays_mismatch(ds, &ds->arrays, &af.file);
            if (!why) {
                ds->info.arrays_kept = 1;
                snprintf(ds->info.arrays_note, sizeof ds->info.arrays_note,
                         "mapped from the cache folder");
                return 0;
            }
            release_matrix(ds);
        }
    }
    if (k->arrays_at[0] && (!why || strcmp(why, "none kept") == 0))
        snprintf(ds->info.arrays_note, sizeof ds->info.arrays_note, "read (none kept)");
    else if (k->arrays_at[0])
        snprintf(ds->info.arrays_note, sizeof ds->info.arrays_note,
                 "read (kept arrays ignored: %s)", why);
    return iv_h5matrix_load_notify(path, ds->group, prefault_start, pf, &ds->m, err);
}

/*
 * The matrix loaded with the cache arena faulted in meanwhile, and the
 * stream made over it with the cache's budget.  A kept index (k) makes
 * no pass: the cache then fills as queries come, and faulting its arena
 * in now would only cost time and resident memory.  On failure nothing
 * is left allocated.
 */
/* A dataset's chunk cache cap: opts->cache_bytes, or by default none
 * but the shared budget's (1 GiB without one). */
static size_t cache_cap(const iv_dataset_opts_t *opts)
{
    if (opts->cache_bytes != (size_t)-1) return opts->cache_bytes;
    return opts->membudget ? SIZE_MAX : (size_t)1 << 30;
}

/* What a cache capped at cap can hold now: no more than the shared budget. */
static size_t cache_room(const iv_dataset_opts_t *opts, size_t cap)
{
    iv_membudget_t *mb = opts->membudget;
    return mb && iv_membudget_bytes(mb) < cap ? iv_membudget_bytes(mb) : cap;
}

static int open_stream(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                       const struct kept *k, int *chunked, iv_err_t *err)
{
    iv_membudget_t *mb = opts->membudget;
    size_t budget = cache_cap(opts);
    /* The arena is address space for at most what the cache may hold; its
     * pages are committed only as chunks land in them. */
    size_t arena_budget = cache_room(opts, budget);
    struct prefault pf = {.pool = opts->pool, .budget = arena_budget, .mb = mb, .skip = k->skip_pass};
    atomic_init(&pf.stop, 0);
    int rc = load_matrix(ds, path, k, opts->pool, &pf, err);
    /* The pass then starts on memory that is there.  When the prefault
     * outlasts the load (2 MiB pages under memory pressure can take
     * reclaim and compaction), the load's time shows the wait: the pass
     * would have paid it anyway, page by page. */
    iv_stream_arena_t *arena = prefault_finish(&pf, rc < 0);
    if (rc < 0) {
        if (mb) iv_membudget_unreserve(mb, pf.reserved);
        iv_stream_arena_free(arena);
        return rc;
    }
    if (!arena && ds->m.stream.chunked)
        arena = iv_stream_arena_new(ds->m.stream.length, ds->m.stream.chunk_len, arena_budget);

    char label[sizeof ds->where + 32];
    snprintf(label, sizeof label, "%s/packed_indices", ds->where);
    ds->m.stream.label = label;
    iv_stream_desc_t desc = ds->m.stream;
    *chunked = desc.chunked && !desc.file_contig;
    /* The stream owns the chunk table and any owned buffer from here on. */
    memset(&ds->m.stream, 0, sizeof ds->m.stream);
    rc = iv_stream_create_in(&desc, budget, arena, &ds->stream, err);
    /* The pass's chunks are charged as they come: the prefault's
     * reservation has done its work. */
    if (mb) iv_membudget_unreserve(mb, pf.reserved);
    if (rc < 0) {
        release_matrix(ds);
        return rc;
    }
    if (mb) iv_stream_join_budget(ds->stream, mb, opts->cache_floor);
    return 0;
}

/* The row-index pass, then the stream sealed with the checksums it took,
 * and the index kept for the next open when it may be (kf set). */
static int build_index(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                       const struct kept *k, const iv_indexfile_for_t *kf, iv_err_t *err)
{
    iv_rowindex_src_t src = {
        .s = ds->stream, .major_ptr = ds->m.major_ptr, .value_ptr = ds->m.value_ptr,
        .n_major = ds->m.n_major, .n_unique = ds->m.n_unique, .nnz = ds->m.nnz,
        .n_minor = ds->m.n_minor, .where = ds->where,
    };
    IV_TRY(iv_rowindex_build(&src, opts->index_stride, opts->pool, &ds->ri, err));
    /* The pass read every stored chunk and took its checksum; from here
     * on every read is checked against them (stream.h). */
    int rc = iv_stream_seal(ds->stream, err);
    if (rc < 0) {
        iv_rowindex_free(&ds->ri);
        return rc;
    }
    /* Kept for the next open; one that cannot be written costs that
     * open the pass again, nothing else. */
    if (k->at[0] && iv_stream_file(ds->stream) && iv_stream_length(ds->stream) >= opts->index_min_bytes)
        keep_index(opts->index_dir, k->at, path, k->key, kf, ds->stream, &ds->ri);
    return 0;
}

/* The arrays kept for the next open when the index may be (the same
 * size rule), unless they came from there; one that cannot be written
 * costs that open the arrays' read, nothing else.  kf: the index's key,
 * set when k->at is. */
static void keep_arrays(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                        const struct kept *k, const iv_indexfile_for_t *kf)
{
    if (ds->arrays.map) {
        iv_cachedir_touch(k->arrays_at);
        return;
    }
    if (!k->arrays_at[0] || !k->at[0] || !iv_stream_file(ds->stream) ||
        iv_stream_length(ds->stream) < opts->index_min_bytes)
        return;
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_cachedir_prepare(opts->index_dir, &e) == 0 &&
        iv_cachedir_note(k->arrays_at, path, k->key, &e) == 0)
        iv_arraysfile_save(k->arrays_at, kf, ds->m.major_ptr, ds->m.value_ptr, ds->m.values,
                           (int)ds->m.value_dtype, &e);
}

/* The row index: the kept one when it loads and fits, else the pass.
 * Returns 1 when kept, 0 when built, or a negative error. */
static int open_index(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                      const struct kept *k, iv_err_t *err)
{
    iv_indexfile_for_t kf;
    int kept = 0;
    if (k->at[0] && iv_stream_file(ds->stream)) {
        const iv_file_id_t *fid = iv_file_loaded_id(iv_stream_file(ds->stream));
        kf = (iv_indexfile_for_t){.file = *fid, .group = ds->group, .n_major = (uint64_t)ds->m.n_major,
                                  .n_unique = (uint64_t)ds->m.n_unique, .nnz = (uint64_t)ds->m.nnz,
                                  .stride = opts->index_stride};
        kept = iv_indexfile_load(k->at, &kf, ds->stream, &ds->ri, NULL, err);
        if (kept < 0) return kept;
    }
    if (kept) {
        iv_cachedir_touch(k->at);
    } else {
        IV_TRY(build_index(ds, path, opts, k, &kf, err));
    }
    keep_arrays(ds, path, opts, k, &kf);
    return kept;
}

static void fill_info(iv_dataset_t *ds, int chunked, int kept, double t0, double t1, double t2)
{
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
    snprintf(in->chunk_index, sizeof in->chunk_index, "%s", ds->m.chunk_index);
    in->chunked = chunked;
    in->stream_bytes = iv_stream_length(ds->stream);
    in->stored_bytes = ds->m.stored_bytes;
    in->n_chunks = iv_stream_n_chunks(ds->stream);
    in->chunk_len = iv_stream_chunk_len(ds->stream);
    in->index_stride = ds->ri.stride;
    in->index_bytes = iv_rowindex_bytes(&ds->ri);
    in->open_seconds = t1 - t0;
    in->index_seconds = t2 - t1;
    in->index_kept = kept;
}

/* The dataset's names: path, group (default X) and path:/group. */
static iv_dataset_t *dataset_alloc(const char *path, const char *group)
{
    iv_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    snprintf(ds->path, sizeof ds->path, "%s", path);
    snprintf(ds->group, sizeof ds->group, "%s", group && *group ? group : "X");
    snprintf(ds->where, sizeof ds->where, "%s:/%s", ds->path, ds->group);
    return ds;
}

/* In stages: the matrix and its stream (open_seconds), then the row
 * index, kept or built (index_seconds). */
int iv_dataset_open(const char *path, const iv_dataset_opts_t *opts, iv_dataset_t **out,
                    iv_err_t *err)
{
    iv_dataset_opts_t defaults;
    if (!opts) {
        iv_dataset_opts_init(&defaults);
        opts = &defaults;
    }
    *out = NULL;
    double t0 = iv_now_s();
    iv_dataset_t *ds = dataset_alloc(path, opts->group);
    if (!ds) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    struct kept k = {.at = "", .arrays_at = ""};
    struct stat kst;
    if (opts->index_dir &&
        kept_path(opts->index_dir, path, ds->group, "index", k.key, k.at, sizeof k.at) == 0) {
        k.skip_pass = stat(k.at, &kst) == 0;
        kept_path(opts->index_dir, path, ds->group, "arrays", k.key, k.arrays_at, sizeof k.arrays_at);
    }
    int chunked;
    int rc = open_stream(ds, path, opts, &k, &chunked, err);
    if (rc < 0) goto fail_alloc;
    double t1 = iv_now_s();
    int kept = open_index(ds, path, opts, &k, err);
    if (kept < 0) {
        rc = kept;
        goto fail_stream;
    }
    fill_info(ds, chunked, kept, t0, t1, iv_now_s());
    atomic_init(&ds->other, NULL);
    atomic_init(&ds->nnz_at, NULL);
    atomic_init(&ds->other_state, IV_OTHER_NONE);
    atomic_init(&ds->plain, NULL);
    atomic_init(&ds->plain_dropped, 0);
    atomic_init(&ds->wide, NULL);
    atomic_init(&ds->wide_dropped, 0);
    *out = ds;
    return 0;

fail_stream:
    iv_stream_destroy(ds->stream);
    release_matrix(ds);
fail_alloc:
    free(ds);
    return rc;
}

void iv_dataset_close(iv_dataset_t *ds)
{
    if (!ds) return;
    iv_dataset_close(atomic_load(&ds->other));
    iv_stream_destroy(atomic_load(&ds->plain));
    iv_stream_destroy(atomic_load(&ds->wide));
    if (ds->other_budget) iv_budget_give(ds->other_budget, ds->other_charged);
    free(atomic_load(&ds->nnz_at));
    iv_rowindex_free(&ds->ri);
    iv_stream_destroy(ds->stream);
    release_matrix(ds);
    free(ds);
}

const iv_dataset_info_t *iv_dataset_info(const iv_dataset_t *ds) { return &ds->info; }
const int64_t *iv_dataset_major_ptr(const iv_dataset_t *ds) { return ds->m.major_ptr; }
const int64_t *iv_dataset_value_ptr(const iv_dataset_t *ds) { return ds->m.value_ptr; }
const void *iv_dataset_values(const iv_dataset_t *ds) { return ds->m.values; }

iv_file_t *iv_dataset_file(const iv_dataset_t *ds)
{
    return ds->is_copy ? NULL : iv_stream_file(ds->stream);
}

iv_file_state_t iv_dataset_file_state(iv_dataset_t *ds, char *msg, size_t n)
{
    if (msg && n) msg[0] = '\0';
    iv_file_t *f = iv_dataset_file(ds);
    iv_file_state_t st = f ? iv_file_state(f, msg, n) : IV_FILE_OK;
    iv_dataset_t *o = iv_dataset_other(ds);
    iv_file_t *fo = o ? iv_dataset_file(o) : NULL;
    if (fo && iv_file_state(fo, NULL, 0) > st) st = iv_file_state(fo, msg, n);
    return st;
}

int iv_dataset_plain_wanted(const iv_dataset_t *ds)
{
    return !ds->is_copy && iv_stream_file(ds->stream) && ds->info.chunked &&
           iv_stream_chunk_len(ds->stream) > IV_PLAIN_CHUNK;
}

/* The cache a plain copy gets: capped like the dataset's own, and no
 * larger than the shared budget. */
static size_t plain_cache_bytes(const iv_dataset_opts_t *opts)
{
    return cache_room(opts, cache_cap(opts));
}

/* A copy of ds kept in the cache folder (the plain one or the wide one). */
struct kept_copy {
    const char *what;                 /* its kind, as in its name */
    _Atomic(iv_stream_t *) *slot;     /* where it is published */
    char *at;                         /* its path once published, sizeof ds->plain_at */
    iv_plainfile_for_t f;             /* what it must be made from */
    /* Writes it at `at`: 0 or a negative error. */
    int (*save)(iv_dataset_t *ds, const iv_dataset_opts_t *opts, const char *at, const iv_plainfile_for_t *f,
                iv_err_t *err);
};

static int save_plain(iv_dataset_t *ds, const iv_dataset_opts_t *opts, const char *at,
                      const iv_plainfile_for_t *f, iv_err_t *err)
{
    return iv_plainfile_save(at, f, ds->stream, opts->pool, opts->stop, err);
}

/* The wide copy decodes the plain copy when there is one: the same bytes,
 * read without decompressing. */
static int save_wide(iv_dataset_t *ds, const iv_dataset_opts_t *opts, const char *at,
                     const iv_plainfile_for_t *f, iv_err_t *err)
{
    return iv_widefile_save(at, f, ds, iv_dataset_read_stream(ds), opts->pool, opts->stop, err);
}

/* c written at `at` (its note first, so that a sweep knows it), then
 * opened: 0 with *s set, or a negative error. */
static int write_copy(iv_dataset_t *ds, const iv_dataset_opts_t *opts, const char *key, const char *at,
                      const struct kept_copy *c, iv_stream_t **s, iv_err_t *err)
{
    const char *why = NULL;
    IV_TRY(iv_cachedir_prepare(opts->index_dir, err));
    IV_TRY(iv_cachedir_note(at, ds->path, key, err));
    IV_TRY(c->save(ds, opts, at, &c->f, err));
    int rc = iv_plainfile_open(at, &c->f, IV_PLAIN_CHUNK, plain_cache_bytes(opts), s, &why, err);
    if (rc == 0)
        return iv_fail(err, IV_EIO, "%s: its %s copy %s was written but is not taken (%s)", ds->where, c->what,
                       at, why);
    return rc < 0 ? rc : 0;
}

/* c taken from the cache folder, or written there when `write`, and
 * published: iv_dataset_use_plain's returns. */
static int use_copy(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, const struct kept_copy *c,
                    iv_err_t *err)
{
    char key[IV_CACHEDIR_KEY_LEN], at[sizeof ds->plain_at];
    if (kept_path(opts->index_dir, ds->path, ds->group, c->what, key, at, sizeof at) != 0)
        return iv_fail(err, IV_EIO, "%s: no name for a %s copy in %s", ds->where, c->what, opts->index_dir);
    iv_stream_t *s = NULL;
    int kept = iv_plainfile_open(at, &c->f, IV_PLAIN_CHUNK, plain_cache_bytes(opts), &s, NULL, err);
    if (kept < 0 || (!kept && !write)) return kept;
    if (kept) iv_cachedir_touch(at);
    else IV_TRY(write_copy(ds, opts, key, at, c, &s, err));
    if (opts->membudget) iv_stream_join_budget(s, opts->membudget, 0);
    snprintf(c->at, sizeof ds->plain_at, "%s", at);
    atomic_store_explicit(c->slot, s, memory_order_release);
    return kept ? 1 : 2;
}

int iv_dataset_use_plain(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, iv_err_t *err)
{
    if (atomic_load(&ds->plain)) return 1;
    if (!iv_dataset_plain_wanted(ds) || !opts->index_dir)
        return iv_fail(err, IV_EUNSUPPORTED, "%s: a plain copy needs a stored, chunked stream "
                       "and a cache folder", ds->where);
    struct kept_copy c = {.what = "plain", .slot = &ds->plain, .at = ds->plain_at, .save = save_plain,
                          .f = {.file = *iv_file_loaded_id(iv_stream_file(ds->stream)), .group = ds->group,
                                .length = iv_stream_length(ds->stream)}};
    return use_copy(ds, opts, write, &c, err);
}

int iv_dataset_wide_wanted(const iv_dataset_t *ds)
{
    return !ds->is_copy && iv_stream_file(ds->stream) && ds->m.nnz > 0 && ds->m.n_minor <= IV_WIDE_MAX_MINOR;
}

int iv_dataset_use_wide(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, iv_err_t *err)
{
    if (atomic_load(&ds->wide)) return 1;
    if (!iv_dataset_wide_wanted(ds) || !opts->index_dir)
        return iv_fail(err, IV_EUNSUPPORTED, "%s: a wide copy needs a file's matrix of at most %d minor "
                       "elements and a cache folder", ds->where, IV_WIDE_MAX_MINOR);
    char group[sizeof ds->group + sizeof IV_WIDE_GROUP_SUFFIX];
    snprintf(group, sizeof group, "%s%s", ds->group, IV_WIDE_GROUP_SUFFIX);
    struct kept_copy c = {.what = "wide", .slot = &ds->wide, .at = ds->wide_at, .save = save_wide,
                          .f = {.file = *iv_file_loaded_id(iv_stream_file(ds->stream)), .group = group,
                                .length = 2 * (uint64_t)ds->m.nnz}};
    return use_copy(ds, opts, write, &c, err);
}

const char *iv_dataset_wide_path(iv_dataset_t *ds)
{
    return iv_dataset_wide_stream(ds) ? ds->wide_at : NULL;
}

/* The copy published in slot while it is sound: NULL when there is none,
 * it was dropped, or the source file changed (a changed source is read,
 * so that the query fails as it did).  A copy whose own file failed a
 * read's checks is dropped here: its file removed (the next start writes
 * it again), the source serving from then on. */
static iv_stream_t *sound_copy(iv_dataset_t *ds, _Atomic(iv_stream_t *) *slot, atomic_int *dropped,
                               const char *at)
{
    iv_stream_t *c = atomic_load_explicit(slot, memory_order_acquire);
    if (!c || atomic_load_explicit(dropped, memory_order_relaxed)) return NULL;
    if (iv_file_state(iv_stream_file(ds->stream), NULL, 0) == IV_FILE_CHANGED) return NULL;
    if (iv_file_state(iv_stream_file(c), NULL, 0) != IV_FILE_CHANGED) return c;
    if (!atomic_exchange(dropped, 1)) unlink(at);
    return NULL;
}

iv_stream_t *iv_dataset_wide_stream(iv_dataset_t *ds)
{
    return sound_copy(ds, &ds->wide, &ds->wide_dropped, ds->wide_at);
}

void iv_dataset_drop_wide(iv_dataset_t *ds) { (void)iv_dataset_wide_stream(ds); }

const char *iv_dataset_plain_path(iv_dataset_t *ds)
{
    return iv_dataset_read_stream(ds) != ds->stream ? ds->plain_at : NULL;
}

iv_stream_t *iv_dataset_read_stream(iv_dataset_t *ds)
{
    iv_stream_t *p = sound_copy(ds, &ds->plain, &ds->plain_dropped, ds->plain_at);
    return p ? p : ds->stream;
}

int64_t iv_dataset_major_nnz(const iv_dataset_t *ds, int64_t i)
{
    return ds->m.value_ptr[ds->m.major_ptr[i + 1]] - ds->m.value_ptr[ds->m.major_ptr[i]];
}

void iv_dataset_cache_stats(iv_dataset_t *ds, iv_cache_stats_t *out)
{
    iv_stream_stats_t st;
    iv_stream_stats(ds->stream, &st);
    out->budget = st.budget;
    out->shared_budget = st.shared_budget;
    out->floor = st.floor;
    out->budget_evictions = st.budget_evictions;
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

/* ---- the other orientation ---- */

iv_dataset_t *iv_dataset_other(const iv_dataset_t *ds)
{
    return atomic_load_explicit(&((iv_dataset_t *)ds)->other, memory_order_acquire);
}

void iv_dataset_set_other_state(iv_dataset_t *ds, iv_other_state_t st)
{
    atomic_store(&ds->other_state, (int)st);
}

/* The plain and wide copies' cached chunks (*used) and slots (*table). */
static void copies_bytes(iv_dataset_t *ds, size_t *used, size_t *table)
{
    iv_stream_t *copies[2] = {atomic_load(&ds->plain), atomic_load(&ds->wide)};
    *used = *table = 0;
    for (int k = 0; k < 2; k++)
        if (copies[k]) {
            iv_stream_stats_t st;
            iv_stream_stats(copies[k], &st);
            *used += st.used;
            *table += st.table_bytes;
        }
}

size_t iv_dataset_memory_of(iv_dataset_t *ds)
{
    const iv_h5matrix_t *m = &ds->m;
    size_t b = (size_t)(m->n_major + 1) * 8 + (size_t)(m->n_unique + 1) * 8 +
               (size_t)m->n_unique * iv_dtype_size(m->value_dtype) + iv_rowindex_bytes(&ds->ri);
    if (atomic_load(&ds->nnz_at)) b += (size_t)(m->n_major + 1) * 8;
    if (ds->is_copy) return b + (size_t)iv_stream_length(ds->stream);
    iv_stream_stats_t st;
    iv_stream_stats(ds->stream, &st);
    b += st.used;
    size_t used, table;
    copies_bytes(ds, &used, &table);
    return b + used + table;
}

void iv_dataset_memory(iv_dataset_t *ds, iv_dataset_memory_t *out)
{
    const iv_h5matrix_t *m = &ds->m;
    iv_stream_stats_t st;
    iv_stream_stats(ds->stream, &st);
    out->pointers = (size_t)(m->n_major + 1) * 8 + (size_t)(m->n_unique + 1) * 8;
    out->values = (size_t)m->n_unique * iv_dtype_size(m->value_dtype);
    out->index = iv_rowindex_bytes(&ds->ri) + st.table_bytes;
    out->cache = st.used;
    /* The plain and wide copies' slots count as index, their chunks as cache. */
    size_t used, table;
    copies_bytes(ds, &used, &table);
    out->index += table;
    out->cache += used;
    /* An in-memory copy's stream is a buffer of the copy's own (is_copy),
     * not one the stream owns. */
    out->stream = ds->is_copy ? (size_t)iv_stream_length(ds->stream) : st.owned_bytes;
    out->scratch = st.scratch_bytes;
    out->other = 0;
    iv_dataset_t *o = iv_dataset_other(ds);
    if (o) {
        iv_dataset_memory_t om;
        iv_dataset_memory(o, &om);
        out->other = om.pointers + om.values + om.index + om.cache + om.stream + om.other + om.scratch;
    }
}

void iv_dataset_orientations(iv_dataset_t *ds, iv_orient_status_t *out)
{
    memset(out, 0, sizeof *out);
    out->file_orient = ds->m.orient;
    out->bytes[ds->m.orient] = iv_dataset_memory_of(ds);
    out->stream_bytes[ds->m.orient] = iv_stream_length(ds->stream);
    if (atomic_load(&ds->plain)) out->plain = atomic_load(&ds->plain_dropped) ? 2 : 1;
    if (atomic_load(&ds->wide)) out->wide = atomic_load(&ds->wide_dropped) ? 2 : 1;
    iv_dataset_t *o = iv_dataset_other(ds);
    out->other_state = (iv_other_state_t)atomic_load(&ds->other_state);
    if (o) {
        out->other_state = IV_OTHER_READY;
        out->other_source = ds->other_source;
        out->other_seconds = ds->other_seconds;
        out->bytes[o->m.orient] = iv_dataset_memory_of(o);
        out->stream_bytes[o->m.orient] = iv_stream_length(o->stream);
    }
}

/* An order-free hash of a matrix's stored values: for every value group,
 * a mix of its value's bits, times its size, summed.  The sum does not
 * depend on the order, so blocks of groups are hashed on the pool and
 * their sums added (ten million cells hold tens of millions of groups in
 * each orientation). */
#define HASH_BLOCK ((int64_t)1 << 20)

struct value_hash_run {
    const iv_h5matrix_t *m;
    uint64_t *part;           /* one sum a block */
};

static void value_hash_block(void *arg, size_t b)
{
    const struct value_hash_run *r = arg;
    const iv_h5matrix_t *m = r->m;
    size_t esz = iv_dtype_size(m->value_dtype);
    int64_t lo = (int64_t)b * HASH_BLOCK;
    int64_t hi = lo + HASH_BLOCK < m->n_unique ? lo + HASH_BLOCK : m->n_unique;
    uint64_t h = 0;
    for (int64_t k = lo; k < hi; k++) {
        uint64_t x = 0;
        memcpy(&x, (const char *)m->values + (size_t)k * esz, esz);
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ULL;
        x ^= x >> 33;
        h += (x | 1) * (uint64_t)(m->value_ptr[k + 1] - m->value_ptr[k]);
    }
    r->part[b] = h;
}

/* 0 with *out set, or IV_ENOMEM. */
static int value_hash(const iv_h5matrix_t *m, iv_pool_t *pool, uint64_t *out)
{
    size_t nb = (size_t)((m->n_unique + HASH_BLOCK - 1) / HASH_BLOCK);
    struct value_hash_run r = {m, calloc(nb ? nb : 1, sizeof(uint64_t))};
    if (!r.part) return IV_ENOMEM;
    iv_pool_parallel_for(pool, nb, 0, value_hash_block, &r);
    uint64_t h = 0;
    for (size_t b = 0; b < nb; b++) h += r.part[b];
    free(r.part);
    *out = h;
    return 0;
}

/* Why matrix b is not the other orientation of a; NULL when it is. */
static const char *companion_mismatch(const iv_h5matrix_t *a, const iv_h5matrix_t *b,
                                      iv_pool_t *pool)
{
    if (a->orient == b->orient) return "it has the same orientation";
    if (a->n_rows != b->n_rows || a->n_cols != b->n_cols) return "the shapes differ";
    if (a->nnz != b->nnz) return "the nnz differ";
    if (a->value_dtype != b->value_dtype) return "the value dtypes differ";
    uint64_t ha, hb;
    if (value_hash(a, pool, &ha) != 0 || value_hash(b, pool, &hb) != 0)
        return "out of memory to compare the values";
    if (ha != hb) return "the stored values differ";
    return NULL;
}

int iv_dataset_attach_other(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                            iv_err_t *err)
{
    double t0 = iv_now_s();
    if (iv_dataset_other(ds) || ds->is_copy)
        return iv_fail(err, IV_EINVALID_ARG, "%s: the other orientation exists already", ds->where);
    iv_dataset_set_other_state(ds, IV_OTHER_BUILDING);
    iv_dataset_t *o = NULL;
    int rc = iv_dataset_open(path, opts, &o, err);
    if (rc < 0) goto fail;
    const char *what = companion_mismatch(&ds->m, &o->m, opts ? opts->pool : NULL);
    if (what) {
        rc = iv_fail(err, IV_EBAD_FILE, "companion %s is not the other orientation of %s: %s",
                     o->where, ds->where, what);
        iv_dataset_close(o);
        goto fail;
    }
    ds->other_source = IV_SRC_FILE;
    ds->other_seconds = iv_now_s() - t0;
    atomic_store_explicit(&ds->other, o, memory_order_release);
    iv_dataset_set_other_state(ds, IV_OTHER_READY);
    return 0;
fail:
    iv_dataset_set_other_state(ds, IV_OTHER_FAILED);
    return rc;
}
