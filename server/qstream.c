/*
 * Query streams: the answer to a query or count, from its set-up job to
 * its last block.
 *
 * Streaming is pull-based.  A response may have at most `blocks_ahead`
 * blocks between "submitted for decode" and "write completed on the
 * socket" (more, up to one a worker, while workers are free; see
 * qs_pump); the next block is submitted only when a write completes.  A
 * slow reader therefore holds at most that many encoded blocks, and
 * because each response keeps only a few jobs in the pool's FIFO, the
 * blocks of concurrent queries interleave: a whole-matrix download does
 * not hold up a one-cell query.  HTTP headers go out with the first
 * block, so an error in the prepare step or the first block still gets a
 * proper status; a later error is reported in the stream's trailer.
 */
#include "srv_conn.h"
#include "srv_datasets.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include <stdio.h>
#include <stdlib.h>

#include "enc_dataset.h"
#include "encode.h"

/* ---- query streams ------------------------------------------------------ */

/* Stops a stream's work: its jobs see the flag between phases and blocks. */
void qs_cancel(qstream_t *qs)
{
    atomic_store_explicit(&qs->cancelled, 1, memory_order_relaxed);
    if (qs->q) iv_query_cancel(qs->q);
}

/* A stream without its query yet: the set-up job builds it. */
qstream_t *qs_new(conn_t *c, sds_t *d, int count)
{
    server_t *s = c->srv;
    qstream_t *qs = calloc(1, sizeof *qs);
    if (!qs) return NULL;
    qs->base_ahead = s->cfg->limits.blocks_ahead ? s->cfg->limits.blocks_ahead : 1;
    qs->ahead = qs->base_ahead;
    if (qs->ahead < iv_pool_threads(s->pool)) qs->ahead = iv_pool_threads(s->pool);
    qs->slots = calloc(qs->ahead, sizeof *qs->slots);
    if (!qs->slots) {
        free(qs);
        return NULL;
    }
    qs->srv = s;
    qs->lp = c->lp;
    qs->c = c;
    qs->ds = d;
    iv_rds_ref(d);  /* a reload may drop d from the list: the stream keeps it */
    qs->fmt = IV_FMT_NONE;
    qs->count = count;
    loop_t *lp = qs->lp;
    qs->next_live = lp->streams;
    if (lp->streams) lp->streams->prev_live = qs;
    lp->streams = qs;
    lp->n_streams++;
    return qs;
}

void qs_free(qstream_t *qs)
{
    server_t *s = qs->srv;
    loop_t *lp = qs->lp;
    if (qs->budget_wait) budget_wait_count(lp, -1);
    reserve_unwait(qs);
    if (qs->reserved) iv_budget_give(&s->answers_left, qs->reserved);
    for (unsigned i = 0; i < qs->ahead; i++)
        if (qs->slots[i]) job_free(qs->slots[i]);
    free(qs->slots);
    iv_query_free(qs->q);
    export_file_free(qs->file);
    if (qs->prev_live) qs->prev_live->next_live = qs->next_live;
    else lp->streams = qs->next_live;
    if (qs->next_live) qs->next_live->prev_live = qs->prev_live;
    lp->n_streams--;
    ds_unref(s, qs->ds);
    free(qs);
}

/* Queues a job of the stream (its type, block b; st for setup_job and
 * viewer_job, owned by the job from here on, freed with it on failure). */
int qs_submit_job(qstream_t *qs, const job_type_t *type, int64_t b, setup_t *st)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        setup_free(st);
        return IV_ENOMEM;
    }
    j->srv = qs->srv;
    j->lp = qs->lp;
    j->type = type;
    j->qs = qs;
    j->b = b;
    j->setup = st;
    int rc = job_submit(j);
    if (rc != 0) {
        job_free(j);
        LP_METRIC(qs->lp, m_->overloaded++);
        return rc;
    }
    qs->inflight++;
    return 0;
}

int qs_submit(qstream_t *qs, const job_type_t *type, int64_t b)
{
    return qs_submit_job(qs, type, b, NULL);
}

/* The headers of a query answer that vary with the coding. */
const char *stream_extra(const qstream_t *qs)
{
    return qs->gz_level ? "Cache-Control: no-store\r\nVary: Accept-Encoding\r\nContent-Encoding: gzip\r\n"
                        : "Cache-Control: no-store\r\nVary: Accept-Encoding\r\n";
}

/* The stream's head and header record, pending for its first write. */
static void stream_headers(conn_t *c, qstream_t *qs)
{
    os_head(c, 200, iv_fmt_media_type(qs->fmt), -1, stream_extra(qs), qs->gz_level > 0);
    iv_stream_hdr_t h = iv_stream_hdr_of(qs->q, qs->dense);
    iv_buf_t sh;
    iv_buf_init(&sh);
    iv_enc_header(&sh, qs->fmt, &h);
    if (sh.oom) c->out.pend.oom = 1;
    os_record(c, sh.data, sh.len);
    iv_buf_free(&sh);
    qs->headers_sent = 1;
}

/* Block j is about to be written: its rows and values join the stream's. */
static void qs_count_block(qstream_t *qs, const job_t *j)
{
    qs->rows += j->rows;
    qs->nnz += j->nnz;
}

/* Ends a stream with its trailer (ok or the error) and the last chunk,
 * after last (the job holding its last block, or NULL) in the same
 * write. */
static void qs_end_after(qstream_t *qs, int rc, const iv_err_t *e, const job_t *last)
{
    conn_t *c = qs->c;
    qs->done = 1;
    if (!qs->headers_sent) stream_headers(c, qs);
    if (last) {
        qs_count_block(qs, last);
        os_coded(c, last->out.data, last->out.len, last->crc, last->raw_len);
    }
    iv_buf_t t;
    iv_buf_init(&t);
    if (rc == 0) {
        iv_enc_trailer(&t, qs->fmt, 0, NULL, NULL, qs->rows, qs->nnz);
    } else {
        /* As send_iv_error: the log keeps the whole message. */
        snprintf(c->errmsg, sizeof c->errmsg, "%s", e->msg);
        char red[sizeof e->msg], named[sizeof e->msg];
        /* A changed file is named by its base name, whatever its folder. */
        const char *msg = rc == IV_EFILE_CHANGED && qs->ds
                              ? iv_enc_file_msg(qs->ds->ds, e->msg, named, sizeof named)
                              : e->msg;
        iv_enc_trailer(&t, qs->fmt, iv_error_status(rc), iv_error_code(rc),
                       error_for_client(rc, msg, red, sizeof red), qs->rows, qs->nnz);
        c->ans_f.close_after = 1;  /* the client may not read the trailer; do not reuse the connection */
    }
    if (t.oom) c->out.pend.oom = 1;
    os_record(c, t.data, t.len);
    iv_buf_free(&t);
    c->rows = qs->rows;
    c->nnz = qs->nnz;
    os_end(c, NULL, NULL);
}

static void qs_end(qstream_t *qs, int rc, const iv_err_t *e)
{
    qs_end_after(qs, rc, e, NULL);
}

void qs_fail(qstream_t *qs, int rc, const iv_err_t *e)
{
    conn_t *c = qs->c;
    if (qs->q) iv_query_cancel(qs->q);
    if (qs->file && qs->headers_sent) {
        /* A file's answer has a Content-Length and no trailer: a body cut
         * short is the only way to say it failed. */
        qs->done = 1;
        snprintf(c->errmsg, sizeof c->errmsg, "%s", e->msg);
        conn_close(c);
        return;
    }
    if (!qs->headers_sent) {
        qs->done = 1;
        c->rows = qs->rows;
        send_iv_error(c, rc, e);
        return;
    }
    qs_end(qs, rc, e);
}

/* A last block at most this large is copied into the stream's last write. */
#define QS_JOIN_BYTES ((size_t)64 << 10)

/* Past the write budget, a stream with blocks still unsent waits (its
 * unsent bytes are part of the overflow); budget_wake resumes it. */
static void qs_budget_check(qstream_t *qs)
{
    if (qs->next_submit < qs->n_blocks && !budget_room(qs->c) && !qs->budget_wait) {
        qs->budget_wait = 1;
        budget_wait_count(qs->lp, 1);
    }
}

/* The window is blocks_ahead, widened by the workers that have nothing
 * else to do: alone on the server, one response decodes on all of them
 * (3 blocks at a time made a 10,000-cell answer three times the engine's
 * time on 16 cores); under load each keeps blocks_ahead.  A stream whose
 * reservation is its window's (answer_reserve) widens only as far as the
 * answers' memory budget gives it blocks, and keeps what it took until it
 * ends. */
static unsigned qs_window(qstream_t *qs)
{
    unsigned win = qs->base_ahead;
    if (qs->ahead > win && qs->next_submit < qs->n_blocks) {
        win += iv_pool_free_workers(qs->srv->pool);
        if (win > qs->ahead) win = qs->ahead;
        unsigned have = qs->base_ahead + qs->widened;
        if (qs->window_reserved && win > have) {
            uint64_t extra = (uint64_t)(win - have) * BLOCK_WORK_BYTES;
            if (iv_budget_take(&qs->srv->answers_left, extra) == 0) {
                qs->reserved += extra;
                qs->widened = win - qs->base_ahead;
            } else {
                win = have;
            }
        }
    }
    return win;
}

/* Submits the blocks the window allows.  -1 when the stream failed (and
 * was answered so); a refusal with work still under way is retried on
 * the next completion. */
static int qs_submit_window(qstream_t *qs, unsigned win)
{
    while (!qs->budget_wait && qs->next_submit < qs->n_blocks &&
           (uint64_t)(qs->next_submit - qs->writes_done) < win) {
        int rc = qs_submit(qs, &block_job, qs->next_submit);
        if (rc != 0) {
            if (qs->inflight > 0 || qs->next_write > qs->writes_done) break;
            iv_err_t e;
            iv_err_clear(&e);
            iv_fail(&e, rc, "%s", rc == IV_EOVERLOADED ? "the server is overloaded; retry later"
                                                         : iv_error_message(rc));
            qs_fail(qs, rc, &e);
            return -1;
        }
        qs->next_submit++;
    }
    return 0;
}

/* Writes block j, the next in order (with the headers when not sent
 * yet); -1 when the stream is to stop here (a write refused, or the
 * client gone). */
static int qs_write_block(qstream_t *qs, job_t *j)
{
    conn_t *c = qs->c;
    if (!qs->headers_sent) stream_headers(c, qs);
    qs_count_block(qs, j);
    /* The block, then (a large binary block) its indices and values as
     * the engine left them: one chunk. */
    wpiece_t p[3] = {{NULL, 0, 1}, {j->tail[0], j->tail_len[0], 1}, {j->tail[1], j->tail_len[1], 1}};
    p[0].p = iv_buf_steal(&j->out, &p[0].len);
    uint32_t crc = j->crc;
    uint64_t raw = j->raw_len;
    j->tail[0] = j->tail[1] = NULL;
    job_free(j);
    qs->next_write++;
    if (os_write(c, p, 3, crc, raw, qs) != 0 || qs->c == NULL) return -1;
    return 0;
}

/* Writes finished blocks in order; -1 when the stream is to stop here
 * (ended, or see qs_write_block). */
static int qs_write_ready(qstream_t *qs)
{
    while (qs->next_write < qs->n_blocks) {
        job_t **slot = &qs->slots[qs->next_write % qs->ahead];
        job_t *j = *slot;
        if (!j || j->b != qs->next_write) break;
        *slot = NULL;
        if (qs->next_write + 1 == qs->n_blocks && j->out.len <= QS_JOIN_BYTES && !j->tail[0]) {
            /* A small last block goes out with the headers (when not sent
             * yet) and the trailer in one write: a one-block answer is
             * one write, not three. */
            qs->next_write++;
            qs_end_after(qs, 0, NULL, j);
            job_free(j);
            return -1;
        }
        if (qs_write_block(qs, j) != 0) return -1;
    }
    return 0;
}

void qs_pump(qstream_t *qs)
{
    if (qs->file) {
        export_pump(qs);  /* the pieces of a file (routes_export.c) */
        return;
    }
    if (!qs->c || qs->done || !qs->prepared) return;
    qs_budget_check(qs);
    if (qs_submit_window(qs, qs_window(qs)) != 0 || qs_write_ready(qs) != 0) return;
    if (qs->next_write == qs->n_blocks && !qs->done) qs_end(qs, 0, NULL);
}

/* ---- the stream's jobs, back on the loop ---------------------------------- */

/*
 * What every job of a stream does first when it comes back: 1 when the
 * caller goes on with j; 0 when the stream is detached (the client left)
 * or already answered, and j was dropped.
 */
int qs_job_back(job_t *j)
{
    qstream_t *qs = j->qs;
    qs->inflight--;
    if (j->cancelled || j->rc == IV_ECANCELLED) LP_METRIC(qs->lp, m_->jobs_cancelled++);
    if (!qs->c || qs->done) {
        /* Detached (client gone) or already answered: drop the result. */
        job_free(j);
        if (!qs->c && qs->inflight == 0 && qs->wq == 0) qs_free(qs);
        else if (qs->c && qs->inflight == 0) qs_pump(qs);
        return 0;
    }
    return 1;
}

int qs_piece_back(job_t *j)
{
    if (!qs_job_back(j)) return 0;
    qstream_t *qs = j->qs;
    conn_t *c = qs->c;
    if (c->state == CS_RESPONDING) conn_set_state(c, CS_RESPONDING);  /* progress */
    if (j->rc != 0) {
        iv_err_t e = j->err;
        int rc = j->rc;
        job_free(j);
        qs_fail(qs, rc, &e);
        return 0;
    }
    return 1;
}
