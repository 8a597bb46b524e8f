/*
 * The routes: match_path() reads a request's path once, for dispatch(),
 * which calls the route's handler, and for route_precheck(), which makes
 * the same decisions on the headers alone (for Expect: 100-continue).
 * The bearer-token checks (auth.h) are answered here.  The handlers that
 * answer at once, on the loop, live here too (health, readiness, metrics,
 * OpenAPI, the dataset list and document, the admin reload); those whose
 * answer is computed on a worker are in routes_query.c.
 */
#include "srv_conn.h"
#include "srv_datasets.h"
#include "srv_loop.h"
#include "srv_respond.h"
#include "srv_routes.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "enc_dataset.h"
#include "openapi.h"
#include "routes_static.h"

/* ---- routes ------------------------------------------------------------- */

sds_t *find_ds(server_t *s, const char *id, size_t n)
{
    return iv_registry_find(&s->reg, id, n);
}

/* The answer to a query on a dataset that failed: 503, naming the failure
 * (paths shortened: the client is not shown where the files are), without
 * Retry-After, since only a reload changes it. */
static void failed_msg(const sds_t *d, char *out, size_t cap)
{
    char red[sizeof d->err];
    iv_http_redact_paths(red, sizeof red, d->err[0] ? d->err : "unknown error");
    snprintf(out, cap, "dataset '%.128s' failed to load: %.300s", d->conf->id, red);
}

/* The answer to a refusal of auth.h.  The message depends on the verdict
 * alone, never on the dataset, so that an unknown id and a protected one
 * answer the same bytes. */
static int auth_refuse(iv_auth_verdict_t v, rfail_t *f)
{
    f->extra = NULL;
    switch (v) {
    case IV_AUTH_OK:
        return 0;
    case IV_AUTH_MISSING:
        f->status = 401;
        f->code = "unauthorized";
        snprintf(f->msg, sizeof f->msg, "this resource needs an Authorization: Bearer token");
        f->extra = "WWW-Authenticate: Bearer realm=\"ivserve\"\r\n";
        break;
    case IV_AUTH_BAD_TOKEN:
        f->status = 401;
        f->code = "invalid_token";
        snprintf(f->msg, sizeof f->msg, "the bearer token is not valid");
        f->extra = "WWW-Authenticate: Bearer realm=\"ivserve\", error=\"invalid_token\"\r\n";
        break;
    case IV_AUTH_DENIED:
        f->status = 403;
        f->code = "forbidden";
        snprintf(f->msg, sizeof f->msg, "the token does not open this resource");
        break;
    }
    return -1;
}

static void note_token(char *out, const iv_auth_token_t *tok)
{
    if (out) snprintf(out, TOKNAME_BYTES, "%s", tok ? tok->name : "");
}

/* A dataset route's bearer check (d NULL or failed: the id names no
 * dataset that answers), in one place for dispatch and route_precheck. */
static int token_ok(server_t *s, const iv_http_req_t *r, const sds_t *d, rfail_t *f, char *tokname)
{
    const iv_auth_token_t *tok;
    const char *authz = r->hdr[IV_H_AUTHORIZATION];
    char qbuf[512];
    /* The Zarr store also takes ?token= (iv_auth_query_bearer). */
    if (!authz && r->path && strstr(r->path, "/zarr/")) authz = iv_auth_query_bearer(r->query, qbuf, sizeof qbuf);
    iv_auth_verdict_t v = iv_auth_dataset(&s->auth, authz, d ? d->conf->id : NULL, &tok);
    note_token(tokname, tok);
    return auth_refuse(v, f);
}

/* The dataset list's check: a bad token is refused; no token is refused
 * only when no dataset is public (the client needs one to see anything).
 * *tok: whose list it is. */
static int list_ok(server_t *s, const iv_http_req_t *r, rfail_t *f, const iv_auth_token_t **tok)
{
    *tok = NULL;
    if (s->auth.n == 0) return 0;
    iv_auth_verdict_t v = iv_auth_identify(&s->auth, r->hdr[IV_H_AUTHORIZATION], tok);
    if (v == IV_AUTH_MISSING) {
        for (size_t i = 0; i < s->reg.n; i++)
            if (!iv_auth_protected(&s->auth, s->reg.v[i]->conf->id)) v = IV_AUTH_OK;
    }
    return auth_refuse(v, f);
}

/* A route that needs a scope: /metrics (IV_SCOPE_METRICS, when
 * metrics_auth is on) and the admin routes (IV_SCOPE_ADMIN: POST
 * /v1/admin/reload answers through `if (scope_check(c, IV_SCOPE_ADMIN))
 * return;`).  0 when the request may proceed; otherwise an answer was
 * sent. */
static int scope_check(conn_t *c, unsigned scope)
{
    const iv_auth_token_t *tok;
    rfail_t f;
    memset(&f, 0, sizeof f);
    iv_auth_verdict_t v = iv_auth_scope(&c->srv->auth, c->req->hdr[IV_H_AUTHORIZATION], scope, &tok);
    note_token(c->tokname, tok);
    if (auth_refuse(v, &f) == 0) return 0;
    send_error(c, f.status, f.code, f.msg, f.extra);
    return -1;
}

/*
 * A request body in a content coding (Content-Encoding: gzip, br, ...)
 * would have to be decoded before its JSON is read, and no route decodes
 * one: RFC 9110 15.5.16 makes that 415, with Accept-Encoding naming the
 * coding that would do.  "identity" is no coding and passes.  0 when the
 * request may go on; otherwise *f says the answer.
 */
static int coding_refused(const iv_http_req_t *r, rfail_t *f)
{
    const char *ce = r->hdr[IV_H_CONTENT_ENCODING];
    for (const char *p = ce; p && *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ",");
        size_t k = n;
        while (k && (p[k - 1] == ' ' || p[k - 1] == '\t')) k--;
        if (k && !(k == 8 && !strncasecmp(p, "identity", 8))) {
            f->status = iv_error_status(IV_EMEDIA_TYPE);
            f->code = iv_error_code(IV_EMEDIA_TYPE);
            snprintf(f->msg, sizeof f->msg,
                     "Content-Encoding: %.*s is not accepted: send the request body without a "
                     "content coding", (int)(k > 60 ? 60 : k), p);
            f->extra = "Accept-Encoding: identity\r\n";
            return -1;
        }
        p += n;
    }
    return 0;
}

int method_ok(conn_t *c, int allow_post)
{
    int m = c->req->method;
    if (m == HTTP_GET || m == HTTP_HEAD || (allow_post && m == HTTP_POST)) return 1;
    char msg[128];
    snprintf(msg, sizeof msg, "%s is not allowed here", method_name(m));
    send_error(c, 405, "method_not_allowed", msg,
               allow_post ? "Allow: GET, HEAD, POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
    return 0;
}

/* One dataset's entry of the list: a ready one's summary, else its state
 * (loading, packing with progress, failed with the reason). */
static void put_list_entry(iv_buf_t *b, const sds_t *d)
{
    if (d->state == DS_READY && d->doc) {
        /* The dataset document minus the column lists keeps this short. */
        iv_enc_ds_summary(b, d->conf->id, d->conf->title, iv_dataset_info(d->ds), 0);
        iv_buf_puts(b, ",\"state\":\"ready\"");
    } else {
        iv_buf_puts(b, "{\"id\":");
        iv_buf_json_str(b, d->conf->id);
        iv_buf_puts(b, ",\"title\":");
        iv_buf_json_str(b, d->conf->title ? d->conf->title : d->conf->id);
        int packing = d->state == DS_LOADING && atomic_load(&d->pack.active);
        iv_buf_printf(b, ",\"ready\":false,\"state\":\"%s\"",
                      d->state == DS_FAILED ? "failed" : packing ? "packing" : "loading");
        if (packing) iv_autopack_progress_json(b, &d->pack);
        if (d->state == DS_FAILED) {
            char msg[480];
            failed_msg(d, msg, sizeof msg);
            iv_buf_puts(b, ",\"error\":");
            iv_buf_json_str(b, msg);
        }
    }
    /* A reload's replacement: loading beside this one, or failed
     * while this one kept serving. */
    if (d->pending) iv_buf_puts(b, ",\"reload\":\"loading\"");
    else if (d->reload_err[0]) {
        char red[sizeof d->reload_err];
        iv_http_redact_paths(red, sizeof red, d->reload_err);
        iv_buf_puts(b, ",\"reload_error\":");
        iv_buf_json_str(b, red);
    }
    iv_buf_puts(b, "}");
}

static void route_list(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0)) return;
    const iv_auth_token_t *tok;
    rfail_t f;
    memset(&f, 0, sizeof f);
    int refused = list_ok(s, c->req, &f, &tok);
    note_token(c->tokname, tok);
    if (refused) {
        send_error(c, f.status, f.code, f.msg, f.extra);
        return;
    }
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "{\"datasets\":[");
    int first = 1;
    for (size_t i = 0; i < s->reg.n; i++) {
        sds_t *d = s->reg.v[i];
        /* Each client sees only what it may read: a protected dataset's
         * id, title and shape are not shown to others. */
        if (!iv_auth_may_read(&s->auth, tok, d->conf->id)) continue;
        if (!first) iv_buf_puts(&b, ",");
        first = 0;
        put_list_entry(&b, d);
    }
    iv_buf_puts(&b, "]}");
    /* Each client has its own list: no shared cache may hand it to another. */
    send_owned(c, 200, "application/json", &b,
               s->auth.n ? "Cache-Control: private, no-cache\r\nVary: Authorization\r\n" : NULL);
}

static sds_t *ready_ds(conn_t *c, const char *id, size_t n)
{
    sds_t *d = find_ds(c->srv, id, n);
    snprintf(c->dsid, sizeof c->dsid, "%.*s", (int)(n > 128 ? 128 : n), id);
    /* The token first: an unknown id answers as a dataset the client may
     * not read would (auth.h), so ids cannot be probed. */
    rfail_t f;
    memset(&f, 0, sizeof f);
    if (token_ok(c->srv, c->req, d, &f, c->tokname)) {
        send_error(c, f.status, f.code, f.msg, f.extra);
        return NULL;
    }
    if (!d) {
        char msg[200];
        snprintf(msg, sizeof msg, "no dataset '%.*s'", (int)(n > 128 ? 128 : n), id);
        send_error(c, 404, "not_found", msg, NULL);
        return NULL;
    }
    if (d->state == DS_FAILED) {
        char msg[480];
        failed_msg(d, msg, sizeof msg);
        send_error(c, 503, "dataset_failed", msg, "Cache-Control: no-store\r\n");
        return NULL;
    }
    if (d->state == DS_LOADING) {
        if (atomic_load(&d->pack.active)) {
            char msg[200];
            snprintf(msg, sizeof msg, "the dataset is being packed from its ordinary .h5ad (%.0f%% "
                     "done; GET /v1/datasets shows its progress)",
                     atomic_load(&d->pack.permille) / 10.0);
            send_error(c, 503, "not_ready", msg, "Retry-After: 5\r\n");
            return NULL;
        }
        send_error(c, 503, "not_ready", "the dataset is still loading", "Retry-After: 1\r\n");
        return NULL;
    }
    return d;
}

static void route_doc(conn_t *c, sds_t *d)
{
    if (!method_ok(c, 0)) return;
    /* The document as built at load, with its memory member rendered now
     * (a cache's size changes with every query); the ETag covers both. */
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_append(&b, d->doc, d->doc_len - 1);
    put_memory(&b, d);
    iv_buf_puts(&b, "}");
    if (b.oom) {
        iv_buf_free(&b);
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    char etag[24];
    snprintf(etag, sizeof etag, "\"%016" PRIx64 "\"", fnv1a(b.data, b.len));
    const char *inm = c->req->hdr[IV_H_IF_NONE_MATCH];
    char extra[96];
    snprintf(extra, sizeof extra, "ETag: %s\r\nCache-Control: no-cache\r\n", etag);
    if (inm && (strstr(inm, etag) || !strcmp(inm, "*"))) {
        iv_buf_free(&b);
        send_simple(c, 304, NULL, NULL, 0, extra);
        return;
    }
    send_owned(c, 200, "application/json", &b, extra);
}

/* Whether the request's client may see dataset d's id in a server-wide
 * answer (/metrics, /readyz): d is public, or the request's token reads
 * it, or holds the metrics or admin scope. */
static int may_name(conn_t *c, const sds_t *d)
{
    const iv_auth_t *a = &c->srv->auth;
    if (!iv_auth_protected(a, d->conf->id)) return 1;
    const iv_auth_token_t *tok = NULL;
    if (iv_auth_identify(a, c->req->hdr[IV_H_AUTHORIZATION], &tok) != IV_AUTH_OK || !tok) return 0;
    return iv_auth_may_read(a, tok, d->conf->id) || (tok->scope & (IV_SCOPE_METRICS | IV_SCOPE_ADMIN));
}

/* The loops' counters summed into sum, and their gauges into g. */
static void sum_loops(server_t *s, iv_metrics_t *sum, iv_metrics_gauges_t *g)
{
    for (unsigned i = 0; i < s->n_loops; i++) {
        loop_t *lp = &s->loops[i];
        g->open_connections += lp->n_conns;
        g->active_streams += lp->n_streams;
        g->queued_write_bytes += lp->queued_bytes;
        pthread_mutex_lock(&lp->mmu);
        iv_metrics_add(sum, &lp->metrics);
        pthread_mutex_unlock(&lp->mmu);
    }
}

/* The memory budget's parts: each one's share and what it holds now. */
static void mem_parts(server_t *s, iv_metrics_gauges_t *g)
{
    size_t queued = 0;
    for (unsigned i = 0; i < s->n_loops; i++) queued += s->loops[i].queued_bytes;
    uint64_t copies_left = atomic_load(&s->transpose_left.left);
    uint64_t answers_left = atomic_load(&s->answers_left.left);
#define PART(n, b, u) g->mem_parts[g->n_mem_parts++] = (iv_metrics_mem_part_t){n, b, u}
    PART("total", s->mem.total, g->process_rss);
    PART("cache", s->mb ? iv_membudget_bytes(s->mb) : 0, s->mb ? iv_membudget_used(s->mb) : 0);
    /* What a build borrows moves from its part to the builds'. */
    size_t lent_copies = atomic_load(&s->lent_copies);
    copies_left += lent_copies;
    PART("copies", s->mem.copies - lent_copies,
         s->mem.copies > copies_left ? s->mem.copies - copies_left : 0);
    PART("writes", s->mem.writes, queued);
    PART("answers", s->mem.answers, s->mem.answers > answers_left ? s->mem.answers - answers_left : 0);
    PART("builds", s->mem.builds + atomic_load(&s->lent) + lent_copies, 0);
#undef PART
}

/* The datasets by state, the caches of the ready ones, and the memory of
 * those this client may name (into mem, which may be NULL). */
static void dataset_gauges(conn_t *c, iv_metrics_gauges_t *g, iv_metrics_ds_mem_t *mem)
{
    server_t *s = c->srv;
    for (size_t i = 0; i < s->reg.n; i++) {
        sds_t *d = s->reg.v[i];
        if (d->state == DS_FAILED) {
            g->datasets_failed++;
            continue;
        }
        if (d->state != DS_READY) {
            g->datasets_loading++;
            continue;
        }
        g->datasets_ready++;
        /* Series labelled by a protected dataset's id only for a client
         * that may know it: its name is not public. */
        if (mem && may_name(c, d)) ds_memory(d, &mem[g->n_ds_mem++]);
        iv_cache_stats_t cs;
        iv_dataset_cache_stats(d->ds, &cs);
        iv_rds_matrices_cache(d, &cs);
        g->cache_bytes += cs.used;
        g->cache_hits += cs.hits;
        g->cache_misses += cs.misses;
    }
}

static void route_metrics(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0) || scope_check(c, IV_SCOPE_METRICS)) return;
    iv_metrics_gauges_t g;
    memset(&g, 0, sizeof g);
    g.queue_depth = iv_pool_queued(s->pool);
    iv_metrics_t *sum = malloc(sizeof *sum);
    if (!sum) {
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    iv_metrics_init(sum);
    sum_loops(s, sum, &g);
    g.cache_budget = s->mb ? iv_membudget_bytes(s->mb) : 0;
    iv_mem_process(&g.process_rss, &g.process_anon);
    mem_parts(s, &g);
    iv_mem_process(&g.process_rss, &g.process_anon);
    g.process_lazyfree = iv_mem_process_lazyfree();
    iv_metrics_ds_mem_t *mem = calloc(s->reg.n ? s->reg.n : 1, sizeof *mem);
    g.ds_mem = mem;
    dataset_gauges(c, &g, mem);
    iv_buf_t b;
    iv_buf_init(&b);
    iv_metrics_render(sum, &g, &b);
    free(sum);
    free(mem);
    send_owned(c, 200, "text/plain; version=0.0.4", &b, NULL);
}

/* Appends "; failed: a, b" (failed) or "; loading: c (packing, 40%)"
 * while the message is short; returns how many were left unnamed because
 * this client may not know them. */
static size_t name_not_ready(conn_t *c, iv_buf_t *m, int failed)
{
    server_t *s = c->srv;
    size_t unnamed = 0;
    int first = 1;
    for (size_t i = 0; i < s->reg.n && m->len < 400; i++) {
        const sds_t *d = s->reg.v[i];
        if (d->state != (failed ? DS_FAILED : DS_LOADING)) continue;
        if (!may_name(c, d)) {
            unnamed++;
            continue;
        }
        iv_buf_printf(m, "%s%s", first ? (failed ? "; failed: " : "; loading: ") : ", ", d->conf->id);
        if (!failed && atomic_load(&d->pack.active))
            iv_buf_printf(m, " (packing, %.0f%%)", atomic_load(&d->pack.permille) / 10.0);
        first = 0;
    }
    return unnamed;
}

/*
 * /readyz: "all" (default) is ready when every configured dataset is
 * loaded, so a failed one keeps the replica out of a load balancer's
 * rotation and someone notices; "any" when at least one is, for a server
 * whose other datasets should stay reachable whatever one file does.
 */
static void route_readyz(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0)) return;
    iv_registry_counts_t n;
    iv_registry_count(&s->reg, &n);
    const char *policy = s->readyz_any ? "any" : "all";
    if (iv_registry_ready(&s->reg, s->readyz_any)) {
        iv_buf_t b;
        iv_buf_init(&b);
        iv_buf_printf(&b, "{\"status\":\"ready\",\"policy\":\"%s\",\"ready\":%zu,\"loading\":%zu,"
                      "\"failed\":%zu}", policy, n.ready, n.loading, n.failed);
        send_owned(c, 200, "application/json", &b, "Cache-Control: no-store\r\n");
        return;
    }
    /* Name the datasets that are not ready (bounded: the message is a line). */
    iv_buf_t m;
    iv_buf_init(&m);
    iv_buf_printf(&m, "%zu of %zu datasets ready (readyz policy \"%s\")", n.ready, s->reg.n, policy);
    size_t unnamed = name_not_ready(c, &m, 1);  /* failed first, then loading */
    unnamed += name_not_ready(c, &m, 0);
    if (unnamed) iv_buf_printf(&m, "; %zu protected not named", unnamed);
    iv_buf_append(&m, "", 1);
    send_error(c, 503, "not_ready", m.oom ? "datasets are not ready" : m.data, "Retry-After: 1\r\n");
    iv_buf_free(&m);
}

typedef struct reload_ask {
    loop_t *lp;
    uint64_t id;
} reload_ask_t;

/* Loop 0. */
static void reload_asked(server_t *s, void *arg)
{
    reload_ask_t a = *(reload_ask_t *)arg;
    free(arg);
    reload_start(s, "POST /v1/admin/reload", a.lp, a.id);
}

/* POST /v1/admin/reload: the same as SIGHUP, answered with the summary
 * once the new and changed datasets are loaded (or failed).  It needs an
 * admin token when the server has any token (scope_check). */
static void route_admin_reload(conn_t *c)
{
    if (c->req->method != HTTP_POST) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s is not allowed here", method_name(c->req->method));
        send_error(c, 405, "method_not_allowed", msg, "Allow: POST, OPTIONS\r\n");
        return;
    }
    if (scope_check(c, IV_SCOPE_ADMIN)) return;
    /* Reloads run on loop 0; the answer comes back to this connection's
     * loop (reload_reply), found by its id. */
    reload_ask_t *a = malloc(sizeof *a);
    if (!a) {
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    a->lp = c->lp;
    a->id = c->id;
    c->life_f.reload_wait = 1;
    if (loop_call(&c->srv->loops[0], c->srv, reload_asked, a) != 0) {
        free(a);
        c->life_f.reload_wait = 0;
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
    }
}

/*
 * What a request path names: the one reading of paths that dispatch() and
 * route_precheck() share, so that the answer to "Expect: 100-continue"
 * cannot disagree with the answer to the request.  Static files ("/",
 * "/viewer/...") are P_NONE here; dispatch asks routes_static.c for them.
 */
typedef enum {
    P_NONE,        /* no route (or a static file) */
    P_HEALTHZ, P_READYZ, P_OPENAPI, P_METRICS, P_RELOAD,
    P_LIST,        /* /v1/datasets */
    P_DOC,         /* /v1/datasets/ID */
    P_QUERY,       /* /v1/datasets/ID/query */
    P_COUNT,       /* /v1/datasets/ID/count */
    P_EXPORT,      /* /v1/datasets/ID/export (routes_export.c) */
    P_VIEWER,      /* /v1/datasets/ID/SUB of api/viewer.h (obs, var, obsm, search, aggregate) */
} path_kind_t;

typedef struct route route_t;

typedef struct {
    const route_t *route; /* NULL: no route (or a static file) */
    path_kind_t kind;
    int metric;           /* the metrics' route label (IV_R_*) */
    const char *id;       /* dataset routes: the id, idn bytes of the path */
    size_t idn;
    const char *sub;      /* the path after the id ("" for the document) */
    int vroute;           /* P_VIEWER: api/viewer.h's route */
} path_match_t;

/* A route's handler: d is the dataset of a dataset route (ready, and the
 * token checked), NULL for the others. */
typedef void (*route_fn)(conn_t *c, const path_match_t *m, sds_t *d);

static void h_healthz(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    if (method_ok(c, 0)) send_simple(c, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
}

static void h_readyz(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    if (method_ok(c, 0)) route_readyz(c);
}

static void h_openapi(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    if (method_ok(c, 0))
        send_simple(c, 200, "application/json", (const char *)iv_openapi_json, iv_openapi_json_len,
                    "Cache-Control: no-cache\r\n");
}

static void h_metrics(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    route_metrics(c);
}

static void h_reload(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    route_admin_reload(c);
}

static void h_list(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m, (void)d;
    route_list(c);
}

static void h_doc(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m;
    route_doc(c, d);
}

static void h_query(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m;
    route_query(c, d, 0);
}

static void h_count(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m;
    route_query(c, d, 1);
}

static void h_export(conn_t *c, const path_match_t *m, sds_t *d)
{
    (void)m;
    route_export(c, d);
}

static void h_viewer(conn_t *c, const path_match_t *m, sds_t *d)
{
    route_viewer(c, d, m->vroute, m->sub);
}

/*
 * The routes.  A fixed path, or (dataset) the part of the path after
 * /v1/datasets/ID; the viewer's dataset routes are api/viewer.h's to
 * match (iv_vroute_match) and share one entry.  Methods and tokens are
 * each handler's to check (method_ok, scope_check; a dataset's token by
 * ready_ds before the handler), and route_precheck's for Expect.
 */
struct route {
    const char *path;
    int dataset;
    path_kind_t kind;
    iv_route_t metric;
    route_fn run;
};

static const route_t ROUTES[] = {
    {"/healthz", 0, P_HEALTHZ, IV_R_HEALTHZ, h_healthz},
    {"/readyz", 0, P_READYZ, IV_R_READYZ, h_readyz},
    {"/openapi.json", 0, P_OPENAPI, IV_R_OTHER, h_openapi},
    {"/metrics", 0, P_METRICS, IV_R_METRICS, h_metrics},
    {"/v1/admin/reload", 0, P_RELOAD, IV_R_OTHER, h_reload},
    {"/v1/datasets", 0, P_LIST, IV_R_DATASETS, h_list},
    {"/v1/datasets/", 0, P_LIST, IV_R_DATASETS, h_list},
    {NULL, 1, P_VIEWER, IV_R_DATASET, h_viewer},  /* iv_vroute_match, first */
    {"", 1, P_DOC, IV_R_DATASET, h_doc},
    {"/query", 1, P_QUERY, IV_R_QUERY, h_query},
    {"/count", 1, P_COUNT, IV_R_COUNT, h_count},
    {"/export", 1, P_EXPORT, IV_R_DATASET, h_export},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

static void match_set(path_match_t *m, const route_t *r)
{
    m->route = r;
    m->kind = r->kind;
    m->metric = r->metric;
}

static void match_path(const char *p, path_match_t *m)
{
    static const char pre[] = "/v1/datasets/";
    memset(m, 0, sizeof *m);
    m->kind = P_NONE;
    m->metric = IV_R_OTHER;
    m->sub = "";
    for (size_t i = 0; i < N_ROUTES; i++)
        if (!ROUTES[i].dataset && !strcmp(p, ROUTES[i].path)) {
            match_set(m, &ROUTES[i]);
            return;
        }
    if (strncmp(p, pre, sizeof pre - 1)) return;
    const char *id = p + sizeof pre - 1, *slash = strchr(id, '/');
    size_t idn = slash ? (size_t)(slash - id) : strlen(id);
    const char *sub = slash ? slash : "";
    if (idn == 0) return;
    int vroute = iv_vroute_match(sub);
    for (size_t i = 0; i < N_ROUTES && !m->route; i++) {
        const route_t *r = &ROUTES[i];
        if (!r->dataset) continue;
        if (r->path ? !strcmp(sub, r->path) : vroute != IV_VR_NONE) match_set(m, r);
    }
    if (!m->route) return;
    m->id = id;
    m->idn = idn;
    m->sub = sub;
    m->vroute = vroute;
}

/* Whether the matched route takes POST (GET and HEAD all take). */
static int match_allows_post(const path_match_t *m)
{
    return m->kind == P_QUERY || m->kind == P_COUNT || m->kind == P_EXPORT || m->kind == P_RELOAD ||
           (m->kind == P_VIEWER && iv_vroute_allows_post(m->vroute));
}

void dispatch(conn_t *c)
{
    server_t *s = c->srv;
    iv_http_req_t *r = c->req;
    const char *p = r->path;
    c->route = IV_R_OTHER;
    if (r->method == HTTP_OPTIONS) {
        const char *origin = r->hdr[IV_H_ORIGIN];
        if (origin_allowed(s, origin))
            send_simple(c, 204, NULL, NULL, 0,
                        "Allow: GET, HEAD, POST, OPTIONS\r\n"
                        "Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS\r\n"
                        "Access-Control-Allow-Headers: Authorization, Content-Type, Accept\r\n"
                        "Access-Control-Max-Age: 600\r\n");
        else
            send_simple(c, 204, NULL, NULL, 0, "Allow: GET, HEAD, POST, OPTIONS\r\n");
        return;
    }
    path_match_t m;
    match_path(p, &m);
    c->route = m.metric;
    if (m.route) {
        sds_t *d = NULL;
        if (m.route->dataset && !(d = ready_ds(c, m.id, m.idn))) return;
        /* The JSON body of a dataset route's POST; no other route reads one. */
        rfail_t f;
        if (m.route->dataset && r->method == HTTP_POST && r->body.len && coding_refused(r, &f)) {
            send_error(c, f.status, f.code, f.msg, f.extra);
            return;
        }
        m.route->run(c, &m, d);
        return;
    }
    iv_static_resp_t sr;  /* the viewer: "/", "/index.html", "/viewer/..." (routes_static.c) */
    if (iv_static_route(p, r->method, r->hdr[IV_H_IF_NONE_MATCH], r->hdr[IV_H_ACCEPT_ENCODING], &sr)) {
        send_simple(c, sr.status, sr.ctype, sr.body, sr.len, sr.extra);
        return;
    }
    if (r->method != HTTP_GET && r->method != HTTP_HEAD && r->method != HTTP_POST) {
        /* TRACE, CONNECT and the like exist nowhere on this server. */
        char msg[128];
        snprintf(msg, sizeof msg, "%s is not allowed here", method_name(r->method));
        send_error(c, 405, "method_not_allowed", msg, "Allow: GET, HEAD, POST, OPTIONS\r\n");
        return;
    }
    send_error(c, 404, "not_found", "no such path", NULL);
}

/* 405 for method meth; allow is the Allow header line. */
static int method_refused(rfail_t *f, int meth, const char *allow)
{
    f->status = 405;
    f->code = "method_not_allowed";
    snprintf(f->msg, sizeof f->msg, "%s is not allowed here", method_name(meth));
    f->extra = allow;
    return -1;
}

/* A dataset route: refused for a token that does not open the dataset,
 * an unknown dataset, one that failed or one still loading. */
static int dataset_refused(server_t *s, const iv_http_req_t *r, const path_match_t *m, rfail_t *f)
{
    const sds_t *d = find_ds(s, m->id, m->idn);
    int idn = (int)(m->idn > 128 ? 128 : m->idn);
    if (token_ok(s, r, d, f, NULL)) return -1;
    if (!d) {
        f->status = 404;
        f->code = "not_found";
        snprintf(f->msg, sizeof f->msg, "no dataset '%.*s'", idn, m->id);
        return -1;
    }
    if (d->state == DS_FAILED) {
        f->status = 503;
        f->code = "dataset_failed";
        snprintf(f->msg, sizeof f->msg, "dataset '%.*s' failed to load", idn, m->id);
        f->extra = "Cache-Control: no-store\r\n";
        return -1;
    }
    if (d->state == DS_LOADING) {
        f->status = 503;
        f->code = "not_ready";
        snprintf(f->msg, sizeof f->msg, "the dataset is still loading");
        f->extra = "Retry-After: 1\r\n";
        return -1;
    }
    return 0;
}

/* The matched route's own checks, before its method's: the token its
 * scope needs, and for a dataset route the dataset's state. */
static int route_refused(server_t *s, const iv_http_req_t *r, const path_match_t *m, rfail_t *f)
{
    const iv_auth_token_t *tok;
    if (m->route->dataset) return dataset_refused(s, r, m, f);
    if (m->kind == P_METRICS)
        return auth_refuse(iv_auth_scope(&s->auth, r->hdr[IV_H_AUTHORIZATION], IV_SCOPE_METRICS, &tok), f) ? -1 : 0;
    if (m->kind == P_LIST) return list_ok(s, r, f, &tok) ? -1 : 0;
    return 0;
}

/*
 * The checks dispatch() makes before any work, made on the headers alone:
 * whether a request that expects "100 Continue" would be refused anyway
 * (unknown path or dataset, wrong method, missing or wrong token, dataset
 * still loading).  Paths are read by match_path, as in dispatch: a route
 * added there is known to both.  0: the request may go on; otherwise *f
 * says the answer.
 */
int route_precheck(conn_t *c, const iv_http_req_t *r, rfail_t *f)
{
    server_t *s = c->srv;
    const char *p = r->path ? r->path : "";
    memset(f, 0, sizeof *f);
    f->route = IV_R_OTHER;
    int meth = r->method;
    if (meth == HTTP_OPTIONS) return 0;
    path_match_t m;
    match_path(p, &m);
    f->route = m.metric;
    if (m.kind == P_NONE) {
        /* A static file of the viewer (GET or HEAD) is dispatch's to find;
         * any other method has no route here. */
        if (meth == HTTP_GET || meth == HTTP_HEAD) return 0;
        f->status = 404;
        f->code = "not_found";
        snprintf(f->msg, sizeof f->msg, "no such path");
        return -1;
    }
    if (m.kind == P_RELOAD) {
        const iv_auth_token_t *tok;
        if (meth != HTTP_POST) return method_refused(f, meth, "Allow: POST, OPTIONS\r\n");
        return auth_refuse(iv_auth_scope(&s->auth, r->hdr[IV_H_AUTHORIZATION], IV_SCOPE_ADMIN, &tok), f);
    }
    if (route_refused(s, r, &m, f)) return -1;
    int post = match_allows_post(&m);
    /* A dataset route's POST body is on its way (it is expected): its
     * coding is checked as dispatch will. */
    if (meth == HTTP_POST && post) return coding_refused(r, f);
    if (meth == HTTP_GET || meth == HTTP_HEAD) return 0;
    return method_refused(f, meth, post ? "Allow: GET, HEAD, POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
}
