/*
 * The viewer routes answered by a module of their own: each handler here
 * hands the request to it (zarr.h, diffexp.h, uns_doc.h, obsp_answer.h).
 */
#include "viewer_impl.h"

#include <string.h>

#include "diffexp.h"
#include "meta_doc.h"
#include "obsp_answer.h"
#include "uns_doc.h"
#include "zarr.h"

/* ---- zarr store (api/zarr.h) ---------------------------------------------- */

const char MEDIA_ZARR_CHUNK[] = "application/octet-stream";
const char MEDIA_ZARR_META[] = "application/json";

int vr_run_zarr(iv_vreq_t *r, iv_err_t *err)
{
    iv_zarr_src_t src = {.ds = r->ds, .meta = r->meta, .arrays = r->vx ? r->vx->arrays : NULL,
                         .cache = r->vx ? r->vx->zcache : NULL,
                         .matrix_name = r->matrix_name, .matrix_open = r->matrix_open,
                         .matrix_ctx = r->matrix_ctx};
    iv_zarr_kind_t kind;
    IV_TRY(iv_zarr_get(&src, r->name, &r->out, &kind, err));
    r->ctype = kind == IV_ZARR_CHUNK ? MEDIA_ZARR_CHUNK : MEDIA_ZARR_META;
    return 0;
}

/* ---- diffexp (api/diffexp.c) ---------------------------------------------- */

int vr_run_diffexp(iv_vreq_t *r, iv_err_t *err)
{
    if (!r->is_post) return iv_fail(err, IV_EMETHOD, "diffexp takes POST with a JSON body");
    iv_api_diffexp_in_t in = {.body = r->body, .body_len = r->body_len, .ds = r->ds, .meta = r->meta,
                              .pool = r->pool, .cancel = r->cancel, .json_bytes = r->json_bytes,
                              .accept = r->accept};
    return iv_api_diffexp(&in, &r->out, &r->ctype, err);
}

/* ---- uns (api/uns_doc.c) -------------------------------------------------- */

/* The file's uns, read on the first request (on this worker: the read
 * forks a child and waits) and kept with the dataset's Zarr state, which
 * serves the same entries; a uns that cannot be read is an error answer
 * here, where the store serves an empty one. */
int vr_run_uns(iv_vreq_t *r, iv_err_t *err)
{
    IV_RETURN_IF(r->query[0], err, IV_EBAD_REQUEST, "uns takes no query parameters");
    const iv_uns_t *u;
    IV_TRY(iv_zarr_cache_uns_get(r->vx ? r->vx->zcache : NULL, iv_dataset_info(r->ds)->path, &u, err));
    r->ctype = "application/json";
    return iv_api_uns_doc(u, r->json_bytes, &r->out, err);
}

/* ---- obsp (core/meta/obsp.c, api/obsp_answer.c) -------------------------- */

/* The file's obsp elements, listed on each request (a child reads the
 * group; the ETag spares a repeat). */
int vr_run_obsp_list(iv_vreq_t *r, iv_err_t *err)
{
    IV_RETURN_IF(r->query[0], err, IV_EBAD_REQUEST, "obsp takes no query parameters");
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    iv_obsp_list_t *l;
    IV_TRY(iv_obsp_list(in->path, in->n_rows, &l, err));
    r->ctype = "application/json";
    int rc = iv_api_obsp_list_doc(l, &r->out, err);
    iv_obsp_list_free(l);
    return rc;
}

/* The request: the query route's cell selection (names and filters
 * resolved) and the answer's format; no genes, matrix or orientation. */
static int obsp_request(iv_vreq_t *r, params_t *p, iv_fmt_t *fmt, iv_err_t *err)
{
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(vr_params_parse(p, r, in->n_rows, in->n_cols, err));
    if (vr_has_selection(&p->qr.var) || p->qr.matrix || p->qr.by_var || p->qr.dense)
        return iv_fail(err, IV_EBAD_SELECTION, "obsp/%.100s takes an obs selection only", r->name);
    IV_TRY(iv_rmeta_resolve_query(r->meta, r->meta, &p->qr, &r->dropped, err));
    return vr_pick_format(r, p->qr.format, "application/vnd.ivserve.csr", IV_FMT_BINARY, fmt, err);
}

/* P[sel][:, sel] of an obsp element, read on this worker (a child reads
 * the selected rows) and sent as a /query answer. */
int vr_run_obsp(iv_vreq_t *r, iv_err_t *err)
{
    params_t p;
    memset(&p, 0, sizeof p);
    iv_fmt_t fmt = IV_FMT_NONE;
    iv_obsp_csr_t m;
    memset(&m, 0, sizeof m);
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    int rc = obsp_request(r, &p, &fmt, err);
    int all = p.qr.obs.kind == IV_PSEL_ALL;
    if (rc == 0)
        rc = iv_obsp_read(in->path, r->name, in->n_rows, all ? NULL : p.qr.obs.idx, all ? 0 : p.qr.obs.n,
                          IV_OBSP_MAX_NNZ, &m, err);
    if (rc == 0) rc = iv_api_obsp_encode(&m, all ? NULL : p.qr.obs.idx, fmt, r->json_bytes, &r->out, err);
    if (rc == 0) r->ctype = vr_fmt_media(fmt, "application/vnd.ivserve.csr");
    iv_obsp_csr_free(&m);
    vr_params_free(&p);
    return rc;
}
