/*
 * Query streams (qstream.c): a query's answer, streamed as blocks
 * decoded on workers a few ahead and written in order, or one document;
 * the answers' share of the memory budget a stream reserves or waits for
 * (answer_wait.c); and the jobs that feed a stream: a query's set-up and
 * a viewer route's job (setup_job.c), the decode jobs (stream_jobs.c),
 * an export's pieces (routes_export.c).  A stream belongs to its
 * connection's loop; workers only read its cancel flag.
 */
#ifndef IV_SRV_QSTREAM_H
#define IV_SRV_QSTREAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "buf.h"
#include "dataset.h"
#include "error.h"
#include "gzip_stream.h"
#include "http.h"
#include "query.h"
#include "request.h"
#include "srv_common.h"

/* The memory one block of a stream works in (decoded and encoded), the
 * unit of an answer's reservation from the answers' memory budget. */
#define BLOCK_WORK_BYTES ((uint64_t)8 << 20)

/* What a query's set-up job leaves for the loop (routes_query.c), kept
 * by a stream that waits for the answers' memory (answer_wait.c). */
typedef struct setup_res {
    int count, have_total, dense, prepared, gz_level;
    double total;
    iv_fmt_t fmt;
} setup_res_t;

struct qstream {
    server_t *srv;
    loop_t *lp;           /* its connection's loop */
    conn_t *c;            /* NULL once detached */
    sds_t *ds;
    iv_query_t *q;
    iv_fmt_t fmt;
    int count;            /* a count answer (else the matrix, streamed or whole) */
    int64_t n_blocks, next_submit, next_write, writes_done;
    job_t **slots;
    unsigned ahead;       /* slots: blocks_ahead, or the pool's workers if more */
    unsigned base_ahead;  /* blocks_ahead: the window when no worker is free */
    int inflight;
    int prepared, headers_sent, done;
    int64_t rows, nnz;
    int have_total;       /* count: total already known from the metadata */
    double total;
    int dense;            /* gene rows as dense vectors */
    int gz_level;         /* > 0: the answer is one gzip member (coding.h: iv_coding_pick),
                           * its blocks deflated by their jobs (ostream.c codes the rest) */
    unsigned wq;          /* its writes whose callbacks have not run (keep it alive) */
    int budget_wait;      /* waits for the write budget before submitting blocks */
    uint64_t reserved;    /* bytes of the answers' memory budget it holds */
    int window_reserved;  /* reserved holds base_ahead blocks' work, widened
                           * blocks reserve their own (qs_window); else it
                           * holds the whole answer's */
    unsigned widened;     /* blocks past base_ahead reserved for */
    /* Waiting for the answers' memory (answer_wait.c): the bytes, since
     * when (arrival order), until when, and the set-up's results. */
    int reserve_wait;
    uint64_t reserve_need, reserve_seq, reserve_until;
    setup_res_t pending;
    /* Set on the loop when the client left or the server stops; workers
     * read it between the phases of a job and drop the work. */
    atomic_int cancelled;
    /* An export's answer (routes_export.c): the file whose pieces are its
     * blocks, closed with the stream; NULL for a query's. */
    struct export_file *file;
    qstream_t *next_live; /* server list of every stream, for shutdown and metrics */
    qstream_t *prev_live;
};

/* The answers' share of the memory budget (answer_wait.c), loop thread:
 * answer_reserve is 0 when the answer's memory is reserved, 1 when the
 * stream waits for it (answer_go runs once it is), -1 when refused (503
 * sent).  reserve_wake retries the waiting streams of lp, oldest first,
 * and refuses those past their wait; reserve_unwait takes a stream off
 * the waiting (qs_free). */
int answer_reserve(conn_t *c, qstream_t *qs, const iv_query_t *q, const setup_res_t *res, int64_t hint);
void reserve_wake(loop_t *lp);
void reserve_unwait(qstream_t *qs);
void reserve_tick(uv_timer_t *t);
/* Any thread: takes need bytes of the answers' share at once, only while
 * no query waits for the share (the oldest waiter goes first): 0 when
 * taken (iv_budget_give returns them), -1 not now.  answer_reserve's
 * first try, and the server's own work's (X's Zarr chunks kept, load.c). */
int answer_take_now(server_t *s, uint64_t need);
/* setup_job.c: a matrix answer whose memory is reserved goes on. */
void answer_go(qstream_t *qs, const setup_res_t *res);

/* Query streams (qstream.c).  Loop thread; qs_cancel only sets flags
 * that the workers read. */
void qs_cancel(qstream_t *qs);
qstream_t *qs_new(conn_t *c, sds_t *d, int count);
void qs_free(qstream_t *qs);
int qs_submit_job(qstream_t *qs, const job_type_t *type, int64_t b, setup_t *st);
int qs_submit(qstream_t *qs, const job_type_t *type, int64_t b);
/* The headers of a query answer that vary with its coding (gz_level). */
const char *stream_extra(const qstream_t *qs);
void qs_fail(qstream_t *qs, int rc, const iv_err_t *e);
void qs_pump(qstream_t *qs);
int qs_job_back(job_t *j);
/* qs_job_back for a job that makes a piece of the answer: it counts as
 * progress on the answer, and a failed one ends the stream (qs_fail).
 * 1 when the loop half goes on with j. */
int qs_piece_back(job_t *j);

/* The stream's decode jobs (stream_jobs.c): prepare, then blocks; or one
 * job for a whole JSON document or a count. */
extern const job_type_t prep_job, block_job, whole_job, count_job;
/* Worker: block b of q decoded and encoded into j's out (j's rows, nnz,
 * and for gzip its CRC); tails: a large binary block's arrays stay the
 * engine's, in j->tail (the stream's block jobs; not the set-up's). */
void stream_encode_block(job_t *j, iv_query_t *q, int64_t b, iv_fmt_t fmt, int dense, int gz_level,
                         int tails);

/* A query's set-up, and a viewer route's answer (setup_job.c): both
 * halves. */
extern const job_type_t setup_job, viewer_job;
/* Worker: the request's selection parsed and its names resolved as the
 * query set-up does (*qr owned by the caller on 0; *mds the matrix it
 * names), the dropped names in the job's setup. */
int setup_selection(job_t *j, iv_qreq_t *qr, iv_dataset_t **mds);

/* An export's stream (routes_export.c).  Loop thread.  qs_pump of an
 * export's stream; the stream's file is freed with it. */
void export_pump(qstream_t *qs);
void export_file_free(struct export_file *f);

/* The body of a count answer (routes_query.c).  Loop thread. */
void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total);

#endif
