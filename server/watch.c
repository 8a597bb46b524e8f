/*
 * The file watcher (see watch.h for why it polls, on the loop).
 *
 * A tick walks the server's list of files: stat() of each path, compared
 * with the identity the file had at load (iv_file_compare), recorded on
 * the file (iv_file_mark).  A move of the state, seen here or by a read
 * on a worker, is then reported once through the change callback
 * (iv_file_news), so that the server logs it and shows it in the
 * dataset's document without a second channel from the workers.
 */
#include "watch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct iv_watch {
    uv_timer_t timer;
    iv_watch_list_fn list;
    iv_watch_change_fn change;
    void *ctx;
};

iv_file_state_t iv_watch_check(iv_file_t *f)
{
    struct stat st;
    int r = stat(iv_file_path(f), &st);
    if (r != 0 && errno != ENOENT && errno != ENOTDIR) {
        /* EACCES, EIO and the like say nothing about the file: the
         * state stays what it was. */
        return iv_file_state(f, NULL, 0);
    }
    const iv_file_id_t *id = iv_file_loaded_id(f);
    const struct stat *now = r == 0 ? &st : NULL;
    iv_file_state_t seen = iv_file_compare(id, now);
    char what[200], msg[480];
    iv_file_describe(id, now, what, sizeof what);
    switch (seen) {
    case IV_FILE_OK:
        snprintf(msg, sizeof msg, "%.160s names the loaded file again", iv_file_path(f));
        break;
    case IV_FILE_DELETED:
    case IV_FILE_REPLACED:
        snprintf(msg, sizeof msg, "%.160s was %s (%.200s); the file loaded is still open and "
                 "served until the dataset is reloaded", iv_file_path(f),
                 seen == IV_FILE_DELETED ? "deleted" : "replaced", what);
        break;
    case IV_FILE_CHANGED:
        snprintf(msg, sizeof msg, "%.160s changed on disk after it was loaded (%.200s); "
                 "reload the dataset", iv_file_path(f), what);
        break;
    }
    iv_file_mark(f, seen, msg);
    return iv_file_state(f, NULL, 0);
}

void iv_watch_tick(iv_watch_t *w)
{
    iv_file_t *f;
    void *key;
    for (size_t i = 0; w->list(w->ctx, i, &f, &key); i++) {
        if (!f) continue;
        iv_watch_check(f);
        if (iv_file_news(f)) {
            char msg[480];
            iv_file_state_t st = iv_file_state(f, msg, sizeof msg);
            w->change(w->ctx, key, f, st, msg);
        }
    }
}

static void on_tick(uv_timer_t *t) { iv_watch_tick(t->data); }

int iv_watch_start(uv_loop_t *loop, uint64_t interval_ms, iv_watch_list_fn list,
                   iv_watch_change_fn change, void *ctx, iv_watch_t **out)
{
    *out = NULL;
    iv_watch_t *w = calloc(1, sizeof *w);
    if (!w) return UV_ENOMEM;
    int rc = uv_timer_init(loop, &w->timer);
    if (rc != 0) {
        free(w);
        return rc;
    }
    w->timer.data = w;
    w->list = list;
    w->change = change;
    w->ctx = ctx;
    if (!interval_ms) interval_ms = IV_WATCH_DEFAULT_MS;
    if ((rc = uv_timer_start(&w->timer, on_tick, interval_ms, interval_ms)) != 0) {
        iv_watch_stop(w);
        return rc;
    }
    /* Ticks never keep the loop alive: a server stopping does not wait for
     * the next one. */
    uv_unref((uv_handle_t *)&w->timer);
    *out = w;
    return 0;
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void iv_watch_stop(iv_watch_t *w)
{
    if (!w || uv_is_closing((uv_handle_t *)&w->timer)) return;
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, on_closed);
}
