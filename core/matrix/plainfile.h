/*
 * The plain copy: a compressed packed stream written out once,
 * uncompressed, to the cache folder, and read back in small chunks.
 *
 * Why.  A cell query reads a few hundred bytes of the stream a cell, but
 * a compressed stream is read a stored chunk at a time (about 150 KB in
 * the atlases of gen_atlas.py): a random cell that misses the chunk
 * cache costs a whole chunk's decompression.  When the stream is larger
 * than the cache (ten million cells: 9.79 GB against 5.15 GB at an
 * 8 GiB budget) nearly every cell of a random selection misses, and the
 * loads spend their time in zstd.  The plain copy holds the same bytes
 * in IV_PLAIN_CHUNK virtual chunks, so a miss is one small read from the
 * page cache.  The row index, pointers and values are the source's (the
 * bytes are the same); only the stream a query reads changes
 * (dataset.h, iv_dataset_read_stream).
 *
 * Checks.  The copy is read through the stream layer like any file
 * (stream.h): every read is checked against the file's identity, and
 * every chunk against the checksum taken while writing it, kept in the
 * file.  A copy is taken only when its header names the source file as
 * opened (device, inode, size, modification time), the matrix group and
 * the stream's length, and the checksum over its header and chunk sums
 * holds; anything else is "no copy" and it is written again.
 *
 * Format (native byte order; the magic tells another): the header below
 * at 0, the stream's bytes at data_off (4096), then, 8-aligned after
 * them, n_chunks uint64 chunk checksums (iv_file_sum of each chunk's
 * bytes) and one uint64: iv_file_sum of the header, mixed with that of
 * the checksums.
 *
 * Thread rules: plain functions of their arguments.  iv_plainfile_save
 * reads the source stream from the pool's workers (any thread may
 * acquire its chunks); the stream it returns is the caller's.
 */
#ifndef IV_PLAINFILE_H
#define IV_PLAINFILE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "filecheck.h"
#include "pool.h"
#include "stream.h"

/* Bytes of a virtual chunk of the copy: a random cell's read.  Measured
 * on 1.26 M cells with the cache a half of the stream (benchmarks,
 * docs/scale.md): 4 KiB chunks served 3.5x the 10,000-cell loads of the
 * compressed stream, 16 KiB 2.2x, 64 KiB 1.5x. */
#define IV_PLAIN_CHUNK 4096u

/* What a copy must have been made from. */
typedef struct iv_plainfile_for {
    iv_file_id_t file;        /* the source file as opened */
    const char *group;        /* the matrix group */
    uint64_t length;          /* the stream's bytes */
} iv_plainfile_for_t;

/* Writes src's bytes to path as a plain copy (under a temporary name,
 * renamed into place), decompressing on the pool's workers.  IV_EIO when
 * it cannot be written, the source's read error, or IV_ECANCELLED once
 * *stop (may be NULL) is set; nothing is left at path then. */
int iv_plainfile_save(const char *path, const iv_plainfile_for_t *f, iv_stream_t *src,
                      iv_pool_t *pool, const atomic_int *stop, iv_err_t *err);
/* The same into an open, empty file (fd, named `what` in messages),
 * which the caller keeps: the transpose's unlinked replica (transpose.h). */
int iv_plainfile_write(int fd, const char *what, const iv_plainfile_for_t *f, iv_stream_t *src,
                       iv_pool_t *pool, const atomic_int *stop, iv_err_t *err);

/* Bytes [a, b) of a copy's data into buf (a task's: a starts a chunk),
 * from any pool worker: 0, or a negative error in e. */
typedef int (*iv_plainfile_fill_fn)(void *ctx, uint64_t a, uint64_t b, uint8_t *buf, iv_err_t *e);
/* A copy in the same format whose f->length bytes the fill makes (the
 * wide copy's, widefile.h), saved as iv_plainfile_save saves. */
int iv_plainfile_save_filled(const char *path, const iv_plainfile_for_t *f, iv_plainfile_fill_fn fill,
                             void *ctx, iv_pool_t *pool, const atomic_int *stop, iv_err_t *err);

/*
 * Opens the copy at path as a stream read in virtual chunks of chunk_len
 * bytes (IV_PLAIN_CHUNK for cell queries; a multiple of it, such as
 * IV_STREAM_CONTIG_CHUNK, for a reader that goes through it in order,
 * the transpose), with a chunk cache of cache_budget bytes, sealed with
 * the kept checksums (each read checks its IV_PLAIN_CHUNK pieces).  1
 * with *out set; 0 when there is no copy or it is not the one wanted
 * (*why, when not NULL, says which: "none kept", "another format", "made
 * for another file or matrix", "truncated", "damaged"); or a negative
 * error (out of memory).
 */
int iv_plainfile_open(const char *path, const iv_plainfile_for_t *f, uint64_t chunk_len,
                      size_t cache_budget, iv_stream_t **out, const char **why, iv_err_t *err);

#endif
