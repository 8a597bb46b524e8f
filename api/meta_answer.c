/*
 * GET|POST /v1/datasets/{id}/obs, /var, /raw/var and their columns: the
 * metadata pages, parameters read here and rendered by meta_doc.c.
 */
#include "viewer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "meta_doc.h"

/*
 * POST of a metadata page: the rows a selection of the route's axis picks
 * (the body's "obs" or "var", the query route's selection object,
 * resolved by the same code: rows in its order, duplicates repeated), with
 * the GET form's parameters as members: columns (a list of names, or a
 * comma-separated string), format, offset and limit for a table; values,
 * offset and limit for a column.  Long index lists do not fit a URL.
 */
static const char *const meta_keys[] = {"columns", "format", "offset", "limit", "values"};
enum { MK_COLUMNS, MK_FORMAT, MK_OFFSET, MK_LIMIT, MK_VALUES };

typedef struct meta_post {
    params_t p;
    iv_rmeta_page_t pg;
    const char **cols;   /* a "columns" list's names (into p's items) */
} meta_post_t;

static void meta_post_free(meta_post_t *mp)
{
    vr_params_free(&mp->p);
    free(mp->cols);
}

/* "columns": a JSON list of names, or one comma-separated string as GET
 * takes it (a name holding a comma needs the list; meta_doc.c splits
 * the string as it splits GET's). */
static int meta_post_columns(meta_post_t *mp, iv_err_t *err)
{
    const cJSON *v = mp->p.items[MK_COLUMNS];
    size_t n = 0;
    if (!v) return 0;
    if (cJSON_IsString(v)) {
        mp->pg.columns_csv = v->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return iv_fail(err, IV_EBAD_REQUEST, "columns must be a list of column names or a comma-separated string");
    mp->cols = calloc((size_t)cJSON_GetArraySize(v) + 1, sizeof *mp->cols);
    if (!mp->cols) return iv_fail(err, IV_ENOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) return iv_fail(err, IV_EBAD_REQUEST, "columns must be a list of strings");
        mp->cols[n++] = it->valuestring;
    }
    mp->pg.columns = mp->cols;
    mp->pg.n_columns = n;
    return 0;
}

/* The body's members past the selection, each where its route takes it. */
static int meta_post_params(meta_post_t *mp, int table, iv_err_t *err)
{
    params_t *p = &mp->p;
    static const int table_only[] = {MK_COLUMNS, MK_FORMAT};
    for (size_t i = 0; i < N_OF(table_only); i++)
        if (!table && p->items[table_only[i]])
            return iv_fail(err, IV_EBAD_REQUEST, "a column takes values, offset and limit, not %s",
                           meta_keys[table_only[i]]);
    if (table && p->items[MK_VALUES])
        return iv_fail(err, IV_EBAD_REQUEST, "a table takes columns, format, offset and limit, not values");
    const cJSON *vals = p->items[MK_VALUES];
    if (vals && !cJSON_IsBool(vals)) return iv_fail(err, IV_EBAD_REQUEST, "values must be true or false");
    mp->pg.values = cJSON_IsTrue(vals);
    IV_TRY(vr_param_str(p, MK_FORMAT, &mp->pg.format, err));
    IV_TRY(vr_param_int(p, MK_OFFSET, 0, INT64_MAX / 2, &mp->pg.offset, err));
    IV_TRY(vr_param_int(p, MK_LIMIT, 0, INT64_MAX / 2, &mp->pg.limit, err));
    return meta_post_columns(mp, err);
}

/* The selection: of the route's axis only, and nothing of a matrix query. */
static int meta_post_selection(meta_post_t *mp, iv_meta_t *m, iv_axis_t axis, char **dropped, iv_err_t *err)
{
    iv_qreq_t *q = &mp->p.qr;
    const char *axn = axis == IV_AXIS_OBS ? "obs" : "var";
    if (vr_has_selection(axis == IV_AXIS_OBS ? &q->var : &q->obs))
        return iv_fail(err, IV_EBAD_SELECTION, "the %s rows take a selection of %s only", axn, axn);
    if (q->by_var || q->dense)
        return iv_fail(err, IV_EBAD_REQUEST, "a metadata page takes no by or dense");
    return iv_rmeta_resolve_query(m, m, q, dropped, err);
}

static int run_meta_post(iv_vreq_t *r, iv_meta_t *m, iv_axis_t axis, int table, iv_err_t *err)
{
    meta_post_t mp = {.p = {.keys = meta_keys, .n = N_OF(meta_keys)}, .pg = {.limit = -1}};
    int rc = vr_params_parse(&mp.p, r, iv_meta_n_rows(m, IV_AXIS_OBS), iv_meta_n_rows(m, IV_AXIS_VAR), err);
    if (rc == 0) rc = meta_post_params(&mp, table, err);
    if (rc == 0) rc = meta_post_selection(&mp, m, axis, &r->dropped, err);
    if (rc == 0) {
        iv_sel_t s = iv_psel_view(axis == IV_AXIS_OBS ? &mp.p.qr.obs : &mp.p.qr.var);
        int64_t n = s.all ? -1 : s.n;
        r->ctype = "application/json";
        rc = table ? iv_rmeta_table_rows(&r->out, m, axis, s.idx, n, &mp.pg, r->accept, &r->ctype, err)
                   : iv_rmeta_column_rows(&r->out, m, axis, r->name, s.idx, n, &mp.pg, r->json_bytes, err);
    }
    meta_post_free(&mp);
    return rc;
}

int vr_run_meta(iv_vreq_t *r, iv_err_t *err)
{
    iv_meta_t *m = r->meta;
    int raw = r->route == IV_VR_RAW_VAR_TABLE || r->route == IV_VR_RAW_VAR_COLUMN;
    if (raw) IV_TRY(vr_raw_var_meta(r, &m, err));
    if (!m) return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    iv_axis_t axis = r->route == IV_VR_OBS_TABLE || r->route == IV_VR_OBS_COLUMN ? IV_AXIS_OBS : IV_AXIS_VAR;
    int table = r->route == IV_VR_OBS_TABLE || r->route == IV_VR_VAR_TABLE || r->route == IV_VR_RAW_VAR_TABLE;
    const char *q = r->query;
    r->ctype = "application/json";
    if (r->is_post && q[0])
        return iv_fail(err, IV_EBAD_REQUEST, "a POST of a metadata page takes its parameters in the JSON body");
    /* An unknown column in the path is a missing resource, before the
     * body's selection is read (whose errors keep their own status). */
    if (!table && !iv_meta_find_col(m, axis, r->name))
        return iv_fail(err, IV_ENOT_FOUND, "%s has no column '%.80s'", axis == IV_AXIS_OBS ? "obs" : "var",
                       r->name);
    if (r->is_post) return run_meta_post(r, m, axis, table, err);
    if (table) return iv_rmeta_table(&r->out, m, axis, q, strlen(q), r->accept, &r->ctype, err);
    int rc = iv_rmeta_column(&r->out, m, axis, r->name, q, strlen(q), r->json_bytes, err);
    /* An unknown column in the path is a missing resource. */
    if (rc == IV_EBAD_SELECTION) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        rc = iv_fail(err, IV_ENOT_FOUND, "%s", msg);
    }
    return rc;
}
