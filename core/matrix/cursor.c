/* Stream cursor (see cursor.h). */
#include "cursor.h"

#include <inttypes.h>

void iv_cursor_init(iv_cursor_t *c, iv_stream_t *s)
{
    c->s = s;
    c->chunk = UINT64_MAX;
    c->chunk_start = 0;
    c->base = c->p = c->end = NULL;
    c->decompressed = 0;
}

void iv_cursor_done(iv_cursor_t *c)
{
    if (c->chunk != UINT64_MAX) iv_stream_release(c->s, c->chunk);
    c->chunk = UINT64_MAX;
    c->base = c->p = c->end = NULL;
}

static int enter_chunk(iv_cursor_t *c, uint64_t k, iv_err_t *err)
{
    if (c->chunk == k) return 0;
    iv_cursor_done(c);
    const uint8_t *data;
    size_t len;
    uint64_t dec = 0;
    IV_TRY(iv_stream_acquire(c->s, k, &data, &len, &dec, err));
    c->decompressed += dec;
    c->chunk = k;
    c->chunk_start = k * iv_stream_chunk_len(c->s);
    c->base = c->p = data;
    c->end = data + len;
    return 0;
}

int iv_cursor_seek(iv_cursor_t *c, uint64_t off, iv_err_t *err)
{
    uint64_t len = iv_stream_length(c->s);
    if (off > len)
        return iv_fail(err, IV_ECORRUPT, "stream offset %" PRIu64 " past the end (%" PRIu64 ")",
                       off, len);
    if (c->chunk != UINT64_MAX && off >= c->chunk_start &&
        off <= c->chunk_start + (uint64_t)(c->end - c->base)) {
        c->p = c->base + (off - c->chunk_start);
        return 0;
    }
    if (off == len) {
        /* At the very end: no chunk to pin; reads will fail cleanly. */
        iv_cursor_done(c);
        c->chunk_start = len;
        return 0;
    }
    uint64_t cl = iv_stream_chunk_len(c->s);
    IV_TRY(enter_chunk(c, off / cl, err));
    c->p = c->base + (off - c->chunk_start);
    return 0;
}

/* Moves to the next chunk when the current one is used up. */
static int advance(iv_cursor_t *c, iv_err_t *err)
{
    /* No pinned chunk means the cursor sits at the end of the stream. */
    uint64_t next = c->chunk == UINT64_MAX ? UINT64_MAX : c->chunk + 1;
    if (next >= iv_stream_n_chunks(c->s))
        return iv_fail(err, IV_ECORRUPT, "%s",
                       "packed stream ends inside a slice (fewer varints than the pointers say)");
    return enter_chunk(c, next, err);
}

int iv_cursor_skip(iv_cursor_t *c, uint64_t n, iv_err_t *err)
{
    while (n > 0) {
        if (c->p == c->end) IV_TRY(advance(c, err));
        uint64_t got;
        size_t used = iv_varint_skip(c->p, (size_t)(c->end - c->p), n, &got);
        c->p += used;
        n -= got;
    }
    return 0;
}

int iv_cursor_read_slow(iv_cursor_t *c, uint64_t *v, iv_err_t *err)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < IV_VARINT_MAX; i++) {
        if (c->p == c->end) IV_TRY(advance(c, err));
        uint64_t b = *c->p++;
        if (i == 9 && b > 1)
            return iv_fail(err, IV_ECORRUPT, "varint at stream offset %" PRIu64 " exceeds 64 bits",
                           iv_cursor_tell(c) - 10);
        x |= (b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *v = x;
            return 0;
        }
    }
    return iv_fail(err, IV_ECORRUPT, "%s", "varint longer than 10 bytes");
}
