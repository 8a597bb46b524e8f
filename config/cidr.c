/*
 * Address ranges (see cidr.h), parsed with inet_pton so that every form
 * the C library accepts for an address is accepted here, and nothing
 * else: no host names (a proxy list that needs DNS would change meaning
 * behind the operator's back).
 */
#include "cidr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int iv_cidr_addr(const char *s, unsigned char out[16])
{
    struct in_addr a4;
    if (inet_pton(AF_INET, s, &a4) == 1) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return 0;
    }
    return inet_pton(AF_INET6, s, out) == 1 ? 0 : -1;
}

/* The prefix length after the '/': digits only, at most max. */
static int prefix_len(const char *p, unsigned max, unsigned *bits)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || *end || p[0] == '-' || p[0] == '+' || v < 0 || (unsigned long)v > max)
        return -1;
    *bits = (unsigned)v;
    return 0;
}

int iv_cidr_parse(const char *s, iv_cidr_t *out)
{
    char host[64];
    const char *slash = strchr(s, '/');
    size_t hl = slash ? (size_t)(slash - s) : strlen(s);
    if (hl == 0 || hl >= sizeof host) return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    memset(out, 0, sizeof *out);
    if (iv_cidr_addr(host, out->addr) != 0) return -1;
    int v4 = strchr(host, ':') == NULL;
    unsigned max = v4 ? 32 : 128, bits = max;
    if (slash && prefix_len(slash + 1, max, &bits) != 0) return -1;
    out->bits = v4 ? bits + 96 : bits;
    for (unsigned i = out->bits; i < 128; i++) out->addr[i / 8] &= (unsigned char)~(0x80u >> (i % 8));
    return 0;
}

int iv_cidr_match(const iv_cidr_t *r, const unsigned char addr[16])
{
    unsigned full = r->bits / 8, rest = r->bits % 8;
    if (memcmp(r->addr, addr, full) != 0) return 0;
    if (rest == 0) return 1;
    unsigned char mask = (unsigned char)(0xff00u >> rest);
    return (r->addr[full] & mask) == (addr[full] & mask);
}
