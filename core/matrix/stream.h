/*
 * The packed index stream of one dataset, as a sequence of fixed-size
 * decompressed chunks, with a decompressed-chunk cache.
 *
 * Bytes come from the file, read with pread() through a descriptor
 * (chunks stored compressed, or one contiguous range cut into virtual
 * chunks of 1 MiB), from memory the caller hands over (tests, tools), or
 * from a buffer read at open (compact layout).  Chunks read from the file
 * are checked (filecheck.h): their checksum, taken when the row-index
 * pass first reads them and sealed after it, and the file's identity; a
 * chunk that fails is IV_EFILE_CHANGED, never other bytes.  iv_stream_acquire() returns a pinned, read-only view of chunk
 * c's decompressed bytes; iv_stream_release() unpins it.  Any thread may
 * acquire any chunk.  A hit and a release take no lock; misses and
 * evictions take the stream's mutex, held only for bookkeeping, never
 * while decompressing.
 *
 * Memory: cached bytes stay within the budget, plus the chunks pinned at
 * the moment (a few per decoding thread).  When the last pin of a chunk
 * goes while the stream is over its budget, the release evicts; the
 * least recently listed chunk not used since goes first when a new one
 * needs room (a clock over the LRU list).  A stream that joined a shared budget
 * (iv_stream_join_budget) also stays within that, together with the
 * other streams that joined it.
 */
#ifndef IV_STREAM_H
#define IV_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "error.h"
#include "membudget.h"
#include "filecheck.h"

typedef struct iv_stream iv_stream_t;

typedef struct iv_stream_desc {
    uint64_t length;          /* decompressed bytes (the dataset's extent) */
    int chunked;              /* 0: bytes are at `contig` */
    const uint8_t *contig;    /* contiguous bytes in memory (owned_buf or owned_map) */
    uint8_t *owned_buf;       /* freed by the stream (compact layout), may be NULL */
    void *owned_map;          /* unmapped by the stream (an in-memory copy), may be NULL */
    size_t owned_map_len;
    /* Chunked layout: n_chunks entries, owned by the stream after create. */
    uint64_t chunk_len;       /* decompressed bytes per chunk */
    uint64_t n_chunks;
    const uint8_t *map;       /* chunks in memory (when file is NULL) */
    uint64_t map_len;
    iv_file_t *file;          /* chunks read from this file (owned by the stream), or NULL */
    uint64_t max_stored;      /* file: the largest chunk_size (sizes the read buffers) */
    int file_contig;          /* file: one contiguous range, cut into virtual chunks */
    int no_arena;             /* 1: chunk buffers from malloc, not an arena (small chunks,
                               * whose arena slots would round up to whole pages) */
    /* NULL, all three, for a file's contiguous range cut into virtual
     * chunks without a table (iv_stream_desc_virtual): chunk c is then at
     * contig_addr + c * chunk_len, unfiltered, chunk_len bytes but the last. */
    uint64_t *chunk_addr;     /* offset in the file or map; UINT64_MAX = not allocated (fill) */
    uint64_t *chunk_size;     /* stored bytes */
    uint32_t *chunk_mask;     /* HDF5 filter mask */
    uint64_t contig_addr;
    /* file: each stored chunk's iv_file_sum, 0 until the row-index pass
     * reads it (owned by the stream; NULL = not checked). */
    _Atomic uint64_t *chunk_sum;
    int sums_sealed;          /* set by iv_stream_seal: every sum is taken */
    /* A contiguous file's checksums over pieces of sum_len bytes instead
     * of one a chunk (0: a chunk each): chunk_sum then holds one per
     * piece, chunk_len being a multiple of sum_len, so that one kept set
     * of sums serves the same file read in chunks of any such size
     * (plainfile.h). */
    uint64_t sum_len;
    iv_pipeline_t pipe;
    const char *label;        /* "FILE:/X/packed_indices", for error messages (copied) */
} iv_stream_desc_t;

/*
 * The memory the cache keeps chunks in: one mapping of as many chunk-sized
 * slots as the budget holds (at most one per chunk).  It can be made before
 * the stream, from the stream's extent alone, so that other threads fault
 * its pages in (iv_stream_arena_touch) while the rest of the file loads;
 * the row-index pass then writes into memory that is already there.
 * iv_stream_arena_new returns NULL when there is no arena to make: a budget
 * under one chunk, a build with AddressSanitizer (which must see each
 * buffer's bounds), or a failed mapping.
 */
typedef struct iv_stream_arena iv_stream_arena_t;
iv_stream_arena_t *iv_stream_arena_new(uint64_t length, uint64_t chunk_len, size_t cache_budget);
size_t iv_stream_arena_bytes(const iv_stream_arena_t *a);
/* Faults in the pages of bytes [from, to) of the arena; any thread. */
void iv_stream_arena_touch(iv_stream_arena_t *a, size_t from, size_t to);
void iv_stream_arena_free(iv_stream_arena_t *a);

/* Virtual chunks a contiguous range of a file is read in (the stream's
 * unit of reading and caching). */
#define IV_STREAM_CONTIG_CHUNK ((uint64_t)1 << 20)

/* Makes desc the chunk table of a contiguous, unfiltered range of `len`
 * bytes at file offset addr, in IV_STREAM_CONTIG_CHUNK virtual chunks.
 * 0, or -1 when out of memory (the arrays made so far are desc's). */
int iv_stream_desc_contig(iv_stream_desc_t *desc, uint64_t addr, uint64_t len);
/* The same in virtual chunks of chunk_len bytes (> 0). */
int iv_stream_desc_contig_len(iv_stream_desc_t *desc, uint64_t addr, uint64_t len, uint64_t chunk_len);
/* The same without a table: nothing allocated (20 bytes a chunk saved,
 * 70 MB for the wide copy of ten million cells in 4 KiB chunks). */
void iv_stream_desc_virtual(iv_stream_desc_t *desc, uint64_t addr, uint64_t len, uint64_t chunk_len);

/* The checksums a desc has: one per chunk, or per sum_len piece. */
uint64_t iv_stream_desc_n_sums(const iv_stream_desc_t *desc);

/* Takes ownership of desc's arrays and owned_buf (also on failure). */
int iv_stream_create(iv_stream_desc_t *desc, size_t cache_budget, iv_stream_t **out, iv_err_t *err);
/* The same, with an arena made ahead for this stream's extent and chunk
 * length, which the stream takes over (also on failure); NULL = none made. */
int iv_stream_create_in(iv_stream_desc_t *desc, size_t cache_budget, iv_stream_arena_t *arena,
                        iv_stream_t **out, iv_err_t *err);
void iv_stream_destroy(iv_stream_t *s);

uint64_t iv_stream_length(const iv_stream_t *s);
uint64_t iv_stream_chunk_len(const iv_stream_t *s);
/* Asks memory early for what reading bytes [off, off + len) will touch:
 * with len 0 the slot of off's chunk; otherwise those bytes (at most
 * IV_STREAM_PREFETCH_MAX, in off's chunk and the next) where their chunk
 * is resident.  Only a hint: nothing is pinned, read or checked, and a
 * chunk that is not resident is left alone.  Any thread. */
enum { IV_STREAM_PREFETCH_MAX = 2048 };
void iv_stream_prefetch(iv_stream_t *s, uint64_t off, uint64_t len);
uint64_t iv_stream_n_chunks(const iv_stream_t *s);

/* Pins chunk c and returns its bytes (len = chunk_len, shorter for the
 * last).  Decompresses on a miss; a corrupt chunk is IV_ECORRUPT naming
 * the stream and chunk.  *decompressed (may be NULL) receives the bytes
 * decompressed by this call (0 on a hit). */
int iv_stream_acquire(iv_stream_t *s, uint64_t c, const uint8_t **data, size_t *len,
                      uint64_t *decompressed, iv_err_t *err);
void iv_stream_release(iv_stream_t *s, uint64_t c);

/*
 * Shares the process-wide budget mb with other streams (membudget.h): the
 * stream's own budget becomes a cap, and other streams' pressure leaves
 * it at least `floor` cached bytes.  Call once, before the stream is used
 * by other threads; a contiguous stream (nothing cached) does not join.
 * The stream leaves the budget when destroyed.
 */
void iv_stream_join_budget(iv_stream_t *s, iv_membudget_t *mb, size_t floor);
/* After the row-index pass: takes the checksum of any stored chunk the
 * pass did not read (none, when it succeeded) and from then on checks
 * every read against them instead of learning.  Before the stream is
 * shared with other threads. */
int iv_stream_seal(iv_stream_t *s, iv_err_t *err);
/*
 * The checksums of a sealed stream read from a file, for keeping them
 * with the row index (indexfile.h): copies n_chunks sums into out (0 for
 * a chunk not allocated) and returns n_chunks; 0 when the stream has
 * none (memory, or not sealed).  iv_stream_seal_with seals a stream with
 * sums kept from an earlier pass over the same file instead of a pass:
 * n must be n_chunks (the pieces' count with sum_len) and every
 * allocated chunk's sum non-zero (IV_ECORRUPT otherwise).  Before the
 * stream is shared.
 */
uint64_t iv_stream_sums(const iv_stream_t *s, uint64_t *out);
int iv_stream_seal_with(iv_stream_t *s, const uint64_t *sums, uint64_t n, iv_err_t *err);
/* The file chunks are read from, or NULL (memory); owned by the stream. */
iv_file_t *iv_stream_file(const iv_stream_t *s);

typedef struct iv_stream_stats {
    size_t budget, used, pinned_over_budget;
    size_t shared_budget;     /* the process-wide budget joined, 0: none */
    size_t floor;
    size_t owned_bytes;       /* stream bytes held in memory (compact layout, in-memory copy) */
    size_t table_bytes;       /* chunk table and slots */
    size_t scratch_bytes;     /* decode scratch buffers kept for reuse */
    uint64_t hits, misses, evictions, bytes_decompressed;
    uint64_t budget_evictions;   /* chunks taken by the shared budget's pressure */
} iv_stream_stats_t;
void iv_stream_stats(iv_stream_t *s, iv_stream_stats_t *out);
void iv_stream_drop_cache(iv_stream_t *s);

#endif
