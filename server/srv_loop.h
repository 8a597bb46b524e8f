/*
 * The server and its event loops (server.c): struct server, struct loop,
 * counting in a loop's metrics, the loops' lock (loop_enter), running a
 * function or a job's done half on a loop (loop_call, loop_post), and a
 * server built without listening (server_open, for the unit tests).
 * Which thread owns what is said at each struct.
 */
#ifndef IV_SRV_LOOP_H
#define IV_SRV_LOOP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "access_log.h"
#include "auth.h"
#include "membudget.h"
#include "metrics.h"
#include "pool.h"
#include "registry.h"
#include "server.h"
#include "srv_common.h"
#include "transpose.h"
#include "watch.h"

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
    /* The arrival number (server->reserve_seq) of its oldest such stream,
     * UINT64_MAX when none: the loops read each other's, so that memory
     * goes to the oldest waiter of the whole server (answer_wait.c). */
    atomic_uint_fast64_t reserve_oldest;
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
    atomic_uint_fast64_t reserve_seq;  /* arrival numbers of answers waiting for memory */
    iv_alog_t log;
    iv_watch_t *watch;            /* the served files' watcher (watch.h), or NULL */
};

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

#endif
