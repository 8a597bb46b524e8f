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
#include "zarr_kept.h"
#include "zarr_slices.h"

typedef struct iv_zarr_cache iv_zarr_cache_t;

/* NULL when out of memory (the store then decodes every request). */
iv_zarr_cache_t *iv_zarr_cache_new(void);
void iv_zarr_cache_free(iv_zarr_cache_t *c);

/* Fills parts[0] with chunk k's indices and parts[1] with its values,
 * each as it goes on the wire (encoded per the array's compressor); both
 * come empty.  Returns 0 or a negative error. */
typedef int (*iv_zarr_fill_fn)(void *ctx, iv_buf_t parts[2], iv_err_t *err);

/*
 * Appends chunk (mx, csr, chunk, k)'s indices (want_val 0) or values to
 * out (mx: the matrix, X or another, as a key): from the cache, or
 * filled once by fill while the requests for the same chunk wait for it
 * (a client asks for both parts at once).  c may be NULL: fill into
 * scratch buffers every time.
 */
int iv_zarr_cache_get(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                      int want_val, iv_buf_t *out, iv_zarr_fill_fn fill, void *ctx, iv_err_t *err);

/* Gives c the kept chunks k (zarr_kept.h) of matrix mx's orientation csr
 * at chunk entries a chunk, served from then on by
 * iv_zarr_cache_kept_read and closed with c.  -1 (k still the caller's)
 * when c is NULL or has that orientation's already. */
int iv_zarr_cache_keep(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, iv_zarr_kept_t *k);

/* Appends part want_val of chunk k of (mx, csr, chunk) to out from the
 * kept chunks: 1 when served, 0 when none are kept for it (the caller
 * decodes), IV_ENOMEM.  A read that fails its checks drops the kept
 * file (it is removed, and decoded chunks serve from then on): 0. */
int iv_zarr_cache_kept_read(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                            int want_val, iv_buf_t *out, iv_err_t *err);

/* The kept file's bytes of orientation csr (0: none) and whether it was
 * dropped. */
void iv_zarr_cache_kept_state(iv_zarr_cache_t *c, int csr, uint64_t *bytes, int *dropped);

/* The decoded long slices kept with c (zarr_slices.h); NULL when c is. */
iv_zarr_slices_t *iv_zarr_cache_slices(iv_zarr_cache_t *c);

/* The dataset's uns entries (uns.h), read from path on the first call
 * (the callers of the same time wait for that read) and kept; NULL when
 * c is NULL or the read failed (the store then has an empty uns). */
const iv_uns_t *iv_zarr_cache_uns(iv_zarr_cache_t *c, const char *path);

/* The same read, with its outcome: 0 and *out (the entries, kept by c),
 * or the read's error, kept too (a damaged uns is not read again per
 * request; IV_ENOMEM is tried again).  c NULL: IV_ENOMEM. */
int iv_zarr_cache_uns_get(iv_zarr_cache_t *c, const char *path, const iv_uns_t **out, iv_err_t *err);

#endif
