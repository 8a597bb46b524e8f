/*
 * The file watcher: a loop timer that looks, every few seconds, at what
 * each served file's path names now and tells the server when a file
 * was replaced, deleted or written in place (filecheck.h says what each
 * means for the queries).
 *
 * Why polling.  inotify watches an inode, and the interesting events
 * (`mv new.h5ad served.h5ad`, rm, cp over it) are about a path, often in
 * a folder the server may not watch (a read-only mount, a volume in a
 * container, NFS, where inotify sees nothing).  One stat() per file every
 * interval costs microseconds and sees all of them, late by at most one
 * interval; the read path (a chunk that fails its check) does not wait
 * for the watcher, and its finding is reported at the next tick too.
 *
 * The stats run on the loop thread, synchronously: the files it looks at
 * are owned by datasets that a reload may close, and a synchronous call
 * cannot outlive its file.  A path on a hung network mount would hold the
 * loop as it would hold the dataset's loads.
 *
 * Thread rules: every function runs on the loop thread.
 */
#ifndef IV_WATCH_H
#define IV_WATCH_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "filecheck.h"

#define IV_WATCH_DEFAULT_MS 2000

typedef struct iv_watch iv_watch_t;

/* The files to look at: for i = 0, 1, ... fills *f (NULL: nothing to
 * look at in slot i, e.g. a dataset still loading) and *key (handed back
 * to the change callback) and returns 1; returns 0 past the last slot. */
typedef int (*iv_watch_list_fn)(void *ctx, size_t i, iv_file_t **f, void **key);
/* A file's state moved (iv_file_news): st and msg say to what. */
typedef void (*iv_watch_change_fn)(void *ctx, void *key, iv_file_t *f, iv_file_state_t st,
                                   const char *msg);

/* Starts the timer (interval_ms, 0 = the default); 0 or a libuv error. */
int iv_watch_start(uv_loop_t *loop, uint64_t interval_ms, iv_watch_list_fn list,
                   iv_watch_change_fn change, void *ctx, iv_watch_t **out);
/* One look at every file now (the timer's work; also for tests). */
void iv_watch_tick(iv_watch_t *w);
/* Stops and closes the timer; the watcher is freed by its close callback,
 * so the caller forgets w.  NULL is a no-op. */
void iv_watch_stop(iv_watch_t *w);

/* One file's look, without a loop: stat its path and record what it
 * shows (iv_file_mark).  Returns the state now. */
iv_file_state_t iv_watch_check(iv_file_t *f);

#endif
