/*
 * Constant-time bearer tokens (see auth.h).
 *
 * The comparison folds byte differences and the length difference into
 * one word without a branch, and never stops early: a mismatch in the
 * first byte costs as long as a mismatch in the last, and a short token
 * as long as a long one.
 */
#include "auth.h"

#include <stdlib.h>
#include <string.h>

size_t iv_tokens_max_len(char *const *toks, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(toks[i]);
        if (l > m) m = l;
    }
    return m;
}

int iv_tokens_init(iv_tokens_t *t, char *const *toks, size_t n, size_t len)
{
    size_t stride = sizeof(size_t) + len;
    memset(t, 0, sizeof *t);
    t->pad = calloc(n ? n : 1, stride);
    if (!t->pad) return -1;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(toks[i]);
        if (l > len) l = len;  /* callers pass len >= every length; stay in bounds regardless */
        memcpy(t->pad + i * stride, &l, sizeof l);
        memcpy(t->pad + i * stride + sizeof l, toks[i], l);
    }
    t->n = n;
    t->len = len;
    return 0;
}

void iv_tokens_free(iv_tokens_t *t)
{
    free(t->pad);
    memset(t, 0, sizeof *t);
}

size_t iv_tokens_candidate(unsigned char *buf, size_t len, const char *tok)
{
    size_t clen = strlen(tok);
    memset(buf, 0, len);
    memcpy(buf, tok, clen < len ? clen : len);
    return clen;
}

int iv_tokens_match(const iv_tokens_t *t, const unsigned char *cand, size_t clen)
{
    size_t stride = sizeof(size_t) + t->len;
    unsigned any = 0;
    for (size_t i = 0; i < t->n; i++) {
        size_t l;
        memcpy(&l, t->pad + i * stride, sizeof l);
        const unsigned char *p = (const unsigned char *)t->pad + i * stride + sizeof l;
        unsigned diff = 0;
        for (size_t k = 0; k < t->len; k++) diff |= (unsigned)(p[k] ^ cand[k]);
        diff |= (unsigned)(l != clen);
        any |= (unsigned)(diff == 0);
    }
    return any != 0;
}
