/*
 * Hash lookups of names (obs names, gene names, gene_ids, any string or
 * categorical column): exact match first, then a unique ASCII
 * case-insensitive match.
 *
 * A names index is built once over n rows and is immutable afterwards:
 * any number of threads may look up concurrently.  It borrows nothing:
 * the strings are read through the callback at build time and compared
 * through it again at lookup time, so the caller keeps the strings alive
 * (and unchanged) as long as the index.
 */
#ifndef IV_NAMES_H
#define IV_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Row i's string, or NULL when row i has none (missing values are not
 * indexed). */
typedef const char *(*iv_names_get_fn)(const void *ctx, int64_t i);

typedef struct iv_names iv_names_t;

/* Indexes rows [0, n) (n < 2^31).  0, IV_ENOMEM or IV_ETOO_LARGE. */
int iv_names_build(int64_t n, iv_names_get_fn get, const void *ctx, iv_names_t **out,
                   iv_err_t *err);
void iv_names_free(iv_names_t *h);

/* First row whose string equals s[0..len) byte for byte, or -1. */
int64_t iv_names_find(const iv_names_t *h, const char *s, size_t len);

/* Row whose string equals s[0..len) ignoring ASCII case, or -1; -2 when
 * several distinct strings match (ambiguous; e.g. "Cd4" and "CD4"). */
int64_t iv_names_find_fold(const iv_names_t *h, const char *s, size_t len);

/* Memory held by the index. */
size_t iv_names_bytes(const iv_names_t *h);

/* Hash of bytes, folded to ASCII lower case when fold != 0 (exposed for
 * other hash sets over strings: filters' `in` on string columns). */
uint64_t iv_names_hash(const char *s, size_t len, int fold);

#endif /* IV_NAMES_H */
