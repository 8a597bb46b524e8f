/*
 * The query server (see server.h): start and stop, signals, the loop's
 * side of the worker hand-off, and the served files' watcher.
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
 * Each of the server's other concerns has a file of its own; the private
 * header server_impl.h lists them and holds the types they share.
 */
#include "server.h"
#include "server_impl.h"

#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>

#include "codec.h"
#include "version.h"

/* ---- loop-side completions, signals ------------------------------------ */

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
        j->type->done(j);
        j = n;
    }
}

static void on_grace(uv_timer_t *t)
{
    server_t *s = t->data;
    iv_alog_event(&s->log, "warn", "shutdown grace period over; closing %zu connections", s->n_conns);
    while (s->conns) conn_close(s->conns);
}

/* The loop's own handles (wake-up, signals, grace timer) and the file
 * watcher: closed once the last connection is gone, so the loop ends. */
void server_close_handles(server_t *s)
{
    iv_watch_stop(s->watch);
    s->watch = NULL;
    uv_close((uv_handle_t *)&s->async, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sighup, NULL);
    uv_close((uv_handle_t *)&s->sigusr1, NULL);
    uv_close((uv_handle_t *)&s->grace, NULL);
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
        server_close_handles(s);
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

/* Frees what the workers handed back after the loop stopped: nothing is
 * answered or installed any more, so no job's done half runs. */
static void drain_after_stop(server_t *s)
{
    job_t *j = take_done(s);
    while (j) {
        job_t *n = j->next;
        qstream_t *qs = j->qs;
        if (qs) qs->inflight--;
        job_free(j);
        if (qs && qs->inflight == 0 && !qs->c) qs_free(qs);
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
