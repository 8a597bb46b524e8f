/*
 * Growable byte buffer (see buf.h).  The sticky oom flag keeps encoder code
 * linear: append everything, check once at the end.
 */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void iv_buf_init(iv_buf_t *b)
{
    memset(b, 0, sizeof *b);
}

void iv_buf_free(iv_buf_t *b)
{
    free(b->data);
    iv_buf_init(b);
}

int iv_buf_reserve(iv_buf_t *b, size_t extra)
{
    if (b->oom) return -1;
    if (extra <= b->cap - b->len) return 0;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = 1;
        return -1;
    }
    size_t want = b->len + extra;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void iv_buf_append(iv_buf_t *b, const void *p, size_t n)
{
    if (n == 0 || iv_buf_reserve(b, n) != 0) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void iv_buf_puts(iv_buf_t *b, const char *s)
{
    iv_buf_append(b, s, strlen(s));
}

void iv_buf_printf(iv_buf_t *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        iv_buf_append(b, small, (size_t)n);
        return;
    }
    if (iv_buf_reserve(b, (size_t)n + 1) != 0) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void iv_buf_u32le(iv_buf_t *b, uint32_t v)
{
    unsigned char s[4];
    for (int i = 0; i < 4; i++) s[i] = (unsigned char)(v >> (8 * i));
    iv_buf_append(b, s, 4);
}

void iv_buf_i64le(iv_buf_t *b, int64_t v)
{
    uint64_t u = (uint64_t)v;
    unsigned char s[8];
    for (int i = 0; i < 8; i++) s[i] = (unsigned char)(u >> (8 * i));
    iv_buf_append(b, s, 8);
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0 when it is not one.
 * p is NUL-terminated, so reading a continuation byte stops at the end. */
static size_t utf8_len(const unsigned char *p)
{
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80 ? 4
                                                                                          : 0;
    }
    return 0;
}

/* Text can come from anywhere (a request's bytes echoed in an error, a
 * file's labels cut short by a "%.40s"), and JSON must be UTF-8: a byte
 * that does not start a well-formed sequence becomes U+FFFD, so the
 * document stays valid JSON.  Runs of plain bytes are appended at once. */
void iv_buf_json_str(iv_buf_t *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    iv_buf_append(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s, *run = p;
    while (*p) {
        unsigned char c = *p;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            p++;
            continue;
        }
        size_t n = c >= 0x80 ? utf8_len(p) : 0;
        if (n) {
            p += n;
            continue;
        }
        iv_buf_append(b, run, (size_t)(p - run));
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            iv_buf_append(b, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            iv_buf_append(b, e, 6);
        } else {
            iv_buf_append(b, "\\ufffd", 6);
        }
        run = ++p;
    }
    iv_buf_append(b, run, (size_t)(p - run));
    iv_buf_append(b, "\"", 1);
}

char *iv_buf_steal(iv_buf_t *b, size_t *len)
{
    char *p = b->data;
    if (len) *len = b->len;
    iv_buf_init(b);
    return p;
}
