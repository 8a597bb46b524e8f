/*
 * Decoded major slices kept for the X chunks they span (see zarr_chunk.c).
 *
 * A slice longer than a chunk (a gene expressed in half a million cells
 * spans ten chunks of 65,536 entries) is cut by every chunk it crosses,
 * and a chunk can only copy out its part after decoding the slice whole:
 * the slice's order is its minor indices', which the value-grouped stream
 * gives only once every group is read.  Vitessce asks for all of a gene's
 * chunks at once, so without this each of them decoded the same slice
 * again.  Here the first chunk decodes it and the others, waiting for
 * that decode if it runs, copy from it.
 *
 * A slice is kept while its decoded block fits the memo's byte bound; a
 * larger one is decoded by each chunk, as before.  Threads: any; one
 * mutex, held while a slice is looked up, never while one is decoded.
 */
#ifndef IV_ZARR_SLICES_H
#define IV_ZARR_SLICES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "query.h"

typedef struct iv_zarr_slices iv_zarr_slices_t;

/* A memo of at most max_bytes of decoded slices; NULL when out of memory. */
iv_zarr_slices_t *iv_zarr_slices_new(size_t max_bytes);
void iv_zarr_slices_free(iv_zarr_slices_t *m);

/* Decodes slice j of the matrix into one block (ids {j}). */
typedef int (*iv_zarr_slice_fn)(void *ctx, int64_t j, iv_block_t *out, iv_err_t *err);

/*
 * Slice j of (mx, csr) as a block: from m, or decoded by fn (once: the
 * callers of the same time wait for it).  bytes is the block's size from
 * the pointers; a slice above m's bound, or m NULL, is decoded into
 * *scratch and *out points at it.  On 0, *out stays valid until
 * iv_zarr_slices_release(m, *out, scratch), which the caller must call
 * whatever it did with it.
 */
int iv_zarr_slices_get(iv_zarr_slices_t *m, const void *mx, int csr, int64_t j, size_t bytes,
                       iv_zarr_slice_fn fn, void *ctx, iv_block_t *scratch, const iv_block_t **out,
                       iv_err_t *err);
void iv_zarr_slices_release(iv_zarr_slices_t *m, const iv_block_t *b, iv_block_t *scratch);

#endif
