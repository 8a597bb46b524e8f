/*
 * libFuzzer target: the LZF decoder (core/codec/lzf.c).
 *
 * Two checks a run:
 *   1. The input's bytes after the first two, decoded to the size those
 *      two give (buffers of exactly their sizes, so any read or write out
 *      of bounds is caught): any result is fine but a crash, and the size
 *      measure must accept exactly the streams that decode to that size.
 *   2. Round trip: the same bytes compressed by the small reference
 *      compressor below and decoded must give them back, byte for byte.
 *
 * The reference compressor (written here from the format, for this test
 * only) is greedy: at each position it looks up the last position whose
 * next 3 bytes hashed alike, takes the match if it is within the 8192
 * bytes a reference reaches, extends it up to 264 bytes, and otherwise
 * adds the byte to a literal run of at most 32.  The first input byte's
 * low bit also makes it prefer distance 1 (runs), so overlapping copies
 * are produced often.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_DIST 8192
#define MAX_MATCH 264
#define HASH_BITS 12

static size_t flush_literals(const uint8_t *lit, size_t n, uint8_t *out, size_t o)
{
    while (n > 0) {
        size_t k = n > 32 ? 32 : n;
        out[o++] = (uint8_t)(k - 1);
        memcpy(out + o, lit, k);
        o += k;
        lit += k;
        n -= k;
    }
    return o;
}

/* Compresses n bytes into out (capacity n + n / 32 + 2 at least). */
static size_t ref_compress(const uint8_t *in, size_t n, uint8_t *out, int prefer_runs)
{
    size_t table[1u << HASH_BITS];
    for (size_t i = 0; i < (1u << HASH_BITS); i++) table[i] = SIZE_MAX;
    size_t o = 0, lit_start = 0, i = 0;
    while (i < n) {
        size_t best_len = 0, best_dist = 0;
        if (i + 3 <= n) {
            unsigned h = ((unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2]) *
                             2654435761u >> (32 - HASH_BITS);
            size_t cand[2] = {table[h], prefer_runs && i > 0 ? i - 1 : SIZE_MAX};
            table[h] = i;
            for (int c = 0; c < 2; c++) {
                size_t p = cand[c];
                if (p == SIZE_MAX || p >= i || i - p > MAX_DIST) continue;
                size_t len = 0;
                while (len < MAX_MATCH && i + len < n && in[p + len] == in[i + len]) len++;
                if (len >= 3 && len > best_len) {
                    best_len = len;
                    best_dist = i - p;
                }
            }
        }
        if (best_len < 3) {
            i++;
            continue;
        }
        o = flush_literals(in + lit_start, i - lit_start, out, o);
        size_t len = best_len - 2, dist = best_dist - 1;
        if (len < 7) {
            out[o++] = (uint8_t)(len << 5 | dist >> 8);
        } else {
            out[o++] = (uint8_t)(7 << 5 | dist >> 8);
            out[o++] = (uint8_t)(len - 7);
        }
        out[o++] = (uint8_t)(dist & 0xff);
        i += best_len;
        lit_start = i;
    }
    return flush_literals(in + lit_start, n - lit_start, out, o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t want = ((size_t)data[0] << 8 | data[1]) % 16384;
    int prefer_runs = data[0] & 1;
    data += 2;
    size -= 2;

    /* 1. Arbitrary bytes decoded to an arbitrary size. */
    uint8_t *in = malloc(size ? size : 1);
    if (size) memcpy(in, data, size);
    uint8_t *out = malloc(want ? want : 1);
    iv_err_t e = {0};
    int rc = iv_lzf_decode(in, size, out, want, &e);
    size_t measured = 0;
    iv_err_t e2 = {0};
    int mrc = iv_lzf_decoded_size(in, size, want, &measured, &e2);
    if ((rc == 0) != (mrc == 0 && measured == want)) abort();
    free(out);

    /* 2. Round trip through the reference compressor. */
    uint8_t *packed = malloc(size + size / 32 + 2);
    size_t plen = ref_compress(in, size, packed, prefer_runs);
    if (plen > size + size / 32 + 2) abort();
    uint8_t *back = malloc(size ? size : 1);
    iv_err_clear(&e);
    if (iv_lzf_decode(packed, plen, back, size, &e) != 0) abort();
    if (size && memcmp(back, in, size) != 0) abort();
    free(back);
    free(packed);
    free(in);
    return 0;
}
