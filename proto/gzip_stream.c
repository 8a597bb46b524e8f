/*
 * A gzip member made of independently compressed pieces (gzip_stream.h).
 *
 * Why pieces and not one deflate stream: a streamed answer is encoded a
 * block at a time on whichever worker is free, several blocks at once.  A
 * single zlib stream would make block k+1 wait for block k's compressor
 * state, serializing the answer onto one thread.  Deflate allows a block
 * boundary at any byte: a raw deflate stream ended with Z_SYNC_FLUSH
 * stops at a byte boundary after an empty stored block and no final
 * block, so the next piece's deflate blocks may follow it directly.  The
 * cost is that a piece cannot refer back into the previous one (its
 * 32 KiB window starts empty), which for blocks of hundreds of kilobytes
 * costs well under one percent of the ratio.
 *
 * The gzip trailer needs the CRC-32 of the whole body; each piece's CRC is
 * computed where the piece is compressed and crc32_combine joins them in
 * body order on the loop in constant time.
 */
#include "gzip_stream.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#ifdef IV_HAVE_ISAL
#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#endif

#include "error.h"
#include "pool.h"

/* zlib counts in uInt: feed and checksum at most this much at a time. */
#define GZ_STEP ((size_t)1 << 30)

void iv_gz_sum_init(iv_gz_sum_t *s)
{
    s->crc = 0;
    s->isize = 0;
}

void iv_gz_sum_add(iv_gz_sum_t *s, uint32_t crc, uint64_t len)
{
    if (len == 0) return;
    s->crc = (uint32_t)crc32_combine(s->crc, crc, (z_off_t)len);
    s->isize += (uint32_t)len;  /* ISIZE is the length mod 2^32 (RFC 1952) */
}

void iv_gz_header(iv_buf_t *out)
{
    /* ID1 ID2, CM = deflate, FLG = 0, MTIME = 0 (none), XFL = 0, OS = 3
     * (Unix): no name, no time, so equal bodies give equal bytes. */
    static const unsigned char h[IV_GZ_HEADER_BYTES] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    iv_buf_append(out, h, sizeof h);
}

/* The gzip CRC-32 of a piece.  ISA-L's (the same polynomial and
 * conventions, so its values combine with zlib's) runs at about 30 GB/s
 * against zlib's 1.8: a sixth of igzip level 1's time on a block. */
static uint32_t crc_of(const void *in, size_t len)
{
#ifdef IV_HAVE_ISAL
    return crc32_gzip_refl(0, (const unsigned char *)in, (uint64_t)len);
#else
    const unsigned char *p = in;
    uLong crc = crc32(0L, Z_NULL, 0);
    while (len) {
        size_t n = len < GZ_STEP ? len : GZ_STEP;
        crc = crc32(crc, p, (uInt)n);
        p += n;
        len -= n;
    }
    return (uint32_t)crc;
#endif
}

#ifdef IV_HAVE_ISAL
/* The piece through ISA-L's igzip at level (1..3): the same contract as
 * zlib's path (raw deflate, a fresh state, ended by a sync flush), at four
 * to five times zlib level 1's speed (benchmarks/bench_gzip_stream.c). */
static int isal_piece(iv_buf_t *out, const unsigned char *in, size_t len, int level)
{
    static const uint32_t buf_size[] = {ISAL_DEF_LVL0_DEFAULT, ISAL_DEF_LVL1_DEFAULT, ISAL_DEF_LVL2_DEFAULT,
                                        ISAL_DEF_LVL3_DEFAULT};
    /* The state holds its own buffers (hundreds of kilobytes): heap, not a
     * worker's stack. */
    struct isal_zstream *z = malloc(sizeof *z);
    uint8_t *lbuf = malloc(buf_size[level]);
    int rc = 0;
    if (!z || !lbuf) {
        rc = IV_ENOMEM;
        goto out;
    }
    isal_deflate_init(z);
    z->level = (uint32_t)level;
    z->level_buf = lbuf;
    z->level_buf_size = buf_size[level];
    z->gzip_flag = IGZIP_DEFLATE;
    z->end_of_stream = 0;
    size_t left = len;
    while (rc == 0 && left) {
        size_t n = left < GZ_STEP ? left : GZ_STEP;
        z->flush = n == left ? SYNC_FLUSH : NO_FLUSH;
        z->next_in = (uint8_t *)(uintptr_t)in;
        z->avail_in = (uint32_t)n;
        size_t want = n + n / 8 + 1024;  /* stored blocks at worst, and the flush */
        do {
            if (iv_buf_reserve(out, want) != 0) {
                rc = IV_ENOMEM;
                break;
            }
            size_t room = out->cap - out->len;
            if (room > UINT32_MAX) room = UINT32_MAX;
            z->next_out = (uint8_t *)out->data + out->len;
            z->avail_out = (uint32_t)room;
            if (isal_deflate(z) != COMP_OK) {
                rc = IV_EINTERNAL;
                break;
            }
            out->len += room - z->avail_out;
            want = (size_t)1 << 16;
        } while (z->avail_in > 0 || z->avail_out == 0 ||
                 (z->flush == SYNC_FLUSH && z->internal_state.state != ZSTATE_NEW_HDR));
        in += n;
        left -= n;
    }
out:
    if (rc == IV_ENOMEM) out->oom = 1;
    free(lbuf);
    free(z);
    return rc;
}
#endif

const char *iv_gz_engine(int level)
{
#ifdef IV_HAVE_ISAL
    if (level >= 1 && level <= 3) return "isa-l";
#endif
    return level >= 1 && level <= 9 ? "zlib" : "none";
}

/* in[0..len) as stored deflate blocks, none final (see iv_gz_stored). */
static void stored_blocks(iv_buf_t *out, const void *in, size_t len)
{
    const unsigned char *p = in;
    /* A stored block (RFC 1951 3.2.4): the 3 header bits BFINAL = 0 and
     * BTYPE = 00, padded to the byte (the previous piece ended on a byte
     * boundary), then LEN and its one's complement NLEN, little-endian,
     * and LEN bytes; at most 65,535 of them a block. */
    while (len) {
        size_t n = len < 65535 ? len : 65535;
        unsigned char h[5] = {0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8),
                              (unsigned char)(~n & 0xff), (unsigned char)((~n >> 8) & 0xff)};
        iv_buf_append(out, h, sizeof h);
        iv_buf_append(out, p, n);
        p += n;
        len -= n;
    }
}

/* Appends in[0..len) as raw deflate at level from a fresh state, ended
 * with a sync flush (iv_gz_block without its checks and its choice). */
static int deflate_piece(iv_buf_t *out, const void *in, size_t len, int level)
{
#ifdef IV_HAVE_ISAL
    if (level <= 3) return isal_piece(out, in, len, level);
#endif
    z_stream z;
    memset(&z, 0, sizeof z);
    /* Negative window bits: raw deflate, no zlib or gzip wrapper. */
    int zr = deflateInit2(&z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    if (zr != Z_OK) {
        out->oom = 1;
        return IV_ENOMEM;
    }
    const unsigned char *p = in;
    size_t left = len;
    int rc = 0;
    while (rc == 0 && left) {
        size_t n = left < GZ_STEP ? left : GZ_STEP;
        int flush = n == left ? Z_SYNC_FLUSH : Z_NO_FLUSH;
        z.next_in = (Bytef *)(uintptr_t)p;
        z.avail_in = (uInt)n;
        /* The first reservation usually holds the whole piece: the bound
         * for the input plus the flush's few bytes. */
        size_t want = (size_t)deflateBound(&z, (uLong)n) + 16;
        do {
            if (iv_buf_reserve(out, want) != 0) {
                rc = IV_ENOMEM;
                break;
            }
            size_t room = out->cap - out->len;
            if (room > UINT_MAX) room = UINT_MAX;
            z.next_out = (Bytef *)out->data + out->len;
            z.avail_out = (uInt)room;
            zr = deflate(&z, flush);
            out->len += room - z.avail_out;
            if (zr != Z_OK && zr != Z_BUF_ERROR) {
                rc = IV_EINTERNAL;
                break;
            }
            want = (size_t)1 << 16;
            /* Done with this input once it is consumed and, for the flush,
             * once deflate returned with output space to spare (zlib's
             * rule for a completed flush). */
        } while (z.avail_in > 0 || z.avail_out == 0);
        p += n;
        left -= n;
    }
    deflateEnd(&z);
    return rc;
}

int iv_gz_block(iv_buf_t *out, const void *in, size_t len, int level, uint32_t *crc)
{
    *crc = crc_of(in, len);
    if (level < 1 || level > 9) return IV_EINVALID_ARG;
    if (len == 0) return 0;
    size_t start = out->len;
    int rc = deflate_piece(out, in, len, level);
    if (rc == 0 && level <= IV_GZ_FAST_LEVEL && (out->len - start) * 3 > len * 2) {
        out->len = start;   /* saved less than a third: the bytes as they are */
        stored_blocks(out, in, len);
        if (out->oom) rc = IV_ENOMEM;
    }
    return rc;
}

void iv_gz_stored(iv_buf_t *out, const void *in, size_t len, uint32_t *crc)
{
    *crc = crc_of(in, len);
    stored_blocks(out, in, len);
}

void iv_gz_finish(iv_buf_t *out, const iv_gz_sum_t *s)
{
    /* An empty final block with fixed Huffman codes: BFINAL = 1, BTYPE =
     * 01, then the 7-bit end-of-block code 0000000, ten bits in all, read
     * from the least significant bit: 0x03 0x00. */
    unsigned char t[IV_GZ_TRAILER_BYTES] = {0x03, 0x00};
    for (int i = 0; i < 4; i++) {
        t[2 + i] = (unsigned char)(s->crc >> (8 * i));
        t[6 + i] = (unsigned char)(s->isize >> (8 * i));
    }
    iv_buf_append(out, t, sizeof t);
}

typedef struct {
    const unsigned char *in;
    size_t len, piece;
    int level;
    iv_buf_t *part;
    uint32_t *crc;
    int *rc;
} pieces_job_t;

static void one_piece(void *arg, size_t i)
{
    pieces_job_t *m = arg;
    size_t off = i * m->piece, n = m->len - off < m->piece ? m->len - off : m->piece;
    m->rc[i] = iv_gz_block(&m->part[i], m->in + off, n, m->level, &m->crc[i]);
}

int iv_gz_pieces(iv_buf_t *out, const void *in, size_t len, size_t piece, int level, uint32_t *crc,
                 struct iv_pool *pool)
{
    if (level < 1 || level > 9) return IV_EINVALID_ARG;
    if (piece == 0 || len <= piece) return iv_gz_block(out, in, len, level, crc);
    size_t k = (len + piece - 1) / piece;
    iv_buf_t *part = calloc(k, sizeof *part);
    uint32_t *crcs = calloc(k, sizeof *crcs);
    int *prc = calloc(k, sizeof *prc);
    int rc = 0;
    if (!part || !crcs || !prc) {
        out->oom = 1;
        rc = IV_ENOMEM;
        goto out;
    }
    pieces_job_t m = {in, len, piece, level, part, crcs, prc};
    iv_pool_parallel_for(pool, k, 0, one_piece, &m);
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    for (size_t i = 0; i < k && rc == 0; i++) {
        rc = prc[i];
        iv_buf_append(out, part[i].data, part[i].len);
        iv_gz_sum_add(&s, crcs[i], i + 1 < k ? piece : len - i * piece);
    }
    *crc = s.crc;
    if (rc == 0 && out->oom) rc = IV_ENOMEM;
out:
    for (size_t i = 0; part && i < k; i++) iv_buf_free(&part[i]);
    free(part);
    free(crcs);
    free(prc);
    return rc;
}

int iv_gz_member(iv_buf_t *out, const void *in, size_t len, int level, struct iv_pool *pool)
{
    if (level < 1 || level > 9) return IV_EINVALID_ARG;
    uint32_t crc = 0;
    iv_gz_header(out);
    int rc = iv_gz_pieces(out, in, len, IV_GZ_PIECE_BYTES, level, &crc, pool);
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    iv_gz_sum_add(&s, crc, len);
    iv_gz_finish(out, &s);
    if (rc == 0 && out->oom) rc = IV_ENOMEM;
    return rc;
}
