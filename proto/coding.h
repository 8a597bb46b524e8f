/*
 * The content coding of an answer: the one place that reads a request's
 * Accept-Encoding and picks identity, gzip or br for what goes back.
 *
 * Two kinds of answer choose differently, by what each can be sent in:
 *
 *   IV_ANSWER_STREAM    a query answer written block by block (binary,
 *                       NDJSON, JSON): gzip or identity.  br is never
 *                       offered: the outputs of separate Brotli encoders
 *                       do not concatenate, and one encoder would compress
 *                       a whole answer on one thread (server/README-server.md,
 *                       "Compression of query answers").
 *   IV_ANSWER_DOCUMENT  a body built whole before it is sent (the viewer
 *                       routes): br, gzip or identity.
 *
 * The choice is made before any work, from the header alone, so that a
 * document's ETag (which names the coding) is known before its body; a
 * document is then encoded whole with iv_coding_encode (a stream's
 * blocks go through gzip_stream.h piece by piece).  The choice is a pure
 * function of its arguments; everything here may run on any thread.
 */
#ifndef IV_CODING_H
#define IV_CODING_H

#include "buf.h"

typedef enum iv_coding {
    IV_CODING_IDENTITY = 0,
    IV_CODING_GZIP = 1,
    IV_CODING_BR = 2,
} iv_coding_t;

typedef enum iv_answer_kind {
    IV_ANSWER_STREAM,
    IV_ANSWER_DOCUMENT,
} iv_answer_kind_t;

/*
 * The q value an Accept-Encoding header h (NULL: absent) gives a content
 * coding ("gzip", "br", "identity"; compared ignoring case): the last
 * entry naming it, when that q is a number >= 0; else the last "*"
 * entry's, whatever it is; else -1.  An entry without a q parameter has
 * q 1; a q value is read as strtod reads it, so a malformed one is
 * whatever number its first characters make (0 for none).
 */
double iv_coding_q(const char *h, const char *coding);

/*
 * The coding of an answer of the given kind to a request whose
 * Accept-Encoding is h (NULL: absent), with q values as iv_coding_q
 * gives them.  gzip_level <= 0 turns gzip off: an answer that would be
 * gzip goes as identity (the choice of br does not change).
 *
 *   br    (documents) when br's q is above 0 and not below gzip's: br
 *         is smaller at a similar cost, so it wins a tie;
 *   gzip  when gzip's q is above 0, or (streams) when gzip has no q of
 *         0 or more (h neither names it nor has "*") and h refuses
 *         identity (its q is exactly 0: "identity;q=0");
 *   identity otherwise, and always when h is absent.
 *
 * A document is not gzipped for a refusal of identity alone: it may go
 * out as identity whatever is chosen (a small or incompressible body is
 * sent as it is), so that refusal could not be honoured every time.
 */
iv_coding_t iv_coding_pick(const char *h, iv_answer_kind_t kind, int gzip_level);

/* The Content-Encoding token of c: "gzip", "br", or "identity". */
const char *iv_coding_name(iv_coding_t c);

/*
 * Encodes a whole document body in place with c: gzip at gzip_level as
 * one member of pieces compressed in parallel on pool (iv_gz_member;
 * NULL: all on the caller, which may be a pool worker), br at quality 1.
 * Returns 1 when body now holds the encoded bytes; 0, body untouched,
 * for identity, when the encoded form would not be smaller, or when
 * memory or the compressor failed (the body then goes out as it is).
 */
struct iv_pool;
int iv_coding_encode(iv_buf_t *body, iv_coding_t c, int gzip_level, struct iv_pool *pool);

#endif /* IV_CODING_H */
