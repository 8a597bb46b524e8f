/*
 * The output chain of an answer (ostream.c).  Every answer's bytes go
 * through it, in body order, on the loop thread of its connection:
 *
 *     encode  ->  code  ->  frame  ->  write
 *
 * - encode: proto/encode.c's table of encoders by media type (a
 *   document; a stream's header record, blocks and trailer record).
 * - code: the answer's content coding.  A gzip stream is one member
 *   (proto/gzip_stream.c): its blocks are deflated on a worker
 *   (stream_jobs.c) and arrive here coded, with their CRC; the records the
 *   loop makes itself are coded here as stored blocks of the same member,
 *   so that the loop never runs a compressor.  A document arrives coded
 *   whole (api/viewer.c) and passes as it is.
 * - frame: one HTTP chunk a write (the pending records each their own)
 *   when the answer is chunked; as it is with a Content-Length, or on
 *   HTTP/1.0, where the close ends the body.
 * - write: conn_writev (respond.c), which counts the bytes against the
 *   write budget and credits a stream's blocks to it.
 *
 * An answer: os_head; then os_record and os_coded (bytes kept pending,
 * to go out with the next write) and os_write (the pending bytes and
 * pieces in one write), in body order; then os_end (the member's end,
 * the last chunk, the final write, and the request's end).  A HEAD request's answer is its
 * head: the body's bytes are dropped here.  The writes return 0, or -1
 * when the connection was closed instead (owned pieces are freed).
 *
 * The state is the connection's (conn_t.out): one answer at a time.
 * Nothing is left pending between loop callbacks.
 */
#ifndef IV_SRV_OSTREAM_H
#define IV_SRV_OSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "gzip_stream.h"
#include "srv_common.h"
#include "srv_respond.h"

typedef struct ostream {
    iv_buf_t pend;        /* head and coded, framed bytes for the next write */
    iv_gz_sum_t gz_sum;   /* a gzip answer's member so far, in body order */
    bool gz;              /* the body is one gzip member coded here and by workers */
    bool gz_begun;        /* its header is out */
    bool chunked;         /* the body goes as HTTP chunks */
    bool head_only;       /* a HEAD request: no body bytes */
} ostream_t;

/* Starts c's answer with its status line and headers (pending).
 * content_length < 0: a body of unknown length, chunked on HTTP/1.1;
 * gz: the body is one gzip member (extra names the coding). */
void os_head(conn_t *c, int status, const char *ctype, int64_t content_length, const char *extra,
             int gz);
/* Body bytes the loop made: coded, framed and kept pending. */
void os_record(conn_t *c, const void *p, size_t len);
/* Body bytes a worker coded (crc and raw_len: the CRC-32 and length of
 * what they decode to, for a gzip answer): framed and kept pending. */
void os_coded(conn_t *c, const void *p, size_t len, uint32_t crc, uint64_t raw_len);
/* The pending bytes, then pieces a worker coded (one chunk; crc and
 * raw_len as os_coded), in one write; qs: the stream credited. */
int os_write(conn_t *c, const wpiece_t *pieces, unsigned n, uint32_t crc, uint64_t raw_len,
             qstream_t *qs);
/* Ends the body (a gzip member's end, the last chunk) and writes the
 * pending bytes and the last piece (may be NULL: bytes as they are, not
 * coded here; a chunked or gzip answer's is copied into the pending
 * bytes, before the end) as the answer's final write; then the request
 * is done (req_done), unless the connection was closed instead (-1). */
int os_end(conn_t *c, const wpiece_t *last, qstream_t *qs);
/* Forgets an answer's chain (anything pending is dropped). */
void os_reset(conn_t *c);
/* Whether Origin origin may read answers (the configured CORS origins). */
int origin_allowed(const server_t *s, const char *origin);

#endif
