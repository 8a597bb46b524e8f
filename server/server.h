/*
 * The HTTP query server: one libuv loop, a worker pool, the datasets.
 *
 * iv_server_run() loads every configured dataset on the workers, listens,
 * serves until SIGTERM or SIGINT, lets streams in flight finish within
 * the configured grace period, and releases everything before returning.
 * Call it from the main thread, once per process (it installs signal
 * handlers on its loop).
 */
#ifndef IV_SERVER_H
#define IV_SERVER_H

#include "config.h"

/* Returns the process exit status: 0 after a clean shutdown, 1 when the
 * server could not start (the reason is printed on stderr). */
int iv_server_run(const iv_config_t *cfg);

#endif
