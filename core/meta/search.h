/*
 * Name search for autocomplete boxes: which rows of a string column
 * (gene names, gene ids, cell barcodes) match a typed fragment.
 *
 * Matches are ranked: an exact match (ignoring ASCII case) first, then
 * names that start with the fragment, then names that contain it; within
 * one kind, a match in the exact case first, then shorter names, then an
 * earlier position of the fragment, then the file's row order.  The index
 * is a lower-cased copy of every name in one arena (built once, about one
 * byte a character plus 8 a row), so a query is one pass of memcmp/memmem
 * over it: 60,000 gene names take well under a millisecond.
 *
 * Immutable after building: any number of threads may search at once.
 */
#ifndef IV_SEARCH_H
#define IV_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct iv_search iv_search_t;

/* String of row i (NUL-terminated; NULL reads as ""). */
typedef const char *(*iv_search_get_fn)(const void *ctx, int64_t i);

/* Builds the index over n rows.  ctx must outlive the index (the original
 * strings are read back to compare case). */
int iv_search_build(int64_t n, iv_search_get_fn get, const void *ctx, iv_search_t **out,
                    iv_err_t *err);
void iv_search_free(iv_search_t *s);
size_t iv_search_bytes(const iv_search_t *s);

typedef enum iv_match { IV_MATCH_EXACT = 0, IV_MATCH_PREFIX = 1, IV_MATCH_SUBSTRING = 2 } iv_match_t;

typedef struct iv_search_hit {
    int64_t row;
    iv_match_t kind;
} iv_search_hit_t;

/* "exact", "prefix", "substring". */
const char *iv_match_name(iv_match_t k);

/*
 * The best `limit` matches of q[0..qlen) in rank order into hits (room for
 * limit entries); returns how many were written and sets *total to the
 * number of rows that match at all.  An empty q matches nothing.  Returns
 * a negative error only when out of memory.
 */
int64_t iv_search_run(const iv_search_t *s, const char *q, size_t qlen, int64_t limit,
                      iv_search_hit_t *hits, int64_t *total);

#endif
