/*
 * GET|POST /v1/datasets/{id}/obsm/{name}, /varm/{name}: rows of an
 * embedding or other 2-D array among the selected cells or genes.
 */
#include "viewer_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "enc_viewer.h"
#include "meta_doc.h"

/* The dtype an obsm/varm answer is in: dtype=float32 or float64, else the
 * stored one. */
static int marray_dtype(params_t *p, const iv_marray_t *a, iv_dtype_t *to, iv_err_t *err)
{
    const char *dt = NULL;
    *to = a->dtype;
    IV_TRY(vr_param_str(p, 0, &dt, err));
    if (!dt) return 0;
    if (!strcmp(dt, "float32")) *to = IV_DT_FLOAT32;
    else if (!strcmp(dt, "float64")) *to = IV_DT_FLOAT64;
    else if (strcmp(dt, iv_dtype_name(a->dtype)) != 0)
        return iv_fail(err, IV_EBAD_REQUEST, "dtype=%.40s: expected float32, float64 or %s", dt,
                       iv_dtype_name(a->dtype));
    return 0;
}

/* An obsm/varm request: its parameters, a selection of the array's own
 * axis only (names resolved), and the answer's format. */
static int marray_request(iv_vreq_t *r, params_t *p, const iv_marray_t *a, iv_axis_t axis, iv_dtype_t *to,
                          iv_fmt_t *fmt, iv_err_t *err)
{
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(vr_params_parse(p, r, in->n_rows, in->n_cols, err));
    IV_TRY(marray_dtype(p, a, to, err));
    if (vr_has_selection(axis == IV_AXIS_OBS ? &p->qr.var : &p->qr.obs))
        return iv_fail(err, IV_EBAD_SELECTION, "%sm/%.100s takes a %s selection only", axn, r->name, axn);
    IV_TRY(iv_rmeta_resolve_query(r->meta, r->meta, &p->qr, &r->dropped, err));
    return vr_pick_format(r, p->qr.format, MEDIA_ARRAY, IV_FMT_BINARY, fmt, err);
}

/* Refuses n rows too large before any work: a JSON document past the
 * JSON limit, or past both max_answer_bytes and the whole array. */
static int check_marray_size(const iv_vreq_t *r, const iv_marray_t *a, const char *axn, iv_fmt_t fmt,
                             int64_t n, iv_dtype_t to, iv_err_t *err)
{
    if (fmt != IV_FMT_BINARY && (uint64_t)n * (uint64_t)(a->n_cols + 1) * 2 > r->json_bytes) {
        /* At two bytes a number ("0,") the document would already be too big. */
        return iv_fail(err, IV_ETOO_LARGE,
                       "%" PRId64 " rows of %sm/%.100s exceed the JSON limit of %zu bytes; ask for "
                       MEDIA_ARRAY " or a smaller selection",
                       n, axn, r->name, r->json_bytes);
    }
    /* Never more than the whole array or max_answer_bytes, whichever is
     * larger: a body that lists rows again cannot multiply the answer. */
    uint64_t body = (uint64_t)n * (uint64_t)a->n_cols * iv_dtype_size(to);
    uint64_t whole = (uint64_t)a->n_rows * (uint64_t)a->n_cols * iv_dtype_size(to);
    if (r->answer_bytes && 2 * body > r->answer_bytes && body > whole)
        return iv_fail(err, IV_ETOO_LARGE,
                       "%" PRId64 " rows of %sm/%.100s take %" PRIu64 " bytes, gathered and then "
                       "encoded: more than the %zu an answer may hold (max_answer_bytes) and more "
                       "than the whole array; select fewer %s",
                       n, axn, r->name, body, r->answer_bytes, axn);
    return 0;
}

/* The rows of sel (all of them when it selects all), gathered in dtype
 * `to` unless they go out as they lie, and encoded. */
static int marray_encode(iv_vreq_t *r, const iv_marray_t *a, const iv_psel_t *sel, const char *axn,
                         iv_fmt_t fmt, iv_dtype_t to, iv_err_t *err)
{
    int all = sel->kind == IV_PSEL_ALL;
    int64_t n = all ? a->n_rows : sel->n;
    void *vals = NULL;
    const void *src = a->data;
    if (!all || to != a->dtype) {
        vals = malloc((size_t)n * (size_t)a->n_cols * iv_dtype_size(to) + 1);
        if (!vals) return iv_fail(err, IV_ENOMEM, "out of memory for %" PRId64 " rows", n);
        iv_marray_gather(a, all ? NULL : sel->idx, n, to, vals);
        src = vals;
    }
    iv_dense_t d = {a->name, axn, n, a->n_cols, to, src, all ? NULL : sel->idx};
    iv_enc_dense(&r->out, fmt, &d);
    free(vals);
    r->ctype = vr_fmt_media(fmt, MEDIA_ARRAY);
    if (r->out.oom) return iv_fail(err, IV_ENOMEM, "out of memory encoding %sm/%.100s", axn, r->name);
    if (fmt != IV_FMT_BINARY && r->out.len > r->json_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "the result exceeds the JSON limit of %zu bytes; ask for "
                       MEDIA_ARRAY " or a smaller selection", r->json_bytes);
    return 0;
}

int vr_run_marray(iv_vreq_t *r, iv_err_t *err)
{
    iv_axis_t axis = r->route == IV_VR_OBSM ? IV_AXIS_OBS : IV_AXIS_VAR;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    const iv_marray_t *a = iv_marrays_find(r->vx ? r->vx->arrays : NULL, axis, r->name);
    if (!a) return iv_fail(err, IV_ENOT_FOUND, "the dataset has no %sm element '%.100s'", axn, r->name);
    if (!a->data)
        return iv_fail(err, IV_EBAD_SELECTION, "%sm/%.100s is not served: %s", axn, r->name, a->why);
    static const char *const keys[] = {"dtype"};
    params_t p;
    memset(&p, 0, sizeof p);
    p.keys = keys;
    p.n = 1;
    iv_dtype_t to = a->dtype;
    iv_fmt_t fmt = IV_FMT_NONE;
    const iv_psel_t *sel = axis == IV_AXIS_OBS ? &p.qr.obs : &p.qr.var;
    int rc = marray_request(r, &p, a, axis, &to, &fmt, err);
    if (rc == 0)
        rc = check_marray_size(r, a, axn, fmt, sel->kind == IV_PSEL_ALL ? a->n_rows : sel->n, to, err);
    if (rc == 0) rc = marray_encode(r, a, sel, axn, fmt, to, err);
    vr_params_free(&p);
    return rc;
}
