/*
 * The other orientation built in memory.
 *
 * iv_dataset_build_other() turns a dataset's packed matrix around (cell
 * major to gene major, or back) into the same packed form: value groups
 * per slice in ascending value order, delta + LEB128 varints, major_ptr,
 * value_ptr and values, held uncompressed in memory as one contiguous
 * stream.  The copy is a dataset of its own, published on the source
 * (iv_dataset_other), so the query code reads it as it reads a file.
 *
 * Memory: the copy must fit `budget` (and what is left of `global`, when
 * given); the check is made on an estimate before anything large is
 * allocated and on the exact size at the end, and a copy over budget is
 * IV_ETOO_LARGE with nothing kept.  Building needs a temporary of about
 * `tmp_bytes` at most (default: four times the source stream's length,
 * at least 64 MiB; when the matrix's entries do not fit it at once, each
 * window's also takes the partly filled last chunks of its chains, at
 * most a quarter more) besides per-band counters and, per encoding
 * worker, buffers of one block's entries (about 1/2048 of a window's, at
 * least 65,536 entries, or one new slice's when that holds more).
 */
#ifndef IV_TRANSPOSE_H
#define IV_TRANSPOSE_H

#include <stdatomic.h>
#include <stdint.h>

#include "dataset.h"
#include "error.h"
#include "pool.h"
#include "stream.h"

/* Bytes shared by several copies (the server's global transpose_bytes). */
typedef struct iv_budget {
    atomic_uint_fast64_t left;
} iv_budget_t;

void iv_budget_init(iv_budget_t *b, uint64_t bytes);
/* Takes n bytes if that many are left: 0, or -1 with nothing taken. */
int iv_budget_take(iv_budget_t *b, uint64_t n);
void iv_budget_give(iv_budget_t *b, uint64_t n);

typedef struct iv_transpose_opts {
    uint64_t budget;          /* bytes the copy may take (0: none) */
    iv_budget_t *global;      /* also charged, or NULL */
    uint64_t tmp_bytes;       /* bound on the temporary; 0 = default */
    iv_pool_t *pool;          /* workers (NULL: the caller only) */
    double *phase_seconds;    /* NULL, or IV_TRANSPOSE_PHASES seconds filled in */
    double *phase_cpu_seconds; /* NULL, or the same phases' CPU seconds (all threads) */
    /* For tests, 0 for the defaults: entries a block aims at, most new
     * slices a block, 8-byte temporary entries even where 4 fit, entries
     * a chunk of the fill's chains (rounded down to a power of two, and
     * up to whole cache lines unless plain_stores), and the fill's plain
     * stores instead of its write combining; resume: 1 resumes each
     * group where the last window left it whatever the bound (its
     * places not counted in it; 2 the same with 12-byte places even
     * where 8 would do), -1 never does (every window's fill
     * decodes the source from each group's start), 0 resumes when the
     * places take at most half the bound (see transpose.c). */
    uint64_t block_entries;
    uint32_t block_slices;
    int wide_entries;
    uint32_t chunk_entries;
    int plain_stores;
    int resume;
    int *resumed_fills;       /* NULL, or counts up each fill that resumed */
    /* A folder where the windows that resume may keep an uncompressed
     * replica of a compressed source stream, read through the page cache
     * instead of decompressed again each window (an unlinked temporary
     * file, gone with the build), or NULL: none.  replica_made, when not
     * NULL, is set to 1 when one was made. */
    const char *replica_dir;
    int *replica_made;
    /* A plain copy of the source stream (plainfile.h) to read as the
     * replica instead of writing one, when it was made from this source;
     * NULL: none.  replica_reused, when not NULL, is set to 1 when it was. */
    const char *replica_from;
    int *replica_reused;
} iv_transpose_opts_t;

/* The replica's chunk cache (besides the source's), and its chunks: a
 * fill's band pins one each, past the cache's bound when they are many. */
#define IV_TRANSPOSE_REPLICA_CACHE ((size_t)16 << 20)
#define IV_TRANSPOSE_REPLICA_CHUNK IV_STREAM_CONTIG_CHUNK

/* Phases timed into opts->phase_seconds (for the benchmarks): value ids,
 * count pass, fill passes, encode, placing, and the copy's pointers. */
enum { IV_TP_VALUES, IV_TP_COUNT, IV_TP_FILL, IV_TP_ENCODE, IV_TP_MOVE, IV_TP_FINISH,
       IV_TRANSPOSE_PHASES };

/*
 * Builds and publishes the other orientation of ds.  Any thread, while
 * queries run on ds; not concurrently with itself or attach_other on the
 * same ds.  Sets ds's other state (building, then ready, skipped or
 * failed).  Errors: IV_ETOO_LARGE (over budget: a skip, not a fault),
 * IV_ECORRUPT (a slice stores an index twice), IV_ENOMEM, IV_EUNSUPPORTED
 * (too many distinct values to pack an entry in 64 bits).
 */
int iv_dataset_build_other(iv_dataset_t *ds, const iv_transpose_opts_t *opts, iv_err_t *err);

/*
 * The other orientation window by window, for a writer (ivserve pack).
 * Each window is the new slices [g0, g1) in the same packed form:
 * `bytes` holds their varints back to back in slice order, each slice's
 * byte length and group count are in slice_bytes / slice_groups (index
 * g - g0), and the groups are listed in order with their value (n_groups
 * values of the source's dtype, back to back) and their entries.  Groups
 * of a slice come in ascending value order as iv_dataset_build_other
 * orders them: numbers by value, 0.0 before -0.0, NaN last ordered by
 * bits, one group for equal bits.
 *
 * Everything a window points at is the engine's and is valid only during
 * the call (its buffers are reused by the next window).
 */
typedef struct iv_transpose_window {
    int64_t g0, g1;               /* new slices */
    const uint8_t *bytes;         /* n_bytes bytes of varints */
    uint64_t n_bytes;
    const uint64_t *slice_bytes;  /* g1 - g0 */
    const uint32_t *slice_groups; /* g1 - g0 */
    const void *values;           /* n_groups values, the source's dtype */
    const uint64_t *group_sizes;  /* n_groups */
    uint64_t n_groups;
    uint64_t entries_done;        /* entries of the windows so far, this one's included */
    uint64_t nnz;                 /* of the whole matrix */
    int count_pass;               /* the source was read once more to count (windows > 1) */
    int window;                   /* which window, from 1: a window can come in several
                                   * pieces, each a run of its slices, in order */
} iv_transpose_window_t;

/* Takes one window: 0, or a negative IV_E* with err set, which stops the
 * transpose and is its result. */
typedef int (*iv_transpose_window_fn)(void *ctx, const iv_transpose_window_t *w, iv_err_t *err);

typedef struct iv_transpose_sink {
    iv_transpose_window_fn window;
    void *ctx;
} iv_transpose_sink_t;

/*
 * Runs the stages of iv_dataset_build_other over ds and hands each window
 * to sink->window, in order, instead of keeping the copy: the copy is
 * never held whole.  Memory: opts->tmp_bytes (0: the default as above)
 * bounds the temporary and the window's output buffer together; besides,
 * per-band counters and per-new-slice arrays (about 8 x bands + 44 bytes
 * a new slice) and the value ids (4 bytes a source group).  opts->budget
 * and opts->global are not used; ds's other orientation is left as it
 * is.  Same threads rules and errors as iv_dataset_build_other, and the
 * sink's.
 */
int iv_transpose_to_sink(iv_dataset_t *ds, const iv_transpose_opts_t *opts, const iv_transpose_sink_t *sink,
                         iv_err_t *err);

#endif
