/*
 * The metadata side of the HTTP API: resolving names and filters of a
 * query selection, and rendering the obs/var column listing, tables and
 * single columns.  Socket-free: every function fills an iv_buf_t that the
 * caller (api/meta_answer.c) sends, so the routes stay small and these parts can
 * be reasoned about without the event loop.
 *
 * Threads: a meta is immutable after loading, so every function here may
 * run on any thread; buffers and selections belong to the caller.
 */
#ifndef IV_API_META_DOC_H
#define IV_API_META_DOC_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "meta.h"
#include "request.h"

/* Rows a table request returns when it names no limit, and the most it may ask for. */
#define IV_TABLE_LIMIT_DEFAULT 1000
#define IV_TABLE_LIMIT_MAX 100000

/*
 * Both selections of a query request (request.h's iv_psel_resolve on obs
 * with m, then var with var_meta: m's, or raw/var for raw/X).  When
 * either selection ignores missing names, or any name was matched only
 * ASCII-case-insensitively, *dropped receives the
 * X-Ivserve-Dropped-Names document {"obs":[...],"var":[...]} (names
 * dropped), with "folded":{"obs":[...],"var":[...]} added when names were
 * matched by ignoring case; otherwise it is left NULL.  Caller frees it.
 */
int iv_rmeta_resolve_query(iv_meta_t *m, iv_meta_t *var_meta, iv_qreq_t *qr, char **dropped, iv_err_t *err);

/* Appends the {"index":..., "columns":[...]} object of one axis for the
 * dataset document: name, type, encoding, computed, null_count and, for
 * categoricals, the categories with their row counts. */
void iv_rmeta_schema(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis);

/*
 * GET .../obs and .../var.  qs is the raw query string: columns=a,b
 * (default all; the index is always the first field, "_index"), where=EXPR,
 * offset=N, limit=N (default IV_TABLE_LIMIT_DEFAULT, at most
 * IV_TABLE_LIMIT_MAX), format=json|ndjson|csv.  When format is absent,
 * accept (the Accept header, may be NULL) chooses: text/csv, then
 * application/x-ndjson, else JSON.  *ctype receives the media type.
 * Errors: IV_EBAD_REQUEST (bad parameter or where syntax), IV_EBAD_FILTER,
 * IV_EBAD_SELECTION (unknown column), IV_ENOT_ACCEPTABLE (format).
 */
int iv_rmeta_table(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *qs, size_t qlen,
                   const char *accept, const char **ctype, iv_err_t *err);

/*
 * GET .../obs/{column} and .../var/{column}: a categorical's categories
 * with counts (and, with values=true, its labels row by row); any other
 * column's values with nulls as null.  qs may give offset and limit
 * (default: every row) and where=EXPR.  The result is refused with
 * IV_ETOO_LARGE past max_bytes.  IV_EBAD_SELECTION for an unknown column.
 */
int iv_rmeta_column(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *column,
                    const char *qs, size_t qlen, size_t max_bytes, iv_err_t *err);

/*
 * POST .../obs, .../var, .../obs/{column}, .../var/{column}: the same
 * answers over rows chosen by a query selection (meta_answer.c parses
 * and resolves it as the query route does): idx[0..n) in that order,
 * duplicates repeated, or every row when n < 0 (idx unused).  The page's
 * parameters are the GET form's, parsed from a JSON body: columns NULL
 * for every column (table), format NULL for the Accept header's choice,
 * limit -1 for the default (table: IV_TABLE_LIMIT_DEFAULT, at most
 * IV_TABLE_LIMIT_MAX; column: every row).  The answer's "total" (table)
 * or "selected" (column) is n.  A position outside the axis is
 * IV_EOUT_OF_RANGE; otherwise the errors of the GET forms.
 */
typedef struct iv_rmeta_page {
    const char *const *columns;   /* table: the columns in order, or NULL for all */
    size_t n_columns;
    const char *columns_csv;      /* table: or them comma-separated, as GET's columns= */
    const char *format;           /* table: "json", "ndjson", "csv" or NULL */
    int64_t offset, limit;
    int values;                   /* column: a categorical's labels row by row */
} iv_rmeta_page_t;

int iv_rmeta_table_rows(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const int64_t *idx, int64_t n,
                        const iv_rmeta_page_t *pg, const char *accept, const char **ctype, iv_err_t *err);
int iv_rmeta_column_rows(iv_buf_t *b, const iv_meta_t *m, iv_axis_t axis, const char *column,
                         const int64_t *idx, int64_t n, const iv_rmeta_page_t *pg, size_t max_bytes,
                         iv_err_t *err);

/* Sum of the computed total_counts column of an axis over rows idx[0..n)
 * (all rows when idx is NULL).  Returns -1 when the axis has no computed
 * total_counts (IVCSC files have it on var only). */
int iv_rmeta_total_counts(const iv_meta_t *m, iv_axis_t axis, const int64_t *idx, int64_t n,
                          double *out);

#endif
