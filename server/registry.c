/*
 * The dataset registry (see registry.h).
 *
 * Reference counts rather than a "quiesce, then swap" step: a reload must
 * not wait for the slowest stream (a whole-matrix download can take
 * minutes) and must not touch other connections, so an entry simply lives
 * as long as the last request or job that holds it.  Counts are atomic:
 * every event loop takes and drops references; the workers use an entry
 * only inside a job that holds one.
 */
#include "registry.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "encode.h"
#include "h5matrix.h"

static void mx_free(iv_rmx_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].ds) iv_dataset_close(v[i].ds);
        iv_meta_free(v[i].var_meta);
    }
    free(v);
}

iv_rds_t *iv_rds_new(const iv_ds_conf_t *conf)
{
    iv_rds_t *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    if (iv_ds_conf_copy(&d->conf_own, conf) != 0) {
        free(d);
        return NULL;
    }
    d->conf = &d->conf_own;
    d->state = IV_RDS_LOADING;
    atomic_init(&d->refs, 1);
    return d;
}

const char *iv_rds_path(const iv_rds_t *d)
{
    return d->served[0] ? d->served : d->conf->path;
}

void iv_rds_ref(iv_rds_t *d)
{
    atomic_fetch_add_explicit(&d->refs, 1, memory_order_relaxed);
}

int iv_rds_unref(iv_rds_t *d)
{
    if (!d || atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) > 1) return 0;
    if (d->pending) {
        /* A retired entry drops its replacement with it. */
        d->pending->retired = 1;
        iv_rds_unref(d->pending);
    }
    mx_free(d->mx, d->n_mx);
    iv_meta_free(d->meta);
    iv_vds_free(d->vx);
    if (d->ds) iv_dataset_close(d->ds);
    free(d->doc);
    if (d->pinned) iv_autopack_unpin(d->served);
    if (d->other_path[0]) iv_autopack_unpin(d->other_path);
    for (int i = 0; i < IV_N_COPIES; i++)
        if (d->copy[i].path[0]) iv_autopack_unpin(d->copy[i].path);
    for (int i = 0; i < 2; i++)
        if (d->zarr_path[i][0]) iv_autopack_unpin(d->zarr_path[i]);
    iv_ds_conf_free(&d->conf_own);
    free(d);
    return 1;
}

void iv_rds_retire(iv_rds_t *d)
{
    d->retired = 1;
    if (d->pending) {
        d->pending->retired = 1;
        iv_rds_unref(d->pending);
        d->pending = NULL;
    }
    iv_rds_unref(d);
}

/* ---- the other matrices of a dataset ----------------------------------- */

/* Opens one packed matrix e of the file into x, checking its shape
 * against X's; raw/X also loads raw/var.  IV_EUNSUPPORTED leaves x listed
 * as not servable (the caller goes on); other errors fail the load. */
static int mx_open(iv_rds_t *d, const iv_h5mx_entry_t *e, int raw_var,
                   const iv_dataset_opts_t *tmpl, iv_rmx_t *x, iv_err_t *err)
{
    const iv_dataset_info_t *xi = iv_dataset_info(d->ds);
    const char *path = iv_rds_path(d);
    int is_raw = !strcmp(e->name, "raw/X");
    iv_dataset_opts_t o = *tmpl;
    o.group = e->name;
    /* The dataset's cache cap applies to each matrix; its floor (what the
     * shared budget must leave it) stays X's alone, so that layers do not
     * multiply the reservation. */
    o.cache_floor = 0;
    int rc = iv_dataset_open(path, &o, &x->ds, err);
    if (rc == IV_EUNSUPPORTED) {
        snprintf(x->reason, sizeof x->reason, "%s", err->msg);
        iv_err_clear(err);
        return 0;
    }
    if (rc != 0) return rc;
    const iv_dataset_info_t *in = iv_dataset_info(x->ds);
    x->shape[0] = in->n_rows;
    x->shape[1] = in->n_cols;
    if (in->n_rows != xi->n_rows || (!is_raw && in->n_cols != xi->n_cols))
        return iv_fail(err, IV_EBAD_FILE, "%s: %s has shape (%" PRId64 ", %" PRId64 "), X (%" PRId64
                       ", %" PRId64 "): %s", path, e->name, in->n_rows, in->n_cols, xi->n_rows,
                       xi->n_cols, is_raw ? "raw/X must have X's cells" : "a layer must have X's shape");
    if (!is_raw) return 0;
    /* raw/X's genes: raw/var's rows, checked against raw/X's shape by the
     * metadata reader; without raw/var they are named 0..n-1. */
    x->raw_var = raw_var;
    rc = iv_meta_load_groups(path, "raw/X", NULL, "raw/var", &x->var_meta, err);
    if (rc == IV_EUNSUPPORTED) {
        /* The matrix serves without gene names (as X does without var). */
        iv_meta_free(x->var_meta);
        x->var_meta = NULL;
        iv_err_clear(err);
        return 0;
    }
    return rc;
}

int iv_rds_load_matrices(iv_rds_t *d, const iv_dataset_opts_t *tmpl, iv_err_t *err)
{
    iv_h5mx_list_t l;
    IV_TRY(iv_h5matrix_list(iv_rds_path(d), &l, err));
    iv_rmx_t *v = calloc(l.n ? l.n : 1, sizeof *v);
    if (!v) {
        iv_h5mx_list_free(&l);
        return iv_fail(err, IV_ENOMEM, "%s: out of memory", iv_rds_path(d));
    }
    int rc = 0;
    size_t n = 0;
    for (size_t i = 0; i < l.n && rc == 0; i++, n++) {
        const iv_h5mx_entry_t *e = &l.v[i];
        iv_rmx_t *x = &v[i];
        snprintf(x->name, sizeof x->name, "%s", e->name);
        snprintf(x->encoding, sizeof x->encoding, "%s", e->encoding);
        x->shape[0] = e->shape[0];
        x->shape[1] = e->shape[1];
        if (!e->packed) snprintf(x->reason, sizeof x->reason, "%s", e->reason);
        else rc = mx_open(d, e, l.raw_var, tmpl, x, err);
    }
    iv_h5mx_list_free(&l);
    if (rc != 0) {
        mx_free(v, n);
        return rc;
    }
    d->mx = v;
    d->n_mx = n;
    return 0;
}

static const iv_rmx_t *mx_find(const iv_rds_t *d, const char *name)
{
    for (size_t i = 0; i < d->n_mx; i++)
        if (!strcmp(d->mx[i].name, name)) return &d->mx[i];
    return NULL;
}

int iv_rds_matrix(const iv_rds_t *d, const char *name, iv_dataset_t **ds, iv_meta_t **var_meta,
                  iv_err_t *err)
{
    if (!name || !strcmp(name, "X")) {
        *ds = d->ds;
        *var_meta = d->meta;
        return 0;
    }
    const iv_rmx_t *x = mx_find(d, name);
    if (!x) {
        /* The names a client could have meant: every matrix, servable or not. */
        char list[256];
        size_t at = (size_t)snprintf(list, sizeof list, "X");
        for (size_t i = 0; i < d->n_mx && at < sizeof list; i++)
            at += (size_t)snprintf(list + at, sizeof list - at, ", %s", d->mx[i].name);
        if (at >= sizeof list) snprintf(list + sizeof list - 5, 5, "...");
        return iv_fail(err, IV_EUNKNOWN_MATRIX, "no matrix '%.120s' in dataset '%.80s'; available: %s",
                       name, d->conf->id, list);
    }
    if (!x->ds)
        return iv_fail(err, IV_EUNSERVABLE, "matrix '%s' is not servable: %.300s", x->name,
                       x->reason);
    *ds = x->ds;
    *var_meta = x->var_meta ? x->var_meta : !strcmp(x->name, "raw/X") ? NULL : d->meta;
    return 0;
}

int iv_rds_matrix_shape(void *ctx, const char *name, int64_t *n_obs, int64_t *n_var,
                        iv_err_t *err)
{
    iv_dataset_t *ds;
    iv_meta_t *vm;
    IV_TRY(iv_rds_matrix(ctx, name, &ds, &vm, err));
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    *n_obs = in->n_rows;
    *n_var = in->n_cols;
    return 0;
}

const char *iv_rds_matrix_name(void *ctx, size_t i)
{
    const iv_rds_t *d = ctx;
    return i < d->n_mx ? d->mx[i].name : NULL;
}

static void put_matrix(iv_buf_t *b, const char *name, iv_dataset_t *ds)
{
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    iv_buf_puts(b, "{\"name\":");
    iv_buf_json_str(b, name);
    iv_buf_printf(b, ",\"shape\":[%" PRId64 ",%" PRId64 "],\"nnz\":%" PRId64
                  ",\"orientation\":\"%s\",\"dtype\":\"%s\",\"stream_bytes\":%" PRIu64
                  ",\"index_bytes\":%zu,\"servable\":true",
                  in->n_rows, in->n_cols, in->nnz, in->orient == IV_IVCSR ? "ivcsr" : "ivcsc",
                  iv_wire_dtype_name(in->value_dtype), in->stream_bytes, in->index_bytes);
}

void iv_rds_matrices_doc(iv_buf_t *b, const iv_rds_t *d)
{
    iv_buf_puts(b, ",\"matrices\":[");
    put_matrix(b, "X", d->ds);
    iv_buf_puts(b, ",\"primary\":true}");
    for (size_t i = 0; i < d->n_mx; i++) {
        const iv_rmx_t *x = &d->mx[i];
        iv_buf_puts(b, ",");
        if (x->ds) {
            put_matrix(b, x->name, x->ds);
        } else {
            iv_buf_puts(b, "{\"name\":");
            iv_buf_json_str(b, x->name);
            iv_buf_puts(b, ",\"shape\":");
            if (x->shape[0] >= 0 && x->shape[1] >= 0)
                iv_buf_printf(b, "[%" PRId64 ",%" PRId64 "]", x->shape[0], x->shape[1]);
            else
                iv_buf_puts(b, "null");
            iv_buf_puts(b, ",\"servable\":false,\"reason\":");
            iv_buf_json_str(b, x->reason);
        }
        iv_buf_puts(b, ",\"encoding\":");
        iv_buf_json_str(b, x->encoding);
        if (!strcmp(x->name, "raw/X"))
            iv_buf_puts(b, x->raw_var ? ",\"var\":\"raw/var\"" : ",\"var\":null");
        iv_buf_puts(b, "}");
    }
    iv_buf_puts(b, "]");
}

void iv_rds_matrices_memory(const iv_rds_t *d, iv_dataset_memory_t *m, size_t *meta_bytes,
                            uint64_t *evictions)
{
    for (size_t i = 0; i < d->n_mx; i++) {
        const iv_rmx_t *x = &d->mx[i];
        if (x->ds) {
            iv_dataset_memory_t dm;
            iv_dataset_memory(x->ds, &dm);
            m->pointers += dm.pointers;
            m->values += dm.values;
            m->index += dm.index;
            m->cache += dm.cache;
            m->stream += dm.stream;
            m->other += dm.other;
            m->scratch += dm.scratch;
            if (evictions) {
                iv_cache_stats_t cs;
                iv_dataset_cache_stats(x->ds, &cs);
                *evictions += cs.budget_evictions;
            }
        }
        if (x->var_meta && meta_bytes) {
            iv_meta_stats_t ms;
            iv_meta_stats(x->var_meta, &ms);
            *meta_bytes += ms.bytes;
        }
    }
}

void iv_rds_matrices_cache(const iv_rds_t *d, iv_cache_stats_t *cs)
{
    for (size_t i = 0; i < d->n_mx; i++) {
        if (!d->mx[i].ds) continue;
        iv_cache_stats_t m;
        iv_dataset_cache_stats(d->mx[i].ds, &m);
        cs->used += m.used;
        cs->hits += m.hits;
        cs->misses += m.misses;
    }
}

void iv_path_id_read(const char *path, iv_path_id_t *out)
{
    struct stat st;
    memset(out, 0, sizeof *out);
    if (stat(path, &st) != 0) return;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (int64_t)st.st_size;
    out->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
    out->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + (int64_t)st.st_ctim.tv_nsec;
    out->ok = 1;
}

int iv_path_id_same(const iv_path_id_t *a, const iv_path_id_t *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

iv_rds_t *iv_registry_find(const iv_registry_t *r, const char *id, size_t n)
{
    for (size_t i = 0; i < r->n; i++)
        if (strlen(r->v[i]->conf->id) == n && !memcmp(r->v[i]->conf->id, id, n)) return r->v[i];
    return NULL;
}

void iv_registry_count(const iv_registry_t *r, iv_registry_counts_t *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < r->n; i++) {
        switch (r->v[i]->state) {
        case IV_RDS_READY: out->ready++; break;
        case IV_RDS_LOADING: out->loading++; break;
        case IV_RDS_FAILED: out->failed++; break;
        }
    }
}

int iv_registry_ready(const iv_registry_t *r, int any)
{
    iv_registry_counts_t c;
    iv_registry_count(r, &c);
    return any ? c.ready > 0 : c.ready == r->n;
}

void iv_registry_free(iv_registry_t *r)
{
    for (size_t i = 0; i < r->n; i++) iv_rds_retire(r->v[i]);
    free(r->v);
    r->v = NULL;
    r->n = 0;
}
