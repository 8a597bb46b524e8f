/*
 * Parts of `ivserve export` beyond the .npz path: selections by names and
 * by a where filter, and the AnnData (.h5ad) output.
 */
#ifndef IV_CLI_EXPORT_H
#define IV_CLI_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"
#include "query.h"
#include "request.h"

/*
 * Parses and resolves one axis' selection: sel as positions and half-open
 * ranges ("5,3,10:20", checked against the axis length n), else as
 * comma-separated names of the axis (obs names or gene names, exact then
 * unique case-insensitive match); where as a filter expression over the
 * axis' columns (rows in file order).  The parser is the query string's
 * (request.h iv_psel_parse_list), the resolver the server's
 * (iv_psel_resolve).  sel and where together are an error; neither
 * selects everything.  *p receives positions (iv_psel_view; free with
 * iv_psel_free).  Returns 0, or -1 with the error printed.
 */
int iv_cli_select(const char *path, const char *group, iv_axis_t axis, const char *sel,
                  const char *where, int64_t n, iv_psel_t *p);

/* Writes the decoded result as a standard AnnData file (core/matrix/anndata_write.h)
 * and notes elements left out on stderr.  0, or -1 with err set. */
int iv_cli_write_h5ad(const char *src_path, const char *out_path, int64_t n_rows, int64_t n_cols,
                      int64_t src_rows, int64_t src_cols, const int64_t *indptr, int64_t nnz,
                      size_t n_parts, const void **ip, const size_t *il, int index_size,
                      const void **dp, const size_t *dl, iv_dtype_t dtype, int index_bits,
                      const iv_sel_t *obs, const iv_sel_t *var, iv_err_t *err);

#endif
