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
 * socket" (more, up to one a worker, while workers are free; see
 * qs_pump); the next block is submitted only when a write completes.  A
 * slow reader therefore holds at most that many encoded blocks, and
 * because each response keeps only a few jobs in the pool's FIFO, the
 * blocks of concurrent queries interleave: a whole-matrix download does
 * not hold up a one-cell query.  HTTP headers go out with the first
 * block, so an error in the prepare step or the first block still gets a
 * proper status; a later error is reported in the stream's trailer.
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
 * its stream, which it credits on completion.
 *
 * Datasets are registry entries (registry.h) that each stream and load job
 * holds by reference, so that a reload (reload_start) can change the list
 * under running requests: an entry it drops lives until the last of them
 * ends, and a replacement loads beside the entry it replaces and is
 * swapped in, on the loop, only once it is ready.
 */
#include "server.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#ifdef __linux__
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#endif

#include <hdf5.h>
#include <uv.h>

#include "access_log.h"
#include "auth.h"
#include "buf.h"
#include "codec.h"
#include "dataset.h"
#include "encode.h"
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
#include "routes_meta.h"
#include "openapi.h"
#include "routes_viewer.h"
#include "transpose.h"
#include "routes_static.h"
#include "version.h"
#include "watch.h"

#define READ_BUF_BYTES 65536
#define TOKNAME_BYTES 72  /* token names are at most 64 bytes (tokens_file.h) */

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct qstream qstream_t;

/* A dataset as the routes see it: a registry entry (registry.h), held by
 * reference by each stream and load job that uses it. */
typedef iv_rds_t sds_t;
#define DS_LOADING IV_RDS_LOADING
#define DS_READY IV_RDS_READY
#define DS_FAILED IV_RDS_FAILED

enum job_kind { J_LOAD, J_SETUP, J_META, J_PREP, J_BLOCK, J_WHOLE, J_COUNT, J_OTHER };

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
    char *dropped;        /* the names dropped by missing=ignore, JSON, or NULL */
    char *dropped_hdr;    /* the same, bounded for the X-Ivserve-Dropped-Names header */
    int have_total;
    double total;
    iv_fmt_t fmt;
    int dense;            /* "dense": true */
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
    uint32_t crc;         /* J_BLOCK of a gzip stream: CRC-32 and length of the */
    size_t raw_len;       /* identity bytes that out holds compressed */
    setup_t *setup;       /* J_SETUP */
    int cancelled;        /* skipped: cancelled before it ran */
    uint64_t gen;         /* J_LOAD: the reload that started it (0: start-up) */
    int replace;          /* J_LOAD: a served entry's pending replacement */
    int reloaded;         /* J_LOAD: of a dataset served before (the reload's summary) */
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
    unsigned ahead;       /* slots: blocks_ahead, or the pool's workers if more */
    unsigned base_ahead;  /* blocks_ahead: the window when no worker is free */
    int inflight;
    int prepared, headers_sent, done;
    int64_t rows, nnz;
    int have_total;       /* J_COUNT: total already known from the metadata */
    double total;
    int dense;            /* gene rows as dense vectors */
    int gz_level;         /* > 0: the answer is one gzip member (stream_gzip_level) */
    iv_gz_sum_t gz_sum;   /* its identity bytes so far, in body order */
    unsigned wq;          /* its writes whose callbacks have not run (keep it alive) */
    int budget_wait;      /* waits for the write budget before submitting blocks */
    /* Set on the loop when the client left or the server stops; workers
     * read it between the phases of a job and drop the work. */
    atomic_int cancelled;
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
    uv_tcp_t tcp;
    uv_timer_t timer;
    server_t *srv;
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
    int log_pending;      /* the last answer's log line waits for the close (delivered bytes) */
    qstream_t *qs;
    int chunked;
    char *dropped;        /* JSON {"obs":[...],"var":[...]} of names dropped by missing=ignore */
    char *dropped_hdr;    /* the same, bounded, for the header */
};

struct server {
    uv_loop_t loop;
    const iv_config_t *cfg;
    iv_pool_t *pool;
    uv_tcp_t listener;
    uv_async_t async;
    uv_signal_t sigterm, sigint, sighup, sigusr1;
    uv_timer_t grace;
    pthread_mutex_t done_mu;
    job_t *done_head;
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
    conn_t *conns;
    size_t n_conns;
    qstream_t *streams;
    size_t n_streams;
    int draining, stopped;
    size_t queued_bytes;  /* bytes waiting in every connection's uv_write queue */
    size_t doomed_bytes;  /* of those, the bytes of closed connections (freed soon) */
    size_t n_budget_wait; /* streams waiting for the write budget */
    /* Every token, with its name and scope (auth.h); a reload builds a
     * new table and frees this one between requests. */
    iv_auth_t auth;
    /* Serializes HDF5 calls when the library was built without thread
     * safety (H5is_library_threadsafe); unused otherwise. */
    pthread_mutex_t h5_mu;
    int h5_serial;
    iv_metrics_t metrics;
    iv_budget_t transpose_left;   /* global transpose_bytes not yet taken */
    iv_membudget_t *mb;           /* the cache budget all datasets share */
    iv_alog_t log;
    iv_watch_t *watch;            /* the served files' watcher (watch.h), or NULL */
};

/* A reload in progress (see reload_start). */
typedef struct reload {
    uint64_t gen;
    unsigned waiting;     /* its load jobs not back yet, plus one while it is being set up */
    iv_buf_t added, removed, reloaded, failed;   /* JSON array members */
    size_t unchanged;
    conn_t *waiter;       /* the admin request to answer, or NULL */
    double t0;
    char why[64];
} reload_t;

/* ---- small helpers ------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *method_name(int m)
{
    return llhttp_method_name((llhttp_method_t)m);
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
    free(st->dropped_hdr);
    free(st);
}

/* Drops a reference to a dataset; the last one of a dataset a reload
 * took out of service frees it, and the log says so (its memory is
 * back). */
static void ds_unref(server_t *s, sds_t *d)
{
    if (d && d->retired && d->refs == 1 && d->ds)
        iv_alog_event(&s->log, "info", "dataset %s released (%s)", d->conf->id, d->conf->path);
    iv_rds_unref(d);
}

/* Takes d out of service (registry.h); freed now or by the last request. */
static void ds_retire(server_t *s, sds_t *d)
{
    if (d->pending) {
        d->pending->retired = 1;
        ds_unref(s, d->pending);
        d->pending = NULL;
    }
    d->retired = 1;
    ds_unref(s, d);
}

/* Loop thread (or after the loop stopped): a load job's reference on its
 * dataset is dropped here. */
static void job_free(job_t *j)
{
    iv_buf_free(&j->out);
    setup_free(j->setup);
    ds_unref(j->srv, j->ds);
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

/* "orientations": which copies of the matrix serve queries, and the memory
 * each takes now (see iv_dataset_orientations). */
static void put_orientations(iv_buf_t *b, iv_dataset_t *ds)
{
    static const char *const state[] = {"none", "building", "ready", "skipped", "failed"};
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    iv_buf_puts(b, ",\"orientations\":{");
    for (int o = 0; o < 2; o++) {
        int own = (iv_orient_t)o == st.file_orient;
        iv_buf_printf(b, "%s\"%s\":{", o ? "," : "", o == IV_IVCSR ? "cells" : "genes");
        if (own || st.other_state == IV_OTHER_READY)
            iv_buf_printf(b, "\"state\":\"ready\",\"source\":\"%s\",\"bytes\":%zu,"
                          "\"stream_bytes\":%" PRIu64, own ? "file" : st.other_source == IV_SRC_FILE
                          ? "companion" : "memory", st.bytes[o], st.stream_bytes[o]);
        else
            iv_buf_printf(b, "\"state\":\"%s\"", state[st.other_state]);
        if (!own && st.other_state == IV_OTHER_READY)
            iv_buf_printf(b, ",\"seconds\":%.3f", st.other_seconds);
        iv_buf_puts(b, "}");
    }
    iv_buf_puts(b, "}");
}

/* A ready dataset's memory now, by part. */
static void ds_memory(const sds_t *d, iv_metrics_ds_mem_t *m)
{
    memset(m, 0, sizeof *m);
    m->id = d->conf->id;
    iv_dataset_memory_t dm;
    iv_dataset_memory(d->ds, &dm);
    /* Layers and raw/X count in the same parts; raw/var as metadata. */
    size_t mx_meta = 0;
    iv_rds_matrices_memory(d, &dm, &mx_meta, &m->budget_evictions);
    m->part[IV_MEM_METADATA] = mx_meta;
    m->part[IV_MEM_POINTERS] = dm.pointers;
    m->part[IV_MEM_VALUES] = dm.values;
    m->part[IV_MEM_INDEX] = dm.index;
    m->part[IV_MEM_CACHE] = dm.cache;
    m->part[IV_MEM_STREAM] = dm.stream;
    m->part[IV_MEM_OTHER] = dm.other;
    m->part[IV_MEM_SCRATCH] = dm.scratch;
    if (d->meta) {
        iv_meta_stats_t ms;
        iv_meta_stats(d->meta, &ms);
        m->part[IV_MEM_METADATA] += ms.bytes;
    }
    iv_vds_memory(d->vx, &m->part[IV_MEM_OBSM], &m->part[IV_MEM_SEARCH]);
    iv_cache_stats_t cs;
    iv_dataset_cache_stats(d->ds, &cs);
    m->budget_evictions += cs.budget_evictions;
}

/* ,"memory":{...}: what the dataset holds now, by part, and its cache's
 * limits (cap null: only the shared budget). */
static void put_memory(iv_buf_t *b, const sds_t *d)
{
    iv_metrics_ds_mem_t m;
    ds_memory(d, &m);
    iv_cache_stats_t cs;
    iv_dataset_cache_stats(d->ds, &cs);
    size_t total = 0;
    iv_buf_puts(b, ",\"memory\":{");
    for (int p = 0; p < IV_MEM_N; p++) {
        iv_buf_printf(b, "\"%s\":%zu,", iv_mem_part_name((iv_mem_part_t)p), m.part[p]);
        total += m.part[p];
    }
    iv_buf_printf(b, "\"total\":%zu,\"cache_floor\":%zu,\"cache_budget\":%zu,\"cache_cap\":", total,
                  cs.floor, cs.shared_budget);
    if (cs.budget == SIZE_MAX) iv_buf_puts(b, "null");
    else iv_buf_printf(b, "%zu", cs.budget);
    iv_buf_printf(b, ",\"cache_budget_evictions\":%" PRIu64 "}", m.budget_evictions);
}

/* "file": whether the path still names the file loaded, unchanged
 * (filecheck.h; the watcher moves it, see on_file_change). */
static void put_file_state(iv_buf_t *b, iv_dataset_t *ds)
{
    char msg[480];
    iv_file_state_t st = iv_dataset_file_state(ds, msg, sizeof msg);
    iv_buf_printf(b, ",\"file\":{\"state\":\"%s\"", iv_file_state_name(st));
    if (st != IV_FILE_OK) {
        iv_buf_puts(b, ",\"message\":");
        iv_buf_json_str(b, msg);
    }
    iv_buf_puts(b, "}");
}

static void render_doc(sds_t *d, iv_buf_t *b);

static void build_doc(sds_t *d)
{
    iv_buf_t b;
    iv_buf_init(&b);
    render_doc(d, &b);
    if (b.oom) {
        iv_buf_free(&b);
        return;
    }
    snprintf(d->etag, sizeof d->etag, "\"%016" PRIx64 "\"", fnv1a(b.data, b.len));
    d->doc = iv_buf_steal(&b, &d->doc_len);
}

static void render_doc(sds_t *d, iv_buf_t *b0)
{
    iv_buf_t b = *b0;
    put_summary(&b, d, 1);
    put_orientations(&b, d->ds);
    put_file_state(&b, d->ds);
    iv_rds_matrices_doc(&b, d);
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
    *b0 = b;
}

/* The other orientation of a ready dataset, on a worker: the companion
 * file when configured, else a copy built in memory under the budgets
 * (the dataset's transpose_bytes, or the global one, and what is left of
 * the global).  The document is rendered again for the loop to install. */
static void job_other(void *arg)
{
    job_t *j = arg;
    sds_t *d = j->ds;
    const iv_config_t *cfg = j->srv->cfg;
    double t0 = now_s();
    if (d->conf->companion) {
        iv_dataset_opts_t o;
        iv_dataset_opts_init(&o);
        o.group = d->conf->companion_group;
        o.cache_bytes = d->conf->cache_bytes >= 0 ? (size_t)d->conf->cache_bytes : (size_t)-1;
        o.membudget = j->srv->mb;
        o.pool = j->srv->pool;
        j->rc = iv_dataset_attach_other(d->ds, d->conf->companion, &o, &j->err);
    } else {
        iv_transpose_opts_t to = {
            .budget = d->conf->transpose_bytes >= 0 ? (uint64_t)d->conf->transpose_bytes
                                                    : (uint64_t)cfg->transpose_bytes,
            .global = &j->srv->transpose_left,
            .pool = j->srv->pool,
        };
        j->rc = iv_dataset_build_other(d->ds, &to, &j->err);
    }
    render_doc(d, &j->out);
    j->secs = now_s() - t0;
    job_finish(j);
}

static void job_load(void *arg)
{
    job_t *j = arg;
    sds_t *d = j->ds;
    double t0 = now_s();
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.group = d->conf->group;
    /* The process-wide budget, with this dataset's cap and floor. */
    o.cache_bytes = d->conf->cache_bytes >= 0 ? (size_t)d->conf->cache_bytes : (size_t)-1;
    o.cache_floor = (size_t)d->conf->cache_floor_bytes;
    o.membudget = j->srv->mb;
    /* The row-index pass and the cache prefault take the workers that are
     * free (nested: this job is one of them, and runs its share). */
    o.pool = j->srv->pool;
    if (j->srv->h5_serial) pthread_mutex_lock(&j->srv->h5_mu);
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
            if (me.code != IV_EUNSUPPORTED) {
                /* A damaged file is left out whole, as `ivserve check` fails it. */
                j->rc = me.code ? me.code : IV_EBAD_FILE;
                j->err = me;
                iv_dataset_close(d->ds);
                d->ds = NULL;
            }
        }
        /* Layers and raw/X: datasets of their own, X stays the primary. */
        if (j->rc == 0 && (j->rc = iv_rds_load_matrices(d, &o, &j->err)) != 0) {
            iv_meta_free(d->meta);
            d->meta = NULL;
            iv_dataset_close(d->ds);
            d->ds = NULL;
        }
        if (j->rc == 0) {
            d->vx = iv_vds_load(d->conf->path, d->ds, d->meta);
            build_doc(d);
        }
    }
    if (j->srv->h5_serial) pthread_mutex_unlock(&j->srv->h5_mu);
    j->secs = now_s() - t0;
    job_finish(j);
}

/* ---- query jobs (worker) ------------------------------------------------ */

/* True when the stream's client left or the server stops: a worker drops
 * the rest of the job.  Checked between the phases of a job. */
static int job_cancelled(job_t *j)
{
    return j->qs && atomic_load_explicit(&j->qs->cancelled, memory_order_relaxed);
}

static int job_cancel_rc(job_t *j)
{
    return iv_fail(&j->err, IV_ECANCELLED, "the client went away");
}

/* The largest X-Ivserve-Dropped-Names header; past it the names are cut
 * at an element and the header says how many there were. */
#define DROPPED_HDR_MAX 4096

/* Length of the longest prefix of the JSON string array arr (of len
 * bytes) that ends at an element and fits in max bytes with its closing
 * ']'; *total and *kept count the elements. */
static size_t json_array_cut(const char *arr, size_t len, size_t max, size_t *total, size_t *kept)
{
    size_t cut = 1, n = 0, k = 0;
    int in_str = 0, esc = 0;
    for (size_t i = 1; i < len; i++) {
        char ch = arr[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (ch == '\\') esc = 1;
            else if (ch == '"') {
                in_str = 0;
                n++;
                if (i + 2 <= max) {
                    cut = i + 1;
                    k = n;
                }
            }
        } else if (ch == '"') {
            in_str = 1;
        }
    }
    *total = n;
    *kept = k;
    return cut;
}

/* Appends one axis of the bounded header form: the names that fit, and
 * when some did not, the count of all of them. */
static void dropped_hdr_axis(iv_buf_t *b, const char *key, const iv_buf_t *arr, size_t budget)
{
    iv_buf_printf(b, "\"%s\":", key);
    if (!arr->len) {
        iv_buf_puts(b, "[]");
        return;
    }
    size_t total, kept, cut = json_array_cut(arr->data, arr->len, budget, &total, &kept);
    if (kept == total) {
        iv_buf_append(b, arr->data, arr->len);
        return;
    }
    iv_buf_append(b, arr->data, cut);
    iv_buf_printf(b, "],\"%s_count\":%zu,\"%s_truncated\":true", key, total, key);
}

/* The worker half of a query's set-up (see setup_t). */
static void setup_run(job_t *j)
{
    setup_t *st = j->setup;
    sds_t *d = j->qs->ds;
    const iv_dataset_info_t *info = iv_dataset_info(d->ds);
    iv_qreq_t qr;
    int rc;
    if (job_cancelled(j)) {
        j->rc = job_cancel_rc(j);
        return;
    }
    /* "matrix": X, a layer or raw/X; its axis lengths bound the selection,
     * raw/X's genes are raw/var's (registry.h). */
    if (st->is_post)
        rc = iv_qreq_parse_json_m(st->body ? st->body : "", st->body_len, iv_rds_matrix_shape, d,
                                  &qr, &j->err);
    else
        rc = iv_qreq_parse_query_m(st->query, strlen(st->query), iv_rds_matrix_shape, d, &qr,
                                   &j->err);
    iv_dataset_t *mds = NULL;
    iv_meta_t *var_meta = NULL;
    if (rc == 0 && (rc = iv_rds_matrix(d, qr.matrix, &mds, &var_meta, &j->err)) != 0)
        iv_qreq_free(&qr);
    if (rc != 0) {
        if (rc == IV_EUNSUPPORTED) st->status = 422;
        j->rc = rc;
        return;
    }
    info = iv_dataset_info(mds);
    /* Names and filters: a bitmap pass over the axis (about 1.5 ms for a
     * four-term filter on 200,000 cells). */
    iv_buf_t drop_obs, drop_var, fold_obs, fold_var;
    iv_buf_init(&drop_obs);
    iv_buf_init(&drop_var);
    iv_buf_init(&fold_obs);
    iv_buf_init(&fold_var);
    int show_obs = qr.obs.missing_ignore, show_var = qr.var.missing_ignore;
    if ((rc = job_cancelled(j) ? job_cancel_rc(j) : 0) != 0 ||
        (rc = iv_rmeta_resolve_ex(d->meta, IV_AXIS_OBS, &qr.obs, &drop_obs, &fold_obs,
                                  &j->err)) != 0 ||
        (rc = job_cancelled(j) ? job_cancel_rc(j) : 0) != 0 ||
        (rc = iv_rmeta_resolve_ex(var_meta, IV_AXIS_VAR, &qr.var, &drop_var, &fold_var,
                                  &j->err)) != 0 ||
        (rc = job_cancelled(j) ? job_cancel_rc(j) : 0) != 0) {
        iv_buf_free(&drop_obs);
        iv_buf_free(&drop_var);
        iv_buf_free(&fold_obs);
        iv_buf_free(&fold_var);
        iv_qreq_free(&qr);
        if (rc == IV_EUNSUPPORTED) st->status = 422;
        j->rc = rc;
        return;
    }
    int folded = fold_obs.len || fold_var.len;
    if (show_obs || show_var || folded) {
        /* The count body's form is whole; names matched only by ignoring
         * case are reported beside the dropped ones, under "folded". */
        iv_buf_t dj;
        iv_buf_init(&dj);
        iv_buf_puts(&dj, "{\"obs\":");
        /* Buffers are not NUL-terminated: copy by length. */
        if (drop_obs.len) iv_buf_append(&dj, drop_obs.data, drop_obs.len);
        else iv_buf_puts(&dj, "[]");
        iv_buf_puts(&dj, ",\"var\":");
        if (drop_var.len) iv_buf_append(&dj, drop_var.data, drop_var.len);
        else iv_buf_puts(&dj, "[]");
        if (folded) {
            iv_buf_puts(&dj, ",\"folded\":{\"obs\":");
            if (fold_obs.len) iv_buf_append(&dj, fold_obs.data, fold_obs.len);
            else iv_buf_puts(&dj, "[]");
            iv_buf_puts(&dj, ",\"var\":");
            if (fold_var.len) iv_buf_append(&dj, fold_var.data, fold_var.len);
            else iv_buf_puts(&dj, "[]");
            iv_buf_puts(&dj, "}");
        }
        iv_buf_append(&dj, "}", 2);  /* the NUL makes it a C string */
        if (!dj.oom) st->dropped = iv_buf_steal(&dj, NULL);
        iv_buf_free(&dj);
        /* The header form is bounded: a request of a million unknown names
         * would otherwise send a header of megabytes. */
        size_t share = folded ? DROPPED_HDR_MAX / 4 : DROPPED_HDR_MAX / 2;
        iv_buf_t dh;
        iv_buf_init(&dh);
        iv_buf_puts(&dh, "{");
        dropped_hdr_axis(&dh, "obs", &drop_obs, share);
        iv_buf_puts(&dh, ",");
        dropped_hdr_axis(&dh, "var", &drop_var, share);
        if (folded) {
            iv_buf_puts(&dh, ",\"folded\":{");
            dropped_hdr_axis(&dh, "obs", &fold_obs, share);
            iv_buf_puts(&dh, ",");
            dropped_hdr_axis(&dh, "var", &fold_var, share);
            iv_buf_puts(&dh, "}");
        }
        iv_buf_append(&dh, "}", 2);
        if (!dh.oom) st->dropped_hdr = iv_buf_steal(&dh, NULL);
        iv_buf_free(&dh);
    }
    iv_buf_free(&drop_obs);
    iv_buf_free(&drop_var);
    iv_buf_free(&fold_obs);
    iv_buf_free(&fold_var);
    /* Total counts without decoding: the computed per-row sums of the axis
     * whose opposite axis is wholly selected. */
    if (st->count && d->meta && mds == d->ds) {
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
    if (job_cancelled(j)) {
        iv_qreq_free(&qr);
        j->rc = job_cancel_rc(j);
        return;
    }
    iv_sel_t so = iv_psel_view(&qr.obs), sv = iv_psel_view(&qr.var);
    iv_query_opts_t qo = {qr.by_var ? IV_OUT_VARS : IV_OUT_ROWS, 0, 0, IV_PICK_AUTO};
    st->dense = qr.dense;
    if (qr.dense) {
        /* A dense gene row holds one value per selected cell: about 8 MiB
         * of them a block. */
        int64_t cells = so.all ? st->n_rows : so.n;
        qo.block_rows = cells > 0 ? ((int64_t)8 << 20) / (cells * 8) : 0;
        if (qo.block_rows < 1) qo.block_rows = 1;
    }
    j->rc = iv_query_new(mds, &so, &sv, &qo, &st->q, &j->err);
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

/* Compresses a job's output where it was encoded, on the worker: a block
 * becomes one piece of the stream's gzip member (gzip_stream.h), the whole
 * JSON document a member of its own (its pieces on the free workers). */
static int gz_job_out(job_t *j)
{
    iv_buf_t z;
    iv_buf_init(&z);
    int level = j->qs->gz_level;
    j->raw_len = j->out.len;
    int rc = j->kind == J_WHOLE ? iv_gz_member(&z, j->out.data, j->out.len, level, j->srv->pool)
                                : iv_gz_block(&z, j->out.data, j->out.len, level, &j->crc);
    iv_buf_free(&j->out);
    if (rc != 0) {
        iv_buf_free(&z);
        return iv_fail(&j->err, rc, rc == IV_ENOMEM ? "out of memory compressing the answer"
                                                     : "the compressor failed");
    }
    j->out = z;
    return 0;
}

static void job_run(void *arg)
{
    job_t *j = arg;
    qstream_t *qs = j->qs;
    double t0 = now_s();
    const iv_limits_t *lim = &j->srv->cfg->limits;
    if (job_cancelled(j)) {
        /* The client left while the job waited in the queue. */
        j->rc = job_cancel_rc(j);
        j->cancelled = 1;
    } else if (j->kind == J_SETUP) {
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
            iv_stream_hdr_t h = iv_stream_hdr_of(qs->q, qs->dense);
            iv_enc_block_h(&j->out, qs->fmt, &h, &blk);
            j->rows = blk.n_rows;
            j->nnz = blk.nnz;
            if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory encoding a block");
            else if (qs->gz_level) j->rc = gz_job_out(j);
        }
        iv_block_free(&blk);
    } else if (j->kind == J_WHOLE || j->kind == J_COUNT) {
        j->rc = iv_query_prepare(qs->q, j->srv->pool, &j->err);
        int64_t hint = iv_query_nnz_hint(qs->q);
        iv_jdoc_t d;
        iv_jdoc_init(&d);
        iv_stream_hdr_t h = iv_stream_hdr_of(qs->q, qs->dense);
        int64_t nb = iv_query_n_blocks(qs->q);
        if (j->kind == J_COUNT && hint >= 0 && qs->have_total) {
            j->nnz = hint;
            nb = 0;
        }
        for (int64_t b = 0; j->rc == 0 && b < nb; b++) {
            if (job_cancelled(j)) {
                j->rc = job_cancel_rc(j);
                break;
            }
            iv_block_t blk;
            memset(&blk, 0, sizeof blk);
            j->rc = iv_query_decode_block(qs->q, b, &blk, &j->err);
            if (j->rc == 0) {
                j->nnz += blk.nnz;
                if (j->kind == J_COUNT && !qs->have_total)
                    for (int64_t k = 0; k < blk.nnz; k++)
                        j->total += iv_dtype_get_f64(blk.dtype, blk.data, (size_t)k);
                if (j->kind == J_WHOLE) {
                    iv_jdoc_add_h(&d, &h, &blk);
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
            iv_jdoc_finish(&d, &h, &j->out);
            if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory building the JSON result");
            else if (qs->gz_level) j->rc = gz_job_out(j);
        }
        j->rows = iv_query_n_rows(qs->q);
        iv_jdoc_free(&d);
    }
    j->secs = now_s() - t0;
    job_finish(j);
}

/* ---- connection output -------------------------------------------------- */

/* One uv_write: up to 2 + 2 * WREQ_PIECES buffers (head, chunk size,
 * payload pieces of at most UINT_MAX bytes, chunk end). */
#define WREQ_PIECES 4
#define PIECE_MAX ((size_t)UINT_MAX)

typedef struct wreq {
    uv_write_t req;
    conn_t *c;
    char *head;           /* owned */
    char *payload;        /* owned, or NULL when borrowed */
    qstream_t *qs;        /* the stream whose block this is, credited on completion */
    uint64_t seq;         /* the answer it belongs to */
    int last;             /* the answer's last write */
    size_t bytes;
    char chunk[24];
} wreq_t;

static void conn_close(conn_t *c);
static void on_timer(uv_timer_t *t);
static void conn_pump(conn_t *c);
static void qs_pump(qstream_t *qs);
static void qs_free(qstream_t *qs);
static void req_done(conn_t *c);
static void conn_shutdown(conn_t *c);
static void drain_check(conn_t *c);
static void budget_wake(server_t *s);

/* How often a draining connection looks at its unacknowledged bytes. */
#define DRAIN_POLL_MS 25

/*
 * The one place a connection changes state.  It also (re)arms the state's
 * timer, so that calling it again with the same state restarts the
 * deadline: that is how progress (a completed write, a finished block)
 * extends a response.
 */
static void conn_set_state(conn_t *c, conn_state_t st)
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

static int is_reading_state(const conn_t *c)
{
    return c->state == CS_IDLE || c->state == CS_READ_HEAD || c->state == CS_READ_BODY;
}

/* An answer's last write completed: the connection closes politely or
 * goes on to the next pipelined request. */
static void resp_finished(conn_t *c)
{
    c->resp_ended = 0;
    if (c->close_after || c->srv->draining) {
        conn_shutdown(c);
        return;
    }
    conn_set_state(c, iv_http_in_headers_done(&c->in) ? CS_READ_BODY
                      : iv_http_in_active(&c->in) || c->rlen || c->n_ahead || c->ahead_err
                          ? CS_READ_HEAD
                          : CS_IDLE);
    conn_pump(c);
}

static void on_write(uv_write_t *w, int status)
{
    wreq_t *r = (wreq_t *)w;
    conn_t *c = r->c;
    server_t *s = c->srv;
    if (c->state == CS_CLOSING) s->doomed_bytes -= r->bytes;
    c->wpending -= r->bytes;
    s->queued_bytes -= r->bytes;
    c->last_progress = uv_now(&s->loop);
    free(r->head);
    free(r->payload);
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
    if (s->n_budget_wait) budget_wake(s);
    if (c->state == CS_CLOSING) return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (last) resp_finished(c);
    else if (c->state == CS_RESPONDING) conn_set_state(c, CS_RESPONDING);  /* progress */
}

/* Queues head (owned, may be NULL) then payload (owned when own, else it
 * must outlive the write; may be NULL), the payload framed as one chunk
 * when chunk is set.  A block of stream qs is credited to it when written;
 * last marks the answer's final bytes.  Returns 0, or -1 when the
 * connection was closed instead. */
static int conn_write(conn_t *c, char *head, size_t hlen, const char *payload, size_t plen, int own,
                      int chunk, qstream_t *qs, int last)
{
    char *owned = own ? (char *)payload : NULL;
    if (c->state == CS_CLOSING) {
        free(head);
        free(owned);
        return -1;
    }
    wreq_t *r = calloc(1, sizeof *r);
    if (!r || plen > PIECE_MAX * WREQ_PIECES) {
        free(r);
        free(head);
        free(owned);
        conn_close(c);
        return -1;
    }
    r->c = c;
    r->head = head;
    r->payload = owned;
    r->qs = qs;
    r->seq = c->seq;
    r->last = last;
    uv_buf_t bufs[3 + WREQ_PIECES];
    unsigned n = 0;
    if (head && hlen) bufs[n++] = uv_buf_init(head, (unsigned)hlen);
    if (payload && plen) {
        if (chunk) {
            int cl = snprintf(r->chunk, sizeof r->chunk, "%zx\r\n", plen);
            bufs[n++] = uv_buf_init(r->chunk, (unsigned)cl);
        }
        /* uv_buf_t lengths are unsigned int: a body past 4 GiB goes in pieces. */
        for (size_t off = 0; off < plen; off += PIECE_MAX) {
            size_t k = plen - off < PIECE_MAX ? plen - off : PIECE_MAX;
            bufs[n++] = uv_buf_init((char *)payload + off, (unsigned)k);
        }
        if (chunk) bufs[n++] = uv_buf_init((char *)"\r\n", 2);
    }
    for (unsigned i = 0; i < n; i++) r->bytes += bufs[i].len;
    if (n == 0) bufs[n++] = uv_buf_init((char *)"", 0);
    if (qs) qs->wq++;
    if (!c->wpending) c->last_progress = uv_now(&c->srv->loop);
    c->wpending += r->bytes;
    c->srv->queued_bytes += r->bytes;
    c->bytes += r->bytes;
    if (c->state == CS_DISPATCHED) conn_set_state(c, CS_RESPONDING);
    if (uv_write(&r->req, (uv_stream_t *)&c->tcp, bufs, n, on_write) != 0) {
        c->wpending -= r->bytes;
        c->srv->queued_bytes -= r->bytes;
        if (qs) qs->wq--;
        free(head);
        free(owned);
        free(r);
        conn_close(c);
        return -1;
    }
    if (c->state == CS_RESPONDING && n && r->bytes) conn_set_state(c, CS_RESPONDING);
    return 0;
}

static int origin_allowed(const server_t *s, const char *origin)
{
    if (!origin) return 0;
    for (size_t i = 0; i < s->cfg->n_cors; i++)
        if (!strcmp(s->cfg->cors_origins[i], "*") || !strcmp(s->cfg->cors_origins[i], origin))
            return 1;
    return 0;
}

/* Status line and headers.  content_length < 0 means a streamed body (or,
 * for HEAD, a length not known without computing the body). */
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
                    "X-Ivserve-Dropped-Names, Content-Length, Content-Encoding, WWW-Authenticate\r\n");
    }
    if (extra) iv_buf_puts(b, extra);
    if (c->dropped_hdr && status < 300) {
        /* JSON keeps the names unambiguous; control characters are escaped
         * by it; the setup bounded its length. */
        iv_buf_puts(b, "X-Ivserve-Dropped-Names: ");
        iv_buf_puts(b, c->dropped_hdr);
        iv_buf_puts(b, "\r\n");
    }
    iv_buf_puts(b, "\r\n");
}

/* Sends a complete answer, head (consumed) and body, in one uv_write, and
 * ends the request; a head that ran out of memory closes the connection
 * instead.  body_own: body is heap memory handed over; otherwise it must
 * outlive the write (static text, a dataset's document). */
static void send_resp(conn_t *c, iv_buf_t *head, const char *body, size_t len, int body_own)
{
    if (head->oom) {
        iv_buf_free(head);
        if (body_own) free((char *)body);
        conn_close(c);
        return;
    }
    size_t n;
    char *p = iv_buf_steal(head, &n);
    if (conn_write(c, p, n, body, len, body_own, 0, NULL, 1) == 0) req_done(c);
}

static void send_buf_done(conn_t *c, iv_buf_t *b)
{
    send_resp(c, b, NULL, 0, 0);
}

/* body must outlive the write (static text or a dataset's document). */
static void send_simple(conn_t *c, int status, const char *ctype, const char *body, size_t len,
                        const char *extra)
{
    iv_buf_t b;
    iv_buf_init(&b);
    resp_head(c, &b, status, ctype, (int64_t)len, extra);
    int head_only = c->req && c->req->method == HTTP_HEAD;
    c->status = status;
    send_resp(c, &b, head_only ? NULL : body, head_only ? 0 : len, 0);
}

/* The body is taken from body (left empty); its memory is written as is. */
static void send_owned(conn_t *c, int status, const char *ctype, iv_buf_t *body, const char *extra)
{
    if (body->oom) {
        iv_buf_free(body);
        conn_close(c);
        return;
    }
    iv_buf_t b;
    iv_buf_init(&b);
    resp_head(c, &b, status, ctype, (int64_t)body->len, extra);
    int head_only = c->req && c->req->method == HTTP_HEAD;
    c->status = status;
    size_t n;
    char *p = iv_buf_steal(body, &n);
    if (head_only) {
        free(p);
        p = NULL;
        n = 0;
    }
    send_resp(c, &b, p, n, 1);
}

static void send_error(conn_t *c, int status, const char *code, const char *msg, const char *extra)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_enc_error(&b, code, msg);
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    if (status == 503 && !extra) extra = "Retry-After: 1\r\n";
    send_owned(c, status, "application/json", &b, extra);
}

static void send_iv_error(conn_t *c, int rc, const iv_err_t *e)
{
    int status = iv_error_status(rc);
    if (rc == IV_EUNSUPPORTED || rc == IV_EBAD_FILE || rc == IV_ECORRUPT || rc == IV_EIO)
        status = 500;
    const char *msg = e && e->msg[0] ? e->msg : iv_error_message(rc);
    if (status >= 500) {
        /* The log keeps the whole message; the client is not shown where
         * the server's files are. */
        char red[sizeof e->msg];
        iv_http_redact_paths(red, sizeof red, msg);
        send_error(c, status, iv_error_code(rc), red, NULL);
        snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
        return;
    }
    send_error(c, status, iv_error_code(rc), msg, NULL);
}

/* ---- request completion, access log ------------------------------------ */

/* One line for the answer; bytes is what was written (or, for a closing
 * connection's last answer, what the client acknowledged). */
static void access_log(conn_t *c, uint64_t bytes)
{
    const iv_config_t *cfg = c->srv->cfg;
    char client[48];
    iv_alog_client(client, sizeof client, c->peer, c->peer_ok ? c->peer_ip : NULL,
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

static void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total);

/* Forgets the answered request (after its log line). */
static void req_reset(conn_t *c)
{
    iv_http_req_free(c->req);
    free(c->req);
    c->req = NULL;
    c->log_pending = 0;
    c->dsid[0] = c->errmsg[0] = c->tokname[0] = '\0';
    c->cells = c->genes = -1;
    c->rows = c->nnz = 0;
    c->bytes = 0;
    c->chunked = 0;
    c->status = 0;
    c->t_end = 0;
}

/* Stops a stream's work: its jobs see the flag between phases and blocks. */
static void qs_cancel(qstream_t *qs)
{
    atomic_store_explicit(&qs->cancelled, 1, memory_order_relaxed);
    if (qs->q) iv_query_cancel(qs->q);
}

/* Starts answering: a new sequence number, the compute deadline. */
static void resp_begin(conn_t *c, iv_http_req_t *req)
{
    c->active = 1;
    c->seq++;
    c->req = req;
    c->t0 = uv_hrtime();
    c->bytes = 0;
    c->resp_ended = 0;
    c->expect_checked = 0;
    if (c->srv->draining) c->close_after = 1;
    conn_set_state(c, CS_DISPATCHED);
}

/* An answer that is not to a complete request (bad input, a timeout while
 * reading, a refused connection): the connection closes after it. */
static void resp_begin_error(conn_t *c)
{
    c->close_after = 1;
    resp_begin(c, NULL);
}

/* The answer's last bytes are queued: log, count, detach the stream.  The
 * connection moves on when that last write completes (resp_finished). */
static void req_done(conn_t *c)
{
    if (!c->active) return;
    server_t *s = c->srv;
    c->active = 0;
    /* An admin reload answered otherwise (a timeout, the client left):
     * the reload goes on, and its summary is only logged. */
    if (s->reload && s->reload->waiter == c) s->reload->waiter = NULL;
    c->resp_ended = 1;
    c->t_end = uv_hrtime();
    free(c->dropped);
    free(c->dropped_hdr);
    c->dropped = c->dropped_hdr = NULL;
    iv_metrics_request(&s->metrics, c->route, c->status, (double)(c->t_end - c->t0) / 1e9,
                       c->bytes);
    if (c->qs) {
        qstream_t *qs = c->qs;
        c->qs = NULL;
        qs->c = NULL;
        if (qs->budget_wait) {
            qs->budget_wait = 0;
            s->n_budget_wait--;
        }
        if (qs->inflight == 0 && qs->wq == 0) qs_free(qs);
        else qs_cancel(qs);
    }
    if (c->req && !c->req->keep_alive) c->close_after = 1;
    if (s->draining) c->close_after = 1;
    if (c->close_after && c->state != CS_CLOSING) {
        /* The log line of a connection's last answer waits for the close,
         * to say how many bytes the client really acknowledged. */
        c->log_pending = 1;
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

static size_t budget_used(const server_t *s)
{
    return s->queued_bytes - s->doomed_bytes;
}

/*
 * True when the bytes waiting to be written across every connection are
 * under the budget, so that a new large answer (or a stream's next block)
 * may start.  When they are not, the connections whose writes have
 * stalled longest (at least BUDGET_SLOW_MS) are cut first, one at a time,
 * until they are; c itself is spared.  An answer that starts under the
 * budget may take it past by its own size: one answer is never refused
 * for being large alone (the JSON and row limits bound it).
 */
static int budget_room(conn_t *c)
{
    server_t *s = c->srv;
    size_t limit = s->cfg->limits.write_budget_bytes;
    uint64_t now = uv_now(&s->loop);
    while (budget_used(s) >= limit) {
        conn_t *worst = NULL;
        for (conn_t *o = s->conns; o; o = o->next)
            if (o != c && o->wpending && o->state != CS_CLOSING &&
                now - o->last_progress >= BUDGET_SLOW_MS &&
                (!worst || o->last_progress < worst->last_progress))
                worst = o;
        if (!worst) return 0;
        snprintf(worst->errmsg, sizeof worst->errmsg,
                 "cut: the write budget of %zu bytes is spent and this client read nothing for "
                 "%" PRIu64 " ms",
                 limit, now - worst->last_progress);
        s->metrics.budget_cuts++;
        conn_close(worst);
    }
    return 1;
}

/* 0 when an answer of len bytes may go out now; otherwise a 503 was sent. */
static int budget_admit(conn_t *c, size_t len)
{
    if (len <= BUDGET_SMALL || budget_room(c)) return 0;
    c->srv->metrics.overloaded++;
    send_error(c, 503, "overloaded",
               "the server holds too many unsent answers for slow clients; retry later",
               "Retry-After: 1\r\n");
    return -1;
}

/* Some bytes were written or dropped: streams waiting for the budget go on. */
static void budget_wake(server_t *s)
{
    if (budget_used(s) >= s->cfg->limits.write_budget_bytes) return;
    /* A pump may end streams or cut connections (freeing their streams),
     * so the list is scanned again from its head after each one. */
    for (qstream_t *qs = s->streams; qs;) {
        if (qs->budget_wait != 1) {
            qs = qs->next_live;
            continue;
        }
        qs->budget_wait = 0;
        s->n_budget_wait--;
        if (qs->c) qs_pump(qs);
        if (!s->n_budget_wait || budget_used(s) >= s->cfg->limits.write_budget_bytes) return;
        qs = s->streams;
    }
}

/* ---- query streams ------------------------------------------------------ */

/* A stream without its query yet: the set-up job builds it. */
static qstream_t *qs_new(conn_t *c, sds_t *d, int kind)
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
    qs->c = c;
    qs->ds = d;
    iv_rds_ref(d);  /* a reload may drop d from the list: the stream keeps it */
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
    if (qs->budget_wait) s->n_budget_wait--;
    for (unsigned i = 0; i < qs->ahead; i++)
        if (qs->slots[i]) job_free(qs->slots[i]);
    free(qs->slots);
    iv_query_free(qs->q);
    if (qs->prev_live) qs->prev_live->next_live = qs->next_live;
    else s->streams = qs->next_live;
    if (qs->next_live) qs->next_live->prev_live = qs->prev_live;
    s->n_streams--;
    ds_unref(s, qs->ds);
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

/*
 * gzip for a query answer (binary, NDJSON, JSON): when Accept-Encoding
 * gives gzip a q above 0, or refuses identity without refusing gzip.  br
 * is not offered for these answers: brotli output of separate encoders
 * does not concatenate, and one encoder would compress a whole answer on
 * one thread (README-server.md, "Compression of query answers").
 */
static int stream_gzip_level(const server_t *s, const iv_http_req_t *r)
{
    const char *h = r->hdr[IV_H_ACCEPT_ENCODING];
    double qg = iv_http_coding_q(h, "gzip");
    if (s->cfg->gzip_level <= 0 || qg == 0) return 0;
    return qg > 0 || iv_http_coding_q(h, "identity") == 0 ? s->cfg->gzip_level : 0;
}

/* The headers of a query answer that vary with the coding. */
static const char *stream_extra(const qstream_t *qs)
{
    return qs->gz_level ? "Cache-Control: no-store\r\nVary: Accept-Encoding\r\nContent-Encoding: gzip\r\n"
                        : "Cache-Control: no-store\r\nVary: Accept-Encoding\r\n";
}

/* Turns a record the loop writes itself (the stream's header or trailer,
 * tens of bytes) into its piece of the gzip member: stored, not
 * compressed, so the loop never runs a compressor; the member's header
 * before the first, its end after the last. */
static void gz_wrap(qstream_t *qs, iv_buf_t *rec, int first, int last)
{
    iv_buf_t z;
    iv_buf_init(&z);
    uint32_t crc;
    if (first) iv_gz_header(&z);
    iv_gz_stored(&z, rec->data, rec->len, &crc);
    iv_gz_sum_add(&qs->gz_sum, crc, rec->len);
    if (last) iv_gz_finish(&z, &qs->gz_sum);
    if (rec->oom) z.oom = 1;
    iv_buf_free(rec);
    *rec = z;
}

static void stream_headers(conn_t *c, qstream_t *qs, iv_buf_t *b)
{
    resp_head(c, b, 200, iv_fmt_media_type(qs->fmt), -1, stream_extra(qs));
    c->status = 200;
    iv_stream_hdr_t h = iv_stream_hdr_of(qs->q, qs->dense);
    iv_buf_t sh;
    iv_buf_init(&sh);
    iv_enc_header(&sh, qs->fmt, &h);
    if (qs->gz_level) gz_wrap(qs, &sh, 1, 0);
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
    if (qs->gz_level) gz_wrap(qs, &t, 0, 1);
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
    /* Past the write budget, a stream with blocks still unsent waits (its
     * unsent bytes are part of the overflow); budget_wake resumes it. */
    if (qs->next_submit < qs->n_blocks && !budget_room(c)) {
        if (!qs->budget_wait) {
            qs->budget_wait = 1;
            qs->srv->n_budget_wait++;
        }
    }
    /* The window is blocks_ahead, widened by the workers that have nothing
     * else to do: alone on the server, one response decodes on all of them
     * (3 blocks at a time made a 10,000-cell answer three times the
     * engine's time on 16 cores); under load each keeps blocks_ahead. */
    unsigned win = qs->base_ahead;
    if (qs->ahead > win && qs->next_submit < qs->n_blocks) {
        win += iv_pool_free_workers(qs->srv->pool);
        if (win > qs->ahead) win = qs->ahead;
    }
    while (!qs->budget_wait && qs->next_submit < qs->n_blocks &&
           (uint64_t)(qs->next_submit - qs->writes_done) < win) {
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
        if (qs->gz_level) iv_gz_sum_add(&qs->gz_sum, j->crc, j->raw_len);
        size_t plen;
        char *payload = iv_buf_steal(&j->out, &plen);
        job_free(j);
        qs->next_write++;
        if (conn_write(c, head, hlen, payload, plen, 1, c->chunked, qs, 0) != 0 || qs->c == NULL)
            return;
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
    if (j->cancelled || j->rc == IV_ECANCELLED) s->metrics.jobs_cancelled++;
    if (!qs->c || qs->done) {
        /* Detached (client gone) or already answered: drop the result. */
        job_free(j);
        if (!qs->c && qs->inflight == 0 && qs->wq == 0) qs_free(qs);
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
    if (c->state == CS_RESPONDING) conn_set_state(c, CS_RESPONDING);  /* progress */
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
        if (budget_admit(c, j->out.len) == 0) send_owned(c, 200, "application/json", &j->out, stream_extra(qs));
    } else {
        iv_buf_t body;
        iv_buf_init(&body);
        count_body(&body, c, qs->q, j->nnz, qs->have_total ? qs->total : j->total);
        send_owned(c, 200, "application/json", &body, NULL);
    }
    job_free(j);
}

/* ---- routes ------------------------------------------------------------- */

/* The body of a count answer; nnz and total from the pointer arrays and the
 * computed metadata columns, or from a decode when those do not suffice. */
static void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total)
{
    int64_t rows = iv_query_n_rows(q), cols = iv_query_n_cols(q), nb = iv_query_n_blocks(q);
    int64_t out_rows = rows;
    if (iv_query_by_var(q)) {
        /* Gene rows: the result's shape is still cells x genes. */
        rows = cols;
        cols = out_rows;
    }
    const char *cells = "n_cells", *genes = "n_genes";
    iv_buf_printf(b,
                  "{\"shape\":[%" PRId64 ",%" PRId64 "],\"%s\":%" PRId64 ",\"%s\":%" PRId64
                  ",\"nnz\":%" PRId64 ",\"total_counts\":%.17g,\"bytes\":{\"binary\":%" PRId64
                  "},\"blocks\":%" PRId64 ",\"exact\":true",
                  rows, cols, cells, rows, genes, cols, nnz, total,
                  iv_enc_binary_size(out_rows, nb, nnz, iv_query_index_size(q), iv_query_dtype(q)), nb);
    iv_buf_printf(b, ",\"orientation\":\"%s\"", iv_query_orient(q) == IV_IVCSR ? "cells" : "genes");
    if (c->qs && c->qs->ds) put_orientations(b, c->qs->ds->ds);
    if (c->dropped) {
        iv_buf_puts(b, ",\"dropped\":");
        iv_buf_puts(b, c->dropped);
    }
    iv_buf_puts(b, "}");
}

static sds_t *find_ds(server_t *s, const char *id, size_t n)
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

/* A refusal decided before any work: the answer to send. */
typedef struct rfail {
    int status;
    const char *code;
    char msg[200];
    const char *extra;
    iv_route_t route;
} rfail_t;

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
    iv_auth_verdict_t v = iv_auth_dataset(&s->auth, r->hdr[IV_H_AUTHORIZATION], d ? d->conf->id : NULL, &tok);
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
        if (d->state == DS_READY && d->doc) {
            /* The dataset document minus the column lists keeps this short. */
            put_summary(&b, d, 0);
            iv_buf_puts(&b, ",\"state\":\"ready\"");
        } else {
            iv_buf_puts(&b, "{\"id\":");
            iv_buf_json_str(&b, d->conf->id);
            iv_buf_puts(&b, ",\"title\":");
            iv_buf_json_str(&b, d->conf->title ? d->conf->title : d->conf->id);
            iv_buf_printf(&b, ",\"ready\":false,\"state\":\"%s\"",
                          d->state == DS_FAILED ? "failed" : "loading");
            if (d->state == DS_FAILED) {
                char msg[480];
                failed_msg(d, msg, sizeof msg);
                iv_buf_puts(&b, ",\"error\":");
                iv_buf_json_str(&b, msg);
            }
        }
        /* A reload's replacement: loading beside this one, or failed
         * while this one kept serving. */
        if (d->pending) iv_buf_puts(&b, ",\"reload\":\"loading\"");
        else if (d->reload_err[0]) {
            char red[sizeof d->reload_err];
            iv_http_redact_paths(red, sizeof red, d->reload_err);
            iv_buf_puts(&b, ",\"reload_error\":");
            iv_buf_json_str(&b, red);
        }
        iv_buf_puts(&b, "}");
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
        send_error(c, 503, "out_of_memory", "out of memory", NULL);
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

/* A dataset whose file was written in place can no longer read all of its
 * matrix: its queries are refused, all alike, until it is reloaded
 * (filecheck.h).  Answers under way finish from the chunks they find
 * cached, or end with the same error at the first chunk they would read. */
static int file_refused(conn_t *c, sds_t *d)
{
    char msg[480];
    if (iv_dataset_file_state(d->ds, msg, sizeof msg) != IV_FILE_CHANGED) return 0;
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    send_error(c, iv_error_status(IV_EFILE_CHANGED), iv_error_code(IV_EFILE_CHANGED), msg,
               "Retry-After: 10\r\n");
    return 1;
}

static void route_query(conn_t *c, sds_t *d, int count)
{
    iv_http_req_t *r = c->req;
    if (!method_ok(c, 1) || file_refused(c, d)) return;
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
    c->dropped_hdr = st->dropped_hdr;
    st->dropped = st->dropped_hdr = NULL;
    iv_query_t *q = qs->q = st->q;
    st->q = NULL;
    /* The access log's selection: cells x genes, whichever the rows are. */
    c->cells = iv_query_by_var(q) ? iv_query_n_cols(q) : iv_query_n_rows(q);
    c->genes = iv_query_by_var(q) ? iv_query_n_rows(q) : iv_query_n_cols(q);
    int count = qs->kind == J_COUNT, have_total = st->have_total;
    double total = st->total;
    iv_fmt_t fmt = st->fmt;
    int dense = st->dense;
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
    if (!count && dense && iv_query_n_rows(q) * iv_query_n_cols(q) > lim->max_nnz) {
        /* Dense gene rows hold every (gene, cell) value. */
        snprintf(msg, sizeof msg,
                 "dense gene rows would hold %" PRId64 " x %" PRId64 " values; the limit is %" PRId64,
                 iv_query_n_rows(q), iv_query_n_cols(q), lim->max_nnz);
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
        send_owned(c, 200, "application/json", &body, NULL);
        return;
    }
    if (!count) qs->gz_level = stream_gzip_level(s, c->req);
    if (!count && c->req->method == HTTP_HEAD) {
        iv_buf_t b;
        iv_buf_init(&b);
        /* The length of a JSON document is not known without building
         * it: the head says nothing rather than something false. */
        resp_head(c, &b, 200, iv_fmt_media_type(fmt), -1, stream_extra(qs));
        c->status = 200;
        send_buf_done(c, &b);
        return;
    }
    int kind = count ? J_COUNT : fmt == IV_FMT_JSON ? J_WHOLE : J_BLOCK;
    qs->fmt = fmt;
    qs->dense = dense;
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
    vr->private_cache = iv_auth_protected(&c->srv->auth, d->conf->id);
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
        /* The header is bounded as the query route's is. */
        if (st->vr->dropped && strlen(st->vr->dropped) <= DROPPED_HDR_MAX) {
            c->dropped_hdr = st->vr->dropped;
            st->vr->dropped = NULL;
        } else if (st->vr->dropped) {
            c->dropped_hdr = strdup("{\"truncated\":true}");
        }
        if (st->vr->status == 304)
            send_simple(c, 304, NULL, NULL, 0, st->vr->extra);
        else if (budget_admit(c, st->vr->out.len) == 0)
            send_owned(c, 200, st->vr->ctype, &st->vr->out, st->vr->extra);
    } else if (st->vr) {
        send_iv_error(c, j->rc, &j->err);
    } else if (j->rc == 0) {
        if (budget_admit(c, st->page.len) == 0)
            send_owned(c, 200, st->ctype, &st->page, "Cache-Control: no-cache\r\n");
    }
    else if (st->status == 404)
        send_error(c, 404, "not_found", j->err.msg, NULL);
    else
        send_iv_error(c, j->rc, &j->err);
    job_free(j);
}

static void route_metrics(conn_t *c)
{
    server_t *s = c->srv;
    if (!method_ok(c, 0) || scope_check(c, IV_SCOPE_METRICS)) return;
    iv_metrics_gauges_t g;
    memset(&g, 0, sizeof g);
    g.queue_depth = iv_pool_queued(s->pool);
    g.open_connections = s->n_conns;
    g.active_streams = s->n_streams;
    g.queued_write_bytes = s->queued_bytes;
    g.cache_budget = s->mb ? iv_membudget_bytes(s->mb) : 0;
    iv_mem_process(&g.process_rss, &g.process_anon);
    iv_metrics_ds_mem_t *mem = calloc(s->reg.n ? s->reg.n : 1, sizeof *mem);
    g.ds_mem = mem;
    for (size_t i = 0; i < s->reg.n; i++) {
        sds_t *d = s->reg.v[i];
        if (d->state == DS_READY) {
            g.datasets_ready++;
            if (mem) ds_memory(d, &mem[g.n_ds_mem++]);
            iv_cache_stats_t cs;
            iv_dataset_cache_stats(d->ds, &cs);
            iv_rds_matrices_cache(d, &cs);
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
    free(mem);
    send_owned(c, 200, "text/plain; version=0.0.4", &b, NULL);
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
    for (int failed = 1; failed >= 0; failed--) {
        int first = 1;
        for (size_t i = 0; i < s->reg.n && m.len < 400; i++) {
            const sds_t *d = s->reg.v[i];
            if (d->state != (failed ? DS_FAILED : DS_LOADING)) continue;
            iv_buf_printf(&m, "%s%s", first ? (failed ? "; failed: " : "; loading: ") : ", ",
                          d->conf->id);
            first = 0;
        }
    }
    iv_buf_append(&m, "", 1);
    send_error(c, 503, "not_ready", m.oom ? "datasets are not ready" : m.data, "Retry-After: 1\r\n");
    iv_buf_free(&m);
}

static void reload_start(server_t *s, const char *why, conn_t *waiter);

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
    reload_start(c->srv, "POST /v1/admin/reload", c);
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
        route_readyz(c);
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
    if (!strcmp(p, "/v1/admin/reload")) {
        c->route = IV_R_OTHER;
        route_admin_reload(c);
        return;
    }
    iv_static_resp_t sr;  /* the viewer: "/", "/index.html", "/viewer/..." (routes_static.c) */
    if (iv_static_route(p, r->method, r->hdr[IV_H_IF_NONE_MATCH], r->hdr[IV_H_ACCEPT_ENCODING], &sr)) {
        send_simple(c, sr.status, sr.ctype, sr.body, sr.len, sr.extra);
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
    if (r->method != HTTP_GET && r->method != HTTP_HEAD && r->method != HTTP_POST) {
        /* TRACE, CONNECT and the like exist nowhere on this server. */
        char msg[128];
        snprintf(msg, sizeof msg, "%s is not allowed here", method_name(r->method));
        send_error(c, 405, "method_not_allowed", msg, "Allow: GET, HEAD, POST, OPTIONS\r\n");
        return;
    }
    send_error(c, 404, "not_found", "no such path", NULL);
}

/*
 * The checks dispatch() makes before any work, made on the headers alone:
 * whether a request that expects "100 Continue" would be refused anyway
 * (unknown path or dataset, wrong method, missing or wrong token, dataset
 * still loading).  It follows dispatch's path rules; a route added there
 * belongs here too.  0: the request may go on; otherwise *f says the
 * answer.
 */
static int route_precheck(conn_t *c, const iv_http_req_t *r, rfail_t *f)
{
    server_t *s = c->srv;
    const char *p = r->path ? r->path : "";
    memset(f, 0, sizeof *f);
    f->route = IV_R_OTHER;
    int m = r->method, allow_post = 0;
    if (m == HTTP_OPTIONS) return 0;
    static const char pre[] = "/v1/datasets";
    const sds_t *d = NULL;
    if (!strcmp(p, "/v1/admin/reload")) {
        if (m != HTTP_POST) {
            f->status = 405;
            f->code = "method_not_allowed";
            snprintf(f->msg, sizeof f->msg, "%s is not allowed here", method_name(m));
            f->extra = "Allow: POST, OPTIONS\r\n";
            return -1;
        }
        const iv_auth_token_t *tok;
        return auth_refuse(iv_auth_scope(&s->auth, r->hdr[IV_H_AUTHORIZATION], IV_SCOPE_ADMIN, &tok), f);
    }
    if (!strcmp(p, "/healthz") || !strcmp(p, "/readyz") || !strcmp(p, "/metrics")) {
        f->route = !strcmp(p, "/healthz") ? IV_R_HEALTHZ : !strcmp(p, "/readyz") ? IV_R_READYZ
                                                                                  : IV_R_METRICS;
        const iv_auth_token_t *tok;
        if (f->route == IV_R_METRICS &&
            auth_refuse(iv_auth_scope(&s->auth, r->hdr[IV_H_AUTHORIZATION], IV_SCOPE_METRICS, &tok), f))
            return -1;
    } else if (!strncmp(p, pre, sizeof pre - 1)) {
        const char *rest = p + sizeof pre - 1;
        if (*rest == '\0' || !strcmp(rest, "/")) {
            f->route = IV_R_DATASETS;
            const iv_auth_token_t *tok;
            if (list_ok(s, r, f, &tok)) return -1;
        } else if (*rest == '/') {
            const char *id = rest + 1;
            const char *slash = strchr(id, '/');
            size_t idn = slash ? (size_t)(slash - id) : strlen(id);
            const char *sub = slash ? slash : "";
            int meta = (!strncmp(sub, "/obs", 4) || !strncmp(sub, "/var", 4)) &&
                       (sub[4] == '\0' || (sub[4] == '/' && sub[5] && !strchr(sub + 5, '/')));
            if (!*sub || meta) f->route = IV_R_DATASET;
            else if (!strcmp(sub, "/query")) f->route = IV_R_QUERY;
            else if (!strcmp(sub, "/count")) f->route = IV_R_COUNT;
            if (f->route != IV_R_OTHER && idn > 0) {
                d = find_ds(s, id, idn);
                if (token_ok(s, r, d, f, NULL)) return -1;
                if (!d) {
                    f->status = 404;
                    f->code = "not_found";
                    snprintf(f->msg, sizeof f->msg, "no dataset '%.*s'", (int)(idn > 128 ? 128 : idn), id);
                    return -1;
                }
                if (d->state == DS_FAILED) {
                    f->status = 503;
                    f->code = "dataset_failed";
                    snprintf(f->msg, sizeof f->msg, "dataset '%.*s' failed to load",
                             (int)(idn > 128 ? 128 : idn), id);
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
                allow_post = f->route == IV_R_QUERY || f->route == IV_R_COUNT;
            } else {
                f->route = IV_R_OTHER;
            }
        }
    }
    if (f->route == IV_R_OTHER) {
        f->status = 404;
        f->code = "not_found";
        snprintf(f->msg, sizeof f->msg, "no such path");
        return -1;
    }
    if (m == HTTP_GET || m == HTTP_HEAD || (allow_post && m == HTTP_POST)) return 0;
    f->status = 405;
    f->code = "method_not_allowed";
    snprintf(f->msg, sizeof f->msg, "%s is not allowed here", method_name(m));
    f->extra = allow_post ? "Allow: GET, HEAD, POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n";
    return -1;
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
    free(c->dropped);
    free(c->dropped_hdr);
    for (unsigned i = 0; i < c->n_ahead; i++) {
        iv_http_req_t *r = c->ahead[(c->ahead_first + i) % c->ahead_cap];
        iv_http_req_free(r);
        free(r);
    }
    free(c->ahead);
    free(c->rbuf);
    free(c);
    if (s->draining && s->n_conns == 0 && !s->stopped) {
        s->stopped = 1;
        iv_watch_stop(s->watch);
        s->watch = NULL;
        uv_close((uv_handle_t *)&s->async, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->sighup, NULL);
        uv_close((uv_handle_t *)&s->sigusr1, NULL);
        uv_close((uv_handle_t *)&s->grace, NULL);
    }
}

/* Bytes the kernel still holds for the client: unsent or unacknowledged.
 * Linux says (SIOCOUTQ); elsewhere 0, and closing relies on the client's
 * EOF or the drain time. */
static size_t sock_outq(conn_t *c)
{
#ifdef __linux__
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &n) == 0 && n > 0)
        return (size_t)n;
#else
    (void)c;
#endif
    return 0;
}

/*
 * A request arrived in part.  Clients that write the headers and the body
 * in two calls with Nagle on (Python's http.client does) hold the second
 * part until the first is acknowledged, and a delayed ACK makes that wait
 * tens of milliseconds: acknowledge now.  Linux only; a hint elsewhere.
 */
static void sock_quickack(conn_t *c)
{
#if defined(__linux__) && defined(TCP_QUICKACK)
    uv_os_fd_t fd;
    int one = 1;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
#else
    (void)c;
#endif
}

static void conn_close(conn_t *c)
{
    if (c->state == CS_CLOSING) return;
    server_t *s = c->srv;
    if (c->active) {
        /* The answer did not end: log it as cut short, and stop its work. */
        if (c->qs) qs_cancel(c->qs);
        if (!c->status) c->status = 499;
        if (c->qs) {
            c->rows = c->qs->rows;
            c->nnz = c->qs->nnz;
        }
        if (!c->errmsg[0])
            snprintf(c->errmsg, sizeof c->errmsg, "connection closed before the response ended");
        c->close_after = 1;
        req_done(c);
    }
    if (c->log_pending) {
        /* What the client really got: the answer less what never left
         * this process and what the kernel still holds unacknowledged. */
        size_t held = c->wpending + sock_outq(c);
        uint64_t got = c->bytes > held ? c->bytes - held : 0;
        if (got < c->bytes && !c->errmsg[0])
            snprintf(c->errmsg, sizeof c->errmsg,
                     "the client acknowledged %" PRIu64 " of %" PRIu64 " bytes before the close", got,
                     c->bytes);
        access_log(c, got);
        req_reset(c);
    }
    s->doomed_bytes += c->wpending;
    c->state = CS_CLOSING;
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
    uint64_t now = uv_now(&c->srv->loop);
    size_t outq = sock_outq(c);
    if (outq != c->outq_last) {
        c->outq_last = outq;
        c->outq_t = now;
    }
    int input_over = now - c->drain_t0 >= DRAIN_MS || c->drain_bytes >= DRAIN_MAX_BYTES;
    int input_done = c->peer_eof || input_over || now - c->drain_last_in >= DRAIN_QUIET_MS;
    if (outq == 0 && input_done) {
        conn_close(c);
        return;
    }
    if (outq > 0 && now - c->outq_t >= c->srv->cfg->limits.write_timeout_ms) {
        conn_close(c);
        return;
    }
    if (input_over && c->reading) {
        /* Enough dropped: stop reading, still wait for the acknowledgements. */
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_t *c = req->data;
    free(req);
    if (c->state == CS_CLOSING) return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    uint64_t now = uv_now(&c->srv->loop);
    c->drain_t0 = c->drain_last_in = c->outq_t = now;
    c->drain_bytes = 0;
    c->outq_last = (size_t)-1;
    c->rlen = 0;
    conn_set_state(c, CS_DRAINING);
    if (!c->reading && !c->peer_eof &&
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) == 0)
        c->reading = 1;
    drain_check(c);
}

/* Half-closes after the queued writes. */
static void conn_shutdown(conn_t *c)
{
    if (c->state == CS_CLOSING || c->shutting) return;
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
        c->srv->metrics.compute_timeouts++;
        send_error(c, 503, "compute_timeout",
                   "the computation took longer than limits.compute_timeout_ms; retry later or ask "
                   "for less",
                   "Retry-After: 1\r\n");
        return;
    case CS_RESPONDING:
        if (!c->wpending && c->active && c->qs && !c->qs->done) {
            /* A stream waited too long for its next block: its trailer says so. */
            iv_err_t e;
            iv_err_clear(&e);
            iv_fail(&e, IV_ECANCELLED, "a block took longer than limits.compute_timeout_ms");
            c->srv->metrics.compute_timeouts++;
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
    if (c->state == CS_CLOSING) return;
    if (c->state == CS_DRAINING) {
        c->rlen = 0;  /* dropped */
        if (n > 0) {
            c->drain_bytes += (size_t)n;
            c->drain_last_in = uv_now(&c->srv->loop);
        } else if (n == UV_EOF) {
            c->peer_eof = 1;
            uv_read_stop(st);
            c->reading = 0;
            drain_check(c);
        } else if (n < 0) {
            conn_close(c);
        }
        return;
    }
    if (n < 0) {
        /* EOF: a request being answered still gets its answer (the client
         * may have half-closed after sending it); otherwise the
         * conversation is over. */
        if (n == UV_EOF && c->active && c->state == CS_RESPONDING) {
            c->peer_eof = 1;
            c->close_after = 1;
            uv_read_stop(st);
            c->reading = 0;
            return;
        }
        /* EOF before any byte of the answer: the client left (as nginx
         * takes it, 499), and its work is cancelled (conn_close). */
        if (c->active && !c->errmsg[0])
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

/*
 * While an answer is in flight, the requests behind it are parsed into a
 * queue, within limits.max_pipeline requests and AHEAD_MAX_BYTES, so that
 * a client's pipelined requests leave the read buffer and a bad one is
 * found early (it is answered in its turn).  A request whose headers ask
 * for "100 Continue" waits: that is answered only when it is next.
 */
static void conn_parse_ahead(conn_t *c)
{
    while (c->rlen > 0 && !c->ahead_err && c->n_ahead < c->ahead_cap) {
        const iv_http_req_t *cur = iv_http_in_current(&c->in);
        size_t held = c->ahead_bytes + (cur ? cur->body.len : 0);
        if (held >= AHEAD_MAX_BYTES) break;
        if (cur && iv_http_in_headers_done(&c->in) && cur->hdr[IV_H_EXPECT]) break;
        size_t n = c->rlen < AHEAD_MAX_BYTES - held ? c->rlen : AHEAD_MAX_BYTES - held;
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
            c->ahead_err = 1;
        } else if (used == 0) {
            break;
        }
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
    if (c->state == CS_CLOSING || c->in_pump) return;
    c->in_pump = 1;
    if (is_reading_state(c)) {
        if (c->n_ahead) {
            iv_http_req_t *req = c->ahead[c->ahead_first];
            c->ahead_first = (c->ahead_first + 1) % c->ahead_cap;
            c->n_ahead--;
            c->ahead_bytes -= req_mem(req);
            resp_begin(c, req);
            dispatch(c);
        } else if (c->ahead_err) {
            c->ahead_err = 0;
            resp_begin_error(c);
            send_error(c, c->in.err_status, parse_error_code(c->in.err_status), c->in.err_msg, NULL);
        } else if (c->rlen > 0) {
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
                resp_begin_error(c);
                send_error(c, c->in.err_status, parse_error_code(c->in.err_status), c->in.err_msg,
                           NULL);
            }
        }
        if (is_reading_state(c)) {
            if (iv_http_in_headers_done(&c->in)) {
                conn_enter(c, CS_READ_BODY);
                if (!c->expect_checked) {
                    c->expect_checked = 1;
                    expect_check(c);
                }
            } else if (iv_http_in_active(&c->in)) {
                conn_enter(c, CS_READ_HEAD);
            }
            if (c->state == CS_READ_HEAD || c->state == CS_READ_BODY) sock_quickack(c);
        }
    }
    if ((c->state == CS_DISPATCHED || c->state == CS_RESPONDING) && !c->close_after)
        conn_parse_ahead(c);
    c->in_pump = 0;
    if (c->state == CS_CLOSING) return;
    int want = c->rlen < c->rcap && !c->peer_eof && !c->close_after && c->state != CS_DRAINING;
    if (want && !c->reading) {
        if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) == 0) c->reading = 1;
    } else if (!want && c->reading && c->state != CS_DRAINING) {
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
    c->ahead_cap = s->cfg->limits.max_pipeline ? s->cfg->limits.max_pipeline : 1;
    c->ahead = calloc(c->ahead_cap, sizeof *c->ahead);
    if (uv_tcp_init(&s->loop, &c->tcp) != 0) {
        free(c->ahead);
        free(c->rbuf);
        free(c);
        return;
    }
    c->tcp.data = c;
    c->handles_open = 1;
    if (uv_timer_init(&s->loop, &c->timer) != 0) {
        c->state = CS_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
        return;
    }
    c->timer.data = c;
    c->handles_open = 2;
    iv_http_in_init(&c->in, s->cfg->limits.header_bytes, s->cfg->limits.body_bytes);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    s->metrics.connections_total++;
    c->last_progress = uv_now(&s->loop);
    if (!c->rbuf || !c->ahead || uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    /* Answers go out as soon as they are written: with Nagle on, the last
     * small write of an answer waits for the client's delayed ACK. */
    uv_tcp_nodelay(&c->tcp, 1);
    c->peer_ok = iv_alog_peer(&c->tcp, c->peer, sizeof c->peer, c->peer_ip) == 0;
    c->cells = c->genes = -1;
    /* A new connection owes its first request within the header timeout,
     * not the keep-alive time. */
    conn_set_state(c, CS_READ_HEAD);
    if (s->n_conns > s->cfg->limits.max_connections || s->draining) {
        resp_begin_error(c);
        send_error(c, 503, "overloaded", "too many connections", "Retry-After: 1\r\n");
        return;
    }
    conn_pump(c);
}

/* ---- loop-side completions, signals ------------------------------------ */

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

static void reload_free(reload_t *op)
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
    if (b.oom) op->waiter = NULL;  /* send_error below */
    iv_alog_event(&s->log, op->failed.len ? "warn" : "info", "reload (%s) done: %.*s", op->why,
                  b.oom ? 2 : (int)(b.len > 900 ? 900 : b.len), b.oom ? "{}" : b.data);
    conn_t *c = op->waiter;
    op->waiter = NULL;
    if (c) send_owned(c, 200, "application/json", &b, "Cache-Control: no-store\r\n");
    iv_buf_free(&b);
    reload_free(op);
    if (s->reload_again && !s->draining) {
        s->reload_again = 0;
        reload_start(s, "asked for during the last one", NULL);
    }
}

/* One of the reload's loads came back (or the set-up ended). */
static void reload_step(server_t *s)
{
    if (s->reload && --s->reload->waiting == 0) reload_finish(s);
}

static void job_load(void *arg);

/* Loads d on a worker; gen, replace and reloaded as in job_t.  A full
 * queue fails the load at once (on_load_done reports it). */
static void load_submit(server_t *s, sds_t *d, uint64_t gen, int replace, int reloaded);

static void on_load_done(job_t *j)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    s->n_loading--;
    if (j->rc != 0) {
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "%s", j->err.msg);
        iv_alog_event(&s->log, "error", "dataset %s (%s) %s: %s", d->conf->id, d->conf->path,
                      j->replace ? "not reloaded, the one loaded before keeps serving" : "left out",
                      j->err.msg);
    } else if (!d->doc) {
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "out of memory");
        iv_alog_event(&s->log, "error", "dataset %s left out: out of memory", d->conf->id);
    } else {
        d->state = DS_READY;
        const iv_dataset_info_t *in = iv_dataset_info(d->ds);
        if (!d->meta)
            iv_alog_event(&s->log, "warn", "dataset %s: metadata not loaded, names selections disabled: %s",
                      d->conf->id, d->err);
        iv_alog_event(&s->log, "info",
                  "dataset %s %s: %" PRId64 " x %" PRId64 ", nnz %" PRId64 ", %s, %s, %.2f s",
                  d->conf->id, j->reloaded ? "reloaded" : "ready", in->n_rows, in->n_cols, in->nnz,
                  in->orient == IV_IVCSR ? "ivcsr" : "ivcsc", in->codec, j->secs);
    }
    if (j->replace && !d->retired) {
        /* A replacement: it takes its old entry's place when ready; when
         * it failed, the old one keeps serving and says why. */
        sds_t *old = NULL;
        size_t at = 0;
        for (size_t i = 0; i < s->reg.n && !old; i++)
            if (s->reg.v[i]->pending == d) old = s->reg.v[at = i];
        if (old) {
            old->pending = NULL;  /* its reference passes to the list, or is dropped */
            if (d->state == DS_READY) {
                s->reg.v[at] = d;
                ds_retire(s, old);
            } else {
                snprintf(old->reload_err, sizeof old->reload_err, "%s", d->err);
                d->retired = 1;
                iv_rds_unref(d);
            }
        } else {
            d->retired = 1;
        }
    }
    if (s->reload && j->gen == s->reload->gen) {
        reload_t *op = s->reload;
        if (d->state == DS_READY) {
            json_member(j->reloaded ? &op->reloaded : &op->added, d->conf->id);
        } else {
            if (op->failed.len) iv_buf_puts(&op->failed, ",");
            iv_buf_puts(&op->failed, "{\"id\":");
            iv_buf_json_str(&op->failed, d->conf->id);
            iv_buf_puts(&op->failed, ",\"error\":");
            iv_buf_json_str(&op->failed, d->err);
            iv_buf_puts(&op->failed, "}");
        }
    }
    if (s->n_loading == 0 && j->gen == 0) iv_alog_event(&s->log, "info", "all datasets loaded");
    const iv_ds_conf_t *dc = d->conf;
    int64_t tb = dc->transpose_bytes >= 0 ? dc->transpose_bytes : (int64_t)s->cfg->transpose_bytes;
    uint64_t gen = j->gen;
    if (d->state == DS_READY && !d->retired && !s->draining && (dc->companion || tb > 0)) {
        /* Cell queries are served meanwhile; the other orientation joins
         * when it is ready (see job_other).  The job keeps its reference. */
        j->kind = J_OTHER;
        j->rc = 0;
        iv_dataset_set_other_state(d->ds, IV_OTHER_BUILDING);
        if (iv_pool_try_submit(s->pool, job_other, j) == 0) j = NULL;
        else iv_dataset_set_other_state(d->ds, IV_OTHER_FAILED);
    }
    if (j) job_free(j);
    if (s->reload && gen == s->reload->gen) reload_step(s);
}

static void load_submit(server_t *s, sds_t *d, uint64_t gen, int replace, int reloaded)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        /* Nothing can report it but the entry itself. */
        d->state = DS_FAILED;
        snprintf(d->err, sizeof d->err, "out of memory");
        return;
    }
    j->srv = s;
    j->kind = J_LOAD;
    j->ds = d;
    iv_rds_ref(d);
    j->gen = gen;
    j->replace = replace;
    j->reloaded = reloaded;
    s->n_loading++;
    if (s->reload && gen == s->reload->gen) s->reload->waiting++;
    iv_alog_event(&s->log, "info", "loading dataset %s from %s", d->conf->id, d->conf->path);
    if (iv_pool_try_submit(s->pool, job_load, j) != 0) {
        j->rc = iv_fail(&j->err, IV_EOVERLOADED, "the worker queue is full; reload to retry");
        on_load_done(j);
    }
}

/* Refuses a reload: the log line, and the admin request's answer. */
static void reload_refuse(server_t *s, conn_t *waiter, int status, const char *code, const char *why,
                          const char *msg)
{
    iv_alog_event(&s->log, "error", "reload (%s) refused: %s; the %zu datasets served are kept", why,
                  msg, s->reg.n);
    if (waiter) send_error(waiter, status, code, msg, status == 409 ? "Retry-After: 1\r\n" : NULL);
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

static void reload_start(server_t *s, const char *why, conn_t *waiter)
{
    if (s->draining) {
        if (waiter) send_error(waiter, 503, "shutting_down", "the server is shutting down", NULL);
        return;
    }
    if (s->reload) {
        if (waiter) {
            send_error(waiter, 409, "reload_in_progress", "a reload is running; retry when it ends",
                       "Retry-After: 1\r\n");
            return;
        }
        s->reload_again = 1;
        iv_alog_event(&s->log, "info", "reload (%s): one is running; another follows it", why);
        return;
    }
    if (!s->reader) {
        reload_refuse(s, waiter, 409, "no_config_source", why,
                      "this server has no configuration source to read again");
        return;
    }
    iv_config_t nc;
    iv_config_init(&nc);
    iv_err_t err;
    iv_err_clear(&err);
    int rc = s->reader(s->reader_arg, &nc, &err);
    if (rc != 0) {
        reload_refuse(s, waiter, 422, "bad_config", why, err.msg[0] ? err.msg : "bad configuration");
        iv_config_free(&nc);
        return;
    }
    /* Everything that can fail is allocated before anything changes. */
    size_t n = nc.n_datasets;
    reload_t *op = calloc(1, sizeof *op);
    sds_t **nv = calloc(n ? n : 1, sizeof *nv);
    struct plan {
        sds_t *fresh;     /* a new entry to load, or NULL: the served one is kept */
        int replace;      /* it waits beside a ready entry */
        int reloaded;     /* the id was served before */
    } *pl = calloc(n ? n : 1, sizeof *pl);
    /* The tokens as the new configuration has them (its tokens file, its
     * datasets' tokens), swapped in with the new list. */
    iv_auth_t na;
    memset(&na, 0, sizeof na);
    int ok = op && nv && pl && iv_auth_build(&na, &nc) == 0;
    for (size_t i = 0; ok && i < n; i++) {
        const iv_ds_conf_t *dc = &nc.datasets[i];
        sds_t *cur = find_ds(s, dc->id, strlen(dc->id));
        iv_path_id_t fid, cfid;
        iv_path_id_read(dc->path, &fid);
        memset(&cfid, 0, sizeof cfid);
        if (dc->companion) iv_path_id_read(dc->companion, &cfid);
        if (cur) {
            /* A failed dataset is tried again whatever changed. */
            const sds_t *latest = cur->pending ? cur->pending : cur;
            if (latest->state != DS_FAILED && iv_ds_conf_equal(latest->conf, dc) &&
                iv_path_id_same(&latest->fid, &fid) && iv_path_id_same(&latest->cfid, &cfid)) {
                nv[i] = cur;
                continue;
            }
        }
        if (!(pl[i].fresh = iv_rds_new(dc))) {
            ok = 0;
            break;
        }
        pl[i].fresh->fid = fid;
        pl[i].fresh->cfid = cfid;
        pl[i].replace = cur && cur->state == DS_READY;
        pl[i].reloaded = cur != NULL;
    }
    if (!ok) {
        for (size_t i = 0; pl && i < n; i++)
            if (pl[i].fresh) iv_rds_unref(pl[i].fresh);
        free(pl);
        free(nv);
        free(op);
        iv_auth_free(&na);
        reload_refuse(s, waiter, 503, "out_of_memory", why, "out of memory");
        iv_config_free(&nc);
        return;
    }
    op->gen = ++s->reload_gen;
    op->waiting = 1;
    op->waiter = waiter;
    op->t0 = now_s();
    snprintf(op->why, sizeof op->why, "%s", why);
    iv_buf_init(&op->added);
    iv_buf_init(&op->removed);
    iv_buf_init(&op->reloaded);
    iv_buf_init(&op->failed);
    s->reload = op;
    s->readyz_any = nc.readyz_any;
    iv_auth_free(&s->auth);
    s->auth = na;
    iv_alog_event(&s->log, "info", "reload (%s): %zu datasets configured", why, n);
    note_restart_keys(s, &nc);
    for (size_t i = 0; i < n; i++) {
        if (!pl[i].fresh) {
            op->unchanged++;
            continue;
        }
        if (!pl[i].replace) {
            nv[i] = pl[i].fresh;
            continue;
        }
        sds_t *cur = find_ds(s, nc.datasets[i].id, strlen(nc.datasets[i].id));
        if (cur->pending) {
            /* A replacement still loading is superseded: its load comes
             * back to nothing. */
            cur->pending->retired = 1;
            iv_rds_unref(cur->pending);
        }
        cur->pending = pl[i].fresh;  /* the entry holds the new one's reference */
        nv[i] = cur;
    }
    /* The new list in place; what left it is retired (freed when its last
     * request ends). */
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
    for (size_t i = 0; i < n; i++)
        if (pl[i].fresh) load_submit(s, pl[i].fresh, op->gen, pl[i].replace, pl[i].reloaded);
    free(pl);
    iv_config_free(&nc);
    reload_step(s);
}

void iv_server_request_reload(struct server *s, const char *why)
{
    reload_start(s, why, NULL);
}

void iv_server_request_reload_async(struct server *s)
{
    atomic_store(&s->reload_asked, 1);
    uv_async_send(&s->async);
}

void iv_server_mark_failed(struct server *s, struct iv_rds *d, const char *why)
{
    if (d->state != DS_READY) return;
    d->state = DS_FAILED;
    snprintf(d->err, sizeof d->err, "%s", why);
    iv_alog_event(&s->log, "error", "dataset %s (%s) failed: %s", d->conf->id, d->conf->path, why);
}

static void on_other_done(job_t *j)
{
    server_t *s = j->srv;
    sds_t *d = j->ds;
    iv_orient_status_t st;
    iv_dataset_orientations(d->ds, &st);
    const char *other = st.file_orient == IV_IVCSR ? "gene-major" : "cell-major";
    if (j->rc == 0)
        iv_alog_event(&s->log, "info", "dataset %s: %s orientation ready (%s, %zu bytes, %.2f s)",
                  d->conf->id, other, st.other_source == IV_SRC_FILE ? "companion" : "in memory",
                  st.bytes[!st.file_orient], j->secs);
    else
        iv_alog_event(&s->log, j->rc == IV_ETOO_LARGE ? "warn" : "error", "dataset %s: %s orientation %s: %s",
                  d->conf->id, other, j->rc == IV_ETOO_LARGE ? "skipped" : "failed", j->err.msg);
    if (!j->out.oom && j->out.len) {
        free(d->doc);
        snprintf(d->etag, sizeof d->etag, "\"%016" PRIx64 "\"", fnv1a(j->out.data, j->out.len));
        d->doc = iv_buf_steal(&j->out, &d->doc_len);
    }
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
    if (atomic_exchange(&s->reload_asked, 0)) reload_start(s, "asked for by a worker", NULL);
    job_t *j = take_done(s);
    while (j) {
        job_t *n = j->next;
        if (j->kind == J_LOAD) on_load_done(j);
        else if (j->kind == J_OTHER) on_other_done(j);
        else on_qs_job(j);
        j = n;
    }
}

static void on_grace(uv_timer_t *t)
{
    server_t *s = t->data;
    iv_alog_event(&s->log, "warn", "shutdown grace period over; closing %zu connections", s->n_conns);
    while (s->conns) conn_close(s->conns);
}

/*
 * SIGHUP: what logrotate and `systemctl reload` send.  The access log file
 * is opened again (a rotated file's new lines go to the new one) and the
 * settings are read again (see reload_start).  SIGUSR1 is only logged: a
 * stray one must not kill a server that many people use.
 */
static void on_hup(uv_signal_t *sig, int signum)
{
    server_t *s = sig->data;
    if (signum == SIGHUP) {
        if (iv_alog_reopen(&s->log, s->cfg->access_log) != 0)
            iv_alog_event(&s->log, "error", "SIGHUP: cannot open the access log %s again; "
                          "still writing to the one open", s->cfg->access_log);
        reload_start(s, "SIGHUP", NULL);
        return;
    }
    iv_alog_event(&s->log, "info", "signal %d ignored (SIGHUP reloads, SIGTERM stops)", signum);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    server_t *s = sig->data;
    if (s->draining) return;
    s->draining = 1;
    iv_alog_event(&s->log, "info", "signal %d: no new connections; finishing %zu open ones", signum, s->n_conns);
    uv_close((uv_handle_t *)&s->listener, NULL);
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (is_reading_state(c)) conn_close(c);
        else c->close_after = 1;
    }
    /* Work for clients that already left is not waited for. */
    for (qstream_t *qs = s->streams; qs; qs = qs->next_live)
        if (!qs->c) qs_cancel(qs);
    if (s->n_conns == 0) {
        s->stopped = 1;
        iv_watch_stop(s->watch);
        s->watch = NULL;
        uv_close((uv_handle_t *)&s->async, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->sighup, NULL);
        uv_close((uv_handle_t *)&s->sigusr1, NULL);
        uv_close((uv_handle_t *)&s->grace, NULL);
        return;
    }
    uv_timer_start(&s->grace, on_grace, s->cfg->limits.shutdown_grace_ms, 0);
}

/* ---- the served files' watcher (watch.h) -------------------------------- */

/* Slot i: dataset i / 2's own file (even) or its companion's (odd). */
static int watch_list(void *ctx, size_t i, iv_file_t **f, void **key)
{
    server_t *s = ctx;
    if (i / 2 >= s->reg.n) return 0;
    sds_t *d = s->reg.v[i / 2];
    *key = d;
    *f = NULL;
    if (d->state != DS_READY || !d->ds) return 1;
    if (i % 2 == 0) {
        *f = iv_dataset_file(d->ds);
    } else {
        iv_orient_status_t st;
        iv_dataset_orientations(d->ds, &st);
        iv_dataset_t *o = iv_dataset_other(d->ds);
        if (o && st.other_source == IV_SRC_FILE) *f = iv_dataset_file(o);
    }
    return 1;
}

/* A served file moved state: one log line, and the document says so. */
static void on_file_change(void *ctx, void *key, iv_file_t *f, iv_file_state_t st, const char *msg)
{
    server_t *s = ctx;
    sds_t *d = key;
    (void)f;
    iv_alog_event(&s->log, st == IV_FILE_CHANGED ? "error" : st == IV_FILE_OK ? "info" : "warn",
                  "dataset %s: file %s: %s", d->conf->id, iv_file_state_name(st), msg);
    char *old = d->doc;
    size_t old_len = d->doc_len;
    char old_etag[sizeof d->etag];
    memcpy(old_etag, d->etag, sizeof old_etag);
    d->doc = NULL;
    build_doc(d);
    if (d->doc) {
        free(old);
    } else {
        /* Out of memory: the old document stays. */
        d->doc = old;
        d->doc_len = old_len;
        memcpy(d->etag, old_etag, sizeof old_etag);
    }
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
    if ((rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len)) != 0) {
        fprintf(stderr, "ivserve: cannot read the listening address: %s\n", uv_strerror(rc));
        return -1;
    }
    int port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                               : ((struct sockaddr_in *)&got)->sin_port);
    iv_alog_event(&s->log, "info", "ivserve %s listening on %s:%d with %u workers", iv_version(), cfg->listen,
              port, iv_pool_threads(s->pool));
    return 0;
}

/* The cache budget all datasets share: cache_bytes, or a share of the
 * memory available now (before any dataset loads). */
static int start_cache_budget(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    size_t bytes = cfg->cache_bytes;
    const char *src = "cache_bytes";
    uint64_t avail = 0;
    if (bytes == IV_CACHE_AUTO)
        bytes = iv_membudget_default(cfg->cache_share_percent, (size_t)1 << 30, &src, &avail);
    s->mb = iv_membudget_new(bytes);
    if (!s->mb) {
        fprintf(stderr, "ivserve: out of memory\n");
        return -1;
    }
    if (cfg->cache_bytes == IV_CACHE_AUTO)
        iv_alog_event(&s->log, "info", "cache budget %zu bytes: %u%% of %" PRIu64 " bytes available (%s)",
                      bytes, cfg->cache_share_percent, avail, src);
    else
        iv_alog_event(&s->log, "info", "cache budget %zu bytes (cache_bytes)", bytes);
    uint64_t floors = 0;
    for (size_t i = 0; i < cfg->n_datasets; i++) floors += (uint64_t)cfg->datasets[i].cache_floor_bytes;
    if (floors > bytes)
        iv_alog_event(&s->log, "warn", "the datasets' cache floors add up to %" PRIu64 " bytes, over the "
                      "cache budget of %zu: the caches may hold up to the floors", floors, bytes);
    return 0;
}

/* Frees what the workers handed back after the loop stopped. */
static void drain_after_stop(server_t *s)
{
    job_t *j = take_done(s);
    while (j) {
        job_t *n = j->next;
        if (j->kind == J_LOAD || j->kind == J_OTHER) {
            if (j->kind == J_LOAD) s->n_loading--;
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
    return iv_server_run_with(cfg, NULL, NULL);
}

int iv_server_run_with(const iv_config_t *cfg, iv_config_reader_fn reader, void *reader_arg)
{
    server_t *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = cfg;
    s->reader = reader;
    s->reader_arg = reader_arg;
    s->readyz_any = cfg->readyz_any;
    atomic_init(&s->reload_asked, 0);
    iv_metrics_init(&s->metrics);
    if (iv_alog_open(&s->log, cfg->access_log, cfg->log_format) != 0) {
        free(s);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    iv_h5filters_register();
    int exit_code = 1;
    s->pool = iv_pool_create(cfg->threads, cfg->queue);
    if (!s->pool) {
        fprintf(stderr, "ivserve: cannot start the worker pool\n");
        goto fail_pool;
    }
    iv_budget_init(&s->transpose_left, cfg->transpose_bytes);
    if (start_cache_budget(s) != 0) goto fail_mem;
    s->reg.v = calloc(cfg->n_datasets ? cfg->n_datasets : 1, sizeof *s->reg.v);
    int ok = s->reg.v && iv_auth_build(&s->auth, cfg) == 0;
    for (size_t i = 0; ok && i < cfg->n_datasets; i++) {
        ok = (s->reg.v[i] = iv_rds_new(&cfg->datasets[i])) != NULL;
        if (ok) {
            s->reg.n++;
            iv_path_id_read(cfg->datasets[i].path, &s->reg.v[i]->fid);
            if (cfg->datasets[i].companion)
                iv_path_id_read(cfg->datasets[i].companion, &s->reg.v[i]->cfid);
        }
    }
    if (ok) {
        /* What is open, said once: an empty tokens file or a forgotten
         * scope would otherwise leave datasets open without a word. */
        size_t n_prot = 0;
        for (size_t i = 0; i < cfg->n_datasets; i++) n_prot += (size_t)iv_auth_protected(&s->auth, cfg->datasets[i].id);
        iv_alog_event(&s->log, "info",
                      "auth: %zu tokens; %zu of %zu datasets need one, the others are public; /metrics %s",
                      s->auth.n, n_prot, cfg->n_datasets, cfg->metrics_auth ? "needs a metrics or admin token" : "is open");
        if (cfg->tokens_file && cfg->n_token_entries == 0)
            iv_alog_event(&s->log, "warn", "auth: the tokens file %s holds no tokens", cfg->tokens_file);
    }
    if (!ok) {
        fprintf(stderr, "ivserve: out of memory\n");
        goto fail_mem;
    }
    /* Datasets load on several workers at once: that needs an HDF5 built
     * thread-safe.  Without it the loads take turns (the queries make no
     * HDF5 calls). */
    hbool_t h5ts = 0;
    if (H5is_library_threadsafe(&h5ts) < 0) h5ts = 0;
    s->h5_serial = !h5ts;
    if (pthread_mutex_init(&s->h5_mu, NULL) != 0 || pthread_mutex_init(&s->done_mu, NULL) != 0) {
        fprintf(stderr, "ivserve: cannot create a mutex\n");
        goto fail_mem;
    }
    int rc;
    if ((rc = uv_loop_init(&s->loop)) != 0) {
        fprintf(stderr, "ivserve: cannot start the event loop: %s\n", uv_strerror(rc));
        goto fail_mutex;
    }
    /* Each handle is closed on failure by fail_loop, which closes the ones
     * that were initialised (a zeroed handle has no loop). */
    if ((rc = uv_async_init(&s->loop, &s->async, on_async)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sigterm)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sigint)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sighup)) != 0 ||
        (rc = uv_signal_init(&s->loop, &s->sigusr1)) != 0 ||
        (rc = uv_timer_init(&s->loop, &s->grace)) != 0 ||
        (rc = uv_tcp_init(&s->loop, &s->listener)) != 0) {
        fprintf(stderr, "ivserve: cannot set up the event loop: %s\n", uv_strerror(rc));
        goto fail_loop;
    }
    s->async.data = s;
    s->sigterm.data = s->sigint.data = s->sighup.data = s->sigusr1.data = s;
    s->grace.data = s;
    s->listener.data = s;
    if ((rc = uv_signal_start(&s->sigterm, on_signal, SIGTERM)) != 0 ||
        (rc = uv_signal_start(&s->sigint, on_signal, SIGINT)) != 0 ||
        (rc = uv_signal_start(&s->sighup, on_hup, SIGHUP)) != 0 ||
        (rc = uv_signal_start(&s->sigusr1, on_hup, SIGUSR1)) != 0) {
        fprintf(stderr, "ivserve: cannot handle SIGTERM/SIGINT/SIGHUP/SIGUSR1: %s\n", uv_strerror(rc));
        goto fail_loop;
    }
    if (s->h5_serial)
        iv_alog_event(&s->log, "warn", "the HDF5 library is not thread-safe: datasets load one at a time");

    if (bind_listener(s) != 0) goto fail_loop;
    for (size_t i = 0; i < s->reg.n; i++) load_submit(s, s->reg.v[i], 0, 0, 0);
    if ((rc = iv_watch_start(&s->loop, IV_WATCH_DEFAULT_MS, watch_list, on_file_change, s,
                             &s->watch)) != 0)
        iv_alog_event(&s->log, "warn", "files replaced under the server will not be noticed: %s",
                      uv_strerror(rc));
    uv_run(&s->loop, UV_RUN_DEFAULT);
    exit_code = 0;
    iv_alog_event(&s->log, "info", "stopped");
    goto cleanup;

fail_loop:
    /* Start-up failed: close every handle that was set up and run the loop
     * until they are gone. */
    s->draining = 1;
    {
        uv_handle_t *hs[] = {(uv_handle_t *)&s->listener, (uv_handle_t *)&s->async,
                             (uv_handle_t *)&s->sigterm, (uv_handle_t *)&s->sigint,
                             (uv_handle_t *)&s->sighup, (uv_handle_t *)&s->sigusr1,
                             (uv_handle_t *)&s->grace};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
            if (hs[i]->loop == &s->loop && !uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    }
    uv_run(&s->loop, UV_RUN_DEFAULT);
cleanup:
    iv_pool_destroy(s->pool);
    s->pool = NULL;
    drain_after_stop(s);
    if (s->reload) {
        /* Stopped during a reload: its waiter's connection is gone. */
        reload_free(s->reload);
        s->reload = NULL;
    }
    uv_loop_close(&s->loop);
fail_mutex:
    pthread_mutex_destroy(&s->done_mu);
    pthread_mutex_destroy(&s->h5_mu);
fail_mem:
    iv_pool_destroy(s->pool);
    iv_registry_free(&s->reg);
    /* After every dataset closed (each stream leaves the budget). */
    iv_membudget_free(s->mb);
    iv_auth_free(&s->auth);
fail_pool:
    iv_alog_close(&s->log);
    free(s);
    return exit_code;
}
