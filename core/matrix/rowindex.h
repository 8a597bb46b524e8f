/*
 * The per-slice byte index the format does not store.
 *
 * iv_rowindex_build() makes one parallel pass over the whole packed
 * stream, one task per chunk (memory bounded by the chunks in flight): it
 * counts varint terminators per chunk, checks that the stream holds
 * exactly nnz varints, that each is well formed, that no decoded index
 * reaches n_minor and that no slice lists a minor index twice (in two of
 * its value groups: the queries could only refuse it), and records the
 * byte offset where every stride-th major slice starts.  The
 * index costs 8 bytes per `stride` slices.  To reach slice r, a reader
 * seeks to checkpoint r / stride and skips the varints of the slices in
 * between, which it finds from the pointer arrays.
 */
#ifndef IV_ROWINDEX_H
#define IV_ROWINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "pool.h"
#include "stream.h"

/* Every slice its own checkpoint.  Measured on 16 cores at 10 M cells
 * (10,000 random cells x 2,000 genes, 64 connections), a stride of 4
 * spent 8% of the server's CPU skipping the slices between a checkpoint
 * and the one wanted, bytes read from memory only to be passed over; the
 * index's 8 bytes a slice (80 MB at 10 M cells) are small beside the
 * pointer arrays' 240. */
#define IV_ROWINDEX_DEFAULT_STRIDE 1

typedef struct iv_rowindex {
    uint32_t stride;
    uint64_t n_ckpt;
    uint64_t *off;        /* n_ckpt offsets: where slice j*stride's first varint starts */
} iv_rowindex_t;

typedef struct iv_rowindex_src {
    iv_stream_t *s;
    const int64_t *major_ptr, *value_ptr;
    int64_t n_major, n_unique, nnz, n_minor;
    const char *where;    /* for messages: "FILE:/X" */
} iv_rowindex_src_t;

int iv_rowindex_build(const iv_rowindex_src_t *src, uint32_t stride, iv_pool_t *pool,
                      iv_rowindex_t *out, iv_err_t *err);
void iv_rowindex_free(iv_rowindex_t *ri);

/* Checkpoint for slice r: stream offset of slice (r / stride) * stride and
 * the number of varints from there to slice r's first one. */
static inline void iv_rowindex_locate(const iv_rowindex_t *ri, const int64_t *major_ptr,
                                      const int64_t *value_ptr, int64_t r, uint64_t *off,
                                      uint64_t *skip)
{
    int64_t j = r / ri->stride;
    *off = ri->off[j];
    *skip = (uint64_t)(value_ptr[major_ptr[r]] - value_ptr[major_ptr[j * ri->stride]]);
}

size_t iv_rowindex_bytes(const iv_rowindex_t *ri);

#endif
