/*
 * Request parsing (see http.h).
 *
 * llhttp calls back with pieces of the URL, header names and values as
 * they arrive, possibly split across reads; the pieces are collected in
 * small buffers and interpreted when llhttp says a piece is complete.
 * Pausing in on_message_complete is what makes pipelining safe: the
 * parser never runs ahead of the server's responses.
 */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Bytes of a header line besides its name and value (": " and CRLF), and
 * of the request line besides its target (method, version, spaces, CRLF,
 * counted at the shortest), so that the limit is on what was sent. */
#define HEADER_LINE_EXTRA 4
#define REQUEST_LINE_EXTRA 14

static const char *const hdr_names[IV_H_COUNT] = {
    "accept", "content-type", "authorization", "origin", "if-none-match", "expect",
    "access-control-request-method", "accept-encoding", "x-forwarded-for", "content-encoding",
};

void iv_http_req_free(iv_http_req_t *r)
{
    if (!r) return;
    free(r->target);
    free(r->path);
    free(r->query);
    for (int i = 0; i < IV_H_COUNT; i++) free(r->hdr[i]);
    iv_buf_free(&r->body);
    memset(r, 0, sizeof *r);
}

static iv_http_in_t *in_of(llhttp_t *p)
{
    return (iv_http_in_t *)p->data;
}

static int fail(iv_http_in_t *in, int status, const char *msg)
{
    in->err_status = status;
    snprintf(in->err_msg, sizeof in->err_msg, "%s", msg);
    return HPE_USER;
}

static int count_header(iv_http_in_t *in, size_t n)
{
    in->header_bytes += n;
    if (in->header_bytes > in->max_header)
        return fail(in, 431, "request line and headers exceed the configured limit");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    iv_http_in_t *in = in_of(p);
    in->cur = calloc(1, sizeof *in->cur);
    if (!in->cur) return fail(in, 503, "out of memory");
    in->in_message = 1;
    in->headers_done = 0;
    in->header_bytes = REQUEST_LINE_EXTRA;
    in->n_host = 0;
    in->url.len = in->field.len = in->value.len = 0;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    iv_http_in_t *in = in_of(p);
    if (count_header(in, n)) return HPE_USER;
    iv_buf_append(&in->url, at, n);
    return in->url.oom ? fail(in, 503, "out of memory") : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    iv_http_in_t *in = in_of(p);
    if (count_header(in, n)) return HPE_USER;
    iv_buf_append(&in->field, at, n);
    return in->field.oom ? fail(in, 503, "out of memory") : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    iv_http_in_t *in = in_of(p);
    if (count_header(in, n)) return HPE_USER;
    /* llhttp accepts an obsolete line folding (CRLF, then a space), even
     * in strict mode, and passes the next line as a second piece of the
     * same value.  A value split by the end of the input ends where the
     * input ends; one that ended earlier and goes on is folded.  RFC 9112
     * 5.2 lets a server reject it, and a proxy may read it otherwise. */
    if (in->value_cut) return fail(in, 400, "folded header lines are not accepted");
    in->value_cut = at + n != in->feed_end;
    iv_buf_append(&in->value, at, n);
    return in->value.oom ? fail(in, 503, "out of memory") : 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    iv_http_in_t *in = in_of(p);
    /* Thousands of tiny headers cost more than their names and values. */
    if (count_header(in, HEADER_LINE_EXTRA)) return HPE_USER;
    in->value_cut = 0;
    if (in->field.len == 4 && strncasecmp(in->field.data, "host", 4) == 0) in->n_host++;
    for (int i = 0; i < IV_H_COUNT; i++) {
        if (in->field.len == strlen(hdr_names[i]) &&
            strncasecmp(in->field.data, hdr_names[i], in->field.len) == 0) {
            char *old = in->cur->hdr[i];
            size_t ol = old ? strlen(old) : 0;
            char *s = malloc(ol + in->value.len + 3);
            if (!s) return fail(in, 503, "out of memory");
            size_t o = 0;
            if (old) {
                memcpy(s, old, ol);
                memcpy(s + ol, ", ", 2);
                o = ol + 2;
            }
            if (in->value.len) memcpy(s + o, in->value.data, in->value.len);
            s[o + in->value.len] = '\0';
            free(old);
            in->cur->hdr[i] = s;
            break;
        }
    }
    in->field.len = in->value.len = 0;
    return 0;
}

/*
 * Where the path of a request target starts: 0 for the usual origin form
 * ("/v1/datasets?x"); past "http://authority" for the absolute form that
 * RFC 9112 3.2.2 has servers accept ("http://host:8080/v1/datasets?x").
 * Routing reads only the path and the query; the authority would stand
 * for Host, which no route reads.
 */
static size_t origin_start(const char *u, size_t n)
{
    size_t s = n >= 7 && !strncasecmp(u, "http://", 7)    ? 7
               : n >= 8 && !strncasecmp(u, "https://", 8) ? 8
                                                          : 0;
    if (!s) return 0;
    while (s < n && u[s] != '/' && u[s] != '?') s++;
    return s;
}

/* The version and framing checks a request's headers must pass. */
static int check_framing(iv_http_in_t *in, const llhttp_t *p)
{
    if (p->http_major != 1) return fail(in, 505, "only HTTP/1.x is supported");
    /* RFC 9112 3.2: an HTTP/1.1 request has exactly one Host header.  A
     * proxy in front may route by it; accepting none or two invites the
     * two to disagree on what the request is. */
    if (p->http_minor >= 1 && in->n_host != 1)
        return fail(in, 400, in->n_host ? "more than one Host header" : "HTTP/1.1 request without Host");
    /* RFC 9112 6.1: an HTTP/1.0 recipient does not know Transfer-Encoding
     * and would find the body's end elsewhere than this parser does; such
     * framing is faulty, and the connection closes after the 400. */
    if (p->http_minor == 0 && (p->flags & F_TRANSFER_ENCODING))
        return fail(in, 400, "Transfer-Encoding in an HTTP/1.0 request");
    return 0;
}

/* The request target, its path and its query (owned copies). */
static int split_target(iv_http_in_t *in, iv_http_req_t *r)
{
    const char *u = in->url.data ? in->url.data : "";
    size_t ulen = in->url.len, skip = origin_start(u, ulen);
    u += skip;
    ulen -= skip;
    char *q = ulen ? memchr(u, '?', ulen) : NULL;
    size_t plen = q ? (size_t)(q - u) : ulen;
    r->target = strndup(in->url.data ? in->url.data : "", in->url.len);
    /* An absolute form without a path ("http://host?x") asks for "/". */
    r->path = skip && plen == 0 ? strdup("/") : strndup(u, plen);
    r->query = q ? strndup(q + 1, ulen - plen - 1) : strdup("");
    if (!r->target || !r->path || !r->query) return fail(in, 503, "out of memory");
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    iv_http_in_t *in = in_of(p);
    iv_http_req_t *r = in->cur;
    r->method = p->method;
    r->http_major = p->http_major;
    r->http_minor = p->http_minor;
    int rc = check_framing(in, p);
    if (rc == 0) rc = split_target(in, r);
    if (rc != 0) return rc;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > in->max_body)
        return fail(in, 413, "request body exceeds the configured limit");
    in->headers_done = 1;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    iv_http_in_t *in = in_of(p);
    if (in->cur->body.len + n > in->max_body)
        return fail(in, 413, "request body exceeds the configured limit");
    iv_buf_append(&in->cur->body, at, n);
    return in->cur->body.oom ? fail(in, 503, "out of memory") : 0;
}

static int on_message_complete(llhttp_t *p)
{
    iv_http_in_t *in = in_of(p);
    in->cur->keep_alive = llhttp_should_keep_alive(p);
    in->complete = 1;
    in->in_message = 0;
    return HPE_PAUSED;
}

void iv_http_in_init(iv_http_in_t *in, size_t max_header, size_t max_body)
{
    memset(in, 0, sizeof *in);
    llhttp_settings_init(&in->settings);
    in->settings.on_message_begin = on_message_begin;
    in->settings.on_url = on_url;
    in->settings.on_header_field = on_header_field;
    in->settings.on_header_value = on_header_value;
    in->settings.on_header_value_complete = on_header_value_complete;
    in->settings.on_headers_complete = on_headers_complete;
    in->settings.on_body = on_body;
    in->settings.on_message_complete = on_message_complete;
    llhttp_init(&in->parser, HTTP_REQUEST, &in->settings);
    in->parser.data = in;
    in->max_header = max_header;
    in->max_body = max_body;
}

void iv_http_in_free(iv_http_in_t *in)
{
    if (in->cur) {
        iv_http_req_free(in->cur);
        free(in->cur);
        in->cur = NULL;
    }
    iv_buf_free(&in->url);
    iv_buf_free(&in->field);
    iv_buf_free(&in->value);
}

int iv_http_in_feed(iv_http_in_t *in, const char *data, size_t len, size_t *consumed,
                    iv_http_req_t **req)
{
    *consumed = 0;
    *req = NULL;
    if (in->err_status) return -1;
    if (llhttp_get_errno(&in->parser) == HPE_PAUSED) llhttp_resume(&in->parser);
    if (len == 0) return 0;
    in->feed_end = data + len;
    llhttp_errno_t e = llhttp_execute(&in->parser, data, len);
    if (e == HPE_OK) {
        *consumed = len;
        return 0;
    }
    if (e == HPE_PAUSED && in->complete) {
        const char *pos = llhttp_get_error_pos(&in->parser);
        *consumed = pos && pos >= data && pos <= data + len ? (size_t)(pos - data) : len;
        in->complete = 0;
        *req = in->cur;
        in->cur = NULL;
        return 1;
    }
    if (!in->err_status) {
        in->err_status = 400;
        snprintf(in->err_msg, sizeof in->err_msg, "malformed HTTP request: %s",
                 llhttp_get_error_reason(&in->parser) ? llhttp_get_error_reason(&in->parser)
                                                      : llhttp_errno_name(e));
    }
    return -1;
}

int iv_http_in_active(const iv_http_in_t *in)
{
    return in->in_message;
}

int iv_http_in_headers_done(const iv_http_in_t *in)
{
    return in->in_message && in->headers_done;
}

const iv_http_req_t *iv_http_in_current(const iv_http_in_t *in)
{
    return in->cur;
}

/* The end of a path starting at p: a space, a quote, a bracket, a comma
 * or ": " ends it. */
static const char *path_end(const char *p)
{
    const char *e = p;
    while (*e && !strchr(" \t'\")],", *e) && !(e[0] == ':' && (e[1] == ' ' || !e[1]))) e++;
    return e;
}

/* Where the last part of the path [p, e) starts. */
static const char *path_base(const char *p, const char *e)
{
    const char *base = p;
    for (const char *q = p; q < e; q++)
        if (*q == '/') base = q + 1;
    return base;
}

size_t iv_http_redact_paths(char *out, size_t cap, const char *msg)
{
    size_t o = 0;
    if (!cap) return 0;
    for (const char *p = msg; *p;) {
        if (*p == '/' && (p == msg || strchr(" \t'\"(=:[,", p[-1]))) {
            const char *e = path_end(p), *base = path_base(p, e);
            if (base > p + 1 && base < e) {
                /* Folders before the last part: only the last part stays. */
                for (const char *q = base; q < e && o + 1 < cap; q++) out[o++] = *q;
                p = e;
                continue;
            }
        }
        if (o + 1 < cap) out[o++] = *p;
        p++;
    }
    out[o] = '\0';
    return o;
}

const char *iv_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
