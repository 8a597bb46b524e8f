/*
 * Connections: reading requests, and the state machine of a connection.
 *
 * Connections are freed only from their close callbacks.  A stream whose
 * connection goes away is detached and its query cancelled; it is freed
 * when its last job returns and its last write completed.  A connection
 * is in one explicit state at a time (conn_state_t), and conn_set_state
 * is the one place that changes it and arms the state's timer.  Requests
 * on one connection are parsed one at a time (the parser pauses after
 * each), and the next only when the previous answer's last write
 * completed, so pipelined requests are answered in order and never share
 * the socket's write queue; reading stops while the input buffer is full.
 * Each write carries the sequence number of its answer and, for a block,
 * its stream, which it credits on completion (respond.c).
 */
#include "srv_conn.h"
#include "srv_loop.h"
#include "srv_qstream.h"
#include "srv_respond.h"
#include "srv_routes.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "transport.h"

#define READ_BUF_BYTES 65536

static void on_timer(uv_timer_t *t);
static void conn_pump(conn_t *c);
static void conn_shutdown(conn_t *c);

/* How often a draining connection looks at its unacknowledged bytes. */
#define DRAIN_POLL_MS 25

/*
 * The one place a connection changes state.  It also (re)arms the state's
 * timer, so that calling it again with the same state restarts the
 * deadline: that is how progress (a completed write, a finished block)
 * extends a response.
 */
void conn_set_state(conn_t *c, conn_state_t st)
{
    if (c->state == CS_CLOSING) return;
    const iv_limits_t *l = &c->srv->cfg->limits;
    uint64_t ms = 0;
    c->state = st;
    switch (st) {
    case CS_IDLE: ms = l->keepalive_ms; break;
    case CS_READ_HEAD: ms = l->header_timeout_ms; break;
    case CS_READ_BODY: ms = l->body_timeout_ms; break;
    case CS_DISPATCHED: ms = l->compute_timeout_ms; break;
    case CS_RESPONDING:
        /* Bytes waiting for the client: the write deadline.  None (a stream
         * waiting for its next block, or the last write done and the
         * close pending): the compute deadline. */
        ms = c->wpending ? l->write_timeout_ms : l->compute_timeout_ms;
        break;
    case CS_DRAINING: ms = DRAIN_POLL_MS; break;
    case CS_CLOSING:
        uv_timer_stop(&c->timer);
        return;
    }
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* Moves between the reading states only on a real change, so that bytes
 * trickling in do not extend the header or body deadline. */
static void conn_enter(conn_t *c, conn_state_t st)
{
    if (c->state != st) conn_set_state(c, st);
}

int is_reading_state(const conn_t *c)
{
    return c->state == CS_IDLE || c->state == CS_READ_HEAD || c->state == CS_READ_BODY;
}

/* An answer's last write completed: the connection closes politely or
 * goes on to the next pipelined request. */
void resp_finished(conn_t *c)
{
    c->ans_f.ended = 0;
    if (c->ans_f.close_after || c->lp->draining) {
        conn_shutdown(c);
        return;
    }
    if (c->ans_f.log_pending) {
        /* Every byte of a keep-alive answer was written (req_done). */
        access_log(c, c->bytes);
        req_reset(c);
    }
    conn_set_state(c, iv_http_in_headers_done(&c->in) ? CS_READ_BODY
                      : iv_http_in_active(&c->in) || c->rlen || c->n_ahead || c->in_f.ahead_err
                          ? CS_READ_HEAD
                          : CS_IDLE);
    conn_pump(c);
}

/* ---- connection input --------------------------------------------------- */

/* One of the connection's two handles (its timer, its transport) closed;
 * the second frees it. */
static void handle_closed(conn_t *c)
{
    if (--c->handles_open > 0) return;
    loop_t *lp = c->lp;
    loop_enter(lp);
    iv_http_in_free(&c->in);
    if (c->req) {
        iv_http_req_free(c->req);
        free(c->req);
    }
    free(c->dropped);
    free(c->dropped_hdr);
    iv_buf_free(&c->out.pend);
    for (unsigned i = 0; i < c->n_ahead; i++) {
        iv_http_req_t *r = c->ahead[(c->ahead_first + i) % c->ahead_cap];
        iv_http_req_free(r);
        free(r);
    }
    free(c->ahead);
    free(c->rbuf);
    free(c);
    loop_stopped_check(lp);
    loop_leave(lp);
}

static void on_timer_closed(uv_handle_t *h)
{
    handle_closed(h->data);
}

void conn_transport_closed(conn_t *c)
{
    handle_closed(c);
}

/* The answer under way did not end: logged as cut short, its work
 * stopped. */
static void cut_answer(conn_t *c)
{
    if (c->qs) qs_cancel(c->qs);
    if (!c->status) c->status = 499;
    if (c->qs) {
        c->rows = c->qs->rows;
        c->nnz = c->qs->nnz;
    }
    if (!c->errmsg[0])
        snprintf(c->errmsg, sizeof c->errmsg, "connection closed before the response ended");
    c->ans_f.close_after = 1;
    req_done(c);
}

/* The access log line of an answer that has one pending, with what the
 * client really got: the answer less what never left this process and
 * what the kernel still holds unacknowledged. */
static void log_closed(conn_t *c)
{
    size_t held = c->wpending + c->tp->unacked(c);
    uint64_t got = c->bytes > held ? c->bytes - held : 0;
    if (got < c->bytes && !c->errmsg[0])
        snprintf(c->errmsg, sizeof c->errmsg,
                 "the client acknowledged %" PRIu64 " of %" PRIu64 " bytes before the close", got,
                 c->bytes);
    access_log(c, got);
    req_reset(c);
}

void conn_close(conn_t *c)
{
    if (c->state == CS_CLOSING) return;
    server_t *s = c->srv;
    if (c->ans_f.active) cut_answer(c);
    if (c->ans_f.log_pending) log_closed(c);
    loop_t *lp = c->lp;
    lp->doomed_bytes += c->wpending;
    s->budget_used -= c->wpending;
    c->state = CS_CLOSING;
    if (c->prev) c->prev->next = c->next;
    else lp->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    lp->n_conns--;
    s->n_conns_all--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
    if (c->life_f.tp_open) c->tp->close(c);
}

/*
 * The polite close.  After the last answer the write side is shut and the
 * input read and dropped: closing a socket with unread input makes the
 * kernel send a reset, which destroys an answer the client has not read
 * yet (a 413 to a client still uploading).  Input is drained for at most
 * DRAIN_MS and DRAIN_MAX_BYTES, and the close waits until the client has
 * acknowledged every byte: a client that pauses before reading the tail
 * of a large answer still gets it.  A client that acknowledges nothing for
 * write_timeout_ms is cut.
 */
#define DRAIN_QUIET_MS 2000               /* input silent this long: the client is done */
#define DRAIN_MS 10000                    /* the longest time input is read and dropped */
#define DRAIN_MAX_BYTES ((size_t)64 << 20)

static void drain_check(conn_t *c)
{
    uint64_t now = uv_now(&c->lp->loop);
    size_t outq = c->tp->unacked(c);
    if (outq != c->outq_last) {
        c->outq_last = outq;
        c->outq_t = now;
    }
    int input_over = now - c->drain_t0 >= DRAIN_MS || c->drain_bytes >= DRAIN_MAX_BYTES;
    int input_done = c->in_f.peer_eof || input_over || now - c->drain_last_in >= DRAIN_QUIET_MS;
    if (outq == 0 && input_done) {
        conn_close(c);
        return;
    }
    if (outq > 0 && now - c->outq_t >= c->srv->cfg->limits.write_timeout_ms) {
        conn_close(c);
        return;
    }
    if (input_over && c->in_f.reading) {
        /* Enough dropped: stop reading, still wait for the acknowledgements. */
        c->tp->read_stop(c);
        c->in_f.reading = 0;
    }
}

void conn_shut(conn_t *c, int status)
{
    if (c->state == CS_CLOSING) return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    uint64_t now = uv_now(&c->lp->loop);
    c->drain_t0 = c->drain_last_in = c->outq_t = now;
    c->drain_bytes = 0;
    c->outq_last = (size_t)-1;
    c->rlen = 0;
    conn_set_state(c, CS_DRAINING);
    if (!c->in_f.reading && !c->in_f.peer_eof && c->tp->read_start(c) == 0) c->in_f.reading = 1;
    drain_check(c);
}

/* Half-closes after the queued writes. */
static void conn_shutdown(conn_t *c)
{
    if (c->state == CS_CLOSING || c->ans_f.shutting) return;
    c->ans_f.shutting = 1;
    if (c->tp->shutdown(c) != 0) conn_close(c);
}

static void timer_fired(uv_timer_t *t)
{
    conn_t *c = t->data;
    switch (c->state) {
    case CS_IDLE:
        conn_close(c);
        return;
    case CS_READ_HEAD:
    case CS_READ_BODY:
        if (c->state == CS_READ_HEAD && !iv_http_in_active(&c->in) && !c->rlen) {
            /* Connected and never sent a byte of a request: nothing to answer. */
            conn_close(c);
            return;
        }
        resp_begin_error(c);
        send_error(c, 408, "timeout",
                   iv_http_in_headers_done(&c->in) ? "the request body did not arrive in time"
                                                   : "the request headers did not arrive in time",
                   NULL);
        return;
    case CS_DISPATCHED:
        /* The computation ran out of time before any byte of the answer:
         * it is cancelled (req_done) and the client told so. */
        if (c->qs) qs_cancel(c->qs);
        LP_METRIC(c->lp, m_->compute_timeouts++);
        send_error(c, 503, "compute_timeout",
                   "the computation took longer than limits.compute_timeout_ms; retry later or ask "
                   "for less",
                   "Retry-After: 1\r\n");
        return;
    case CS_RESPONDING:
        if (!c->wpending && c->ans_f.active && c->qs && !c->qs->done) {
            /* A stream waited too long for its next block: its trailer says so. */
            iv_err_t e;
            iv_err_clear(&e);
            iv_fail(&e, IV_ECANCELLED, "a block took longer than limits.compute_timeout_ms");
            LP_METRIC(c->lp, m_->compute_timeouts++);
            qs_fail(c->qs, IV_ECANCELLED, &e);
            return;
        }
        if (!c->errmsg[0])
            snprintf(c->errmsg, sizeof c->errmsg, "the client read nothing for %u ms",
                     c->srv->cfg->limits.write_timeout_ms);
        conn_close(c);
        return;
    case CS_DRAINING:
        drain_check(c);
        if (c->state == CS_DRAINING) conn_set_state(c, CS_DRAINING);
        return;
    case CS_CLOSING:
        return;
    }
}

/* n bytes arrived at c->rbuf + c->rlen, or the input ended (UV_EOF) or
 * failed. */
void conn_input(conn_t *c, ssize_t n)
{
    if (c->state == CS_CLOSING) return;
    if (c->state == CS_DRAINING) {
        c->rlen = 0;  /* dropped */
        if (n > 0) {
            c->drain_bytes += (size_t)n;
            c->drain_last_in = uv_now(&c->lp->loop);
        } else if (n == UV_EOF) {
            c->in_f.peer_eof = 1;
            c->tp->read_stop(c);
            c->in_f.reading = 0;
            drain_check(c);
        } else if (n < 0) {
            conn_close(c);
        }
        return;
    }
    if (n < 0) {
        /* EOF: an answer being written is still written whole (the client
         * may have half-closed after sending its request), also when its
         * last bytes are only queued; otherwise the conversation is over. */
        if (n == UV_EOF && c->state == CS_RESPONDING) {
            c->in_f.peer_eof = 1;
            c->ans_f.close_after = 1;
            c->tp->read_stop(c);
            c->in_f.reading = 0;
            return;
        }
        /* EOF before any byte of the answer: the client left (as nginx
         * takes it, 499), and its work is cancelled (conn_close). */
        if (c->ans_f.active && !c->errmsg[0])
            snprintf(c->errmsg, sizeof c->errmsg, "the client closed the connection before the answer");
        conn_close(c);
        return;
    }
    if (n == 0) return;
    c->rlen += (size_t)n;
    conn_pump(c);
}

/* The status code and error code of a request the parser refused. */
static const char *parse_error_code(int status)
{
    switch (status) {
    case 413: return "too_large";
    case 417: return "expectation_failed";
    case 431: return "header_too_large";
    case 503: return "out_of_memory";
    case 505: return "http_version_not_supported";
    default: return "bad_request";
    }
}

/*
 * A request's headers are complete and its body is still to come: an
 * Expect header is answered now.  "100-continue" gets its interim answer
 * only when the route, the method, the dataset and the token would accept
 * the request; otherwise the final answer goes out at once and the
 * connection closes (the body is drained, not read).  Any other
 * expectation is 417.
 */
static void expect_check(conn_t *c)
{
    const iv_http_req_t *cur = iv_http_in_current(&c->in);
    const char *ex = cur ? cur->hdr[IV_H_EXPECT] : NULL;
    if (!ex) return;
    /* The parser keeps a value's trailing blanks. */
    if (strncasecmp(ex, "100-continue", 12) != 0 || ex[12 + strspn(ex + 12, " \t")] != '\0') {
        resp_begin_error(c);
        send_error(c, 417, "expectation_failed", "only Expect: 100-continue is supported", NULL);
        return;
    }
    rfail_t f;
    if (route_precheck(c, cur, &f) != 0) {
        resp_begin_error(c);
        c->route = f.route;
        send_error(c, f.status, f.code, f.msg, f.extra);
        return;
    }
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    conn_write(c, NULL, 0, cont, sizeof cont - 1, 0, 0, NULL, 0);
}

/* Requests parsed ahead hold at most this much (bodies, targets). */
#define AHEAD_MAX_BYTES ((size_t)64 << 10)

static size_t req_mem(const iv_http_req_t *r)
{
    return r->body.len + 2 * (r->target ? strlen(r->target) : 0) + 512;
}

/* Parses up to n bytes of the input ahead: a complete request joins the
 * queue, a parse error is kept for its turn.  -1 when nothing could be
 * taken (the parser wants more than there is). */
static int parse_one_ahead(conn_t *c, size_t n)
{
    size_t used = 0;
    iv_http_req_t *req = NULL;
    int rc = iv_http_in_feed(&c->in, c->rbuf, n, &used, &req);
    if (used) {
        memmove(c->rbuf, c->rbuf + used, c->rlen - used);
        c->rlen -= used;
    }
    if (rc == 1) {
        c->ahead[(c->ahead_first + c->n_ahead) % c->ahead_cap] = req;
        c->n_ahead++;
        c->ahead_bytes += req_mem(req);
    } else if (rc < 0) {
        c->in_f.ahead_err = 1;
    } else if (used == 0) {
        return -1;
    }
    return 0;
}

/*
 * While an answer is in flight, the requests behind it are parsed into a
 * queue, within limits.max_pipeline requests and AHEAD_MAX_BYTES, so that
 * a client's pipelined requests leave the read buffer and a bad one is
 * found early (it is answered in its turn).  A request whose headers ask
 * for "100 Continue" waits: that is answered only when it is next.
 */
static void conn_parse_ahead(conn_t *c)
{
    while (c->rlen > 0 && !c->in_f.ahead_err && c->n_ahead < c->ahead_cap) {
        const iv_http_req_t *cur = iv_http_in_current(&c->in);
        size_t held = c->ahead_bytes + (cur ? cur->body.len : 0);
        if (held >= AHEAD_MAX_BYTES) break;
        if (cur && iv_http_in_headers_done(&c->in) && cur->hdr[IV_H_EXPECT]) break;
        if (parse_one_ahead(c, c->rlen < AHEAD_MAX_BYTES - held ? c->rlen : AHEAD_MAX_BYTES - held) != 0)
            break;
    }
}

/* Answers a request that could not be parsed (its status and message are
 * the parser's). */
static void answer_parse_error(conn_t *c)
{
    resp_begin_error(c);
    send_error(c, c->in.err_status, parse_error_code(c->in.err_status), c->in.err_msg, NULL);
}

/* Feeds the bytes read to the parser; a complete request is dispatched. */
static void parse_input(conn_t *c)
{
    size_t used = 0;
    iv_http_req_t *req = NULL;
    int rc = iv_http_in_feed(&c->in, c->rbuf, c->rlen, &used, &req);
    if (used) {
        memmove(c->rbuf, c->rbuf + used, c->rlen - used);
        c->rlen -= used;
    }
    if (rc == 1) {
        resp_begin(c, req);
        dispatch(c);
    } else if (rc < 0) {
        answer_parse_error(c);
    }
}

/* The next request: one parsed ahead, then a parse error met ahead, then
 * what the input holds. */
static void start_next_request(conn_t *c)
{
    if (c->n_ahead) {
        iv_http_req_t *req = c->ahead[c->ahead_first];
        c->ahead_first = (c->ahead_first + 1) % c->ahead_cap;
        c->n_ahead--;
        c->ahead_bytes -= req_mem(req);
        resp_begin(c, req);
        dispatch(c);
    } else if (c->in_f.ahead_err) {
        c->in_f.ahead_err = 0;
        answer_parse_error(c);
    } else if (c->rlen > 0) {
        parse_input(c);
    }
}

/* Still reading: a request begun puts the connection in its head or body
 * state (with their deadlines), and a body is checked against Expect once. */
static void note_partial_request(conn_t *c)
{
    if (iv_http_in_headers_done(&c->in)) {
        conn_enter(c, CS_READ_BODY);
        if (!c->in_f.expect_checked) {
            c->in_f.expect_checked = 1;
            expect_check(c);
        }
    } else if (iv_http_in_active(&c->in)) {
        conn_enter(c, CS_READ_HEAD);
    }
    if (c->state == CS_READ_HEAD || c->state == CS_READ_BODY) c->tp->quickack(c);
}

/* Reads while there is room, the peer may send and the connection takes
 * more; a draining connection keeps its reads as they are. */
static void update_reading(conn_t *c)
{
    int want = c->rlen < c->rcap && !c->in_f.peer_eof && !c->ans_f.close_after && c->state != CS_DRAINING;
    if (want && !c->in_f.reading) {
        if (c->tp->read_start(c) == 0) c->in_f.reading = 1;
    } else if (!want && c->in_f.reading && c->state != CS_DRAINING) {
        c->tp->read_stop(c);
        c->in_f.reading = 0;
    }
}

/*
 * Between answers: starts the next request (parsed ahead, or parsed now
 * from the read buffer), answers a parse error in its turn, or handles a
 * request still arriving (its Expect, its state).  While an answer is in
 * flight: parses ahead.  Then starts or stops reading (the input buffer
 * is full, or the connection closes after its answer).  The next request
 * starts only when the previous answer's last write completed
 * (resp_finished calls this).
 */
static void conn_pump(conn_t *c)
{
    if (c->state == CS_CLOSING || c->in_f.in_pump) return;
    c->in_f.in_pump = 1;
    if (is_reading_state(c)) {
        start_next_request(c);
        if (is_reading_state(c)) note_partial_request(c);
    }
    if ((c->state == CS_DISPATCHED || c->state == CS_RESPONDING) && !c->ans_f.close_after)
        conn_parse_ahead(c);
    c->in_f.in_pump = 0;
    if (c->state == CS_CLOSING) return;
    update_reading(c);
}


/* ---- the loop's callbacks (each within loop_enter / loop_leave) ---------- */

static void on_timer(uv_timer_t *t)
{
    loop_t *lp = ((conn_t *)t->data)->lp;
    loop_enter(lp);
    timer_fired(t);
    loop_leave(lp);
}

conn_t *conn_by_id(loop_t *lp, uint64_t id)
{
    for (conn_t *c = lp->conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

conn_t *conn_create(loop_t *lp, const iv_transport_t *tp)
{
    server_t *s = lp->srv;
    conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    c->lp = lp;
    c->tp = tp;
    c->id = atomic_fetch_add(&s->next_conn_id, 1);
    c->rcap = s->cfg->limits.header_bytes + 4096 > READ_BUF_BYTES ? s->cfg->limits.header_bytes + 4096
                                                                   : READ_BUF_BYTES;
    c->rbuf = malloc(c->rcap);
    c->ahead_cap = s->cfg->limits.max_pipeline ? s->cfg->limits.max_pipeline : 1;
    c->ahead = calloc(c->ahead_cap, sizeof *c->ahead);
    if (!c->rbuf || !c->ahead || uv_timer_init(&lp->loop, &c->timer) != 0) {
        free(c->ahead);
        free(c->rbuf);
        free(c);
        return NULL;
    }
    c->timer.data = c;
    c->handles_open = 1;
    c->cells = c->genes = -1;
    iv_http_in_init(&c->in, s->cfg->limits.header_bytes, s->cfg->limits.body_bytes);
    c->next = lp->conns;
    if (lp->conns) lp->conns->prev = c;
    lp->conns = c;
    lp->n_conns++;
    s->n_conns_all++;
    LP_METRIC(lp, m_->connections_total++);
    c->last_progress = uv_now(&lp->loop);
    return c;
}

void conn_attached(conn_t *c)
{
    c->life_f.tp_open = 1;
    c->handles_open++;
}

void conn_start(conn_t *c)
{
    server_t *s = c->srv;
    /* A new connection owes its first request within the header timeout,
     * not the keep-alive time. */
    conn_set_state(c, CS_READ_HEAD);
    if (s->n_conns_all > s->cfg->limits.max_connections || c->lp->draining) {
        resp_begin_error(c);
        send_error(c, 503, "overloaded", "too many connections", "Retry-After: 1\r\n");
        return;
    }
    conn_pump(c);
}

void conn_adopt(loop_t *lp, int fd)
{
    conn_t *c = conn_create(lp, &iv_tcp_transport);
    if (!c) {
        close(fd);
        return;
    }
    if (iv_tcp_open(c, fd) != 0) {
        conn_close(c);
        return;
    }
    conn_start(c);
}
