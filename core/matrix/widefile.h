/*
 * The wide copy: a matrix's minor indices written out once, to the cache
 * folder, as two-byte integers in the packed stream's order, for the
 * cell queries that select genes (query.c, decode_slice_wide).
 *
 * Why.  A query of 10,000 cells x 2,000 of 33,000 genes reads all of its
 * cells' 7.25 M stored entries to keep about 0.45 M.  Through the packed
 * stream each entry is a delta varint, decoded by a prefix sum before
 * its bit in the selection can be tested (varint_pick.c): half of the
 * query's time at ten million cells on 16 cores.  With the index itself
 * in two bytes, sixteen entries are one load, a gather of their bitmap
 * words and a test (widepick.h), and a slice needs no row index: entry
 * k is at byte 2k, k counted as value_ptr counts.
 *
 * Cost: two bytes a stored entry on disk (14.5 GB at ten million cells
 * of 725 entries, against 9.8 GB for the packed stream), read in
 * IV_PLAIN_CHUNK chunks through the chunk cache, under the same budget.
 * Only for a minor axis of at most 65,536 (genes, as cells are major);
 * anything else keeps the packed stream.
 *
 * Format and checks: a plain copy's (plainfile.h), its data the indices
 * in native byte order, its header naming the source file as opened, the
 * matrix group with WIDE_GROUP_SUFFIX, and the length 2 x nnz.
 *
 * Thread rules: iv_widefile_save reads the dataset's stream from the
 * pool's workers; the dataset must stay open meanwhile.
 */
#ifndef IV_WIDEFILE_H
#define IV_WIDEFILE_H

#include <stdatomic.h>
#include <stdint.h>

#include "dataset.h"
#include "error.h"
#include "plainfile.h"
#include "pool.h"

/* The largest minor axis the wide copy holds (indices 0 .. 65,535). */
#define IV_WIDE_MAX_MINOR 65536

/* Appended to the matrix group in a wide copy's header, so that a plain
 * copy and a wide copy of one matrix are never taken for each other. */
#define IV_WIDE_GROUP_SUFFIX " (uint16 indices)"

/* Writes ds's wide copy to path, decoding the varints of src (ds's own
 * stream or its plain copy, the same bytes) on the pool's workers; every
 * index checked below the minor axis.  f names the source as
 * iv_plainfile_open will want it.  As iv_plainfile_save: IV_ECORRUPT for
 * a stream that lies, IV_EIO, IV_ECANCELLED once *stop is set; nothing
 * left at path then. */
/* Entries [e0, e1) of ds's minor indices (value_ptr's ranks), decoded
 * from src into out: a task of iv_widefile_save, and the tests' way to
 * start one anywhere.  0, IV_ECORRUPT for an index past the minor axis,
 * or src's read error. */
int iv_widefile_fill(const iv_dataset_t *ds, iv_stream_t *src, int64_t e0, int64_t e1, uint16_t *out,
                     iv_err_t *err);

int iv_widefile_save(const char *path, const iv_plainfile_for_t *f, iv_dataset_t *ds, iv_stream_t *src,
                     iv_pool_t *pool, const atomic_int *stop, iv_err_t *err);

#endif
