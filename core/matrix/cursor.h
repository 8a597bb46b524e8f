/*
 * A caller-owned read cursor over the packed stream: a position, the
 * pinned chunk it is in, and inline varint reads with a slow path that
 * crosses chunk boundaries.  One cursor belongs to one thread; it pins at
 * most one chunk at a time and must be finished with iv_cursor_done().
 */
#ifndef IV_CURSOR_H
#define IV_CURSOR_H

#include <stdint.h>

#include "error.h"
#include "stream.h"
#include "varint.h"

typedef struct iv_cursor {
    iv_stream_t *s;
    uint64_t chunk;               /* pinned chunk, UINT64_MAX when none */
    uint64_t chunk_start;         /* stream offset of base */
    const uint8_t *base, *p, *end;
    uint64_t decompressed;        /* bytes decompressed through this cursor */
} iv_cursor_t;

void iv_cursor_init(iv_cursor_t *c, iv_stream_t *s);
void iv_cursor_done(iv_cursor_t *c);

/* Moves to stream offset off (off == length is allowed: at the end). */
int iv_cursor_seek(iv_cursor_t *c, uint64_t off, iv_err_t *err);
/* Stream offset of the cursor. */
static inline uint64_t iv_cursor_tell(const iv_cursor_t *c)
{
    return c->chunk_start + (uint64_t)(c->p - c->base);
}
/* Skips n varints; IV_ECORRUPT if the stream ends first. */
int iv_cursor_skip(iv_cursor_t *c, uint64_t n, iv_err_t *err);

int iv_cursor_read_slow(iv_cursor_t *c, uint64_t *v, iv_err_t *err);

/* Reads one varint.  The common case (enough bytes left in the chunk) is
 * inline; crossing a chunk, the end of the stream and malformed varints go
 * out of line. */
static inline int iv_cursor_read(iv_cursor_t *c, uint64_t *v, iv_err_t *err)
{
    if (c->end - c->p >= IV_VARINT_MAX) {
        if (*c->p < 0x80) {
            *v = *c->p++;
            return 0;
        }
        size_t n = iv_varint_read_slow(c->p, c->end, v);
        if (n) {
            c->p += n;
            return 0;
        }
    }
    return iv_cursor_read_slow(c, v, err);
}

#endif
