/*
 * Log lines (see access_log.h).
 *
 * Lines are built whole in a buffer and written with one fwrite, so that
 * a line is never interleaved with another writer's; JSON escaping comes
 * from the same buffer code the API uses, so a path or message with
 * control characters or quotes stays one valid JSON line.
 */
#include "access_log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "buf.h"

static void iso_time(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

int iv_alog_open(iv_alog_t *l, const char *access, const char *format)
{
    memset(l, 0, sizeof *l);
    l->json = strcmp(format, "text") != 0;
    if (!strcmp(access, "-")) {
        l->f = stderr;
    } else if (strcmp(access, "off") != 0) {
        l->f = fopen(access, "a");
        if (!l->f) {
            fprintf(stderr, "ivserve: cannot open access log %s\n", access);
            return -1;
        }
        l->owned = 1;
    }
    return 0;
}

void iv_alog_close(iv_alog_t *l)
{
    if (l->owned) fclose(l->f);
    l->f = NULL;
    l->owned = 0;
}

int iv_alog_reopen(iv_alog_t *l, const char *access)
{
    if (!l->owned) return 0;
    FILE *f = fopen(access, "a");
    if (!f) return -1;
    fclose(l->f);
    l->f = f;
    return 0;
}

void iv_alog_event(const iv_alog_t *l, const char *level, const char *fmt, ...)
{
    char msg[1024], t[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    iso_time(t, sizeof t);
    if (l->json) {
        iv_buf_t b;
        iv_buf_init(&b);
        iv_buf_printf(&b, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":", t, level);
        iv_buf_json_str(&b, msg);
        iv_buf_puts(&b, "}\n");
        if (!b.oom) fwrite(b.data, 1, b.len, stderr);
        iv_buf_free(&b);
    } else {
        fprintf(stderr, "%s %s %s\n", t, level, msg);
    }
    fflush(stderr);
}

void iv_alog_access(const iv_alog_t *l, const iv_alog_entry_t *e)
{
    if (!l->f) return;
    char t[40];
    iso_time(t, sizeof t);
    const char *err = e->error ? e->error : "";
    const char *ds = e->dataset && e->dataset[0] ? e->dataset : NULL;
    iv_buf_t b;
    iv_buf_init(&b);
    if (l->json) {
        iv_buf_printf(&b, "{\"time\":\"%s\",\"method\":\"%s\",\"path\":", t, e->method);
        iv_buf_json_str(&b, e->path);
        iv_buf_puts(&b, ",\"dataset\":");
        if (ds) iv_buf_json_str(&b, ds);
        else iv_buf_puts(&b, "null");
        iv_buf_printf(&b,
                      ",\"status\":%d,\"rows\":%" PRId64 ",\"nnz\":%" PRId64 ",\"bytes\":%" PRIu64
                      ",\"ms\":%.3f",
                      e->status, e->rows, e->nnz, e->bytes, e->ms);
        if (err[0]) {
            iv_buf_puts(&b, ",\"error\":");
            iv_buf_json_str(&b, err);
        }
        iv_buf_puts(&b, "}\n");
    } else {
        iv_buf_printf(&b, "%s %s %s %s %d rows=%" PRId64 " nnz=%" PRId64 " bytes=%" PRIu64 " ms=%.3f%s%s\n",
                      t, e->method, e->path, ds ? ds : "-", e->status, e->rows, e->nnz, e->bytes,
                      e->ms, err[0] ? " error=" : "", err);
    }
    if (!b.oom) fwrite(b.data, 1, b.len, l->f);
    fflush(l->f);
    iv_buf_free(&b);
}
