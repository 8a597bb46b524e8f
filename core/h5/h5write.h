/*
 * Writing HDF5 for `ivserve pack` and `ivserve export`: 1-D arrays that
 * grow by appending and are compressed chunk by chunk on the worker pool,
 * anndata-style attributes, and copies of groups and attributes from
 * another file without decoding them (H5Ocopy).
 *
 * Compressed chunks are written with H5Dwrite_chunk, so the filter in the
 * dataset's pipeline is only a label for readers: the zstd chunks are the
 * frames the HDF5 Zstandard plugin (id 32015, cd_values = {level}) writes,
 * one frame with its content size per chunk, and deflate chunks are zlib
 * streams as HDF5's built-in filter 1 (cd_values = {level}) writes them.
 * Both are flagged optional, as h5py and hdf5plugin add them.  The last
 * chunk is padded with zeros to the full chunk length, as HDF5 stores it.
 *
 * An array is written by one thread (appends and finish); compression of
 * full chunks runs on the pool while the caller appends the next ones.
 * Chunks reach the file in order, and the dataset's extent never shrinks
 * (shrinking would make HDF5 rewrite the edge chunk through the filter).
 */
#ifndef IV_H5WRITE_H
#define IV_H5WRITE_H

#include <stddef.h>
#include <stdint.h>

#include <hdf5.h>

#include "dtype.h"
#include "error.h"
#include "pool.h"

typedef enum iv_h5w_codec_kind {
    IV_H5W_NONE = 0,     /* chunked, no filter */
    IV_H5W_ZSTD = 1,     /* filter 32015 */
    IV_H5W_DEFLATE = 2,  /* filter 1 */
} iv_h5w_codec_kind_t;

typedef struct iv_h5w_codec {
    iv_h5w_codec_kind_t kind;
    int level;           /* zstd 1..22 (negative = fast modes), deflate 0..9 */
} iv_h5w_codec_t;

/* Parses "zstd", "zstd:3", "deflate:6", "none" into *c; 0 or -1. */
int iv_h5w_codec_parse(const char *s, iv_h5w_codec_t *c);
/* "zstd-1", "deflate-6", "none". */
void iv_h5w_codec_describe(const iv_h5w_codec_t *c, char *buf, size_t cap);

/* Compresses one chunk (n bytes) into dst (capacity cap, at least
 * iv_h5w_bound(n)); returns the compressed length or 0 on failure.  Any
 * thread; each thread keeps its own compression context. */
size_t iv_h5w_bound(const iv_h5w_codec_t *c, size_t n);
size_t iv_h5w_compress(const iv_h5w_codec_t *c, const void *src, size_t n, void *dst, size_t cap);
/* The memory of the context iv_h5w_compress keeps in a thread that
 * compresses chunks of n bytes with c (zstd's own estimate; 0 for the
 * codecs that keep none). */
size_t iv_h5w_ctx_bytes(const iv_h5w_codec_t *c, size_t n);

typedef struct iv_h5w_array iv_h5w_array_t;

/*
 * Creates dataset `name` in loc: 1-D, element type dt, growable, chunks of
 * chunk_elems elements, filtered by codec.  pool (may be NULL) compresses
 * up to `batch` chunks at a time (0 = two per pool thread).  label names
 * the output in error messages.
 */
int iv_h5w_array_create(hid_t loc, const char *name, iv_dtype_t dt, uint64_t chunk_elems,
                        const iv_h5w_codec_t *codec, iv_pool_t *pool, unsigned batch,
                        const char *label, iv_h5w_array_t **out, iv_err_t *err);
/* Appends n elements. */
int iv_h5w_array_append(iv_h5w_array_t *a, const void *data, uint64_t n, iv_err_t *err);
/* Writes what is left and tags the dataset as an anndata `array`.  The
 * array must still be freed. */
int iv_h5w_array_finish(iv_h5w_array_t *a, iv_err_t *err);
/* Closes the dataset and frees everything (also without finish). */
void iv_h5w_array_free(iv_h5w_array_t *a);
uint64_t iv_h5w_array_length(const iv_h5w_array_t *a);
/* Bytes written to the file so far (compressed chunks). */
uint64_t iv_h5w_array_stored(const iv_h5w_array_t *a);


/* Scalar variable-length UTF-8 string attribute, as h5py writes str. */
int iv_h5w_attr_str(hid_t obj, const char *name, const char *value);
/* 1-D int64 attribute of n elements. */
int iv_h5w_attr_i64(hid_t obj, const char *name, const int64_t *v, size_t n);
/* encoding-type / encoding-version. */
int iv_h5w_attr_encoding(hid_t obj, const char *type, const char *version);


/* Copies every attribute of src onto dst, type and bytes unchanged,
 * except object references (they would point into the source file). */
int iv_h5w_copy_attrs(hid_t src, hid_t dst);

/* H5Ocopy of src_loc/name to dst_loc/dst_name, with the references it
 * holds pointing into the copy.  0 or -1. */
int iv_h5w_copy_object(hid_t src_loc, const char *name, hid_t dst_loc, const char *dst_name);

#endif /* IV_H5WRITE_H */
