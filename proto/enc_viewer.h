/*
 * Wire forms of the viewer routes: dense arrays (obsm/varm rows) and
 * grouped-statistics tables.  Pure functions into a caller-owned iv_buf_t
 * (check its oom flag); any thread.
 *
 * Dense array, binary (application/vnd.ivserve.array), little-endian:
 *
 *   header, 40 bytes:
 *     char[4] magic "IVAR"
 *     u32     version (1)
 *     i64     rows, i64 columns
 *     char[8] value dtype, numpy descr NUL-padded ("<f4", "<f8", ...)
 *     u32     flags: bit 0 = an i64 row id (the obs/var index) per row follows
 *     u32     0
 *   i64 ids[rows]            only with flag bit 0 (a selection was given)
 *   values[rows * columns]   row-major, the header's dtype
 *
 * NDJSON: {"type":"header","name":...,"axis":"obs","shape":[r,c],"dtype":...},
 * then {"type":"rows","ids":[...],"values":[[...],...]} per IV_ENC_ROWS_LINE
 * rows, then {"type":"end","status":"ok","rows":r}.  JSON: one document
 * {"name","axis","shape","dtype","ids":[...],"values":[[...],...]}.
 * Non-finite floats are null in both JSON forms.
 *
 * Grouped statistics, binary (application/vnd.ivserve.aggregate):
 *
 *   char[4] magic "IVAG", u32 version (1), u64 json_len,
 *   json_len bytes: the JSON document without its "values" member,
 *   zero bytes up to a multiple of 8 from the start,
 *   per stat in the document's "stats" order: f64 values[groups * genes],
 *   group-major (row g holds group g's value for every gene).
 *
 * JSON: the same document with a last member "values":
 * {"<stat>":[[group 0's value per gene],...],...} in "stats" order;
 * non-finite values are null.
 */
#ifndef IV_ENC_VIEWER_H
#define IV_ENC_VIEWER_H

#include <stdint.h>

#include "buf.h"
#include "dtype.h"
#include "request.h"

#define IV_ARRAY_MAGIC "IVAR"
#define IV_ARRAY_HEADER_BYTES 40
#define IV_AGG_MAGIC "IVAG"
#define IV_ENC_ROWS_LINE 4096

typedef struct iv_dense {
    const char *name;
    const char *axis;         /* "obs" or "var" */
    int64_t n_rows, n_cols;
    iv_dtype_t dtype;         /* IV_DT_FLOAT32 / FLOAT64 or any stored dtype */
    const void *values;       /* n_rows * n_cols, row-major */
    const int64_t *ids;       /* n_rows row ids, or NULL (rows 0..n-1 of the axis) */
} iv_dense_t;

/* The whole response in format f (binary, NDJSON or JSON). */
void iv_enc_dense(iv_buf_t *b, iv_fmt_t f, const iv_dense_t *d);

/* A computed aggregate (grouped statistics table). */
typedef struct iv_agg_table {
    const char *doc;          /* the JSON document without "values" and its closing '}' */
    size_t doc_len;
    size_t n_stats;
    const char *const *stats; /* n_stats names, the document's "stats" order */
    int64_t n_groups, n_genes;
    const double *values;     /* n_stats blocks of n_groups * n_genes, group-major */
} iv_agg_table_t;

/* The whole response in format f: IV_FMT_BINARY the IVAG form, else
 * JSON.  JSON stops after the first stat that takes b past json_limit
 * bytes (the caller refuses such an answer). */
void iv_enc_agg(iv_buf_t *b, iv_fmt_t f, const iv_agg_table_t *t, size_t json_limit);

#endif
