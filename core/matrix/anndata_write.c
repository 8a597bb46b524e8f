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

typedef struct subset {
    const int64_t *idx;       /* NULL = all rows */
    int64_t n;                /* output rows */
    int64_t axis_len;         /* input rows */
    char *skipped;
    size_t skipped_cap;
    const char *src_path;
} subset_t;

static void note_skipped(const subset_t *s, const char *path)
{
    size_t n = strlen(s->skipped);
    snprintf(s->skipped + n, s->skipped_cap - n, "%s%s", n ? ", " : "", path);
}

/* Subsets dataset name of src along axis 0 into dst. */
static int subset_dataset(hid_t src, const char *name, hid_t dst, const subset_t *s,
                          const char *path, iv_err_t *err)
{
    int rc = 0;
    hid_t d = H5Dopen2(src, name, H5P_DEFAULT), ft = -1, mt = -1, sp = -1, osp = -1, od = -1;
    uint8_t *buf = NULL, *out = NULL;
    if (d < 0) return FAILF(IV_EBAD_FILE, "%s:/%s: cannot open", s->src_path, path);
    ft = H5Dget_type(d);
    sp = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[8];
    if (rank < 1 || rank > 8) {
        rc = FAILF(IV_EUNSUPPORTED, "%s:/%s: rank %d cannot be subset", s->src_path, path, rank);
        goto done;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if ((int64_t)dims[0] != s->axis_len) {
        rc = FAILF(IV_EBAD_FILE, "%s:/%s has %llu rows, expected %" PRId64, s->src_path, path,
                   (unsigned long long)dims[0], s->axis_len);
        goto done;
    }
    if ((mt = H5Tget_native_type(ft, H5T_DIR_ASCEND)) < 0 && (mt = H5Tcopy(ft)) < 0) {
        rc = FAILF(IV_EUNSUPPORTED, "%s:/%s: element type unreadable", s->src_path, path);
        goto done;
    }
    char what[2400];
    snprintf(what, sizeof what, "%s:/%s", s->src_path, path);
    iv_h5guard_stage("reading %s", path);
    if ((rc = iv_h5_check_stored(d, what, err)) < 0) goto done;
    /* The row's bytes and the whole array's, without overflow: a shape
     * past what memory can hold is refused, not attempted. */
    size_t row = H5Tget_size(mt);
    double whole = (double)row * (double)(dims[0] ? dims[0] : 1);
    for (int i = 1; i < rank; i++) {
        whole *= (double)dims[i];
        row *= (size_t)dims[i];
    }
    if (whole + (double)row * (double)s->n > (double)((size_t)1 << 46)) {
        rc = FAILF(IV_ETOO_LARGE, "%s: %.0f bytes is past what export can hold", what, whole);
        goto done;
    }
    buf = malloc(row * (size_t)(dims[0] ? dims[0] : 1) + 1);
    out = malloc(row * (size_t)(s->n ? s->n : 1) + 1);
    if (!buf || !out) {
        rc = FAILF(IV_ENOMEM, "%s:/%s: out of memory", s->src_path, path);
        goto done;
    }
    if (dims[0] > 0 && row > 0 && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        rc = FAILF(IV_EBAD_FILE, "%s:/%s: read failed", s->src_path, path);
        goto done;
    }
    if (s->idx)
        for (int64_t i = 0; i < s->n; i++) memcpy(out + (size_t)i * row, buf + (size_t)s->idx[i] * row, row);
    else
        memcpy(out, buf, row * (size_t)s->n);
    hsize_t odims[8];
    memcpy(odims, dims, sizeof odims);
    odims[0] = (hsize_t)s->n;
    osp = H5Screate_simple(rank, odims, NULL);
    if (osp < 0 || (od = H5Dcreate2(dst, name, ft, osp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        (s->n > 0 && row > 0 && H5Dwrite(od, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) ||
        iv_h5w_copy_attrs(d, od) < 0)
        rc = FAILF(IV_EIO, "%s: cannot write", path);
    if (dims[0] > 0 && (H5Tdetect_class(mt, H5T_VLEN) > 0 || H5Tis_variable_str(mt) > 0))
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, buf);
done:
    free(buf);
    free(out);
    if (od >= 0) H5Dclose(od);
    if (osp >= 0) H5Sclose(osp);
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    H5Dclose(d);
    return rc;
}

static int subset_element(hid_t src, const char *name, hid_t dst, const subset_t *s,
                          const char *parent, int in_frame, iv_err_t *err);

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
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[1024];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child,
                               H5P_DEFAULT) < 0) {
            rc = FAILF(IV_EBAD_FILE, "%s:/%s: unreadable", s->src_path, path);
            break;
        }
        int copy = 0;
        for (size_t k = 0; whole && whole[k]; k++) copy |= strcmp(child, whole[k]) == 0;
        if (copy) {
            if (iv_h5w_copy_object(sg, child, dg, child) < 0)
                rc = FAILF(IV_EIO, "%s/%s: cannot copy", path, child);
        } else {
            rc = subset_element(sg, child, dg, s, path, in_frame, err);
        }
    }
    if (dg >= 0) H5Gclose(dg);
    H5Gclose(sg);
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
    static const char *const cat_whole[] = {"categories", NULL};
    static const char *const frame_whole[] = {"__categories", NULL};
    if (strcmp(enc, "categorical") == 0) return subset_group(src, name, dst, s, path, cat_whole, 1, err);
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

/* obsm / varm: a dict of elements with rows along the axis. */
static int write_axism(hid_t in, hid_t out, const char *name, const subset_t *s, iv_err_t *err)
{
    if (H5Lexists(in, name, H5P_DEFAULT) <= 0) return 0;
    hid_t sg = H5Gopen2(in, name, H5P_DEFAULT);
    if (sg < 0) return 0;
    hid_t dg = H5Gcreate2(out, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = dg < 0 || iv_h5w_copy_attrs(sg, dg) < 0 ? FAILF(IV_EIO, "/%s: cannot write", name) : 0;
    H5G_info_t gi;
    if (rc == 0 && H5Gget_info(sg, &gi) < 0) gi.nlinks = 0;
    for (hsize_t i = 0; rc == 0 && i < gi.nlinks; i++) {
        char child[1024];
        if (H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, child, sizeof child,
                               H5P_DEFAULT) < 0)
            break;
        rc = subset_element(sg, child, dg, s, name, 1, err);
    }
    if (dg >= 0) H5Gclose(dg);
    H5Gclose(sg);
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
        hsize_t cnt[1] = {bytes[k] / esz}, o[1] = {off};
        if (cnt[0] == 0) continue;
        hid_t ms = H5Screate_simple(1, cnt, NULL), fs = H5Dget_space(d);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, o, NULL, cnt, NULL);
        if (H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, parts[k]) < 0) rc = -1;
        H5Sclose(fs);
        H5Sclose(ms);
        off += cnt[0];
    }
    if (rc == 0 && (int64_t)off != n) rc = -1;
    if (rc == 0 && iv_h5w_attr_encoding(d, "array", "0.2.0") < 0) rc = -1;
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    return rc;
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
    /* indptr and indices in one integer type, as scipy makes them: int32
     * while every pointer and index fits, int64 otherwise.  scipy's
     * indexing routines refuse a mix (anndata's backed X[:, genes] failed
     * with "Output dtype not compatible with inputs"); HDF5 converts from
     * the memory types. */
    int wide = x->index_bits == 64 ||
               (x->index_bits == 0 && (x->index_size == 8 || x->nnz > INT32_MAX || x->n_cols > INT32_MAX));
    hid_t ift = wide ? H5T_STD_I64LE : H5T_STD_I32LE;
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

int iv_anndata_write(const char *src_path, const char *out_path, const iv_adw_x_t *x,
                     const iv_sel_t *obs, const iv_sel_t *var, char *skipped, size_t skipped_cap,
                     iv_err_t *err)
{
    skipped[0] = '\0';
    if (x->index_bits != 0 && x->index_bits != 32 && x->index_bits != 64)
        return FAILF(IV_EINVALID_ARG, "index type of %d bits (expected 32 or 64)", x->index_bits);
    if (x->index_bits == 32 && (x->nnz > INT32_MAX || x->n_cols > INT32_MAX))
        return FAILF(IV_ETOO_LARGE, "%s: %lld stored values and %lld columns do not fit int32 "
                     "indptr and indices", out_path, (long long)x->nnz, (long long)x->n_cols);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", out_path, (long)getpid());
    hid_t in = H5Fopen(src_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (in < 0) return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", src_path);
    iv_h5guard_stage("checking the filter pipelines");
    if (iv_h5_check_filters(in, src_path, err) < 0) {
        H5Fclose(in);
        return err->code;
    }
    iv_h5guard_temp(tmp);
    hid_t out = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int rc = 0;
    if (out < 0) {
        rc = FAILF(IV_EIO, "%s: cannot create: %s", out_path, strerror(errno));
        goto done;
    }
    hid_t rin = H5Gopen2(in, "/", H5P_DEFAULT), rout = H5Gopen2(out, "/", H5P_DEFAULT);
    int ok = rin >= 0 && rout >= 0 && iv_h5w_copy_attrs(rin, rout) == 0;
    if (ok && H5Aexists(rout, "encoding-type") <= 0)
        ok = iv_h5w_attr_encoding(rout, "anndata", "0.1.0") == 0;
    if (rin >= 0) H5Gclose(rin);
    if (rout >= 0) H5Gclose(rout);
    if (!ok) {
        rc = FAILF(IV_EIO, "%s: cannot write the root attributes", out_path);
        goto done;
    }
    if (write_x(out, x) < 0) {
        rc = FAILF(IV_EIO, "%s: cannot write X (disk full?)", out_path);
        goto done;
    }
    subset_t so = {obs->all ? NULL : obs->idx, obs->all ? x->src_rows : obs->n, x->src_rows,
                   skipped, skipped_cap, src_path};
    subset_t sv = {var->all ? NULL : var->idx, var->all ? x->src_cols : var->n, x->src_cols,
                   skipped, skipped_cap, src_path};
    if ((rc = write_axis(in, out, "obs", &so, err)) < 0 ||
        (rc = write_axis(in, out, "var", &sv, err)) < 0 ||
        (rc = write_axism(in, out, "obsm", &so, err)) < 0 ||
        (rc = write_axism(in, out, "varm", &sv, err)) < 0)
        goto done;
    iv_h5guard_stage("copying uns");
    if (H5Lexists(in, "uns", H5P_DEFAULT) > 0 && iv_h5w_copy_object(in, "uns", out, "uns") < 0) {
        rc = FAILF(IV_EIO, "%s:/uns: cannot copy", src_path);
        goto done;
    }
    static const char *const dropped[] = {"obsp", "varp", "layers", "raw"};
    for (size_t i = 0; i < sizeof dropped / sizeof *dropped; i++) {
        if (H5Lexists(in, dropped[i], H5P_DEFAULT) <= 0) continue;
        H5G_info_t gi;
        hid_t g = H5Gopen2(in, dropped[i], H5P_DEFAULT);
        int empty = g >= 0 && H5Gget_info(g, &gi) >= 0 && gi.nlinks == 0;
        if (g >= 0) H5Gclose(g);
        if (!empty) {
            subset_t t = so;
            note_skipped(&t, dropped[i]);
        }
    }
done:
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
