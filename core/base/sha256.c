/*
 * SHA-256 (see sha256.h).
 *
 * A direct reading of FIPS 180-4: the functions Ch, Maj, Σ0, Σ1, σ0, σ1 of
 * section 4.1.2, the constants K of 4.2.2, the initial hash value of
 * 5.3.3, padding of 5.1.1 and the computation of 6.2.2.  Words are read
 * and written big-endian byte by byte, so the code does not depend on the
 * machine's byte order.  Speed does not matter here (a token is hashed
 * once per request), clarity does.
 */
#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define BSIG0(x) (rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22))
#define BSIG1(x) (rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25))
#define SSIG0(x) (rotr(x, 7) ^ rotr(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (rotr(x, 17) ^ rotr(x, 19) ^ ((x) >> 10))

/* One 512-bit block (6.2.2 steps 1 to 4). */
static void compress(uint32_t h[8], const unsigned char *m)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)m[4 * t] << 24 | (uint32_t)m[4 * t + 1] << 16 | (uint32_t)m[4 * t + 2] << 8 |
               (uint32_t)m[4 * t + 3];
    for (int t = 16; t < 64; t++) w[t] = SSIG1(w[t - 2]) + w[t - 7] + SSIG0(w[t - 15]) + w[t - 16];
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + BSIG1(e) + CH(e, f, g) + K[t] + w[t];
        uint32_t t2 = BSIG0(a) + MAJ(a, b, c);
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

void iv_sha256_init(iv_sha256_t *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bits = 0;
    s->fill = 0;
}

void iv_sha256_update(iv_sha256_t *s, const void *data, size_t len)
{
    const unsigned char *p = data;
    s->bits += (uint64_t)len * 8;
    while (len > 0) {
        size_t take = 64 - s->fill;
        if (take > len) take = len;
        memcpy(s->blk + s->fill, p, take);
        s->fill += take;
        p += take;
        len -= take;
        if (s->fill == 64) {
            compress(s->h, s->blk);
            s->fill = 0;
        }
    }
}

void iv_sha256_final(iv_sha256_t *s, unsigned char out[IV_SHA256_BYTES])
{
    /* 5.1.1: a 1 bit, zeros up to 448 mod 512 bits, the length in 64 bits. */
    uint64_t bits = s->bits;
    s->blk[s->fill++] = 0x80;
    if (s->fill > 56) {
        memset(s->blk + s->fill, 0, 64 - s->fill);
        compress(s->h, s->blk);
        s->fill = 0;
    }
    memset(s->blk + s->fill, 0, 56 - s->fill);
    for (int i = 0; i < 8; i++) s->blk[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    compress(s->h, s->blk);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
    /* The last block held the end of the message (a token): wipe it. */
    volatile unsigned char *v = (volatile unsigned char *)s;
    for (size_t i = 0; i < sizeof *s; i++) v[i] = 0;
}

void iv_sha256(const void *data, size_t len, unsigned char out[IV_SHA256_BYTES])
{
    iv_sha256_t s;
    iv_sha256_init(&s);
    iv_sha256_update(&s, data, len);
    iv_sha256_final(&s, out);
}

void iv_sha256_hex(const unsigned char d[IV_SHA256_BYTES], char out[2 * IV_SHA256_BYTES + 1])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < IV_SHA256_BYTES; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * IV_SHA256_BYTES] = '\0';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

int iv_sha256_from_hex(const char *hex, size_t len, unsigned char d[IV_SHA256_BYTES])
{
    if (len != 2 * IV_SHA256_BYTES) return -1;
    for (int i = 0; i < IV_SHA256_BYTES; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        d[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}
