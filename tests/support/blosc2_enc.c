/*
 * TEST-ONLY Blosc2 encoder (see blosc2_enc.h).  Simple and slow on
 * purpose: the forward filters are written element by element from the
 * format description so that they share no code with the decoder.
 */
#include "blosc2_enc.h"

#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <lz4hc.h>
#include <zlib.h>
#include <zstd.h>

static void wr_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void wr_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void wr_be32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * (3 - i)));
}

static void wr_be64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * (7 - i)));
}

void iv_b2e_shuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts)
{
    size_t ne = ts ? n / ts : 0;
    for (size_t i = 0; i < ne; i++)
        for (size_t j = 0; j < ts; j++) dst[j * ne + i] = src[i * ts + j];
    memcpy(dst + ne * ts, src + ne * ts, n - ne * ts);
}

/* Plane (j*8 + k), byte r, bit m holds bit k of byte j of element 8r+m. */
void iv_b2e_bitshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts)
{
    size_t ne = n / ts;
    size_t ne8 = ne - ne % 8;
    size_t nrow = ne8 / 8;
    memset(dst, 0, ne8 * ts);
    for (size_t e = 0; e < ne8; e++)
        for (size_t j = 0; j < ts; j++)
            for (size_t k = 0; k < 8; k++) {
                unsigned bit = (src[e * ts + j] >> k) & 1u;
                dst[(j * 8 + k) * nrow + e / 8] |= (uint8_t)(bit << (e % 8));
            }
    memcpy(dst + ne8 * ts, src + ne8 * ts, n - ne8 * ts);
}

/* c-blosc2's delta: XOR with the previous element in the chunk's first
 * block, with the first block's bytes in the others. */
static void delta_encode(const uint8_t *chunk, size_t off, const uint8_t *src, uint8_t *dst,
                         size_t bsize, size_t ts)
{
    size_t w = (ts == 1 || ts == 2 || ts == 4 || ts == 8) ? ts : (ts % 8 == 0 ? 8 : 1);
    size_t ne = bsize / w;
    memcpy(dst, src, bsize);
    if (off == 0) {
        for (size_t i = 1; i < ne; i++)
            for (size_t k = 0; k < w; k++) dst[i * w + k] = src[i * w + k] ^ chunk[(i - 1) * w + k];
    } else {
        for (size_t i = 0; i < ne * w; i++) dst[i] = src[i] ^ chunk[i];
    }
}

size_t iv_b2e_blosclz(const uint8_t *src, size_t n, int literal_only, uint8_t *dst, size_t cap)
{
    enum { HBITS = 12 };
    size_t *table = calloc((size_t)1 << HBITS, sizeof *table); /* position + 1 */
    if (!table) return 0;
    size_t ip = 0, op = 0, lit_start = 0;
#define PUT(b)                         \
    do {                               \
        if (op >= cap) goto overflow;  \
        dst[op++] = (uint8_t)(b);      \
    } while (0)
    while (ip < n) {
        size_t best_len = 0, best_dist = 0;
        if (!literal_only && ip + 3 <= n && ip > 0) {
            uint32_t h = ((uint32_t)src[ip] | (uint32_t)src[ip + 1] << 8 |
                          (uint32_t)src[ip + 2] << 16) * 2654435761u >> (32 - HBITS);
            size_t cand = table[h];
            table[h] = ip + 1;
            /* Also try distance 1 (runs) so that overlapping copies occur. */
            size_t cands[2] = {cand ? cand - 1 : SIZE_MAX, ip - 1};
            for (int c = 0; c < 2; c++) {
                size_t from = cands[c];
                if (from == SIZE_MAX || from >= ip) continue;
                size_t dist = ip - from;
                if (dist > 8192 + 65535) continue;
                size_t len = 0;
                while (ip + len < n && src[from + len] == src[ip + len] && len < 1000) len++;
                if (len >= 3 && len > best_len) {
                    best_len = len;
                    best_dist = dist;
                }
            }
        }
        if (best_len == 0) {
            ip++;
            continue;
        }
        /* Flush literals before the match, at most 32 per instruction. */
        while (lit_start < ip) {
            size_t run = ip - lit_start > 32 ? 32 : ip - lit_start;
            PUT(run - 1);
            for (size_t i = 0; i < run; i++) PUT(src[lit_start + i]);
            lit_start += run;
        }
        size_t L = best_len, dd = best_dist - 1;
        unsigned c = L <= 8 ? (unsigned)(L - 2) : 7u;
        int far = dd >= 8191;
        unsigned low5 = far ? 31u : (unsigned)(dd >> 8);
        PUT(c << 5 | low5);
        if (c == 7) {
            size_t ext = L - 9;
            while (ext >= 255) {
                PUT(255);
                ext -= 255;
            }
            PUT(ext);
        }
        if (far) {
            size_t fd = best_dist - 8192;
            PUT(255);
            PUT(fd >> 8);
            PUT(fd & 255);
        } else {
            PUT(dd & 255);
        }
        ip += L;
        lit_start = ip;
    }
    while (lit_start < n) {
        size_t run = n - lit_start > 32 ? 32 : n - lit_start;
        PUT(run - 1);
        for (size_t i = 0; i < run; i++) PUT(src[lit_start + i]);
        lit_start += run;
    }
#undef PUT
    free(table);
    return op;
overflow:
    free(table);
    return 0;
}

static int codec_format(int compcode)
{
    switch (compcode) {
    case IV_B2E_BLOSCLZ: return 0;
    case IV_B2E_LZ4:
    case IV_B2E_LZ4HC: return 1;
    case IV_B2E_ZLIB: return 3;
    case IV_B2E_ZSTD: return 4;
    default: return -1;
    }
}

/* Compresses one stream; 0 when it does not shrink. */
static size_t compress_stream(int compcode, const uint8_t *s, size_t n, uint8_t *d, size_t cap)
{
    switch (compcode) {
    case IV_B2E_BLOSCLZ: return iv_b2e_blosclz(s, n, 0, d, cap);
    case IV_B2E_LZ4: {
        int r = LZ4_compress_default((const char *)s, (char *)d, (int)n, (int)cap);
        return r > 0 ? (size_t)r : 0;
    }
    case IV_B2E_LZ4HC: {
        int r = LZ4_compress_HC((const char *)s, (char *)d, (int)n, (int)cap, 9);
        return r > 0 ? (size_t)r : 0;
    }
    case IV_B2E_ZLIB: {
        uLongf dl = cap;
        return compress2(d, &dl, s, n, 6) == Z_OK ? (size_t)dl : 0;
    }
    case IV_B2E_ZSTD: {
        size_t r = ZSTD_compress(d, cap, s, n, 3);
        return ZSTD_isError(r) ? 0 : r;
    }
    default: return 0;
    }
}

size_t iv_b2e_chunk_bound(size_t n, const iv_b2e_opts_t *o)
{
    size_t bs = o->blocksize ? o->blocksize : (n ? n : 1);
    size_t nblocks = (n + bs - 1) / bs;
    return 32 + 4 * nblocks + n + nblocks * (4 * o->typesize + 8) + 64;
}

static void write_header(uint8_t *d, const iv_b2e_opts_t *o, uint8_t flags, size_t n, size_t bs,
                         size_t cbytes)
{
    memset(d, 0, 32);
    d[0] = o->version ? o->version : 5;
    d[1] = 1;
    d[2] = flags;
    d[3] = (uint8_t)o->typesize;
    wr_le32(d + 4, (uint32_t)n);
    wr_le32(d + 8, (uint32_t)bs);
    wr_le32(d + 12, (uint32_t)cbytes);
    memcpy(d + 16, o->filters, 6);
    memcpy(d + 24, o->filters_meta, 6);
}

size_t iv_b2e_chunk(const uint8_t *src, size_t n, const iv_b2e_opts_t *o, uint8_t *dst,
                    size_t cap)
{
    int fmt = codec_format(o->compcode);
    if (fmt < 0 || o->typesize == 0 || o->typesize > 255 || cap < 32) return 0;
    size_t bs = o->blocksize ? o->blocksize : n;
    if (bs > n) bs = n;
    /* Like c-blosc2, keep blocks whole elements so split streams are even. */
    if (bs >= o->typesize) bs -= bs % o->typesize;
    uint8_t flags = (uint8_t)(0x05 | (o->dont_split ? 0x10 : 0) | fmt << 5);
    if (o->memcpyed || n == 0) {
        if (cap < 32 + n) return 0;
        write_header(dst, o, flags | 0x02, n, bs ? bs : 1, 32 + n);
        memcpy(dst + 32, src, n);
        return 32 + n;
    }
    size_t nblocks = (n + bs - 1) / bs;
    size_t op = 32 + 4 * nblocks;
    if (op > cap) return 0;
    uint8_t *a = malloc(bs), *b = malloc(bs);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    size_t result = 0;
    for (size_t k = 0; k < nblocks; k++) {
        size_t off = k * bs;
        size_t bsize = n - off < bs ? n - off : bs;
        wr_le32(dst + 32 + 4 * k, (uint32_t)op);
        /* Forward filters, slot 0 to 5. */
        memcpy(a, src + off, bsize);
        for (int i = 0; i < 6; i++) {
            switch (o->filters[i]) {
            case 1: iv_b2e_shuffle(a, b, bsize, o->filters_meta[i] ? o->filters_meta[i] : o->typesize); break;
            case 2: iv_b2e_bitshuffle(a, b, bsize, o->typesize); break;
            case 3: delta_encode(src, off, a, b, bsize, o->typesize); break;
            default: continue; /* none and truncation change nothing */
            }
            memcpy(a, b, bsize);
        }
        size_t nstreams = (!o->dont_split && bsize == bs) ? o->typesize : 1;
        size_t slen = bsize / nstreams;
        for (size_t j = 0; j < nstreams; j++) {
            const uint8_t *s = a + j * slen;
            if (op + 4 > cap) goto out;
            int run = !o->no_runs && slen > 0;
            for (size_t i = 1; run && i < slen; i++) run = s[i] == s[0];
            if (run && s[0] == 0) {
                wr_le32(dst + op, 0);
                op += 4;
                continue;
            }
            if (run) {
                if (op + 5 > cap) goto out;
                wr_le32(dst + op, (uint32_t)-(int32_t)s[0]);
                dst[op + 4] = 0x01;
                op += 5;
                continue;
            }
            size_t c = 0;
            if (!o->raw_streams && slen > 1)
                c = compress_stream(o->compcode, s, slen, dst + op + 4, cap - op - 4 < slen - 1 ? cap - op - 4 : slen - 1);
            if (c == 0 || c >= slen) {
                if (op + 4 + slen > cap) goto out;
                memcpy(dst + op + 4, s, slen);
                c = slen;
            }
            wr_le32(dst + op, (uint32_t)c);
            op += 4 + c;
        }
    }
    write_header(dst, o, flags, n, bs, op);
    result = op;
out:
    free(a);
    free(b);
    return result;
}

size_t iv_b2e_special_chunk(int kind, size_t nbytes, size_t typesize, const uint8_t *value,
                            uint8_t *dst, size_t cap)
{
    size_t len = 32 + (kind == 3 ? typesize : 0);
    if (cap < len) return 0;
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.typesize = typesize;
    write_header(dst, &o, 0x05 | 1 << 5, nbytes, nbytes, len);
    dst[31] = (uint8_t)(kind << 4);
    if (kind == 3) memcpy(dst + 32, value, typesize);
    return len;
}

size_t iv_b2e_frame(const uint8_t *src, size_t n, size_t chunksize, const iv_b2e_opts_t *o,
                    const uint8_t *special, uint8_t *dst, size_t cap)
{
    enum { HLEN = 97 };
    if (chunksize == 0 || cap < HLEN) return 0;
    size_t nchunks = (n + chunksize - 1) / chunksize;
    memset(dst, 0, HLEN);
    dst[0] = 0x9e;
    dst[1] = 0xa8;
    memcpy(dst + 2, "b2frame", 8);
    dst[10] = 0xd2;
    dst[15] = 0xcf;
    dst[24] = 0xa4;
    dst[25] = 0x12; /* format 2, 64-bit offsets */
    dst[26] = 0;    /* contiguous */
    dst[27] = (uint8_t)o->compcode;
    dst[29] = 0xd3;
    dst[38] = 0xd3;
    dst[47] = 0xd2;
    dst[52] = 0xd2;
    dst[57] = 0xd2;
    size_t op = HLEN;
    uint64_t *offs = calloc(nchunks ? nchunks : 1, sizeof *offs);
    if (!offs) return 0;
    for (size_t k = 0; k < nchunks; k++) {
        size_t len = n - k * chunksize < chunksize ? n - k * chunksize : chunksize;
        if (special && special[k]) {
            offs[k] = (uint64_t)(0x80u | special[k]) << 56;
            continue;
        }
        offs[k] = op - HLEN;
        size_t w = iv_b2e_chunk(src + k * chunksize, len, o, dst + op, cap - op);
        if (w == 0) {
            free(offs);
            return 0;
        }
        op += w;
    }
    size_t cbytes = op - HLEN;
    /* The offsets index: an ordinary chunk of int64 LE, shuffled. */
    uint8_t *raw = malloc(8 * (nchunks ? nchunks : 1));
    if (!raw) {
        free(offs);
        return 0;
    }
    for (size_t k = 0; k < nchunks; k++) wr_le64(raw + 8 * k, offs[k]);
    iv_b2e_opts_t io;
    memset(&io, 0, sizeof io);
    io.compcode = o->compcode;
    io.typesize = 8;
    io.filters[5] = 1;
    size_t w = iv_b2e_chunk(raw, 8 * nchunks, &io, dst + op, cap - op);
    free(raw);
    free(offs);
    if (w == 0) return 0;
    op += w;
    /* A token trailer: the decoder must not depend on its contents. */
    if (op + 16 > cap) return 0;
    memset(dst + op, 0, 16);
    op += 16;
    wr_be32(dst + 11, HLEN);
    wr_be64(dst + 16, op);
    wr_be64(dst + 30, n);
    wr_be64(dst + 39, cbytes);
    wr_be32(dst + 48, (uint32_t)o->typesize);
    wr_be32(dst + 53, (uint32_t)(o->blocksize ? o->blocksize : chunksize));
    wr_be32(dst + 58, (uint32_t)chunksize);
    return op;
}
