/*
 * HTTP/1.1 request parsing on top of llhttp, without sockets.
 *
 * iv_http_in_t turns a byte stream into one complete request at a time:
 * after a request's last byte the parser pauses, so a connection answers
 * pipelined requests strictly in order and the bytes of the next request
 * stay in the caller's buffer until it is ready for them.  Limits on the
 * header block and the body are enforced while parsing, before anything
 * is buffered past them.  Only the headers the server uses are kept.
 *
 * One iv_http_in_t per connection, used by one thread (the loop).
 */
#ifndef IV_HTTP_H
#define IV_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <llhttp.h>

#include "buf.h"

enum iv_http_hdr {
    IV_H_ACCEPT, IV_H_CONTENT_TYPE, IV_H_AUTHORIZATION, IV_H_ORIGIN, IV_H_IF_NONE_MATCH,
    IV_H_EXPECT, IV_H_AC_REQUEST_METHOD, IV_H_ACCEPT_ENCODING, IV_H_X_FORWARDED_FOR,
    IV_H_CONTENT_ENCODING, IV_H_COUNT
};

typedef struct iv_http_req {
    int method;                 /* llhttp_method_t */
    int http_major, http_minor;
    int keep_alive;
    char *target;               /* request target as sent (owned) */
    char *path;                 /* target up to '?', less an absolute form's "http://host" (owned) */
    char *query;                /* after '?', or "" (owned) */
    char *hdr[IV_H_COUNT];      /* owned, NULL when absent; repeated headers joined by ", " */
    iv_buf_t body;
} iv_http_req_t;

void iv_http_req_free(iv_http_req_t *r);

typedef struct iv_http_in {
    llhttp_t parser;
    llhttp_settings_t settings;
    size_t max_header, max_body;
    size_t header_bytes;        /* request line and header lines so far, as sent */
    int n_host;                 /* Host headers of the current request */
    const char *feed_end;       /* end of the bytes being parsed */
    int value_cut;              /* the header value's last piece ended before feed_end */
    iv_http_req_t *cur;         /* request being parsed (owned until handed out) */
    iv_buf_t url, field, value; /* pieces that may arrive split over reads */
    int in_message;             /* between message begin and complete */
    int headers_done;
    int complete;               /* cur holds a complete request */
    int err_status;             /* 400, 413, 431, 505 ... once failed */
    char err_msg[160];
} iv_http_in_t;

void iv_http_in_init(iv_http_in_t *in, size_t max_header, size_t max_body);
void iv_http_in_free(iv_http_in_t *in);

/*
 * Feeds up to len bytes.  Stops after the end of a request.  Returns
 *   1  a request is complete: *req receives it (caller frees with
 *      iv_http_req_free + free), *consumed bytes were used;
 *   0  all bytes consumed, request incomplete;
 *  -1  the input is bad: in->err_status and in->err_msg say why; the
 *      connection cannot be resynchronised and must close after answering.
 */
int iv_http_in_feed(iv_http_in_t *in, const char *data, size_t len, size_t *consumed,
                    iv_http_req_t **req);

/* True between the first byte of a request and its completion. */
int iv_http_in_active(const iv_http_in_t *in);
/* True once the current request's headers are complete. */
int iv_http_in_headers_done(const iv_http_in_t *in);
/* The current (incomplete) request, e.g. to look at Expect; NULL if none. */
const iv_http_req_t *iv_http_in_current(const iv_http_in_t *in);

/* Copies msg into out (cap bytes, NUL-terminated) with every absolute
 * file path shortened to its last part ("/srv/data/a.h5ad" -> "a.h5ad"),
 * for error answers that must not show where the server's files are.
 * Returns the length written. */
size_t iv_http_redact_paths(char *out, size_t cap, const char *msg);

/* "OK", "Not Found", ... for a status code. */
const char *iv_http_reason(int status);

#endif
