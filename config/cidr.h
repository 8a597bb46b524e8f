/*
 * Address ranges ("10.0.0.0/8", "::1", "fd00::/8") for trusted_proxies:
 * the peers whose X-Forwarded-For header the access log believes.
 *
 * IPv4 is kept as an IPv4-mapped IPv6 address (::ffff:a.b.c.d, the prefix
 * length plus 96), so one 16-byte comparison serves both families and a
 * dual-stack socket's mapped peers match IPv4 ranges.  Plain data; any
 * thread.
 */
#ifndef IV_CIDR_H
#define IV_CIDR_H

typedef struct iv_cidr {
    unsigned char addr[16];
    unsigned bits;        /* prefix length, 0..128 */
} iv_cidr_t;

/* "ADDR" or "ADDR/LEN"; bits past the prefix are cleared.  0, or -1. */
int iv_cidr_parse(const char *s, iv_cidr_t *out);
/* Parses an address alone ("1.2.3.4", "::1") into 16 bytes; 0, or -1. */
int iv_cidr_addr(const char *s, unsigned char out[16]);
/* True when the 16-byte address is inside the range. */
int iv_cidr_match(const iv_cidr_t *r, const unsigned char addr[16]);

#endif
