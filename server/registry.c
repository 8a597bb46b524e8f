/*
 * The dataset registry (see registry.h).
 *
 * Reference counts rather than a "quiesce, then swap" step: a reload must
 * not wait for the slowest stream (a whole-matrix download can take
 * minutes) and must not touch other connections, so an entry simply lives
 * as long as the last request or job that holds it.  Counts are plain
 * integers because only the loop thread takes and drops references; the
 * workers use an entry only inside a job that holds one.
 */
#include "registry.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    d->refs = 1;
    return d;
}

void iv_rds_ref(iv_rds_t *d)
{
    d->refs++;
}

void iv_rds_unref(iv_rds_t *d)
{
    if (!d || --d->refs > 0) return;
    if (d->pending) {
        /* A retired entry drops its replacement with it. */
        d->pending->retired = 1;
        iv_rds_unref(d->pending);
    }
    iv_meta_free(d->meta);
    iv_vds_free(d->vx);
    if (d->ds) iv_dataset_close(d->ds);
    free(d->doc);
    iv_ds_conf_free(&d->conf_own);
    free(d);
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

void iv_path_id_read(const char *path, iv_path_id_t *out)
{
    struct stat st;
    memset(out, 0, sizeof *out);
    if (stat(path, &st) != 0) return;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (int64_t)st.st_size;
    out->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
    out->ok = 1;
}

int iv_path_id_same(const iv_path_id_t *a, const iv_path_id_t *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns;
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
