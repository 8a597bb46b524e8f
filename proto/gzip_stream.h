/*
 * One gzip member built from independently compressed pieces (the way
 * pigz builds one), so that the blocks of a streamed answer compress in
 * parallel on any worker and their outputs simply concatenate:
 *
 *   iv_gz_header           the 10-byte gzip header
 *   iv_gz_block  (any number, any thread, in any order of completion)
 *                          one piece of the body as raw deflate from a fresh
 *                          state, ended with a sync flush: it leaves the bit
 *                          stream byte-aligned with no final block, so the
 *                          next piece may start right after it
 *   iv_gz_stored           a small piece (the stream's header and trailer
 *                          records) as stored deflate blocks: no compressor
 *                          state at all, cheap enough for the loop
 *   iv_gz_finish           an empty final deflate block and the 8-byte
 *                          trailer: the CRC-32 of the whole body, combined
 *                          from the pieces' CRCs (crc32_combine), and the
 *                          body's length mod 2^32
 *
 * The caller writes the pieces in body order and folds each piece's
 * (crc, length) into an iv_gz_sum_t in the same order.
 *
 * Thread rules: every function is pure apart from the buffer and sum it is
 * given; iv_gz_block may run on several threads at once for different
 * buffers.  Output goes to a caller-owned iv_buf_t; check its oom flag (or
 * iv_gz_block's result).
 */
#ifndef IV_GZIP_STREAM_H
#define IV_GZIP_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define IV_GZ_HEADER_BYTES 10
#define IV_GZ_TRAILER_BYTES 10   /* the empty final block (2) and CRC + ISIZE (8) */

/* The running CRC-32 and length (mod 2^32) of the body written so far. */
typedef struct iv_gz_sum {
    uint32_t crc;
    uint32_t isize;
} iv_gz_sum_t;

void iv_gz_sum_init(iv_gz_sum_t *s);
/* Folds in the next piece of the body: its CRC-32 and its length.  len is
 * 64-bit so that a piece (or a simulated one) may exceed 4 GiB. */
void iv_gz_sum_add(iv_gz_sum_t *s, uint32_t crc, uint64_t len);

/* Appends the gzip member header (no name, no time stamp). */
void iv_gz_header(iv_buf_t *out);

/*
 * Appends in[0..len) compressed at level (1..9) as raw deflate from a
 * fresh state, ended with a sync flush (never a final block); *crc
 * receives the CRC-32 of the input.  An empty input appends nothing.
 * Levels 1..3 run on ISA-L's igzip (its levels 1..3) when the build has
 * it (IV_HAVE_ISAL), four to five times faster than zlib at a similar
 * ratio; levels 4..9, and every level without ISA-L, on zlib.
 *
 * At the fast levels (1..IV_GZ_FAST_LEVEL) a piece that deflate shrinks
 * by less than a third is appended as stored blocks instead: the bytes as
 * they are, five bytes of framing in 65,535.  Such a piece is mostly
 * literals (a gene's cell ids as int32: igzip's shortest match is four
 * bytes, and it leaves them at 76-79% of their size), and a client
 * inflates literals at a few nanoseconds a byte (Python's zlib: 2.6 on
 * the 2-core machine), so the third at most that it would save on the
 * wire costs the client more time than it saves on any link faster than
 * about a gigabit.  A level above IV_GZ_FAST_LEVEL asks for the ratio,
 * and always compresses.
 *
 * Returns 0, or IV_ENOMEM (out->oom set) when memory ran out,
 * IV_EINVALID_ARG for a level out of range.
 */
#define IV_GZ_FAST_LEVEL 3
int iv_gz_block(iv_buf_t *out, const void *in, size_t len, int level, uint32_t *crc);

/* "isa-l" or "zlib": the compressor iv_gz_block uses for level ("none"
 * for a level out of range). */
const char *iv_gz_engine(int level);

/* Appends in[0..len) as stored (uncompressed) deflate blocks, none final;
 * *crc receives its CRC-32. */
void iv_gz_stored(iv_buf_t *out, const void *in, size_t len, uint32_t *crc);

/* Appends the empty final block and the trailer for the body summed in s. */
void iv_gz_finish(iv_buf_t *out, const iv_gz_sum_t *s);

/* Appends a whole member of in[0..len) (a complete body, e.g. a JSON
 * document), cut into pieces of IV_GZ_PIECE_BYTES compressed in parallel
 * on pool (NULL: all on the caller; callable from a pool worker).  0 or
 * as iv_gz_block. */
#define IV_GZ_PIECE_BYTES ((size_t)1 << 20)
struct iv_pool;
int iv_gz_member(iv_buf_t *out, const void *in, size_t len, int level, struct iv_pool *pool);

/* As iv_gz_block (one raw deflate piece of in[0..len), sync-flushed, *crc
 * the CRC-32 of all of it), but cut into pieces of `piece` bytes (0: one)
 * compressed in parallel on pool (NULL: on the caller; callable from a
 * pool worker) and concatenated: one large block of a streamed answer
 * (a gene over millions of cells is one row) no longer compresses on one
 * core.  0 or as iv_gz_block. */
int iv_gz_pieces(iv_buf_t *out, const void *in, size_t len, size_t piece, int level, uint32_t *crc,
                 struct iv_pool *pool);

#endif
