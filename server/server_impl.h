/*
 * The server's private header: the types its files share (struct server,
 * struct conn, a query stream, a job) and the functions that one of them
 * calls in another.  Only server/ includes it; server.h is the public face.
 *
 * The files, one concern each:
 *   server.c        start and stop, the event loops and the hand-off of
 *                   connections to them, signals, the loops' side of the
 *                   worker hand-off, the served files' watcher
 *   conn.c          connection input and the connection state machine
 *   transport_tcp.c the connections' TCP sockets (transport.h)
 *   respond.c       status line and headers, writes, the end of an answer
 *                   and its access-log line, the write budget
 *   qstream.c       query streams: the blocks-ahead window, blocks
 *                   written in order, the trailer
 *   routes.c        the routes (dispatch, the 100-continue precheck), auth,
 *                   the routes answered on the loop
 *   routes_export.c the export route: a .h5ad written on a worker, sent
 *                   as a stream of pieces of the unlinked file
 *   routes_query.c  the routes answered by worker jobs: query, count,
 *                   metadata pages, viewer routes (their first job)
 *   jobs.c          the loop → worker → loop hand-off of every job
 *   setup_job.c     a query's set-up job and a viewer route's job, both
 *                   halves
 *   stream_jobs.c   a stream's decode jobs (prepare, block, whole, count),
 *                   both halves
 *   load.c          datasets loading (the load, warm and other-orientation
 *                   jobs, both halves), their documents
 *   reload.c        reloads
 */
#ifndef IV_SERVER_IMPL_H
#define IV_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <uv.h>

#include "access_log.h"
#include "auth.h"
#include "buf.h"
#include "dataset.h"
#include "error.h"
#include "gzip_stream.h"
#include "http.h"
#include "membudget.h"
#include "meta.h"
#include "metrics.h"
#include "pool.h"
#include "query.h"
#include "registry.h"
#include "request.h"
#include "routes_viewer.h"
#include "server.h"
#include "transport.h"
#include "transpose.h"
#include "watch.h"

#define TOKNAME_BYTES 72  /* token names are at most 64 bytes (tokens_file.h) */

typedef struct server server_t;
typedef struct loop loop_t;
typedef struct conn conn_t;
typedef struct qstream qstream_t;

/* A dataset as the routes see it: a registry entry (registry.h), held by
 * reference by each stream and load job that uses it. */
typedef iv_rds_t sds_t;
#define DS_LOADING IV_RDS_LOADING
#define DS_READY IV_RDS_READY
#define DS_FAILED IV_RDS_FAILED

/*
 * A query's set-up, run on a worker: parsing the JSON body or query string,
 * resolving names and filters, building the engine query.  Each is O(the
 * request), and a request of a million indices would otherwise hold the
 * loop for tens of milliseconds.  Inputs are copies (the connection may go
 * away meanwhile); outputs go back to the loop with the job.  A viewer
 * route's request travels the same way, as vr.
 */
typedef struct setup {
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
    iv_vreq_t *vr;        /* viewer_job: a viewer route (routes_viewer.h) */
    /* A small streamed query is prepared, and its one block decoded and
     * encoded (in the job's out), in the set-up job itself: one hand-off
     * instead of three (setup_fuse). */
    int fuse;             /* in: may be fused (a streamed GET/POST), with */
    int gz_level;         /* in: the answer's gzip level */
    int prepared;         /* out: the query is prepared */
    int block0;           /* out: its block 0 is in the job's out, rows, nnz */
} setup_t;

/*
 * A job is work for the pool in two halves, named by its type: run on a
 * worker, then done on the loop thread (server.c, on_async), which owns
 * the job from then on and frees it (job_free) or keeps it (a decoded
 * block waits in its stream's window).  job_submit queues it.
 */
typedef struct job job_t;
typedef struct job_type {
    void (*run)(job_t *j);    /* worker: fills rc/err and the results */
    void (*done)(job_t *j);   /* loop thread */
} job_type_t;

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
    int gz_level;         /* > 0: the answer is one gzip member (stream_gzip_level) */
    iv_gz_sum_t gz_sum;   /* its identity bytes so far, in body order */
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

/*
 * A connection is always in exactly one of these states, and the state
 * alone decides which timer runs (see conn_set_state):
 *
 *   IDLE        keep-alive: no byte of the next request yet (keepalive_ms)
 *   READ_HEAD   request line and headers arriving; a new connection starts
 *               here (header_timeout_ms)
 *   READ_BODY   the body arriving (body_timeout_ms)
 *   DISPATCHED  a complete request is being worked on and nothing of its
 *               answer is written yet (compute_timeout_ms)
 *   RESPONDING  the answer is being written (write_timeout_ms while bytes
 *               wait for the socket, compute_timeout_ms while a stream
 *               waits for its next block); ends when the answer's last
 *               write completes, and only then is the next pipelined
 *               request parsed
 *   DRAINING    the last answer is out and the write side shut: input is
 *               read and dropped, for a bounded time and size, until the
 *               client has acknowledged every byte (polled)
 *   CLOSING     uv_close called; freed in the close callbacks
 */
typedef enum conn_state {
    CS_IDLE, CS_READ_HEAD, CS_READ_BODY, CS_DISPATCHED, CS_RESPONDING, CS_DRAINING, CS_CLOSING
} conn_state_t;

struct conn {
    uv_tcp_t tcp;         /* the TCP transport's handle (transport_tcp.c) */
    uv_timer_t timer;
    const iv_transport_t *tp;  /* its transport (transport.h) */
    void *tp_ctx;         /* the transport's own state, if any */
    int tp_open;          /* the transport is open: closed with the connection */
    server_t *srv;
    loop_t *lp;           /* the loop that owns its socket and timer */
    uint64_t id;          /* unique in the server's life (a reload's answer finds it by id) */
    int reload_wait;      /* an admin reload's answer is awaited */
    conn_t *prev, *next;
    conn_state_t state;
    iv_http_in_t in;
    char *rbuf;
    size_t rlen, rcap;
    int reading, handles_open, in_pump;
    int active;           /* between resp_begin and req_done */
    int shutting;         /* uv_shutdown called */
    int close_after;      /* the connection ends after the current answer */
    int peer_eof;         /* the client half-closed */
    size_t wpending;      /* bytes in uv_write calls whose callbacks have not run */
    uint64_t last_progress; /* uv_now of the last completed write, for the write budget */
    /* The answer being written: its sequence number and whether its last
     * bytes are queued (req_done ran). */
    uint64_t seq;
    int resp_ended;
    int expect_checked;   /* Expect of the request being read was answered */
    /* Requests parsed ahead while an answer is in flight, oldest first
     * (at most limits.max_pipeline of them, AHEAD_MAX_BYTES in all), and
     * whether the parser failed after them. */
    iv_http_req_t **ahead;
    unsigned n_ahead, ahead_first, ahead_cap;
    size_t ahead_bytes;
    int ahead_err;
    /* DRAINING bookkeeping. */
    uint64_t drain_t0, drain_last_in, outq_t;
    size_t drain_bytes, outq_last;
    /* The request being answered. */
    iv_http_req_t *req;
    iv_route_t route;
    uint64_t t0, t_end;
    int status;
    char dsid[136];
    char tokname[TOKNAME_BYTES]; /* the answer's token name (never the token), or "" */
    int64_t cells, genes; /* the query's selection, -1 unknown */
    char peer[48];        /* the socket's peer address, as text */
    unsigned char peer_ip[16]; /* the same, IPv4-mapped (cidr.h); peer_ok: known */
    int peer_ok;
    int64_t rows, nnz;
    uint64_t bytes;
    char errmsg[520];
    int log_pending;      /* the log line waits for the last write, or the close (bytes delivered) */
    qstream_t *qs;
    int chunked;
    char *dropped;        /* JSON {"obs":[...],"var":[...]} of names dropped by missing=ignore */
    char *dropped_hdr;    /* the same, bounded, for the header */
};

/*
 * An event loop and what it owns.  Loop 0 runs on the thread that called
 * iv_server_run; the others (config "loops") each on a thread of their
 * own.  Loop 0 accepts every connection and hands each to a loop, round
 * robin (conn_adopt); from then on a connection, its streams and its
 * timers belong to that loop alone, and its jobs come back to it.
 *
 * What the loops share lives in struct server: the registry, the tokens
 * and reloads are changed on loop 0 only, under the shared lock held for
 * writing; every other loop holds it for reading while it runs a callback
 * (loop_enter / loop_leave), so that it sees them whole.  Metrics are
 * counted per loop, under the loop's own mutex, and summed for /metrics.
 */
struct loop {
    server_t *srv;
    unsigned idx;
    uv_loop_t loop;
    uv_async_t async;     /* finished jobs, handed-off connections, stop */
    uv_timer_t grace;     /* shutdown grace period */
    uv_timer_t budget;    /* several loops: budget_tick */
    pthread_t thread;     /* loops 1..: the thread that runs it */
    pthread_mutex_t done_mu;
    job_t *done_head;     /* finished jobs, newest first */
    int *new_fds;         /* accepted sockets handed to this loop (under done_mu) */
    size_t n_new_fds, cap_new_fds;
    atomic_int stop_asked;
    conn_t *conns;
    atomic_size_t n_conns;
    qstream_t *streams;
    atomic_size_t n_streams;
    atomic_size_t queued_bytes;  /* bytes waiting in its connections' uv_write queues */
    size_t doomed_bytes;  /* of those, the bytes of closed connections (freed soon) */
    atomic_size_t n_budget_wait; /* its streams waiting for the write budget */
    unsigned n_reserve_wait; /* its streams waiting for the answers' memory */
    uint64_t reserve_seq;    /* their arrival order */
    uv_timer_t reserve;      /* retries them while there are any (answer_wait.c) */
    int draining, stopped;
    pthread_mutex_t mmu;  /* metrics */
    iv_metrics_t metrics;
};

/* Counting in a loop's metrics (any thread of that loop's callbacks). */
#define LP_METRIC(lp, stmt)                 \
    do {                                    \
        pthread_mutex_lock(&(lp)->mmu);     \
        iv_metrics_t *m_ = &(lp)->metrics;  \
        stmt;                               \
        pthread_mutex_unlock(&(lp)->mmu);   \
    } while (0)

/* Taken at the entry of each of a loop's callbacks, left at its end: with
 * several loops, the shared lock for reading on a connection loop, for
 * writing on loop 0 (the only one that changes the registry, a dataset's
 * state or document, or the tokens); nothing with one loop. */
void loop_enter(loop_t *lp);
void loop_leave(loop_t *lp);

struct server {
    loop_t *loops;        /* n_loops of them; loops[0] is the main loop */
    unsigned n_loops;
    unsigned next_loop;   /* round robin for new connections */
    pthread_rwlock_t shared;
    atomic_uint_fast64_t next_conn_id;
    atomic_size_t n_conns_all;  /* open connections, all loops */
    /* The write budget (limits.write_budget_bytes) is one for all loops:
     * the bytes waiting to be written to open connections, and the
     * streams waiting for room, on every loop. */
    atomic_size_t budget_used;
    atomic_size_t n_wait_all;
    atomic_uint_fast64_t room_wanted_ms;  /* when a loop last found no reader of its own to cut */
    const iv_config_t *cfg;
    iv_pool_t *pool;
    uv_poll_t accept_poll;  /* loop 0: the listening socket, accepted by hand */
    uv_timer_t accept_pause;  /* loop 0: listening again after running out of descriptors */
    int listen_fd;
    uv_signal_t sigterm, sigint, sighup, sigusr1;
    iv_registry_t reg;    /* the datasets served now */
    size_t n_loading;     /* load jobs in flight */
    int readyz_any;       /* /readyz policy (config "readyz") */
    /* Reloads (SIGHUP, POST /v1/admin/reload): one at a time; another
     * asked for meanwhile runs when it ends. */
    iv_config_reader_fn reader;
    void *reader_arg;
    struct reload *reload;
    int reload_again;
    atomic_int reload_asked;  /* iv_server_request_reload_async */
    uint64_t reload_gen;
    int draining;         /* loop 0: SIGTERM seen */
    atomic_int stopping;  /* the same, for workers: a pack in a load job ends (autopack.h) */
    /* Every token, with its name and scope (auth.h); a reload builds a
     * new table and frees this one between requests. */
    iv_auth_t auth;
    /* Serializes HDF5 calls when the library was built without thread
     * safety (H5is_library_threadsafe); unused otherwise. */
    pthread_mutex_t h5_mu;
    int h5_serial;
    iv_budget_t transpose_left;   /* global transpose_bytes not yet taken */
    iv_membudget_t *mb;           /* the cache budget all datasets share */
    /* The process's memory budget (memory_bytes) and its parts, set at
     * start (start_memory): the chunk caches (mb), in-memory copies of
     * the other orientation (transpose_left), bytes waiting to be written
     * (write_budget), answers being computed (answers_left: each query
     * stream reserves its working set, a 503 when it is spent) and the
     * packs the server runs (builds: their --memory-mb). */
    struct {
        size_t total, cache, copies, writes, answers, builds;
    } mem;
    size_t write_budget;          /* limits.write_budget_bytes within mem.writes */
    atomic_int lending;           /* a build borrows from the caches' part now (load.c) */
    atomic_size_t lent;           /* how much, from the caches' part */
    atomic_size_t lent_copies;    /* and from the in-memory copies' part */
    iv_budget_t answers_left;
    iv_alog_t log;
    iv_watch_t *watch;            /* the served files' watcher (watch.h), or NULL */
};

/* A reload in progress (see reload_start). */
typedef struct reload {
    uint64_t gen;
    unsigned waiting;     /* its load jobs not back yet, plus one while it is being set up */
    iv_buf_t added, removed, reloaded, failed;   /* JSON array members */
    size_t unchanged;
    loop_t *waiter_lp;    /* the admin request to answer: its loop and */
    uint64_t waiter;      /* connection id, or 0 */
    double t0;
    char why[64];
} reload_t;

/* A refusal decided before any work: the answer to send. */
typedef struct rfail {
    int status;
    const char *code;
    char msg[200];
    const char *extra;
    iv_route_t route;
} rfail_t;

/* The largest X-Ivserve-Dropped-Names header; past it the names are cut
 * at an element and the header says how many there were. */
#define DROPPED_HDR_MAX 4096

/* ---- small helpers ------------------------------------------------------ */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline const char *method_name(int m)
{
    return llhttp_method_name((llhttp_method_t)m);
}

static inline uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

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

/* Datasets loading (load.c): the load, other-orientation and warm jobs,
 * both halves (load_submit starts one, loop thread).  The document parts
 * are called wherever the dataset is not changing under them; ds_unref
 * and ds_retire are for the loop thread. */
void load_submit(server_t *s, sds_t *d, uint64_t gen, int replace, int reloaded);
void ds_unref(server_t *s, sds_t *d);
void ds_retire(server_t *s, sds_t *d);
void ds_memory(const sds_t *d, iv_metrics_ds_mem_t *m);
void put_memory(iv_buf_t *b, const sds_t *d);
void build_doc(sds_t *d);
/* Where a ready dataset's other orientation comes from (config.h's
 * other_orientation, the dataset's companion and transpose budget, the
 * stream's size); OTHER_NONE: it gets none. */
enum { OTHER_NONE = 0, OTHER_MEMORY, OTHER_DISK, OTHER_COMPANION };
int other_plan(const server_t *s, const sds_t *d);

/* Answers, the end of a request, the write budget (respond.c).  Loop thread.
 *
 * conn_writev queues head (owned, may be NULL) then the pieces in order
 * (at most three of them owned, freed when written; the others must
 * outlive the write), the pieces framed as one chunk when chunk is set.
 * A block of stream qs is credited to it when written; last marks the
 * answer's final bytes.  Returns 0, or -1 when the connection was closed
 * instead (what was owned is freed).  conn_write is the same for one
 * payload (owned when own). */
typedef struct wpiece {
    const char *p;
    size_t len;
    int own;
} wpiece_t;
int conn_writev(conn_t *c, char *head, size_t hlen, const wpiece_t *pieces, unsigned n_pieces,
                int chunk, qstream_t *qs, int last);
int conn_write(conn_t *c, char *head, size_t hlen, const char *payload, size_t plen, int own,
               int chunk, qstream_t *qs, int last);
int origin_allowed(const server_t *s, const char *origin);
void resp_head(conn_t *c, iv_buf_t *b, int status, const char *ctype, int64_t content_length,
               const char *extra);
void send_buf_done(conn_t *c, iv_buf_t *b);
void send_simple(conn_t *c, int status, const char *ctype, const char *body, size_t len,
                 const char *extra);
void send_owned(conn_t *c, int status, const char *ctype, iv_buf_t *body, const char *extra);
void send_error(conn_t *c, int status, const char *code, const char *msg, const char *extra);
void send_iv_error(conn_t *c, int rc, const iv_err_t *e);
/* The message a client is shown for engine error rc: msg, or for a 5xx
 * msg with the server's paths taken out (written to red, of cap bytes).
 * The access log keeps msg whole (callers put it in c->errmsg). */
const char *error_for_client(int rc, const char *msg, char *red, size_t cap);
void access_log(conn_t *c, uint64_t bytes);
void req_reset(conn_t *c);
void resp_begin(conn_t *c, iv_http_req_t *req);
void resp_begin_error(conn_t *c);
void req_done(conn_t *c);
int budget_room(conn_t *c);
int budget_admit(conn_t *c, size_t len);
void budget_wake(loop_t *lp);
#define BUDGET_TICK_MS 100
void budget_tick(uv_timer_t *t);
/* A stream of lp starts (+1) or stops (-1) waiting for the budget. */
void budget_wait_count(loop_t *lp, int d);

/* Connections (conn.c).  Loop thread. */
void conn_set_state(conn_t *c, conn_state_t st);
int is_reading_state(const conn_t *c);
void resp_finished(conn_t *c);
void conn_close(conn_t *c);
/* Loop lp takes the accepted socket fd (closes it on failure). */
void conn_adopt(loop_t *lp, int fd);
/* The steps of conn_adopt, for any transport: a connection on loop lp
 * (NULL when out of memory), counted and listed, its transport not yet
 * open; conn_attached once the transport is open (it is closed with the
 * connection); conn_start to read the first request. */
conn_t *conn_create(loop_t *lp, const iv_transport_t *tp);
void conn_attached(conn_t *c);
void conn_start(conn_t *c);
conn_t *conn_by_id(loop_t *lp, uint64_t id);

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
/* setup_job.c: a matrix answer whose memory is reserved goes on. */
void answer_go(qstream_t *qs, const setup_res_t *res);

/* Query streams (qstream.c).  Loop thread; qs_cancel only sets flags
 * that the workers read. */
void qs_cancel(qstream_t *qs);
qstream_t *qs_new(conn_t *c, sds_t *d, int count);
void qs_free(qstream_t *qs);
int qs_submit_job(qstream_t *qs, const job_type_t *type, int64_t b, setup_t *st);
int qs_submit(qstream_t *qs, const job_type_t *type, int64_t b);
/* gzip level of a query answer by Accept-Encoding (0: identity), and
 * the headers that vary with it. */
int stream_gzip_level(const server_t *s, const iv_http_req_t *r);
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

/* The server and its loops (server.c).
 *
 * server_open builds the server's state without a listening socket or
 * running loops: what iv_server_run sets up before it listens.  Unit
 * tests build a server this way and drive its loop and connections by
 * hand.  It says on stderr why it returns NULL; server_free frees a
 * server set up as far as its stage. */
enum { SRV_ALLOCATED, SRV_POOL, SRV_LOOPS, SRV_RAN };
server_t *server_open(const iv_config_t *cfg, iv_config_reader_fn reader, void *reader_arg);
void server_free(server_t *s, int stage);
/* Closes the loop's handles once no connection is left. */
void loop_stopped_check(loop_t *lp);
/* Runs fn(arg) on loop lp's thread, soon (a job with only a done half). */
int loop_call(loop_t *lp, server_t *s, void (*fn)(server_t *s, void *arg), void *arg);
/* Hands job j to loop lp: its done half runs there (any thread). */
void loop_post(loop_t *lp, job_t *j);

/* Routes (routes.c).  Loop thread. */
sds_t *find_ds(server_t *s, const char *id, size_t n);
int method_ok(conn_t *c, int allow_post);
void dispatch(conn_t *c);
int route_precheck(conn_t *c, const iv_http_req_t *r, rfail_t *f);

/* Routes computed on a worker (routes_query.c).  Loop thread. */
void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total);
void route_query(conn_t *c, sds_t *d, int count);
/* Refuses (415) a POST body that is not JSON (form-urlencoded and text
 * pass: curl -d sends them); 1 when it was refused. */
int body_type_refused(conn_t *c);
void route_viewer(conn_t *c, sds_t *d, int vroute, const char *sub);

/* A query's set-up, and a viewer route's answer (setup_job.c): both
 * halves. */
extern const job_type_t setup_job, viewer_job;
/* Worker: the request's selection parsed and its names resolved as the
 * query set-up does (*qr owned by the caller on 0; *mds the matrix it
 * names), the dropped names in the job's setup. */
int setup_selection(job_t *j, iv_qreq_t *qr, iv_dataset_t **mds);

/* The export route (routes_export.c).  Loop thread. */
void route_export(conn_t *c, sds_t *d);
/* qs_pump of an export's stream; the stream's file is freed with it. */
void export_pump(qstream_t *qs);
void export_file_free(struct export_file *f);

/* Reloads (reload.c).  Loop thread.  A load of the running reload (its
 * gen) that came back is noted in the reload's summary
 * (reload_load_noted), then counted off (reload_step). */
void reload_free(reload_t *op);
void reload_start(server_t *s, const char *why, loop_t *waiter_lp, uint64_t waiter);
void reload_load_noted(server_t *s, const job_t *j, const sds_t *d);
void reload_step(server_t *s);
/* The answer to an admin reload, sent on the waiter's loop if it is still there. */
void reload_reply(server_t *s, loop_t *lp, uint64_t id, int status, const char *code,
                  const char *msg, iv_buf_t *body, const char *extra);

#endif
