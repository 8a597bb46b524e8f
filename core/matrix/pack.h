/*
 * `ivserve pack`: writes an IVCSR or IVCSC .h5ad from an anndata .h5ad.
 *
 * Input: the matrix at `matrix` (X, layers/NAME, raw/X) stored as
 * anndata's csr_matrix or csc_matrix (0.8 encoding attributes or 0.7
 * h5sparse attributes), a dense 2-D array, or an IVCSR/IVCSC group (a
 * top-level one), of any integer or float dtype; compressed datasets read
 * through HDF5 with the project's decoders registered.
 *
 * Output: OUT with the packed matrix in top-level group `group` (X by
 * default) written as FORMAT.md section 2 says, and every other element
 * of the input copied with H5Ocopy (never decoded); with `layers`, the
 * sparse and dense layers and raw/X packed too, at their own paths.  The file is written
 * under a temporary name beside OUT and renamed over OUT at the end, so
 * OUT is either the old file or the complete new one.
 *
 * Memory: a slab of input slices (a few million entries) plus the chunk
 * slots of the writers when the orientation is kept.  Changing it (CSR
 * to IVCSC, CSC to IVCSR, dense to IVCSC, IVCSR to IVCSC, ...) counts the
 * entries of each output slice in a first pass, then fills bands of
 * output slices whose entries fit `memory_budget`, one pass over the
 * input per band: the decoded matrix is never held whole.  A packed input
 * turned around goes instead through the transpose engine (transpose.h)
 * window by window, its temporary and window buffer taking what the
 * budget leaves after the per-slice arrays and the input's pointers.
 *
 * Thread rules: one call runs on the calling thread and uses the pool for
 * encoding slices and compressing chunks.  Separate calls are independent.
 */
#ifndef IV_PACK_H
#define IV_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "dtype.h"
#include "error.h"
#include "h5write.h"
#include "pool.h"

typedef struct iv_pack_progress {
    double fraction;          /* 0..1 of the whole job */
    int64_t slices_done;      /* output slices (rows for IVCSR) written */
    int64_t n_slices;
    uint64_t bytes_read;      /* input bytes decoded so far (indices + values) */
    int pass, n_passes;       /* 1-based pass over the input, and how many */
} iv_pack_progress_t;

typedef void (*iv_pack_progress_fn)(void *ctx, const iv_pack_progress_t *p);

typedef struct iv_pack_opts {
    const char *matrix;       /* input element; NULL = "X" */
    const char *group;        /* output group; NULL = "X" */
    iv_orient_t orient;       /* output orientation */
    iv_h5w_codec_t codec;     /* of every matrix dataset */
    uint64_t chunk_bytes;     /* packed_indices chunk; 0 = IV_PACK_DEFAULT_CHUNK */
    size_t memory_budget;     /* entry buffers when transposing; 0 = half the memory available, at least 2 GiB */
    iv_pool_t *pool;          /* may be NULL */
    iv_pack_progress_fn progress;
    void *progress_ctx;
    /* Also pack every csr_matrix, csc_matrix and dense member of `layers`
     * and raw/X into IVCSR/IVCSC groups at the same paths (the orientation
     * of X), so that the server serves them as matrices of the dataset;
     * other members are copied as they are.  Only with matrix and group X. */
    int layers;
    /* Write the packed matrix only: no other element of the input is
     * copied (the server's other orientation in its cache folder needs
     * nothing else; the source file keeps obs, var and the rest). */
    int matrix_only;
    /* A packed (IVCSR/IVCSC) input whose orientation changes, without
     * layers, goes through the in-memory transpose's engine window by
     * window (transpose.h), its temporary sized from memory_budget: 1 by
     * init; 0 takes the general count-and-bands path (--transpose-engine
     * off).  The engine refusing the input (too many distinct values)
     * falls back to that path, as the report says. */
    int transpose_engine;
    /* For tests, 0 otherwise: the engine's temporary and window buffer
     * in bytes, instead of what memory_budget leaves (many windows on a
     * small matrix). */
    uint64_t engine_window_bytes;
    /* 1: the engine's resumed windows decompress the input again each
     * window instead of reading an uncompressed replica of it written
     * beside the output (--engine-replica off; transpose.h). */
    int no_replica;
    /* A plain copy of the input's stream (plainfile.h) the engine reads as
     * its replica instead of writing one, when it was made from the input
     * (--engine-replica-from; the server passes the copy it keeps). */
    const char *replica_from;
    /* A cache folder holding the input's kept row index and pointer
     * arrays (indexfile.h, arraysfile.h), which the engine's open of the
     * input reads instead of making them again; it writes none there
     * (--engine-index-from; the server passes its own). */
    const char *index_dir;
} iv_pack_opts_t;

/* The packed_indices chunk length chosen from benchmarks/README.md's table. */
#define IV_PACK_DEFAULT_CHUNK (16u << 10)

typedef struct iv_pack_report {
    int64_t n_rows, n_cols, nnz, n_unique;
    iv_dtype_t dtype;
    char input_kind[32];      /* "csr_matrix", "csc_matrix", "dense", "ivcsr", "ivcsc" */
    uint64_t stream_bytes;    /* packed_indices length */
    uint64_t stored_bytes;    /* compressed bytes of the four matrix datasets */
    uint64_t input_bytes;     /* input bytes decoded, all passes */
    int n_passes;
    char dropped[512];        /* input elements not carried over, comma-separated */
    char packed[1024];        /* with layers: the members packed ("layers/counts, raw/X") */
    /* How a change of orientation of a packed input ran: "engine, N
     * windows", or "count and bands" with why (engine off, or the
     * engine's refusal); "" otherwise. */
    char transpose[512];
} iv_pack_report_t;

/* Zstd level 1, orientation IVCSR, defaults elsewhere. */
void iv_pack_opts_init(iv_pack_opts_t *o);

/* The temporary name iv_pack_file writes before renaming to out_path
 * (out_path + ".tmp" + the process id), for a caller that removes it
 * when interrupted. */
void iv_pack_temp_name(const char *out_path, char *buf, size_t cap);

/* Packs in_path into out_path.  0, or a negative IV_E* with err naming the
 * file, the element and the check that failed; OUT is then untouched. */
int iv_pack_file(const char *in_path, const char *out_path, const iv_pack_opts_t *o,
                 iv_pack_report_t *rep, iv_err_t *err);

#endif /* IV_PACK_H */
