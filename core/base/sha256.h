/*
 * SHA-256 (FIPS 180-4, section 6.2), for bearer tokens: the server keeps
 * only the hashes of its tokens, so a tokens file or a memory dump holds
 * no secret, and every candidate is compared as 32 bytes whatever its
 * length.
 *
 * Written from the standard rather than taken from a crypto library so
 * that the server has no such dependency for one hash; the unit test
 * checks it against the standard's own examples.  Contexts belong to the
 * caller; the functions keep no state of their own and are thread-safe.
 */
#ifndef IV_SHA256_H
#define IV_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define IV_SHA256_BYTES 32

typedef struct iv_sha256 {
    uint32_t h[8];        /* the hash value H(i) */
    uint64_t bits;        /* message length so far, in bits (mod 2^64) */
    unsigned char blk[64];
    size_t fill;          /* bytes of blk in use */
} iv_sha256_t;

void iv_sha256_init(iv_sha256_t *s);
void iv_sha256_update(iv_sha256_t *s, const void *data, size_t len);
/* Pads, writes the 32-byte digest and wipes the context. */
void iv_sha256_final(iv_sha256_t *s, unsigned char out[IV_SHA256_BYTES]);
/* The three steps for one buffer. */
void iv_sha256(const void *data, size_t len, unsigned char out[IV_SHA256_BYTES]);

/* out (65 bytes) = the digest in lower-case hex. */
void iv_sha256_hex(const unsigned char d[IV_SHA256_BYTES], char out[2 * IV_SHA256_BYTES + 1]);
/* Parses exactly 64 hex digits (either case) into d; 0, or -1. */
int iv_sha256_from_hex(const char *hex, size_t len, unsigned char d[IV_SHA256_BYTES]);

#endif
