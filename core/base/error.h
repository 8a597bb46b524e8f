/*
 * ivserve error codes.
 *
 * One table, expanded with an X-macro, gives every error its enum value,
 * a stable machine-readable code string, the HTTP status a server answers
 * with, and a default message.  Functions return 0 on success or a negative
 * IV_E* value; the human-readable detail (which file, which dataset, which
 * check) goes into a caller-owned iv_err_t.
 *
 * The status column is the only map from errors to HTTP statuses: a
 * handler answers iv_error_status(rc) with iv_error_code(rc), so an error
 * that needs another status needs its own row, not a special case where
 * it is answered.  NO_METADATA (a names or filter selection on a dataset
 * whose obs/var could not be loaded: 422 "unsupported") and NO_COLUMN (an
 * unknown column named in a URL path: 404 "not_found") are such rows; they
 * keep the wire codes those answers have always had.  Values are unique
 * (error.c's switch does not compile otherwise); code strings need not be.
 */
#ifndef IV_ERROR_H
#define IV_ERROR_H

#include <stdarg.h>

/*      name              value status code-string             default message */
#define IV_ERROR_MAP(X)                                                                        \
    X(OK,               0,  200, "ok",                   "ok")                                 \
    X(NOMEM,           -1,  503, "out_of_memory",        "out of memory")                      \
    X(IO,              -2,  500, "io_error",             "input/output error")                 \
    X(BAD_FILE,        -3,  500, "bad_file",             "invalid or inconsistent file")       \
    X(UNSUPPORTED,     -4,  500, "unsupported",          "unsupported feature")                \
    X(CORRUPT,         -5,  500, "corrupt_data",         "corrupt compressed data")            \
    X(BAD_REQUEST,     -6,  400, "bad_request",          "malformed request")                  \
    X(BAD_JSON,        -7,  400, "bad_json",             "malformed JSON")                     \
    X(UNAUTHORIZED,    -8,  401, "unauthorized",         "missing or invalid token")           \
    X(FORBIDDEN,       -9,  403, "forbidden",            "token not allowed here")             \
    X(NOT_FOUND,      -10,  404, "not_found",            "not found")                          \
    X(METHOD,         -11,  405, "method_not_allowed",   "method not allowed")                 \
    X(NOT_ACCEPTABLE, -12,  406, "not_acceptable",       "no acceptable encoding")             \
    X(TOO_LARGE,      -13,  413, "too_large",            "request or result too large")        \
    X(MEDIA_TYPE,     -14,  415, "unsupported_media",    "unsupported media type")             \
    X(OUT_OF_RANGE,   -15,  422, "out_of_range",         "selection out of range")             \
    X(UNKNOWN_NAME,   -16,  422, "unknown_name",         "unknown name")                       \
    X(BAD_SELECTION,  -17,  422, "bad_selection",        "invalid selection")                  \
    X(BAD_FILTER,     -18,  422, "bad_filter",           "invalid filter")                     \
    X(TOO_MANY,       -19,  429, "too_many_requests",    "too many requests")                  \
    X(OVERLOADED,     -20,  503, "overloaded",           "server overloaded, retry later")     \
    X(NOT_READY,      -21,  503, "not_ready",            "dataset not ready")                  \
    X(TIMEOUT,        -22,  408, "timeout",              "request timed out")                  \
    X(CANCELLED,      -23,  499, "cancelled",            "cancelled")                          \
    X(INTERNAL,       -24,  500, "internal",             "internal error")                     \
    X(INVALID_ARG,    -25,  400, "invalid_argument",     "invalid argument")                   \
    X(NO_METADATA,    -26,  422, "unsupported",          "the dataset's metadata is not available") \
    X(NO_COLUMN,      -27,  404, "not_found",            "no such column")               \
    X(FILE_CHANGED,   -28,  503, "file_changed",         "the dataset's file changed on disk; reload it") \
    X(UNKNOWN_MATRIX, -29,  404, "unknown_matrix",       "no such matrix in the dataset")   \
    X(UNSERVABLE,     -30,  422, "unsupported",          "the matrix is listed but cannot be served")

enum iv_error {
#define IV__ENUM(name, val, status, code, msg) IV_E##name = (val),
    IV_ERROR_MAP(IV__ENUM)
#undef IV__ENUM
};

/* Detail of the last error, owned by the caller (usually on its stack). */
typedef struct iv_err {
    int code;          /* IV_E* value, 0 when no error was set */
    char msg[512];     /* one line, no trailing newline */
} iv_err_t;

/* Stable code string ("bad_file") of an IV_E* value; "unknown" otherwise. */
const char *iv_error_code(int err);
/* HTTP status for an IV_E* value (500 for unknown values). */
int iv_error_status(int err);
/* Default message for an IV_E* value. */
const char *iv_error_message(int err);

/*
 * Records code and a printf-style message in e (which may be NULL) and
 * returns code, so that callers write `return iv_fail(e, IV_EBAD_FILE, ...)`.
 * Keeps the first error: a later call does not overwrite a set message
 * unless the earlier one was cleared with iv_err_clear().
 */
int iv_fail(iv_err_t *e, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int iv_vfail(iv_err_t *e, int code, const char *fmt, va_list ap);
void iv_err_clear(iv_err_t *e);

/*
 * Validation helper: returns the error from the enclosing function when
 * cond holds.  Debug builds append the source location to the message.
 */
#ifndef NDEBUG
#define IV_FAIL(e, code, ...) iv_fail_at((e), (code), __FILE__, __LINE__, __VA_ARGS__)
int iv_fail_at(iv_err_t *e, int code, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
#else
#define IV_FAIL(e, code, ...) iv_fail((e), (code), __VA_ARGS__)
#endif

#define IV_RETURN_IF(cond, e, code, ...)                 \
    do {                                                 \
        if (cond) return IV_FAIL((e), (code), __VA_ARGS__); \
    } while (0)

/* Propagates a negative return value. */
#define IV_TRY(expr)                 \
    do {                             \
        int iv__rc = (expr);         \
        if (iv__rc < 0) return iv__rc; \
    } while (0)

#endif /* IV_ERROR_H */
