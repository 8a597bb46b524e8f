/*
 * The server's private headers hold the types server/'s files share and
 * the functions that one of them calls in another, one concern a header,
 * so that a file includes only what it uses.  Only server/ (and its unit
 * tests) include them; server.h is the public face.  This one holds what
 * the others share: the names of the server's types (each defined in the
 * header of its concern), a dataset as the routes see it, and two small
 * helpers (any thread).
 *
 * The private headers:
 *   srv_common.h    this one
 *   srv_loop.h      the server and its event loops (struct server,
 *                   struct loop, their metrics and locks, loop_call and
 *                   loop_post, server_open and server_free)
 *   srv_conn.h      connections: struct conn, its states, the conn_*
 *                   functions the transports and the server call
 *   srv_ostream.h   the output chain of an answer: head, coding of the
 *                   loop's records, chunk framing, the writes (os_*)
 *   srv_respond.h   answers and writes: send_*, conn_writev, the end of
 *                   a request, the write budget
 *   srv_jobs.h      jobs: job_t, job_type_t, a query's set-up inputs
 *                   (setup_t), job_submit, job_cancelled
 *   srv_qstream.h   query streams: qstream_t, the answers' memory
 *                   (answer_wait.c), qs_*, and the jobs that feed a
 *                   stream (stream_jobs.c, setup_job.c)
 *   srv_datasets.h  datasets: loads, documents, memory, reloads
 *   srv_routes.h    routes: dispatch, the route_* entry points, rfail_t
 *
 * The files, one concern each:
 *   server.c        start and stop, the event loops and the hand-off of
 *                   connections to them, signals, the loops' side of the
 *                   worker hand-off, the served files' watcher
 *   conn.c          connection input and the connection state machine
 *   transport_tcp.c the connections' TCP sockets (transport.h)
 *   ostream.c       the output chain: every answer's head, coding of the
 *                   records the loop makes, framing, and writes
 *   respond.c       writes, whole answers, the end of an answer and its
 *                   access-log line, the write budget
 *   qstream.c       query streams: the blocks-ahead window, blocks put
 *                   in order into the output chain, the trailer
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
#ifndef IV_SRV_COMMON_H
#define IV_SRV_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "registry.h"

typedef struct server server_t;       /* srv_loop.h */
typedef struct loop loop_t;           /* srv_loop.h */
typedef struct conn conn_t;           /* srv_conn.h */
typedef struct qstream qstream_t;     /* srv_qstream.h */
typedef struct job job_t;             /* srv_jobs.h */
typedef struct job_type job_type_t;   /* srv_jobs.h */
typedef struct setup setup_t;         /* srv_jobs.h */

/* A dataset as the routes see it: a registry entry (registry.h), held by
 * reference by each stream and load job that uses it. */
typedef iv_rds_t sds_t;
#define DS_LOADING IV_RDS_LOADING
#define DS_READY IV_RDS_READY
#define DS_FAILED IV_RDS_FAILED

/* ---- small helpers ------------------------------------------------------ */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

#endif
