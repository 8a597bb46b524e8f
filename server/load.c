/*
 * Datasets loading, and the documents that describe them: the load,
 * warm and other-orientation jobs, both halves.
 *
 * load_run opens a dataset's matrix, its metadata and its viewer arrays
 * on a worker (HDF5 calls take turns when the library is not
 * thread-safe) and renders the dataset document there too, so that the
 * loop only installs a finished entry (on_load_done, which also swaps a
 * reload's replacement in and tells the reload, reload.c).  warm_run
 * then builds the names lookups ahead of their first use, and other_run
 * builds or attaches the other orientation and renders the document
 * again.  The document's matrix members are proto/'s
 * (enc_dataset.h), which the dataset list and the count answer share; its
 * memory member is rendered per request, since a cache's size changes
 * with every query.
 */
#include "srv_datasets.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_qstream.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "enc_dataset.h"
#include "meta_doc.h"

/* The smallest stream whose row index and arrays are kept in the cache
 * folder (indexfile.h): IV_OTHER_MEMORY_MAX, below which the pass and the
 * reads cost less than the files; IVSERVE_KEEP_MIN_BYTES sets another
 * (the tests keep a small dataset's). */
static size_t keep_min_bytes(void)
{
    const char *v = getenv("IVSERVE_KEEP_MIN_BYTES");
    char *end;
    unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
    return v && *v && *end == '\0' ? (size_t)n : (size_t)IV_OTHER_MEMORY_MAX;
}

/* Drops a reference to a dataset; the last one of a dataset a reload
 * took out of service frees it, and the log says so (its memory is
 * back). */
void ds_unref(server_t *s, sds_t *d)
{
    if (!d) return;
    char what[400] = "";
    if (d->retired && d->ds) snprintf(what, sizeof what, "%s released (%s)", d->conf->id, d->conf->path);
    if (iv_rds_unref(d) && what[0]) iv_alog_event(&s->log, "info", "dataset %s", what);
}

/* Takes d out of service (registry.h); freed now or by the last request. */
void ds_retire(server_t *s, sds_t *d)
{
    if (d->pending) {
        d->pending->retired = 1;
        ds_unref(s, d->pending);
        d->pending = NULL;
    }
    d->retired = 1;
    ds_unref(s, d);
}

/* ---- dataset loading (worker) ------------------------------------------ */

/* A ready dataset's memory now, by part. */
void ds_memory(const sds_t *d, iv_metrics_ds_mem_t *m)
{
    memset(m, 0, sizeof *m);
    m->id = d->conf->id;
    iv_dataset_memory_t dm;
    iv_dataset_memory(d->ds, &dm);
    /* Layers and raw/X count in the same parts; raw/var as metadata. */
    size_t mx_meta = 0;
    iv_rds_matrices_memory(d, &dm, &mx_meta, &m->budget_evictions);
    m->part[IV_MEM_METADATA] = mx_meta;
    m->part[IV_MEM_POINTERS] = dm.pointers;
    m->part[IV_MEM_VALUES] = dm.values;
    m->part[IV_MEM_INDEX] = dm.index;
    m->part[IV_MEM_CACHE] = dm.cache;
    m->part[IV_MEM_STREAM] = dm.stream;
    m->part[IV_MEM_OTHER] = dm.other;
    m->part[IV_MEM_SCRATCH] = dm.scratch;
    if (d->meta) {
        iv_meta_stats_t ms;
        iv_meta_stats(d->meta, &ms);
        m->part[IV_MEM_METADATA] += ms.bytes;
    }
    iv_vds_memory(d->vx, &m->part[IV_MEM_OBSM], &m->part[IV_MEM_SEARCH]);
    for (int csr = 0; csr < 2; csr++) m->zarr_kept[csr] = iv_vds_zarr_kept(d->vx, csr);
    iv_cache_stats_t cs;
    iv_dataset_cache_stats(d->ds, &cs);
    m->budget_evictions += cs.budget_evictions;
}

/* ,"memory":{...}: what the dataset holds now, by part, and its cache's
 * limits (cap null: only the shared budget). */
void put_memory(iv_buf_t *b, const sds_t *d)
{
    iv_metrics_ds_mem_t m;
    ds_memory(d, &m);
    iv_cache_stats_t cs;
    iv_dataset_cache_stats(d->ds, &cs);
    size_t total = 0;
    iv_buf_puts(b, ",\"memory\":{");
    for (int p = 0; p < IV_MEM_N; p++) {
        iv_buf_printf(b, "\"%s\":%zu,", iv_mem_part_name((iv_mem_part_t)p), m.part[p]);
        total += m.part[p];
    }
    iv_buf_printf(b, "\"total\":%zu,\"cache_floor\":%zu,\"cache_budget\":%zu,\"cache_cap\":", total,
                  cs.floor, cs.shared_budget);
    if (cs.budget == SIZE_MAX) iv_buf_puts(b, "null");
    else iv_buf_printf(b, "%zu", cs.budget);
    iv_buf_printf(b, ",\"cache_budget_evictions\":%" PRIu64 "}", m.budget_evictions);
}

static void render_doc(sds_t *d, iv_buf_t *b);

void build_doc(sds_t *d)
{
    iv_buf_t b;
    iv_buf_init(&b);
    render_doc(d, &b);
    if (b.oom) {
        iv_buf_free(&b);
        return;
    }
    snprintf(d->etag, sizeof d->etag, "\"%016" PRIx64 "\"", fnv1a(b.data, b.len));
    d->doc = iv_buf_steal(&b, &d->doc_len);
}

static void render_doc(sds_t *d, iv_buf_t *b0)
{
    iv_buf_t b = *b0;
    iv_enc_ds_summary(&b, d->conf->id, d->conf->title, iv_dataset_info(d->ds), 1);
    iv_enc_orientations(&b, d->ds, d->other_path[0] != 0);
    iv_enc_file_state(&b, d->ds);
    iv_rds_matrices_doc(&b, d);
    for (int ax = 0; ax < 2; ax++) {
        iv_buf_puts(&b, ax == 0 ? ",\"obs\":" : ",\"var\":");
        if (!d->meta) {
            iv_buf_puts(&b, "null");
            continue;
        }
        iv_rmeta_schema(&b, d->meta, ax == 0 ? IV_AXIS_OBS : IV_AXIS_VAR);
    }
    iv_vds_doc(&b, d->vx);
    iv_buf_puts(&b, "}");
    *b0 = b;
}

/* The other orientation of a ready dataset, on a worker: the companion
 * file when configured, else a copy built in memory under the budgets
 * (the dataset's transpose_bytes, or the global one, and what is left of
 * the global).  The document is rendered again for the loop to install. */
int other_plan(const server_t *s, const sds_t *d)
{
    const iv_config_t *cfg = s->cfg;
    if (d->conf->companion) return OTHER_COMPANION;
    int64_t tb = d->conf->transpose_bytes >= 0 ? d->conf->transpose_bytes
                                                : (int64_t)cfg->transpose_bytes;
    if (cfg->other_orientation == IV_OTHER_DISK) return OTHER_DISK;
    if (cfg->other_orientation == IV_OTHER_AUTO && d->ds &&
        iv_dataset_info(d->ds)->stream_bytes > IV_OTHER_MEMORY_MAX)
        return OTHER_DISK;
    return tb > 0 ? OTHER_MEMORY : OTHER_NONE;
}

/* The other orientation from the cache folder: packed there now when it
 * is not there yet (autopack.h), then attached as a companion is. */
static int other_from_disk(job_t *j, const iv_dataset_opts_t *o)
{
    sds_t *d = j->ds;
    server_t *s = j->srv;
    int to_ivcsc = iv_dataset_info(d->ds)->orient == IV_IVCSR, built = 0;
    char path[sizeof d->other_path];
    /* The pack passes over the whole stream once per window of output
     * slices that fits its memory (about 4 s a pass at ten million cells
     * on 16 cores).  While it runs it borrows three quarters of the chunk
     * caches' part (evicted down to the rest) and half of the in-memory
     * copies' part as far as no copy holds it (the rest stays for the
     * small datasets' copies), one build at a time, so that a
     * first start takes a few passes instead of many: at 8 GiB and ten
     * million cells the builds' own part alone makes 34 windows. */
    size_t lend = 0;
    uint64_t copies = 0;
    int lending = !atomic_exchange(&s->lending, 1);
    if (lending) {
        lend = s->mem.cache / 4 * 3;
        for (copies = s->mem.copies / 2; copies >= ((uint64_t)64 << 20); copies /= 2)
            if (iv_budget_take(&s->transpose_left, copies) == 0) break;
        if (copies < ((uint64_t)64 << 20)) copies = 0;
        iv_membudget_set_bytes(s->mb, s->mem.cache - lend);
        iv_autopack_set_memory(s->mem.builds + lend + (size_t)copies);
        atomic_store(&s->lent, lend);
        atomic_store(&s->lent_copies, (size_t)copies);
    }
    int rc = iv_autopack_other(s->cfg, &s->log, d->conf->id, iv_rds_path(d), d->conf->group,
                               to_ivcsc, iv_dataset_plain_path(d->ds), &d->other_pack, &s->stopping,
                               path, sizeof path, &built, &j->err);
    if (lending) {
        iv_autopack_set_memory(s->mem.builds);
        iv_membudget_set_bytes(s->mb, s->mem.cache);
        if (copies) iv_budget_give(&s->transpose_left, copies);
        atomic_store(&s->lent, 0);
        atomic_store(&s->lent_copies, 0);
        atomic_store(&s->lending, 0);
    }
    if (rc != 0) return rc;
    /* Pinned by iv_autopack_other; unpinned with the entry. */
    snprintf(d->other_path, sizeof d->other_path, "%s", path);
    iv_dataset_opts_t oo = *o;
    oo.group = "X";
    return iv_dataset_attach_other(d->ds, path, &oo, &j->err);
}

/* The options of a file opened beside a dataset (its other orientation,
 * its plain copy): the dataset's cache cap in the shared budget, the
 * pool, the cache folder for kept indexes. */
static void beside_opts(const job_t *j, const char *dir, iv_dataset_opts_t *o)
{
    iv_dataset_opts_init(o);
    o->cache_bytes = j->ds->conf->cache_bytes >= 0 ? (size_t)j->ds->conf->cache_bytes : (size_t)-1;
    o->membudget = j->srv->mb;
    o->pool = j->srv->pool;
    o->index_dir = dir;
    o->index_min_bytes = keep_min_bytes();
}

/* Whether d's cell queries get a plain copy to read (plainfile.h): asked
 * for, or, by default, when its compressed stream is larger than the
 * chunk caches' part of the budget (a random cell then mostly misses the
 * cache) and large enough for the cache folder. */
static int plain_wanted(const server_t *s, const sds_t *d)
{
    if (!d->ds || s->cfg->plain_copy == IV_PLAIN_OFF || !iv_dataset_plain_wanted(d->ds)) return 0;
    uint64_t len = iv_dataset_info(d->ds)->stream_bytes;
    return s->cfg->plain_copy == IV_PLAIN_ON || (len > s->mem.cache && len >= keep_min_bytes());
}

/* Whether d's cell queries get a wide copy to read (widefile.h): asked
 * for, or, by default, when its stream is large enough for the cache
 * folder; either way only for a matrix of at most 65,536 genes. */
static int wide_wanted(const server_t *s, const sds_t *d)
{
    if (!d->ds || s->cfg->wide_copy == IV_PLAIN_OFF || !iv_dataset_wide_wanted(d->ds)) return 0;
    return s->cfg->wide_copy == IV_PLAIN_ON || iv_dataset_info(d->ds)->stream_bytes >= keep_min_bytes();
}

/* A copy of a dataset's kept in the cache folder, as copy_run takes it:
 * the kinds in the order they are made (COPIES). */
struct copy_kind {
    int slot;                                 /* its d->copy[] (IV_COPY_*) */
    const char *name;                         /* for the log */
    int (*wanted)(const server_t *s, const sds_t *d);
    const char *(*path)(iv_dataset_t *ds);    /* the published copy's, or NULL */
    int (*use)(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, iv_err_t *err);
    const char *without;                      /* what cell queries do without it */
};

static const struct copy_kind COPIES[IV_N_COPIES] = {
    {IV_COPY_PLAIN, "plain copy of its stream", plain_wanted, iv_dataset_plain_path, iv_dataset_use_plain,
     "cell queries read the compressed stream"},
    {IV_COPY_WIDE, "wide copy of its indices", wide_wanted, iv_dataset_wide_path, iv_dataset_use_wide,
     "cell queries decode the packed stream"},
};

/* Whether d gets any of the copies. */
static int copy_wanted(const server_t *s, const sds_t *d)
{
    for (int i = 0; i < IV_N_COPIES; i++)
        if (COPIES[i].wanted(s, d)) return 1;
    return 0;
}

/* The plain copy, then the wide copy: a kept one is taken before the
 * other orientation (the pack then reads the plain copy as its replica);
 * one is written only after, so that the other orientation, and the
 * disk's write-back of the gene-major copy, come first (at ten million
 * cells on 16 cores the plain copy's write-back slowed the pack by 6-14
 * s); the wide copy last, as it decodes the plain copy.  The outcome waits
 * in d->copy[].note for the loop's log; the path taken is pinned in
 * d->copy[].path. */
static void copy_run(job_t *j, const struct copy_kind *k, const char *dir, int write)
{
    sds_t *d = j->ds;
    char *note = d->copy[k->slot].note, *pinned = d->copy[k->slot].path;
    note[0] = '\0';
    if (!k->wanted(j->srv, d) || k->path(d->ds)) return;
    iv_dataset_opts_t o;
    beside_opts(j, dir, &o);
    o.stop = &j->srv->stopping;
    iv_err_t e;
    iv_err_clear(&e);
    double t0 = now_s();
    int rc = k->use(d->ds, &o, write, &e);
    if (rc < 0)
        snprintf(note, sizeof d->copy[0].note, "failed (%.500s); %s", e.msg, k->without);
    else if (rc > 0)
        snprintf(note, sizeof d->copy[0].note, "%s (%.2f s)", rc == 1 ? "kept" : "written", now_s() - t0);
    /* In use: no sweep of the folder removes it (unpinned with the entry). */
    const char *at = rc > 0 ? k->path(d->ds) : NULL;
    if (at && !pinned[0]) {
        snprintf(pinned, sizeof d->copy[0].path, "%s", at);
        iv_autopack_pin(pinned);
    }
}

static void other_run(job_t *j)
{
    sds_t *d = j->ds;
    const iv_config_t *cfg = j->srv->cfg;
    int plan = other_plan(j->srv, d);
    char dir[4096];
    iv_config_cache_dir(cfg, dir, sizeof dir);
    for (int i = 0; i < IV_N_COPIES; i++) copy_run(j, &COPIES[i], dir, 0);
    if (plan == OTHER_DISK) {
        iv_dataset_opts_t o;
        beside_opts(j, dir, &o);
        j->rc = other_from_disk(j, &o);
    } else if (plan == OTHER_COMPANION) {
        iv_dataset_opts_t o;
        beside_opts(j, dir, &o);
        o.group = d->conf->companion_group;
        j->rc = iv_dataset_attach_other(d->ds, d->conf->companion, &o, &j->err);
    } else if (plan == OTHER_MEMORY) {
        iv_transpose_opts_t to = {
            .budget = d->conf->transpose_bytes >= 0 ? (uint64_t)d->conf->transpose_bytes
                                                    : (uint64_t)cfg->transpose_bytes,
            .global = &j->srv->transpose_left,
            .pool = j->srv->pool,
            .phase_seconds = j->phase,
        };
        j->rc = iv_dataset_build_other(d->ds, &to, &j->err);
    }
    render_doc(d, &j->out);
}


/* The dataset's obs/var metadata, with its computed columns, kept in the
 * cache folder for the next start like the row index (metafile.h).
 * Without them the matrix serves without names (the reason is logged on
 * the loop); a damaged file is left out whole, as `ivserve check` fails
 * it. */
static void load_meta(job_t *j, const char *path, const char *dir)
{
    sds_t *d = j->ds;
    iv_err_t me;
    iv_err_clear(&me);
    /* Kept for the datasets whose row index is kept: those whose restart
     * is worth the disk. */
    int worth = iv_dataset_info(d->ds)->stream_bytes >= keep_min_bytes();
    iv_meta_keep_t keep = {.dir = worth ? dir : NULL};
    int rc = iv_meta_load_kept(path, d->conf->group, &keep, &d->meta, &me);
    snprintf(d->meta_note, sizeof d->meta_note, "%s", keep.note);
    if (rc == 0 && iv_meta_add_computed(d->meta, d->ds, j->srv->pool, &me) == 0)
        return;
    iv_meta_free(d->meta);
    d->meta = NULL;
    snprintf(d->err, sizeof d->err, "%s", me.msg);
    if (me.code == IV_EUNSUPPORTED) return;
    j->rc = me.code ? me.code : IV_EBAD_FILE;
    j->err = me;
    iv_dataset_close(d->ds);
    d->ds = NULL;
}

/* Builds, on a worker once the dataset serves, the obs names lookups a
 * load leaves to first use (iv_meta_warm, iv_vds_warm): at ten million
 * cells they take seconds, which would otherwise hold the dataset from
 * serving or fall on the first query by a cell's name. */
static void warm_run(job_t *j)
{
    sds_t *d = j->ds;
    if (d->meta) j->rc = iv_meta_warm(d->meta, &j->err);
    iv_vds_warm(d->vx);
}

static void load_run(job_t *j)
{
    sds_t *d = j->ds;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.group = d->conf->group;
    /* The process-wide budget, with this dataset's cap and floor. */
    o.cache_bytes = d->conf->cache_bytes >= 0 ? (size_t)d->conf->cache_bytes : (size_t)-1;
    o.cache_floor = (size_t)d->conf->cache_floor_bytes;
    o.membudget = j->srv->mb;
    /* The row-index pass and the cache prefault take the workers that are
     * free (nested: this job is one of them, and runs its share). */
    o.pool = j->srv->pool;
    /* An ordinary .h5ad is served from its packed copy (autopack.h),
     * packed here first when the cache folder has none. */
    /* Row indexes of large matrices are kept in the cache folder for the
     * next start (indexfile.h); a folder that cannot be made costs the
     * pass. */
    char dir[4096];
    o.index_dir = iv_config_cache_dir(j->srv->cfg, dir, sizeof dir);
    o.index_min_bytes = keep_min_bytes();
    j->rc = iv_autopack_resolve(j->srv->cfg, &j->srv->log, d->conf->id, d->conf->path,
                                d->conf->group, &d->pack, &j->srv->stopping, d->served,
                                sizeof d->served, &j->err);
    if (j->rc != 0) return;
    d->pinned = strcmp(d->served, d->conf->path) != 0;  /* pinned by the resolve */
    const char *path = iv_rds_path(d);
    if (j->srv->h5_serial) pthread_mutex_lock(&j->srv->h5_mu);
    j->rc = iv_dataset_open(path, &o, &d->ds, &j->err);
    if (j->rc == 0) {
        load_meta(j, path, o.index_dir);
        /* Layers and raw/X: datasets of their own, X stays the primary. */
        if (j->rc == 0 && (j->rc = iv_rds_load_matrices(d, &o, &j->err)) != 0) {
            iv_meta_free(d->meta);
            d->meta = NULL;
            iv_dataset_close(d->ds);
            d->ds = NULL;
        }
        if (j->rc == 0) {
            d->vx = iv_vds_load(path, d->ds, d->meta);
            build_doc(d);
        }
    }
    if (j->srv->h5_serial) pthread_mutex_unlock(&j->srv->h5_mu);
}

/* ---- the load, warm and other jobs, back on the loop -------------------- */

static void on_other_done(job_t *j);

static void copy_job_run(job_t *j);

/* A dataset's other orientation, built or attached after it is ready,
 * then its copies in turn (copy_jobs[i] writes COPIES[i]); all end in
 * on_other_done. */
static const job_type_t other_job = {other_run, on_other_done};
static const job_type_t copy_jobs[IV_N_COPIES] = {{copy_job_run, on_other_done}, {copy_job_run, on_other_done}};

/* A copy written after the other orientation (copy_run), each in a job of
 * its own, so that the document says the orientation, and each copy, is
 * ready as soon as it is. */
static void copy_job_run(job_t *j)
{
    char dir[4096];
    iv_config_cache_dir(j->srv->cfg, dir, sizeof dir);
    copy_run(j, &COPIES[j->type - copy_jobs], dir, 1);
    render_doc(j->ds, &j->out);
}

/* The start-up loads are over: how many datasets serve and how many were
 * left out, so that a failure is not read as "all loaded". */
static void log_start_loads(server_t *s)
{
    size_t ready = 0, failed = 0;
    char names[256] = "";
    size_t nl = 0;
    for (size_t i = 0; i < s->reg.n; i++) {
        const sds_t *d = s->reg.v[i];
        if (d->state == DS_READY) {
            ready++;
        } else if (d->state == DS_FAILED) {
            failed++;
            if (nl < sizeof names)
                nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", failed > 1 ? ", " : "",
                                       d->conf->id);
        }
    }
    if (failed == 0)
        iv_alog_event(&s->log, "info", "all datasets loaded: %zu of %zu", ready, ready);
    else
        iv_alog_event(&s->log, "warn", "%zu of %zu datasets loaded, %zu failed (%s%s)", ready,
                      ready + failed, failed, names, nl >= sizeof names ? "..." : "");
}

/* The load's outcome in d's state, and its log line. */
static void take_load_result(server_t *s, job_t *j, sds_t *d)
{
    if (j->rc != 0) {
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "%s", j->err.msg);
        iv_alog_event(&s->log, "error", "dataset %s (%s) %s: %s", d->conf->id, d->conf->path,
                      j->replace ? "not reloaded, the one loaded before keeps serving" : "left out",
                      j->err.msg);
        return;
    }
    if (!d->doc) {
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "out of memory");
        iv_alog_event(&s->log, "error", "dataset %s left out: out of memory", d->conf->id);
        return;
    }
    d->state = DS_READY;
    const iv_dataset_info_t *in = iv_dataset_info(d->ds);
    if (!d->meta)
        iv_alog_event(&s->log, "warn", "dataset %s: metadata not loaded, names selections disabled: %s",
                  d->conf->id, d->err);
    iv_alog_event(&s->log, "info",
              "dataset %s %s: %" PRId64 " x %" PRId64 ", nnz %" PRId64 ", %s, %s, %.2f s "
              "(open %.2f s, row index %s %.2f s%s%s%s%s)",
              d->conf->id, j->reloaded ? "reloaded" : "ready", in->n_rows, in->n_cols, in->nnz,
              in->orient == IV_IVCSR ? "ivcsr" : "ivcsc", in->codec, j->secs, in->open_seconds,
              in->index_kept ? "read from the cache folder in" : "pass", in->index_seconds,
              in->arrays_note[0] ? "; pointer arrays " : "", in->arrays_note,
              d->meta ? "; metadata " : "", d->meta ? d->meta_note : "");
}

/* A replacement takes its old entry's place when ready; when it failed,
 * the old one keeps serving and says why. */
static void replace_entry(server_t *s, sds_t *d)
{
    sds_t *old = NULL;
    size_t at = 0;
    for (size_t i = 0; i < s->reg.n && !old; i++)
        if (s->reg.v[i]->pending == d) old = s->reg.v[at = i];
    if (!old) {
        d->retired = 1;
        return;
    }
    old->pending = NULL;  /* its reference passes to the list, or is dropped */
    if (d->state == DS_READY) {
        s->reg.v[at] = d;
        ds_retire(s, old);
    } else {
        snprintf(old->reload_err, sizeof old->reload_err, "%s", d->err);
        d->retired = 1;
        iv_rds_unref(d);
    }
}

/* Cell queries are served meanwhile; the other orientation joins when it
 * is ready (see other_run).  The job keeps its reference; NULL when it
 * went on as the other job, else j, to be freed. */
static job_t *start_other(server_t *s, job_t *j, sds_t *d)
{
    int plan = d->state == DS_READY ? other_plan(s, d) : OTHER_NONE;
    if (d->state != DS_READY || d->retired || s->draining ||
        (plan == OTHER_NONE && !copy_wanted(s, d)))
        return j;
    j->type = &other_job;
    j->rc = 0;
    if (plan != OTHER_NONE) iv_dataset_set_other_state(d->ds, IV_OTHER_BUILDING);
    if (job_submit_server(j) == 0) return NULL;
    if (plan != OTHER_NONE) iv_dataset_set_other_state(d->ds, IV_OTHER_FAILED);
    return j;
}

/* ---- X's Zarr chunks kept (api/zarr_kept.h) ------------------------------ */

static void install_doc(sds_t *d, job_t *j);

/* Whether d's Zarr X chunks are to be kept in the cache folder: a
 * matrix of at most zarr_keep_entries stored entries, none kept yet. */
static int zarr_wanted(const server_t *s, const sds_t *d)
{
    return d->state == DS_READY && d->ds && d->vx && !d->retired && !s->draining &&
           s->cfg->zarr_keep_entries > 0 && iv_dataset_info(d->ds)->nnz <= s->cfg->zarr_keep_entries &&
           !d->zarr_path[0][0] && !d->zarr_path[1][0];
}

/* The keep's memory comes out of the answers' share (answer_wait.c), as
 * a query's working set does, for the keep's whole run: as many chunks at
 * a time as the share gives now, from IV_ZARR_SAVE_WIDTH of the pool down
 * to one, taken only while no query waits for the share.  When not even
 * one chunk's is there it waits a tick at a time (the share comes back as
 * answers end) until the server stops.  The bytes taken and *width; 0
 * when none, with why in note: more than the whole share, or the server
 * stopping. */
static uint64_t zarr_reserve(job_t *j, size_t *width, char *note, size_t cap)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    size_t threads = (size_t)iv_pool_threads(s->pool);
    uint64_t least = iv_vds_keep_zarr_bytes(d->vx, d->ds, threads, 1);
    if (least > s->mem.answers) {
        snprintf(note, cap, "csr and csc: failed (the keep needs %" PRIu64 " bytes at least, more than the "
                 "%zu bytes the memory budget gives answers being computed)", least, s->mem.answers);
        return 0;
    }
    while (!atomic_load(&s->stopping)) {
        for (size_t w = IV_ZARR_SAVE_WIDTH(threads); w >= 1; w /= 2) {
            uint64_t need = iv_vds_keep_zarr_bytes(d->vx, d->ds, threads, w);
            if (answer_take_now(s, need) == 0) {
                *width = w;
                return need;
            }
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    snprintf(note, cap, "csr and csc: not kept (the server is stopping)");
    return 0;
}

/* Both orientations' chunks kept (or taken) and served from then on;
 * the outcome waits in d->zarr_note for the loop's log. */
static void zarr_run(job_t *j)
{
    sds_t *d = j->ds;
    char dir[4096];
    size_t width = 0;
    double t0 = now_s();
    uint64_t held = zarr_reserve(j, &width, d->zarr_note, sizeof d->zarr_note);
    if (!held) {
        d->zarr_made[0][0] = d->zarr_made[1][0] = '\0';
        render_doc(d, &j->out);
        return;
    }
    iv_zarr_keep_in_t in = {.dir = iv_config_cache_dir(j->srv->cfg, dir, sizeof dir), .path = iv_rds_path(d),
                            .stop = &j->srv->stopping, .pool = j->srv->pool, .width = width};
    iv_zarr_keep_out_t out;
    iv_vds_keep_zarr(d->vx, d->ds, &in, &out);
    iv_budget_give(&j->srv->answers_left, held);
    for (int i = 0; i < 2; i++) {
        snprintf(d->zarr_made[i], sizeof d->zarr_made[i], "%s", out.path[i]);
        if (out.path[i][0]) iv_autopack_pin(d->zarr_made[i]);  /* in use: no sweep removes it */
    }
    snprintf(d->zarr_note, sizeof d->zarr_note, "%s; %s; %.2f s; %zu chunk%s at a time, %" PRIu64 " bytes of "
             "the answers' memory reserved, %zu held by the parts", out.note[1], out.note[0], now_s() - t0, width,
             width == 1 ? "" : "s", held, out.held);
    render_doc(d, &j->out);
}

static void on_zarr_done(job_t *j)
{
    sds_t *d = j->ds;
    for (int i = 0; i < 2; i++) memcpy(d->zarr_path[i], d->zarr_made[i], sizeof d->zarr_path[i]);
    iv_alog_event(&j->srv->log, strstr(d->zarr_note, "failed") ? "warn" : "info",
                  "dataset %s: Zarr X chunks in the cache folder: %s", d->conf->id, d->zarr_note);
    install_doc(d, j);
    job_free(j);
}

static const job_type_t zarr_job = {zarr_run, on_zarr_done};

/* The last of a dataset's jobs after its load: X's Zarr chunks kept, when
 * wanted.  NULL when j went on as that job, else j, to be freed. */
static job_t *start_zarr(server_t *s, job_t *j, sds_t *d)
{
    if (!zarr_wanted(s, d)) return j;
    j->type = &zarr_job;
    j->rc = 0;
    iv_buf_free(&j->out);
    iv_buf_init(&j->out);
    return job_submit_server(j) == 0 ? NULL : j;
}

static void on_warm_done(job_t *j)
{
    if (j->rc != 0)
        iv_alog_event(&j->srv->log, "warn", "dataset %s: obs names not indexed ahead (%s); the "
                      "first lookup by name builds them", j->ds->conf->id, j->err.msg);
    job_free(j);
}

static const job_type_t warm_job = {warm_run, on_warm_done};

/* The names lookups a load leaves to first use, built on a worker while
 * the dataset serves (warm_run); skipped when out of memory. */
static void start_warm(server_t *s, sds_t *d)
{
    if (d->state != DS_READY || d->retired || s->draining || !d->meta) return;
    job_t *j = calloc(1, sizeof *j);
    if (!j) return;
    j->srv = s;
    j->type = &warm_job;
    j->ds = d;
    iv_rds_ref(d);
    if (job_submit_server(j) != 0) job_free(j);
}

static void on_load_done(job_t *j)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    s->n_loading--;
    take_load_result(s, j, d);
    if (j->replace && !d->retired) replace_entry(s, d);
    if (s->reload && j->gen == s->reload->gen) reload_note(s->reload, j, d);
    if (s->n_loading == 0 && j->gen == 0) log_start_loads(s);
    uint64_t gen = j->gen;
    start_warm(s, d);
    j = start_other(s, j, d);
    if (j) j = start_zarr(s, j, d);
    if (j) job_free(j);
    if (s->reload && gen == s->reload->gen) reload_step(s);
}

static const job_type_t load_job = {load_run, on_load_done};

/* Loads d on a worker; gen, replace and reloaded as in job_t.  The load
 * waits its turn however many client jobs are queued; only running out of
 * memory (or a stopping pool) fails it at once (on_load_done reports it). */
void load_submit(server_t *s, sds_t *d, uint64_t gen, int replace, int reloaded)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        /* Nothing can report it but the entry itself. */
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "out of memory");
        return;
    }
    j->srv = s;
    j->type = &load_job;
    j->ds = d;
    iv_rds_ref(d);
    j->gen = gen;
    j->replace = replace;
    j->reloaded = reloaded;
    s->n_loading++;
    if (s->reload && gen == s->reload->gen) s->reload->waiting++;
    iv_alog_event(&s->log, "info", "loading dataset %s from %s", d->conf->id, d->conf->path);
    int rc = job_submit_server(j);
    if (rc != 0) {
        j->rc = iv_fail(&j->err, rc, "cannot queue the load (%s); reload to retry", iv_error_message(rc));
        on_load_done(j);
    }
}

/* The other orientation's outcome, in one line of the log. */
static void log_other(server_t *s, sds_t *d, job_t *j, const iv_orient_status_t *st)
{
    const char *other = st->file_orient == IV_IVCSR ? "gene-major" : "cell-major";
    if (j->rc == 0 && st->other_source == IV_SRC_FILE && d->other_path[0])
        iv_alog_event(&s->log, "info", "dataset %s: %s orientation ready (on disk, %s, %zu bytes, "
                      "%.2f s; row index %s%s%s)", d->conf->id, other, d->other_path,
                      st->bytes[!st->file_orient], j->secs,
                      iv_dataset_info(iv_dataset_other(d->ds))->index_kept ? "kept" : "made",
                      iv_dataset_info(iv_dataset_other(d->ds))->arrays_note[0] ? "; pointer arrays " : "",
                      iv_dataset_info(iv_dataset_other(d->ds))->arrays_note);
    else if (j->rc == 0 && st->other_source == IV_SRC_FILE)
        iv_alog_event(&s->log, "info", "dataset %s: %s orientation ready (companion, %zu bytes, %.2f s)",
                      d->conf->id, other, st->bytes[!st->file_orient], j->secs);
    else if (j->rc == 0)
        iv_alog_event(&s->log, "info", "dataset %s: %s orientation ready (in memory, %zu bytes, %.2f s: "
                      "values %.2f, count %.2f, fill %.2f, encode %.2f, move %.2f, finish %.2f)",
                      d->conf->id, other, st->bytes[!st->file_orient], j->secs, j->phase[IV_TP_VALUES],
                      j->phase[IV_TP_COUNT], j->phase[IV_TP_FILL], j->phase[IV_TP_ENCODE],
                      j->phase[IV_TP_MOVE], j->phase[IV_TP_FINISH]);
    else
        iv_alog_event(&s->log, j->rc == IV_ETOO_LARGE ? "warn" : "error", "dataset %s: %s orientation %s: %s",
                  d->conf->id, other, j->rc == IV_ETOO_LARGE ? "skipped" : "failed", j->err.msg);
}

/* The document a job rendered, installed (the loop's). */
static void install_doc(sds_t *d, job_t *j)
{
    if (j->out.oom || !j->out.len) return;
    free(d->doc);
    snprintf(d->etag, sizeof d->etag, "\"%016" PRIx64 "\"", fnv1a(j->out.data, j->out.len));
    d->doc = iv_buf_steal(&j->out, &d->doc_len);
}

static void on_other_done(job_t *j)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    iv_orient_status_t st;
    iv_dataset_orientations(d->ds, &st);
    for (int i = 0; i < IV_N_COPIES; i++) {
        char *note = d->copy[i].note;
        if (note[0])
            iv_alog_event(&s->log, strncmp(note, "failed", 6) ? "info" : "warn", "dataset %s: %s %s",
                          d->conf->id, COPIES[i].name, note);
        note[0] = '\0';
    }
    /* A copy's job has no orientation to tell of. */
    if (j->type == &other_job && (st.other_state != IV_OTHER_NONE || j->rc != 0)) log_other(s, d, j, &st);
    install_doc(d, j);
    /* Then each copy after the one just written (all, after the other
     * orientation), in order, when it is wanted and none was kept. */
    for (int i = j->type == &other_job ? 0 : (int)(j->type - copy_jobs) + 1;
         i < IV_N_COPIES && !d->retired && !s->draining; i++) {
        if (!COPIES[i].wanted(s, d) || COPIES[i].path(d->ds)) continue;
        j->type = &copy_jobs[i];
        j->rc = 0;
        if (job_submit_server(j) == 0) return;
    }
    j = start_zarr(s, j, d);
    if (j) job_free(j);
}
