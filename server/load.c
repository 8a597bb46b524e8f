/*
 * Datasets loading on the workers, and the documents that describe them.
 *
 * load_run opens a dataset's matrix, its metadata and its viewer arrays
 * on a worker (HDF5 calls take turns when the library is not
 * thread-safe) and renders the dataset document there too, so that the
 * loop only installs a finished entry (reload.c, on_load_done).
 * other_run then builds or attaches the other orientation and renders the
 * document again.  The document's matrix members are proto/'s
 * (enc_dataset.h), which the dataset list and the count answer share; its
 * memory member is rendered per request, since a cache's size changes
 * with every query.
 */
#include "server_impl.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachedir.h"
#include "enc_dataset.h"
#include "routes_meta.h"

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
                               to_ivcsc, &d->other_pack, &s->stopping, path, sizeof path, &built,
                               &j->err);
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

void other_run(job_t *j)
{
    sds_t *d = j->ds;
    const iv_config_t *cfg = j->srv->cfg;
    int plan = other_plan(j->srv, d);
    char dir[4096];
    iv_config_cache_dir(cfg, dir, sizeof dir);
    if (plan == OTHER_DISK) {
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        o.cache_bytes = d->conf->cache_bytes >= 0 ? (size_t)d->conf->cache_bytes : (size_t)-1;
        o.membudget = j->srv->mb;
        o.pool = j->srv->pool;
        o.index_dir = dir;
        o.index_min_bytes = keep_min_bytes();
        j->rc = other_from_disk(j, &o);
    } else if (plan == OTHER_COMPANION) {
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        o.index_dir = dir;
        o.index_min_bytes = keep_min_bytes();
        o.group = d->conf->companion_group;
        o.cache_bytes = d->conf->cache_bytes >= 0 ? (size_t)d->conf->cache_bytes : (size_t)-1;
        o.membudget = j->srv->mb;
        o.pool = j->srv->pool;
        j->rc = iv_dataset_attach_other(d->ds, d->conf->companion, &o, &j->err);
    } else {
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
void warm_run(job_t *j)
{
    sds_t *d = j->ds;
    if (d->meta) j->rc = iv_meta_warm(d->meta, &j->err);
    iv_vds_warm(d->vx);
}

void load_run(job_t *j)
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
