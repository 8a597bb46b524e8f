/*
 * Tests of the connection state machine (server/conn.c, respond.c,
 * qstream.c) and the output chain (ostream.c) against a fake transport: a server built without a listening
 * socket (server_open), connections whose writes and shutdowns are held
 * until the test completes them, input fed by hand, and the server's own
 * loop run in small steps.  Each test looks at the state, the timers'
 * effects and the bytes written, one event at a time, with nothing left
 * to the kernel's timing.
 */
#include <check.h>

#include "check_main.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "gzip_stream.h"
#include "srv_conn.h"
#include "srv_datasets.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_qstream.h"
#include "srv_respond.h"

/* ---- the fake transport ------------------------------------------------- */

#define HELD_MAX 4096

typedef struct fake {
    conn_t *c;            /* NULL once freed */
    int reading;
    char *out;            /* every byte written, in order */
    size_t out_len, out_cap;
    uv_write_t *held[HELD_MAX];  /* writes not yet completed, oldest first */
    size_t held_end[HELD_MAX];   /* out_len after each of them */
    unsigned n_held;
    int shut_asked;       /* shutdown called, not completed */
    int shut_calls;
    int close_asked;
    size_t unacked;       /* what the transport reports as unacknowledged */
    int quickacks;
} fake_t;

static fake_t *fake_of(conn_t *c)
{
    return c->tp_ctx;
}

static int f_read_start(conn_t *c)
{
    fake_of(c)->reading = 1;
    return 0;
}

static void f_read_stop(conn_t *c)
{
    fake_of(c)->reading = 0;
}

static int f_write(conn_t *c, uv_write_t *w, const uv_buf_t *bufs, unsigned n)
{
    fake_t *f = fake_of(c);
    ck_assert_uint_lt(f->n_held, HELD_MAX);
    for (unsigned i = 0; i < n; i++) {
        if (f->out_len + bufs[i].len > f->out_cap) {
            size_t cap = f->out_cap ? f->out_cap : 4096;
            while (cap < f->out_len + bufs[i].len) cap *= 2;
            f->out = realloc(f->out, cap);
            ck_assert_ptr_nonnull(f->out);
            f->out_cap = cap;
        }
        if (bufs[i].len) memcpy(f->out + f->out_len, bufs[i].base, bufs[i].len);
        f->out_len += bufs[i].len;
    }
    f->held[f->n_held] = w;
    f->held_end[f->n_held] = f->out_len;
    f->n_held++;
    return 0;
}

static int f_shutdown(conn_t *c)
{
    fake_t *f = fake_of(c);
    f->shut_asked = 1;
    f->shut_calls++;
    return 0;
}

static void f_close(conn_t *c)
{
    fake_t *f = fake_of(c);
    f->close_asked = 1;
    f->reading = 0;
}

static size_t f_unacked(conn_t *c)
{
    return fake_of(c)->unacked;
}

static void f_quickack(conn_t *c)
{
    fake_of(c)->quickacks++;
}

static const iv_transport_t fake_tp = {
    .read_start = f_read_start,
    .read_stop = f_read_stop,
    .write = f_write,
    .shutdown = f_shutdown,
    .close = f_close,
    .unacked = f_unacked,
    .quickack = f_quickack,
};

/* ---- the server and its loop -------------------------------------------- */

static iv_config_t cfg;
static server_t *srv;

static void cfg_base(void)
{
    iv_config_init(&cfg);
    cfg.threads = 2;
    cfg.loops = 1;
    cfg.transpose_bytes = 0;
    free(cfg.access_log);
    cfg.access_log = strdup("off");
    free(cfg.log_format);
    cfg.log_format = strdup("text");
    cfg.limits.header_timeout_ms = 5000;
    cfg.limits.body_timeout_ms = 5000;
    cfg.limits.keepalive_ms = 5000;
    cfg.limits.write_timeout_ms = 5000;
    cfg.limits.compute_timeout_ms = 5000;
}

static void srv_start(void)
{
    srv = server_open(&cfg, NULL, NULL);
    ck_assert_ptr_nonnull(srv);
}

static uv_loop_t *uvl(void)
{
    return &srv->loops[0].loop;
}

static double now_ms(void)
{
    return now_s() * 1e3;
}

/* Runs the loop's ready callbacks (timers due, finished jobs), once. */
static void step(void)
{
    uv_run(uvl(), UV_RUN_NOWAIT);
}

/* Runs the loop for about ms milliseconds. */
static void run_for(double ms)
{
    double end = now_ms() + ms;
    while (now_ms() < end) {
        step();
        usleep(500);
    }
}

#define RUN_UNTIL(cond, ms)                                   \
    do {                                                      \
        double end_ = now_ms() + (ms);                        \
        while (!(cond) && now_ms() < end_) {                  \
            step();                                           \
            usleep(500);                                      \
        }                                                     \
        ck_assert_msg((cond), "timed out waiting for " #cond); \
    } while (0)

/* Loads every configured dataset as the server does at start-up. */
static void load_all(void)
{
    for (size_t i = 0; i < srv->reg.n; i++) load_submit(srv, srv->reg.v[i], 0, 0, 0);
    for (size_t i = 0; i < srv->reg.n; i++) {
        RUN_UNTIL(srv->reg.v[i]->state != DS_LOADING, 60000);
        ck_assert_int_eq(srv->reg.v[i]->state, DS_READY);
    }
}

/* ---- connections -------------------------------------------------------- */

static fake_t *connect_fake(void)
{
    fake_t *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    conn_t *c = conn_create(&srv->loops[0], &fake_tp);
    ck_assert_ptr_nonnull(c);
    c->tp_ctx = f;
    f->c = c;
    conn_attached(c);
    conn_start(c);
    return f;
}

/* Input, as a socket delivers it: only while the connection reads, at
 * most what its buffer takes at a time.  Returns the bytes taken. */
static size_t feed(fake_t *f, const char *p, size_t n)
{
    size_t done = 0;
    while (done < n && f->c && f->reading && !f->close_asked) {
        conn_t *c = f->c;
        size_t room = c->rcap - c->rlen;
        if (!room) break;
        size_t k = n - done < room ? n - done : room;
        memcpy(c->rbuf + c->rlen, p + done, k);
        conn_input(c, (ssize_t)k);
        done += k;
    }
    return done;
}

static void feed_str(fake_t *f, const char *s)
{
    ck_assert_uint_eq(feed(f, s, strlen(s)), strlen(s));
}

static void feed_eof(fake_t *f)
{
    ck_assert(f->reading);
    conn_input(f->c, UV_EOF);
}

/* Completes the oldest held write with status. */
static void complete1(fake_t *f, int status)
{
    ck_assert_uint_gt(f->n_held, 0);
    uv_write_t *w = f->held[0];
    f->n_held--;
    memmove(f->held, f->held + 1, f->n_held * sizeof f->held[0]);
    memmove(f->held_end, f->held_end + 1, f->n_held * sizeof f->held_end[0]);
    conn_wrote(w, status);
}

/* Completes held writes (and any they lead to) until none is held,
 * running the loop so that workers' blocks arrive, until the answer in
 * flight is over or ms pass. */
static void complete_all(fake_t *f, double ms)
{
    double end = now_ms() + ms;
    while (now_ms() < end && !f->close_asked) {
        if (f->n_held) {
            complete1(f, 0);
            continue;
        }
        if (!f->c->ans_f.active && !f->c->n_ahead && f->c->state != CS_DISPATCHED) break;
        step();
        usleep(200);
    }
}

static void shut_done(fake_t *f, int status)
{
    ck_assert(f->shut_asked);
    f->shut_asked = 0;
    conn_shut(f->c, status);
}

/* The last answer's last write completes: only then is the write side
 * shut, and the connection goes on to drain its input. */
static void last_write_then_shut(fake_t *f)
{
    ck_assert(!f->shut_asked);
    complete1(f, 0);
    ck_assert(f->shut_asked);
    ck_assert(!f->close_asked);
    shut_done(f, 0);
}

/* The transport's side of a close, as libuv does it: pending writes and
 * a pending shutdown are cancelled, then the handle's close callback. */
static void finish_close(fake_t *f)
{
    ck_assert(f->close_asked);
    conn_t *c = f->c;
    while (f->n_held) complete1(f, UV_ECANCELED);
    if (f->shut_asked) {
        f->shut_asked = 0;
        conn_shut(c, UV_ECANCELED);
    }
    conn_transport_closed(c);
    f->c = NULL;
    step();  /* the timer's close callback frees the connection */
}

static void fake_free(fake_t *f)
{
    if (f->c && !f->close_asked) conn_close(f->c);
    if (f->c) finish_close(f);
    free(f->out);
    free(f);
}

static void srv_stop(void)
{
    ck_assert_ptr_null(srv->loops[0].conns);
    server_free(srv, SRV_LOOPS);
    srv = NULL;
    iv_config_free(&cfg);
}

/* ---- what was written --------------------------------------------------- */

static size_t count_of(const fake_t *f, const char *needle)
{
    size_t n = 0, k = strlen(needle);
    for (size_t i = 0; i + k <= f->out_len; i++)
        if (!memcmp(f->out + i, needle, k)) n++;
    return n;
}

/* The position of the n-th (0-based) status line, or out_len. */
static size_t answer_at(const fake_t *f, size_t nth)
{
    size_t n = 0;
    for (size_t i = 0; i + 9 <= f->out_len; i++)
        if (!memcmp(f->out + i, "HTTP/1.1 ", 9) && n++ == nth) return i;
    return f->out_len;
}

static int status_of(const fake_t *f, size_t nth)
{
    size_t at = answer_at(f, nth);
    ck_assert_uint_lt(at, f->out_len);
    return atoi(f->out + at + 9);
}

#define GET(path) "GET " path " HTTP/1.1\r\nHost: t\r\n\r\n"
#define GET_CLOSE(path) "GET " path " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"

/* ---- tests -------------------------------------------------------------- */

START_TEST(test_pipelined_answers_wait_for_the_last_write)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    ck_assert_int_eq(f->c->state, CS_READ_HEAD);
    feed_str(f, GET("/healthz") GET("/nope") GET("/healthz"));
    /* The first answer is written; the second waits for its last write. */
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 1);
    ck_assert_int_eq(status_of(f, 0), 200);
    ck_assert_int_eq(f->c->state, CS_RESPONDING);
    ck_assert_uint_eq(f->c->n_ahead, 2);  /* parsed ahead, not started */
    run_for(20);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 1);
    complete1(f, 0);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 2);
    ck_assert_int_eq(status_of(f, 1), 404);
    ck_assert_int_eq(f->c->state, CS_RESPONDING);
    complete1(f, 0);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 3);
    ck_assert_int_eq(status_of(f, 2), 200);
    complete1(f, 0);
    ck_assert_int_eq(f->c->state, CS_IDLE);
    ck_assert_uint_eq(f->n_held, 0);
    ck_assert(f->reading);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_parse_ahead_is_bounded_by_max_pipeline)
{
    cfg_base();
    cfg.limits.max_pipeline = 2;
    srv_start();
    fake_t *f = connect_fake();
    char in[2048] = "";
    for (int i = 0; i < 8; i++) strcat(in, i % 2 ? GET("/nope") : GET("/healthz"));
    size_t took = feed(f, in, strlen(in));
    ck_assert_uint_eq(took, strlen(in));  /* all fits the read buffer */
    ck_assert_uint_eq(f->c->n_ahead, 2);
    ck_assert_uint_gt(f->c->rlen, 0);     /* the rest waits, unparsed */
    complete_all(f, 5000);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 8);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(status_of(f, (size_t)i), i % 2 ? 404 : 200);
    ck_assert_int_eq(f->c->state, CS_IDLE);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_silent_connection_closed_at_the_header_timeout)
{
    cfg_base();
    cfg.limits.header_timeout_ms = 60;
    srv_start();
    double t0 = now_ms();
    fake_t *f = connect_fake();
    RUN_UNTIL(f->close_asked, 3000);
    double took = now_ms() - t0;
    ck_assert_double_ge(took, 55);
    ck_assert_double_lt(took, 2000);   /* not the keep-alive time (5 s) */
    ck_assert_uint_eq(f->out_len, 0);  /* nothing to answer */
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_partial_headers_get_408_and_a_polite_close)
{
    cfg_base();
    cfg.limits.header_timeout_ms = 60;
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, "GET /healthz HTTP/1.1\r\nHo");
    ck_assert_int_eq(f->c->state, CS_READ_HEAD);
    ck_assert_int_gt(f->quickacks, 0);
    RUN_UNTIL(f->out_len > 0, 3000);
    ck_assert_int_eq(status_of(f, 0), 408);
    ck_assert_uint_eq(count_of(f, "headers did not arrive"), 1);
    ck_assert_uint_eq(count_of(f, "Connection: close"), 1);
    last_write_then_shut(f);
    ck_assert_int_eq(f->c->state, CS_DRAINING);
    ck_assert(f->reading);     /* input is drained, not left to cause a reset */
    feed_str(f, "st: t\r\n\r\nmore bytes the client still sends");
    ck_assert(!f->close_asked);
    feed_eof(f);
    ck_assert(f->close_asked);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_body_timeout_names_the_body)
{
    cfg_base();
    cfg.limits.body_timeout_ms = 60;
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, "POST /v1/datasets/x/query HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n{\"ob");
    ck_assert_int_eq(f->c->state, CS_READ_BODY);
    RUN_UNTIL(f->out_len > 0, 3000);
    ck_assert_int_eq(status_of(f, 0), 408);
    ck_assert_uint_eq(count_of(f, "body did not arrive"), 1);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_idle_keepalive_closes_without_a_byte)
{
    cfg_base();
    cfg.limits.keepalive_ms = 80;
    srv_start();
    fake_t *f = connect_fake();
    /* t0 before the request, and the loop's clock brought to it: the
     * server stamps the answer's end with the loop's clock, which lags
     * real time by an iteration (tens of ms under TSan), so a t0 taken
     * after the answer could be later than the stamp. */
    double t0 = now_ms();
    uv_update_time(uvl());
    feed_str(f, GET("/healthz"));
    complete1(f, 0);
    ck_assert_int_eq(f->c->state, CS_IDLE);
    size_t len = f->out_len;
    RUN_UNTIL(f->close_asked, 3000);
    ck_assert_double_ge(now_ms() - t0, 70);
    ck_assert_uint_eq(f->out_len, len);
    ck_assert_int_eq(f->shut_calls, 0);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_a_client_that_reads_nothing_is_cut_at_the_write_timeout)
{
    cfg_base();
    cfg.limits.write_timeout_ms = 80;
    srv_start();
    fake_t *f = connect_fake();
    double t0 = now_ms();   /* before the write, the loop's clock at it (above) */
    uv_update_time(uvl());
    feed_str(f, GET("/healthz"));
    ck_assert_int_eq(f->c->state, CS_RESPONDING);
    RUN_UNTIL(f->close_asked, 3000);
    ck_assert_double_ge(now_ms() - t0, 70);
    ck_assert_uint_eq(f->n_held, 1);  /* cancelled by the close */
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_a_failed_write_closes)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, GET("/healthz") GET("/healthz"));
    complete1(f, UV_EPIPE);
    ck_assert(f->close_asked);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 1);  /* the second never starts */
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_close_waits_until_the_client_acknowledged_everything)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, GET_CLOSE("/healthz"));
    last_write_then_shut(f);
    ck_assert_int_eq(f->c->state, CS_DRAINING);
    f->unacked = 5000;  /* the tail still in the kernel, unacknowledged */
    feed_eof(f);
    run_for(150);
    ck_assert(!f->close_asked);
    ck_assert_int_eq(f->c->state, CS_DRAINING);
    f->unacked = 0;
    RUN_UNTIL(f->close_asked, 1000);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_unacknowledged_tail_is_cut_at_the_write_timeout)
{
    cfg_base();
    cfg.limits.write_timeout_ms = 100;
    srv_start();
    fake_t *f = connect_fake();
    double t0 = now_ms();
    feed_str(f, GET_CLOSE("/healthz"));
    last_write_then_shut(f);
    f->unacked = 5000;
    feed_eof(f);
    RUN_UNTIL(f->close_asked, 3000);
    /* Cut by the 100 ms timer, not at once.  The timer counts from the
     * loop's cached clock, which may lag the real one by a loop turn (tens
     * of milliseconds under ThreadSanitizer), so the bound leaves room. */
    ck_assert_double_ge(now_ms() - t0, 50);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_eof_after_the_request_still_gets_the_answer)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, GET("/healthz"));
    feed_eof(f);  /* half-closed after sending */
    ck_assert(!f->close_asked);
    ck_assert_int_eq(f->c->state, CS_RESPONDING);
    ck_assert(!f->reading);
    last_write_then_shut(f);
    /* The client's input is over and it acknowledged everything. */
    ck_assert(f->close_asked);
    ck_assert_int_eq(status_of(f, 0), 200);
    fake_free(f);
    srv_stop();
}
END_TEST

START_TEST(test_a_bad_request_is_answered_then_closed)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    feed_str(f, GET("/healthz") "BLAH\r\n\r\n" GET("/healthz"));
    ck_assert_int_eq(status_of(f, 0), 200);
    complete1(f, 0);
    ck_assert_int_eq(status_of(f, 1), 400);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 2);
    last_write_then_shut(f);
    feed_eof(f);
    ck_assert(f->close_asked);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 2);  /* nothing after the error */
    fake_free(f);
    srv_stop();
}
END_TEST

/* ---- streams, on the bundled example dataset ---------------------------- */

static void cfg_example(void)
{
    cfg_base();
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_add_path(&cfg, IV_SOURCE_DIR "/examples/pbmc_example.h5ad", &e), 0);
}

#define QA "/v1/datasets/pbmc_example/query?obs=0:300&var=0:200"
#define QB "/v1/datasets/pbmc_example/query?obs=299,3,3,17&var=5:50&format=ndjson"
#define QC "/v1/datasets/pbmc_example/count?obs=0:100"

/* The answer to request req alone, on a connection of its own. */
static char *answer_alone(const char *req, size_t *len)
{
    fake_t *f = connect_fake();
    feed_str(f, req);
    complete_all(f, 20000);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 1);
    ck_assert_int_eq(status_of(f, 0), 200);
    char *a = malloc(f->out_len);
    memcpy(a, f->out, f->out_len);
    *len = f->out_len;
    fake_free(f);
    return a;
}

/* Two requests pipelined in one write: the second answer's first byte is
 * written only after the first answer's last write completed, and each
 * answer is byte for byte the answer it gets alone. */
static void pipeline_pair(const char *ra, const char *rb)
{
    size_t la, lb;
    char *a = answer_alone(ra, &la);
    char *b = answer_alone(rb, &lb);
    fake_t *f = connect_fake();
    char both[1024];
    snprintf(both, sizeof both, "%s%s", ra, rb);
    feed_str(f, both);
    double end = now_ms() + 20000;
    while (now_ms() < end &&
           (f->c->ans_f.active || f->c->n_ahead || f->n_held || f->c->state == CS_DISPATCHED)) {
        if (!f->n_held) {
            step();
            usleep(200);
            continue;
        }
        size_t before = f->out_len;
        unsigned held_before = f->n_held;
        size_t first_end = f->held_end[0];
        complete1(f, 0);
        if (before <= la && f->out_len > la) {
            /* This completion started the second answer: it was the first
             * answer's last write, and nothing else was in flight. */
            ck_assert_uint_eq(held_before, 1);
            ck_assert_uint_eq(first_end, la);
        }
    }
    ck_assert_uint_eq(f->out_len, la + lb);
    ck_assert(!memcmp(f->out, a, la));
    ck_assert(!memcmp(f->out + la, b, lb));
    ck_assert_int_eq(f->c->state, CS_IDLE);
    fake_free(f);
    free(a);
    free(b);
}

START_TEST(test_pipelined_streams_answer_in_order)
{
    cfg_example();
    cfg.limits.blocks_ahead = 1;
    srv_start();
    load_all();
    const char *reqs[] = {
        "GET " QA " HTTP/1.1\r\nHost: t\r\nAccept: application/vnd.ivserve.csr\r\n\r\n",
        "GET " QB " HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET " QC " HTTP/1.1\r\nHost: t\r\n\r\n",
        "HEAD " QA " HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET " QA "&format=json HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET /v1/datasets/pbmc_example/obs?limit=5 HTTP/1.1\r\nHost: t\r\n\r\n",
    };
    /* stream->stream, stream->count, count->stream, HEAD->stream,
     * json->stream, metadata->stream. */
    pipeline_pair(reqs[0], reqs[1]);
    pipeline_pair(reqs[1], reqs[2]);
    pipeline_pair(reqs[2], reqs[0]);
    pipeline_pair(reqs[3], reqs[1]);
    pipeline_pair(reqs[4], reqs[0]);
    pipeline_pair(reqs[5], reqs[1]);
    srv_stop();
}
END_TEST

START_TEST(test_a_stream_keeps_its_window_while_the_client_reads_nothing)
{
    cfg_example();
    cfg.limits.blocks_ahead = 1;
    cfg.threads = 4;
    srv_start();
    load_all();
    fake_t *f = connect_fake();
    /* Every cell 8 times: 2 M stored values, about 8 blocks. */
    size_t cap = 200000, len = 0;
    char *body = malloc(cap);
    len += (size_t)snprintf(body, cap, "{\"obs\":{\"index\":[");
    for (int i = 0; i < 16000; i++) len += (size_t)snprintf(body + len, cap - len, "%s%d", i ? "," : "", i % 2000);
    len += (size_t)snprintf(body + len, cap - len, "]}}");
    char head[256];
    snprintf(head, sizeof head, "POST /v1/datasets/pbmc_example/query HTTP/1.1\r\nHost: t\r\n"
             "Accept: application/vnd.ivserve.csr\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n", len);
    feed_str(f, head);
    ck_assert_uint_eq(feed(f, body, len), len);
    free(body);
    RUN_UNTIL(f->c->qs && f->c->qs->prepared && f->n_held >= 1, 20000);
    qstream_t *qs = f->c->qs;
    ck_assert_int_gt(qs->n_blocks, 4);  /* enough blocks for a window to matter */
    run_for(300);
    /* Nothing was acknowledged: the stream decoded at most its window
     * ahead of the writes that completed (none). */
    ck_assert_int_le(qs->next_submit, (int64_t)qs->ahead);
    ck_assert_int_eq(qs->writes_done, 0);
    complete_all(f, 20000);
    ck_assert_int_eq(f->c->state, CS_IDLE);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 1);
    ck_assert_int_eq(status_of(f, 0), 200);
    fake_free(f);
    srv_stop();
}
END_TEST

/* A worker held busy: the request's set-up cannot start. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate_t;

static void gate_wait(void *arg)
{
    gate_t *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

START_TEST(test_a_computation_past_its_limit_is_answered_503)
{
    cfg_example();
    cfg.threads = 1;
    cfg.limits.compute_timeout_ms = 100;
    cfg.limits.write_timeout_ms = 20;  /* not the limit that applies */
    srv_start();
    load_all();
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    ck_assert_int_eq(iv_pool_submit(srv->pool, gate_wait, &g), 0);
    fake_t *f = connect_fake();
    feed_str(f, "GET " QA " HTTP/1.1\r\nHost: t\r\n\r\n");
    ck_assert_int_eq(f->c->state, CS_DISPATCHED);
    run_for(50);
    ck_assert_int_eq(f->c->state, CS_DISPATCHED);  /* past the write timeout, still waiting */
    ck_assert_uint_eq(f->out_len, 0);
    RUN_UNTIL(f->out_len > 0, 3000);
    ck_assert_int_eq(status_of(f, 0), 503);
    ck_assert_uint_eq(count_of(f, "\"compute_timeout\""), 1);
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    complete_all(f, 5000);
    /* The cancelled set-up comes back and is dropped; the connection
     * serves the next request. */
    run_for(50);
    feed_str(f, GET("/healthz"));
    complete_all(f, 5000);
    ck_assert_uint_eq(count_of(f, "HTTP/1.1 "), 2);
    ck_assert_int_eq(status_of(f, 1), 200);
    fake_free(f);
    srv_stop();
}
END_TEST

/* ---- the output chain (ostream.c), driven directly ------------------------ */

/* A request as the parser hands it over, answered on f's connection. */
static void begin_answer(fake_t *f, int method, int minor)
{
    iv_http_req_t *r = calloc(1, sizeof *r);
    ck_assert_ptr_nonnull(r);
    r->method = method;
    r->http_major = 1;
    r->http_minor = minor;
    r->keep_alive = 1;  /* as asked: HTTP/1.0 must still close */
    resp_begin(f->c, r);
}

/* The body after the head of the first answer in f's output: *head_end
 * gets where the head ends.  De-chunked when chunked (and then every byte
 * of the output must be framing or body, the last chunk last). */
static size_t answer_body(const fake_t *f, int chunked, char *body, size_t cap, size_t *head_end)
{
    const char *o = f->out, *e = f->out + f->out_len;
    const char *h = NULL;
    for (const char *p = o; p + 4 <= e; p++)
        if (!memcmp(p, "\r\n\r\n", 4)) {
            h = p + 4;
            break;
        }
    ck_assert_ptr_nonnull(h);
    *head_end = (size_t)(h - o);
    size_t n = 0;
    if (!chunked) {
        ck_assert_uint_le((size_t)(e - h), cap);
        memcpy(body, h, (size_t)(e - h));
        return (size_t)(e - h);
    }
    for (;;) {
        char *end;
        unsigned long len = strtoul(h, &end, 16);
        ck_assert_msg(end > h && end + 2 <= e && !memcmp(end, "\r\n", 2), "a chunk-size line");
        h = end + 2;
        if (len == 0) {
            ck_assert_msg(h + 2 == e && !memcmp(h, "\r\n", 2), "the last chunk ends the output");
            return n;
        }
        ck_assert_msg(h + len + 2 <= e && !memcmp(h + len, "\r\n", 2), "a chunk's data and CRLF");
        ck_assert_uint_le(n + len, cap);
        memcpy(body + n, h, len);
        n += len;
        h += len + 2;
    }
}

/* in[0..n) as exactly one gzip member (zlib checks its CRC and length),
 * inflated into out; returns the bytes it holds. */
static size_t gunzip_all(const char *in, size_t n, char *out, size_t cap)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    ck_assert_int_eq(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)n;
    zs.next_out = (Bytef *)out;
    zs.avail_out = (uInt)cap;
    ck_assert_int_eq(inflate(&zs, Z_FINISH), Z_STREAM_END);
    ck_assert_uint_eq(zs.avail_in, 0);
    size_t got = zs.total_out;
    inflateEnd(&zs);
    return got;
}

/* A connection whose answer has begun: a chunked gzip head. */
static fake_t *gzip_begun(void)
{
    fake_t *f = connect_fake();
    begin_answer(f, HTTP_GET, 1);
    os_head(f->c, 200, "application/x-test", -1, "Content-Encoding: gzip\r\n", 1);
    return f;
}

/* A gzip stream as qstream.c makes one: the loop's header record, a
 * block a worker deflated written as a piece, another joined to the
 * pending bytes, the trailer record.  The client's view: chunks that
 * de-chunk to one gzip member, which inflates (CRC and length checked
 * by zlib) to the records and blocks in order. */
START_TEST(test_the_output_chain_makes_one_gzip_member_of_a_stream)
{
    cfg_base();
    srv_start();
    fake_t *f = gzip_begun();
    conn_t *c = f->c;
    os_record(c, "header;", 7);
    iv_buf_t z1, z2;
    iv_buf_init(&z1);
    iv_buf_init(&z2);
    uint32_t crc1, crc2;
    static const char b1[] = "the first block, deflated on a worker;";
    static const char b2[] = "the second, joined to the trailer;";
    ck_assert_int_eq(iv_gz_block(&z1, b1, strlen(b1), 1, &crc1), 0);
    ck_assert_int_eq(iv_gz_block(&z2, b2, strlen(b2), 6, &crc2), 0);
    wpiece_t p = {NULL, 0, 1};
    p.p = iv_buf_steal(&z1, &p.len);
    ck_assert_int_eq(os_write(c, &p, 1, crc1, strlen(b1), NULL), 0);
    os_coded(c, z2.data, z2.len, crc2, strlen(b2));
    iv_buf_free(&z2);
    os_record(c, "trailer", 7);
    ck_assert_int_eq(os_end(c, NULL, NULL), 0);
    complete_all(f, 5000);
    static char body[1 << 16], plain[1 << 16];
    size_t head_end, n = answer_body(f, 1, body, sizeof body, &head_end);
    ck_assert(memmem(f->out, head_end, "Transfer-Encoding: chunked\r\n", 28) != NULL);
    ck_assert(memmem(f->out, head_end, "Content-Encoding: gzip\r\n", 24) != NULL);
    char want[256];
    snprintf(want, sizeof want, "header;%s%strailer", b1, b2);
    ck_assert_uint_eq(gunzip_all(body, n, plain, sizeof plain), strlen(want));
    ck_assert(!memcmp(plain, want, strlen(want)));
    fake_free(f);

    /* A member whose first bytes are a worker's: the chain gives it its
     * header all the same. */
    f = gzip_begun();
    iv_buf_init(&z1);
    ck_assert_int_eq(iv_gz_block(&z1, b1, strlen(b1), 1, &crc1), 0);
    p.p = iv_buf_steal(&z1, &p.len);
    p.own = 1;
    ck_assert_int_eq(os_write(f->c, &p, 1, crc1, strlen(b1), NULL), 0);
    ck_assert_int_eq(os_end(f->c, NULL, NULL), 0);
    complete_all(f, 5000);
    n = answer_body(f, 1, body, sizeof body, &head_end);
    ck_assert_uint_eq(gunzip_all(body, n, plain, sizeof plain), strlen(b1));
    ck_assert(!memcmp(plain, b1, strlen(b1)));
    fake_free(f);

    /* A member with nothing in it is still one. */
    f = gzip_begun();
    ck_assert_int_eq(os_end(f->c, NULL, NULL), 0);
    complete_all(f, 5000);
    n = answer_body(f, 1, body, sizeof body, &head_end);
    ck_assert_uint_gt(n, 0);
    ck_assert_uint_eq(gunzip_all(body, n, plain, sizeof plain), 0);
    fake_free(f);
    srv_stop();
}
END_TEST

/* HTTP/1.0 has no chunks: the body goes as it is and the close ends it.
 * A HEAD request's answer is its head alone, whatever the body given. */
START_TEST(test_the_output_chain_frames_by_version_and_drops_a_heads_body)
{
    cfg_base();
    srv_start();
    fake_t *f = connect_fake();
    begin_answer(f, HTTP_GET, 0);
    os_head(f->c, 200, "text/plain", -1, NULL, 0);
    os_record(f->c, "one ", 4);
    wpiece_t p = {"two ", 4, 0};
    ck_assert_int_eq(os_write(f->c, &p, 1, 0, 0, NULL), 0);
    os_record(f->c, "three", 5);
    ck_assert_int_eq(os_end(f->c, NULL, NULL), 0);
    ck_assert(f->c->ans_f.close_after);
    char body[64];
    size_t head_end, n = answer_body(f, 0, body, sizeof body, &head_end);
    ck_assert(memmem(f->out, head_end, "Connection: close\r\n", 19) != NULL);
    ck_assert(memmem(f->out, head_end, "Transfer-Encoding", 17) == NULL);
    ck_assert_uint_eq(n, 13);
    ck_assert(!memcmp(body, "one two three", 13));
    fake_free(f);

    f = connect_fake();
    begin_answer(f, HTTP_HEAD, 1);
    os_head(f->c, 200, "text/plain", 5, NULL, 0);
    wpiece_t q = {strdup("hello"), 5, 1};
    ck_assert_int_eq(os_end(f->c, &q, NULL), 0);
    n = answer_body(f, 0, body, sizeof body, &head_end);
    ck_assert(memmem(f->out, head_end, "Content-Length: 5\r\n", 19) != NULL);
    ck_assert_uint_eq(n, 0);
    complete_all(f, 5000);
    /* A stream's HEAD (chunked, gzip): no member, no last chunk. */
    begin_answer(f, HTTP_HEAD, 1);
    size_t before = f->out_len;
    os_head(f->c, 200, "text/plain", -1, "Content-Encoding: gzip\r\n", 1);
    ck_assert_int_eq(os_end(f->c, NULL, NULL), 0);
    ck_assert_uint_gt(f->out_len, before + 4);
    ck_assert(!memcmp(f->out + f->out_len - 4, "\r\n\r\n", 4));
    ck_assert(memmem(f->out + before, f->out_len - before, "Transfer-Encoding: chunked\r\n", 28) != NULL);
    complete_all(f, 5000);
    fake_free(f);

    /* A chunked answer's last piece (owned) goes into its last chunk. */
    f = connect_fake();
    begin_answer(f, HTTP_GET, 1);
    os_head(f->c, 200, "text/plain", -1, NULL, 0);
    os_record(f->c, "first, ", 7);
    wpiece_t l = {strdup("then the last"), 13, 1};
    ck_assert_int_eq(os_end(f->c, &l, NULL), 0);
    n = answer_body(f, 1, body, sizeof body, &head_end);
    ck_assert_uint_eq(n, 20);
    ck_assert(!memcmp(body, "first, then the last", 20));
    complete_all(f, 5000);
    fake_free(f);
    srv_stop();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("conn");
    TCase *t = tcase_create("states");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_pipelined_answers_wait_for_the_last_write);
    tcase_add_test(t, test_parse_ahead_is_bounded_by_max_pipeline);
    tcase_add_test(t, test_silent_connection_closed_at_the_header_timeout);
    tcase_add_test(t, test_partial_headers_get_408_and_a_polite_close);
    tcase_add_test(t, test_body_timeout_names_the_body);
    tcase_add_test(t, test_idle_keepalive_closes_without_a_byte);
    tcase_add_test(t, test_a_client_that_reads_nothing_is_cut_at_the_write_timeout);
    tcase_add_test(t, test_a_failed_write_closes);
    tcase_add_test(t, test_close_waits_until_the_client_acknowledged_everything);
    tcase_add_test(t, test_unacknowledged_tail_is_cut_at_the_write_timeout);
    tcase_add_test(t, test_eof_after_the_request_still_gets_the_answer);
    tcase_add_test(t, test_a_bad_request_is_answered_then_closed);
    tcase_add_test(t, test_the_output_chain_makes_one_gzip_member_of_a_stream);
    tcase_add_test(t, test_the_output_chain_frames_by_version_and_drops_a_heads_body);
    suite_add_tcase(s, t);
    TCase *st = tcase_create("streams");
    tcase_set_timeout(st, 300);
    tcase_add_test(st, test_pipelined_streams_answer_in_order);
    tcase_add_test(st, test_a_stream_keeps_its_window_while_the_client_reads_nothing);
    tcase_add_test(st, test_a_computation_past_its_limit_is_answered_503);
    suite_add_tcase(s, st);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
