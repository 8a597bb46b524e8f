/*
 * The entries of a file's `uns` the server can serve (the Zarr store's
 * uns group, api/zarr.h): scalars (numeric, bool, string), 1-D numeric,
 * bool and string arrays, and dict groups of those, nested.
 *
 * iv_uns_load() reads them once, in a child process (h5iso.h: HDF5 is not
 * safe on damaged input), and returns them flattened, parents before
 * children and each group's members in name order.  What it cannot serve
 * is left out: groups with another encoding-type (a data frame, a sparse
 * matrix, ...) and their members, arrays of two or more dimensions,
 * compound, enum (but bool), opaque or reference types, strings that are
 * not UTF-8, soft and external links, and entries past the limits below.
 * Each of those is named in the skipped list with the reason (a group
 * left out once, not its members); a path longer than 1023 bytes is left
 * out unnamed.  A uns whose structure cannot be read (the group or a
 * member's object header damaged) is an error, not a shorter list.
 *
 * Thread rules: a loaded iv_uns_t is immutable; any number of threads may
 * read it.  iv_uns_load may be called from any thread (it blocks on the
 * child).
 */
#ifndef IV_UNS_H
#define IV_UNS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "error.h"

/* Limits: an entry's elements, the bytes of all values, the entries, the
 * nesting depth. */
#define IV_UNS_MAX_ELEMS ((int64_t)1 << 24)
#define IV_UNS_MAX_BYTES ((uint64_t)64 << 20)
#define IV_UNS_MAX_ENTRIES 10000
#define IV_UNS_MAX_DEPTH 16

typedef enum iv_uns_kind {
    IV_UNS_DICT = 0,          /* a group */
    IV_UNS_NUM = 1,           /* integers or floats, in dtype */
    IV_UNS_BOOL = 2,          /* one byte an element, 0 or 1 */
    IV_UNS_STR = 3,           /* UTF-8 strings */
} iv_uns_kind_t;

typedef struct iv_uns_entry {
    char *path;               /* below uns: "neighbors/params/method" */
    iv_uns_kind_t kind;
    int scalar;               /* a 0-d dataset (anndata's numeric-scalar / string) */
    iv_dtype_t dtype;         /* IV_UNS_NUM */
    int64_t n;                /* elements (1 for a scalar) */
    void *data;               /* NUM/BOOL: n elements; STR: n NUL-terminated strings */
    size_t *off;              /* STR: n + 1 offsets of the strings in data */
} iv_uns_entry_t;

/* An element left out, and why ("a 2-D array", "encoding-type dataframe"). */
typedef struct iv_uns_skip {
    char *path;
    char *why;
} iv_uns_skip_t;

/* At most this many skipped elements are named; more sets more_skipped. */
#define IV_UNS_MAX_SKIPPED 1000

typedef struct iv_uns {
    iv_uns_entry_t *e;
    size_t n;
    iv_uns_skip_t *skip;      /* in the walk's order */
    size_t n_skip;
    int more_skipped;
} iv_uns_t;

/* Reads path's uns (none: an empty list).  0 or a negative error: the
 * child's (IV_EBAD_FILE for a damaged file or uns), IV_ENOMEM. */
int iv_uns_load(const char *path, iv_uns_t **out, iv_err_t *err);
void iv_uns_free(iv_uns_t *u);

/* String i of a STR entry and its length in bytes. */
static inline const char *iv_uns_str(const iv_uns_entry_t *e, int64_t i, size_t *len)
{
    *len = e->off[i + 1] - e->off[i] - 1;
    return (const char *)e->data + e->off[i];
}

#endif
