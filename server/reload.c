/*
 * Reloads: the configured list read again and compared with the datasets
 * served; the loads they start are load.c's.
 *
 * Datasets are registry entries (registry.h) that each stream and load job
 * holds by reference, so that a reload (reload_start) can change the list
 * under running requests: an entry it drops lives until the last of them
 * ends, and a replacement loads beside the entry it replaces and is
 * swapped in, on the loop, only once it is ready.
 */
#include "srv_conn.h"
#include "srv_datasets.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A reload (SIGHUP, POST /v1/admin/reload, iv_server_request_reload).
 *
 * The settings are read afresh on the loop (a small file); a bad file is
 * refused whole and the datasets served stay as they are.  Then each
 * dataset of the new list is compared with the one served under its id:
 * the same settings and the same file identity (registry.h) keep the
 * entry; anything else loads a new entry on the workers.  A new entry for
 * a ready dataset waits beside it (the old one's `pending`) and is swapped
 * in by on_load_done when it is ready, so queries never see a half-loaded
 * dataset; one for a dataset that was not serving anyway (loading, failed)
 * takes its place at once.  Datasets no longer configured leave the list
 * at once and are freed when their last stream ends.  Connections are not
 * touched.  The reload is over when every load it started has come back;
 * then its summary is logged and sent to the admin request that asked.
 */

static void json_member(iv_buf_t *b, const char *id)
{
    if (b->len) iv_buf_puts(b, ",");
    iv_buf_json_str(b, id);
}

void reload_free(reload_t *op)
{
    iv_buf_free(&op->added);
    iv_buf_free(&op->removed);
    iv_buf_free(&op->reloaded);
    iv_buf_free(&op->failed);
    free(op);
}

static void reload_finish(server_t *s)
{
    reload_t *op = s->reload;
    s->reload = NULL;
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "{\"added\":[");
    iv_buf_append(&b, op->added.data, op->added.len);
    iv_buf_puts(&b, "],\"removed\":[");
    iv_buf_append(&b, op->removed.data, op->removed.len);
    iv_buf_puts(&b, "],\"reloaded\":[");
    iv_buf_append(&b, op->reloaded.data, op->reloaded.len);
    iv_buf_puts(&b, "],\"failed\":[");
    iv_buf_append(&b, op->failed.data, op->failed.len);
    iv_buf_printf(&b, "],\"unchanged\":%zu,\"seconds\":%.3f}", op->unchanged, now_s() - op->t0);
    iv_alog_event(&s->log, op->failed.len ? "warn" : "info", "reload (%s) done: %.*s", op->why,
                  b.oom ? 2 : (int)(b.len > 900 ? 900 : b.len), b.oom ? "{}" : b.data);
    if (op->waiter) {
        if (b.oom) reload_reply(s, op->waiter_lp, op->waiter, 503, "out_of_memory", "out of memory", NULL, NULL);
        else reload_reply(s, op->waiter_lp, op->waiter, 200, NULL, NULL, &b, "Cache-Control: no-store\r\n");
    }
    iv_buf_free(&b);
    reload_free(op);
    if (s->reload_again && !s->draining) {
        s->reload_again = 0;
        reload_start(s, "asked for during the last one", NULL, 0);
    }
}

/* One of the reload's loads came back (or the set-up ended). */
void reload_step(server_t *s)
{
    if (s->reload && --s->reload->waiting == 0) reload_finish(s);
}

/* The load's line in its reload's summary: added, reloaded or failed. */
void reload_note(reload_t *op, const job_t *j, const sds_t *d)
{
    if (d->state == DS_READY) {
        json_member(j->reloaded ? &op->reloaded : &op->added, d->conf->id);
        return;
    }
    if (op->failed.len) iv_buf_puts(&op->failed, ",");
    iv_buf_puts(&op->failed, "{\"id\":");
    iv_buf_json_str(&op->failed, d->conf->id);
    iv_buf_puts(&op->failed, ",\"error\":");
    iv_buf_json_str(&op->failed, d->err);
    iv_buf_puts(&op->failed, "}");
}

/* Refuses a reload: the log line, and the admin request's answer. */
static void reload_refuse(server_t *s, loop_t *wlp, uint64_t waiter, int status, const char *code,
                          const char *why, const char *msg)
{
    iv_alog_event(&s->log, "error", "reload (%s) refused: %s; the %zu datasets served are kept", why,
                  msg, s->reg.n);
    if (waiter)
        reload_reply(s, wlp, waiter, status, code, msg, NULL, status == 409 ? "Retry-After: 1\r\n" : NULL);
}

/* ---- the admin request's answer, on its own loop ------------------------ */

typedef struct reply {
    loop_t *lp;
    uint64_t id;
    int status;
    const char *code, *extra;   /* string constants */
    char msg[400];
    iv_buf_t body;              /* a 200's body */
} reply_t;

static void reply_deliver(server_t *s, void *arg)
{
    reply_t *r = arg;
    (void)s;
    conn_t *c = conn_by_id(r->lp, r->id);
    if (c && c->life_f.reload_wait && c->ans_f.active) {
        c->life_f.reload_wait = 0;
        if (r->status == 200) send_owned(c, 200, "application/json", &r->body, r->extra);
        else send_error(c, r->status, r->code, r->msg, r->extra);
    }
    iv_buf_free(&r->body);
    free(r);
}

void reload_reply(server_t *s, loop_t *lp, uint64_t id, int status, const char *code,
                  const char *msg, iv_buf_t *body, const char *extra)
{
    reply_t *r = calloc(1, sizeof *r);
    if (!r) return;  /* the request times out; the reload is logged */
    r->lp = lp;
    r->id = id;
    r->status = status;
    r->code = code;
    r->extra = extra;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    iv_buf_init(&r->body);
    if (body) {
        r->body = *body;
        iv_buf_init(body);
    }
    if (loop_call(lp, s, reply_deliver, r) != 0) {
        iv_buf_free(&r->body);
        free(r);
    }
}

static int strv_same(char *const *a, size_t na, char *const *b, size_t nb)
{
    if (na != nb) return 0;
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i], b[i])) return 0;
    return 1;
}

/* A reload applies the datasets and the readyz policy; the log names the
 * other settings that changed, which wait for the next start. */
static void note_restart_keys(server_t *s, const iv_config_t *nc)
{
    const iv_config_t *c = s->cfg;
    char keys[256] = "";
    struct {
        int changed;
        const char *key;
    } k[] = {
        {strcmp(c->listen, nc->listen) != 0, "listen"},
        {c->port != nc->port, "port"},
        {c->threads != nc->threads || c->queue != nc->queue, "threads/queue"},
        {c->cache_bytes != nc->cache_bytes, "cache_bytes"},
        {c->transpose_bytes != nc->transpose_bytes, "transpose_bytes"},
        {c->cache_max_age != nc->cache_max_age, "cache_max_age"},
        {c->gzip_level != nc->gzip_level, "gzip_level"},
        {!strv_same(c->cors_origins, c->n_cors, nc->cors_origins, nc->n_cors), "cors_origins"},
        {strcmp(c->log_format, nc->log_format) || strcmp(c->access_log, nc->access_log),
         "log_format/access_log"},
        {memcmp(&c->limits, &nc->limits, sizeof c->limits) != 0, "limits"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].changed)
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s", keys[0] ? ", " : "",
                     k[i].key);
    if (keys[0])
        iv_alog_event(&s->log, "warn", "reload: changed settings that take effect at the next "
                      "start: %s (a reload applies datasets and readyz)", keys);
}

/* Answers a reload that cannot start now: the server stops, one is
 * running (another then follows it, unless an admin request asked), or
 * there is nothing to read again.  1 when it was answered so. */
static int reload_not_now(server_t *s, const char *why, loop_t *wlp, uint64_t waiter)
{
    if (s->draining) {
        if (waiter)
            reload_reply(s, wlp, waiter, 503, "shutting_down", "the server is shutting down", NULL, NULL);
        return 1;
    }
    if (s->reload) {
        if (waiter) {
            reload_reply(s, wlp, waiter, 409, "reload_in_progress",
                         "a reload is running; retry when it ends", NULL, "Retry-After: 1\r\n");
            return 1;
        }
        s->reload_again = 1;
        iv_alog_event(&s->log, "info", "reload (%s): one is running; another follows it", why);
        return 1;
    }
    if (!s->reader) {
        reload_refuse(s, wlp, waiter, 409, "no_config_source", why,
                      "this server has no configuration source to read again");
        return 1;
    }
    return 0;
}

/* The reload's decision for one configured dataset. */
typedef struct plan {
    sds_t *fresh;     /* a new entry to load, or NULL: the served one is kept */
    int replace;      /* it waits beside a ready entry */
    int reloaded;     /* the id was served before */
} plan_t;

/* What a reload prepares before it changes anything: everything that can
 * fail is allocated first. */
typedef struct reload_prep {
    reload_t *op;
    sds_t **nv;       /* the new list */
    plan_t *pl;       /* a plan for each of its datasets */
    iv_auth_t na;     /* the tokens as the new configuration has them (its
                       * tokens file, its datasets' tokens), swapped in with
                       * the new list */
} reload_prep_t;

static void reload_prep_free(reload_prep_t *rp, size_t n)
{
    for (size_t i = 0; rp->pl && i < n; i++)
        if (rp->pl[i].fresh) iv_rds_unref(rp->pl[i].fresh);
    free(rp->pl);
    free(rp->nv);
    free(rp->op);
    iv_auth_free(&rp->na);
}

/* Whether the served entry cur (or its pending replacement) is dc's as
 * it is now: a failed dataset is tried again whatever changed. */
static int entry_current(const sds_t *cur, const iv_ds_conf_t *dc, const iv_path_id_t *fid,
                         const iv_path_id_t *cfid)
{
    const sds_t *latest = cur->pending ? cur->pending : cur;
    return latest->state != DS_FAILED && iv_ds_conf_equal(latest->conf, dc) &&
           iv_path_id_same(&latest->fid, fid) && iv_path_id_same(&latest->cfid, cfid);
}

/* Plans dataset dc: the served entry kept in *kept, or a new entry in
 * *pl.  -1 when out of memory. */
static int plan_dataset(server_t *s, const iv_ds_conf_t *dc, sds_t **kept, plan_t *pl)
{
    sds_t *cur = find_ds(s, dc->id, strlen(dc->id));
    iv_path_id_t fid, cfid;
    iv_path_id_read(dc->path, &fid);
    memset(&cfid, 0, sizeof cfid);
    if (dc->companion) iv_path_id_read(dc->companion, &cfid);
    if (cur && entry_current(cur, dc, &fid, &cfid)) {
        *kept = cur;
        return 0;
    }
    if (!(pl->fresh = iv_rds_new(dc))) return -1;
    pl->fresh->fid = fid;
    pl->fresh->cfid = cfid;
    pl->replace = cur && cur->state == DS_READY;
    pl->reloaded = cur != NULL;
    return 0;
}

/* Allocates and plans (see reload_prep_t); -1, with nothing kept, when
 * out of memory. */
static int reload_prepare(server_t *s, const iv_config_t *nc, reload_prep_t *rp)
{
    size_t n = nc->n_datasets;
    memset(rp, 0, sizeof *rp);
    rp->op = calloc(1, sizeof *rp->op);
    rp->nv = calloc(n ? n : 1, sizeof *rp->nv);
    rp->pl = calloc(n ? n : 1, sizeof *rp->pl);
    int ok = rp->op && rp->nv && rp->pl && iv_auth_build(&rp->na, nc) == 0;
    for (size_t i = 0; ok && i < n; i++) ok = plan_dataset(s, &nc->datasets[i], &rp->nv[i], &rp->pl[i]) == 0;
    if (ok) return 0;
    reload_prep_free(rp, n);
    return -1;
}

static void reload_op_start(server_t *s, reload_t *op, const char *why, loop_t *wlp, uint64_t waiter)
{
    op->gen = ++s->reload_gen;
    op->waiting = 1;
    op->waiter_lp = wlp;
    op->waiter = waiter;
    op->t0 = now_s();
    snprintf(op->why, sizeof op->why, "%s", why);
    iv_buf_init(&op->added);
    iv_buf_init(&op->removed);
    iv_buf_init(&op->reloaded);
    iv_buf_init(&op->failed);
    s->reload = op;
}

/* Places each planned entry in the new list: a kept one as it is, a
 * fresh one at once, a replacement as its served entry's pending one. */
static void place_entries(server_t *s, const iv_config_t *nc, reload_prep_t *rp)
{
    for (size_t i = 0; i < nc->n_datasets; i++) {
        plan_t *pl = &rp->pl[i];
        if (!pl->fresh) {
            rp->op->unchanged++;
            continue;
        }
        if (!pl->replace) {
            rp->nv[i] = pl->fresh;
            continue;
        }
        sds_t *cur = find_ds(s, nc->datasets[i].id, strlen(nc->datasets[i].id));
        if (cur->pending) {
            /* A replacement still loading is superseded: its load comes
             * back to nothing. */
            cur->pending->retired = 1;
            iv_rds_unref(cur->pending);
        }
        cur->pending = pl->fresh;  /* the entry holds the new one's reference */
        rp->nv[i] = cur;
    }
}

/* The new list in place; what left it is retired (freed when its last
 * request ends). */
static void install_list(server_t *s, sds_t **nv, size_t n, reload_t *op)
{
    sds_t **old = s->reg.v;
    size_t n_old = s->reg.n;
    s->reg.v = nv;
    s->reg.n = n;
    for (size_t k = 0; k < n_old; k++) {
        int kept = 0;
        for (size_t i = 0; i < n && !kept; i++) kept = nv[i] == old[k];
        if (kept) continue;
        if (!find_ds(s, old[k]->conf->id, strlen(old[k]->conf->id))) {
            json_member(&op->removed, old[k]->conf->id);
            iv_alog_event(&s->log, "info", "dataset %s removed; freed when its last request ends",
                          old[k]->conf->id);
        }
        ds_retire(s, old[k]);
    }
    free(old);
}

void reload_start(server_t *s, const char *why, loop_t *wlp, uint64_t waiter)
{
    if (reload_not_now(s, why, wlp, waiter)) return;
    iv_config_t nc;
    iv_config_init(&nc);
    iv_err_t err;
    iv_err_clear(&err);
    if (s->reader(s->reader_arg, &nc, &err) != 0) {
        reload_refuse(s, wlp, waiter, 422, "bad_config", why, err.msg[0] ? err.msg : "bad configuration");
        iv_config_free(&nc);
        return;
    }
    reload_prep_t rp;
    if (reload_prepare(s, &nc, &rp) != 0) {
        reload_refuse(s, wlp, waiter, 503, "out_of_memory", why, "out of memory");
        iv_config_free(&nc);
        return;
    }
    size_t n = nc.n_datasets;
    reload_t *op = rp.op;
    reload_op_start(s, op, why, wlp, waiter);
    s->readyz_any = nc.readyz_any;
    iv_auth_free(&s->auth);
    s->auth = rp.na;
    iv_alog_event(&s->log, "info", "reload (%s): %zu datasets configured", why, n);
    note_restart_keys(s, &nc);
    place_entries(s, &nc, &rp);
    install_list(s, rp.nv, n, op);
    for (size_t i = 0; i < n; i++)
        if (rp.pl[i].fresh) load_submit(s, rp.pl[i].fresh, op->gen, rp.pl[i].replace, rp.pl[i].reloaded);
    free(rp.pl);
    iv_config_free(&nc);
    reload_step(s);
}

void iv_server_request_reload(struct server *s, const char *why)
{
    reload_start(s, why, NULL, 0);
}

void iv_server_request_reload_async(struct server *s)
{
    atomic_store(&s->reload_asked, 1);
    uv_async_send(&s->loops[0].async);
}

void iv_server_mark_failed(struct server *s, struct iv_rds *d, const char *why)
{
    if (d->state != DS_READY) return;
    d->state = DS_FAILED;
    snprintf(d->err, sizeof d->err, "%s", why);
    iv_alog_event(&s->log, "error", "dataset %s (%s) failed: %s", d->conf->id, d->conf->path, why);
}
