/*
 * A dataset: one IVCSR/IVCSC matrix of one .h5ad file, opened read-only,
 * validated, opened for reading and indexed at start-up.
 *
 * iv_dataset_open() does every HDF5 call this matrix will ever need:
 * attributes, pointer and value arrays, the chunk table of
 * packed_indices, all in a reader process (h5iso.h) whose crash on a
 * damaged file is this open's error and nobody else's.  Then it builds the row index in one parallel pass over
 * the packed stream (see rowindex.h).  After open returns, a dataset is
 * immutable apart from its chunk cache (internally locked), so any number
 * of threads may query it concurrently.  The hot path reads memory and,
 * on a cache miss, one stored chunk from the file through a descriptor,
 * checked against the checksum the row-index pass took (filecheck.h): a
 * file written over under the server gives IV_EFILE_CHANGED, never a
 * crash or another file's bytes.
 */
#ifndef IV_DATASET_H
#define IV_DATASET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"
#include "membudget.h"
#include "filecheck.h"
#include "pool.h"

typedef enum iv_orient { IV_IVCSR = 0, IV_IVCSC = 1 } iv_orient_t;

typedef struct iv_dataset iv_dataset_t;

typedef struct iv_dataset_opts {
    const char *group;        /* group of the matrix: "X" (NULL), another top-level
                               * name, or a path such as "layers/counts" or "raw/X" */
    uint32_t index_stride;    /* row-index checkpoint every K major slices; 0 = default */
    size_t cache_bytes;       /* decompressed-chunk cache budget; (size_t)-1 = default */
    iv_pool_t *pool;          /* workers for the start-up pass; NULL = caller only */
    /* A process-wide cache budget shared with other datasets, or NULL.
     * With one, cache_bytes is this dataset's cap ((size_t)-1: none but
     * the shared budget) and cache_floor the bytes other datasets'
     * pressure leaves it.  The arena faulted in ahead of the row-index
     * pass is only what the shared budget has free at the time. */
    iv_membudget_t *membudget;
    size_t cache_floor;
    /* A cache folder (cachedir.h) where the row index and chunk checksums
     * are kept (indexfile.h): a later open of the same file reads them
     * instead of making the row-index pass.  NULL: always the pass.  An
     * index is written there (the folder made when absent) only for a
     * stream of at least index_min_bytes: a smaller one's pass is quick. */
    const char *index_dir;
    uint64_t index_min_bytes;
    /* Set by another thread to stop a plain copy being written
     * (iv_dataset_use_plain: IV_ECANCELLED); NULL: never. */
    const atomic_int *stop;
} iv_dataset_opts_t;

/* Sets defaults (group X, stride 0, cache 1 GiB, no shared budget). */
void iv_dataset_opts_init(iv_dataset_opts_t *o);

typedef struct iv_dataset_info {
    const char *path;         /* as given to open */
    const char *group;
    iv_orient_t orient;
    int64_t n_rows, n_cols;   /* shape: cells x genes, whatever the orientation */
    int64_t n_major, n_minor; /* n_rows/n_cols for IVCSR, swapped for IVCSC */
    int64_t nnz;
    int64_t n_unique;         /* number of (slice, value) groups */
    iv_dtype_t value_dtype;
    iv_dtype_t indices_dtype; /* the file's indices_dtype attribute */
    char codec[64];           /* pipeline description of packed_indices */
    char chunk_index[32];     /* how its chunk table was read ("" when not chunked) */
    int chunked;              /* 0 = contiguous packed stream */
    uint64_t stream_bytes;    /* decompressed packed_indices length */
    uint64_t stored_bytes;    /* compressed bytes of packed_indices in the file */
    uint64_t n_chunks;
    uint64_t chunk_len;       /* decompressed bytes per chunk (last may be shorter) */
    uint32_t index_stride;
    size_t index_bytes;       /* memory of the row index */
    double open_seconds;      /* validation + loading */
    double index_seconds;     /* row-index build pass, or reading the kept index */
    int index_kept;           /* 1: the row index was read from index_dir, no pass made */
    int arrays_kept;          /* 1: the pointer and value arrays are mapped from index_dir */
    char arrays_note[96];     /* how the arrays came ("mapped from the cache folder", "read
                               * (none kept)", "read (kept arrays ignored: damaged)");
                               * "" without index_dir */
} iv_dataset_info_t;

int iv_dataset_open(const char *path, const iv_dataset_opts_t *opts, iv_dataset_t **out,
                    iv_err_t *err);
void iv_dataset_close(iv_dataset_t *ds);

const iv_dataset_info_t *iv_dataset_info(const iv_dataset_t *ds);

/* Pointer arrays, loaded at open (read-only, lifetime of ds). */
const int64_t *iv_dataset_major_ptr(const iv_dataset_t *ds);  /* n_major + 1 */
const int64_t *iv_dataset_value_ptr(const iv_dataset_t *ds);  /* n_unique + 1 */
const void *iv_dataset_values(const iv_dataset_t *ds);        /* n_unique, value_dtype */

/*
 * The file a dataset reads (NULL for an in-memory copy), for the watcher
 * (server/watch.c), which compares what the path names now with it; and
 * the worse of its state and its companion file's, with a message (msg
 * may be NULL).  IV_FILE_CHANGED: the matrix can no longer be read in
 * full and queries should be refused (IV_EFILE_CHANGED); a DELETED or
 * REPLACED path leaves the loaded file open and fully served.  Any
 * thread; the file lives as long as ds.
 */
iv_file_t *iv_dataset_file(const iv_dataset_t *ds);
iv_file_state_t iv_dataset_file_state(iv_dataset_t *ds, char *msg, size_t n);

/* Stored entries of major slice i (from the pointers; no decode). */
int64_t iv_dataset_major_nnz(const iv_dataset_t *ds, int64_t i);

typedef struct iv_cache_stats {
    size_t budget, used, pinned_over_budget;
    size_t shared_budget;          /* the process-wide budget, 0: none */
    size_t floor;
    uint64_t hits, misses, evictions;
    uint64_t budget_evictions;     /* chunks the shared budget took */
    uint64_t bytes_decompressed;   /* since open */
} iv_cache_stats_t;
void iv_dataset_cache_stats(iv_dataset_t *ds, iv_cache_stats_t *out);
/* Drops every unpinned cached chunk (benchmarks: cold runs). */
void iv_dataset_cache_drop(iv_dataset_t *ds);

/*
 * Memory a dataset's matrix holds now, by part (bytes; any thread):
 * pointers (major_ptr and value_ptr, 8 bytes an entry), values (one per
 * value group), index (row-index checkpoints, the chunk table and its
 * cache slots), cache (decompressed chunks resident now), stream (a
 * packed stream held in memory whole: compact layout or an in-memory
 * copy), other (the other orientation, all its parts, when ready) and
 * scratch (buffers of multi-stage decoding, kept for reuse).
 * Metadata and obsm arrays are held by other layers (meta.h, obsm.h).
 */
typedef struct iv_dataset_memory {
    size_t pointers, values, index, cache, stream, other;
    size_t scratch;           /* decode scratch buffers (one per thread that decoded at once) */
} iv_dataset_memory_t;
void iv_dataset_memory(iv_dataset_t *ds, iv_dataset_memory_t *out);

/*
 * Both orientations.  A dataset opens in its file's orientation; the other
 * one (gene-major for an IVCSR file, cell-major for an IVCSC one) can be
 * added later, while queries run: built in memory from the decoded stream
 * (iv_dataset_build_other, transpose.h) or read from a companion file that
 * holds the same matrix the other way (iv_dataset_attach_other).  Queries
 * started before it is published use the file's orientation only.
 */
typedef enum iv_other_state {
    IV_OTHER_NONE = 0,        /* nothing asked */
    IV_OTHER_BUILDING,        /* being built or attached */
    IV_OTHER_READY,           /* published: queries may use it */
    IV_OTHER_SKIPPED,         /* over its memory budget */
    IV_OTHER_FAILED,          /* the build or the companion failed (logged by the caller) */
} iv_other_state_t;

typedef enum iv_other_source { IV_SRC_NONE = 0, IV_SRC_MEMORY, IV_SRC_FILE } iv_other_source_t;

typedef struct iv_orient_status {
    iv_orient_t file_orient;        /* the dataset's own orientation */
    iv_other_state_t other_state;
    iv_other_source_t other_source; /* when ready */
    size_t bytes[2];                /* memory per orientation (index IV_IVCSR / IV_IVCSC), 0 = absent */
    uint64_t stream_bytes[2];       /* packed stream length per orientation */
    double other_seconds;           /* time the other one took to build or attach */
    int plain;                      /* the own orientation's plain copy: 0 none, 1 read, 2 dropped */
    int wide;                       /* the own orientation's wide copy: 0 none, 1 read, 2 dropped */
} iv_orient_status_t;

/*
 * The plain copy (plainfile.h): a compressed stream's bytes kept
 * uncompressed in the cache folder, read by queries in its place, so
 * that a random cell missing the chunk cache costs a 4 KiB read instead
 * of a stored chunk's decompression.  iv_dataset_plain_wanted: 1 when ds
 * reads a compressed stream from a file.  iv_dataset_use_plain takes the
 * copy kept in opts->index_dir, or, when there is none and `write`,
 * writes it there first (decompressing on opts->pool), and publishes it
 * with a cache capped like the dataset's own (opts->cache_bytes,
 * opts->membudget): 1 when a kept one was taken, 2 when written, 0 when
 * none is kept and !write, or a negative error with ds unchanged.  One
 * call at a time on a ds; queries may run meanwhile.
 */
int iv_dataset_plain_wanted(const iv_dataset_t *ds);
int iv_dataset_use_plain(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, iv_err_t *err);
/* The published plain copy's path, or NULL (none, or dropped). */
const char *iv_dataset_plain_path(iv_dataset_t *ds);

/*
 * The wide copy (widefile.h): the minor indices as two-byte integers in
 * the cache folder, read by the cell queries that select genes instead
 * of the packed stream's varints.  iv_dataset_wide_wanted: 1 when ds is
 * a file's matrix with some entries and a minor axis of at most
 * IV_WIDE_MAX_MINOR.  iv_dataset_use_wide: as iv_dataset_use_plain (the
 * kept one taken, or written when `write`, decoding the plain copy when
 * there is one, else the packed stream; the same returns).
 */
int iv_dataset_wide_wanted(const iv_dataset_t *ds);
int iv_dataset_use_wide(iv_dataset_t *ds, const iv_dataset_opts_t *opts, int write, iv_err_t *err);
/* The published wide copy's path, or NULL (none, or dropped). */
const char *iv_dataset_wide_path(iv_dataset_t *ds);

/* A snapshot; any thread. */
void iv_dataset_orientations(iv_dataset_t *ds, iv_orient_status_t *out);
/* The other orientation once published, else NULL (any thread). */
iv_dataset_t *iv_dataset_other(const iv_dataset_t *ds);
/* Marks the other orientation as being built/attached, or as skipped or
 * failed (the caller decides; these only change what is reported). */
void iv_dataset_set_other_state(iv_dataset_t *ds, iv_other_state_t st);

/*
 * Opens path (group per opts) as the other orientation of ds and checks
 * that it is the same matrix: opposite orientation, same shape, nnz and
 * value dtype, and the same multiset of stored values, compared as an
 * order-free hash of (value bits, group size) over every value group,
 * which both files give from their pointer and value arrays without
 * decoding (O(groups)).  It cannot see a permutation of the indices; the
 * files' own row-index passes have checked each stream.  A mismatch is
 * IV_EBAD_FILE naming both files and the check; ds is left unchanged.
 * Not thread-safe with itself or iv_dataset_build_other on the same ds.
 */
int iv_dataset_attach_other(iv_dataset_t *ds, const char *path, const iv_dataset_opts_t *opts,
                            iv_err_t *err);

#endif /* IV_DATASET_H */
