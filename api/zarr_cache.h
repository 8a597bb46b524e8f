/*
 * A dataset's Zarr store state: the X chunks decoded last, shared by the
 * requests for X/indices/k and X/data/k (see zarr_cache.c), and the uns
 * entries read once.  Owned by the dataset's viewer state; any thread.
 */
#ifndef IV_ZARR_CACHE_H
#define IV_ZARR_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "uns.h"

typedef struct iv_zarr_cache iv_zarr_cache_t;

/* NULL when out of memory (the store then decodes every request). */
iv_zarr_cache_t *iv_zarr_cache_new(void);
void iv_zarr_cache_free(iv_zarr_cache_t *c);

/* Fills idx (n_idx bytes) and val (n_val bytes) with chunk k of one X
 * store; returns 0 or a negative error. */
typedef int (*iv_zarr_fill_fn)(void *ctx, uint8_t *idx, uint8_t *val, iv_err_t *err);

/*
 * Copies chunk (mx, csr, chunk, k)'s indices (want_val 0) or values into dst:
 * from the cache, or filled once by fill while the requests for the same
 * chunk wait for it (a client asks for both parts at once).  c may be
 * NULL: fill into scratch buffers every time.
 */
int iv_zarr_cache_get(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k, size_t n_idx,
                      size_t n_val, int want_val, uint8_t *dst, iv_zarr_fill_fn fill, void *ctx,
                      iv_err_t *err);

/* The dataset's uns entries (uns.h), read from path on the first call
 * (the callers of the same time wait for that read) and kept; NULL when
 * c is NULL or the read failed (the store then has an empty uns). */
const iv_uns_t *iv_zarr_cache_uns(iv_zarr_cache_t *c, const char *path);

#endif
