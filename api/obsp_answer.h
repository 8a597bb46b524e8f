/*
 * GET /v1/datasets/{id}/obsp and GET|POST /v1/datasets/{id}/obsp/{name}:
 * the file's cell x cell matrices (core/meta/obsp.h), listed, and one of
 * them for a selection of cells (docs/obsp.md).
 *
 * The list is one JSON document:
 *
 *   {"obsp": [{"name": "connectivities", "format": "csr_matrix",
 *              "shape": [n_obs, n_obs], "dtype": "float32", "nnz": 28012,
 *              "servable": true}, ...,
 *             {"name": "labels", "format": "dataframe", ..., "servable": false,
 *              "reason": "a dataframe element (...)"}]}
 *
 * A subset P[sel][:, sel] goes out as a /query answer (proto/encode.h):
 * the binary stream application/vnd.ivserve.csr by default, NDJSON or
 * JSON on request, with shape n x n, the values' dtype, the original
 * cell of each row as the block ids, and columns as positions in the
 * selection.  So a client decodes it with the decoder it has for /query;
 * a csc_matrix is answered as the CSR of the same matrix and a dense
 * array as a CSR holding every value (the client turns them back).
 *
 * Socket-free; any thread.
 */
#ifndef IV_API_OBSP_H
#define IV_API_OBSP_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "obsp.h"
#include "request.h"

/* Rows of a block of the answer, and most entries a block holds (a row
 * past it is a block of its own). */
#define IV_API_OBSP_BLOCK_ROWS 65536
#define IV_API_OBSP_BLOCK_NNZ ((int64_t)1 << 24)

/* Appends the list document of l to out.  0 or IV_ENOMEM. */
int iv_api_obsp_list_doc(const iv_obsp_list_t *l, iv_buf_t *out, iv_err_t *err);

/* Appends the answer of subset m in fmt (IV_FMT_BINARY, _NDJSON, _JSON)
 * to out; ids[k] is the dataset row of row k (NULL: k).  A JSON document
 * past json_bytes is IV_ETOO_LARGE; IV_ENOMEM. */
int iv_api_obsp_encode(const iv_obsp_csr_t *m, const int64_t *ids, iv_fmt_t fmt, size_t json_bytes,
                       iv_buf_t *out, iv_err_t *err);

#endif
