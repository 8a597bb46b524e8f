/*
 * A dataset as a read-only Zarr v2 store holding AnnData, computed on
 * request: GET /v1/datasets/{id}/zarr/{key}.  (X's chunks of a small
 * enough matrix are computed once and kept in the cache folder,
 * zarr_kept.h.)
 *
 * Viewers and analysis tools (Vitessce through zarrita, zarr-python with
 * fsspec, anndata's read_zarr) read AnnData stored as Zarr chunk by chunk
 * over HTTP.  This module answers their keys from what the server holds
 * already: the packed matrix (both orientations), the obs/var columns
 * (meta.h) and the obsm/varm arrays (obsm.h).
 *
 * The store's layout (zarr_store.c): root .zgroup/.zattrs (encoding
 * "anndata") and a consolidated .zmetadata; X as a csc_matrix served from
 * the gene-major orientation, so that one gene costs its own chunks; obs
 * and var data frames (index, categorical, numeric, bool, nullable and
 * string columns as anndata writes them); obsm and varm arrays.  The
 * same store with X as a csr_matrix (from the cell-major orientation) is
 * under the prefix "csr/" (a store of its own: "csr/.zmetadata", ...).
 *
 * Chunks (zarr_chunk.c) are the bytes zarr-python writes for the same
 * arrays, chunking and compressor (zstd for the sparse matrices' arrays,
 * IV_ZARR_ZSTD_LEVEL; none for the rest): edge chunks
 * padded with the fill value (0) to the whole chunk shape, strings in
 * numcodecs' vlen-utf8 layout.  Chunk k of X/indices and X/data is the
 * entries [k*C, (k+1)*C) of the orientation's order, decoded from the
 * packed stream (query.h) of the major slices that hold them.
 *
 * Threads: any number of threads may answer keys of the same source at
 * once (everything read is immutable or internally locked).
 */
#ifndef IV_ZARR_H
#define IV_ZARR_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "dataset.h"
#include "error.h"
#include "meta.h"
#include "obsm.h"

/* Entries per chunk of X/indices and X/data (see docs/zarr.md for the
 * measurement that chose it). */
/* The store's format: bumped whenever a key's bytes change for the same
 * dataset (chunk compression, layout), so that HTTP caches holding the
 * old bytes (the store's answers are long-lived) see a new ETag.
 * 2: X, layers and raw/X chunks zstd-compressed; layers, raw and uns. */
#define IV_ZARR_STORE_FORMAT 2

#ifndef IV_ZARR_X_CHUNK  /* benchmarks build other sizes with -DIV_ZARR_X_CHUNK=N */
#define IV_ZARR_X_CHUNK ((int64_t)1 << 16)
#endif
/* The compressor of the sparse matrices' arrays (X, layers, raw/X):
 * numcodecs' Zstd at this level, whose chunks are ZSTD_compress's output
 * (byte for byte what zarr-python writes); 0: none.  See docs/zarr.md
 * for the measurement that chose it. */
#ifndef IV_ZARR_ZSTD_LEVEL  /* benchmarks build -DIV_ZARR_ZSTD_LEVEL=0 to compare */
#define IV_ZARR_ZSTD_LEVEL 1
#endif
/* Largest chunk of a numeric column or obsm/varm array, in bytes: a
 * whole column of a 1.26-million-cell atlas is two chunks. */
#define IV_ZARR_COL_CHUNK_BYTES ((int64_t)8 << 20)

/* What a store is computed from (borrowed; meta and arrays may be NULL:
 * no obs/var columns, no obsm/varm). */
typedef struct iv_zarr_src {
    iv_dataset_t *ds;
    iv_meta_t *meta;
    const iv_marrays_t *arrays;
    int64_t x_chunk;          /* entries per X chunk; 0 = IV_ZARR_X_CHUNK */
    /* The chunks decoded last (zarr_cache.h), shared by the requests of
     * one dataset, or NULL (every request decodes). */
    struct iv_zarr_cache *cache;
    /* The dataset's other matrices (layers, raw/X), served under layers/
     * and raw/ when they open: matrix_name lists them (NULL past the
     * last), matrix_open opens one with its genes' metadata (raw/var for
     * raw/X, NULL when the file has none); both over matrix_ctx.  NULL:
     * empty layers, no raw. */
    const char *(*matrix_name)(void *ctx, size_t i);
    int (*matrix_open)(void *ctx, const char *name, iv_dataset_t **ds, iv_meta_t **var_meta,
                       iv_err_t *err);
    void *matrix_ctx;
} iv_zarr_src_t;

/* What a key holds. */
typedef enum iv_zarr_kind {
    IV_ZARR_JSON = 0,         /* .zgroup, .zattrs, .zarray, .zmetadata */
    IV_ZARR_CHUNK = 1,        /* a chunk: raw bytes */
} iv_zarr_kind_t;

/*
 * Appends the value of key (a store key such as "X/.zarray", "obs/_index/0",
 * "csr/X/indices/3"; no leading slash) to out and sets *kind.  Errors:
 * IV_ENOT_FOUND for a key the store does not hold (a chunk past the end
 * included), IV_ENOT_READY when the orientation a chunk of X needs is
 * still being built (ask again later), IV_EUNKNOWN_MATRIX when it will
 * never be (skipped or failed), IV_ECORRUPT / IV_EFILE_CHANGED from the
 * decode, IV_ENOMEM.
 */
int iv_zarr_get(const iv_zarr_src_t *src, const char *key, iv_buf_t *out, iv_zarr_kind_t *kind,
                iv_err_t *err);

#endif
