/*
 * A dataset's Zarr store state: the X chunks decoded last, shared by the
 * requests for X/indices/k and X/data/k (see zarr_cache.c), and the uns
 * entries read once.  Owned by the dataset's viewer state; any thread.
 */
#ifndef IV_ZARR_CACHE_H
#define IV_ZARR_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "uns.h"

typedef struct iv_zarr_cache iv_zarr_cache_t;

/* NULL when out of memory (the store then decodes every request). */
iv_zarr_cache_t *iv_zarr_cache_new(void);
void iv_zarr_cache_free(iv_zarr_cache_t *c);

/* How a chunk's parts are made, in two steps over ctx: decode the chunk
 * (both parts' raw bytes, held by ctx), then encode part p (0: indices,
 * 1: values) as it goes on the wire, appending it to out (empty), for
 * each part wanted.  Both return 0 or a negative error.  The two run on
 * the same thread, decode first. */
typedef struct iv_zarr_filler {
    int (*decode)(void *ctx, iv_err_t *err);
    int (*encode)(void *ctx, int part, iv_buf_t *out, iv_err_t *err);
    void *ctx;
} iv_zarr_filler_t;

/*
 * Appends chunk (mx, csr, chunk, k)'s indices (want_val 0) or values to
 * out (mx: the matrix, X or another, as a key): from the cache, or
 * encoded once by fill while the requests for the same part wait for it.
 * A fill encodes the part asked for and the other part only when a
 * request for it came while the chunk was being decoded (Vitessce asks
 * for both at once); a request for the other part later decodes the
 * chunk again (anndata's read_zarr asks for every chunk's values before
 * any indices: their encoding then waits for the second pass).  c may be
 * NULL: fill into scratch buffers every time.
 */
int iv_zarr_cache_get(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                      int want_val, iv_buf_t *out, const iv_zarr_filler_t *fill, iv_err_t *err);

/* The dataset's uns entries (uns.h), read from path on the first call
 * (the callers of the same time wait for that read) and kept; NULL when
 * c is NULL or the read failed (the store then has an empty uns). */
const iv_uns_t *iv_zarr_cache_uns(iv_zarr_cache_t *c, const char *path);

/* The same read, with its outcome: 0 and *out (the entries, kept by c),
 * or the read's error, kept too (a damaged uns is not read again per
 * request; IV_ENOMEM is tried again).  c NULL: IV_ENOMEM. */
int iv_zarr_cache_uns_get(iv_zarr_cache_t *c, const char *path, const iv_uns_t **out, iv_err_t *err);

#endif
