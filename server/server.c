/*
 * The query server (see server.h).
 *
 * Design.  One libuv loop owns every socket, timer and connection; it
 * parses HTTP, routes requests and writes bytes, and nothing else.  All
 * work that grows with a request or touches a file or a decoder (dataset
 * loading, a query's set-up from its JSON body, names and filters, query
 * prepare, block decode and encoding, metadata pages) runs as jobs on the
 * worker pool.  A worker
 * finishes a job by pushing it on a locked list and calling
 * uv_async_send(); the loop drains the whole list in one swap, so
 * coalesced wake-ups lose nothing.
 *
 * Streaming is pull-based.  A response may have at most `blocks_ahead`
 * blocks between "submitted for decode" and "write completed on the
 * socket"; the next block is submitted only when a write completes.  A
 * slow reader therefore holds at most that many encoded blocks, and
 * because each response keeps only a few jobs in the pool's FIFO, the
 * blocks of concurrent queries interleave: a whole-matrix download does
 * not hold up a one-cell query.  HTTP headers go out with the first
 * block, so an error in the prepare step or the first block still gets a
 * proper status; a later error is reported in the stream's trailer.
 *
 * Connections are freed only from their close callbacks.  A stream whose
 * connection goes away is detached and its query cancelled; it is freed
 * when its last job returns.  Requests on one connection are parsed one
 * at a time (the parser pauses after each), so pipelined requests are
 * answered in order, and reading stops while the input buffer is full or
 * the output queue is above a high-water mark.
 */
#include "server.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <uv.h>

#include "buf.h"
#include "codec.h"
#include "dataset.h"
#include "encode.h"
#include "error.h"
#include "http.h"
#include "meta.h"
#include "metrics.h"
#include "pool.h"
#include "query.h"
#include "request.h"
#include "routes_meta.h"
#include "openapi.h"
#include "routes_viewer.h"
#include "version.h"

#define READ_BUF_BYTES 65536
#define WRITE_HIGH_WATER ((size_t)1 << 20)

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct qstream qstream_t;

enum { DS_LOADING, DS_READY, DS_FAILED };

typedef struct sds {
    const iv_ds_conf_t *conf;
    iv_dataset_t *ds;
    iv_meta_t *meta;
    int state;
    char err[512];
    iv_vds_t *vx;         /* viewer state: obsm/varm arrays, search indexes */
    char *doc;            /* GET /v1/datasets/{id} document */
    size_t doc_len;
    char etag[24];
} sds_t;

enum job_kind { J_LOAD, J_SETUP, J_META, J_PREP, J_BLOCK, J_WHOLE, J_COUNT };

/*
 * A query's set-up, run on a worker: parsing the JSON body or query string,
 * resolving names and filters, building the engine query.  Each is O(the
 * request), and a request of a million indices would otherwise hold the
 * loop for tens of milliseconds.  Inputs are copies (the connection may go
 * away meanwhile); outputs go back to the loop with the job.
 */
typedef struct setup {
    /* in */
    char *body;           /* POST body (taken from the request), or NULL */
    size_t body_len;
    char *query;          /* GET query string (copied) */
    char *accept;         /* Accept header (copied), or NULL */
    int is_post, count;
    int64_t n_rows, n_cols;
    iv_axis_t axis;       /* J_META: the table's axis */
    char *col;            /* J_META: the column asked for (decoded), or NULL */
    size_t json_bytes;    /* J_META: limit of a column document */
    /* out */
    int status;           /* 0: rc/err decide the status; 422: "unsupported"; 404 */
    iv_buf_t page;        /* J_META: the document */
    const char *ctype;    /* J_META: its media type (static) */
    iv_query_t *q;
    char *dropped;        /* X-Ivserve-Dropped-Names JSON, or NULL */
    int have_total;
    double total;
    iv_fmt_t fmt;
    iv_vreq_t *vr;        /* J_META: a viewer route (routes_viewer.h), or NULL */
} setup_t;

typedef struct job {
    struct job *next;
    server_t *srv;
    int kind;
    sds_t *ds;
    qstream_t *qs;
    int64_t b;
    iv_buf_t out;
    int64_t rows, nnz;
    int rc;
    iv_err_t err;
    double secs;
    double total;         /* J_COUNT: sum of the selected values */
    setup_t *setup;       /* J_SETUP */
} job_t;

struct qstream {
    server_t *srv;
    conn_t *c;            /* NULL once detached */
    sds_t *ds;
    iv_query_t *q;
    iv_fmt_t fmt;
    int kind;             /* J_BLOCK (stream), J_WHOLE, J_COUNT */
    int64_t n_blocks, next_submit, next_write, writes_done;
    job_t **slots;
    unsigned ahead;
    int inflight;
    int prepared, headers_sent, done;
    int64_t rows, nnz;
    int have_total;       /* J_COUNT: total already known from the metadata */
    double total;
    qstream_t *next_live; /* server list of every stream, for shutdown and metrics */
    qstream_t *prev_live;
};

enum tstate { T_NONE, T_IDLE, T_HEADER, T_BODY, T_WRITE };

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    server_t *srv;
    conn_t *prev, *next;
    iv_http_in_t in;
    char *rbuf;
    size_t rlen, rcap;
    int reading, closing, handles_open, in_pump, busy, close_after, shutting, lingering;
    enum tstate tstate;
    size_t wpending;
    int sent_continue;
    /* The request being answered. */
    iv_http_req_t *req;
    iv_route_t route;
    uint64_t t0;
    int status;
    char dsid[136];
    int64_t rows, nnz;
    uint64_t bytes;
    char errmsg[520];
    qstream_t *qs;
    int chunked;
    char *dropped;        /* JSON {"obs":[...],"var":[...]} of names dropped by missing=ignore */
};

struct server {
    uv_loop_t loop;
    const iv_config_t *cfg;
    iv_pool_t *pool;
    uv_tcp_t listener;
    uv_async_t async;
    uv_signal_t sigterm, sigint;
    uv_timer_t grace;
    pthread_mutex_t done_mu;
    job_t *done_head;
    sds_t *ds;
    size_t n_ds, n_loading;
    conn_t *conns;
    size_t n_conns;
    qstream_t *streams;
    size_t n_streams;
    int draining, stopped;
    iv_metrics_t metrics;
    FILE *alog;
    int alog_owned;
    int alog_json;
};

/* ---- small helpers ------------------------------------------------------ */

static void iso_time(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Server events (start-up, datasets, shutdown) go to stderr as one line each. */
static void log_event(server_t *s, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_event(server_t *s, const char *level, const char *fmt, ...)
{
    char msg[1024], t[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    iso_time(t, sizeof t);
    if (s->alog_json) {
        iv_buf_t b;
        iv_buf_init(&b);
        iv_buf_printf(&b, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":", t, level);
        iv_buf_json_str(&b, msg);
        iv_buf_puts(&b, "}\n");
        if (!b.oom) fwrite(b.data, 1, b.len, stderr);
        iv_buf_free(&b);
    } else {
        fprintf(stderr, "%s %s %s\n", t, level, msg);
    }
    fflush(stderr);
}

static const char *method_name(int m)
{
    return llhttp_method_name((llhttp_method_t)m);
}

static int token_eq(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = (unsigned)(la ^ lb);
    for (size_t i = 0; i < la && i < lb; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- worker → loop hand-off -------------------------------------------- */

static void job_finish(job_t *j)
{
    server_t *s = j->srv;
    pthread_mutex_lock(&s->done_mu);
    j->next = s->done_head;
    s->done_head = j;
    pthread_mutex_unlock(&s->done_mu);
    uv_async_send(&s->async);
}

static void setup_free(setup_t *st)
{
    if (!st) return;
    free(st->body);
    free(st->query);
    free(st->accept);
    free(st->col);
    iv_buf_free(&st->page);
    iv_query_free(st->q);
    free(st->dropped);
    iv_vreq_free(st->vr);
    free(st);
}

static void job_free(job_t *j)
{
    iv_buf_free(&j->out);
    setup_free(j->setup);
    free(j);
}

/* ---- dataset loading (worker) ------------------------------------------ */

/* The members a ready dataset's list entry and its document share, from
 * '{' up to "ready":true; the document also names the indices dtype. */
static void put_summary(iv_buf_t *b, const sds_t *d, int with_indices_dtype)
{
    const iv_dataset_info_t *in = iv_dataset_info(d->ds);
    iv_buf_puts(b, "{\"id\":");
    iv_buf_json_str(b, d->conf->id);
    iv_buf_puts(b, ",\"title\":");
    iv_buf_json_str(b, d->conf->title ? d->conf->title : d->conf->id);
    iv_buf_printf(b, ",\"shape\":[%" PRId64 ",%" PRId64 "],\"orientation\":\"%s\",\"nnz\":%" PRId64
                  ",\"dtype\":\"%s\"",
                  in->n_rows, in->n_cols, in->orient == IV_IVCSR ? "ivcsr" : "ivcsc", in->nnz,
                  iv_wire_dtype_name(in->value_dtype));
    if (with_indices_dtype)
        iv_buf_printf(b, ",\"indices_dtype\":\"%s\"", iv_wire_dtype_name(in->indices_dtype));
    iv_buf_puts(b, ",\"codec\":");
    iv_buf_json_str(b, in->codec);
    iv_buf_puts(b, ",\"ready\":true");
}

static void build_doc(sds_t *d)
{
    iv_buf_t b;
    iv_buf_init(&b);
    put_summary(&b, d, 1);
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
    if (b.oom) {
        iv_buf_free(&b);
        return;
    }
    snprintf(d->etag, sizeof d->etag, "\"%016" PRIx64 "\"", fnv1a(b.data, b.len));
    d->doc = iv_buf_steal(&b, &d->doc_len);
}

static void job_load(void *arg)
{
    job_t *j = arg;
    sds_t *d = j->ds;
    double t0 = now_s();
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.group = d->conf->group;
    o.cache_bytes = j->srv->cfg->cache_bytes;
    /* The row-index pass and the cache prefault take the workers that are
     * free (nested: this job is one of them, and runs its share). */
    o.pool = j->srv->pool;
    j->rc = iv_dataset_open(d->conf->path, &o, &d->ds, &j->err);
    if (j->rc == 0) {
        iv_err_t me;
        iv_err_clear(&me);
        if (iv_meta_load(d->conf->path, d->conf->group, &d->meta, &me) != 0 ||
            iv_meta_add_computed(d->meta, d->ds, &me) != 0) {
            /* The matrix serves without names; the reason is logged on the loop. */
            iv_meta_free(d->meta);
            d->meta = NULL;
            snprintf(d->err, sizeof d->err, "%s", me.msg);
        }
        d->vx = iv_vds_load(d->conf->path, d->ds, d->meta);
        build_doc(d);
    }
    j->secs = now_s() - t0;
    job_finish(j);
}

/* ---- query jobs (worker) ------------------------------------------------ */

/* The worker half of a query's set-up (see setup_t). */
static void setup_run(job_t *j)
{
    setup_t *st = j->setup;
    sds_t *d = j->qs->ds;
    const iv_dataset_info_t *info = iv_dataset_info(d->ds);
    iv_qreq_t qr;
    int rc;
    if (st->is_post)
        rc = iv_qreq_parse_json(st->body ? st->body : "", st->body_len, st->n_rows, st->n_cols,
                                &qr, &j->err);
    else
        rc = iv_qreq_parse_query(st->query, strlen(st->query), st->n_rows, st->n_cols, &qr,
                                 &j->err);
    if (rc != 0) {
        j->rc = rc;
        return;
    }
    /* Names and filters: a bitmap pass over the axis (about 1.5 ms for a
     * four-term filter on 200,000 cells). */
    if ((rc = iv_rmeta_resolve_query(d->meta, &qr, &st->dropped, &j->err)) != 0) {
        iv_qreq_free(&qr);
        if (rc == IV_EUNSUPPORTED) st->status = 422;
        j->rc = rc;
        return;
    }
    /* Total counts without decoding: the computed per-row sums of the axis
     * whose opposite axis is wholly selected. */
    if (st->count && d->meta) {
        iv_axis_t maj = info->orient == IV_IVCSR ? IV_AXIS_OBS : IV_AXIS_VAR;
        const iv_psel_t *pm = maj == IV_AXIS_OBS ? &qr.obs : &qr.var;
        const iv_psel_t *po = maj == IV_AXIS_OBS ? &qr.var : &qr.obs;
        if (po->kind == IV_PSEL_ALL)
            st->have_total = iv_rmeta_total_counts(d->meta, maj,
                                                   pm->kind == IV_PSEL_ALL ? NULL : pm->idx, pm->n,
                                                   &st->total) == 0;
    }
    st->fmt = qr.format ? qr.format : iv_fmt_from_accept(st->accept);
    if (!st->count && st->fmt == IV_FMT_NONE) {
        iv_qreq_free(&qr);
        j->rc = iv_fail(&j->err, IV_ENOT_ACCEPTABLE,
                        "acceptable encodings: application/vnd.ivserve.csr, "
                        "application/x-ndjson, application/json");
        return;
    }
    iv_sel_t so = iv_psel_view(&qr.obs), sv = iv_psel_view(&qr.var);
    iv_query_opts_t qo = {IV_OUT_ROWS, 0, 0};
    j->rc = iv_query_new(d->ds, &so, &sv, &qo, &st->q, &j->err);
    iv_qreq_free(&qr);
}

/* A metadata table page or column document, built on a worker: its cost
 * grows with the page (a 100,000-row CSV page takes about 90 ms). */
static void meta_run(job_t *j)
{
    setup_t *st = j->setup;
    sds_t *d = j->qs->ds;
    const char *q = st->query;
    st->ctype = "application/json";
    if (st->vr) {
        j->rc = iv_vreq_run(st->vr, &j->err);
        return;
    }
    if (st->col) {
        j->rc = iv_rmeta_column(&st->page, d->meta, st->axis, st->col, q, strlen(q), st->json_bytes,
                                &j->err);
        /* An unknown column in the path is a missing resource. */
        if (j->rc == IV_EBAD_SELECTION) st->status = 404;
    } else {
        j->rc = iv_rmeta_table(&st->page, d->meta, st->axis, q, strlen(q), st->accept, &st->ctype,
                               &j->err);
    }
}

static void job_run(void *arg)
{
    job_t *j = arg;
    qstream_t *qs = j->qs;
    double t0 = now_s();
    const iv_limits_t *lim = &j->srv->cfg->limits;
    if (j->kind == J_SETUP) {
        setup_run(j);
    } else if (j->kind == J_META) {
        meta_run(j);
    } else if (j->kind == J_PREP) {
        j->rc = iv_query_prepare(qs->q, j->srv->pool, &j->err);
    } else if (j->kind == J_BLOCK) {
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        j->rc = iv_query_decode_block(qs->q, j->b, &blk, &j->err);
        if (j->rc == 0) {
            iv_enc_block(&j->out, qs->fmt, &blk);
            j->rows = blk.n_rows;
            j->nnz = blk.nnz;
            if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory encoding a block");
        }
        iv_block_free(&blk);
    } else if (j->kind == J_WHOLE || j->kind == J_COUNT) {
        j->rc = iv_query_prepare(qs->q, j->srv->pool, &j->err);
        int64_t hint = iv_query_nnz_hint(qs->q);
        iv_jdoc_t d;
        iv_jdoc_init(&d);
        int64_t nb = iv_query_n_blocks(qs->q);
        if (j->kind == J_COUNT && hint >= 0 && qs->have_total) {
            j->nnz = hint;
            nb = 0;
        }
        for (int64_t b = 0; j->rc == 0 && b < nb; b++) {
            iv_block_t blk;
            memset(&blk, 0, sizeof blk);
            j->rc = iv_query_decode_block(qs->q, b, &blk, &j->err);
            if (j->rc == 0) {
                j->nnz += blk.nnz;
                if (j->kind == J_COUNT && !qs->have_total)
                    for (int64_t k = 0; k < blk.nnz; k++)
                        j->total += iv_dtype_get_f64(blk.dtype, blk.data, (size_t)k);
                if (j->kind == J_WHOLE) {
                    iv_jdoc_add(&d, &blk);
                    if (iv_jdoc_oom(&d))
                        j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory building the JSON result");
                    else if (iv_jdoc_bytes(&d) > lim->json_bytes)
                        j->rc = iv_fail(&j->err, IV_ETOO_LARGE,
                                        "the result exceeds the JSON limit of %zu bytes; ask for "
                                        "application/vnd.ivserve.csr or application/x-ndjson",
                                        lim->json_bytes);
                }
            }
            iv_block_free(&blk);
        }
        if (j->rc == 0 && j->kind == J_WHOLE) {
            iv_stream_hdr_t h = {iv_query_n_rows(qs->q), iv_query_n_cols(qs->q),
                                 iv_query_dtype(qs->q), iv_query_index_size(qs->q)};
            iv_jdoc_finish(&d, &h, &j->out);
            if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory building the JSON result");
        }
        j->rows = iv_query_n_rows(qs->q);
        iv_jdoc_free(&d);
    }
    j->secs = now_s() - t0;
    job_finish(j);
}

/* ---- connection output -------------------------------------------------- */

typedef struct wreq {
    uv_write_t req;
    conn_t *c;
    char *head;
    char *payload;
    size_t bytes;
    int block;
    char chunk[24];
} wreq_t;

static void conn_close(conn_t *c);
static void on_timer(uv_timer_t *t);
static void conn_pump(conn_t *c);
static void qs_pump(qstream_t *qs);
static void req_done(conn_t *c);
static void conn_finish(conn_t *c);

static void timer_arm(conn_t *c, enum tstate st, int force)
{
    if (c->closing || c->lingering || (c->tstate == st && !force)) return;
    const iv_limits_t *l = &c->srv->cfg->limits;
    uint64_t ms = 0;
    switch (st) {
    case T_IDLE: ms = l->keepalive_ms; break;
    case T_HEADER: ms = l->header_timeout_ms; break;
    case T_BODY: ms = l->body_timeout_ms; break;
    case T_WRITE: ms = l->write_timeout_ms; break;
    case T_NONE: break;
    }
    c->tstate = st;
    if (st == T_NONE) uv_timer_stop(&c->timer);
    else uv_timer_start(&c->timer, on_timer, ms, 0);
}

static void on_write(uv_write_t *w, int status)
{
    wreq_t *r = (wreq_t *)w;
    conn_t *c = r->c;
    c->wpending -= r->bytes;
    free(r->head);
    free(r->payload);
    int block = r->block;
    free(r);
    if (status < 0 || c->closing) {
        conn_close(c);
        return;
    }
    if (c->busy) timer_arm(c, T_WRITE, 1);  /* progress: the write deadline starts again */
    if (block && c->qs) {
        c->qs->writes_done++;
        qs_pump(c->qs);
        return;
    }
    if (c->closing) return;
    if (!c->busy && c->close_after && c->wpending == 0) {
        conn_finish(c);
        return;
    }
    if (!c->busy) conn_pump(c);
}

/* Queues head (owned, may be NULL) then payload (owned, may be NULL),
 * the payload framed as one chunk when chunk is set. */
static void conn_write(conn_t *c, char *head, size_t hlen, char *payload, size_t plen, int chunk,
                       int block)
{
    if (c->closing) {
        free(head);
        free(payload);
        return;
    }
    wreq_t *r = calloc(1, sizeof *r);
    if (!r) {
        free(head);
        free(payload);
        conn_close(c);
        return;
    }
    r->c = c;
    r->head = head;
    r->payload = payload;
    r->block = block;
    uv_buf_t bufs[4];
    unsigned n = 0;
    if (head && hlen) bufs[n++] = uv_buf_init(head, (unsigned)hlen);
    if (payload && plen) {
        if (chunk) {
            int cl = snprintf(r->chunk, sizeof r->chunk, "%zx\r\n", plen);
            bufs[n++] = uv_buf_init(r->chunk, (unsigned)cl);
        }
        bufs[n++] = uv_buf_init(payload, (unsigned)plen);
        if (chunk) bufs[n++] = uv_buf_init((char *)"\r\n", 2);
    }
    for (unsigned i = 0; i < n; i++) r->bytes += bufs[i].len;
    if (n == 0) bufs[n++] = uv_buf_init((char *)"", 0);
    c->wpending += r->bytes;
    c->bytes += r->bytes;
    if (uv_write(&r->req, (uv_stream_t *)&c->tcp, bufs, n, on_write) != 0) {
        c->wpending -= r->bytes;
        free(head);
        free(payload);
        free(r);
        conn_close(c);
    }
}

static int origin_allowed(const server_t *s, const char *origin)
{
    if (!origin) return 0;
    for (size_t i = 0; i < s->cfg->n_cors; i++)
        if (!strcmp(s->cfg->cors_origins[i], "*") || !strcmp(s->cfg->cors_origins[i], origin))
            return 1;
    return 0;
}

/* Status line and headers.  content_length < 0 means a streamed body. */
static void resp_head(conn_t *c, iv_buf_t *b, int status, const char *ctype, int64_t content_length,
                      const char *extra)
{
    iv_http_req_t *r = c->req;
    int keep = r && r->keep_alive && !c->close_after && !c->srv->draining;
    iv_buf_printf(b, "HTTP/1.1 %d %s\r\nServer: ivserve/%s\r\n", status, iv_http_reason(status),
                  iv_version());
    if (ctype) iv_buf_printf(b, "Content-Type: %s\r\n", ctype);
    if (content_length >= 0) {
        iv_buf_printf(b, "Content-Length: %" PRId64 "\r\n", content_length);
    } else if (r && r->http_minor >= 1) {
        iv_buf_puts(b, "Transfer-Encoding: chunked\r\n");
        c->chunked = 1;
    } else {
        keep = 0;  /* HTTP/1.0 has no chunking: the end of the body is the close */
    }
    if (!keep) c->close_after = 1;
    iv_buf_puts(b, keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
    const char *origin = r ? r->hdr[IV_H_ORIGIN] : NULL;
    if (origin_allowed(c->srv, origin)) {
        iv_buf_puts(b, "Access-Control-Allow-Origin: ");
        iv_buf_puts(b, origin);
        iv_buf_puts(b, "\r\nVary: Origin\r\nAccess-Control-Expose-Headers: ETag, Retry-After, "
                    "X-Ivserve-Dropped-Names, Content-Length, Content-Encoding\r\n");
    }
    if (extra) iv_buf_puts(b, extra);
    if (c->dropped && status < 300) {
        /* JSON keeps the names unambiguous; control characters are escaped by it. */
        iv_buf_puts(b, "X-Ivserve-Dropped-Names: ");
        iv_buf_puts(b, c->dropped);
        iv_buf_puts(b, "\r\n");
    }
    iv_buf_puts(b, "\r\n");
}

/* Sends a complete response that is all in b (b is consumed) and ends the
 * request; a buffer that ran out of memory closes the connection instead. */
static void send_buf_done(conn_t *c, iv_buf_t *b)
{
    if (b->oom) {
        iv_buf_free(b);
        conn_close(c);
        return;
    }
    size_t n;
    char *p = iv_buf_steal(b, &n);
    conn_write(c, p, n, NULL, 0, 0, 0);
    req_done(c);
}

static void send_simple(conn_t *c, int status, const char *ctype, const char *body, size_t len,
                        const char *extra)
{
    iv_buf_t b;
    iv_buf_init(&b);
    resp_head(c, &b, status, ctype, (int64_t)len, extra);
    int head_only = c->req && c->req->method == HTTP_HEAD;
    if (!head_only && len) iv_buf_append(&b, body, len);
    c->status = status;
    send_buf_done(c, &b);
}

static void send_error(conn_t *c, int status, const char *code, const char *msg, const char *extra)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_enc_error(&b, code, msg);
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    if (status == 503 && !extra) extra = "Retry-After: 1\r\n";
    send_simple(c, status, "application/json", b.data ? b.data : "", b.len, extra);
    iv_buf_free(&b);
}

static void send_iv_error(conn_t *c, int rc, const iv_err_t *e)
{
    int status = iv_error_status(rc);
    if (rc == IV_EUNSUPPORTED || rc == IV_EBAD_FILE || rc == IV_ECORRUPT || rc == IV_EIO)
        status = 500;
    send_error(c, status, iv_error_code(rc), e && e->msg[0] ? e->msg : iv_error_message(rc), NULL);
}

/* ---- request completion, access log ------------------------------------ */

static void access_log(conn_t *c)
{
    server_t *s = c->srv;
    if (!s->alog) return;
    char t[40];
    iso_time(t, sizeof t);
    double ms = (double)(uv_hrtime() - c->t0) / 1e6;
    iv_buf_t b;
    iv_buf_init(&b);
    const char *path = c->req && c->req->path ? c->req->path : "";
    const char *method = c->req ? method_name(c->req->method) : "-";
    if (s->alog_json) {
        iv_buf_printf(&b, "{\"time\":\"%s\",\"method\":\"%s\",\"path\":", t, method);
        iv_buf_json_str(&b, path);
        iv_buf_puts(&b, ",\"dataset\":");
        if (c->dsid[0]) iv_buf_json_str(&b, c->dsid);
        else iv_buf_puts(&b, "null");
        iv_buf_printf(&b,
                      ",\"status\":%d,\"rows\":%" PRId64 ",\"nnz\":%" PRId64 ",\"bytes\":%" PRIu64
                      ",\"ms\":%.3f",
                      c->status, c->rows, c->nnz, c->bytes, ms);
        if (c->errmsg[0]) {
            iv_buf_puts(&b, ",\"error\":");
            iv_buf_json_str(&b, c->errmsg);
        }
        iv_buf_puts(&b, "}\n");
    } else {
        iv_buf_printf(&b, "%s %s %s %s %d rows=%" PRId64 " nnz=%" PRId64 " bytes=%" PRIu64 " ms=%.3f%s%s\n",
                      t, method, path, c->dsid[0] ? c->dsid : "-", c->status, c->rows, c->nnz,
                      c->bytes, ms, c->errmsg[0] ? " error=" : "", c->errmsg);
    }
    if (!b.oom) fwrite(b.data, 1, b.len, s->alog);
    fflush(s->alog);
    iv_buf_free(&b);
}

static void qs_free(qstream_t *qs);
static void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total);

static void req_done(conn_t *c)
{
    if (!c->busy) return;
    server_t *s = c->srv;
    access_log(c);
    free(c->dropped);
    c->dropped = NULL;
    iv_metrics_request(&s->metrics, c->route, c->status, (double)(uv_hrtime() - c->t0) / 1e9,
                       c->bytes);
    if (c->qs) {
        qstream_t *qs = c->qs;
        c->qs = NULL;
        qs->c = NULL;
        if (qs->inflight == 0) qs_free(qs);
        else if (qs->q) iv_query_cancel(qs->q);
    }
    if (c->req && !c->req->keep_alive) c->close_after = 1;
    if (s->draining) c->close_after = 1;
    iv_http_req_free(c->req);
    free(c->req);
    c->req = NULL;
    c->busy = 0;
    c->dsid[0] = c->errmsg[0] = '\0';
    c->rows = c->nnz = 0;
    c->bytes = 0;
    c->chunked = 0;
    c->status = 0;
    if (c->close_after) {
        if (c->wpending == 0) conn_finish(c);
        return;
    }
    if (!c->in_pump) conn_pump(c);
}

/* ---- query streams ------------------------------------------------------ */

/* A stream without its query yet: the set-up job builds it. */
static qstream_t *qs_new(conn_t *c, sds_t *d, int kind)
{
    server_t *s = c->srv;
    qstream_t *qs = calloc(1, sizeof *qs);
    if (!qs) return NULL;
    qs->ahead = s->cfg->limits.blocks_ahead ? s->cfg->limits.blocks_ahead : 1;
    qs->slots = calloc(qs->ahead, sizeof *qs->slots);
    if (!qs->slots) {
        free(qs);
        return NULL;
    }
    qs->srv = s;
    qs->c = c;
    qs->ds = d;
    qs->fmt = IV_FMT_NONE;
    qs->kind = kind;
    qs->next_live = s->streams;
    if (s->streams) s->streams->prev_live = qs;
    s->streams = qs;
    s->n_streams++;
    return qs;
}

static void qs_free(qstream_t *qs)
{
    server_t *s = qs->srv;
    for (unsigned i = 0; i < qs->ahead; i++)
        if (qs->slots[i]) job_free(qs->slots[i]);
    free(qs->slots);
    iv_query_free(qs->q);
    if (qs->prev_live) qs->prev_live->next_live = qs->next_live;
    else s->streams = qs->next_live;
    if (qs->next_live) qs->next_live->prev_live = qs->prev_live;
    s->n_streams--;
    free(qs);
}

/* Queues a job of the stream (kind, block b; st for J_SETUP, owned by the
 * job from here on, freed with it on failure). */
static int qs_submit_job(qstream_t *qs, int kind, int64_t b, setup_t *st)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        setup_free(st);
        return IV_ENOMEM;
    }
    j->srv = qs->srv;
    j->kind = kind;
    j->qs = qs;
    j->b = b;
    j->setup = st;
    int rc = iv_pool_try_submit(qs->srv->pool, job_run, j);
    if (rc != 0) {
        job_free(j);
        qs->srv->metrics.overloaded++;
        return rc;
    }
    qs->inflight++;
    return 0;
}

static int qs_submit(qstream_t *qs, int kind, int64_t b)
{
    return qs_submit_job(qs, kind, b, NULL);
}

static void stream_headers(conn_t *c, qstream_t *qs, iv_buf_t *b)
{
    resp_head(c, b, 200, iv_fmt_media_type(qs->fmt), -1, "Cache-Control: no-store\r\n");
    c->status = 200;
    iv_stream_hdr_t h = {iv_query_n_rows(qs->q), iv_query_n_cols(qs->q), iv_query_dtype(qs->q),
                         iv_query_index_size(qs->q)};
    iv_buf_t sh;
    iv_buf_init(&sh);
    iv_enc_header(&sh, qs->fmt, &h);
    if (c->chunked) iv_buf_printf(b, "%zx\r\n", sh.len);
    iv_buf_append(b, sh.data, sh.len);
    if (c->chunked) iv_buf_puts(b, "\r\n");
    if (sh.oom) b->oom = 1;
    iv_buf_free(&sh);
    qs->headers_sent = 1;
}

/* Ends a stream with its trailer (ok or the error) and the last chunk. */
static void qs_end(qstream_t *qs, int rc, const iv_err_t *e)
{
    conn_t *c = qs->c;
    qs->done = 1;
    iv_buf_t b;
    iv_buf_init(&b);
    if (!qs->headers_sent) stream_headers(c, qs, &b);
    iv_buf_t t;
    iv_buf_init(&t);
    if (rc == 0) {
        iv_enc_trailer(&t, qs->fmt, 0, NULL, NULL, qs->rows, qs->nnz);
    } else {
        snprintf(c->errmsg, sizeof c->errmsg, "%s", e->msg);
        iv_enc_trailer(&t, qs->fmt, iv_error_status(rc), iv_error_code(rc), e->msg, qs->rows, qs->nnz);
        c->close_after = 1;  /* the client may not read the trailer; do not reuse the connection */
    }
    if (c->chunked) iv_buf_printf(&b, "%zx\r\n", t.len);
    iv_buf_append(&b, t.data, t.len);
    if (c->chunked) iv_buf_puts(&b, "\r\n0\r\n\r\n");
    iv_buf_free(&t);
    c->rows = qs->rows;
    c->nnz = qs->nnz;
    send_buf_done(c, &b);
}

static void qs_fail(qstream_t *qs, int rc, const iv_err_t *e)
{
    conn_t *c = qs->c;
    if (qs->q) iv_query_cancel(qs->q);
    if (!qs->headers_sent) {
        qs->done = 1;
        c->rows = qs->rows;
        if (rc == IV_EOVERLOADED) send_error(c, 503, iv_error_code(rc), e->msg, "Retry-After: 1\r\n");
        else send_iv_error(c, rc, e);
        return;
    }
    qs_end(qs, rc, e);
}

static void qs_pump(qstream_t *qs)
{
    conn_t *c = qs->c;
    if (!c || qs->done || !qs->prepared) return;
    while (qs->next_submit < qs->n_blocks &&
           (uint64_t)(qs->next_submit - qs->writes_done) < qs->ahead) {
        int rc = qs_submit(qs, J_BLOCK, qs->next_submit);
        if (rc != 0) {
            if (qs->inflight > 0 || qs->next_write > qs->writes_done) break;  /* retried on the next completion */
            iv_err_t e;
            iv_err_clear(&e);
            iv_fail(&e, rc, "the server is overloaded; retry later");
            qs_fail(qs, rc, &e);
            return;
        }
        qs->next_submit++;
    }
    /* Write finished blocks in order. */
    while (qs->next_write < qs->n_blocks) {
        job_t **slot = &qs->slots[qs->next_write % qs->ahead];
        job_t *j = *slot;
        if (!j || j->b != qs->next_write) break;
        *slot = NULL;
        char *head = NULL;
        size_t hlen = 0;
        if (!qs->headers_sent) {
            iv_buf_t b;
            iv_buf_init(&b);
            stream_headers(c, qs, &b);
            head = iv_buf_steal(&b, &hlen);
        }
        qs->rows += j->rows;
        qs->nnz += j->nnz;
        size_t plen;
        char *payload = iv_buf_steal(&j->out, &plen);
        job_free(j);
        qs->next_write++;
        conn_write(c, head, hlen, payload, plen, c->chunked, 1);
        if (c->closing || qs->c == NULL) return;
    }
    if (qs->next_write == qs->n_blocks && !qs->done) qs_end(qs, 0, NULL);
}

static void route_query_finish(qstream_t *qs, job_t *j);
static void route_meta_finish(qstream_t *qs, job_t *j);

static void on_qs_job(job_t *j)
{
    qstream_t *qs = j->qs;
    server_t *s = j->srv;
    qs->inflight--;
    if (j->kind != J_SETUP && j->kind != J_META) s->metrics.decode_seconds += j->secs;
    if (!qs->c || qs->done) {
        /* Detached (client gone) or already answered: drop the result. */
        job_free(j);
        if (!qs->c && qs->inflight == 0) qs_free(qs);
        else if (qs->c && qs->inflight == 0) qs_pump(qs);
        return;
    }
    conn_t *c = qs->c;
    if (j->kind == J_SETUP) {
        route_query_finish(qs, j);
        return;
    }
    if (j->kind == J_META) {
        route_meta_finish(qs, j);
        return;
    }
    timer_arm(c, T_WRITE, 1);
    if (j->rc != 0) {
        iv_err_t e = j->err;
        int rc = j->rc;
        job_free(j);
        qs_fail(qs, rc, &e);
        return;
    }
    if (j->kind == J_PREP) {
        qs->prepared = 1;
        qs->n_blocks = iv_query_n_blocks(qs->q);
        job_free(j);
        qs_pump(qs);
        return;
    }
    if (j->kind == J_BLOCK) {
        s->metrics.blocks_decoded++;
        qs->slots[j->b % qs->ahead] = j;
        qs_pump(qs);
        return;
    }
    qs->done = 1;
    c->rows = j->rows;
    c->nnz = j->nnz;
    if (j->kind == J_WHOLE) {
        send_simple(c, 200, "application/json", j->out.data ? j->out.data : "", j->out.len,
                    "Cache-Control: no-store\r\n");
    } else {
        iv_buf_t body;
        iv_buf_init(&body);
        count_body(&body, c, qs->q, j->nnz, qs->have_total ? qs->total : j->total);
        send_simple(c, 200, "application/json", body.data ? body.data : "", body.len, NULL);
        iv_buf_free(&body);
    }
    job_free(j);
}

/* ---- routes ------------------------------------------------------------- */

/* The body of a count answer; nnz and total from the pointer arrays and the
 * computed metadata columns, or from a decode when those do not suffice. */
static void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total)
{
    int64_t rows = iv_query_n_rows(q), cols = iv_query_n_cols(q), nb = iv_query_n_blocks(q);
    const char *cells = "n_cells", *genes = "n_genes";
    iv_buf_printf(b,
                  "{\"shape\":[%" PRId64 ",%" PRId64 "],\"%s\":%" PRId64 ",\"%s\":%" PRId64
                  ",\"nnz\":%" PRId64 ",\"total_counts\":%.17g,\"bytes\":{\"binary\":%" PRId64
                  "},\"blocks\":%" PRId64 ",\"exact\":true",
                  rows, cols, cells, rows, genes, cols, nnz, total,
                  iv_enc_binary_size(rows, nb, nnz, iv_query_index_size(q), iv_query_dtype(q)), nb);
    if (c->dropped) {
        iv_buf_puts(b, ",\"dropped\":");
        iv_buf_puts(b, c->dropped);
    }
    iv_buf_puts(b, "}");
}

static sds_t *find_ds(server_t *s, const char *id, size_t n)
{
    for (size_t i = 0; i < s->n_ds; i++)
        if (strlen(s->ds[i].conf->id) == n && !strncmp(s->ds[i].conf->id, id, n)) return &s->ds[i];
    return NULL;
}

/* 0 when the request may proceed; otherwise an answer was sent. */
static int auth_check(conn_t *c, const sds_t *d)
{
    const iv_config_t *cfg = c->srv->cfg;
    size_t nd = d ? d->conf->n_tokens : 0;
    if (cfg->n_tokens == 0 && nd == 0) return 0;
    const char *h = c->req->hdr[IV_H_AUTHORIZATION];
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
        send_error(c, 401, "unauthorized", "this resource needs an Authorization: Bearer token",
                   "WWW-Authenticate: Bearer\r\n");
        return -1;
    }
    const char *tok = h + 7;
    while (*tok == ' ') tok++;
    int ok = 0;
    for (size_t i = 0; i < cfg->n_tokens; i++) ok |= token_eq(tok, cfg->tokens[i]);
    for (size_t i = 0; i < nd; i++) ok |= token_eq(tok, d->conf->tokens[i]);
    if (!ok) {
        send_error(c, 403, "forbidden", "the token does not open this resource", NULL);
        return -1;
    }
    return 0;
}

static int method_ok(conn_t *c, int allow_post)
{
    int m = c->req->method;
    if (m == HTTP_GET || m == HTTP_HEAD || (allow_post && m == HTTP_POST)) return 1;
    char msg[128];
    snprintf(msg, sizeof msg, "%s is not allowed here", method_name(m));
    send_error(c, 405, "method_not_allowed", msg,
               allow_post ? "Allow: GET, HEAD, POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
    return 0;
}

static void route_list(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0) || auth_check(c, NULL)) return;
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "{\"datasets\":[");
    int first = 1;
    for (size_t i = 0; i < s->n_ds; i++) {
        sds_t *d = &s->ds[i];
        if (d->state == DS_FAILED) continue;
        if (!first) iv_buf_puts(&b, ",");
        first = 0;
        if (d->state == DS_READY && d->doc) {
            /* The dataset document minus the column lists keeps this short. */
            put_summary(&b, d, 0);
            iv_buf_puts(&b, "}");
        } else {
            iv_buf_puts(&b, "{\"id\":");
            iv_buf_json_str(&b, d->conf->id);
            iv_buf_puts(&b, ",\"ready\":false}");
        }
    }
    iv_buf_puts(&b, "]}");
    send_simple(c, 200, "application/json", b.data, b.len, NULL);
    iv_buf_free(&b);
}

static sds_t *ready_ds(conn_t *c, const char *id, size_t n)
{
    sds_t *d = find_ds(c->srv, id, n);
    snprintf(c->dsid, sizeof c->dsid, "%.*s", (int)(n > 128 ? 128 : n), id);
    if (!d || d->state == DS_FAILED) {
        char msg[200];
        snprintf(msg, sizeof msg, "no dataset '%.*s'", (int)(n > 128 ? 128 : n), id);
        send_error(c, 404, "not_found", msg, NULL);
        return NULL;
    }
    if (auth_check(c, d)) return NULL;
    if (d->state == DS_LOADING) {
        send_error(c, 503, "not_ready", "the dataset is still loading", "Retry-After: 1\r\n");
        return NULL;
    }
    return d;
}

static void route_doc(conn_t *c, sds_t *d)
{
    if (!method_ok(c, 0)) return;
    const char *inm = c->req->hdr[IV_H_IF_NONE_MATCH];
    char extra[96];
    snprintf(extra, sizeof extra, "ETag: %s\r\nCache-Control: no-cache\r\n", d->etag);
    if (inm && (strstr(inm, d->etag) || !strcmp(inm, "*"))) {
        send_simple(c, 304, NULL, NULL, 0, extra);
        return;
    }
    send_simple(c, 200, "application/json", d->doc, d->doc_len, extra);
}

/* Hands st (owned from here on) to a worker as job jkind of a new stream
 * of kind qkind for c.  The stream exists from now on, so that a client
 * that goes away detaches it; failures are answered here. */
static void submit_setup(conn_t *c, sds_t *d, setup_t *st, int qkind, int jkind)
{
    qstream_t *qs = qs_new(c, d, qkind);
    if (!qs) {
        setup_free(st);
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    c->qs = qs;
    if (qs_submit_job(qs, jkind, -1, st) != 0) {
        c->qs = NULL;
        qs->c = NULL;
        qs_free(qs);
        send_error(c, 503, "overloaded", "the server is overloaded; retry later", "Retry-After: 1\r\n");
    }
}

static void route_query(conn_t *c, sds_t *d, int count)
{
    iv_http_req_t *r = c->req;
    if (!method_ok(c, 1)) return;
    const iv_dataset_info_t *info = iv_dataset_info(d->ds);
    if (r->method == HTTP_POST) {
        const char *ct = r->hdr[IV_H_CONTENT_TYPE];
        /* curl -d sends form-urlencoded by default; its body is still our JSON. */
        if (ct && r->body.len && strncasecmp(ct, "application/json", 16) != 0 &&
            strncasecmp(ct, "application/x-www-form-urlencoded", 33) != 0 &&
            strncasecmp(ct, "text/plain", 10) != 0) {
            send_error(c, 415, "unsupported_media", "the request body must be application/json", NULL);
            return;
        }
    }
    /* The rest of the set-up runs on a worker (see setup_t). */
    setup_t *st = calloc(1, sizeof *st);
    if (!st) {
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    st->is_post = r->method == HTTP_POST;
    st->count = count;
    st->n_rows = info->n_rows;
    st->n_cols = info->n_cols;
    if (st->is_post) st->body = iv_buf_steal(&r->body, &st->body_len);
    else st->query = strdup(r->query ? r->query : "");
    if (r->hdr[IV_H_ACCEPT]) st->accept = strdup(r->hdr[IV_H_ACCEPT]);
    if ((!st->is_post && !st->query) || (r->hdr[IV_H_ACCEPT] && !st->accept)) {
        setup_free(st);
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    submit_setup(c, d, st, count ? J_COUNT : J_BLOCK, J_SETUP);
}

/* The loop half of a query's set-up, once the worker built the query: the
 * limits, the answers that need no decode, then the decode jobs. */
static void route_query_finish(qstream_t *qs, job_t *j)
{
    conn_t *c = qs->c;
    server_t *s = c->srv;
    setup_t *st = j->setup;
    if (j->rc != 0) {
        iv_err_t e = j->err;
        int rc = j->rc, status = st->status;
        job_free(j);
        if (status == 422) send_error(c, 422, "unsupported", e.msg, NULL);
        else send_iv_error(c, rc, &e);
        return;
    }
    c->dropped = st->dropped;
    st->dropped = NULL;
    iv_query_t *q = qs->q = st->q;
    st->q = NULL;
    int count = qs->kind == J_COUNT, have_total = st->have_total;
    double total = st->total;
    iv_fmt_t fmt = st->fmt;
    job_free(j);
    int64_t rows = iv_query_n_rows(q), hint = iv_query_nnz_hint(q);
    const iv_limits_t *lim = &s->cfg->limits;
    char msg[256];
    if (!count && (rows > lim->max_rows || hint > lim->max_nnz)) {
        snprintf(msg, sizeof msg,
                 "the query selects %" PRId64 " rows and %" PRId64
                 " stored values; the limits are %" PRId64 " rows and %" PRId64 " values",
                 rows, hint, lim->max_rows, lim->max_nnz);
        send_error(c, 413, "too_large", msg, NULL);
        return;
    }
    if (!count && fmt == IV_FMT_JSON && hint >= 0 &&
        (uint64_t)hint * 4 + (uint64_t)rows * 4 > lim->json_bytes) {
        /* Even at the shortest 4 bytes per number the document is too big. */
        snprintf(msg, sizeof msg,
                 "the result (%" PRId64 " values) exceeds the JSON limit of %zu bytes; ask for "
                 "application/vnd.ivserve.csr or application/x-ndjson",
                 hint, lim->json_bytes);
        send_error(c, 413, "too_large", msg, NULL);
        return;
    }
    if (count && hint >= 0 && have_total) {
        /* Answered from the pointer arrays and computed columns, no decode. */
        iv_buf_t body;
        iv_buf_init(&body);
        count_body(&body, c, q, hint, total);
        c->rows = rows;
        c->nnz = hint;
        send_simple(c, 200, "application/json", body.data ? body.data : "", body.len, NULL);
        iv_buf_free(&body);
        return;
    }
    if (!count && c->req->method == HTTP_HEAD) {
        iv_buf_t b;
        iv_buf_init(&b);
        resp_head(c, &b, 200, iv_fmt_media_type(fmt), fmt == IV_FMT_JSON ? 0 : -1, NULL);
        c->status = 200;
        send_buf_done(c, &b);
        return;
    }
    int kind = count ? J_COUNT : fmt == IV_FMT_JSON ? J_WHOLE : J_BLOCK;
    qs->fmt = fmt;
    qs->kind = kind;
    qs->have_total = have_total;
    qs->total = total;
    if (qs_submit(qs, kind == J_BLOCK ? J_PREP : kind, -1) != 0) {
        c->qs = NULL;
        qs->c = NULL;
        qs_free(qs);
        send_error(c, 503, "overloaded", "the server is overloaded; retry later", "Retry-After: 1\r\n");
    }
}

/* GET .../obs, .../var (tables) and .../obs/{column}, .../var/{column}.
 * sub points past the dataset id ("/obs", "/var/cell_type"). */
static void route_meta(conn_t *c, sds_t *d, const char *sub)
{
    if (!method_ok(c, 0)) return;
    if (!d->meta) {
        send_error(c, 422, "unsupported", "the dataset's metadata could not be loaded", NULL);
        return;
    }
    const char *col = sub[4] == '/' ? sub + 5 : NULL;
    setup_t *st = calloc(1, sizeof *st);
    if (!st) {
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    iv_buf_init(&st->page);
    st->axis = !strncmp(sub, "/obs", 4) ? IV_AXIS_OBS : IV_AXIS_VAR;
    st->json_bytes = c->srv->cfg->limits.json_bytes;
    st->query = strdup(c->req->query ? c->req->query : "");
    if (c->req->hdr[IV_H_ACCEPT]) st->accept = strdup(c->req->hdr[IV_H_ACCEPT]);
    int bad_name = 0;
    if (col && !(st->col = iv_url_decode(col, strlen(col)))) bad_name = 1;
    if (!st->query || (c->req->hdr[IV_H_ACCEPT] && !st->accept) || bad_name) {
        setup_free(st);
        if (bad_name) send_error(c, 400, "bad_request", "bad percent-escape in the column name", NULL);
        else send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    submit_setup(c, d, st, J_META, J_META);
}

/* GET/POST of a viewer route (routes_viewer.h): copied for a worker, which
 * builds the whole answer; route_meta_finish sends it. */
static void route_viewer(conn_t *c, sds_t *d, int vroute, const char *sub)
{
    iv_http_req_t *r = c->req;
    if (!method_ok(c, iv_vroute_allows_post(vroute))) return;
    const char *ct = r->hdr[IV_H_CONTENT_TYPE];
    if (r->method == HTTP_POST && ct && r->body.len && strncasecmp(ct, "application/json", 16) != 0 &&
        strncasecmp(ct, "application/x-www-form-urlencoded", 33) != 0 &&
        strncasecmp(ct, "text/plain", 10) != 0) {
        send_error(c, 415, "unsupported_media", "the request body must be application/json", NULL);
        return;
    }
    int bad_name = 0;
    size_t blen = 0;
    char *body = r->method == HTTP_POST ? iv_buf_steal(&r->body, &blen) : NULL;
    iv_vreq_t *vr = iv_vreq_new(vroute, sub, r->method == HTTP_POST, r->query, body, blen,
                                r->hdr[IV_H_ACCEPT], &bad_name);
    setup_t *st = vr ? calloc(1, sizeof *st) : NULL;
    if (!st) {
        iv_vreq_free(vr);
        if (bad_name) send_error(c, 400, "bad_request", "bad percent-escape in the path", NULL);
        else send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    iv_buf_init(&st->page);
    vr->ds = d->ds;
    vr->meta = d->meta;
    vr->vx = d->vx;
    vr->pool = c->srv->pool;
    vr->json_bytes = c->srv->cfg->limits.json_bytes;
    vr->max_age = c->srv->cfg->cache_max_age;
    vr->private_cache = c->srv->cfg->n_tokens > 0 || d->conf->n_tokens > 0;
    if ((r->hdr[IV_H_IF_NONE_MATCH] && !(vr->if_none_match = strdup(r->hdr[IV_H_IF_NONE_MATCH]))) ||
        (r->hdr[IV_H_ACCEPT_ENCODING] &&
         !(vr->accept_encoding = strdup(r->hdr[IV_H_ACCEPT_ENCODING])))) {
        iv_vreq_free(vr);
        free(st);
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
        return;
    }
    st->vr = vr;
    submit_setup(c, d, st, J_META, J_META);
}

/* The loop half of a metadata page: send what the worker built. */
static void route_meta_finish(qstream_t *qs, job_t *j)
{
    conn_t *c = qs->c;
    setup_t *st = j->setup;
    if (st->vr && j->rc == 0) {
        c->dropped = st->vr->dropped;
        st->vr->dropped = NULL;
        if (st->vr->status == 304) {
            send_simple(c, 304, NULL, NULL, 0, st->vr->extra);
        } else {
            /* The body (an embedding can be tens of MB) is handed to the
             * write as it is, not copied behind the headers on the loop. */
            iv_buf_t h;
            iv_buf_init(&h);
            resp_head(c, &h, 200, st->vr->ctype, (int64_t)st->vr->out.len, st->vr->extra);
            c->status = 200;
            size_t hlen = 0, blen = 0;
            char *body = c->req->method == HTTP_HEAD ? NULL : iv_buf_steal(&st->vr->out, &blen);
            if (h.oom) {
                iv_buf_free(&h);
                free(body);
                conn_close(c);
            } else {
                char *head = iv_buf_steal(&h, &hlen);
                conn_write(c, head, hlen, body, blen, 0, 0);
                req_done(c);
            }
        }
    } else if (st->vr) {
        send_iv_error(c, j->rc, &j->err);
    } else if (j->rc == 0)
        send_simple(c, 200, st->ctype, st->page.data ? st->page.data : "", st->page.len,
                    "Cache-Control: no-cache\r\n");
    else if (st->status == 404)
        send_error(c, 404, "not_found", j->err.msg, NULL);
    else
        send_iv_error(c, j->rc, &j->err);
    job_free(j);
}

static void route_metrics(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0)) return;
    iv_metrics_gauges_t g;
    memset(&g, 0, sizeof g);
    g.queue_depth = iv_pool_queued(s->pool);
    g.open_connections = s->n_conns;
    g.active_streams = s->n_streams;
    for (size_t i = 0; i < s->n_ds; i++) {
        sds_t *d = &s->ds[i];
        if (d->state == DS_READY) {
            g.datasets_ready++;
            iv_cache_stats_t cs;
            iv_dataset_cache_stats(d->ds, &cs);
            g.cache_bytes += cs.used;
            g.cache_hits += cs.hits;
            g.cache_misses += cs.misses;
        } else if (d->state == DS_FAILED) {
            g.datasets_failed++;
        } else {
            g.datasets_loading++;
        }
    }
    iv_buf_t b;
    iv_buf_init(&b);
    iv_metrics_render(&s->metrics, &g, &b);
    send_simple(c, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len, NULL);
    iv_buf_free(&b);
}

static void dispatch(conn_t *c)
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
    if (!strcmp(p, "/healthz")) {
        c->route = IV_R_HEALTHZ;
        if (method_ok(c, 0)) send_simple(c, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
        return;
    }
    if (!strcmp(p, "/readyz")) {
        c->route = IV_R_READYZ;
        if (!method_ok(c, 0)) return;
        if (s->n_loading == 0) send_simple(c, 200, "application/json", "{\"status\":\"ready\"}", 18, NULL);
        else send_error(c, 503, "not_ready", "datasets are still loading", "Retry-After: 1\r\n");
        return;
    }
    if (!strcmp(p, "/openapi.json")) {
        if (method_ok(c, 0))
            send_simple(c, 200, "application/json", (const char *)iv_openapi_json, iv_openapi_json_len,
                        "Cache-Control: no-cache\r\n");
        return;
    }
    if (!strcmp(p, "/metrics")) {
        c->route = IV_R_METRICS;
        route_metrics(c);
        return;
    }
    static const char pre[] = "/v1/datasets";
    if (!strncmp(p, pre, sizeof pre - 1)) {
        const char *rest = p + sizeof pre - 1;
        if (*rest == '\0' || !strcmp(rest, "/")) {
            c->route = IV_R_DATASETS;
            route_list(c);
            return;
        }
        if (*rest == '/') {
            const char *id = rest + 1;
            const char *slash = strchr(id, '/');
            size_t idn = slash ? (size_t)(slash - id) : strlen(id);
            const char *sub = slash ? slash : "";
            int vroute = iv_vroute_match(sub);
            if (vroute != IV_VR_NONE && idn > 0) {
                c->route = IV_R_DATASET;
                sds_t *d = ready_ds(c, id, idn);
                if (d) route_viewer(c, d, vroute, sub);
                return;
            }
            int meta = (!strncmp(sub, "/obs", 4) || !strncmp(sub, "/var", 4)) &&
                       (sub[4] == '\0' || (sub[4] == '/' && sub[5] && !strchr(sub + 5, '/')));
            if (!*sub || meta) c->route = IV_R_DATASET;
            else if (!strcmp(sub, "/query")) c->route = IV_R_QUERY;
            else if (!strcmp(sub, "/count")) c->route = IV_R_COUNT;
            if (c->route != IV_R_OTHER && idn > 0) {
                sds_t *d = ready_ds(c, id, idn);
                if (!d) return;
                if (meta) route_meta(c, d, sub);
                else if (c->route == IV_R_DATASET) route_doc(c, d);
                else route_query(c, d, c->route == IV_R_COUNT);
                return;
            }
        }
    }
    send_error(c, 404, "not_found", "no such path", NULL);
}

/* ---- connection input --------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles_open > 0) return;
    server_t *s = c->srv;
    iv_http_in_free(&c->in);
    if (c->req) {
        iv_http_req_free(c->req);
        free(c->req);
    }
    free(c->rbuf);
    free(c);
    if (s->draining && s->n_conns == 0 && !s->stopped) {
        s->stopped = 1;
        uv_close((uv_handle_t *)&s->async, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->grace, NULL);
    }
}

static void conn_close(conn_t *c)
{
    if (c->closing) return;
    server_t *s = c->srv;
    if (c->busy) {
        /* The client went away mid-request: log it as such. */
        if (!c->status) c->status = 499;
        if (c->qs) {
            c->rows = c->qs->rows;
            c->nnz = c->qs->nnz;
        }
        snprintf(c->errmsg, sizeof c->errmsg, "connection closed before the response ended");
        c->in_pump = 1;  /* req_done must not start parsing again */
        req_done(c);
    }
    c->closing = 1;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);

/* After the last response of a connection that the client may still be
 * writing to (a refused upload, a malformed request), the server reads and
 * drops input for a short while before closing: closing with unread input
 * makes the kernel send a reset, which can destroy the response the
 * client has not read yet. */
#define LINGER_MS 2000

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_t *c = req->data;
    free(req);
    if (status < 0 || c->closing) {
        conn_close(c);
        return;
    }
    c->lingering = 1;
    c->rlen = 0;
    c->tstate = T_NONE;
    uv_timer_start(&c->timer, on_timer, LINGER_MS, 0);
    if (!c->reading && uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) == 0) c->reading = 1;
    if (!c->reading) conn_close(c);
}

/* Half-closes after the queued writes so that the client reads the last
 * response before the connection goes away. */
static void conn_finish(conn_t *c)
{
    if (c->closing || c->shutting) return;
    c->shutting = 1;
    uv_shutdown_t *sr = malloc(sizeof *sr);
    if (!sr) {
        conn_close(c);
        return;
    }
    sr->data = c;
    if (uv_shutdown(sr, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        free(sr);
        conn_close(c);
    }
}

static void on_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (c->lingering) {
        conn_close(c);
        return;
    }
    if (c->tstate == T_HEADER || c->tstate == T_BODY) {
        const char *what = c->tstate == T_BODY ? "the request body did not arrive in time"
                                               : "the request headers did not arrive in time";
        c->busy = 1;
        c->t0 = uv_hrtime();
        c->close_after = 1;
        c->tstate = T_NONE;
        send_error(c, 408, "timeout", what, NULL);
        conn_finish(c);
        return;
    }
    conn_close(c);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    if (c->rlen >= c->rcap) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init(c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    conn_t *c = st->data;
    if (c->lingering) {
        c->rlen = 0;  /* dropped */
        if (n < 0) conn_close(c);
        return;
    }
    if (n < 0) {
        /* EOF: answer what is already buffered only when it is a complete
         * request being served; otherwise the conversation is over. */
        if (c->busy && n == UV_EOF) {
            c->close_after = 1;
            uv_read_stop(st);
            c->reading = 0;
            return;
        }
        conn_close(c);
        return;
    }
    if (n == 0) return;
    c->rlen += (size_t)n;
    conn_pump(c);
}

static void conn_pump(conn_t *c)
{
    server_t *s = c->srv;
    if (c->closing || c->in_pump) return;
    c->in_pump = 1;
    while (!c->closing && !c->busy && !c->close_after && c->wpending < WRITE_HIGH_WATER && c->rlen > 0) {
        size_t used = 0;
        iv_http_req_t *req = NULL;
        int rc = iv_http_in_feed(&c->in, c->rbuf, c->rlen, &used, &req);
        if (used) {
            memmove(c->rbuf, c->rbuf + used, c->rlen - used);
            c->rlen -= used;
        }
        if (rc == 1) {
            c->busy = 1;
            c->req = req;
            c->t0 = uv_hrtime();
            c->sent_continue = 0;
            timer_arm(c, T_WRITE, 1);
            if (s->draining) c->close_after = 1;
            dispatch(c);
            continue;
        }
        if (rc < 0) {
            c->busy = 1;
            c->t0 = uv_hrtime();
            c->close_after = 1;
            send_error(c, c->in.err_status, c->in.err_status == 400 ? "bad_request" : "too_large",
                       c->in.err_msg, NULL);
            break;
        }
        if (iv_http_in_headers_done(&c->in)) {
            const iv_http_req_t *cur = iv_http_in_current(&c->in);
            if (cur && cur->hdr[IV_H_EXPECT] && !strcasecmp(cur->hdr[IV_H_EXPECT], "100-continue") &&
                !c->sent_continue) {
                c->sent_continue = 1;
                char *m = strdup("HTTP/1.1 100 Continue\r\n\r\n");
                if (m) conn_write(c, m, strlen(m), NULL, 0, 0, 0);
            }
            timer_arm(c, T_BODY, 0);
        } else if (iv_http_in_active(&c->in)) {
            timer_arm(c, T_HEADER, 0);
        }
        break;
    }
    c->in_pump = 0;
    if (c->closing) return;
    if (!c->busy && c->close_after) {
        if (c->wpending == 0) conn_finish(c);
        return;
    }
    if (!c->busy && !iv_http_in_active(&c->in) && c->rlen == 0) timer_arm(c, T_IDLE, 0);
    else if (!c->busy && iv_http_in_active(&c->in) && !iv_http_in_headers_done(&c->in))
        timer_arm(c, T_HEADER, 0);
    int want = c->rlen < c->rcap && !c->close_after;
    if (want && !c->reading) {
        if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) == 0) c->reading = 1;
    } else if (!want && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void on_connection(uv_stream_t *ls, int status)
{
    server_t *s = ls->data;
    if (status < 0) return;
    conn_t *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    c->rcap = s->cfg->limits.header_bytes + 4096 > READ_BUF_BYTES ? s->cfg->limits.header_bytes + 4096
                                                                   : READ_BUF_BYTES;
    c->rbuf = malloc(c->rcap);
    uv_tcp_init(&s->loop, &c->tcp);
    c->tcp.data = c;
    uv_timer_init(&s->loop, &c->timer);
    c->timer.data = c;
    c->handles_open = 2;
    iv_http_in_init(&c->in, s->cfg->limits.header_bytes, s->cfg->limits.body_bytes);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    s->metrics.connections_total++;
    if (!c->rbuf || uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (s->n_conns > s->cfg->limits.max_connections || s->draining) {
        c->busy = 1;
        c->t0 = uv_hrtime();
        c->close_after = 1;
        send_error(c, 503, "overloaded", "too many connections", "Retry-After: 1\r\n");
        return;
    }
    conn_pump(c);
}

/* ---- loop-side completions, signals ------------------------------------ */

static void on_load_done(job_t *j)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    s->n_loading--;
    if (j->rc != 0) {
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "%s", j->err.msg);
        log_event(s, "error", "dataset %s (%s) left out: %s", d->conf->id, d->conf->path, j->err.msg);
    } else if (!d->doc) {
        d->state = DS_FAILED;
        log_event(s, "error", "dataset %s left out: out of memory", d->conf->id);
    } else {
        d->state = DS_READY;
        const iv_dataset_info_t *in = iv_dataset_info(d->ds);
        if (!d->meta)
            log_event(s, "warn", "dataset %s: metadata not loaded, names selections disabled: %s",
                      d->conf->id, d->err);
        log_event(s, "info",
                  "dataset %s ready: %" PRId64 " x %" PRId64 ", nnz %" PRId64 ", %s, %s, %.2f s",
                  d->conf->id, in->n_rows, in->n_cols, in->nnz,
                  in->orient == IV_IVCSR ? "ivcsr" : "ivcsc", in->codec, j->secs);
    }
    if (s->n_loading == 0) log_event(s, "info", "all datasets loaded");
    job_free(j);
}

static job_t *take_done(server_t *s)
{
    pthread_mutex_lock(&s->done_mu);
    job_t *list = s->done_head;
    s->done_head = NULL;
    pthread_mutex_unlock(&s->done_mu);
    /* The list is newest first; reverse it to handle completions in order. */
    job_t *rev = NULL;
    while (list) {
        job_t *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    return rev;
}

static void on_async(uv_async_t *a)
{
    server_t *s = a->data;
    job_t *j = take_done(s);
    while (j) {
        job_t *n = j->next;
        if (j->kind == J_LOAD) on_load_done(j);
        else on_qs_job(j);
        j = n;
    }
}

static void on_grace(uv_timer_t *t)
{
    server_t *s = t->data;
    log_event(s, "warn", "shutdown grace period over; closing %zu connections", s->n_conns);
    while (s->conns) conn_close(s->conns);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    server_t *s = sig->data;
    if (s->draining) return;
    s->draining = 1;
    log_event(s, "info", "signal %d: no new connections; finishing %zu open ones", signum, s->n_conns);
    uv_close((uv_handle_t *)&s->listener, NULL);
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (!c->busy) conn_close(c);
        else c->close_after = 1;
    }
    if (s->n_conns == 0) {
        s->stopped = 1;
        uv_close((uv_handle_t *)&s->async, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->grace, NULL);
        return;
    }
    uv_timer_start(&s->grace, on_grace, s->cfg->limits.shutdown_grace_ms, 0);
}

/* ---- start and stop ----------------------------------------------------- */

static int bind_listener(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    struct sockaddr_storage addr;
    int rc = strchr(cfg->listen, ':') ? uv_ip6_addr(cfg->listen, cfg->port, (struct sockaddr_in6 *)&addr)
                                      : uv_ip4_addr(cfg->listen, cfg->port, (struct sockaddr_in *)&addr);
    if (rc != 0) {
        fprintf(stderr, "ivserve: listen address '%s' is not an IP address\n", cfg->listen);
        return -1;
    }
    if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection)) != 0) {
        fprintf(stderr, "ivserve: cannot listen on %s:%d: %s\n", cfg->listen, cfg->port,
                uv_strerror(rc));
        return -1;
    }
    struct sockaddr_storage got;
    int len = sizeof got;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len);
    int port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                               : ((struct sockaddr_in *)&got)->sin_port);
    log_event(s, "info", "ivserve %s listening on %s:%d with %u workers", iv_version(), cfg->listen,
              port, iv_pool_threads(s->pool));
    return 0;
}

/* Frees what the workers handed back after the loop stopped. */
static void drain_after_stop(server_t *s)
{
    job_t *j = take_done(s);
    while (j) {
        job_t *n = j->next;
        if (j->kind == J_LOAD) {
            s->n_loading--;
        } else {
            qstream_t *qs = j->qs;
            qs->inflight--;
            job_free(j);
            if (qs->inflight == 0 && !qs->c) qs_free(qs);
            j = n;
            continue;
        }
        job_free(j);
        j = n;
    }
    while (s->streams) qs_free(s->streams);
}

int iv_server_run(const iv_config_t *cfg)
{
    server_t *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = cfg;
    iv_metrics_init(&s->metrics);
    s->alog_json = strcmp(cfg->log_format, "text") != 0;
    if (!strcmp(cfg->access_log, "-")) {
        s->alog = stderr;
    } else if (strcmp(cfg->access_log, "off") != 0) {
        s->alog = fopen(cfg->access_log, "a");
        if (!s->alog) {
            fprintf(stderr, "ivserve: cannot open access log %s\n", cfg->access_log);
            free(s);
            return 1;
        }
        s->alog_owned = 1;
    }
    signal(SIGPIPE, SIG_IGN);
    iv_h5filters_register();
    int exit_code = 1;
    s->pool = iv_pool_create(cfg->threads, cfg->queue);
    if (!s->pool) {
        fprintf(stderr, "ivserve: cannot start the worker pool\n");
        goto fail_pool;
    }
    pthread_mutex_init(&s->done_mu, NULL);
    uv_loop_init(&s->loop);
    uv_async_init(&s->loop, &s->async, on_async);
    s->async.data = s;
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_timer_init(&s->loop, &s->grace);
    s->grace.data = s;
    uv_tcp_init(&s->loop, &s->listener);
    s->listener.data = s;

    s->n_ds = cfg->n_datasets;
    s->ds = calloc(s->n_ds ? s->n_ds : 1, sizeof *s->ds);
    if (!s->ds) goto fail_loop;
    if (bind_listener(s) != 0) goto fail_loop;
    for (size_t i = 0; i < s->n_ds; i++) {
        s->ds[i].conf = &cfg->datasets[i];
        s->ds[i].state = DS_LOADING;
        job_t *j = calloc(1, sizeof *j);
        if (!j) goto fail_loop;
        j->srv = s;
        j->kind = J_LOAD;
        j->ds = &s->ds[i];
        s->n_loading++;
        log_event(s, "info", "loading dataset %s from %s", cfg->datasets[i].id, cfg->datasets[i].path);
        if (iv_pool_try_submit(s->pool, job_load, j) != 0) {
            s->n_loading--;
            s->ds[i].state = DS_FAILED;
            free(j);
        }
    }
    uv_run(&s->loop, UV_RUN_DEFAULT);
    exit_code = 0;
    log_event(s, "info", "stopped");
    goto cleanup;

fail_loop:
    /* Start-up failed: close every handle and run the loop until they are gone. */
    s->draining = 1;
    if (!uv_is_closing((uv_handle_t *)&s->listener)) uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->async, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->grace, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
cleanup:
    iv_pool_destroy(s->pool);
    drain_after_stop(s);
    for (size_t i = 0; s->ds && i < s->n_ds; i++) {
        iv_meta_free(s->ds[i].meta);
        if (s->ds[i].ds) iv_dataset_close(s->ds[i].ds);
        iv_vds_free(s->ds[i].vx);
        free(s->ds[i].doc);
    }
    free(s->ds);
    uv_loop_close(&s->loop);
    pthread_mutex_destroy(&s->done_mu);
fail_pool:
    if (s->alog_owned) fclose(s->alog);
    free(s);
    return exit_code;
}
