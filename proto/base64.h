/*
 * Base64 decoding for selection masks.
 *
 * Accepts the standard alphabet and the URL-safe one ('-' and '_'), with or
 * without '=' padding, so that masks survive being pasted into a query
 * string.  Input is untrusted: every character is checked and the output
 * length is computed before anything is written.  Pure function, any thread.
 */
#ifndef IV_BASE64_H
#define IV_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Upper bound of the decoded length of n input characters. */
size_t iv_base64_decoded_max(size_t n);

/* Decodes src[0..n) into dst (capacity cap).  Returns the decoded length,
 * or -1 on a bad character, bad padding, a dangling single character, or
 * too small a destination. */
long iv_base64_decode(const char *src, size_t n, uint8_t *dst, size_t cap);

/* Encodes n bytes with padding into dst (capacity >= 4*ceil(n/3)+1, NUL
 * terminated); returns the length.  Used by tests and the client docs. */
size_t iv_base64_encode(const uint8_t *src, size_t n, char *dst);

#endif
