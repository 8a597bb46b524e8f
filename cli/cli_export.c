/*
 * Selections, and AnnData output, for `ivserve export` (see
 * cli_export.h).  A selection is parsed by the query string's parser
 * (proto/request.c iv_psel_parse_list) and resolved by the server's
 * resolver (iv_psel_resolve over core/meta/select.c iv_meta_resolve), so
 * that a list means the same on the command line and over HTTP.  The
 * metadata is loaded only when a selection needs it (names or a where
 * filter), then freed.
 */
#include "cli_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anndata_write.h"

/* Names and filters resolved on the file's metadata, loaded for them
 * only; positions alone need none. */
static int resolve_on_meta(const char *path, const char *group, iv_axis_t axis, iv_psel_t *p,
                           iv_err_t *err)
{
    if (p->kind != IV_PSEL_NAMES && !p->filter) return 0;
    iv_meta_t *m = NULL;
    int rc = iv_meta_load(path, group, &m, err) < 0 ? -1 : iv_psel_resolve(p, m, axis, NULL, NULL, err);
    iv_meta_free(m);
    return rc;
}

int iv_cli_select(const char *path, const char *group, iv_axis_t axis, const char *sel,
                  const char *where, int64_t n, iv_psel_t *p)
{
    const char *an = axis == IV_AXIS_OBS ? "obs" : "var";
    iv_err_t err = {0};
    memset(p, 0, sizeof *p);
    if (sel && where) {
        fprintf(stderr, "ivserve: error: give --%s or a where filter for %s, not both\n", an, an);
        return -1;
    }
    if (iv_psel_parse_list(p, an, sel, where, n, &err) == 0 &&
        resolve_on_meta(path, group, axis, p, &err) == 0)
        return 0;
    fprintf(stderr, "ivserve: error: %s selection: %s\n", an, err.msg[0] ? err.msg : "failed");
    iv_psel_free(p);
    return -1;
}

int iv_cli_write_h5ad(const char *src_path, const char *out_path, int64_t n_rows, int64_t n_cols,
                      int64_t src_rows, int64_t src_cols, const int64_t *indptr, int64_t nnz,
                      size_t n_parts, const void **ip, const size_t *il, int index_size,
                      const void **dp, const size_t *dl, iv_dtype_t dtype, int index_bits,
                      const iv_sel_t *obs, const iv_sel_t *var, iv_err_t *err)
{
    iv_adw_x_t x = {
        .n_rows = n_rows, .n_cols = n_cols, .nnz = nnz, .src_rows = src_rows,
        .src_cols = src_cols, .indptr = indptr, .n_parts = n_parts,
        .indices = (const void *const *)ip, .indices_bytes = il, .index_size = index_size,
        .data = (const void *const *)dp, .data_bytes = dl, .dtype = dtype,
        .index_bits = index_bits,
    };
    char skipped[1024];
    if (iv_anndata_write(src_path, out_path, &x, obs, var, skipped, sizeof skipped, err) < 0)
        return -1;
    if (skipped[0]) fprintf(stderr, "ivserve: %s: not exported: %s\n", out_path, skipped);
    return 0;
}
