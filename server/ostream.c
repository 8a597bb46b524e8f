/*
 * The output chain of an answer (see srv_ostream.h): its head, the coding
 * of the bytes the loop makes, the framing, the writes.
 */
#include "srv_conn.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_respond.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"

int origin_allowed(const server_t *s, const char *origin)
{
    if (!origin) return 0;
    for (size_t i = 0; i < s->cfg->n_cors; i++)
        if (!strcmp(s->cfg->cors_origins[i], "*") || !strcmp(s->cfg->cors_origins[i], origin))
            return 1;
    return 0;
}

/* The CORS headers, for an allowed Origin. */
static void put_cors(const conn_t *c, iv_buf_t *b)
{
    const char *origin = c->req ? c->req->hdr[IV_H_ORIGIN] : NULL;
    if (!origin_allowed(c->srv, origin)) return;
    iv_buf_puts(b, "Access-Control-Allow-Origin: ");
    iv_buf_puts(b, origin);
    iv_buf_puts(b, "\r\nVary: Origin\r\nAccess-Control-Expose-Headers: ETag, Retry-After, "
                "X-Ivserve-Dropped-Names, Content-Length, Content-Encoding, WWW-Authenticate\r\n");
}

void os_reset(conn_t *c)
{
    iv_buf_free(&c->out.pend);
    memset(&c->out, 0, sizeof c->out);
    iv_buf_init(&c->out.pend);
}

void os_head(conn_t *c, int status, const char *ctype, int64_t content_length, const char *extra,
             int gz)
{
    ostream_t *o = &c->out;
    os_reset(c);
    iv_buf_t *b = &o->pend;
    iv_http_req_t *r = c->req;
    int keep = r && r->keep_alive && !c->ans_f.close_after && !c->lp->draining;
    o->head_only = r && r->method == HTTP_HEAD;
    o->gz = gz != 0;
    iv_gz_sum_init(&o->gz_sum);
    iv_buf_printf(b, "HTTP/1.1 %d %s\r\nServer: ivserve/%s\r\n", status, iv_http_reason(status),
                  iv_version());
    if (ctype) iv_buf_printf(b, "Content-Type: %s\r\n", ctype);
    if (content_length >= 0) {
        iv_buf_printf(b, "Content-Length: %" PRId64 "\r\n", content_length);
    } else if (r && r->http_minor >= 1) {
        iv_buf_puts(b, "Transfer-Encoding: chunked\r\n");
        o->chunked = 1;
    } else {
        keep = 0;  /* HTTP/1.0 has no chunking: the end of the body is the close */
    }
    if (!keep) c->ans_f.close_after = 1;
    iv_buf_puts(b, keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
    put_cors(c, b);
    if (extra) iv_buf_puts(b, extra);
    if (c->dropped_hdr && status < 300) {
        /* JSON keeps the names unambiguous; control characters are escaped
         * by it; the setup bounded its length. */
        iv_buf_puts(b, "X-Ivserve-Dropped-Names: ");
        iv_buf_puts(b, c->dropped_hdr);
        iv_buf_puts(b, "\r\n");
    }
    iv_buf_puts(b, "\r\n");
    c->status = status;
}

/* Frames len bytes at p into the pending bytes: one chunk when chunked
 * (none for len 0: an empty chunk would end the body). */
static void frame(ostream_t *o, const void *p, size_t len)
{
    if (!len || o->head_only) return;
    if (o->chunked) iv_buf_printf(&o->pend, "%zx\r\n", len);
    iv_buf_append(&o->pend, p, len);
    if (o->chunked) iv_buf_puts(&o->pend, "\r\n");
}

/* A gzip answer's member header, framed, before its first bytes. */
static void gz_begin(ostream_t *o)
{
    if (!o->gz || o->gz_begun) return;
    o->gz_begun = 1;
    iv_buf_t z;
    iv_buf_init(&z);
    iv_gz_header(&z);
    if (z.oom) o->pend.oom = 1;
    frame(o, z.data, z.len);
    iv_buf_free(&z);
}

void os_record(conn_t *c, const void *p, size_t len)
{
    ostream_t *o = &c->out;
    if (!o->gz) {
        frame(o, p, len);
        return;
    }
    /* A stored piece of the member (tens of bytes: a stream's records). */
    gz_begin(o);
    iv_buf_t z;
    iv_buf_init(&z);
    uint32_t crc;
    iv_gz_stored(&z, p, len, &crc);
    iv_gz_sum_add(&o->gz_sum, crc, len);
    if (z.oom) o->pend.oom = 1;
    frame(o, z.data, z.len);
    iv_buf_free(&z);
}

void os_coded(conn_t *c, const void *p, size_t len, uint32_t crc, uint64_t raw_len)
{
    ostream_t *o = &c->out;
    gz_begin(o);
    if (o->gz) iv_gz_sum_add(&o->gz_sum, crc, raw_len);
    frame(o, p, len);
}

/* The pending bytes and pieces as one write (last: the answer's final). */
static int flush(conn_t *c, const wpiece_t *pieces, unsigned n, int chunk, qstream_t *qs, int last)
{
    ostream_t *o = &c->out;
    if (o->pend.oom) {
        for (unsigned i = 0; i < n; i++)
            if (pieces[i].own) free((char *)pieces[i].p);
        os_reset(c);
        conn_close(c);
        return -1;
    }
    size_t hlen;
    char *head = iv_buf_steal(&o->pend, &hlen);
    return conn_writev(c, head, hlen, pieces, n, chunk, qs, last);
}

int os_write(conn_t *c, const wpiece_t *pieces, unsigned n, uint32_t crc, uint64_t raw_len,
             qstream_t *qs)
{
    ostream_t *o = &c->out;
    if (n) gz_begin(o);
    if (o->gz) iv_gz_sum_add(&o->gz_sum, crc, raw_len);
    if (o->head_only) {
        for (unsigned i = 0; i < n; i++)
            if (pieces[i].own) free((char *)pieces[i].p);
        n = 0;
    }
    return flush(c, pieces, n, o->chunked, qs, 0);
}

int os_end(conn_t *c, const wpiece_t *last, qstream_t *qs)
{
    ostream_t *o = &c->out;
    wpiece_t p = {NULL, 0, 0};
    gz_begin(o);  /* a member with nothing yet: its header first */
    if (last && (o->head_only || o->chunked || o->gz)) {
        /* Dropped (HEAD), or copied into the last chunk or before the
         * member's end. */
        frame(o, last->p, last->len);
        if (last->own) free((char *)last->p);
    } else if (last) {
        p = *last;
    }
    if (o->gz && !o->head_only) {
        iv_buf_t z;
        iv_buf_init(&z);
        iv_gz_finish(&z, &o->gz_sum);
        if (z.oom) o->pend.oom = 1;
        frame(o, z.data, z.len);
        iv_buf_free(&z);
    }
    if (o->chunked && !o->head_only) iv_buf_puts(&o->pend, "0\r\n\r\n");
    if (flush(c, &p, 1, 0, qs, 1) != 0) return -1;
    req_done(c);
    return 0;
}
