/*
 * The chunk table of a 1-D chunked dataset, read from the file's own
 * index in one walk.
 *
 * HDF5 1.10 (Debian 12's) answers H5Dget_chunk_info_by_coord by walking
 * the dataset's chunk index from its start until it meets the chunk, so
 * asking for every chunk costs chunks^2 / 2 steps: a 191,000-chunk
 * stream (200,000 cells packed in 1 KiB chunks, or 3 M cells in the
 * default 16 KiB) took over 5 minutes to open.  This reads the version 1
 * B-tree that HDF5 keeps for such datasets (layout message version 3,
 * the layout h5py and our writer make) straight from the file, checking
 * every node against the file's length and the dataset's shape.  Other
 * layouts are not handled here: the caller then asks HDF5 chunk by chunk.
 */
#ifndef IV_H5CHUNKS_H
#define IV_H5CHUNKS_H

#include <hdf5.h>
#include <stdint.h>

#include "error.h"
#include "filecheck.h"

/* Reads exactly len bytes at the absolute offset off into buf, or fails
 * with err set. */
typedef int (*iv_h5_read_fn)(void *ctx, uint64_t off, void *buf, size_t len, iv_err_t *err);

/*
 * The walk itself, on bytes only (no HDF5 call; what the fuzz target
 * drives): the object header at relative address `header`, its layout
 * message, then the B-tree, every byte through read(ctx, ...) at base +
 * a relative address, file_len bounding them all.  Same results and
 * arrays as iv_h5_chunk_table below, which adds the header's address
 * and HDF5's check of the first and last chunk.
 */
int iv_h5_chunk_walk(iv_h5_read_fn read, void *ctx, uint64_t file_len, uint64_t base,
                     uint64_t header, uint64_t chunk_len, size_t elem_size, uint64_t n_chunks,
                     uint64_t *addr, uint64_t *size, uint32_t *mask, const char *where,
                     iv_err_t *err);

/*
 * Fills addr/size/mask[0 .. n_chunks) of dataset d (1-D, chunks of
 * chunk_len elements of elem_size bytes) from its B-tree; a chunk the
 * tree does not hold (never written) gets addr UINT64_MAX and size 0.
 * Addresses are absolute (base, the user block's size, added).  Returns
 * 1 when filled, 0 when the dataset's layout is not one this reads (the
 * arrays are then untouched), < 0 with err set when the index is
 * damaged (a node outside the file, a chunk outside the dataset or
 * listed twice, a tree that loops).
 */
int iv_h5_chunk_table(hid_t d, iv_file_t *f, uint64_t file_len, uint64_t base,
                      uint64_t chunk_len, size_t elem_size, uint64_t n_chunks, uint64_t *addr,
                      uint64_t *size, uint32_t *mask, const char *where, iv_err_t *err);

#endif
