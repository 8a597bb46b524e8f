/*
 * Small HDF5 helpers shared by the file readers and writers.  Any thread
 * that may call HDF5 (see h5iso.h for where that is allowed).
 */
#ifndef IV_H5UTIL_H
#define IV_H5UTIL_H

#include <hdf5.h>
#include <stddef.h>

#include "dtype.h"
#include "error.h"

/* Our dtype of an HDF5 integer or IEEE binary32/64 float type (the file
 * types a matrix's values may have); -1 for anything else. */
int iv_h5_dtype_of(hid_t t, iv_dtype_t *out);

/* The native memory type of a dtype (H5T_NATIVE_*), or -1 for none. */
hid_t iv_h5_native(iv_dtype_t t);

/* Reads a scalar string attribute (variable or fixed length) into buf
 * (cut to cap - 1 bytes).  0, or -1 when absent, not a scalar string or
 * unreadable (buf is then ""). */
int iv_h5_read_str_attr(hid_t obj, const char *name, char *buf, size_t cap);

/*
 * Checks that dataset d holds what its shape declares before a reader
 * allocates or decodes by that shape: every chunk of a chunked dataset
 * stored (a missing chunk reads as the fill value, so a few kilobytes
 * could declare terabytes), a contiguous one's bytes all allocated, and
 * no compression ratio past what any codec reaches.  0, or IV_EBAD_FILE
 * with err naming `where`, the shape and what is stored.  Reads the chunk
 * index (one walk): call it where HDF5 may be called and a damaged file
 * cannot take the server down (the writers' guarded child).
 */
int iv_h5_check_stored(hid_t d, const char *where, iv_err_t *err);

/*
 * Refuses a file that holds a dataset this process cannot decode, before
 * anything reads or copies it (libhdf5 fails a read through a missing
 * filter, and can crash copying one with H5Ocopy).  Walks every object
 * reachable from loc (a file or a group) by hard links, and checks each
 * filter of each dataset's pipeline with H5Zfilter_avail and
 * H5Zget_filter_info (decoding enabled): HDF5's built-in filters, the
 * ones iv_h5filters_register() adds (call it first) and any plugin HDF5
 * finds.  path names the file in messages, followed by the element's
 * full name ("FILE:/obsm/X_pca: HDF5 filter 32001 (blosc) is not
 * available; ...").  0, or IV_EUNSUPPORTED naming the first such
 * element and its filter (id and name).  A structure the walk
 * cannot read is left to the readers, which name it.  Call it where HDF5
 * may be called and a damaged file cannot take the server down.
 */
int iv_h5_check_filters(hid_t loc, const char *path, iv_err_t *err);

#endif /* IV_H5UTIL_H */
