/*
 * Small HDF5 helpers shared by the file readers and writers.  Any thread
 * that may call HDF5 (see h5iso.h for where that is allowed).
 */
#ifndef IV_H5UTIL_H
#define IV_H5UTIL_H

#include <hdf5.h>
#include <stddef.h>

#include "dtype.h"

/* Our dtype of an HDF5 integer or IEEE binary32/64 float type (the file
 * types a matrix's values may have); -1 for anything else. */
int iv_h5_dtype_of(hid_t t, iv_dtype_t *out);

/* The native memory type of a dtype (H5T_NATIVE_*), or -1 for none. */
hid_t iv_h5_native(iv_dtype_t t);

/* Reads a scalar string attribute (variable or fixed length) into buf
 * (cut to cap - 1 bytes).  0, or -1 when absent, not a scalar string or
 * unreadable (buf is then ""). */
int iv_h5_read_str_attr(hid_t obj, const char *name, char *buf, size_t cap);

#endif /* IV_H5UTIL_H */
