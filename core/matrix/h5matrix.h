/*
 * The HDF5 side of a dataset: open a .h5ad read-only, find the IVCSR/IVCSC
 * group, validate its attributes and arrays (FORMAT.md section 2), load
 * the pointer and value arrays, map the file and describe where the
 * packed index bytes live (an in-place range or a table of chunks).
 *
 * This is the only engine file that calls HDF5 for the matrix, and it
 * runs at start-up only, in a reader process (h5iso.h): a damaged file
 * that crashes libhdf5 fails this load with an error, not the caller.
 * The results cross back as bytes and are checked again here (counts,
 * chunk offsets against the file's size, the pointer arrays).
 * Everything it returns is plain memory plus the file, open read-only in
 * the caller's process (filecheck.h: packed chunks are read from it with
 * pread, never mapped, so that a file written over under a running server
 * is an error and not a SIGBUS); the caller owns it and frees it with
 * iv_h5matrix_free().  A contiguous packed_indices comes back as a table
 * of virtual 1 MiB chunks of that range, so that it is read and cached
 * like stored chunks.  Checks that need the packed bytes themselves
 * (varint count, index bounds) belong to the row-index pass.
 */
#ifndef IV_H5MATRIX_H
#define IV_H5MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "stream.h"

typedef struct iv_h5matrix {
    iv_orient_t orient;
    int64_t n_rows, n_cols, n_major, n_minor;
    int64_t nnz, n_unique;
    int64_t *major_ptr;       /* n_major + 1 */
    int64_t *value_ptr;       /* n_unique + 1 */
    void *values;             /* n_unique elements of value_dtype */
    iv_dtype_t value_dtype;
    iv_dtype_t indices_dtype;
    uint64_t file_len;        /* the file's size at load */
    iv_stream_desc_t stream;  /* packed_indices; arrays and file handed to iv_stream_create */
    uint64_t stored_bytes;
    char codec[64];
    char chunk_index[32];     /* how the chunk table was read ("" when not chunked) */
} iv_h5matrix_t;

/* Opens path and loads group (NULL = "X"; a path such as "layers/counts"
 * is taken too).  Errors name the file, the
 * dataset or attribute and the failed check; a crash of the reader names
 * what it was reading (see iv_h5iso_run).  Blocks the calling thread for
 * the load; any thread may call it, concurrently. */
int iv_h5matrix_load(const char *path, const char *group, iv_h5matrix_t *m, iv_err_t *err);

/* The same, telling fn(ctx, length, chunk_len) as soon as packed_indices
 * looks like a chunked byte array (its extent and chunk length), before
 * the pointer arrays and the chunk table load, which take most of the
 * time.  Nothing is validated yet then: the load may still fail. */
typedef void (*iv_h5matrix_stream_fn)(void *ctx, uint64_t length, uint64_t chunk_len);
int iv_h5matrix_load_notify(const char *path, const char *group, iv_h5matrix_stream_fn fn,
                            void *ctx, iv_h5matrix_t *m, iv_err_t *err);

/* The same load without the pointer and value arrays, for a caller that
 * has them from elsewhere (the cache folder, indexfile.h): major_ptr,
 * value_ptr and values stay NULL; their lengths (n_unique), value_dtype
 * and nnz (value_ptr's last element) are read; the pointers are not
 * checked.  The caller sets the arrays and runs
 * iv_h5matrix_check_pointers before any use, and clears them before
 * iv_h5matrix_free when they are not malloc's. */
int iv_h5matrix_load_bare(const char *path, const char *group, iv_h5matrix_stream_fn fn,
                          void *ctx, iv_h5matrix_t *m, iv_err_t *err);

/* Frees what load allocated and still owns (the stream arrays too, unless
 * they were handed over: the caller then zeroes m->stream first). */
/* The same load in this process, for command-line tools that already hold
 * the file open with HDF5 (ivserve pack): a fork would copy that state.
 * A damaged file can then crash the tool, never the server. */
int iv_h5matrix_load_inproc(const char *path, const char *group, iv_h5matrix_t *m, iv_err_t *err);

void iv_h5matrix_free(iv_h5matrix_t *m);

/*
 * The matrices of a file besides X: every member of `layers` (in name
 * order, at most 1024) and `raw/X`, each with its encoding-type, its shape
 * (-1 when unknown) and whether it is a packed IVCSR/IVCSC group; the
 * others carry the reason they cannot be served as they are (a plain
 * csr_matrix, a dense array, ...).  raw_var: the file has raw/var.  Read
 * in a reader process (h5iso.h); nothing is validated beyond that: the
 * caller opens each packed one with iv_dataset_open (group = its name).
 * An absent `layers` or `raw` lists nothing.  Any thread.
 */
typedef struct iv_h5mx_entry {
    char name[256];           /* "layers/counts", "raw/X" */
    char encoding[32];        /* its encoding-type ("ivcsr", "csr_matrix", "array", ...) or "" */
    int64_t shape[2];
    int packed;
    char reason[192];         /* not packed: why it is not servable */
} iv_h5mx_entry_t;

typedef struct iv_h5mx_list {
    iv_h5mx_entry_t *v;
    size_t n;
    int raw_var;
} iv_h5mx_list_t;

int iv_h5matrix_list(const char *path, iv_h5mx_list_t *out, iv_err_t *err);
void iv_h5mx_list_free(iv_h5mx_list_t *l);

/* One element (name: "X", "layers/counts") described as the list
 * describes each: its encoding ("array" for a dataset), shape, whether it
 * is packed.  IV_EBAD_FILE when the file has no such element.  Forks a
 * reader process; any thread. */
int iv_h5matrix_describe(const char *path, const char *name, iv_h5mx_entry_t *out, iv_err_t *err);

/* Validates the pointer arrays against each other and the shape (no I/O). */
int iv_h5matrix_check_pointers(const iv_h5matrix_t *m, const char *where, iv_err_t *err);

#endif
