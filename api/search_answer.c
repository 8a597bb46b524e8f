/*
 * GET /v1/datasets/{id}/var/search, /obs/search, /raw/var/search: names
 * matching a query string, through the search index of a text column.
 */
#include "viewer_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEARCH_LIMIT_DEFAULT 20
#define SEARCH_LIMIT_MAX 1000

/* A search's parameters: q (required), limit and by, and nothing else. */
static int search_request(iv_vreq_t *r, params_t *p, const char **q, const char **by, int64_t *limit,
                          iv_err_t *err)
{
    const iv_dataset_info_t *in = iv_dataset_info(r->ds);
    IV_TRY(vr_params_parse(p, r, in->n_rows, in->n_cols, err));
    /* Only q, limit and by are known: anything left is a selection the
     * search does not take. */
    if (vr_has_selection(&p->qr.obs) || vr_has_selection(&p->qr.var) || p->qr.format != IV_FMT_NONE)
        return iv_fail(err, IV_EBAD_REQUEST, "search takes the parameters q, limit and by only");
    IV_TRY(vr_param_str(p, 0, q, err));
    IV_TRY(vr_param_str(p, 2, by, err));
    IV_TRY(vr_param_int(p, 1, 1, SEARCH_LIMIT_MAX, limit, err));
    if (!*q || !**q) return iv_fail(err, IV_EBAD_REQUEST, "q (the text to search for) is required");
    return 0;
}

/* The column searched: by, else the names index; a text column. */
static int search_column(const iv_meta_t *m, iv_axis_t axis, const char *axn, const char *by,
                         const iv_meta_col_t **out, iv_err_t *err)
{
    const iv_meta_col_t *col = by ? iv_meta_find_col(m, axis, by) : iv_meta_index(m, axis);
    if (!col) return iv_fail(err, IV_EBAD_SELECTION, "%s has no column '%.80s'", axn, by);
    if (!vr_is_text(col))
        return iv_fail(err, IV_EBAD_SELECTION, "%s column '%.80s' holds %s values, not names", axn,
                       col->name, iv_col_type_name(col->type));
    *out = col;
    return 0;
}

/* The answer: each hit's row, its name (ix), and the value matched when
 * the column searched is not the names index. */
static void put_search_hits(iv_buf_t *b, const char *q, const char *axn, const iv_meta_col_t *col,
                            const iv_meta_col_t *ix, const iv_search_hit_t *hits, int64_t k, int64_t total)
{
    iv_buf_puts(b, "{\"q\":");
    iv_buf_json_str(b, q);
    iv_buf_printf(b, ",\"axis\":\"%s\",\"by\":", axn);
    iv_buf_json_str(b, col->name);
    iv_buf_printf(b, ",\"total\":%" PRId64 ",\"results\":[", total);
    for (int64_t i = 0; i < k; i++) {
        int64_t row = hits[i].row;
        iv_buf_printf(b, i ? ",{\"index\":%" PRId64 ",\"name\":" : "{\"index\":%" PRId64 ",\"name\":", row);
        const char *nm = ix ? vr_col_get(ix, row) : NULL;
        if (nm) iv_buf_json_str(b, nm);
        else iv_buf_puts(b, "null");
        if (col != ix) {
            iv_buf_puts(b, ",\"value\":");
            iv_buf_json_str(b, vr_col_get(col, row));
        }
        iv_buf_printf(b, ",\"match\":\"%s\"}", iv_match_name(hits[i].kind));
    }
    iv_buf_puts(b, "]}");
}

/* Runs the search of col for q, at most limit hits, into r->out. */
static int search_answer(iv_vreq_t *r, const iv_meta_t *m, iv_axis_t axis, const char *axn,
                         const iv_meta_col_t *col, const char *q, int64_t limit, iv_err_t *err)
{
    const iv_search_t *s = NULL;
    IV_TRY(vr_search_index(r->vx, axis, col, &s, err));
    iv_search_hit_t *hits = malloc((size_t)limit * sizeof *hits);
    if (!hits) return iv_fail(err, IV_ENOMEM, "out of memory");
    int64_t total = 0, k = iv_search_run(s, q, strlen(q), limit, hits, &total);
    if (k < 0) {
        free(hits);
        return iv_fail(err, IV_ENOMEM, "out of memory searching");
    }
    put_search_hits(&r->out, q, axn, col, iv_meta_index(m, axis), hits, k, total);
    free(hits);
    r->ctype = "application/json";
    if (r->out.oom) return iv_fail(err, IV_ENOMEM, "out of memory");
    return 0;
}

int vr_run_search(iv_vreq_t *r, iv_err_t *err)
{
    iv_axis_t axis = r->route == IV_VR_OBS_SEARCH ? IV_AXIS_OBS : IV_AXIS_VAR;
    int raw = r->route == IV_VR_RAW_VAR_SEARCH;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : raw ? "raw/var" : "var";
    if (r->is_post) return iv_fail(err, IV_EMETHOD, "search takes GET");
    iv_meta_t *m = r->meta;   /* the names searched: obs, var or raw/var */
    if (raw) IV_TRY(vr_raw_var_meta(r, &m, err));
    if (!m || !r->vx)
        return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    static const char *const keys[] = {"q", "limit", "by"};
    params_t p;
    memset(&p, 0, sizeof p);
    p.keys = keys;
    p.n = 3;
    const char *q = NULL, *by = NULL;
    int64_t limit = SEARCH_LIMIT_DEFAULT;
    const iv_meta_col_t *col = NULL;
    int rc = search_request(r, &p, &q, &by, &limit, err);
    if (rc == 0) rc = search_column(m, axis, axn, by, &col, err);
    if (rc == 0) rc = search_answer(r, m, axis, axn, col, q, limit, err);
    vr_params_free(&p);
    return rc;
}
