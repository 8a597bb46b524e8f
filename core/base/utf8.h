/*
 * Well-formed UTF-8 (RFC 3629): what the metadata and uns readers accept
 * as text.  Overlong forms, surrogates and code points past U+10FFFF are
 * not well-formed.
 */
#ifndef IV_UTF8_H
#define IV_UTF8_H

#include <stddef.h>

/* Offset of the first byte of s[0, n) that does not start a well-formed
 * sequence within s[0, n), or n when all of it is well-formed. */
size_t iv_utf8_bad_at(const char *s, size_t n);

#endif
