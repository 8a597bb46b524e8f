/* Error table lookups and message formatting (see error.h). */
#include "error.h"

#include <stdio.h>
#include <string.h>

const char *iv_error_code(int err)
{
    switch (err) {
#define IV__CASE(name, val, status, code, msg) case (val): return code;
        IV_ERROR_MAP(IV__CASE)
#undef IV__CASE
    }
    return "unknown";
}

int iv_error_status(int err)
{
    switch (err) {
#define IV__CASE(name, val, status, code, msg) case (val): return status;
        IV_ERROR_MAP(IV__CASE)
#undef IV__CASE
    }
    return 500;
}

const char *iv_error_message(int err)
{
    switch (err) {
#define IV__CASE(name, val, status, code, msg) case (val): return msg;
        IV_ERROR_MAP(IV__CASE)
#undef IV__CASE
    }
    return "unknown error";
}

int iv_vfail(iv_err_t *e, int code, const char *fmt, va_list ap)
{
    if (e == NULL || e->code != 0) return code;
    e->code = code;
    if (fmt == NULL) {
        snprintf(e->msg, sizeof e->msg, "%s", iv_error_message(code));
    } else {
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    }
    return code;
}

int iv_fail(iv_err_t *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    iv_vfail(e, code, fmt, ap);
    va_end(ap);
    return code;
}

#ifndef NDEBUG
int iv_fail_at(iv_err_t *e, int code, const char *file, int line, const char *fmt, ...)
{
    if (e == NULL || e->code != 0) return code;
    va_list ap;
    va_start(ap, fmt);
    iv_vfail(e, code, fmt, ap);
    va_end(ap);
    size_t n = strlen(e->msg);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (n + 1 < sizeof e->msg)
        snprintf(e->msg + n, sizeof e->msg - n, " [%s:%d]", base, line);
    return code;
}
#endif

void iv_err_clear(iv_err_t *e)
{
    if (e) {
        e->code = 0;
        e->msg[0] = '\0';
    }
}
