/*
 * Selections by names and filters, and AnnData output, for `ivserve
 * export` (see cli_export.h).  The metadata is loaded only when a
 * selection needs it (names or a where filter), then freed.
 */
#include "cli_export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anndata_write.h"
#include "filter.h"
#include "where.h"

/* Parses "5,3,10:20" quietly; 1 = not of that form, -1 = out of memory. */
static int parse_numeric(const char *s, int64_t **out, int64_t *n_out)
{
    size_t cap = 16, n = 0;
    int64_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') goto no;
        errno = 0;
        long long a = strtoll(p, &end, 10), b = a + 1;
        if (errno) goto no;
        if (*end == ':') {
            const char *q = end + 1;
            if (*q < '0' || *q > '9') goto no;
            b = strtoll(q, &end, 10);
            if (errno || b < a) goto no;
        }
        for (long long x = a; x < b; x++) {
            if (n == cap) {
                int64_t *nv = realloc(v, (cap *= 2) * sizeof *v);
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
            }
            v[n++] = x;
        }
        if (*end == ',') p = end + 1;
        else if (*end == '\0') p = end;
        else goto no;
    }
    *out = v;
    *n_out = (int64_t)n;
    return 0;
no:
    free(v);
    return 1;
}

int iv_cli_select(const char *path, const char *group, iv_axis_t axis, const char *sel,
                  const char *where, iv_sel_t *out, int64_t **buf)
{
    const char *an = axis == IV_AXIS_OBS ? "obs" : "var";
    memset(out, 0, sizeof *out);
    *buf = NULL;
    if (sel && where) {
        fprintf(stderr, "ivserve: error: give --%s or a where filter for %s, not both\n", an, an);
        return -1;
    }
    if ((!sel && !where) || (sel && strcmp(sel, "*") == 0)) {
        out->all = 1;
        return 0;
    }
    if (sel) {
        int64_t n = 0;
        int r = parse_numeric(sel, buf, &n);
        if (r < 0) goto nomem;
        if (r == 0) {
            out->idx = *buf;
            out->n = n;
            return 0;
        }
    }
    /* Names or a filter: both need the metadata. */
    iv_meta_t *m = NULL;
    iv_err_t err = {0};
    int rc = -1;
    char **names = NULL;
    char *copy = NULL;
    iv_expr_t *e = NULL;
    iv_fprog_t *prog = NULL;
    if (iv_meta_load(path, group, &m, &err) < 0) goto report;
    if (sel) {
        copy = strdup(sel);
        size_t n = 1;
        for (const char *p = sel; *p; p++) n += *p == ',';
        names = calloc(n, sizeof *names);
        int64_t *idx = malloc(n * sizeof *idx);
        if (!copy || !names || !idx) {
            free(idx);
            goto nomem_meta;
        }
        size_t k = 0;
        for (char *tok = copy, *next; tok; tok = next) {
            next = strchr(tok, ',');
            if (next) *next++ = '\0';
            names[k++] = tok;
        }
        *buf = idx;
        if (iv_meta_find_names(m, axis, NULL, (const char *const *)names, (int64_t)k, 0, idx, NULL,
                               &err) < 0)
            goto report;
        out->idx = idx;
        out->n = (int64_t)k;
    } else {
        int64_t n = 0;
        if (iv_where_parse(where, strlen(where), &e, &err) < 0 ||
            iv_filter_compile(m, axis, e, &prog, &err) < 0 || iv_filter_select(prog, buf, &n, &err) < 0)
            goto report;
        out->idx = *buf;
        out->n = n;
    }
    rc = 0;
report:
    if (rc < 0) {
        fprintf(stderr, "ivserve: error: %s selection: %s\n", an, err.msg[0] ? err.msg : "failed");
        free(*buf);
        *buf = NULL;
        memset(out, 0, sizeof *out);
    }
    iv_filter_free(prog);
    iv_expr_free(e);
    free(names);
    free(copy);
    iv_meta_free(m);
    return rc;
nomem_meta:
    iv_meta_free(m);
    free(names);
    free(copy);
nomem:
    fprintf(stderr, "ivserve: error: out of memory\n");
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
