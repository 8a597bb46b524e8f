/*
 * The start-up index of a packed matrix, kept on disk so that a restart
 * reads it instead of making the row-index pass again.
 *
 * What the pass computes and a restart can reuse is the row index's
 * checkpoints (rowindex.h) and the checksum of every stored chunk
 * (filecheck.h, stream.h).  Both depend only on the file's bytes, so
 * they are kept in the cache folder (cachedir.h) under the name of the
 * file's identity key, and a kept index is taken only when everything it
 * was made for is the same: the file's device, inode, size and
 * modification time as the dataset opened it (besides the key, which
 * also hashes its first and last MiB), the matrix group, the shape of
 * the stream (length, chunks, chunk length), the pointer arrays' sizes
 * and the checkpoint stride.  Its own bytes carry a checksum.  Anything
 * else is "no kept index" and the pass runs as before.
 *
 * A loaded index skips the pass's checks of the stream (well-formed
 * varints, indices below n_minor, no duplicate in a slice): they held
 * when the same bytes were indexed, and every chunk read is still
 * checked against its kept checksum, so a file changed since fails its
 * reads as it would have after a pass.
 *
 * Format (native byte order; the magic tells another): the header below,
 * then n_ckpt uint64 offsets, then n_chunks uint64 sums, then one uint64
 * iv_file_sum of everything before it.
 *
 * Thread rules: plain functions of their arguments; the caller owns the
 * stream and index until the dataset is published.
 */
#ifndef IV_INDEXFILE_H
#define IV_INDEXFILE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "filecheck.h"
#include "rowindex.h"
#include "stream.h"

/* What a kept index must have been made for. */
typedef struct iv_indexfile_for {
    iv_file_id_t file;        /* the packed file as opened */
    const char *group;        /* the matrix group ("X", "layers/counts") */
    uint64_t n_major, n_unique, nnz;
    uint32_t stride;          /* the wanted checkpoint stride */
} iv_indexfile_for_t;

/*
 * Loads the index kept at path into ri (allocated; free with
 * iv_rowindex_free) and seals s with its checksums.  Returns 1 when
 * loaded, 0 when there is none or it was made for something else (*why,
 * when not NULL, says which; nothing changed), or an error (out of
 * memory) with nothing changed.
 */
int iv_indexfile_load(const char *path, const iv_indexfile_for_t *f, iv_stream_t *s,
                      iv_rowindex_t *ri, const char **why, iv_err_t *err);

/* Writes ri and the sealed stream's checksums to path (under a temporary
 * name, renamed into place).  IV_EIO when it cannot be written; a stream
 * with no checksums (in memory) is IV_EUNSUPPORTED. */
int iv_indexfile_save(const char *path, const iv_indexfile_for_t *f, const iv_stream_t *s,
                      const iv_rowindex_t *ri, iv_err_t *err);

/*
 * The pointer and value arrays kept beside the index (the ".arrays"
 * file), so that a restart maps them instead of having the reader
 * process (h5iso.h) read and hand over major_ptr (n_major + 1 int64),
 * value_ptr (n_unique + 1 int64) and values (n_unique of the value
 * dtype), which at ten million cells is most of a restart's time.
 *
 * Kept under the same key as the index and taken only for the same file
 * (device, inode, size, modification time) and matrix group; the counts
 * (n_major, n_unique, nnz) and value dtype it holds are compared with
 * the bare load's (iv_h5matrix_load_bare) by the dataset, which also
 * checks the pointers as any load does.  Its bytes carry checksums,
 * checked over the whole file at every open, so a flipped byte in values
 * is found too.
 *
 * Format (native byte order; the magic tells another): the header below
 * (a multiple of 8 bytes, so that the arrays after it are aligned), then
 * major_ptr, value_ptr, values padded to 8 bytes with zeros, then the
 * uint64 iv_file_sum of the header and of each array's blocks of
 * IV_ARRAYSFILE_BLOCK bytes in order (the blocks, checked apart, let a
 * restart check them on idle workers while the reader process runs).
 *
 * The map is read-only and private (PROT_READ, MAP_PRIVATE): its pages
 * are the page cache's, shared with the file and dropped by the kernel
 * under pressure rather than swapped; nothing writes through it.  The
 * file is written under a temporary name and renamed into place, never
 * written over, so a map taken stays the bytes that were checked.  Unlike
 * the packed file's chunks (read with pread, filecheck.h), a kept file
 * truncated in place under a running server would fault its reads
 * (SIGBUS): the cache folder is the server's own (mode 0700, files 0600),
 * and the server itself only ever renames over or unlinks them.
 */
#define IV_ARRAYSFILE_BLOCK ((uint64_t)16 << 20)

typedef struct iv_arraysfile {
    void *map;                /* the whole file, read-only; NULL when none */
    size_t len;
    int64_t *major_ptr;       /* n_major + 1, inside map */
    int64_t *value_ptr;       /* n_unique + 1, inside map */
    void *values;             /* n_unique of value_dtype, inside map */
    uint64_t n_major, n_unique, nnz;
    int value_dtype;          /* iv_dtype_t */
    size_t n_blocks;          /* checksummed blocks (iv_arraysfile_check_block) */
} iv_arraysfile_t;

/* Maps the arrays kept at path if they were made for file f's group
 * (f->n_major, n_unique, nnz and stride are not compared: the header's
 * are given in *a).  Returns 1 when mapped and its checksums hold, 0
 * when there is none or it is not the one wanted (*why, when not NULL,
 * says which; *a zeroed), or a negative error. */
int iv_arraysfile_map(const char *path, const iv_indexfile_for_t *f, iv_arraysfile_t *a,
                      const char **why, iv_err_t *err);

/* The same in two steps, for a caller that checks the sums on other
 * threads: open maps the file and checks its header and size only (1, 0
 * with *why, or an error, as map); then every block i in [0, n_blocks)
 * must pass iv_arraysfile_check_block (1: its sum holds; any thread, at
 * once) before the arrays are used.  A block that fails: unmap, the
 * file is "damaged". */
int iv_arraysfile_open(const char *path, const iv_indexfile_for_t *f, iv_arraysfile_t *a,
                       const char **why, iv_err_t *err);
int iv_arraysfile_check_block(const iv_arraysfile_t *a, size_t i);

/* Unmaps what iv_arraysfile_map mapped (none: nothing) and zeroes *a. */
void iv_arraysfile_unmap(iv_arraysfile_t *a);

/* Writes the arrays for f (f->n_major, n_unique, nnz give their lengths;
 * value_dtype their element) to path, under a temporary name renamed
 * into place.  IV_EIO when it cannot be written. */
int iv_arraysfile_save(const char *path, const iv_indexfile_for_t *f, const int64_t *major_ptr,
                       const int64_t *value_ptr, const void *values, int value_dtype,
                       iv_err_t *err);

#endif /* IV_INDEXFILE_H */
