/*
 * Jobs (jobs.c): work handed from a loop to the worker pool and back.  A
 * job's inputs are copies (a query's set-up gets a setup_t) so that a
 * worker never touches loop objects; its results travel back in the job.
 * Each job type's two halves are in one file; the types that another
 * file submits are declared in the header of their concern (srv_qstream.h:
 * the stream's decode jobs and the set-up job), the others are static in
 * their file (load.c, routes_export.c, server.c's call_job).
 */
#ifndef IV_SRV_JOBS_H
#define IV_SRV_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "query.h"
#include "request.h"
#include "viewer.h"
#include "srv_common.h"
#include "transpose.h"

/*
 * A query's set-up, run on a worker: parsing the JSON body or query string,
 * resolving names and filters, building the engine query.  Each is O(the
 * request), and a request of a million indices would otherwise hold the
 * loop for tens of milliseconds.  Inputs are copies (the connection may go
 * away meanwhile); outputs go back to the loop with the job.  A viewer
 * route's request travels the same way, as vr.
 */
struct setup {
    /* in */
    char *body;           /* POST body (taken from the request), or NULL */
    size_t body_len;
    char *query;          /* GET query string (copied) */
    char *accept;         /* Accept header (copied), or NULL */
    int is_post, count;
    int64_t n_rows, n_cols;
    /* out (an error: j->rc and j->err, answered by send_iv_error) */
    iv_query_t *q;
    char *dropped;        /* the names dropped by missing=ignore, JSON, or NULL */
    char *dropped_hdr;    /* the same, bounded for the X-Ivserve-Dropped-Names header */
    int have_total;
    double total;
    iv_fmt_t fmt;
    int dense;            /* "dense": true */
    iv_vreq_t *vr;        /* viewer_job: a viewer route (api/viewer.h) */
    /* A small streamed query is prepared, and its one block decoded and
     * encoded (in the job's out), in the set-up job itself: one hand-off
     * instead of three (setup_fuse). */
    int fuse;             /* in: may be fused (a streamed GET/POST), with */
    int gz_level;         /* in: the answer's gzip level */
    int prepared;         /* out: the query is prepared */
    int block0;           /* out: its block 0 is in the job's out, rows, nnz */
};

/* The largest X-Ivserve-Dropped-Names header; past it the names are cut
 * at an element and the header says how many there were. */
#define DROPPED_HDR_MAX 4096

/*
 * A job is work for the pool in two halves, named by its type: run on a
 * worker, then done on the loop thread (server.c, on_async), which owns
 * the job from then on and frees it (job_free) or keeps it (a decoded
 * block waits in its stream's window).  job_submit queues it.
 */
struct job_type {
    void (*run)(job_t *j);    /* worker: fills rc/err and the results */
    void (*done)(job_t *j);   /* loop thread */
};

struct job {
    struct job *next;
    server_t *srv;
    loop_t *lp;           /* the loop its done half runs on (NULL at submit: loop 0) */
    const job_type_t *type;
    sds_t *ds;            /* load_job, other_job: the dataset (a reference) */
    qstream_t *qs;        /* the stream's jobs: their stream */
    int64_t b;            /* block_job: the block */
    iv_buf_t out;
    /* block_job of a large binary block: its indices and values, the
     * engine's own arrays, sent after out without a copy (owned). */
    char *tail[2];
    size_t tail_len[2];
    int64_t rows, nnz;
    int rc;
    iv_err_t err;
    double secs;
    double phase[IV_TRANSPOSE_PHASES];  /* other_job, a copy built: seconds by phase */
    double total;         /* count_job: sum of the selected values */
    uint32_t crc;         /* block_job of a gzip stream: CRC-32 and length of the */
    size_t raw_len;       /* identity bytes that out holds compressed */
    setup_t *setup;       /* setup_job, viewer_job */
    int cancelled;        /* skipped: cancelled before it ran */
    void (*call)(server_t *s, void *arg);  /* call_job (loop_call) */
    void *arg;
    uint64_t gen;         /* load_job: the reload that started it (0: start-up) */
    int replace;          /* load_job: a served entry's pending replacement */
    int reloaded;         /* load_job: of a dataset served before (the reload's summary) */
};

/* Jobs (jobs.c).  The loop thread, or after the loop stopped, but for
 * job_cancelled and job_cancel_rc (a worker). */
void setup_free(setup_t *st);
void job_free(job_t *j);
/* Worker: true when the job's stream was cancelled (its client left, or
 * the server stops); checked between a job's phases. */
int job_cancelled(const job_t *j);
/* Worker: IV_ECANCELLED in j's error. */
int job_cancel_rc(job_t *j);
/* Queues j (its type, srv and inputs set) on the pool; 0, or a negative
 * error (the queue is full) and j is still the caller's.  job_submit is
 * for clients' work, refused when the queue is full; job_submit_server
 * for the server's own (dataset loads and orientation builds, one a
 * dataset), which waits in the queue however full it is. */
int job_submit(job_t *j);
int job_submit_server(job_t *j);

#endif
