/*
 * Query requests: the JSON body of POST .../query and .../count, or the
 * same selection in a GET query string, parsed and validated into
 * selections the engine accepts.
 *
 * JSON body:  {"obs": SEL, "var": SEL, "format": "binary"|"ndjson"|"json",
 *              "by": "obs"|"var", "dense": true|false, "matrix": "X"|"layers/NAME"|"raw/X"}
 * SEL:        {"index":[i,...]} | {"range":[start,stop]} |
 *             {"mask":"<base64, bit i = element i, LSB first>"} |
 *             {"mask":[true,false,...]} | {"names":["a",...]} | absent (all)
 *             plus, in the same object: "filter": {...} (filter_json.h),
 *             "where": "string" (where.h), and with names "by": "column"
 *             and "missing": "error" | "ignore".
 * Query string: obs=1,5,2 | obs=10:20 (range) | obs_mask=B64 | obs_names=a,b
 *             | obs_where=EXPR | obs_by=COL | obs_missing=ignore
 *             and the same with var; format=...; by=obs|var; dense=true|false  Values are percent-decoded;
 *             '+' stays '+' because base64 masks use it.
 *
 * A filter is parsed here (syntax errors are IV_EBAD_REQUEST, 400) but
 * compiled by the caller against the dataset's metadata (unknown columns
 * and categories are then IV_EBAD_FILTER, 422).  When both "filter" and
 * "where" are given they are combined with "and".
 *
 * Every error names the offending key, position or value.  Index, range
 * and mask selections are checked against the axis lengths here, so the
 * engine only ever sees in-range indices; name selections are resolved by
 * the caller (they need the dataset's metadata).  Pure functions: any
 * thread; everything allocated belongs to the iv_qreq_t.
 */
#ifndef IV_REQUEST_H
#define IV_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "filter.h"
#include "query.h"
#include "select.h"

typedef enum iv_psel_kind {
    IV_PSEL_ALL = 0,
    IV_PSEL_INDEX,
    IV_PSEL_RANGE,
    IV_PSEL_MASK,
    IV_PSEL_NAMES,
} iv_psel_kind_t;

typedef struct iv_psel {
    iv_psel_kind_t kind;
    int64_t n;          /* selected elements (idx) or names */
    int64_t *idx;       /* owned; INDEX, RANGE, MASK */
    char **names;       /* owned; NAMES (n strings) */
    char *by;           /* owned or NULL; NAMES: the column names are looked up in */
    int missing_ignore; /* NAMES: drop unknown names instead of failing */
    iv_expr_t *filter;  /* owned or NULL; intersected with the selection */
} iv_psel_t;

typedef enum iv_fmt {
    IV_FMT_NONE = 0,    /* not named by the request */
    IV_FMT_BINARY,      /* application/vnd.ivserve.csr */
    IV_FMT_NDJSON,      /* application/x-ndjson */
    IV_FMT_JSON,        /* application/json */
} iv_fmt_t;

typedef struct iv_qreq {
    iv_psel_t obs, var;
    iv_fmt_t format;    /* from the "format" field / parameter */
    int by_var;         /* "by": "var" / by=var: one block row per selected gene (CSC) */
    int dense;          /* "dense": true / dense=true: gene rows as dense vectors (implies by_var) */
    char *matrix;       /* owned; "matrix" / matrix=: the matrix read ("layers/counts"), NULL = X */
} iv_qreq_t;

/* Parses a JSON body (need not be NUL terminated).  n_obs/n_var are the
 * dataset's axis lengths.  On error *out is left empty (nothing to free)
 * and err names the problem: IV_EBAD_JSON for syntax, IV_EBAD_SELECTION,
 * IV_EOUT_OF_RANGE. */
int iv_qreq_parse_json(const char *body, size_t len, int64_t n_obs, int64_t n_var,
                       iv_qreq_t *out, iv_err_t *err);
/* Parses a query string (the part after '?', without it). */
int iv_qreq_parse_query(const char *qs, size_t len, int64_t n_obs, int64_t n_var,
                        iv_qreq_t *out, iv_err_t *err);

/*
 * The matrix a request reads: "matrix": "layers/counts" in a body,
 * matrix=layers/counts in a query string (absent: X).  The two functions
 * above serve routes that read X only: a matrix other than "X" is
 * IV_EBAD_REQUEST saying so.  The _m forms ask fn for the axis lengths of
 * the named matrix (name NULL when absent) before any selection is read,
 * whatever the order of the keys, so that indices and masks are checked
 * against that matrix (raw/X may have more genes than X); fn's error
 * (IV_EUNKNOWN_MATRIX naming the available ones) is the parse's error.
 */
typedef int (*iv_qreq_matrix_fn)(void *ctx, const char *name, int64_t *n_obs, int64_t *n_var,
                                 iv_err_t *err);
int iv_qreq_parse_json_m(const char *body, size_t len, iv_qreq_matrix_fn fn, void *ctx,
                         iv_qreq_t *out, iv_err_t *err);
int iv_qreq_parse_query_m(const char *qs, size_t len, iv_qreq_matrix_fn fn, void *ctx,
                          iv_qreq_t *out, iv_err_t *err);
void iv_qreq_free(iv_qreq_t *q);

/* The engine's view of a parsed index/range/mask/all selection (borrows
 * p's array).  Must not be called on a NAMES selection before the caller
 * has replaced it by indices (iv_psel_set_indices). */
iv_sel_t iv_psel_view(const iv_psel_t *p);
/* Replaces p's index/range/mask/names content by an owned index array
 * (names resolved, filter applied).  by, missing_ignore and filter stay. */
void iv_psel_set_indices(iv_psel_t *p, int64_t *idx, int64_t n);

/*
 * One axis' selection as a command line writes it (docs/cli.md, SEL), the
 * same list a query string's obs= takes: sel NULL or "*" selects every
 * element; digits, commas and colons are positions and half-open ranges
 * ("5,3,3,10:20"; "" selects none) checked against the axis length n;
 * other text is a comma-separated list of names (resolved later).  where,
 * when not NULL, is a filter (where.h) kept in p->filter.  axis ("obs" or
 * "var") prefixes the messages.  On error p is left empty.
 */
int iv_psel_parse_list(iv_psel_t *p, const char *axis, const char *sel, const char *where,
                       int64_t n, iv_err_t *err);
/*
 * Resolves p's names and filter on m's axis with the engine's resolver
 * (iv_meta_resolve, core/meta/select.h) and replaces them by positions:
 * names are looked up (by p->by or the index; with p->missing_ignore
 * unknown names are dropped), then p->filter is compiled and intersected
 * (file order, or the list's order when one was given).  A selection of
 * positions alone, or everything, without filter is left as it is.
 *
 * The names the lookup reports go out as JSON arrays of strings, for the
 * X-Ivserve-Dropped-Names document: when p was a names selection, the
 * dropped ones are appended to dropped ("[]" if none), and those matched
 * only ASCII-case-insensitively to folded, which gets nothing when every
 * match was exact (so folded->len says whether any was).  Either may be
 * NULL.  0 or iv_meta_resolve's error: IV_ENO_METADATA (m NULL),
 * IV_EUNKNOWN_NAME, IV_EBAD_SELECTION (unknown by-column), IV_EBAD_FILTER.
 */
int iv_psel_resolve(iv_psel_t *p, iv_meta_t *m, iv_axis_t axis, iv_buf_t *dropped, iv_buf_t *folded,
                    iv_err_t *err);
/*
 * The X-Ivserve-Dropped-Names document of two resolved selections, as a
 * C string (malloc'd; NULL when out of memory): {"obs": [...], "var":
 * [...]} from each axis's dropped list (index 0 obs, 1 var; "[]" when
 * empty), and, when `folded`, "folded": {"obs": [...], "var": [...]}
 * from the folded lists.  The lists are iv_psel_resolve's.
 */
char *iv_psel_dropped_doc(const iv_buf_t dropped[2], const iv_buf_t folded_lists[2], int folded);
/* Frees what p owns and empties it. */
void iv_psel_free(iv_psel_t *p);

/* Encoding names: "binary" (or "csr"), "ndjson", "json"; IV_FMT_NONE if unknown. */
iv_fmt_t iv_fmt_parse(const char *name);
const char *iv_fmt_name(iv_fmt_t f);
const char *iv_fmt_media_type(iv_fmt_t f);
/*
 * Content negotiation on an Accept header (NULL or empty = anything).
 * Picks the listed type of highest q that the server has; the wildcards
 * (star/star, application/star) pick NDJSON so that a terminal never receives
 * binary.  Returns IV_FMT_NONE when nothing acceptable is listed (406).
 */
iv_fmt_t iv_fmt_from_accept(const char *accept);

/* Percent-decodes src[0..n) into a new NUL-terminated string; NULL on a bad
 * escape, an embedded NUL, or allocation failure. */
char *iv_url_decode(const char *src, size_t n);
/* The same with '+' read as a space (form encoding), for text values. */
char *iv_url_decode_form(const char *src, size_t n);

/*
 * Splits a query string into key=value pairs, percent-decodes both and
 * calls fn for each (a pair without '=' has the value ""), stopping at the
 * first non-zero return.  A '+' in a value is a space, as HTML forms write
 * it, when plus_is_space is NULL or says so for the key; otherwise it stays
 * a '+' (base64 uses it).  fn owns val.  Returns 0 or the first error; a
 * bad escape is IV_EBAD_REQUEST.
 */
typedef int (*iv_qs_param_fn)(void *arg, const char *key, char *val, iv_err_t *err);
int iv_qs_each(const char *qs, size_t len, int (*plus_is_space)(const char *key),
               iv_qs_param_fn fn, void *arg, iv_err_t *err);

#endif
