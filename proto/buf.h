/*
 * Growable byte buffer used by the encoders and the HTTP layer.
 *
 * A buffer owns its bytes.  Appends grow it geometrically; an append that
 * fails to allocate sets a sticky `oom` flag instead of returning an error
 * on every call, so that an encoder can append many pieces and check once.
 * Not thread-safe: one owner at a time (a worker builds it, then hands the
 * whole buffer to the loop).
 */
#ifndef IV_BUF_H
#define IV_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct iv_buf {
    char *data;
    size_t len, cap;
    int oom;            /* set when an allocation failed; contents are then incomplete */
} iv_buf_t;

void iv_buf_init(iv_buf_t *b);
void iv_buf_free(iv_buf_t *b);
/* Ensures room for `extra` more bytes; 0 or -1 (and oom set). */
int iv_buf_reserve(iv_buf_t *b, size_t extra);
void iv_buf_append(iv_buf_t *b, const void *p, size_t n);
void iv_buf_puts(iv_buf_t *b, const char *s);
void iv_buf_printf(iv_buf_t *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Little-endian fixed-width integers. */
void iv_buf_u32le(iv_buf_t *b, uint32_t v);
void iv_buf_i64le(iv_buf_t *b, int64_t v);
/* Appends s as a JSON string literal, quotes included, escaping what JSON
 * requires; bytes that are not well-formed UTF-8 become U+FFFD (written
 * \ufffd), so the result is valid JSON whatever s holds. */
void iv_buf_json_str(iv_buf_t *b, const char *s);
/* Takes the bytes out of b (caller frees them); b is left empty. */
char *iv_buf_steal(iv_buf_t *b, size_t *len);

#endif
