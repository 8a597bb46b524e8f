/*
 * Writing answers: the status line and headers (keep-alive, chunked
 * framing, CORS), the uv_write calls, the end of an answer (its metrics
 * and its access-log line), and the write budget.
 *
 * Each write carries the sequence number of the answer it belongs to and,
 * for a stream's block, the stream, which its completion credits
 * (conn_wrote): a stream hears "written" from its own blocks, never from
 * whatever else the connection writes.  A write's buffers live until its
 * callback.  When an answer's last write completes, the connection goes
 * back to its state machine (conn.c, resp_finished).  The write budget
 * bounds the bytes queued for slow readers across all connections: past
 * it, large answers get 503, streams wait, and the connections stalled
 * longest are cut first.
 */
#include "srv_conn.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encode.h"

/* ---- connection output -------------------------------------------------- */

/* One uv_write: at most WREQ_BUFS buffers (head, chunk size, the
 * payload's pieces cut at UINT_MAX bytes, chunk end), of which at most
 * WREQ_OWNED payload pieces are the write's to free. */
#define WREQ_BUFS 12
#define WREQ_OWNED 3
#define PIECE_MAX ((size_t)UINT_MAX)

typedef struct wreq {
    uv_write_t req;
    conn_t *c;
    char *head;           /* owned */
    char *owned[WREQ_OWNED]; /* payload pieces freed with the write */
    qstream_t *qs;        /* the stream whose block this is, credited on completion */
    uint64_t seq;         /* the answer it belongs to */
    int last;             /* the answer's last write */
    size_t bytes;
    char chunk[24];
} wreq_t;

static void budget_freed(loop_t *lp);

void conn_wrote(uv_write_t *w, int status)
{
    wreq_t *r = (wreq_t *)w;
    conn_t *c = r->c;
    loop_t *lp = c->lp;
    if (c->state == CS_CLOSING) lp->doomed_bytes -= r->bytes;
    else lp->srv->budget_used -= r->bytes;
    c->wpending -= r->bytes;
    lp->queued_bytes -= r->bytes;
    c->last_progress = uv_now(&lp->loop);
    free(r->head);
    for (unsigned i = 0; i < WREQ_OWNED; i++) free(r->owned[i]);
    qstream_t *qs = r->qs;
    int last = r->last && r->seq == c->seq;
    free(r);
    if (qs) {
        /* The block's own stream is told, whatever the connection does now. */
        qs->wq--;
        qs->writes_done++;
        if (!qs->c) {
            if (qs->inflight == 0 && qs->wq == 0) qs_free(qs);
        } else if (status == 0 && c->state != CS_CLOSING) {
            qs_pump(qs);
        }
    }
    budget_freed(lp);
    if (c->state == CS_CLOSING) return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (last) resp_finished(c);
    else if (c->state == CS_RESPONDING) conn_set_state(c, CS_RESPONDING);  /* progress */
}

static void pieces_free(char *head, const wpiece_t *pieces, unsigned n)
{
    free(head);
    for (unsigned i = 0; i < n; i++)
        if (pieces[i].own) free((char *)pieces[i].p);
}

/* A write's pieces: their bytes, the uv_buf_t slices they take, and how
 * many the write is to free. */
static void measure_pieces(const wpiece_t *pieces, unsigned n_pieces, size_t *plen, size_t *slices,
                           unsigned *n_own)
{
    *plen = *slices = 0;
    *n_own = 0;
    for (unsigned i = 0; i < n_pieces; i++) {
        *plen += pieces[i].len;
        *slices += pieces[i].len ? (pieces[i].len - 1) / PIECE_MAX + 1 : 0;
        *n_own += pieces[i].own != 0;
    }
}

/* The write's buffers, never none: the head, the chunk-size line, the
 * pieces, the chunk's CRLF.  r takes the pieces it owns and counts the
 * bytes.  Returns the number of buffers. */
static unsigned fill_bufs(wreq_t *r, uv_buf_t *bufs, size_t hlen, const wpiece_t *pieces,
                          unsigned n_pieces, size_t plen, int chunk)
{
    unsigned n = 0;
    if (r->head && hlen) bufs[n++] = uv_buf_init(r->head, (unsigned)hlen);
    if (plen && chunk) {
        int cl = snprintf(r->chunk, sizeof r->chunk, "%zx\r\n", plen);
        bufs[n++] = uv_buf_init(r->chunk, (unsigned)cl);
    }
    for (unsigned i = 0, k = 0; i < n_pieces; i++) {
        if (pieces[i].own) r->owned[k++] = (char *)pieces[i].p;
        /* uv_buf_t lengths are unsigned int: a piece past 4 GiB goes in slices. */
        for (size_t off = 0; off < pieces[i].len; off += PIECE_MAX) {
            size_t m = pieces[i].len - off < PIECE_MAX ? pieces[i].len - off : PIECE_MAX;
            bufs[n++] = uv_buf_init((char *)pieces[i].p + off, (unsigned)m);
        }
    }
    if (plen && chunk) bufs[n++] = uv_buf_init((char *)"\r\n", 2);
    for (unsigned i = 0; i < n; i++) r->bytes += bufs[i].len;
    if (n == 0) bufs[n++] = uv_buf_init((char *)"", 0);
    return n;
}

/* Bytes handed to the transport: the connection's, the loop's queue and
 * the server's write budget count them until conn_wrote. */
static void queue_bytes(conn_t *c, size_t bytes)
{
    if (!c->wpending) c->last_progress = uv_now(&c->lp->loop);
    c->wpending += bytes;
    c->lp->queued_bytes += bytes;
    c->srv->budget_used += bytes;
    c->bytes += bytes;
}

/* A write the transport refused: its bytes leave the counts again. */
static void unqueue_bytes(conn_t *c, size_t bytes)
{
    c->wpending -= bytes;
    c->lp->queued_bytes -= bytes;
    c->srv->budget_used -= bytes;
}

int conn_writev(conn_t *c, char *head, size_t hlen, const wpiece_t *pieces, unsigned n_pieces,
                int chunk, qstream_t *qs, int last)
{
    if (c->state == CS_CLOSING) {
        pieces_free(head, pieces, n_pieces);
        return -1;
    }
    size_t plen, slices;
    unsigned n_own;
    measure_pieces(pieces, n_pieces, &plen, &slices, &n_own);
    wreq_t *r = calloc(1, sizeof *r);
    if (!r || slices + 3 > WREQ_BUFS || n_own > WREQ_OWNED) {
        free(r);
        pieces_free(head, pieces, n_pieces);
        conn_close(c);
        return -1;
    }
    r->c = c;
    r->head = head;
    r->qs = qs;
    r->seq = c->seq;
    r->last = last;
    uv_buf_t bufs[WREQ_BUFS];
    unsigned n = fill_bufs(r, bufs, hlen, pieces, n_pieces, plen, chunk);
    if (qs) qs->wq++;
    queue_bytes(c, r->bytes);
    if (c->state == CS_DISPATCHED) conn_set_state(c, CS_RESPONDING);
    if (c->tp->write(c, &r->req, bufs, n) != 0) {
        unqueue_bytes(c, r->bytes);
        if (qs) qs->wq--;
        pieces_free(head, pieces, n_pieces);
        free(r);
        conn_close(c);
        return -1;
    }
    if (c->state == CS_RESPONDING && r->bytes) conn_set_state(c, CS_RESPONDING);
    return 0;
}

int conn_write(conn_t *c, char *head, size_t hlen, const char *payload, size_t plen, int own,
               int chunk, qstream_t *qs, int last)
{
    wpiece_t p = {payload, payload ? plen : 0, own && payload};
    return conn_writev(c, head, hlen, &p, 1, chunk, qs, last);
}

/* body must outlive the write (static text or a dataset's document). */
void send_simple(conn_t *c, int status, const char *ctype, const char *body, size_t len,
                 const char *extra)
{
    os_head(c, status, ctype, (int64_t)len, extra, 0);
    wpiece_t p = {body, len, 0};
    os_end(c, &p, NULL);
}

/* The body is taken from body (left empty); its memory is written as is. */
void send_owned(conn_t *c, int status, const char *ctype, iv_buf_t *body, const char *extra)
{
    if (body->oom) {
        iv_buf_free(body);
        conn_close(c);
        return;
    }
    os_head(c, status, ctype, (int64_t)body->len, extra, 0);
    wpiece_t p = {NULL, 0, 1};
    p.p = iv_buf_steal(body, &p.len);
    os_end(c, &p, NULL);
}

void send_error(conn_t *c, int status, const char *code, const char *msg, const char *extra)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_enc_error(&b, code, msg);
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    if (status == 503 && !extra) extra = "Retry-After: 1\r\n";
    send_owned(c, status, "application/json", &b, extra);
}

/*
 * The answer to an engine error: its status and code come from the one
 * table of core/base/error.h (iv_error_status, iv_error_code), never from a
 * special case here; an error that needs another status needs its own row
 * there.  The message is e's, or the table's when e has none.
 */
void send_iv_error(conn_t *c, int rc, const iv_err_t *e)
{
    const char *msg = e && e->msg[0] ? e->msg : iv_error_message(rc);
    char red[sizeof e->msg];
    send_error(c, iv_error_status(rc), iv_error_code(rc), error_for_client(rc, msg, red, sizeof red),
               NULL);
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);  /* the log keeps the whole message */
}

const char *error_for_client(int rc, const char *msg, char *red, size_t cap)
{
    if (iv_error_status(rc) < 500) return msg;
    iv_http_redact_paths(red, cap, msg);
    return red;
}

/* ---- request completion, access log ------------------------------------ */

/* One line for the answer; bytes is what was written (or, for a closing
 * connection's last answer, what the client acknowledged). */
void access_log(conn_t *c, uint64_t bytes)
{
    const iv_config_t *cfg = c->srv->cfg;
    char client[48];
    iv_alog_client(client, sizeof client, c->peer, c->life_f.peer_ok ? c->peer_ip : NULL,
                   c->req ? c->req->hdr[IV_H_X_FORWARDED_FOR] : NULL, cfg->trusted_proxies,
                   cfg->n_trusted_proxies);
    iv_alog_entry_t e = {
        .method = c->req ? method_name(c->req->method) : "-",
        .path = c->req && c->req->path ? c->req->path : "",
        .client = client,
        .peer = c->peer,
        .token = c->tokname,
        .cells = c->cells,
        .genes = c->genes,
        .dataset = c->dsid,
        .error = c->errmsg,
        .status = c->status,
        .rows = c->rows,
        .nnz = c->nnz,
        .bytes = bytes,
        .ms = (double)((c->t_end ? c->t_end : uv_hrtime()) - c->t0) / 1e6,
    };
    iv_alog_access(&c->srv->log, &e);
}

/* Forgets the answered request (after its log line). */
void req_reset(conn_t *c)
{
    iv_http_req_free(c->req);
    free(c->req);
    c->req = NULL;
    c->ans_f.log_pending = 0;
    c->dsid[0] = c->errmsg[0] = c->tokname[0] = '\0';
    c->cells = c->genes = -1;
    c->rows = c->nnz = 0;
    c->bytes = 0;
    os_reset(c);
    c->status = 0;
    c->t_end = 0;
}

/* Starts answering: a new sequence number, the compute deadline. */
void resp_begin(conn_t *c, iv_http_req_t *req)
{
    c->ans_f.active = 1;
    c->seq++;
    c->req = req;
    c->t0 = uv_hrtime();
    c->bytes = 0;
    c->ans_f.ended = 0;
    c->in_f.expect_checked = 0;
    if (c->lp->draining) c->ans_f.close_after = 1;
    conn_set_state(c, CS_DISPATCHED);
}

/* An answer that is not to a complete request (bad input, a timeout while
 * reading, a refused connection): the connection closes after it. */
void resp_begin_error(conn_t *c)
{
    c->ans_f.close_after = 1;
    resp_begin(c, NULL);
}

/* The answer's last bytes are queued: count, detach the stream, and log
 * (now, or when the bytes are out: log_pending).  The connection moves on
 * when that last write completes (resp_finished). */
void req_done(conn_t *c)
{
    if (!c->ans_f.active) return;
    loop_t *lp = c->lp;
    c->ans_f.active = 0;
    /* An admin reload answered otherwise (a timeout, the client left):
     * the reload goes on, and its summary is only logged. */
    c->life_f.reload_wait = 0;
    c->ans_f.ended = 1;
    c->t_end = uv_hrtime();
    free(c->dropped);
    free(c->dropped_hdr);
    c->dropped = c->dropped_hdr = NULL;
    LP_METRIC(lp, iv_metrics_request(m_, c->route, c->status, (double)(c->t_end - c->t0) / 1e9,
                                     c->bytes));
    if (c->qs) {
        qstream_t *qs = c->qs;
        c->qs = NULL;
        qs->c = NULL;
        if (qs->budget_wait) {
            qs->budget_wait = 0;
            budget_wait_count(lp, -1);
        }
        if (qs->inflight == 0 && qs->wq == 0) qs_free(qs);
        else qs_cancel(qs);
    }
    if (c->req && !c->req->keep_alive) c->ans_f.close_after = 1;
    if (lp->draining) c->ans_f.close_after = 1;
    if (c->state != CS_CLOSING && (c->ans_f.close_after || c->wpending)) {
        /* The log line waits until the answer is out: a connection's last
         * answer until the close, to say how many bytes the client really
         * acknowledged; any other until its last write completed
         * (resp_finished), or until the connection is cut first (the write
         * timeout, the write budget), which logs it as cut, as the close
         * does. */
        c->ans_f.log_pending = 1;
        return;
    }
    access_log(c, c->bytes);
    req_reset(c);
}

/* ---- the write budget -------------------------------------------------- */

/* An answer at most this large is always sent: the budget is about the
 * large ones. */
#define BUDGET_SMALL ((size_t)64 << 10)
/* A connection whose writes made no progress for this long may be cut to
 * make room for others. */
#define BUDGET_SLOW_MS 1000

static size_t budget_used(const loop_t *lp)
{
    return lp->srv->budget_used;
}

void budget_wait_count(loop_t *lp, int d)
{
    if (d > 0) {
        lp->n_budget_wait++;
        lp->srv->n_wait_all++;
    } else {
        lp->n_budget_wait--;
        lp->srv->n_wait_all--;
    }
}

/* Bytes of lp's were written or dropped: its waiting streams go on, and
 * another loop's are woken (on_async calls budget_wake) when they wait. */
static void budget_freed(loop_t *lp)
{
    server_t *s = lp->srv;
    if (lp->n_budget_wait) budget_wake(lp);
    if (s->n_wait_all <= lp->n_budget_wait || budget_used(lp) >= s->write_budget)
        return;
    for (unsigned i = 0; i < s->n_loops; i++)
        if (&s->loops[i] != lp && s->loops[i].n_budget_wait) uv_async_send(&s->loops[i].async);
}

/*
 * True when the bytes waiting to be written to every open connection, on
 * every loop, are under the budget, so that a new large answer (or a
 * stream's next block) may start.  When they are not, the connections of
 * c's loop whose writes have stalled longest (at least BUDGET_SLOW_MS)
 * are cut first, one at a time, until they are; c itself is spared (a
 * loop cuts only its own connections: another loop's are its to cut).  An answer
 * that starts under the budget may take it past by its own size: one
 * answer is never refused for being large alone (the JSON and row limits
 * bound it).
 */
static int budget_cut(loop_t *lp, conn_t *c)
{
    size_t limit = lp->srv->write_budget;
    uint64_t now = uv_now(&lp->loop);
    while (budget_used(lp) >= limit) {
        conn_t *worst = NULL;
        for (conn_t *o = lp->conns; o; o = o->next)
            if (o != c && o->wpending && o->state != CS_CLOSING &&
                now - o->last_progress >= BUDGET_SLOW_MS &&
                (!worst || o->last_progress < worst->last_progress))
                worst = o;
        if (!worst) {
            /* Another loop's stalled readers may be cut for this answer
             * (budget_tick). */
            if (c && lp->srv->n_loops > 1) lp->srv->room_wanted_ms = uv_hrtime() / 1000000;
            return 0;
        }
        snprintf(worst->errmsg, sizeof worst->errmsg,
                 "cut: the write budget of %zu bytes is spent and this client read nothing for "
                 "%" PRIu64 " ms",
                 limit, now - worst->last_progress);
        LP_METRIC(lp, m_->budget_cuts++);
        conn_close(worst);
    }
    return 1;
}

int budget_room(conn_t *c)
{
    return budget_cut(c->lp, c);
}

/* Several loops: an answer that wants room may be on another loop, which
 * cannot touch this one's connections.  So each loop looks every
 * BUDGET_TICK_MS, and while the budget is spent and some loop found
 * nothing to cut in the last BUDGET_WANTED_MS, cuts its own stalled
 * readers as that loop would have. */
#define BUDGET_WANTED_MS 2000
void budget_tick(uv_timer_t *t)
{
    loop_t *lp = t->data;
    server_t *s = lp->srv;
    uint64_t wanted = s->room_wanted_ms;
    if (!lp->conns || !wanted || uv_hrtime() / 1000000 - wanted > BUDGET_WANTED_MS) return;
    loop_enter(lp);
    if (budget_used(lp) >= s->write_budget) {
        budget_cut(lp, NULL);
        budget_freed(lp);
    }
    loop_leave(lp);
}

/* 0 when an answer of len bytes may go out now; otherwise a 503 was sent. */
int budget_admit(conn_t *c, size_t len)
{
    if (len <= BUDGET_SMALL || budget_room(c)) return 0;
    LP_METRIC(c->lp, m_->overloaded++);
    send_error(c, 503, "overloaded",
               "the server holds too many unsent answers for slow clients; retry later",
               "Retry-After: 1\r\n");
    return -1;
}

/* Some bytes were written or dropped: streams waiting for the budget go on. */
void budget_wake(loop_t *lp)
{
    size_t limit = lp->srv->write_budget;
    if (budget_used(lp) >= limit) return;
    /* A pump may end streams or cut connections (freeing their streams),
     * so the list is scanned again from its head after each one. */
    for (qstream_t *qs = lp->streams; qs;) {
        if (qs->budget_wait != 1) {
            qs = qs->next_live;
            continue;
        }
        qs->budget_wait = 0;
        budget_wait_count(lp, -1);
        if (qs->c) qs_pump(qs);
        if (!lp->n_budget_wait || budget_used(lp) >= limit) return;
        qs = lp->streams;
    }
}
