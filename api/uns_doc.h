/*
 * GET /v1/datasets/{id}/uns: the file's uns as one JSON document that
 * mirrors anndata's `adata.uns` dict (docs/uns.md):
 *
 *   {"uns": {"neighbors": {"params": {"n_neighbors":
 *                {"dtype": "int64", "shape": [], "data": 15}}},
 *            "cell_type_colors":
 *                {"dtype": "str", "shape": [3], "data": ["#1f77b4", ...]}},
 *    "skipped": [{"path": "rank_genes_groups/names", "reason": "..."}],
 *    "skipped_truncated": false}
 *
 * A dict group is a JSON object whose every member is an object; an
 * element (a scalar or a 1-D array) is an object whose "dtype" is a
 * string, so the two are never confused even where a dict has a member
 * named "dtype".  dtype is a numpy name ("int8" ... "uint64", "float32",
 * "float64", "bool", "str"); shape is [] for a scalar (data is the value)
 * or [n] (data is a list).  Floats are written in the fewest digits that
 * read back to the same float32 or float64 bits (a float32 read as a
 * double and rounded to float32), always with a "." or an exponent so
 * that -0.0 keeps its sign; NaN and the infinities, which JSON lacks, are
 * the strings "NaN", "Infinity" and "-Infinity".  Integers are exact
 * (int64 and uint64 included).  "skipped" names what the server leaves
 * out (uns.h) and why; "skipped_truncated" is true past
 * IV_UNS_MAX_SKIPPED of them.
 *
 * Socket-free: the server reads uns once per dataset (uns.h, in a child
 * process, on a worker) and calls iv_api_uns_doc on a worker.  Any
 * thread; u is only read.
 */
#ifndef IV_API_UNS_DOC_H
#define IV_API_UNS_DOC_H

#include <stddef.h>

#include "buf.h"
#include "error.h"
#include "uns.h"

/* The document's format, for the route's ETags: a new number when the
 * bytes for the same file change. */
#define IV_API_UNS_FORMAT 1

/* Appends the document of u (NULL: an empty uns) to out.  0, IV_ENOMEM,
 * or IV_ETOO_LARGE once the document passes max_bytes (0: no bound). */
int iv_api_uns_doc(const iv_uns_t *u, size_t max_bytes, iv_buf_t *out, iv_err_t *err);

#endif
