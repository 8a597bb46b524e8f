/*
 * The query server (see server.h): start and stop, signals, the loop's
 * side of the worker hand-off, and the served files' watcher.
 *
 * Design.  Event loops own the sockets, timers and connections; they
 * parse HTTP, route requests and write bytes, and nothing else.  With one
 * loop it does all of that; with several (config "loops"), loop 0 is a
 * control loop that accepts and hands each connection to a connection
 * loop in turn, and keeps the server's own work (loads, reloads, signals,
 * the file watcher) to itself (see struct loop and loop_enter in
 * srv_loop.h for what they share and how).  All work that grows with a
 * request or touches a file or a decoder (dataset loading, a query's
 * set-up from its JSON body, names and filters, query prepare, block
 * decode and encoding, metadata pages) runs as jobs on the worker pool.
 * A worker finishes a job by pushing it on its loop's locked list and
 * calling uv_async_send(); the loop drains the whole list in one swap, so
 * coalesced wake-ups lose nothing.
 *
 * Each of the server's other concerns has a file of its own; the private
 * headers (srv_*.h, one a concern, listed in srv_common.h) hold what
 * they share.
 */
#include "server.h"
#include "srv_conn.h"
#include "srv_datasets.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include "autopack.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>

#include "codec.h"
#include "version.h"

/* ---- the shared lock ---------------------------------------------------- */

/*
 * With one loop there is nothing to lock.  With several, loop 0 is the
 * control loop: it accepts and hands connections out, loads datasets,
 * reloads, watches the files and takes signals, and serves no connection
 * itself.  Its callbacks hold the shared lock for writing, the other
 * loops' callbacks for reading; so a connection's loop sees the registry,
 * the datasets' states and documents and the tokens only between loop 0's
 * changes, and never needs a finer lock.  Loop 0's callbacks are rare and
 * short (a load or reload step, a file check).
 */
void loop_enter(loop_t *lp)
{
    server_t *s = lp->srv;
    if (s->n_loops == 1) return;
    if (lp->idx) pthread_rwlock_rdlock(&s->shared);
    else pthread_rwlock_wrlock(&s->shared);
}

void loop_leave(loop_t *lp)
{
    if (lp->srv->n_loops > 1) pthread_rwlock_unlock(&lp->srv->shared);
}

/* ---- loop-side completions, hand-offs, stopping ------------------------- */

static job_t *take_done(loop_t *lp)
{
    pthread_mutex_lock(&lp->done_mu);
    job_t *list = lp->done_head;
    lp->done_head = NULL;
    pthread_mutex_unlock(&lp->done_mu);
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

static void call_done(job_t *j)
{
    j->call(j->srv, j->arg);
    job_free(j);
}

static const job_type_t call_job = {NULL, call_done};

void loop_post(loop_t *lp, job_t *j)
{
    pthread_mutex_lock(&lp->done_mu);
    j->next = lp->done_head;
    lp->done_head = j;
    pthread_mutex_unlock(&lp->done_mu);
    uv_async_send(&lp->async);
}

int loop_call(loop_t *lp, server_t *s, void (*fn)(server_t *s, void *arg), void *arg)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j) return -1;
    j->srv = s;
    j->lp = lp;
    j->type = &call_job;
    j->call = fn;
    j->arg = arg;
    loop_post(lp, j);
    return 0;
}

/* Tells a connection loop to stop as at SIGTERM (loop_stop, on its thread). */
static void loop_ask_stop(loop_t *lp)
{
    atomic_store(&lp->stop_asked, 1);
    uv_async_send(&lp->async);
}

static void loop_close_handles(loop_t *lp)
{
    server_t *s = lp->srv;
    uv_close((uv_handle_t *)&lp->async, NULL);
    uv_close((uv_handle_t *)&lp->grace, NULL);
    if (lp->budget.loop) uv_close((uv_handle_t *)&lp->budget, NULL);
    uv_close((uv_handle_t *)&lp->reserve, NULL);
    if (lp->idx) return;
    /* Loop 0 also holds the signals and the file watcher. */
    iv_watch_stop(s->watch);
    s->watch = NULL;
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sighup, NULL);
    uv_close((uv_handle_t *)&s->sigusr1, NULL);
    uv_close((uv_handle_t *)&s->accept_pause, NULL);
}

/* A stopping loop whose last connection is gone closes its handles, so
 * that its uv_run ends. */
void loop_stopped_check(loop_t *lp)
{
    if (lp->draining && lp->n_conns == 0 && !lp->stopped) {
        lp->stopped = 1;
        loop_close_handles(lp);
    }
}

static void on_grace(uv_timer_t *t)
{
    loop_t *lp = t->data;
    loop_enter(lp);
    iv_alog_event(&lp->srv->log, "warn", "shutdown grace period over; closing %zu connections",
                  (size_t)lp->n_conns);
    while (lp->conns) conn_close(lp->conns);
    loop_leave(lp);
}

/* SIGTERM reached this loop: connections waiting for a request close, the
 * others after their answer; the loop ends with its last connection or
 * the grace period. */
static void loop_stop(loop_t *lp)
{
    if (lp->draining) return;
    lp->draining = 1;
    for (conn_t *c = lp->conns, *n; c; c = n) {
        n = c->next;
        if (is_reading_state(c)) conn_close(c);
        else c->ans_f.close_after = 1;
    }
    /* Work for clients that already left is not waited for. */
    for (qstream_t *qs = lp->streams; qs; qs = qs->next_live)
        if (!qs->c) qs_cancel(qs);
    if (lp->n_conns == 0) {
        loop_stopped_check(lp);
        return;
    }
    uv_timer_start(&lp->grace, on_grace, lp->srv->cfg->limits.shutdown_grace_ms, 0);
}

static void on_async(uv_async_t *a)
{
    loop_t *lp = a->data;
    server_t *s = lp->srv;
    loop_enter(lp);
    if (lp->idx == 0 && atomic_exchange(&s->reload_asked, 0))
        reload_start(s, "asked for by a worker", NULL, 0);
    /* Connections handed over by loop 0. */
    for (;;) {
        pthread_mutex_lock(&lp->done_mu);
        int fd = lp->n_new_fds ? lp->new_fds[--lp->n_new_fds] : -1;
        pthread_mutex_unlock(&lp->done_mu);
        if (fd < 0) break;
        conn_adopt(lp, fd);
    }
    job_t *j = take_done(lp);
    while (j) {
        job_t *n = j->next;
        j->type->done(j);
        j = n;
    }
    if (lp->n_budget_wait) budget_wake(lp);
    if (lp->n_reserve_wait) reserve_wake(lp);
    if (atomic_load(&lp->stop_asked) && !lp->draining) loop_stop(lp);
    loop_leave(lp);
}

#define ACCEPT_PAUSE_MS 100

static void on_accept(uv_poll_t *p, int status, int events);

static void on_accept_resume(uv_timer_t *t)
{
    server_t *s = t->data;
    if (s->listen_fd >= 0 && !s->draining) uv_poll_start(&s->accept_poll, UV_READABLE, on_accept);
}

/* Hands fd to connection loop lp: queued on its locked list, and the loop
 * woken.  Closed when the list cannot grow. */
static void hand_fd(loop_t *lp, int fd)
{
    pthread_mutex_lock(&lp->done_mu);
    int ok = 1;
    if (lp->n_new_fds == lp->cap_new_fds) {
        size_t cap = lp->cap_new_fds ? 2 * lp->cap_new_fds : 16;
        int *v = realloc(lp->new_fds, cap * sizeof *v);
        if (v) {
            lp->new_fds = v;
            lp->cap_new_fds = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) lp->new_fds[lp->n_new_fds++] = fd;
    pthread_mutex_unlock(&lp->done_mu);
    if (!ok) close(fd);
    else uv_async_send(&lp->async);
}

/* Loop 0: a new connection on the listening socket, given to the loops in
 * turn. */
static void on_accept(uv_poll_t *p, int status, int events)
{
    server_t *s = p->data;
    (void)events;
    if (status < 0) return;
    for (int k = 0; k < 64; k++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: the waiting connection would wake
                 * this poll again at once.  Listen again in a while. */
                uv_poll_stop(&s->accept_poll);
                uv_timer_start(&s->accept_pause, on_accept_resume, ACCEPT_PAUSE_MS, 0);
                iv_alog_event(&s->log, "error", "cannot accept a connection: %s; pausing %d ms",
                              strerror(errno), ACCEPT_PAUSE_MS);
            }
            return;  /* EAGAIN, or a connection reset before it was taken */
        }
        loop_t *lp = s->n_loops == 1 ? &s->loops[0] : &s->loops[1 + s->next_loop++ % (s->n_loops - 1)];
        if (lp->idx == 0) conn_adopt(lp, fd);
        else hand_fd(lp, fd);
    }
}

static void on_accept_closed(uv_handle_t *h)
{
    server_t *s = h->data;
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
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
        loop_enter(&s->loops[0]);
        if (iv_alog_reopen(&s->log, s->cfg->access_log) != 0)
            iv_alog_event(&s->log, "error", "SIGHUP: cannot open the access log %s again; "
                          "still writing to the one open", s->cfg->access_log);
        reload_start(s, "SIGHUP", NULL, 0);
        loop_leave(&s->loops[0]);
        return;
    }
    iv_alog_event(&s->log, "info", "signal %d ignored (SIGHUP reloads, SIGTERM stops)", signum);
}

/* The signals the server handles (see iv_server_block_signals). */
static void handled_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
}

void iv_server_block_signals(void)
{
    sigset_t set;
    handled_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    server_t *s = sig->data;
    if (s->draining) return;
    loop_enter(&s->loops[0]);
    s->draining = 1;
    atomic_store(&s->stopping, 1);
    iv_alog_event(&s->log, "info", "signal %d: no new connections; finishing %zu open ones", signum,
                  (size_t)s->n_conns_all);
    if (s->listen_fd >= 0) uv_close((uv_handle_t *)&s->accept_poll, on_accept_closed);
    uv_timer_stop(&s->accept_pause);
    for (unsigned i = 1; i < s->n_loops; i++) loop_ask_stop(&s->loops[i]);
    loop_stop(&s->loops[0]);
    loop_leave(&s->loops[0]);
}

/* ---- the served files' watcher (watch.h) -------------------------------- */

/*
 * A dataset served from the packed copy of an ordinary file (autopack.h)
 * watches its source: once the source has a new identity, the same at two
 * ticks in a row (a copy still being written changes between them), a
 * reload is asked for, which packs the new file beside the served copy
 * and swaps them when it is ready.  Asked once for each new identity, so
 * a source that fails to pack is not packed again until it changes.
 */
static void source_look(server_t *s, sds_t *d)
{
    iv_path_id_t now;
    iv_path_id_read(d->conf->path, &now);
    if (!now.ok || iv_path_id_same(&now, &d->fid) || d->pending) return;
    if (iv_path_id_same(&now, &d->src_seen) && !iv_path_id_same(&now, &d->src_asked)) {
        d->src_asked = now;
        iv_alog_event(&s->log, "info", "dataset %s: its source %s changed; packing it again",
                      d->conf->id, d->conf->path);
        iv_server_request_reload_async(s);
    }
    d->src_seen = now;
}

static void rebuild_doc(server_t *s, sds_t *d);

/* A kept Zarr file (api/zarr_kept.h) that a request dropped after a
 * failed check: one log line, and the document no longer lists it. */
static void zarr_look(server_t *s, sds_t *d)
{
    int dropped = 0;
    for (int csr = 0; csr < 2; csr++) {
        if (!d->zarr_path[csr][0] || iv_vds_zarr_kept(d->vx, csr)) continue;
        iv_alog_event(&s->log, "warn", "dataset %s: its kept Zarr X chunks (%s, %s) failed a check and "
                      "were removed; X's %s chunks are decoded on request until the next start writes "
                      "them again", d->conf->id, csr ? "csr" : "csc", d->zarr_path[csr],
                      csr ? "csr" : "csc");
        iv_autopack_unpin(d->zarr_path[csr]);
        d->zarr_path[csr][0] = '\0';
        dropped = 1;
    }
    if (dropped) rebuild_doc(s, d);
}

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
        if (d->pinned) source_look(s, d);
        zarr_look(s, d);
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
    rebuild_doc(s, d);
}

/* d's document made again (it shows a file's state and the kept Zarr
 * files); on loop 0, under its write lock. */
static void rebuild_doc(server_t *s, sds_t *d)
{
    char *old = d->doc;
    size_t old_len = d->doc_len;
    char old_etag[sizeof d->etag];
    memcpy(old_etag, d->etag, sizeof old_etag);
    loop_enter(&s->loops[0]);  /* loop 0's write lock: the document changes */
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
    loop_leave(&s->loops[0]);
}

/* ---- start and stop ----------------------------------------------------- */

/* A listening socket on cfg's address and port, or -1 (said on stderr). */
static int open_listen_socket(const iv_config_t *cfg)
{
    struct sockaddr_storage addr;
    int v6 = strchr(cfg->listen, ':') != NULL;
    int rc = v6 ? uv_ip6_addr(cfg->listen, cfg->port, (struct sockaddr_in6 *)&addr)
                : uv_ip4_addr(cfg->listen, cfg->port, (struct sockaddr_in *)&addr);
    if (rc != 0) {
        fprintf(stderr, "ivserve: listen address '%s' is not an IP address\n", cfg->listen);
        return -1;
    }
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    socklen_t alen = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        bind(fd, (struct sockaddr *)&addr, alen) != 0 || listen(fd, 511) != 0) {
        int e = errno;
        fprintf(stderr, "ivserve: cannot listen on %s:%d: %s%s\n", cfg->listen, cfg->port,
                strerror(e),
                e == EADDRINUSE ? " (another program, or another ivserve, has that port; "
                                  "choose another with --port N or IVSERVE_PORT=N, or "
                                  "PORT=N scripts/run_example.sh)"
                                : "");
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* The listening socket, opened by hand so that loop 0 can accept and hand
 * each connection to a loop (on_accept). */
static int bind_listener(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    int fd = open_listen_socket(cfg), rc;
    if (fd < 0) return -1;
    struct sockaddr_storage got;
    socklen_t len = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &len) != 0) {
        fprintf(stderr, "ivserve: cannot read the listening address: %s\n", strerror(errno));
        close(fd);
        return -1;
    }
    if ((rc = uv_poll_init(&s->loops[0].loop, &s->accept_poll, fd)) != 0) {
        fprintf(stderr, "ivserve: cannot watch the listening socket: %s\n", uv_strerror(rc));
        close(fd);
        return -1;
    }
    s->listen_fd = fd;
    s->accept_poll.data = s;
    if ((rc = uv_poll_start(&s->accept_poll, UV_READABLE, on_accept)) != 0) {
        fprintf(stderr, "ivserve: cannot watch the listening socket: %s\n", uv_strerror(rc));
        return -1;
    }
    int port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                               : ((struct sockaddr_in *)&got)->sin_port);
    iv_alog_event(&s->log, "info", "ivserve %s listening on %s:%d with %u workers and %u event loops",
                  iv_version(), cfg->listen, port, iv_pool_threads(s->pool),
                  s->n_loops > 1 ? s->n_loops - 1 : 1);
    return 0;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/*
 * The process's memory budget: memory_bytes, or 90% of the memory
 * available now (the machine's, or the cgroup's when it sets a limit),
 * split into parts each bounded by its own setting: the chunk caches up
 * to 60%, in-memory copies of the other orientation, bytes waiting to be
 * written, answers being computed and the packs the server runs up to
 * 10% each.  Logged once.
 */
static void start_memory(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    const char *src = "memory_bytes";
    uint64_t avail = 0;
    size_t total = cfg->memory_bytes;
    if (!total) total = iv_membudget_default(90, (size_t)8 << 30, &src, &avail);
    s->mem.total = total;
    s->mem.copies = min_size(cfg->transpose_bytes, total / 10);
    s->mem.writes = min_size(cfg->limits.write_budget_bytes, total / 10);
    s->mem.answers = total / 10;
    s->mem.builds = total / 10;
    s->write_budget = s->mem.writes;
    iv_budget_init(&s->transpose_left, s->mem.copies);
    iv_budget_init(&s->answers_left, s->mem.answers);
    iv_autopack_set_memory(s->mem.builds);
    if (cfg->memory_bytes)
        iv_alog_event(&s->log, "info", "memory budget %zu bytes (memory_bytes)", total);
    else
        iv_alog_event(&s->log, "info", "memory budget %zu bytes: 90%% of %" PRIu64 " bytes available "
                      "(%s)", total, avail, src);
}

/* The cache budget all datasets share: cache_bytes, or a share of the
 * memory available now (before any dataset loads), within 60% of the
 * memory budget. */
static int start_cache_budget(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    size_t bytes = cfg->cache_bytes;
    const char *src = "cache_bytes";
    uint64_t avail = 0;
    if (bytes == IV_CACHE_AUTO) {
        bytes = iv_membudget_default(cfg->cache_share_percent, (size_t)1 << 30, &src, &avail);
        if (bytes > s->mem.total / 10 * 6) bytes = s->mem.total / 10 * 6;
    }
    s->mem.cache = bytes;
    s->mb = iv_membudget_new(bytes);
    if (!s->mb) {
        fprintf(stderr, "ivserve: out of memory\n");
        return -1;
    }
    if (cfg->cache_bytes == IV_CACHE_AUTO && bytes == s->mem.total / 10 * 6)
        iv_alog_event(&s->log, "info", "cache budget %zu bytes: 60%% of the memory budget", bytes);
    else if (cfg->cache_bytes == IV_CACHE_AUTO)
        iv_alog_event(&s->log, "info", "cache budget %zu bytes: %u%% of %" PRIu64 " bytes available (%s)",
                      bytes, cfg->cache_share_percent, avail, src);
    else
        iv_alog_event(&s->log, "info", "cache budget %zu bytes (cache_bytes)", bytes);
    if (bytes > s->mem.total)
        iv_alog_event(&s->log, "warn", "cache_bytes (%zu) is more than the memory budget (%zu): "
                      "the process may hold more than memory_bytes", bytes, s->mem.total);
    iv_alog_event(&s->log, "info", "memory budget parts: caches %zu, in-memory copies %zu, writes %zu, "
                  "answers %zu, builds %zu bytes", s->mem.cache, s->mem.copies, s->mem.writes,
                  s->mem.answers, s->mem.builds);
    uint64_t floors = 0;
    for (size_t i = 0; i < cfg->n_datasets; i++) floors += (uint64_t)cfg->datasets[i].cache_floor_bytes;
    if (floors > bytes)
        iv_alog_event(&s->log, "warn", "the datasets' cache floors add up to %" PRIu64 " bytes, over the "
                      "cache budget of %zu: the caches may hold up to the floors", floors, bytes);
    return 0;
}

/* Frees what the workers handed back after the loops stopped: nothing is
 * answered or installed any more, so no job's done half runs. */
static int drain_after_stop(loop_t *lp)
{
    job_t *j = take_done(lp);
    int any = j != NULL;
    while (j) {
        job_t *n = j->next;
        if (j->type == &call_job) {
            /* A call posted to a loop that had stopped (an admin reload
             * asked for at the end, its answer): run, it finds no
             * connection and frees what it holds. */
            call_done(j);
            j = n;
            continue;
        }
        qstream_t *qs = j->qs;
        if (qs) qs->inflight--;
        job_free(j);
        if (qs && qs->inflight == 0 && !qs->c) qs_free(qs);
        j = n;
    }
    while (lp->streams) qs_free(lp->streams);
    for (size_t i = 0; i < lp->n_new_fds; i++) close(lp->new_fds[i]);
    lp->n_new_fds = 0;
    return any;
}

static void *loop_thread(void *arg)
{
    loop_t *lp = arg;
    uv_run(&lp->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* How many event loops: the config's, or one for every two cores (eight
 * loops gave 9.0 GB/s to 64 clients of 58 MB answers on 16 cores, four
 * 7.5, sixteen 8.8: benchmarks/README.md). */
static unsigned loops_wanted(const iv_config_t *cfg)
{
    unsigned n = cfg->loops;
    if (!n) {
        unsigned cores = (unsigned)uv_available_parallelism();
        n = cores >= 8 ? (cores + 1) / 2 : 1;
    }
    /* Several connection loops come with a control loop (loop_enter). */
    return n > 1 ? n + 1 : 1;
}

/* Sets up loop lp (not yet running): its libuv loop and its own handles.
 * On failure what was set up is closed by close_loops. */
static int loop_init(server_t *s, loop_t *lp, unsigned idx)
{
    lp->idx = idx;
    atomic_init(&lp->stop_asked, 0);
    atomic_init(&lp->n_conns, 0);
    atomic_init(&lp->n_streams, 0);
    atomic_init(&lp->queued_bytes, 0);
    atomic_init(&lp->n_budget_wait, 0);
    iv_metrics_init(&lp->metrics);
    if (pthread_mutex_init(&lp->done_mu, NULL) != 0) return -1;
    if (pthread_mutex_init(&lp->mmu, NULL) != 0) {
        pthread_mutex_destroy(&lp->done_mu);
        return -1;
    }
    int rc;
    if ((rc = uv_loop_init(&lp->loop)) != 0) {
        fprintf(stderr, "ivserve: cannot start an event loop: %s\n", uv_strerror(rc));
        pthread_mutex_destroy(&lp->done_mu);
        pthread_mutex_destroy(&lp->mmu);
        return -1;
    }
    /* From here on the loop is closed and freed with the server's. */
    lp->srv = s;
    if ((rc = uv_async_init(&lp->loop, &lp->async, on_async)) != 0 ||
        (rc = uv_timer_init(&lp->loop, &lp->grace)) != 0 || (rc = uv_timer_init(&lp->loop, &lp->reserve)) != 0) {
        fprintf(stderr, "ivserve: cannot set up an event loop: %s\n", uv_strerror(rc));
        return -1;
    }
    lp->async.data = lp;
    lp->grace.data = lp;
    lp->reserve.data = lp;
    if (idx > 0) {
        if ((rc = uv_timer_init(&lp->loop, &lp->budget)) != 0 ||
            (rc = uv_timer_start(&lp->budget, budget_tick, BUDGET_TICK_MS, BUDGET_TICK_MS)) != 0) {
            fprintf(stderr, "ivserve: cannot set up an event loop: %s\n", uv_strerror(rc));
            return -1;
        }
        lp->budget.data = lp;
        uv_unref((uv_handle_t *)&lp->budget);
    }
    return 0;
}

/* Start-up failed: closes every handle that was set up on each loop and
 * runs the loops until they are gone. */
static void close_loops(server_t *s)
{
    s->draining = 1;
    for (unsigned i = 0; i < s->n_loops; i++) {
        loop_t *lp = &s->loops[i];
        if (lp->srv != s) continue;
        uv_handle_t *hs[] = {(uv_handle_t *)&lp->async, (uv_handle_t *)&lp->grace,
                             (uv_handle_t *)&lp->budget, (uv_handle_t *)&lp->reserve, (uv_handle_t *)&s->accept_poll, (uv_handle_t *)&s->sigterm,
                             (uv_handle_t *)&s->sigint, (uv_handle_t *)&s->sighup,
                             (uv_handle_t *)&s->sigusr1, (uv_handle_t *)&s->accept_pause};
        size_t n = i == 0 ? sizeof hs / sizeof hs[0] : 4;
        for (size_t k = 0; k < n; k++)
            if (hs[k]->loop == &lp->loop && !uv_is_closing(hs[k]))
                uv_close(hs[k], hs[k] == (uv_handle_t *)&s->accept_poll ? on_accept_closed : NULL);
        uv_run(&lp->loop, UV_RUN_DEFAULT);
    }
}

int iv_server_run(const iv_config_t *cfg)
{
    return iv_server_run_with(cfg, NULL, NULL);
}

/* What is open, said once: an empty tokens file or a forgotten scope
 * would otherwise leave datasets open without a word. */
static void log_auth(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    size_t n_prot = 0;
    for (size_t i = 0; i < cfg->n_datasets; i++) n_prot += (size_t)iv_auth_protected(&s->auth, cfg->datasets[i].id);
    iv_alog_event(&s->log, "info",
                  "auth: %zu tokens; %zu of %zu datasets need one, the others are public; /metrics %s",
                  s->auth.n, n_prot, cfg->n_datasets, cfg->metrics_auth ? "needs a metrics or admin token" : "is open");
    if (cfg->tokens_file && cfg->n_token_entries == 0)
        iv_alog_event(&s->log, "warn", "auth: the tokens file %s holds no tokens", cfg->tokens_file);
}

/* The configured datasets' entries (not loaded yet) and the tokens; -1
 * when out of memory (server_free frees what was made). */
static int open_registry(server_t *s)
{
    const iv_config_t *cfg = s->cfg;
    s->reg.v = calloc(cfg->n_datasets ? cfg->n_datasets : 1, sizeof *s->reg.v);
    int ok = s->reg.v && iv_auth_build(&s->auth, cfg) == 0;
    for (size_t i = 0; ok && i < cfg->n_datasets; i++) {
        ok = (s->reg.v[i] = iv_rds_new(&cfg->datasets[i])) != NULL;
        if (!ok) break;
        s->reg.n++;
        iv_path_id_read(cfg->datasets[i].path, &s->reg.v[i]->fid);
        if (cfg->datasets[i].companion) iv_path_id_read(cfg->datasets[i].companion, &s->reg.v[i]->cfid);
    }
    if (!ok) return -1;
    log_auth(s);
    return 0;
}

/* The server's locks.  Datasets load on several workers at once: that
 * needs an HDF5 built thread-safe.  Without it the loads take turns (the
 * queries make no HDF5 calls). */
static int open_locks(server_t *s)
{
    hbool_t h5ts = 0;
    if (H5is_library_threadsafe(&h5ts) < 0) h5ts = 0;
    s->h5_serial = !h5ts;
    pthread_rwlockattr_t ra;
    int lock_ok = pthread_rwlockattr_init(&ra) == 0;
    /* A reload must not wait behind a steady stream of readers. */
    if (lock_ok)
        pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    lock_ok = lock_ok && pthread_rwlock_init(&s->shared, &ra) == 0;
    if (!lock_ok || pthread_mutex_init(&s->h5_mu, NULL) != 0) {
        fprintf(stderr, "ivserve: cannot create a lock\n");
        return -1;
    }
    return 0;
}

/* Loop 0's signal handlers and accept-pause timer.  Each handle is closed
 * on failure by close_loops, which closes the ones that were initialised
 * (a zeroed handle has no loop). */
static int open_signals(server_t *s)
{
    int rc;
    uv_loop_t *l0 = &s->loops[0].loop;
    if ((rc = uv_signal_init(l0, &s->sigterm)) != 0 || (rc = uv_signal_init(l0, &s->sigint)) != 0 ||
        (rc = uv_signal_init(l0, &s->sighup)) != 0 || (rc = uv_signal_init(l0, &s->sigusr1)) != 0 ||
        (rc = uv_timer_init(l0, &s->accept_pause)) != 0) {
        fprintf(stderr, "ivserve: cannot set up the event loop: %s\n", uv_strerror(rc));
        return -1;
    }
    s->sigterm.data = s->sigint.data = s->sighup.data = s->sigusr1.data = s;
    s->accept_pause.data = s;
    if ((rc = uv_signal_start(&s->sigterm, on_signal, SIGTERM)) != 0 ||
        (rc = uv_signal_start(&s->sigint, on_signal, SIGINT)) != 0 ||
        (rc = uv_signal_start(&s->sighup, on_hup, SIGHUP)) != 0 ||
        (rc = uv_signal_start(&s->sigusr1, on_hup, SIGUSR1)) != 0) {
        fprintf(stderr, "ivserve: cannot handle SIGTERM/SIGINT/SIGHUP/SIGUSR1: %s\n", uv_strerror(rc));
        return -1;
    }
    return 0;
}

/* The server's fields before anything is started. */
static void server_init_fields(server_t *s, const iv_config_t *cfg, iv_config_reader_fn reader,
                               void *reader_arg)
{
    s->cfg = cfg;
    s->reader = reader;
    s->reader_arg = reader_arg;
    s->readyz_any = cfg->readyz_any;
    s->listen_fd = -1;
    atomic_init(&s->reload_asked, 0);
    atomic_init(&s->next_conn_id, 1);
    atomic_init(&s->n_conns_all, 0);
    atomic_init(&s->budget_used, 0);
    atomic_init(&s->n_wait_all, 0);
    atomic_init(&s->room_wanted_ms, 0);
}

server_t *server_open(const iv_config_t *cfg, iv_config_reader_fn reader, void *reader_arg)
{
    server_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    server_init_fields(s, cfg, reader, reader_arg);
    if (iv_alog_open(&s->log, cfg->access_log, cfg->log_format) != 0) {
        free(s);
        return NULL;
    }
    signal(SIGPIPE, SIG_IGN);
    iv_h5filters_register();
    s->n_loops = loops_wanted(cfg);
    s->loops = calloc(s->n_loops, sizeof *s->loops);
    if (!s->loops) {
        fprintf(stderr, "ivserve: out of memory\n");
        server_free(s, SRV_ALLOCATED);
        return NULL;
    }
    for (unsigned i = 0; i < s->n_loops; i++) atomic_init(&s->loops[i].reserve_oldest, UINT64_MAX);
    atomic_init(&s->reserve_seq, 0);
    s->pool = iv_pool_create(cfg->threads, cfg->queue);
    if (!s->pool) {
        fprintf(stderr, "ivserve: cannot start the worker pool\n");
        server_free(s, SRV_ALLOCATED);
        return NULL;
    }
    start_memory(s);
    if (start_cache_budget(s) != 0) goto fail_mem;
    if (open_registry(s) != 0) {
        fprintf(stderr, "ivserve: out of memory\n");
        goto fail_mem;
    }
    if (open_locks(s) != 0) goto fail_mem;
    for (unsigned i = 0; i < s->n_loops; i++)
        if (loop_init(s, &s->loops[i], i) != 0) goto fail_loop;
    if (open_signals(s) != 0) goto fail_loop;
    /* The handlers are in place: a signal held back since main (or blocked
     * by whoever started the process) is taken now, and runs its handler
     * when loop 0 runs, as one that comes later would.  The threads
     * started before this point keep them blocked, so they reach this
     * thread. */
    sigset_t handled;
    handled_signals(&handled);
    pthread_sigmask(SIG_UNBLOCK, &handled, NULL);
    if (s->h5_serial)
        iv_alog_event(&s->log, "warn", "the HDF5 library is not thread-safe: datasets load one at a time");
    return s;

fail_loop:
    server_free(s, SRV_LOOPS);
    return NULL;
fail_mem:
    server_free(s, SRV_POOL);
    return NULL;
}

int iv_server_run_with(const iv_config_t *cfg, iv_config_reader_fn reader, void *reader_arg)
{
    server_t *s = server_open(cfg, reader, reader_arg);
    if (!s) return 1;
    int rc;
    uv_loop_t *l0 = &s->loops[0].loop;
    if (bind_listener(s) != 0) {
        server_free(s, SRV_LOOPS);
        return 1;
    }
    for (unsigned i = 1; i < s->n_loops; i++) {
        loop_t *lp = &s->loops[i];
        if ((rc = pthread_create(&lp->thread, NULL, loop_thread, lp)) != 0) {
            fprintf(stderr, "ivserve: cannot start an event loop's thread: %s\n", strerror(rc));
            /* The loops already running stop as at SIGTERM. */
            for (unsigned k = 1; k < i; k++) loop_ask_stop(&s->loops[k]);
            for (unsigned k = 1; k < i; k++) pthread_join(s->loops[k].thread, NULL);
            server_free(s, SRV_LOOPS);
            return 1;
        }
    }
    for (size_t i = 0; i < s->reg.n; i++) load_submit(s, s->reg.v[i], 0, 0, 0);
    if ((rc = iv_watch_start(l0, IV_WATCH_DEFAULT_MS, watch_list, on_file_change, s,
                             &s->watch)) != 0)
        iv_alog_event(&s->log, "warn", "files replaced under the server will not be noticed: %s",
                      uv_strerror(rc));
    uv_run(l0, UV_RUN_DEFAULT);
    for (unsigned i = 1; i < s->n_loops; i++) pthread_join(s->loops[i].thread, NULL);
    iv_alog_event(&s->log, "info", "stopped");
    server_free(s, SRV_RAN);
    return 0;
}

/*
 * Frees server s, set up as far as stage says: SRV_ALLOCATED (the
 * structure, its log and loop array), SRV_POOL (and the pool, budgets,
 * registry, tokens), SRV_LOOPS (and the loops and their handles, not
 * run), SRV_RAN (its loops ran to their end and closed their handles).
 */
void server_free(server_t *s, int stage)
{
    if (stage < SRV_POOL) goto allocated;
    if (stage < SRV_LOOPS) goto pool_up;
    if (stage == SRV_LOOPS) close_loops(s);
    iv_pool_destroy(s->pool);
    s->pool = NULL;
    /* A call drained on one loop may post another to a loop drained
     * before it: again until every list stays empty. */
    for (int again = 1; again;) {
        again = 0;
        for (unsigned i = 0; i < s->n_loops; i++)
            if (s->loops[i].srv == s && drain_after_stop(&s->loops[i])) again = 1;
    }
    if (s->reload) {
        /* Stopped during a reload: its waiter's connection is gone. */
        reload_free(s->reload);
        s->reload = NULL;
    }
    for (unsigned i = 0; i < s->n_loops; i++) {
        loop_t *lp = &s->loops[i];
        if (lp->srv != s) continue;
        uv_loop_close(&lp->loop);
        pthread_mutex_destroy(&lp->done_mu);
        pthread_mutex_destroy(&lp->mmu);
        free(lp->new_fds);
    }
    pthread_rwlock_destroy(&s->shared);
    pthread_mutex_destroy(&s->h5_mu);
pool_up:
    iv_pool_destroy(s->pool);
    iv_registry_free(&s->reg);
    /* After every dataset closed (each stream leaves the budget). */
    iv_membudget_free(s->mb);
    iv_auth_free(&s->auth);
allocated:
    free(s->loops);
    iv_alog_close(&s->log);
    free(s);
}
