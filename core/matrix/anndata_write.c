/*
 * AnnData writer for `ivserve export -o OUT.h5ad` (see anndata_write.h).
 *
 * Row subsetting reads a whole element in its own in-memory type (numbers,
 * fixed-length or variable-length strings, enums) and gathers rows as byte
 * runs, so every type HDF5 can convert to memory survives unchanged: the
 * gathered variable-length pointers still point into the buffer HDF5
 * allocated, which is reclaimed only after the write.  Memory is the
 * element read plus its subset; metadata columns are small next to X.
 * A whole axis selected goes the same way (idx NULL), so that the output
 * never depends on a filter plugin the input's columns needed.
 */
#include "anndata_write.h"

#include <errno.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "h5guard.h"
#include "h5util.h"
#include "h5write.h"

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

/* A categorical column of obs or var whose categories were trimmed: uns's
 * "{col}_colors" is trimmed alike. */
typedef struct cat_trim {
    char col[256];
    int64_t n_cat;            /* categories in the input */
    int64_t *used;            /* the ones kept, ascending */
    int64_t n_used;
    struct cat_trim *next;
} cat_trim_t;

typedef struct subset {
    const int64_t *idx;       /* NULL = all rows */
    int64_t n;                /* output rows */
    int64_t axis_len;         /* input rows */
    char *skipped;
    size_t skipped_cap;
    const char *src_path;
    cat_trim_t **trims;       /* obs's and var's trimmed columns (NULL: not recorded) */
} subset_t;

static void note_skipped(const subset_t *s, const char *path)
{
    size_t n = strlen(s->skipped);
    snprintf(s->skipped + n, s->skipped_cap - n, "%s%s", n ? ", " : "", path);
}

/*
 * One dataset being subset: the input dataset, its file and memory types
 * and space, its shape, the bytes of a row (all dimensions past the
 * first), the whole element read and the rows gathered, and the output's
 * space and dataset.
 */
struct subset_io {
    hid_t d, ft, mt, sp, osp, od;
    int rank;
    hsize_t dims[8];
    size_t row;
    uint8_t *buf, *out;
};

/* The input's type and shape, checked: rank 1 to 8, as many rows as the
 * axis, a memory type HDF5 can convert to. */
static int subset_open(struct subset_io *io, const subset_t *s, const char *path, iv_err_t *err)
{
    io->ft = H5Dget_type(io->d);
    io->sp = H5Dget_space(io->d);
    io->rank = H5Sget_simple_extent_ndims(io->sp);
    if (io->rank < 1 || io->rank > 8)
        return FAILF(IV_EUNSUPPORTED, "%s:/%s: rank %d cannot be subset", s->src_path, path, io->rank);
    H5Sget_simple_extent_dims(io->sp, io->dims, NULL);
    if ((int64_t)io->dims[0] != s->axis_len)
        return FAILF(IV_EBAD_FILE, "%s:/%s has %llu rows, expected %" PRId64, s->src_path, path,
                     (unsigned long long)io->dims[0], s->axis_len);
    if ((io->mt = H5Tget_native_type(io->ft, H5T_DIR_ASCEND)) < 0 && (io->mt = H5Tcopy(io->ft)) < 0)
        return FAILF(IV_EUNSUPPORTED, "%s:/%s: element type unreadable", s->src_path, path);
    return 0;
}

/* The bytes of a row (io->row) and of the whole array, the latter as a
 * double so that no shape overflows it. */
static double subset_sizes(struct subset_io *io)
{
    size_t row = H5Tget_size(io->mt);
    double whole = (double)row * (double)(io->dims[0] ? io->dims[0] : 1);
    for (int i = 1; i < io->rank; i++) {
        whole *= (double)io->dims[i];
        row *= (size_t)io->dims[i];
    }
    io->row = row;
    return whole;
}

/* The whole element read into io->buf, and io->out allocated for the
 * subset.  A shape past what memory can hold is refused, not attempted. */
static int subset_read(struct subset_io *io, const subset_t *s, const char *path, iv_err_t *err)
{
    char what[2400];
    snprintf(what, sizeof what, "%s:/%s", s->src_path, path);
    iv_h5guard_stage("reading %s", path);
    int rc = iv_h5_check_stored(io->d, what, err);
    if (rc < 0) return rc;
    double whole = subset_sizes(io);
    size_t row = io->row;
    if (whole + (double)row * (double)s->n > (double)((size_t)1 << 46))
        return FAILF(IV_ETOO_LARGE, "%s: %.0f bytes is past what export can hold", what, whole);
    io->buf = malloc(row * (size_t)(io->dims[0] ? io->dims[0] : 1) + 1);
    io->out = malloc(row * (size_t)(s->n ? s->n : 1) + 1);
    if (!io->buf || !io->out) return FAILF(IV_ENOMEM, "%s:/%s: out of memory", s->src_path, path);
    if (io->dims[0] > 0 && row > 0 && H5Dread(io->d, io->mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, io->buf) < 0)
        return FAILF(IV_EBAD_FILE, "%s:/%s: read failed", s->src_path, path);
    return 0;
}

/* The selected rows, in the selection's order, gathered as byte runs. */
static void subset_gather(struct subset_io *io, const subset_t *s)
{
    size_t row = io->row;
    if (!s->idx) {
        memcpy(io->out, io->buf, row * (size_t)s->n);
        return;
    }
    for (int64_t i = 0; i < s->n; i++) memcpy(io->out + (size_t)i * row, io->buf + (size_t)s->idx[i] * row, row);
}

/* The variable-length data HDF5 allocated for the read, which the
 * gathered rows pointed into. */
static void subset_reclaim(struct subset_io *io)
{
    if (io->dims[0] > 0 && (H5Tdetect_class(io->mt, H5T_VLEN) > 0 || H5Tis_variable_str(io->mt) > 0))
        H5Dvlen_reclaim(io->mt, io->sp, H5P_DEFAULT, io->buf);
}

/* The subset written as dataset name of dst, in the input's file type,
 * with the input's attributes. */
static int subset_write(struct subset_io *io, hid_t dst, const char *name, const subset_t *s, const char *path,
                        iv_err_t *err)
{
    hsize_t odims[8];
    memcpy(odims, io->dims, sizeof odims);
    odims[0] = (hsize_t)s->n;
    io->osp = H5Screate_simple(io->rank, odims, NULL);
    if (io->osp < 0 ||
        (io->od = H5Dcreate2(dst, name, io->ft, io->osp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        (s->n > 0 && io->row > 0 && H5Dwrite(io->od, io->mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, io->out) < 0) ||
        iv_h5w_copy_attrs(io->d, io->od) < 0)
        return FAILF(IV_EIO, "%s: cannot write", path);
    return 0;
}

static void subset_io_close(struct subset_io *io)
{
    free(io->buf);
    free(io->out);
    if (io->od >= 0) H5Dclose(io->od);
    if (io->osp >= 0) H5Sclose(io->osp);
    if (io->sp >= 0) H5Sclose(io->sp);
    if (io->mt >= 0) H5Tclose(io->mt);
    if (io->ft >= 0) H5Tclose(io->ft);
    H5Dclose(io->d);
}

/* Subsets dataset name of src along axis 0 into dst: open and check,
 * read whole, gather the rows, write. */
static int subset_dataset(hid_t src, const char *name, hid_t dst, const subset_t *s,
                          const char *path, iv_err_t *err)
{
    struct subset_io io = {.d = H5Dopen2(src, name, H5P_DEFAULT), .ft = -1, .mt = -1, .sp = -1, .osp = -1,
                           .od = -1};
    if (io.d < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: cannot open", s->src_path, path);
    int rc = subset_open(&io, s, path, err);
    if (rc == 0) rc = subset_read(&io, s, path, err);
    if (rc == 0) {
        subset_gather(&io, s);
        rc = subset_write(&io, dst, name, s, path, err);
        subset_reclaim(&io);
    }
    subset_io_close(&io);
    return rc;
}

static int subset_element(hid_t src, const char *name, hid_t dst, const subset_t *s,
                          const char *parent, int in_frame, iv_err_t *err);

/* Whether child is one of the names of whole (NULL-terminated; NULL: none). */
static int is_whole(const char *child, const char *const *whole)
{
    for (size_t k = 0; whole && whole[k]; k++)
        if (strcmp(child, whole[k]) == 0) return 1;
    return 0;
}

/* Child i of group sg (at path) into dg: copied unchanged when named in
 * whole, else subset. */
static int subset_child(hid_t sg, hsize_t i, hid_t dg, const subset_t *s, const char *path,
                        const char *const *whole, int in_frame, iv_err_t *err)
{
    char child[1024];
    if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child, H5P_DEFAULT) < 0)
        return FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
    if (!is_whole(child, whole)) return subset_element(sg, child, dg, s, path, in_frame, err);
    if (iv_h5w_copy_object(sg, child, dg, child) < 0) return FAILF(IV_EIO, "%s/%s: cannot copy", path, child);
    return 0;
}

/* A group whose children are all rows-along-axis elements (dataframe,
 * obsm's dict) or named parts: `whole` children are copied unchanged. */
static int subset_group(hid_t src, const char *name, hid_t dst, const subset_t *s,
                        const char *path, const char *const *whole, int in_frame, iv_err_t *err)
{
    hid_t sg = H5Gopen2(src, name, H5P_DEFAULT);
    if (sg < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: cannot open", s->src_path, path);
    hid_t dg = H5Gcreate2(dst, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = 0;
    if (dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0) rc = FAILF(IV_EIO, "%s: cannot write", path);
    H5G_info_t gi;
    if (rc == 0 && H5Gget_info(sg, &gi) < 0) rc = FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) rc = subset_child(sg, i, dg, s, path, whole, in_frame, err);
    if (dg >= 0) H5Gclose(dg);
    H5Gclose(sg);
    return rc;
}

/* The smallest signed integer type of pandas' codes for n categories
 * (pandas.core.arrays.categorical's coerce_indexer_dtype). */
static hid_t codes_type(int64_t n)
{
    if (n < 128) return H5T_STD_I8LE;
    if (n < 32768) return H5T_STD_I16LE;
    if (n < ((int64_t)1 << 31)) return H5T_STD_I32LE;
    return H5T_STD_I64LE;
}

/* The number of rows of dataset name of g (rank 1), or -1. */
static int64_t rows_of(hid_t g, const char *name)
{
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    hsize_t dims[8] = {0};
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (rank == 1) H5Sget_simple_extent_dims(sp, dims, NULL);
    if (sp >= 0) H5Sclose(sp);
    H5Dclose(d);
    return rank == 1 ? (int64_t)dims[0] : -1;
}

/* The selected rows' codes (-1: missing) read as int64 into *out. */
static int read_codes(hid_t sg, const subset_t *s, const char *path, int64_t n_cat, int64_t **out,
                      iv_err_t *err)
{
    *out = NULL;
    if (rows_of(sg, "codes") != s->axis_len)
        return FAILF(IV_EBAD_FILE, "%s:/%s/codes: not one code a row", s->src_path, path);
    int64_t *all = malloc((size_t)(s->axis_len ? s->axis_len : 1) * sizeof *all);
    int64_t *sub = malloc((size_t)(s->n ? s->n : 1) * sizeof *sub);
    hid_t d = H5Dopen2(sg, "codes", H5P_DEFAULT);
    int rc = 0;
    if (!all || !sub) rc = FAILF(IV_ENOMEM, "%s:/%s: out of memory", s->src_path, path);
    else if (d < 0 || (s->axis_len > 0 && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) < 0))
        rc = FAILF(IV_EBAD_FILE, "%s:/%s/codes: read failed", s->src_path, path);
    for (int64_t i = 0; rc == 0 && i < s->n; i++) {
        int64_t c = all[s->idx ? s->idx[i] : i];
        if (c < -1 || c >= n_cat)
            rc = FAILF(IV_EBAD_FILE, "%s:/%s/codes: code %" PRId64 " of row %" PRId64 " is not one of the %"
                       PRId64 " categories", s->src_path, path, c, s->idx ? s->idx[i] : i, n_cat);
        sub[i] = c;
    }
    if (d >= 0) H5Dclose(d);
    free(all);
    if (rc < 0) free(sub);
    else *out = sub;
    return rc;
}

/* The codes remapped to the kept categories, written as pandas types
 * them for that many, with the input's attributes. */
static int write_codes(hid_t sg, hid_t dg, const subset_t *s, const char *path, int64_t *codes,
                       const int64_t *map, int64_t n_used, iv_err_t *err)
{
    for (int64_t i = 0; i < s->n; i++)
        if (codes[i] >= 0) codes[i] = map[codes[i]];
    hsize_t dims[1] = {(hsize_t)s->n};
    hid_t sp = H5Screate_simple(1, dims, NULL), src = H5Dopen2(sg, "codes", H5P_DEFAULT);
    hid_t d = sp >= 0 ? H5Dcreate2(dg, "codes", codes_type(n_used), sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    int rc = d < 0 || (s->n > 0 && H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, codes) < 0) ||
                     src < 0 || iv_h5w_copy_attrs(src, d) < 0
                 ? FAILF(IV_EIO, "%s/codes: cannot write", path)
                 : 0;
    if (d >= 0) H5Dclose(d);
    if (src >= 0) H5Dclose(src);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/* Records the kept categories of obs's or var's column col (takes used). */
static void note_trim(const subset_t *s, const char *parent, const char *col, int64_t n_cat, int64_t *used,
                      int64_t n_used)
{
    cat_trim_t *t = NULL;
    if (s->trims && (strcmp(parent, "/obs") == 0 || strcmp(parent, "/var") == 0) &&
        strlen(col) < sizeof t->col && (t = calloc(1, sizeof *t)) != NULL) {
        snprintf(t->col, sizeof t->col, "%s", col);
        t->n_cat = n_cat;
        t->used = used;
        t->n_used = n_used;
        t->next = *s->trims;
        *s->trims = t;
        return;
    }
    free(used);
}

/* The categories the n codes use, ascending, into used (*n_used of
 * them), and map from an input category to its place among them. */
static void plan_kept(const int64_t *codes, int64_t n, int64_t n_cat, int64_t *map, int64_t *used,
                      int64_t *n_used)
{
    *n_used = 0;
    for (int64_t c = 0; c < n_cat; c++) map[c] = -1;
    for (int64_t i = 0; i < n; i++)
        if (codes[i] >= 0) map[codes[i]] = 0;
    for (int64_t c = 0; c < n_cat; c++) {
        if (map[c] != 0) continue;
        map[c] = *n_used;
        used[(*n_used)++] = c;
    }
}

/* s for another array: rows idx (n of them) of one of axis_len rows,
 * with no trims recorded. */
static subset_t rows_subset(const subset_t *s, const int64_t *idx, int64_t n, int64_t axis_len)
{
    subset_t r = *s;
    r.idx = idx;
    r.n = n;
    r.axis_len = axis_len;
    r.trims = NULL;
    return r;
}

/* The kept categories (rows `used` of the input's) as dg's categories. */
static int write_categories(hid_t sg, hid_t dg, const subset_t *s, const char *path, int64_t n_cat,
                            int64_t *used, int64_t n_used, iv_err_t *err)
{
    char cpath[2100];
    snprintf(cpath, sizeof cpath, "%s/categories", path);
    subset_t cs = rows_subset(s, used, n_used, n_cat);
    return subset_dataset(sg, "categories", dg, &cs, cpath, err);
}

/* sg's children other than codes and categories, subset into dg. */
static int subset_rest(hid_t sg, hid_t dg, const subset_t *s, const char *path, iv_err_t *err)
{
    H5G_info_t gi;
    if (H5Gget_info(sg, &gi) < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
    int rc = 0;
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[1024];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child, H5P_DEFAULT) < 0)
            return FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
        if (strcmp(child, "codes") != 0 && strcmp(child, "categories") != 0)
            rc = subset_element(sg, child, dg, s, path, 1, err);
    }
    return rc;
}

/*
 * A categorical column: the selected rows' codes, and only the categories
 * they use, in their order (anndata's subset drops the others, pandas'
 * remove_unused_categories), the codes renumbered and typed as pandas
 * types them.  Any other child is subset as usual.
 */
static int subset_categorical(hid_t src, const char *name, hid_t dst, const subset_t *s, const char *parent,
                              const char *path, iv_err_t *err)
{
    hid_t sg = H5Gopen2(src, name, H5P_DEFAULT);
    if (sg < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: cannot open", s->src_path, path);
    int64_t n_cat = rows_of(sg, "categories"), *codes = NULL, n_used = 0;
    int64_t *map = malloc((size_t)(n_cat > 0 ? n_cat : 1) * sizeof *map);
    int64_t *used = malloc((size_t)(n_cat > 0 ? n_cat : 1) * sizeof *used);
    hid_t dg = -1;
    int rc = 0;
    if (n_cat < 0) rc = FAILF(IV_EBAD_FILE, "%s:/%s/categories: not a 1-D array", s->src_path, path);
    else if (!map || !used) rc = FAILF(IV_ENOMEM, "%s:/%s: out of memory", s->src_path, path);
    else rc = read_codes(sg, s, path, n_cat, &codes, err);
    if (rc == 0) {
        plan_kept(codes, s->n, n_cat, map, used, &n_used);
        dg = H5Gcreate2(dst, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0) rc = FAILF(IV_EIO, "%s: cannot write", path);
    }
    if (rc == 0) rc = write_codes(sg, dg, s, path, codes, map, n_used, err);
    if (rc == 0) rc = write_categories(sg, dg, s, path, n_cat, used, n_used, err);
    if (rc == 0) rc = subset_rest(sg, dg, s, path, err);
    if (dg >= 0) H5Gclose(dg);
    H5Gclose(sg);
    free(codes);
    free(map);
    if (rc == 0) note_trim(s, parent, name, n_cat, used, n_used);
    else free(used);
    return rc;
}

static int subset_element(hid_t src, const char *name, hid_t dst, const subset_t *s,
                          const char *parent, int in_frame, iv_err_t *err)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", parent, name);
    H5O_info_t oi;
    if (H5Oget_info_by_name(src, name, &oi, H5P_DEFAULT) < 0)
        return FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
    if (oi.type == H5O_TYPE_DATASET) return subset_dataset(src, name, dst, s, path, err);
    if (oi.type != H5O_TYPE_GROUP) {
        note_skipped(s, path);
        return 0;
    }
    hid_t g = H5Gopen2(src, name, H5P_DEFAULT);
    char enc[64] = "";
    if (g >= 0) {
        iv_h5_read_str_attr(g, "encoding-type", enc, sizeof enc);
        H5Gclose(g);
    }
    static const char *const frame_whole[] = {"__categories", NULL};
    if (strcmp(enc, "categorical") == 0) return subset_categorical(src, name, dst, s, parent, path, err);
    if (strncmp(enc, "nullable-", 9) == 0) return subset_group(src, name, dst, s, path, NULL, 1, err);
    if (strcmp(enc, "dataframe") == 0 || (!enc[0] && !in_frame))
        return subset_group(src, name, dst, s, path, frame_whole, 1, err);
    note_skipped(s, path);
    return 0;
}

/* obs or var.  Every row selected is subset too, never H5Ocopy'd: the
 * output must be readable without the input's filters (Blosc2 columns). */
static int write_axis(hid_t in, hid_t out, const char *name, const subset_t *s, iv_err_t *err)
{
    if (H5Lexists(in, name, H5P_DEFAULT) <= 0) return 0;
    return subset_element(in, name, out, s, "", 0, err);
}

/* The elements of dict sg (at /name) subset into dg; a dict or a name
 * that cannot be read ends the list. */
static int subset_dict(hid_t sg, hid_t dg, const char *name, const subset_t *s, iv_err_t *err)
{
    H5G_info_t gi;
    if (H5Gget_info(sg, &gi) < 0) return 0;
    int rc = 0;
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[1024];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child,
                               H5P_DEFAULT) < 0)
            break;
        rc = subset_element(sg, child, dg, s, name, 1, err);
    }
    return rc;
}

/* obsm / varm: a dict of elements with rows along the axis. */
static int write_axism(hid_t in, hid_t out, const char *name, const subset_t *s, iv_err_t *err)
{
    if (H5Lexists(in, name, H5P_DEFAULT) <= 0) return 0;
    hid_t sg = H5Gopen2(in, name, H5P_DEFAULT);
    if (sg < 0) return 0;
    hid_t dg = H5Gcreate2(out, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0 ? FAILF(IV_EIO, "/%s: cannot write", name) : 0;
    if (rc == 0) rc = subset_dict(sg, dg, name, s, err);
    if (dg >= 0) H5Gclose(dg);
    H5Gclose(sg);
    return rc;
}

/* cnt elements of data written at element off of the 1-D dataset d.
 * 0 or -1. */
static int write_part(hid_t d, hid_t mtype, hsize_t off, hsize_t cnt, const void *data)
{
    hsize_t c[1] = {cnt}, o[1] = {off};
    hid_t ms = H5Screate_simple(1, c, NULL), fs = H5Dget_space(d);
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, o, NULL, c, NULL);
    int rc = H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, data) < 0 ? -1 : 0;
    H5Sclose(fs);
    H5Sclose(ms);
    return rc;
}

/* One contiguous 1-D dataset written from parts. */
static int write_parts(hid_t g, const char *name, hid_t ftype, hid_t mtype, size_t esz,
                       int64_t n, size_t n_parts, const void *const *parts, const size_t *bytes)
{
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t d = sp < 0 ? -1 : H5Dcreate2(g, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = d < 0 ? -1 : 0;
    hsize_t off = 0;
    for (size_t k = 0; rc == 0 && k < n_parts; k++) {
        hsize_t cnt = bytes[k] / esz;
        if (cnt == 0) continue;
        rc = write_part(d, mtype, off, cnt, parts[k]);
        off += cnt;
    }
    if (rc == 0 && (int64_t)off != n) rc = -1;
    if (rc == 0 && iv_h5w_attr_encoding(d, "array", "0.2.0") < 0) rc = -1;
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/*
 * indptr and indices in one integer type, as scipy makes them: int32
 * while every pointer and index fits, int64 otherwise.  scipy's indexing
 * routines refuse a mix (anndata's backed X[:, genes] failed with
 * "Output dtype not compatible with inputs"); HDF5 converts from the
 * memory types.
 */
static hid_t index_file_type(const iv_adw_x_t *x)
{
    int wide = x->index_bits == 64 ||
               (x->index_bits == 0 && (x->index_size == 8 || x->nnz > INT32_MAX || x->n_cols > INT32_MAX));
    return wide ? H5T_STD_I64LE : H5T_STD_I32LE;
}

static int write_x(hid_t out, const iv_adw_x_t *x)
{
    hid_t g = H5Gcreate2(out, "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return -1;
    int64_t shape[2] = {x->n_rows, x->n_cols};
    int rc = iv_h5w_attr_encoding(g, "csr_matrix", "0.1.0") < 0 ||
                     iv_h5w_attr_i64(g, "shape", shape, 2) < 0 ? -1 : 0;
    const void *pp[1] = {x->indptr};
    size_t pb[1] = {(size_t)(x->n_rows + 1) * sizeof(int64_t)};
    size_t esz = iv_dtype_size(x->dtype);
    /* The little-endian file type of the value dtype: the native one on
     * every platform this builds for, spelled as numpy stores it. */
    hid_t vft = H5Tcopy(iv_h5_native(x->dtype));
    H5Tset_order(vft, H5T_ORDER_LE);
    hid_t ift = index_file_type(x);
    if (rc == 0) rc = write_parts(g, "indptr", ift, H5T_NATIVE_INT64, 8, x->n_rows + 1, 1, pp, pb);
    if (rc == 0)
        rc = write_parts(g, "indices", ift, x->index_size == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64,
                         (size_t)x->index_size, x->nnz, x->n_parts, x->indices, x->indices_bytes);
    if (rc == 0)
        rc = write_parts(g, "data", vft, iv_h5_native(x->dtype), esz, x->nnz, x->n_parts, x->data,
                         x->data_bytes);
    H5Tclose(vft);
    H5Gclose(g);
    return rc;
}

/* The index type asked for, and whether the result fits it. */
static int check_index_bits(const iv_adw_x_t *x, const char *out_path, iv_err_t *err)
{
    if (x->index_bits != 0 && x->index_bits != 32 && x->index_bits != 64)
        return FAILF(IV_EINVALID_ARG, "index type of %d bits (expected 32 or 64)", x->index_bits);
    if (x->index_bits == 32 && (x->nnz > INT32_MAX || x->n_cols > INT32_MAX))
        return FAILF(IV_ETOO_LARGE, "%s: %lld stored values and %lld columns do not fit int32 "
                     "indptr and indices", out_path, (long long)x->nnz, (long long)x->n_cols);
    return 0;
}

/* The input file (*in), its filter pipelines checked. */
static int open_source(const char *src_path, hid_t *in, iv_err_t *err)
{
    *in = H5Fopen(src_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (*in < 0) return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", src_path);
    iv_h5guard_stage("checking the filter pipelines");
    if (iv_h5_check_filters(*in, src_path, err) < 0) {
        H5Fclose(*in);
        return err->code;
    }
    return 0;
}

/* The input root's attributes, and encoding-type anndata where it has
 * none.  0 or -1. */
static int write_root_attrs(hid_t in, hid_t out)
{
    hid_t rin = H5Gopen2(in, "/", H5P_DEFAULT), rout = H5Gopen2(out, "/", H5P_DEFAULT);
    int ok = rin >= 0 && rout >= 0 && iv_h5w_copy_attrs(rin, rout) == 0;
    if (ok && H5Aexists(rout, "encoding-type") <= 0)
        ok = iv_h5w_attr_encoding(rout, "anndata", "0.1.0") == 0;
    if (rin >= 0) H5Gclose(rin);
    if (rout >= 0) H5Gclose(rout);
    return ok ? 0 : -1;
}

/* The rows of an axis of `len` that sel selects. */
static subset_t axis_subset(const iv_sel_t *sel, int64_t len, char *skipped, size_t skipped_cap,
                            const char *src_path, cat_trim_t **trims)
{
    subset_t s = {sel->all ? NULL : sel->idx, sel->all ? len : sel->n, len, skipped, skipped_cap, src_path, trims};
    return s;
}

/* Whether group name of in is there and not empty (one that cannot be
 * read counts as not empty). */
static int has_content(hid_t in, const char *name)
{
    if (H5Lexists(in, name, H5P_DEFAULT) <= 0) return 0;
    H5G_info_t gi;
    hid_t g = H5Gopen2(in, name, H5P_DEFAULT);
    int empty = g >= 0 && H5Gget_info(g, &gi) >= 0 && gi.nlinks == 0;
    if (g >= 0) H5Gclose(g);
    return !empty;
}

/* obsp, varp, layers and raw are not exported: each one there and not
 * empty is named in s->skipped. */
static void note_dropped(hid_t in, const subset_t *s)
{
    static const char *const dropped[] = {"obsp", "varp", "layers", "raw"};
    for (size_t i = 0; i < sizeof dropped / sizeof *dropped; i++)
        if (has_content(in, dropped[i])) note_skipped(s, dropped[i]);
}

/* uns's "{col}_colors" of each trimmed categorical column, trimmed alike
 * (anndata's _remove_unused_categories: the colors of the kept
 * categories; left whole when they are too few to index so). */
static int trim_colors(hid_t in, hid_t out, const cat_trim_t *t, const subset_t *s, iv_err_t *err)
{
    if (!t || H5Lexists(in, "uns", H5P_DEFAULT) <= 0 || H5Lexists(out, "uns", H5P_DEFAULT) <= 0) return 0;
    hid_t iu = H5Gopen2(in, "uns", H5P_DEFAULT), ou = H5Gopen2(out, "uns", H5P_DEFAULT);
    int rc = iu < 0 || ou < 0 ? FAILF(IV_EBAD_FILE, "%s:/uns: cannot open", s->src_path) : 0;
    for (; rc == 0 && t; t = t->next) {
        char name[300], path[320];
        snprintf(name, sizeof name, "%s_colors", t->col);
        snprintf(path, sizeof path, "/uns/%s", name);
        /* -1: absent, a group, or not one row a colour. */
        int64_t rows = H5Lexists(iu, name, H5P_DEFAULT) > 0 ? rows_of(iu, name) : -1;
        if (rows < 0 || (t->n_used > 0 && t->used[t->n_used - 1] >= rows)) continue;
        subset_t cs = rows_subset(s, t->used, t->n_used, rows);
        if (H5Ldelete(ou, name, H5P_DEFAULT) < 0) rc = FAILF(IV_EIO, "%s: cannot write", path);
        else rc = subset_dataset(iu, name, ou, &cs, path, err);
    }
    if (ou >= 0) H5Gclose(ou);
    if (iu >= 0) H5Gclose(iu);
    return rc;
}

static void trims_free(cat_trim_t *t)
{
    while (t) {
        cat_trim_t *n = t->next;
        free(t->used);
        free(t);
        t = n;
    }
}

/* The output's contents: the root's attributes, X, obs and var, obsm
 * and varm, uns; the elements left out named in the subsets' skipped. */
static int write_contents(hid_t in, hid_t out, const char *out_path, const iv_adw_x_t *x, const subset_t *so,
                          const subset_t *sv, iv_err_t *err)
{
    if (write_root_attrs(in, out) < 0) return FAILF(IV_EIO, "%s: cannot write the root attributes", out_path);
    if (write_x(out, x) < 0) return FAILF(IV_EIO, "%s: cannot write X (disk full?)", out_path);
    int rc;
    if ((rc = write_axis(in, out, "obs", so, err)) < 0 || (rc = write_axis(in, out, "var", sv, err)) < 0 ||
        (rc = write_axism(in, out, "obsm", so, err)) < 0 || (rc = write_axism(in, out, "varm", sv, err)) < 0)
        return rc;
    iv_h5guard_stage("copying uns");
    if (H5Lexists(in, "uns", H5P_DEFAULT) > 0 && iv_h5w_copy_object(in, "uns", out, "uns") < 0)
        return FAILF(IV_EIO, "%s:/uns: cannot copy", so->src_path);
    if ((rc = trim_colors(in, out, *so->trims, so, err)) < 0 || (rc = trim_colors(in, out, *sv->trims, sv, err)) < 0)
        return rc;
    note_dropped(in, so);
    return 0;
}

/* Closes both files and, when all went well (rc 0), renames the
 * temporary into place; otherwise removes it.  rc, or the close's or
 * rename's error. */
static int finish_file(hid_t in, hid_t out, const char *tmp, const char *src_path, const char *out_path, int rc,
                       iv_err_t *err)
{
    iv_h5guard_stage("closing %s and %s", src_path, out_path);
    if (out >= 0 && H5Fclose(out) < 0 && rc == 0)
        rc = FAILF(IV_EIO, "%s: closing the file failed (disk full?)", out_path);
    H5Fclose(in);
    if (rc == 0 && iv_h5guard_commit(tmp, out_path) != 0)
        rc = FAILF(IV_EIO, "%s: cannot rename the finished file into place: %s", out_path,
                   strerror(errno));
    if (rc < 0) unlink(tmp);
    iv_h5guard_temp(NULL);
    return rc;
}

int iv_anndata_write(const char *src_path, const char *out_path, const iv_adw_x_t *x,
                     const iv_sel_t *obs, const iv_sel_t *var, char *skipped, size_t skipped_cap,
                     iv_err_t *err)
{
    skipped[0] = '\0';
    int rc = check_index_bits(x, out_path, err);
    if (rc < 0) return rc;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", out_path, (long)getpid());
    hid_t in;
    if ((rc = open_source(src_path, &in, err)) < 0) return rc;
    iv_h5guard_temp(tmp);
    hid_t out = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (out < 0) {
        rc = FAILF(IV_EIO, "%s: cannot create: %s", out_path, strerror(errno));
    } else {
        cat_trim_t *obs_trims = NULL, *var_trims = NULL;
        subset_t so = axis_subset(obs, x->src_rows, skipped, skipped_cap, src_path, &obs_trims);
        subset_t sv = axis_subset(var, x->src_cols, skipped, skipped_cap, src_path, &var_trims);
        rc = write_contents(in, out, out_path, x, &so, &sv, err);
        trims_free(obs_trims);
        trims_free(var_trims);
    }
    return finish_file(in, out, tmp, src_path, out_path, rc, err);
}
