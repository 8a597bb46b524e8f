/*
 * HDF5 loading and validation of the IVCSR/IVCSC group (see h5matrix.h).
 *
 * HDF5's automatic error printing is silenced for the calls made here: a
 * bad file must produce one clear message, not an HDF5 stack dump.  Every
 * HDF5 handle is closed on every path through the labelled cleanup at the
 * end of each function.
 */
#include "h5matrix.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

/* Reads a string attribute (variable or fixed length) into buf. */
static int read_str_attr(hid_t obj, const char *name, char *buf, size_t cap)
{
    int rc = -1;
    hid_t a = -1, t = -1, mt = -1;
    buf[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return -1;
    if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0) goto done;
    if ((t = H5Aget_type(a)) < 0) goto done;
    if (H5Tget_class(t) != H5T_STRING) goto done;
    hid_t sp = H5Aget_space(a);
    hssize_t npts = H5Sget_simple_extent_npoints(sp);
    H5Sclose(sp);
    if (npts != 1) goto done;
    if (H5Tis_variable_str(t) > 0) {
        char *s = NULL;
        mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        if (H5Aread(a, mt, &s) < 0) goto done;
        if (s) {
            snprintf(buf, cap, "%s", s);
            H5free_memory(s);
        }
    } else {
        size_t n = H5Tget_size(t);
        char *tmp = calloc(1, n + 1);
        if (!tmp) goto done;
        mt = H5Tcopy(t);
        if (H5Aread(a, mt, tmp) < 0) {
            free(tmp);
            goto done;
        }
        snprintf(buf, cap, "%s", tmp);
        free(tmp);
    }
    rc = 0;
done:
    if (mt >= 0) H5Tclose(mt);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Reads a small integer attribute array as int64. */
static int read_i64_attr(hid_t obj, const char *name, int64_t *out, size_t want)
{
    int rc = -1;
    hid_t a = -1, t = -1, sp = -1;
    if (H5Aexists(obj, name) <= 0) return -1;
    if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0) goto done;
    if ((t = H5Aget_type(a)) < 0 || H5Tget_class(t) != H5T_INTEGER) goto done;
    if ((sp = H5Aget_space(a)) < 0) goto done;
    if (H5Sget_simple_extent_npoints(sp) != (hssize_t)want) goto done;
    if (H5Aread(a, H5T_NATIVE_INT64, out) < 0) goto done;
    rc = 0;
done:
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Maps an HDF5 numeric type to ours. */
static int dtype_of(hid_t t, iv_dtype_t *out)
{
    H5T_class_t cls = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    if (cls == H5T_INTEGER) {
        int sgn = H5Tget_sign(t) == H5T_SGN_2;
        switch (sz) {
        case 1: *out = sgn ? IV_DT_INT8 : IV_DT_UINT8; return 0;
        case 2: *out = sgn ? IV_DT_INT16 : IV_DT_UINT16; return 0;
        case 4: *out = sgn ? IV_DT_INT32 : IV_DT_UINT32; return 0;
        case 8: *out = sgn ? IV_DT_INT64 : IV_DT_UINT64; return 0;
        }
    } else if (cls == H5T_FLOAT) {
        if (sz == 4) { *out = IV_DT_FLOAT32; return 0; }
        if (sz == 8) { *out = IV_DT_FLOAT64; return 0; }
    }
    return -1;
}

static hid_t native_of(iv_dtype_t t)
{
    switch (t) {
    case IV_DT_INT8: return H5T_NATIVE_INT8;
    case IV_DT_INT16: return H5T_NATIVE_INT16;
    case IV_DT_INT32: return H5T_NATIVE_INT32;
    case IV_DT_INT64: return H5T_NATIVE_INT64;
    case IV_DT_UINT8: return H5T_NATIVE_UINT8;
    case IV_DT_UINT16: return H5T_NATIVE_UINT16;
    case IV_DT_UINT32: return H5T_NATIVE_UINT32;
    case IV_DT_UINT64: return H5T_NATIVE_UINT64;
    case IV_DT_FLOAT32: return H5T_NATIVE_FLOAT;
    case IV_DT_FLOAT64: return H5T_NATIVE_DOUBLE;
    default: return -1;
    }
}

/* Opens a 1-D dataset of the group, giving its length and element type. */
static int open_1d(hid_t g, const char *where, const char *name, hid_t *d_out, int64_t *len,
                   iv_dtype_t *dt, iv_err_t *err)
{
    *d_out = -1;
    if (H5Lexists(g, name, H5P_DEFAULT) <= 0)
        return FAILF(IV_EBAD_FILE, "%s: dataset '%s' is missing", where, name);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return FAILF(IV_EBAD_FILE, "%s: '%s' is not a dataset", where, name);
    hid_t sp = H5Dget_space(d), t = H5Dget_type(d);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[1] = {0};
    int rc = 0;
    if (rank != 1) {
        rc = FAILF(IV_EBAD_FILE, "%s/%s: expected a 1-D array, found rank %d", where, name, rank);
    } else {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        if (dtype_of(t, dt) != 0)
            rc = FAILF(IV_EBAD_FILE, "%s/%s: element type is not an integer or float of 1-8 bytes",
                       where, name);
    }
    H5Tclose(t);
    H5Sclose(sp);
    if (rc < 0) {
        H5Dclose(d);
        return rc;
    }
    *len = (int64_t)dims[0];
    *d_out = d;
    return 0;
}

/* Reads a whole 1-D integer dataset as int64 (HDF5 converts). */
static int load_i64(hid_t g, const char *where, const char *name, int64_t **out, int64_t *len,
                    iv_err_t *err)
{
    hid_t d;
    iv_dtype_t dt;
    *out = NULL;
    IV_TRY(open_1d(g, where, name, &d, len, &dt, err));
    int rc = 0;
    if (dt == IV_DT_FLOAT32 || dt == IV_DT_FLOAT64) {
        rc = FAILF(IV_EBAD_FILE, "%s/%s: pointer array must be integer, found %s", where, name,
                   iv_dtype_name(dt));
    } else {
        *out = malloc((size_t)(*len ? *len : 1) * sizeof(int64_t));
        if (!*out) {
            rc = FAILF(IV_ENOMEM, "%s/%s: out of memory for %" PRId64 " pointers", where, name, *len);
        } else if (*len > 0) {
            /* uint64 values past INT64_MAX would be clipped by conversion;
             * read them raw and refuse them instead. */
            if (dt == IV_DT_UINT64) {
                if (H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0) {
                    rc = FAILF(IV_EBAD_FILE, "%s/%s: read failed", where, name);
                } else {
                    for (int64_t i = 0; i < *len; i++)
                        if ((*out)[i] < 0) {
                            rc = FAILF(IV_EBAD_FILE, "%s/%s[%" PRId64 "] exceeds int64", where,
                                       name, i);
                            break;
                        }
                }
            } else if (H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0) {
                rc = FAILF(IV_EBAD_FILE, "%s/%s: read failed (corrupt or unsupported compression)",
                           where, name);
            }
        }
    }
    H5Dclose(d);
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

static int map_file(const char *path, iv_h5matrix_t *m, iv_err_t *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FAILF(IV_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return FAILF(IV_EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    m->map_len = (size_t)st.st_size;
    if (m->map_len > 0) {
        void *p = mmap(NULL, m->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return FAILF(IV_EIO, "%s: cannot map: %s", path, strerror(errno));
        }
        m->map = p;
    }
    close(fd);
    return 0;
}

/* Reads the filter pipeline of a chunked dataset. */
static int read_pipeline(hid_t dcpl, const char *where, iv_pipeline_t *p, iv_err_t *err)
{
    int n = H5Pget_nfilters(dcpl);
    if (n < 0 || n > IV_PIPELINE_MAX)
        return FAILF(IV_EUNSUPPORTED, "%s: %d filters in the pipeline (at most %d supported)",
                     where, n, IV_PIPELINE_MAX);
    p->n = (size_t)n;
    p->elem_size = 1;
    for (int i = 0; i < n; i++) {
        iv_filter_t *f = &p->f[i];
        size_t ncd = IV_FILTER_MAX_CD;
        char name[64];
        unsigned cfg;
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &f->flags, &ncd, f->cd, sizeof name,
                                         name, &cfg);
        if (id < 0) return FAILF(IV_EBAD_FILE, "%s: cannot read filter %d", where, i);
        f->id = (int)id;
        f->n_cd = ncd < IV_FILTER_MAX_CD ? ncd : IV_FILTER_MAX_CD;
        switch (f->id) {
        case IV_FILTER_DEFLATE: case IV_FILTER_SHUFFLE: case IV_FILTER_FLETCHER32:
        case IV_FILTER_ZSTD: case IV_FILTER_BLOSC2:
            break;
        default:
            return FAILF(IV_EUNSUPPORTED, "%s: HDF5 filter %d ('%s') is not supported", where,
                         f->id, name);
        }
    }
    return 0;
}

/* The largest packed_indices chunk taken (1 GiB). */
#define MAX_CHUNK_BYTES (1u << 30)

/* Describes where packed_indices' bytes are. */
static int locate_packed(hid_t file, hid_t d, const char *path, const char *where, int64_t len,
                         iv_h5matrix_t *m, iv_err_t *err)
{
    int rc = 0;
    hid_t dcpl = H5Dget_create_plist(d);
    hid_t fcpl = H5Fget_create_plist(file);
    hsize_t userblock = 0;
    if (fcpl >= 0) H5Pget_userblock(fcpl, &userblock);
    iv_stream_desc_t *s = &m->stream;
    memset(s, 0, sizeof *s);
    s->length = (uint64_t)len;
    s->map = m->map;
    s->map_len = m->map_len;
    H5D_layout_t layout = H5Pget_layout(dcpl);

    if (layout == H5D_CHUNKED) {
        hsize_t cdims[1];
        if (H5Pget_chunk(dcpl, 1, cdims) != 1 || cdims[0] == 0) {
            rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: bad chunk shape", where);
            goto done;
        }
        if (cdims[0] > MAX_CHUNK_BYTES) {
            rc = FAILF(IV_EUNSUPPORTED, "%s/packed_indices: chunks of %llu bytes (at most 1 GiB)",
                       where, (unsigned long long)cdims[0]);
            goto done;
        }
        if ((rc = read_pipeline(dcpl, where, &s->pipe, err)) < 0) goto done;
        iv_pipeline_describe(&s->pipe, m->codec, sizeof m->codec);
        s->chunked = 1;
        s->chunk_len = cdims[0];
        s->n_chunks = ((uint64_t)len + cdims[0] - 1) / cdims[0];
        size_t nc = (size_t)(s->n_chunks ? s->n_chunks : 1);
        s->chunk_addr = malloc(nc * sizeof *s->chunk_addr);
        s->chunk_size = malloc(nc * sizeof *s->chunk_size);
        s->chunk_mask = malloc(nc * sizeof *s->chunk_mask);
        if (!s->chunk_addr || !s->chunk_size || !s->chunk_mask) {
            rc = FAILF(IV_ENOMEM, "%s/packed_indices: out of memory for the chunk table", where);
            goto done;
        }
        for (uint64_t c = 0; c < s->n_chunks; c++) {
            hsize_t off[1] = {c * cdims[0]}, size = 0;
            haddr_t addr = HADDR_UNDEF;
            unsigned mask = 0;
            if (H5Dget_chunk_info_by_coord(d, off, &mask, &addr, &size) < 0) {
                rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: chunk %" PRIu64 " info unreadable",
                           where, c);
                goto done;
            }
            if (addr == HADDR_UNDEF || size == 0) {
                s->chunk_addr[c] = UINT64_MAX;
                s->chunk_size[c] = 0;
                s->chunk_mask[c] = 0;
                continue;
            }
            uint64_t a = (uint64_t)addr + userblock;
            if (a > m->map_len || size > m->map_len - a) {
                rc = FAILF(IV_EBAD_FILE,
                           "%s/packed_indices: chunk %" PRIu64 " (offset %" PRIu64 ", %llu bytes) "
                           "lies past the end of the file (%zu bytes)",
                           where, c, a, (unsigned long long)size, m->map_len);
                goto done;
            }
            s->chunk_addr[c] = a;
            s->chunk_size[c] = size;
            s->chunk_mask[c] = mask;
            m->stored_bytes += size;
        }
    } else if (layout == H5D_CONTIGUOUS && len > 0 && H5Dget_offset(d) != HADDR_UNDEF) {
        haddr_t a = H5Dget_offset(d); /* absolute: the user block is included */
        if (a > m->map_len || (uint64_t)len > m->map_len - a) {
            rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: contiguous data past the end of the file",
                       where);
            goto done;
        }
        s->contig = m->map + a;
        m->stored_bytes = (uint64_t)len;
        snprintf(m->codec, sizeof m->codec, "none");
    } else {
        /* Compact, external or never written: read it through HDF5 once. */
        s->owned_buf = malloc((size_t)(len ? len : 1));
        if (!s->owned_buf) {
            rc = FAILF(IV_ENOMEM, "%s/packed_indices: out of memory", where);
            goto done;
        }
        if (len > 0 &&
            H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->owned_buf) < 0) {
            rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: read failed", where);
            goto done;
        }
        s->contig = s->owned_buf;
        m->stored_bytes = (uint64_t)len;
        snprintf(m->codec, sizeof m->codec, "none");
    }
    (void)path;
done:
    if (fcpl >= 0) H5Pclose(fcpl);
    H5Pclose(dcpl);
    return rc;
}

int iv_h5matrix_check_pointers(const iv_h5matrix_t *m, const char *where, iv_err_t *err)
{
    const int64_t *mp = m->major_ptr, *vp = m->value_ptr;
    if (mp[0] != 0) return FAILF(IV_EBAD_FILE, "%s/major_ptr[0] is %" PRId64 ", not 0", where, mp[0]);
    for (int64_t i = 0; i < m->n_major; i++)
        if (mp[i + 1] < mp[i])
            return FAILF(IV_EBAD_FILE, "%s/major_ptr goes backwards at %" PRId64 " (%" PRId64
                         " after %" PRId64 ")", where, i + 1, mp[i + 1], mp[i]);
    if (mp[m->n_major] != m->n_unique)
        return FAILF(IV_EBAD_FILE, "%s/major_ptr ends at %" PRId64 " but values holds %" PRId64
                     " groups", where, mp[m->n_major], m->n_unique);
    if (vp[0] != 0) return FAILF(IV_EBAD_FILE, "%s/value_ptr[0] is %" PRId64 ", not 0", where, vp[0]);
    for (int64_t k = 0; k < m->n_unique; k++)
        if (vp[k + 1] < vp[k])
            return FAILF(IV_EBAD_FILE, "%s/value_ptr goes backwards at %" PRId64 " (%" PRId64
                         " after %" PRId64 ")", where, k + 1, vp[k + 1], vp[k]);
    if (m->n_minor > 0 && m->n_major > 0) {
        /* nnz of a slice cannot exceed the number of minor elements. */
        for (int64_t i = 0; i < m->n_major; i++) {
            int64_t nz = vp[mp[i + 1]] - vp[mp[i]];
            if (nz > m->n_minor)
                return FAILF(IV_EBAD_FILE, "%s: slice %" PRId64 " holds %" PRId64
                             " entries but there are only %" PRId64 " minor elements",
                             where, i, nz, m->n_minor);
        }
    } else if (m->nnz != 0) {
        return FAILF(IV_EBAD_FILE, "%s: %" PRId64 " stored entries in an empty shape", where, m->nnz);
    }
    if (m->nnz > (int64_t)m->stream.length)
        return FAILF(IV_EBAD_FILE, "%s: value_ptr promises %" PRId64 " varints but packed_indices "
                     "holds only %" PRIu64 " bytes", where, m->nnz, m->stream.length);
    return 0;
}

/* packed_indices' extent and chunk length when it is a chunked 1-D array
 * of bytes; 0 otherwise.  Quiet: the load reports what is wrong. */
static uint64_t peek_chunk_len(hid_t g, uint64_t *length)
{
    uint64_t cl = 0;
    if (H5Lexists(g, "packed_indices", H5P_DEFAULT) <= 0) return 0;
    hid_t d = H5Dopen2(g, "packed_indices", H5P_DEFAULT);
    if (d < 0) return 0;
    hid_t sp = H5Dget_space(d), t = H5Dget_type(d), dcpl = H5Dget_create_plist(d);
    hsize_t dims[1] = {0}, cdims[1] = {0};
    if (sp >= 0 && t >= 0 && dcpl >= 0 && H5Sget_simple_extent_ndims(sp) == 1 &&
        H5Tget_size(t) == 1 && H5Pget_layout(dcpl) == H5D_CHUNKED &&
        H5Pget_chunk(dcpl, 1, cdims) == 1 && cdims[0] > 0 && cdims[0] <= MAX_CHUNK_BYTES) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        *length = dims[0];
        cl = cdims[0];
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    H5Dclose(d);
    return cl;
}

int iv_h5matrix_load(const char *path, const char *group, iv_h5matrix_t *m, iv_err_t *err)
{
    return iv_h5matrix_load_notify(path, group, NULL, NULL, m, err);
}

int iv_h5matrix_load_notify(const char *path, const char *group, iv_h5matrix_stream_fn fn,
                            void *ctx, iv_h5matrix_t *m, iv_err_t *err)
{
    memset(m, 0, sizeof *m);
    if (!group || !*group) group = "X";
    char where[1024];
    snprintf(where, sizeof where, "%s:/%s", path, group);
    int rc = 0;
    hid_t file = -1, g = -1, d = -1;

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();

    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        if (access(path, R_OK) != 0)
            return FAILF(IV_EIO, "%s: cannot open: %s", path, strerror(errno));
        return FAILF(IV_EBAD_FILE, "%s: not an HDF5 file", path);
    }
    if ((file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
        return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", path);
    if ((rc = map_file(path, m, err)) < 0) goto fail;

    if (strchr(group, '/') || H5Lexists(file, group, H5P_DEFAULT) <= 0) {
        rc = FAILF(IV_EBAD_FILE, "%s: no top-level group '%s'", path, group);
        goto fail;
    }
    H5O_info_t oi;
    if (H5Oget_info_by_name(file, group, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_GROUP) {
        rc = FAILF(IV_EBAD_FILE, "%s: '%s' is not a group", path, group);
        goto fail;
    }
    if ((g = H5Gopen2(file, group, H5P_DEFAULT)) < 0) {
        rc = FAILF(IV_EBAD_FILE, "%s: cannot open group", where);
        goto fail;
    }

    char enc[64], ver[64], idt[64];
    if (read_str_attr(g, "encoding-type", enc, sizeof enc) != 0) {
        rc = FAILF(IV_EBAD_FILE, "%s: attribute 'encoding-type' missing or not a string", where);
        goto fail;
    }
    if (strcmp(enc, "ivcsr") == 0) m->orient = IV_IVCSR;
    else if (strcmp(enc, "ivcsc") == 0) m->orient = IV_IVCSC;
    else {
        rc = FAILF(IV_EBAD_FILE, "%s: encoding-type is '%s', expected 'ivcsr' or 'ivcsc'", where, enc);
        goto fail;
    }
    if (read_str_attr(g, "encoding-version", ver, sizeof ver) != 0) {
        rc = FAILF(IV_EBAD_FILE, "%s: attribute 'encoding-version' missing or not a string", where);
        goto fail;
    }
    if (strcmp(ver, "0.1.0") != 0) {
        rc = FAILF(IV_EUNSUPPORTED, "%s: encoding-version '%s' is not supported (expected 0.1.0)",
                   where, ver);
        goto fail;
    }
    int64_t shape[2];
    if (read_i64_attr(g, "shape", shape, 2) != 0 || shape[0] < 0 || shape[1] < 0) {
        rc = FAILF(IV_EBAD_FILE, "%s: attribute 'shape' missing or not two non-negative integers",
                   where);
        goto fail;
    }
    if (shape[0] > INT32_MAX || shape[1] > INT32_MAX) {
        /* Output indices are int32 (or int64); keep shapes sane for both. */
        if (shape[0] > ((int64_t)1 << 40) || shape[1] > ((int64_t)1 << 40)) {
            rc = FAILF(IV_EBAD_FILE, "%s: shape (%" PRId64 ", %" PRId64 ") is implausibly large",
                       where, shape[0], shape[1]);
            goto fail;
        }
    }
    m->n_rows = shape[0];
    m->n_cols = shape[1];
    m->n_major = m->orient == IV_IVCSR ? shape[0] : shape[1];
    m->n_minor = m->orient == IV_IVCSR ? shape[1] : shape[0];
    m->indices_dtype = IV_DT_INT32;
    if (read_str_attr(g, "indices_dtype", idt, sizeof idt) == 0) {
        if (iv_dtype_parse(idt, &m->indices_dtype) != 0 || m->indices_dtype >= IV_DT_FLOAT32) {
            rc = FAILF(IV_EBAD_FILE, "%s: indices_dtype '%s' is not an integer dtype", where, idt);
            goto fail;
        }
    } else {
        rc = FAILF(IV_EBAD_FILE, "%s: attribute 'indices_dtype' missing or not a string", where);
        goto fail;
    }

    if (fn) {
        uint64_t length = 0, cl = peek_chunk_len(g, &length);
        if (cl) fn(ctx, length, cl);
    }

    int64_t n_mp, n_vp, n_val, n_packed;
    if ((rc = load_i64(g, where, "major_ptr", &m->major_ptr, &n_mp, err)) < 0) goto fail;
    if (n_mp != m->n_major + 1) {
        rc = FAILF(IV_EBAD_FILE, "%s/major_ptr has %" PRId64 " entries, expected n_major + 1 = %" PRId64,
                   where, n_mp, m->n_major + 1);
        goto fail;
    }
    if ((rc = load_i64(g, where, "value_ptr", &m->value_ptr, &n_vp, err)) < 0) goto fail;
    if (n_vp < 1) {
        rc = FAILF(IV_EBAD_FILE, "%s/value_ptr is empty (needs n_unique + 1 entries)", where);
        goto fail;
    }
    m->n_unique = n_vp - 1;
    m->nnz = m->value_ptr[n_vp - 1];

    if ((rc = open_1d(g, where, "values", &d, &n_val, &m->value_dtype, err)) < 0) goto fail;
    if (n_val != m->n_unique) {
        rc = FAILF(IV_EBAD_FILE, "%s/values has %" PRId64 " entries but value_ptr has %" PRId64
                   " (expected values + 1)", where, n_val, n_vp);
        goto fail;
    }
    size_t esz = iv_dtype_size(m->value_dtype);
    m->values = malloc((size_t)(n_val ? n_val : 1) * esz);
    if (!m->values) {
        rc = FAILF(IV_ENOMEM, "%s/values: out of memory", where);
        goto fail;
    }
    if (n_val > 0 &&
        H5Dread(d, native_of(m->value_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, m->values) < 0) {
        rc = FAILF(IV_EBAD_FILE, "%s/values: read failed (corrupt or unsupported compression)", where);
        goto fail;
    }
    H5Dclose(d);
    d = -1;

    iv_dtype_t pdt;
    if ((rc = open_1d(g, where, "packed_indices", &d, &n_packed, &pdt, err)) < 0) goto fail;
    if (pdt != IV_DT_UINT8 && pdt != IV_DT_INT8) {
        rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: element type %s, expected uint8", where,
                   iv_dtype_name(pdt));
        goto fail;
    }
    if ((rc = locate_packed(file, d, path, where, n_packed, m, err)) < 0) goto fail;
    if ((rc = iv_h5matrix_check_pointers(m, where, err)) < 0) goto fail;

    H5Dclose(d);
    H5Gclose(g);
    H5Fclose(file);
    return 0;

fail:
    if (d >= 0) H5Dclose(d);
    if (g >= 0) H5Gclose(g);
    if (file >= 0) H5Fclose(file);
    iv_h5matrix_free(m);
    return rc < 0 ? rc : IV_EBAD_FILE;
}

void iv_h5matrix_free(iv_h5matrix_t *m)
{
    free(m->major_ptr);
    free(m->value_ptr);
    free(m->values);
    free(m->stream.chunk_addr);
    free(m->stream.chunk_size);
    free(m->stream.chunk_mask);
    free(m->stream.owned_buf);
    if (m->map) munmap(m->map, m->map_len);
    memset(m, 0, sizeof *m);
}
