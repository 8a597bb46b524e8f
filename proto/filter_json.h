/*
 * The JSON "filter" object of a selection, turned into an iv_expr_t tree:
 *
 *   {"column": "cell_type", "in": ["B cell", "NK cell"]}
 *   {"column": "total_counts", "ge": 500, "lt": 10000}   (several ops: and)
 *   {"column": "is_doublet", "eq": false}
 *   {"column": "batch", "is_null": true}
 *   {"column": "sample", "not_in": [...]}
 *   {"and": [...]}, {"or": [...]}, {"not": {...}}
 *
 * Operators: eq, ne, lt, le, gt, ge, in, not_in, is_null (not_in, like
 * ne, is false on missing values).  Trees stop at the limits of filter.h
 * (more terms or list values: IV_ETOO_LARGE).  Malformed
 * objects are IV_EBAD_REQUEST naming the JSON path of the problem
 * ("filter.and[2].ge: expected a number, string or boolean").
 * Pure function of its input; any thread.
 */
#ifndef IV_FILTER_JSON_H
#define IV_FILTER_JSON_H

#include <cjson/cJSON.h>

#include "error.h"
#include "filter.h"

/* Builds a tree from j; *out owned by the caller (iv_expr_free). */
int iv_filter_json_parse(const cJSON *j, iv_expr_t **out, iv_err_t *err);

#endif /* IV_FILTER_JSON_H */
