/*
 * What the viewer routes' files share (viewer.h is the server's view of
 * them): the per-dataset state, a route's own parameters and the helpers
 * that read them, and each route's handler.  Internal to api/.
 *
 *   viewer.c          route table, iv_vreq_new/free, iv_vreq_run (ETag, coding)
 *   viewer_data.c     iv_vds_t: embeddings, search indexes, the Zarr cache
 *   viewer_params.c   a route's parameters and the shared selection helpers
 *   arrays_answer.c   obsm/varm rows
 *   search_answer.c   name search
 *   meta_answer.c     the obs/var pages and columns (rendered by meta_doc.c)
 *   aggregate_answer.c  grouped statistics
 *   adapters.c        zarr, diffexp, uns and obsp: a request handed to
 *                     the module that answers it
 *
 * A handler takes the request (r->ds, r->meta, r->vx set) and fills
 * r->out and r->ctype, or returns a negative error with err set.
 */
#ifndef IV_API_VIEWER_IMPL_H
#define IV_API_VIEWER_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "encode.h"
#include "obsm.h"
#include "request.h"
#include "search.h"
#include "viewer.h"
#include "zarr_cache.h"

/* The gzip level of a document (br's quality is coding.c's), from the
 * per-thread cost table in benchmarks/README.md. */
#define GZIP_LEVEL 1

#define MEDIA_ARRAY "application/vnd.ivserve.array"
#define MEDIA_AGG "application/vnd.ivserve.aggregate"
/* The Zarr store's media types, compared by address (a chunk is not
 * HTTP-encoded, a metadata document is); adapters.c defines them. */
extern const char MEDIA_ZARR_CHUNK[], MEDIA_ZARR_META[];

#define N_OF(a) (sizeof(a) / sizeof(a)[0])

/* ---- per-dataset state (viewer_data.c) ---------------------------------- */

typedef struct sidx {
    iv_axis_t axis;
    const iv_meta_col_t *col;
    iv_search_t *s;
} sidx_t;

struct iv_vds {
    char identity[96];        /* content identity for ETags (iv_vds_identity) */
    iv_marrays_t *arrays;
    char arrays_err[256];
    iv_meta_t *meta;
    pthread_mutex_t mu;       /* guards idx (lazy search indexes) */
    sidx_t *idx;
    size_t n_idx, cap_idx;
    size_t search_bytes;
    iv_zarr_cache_t *zcache;  /* X chunks decoded last (api/zarr_cache.h), or NULL */
};

/* The search index of col (built on first use, under v's lock). */
int vr_search_index(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col, const iv_search_t **out, iv_err_t *err);
/* Whether col holds text (strings or categories): what search reads. */
int vr_is_text(const iv_meta_col_t *c);
/* Row i of a text column, for iv_search and the aggregate's group keys. */
const char *vr_col_get(const void *ctx, int64_t i);

/* ---- parameters (viewer_params.c) ---------------------------------------- */

/* A route's own parameters, taken out of the request before the rest goes
 * to the selection parser.  vals[i] is the value of keys[i] (owned) or
 * NULL; for a JSON body, items[i] is the detached JSON value instead. */
typedef struct params {
    const char *const *keys;
    size_t n;
    char *vals[8];
    cJSON *items[8];
    iv_qreq_t qr;
    int have_qr;
    int with_matrix;   /* the route reads any selectable matrix ("matrix"), not X alone */
} params_t;

void vr_params_free(params_t *p);
int vr_params_parse(params_t *p, const iv_vreq_t *r, int64_t n_obs, int64_t n_var, iv_err_t *err);
int vr_param_str(params_t *p, size_t i, const char **out, iv_err_t *err);
int vr_param_int(params_t *p, size_t i, int64_t lo, int64_t hi, int64_t *out, iv_err_t *err);
int vr_param_list(params_t *p, size_t i, const char ***out, size_t *n, iv_err_t *err);
int vr_pick_format(const iv_vreq_t *r, iv_fmt_t given, const char *own_media, iv_fmt_t dflt, iv_fmt_t *out, iv_err_t *err);
const char *vr_fmt_media(iv_fmt_t f, const char *own_media);
int vr_has_selection(const iv_psel_t *p);
int vr_raw_var_meta(iv_vreq_t *r, iv_meta_t **m, iv_err_t *err);

/* ---- handlers, one file each (adapters.c holds the four thin ones) ------- */

int vr_run_marray(iv_vreq_t *r, iv_err_t *err);
int vr_run_search(iv_vreq_t *r, iv_err_t *err);
int vr_run_meta(iv_vreq_t *r, iv_err_t *err);
int vr_run_aggregate(iv_vreq_t *r, iv_err_t *err);
int vr_run_zarr(iv_vreq_t *r, iv_err_t *err);
int vr_run_diffexp(iv_vreq_t *r, iv_err_t *err);
int vr_run_uns(iv_vreq_t *r, iv_err_t *err);
int vr_run_obsp_list(iv_vreq_t *r, iv_err_t *err);
int vr_run_obsp(iv_vreq_t *r, iv_err_t *err);

#endif
