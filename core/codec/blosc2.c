/*
 * Blosc2 chunk and contiguous-frame decoders.
 *
 * Design: the HDF5 Blosc2 filter stores each HDF5 chunk as a Blosc2
 * contiguous frame holding one or more Blosc2 chunks, so the frame decoder
 * validates the frame header, decodes the chunk-offsets index (itself a
 * Blosc2 chunk of int64 offsets) and concatenates the chunks, expanding
 * special offsets (zeros, NaN, uninitialized) without reading data.
 *
 * A chunk is a 32-byte header, a table of block starts, and per block one
 * stream (or typesize streams when the block is split) of codec data,
 * zeros, a byte run, or raw bytes.  Blocks decode independently except for
 * the delta filter, whose reference is the chunk's first decoded block, so
 * blocks are decoded in order straight into the caller's buffer.  When a
 * block carries filters, its streams decode into a per-thread scratch
 * buffer and the filters are undone from slot 5 to 0 into the output.
 *
 * Every field comes from untrusted bytes: sizes are checked against the
 * chunk's cbytes, cbytes against the input length, nbytes against the
 * output capacity, and each stream's decoded size must equal its expected
 * size exactly.  Unsupported features (dictionaries, lazy chunks, variable
 * blocks, unknown codecs or filters) fail with IV_EUNSUPPORTED naming the
 * feature instead of producing wrong bytes.
 */
#include "codec.h"
#include "codec_tls.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

enum {
    CHUNK_HEADER = 32,
    /* flags (byte 2) */
    FL_SHUFFLE = 0x01,
    FL_MEMCPYED = 0x02,
    FL_BITSHUFFLE = 0x04,
    FL_DONT_SPLIT = 0x10,
    /* codec formats (flags bits 5-7) */
    FMT_BLOSCLZ = 0,
    FMT_LZ4 = 1,
    FMT_ZLIB = 3,
    FMT_ZSTD = 4,
    /* filter codes */
    F_NONE = 0,
    F_SHUFFLE = 1,
    F_BITSHUFFLE = 2,
    F_DELTA = 3,
    F_TRUNC = 4,
    N_FILTERS = 6,
    /* special values (blosc2 flags bits 4-6, and frame offsets' top byte) */
    SP_NONE = 0,
    SP_ZERO = 1,
    SP_NAN = 2,
    SP_VALUE = 3,
    SP_UNINIT = 4,
};

static uint32_t rd_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int32_t rd_le32s(const uint8_t *p)
{
    return (int32_t)rd_le32(p);
}

static uint64_t rd_le64(const uint8_t *p)
{
    return (uint64_t)rd_le32(p) | (uint64_t)rd_le32(p + 4) << 32;
}

static uint32_t rd_be32(const uint8_t *p)
{
    return (uint32_t)p[3] | (uint32_t)p[2] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[0] << 24;
}

static uint64_t rd_be64(const uint8_t *p)
{
    return (uint64_t)rd_be32(p) << 32 | rd_be32(p + 4);
}

/* Fills n bytes with the NaN of a float32 or float64 element. */
static int fill_nan(uint8_t *dst, size_t n, size_t ts, iv_err_t *err)
{
    static const uint8_t nan32[4] = {0x00, 0x00, 0xc0, 0x7f};
    static const uint8_t nan64[8] = {0, 0, 0, 0, 0, 0, 0xf8, 0x7f};
    const uint8_t *pat;
    if (ts == 4) {
        pat = nan32;
    } else if (ts == 8) {
        pat = nan64;
    } else {
        return IV_FAIL(err, IV_EUNSUPPORTED, "blosc2: NaN chunk with typesize %zu", ts);
    }
    IV_RETURN_IF(n % ts != 0, err, IV_ECORRUPT,
                 "blosc2: NaN chunk of %zu bytes is not whole elements", n);
    for (size_t i = 0; i < n; i += ts) memcpy(dst + i, pat, ts);
    return 0;
}

typedef struct chunk_info {
    uint8_t version;
    uint8_t flags;
    size_t typesize;
    size_t nbytes;
    size_t blocksize;
    size_t cbytes;
    uint8_t filters[N_FILTERS];
    uint8_t filters_meta[N_FILTERS];
    int n_active;      /* filters that need undoing (not none/truncation) */
} chunk_info_t;

/* Undoes the delta filter on one block in place (XOR, as c-blosc2). */
static void undo_delta(uint8_t *chunk, size_t off, size_t bsize, size_t ts)
{
    size_t w = (ts == 1 || ts == 2 || ts == 4 || ts == 8) ? ts : (ts % 8 == 0 ? 8 : 1);
    uint8_t *b = chunk + off;
    size_t ne = bsize / w;
    if (off == 0) {
        /* The reference block is delta coded against its own previous
         * element, already decoded when we reach the next one. */
        for (size_t i = 1; i < ne; i++)
            for (size_t k = 0; k < w; k++) b[i * w + k] ^= b[(i - 1) * w + k];
    } else {
        for (size_t i = 0; i < ne * w; i++) b[i] ^= chunk[i];
    }
}

static int decode_stream(const chunk_info_t *ci, const uint8_t *s, size_t slen, uint8_t *out,
                         size_t olen, iv_err_t *err)
{
    switch (ci->flags >> 5) {
    case FMT_BLOSCLZ:
        return iv_blosclz_decode(s, slen, out, olen, err);
    case FMT_LZ4:
        return iv_lz4_decode(s, slen, out, olen, err);
    case FMT_ZSTD: {
        size_t got = 0;
        IV_TRY(iv_zstd_decode(s, slen, out, olen, &got, err));
        IV_RETURN_IF(got != olen, err, IV_ECORRUPT,
                     "blosc2: zstd stream decodes to %zu bytes, expected %zu", got, olen);
        return 0;
    }
    case FMT_ZLIB: {
        size_t got = 0;
        IV_TRY(iv_deflate_decode(s, slen, out, olen, &got, err));
        IV_RETURN_IF(got != olen, err, IV_ECORRUPT,
                     "blosc2: zlib stream decodes to %zu bytes, expected %zu", got, olen);
        return 0;
    }
    default:
        return IV_FAIL(err, IV_EUNSUPPORTED, "blosc2: codec format %u is not supported",
                       (unsigned)(ci->flags >> 5));
    }
}

/*
 * Decodes block nb (bsize bytes) whose streams start at chunk offset
 * bstart into out.
 */
static int decode_block_streams(const chunk_info_t *ci, const uint8_t *chunk, size_t bstart,
                                size_t bsize, int full, uint8_t *out, iv_err_t *err)
{
    size_t nstreams = (!(ci->flags & FL_DONT_SPLIT) && full) ? ci->typesize : 1;
    IV_RETURN_IF(bsize % nstreams != 0, err, IV_ECORRUPT,
                 "blosc2: block of %zu bytes does not split into %zu streams", bsize, nstreams);
    size_t slen = bsize / nstreams;
    size_t pos = bstart;
    for (size_t j = 0; j < nstreams; j++) {
        IV_RETURN_IF(ci->cbytes - pos < 4, err, IV_ECORRUPT,
                     "blosc2: stream size past the end of the chunk");
        int32_t csize = rd_le32s(chunk + pos);
        pos += 4;
        uint8_t *o = out + j * slen;
        if (csize == 0) {
            memset(o, 0, slen);
        } else if (csize < 0) {
            IV_RETURN_IF(ci->cbytes - pos < 1, err, IV_ECORRUPT,
                         "blosc2: run token past the end of the chunk");
            uint8_t token = chunk[pos++];
            IV_RETURN_IF(!(token & 1), err, IV_EUNSUPPORTED,
                         "blosc2: stream token 0x%02x is not supported", token);
            IV_RETURN_IF(csize < -255, err, IV_ECORRUPT,
                         "blosc2: run value %lld out of range", -(long long)csize);
            memset(o, -csize, slen);
        } else {
            IV_RETURN_IF((size_t)csize > ci->cbytes - pos, err, IV_ECORRUPT,
                         "blosc2: stream of %d bytes past the end of the chunk", csize);
            if ((size_t)csize == slen) {
                memcpy(o, chunk + pos, slen);
            } else {
                IV_TRY(decode_stream(ci, chunk + pos, (size_t)csize, o, slen, err));
            }
            pos += (size_t)csize;
        }
    }
    return 0;
}

/* Undoes the filters of one block from tmp into dst + off. */
static int undo_filters(const chunk_info_t *ci, uint8_t *tmp, uint8_t *tmp2, uint8_t *dst,
                        size_t off, size_t bsize, iv_err_t *err)
{
    /* Active filters in decode order (slot 5 first). */
    int order[N_FILTERS], n = 0;
    for (int i = N_FILTERS - 1; i >= 0; i--)
        if (ci->filters[i] != F_NONE && ci->filters[i] != F_TRUNC) order[n++] = i;
    const uint8_t *cur = tmp;
    for (int s = 0; s < n; s++) {
        int i = order[s];
        int last = (s == n - 1);
        uint8_t f = ci->filters[i];
        if (f == F_DELTA) {
            /* Delta needs the chunk's first block in the output, so it has
             * to be the last filter undone; c-blosc2 writes it before
             * shuffle (decoded after it) in every layout it produces. */
            IV_RETURN_IF(!last, err, IV_EUNSUPPORTED,
                         "blosc2: delta filter followed by another filter");
            if (cur != dst + off) memcpy(dst + off, cur, bsize);
            undo_delta(dst, off, bsize, ci->typesize);
            return 0;
        }
        int next_delta = !last && ci->filters[order[s + 1]] == F_DELTA;
        uint8_t *out = (last || next_delta) ? dst + off : (cur == tmp ? tmp2 : tmp);
        if (f == F_SHUFFLE) {
            size_t ts = ci->filters_meta[i] ? ci->filters_meta[i] : ci->typesize;
            iv_unshuffle(cur, out, bsize, ts);
        } else if (f == F_BITSHUFFLE) {
            if (ci->version <= 2 && (bsize / ci->typesize) % 8 != 0) {
                /* Format 2 left such blocks unshuffled. */
                memcpy(out, cur, bsize);
            } else {
                IV_TRY(iv_bitunshuffle(cur, out, bsize, ci->typesize, err));
            }
        } else {
            return IV_FAIL(err, IV_EUNSUPPORTED, "blosc2: filter %u is not supported", f);
        }
        cur = out;
    }
    return 0;
}

/* The chunk header's sizes and flags into ci, checked against the input
 * and the output's capacity. */
static int read_chunk_header(const uint8_t *src, size_t src_len, size_t dst_cap,
                             chunk_info_t *ci, iv_err_t *err)
{
    memset(ci, 0, sizeof *ci);
    ci->version = src[0];
    ci->flags = src[2];
    ci->typesize = src[3];
    int32_t nbytes = rd_le32s(src + 4), blocksize = rd_le32s(src + 8), cbytes = rd_le32s(src + 12);
    uint8_t flags2 = src[30], b2flags = src[31];

    IV_RETURN_IF(ci->version == 0 || ci->version > 6, err, IV_EUNSUPPORTED,
                 "blosc2: chunk format version %u", ci->version);
    IV_RETURN_IF((ci->flags & (FL_SHUFFLE | FL_BITSHUFFLE)) != (FL_SHUFFLE | FL_BITSHUFFLE), err,
                 IV_EUNSUPPORTED, "blosc2: chunk without the extended header (Blosc1 format)");
    IV_RETURN_IF(nbytes < 0 || blocksize < 0 || cbytes < CHUNK_HEADER, err, IV_ECORRUPT,
                 "blosc2: negative sizes in chunk header");
    IV_RETURN_IF((size_t)cbytes > src_len, err, IV_ECORRUPT,
                 "blosc2: chunk cbytes %d past the end of the input (%zu bytes)", cbytes, src_len);
    IV_RETURN_IF((size_t)nbytes > dst_cap, err, IV_ECORRUPT,
                 "blosc2: chunk nbytes %d exceeds capacity %zu", nbytes, dst_cap);
    IV_RETURN_IF(ci->typesize == 0, err, IV_ECORRUPT, "blosc2: typesize 0");
    ci->nbytes = (size_t)nbytes;
    ci->blocksize = (size_t)blocksize;
    ci->cbytes = (size_t)cbytes;

    IV_RETURN_IF(b2flags & 0x01, err, IV_EUNSUPPORTED, "blosc2: dictionary compression");
    IV_RETURN_IF(b2flags & 0x08, err, IV_EUNSUPPORTED, "blosc2: lazy chunk");
    IV_RETURN_IF(flags2 & 0x01, err, IV_EUNSUPPORTED, "blosc2: variable-length blocks");
    return 0;
}

/* A special chunk (zeros, NaNs, one repeated value) written out: 1 when
 * the chunk was one, 0 when it holds blocks, or an error. */
static int decode_special(const chunk_info_t *ci, const uint8_t *src, uint8_t *dst,
                          iv_err_t *err)
{
    unsigned special = (src[31] >> 4) & 7u;
    switch (special) {
    case SP_NONE: return 0;
    case SP_ZERO:
    case SP_UNINIT:
        memset(dst, 0, ci->nbytes);
        return 1;
    case SP_NAN:
        IV_TRY(fill_nan(dst, ci->nbytes, ci->typesize, err));
        return 1;
    case SP_VALUE:
        IV_RETURN_IF(ci->cbytes < CHUNK_HEADER + ci->typesize, err, IV_ECORRUPT,
                     "blosc2: repeated-value chunk without its value");
        IV_RETURN_IF(ci->nbytes % ci->typesize != 0, err, IV_ECORRUPT,
                     "blosc2: repeated-value chunk of %zu bytes is not whole elements",
                     ci->nbytes);
        for (size_t i = 0; i < ci->nbytes; i += ci->typesize)
            memcpy(dst + i, src + CHUNK_HEADER, ci->typesize);
        return 1;
    default:
        return IV_FAIL(err, IV_EUNSUPPORTED, "blosc2: special chunk kind %u", special);
    }
}

/* The filter pipeline and the codec of a chunk that holds blocks. */
static int read_filters(chunk_info_t *ci, const uint8_t *src, iv_err_t *err)
{
    for (int i = 0; i < N_FILTERS; i++) {
        ci->filters[i] = src[16 + i];
        ci->filters_meta[i] = src[24 + i];
        uint8_t f = ci->filters[i];
        IV_RETURN_IF(f > F_TRUNC, err, IV_EUNSUPPORTED, "blosc2: filter code %u in slot %d", f, i);
        if (f != F_NONE && f != F_TRUNC) ci->n_active++;
    }
    unsigned fmt = ci->flags >> 5;
    IV_RETURN_IF(fmt != FMT_BLOSCLZ && fmt != FMT_LZ4 && fmt != FMT_ZLIB && fmt != FMT_ZSTD, err,
                 IV_EUNSUPPORTED, "blosc2: codec format %u (user-defined or unknown)", fmt);
    return 0;
}

/* Every block of the chunk: its streams decoded, then its filters
 * undone (through thread-local scratch when there are any). */
static int decode_blocks(const chunk_info_t *ci, const uint8_t *src, uint8_t *dst, iv_err_t *err)
{
    /* A block never exceeds the chunk; clamping keeps scratch bounded. */
    size_t bs = ci->blocksize < ci->nbytes ? ci->blocksize : ci->nbytes;
    size_t nblocks = (ci->nbytes + ci->blocksize - 1) / ci->blocksize;
    IV_RETURN_IF(nblocks > (ci->cbytes - CHUNK_HEADER) / 4, err, IV_ECORRUPT,
                 "blosc2: block table of %zu entries past the end of the chunk", nblocks);
    size_t table_end = CHUNK_HEADER + 4 * nblocks;

    uint8_t *tmp = NULL, *tmp2 = NULL;
    if (ci->n_active > 0) {
        tmp = iv_codec_scratch(2 * bs);
        if (!tmp) return iv_fail(err, IV_ENOMEM, "blosc2: no scratch for a %zu-byte block", bs);
        tmp2 = tmp + bs;
    }

    for (size_t b = 0; b < nblocks; b++) {
        size_t off = b * ci->blocksize;
        size_t bsize = ci->nbytes - off < ci->blocksize ? ci->nbytes - off : ci->blocksize;
        int32_t bstart = rd_le32s(src + CHUNK_HEADER + 4 * b);
        IV_RETURN_IF(bstart < 0 || (size_t)bstart < table_end || (size_t)bstart >= ci->cbytes,
                     err, IV_ECORRUPT, "blosc2: block %zu starts at %d, outside the chunk", b,
                     bstart);
        uint8_t *target = ci->n_active > 0 ? tmp : dst + off;
        IV_TRY(decode_block_streams(ci, src, (size_t)bstart, bsize, bsize == ci->blocksize,
                                    target, err));
        if (ci->n_active > 0) IV_TRY(undo_filters(ci, tmp, tmp2, dst, off, bsize, err));
    }
    return 0;
}

int iv_blosc2_chunk_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                           size_t *out_len, iv_err_t *err)
{
    *out_len = 0;
    IV_RETURN_IF(src_len < CHUNK_HEADER, err, IV_ECORRUPT,
                 "blosc2: chunk of %zu bytes is shorter than its header", src_len);
    chunk_info_t ci;
    IV_TRY(read_chunk_header(src, src_len, dst_cap, &ci, err));
    int special = decode_special(&ci, src, dst, err);
    if (special < 0) return special;
    if (special) {
        *out_len = ci.nbytes;
        return 0;
    }
    if (ci.flags & FL_MEMCPYED) {
        IV_RETURN_IF(ci.cbytes != CHUNK_HEADER + ci.nbytes, err, IV_ECORRUPT,
                     "blosc2: memcpyed chunk has cbytes %zu for nbytes %zu", ci.cbytes,
                     ci.nbytes);
        memcpy(dst, src + CHUNK_HEADER, ci.nbytes);
        *out_len = ci.nbytes;
        return 0;
    }
    if (ci.nbytes == 0) return 0;
    IV_RETURN_IF(ci.blocksize == 0, err, IV_ECORRUPT, "blosc2: blocksize 0");
    IV_TRY(read_filters(&ci, src, err));
    IV_TRY(decode_blocks(&ci, src, dst, err));
    *out_len = ci.nbytes;
    return 0;
}

/* ---- frames ---------------------------------------------------------------- */

enum {
    FR_HEADER_LEN = 11,   /* int32 BE, msgpack 0xd2 at 10 */
    FR_FRAME_LEN = 16,    /* uint64 BE, msgpack 0xcf at 15 */
    FR_FLAGS = 25,        /* general flags; frame type at 26 */
    FR_NBYTES = 30,       /* int64 BE, 0xd3 at 29 */
    FR_CBYTES = 39,       /* int64 BE, 0xd3 at 38 */
    FR_TYPESIZE = 48,     /* int32 BE, 0xd2 at 47 */
    FR_BLOCKSIZE = 53,    /* int32 BE, 0xd2 at 52 */
    FR_CHUNKSIZE = 58,    /* int32 BE, 0xd2 at 57 */
    FR_MIN_HEADER = 62,
    OFFSETS_ON_STACK = 32,
};

/* A contiguous frame's layout: its data section, the offsets index
 * after it, and the sizes of what they hold. */
typedef struct frame_info {
    const uint8_t *data, *idx;
    size_t data_len, idx_len;
    size_t n_out, csize, nchunks, typesize;
} frame_info_t;

/* Reads and checks the frame header; fr->n_out is 0 for an empty frame
 * (nothing else set then). */
static int read_frame_header(const uint8_t *src, size_t src_len, size_t dst_cap, frame_info_t *fr,
                             iv_err_t *err)
{
    IV_RETURN_IF((src[0] & 0xf0) != 0x90 || src[1] != 0xa8 || memcmp(src + 2, "b2frame", 8) != 0,
                 err, IV_ECORRUPT, "blosc2 frame: bad magic");
    IV_RETURN_IF(src[10] != 0xd2 || src[15] != 0xcf || src[29] != 0xd3 || src[38] != 0xd3 ||
                     src[47] != 0xd2 || src[52] != 0xd2 || src[57] != 0xd2,
                 err, IV_ECORRUPT, "blosc2 frame: malformed header fields");
    uint32_t header_len = rd_be32(src + FR_HEADER_LEN);
    uint64_t frame_len = rd_be64(src + FR_FRAME_LEN);
    int64_t nbytes = (int64_t)rd_be64(src + FR_NBYTES);
    int64_t cbytes = (int64_t)rd_be64(src + FR_CBYTES);
    int32_t typesize = (int32_t)rd_be32(src + FR_TYPESIZE);
    int32_t chunksize = (int32_t)rd_be32(src + FR_CHUNKSIZE);
    uint8_t gflags = src[FR_FLAGS], ftype = src[FR_FLAGS + 1];

    IV_RETURN_IF(frame_len > src_len, err, IV_ECORRUPT,
                 "blosc2 frame: frame_len %llu past the end of the input (%zu bytes)",
                 (unsigned long long)frame_len, src_len);
    IV_RETURN_IF(header_len < FR_MIN_HEADER || header_len > frame_len, err, IV_ECORRUPT,
                 "blosc2 frame: header_len %u outside the frame", header_len);
    IV_RETURN_IF((ftype & 0x0f) != 0, err, IV_EUNSUPPORTED,
                 "blosc2 frame: frame type %u (only contiguous frames)", ftype & 0x0f);
    IV_RETURN_IF(((gflags >> 4) & 3) != 1, err, IV_EUNSUPPORTED,
                 "blosc2 frame: chunk offsets of %d bits (only 64)", 32 << ((gflags >> 4) & 3));
    IV_RETURN_IF(nbytes < 0 || cbytes < 0, err, IV_ECORRUPT, "blosc2 frame: negative sizes");
    IV_RETURN_IF((uint64_t)cbytes > frame_len - header_len, err, IV_ECORRUPT,
                 "blosc2 frame: cbytes %lld past the end of the frame", (long long)cbytes);
    IV_RETURN_IF((uint64_t)nbytes > dst_cap, err, IV_ECORRUPT,
                 "blosc2 frame: nbytes %lld exceeds capacity %zu", (long long)nbytes, dst_cap);
    fr->n_out = (size_t)nbytes;
    if (nbytes == 0) return 0;
    IV_RETURN_IF(chunksize <= 0, err, IV_EUNSUPPORTED,
                 "blosc2 frame: variable-length chunks (chunksize %d)", chunksize);
    IV_RETURN_IF(typesize <= 0, err, IV_ECORRUPT, "blosc2 frame: typesize %d", typesize);
    fr->csize = (size_t)chunksize;
    fr->typesize = (size_t)typesize;
    fr->nchunks = (fr->n_out + fr->csize - 1) / fr->csize;
    fr->data = src + header_len;
    fr->data_len = (size_t)cbytes;
    fr->idx = fr->data + fr->data_len;
    fr->idx_len = (size_t)frame_len - header_len - fr->data_len;
    return 0;
}

/* Chunk k of the frame (offset off into the data, or a special value)
 * decoded into want bytes at out. */
static int decode_frame_chunk(const frame_info_t *fr, size_t k, uint64_t off, uint8_t *out,
                              size_t want, iv_err_t *err)
{
    if (off >> 63) {
        unsigned sp = (unsigned)(off >> 56) & 0x7fu;
        if (sp & SP_ZERO || sp & SP_UNINIT) {
            memset(out, 0, want);
            return 0;
        }
        if (sp & SP_NAN) return fill_nan(out, want, fr->typesize, err);
        return IV_FAIL(err, IV_ECORRUPT, "blosc2 frame: chunk %zu has special offset 0x%llx",
                       k, (unsigned long long)off);
    }
    if (off >= fr->data_len || fr->data_len - off < CHUNK_HEADER)
        return IV_FAIL(err, IV_ECORRUPT, "blosc2 frame: chunk %zu offset %llu outside data",
                       k, (unsigned long long)off);
    size_t clen = 0;
    IV_TRY(iv_blosc2_chunk_decode(fr->data + off, fr->data_len - (size_t)off, out, want, &clen,
                                  err));
    if (clen != want)
        return IV_FAIL(err, IV_ECORRUPT, "blosc2 frame: chunk %zu holds %zu bytes, expected %zu",
                       k, clen, want);
    return 0;
}

/* Decodes the offsets index (offs_bytes of it) into offs, then every
 * chunk into dst. */
static int decode_frame_chunks(const frame_info_t *fr, uint8_t *offs, size_t offs_bytes,
                               uint8_t *dst, iv_err_t *err)
{
    size_t got = 0;
    IV_TRY(iv_blosc2_chunk_decode(fr->idx, fr->idx_len, offs, offs_bytes, &got, err));
    if (got != offs_bytes)
        return IV_FAIL(err, IV_ECORRUPT, "blosc2 frame: offsets index holds %zu bytes, expected %zu",
                       got, offs_bytes);
    size_t pos = 0;
    for (size_t k = 0; k < fr->nchunks; k++) {
        size_t want = fr->n_out - pos < fr->csize ? fr->n_out - pos : fr->csize;
        IV_TRY(decode_frame_chunk(fr, k, rd_le64(offs + 8 * k), dst + pos, want, err));
        pos += want;
    }
    return 0;
}

int iv_blosc2_frame_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                           size_t *out_len, iv_err_t *err)
{
    *out_len = 0;
    IV_RETURN_IF(src_len < FR_MIN_HEADER, err, IV_ECORRUPT,
                 "blosc2 frame: %zu bytes is shorter than a frame header", src_len);
    frame_info_t fr;
    memset(&fr, 0, sizeof fr);
    IV_TRY(read_frame_header(src, src_len, dst_cap, &fr, err));
    if (fr.n_out == 0) return 0;

    /* The offsets index: one int64 per chunk.  nchunks * 8 is at most
     * 8 * nbytes / chunksize + 8, bounded by the output size. */
    int64_t stack_offsets[OFFSETS_ON_STACK];
    uint8_t *offs = (uint8_t *)stack_offsets;
    IV_RETURN_IF(fr.nchunks > SIZE_MAX / 8, err, IV_ECORRUPT, "blosc2 frame: too many chunks");
    size_t offs_bytes = fr.nchunks * 8;
    if (fr.nchunks > OFFSETS_ON_STACK) {
        IV_RETURN_IF(offs_bytes > 2 * fr.n_out + 4096, err, IV_ECORRUPT,
                     "blosc2 frame: %zu chunks of %zu bytes", fr.nchunks, fr.csize);
        offs = malloc(offs_bytes);
        if (!offs) return iv_fail(err, IV_ENOMEM, "blosc2 frame: no memory for offsets");
    }
    int rc = decode_frame_chunks(&fr, offs, offs_bytes, dst, err);
    if (rc == 0) *out_len = fr.n_out;
    if (offs != (uint8_t *)stack_offsets) free(offs);
    return rc;
}
