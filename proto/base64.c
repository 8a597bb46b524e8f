/*
 * Base64 (see base64.h).  A 256-entry table maps characters to 6-bit
 * values; everything not in it is an error, never skipped, so that a
 * truncated or mangled mask cannot silently select the wrong cells.
 */
#include "base64.h"

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

size_t iv_base64_decoded_max(size_t n)
{
    return (n / 4) * 3 + 3;
}

long iv_base64_decode(const char *src, size_t n, uint8_t *dst, size_t cap)
{
    /* Strip padding: at most two '=' and only at the end. */
    size_t pad = 0;
    while (n > 0 && src[n - 1] == '=' && pad < 2) {
        n--;
        pad++;
    }
    if (pad && (n + pad) % 4 != 0) return -1;
    if (n % 4 == 1) return -1;
    size_t out_len = (n / 4) * 3 + (n % 4 ? n % 4 - 1 : 0);
    if (out_len > cap) return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)src[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            dst[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* Leftover bits of the last character must be zero (canonical form). */
    if (acc != 0) return -1;
    return (long)o;
}

size_t iv_base64_encode(const uint8_t *src, size_t n, char *dst)
{
    static const char alpha[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16;
        if (i + 1 < n) v |= (uint32_t)src[i + 1] << 8;
        if (i + 2 < n) v |= src[i + 2];
        dst[o++] = alpha[(v >> 18) & 63];
        dst[o++] = alpha[(v >> 12) & 63];
        dst[o++] = i + 1 < n ? alpha[(v >> 6) & 63] : '=';
        dst[o++] = i + 2 < n ? alpha[v & 63] : '=';
    }
    dst[o] = '\0';
    return o;
}
