/*
 * Bearer tokens, compared in constant time.
 *
 * A token set is stored zero-padded to one length (the longest token the
 * server knows), and a candidate is copied into a zero-padded buffer of
 * that length, so that checking it reads the same bytes whatever its
 * length or the tokens' lengths and contents are: the answer's time says
 * nothing about a token.  Sets are immutable after iv_tokens_init and
 * may be read from any thread; the candidate buffer belongs to the caller.
 */
#ifndef IV_AUTH_H
#define IV_AUTH_H

#include <stddef.h>

typedef struct iv_tokens {
    char *pad;            /* n entries of [size_t length][len bytes, zero-padded] */
    size_t n, len;
} iv_tokens_t;

/* The longest of n tokens (0 when none). */
size_t iv_tokens_max_len(char *const *toks, size_t n);

/* Stores toks[0..n) padded to len bytes (len >= every token's length).
 * Returns 0, or -1 out of memory. */
int iv_tokens_init(iv_tokens_t *t, char *const *toks, size_t n, size_t len);
void iv_tokens_free(iv_tokens_t *t);

/* Copies tok into buf (len bytes: cut there, zero-padded) and returns
 * tok's real length. */
size_t iv_tokens_candidate(unsigned char *buf, size_t len, const char *tok);

/* True when the candidate (from iv_tokens_candidate with t->len, real
 * length clen) equals one of t's tokens.  Every token is compared over all
 * t->len bytes. */
int iv_tokens_match(const iv_tokens_t *t, const unsigned char *cand, size_t clen);

#endif
