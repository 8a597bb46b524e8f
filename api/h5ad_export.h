/*
 * POST|GET /v1/datasets/{id}/export: a selection of the dataset as a
 * standard AnnData .h5ad (docs/export-route.md), the file `ivserve export
 * FILE [selection] -o OUT.h5ad` writes (core/matrix/anndata_write.h).
 *
 * Socket-free: iv_api_export_h5ad decodes the selection with the
 * engine, writes the file in a temporary folder of its own and hands back
 * an open descriptor of it, already unlinked, so that nothing is left on
 * disk whatever happens to the answer afterwards; the server streams the
 * descriptor's bytes (server/routes_export.c).
 *
 * libhdf5 is not safe on damaged input (h5iso.h): the writer, which reads
 * the source's obs, var, obsm and uns with HDF5, runs in an h5iso child;
 * the matrix is decoded before, in this process, on the pool.
 *
 * Threads: call from a worker (it blocks for the whole write, and uses
 * the pool with iv_pool_parallel_for, which cannot deadlock from a
 * worker).  Nothing here touches the loop.
 */
#ifndef IV_API_H5AD_EXPORT_H
#define IV_API_H5AD_EXPORT_H

#include <stdatomic.h>
#include <stdint.h>

#include "dataset.h"
#include "error.h"
#include "pool.h"
#include "query.h"

/*
 * Writes X[obs, var] of ds (q: the query of that selection, rows by cell,
 * not yet prepared; obs, var: the selections q was built with) and the
 * obs / var rows in the selection's order as a .h5ad in a folder made
 * under tmpdir, then opens it, removes it and its folder, and returns the
 * open descriptor in *fd (the caller closes it) and its size in *size.
 * cancel (may be NULL): when set, the work stops at the next block with
 * IV_ECANCELLED.  Errors: the engine's, IV_EIO for the temporary space,
 * IV_EBAD_FILE when the writer's child died on a damaged file.
 */
int iv_api_export_h5ad(iv_dataset_t *ds, iv_query_t *q, iv_pool_t *pool, const iv_sel_t *obs,
                       const iv_sel_t *var, const char *tmpdir, const atomic_int *cancel, int *fd,
                       int64_t *size, iv_err_t *err);

#endif
