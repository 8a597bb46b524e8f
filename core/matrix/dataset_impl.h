/* Internals of iv_dataset_t shared by dataset.c, transpose.c and query.c only. */
#ifndef IV_DATASET_IMPL_H
#define IV_DATASET_IMPL_H

#include <stdatomic.h>

#include "dataset.h"
#include "h5matrix.h"
#include "indexfile.h"
#include "rowindex.h"
#include "stream.h"

struct iv_dataset {
    char path[4096];
    char group[256];
    char where[4400];
    iv_h5matrix_t m;          /* pointers, values, mapping */
    /* When m's pointer and value arrays point into a kept file mapped
     * from the cache folder (indexfile.h), that map: unmapped, not freed,
     * where the arrays go (dataset.c release_matrix). */
    iv_arraysfile_t arrays;
    iv_stream_t *stream;
    iv_rowindex_t ri;
    iv_dataset_info_t info;
    /*
     * The same matrix in the other orientation, or NULL: an in-memory copy
     * built after open (transpose.c) or a companion file.  It is a whole
     * dataset of its own (pointers, stream, row index), so the query code
     * runs over it unchanged.  Published once with a release store when it
     * is complete; readers load it with acquire and may use it until the
     * dataset closes.  other_state says how far its building got.
     */
    _Atomic(struct iv_dataset *) other;
    atomic_int other_state;   /* iv_other_state_t */
    iv_other_source_t other_source;   /* set before other is published */
    double other_seconds;     /* set before other is published */
    /* The global budget an in-memory other orientation was charged to, and
     * how much: given back when the dataset closes (a reload that drops or
     * replaces it would otherwise leave later builds skipped). */
    struct iv_budget *other_budget;
    uint64_t other_charged;
    int is_copy;              /* this dataset is an in-memory copy (no file mapping) */
    /*
     * Stored entries before each major slice (n_major + 1), or NULL: made
     * by the first query over a large matrix (query.c) and published with
     * a release store.  Planning reads a slice's entry count once per
     * selected slice; through the pointers that is two dependent cache
     * misses (value_ptr[major_ptr[s]]), through this array one.
     */
    _Atomic(int64_t *) nnz_at;
    /*
     * The plain copy of a compressed stream (plainfile.h), or NULL:
     * published once with a release store (iv_dataset_use_plain), read by
     * the queries through iv_dataset_read_stream, destroyed at close.
     * plain_at is its path; plain_dropped is set once a read of it failed
     * its checks (the file is then removed and queries read `stream`).
     */
    _Atomic(iv_stream_t *) plain;
    char plain_at[4400];
    atomic_int plain_dropped;
    /* The wide copy (widefile.h), or NULL: published, read and dropped as
     * the plain copy is (iv_dataset_use_wide, iv_dataset_wide_stream). */
    _Atomic(iv_stream_t *) wide;
    char wide_at[4400];
    atomic_int wide_dropped;
};

/* The stream a query reads: the plain copy while it is published and
 * sound and the source file unchanged, else the dataset's own.  Any
 * thread. */
iv_stream_t *iv_dataset_read_stream(iv_dataset_t *ds);

/* The wide copy a query reads the minor indices from: the published one
 * while it is sound and the source file unchanged, else NULL (the packed
 * stream); dropped, as the plain copy is, once its file failed a read's
 * checks.  iv_dataset_drop_wide: a read of it failed (the drop, when the
 * checks are why).  Any thread. */
iv_stream_t *iv_dataset_wide_stream(iv_dataset_t *ds);
void iv_dataset_drop_wide(iv_dataset_t *ds);

/* Memory a dataset's matrix takes now: pointer and value arrays, row
 * index, and its stream's resident bytes (the cache, or the whole
 * in-memory copy). */
size_t iv_dataset_memory_of(iv_dataset_t *ds);

#endif
