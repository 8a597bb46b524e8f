/*
 * The routes a web viewer needs besides queries: embeddings (obsm/varm
 * arrays), name search and grouped statistics.
 *
 *   GET|POST /v1/datasets/{id}/obsm/{name}   rows of an obsm array
 *   GET|POST /v1/datasets/{id}/varm/{name}   rows of a varm array
 *   GET      /v1/datasets/{id}/var/search    gene name search
 *   GET      /v1/datasets/{id}/obs/search    cell name search
 *   GET|POST /v1/datasets/{id}/aggregate     grouped statistics
 *   POST     /v1/datasets/{id}/diffexp       marker genes (api/diffexp.h)
 *   GET      /v1/datasets/{id}/uns           the file's uns (api/uns_doc.h)
 *   GET      /v1/datasets/{id}/obsp          the file's obsp elements (api/obsp_answer.h)
 *   GET|POST /v1/datasets/{id}/obsp/{name}   an obsp element among the selected cells
 *   GET      /v1/datasets/{id}/obs, /var, /obs/{column}, /var/{column}
 *                                             metadata pages (meta_doc.h)
 *
 * Socket-free like meta_doc.h: a request is copied into an iv_vreq_t
 * on the loop, run on a worker (iv_vreq_run fills a complete response
 * body), and the server sends what it built.  Per-dataset state (the
 * arrays, the search indexes) lives in an iv_vds_t loaded with the
 * dataset.
 *
 * Threads: iv_vds_load runs once on the load worker; afterwards a vds is
 * shared by every worker (search indexes of further columns are built on
 * first use under its lock).  A vreq belongs to one thread at a time.
 */
#ifndef IV_API_VIEWER_H
#define IV_API_VIEWER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "dataset.h"
#include "error.h"
#include "meta.h"
#include "pool.h"
#include "request.h"
#include "zarr_kept.h"

typedef struct iv_vds iv_vds_t;

/*
 * Loads the viewer state of a dataset: obsm/varm arrays of the file at
 * path and the search indexes of both names indexes and of var's string
 * columns.  meta may be NULL (no search then).  Never fails the dataset:
 * a file whose arrays cannot be read gets a vds without them and the
 * reason in the dataset document.  NULL only when out of memory.
 */
iv_vds_t *iv_vds_load(const char *path, const iv_dataset_t *ds, iv_meta_t *meta);
/* Builds the obs names' search index, which iv_vds_load leaves out (a
 * first search would build it), on a worker once the dataset serves.
 * Any thread; an error leaves it to the first search. */
void iv_vds_warm(iv_vds_t *v);
/* Keeps the Zarr store's X chunks of dataset ds (both orientations) in
 * the cache folder and serves them from there (zarr_kept.h,
 * iv_zarr_keep_x), on a worker once the dataset's other orientation is
 * there.  out: the files now served and a note an orientation. */
void iv_vds_keep_zarr(iv_vds_t *v, iv_dataset_t *ds, const iv_zarr_keep_in_t *in, iv_zarr_keep_out_t *out);
/* The most memory iv_vds_keep_zarr holds at once, its writes making
 * `width` chunks at a time on a pool of `threads` (iv_zarr_keep_bytes). */
size_t iv_vds_keep_zarr_bytes(iv_vds_t *v, iv_dataset_t *ds, size_t threads, size_t width);
void iv_vds_free(iv_vds_t *v);
/* Bytes of X's Zarr chunks of orientation csr served from the cache
 * folder now: 0 when none are kept or the file was dropped after a
 * failed check (v may be NULL).  Any thread. */
uint64_t iv_vds_zarr_kept(const iv_vds_t *v, int csr);

/* Appends the members ,"obsm":[...],"varm":[...],"viewer_bytes":N,
 * "zarr_kept":{"csr":BYTES,"csc":BYTES} (X's Zarr chunks kept in the cache
 * folder when the document is made; null: none) to a
 * dataset document being built (v may be NULL: empty lists). */
void iv_vds_doc(iv_buf_t *b, const iv_vds_t *v);
/* Memory the viewer state holds now: obsm/varm arrays and the search
 * indexes built so far (v may be NULL: none).  Any thread. */
void iv_vds_memory(const iv_vds_t *v, size_t *arrays, size_t *search);

enum iv_vroute {
    IV_VR_NONE = 0,
    IV_VR_OBSM,
    IV_VR_VARM,
    IV_VR_OBS_SEARCH,
    IV_VR_VAR_SEARCH,
    IV_VR_AGGREGATE,
    IV_VR_OBS_TABLE,          /* .../obs and .../var pages (meta_doc.h), */
    IV_VR_VAR_TABLE,          /* served here for their ETag and encoding */
    IV_VR_OBS_COLUMN,
    IV_VR_VAR_COLUMN,
    IV_VR_RAW_VAR_TABLE,      /* .../raw/var, .../raw/var/COLUMN, .../raw/var/search: */
    IV_VR_RAW_VAR_COLUMN,     /* raw/X's genes */
    IV_VR_RAW_VAR_SEARCH,
    IV_VR_ZARR,               /* .../zarr/KEY: the dataset as a Zarr store (api/zarr.h) */
    IV_VR_DIFFEXP,            /* POST .../diffexp (api/diffexp.h) */
    IV_VR_UNS,                /* .../uns: the file's uns as JSON (api/uns_doc.h) */
    IV_VR_OBSP_LIST,          /* .../obsp: the obsp elements (api/obsp_answer.h) */
    IV_VR_OBSP,               /* .../obsp/NAME: one among the selected cells */
};

/* The viewer route of sub (the path after the dataset id, e.g.
 * "/obsm/X_umap"), or IV_VR_NONE. */
int iv_vroute_match(const char *sub);
/* Whether the route takes POST (a selection in a JSON body). */
int iv_vroute_allows_post(int route);

typedef struct iv_vreq {
    /* in: the request (owned copies) */
    int route;
    char *name;               /* obsm/varm element, column or zarr key, percent-decoded */
    char *query;              /* raw query string ("" when none) */
    char *body;               /* POST body or NULL */
    size_t body_len;
    int is_post;
    char *accept;             /* Accept header or NULL */
    /* in: the dataset and server (borrowed; set by the caller) */
    iv_dataset_t *ds;
    iv_meta_t *meta;
    iv_vds_t *vx;
    iv_pool_t *pool;
    /* The dataset's selectable matrices (layers, raw/X) for the routes
     * that read one ("matrix"): their axis lengths, and the matrix with
     * its genes' metadata (raw/var for raw/X).  NULL: X only. */
    iv_qreq_matrix_fn matrix_shape;
    int (*matrix_open)(void *ctx, const char *name, iv_dataset_t **ds, iv_meta_t **var_meta,
                       iv_err_t *err);
    const char *(*matrix_name)(void *ctx, size_t i);  /* the i-th, NULL past the last */
    void *matrix_ctx;
    size_t json_bytes;        /* JSON response limit */
    size_t answer_bytes;      /* limits.max_answer_bytes: a whole answer's bound; 0 = none */
    uint32_t max_age;         /* Cache-Control max-age; 0 = no-cache */
    /* Set (by the loop) when the client left, the computation timed out
     * or the server is stopping: long routes stop at their next block
     * with IV_ECANCELLED.  NULL: never. */
    const atomic_int *cancel;
    int private_cache;        /* the dataset needs a token: "private", not "public" */
    char *if_none_match;      /* If-None-Match header or NULL (owned) */
    char *accept_encoding;    /* Accept-Encoding header or NULL (owned) */
    /* out */
    int status;               /* 200, or 304 when If-None-Match matched (out empty) */
    const char *ctype;        /* media type of out (static) */
    iv_buf_t out;             /* the response body (gzip-encoded when extra says so) */
    char *dropped;            /* X-Ivserve-Dropped-Names JSON, or NULL */
    char extra[320];          /* header lines to add: ETag, Cache-Control, Content-Encoding, Vary */
} iv_vreq_t;

/* The identity of a dataset's content for ETags: the file's device,
 * inode, size and modification time at load (a dataset is immutable
 * while served, and a replaced file changes them).  "" when unknown. */
const char *iv_vds_identity(const iv_vds_t *v);

/* Copies a request for a worker; body (may be NULL) is taken.  NULL when
 * out of memory or when the name in sub has a bad percent-escape
 * (*bad_name set). */
iv_vreq_t *iv_vreq_new(int route, const char *sub, int is_post, const char *query, char *body,
                       size_t body_len, const char *accept, int *bad_name);
void iv_vreq_free(iv_vreq_t *r);

/*
 * Runs the request (worker): fills status, ctype, out, dropped and extra,
 * or returns an error whose iv_error_status is the HTTP status (404
 * unknown array, 400 bad parameters, 406, 413 over the JSON limit, 422
 * selections).  A response depends only on the dataset's content and
 * the request, so it gets a strong ETag (the content identity, the
 * route, the path, the exact query string or body, Accept and the
 * content coding) and Cache-Control; an If-None-Match that matches
 * answers 304 before any work.  Bodies of 1 KiB and more are encoded
 * with br or gzip as proto/coding.h chooses from Accept-Encoding.
 */
int iv_vreq_run(iv_vreq_t *r, iv_err_t *err);

#endif
