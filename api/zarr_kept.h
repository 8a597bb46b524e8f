/*
 * X's Zarr chunks kept in the cache folder: both parts of every chunk of
 * X/indices and X/data, encoded as the store serves them (zstd), written
 * once after the dataset loads and read back with pread.
 *
 * Why.  A whole-matrix reader (anndata's read_zarr) asks for every chunk
 * of X at once; computed on request, each costs its decode from the
 * packed stream and its compression, and that compression is two thirds
 * of the server's CPU of such a read (docs/zarr.md, "The first read").
 * A first read then took 3x to 4x the local store's time on two cores.
 * Encoded once in the background and kept, every read, the first
 * included and every read after a restart, costs a read of the kept bytes.
 * Kept for matrices up to a bound of stored entries (zarr_keep_entries in
 * the configuration): the file is about the entries' raw bytes over
 * zstd's ratio, twice (one file an orientation).
 *
 * Checks.  A file is taken only when its header names the same store
 * (IV_ZARR_STORE_FORMAT, the zstd level, the chunking, the orientation,
 * the matrix's shape, dtypes and a checksum of its pointers) and the
 * checksum over its header and table holds; every part read is checked
 * against the checksum taken when it was written (iv_file_sum) and the
 * file against its identity at open (filecheck.h).  The file's name
 * carries the source's identity key (cachedir.h).
 *
 * Format (native byte order; the magic tells another): a header, the
 * table (2 parts a chunk: offset, length, checksum), then the parts'
 * bytes in chunk order.
 *
 * Thread rules: a kept store is immutable once open; iv_zarr_kept_read
 * may be called from any thread at once.
 */
#ifndef IV_ZARR_KEPT_H
#define IV_ZARR_KEPT_H

#include <stdatomic.h>
#include <stdint.h>

#include "buf.h"
#include "dtype.h"
#include "error.h"
#include "pool.h"
#include "zarr.h"

typedef struct iv_zarr_kept iv_zarr_kept_t;

/* What a kept store must have been made for. */
typedef struct iv_zarr_kept_for {
    int csr;                  /* from the cell-major orientation (else gene-major) */
    int64_t chunk;            /* entries a chunk */
    int64_t nnz, n_major, n_minor;
    int idx_size;             /* bytes of an index: 4 or 8 */
    iv_dtype_t val_dtype;
    uint64_t ptr_sum;         /* iv_file_sum of X/indptr's int64 values */
} iv_zarr_kept_for_t;

/* Chunk k's two parts, encoded (indices, values), into parts (empty). */
typedef int (*iv_zarr_chunk_fn)(void *ctx, int64_t k, iv_buf_t parts[2], iv_err_t *err);

/* How a store is written: every chunk's parts from fill (called on the
 * pool's threads and the caller's at once: it must allow that), and when
 * to stop. */
typedef struct iv_zarr_save {
    iv_zarr_chunk_fn fill;
    void *ctx;
    iv_pool_t *pool;          /* NULL: the caller makes every chunk */
    const atomic_int *stop;   /* set: the write stops (may be NULL) */
    size_t width;             /* chunks made at once (0: IV_ZARR_SAVE_WIDTH of the pool) */
    size_t *held;             /* not NULL: set to the most bytes the batch's parts held */
} iv_zarr_save_t;

/* The chunks a write makes at once, at most, and by default: two a pool
 * thread and two more (h5write's batches), at most IV_ZARR_SAVE_MAX. */
#define IV_ZARR_SAVE_MAX 64
#define IV_ZARR_SAVE_WIDTH(threads) \
    (2 * (size_t)(threads) + 2 < IV_ZARR_SAVE_MAX ? 2 * (size_t)(threads) + 2 : IV_ZARR_SAVE_MAX)

/* Writes the store of f to path (under iv_cachedir_temp's name, renamed into place),
 * the chunks made a batch at a time (sv->width of them, on the pool and
 * the caller's thread) and written in order.
 * IV_EIO when it cannot be written, fill's error (the lowest chunk's), or
 * IV_ECANCELLED once *stop is set; nothing is left at path then. */
int iv_zarr_kept_save(const char *path, const iv_zarr_kept_for_t *f, const iv_zarr_save_t *sv, iv_err_t *err);

/* Opens the store at path: 1 with *out set; 0 when there is none or it
 * is not the one wanted (*why: "none kept", "another format", "made for
 * another matrix", "truncated", "damaged"); or a negative error. */
int iv_zarr_kept_open(const char *path, const iv_zarr_kept_for_t *f, iv_zarr_kept_t **out,
                      const char **why, iv_err_t *err);
void iv_zarr_kept_close(iv_zarr_kept_t *k);

/* Appends part (0: indices, 1: values) of chunk k to out.  IV_ECORRUPT
 * when its bytes fail their checksum, IV_EFILE_CHANGED when the file
 * changed since it was opened, IV_ENOMEM; out unchanged then. */
int iv_zarr_kept_read(iv_zarr_kept_t *k, int64_t chunk, int part, iv_buf_t *out, iv_err_t *err);

/* The file's bytes, and its path as opened. */
uint64_t iv_zarr_kept_bytes(const iv_zarr_kept_t *k);
const char *iv_zarr_kept_path(const iv_zarr_kept_t *k);

/* Where iv_zarr_keep_x keeps a dataset's X chunks. */
typedef struct iv_zarr_keep_in {
    const char *dir;          /* the cache folder */
    const char *path;         /* the file the dataset was loaded from (its key names the files) */
    const atomic_int *stop;   /* set: a write stops (may be NULL) */
    iv_pool_t *pool;          /* makes the chunks of a write (NULL: the caller alone) */
    size_t width;             /* chunks a write makes at once (0: IV_ZARR_SAVE_WIDTH of the pool) */
} iv_zarr_keep_in_t;

/* What it did, an orientation each ([1]: csr, [0]: csc). */
typedef struct iv_zarr_keep_out {
    char path[2][4096];       /* the kept file now served, "" when none */
    char note[2][400];        /* "csr: kept (N bytes, s)", "csc: written (...)", "csc: none (why)", ... */
    size_t held;              /* the most bytes a write's batch of parts held */
} iv_zarr_keep_out_t;

/* Keeps X's chunks of both orientations of src's dataset (src->ds, its
 * chunking) in the cache folder, taken when a file is kept for them and
 * written otherwise, and gives them to src->cache, which serves X's
 * chunks from them from then on.  An orientation that is not there (not
 * built, skipped), or a file that cannot be written, is left to the
 * chunks decoded on request, with its note saying why.  On a worker: a
 * write decodes and compresses the whole matrix, on in->pool's workers. */
void iv_zarr_keep_x(const iv_zarr_src_t *src, const iv_zarr_keep_in_t *in, iv_zarr_keep_out_t *out);

/* The most memory iv_zarr_keep_x of src's dataset holds at once when its
 * writes make `width` chunks at a time on a pool of `threads` (its own
 * memory, which the caller reserves from its budget): the batch's
 * encoded parts at their bound, each maker's raw chunk and compression
 * context (a pool thread keeps its context after), and the larger
 * orientation's table and X/indptr. */
size_t iv_zarr_keep_bytes(const iv_zarr_src_t *src, size_t threads, size_t width);

#endif
