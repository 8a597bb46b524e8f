/*
 * Cell and gene metadata: the obs and var data frames of one .h5ad file,
 * read once at start-up into compact in-memory columns.
 *
 * iv_meta_load() opens the file read-only with HDF5, reads every column
 * of obs and var in any encoding anndata writes (categorical, numeric,
 * bool, string, nullable integer/boolean/string, the index, anndata 0.7
 * categoricals by object reference, fixed-length strings; compressed
 * columns through the decoders iv_h5filters_register() installs) and
 * closes the file again.  Computed columns (total_counts, n_genes or
 * n_cells, max_count) are added from a dataset's pointer arrays by
 * iv_meta_add_computed(), without decoding the packed indices.
 *
 * After loading, a meta is immutable: any number of threads may read
 * columns, look names up and evaluate filters concurrently.  The only
 * internal mutation, building a name hash of a non-index column on its
 * first lookup, is done under an internal lock.
 *
 * Missing values: a column's mask (1 = missing) covers nullable columns,
 * categorical code -1 and NaN floats alike, so that every consumer sees
 * one notion of "missing", the one pandas' isna() has.
 */
#ifndef IV_META_H
#define IV_META_H

#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "dtype.h"
#include "error.h"
#include "pool.h"

typedef enum iv_axis { IV_AXIS_OBS = 0, IV_AXIS_VAR = 1 } iv_axis_t;

typedef enum iv_col_type {
    IV_COL_CATEGORICAL = 0,  /* codes (int32, -1 = missing) into categories */
    IV_COL_INT,              /* int64 values (any stored integer width) */
    IV_COL_FLOAT,            /* double values (NaN = missing) */
    IV_COL_BOOL,             /* uint8 values 0/1 */
    IV_COL_STRING,           /* UTF-8 strings */
} iv_col_type_t;

/* "categorical", "int", "float", "bool", "string". */
const char *iv_col_type_name(iv_col_type_t t);

/*
 * One column, read-only for the lifetime of its meta.  Exactly the value
 * array of the column's type is set.  String i of a string column is
 * str_data + str_off[i] (NUL-terminated); categories likewise.
 */
typedef struct iv_meta_col {
    const char *name;
    iv_col_type_t type;
    const char *encoding;     /* the file's encoding-type ("categorical", "array",
                                 "nullable-integer", "string-array", "computed", ...) */
    iv_dtype_t dtype;         /* stored numeric dtype (INT/FLOAT/codes); informative */
    int nullable;             /* stored with a mask (nullable-*), or categorical/float */
    int computed;             /* 1 for columns computed from the matrix */
    int is_index;             /* 1 for the data frame's index (names) */
    int64_t n;                /* rows */
    int64_t null_count;
    const uint8_t *mask;      /* n bytes, 1 = missing; NULL when nothing is missing */

    const int64_t *i64;       /* IV_COL_INT */
    const double *f64;        /* IV_COL_FLOAT */
    const uint8_t *b;         /* IV_COL_BOOL */
    const int32_t *codes;     /* IV_COL_CATEGORICAL */
    const char *str_data;     /* IV_COL_STRING: arena */
    const int64_t *str_off;   /* IV_COL_STRING: n offsets into str_data */

    /* IV_COL_CATEGORICAL only. */
    int64_t n_cats;
    int ordered;
    int cats_numeric;         /* categories were numbers (cat_num holds them) */
    const char *cat_data;     /* category labels, arena */
    const int64_t *cat_off;   /* n_cats offsets into cat_data */
    const double *cat_num;    /* n_cats numeric values when cats_numeric, else NULL */
    const int64_t *cat_counts;/* rows per category (missing ones not counted) */
} iv_meta_col_t;

static inline const char *iv_meta_col_str(const iv_meta_col_t *c, int64_t i)
{
    return c->str_data + c->str_off[i];
}
static inline const char *iv_meta_col_cat(const iv_meta_col_t *c, int64_t k)
{
    return c->cat_data + c->cat_off[k];
}

typedef struct iv_meta iv_meta_t;

typedef struct iv_meta_stats {
    size_t bytes;             /* memory held by columns, names and hashes */
    double load_seconds;      /* iv_meta_load wall time */
    double computed_seconds;  /* iv_meta_add_computed wall time */
} iv_meta_stats_t;

/*
 * Reads obs and var of the .h5ad file at path.  x_group (NULL = "X") is
 * the matrix group whose shape attribute the row counts are checked
 * against; a file without that group is accepted unchecked.  Opens and
 * closes the file itself (HDF5, read-only; start-up only, never on the
 * query path), in a reader process (h5iso.h): a file that crashes libhdf5
 * fails with IV_EBAD_FILE and a message naming the element being read.  A missing obs or var group gives an empty frame with an
 * index of numbers "0".."n-1" when the matrix shape is known.
 * On error *out is NULL and err names the file, the column and the check.
 */
int iv_meta_load(const char *path, const char *x_group, iv_meta_t **out, iv_err_t *err);
/* The same with the frames read from other groups: raw/X's genes are
 * described by raw/var ("raw/X", NULL, "raw/var").  A NULL group gives an
 * empty frame (0 rows) for that axis, for a matrix that shares the other
 * one with X. */
int iv_meta_load_groups(const char *path, const char *x_group, const char *obs_group,
                        const char *var_group, iv_meta_t **out, iv_err_t *err);
void iv_meta_free(iv_meta_t *m);

/* Where iv_meta_load_kept keeps a file's obs/var between runs. */
typedef struct iv_meta_keep {
    const char *dir;          /* the cache folder (NULL or "": none kept) */
    size_t min_bytes;         /* answers smaller than this are not kept */
    char note[160];           /* out: "mapped from the cache folder", "read and
                                 kept in the cache folder", "read (...why...)" */
} iv_meta_keep_t;

/*
 * iv_meta_load for the server: the reader's answer is kept in keep->dir
 * (metafile.h) when it has min_bytes or more, and a later load of the
 * same unchanged file maps it instead of reading HDF5 again.  The arrays
 * are used in place either way (no copy).  A kept answer made for
 * another file or group, or damaged, is passed over (keep->note says
 * why) and the file read again; a cache folder that cannot be written
 * costs only the keeping.  Errors as iv_meta_load.
 */
int iv_meta_load_kept(const char *path, const char *x_group, iv_meta_keep_t *keep,
                      iv_meta_t **out, iv_err_t *err);

/* Builds what the first lookup by name would build (the names hashes of
 * both indexes; obs's is left to first use by a load), so that a server
 * can do it on a worker once the dataset serves.  Any thread. */
int iv_meta_warm(iv_meta_t *m, iv_err_t *err);

/*
 * Validates obs and var of the .h5ad file at path as iv_meta_load reads
 * them, with every check of the load (row counts against x_group's shape,
 * NULL = "X"; codes within their categories; categories unique; index,
 * column names, categories and strings well-formed UTF-8), for writers
 * that copy them (pack, export) and must not write what anndata cannot
 * read.  Elements in an encoding this reader does not read are passed
 * over, not failed: a writer copies them as they are.  Returns 0, or a
 * negative error whose message names the file and the element
 * ("FILE: obs/cell_type/categories: category 'B' appears twice ...").
 * Forks a reader process like iv_meta_load; any thread.
 */
int iv_meta_validate_file(const char *path, const char *x_group, iv_err_t *err);

/* Builds a meta from the bytes iv_meta_load's reader process answers
 * (its own format, see meta.c), checking every length, offset and code;
 * path names the file in errors.  What iv_meta_load does after the read;
 * public for the fuzz target.  data is not kept. */
int iv_meta_from_bytes(const char *path, const uint8_t *data, size_t len, iv_meta_t **out,
                       iv_err_t *err);

/*
 * Adds computed columns from the pointer arrays of ds (no decode):
 * IVCSR: obs total_counts, n_genes, max_count; IVCSC: var total_counts,
 * n_cells, max_count.  max_count counts implicit zeros (it is the maximum
 * of the dense row).  When the file already has a column of that name,
 * the computed one is named "iv_<name>".  The slices are summed in blocks
 * on pool's workers (NULL: the calling thread), a few seconds' work at
 * ten million cells.  Not thread-safe with readers: call at start-up,
 * before sharing the meta.
 */
int iv_meta_add_computed(iv_meta_t *m, const iv_dataset_t *ds, iv_pool_t *pool, iv_err_t *err);

/* The same from raw arrays (what iv_meta_add_computed calls; tests use it).
 * values has n_unique = value_ptr-length - 1 elements of dtype vt. */
int iv_meta_add_computed_arrays(iv_meta_t *m, iv_orient_t orient, int64_t n_major,
                                int64_t n_minor, const int64_t *major_ptr,
                                const int64_t *value_ptr, int64_t n_unique,
                                const void *values, iv_dtype_t vt, iv_err_t *err);

/* Rows of an axis (cells or genes). */
int64_t iv_meta_n_rows(const iv_meta_t *m, iv_axis_t axis);
/* Columns of an axis, in the file's column order, computed columns last;
 * the index is not counted (see iv_meta_index). */
size_t iv_meta_n_cols(const iv_meta_t *m, iv_axis_t axis);
const iv_meta_col_t *iv_meta_col(const iv_meta_t *m, iv_axis_t axis, size_t i);
/* Column by exact name (the index too, by its stored name); NULL if absent. */
const iv_meta_col_t *iv_meta_find_col(const iv_meta_t *m, iv_axis_t axis, const char *name);
/* The index (obs names / gene names): a string column. */
const iv_meta_col_t *iv_meta_index(const iv_meta_t *m, iv_axis_t axis);

void iv_meta_stats(const iv_meta_t *m, iv_meta_stats_t *out);

/* What a names lookup found besides exact matches.  Arrays hold positions
 * in the caller's names[] list, ascending; free with iv_names_report_free. */
typedef struct iv_names_report {
    int64_t n_found;
    int64_t n_missing;
    int64_t *missing;         /* names that matched nothing (out_idx = -1) */
    int64_t n_folded;
    int64_t *folded;          /* names matched only case-insensitively */
    int64_t n_ambiguous;
    int64_t *ambiguous;       /* case-insensitive matches of several rows: missing */
} iv_names_report_t;

void iv_names_report_free(iv_names_report_t *r);

/*
 * Looks names up on an axis, by the index (by_column NULL) or by a string
 * or categorical column (e.g. "gene_ids").  out_idx[i] receives the row of
 * names[i] (the first row with that exact value; duplicates in names[] give
 * duplicate rows) or -1.  An exact match wins; otherwise a unique
 * ASCII-case-insensitive match is taken and reported in rep->folded.
 * When allow_missing is 0 and a name is missing, returns IV_EUNKNOWN_NAME
 * and err lists the first missing names; out_idx and rep are filled either
 * way.  IV_EBAD_SELECTION when by_column is unknown or not of strings.
 * Thread-safe.  rep may be NULL.
 */
int iv_meta_find_names(iv_meta_t *m, iv_axis_t axis, const char *by_column,
                       const char *const *names, int64_t n, int allow_missing,
                       int64_t *out_idx, iv_names_report_t *rep, iv_err_t *err);

#endif /* IV_META_H */
