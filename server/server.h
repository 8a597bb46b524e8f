/*
 * The HTTP query server: one libuv loop, a worker pool, the datasets.
 *
 * iv_server_run() loads every configured dataset on the workers, listens,
 * serves until SIGTERM or SIGINT, lets streams in flight finish within
 * the configured grace period, and releases everything before returning.
 * SIGHUP reopens the access log and reloads the datasets (see
 * iv_server_run_with); SIGUSR1 is logged and ignored.
 * Call it from the main thread, once per process (it installs signal
 * handlers on its loop).
 */
#ifndef IV_SERVER_H
#define IV_SERVER_H

#include "config.h"

/* Returns the process exit status: 0 after a clean shutdown, 1 when the
 * server could not start (the reason is printed on stderr).  Without a
 * reader (see iv_server_run_with) a reload keeps the datasets as they are
 * and says so. */
int iv_server_run(const iv_config_t *cfg);

/*
 * Reads the settings afresh into out (initialised by the reader), from the
 * same sources as at start-up (config file, environment, command-line
 * datasets): a reload (SIGHUP, POST /v1/admin/reload) calls it on the loop
 * thread and applies the datasets and the readyz policy it returns; the
 * other settings take effect at the next start.  Returns 0 or a negative
 * error with err set; out is freed by the caller either way.
 */
typedef int (*iv_config_reader_fn)(void *arg, iv_config_t *out, iv_err_t *err);

/* iv_server_run with a reader for reloads. */
int iv_server_run_with(const iv_config_t *cfg, iv_config_reader_fn reader, void *arg);

/*
 * Blocks SIGTERM, SIGINT, SIGHUP and SIGUSR1 in the calling thread.  Call
 * it first thing in main, before any thread starts (threads inherit the
 * mask): one of them sent while the settings are read and the server is
 * set up then waits, pending, instead of killing the process by its
 * default action, and iv_server_run unblocks them once its handlers are
 * in place, so that a SIGTERM that came early is a graceful stop and a
 * SIGHUP a reload.  Signals already blocked when the process started
 * (a mask inherited across exec) are honoured the same way.
 */
void iv_server_block_signals(void);

/*
 * For code that finds a served dataset broken while running (a file
 * changed on disk under it).  struct server and struct iv_rds are the
 * server's and the registry's (registry.h).
 *
 * iv_server_mark_failed: loop thread.  The dataset is listed with state
 * "failed" and the reason, queries on it answer 503 dataset_failed, and
 * /readyz counts it as not loaded; requests already running on it finish.
 * A reload (which sees the file's new identity) loads it afresh.
 *
 * iv_server_request_reload: loop thread; the same as SIGHUP (why is
 * logged).  iv_server_request_reload_async: any thread (a worker); the
 * reload starts on the loop soon after.
 */
struct server;
struct iv_rds;
void iv_server_mark_failed(struct server *s, struct iv_rds *d, const char *why);
void iv_server_request_reload(struct server *s, const char *why);
void iv_server_request_reload_async(struct server *s);

#endif
