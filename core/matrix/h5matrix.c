/*
 * HDF5 loading and validation of the IVCSR/IVCSC group (see h5matrix.h).
 *
 * HDF5's automatic error printing is silenced for the calls made here: a
 * bad file must produce one clear message, not an HDF5 stack dump.  Every
 * HDF5 handle is closed on every path through the labelled cleanup at the
 * end of each function.
 */
#include "h5matrix.h"

#include "h5util.h"

#include "filecheck.h"
#include "h5chunks.h"
#include "h5iso.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

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
        if (iv_h5_dtype_of(t, dt) != 0)
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

/* Reads dataset d's len pointers into out: uint64 values past INT64_MAX
 * would be clipped by conversion, so uint64 is read raw and such values
 * refused. */
static int read_pointers(hid_t d, iv_dtype_t dt, const char *where, const char *name, int64_t *out,
                         int64_t len, iv_err_t *err)
{
    if (dt != IV_DT_UINT64) {
        if (H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
            return FAILF(IV_EBAD_FILE, "%s/%s: read failed (corrupt or unsupported compression)",
                         where, name);
        return 0;
    }
    if (H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
        return FAILF(IV_EBAD_FILE, "%s/%s: read failed", where, name);
    for (int64_t i = 0; i < len; i++)
        if (out[i] < 0) return FAILF(IV_EBAD_FILE, "%s/%s[%" PRId64 "] exceeds int64", where, name, i);
    return 0;
}

/* Opens a 1-D pointer array (open_1d), refusing a float one: 0, or an
 * error with the dataset closed. */
static int open_ptr_1d(hid_t g, const char *where, const char *name, hid_t *d, int64_t *len,
                       iv_dtype_t *dt, iv_err_t *err)
{
    IV_TRY(open_1d(g, where, name, d, len, dt, err));
    if (*dt != IV_DT_FLOAT32 && *dt != IV_DT_FLOAT64) return 0;
    H5Dclose(*d);
    return FAILF(IV_EBAD_FILE, "%s/%s: pointer array must be integer, found %s", where, name,
                 iv_dtype_name(*dt));
}

/* Reads a whole 1-D integer dataset as int64 (HDF5 converts). */
static int load_i64(hid_t g, const char *where, const char *name, int64_t **out, int64_t *len,
                    iv_err_t *err)
{
    hid_t d;
    iv_dtype_t dt;
    *out = NULL;
    IV_TRY(open_ptr_1d(g, where, name, &d, len, &dt, err));
    int rc = 0;
    if (!(*out = malloc((size_t)(*len ? *len : 1) * sizeof(int64_t))))
        rc = FAILF(IV_ENOMEM, "%s/%s: out of memory for %" PRId64 " pointers", where, name, *len);
    else if (*len > 0)
        rc = read_pointers(d, dt, where, name, *out, *len, err);
    H5Dclose(d);
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* Opens the file for the stream's reads; *st receives its identity. */
static int open_file(const char *path, iv_h5matrix_t *m, struct stat *id, iv_err_t *err)
{
    IV_TRY(iv_file_open(path, &m->stream.file, err));
    const iv_file_id_t *f = iv_file_loaded_id(m->stream.file);
    memset(id, 0, sizeof *id);
    id->st_size = (off_t)f->size;
    id->st_dev = (dev_t)f->dev;
    id->st_ino = (ino_t)f->ino;
    id->st_mtim.tv_sec = (time_t)f->mtime_s;
    id->st_mtim.tv_nsec = (long)f->mtime_ns;
    m->file_len = f->size;
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
        case IV_FILTER_ZSTD: case IV_FILTER_BLOSC2: case IV_FILTER_LZF:
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

/* The most bytes a stored chunk may hold: no supported filter doubles a
 * chunk, and the stream's read buffers are sized by the largest one. */
static uint64_t max_stored_for(uint64_t chunk_len) { return 2 * chunk_len + 65536; }

/* Virtual chunks a contiguous packed_indices is read in (stream.h). */
#define CONTIG_CHUNK IV_STREAM_CONTIG_CHUNK

/* The chunk table of a contiguous range of `len` bytes at file offset a. */
static int contig_table(iv_stream_desc_t *s, uint64_t a, uint64_t len, const char *where,
                        iv_err_t *err)
{
    if (iv_stream_desc_contig(s, a, len) < 0)
        return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory for the chunk table", where);
    return 0;
}

/* The checksums and read-buffer size of a file-backed chunk table, once
 * its sizes are checked. */
static int table_finish(iv_stream_desc_t *s, const char *where, iv_err_t *err)
{
    s->max_stored = 0;
    for (uint64_t c = 0; c < s->n_chunks; c++) {
        if (s->chunk_addr[c] == UINT64_MAX) continue;
        if (s->chunk_size[c] > max_stored_for(s->chunk_len))
            return FAILF(IV_EBAD_FILE, "%s/packed_indices: chunk %" PRIu64 " stores %" PRIu64
                         " bytes, more than any supported filter makes of a %" PRIu64
                         "-byte chunk", where, c, s->chunk_size[c], s->chunk_len);
        if (s->chunk_size[c] > s->max_stored) s->max_stored = s->chunk_size[c];
    }
    s->chunk_sum = calloc((size_t)(s->n_chunks ? s->n_chunks : 1), sizeof *s->chunk_sum);
    if (!s->chunk_sum)
        return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory for the chunk checksums", where);
    return 0;
}

/* The chunk table through HDF5's per-chunk lookup, for layouts h5chunks.c
 * does not read (it walks the index from its start each time). */
static int chunk_table_by_lookup(hid_t d, iv_stream_desc_t *s, uint64_t userblock,
                                 const char *where, iv_err_t *err)
{
    for (uint64_t c = 0; c < s->n_chunks; c++) {
        hsize_t off[1] = {c * s->chunk_len}, size = 0;
        haddr_t addr = HADDR_UNDEF;
        unsigned mask = 0;
        if (H5Dget_chunk_info_by_coord(d, off, &mask, &addr, &size) < 0)
            return FAILF(IV_EBAD_FILE, "%s/packed_indices: chunk %" PRIu64 " info unreadable",
                         where, c);
        int absent = addr == HADDR_UNDEF || size == 0;
        s->chunk_addr[c] = absent ? UINT64_MAX : (uint64_t)addr + userblock;
        s->chunk_size[c] = absent ? 0 : size;
        s->chunk_mask[c] = absent ? 0 : mask;
    }
    return 0;
}

/* Every stored chunk inside the file; their bytes add to stored_bytes. */
static int check_chunk_bounds(iv_h5matrix_t *m, const char *where, iv_err_t *err)
{
    const iv_stream_desc_t *s = &m->stream;
    for (uint64_t c = 0; c < s->n_chunks; c++) {
        uint64_t a = s->chunk_addr[c], size = s->chunk_size[c];
        if (a == UINT64_MAX) continue;
        if (a > m->file_len || size > m->file_len - a)
            return FAILF(IV_EBAD_FILE,
                         "%s/packed_indices: chunk %" PRIu64 " (offset %" PRIu64 ", %llu bytes) "
                         "lies past the end of the file (%" PRIu64 " bytes)",
                         where, c, a, (unsigned long long)size, m->file_len);
        m->stored_bytes += size;
    }
    return 0;
}

/* The chunk shape and filter pipeline of a chunked packed_indices, and
 * room for its chunk table. */
static int chunk_layout(hid_t dcpl, const char *where, int64_t len, iv_h5matrix_t *m, iv_err_t *err)
{
    iv_stream_desc_t *s = &m->stream;
    hsize_t cdims[1];
    if (H5Pget_chunk(dcpl, 1, cdims) != 1 || cdims[0] == 0)
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad chunk shape", where);
    if (cdims[0] > MAX_CHUNK_BYTES)
        return FAILF(IV_EUNSUPPORTED, "%s/packed_indices: chunks of %llu bytes (at most 1 GiB)",
                     where, (unsigned long long)cdims[0]);
    IV_TRY(read_pipeline(dcpl, where, &s->pipe, err));
    iv_pipeline_describe(&s->pipe, m->codec, sizeof m->codec);
    s->chunked = 1;
    s->chunk_len = cdims[0];
    s->n_chunks = ((uint64_t)len + cdims[0] - 1) / cdims[0];
    size_t nc = (size_t)(s->n_chunks ? s->n_chunks : 1);
    s->chunk_addr = malloc(nc * sizeof *s->chunk_addr);
    s->chunk_size = malloc(nc * sizeof *s->chunk_size);
    s->chunk_mask = malloc(nc * sizeof *s->chunk_mask);
    if (!s->chunk_addr || !s->chunk_size || !s->chunk_mask)
        return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory for the chunk table", where);
    return 0;
}

/* A chunked packed_indices: its layout, then its chunk table, read in one
 * walk of the chunk index where h5chunks.c can, then checked. */
static int locate_chunked(hid_t d, hid_t dcpl, uint64_t userblock, const char *where, int64_t len,
                          iv_h5matrix_t *m, iv_err_t *err)
{
    iv_stream_desc_t *s = &m->stream;
    IV_TRY(chunk_layout(dcpl, where, len, m, err));
    char pw[1200];
    snprintf(pw, sizeof pw, "%s/packed_indices", where);
    int walked = iv_h5_chunk_table(d, s->file, m->file_len, userblock, s->chunk_len, 1,
                                   s->n_chunks, s->chunk_addr, s->chunk_size, s->chunk_mask,
                                   pw, err);
    if (walked < 0) return walked;
    snprintf(m->chunk_index, sizeof m->chunk_index, "%s",
             walked ? "B-tree, read in one walk" : "HDF5 lookups, one a chunk");
    if (!walked) IV_TRY(chunk_table_by_lookup(d, s, userblock, where, err));
    IV_TRY(check_chunk_bounds(m, where, err));
    return table_finish(s, where, err);
}

/* A contiguous packed_indices at absolute file offset a (the user block
 * included), read in place as virtual chunks. */
static int locate_contig(haddr_t a, const char *where, int64_t len, iv_h5matrix_t *m,
                         iv_err_t *err)
{
    iv_stream_desc_t *s = &m->stream;
    if (a > m->file_len || (uint64_t)len > m->file_len - a)
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: contiguous data past the end of the file",
                     where);
    IV_TRY(contig_table(s, a, (uint64_t)len, where, err));
    IV_TRY(table_finish(s, where, err));
    m->stored_bytes = (uint64_t)len;
    snprintf(m->codec, sizeof m->codec, "none");
    return 0;
}

/* Compact, external or never written: read it through HDF5 once. */
static int read_packed_whole(hid_t d, const char *where, int64_t len, iv_h5matrix_t *m,
                             iv_err_t *err)
{
    iv_stream_desc_t *s = &m->stream;
    s->owned_buf = malloc((size_t)(len ? len : 1));
    if (!s->owned_buf) return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory", where);
    if (len > 0 && H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->owned_buf) < 0)
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: read failed", where);
    s->contig = s->owned_buf;
    m->stored_bytes = (uint64_t)len;
    snprintf(m->codec, sizeof m->codec, "none");
    return 0;
}

/* Describes where packed_indices' bytes are. */
static int locate_packed(hid_t file, hid_t d, const char *where, int64_t len, iv_h5matrix_t *m,
                         iv_err_t *err)
{
    int rc;
    hid_t dcpl = H5Dget_create_plist(d);
    hid_t fcpl = H5Fget_create_plist(file);
    hsize_t userblock = 0;
    if (fcpl >= 0) H5Pget_userblock(fcpl, &userblock);
    m->stream.length = (uint64_t)len;
    H5D_layout_t layout = H5Pget_layout(dcpl);
    if (layout == H5D_CHUNKED)
        rc = locate_chunked(d, dcpl, (uint64_t)userblock, where, len, m, err);
    else if (layout == H5D_CONTIGUOUS && len > 0 && H5Dget_offset(d) != HADDR_UNDEF)
        rc = locate_contig(H5Dget_offset(d), where, len, m, err);
    else
        rc = read_packed_whole(d, where, len, m, err);
    if (fcpl >= 0) H5Pclose(fcpl);
    H5Pclose(dcpl);
    return rc;
}

/* A pointer array p[0..n] starts at 0 and never goes backwards. */
static int check_rising(const int64_t *p, int64_t n, const char *where, const char *name,
                        iv_err_t *err)
{
    if (p[0] != 0) return FAILF(IV_EBAD_FILE, "%s/%s[0] is %" PRId64 ", not 0", where, name, p[0]);
    for (int64_t i = 0; i < n; i++)
        if (p[i + 1] < p[i])
            return FAILF(IV_EBAD_FILE, "%s/%s goes backwards at %" PRId64 " (%" PRId64
                         " after %" PRId64 ")", where, name, i + 1, p[i + 1], p[i]);
    return 0;
}

/* No slice holds more entries than there are minor elements; an empty
 * shape holds none. */
static int check_slice_sizes(const iv_h5matrix_t *m, const char *where, iv_err_t *err)
{
    const int64_t *mp = m->major_ptr, *vp = m->value_ptr;
    if (m->n_minor <= 0 || m->n_major <= 0) {
        if (m->nnz != 0)
            return FAILF(IV_EBAD_FILE, "%s: %" PRId64 " stored entries in an empty shape", where, m->nnz);
        return 0;
    }
    for (int64_t i = 0; i < m->n_major; i++) {
        int64_t nz = vp[mp[i + 1]] - vp[mp[i]];
        if (nz > m->n_minor)
            return FAILF(IV_EBAD_FILE, "%s: slice %" PRId64 " holds %" PRId64
                         " entries but there are only %" PRId64 " minor elements",
                         where, i, nz, m->n_minor);
    }
    return 0;
}

int iv_h5matrix_check_pointers(const iv_h5matrix_t *m, const char *where, iv_err_t *err)
{
    IV_TRY(check_rising(m->major_ptr, m->n_major, where, "major_ptr", err));
    if (m->major_ptr[m->n_major] != m->n_unique)
        return FAILF(IV_EBAD_FILE, "%s/major_ptr ends at %" PRId64 " but values holds %" PRId64
                     " groups", where, m->major_ptr[m->n_major], m->n_unique);
    IV_TRY(check_rising(m->value_ptr, m->n_unique, where, "value_ptr", err));
    IV_TRY(check_slice_sizes(m, where, err));
    if (m->nnz > (int64_t)m->stream.length)
        return FAILF(IV_EBAD_FILE, "%s: value_ptr promises %" PRId64 " varints but packed_indices "
                     "holds only %" PRIu64 " bytes", where, m->nnz, m->stream.length);
    return 0;
}

/* Whether a dataset of space sp, type t and creation list dcpl is a
 * 1-D byte array in chunks of a length taken (into cdims). */
static int chunked_bytes(hid_t sp, hid_t t, hid_t dcpl, hsize_t cdims[1])
{
    return H5Sget_simple_extent_ndims(sp) == 1 && H5Tget_size(t) == 1 &&
           H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 1, cdims) == 1 &&
           cdims[0] > 0 && cdims[0] <= MAX_CHUNK_BYTES;
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
    if (sp >= 0 && t >= 0 && dcpl >= 0 && chunked_bytes(sp, t, dcpl, cdims)) {
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

/* Tells the parent which part of the group the child reads now. */
static void stage(iv_h5iso_out_t *o, const char *group, const char *name)
{
    if (!o) return;  /* an in-process load (iv_h5matrix_load_inproc) */
    char buf[IV_H5ISO_STAGE_MAX];
    snprintf(buf, sizeof buf, "%s%s%s", group, name ? "/" : "", name ? name : "");
    iv_h5iso_stage(o, buf);
}

/* A path component other than "", "." and "..". */
static int plain_component(const char *c, size_t len)
{
    return !(len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'));
}

/*
 * Whether group, a top-level name or a path such as "layers/counts",
 * names an object.  H5Lexists needs every link before the last to exist,
 * so each prefix is checked in turn; empty components, "." and ".." and
 * a leading '/' are refused (the path is relative to the root, and comes
 * from a configuration or a file's layer names).
 */
static int group_path_exists(hid_t file, const char *group)
{
    char buf[1024];
    size_t n = strlen(group);
    if (n == 0 || n >= sizeof buf || group[0] == '/' || group[n - 1] == '/') return 0;
    memcpy(buf, group, n + 1);
    for (size_t i = 0; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        size_t start = i;
        while (start > 0 && buf[start - 1] != '/') start--;
        if (!plain_component(buf + start, i - start)) return 0;
        char save = buf[i];
        buf[i] = '\0';
        htri_t e = H5Lexists(file, buf, H5P_DEFAULT);
        buf[i] = save;
        if (e <= 0) return 0;
    }
    return 1;
}

/* Opens path read-only as an HDF5 file, or says why it cannot. */
static int open_hdf5(const char *path, hid_t *file, iv_err_t *err)
{
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        if (access(path, R_OK) != 0)
            return FAILF(IV_EIO, "%s: cannot open: %s", path, strerror(errno));
        return FAILF(IV_EBAD_FILE, "%s: not an HDF5 file", path);
    }
    if ((*file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
        return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", path);
    return 0;
}

/* Opens the matrix's group, which must exist and be a group. */
static int open_group(hid_t file, const char *path, const char *group, const char *where, hid_t *g,
                      iv_err_t *err)
{
    if (!group_path_exists(file, group)) return FAILF(IV_EBAD_FILE, "%s: no group '%s'", path, group);
    H5O_info_t oi;
    if (H5Oget_info_by_name(file, group, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_GROUP)
        return FAILF(IV_EBAD_FILE, "%s: '%s' is not a group", path, group);
    if ((*g = H5Gopen2(file, group, H5P_DEFAULT)) < 0)
        return FAILF(IV_EBAD_FILE, "%s: cannot open group", where);
    return 0;
}

/* encoding-type (the orientation) and encoding-version. */
static int read_encoding(hid_t g, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    char enc[64], ver[64];
    if (iv_h5_read_str_attr(g, "encoding-type", enc, sizeof enc) != 0)
        return FAILF(IV_EBAD_FILE, "%s: attribute 'encoding-type' missing or not a string", where);
    if (strcmp(enc, "ivcsr") == 0) m->orient = IV_IVCSR;
    else if (strcmp(enc, "ivcsc") == 0) m->orient = IV_IVCSC;
    else return FAILF(IV_EBAD_FILE, "%s: encoding-type is '%s', expected 'ivcsr' or 'ivcsc'", where, enc);
    if (iv_h5_read_str_attr(g, "encoding-version", ver, sizeof ver) != 0)
        return FAILF(IV_EBAD_FILE, "%s: attribute 'encoding-version' missing or not a string", where);
    if (strcmp(ver, "0.1.0") != 0)
        return FAILF(IV_EUNSUPPORTED, "%s: encoding-version '%s' is not supported (expected 0.1.0)",
                     where, ver);
    return 0;
}

/* The shape attribute, and the major and minor lengths it gives. */
static int read_shape(hid_t g, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    int64_t shape[2];
    if (read_i64_attr(g, "shape", shape, 2) != 0 || shape[0] < 0 || shape[1] < 0)
        return FAILF(IV_EBAD_FILE, "%s: attribute 'shape' missing or not two non-negative integers",
                     where);
    /* Output indices are int32 (or int64); keep shapes sane for both. */
    if (shape[0] > ((int64_t)1 << 40) || shape[1] > ((int64_t)1 << 40))
        return FAILF(IV_EBAD_FILE, "%s: shape (%" PRId64 ", %" PRId64 ") is implausibly large",
                     where, shape[0], shape[1]);
    m->n_rows = shape[0];
    m->n_cols = shape[1];
    m->n_major = m->orient == IV_IVCSR ? shape[0] : shape[1];
    m->n_minor = m->orient == IV_IVCSR ? shape[1] : shape[0];
    return 0;
}

static int read_indices_dtype(hid_t g, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    char idt[64];
    m->indices_dtype = IV_DT_INT32;
    if (iv_h5_read_str_attr(g, "indices_dtype", idt, sizeof idt) != 0)
        return FAILF(IV_EBAD_FILE, "%s: attribute 'indices_dtype' missing or not a string", where);
    if (iv_dtype_parse(idt, &m->indices_dtype) != 0 || m->indices_dtype >= IV_DT_FLOAT32)
        return FAILF(IV_EBAD_FILE, "%s: indices_dtype '%s' is not an integer dtype", where, idt);
    return 0;
}

/* The group's attributes: encoding, shape, indices_dtype. */
static int read_attrs(hid_t g, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    IV_TRY(read_encoding(g, where, m, err));
    IV_TRY(read_shape(g, where, m, err));
    return read_indices_dtype(g, where, m, err);
}

/* Tells fn packed_indices' extent and chunk length, when it is chunked,
 * before the long reads. */
static void announce_stream(hid_t g, iv_h5matrix_stream_fn fn, void *ctx, iv_h5iso_out_t *o,
                            const char *group)
{
    stage(o, group, "packed_indices");
    uint64_t length = 0, cl = peek_chunk_len(g, &length);
    if (cl) fn(ctx, length, cl);
}

/* The length of an integer 1-D dataset and, when last is not NULL, its
 * last element (len > 0), without reading the rest. */
static int extent_i64(hid_t g, const char *where, const char *name, int64_t *len, int64_t *last,
                      iv_err_t *err)
{
    hid_t d;
    iv_dtype_t dt;
    IV_TRY(open_ptr_1d(g, where, name, &d, len, &dt, err));
    int rc = 0;
    if (last && *len > 0) {
        hsize_t at[1] = {(hsize_t)*len - 1}, one[1] = {1};
        hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, one, NULL);
        if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, NULL, one, NULL) < 0 ||
            H5Dread(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, last) < 0 || *last < 0)
            rc = FAILF(IV_EBAD_FILE, "%s/%s: read failed", where, name);
        H5Sclose(ms);
        H5Sclose(fs);
    }
    H5Dclose(d);
    return rc;
}

/* A load without the arrays (iv_h5matrix_load_bare): their lengths and
 * nnz (value_ptr's last element) only. */
static int pointer_extents(hid_t g, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    int64_t n_mp, n_vp;
    IV_TRY(extent_i64(g, where, "major_ptr", &n_mp, NULL, err));
    if (n_mp != m->n_major + 1)
        return FAILF(IV_EBAD_FILE, "%s/major_ptr has %" PRId64 " entries, expected n_major + 1 = %" PRId64,
                     where, n_mp, m->n_major + 1);
    IV_TRY(extent_i64(g, where, "value_ptr", &n_vp, &m->nnz, err));
    if (n_vp < 1) return FAILF(IV_EBAD_FILE, "%s/value_ptr is empty (needs n_unique + 1 entries)", where);
    m->n_unique = n_vp - 1;
    return 0;
}

/* major_ptr and value_ptr, with the lengths the shape asks for. */
static int load_pointers(hid_t g, const char *where, iv_h5iso_out_t *o, const char *group,
                         int bare, iv_h5matrix_t *m, iv_err_t *err)
{
    int64_t n_mp, n_vp;
    if (bare) return pointer_extents(g, where, m, err);
    stage(o, group, "major_ptr");
    IV_TRY(load_i64(g, where, "major_ptr", &m->major_ptr, &n_mp, err));
    if (n_mp != m->n_major + 1)
        return FAILF(IV_EBAD_FILE, "%s/major_ptr has %" PRId64 " entries, expected n_major + 1 = %" PRId64,
                     where, n_mp, m->n_major + 1);
    stage(o, group, "value_ptr");
    IV_TRY(load_i64(g, where, "value_ptr", &m->value_ptr, &n_vp, err));
    if (n_vp < 1) return FAILF(IV_EBAD_FILE, "%s/value_ptr is empty (needs n_unique + 1 entries)", where);
    m->n_unique = n_vp - 1;
    m->nnz = m->value_ptr[n_vp - 1];
    return 0;
}

/* The values array, one per value group. */
static int load_values(hid_t g, const char *where, iv_h5iso_out_t *o, const char *group,
                       int bare, iv_h5matrix_t *m, iv_err_t *err)
{
    hid_t d;
    int64_t n_val;
    int rc = 0;
    stage(o, group, "values");
    IV_TRY(open_1d(g, where, "values", &d, &n_val, &m->value_dtype, err));
    size_t esz = iv_dtype_size(m->value_dtype);
    if (n_val != m->n_unique)
        rc = FAILF(IV_EBAD_FILE, "%s/values has %" PRId64 " entries but value_ptr has %" PRId64
                   " (expected values + 1)", where, n_val, m->n_unique + 1);
    else if (bare)
        rc = 0;
    else if (!(m->values = malloc((size_t)(n_val ? n_val : 1) * esz)))
        rc = FAILF(IV_ENOMEM, "%s/values: out of memory", where);
    else if (n_val > 0 &&
             H5Dread(d, iv_h5_native(m->value_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, m->values) < 0)
        rc = FAILF(IV_EBAD_FILE, "%s/values: read failed (corrupt or unsupported compression)", where);
    H5Dclose(d);
    return rc;
}

/* packed_indices: a byte array, and where its bytes are. */
static int load_packed(hid_t file, hid_t g, const char *where, iv_h5iso_out_t *o,
                       const char *group, iv_h5matrix_t *m, iv_err_t *err)
{
    hid_t d;
    int64_t n_packed;
    iv_dtype_t pdt;
    stage(o, group, "packed_indices");
    IV_TRY(open_1d(g, where, "packed_indices", &d, &n_packed, &pdt, err));
    int rc;
    if (pdt != IV_DT_UINT8 && pdt != IV_DT_INT8)
        rc = FAILF(IV_EBAD_FILE, "%s/packed_indices: element type %s, expected uint8", where,
                   iv_dtype_name(pdt));
    else
        rc = locate_packed(file, d, where, n_packed, m, err);
    H5Dclose(d);
    return rc;
}

/*
 * The HDF5 load itself; runs in the reader process (see h5iso.h).  In
 * order: the file, every dataset's filters, the group and its attributes,
 * the pointer arrays, the values, where packed_indices' bytes are, and
 * the pointers checked against each other.  A bare load (the caller has
 * the arrays) reads the arrays' lengths only, and checks no pointers.
 */
static int load_here(const char *path, const char *group, iv_h5matrix_stream_fn fn, void *ctx,
                     int bare, iv_h5iso_out_t *o, iv_h5matrix_t *m, struct stat *id, iv_err_t *err)
{
    memset(m, 0, sizeof *m);
    if (!group || !*group) group = "X";
    char where[1024];
    snprintf(where, sizeof where, "%s:/%s", path, group);
    int rc = 0;
    hid_t file = -1, g = -1;

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    IV_TRY(open_hdf5(path, &file, err));
    if ((rc = open_file(path, m, id, err)) < 0) goto fail;
    /* Every dataset's filters, before any read: a file the server could
     * only partly decode is left out whole, naming the element. */
    stage(o, "the filter pipelines", NULL);
    if ((rc = iv_h5_check_filters(file, path, err)) < 0) goto fail;
    stage(o, group, NULL);
    if ((rc = open_group(file, path, group, where, &g, err)) < 0) goto fail;
    if ((rc = read_attrs(g, where, m, err)) < 0) goto fail;
    if (fn) announce_stream(g, fn, ctx, o, group);
    if ((rc = load_pointers(g, where, o, group, bare, m, err)) < 0) goto fail;
    if ((rc = load_values(g, where, o, group, bare, m, err)) < 0) goto fail;
    if ((rc = load_packed(file, g, where, o, group, m, err)) < 0) goto fail;
    if (!bare && (rc = iv_h5matrix_check_pointers(m, where, err)) < 0) goto fail;
    H5Gclose(g);
    H5Fclose(file);
    return 0;

fail:
    if (g >= 0) H5Gclose(g);
    if (file >= 0) H5Fclose(file);
    iv_h5matrix_free(m);
    return rc < 0 ? rc : IV_EBAD_FILE;
}

/* ------------------------------------------- the load, across the process line */

/*
 * The child puts, in this order: a magic word; the shape, counts, dtypes
 * and stored size (u64 each); the codec text (64 bytes); how the chunk
 * table was read (32 bytes of text); the identity of
 * the file it read (size, device, inode, modification time); the pointer
 * and value arrays as blobs (none in a bare load); packed_indices' extent, layout (0: its bytes
 * follow, compact layout; 1: stored chunks; 2: a contiguous range as
 * virtual chunks), pipeline and either its bytes or its chunk table.  The
 * parent opens the file itself, refuses a file that is not the one the
 * child read, and checks every count, offset and pointer again: what
 * crosses the line is bytes, to be trusted no more than the file.
 */
#define MAT_MAGIC 0x3154414d35485649ull   /* "IVH5MAT1" */
enum { CONTIG_NONE = 0, CONTIG_OWNED = 2 };

struct mat_ctx {
    const char *path, *group;
    int notify;
    int bare;                 /* no arrays cross (iv_h5matrix_load_bare) */
};

/* The child's end of the prefault notice: extent and chunk length. */
static void child_peek(void *ctx, uint64_t length, uint64_t chunk_len)
{
    uint64_t v[2] = {length, chunk_len};
    iv_h5iso_note(ctx, v, sizeof v);
}

static int put_matrix(iv_h5iso_out_t *o, const iv_h5matrix_t *m, int bare, const struct stat *id)
{
    const iv_stream_desc_t *s = &m->stream;
    uint64_t head[] = {MAT_MAGIC, (uint64_t)m->orient, (uint64_t)m->n_rows, (uint64_t)m->n_cols,
                       (uint64_t)m->n_major, (uint64_t)m->n_minor, (uint64_t)m->nnz,
                       (uint64_t)m->n_unique, (uint64_t)m->value_dtype,
                       (uint64_t)m->indices_dtype, m->stored_bytes,
                       (uint64_t)id->st_size, (uint64_t)id->st_dev, (uint64_t)id->st_ino,
                       (uint64_t)id->st_mtim.tv_sec, (uint64_t)id->st_mtim.tv_nsec};
    IV_TRY(iv_h5iso_put(o, head, sizeof head));
    IV_TRY(iv_h5iso_put(o, m->codec, sizeof m->codec));
    IV_TRY(iv_h5iso_put(o, m->chunk_index, sizeof m->chunk_index));
    if (!bare) {
        IV_TRY(iv_h5iso_put_blob(o, m->major_ptr, (uint64_t)(m->n_major + 1) * 8));
        IV_TRY(iv_h5iso_put_blob(o, m->value_ptr, (uint64_t)(m->n_unique + 1) * 8));
        IV_TRY(iv_h5iso_put_blob(o, m->values,
                                 (uint64_t)m->n_unique * iv_dtype_size(m->value_dtype)));
    }
    uint64_t sh[] = {s->length, s->chunked ? (s->file_contig ? 2u : 1u) : 0u, s->chunk_len,
                     s->n_chunks};
    IV_TRY(iv_h5iso_put(o, sh, sizeof sh));
    IV_TRY(iv_h5iso_put(o, &s->pipe, sizeof s->pipe));
    if (s->chunked) {
        IV_TRY(iv_h5iso_put_blob(o, s->chunk_addr, s->n_chunks * 8));
        IV_TRY(iv_h5iso_put_blob(o, s->chunk_size, s->n_chunks * 8));
        return iv_h5iso_put_blob(o, s->chunk_mask, s->n_chunks * 4);
    }
    if (s->owned_buf) {
        IV_TRY(iv_h5iso_put_u64(o, CONTIG_OWNED));
        return iv_h5iso_put_blob(o, s->owned_buf, s->length);
    }
    return iv_h5iso_put_u64(o, CONTIG_NONE);
}

static int matrix_child(void *vctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    const struct mat_ctx *c = vctx;
    iv_h5matrix_t m;
    struct stat id;
    IV_TRY(load_here(c->path, c->group, c->notify ? child_peek : NULL, o, c->bare, o, &m, &id, err));
    int rc = put_matrix(o, &m, c->bare, &id);
    iv_h5matrix_free(&m);
    if (rc < 0) return iv_fail(err, rc, "%s: cannot pass the matrix to the server", c->path);
    return 0;
}

struct peek_relay {
    iv_h5matrix_stream_fn fn;
    void *ctx;
    int told;
};

static void parent_peek(void *ctx, const void *msg, size_t n)
{
    struct peek_relay *pr = ctx;
    uint64_t v[2];
    if (n != sizeof v || pr->told) return;
    memcpy(v, msg, sizeof v);
    if (v[0] == 0 || v[1] == 0 || v[1] > MAX_CHUNK_BYTES) return;
    pr->told = 1;
    pr->fn(pr->ctx, v[0], v[1]);
}

/* A copy of a blob of exactly n elements of size esz (at least one
 * element allocated, as the in-process load did). */
static void *take_array(iv_h5iso_rd_t *r, uint64_t n, size_t esz)
{
    if (n > ((uint64_t)1 << 56) / (esz ? esz : 1)) {
        r->bad = 1;
        return NULL;
    }
    size_t bytes = (size_t)n * esz;
    const void *p = iv_h5iso_rd_blob(r, bytes, NULL);
    if (!p) return NULL;
    void *a = malloc(bytes ? bytes : 1);
    if (a && bytes) memcpy(a, p, bytes);
    return a;
}

static int filter_known(int id)
{
    return id == IV_FILTER_DEFLATE || id == IV_FILTER_SHUFFLE || id == IV_FILTER_FLETCHER32 ||
           id == IV_FILTER_ZSTD || id == IV_FILTER_BLOSC2 || id == IV_FILTER_LZF;
}

/* The answer's head (16 words, see put_matrix): shape, counts, dtypes. */
static int take_head(iv_h5iso_rd_t *r, const char *where, uint64_t head[16], iv_h5matrix_t *m,
                     iv_err_t *err)
{
    const uint64_t *h = iv_h5iso_rd_raw(r, 16 * 8);
    if (!h) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is truncated", where);
    memcpy(head, h, 16 * 8);
    if (head[0] != MAT_MAGIC || head[1] > IV_IVCSC || head[8] >= IV_DT_COUNT ||
        head[9] >= IV_DT_FLOAT32)
        return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed", where);
    for (int i = 2; i <= 7; i++)
        if (head[i] > ((uint64_t)1 << 48))
            return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed", where);
    m->orient = (iv_orient_t)head[1];
    m->n_rows = (int64_t)head[2];
    m->n_cols = (int64_t)head[3];
    m->n_major = (int64_t)head[4];
    m->n_minor = (int64_t)head[5];
    m->n_unique = (int64_t)head[7];
    m->value_dtype = (iv_dtype_t)head[8];
    m->indices_dtype = (iv_dtype_t)head[9];
    m->stored_bytes = head[10];
    if (m->n_major != (m->orient == IV_IVCSR ? m->n_rows : m->n_cols) ||
        m->n_minor != (m->orient == IV_IVCSR ? m->n_cols : m->n_rows))
        return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (shape)", where);
    return 0;
}

/* A fixed text field of the answer into dst (cap bytes, NUL-terminated). */
static int take_text(iv_h5iso_rd_t *r, const char *where, char *dst, size_t cap, iv_err_t *err)
{
    const char *p = iv_h5iso_rd_raw(r, cap);
    if (!p) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is truncated", where);
    memcpy(dst, p, cap);
    dst[cap - 1] = '\0';
    return 0;
}

/* Opens the file; it must be the one the child read (head[11..15]). */
static int check_same_file(const char *path, const uint64_t head[16], iv_h5matrix_t *m,
                           iv_err_t *err)
{
    struct stat id;
    IV_TRY(open_file(path, m, &id, err));
    if ((uint64_t)id.st_size != head[11] || (uint64_t)id.st_dev != head[12] ||
        (uint64_t)id.st_ino != head[13] || (uint64_t)id.st_mtim.tv_sec != head[14] ||
        (uint64_t)id.st_mtim.tv_nsec != head[15])
        return FAILF(IV_EBAD_FILE, "%s: the file changed while it was being loaded", path);
    return 0;
}

/* The pointer and value arrays; nnz must be what the head says. */
static int take_arrays(iv_h5iso_rd_t *r, const char *where, uint64_t nnz, iv_h5matrix_t *m,
                       iv_err_t *err)
{
    m->major_ptr = take_array(r, (uint64_t)m->n_major + 1, 8);
    m->value_ptr = take_array(r, (uint64_t)m->n_unique + 1, 8);
    m->values = take_array(r, (uint64_t)m->n_unique, iv_dtype_size(m->value_dtype));
    if (r->bad) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (arrays)", where);
    if (!m->major_ptr || !m->value_ptr || !m->values)
        return FAILF(IV_ENOMEM, "%s: out of memory for the pointer arrays", where);
    m->nnz = m->value_ptr[m->n_unique];
    if ((uint64_t)m->nnz != nnz)
        return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (nnz)", where);
    return 0;
}

/* packed_indices' extent, layout and filter pipeline. */
static int take_stream_head(iv_h5iso_rd_t *r, const char *where, iv_stream_desc_t *s, iv_err_t *err)
{
    const uint64_t *shp = iv_h5iso_rd_raw(r, 4 * 8);
    const iv_pipeline_t *pipe = iv_h5iso_rd_raw(r, sizeof s->pipe);
    if (!shp || !pipe) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is truncated", where);
    uint64_t sh[4];
    memcpy(sh, shp, sizeof sh);
    memcpy(&s->pipe, pipe, sizeof s->pipe);
    if (sh[1] > 2) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (layout)", where);
    s->length = sh[0];
    s->chunked = sh[1] != 0;
    s->file_contig = sh[1] == 2;
    s->chunk_len = sh[2];
    s->n_chunks = sh[3];
    if (s->pipe.n > IV_PIPELINE_MAX) return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad filter pipeline", where);
    if (s->file_contig && (s->pipe.n != 0 || s->chunk_len != CONTIG_CHUNK))
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad chunk table", where);
    for (size_t i = 0; i < s->pipe.n; i++)
        if (!filter_known(s->pipe.f[i].id) || s->pipe.f[i].n_cd > IV_FILTER_MAX_CD)
            return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad filter pipeline", where);
    return 0;
}

/* Chunk c of a checked table: a contiguous range's virtual chunks are all
 * there, each 1 MiB but the last; a stored chunk lies inside the file. */
static int check_taken_chunk(const iv_h5matrix_t *m, uint64_t c, const char *where, iv_err_t *err)
{
    const iv_stream_desc_t *s = &m->stream;
    uint64_t a = s->chunk_addr[c], z = s->chunk_size[c];
    uint64_t contig_size = c + 1 < s->n_chunks ? CONTIG_CHUNK : s->length - c * CONTIG_CHUNK;
    if (s->file_contig && (a == UINT64_MAX || z != contig_size))
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad chunk table", where);
    if (a == UINT64_MAX && z == 0) return 0;
    if (a > m->file_len || z > m->file_len - a)
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: chunk %" PRIu64 " (offset %" PRIu64 ", %" PRIu64
                     " bytes) lies past the end of the file (%" PRIu64 " bytes)", where, c, a, z,
                     m->file_len);
    return 0;
}

/* A chunked (or virtually chunked) packed_indices' chunk table. */
static int take_chunk_table(iv_h5iso_rd_t *r, const char *where, iv_h5matrix_t *m, iv_err_t *err)
{
    iv_stream_desc_t *s = &m->stream;
    if (s->chunk_len == 0 || s->chunk_len > MAX_CHUNK_BYTES ||
        s->n_chunks != (s->length + s->chunk_len - 1) / s->chunk_len)
        return FAILF(IV_EBAD_FILE, "%s/packed_indices: bad chunk table", where);
    s->chunk_addr = take_array(r, s->n_chunks, 8);
    s->chunk_size = take_array(r, s->n_chunks, 8);
    s->chunk_mask = take_array(r, s->n_chunks, 4);
    if (r->bad) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (chunk table)", where);
    if (!s->chunk_addr || !s->chunk_size || !s->chunk_mask)
        return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory for the chunk table", where);
    uint64_t stored = 0;
    for (uint64_t c = 0; c < s->n_chunks; c++) {
        IV_TRY(check_taken_chunk(m, c, where, err));
        stored += s->chunk_size[c];
    }
    m->stored_bytes = stored;
    return table_finish(s, where, err);
}

/* A packed_indices that is not chunked: its bytes follow, or it is empty. */
static int take_contig(iv_h5iso_rd_t *r, const char *where, iv_stream_desc_t *s, iv_err_t *err)
{
    uint64_t kind = iv_h5iso_rd_u64(r);
    if (kind == CONTIG_OWNED) {
        s->owned_buf = take_array(r, s->length, 1);
        if (!r->bad && !s->owned_buf) return FAILF(IV_ENOMEM, "%s/packed_indices: out of memory", where);
        s->contig = s->owned_buf;
    } else if (kind != CONTIG_NONE || s->length != 0) {
        r->bad = 1;
    }
    if (r->bad) return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (layout)", where);
    return 0;
}

/* The parent's end: the child's answer read and checked in the order
 * put_matrix wrote it, with the file opened again and compared. */
static int take_parts(const char *path, const char *where, int bare, iv_h5iso_rd_t *r,
                      iv_h5matrix_t *m, iv_err_t *err)
{
    uint64_t head[16];
    IV_TRY(take_head(r, where, head, m, err));
    IV_TRY(take_text(r, where, m->codec, sizeof m->codec, err));
    IV_TRY(take_text(r, where, m->chunk_index, sizeof m->chunk_index, err));
    IV_TRY(check_same_file(path, head, m, err));
    if (bare) m->nnz = (int64_t)head[6];
    else IV_TRY(take_arrays(r, where, head[6], m, err));
    IV_TRY(take_stream_head(r, where, &m->stream, err));
    if (m->stream.chunked) IV_TRY(take_chunk_table(r, where, m, err));
    else IV_TRY(take_contig(r, where, &m->stream, err));
    if (r->pos != r->len)
        return FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's answer is malformed (trailing bytes)", where);
    return bare ? 0 : iv_h5matrix_check_pointers(m, where, err);
}

static int take_matrix(const char *path, const char *where, int bare, const iv_h5iso_result_t *res,
                       iv_h5matrix_t *m, iv_err_t *err)
{
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, res);
    int rc = take_parts(path, where, bare, &r, m, err);
    if (rc == 0) return 0;
    iv_h5matrix_free(m);
    return rc < 0 ? rc : IV_EBAD_FILE;
}

int iv_h5matrix_load(const char *path, const char *group, iv_h5matrix_t *m, iv_err_t *err)
{
    return iv_h5matrix_load_notify(path, group, NULL, NULL, m, err);
}

/* The load across the process line, with or without the arrays. */
static int load_across(const char *path, const char *group, iv_h5matrix_stream_fn fn, void *ctx,
                       int bare, iv_h5matrix_t *m, iv_err_t *err)
{
    memset(m, 0, sizeof *m);
    if (!group || !*group) group = "X";
    char where[1024];
    snprintf(where, sizeof where, "%s:/%s", path, group);
    struct mat_ctx c = {path, group, fn != NULL, bare};
    struct peek_relay pr = {fn, ctx, 0};
    iv_h5iso_result_t res;
    IV_TRY(iv_h5iso_run(path, matrix_child, &c, fn ? parent_peek : NULL, &pr, &res, err));
    int rc = take_matrix(path, where, bare, &res, m, err);
    iv_h5iso_result_free(&res);
    return rc;
}

int iv_h5matrix_load_notify(const char *path, const char *group, iv_h5matrix_stream_fn fn,
                            void *ctx, iv_h5matrix_t *m, iv_err_t *err)
{
    return load_across(path, group, fn, ctx, 0, m, err);
}

int iv_h5matrix_load_bare(const char *path, const char *group, iv_h5matrix_stream_fn fn,
                          void *ctx, iv_h5matrix_t *m, iv_err_t *err)
{
    return load_across(path, group, fn, ctx, 1, m, err);
}

int iv_h5matrix_load_inproc(const char *path, const char *group, iv_h5matrix_t *m, iv_err_t *err)
{
    struct stat id;
    return load_here(path, group, NULL, NULL, 0, NULL, m, &id, err);
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
    free((void *)m->stream.chunk_sum);
    iv_file_close(m->stream.file);
    memset(m, 0, sizeof *m);
}

/* ---- listing the other matrices of a file ------------------------------ */

#define LIST_MAGIC 0x3154534c35485649ull   /* "IVH5LST1" */
#define LIST_MAX 1024                       /* layers listed at most */

typedef struct list_ctx {
    const char *path;
    hid_t file;
    iv_h5iso_out_t *o;
    iv_h5mx_entry_t *v;
    size_t n, cap;
    int rc;
    iv_err_t *err;
} list_ctx_t;

/* A dataset: its shape when two-dimensional, its encoding-type (or
 * "array"), and why it is not served. */
static void describe_dataset(hid_t file, const char *name, iv_h5mx_entry_t *e)
{
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t dims[2] = {0, 0};
    if (nd == 2 && H5Sget_simple_extent_dims(sp, dims, NULL) == 2) {
        e->shape[0] = (int64_t)dims[0];
        e->shape[1] = (int64_t)dims[1];
    }
    if (d >= 0 && iv_h5_read_str_attr(d, "encoding-type", e->encoding, sizeof e->encoding) != 0)
        snprintf(e->encoding, sizeof e->encoding, "array");
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    snprintf(e->reason, sizeof e->reason,
             nd == 2 ? "a dense array; pack it into an IVCSR/IVCSC group (ivserve pack --layers) "
                       "to serve it"
                     : "not a two-dimensional matrix");
}

/* A group by its encoding-type: packed, or why it cannot be served. */
static void classify_group(iv_h5mx_entry_t *e)
{
    if (!strcmp(e->encoding, "ivcsr") || !strcmp(e->encoding, "ivcsc")) {
        e->packed = 1;
    } else if (!strcmp(e->encoding, "csr_matrix") || !strcmp(e->encoding, "csc_matrix")) {
        snprintf(e->reason, sizeof e->reason,
                 "a plain %s; pack it into an IVCSR/IVCSC group (ivserve pack --layers) to serve it",
                 e->encoding);
    } else if (e->encoding[0]) {
        snprintf(e->reason, sizeof e->reason, "encoding-type '%.60s' is not a matrix", e->encoding);
    } else {
        snprintf(e->reason, sizeof e->reason, "a group without an encoding-type");
    }
}

/* A group: its encoding-type and shape attributes, then classify_group. */
static void describe_group(hid_t file, const char *name, iv_h5mx_entry_t *e)
{
    hid_t g = H5Gopen2(file, name, H5P_DEFAULT);
    if (g < 0) {
        snprintf(e->reason, sizeof e->reason, "HDF5 cannot open the group");
        return;
    }
    if (iv_h5_read_str_attr(g, "encoding-type", e->encoding, sizeof e->encoding) != 0)
        e->encoding[0] = '\0';
    int64_t shape[2];
    if (read_i64_attr(g, "shape", shape, 2) == 0) {
        e->shape[0] = shape[0];
        e->shape[1] = shape[1];
    }
    H5Gclose(g);
    classify_group(e);
}

/* Describes the element at name (relative to the root) into e: an IVCSR
 * or IVCSC group is packed; anything else gets the reason it cannot be
 * served as it is. */
static void describe(hid_t file, const char *name, iv_h5mx_entry_t *e)
{
    e->shape[0] = e->shape[1] = -1;
    H5O_info_t oi;
    if (H5Oget_info_by_name(file, name, &oi, H5P_DEFAULT) < 0)
        snprintf(e->reason, sizeof e->reason, "HDF5 cannot read the element");
    else if (oi.type == H5O_TYPE_DATASET)
        describe_dataset(file, name, e);
    else if (oi.type == H5O_TYPE_GROUP)
        describe_group(file, name, e);
    else
        snprintf(e->reason, sizeof e->reason, "not a group or a dataset");
}

static int list_add(list_ctx_t *L, const char *name)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 8;
        iv_h5mx_entry_t *v = realloc(L->v, cap * sizeof *v);
        if (!v) return L->rc = iv_fail(L->err, IV_ENOMEM, "%s: out of memory listing layers", L->path);
        L->v = v;
        L->cap = cap;
    }
    iv_h5mx_entry_t *e = &L->v[L->n++];
    memset(e, 0, sizeof *e);
    if (strlen(name) >= sizeof e->name) {
        /* Listed by a shortened name that no request can name. */
        snprintf(e->name, sizeof e->name, "%.200s...", name);
        e->shape[0] = e->shape[1] = -1;
        snprintf(e->reason, sizeof e->reason, "the name is longer than %zu bytes",
                 sizeof e->name - 1);
        return 0;
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    char stage_buf[IV_H5ISO_STAGE_MAX];
    snprintf(stage_buf, sizeof stage_buf, "%s", name);
    if (L->o) iv_h5iso_stage(L->o, stage_buf);
    describe(L->file, name, e);
    return 0;
}

static herr_t list_visit(hid_t g, const char *name, const H5L_info_t *info, void *arg)
{
    (void)g;
    (void)info;
    list_ctx_t *L = arg;
    if (L->n >= LIST_MAX) return 1;
    char full[600];
    snprintf(full, sizeof full, "layers/%s", name);
    if (strlen(name) > 400) snprintf(full, sizeof full, "layers/%.400s~", name);
    return list_add(L, full) == 0 ? 0 : -1;
}

static int list_here(const char *path, iv_h5iso_out_t *o, iv_h5mx_list_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", path);
    list_ctx_t L = {path, file, o, NULL, 0, 0, 0, err};
    H5E_BEGIN_TRY
    {
        if (H5Lexists(file, "layers", H5P_DEFAULT) > 0) {
            H5O_info_t oi;
            if (H5Oget_info_by_name(file, "layers", &oi, H5P_DEFAULT) >= 0 &&
                oi.type == H5O_TYPE_GROUP) {
                hid_t g = H5Gopen2(file, "layers", H5P_DEFAULT);
                if (g >= 0) {
                    hsize_t idx = 0;
                    if (o) iv_h5iso_stage(o, "layers");
                    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_visit, &L);
                    H5Gclose(g);
                }
            }
        }
        if (L.rc == 0 && group_path_exists(file, "raw/X")) {
            list_add(&L, "raw/X");
            out->raw_var = group_path_exists(file, "raw/var");
        }
    }
    H5E_END_TRY;
    H5Fclose(file);
    if (L.rc != 0) {
        free(L.v);
        return L.rc;
    }
    out->v = L.v;
    out->n = L.n;
    return 0;
}

static int put_str(iv_h5iso_out_t *o, const char *s)
{
    return iv_h5iso_put_blob(o, s, strlen(s));
}

static int list_child(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    const char *path = ctx;
    iv_h5mx_list_t l;
    IV_TRY(list_here(path, o, &l, err));
    int rc = iv_h5iso_put_u64(o, LIST_MAGIC);
    if (rc == 0) rc = iv_h5iso_put_u64(o, (uint64_t)l.n);
    if (rc == 0) rc = iv_h5iso_put_u64(o, (uint64_t)l.raw_var);
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        const iv_h5mx_entry_t *e = &l.v[i];
        uint64_t w[] = {(uint64_t)e->shape[0], (uint64_t)e->shape[1], (uint64_t)e->packed};
        rc = iv_h5iso_put(o, w, sizeof w);
        if (rc == 0) rc = put_str(o, e->name);
        if (rc == 0) rc = put_str(o, e->encoding);
        if (rc == 0) rc = put_str(o, e->reason);
    }
    iv_h5mx_list_free(&l);
    if (rc < 0) return iv_fail(err, rc, "%s: cannot pass the layer list to the server", path);
    return 0;
}

/* A string of the reader's answer into a fixed buffer; bad when it does
 * not fit or holds a NUL. */
static void take_str(iv_h5iso_rd_t *r, char *dst, size_t cap)
{
    size_t n = 0;
    const char *p = iv_h5iso_rd_blob(r, (size_t)-1, &n);
    if (!p || n >= cap || memchr(p, '\0', n)) {
        r->bad = 1;
        dst[0] = '\0';
        return;
    }
    memcpy(dst, p, n);
    dst[n] = '\0';
}

/* One entry of the layer list as list_child wrote it; r->bad when it
 * does not read back. */
static void take_entry(iv_h5iso_rd_t *r, iv_h5mx_entry_t *e)
{
    e->shape[0] = (int64_t)iv_h5iso_rd_u64(r);
    e->shape[1] = (int64_t)iv_h5iso_rd_u64(r);
    uint64_t packed = iv_h5iso_rd_u64(r);
    if (packed > 1 || e->shape[0] < -1 || e->shape[1] < -1) r->bad = 1;
    e->packed = (int)packed;
    take_str(r, e->name, sizeof e->name);
    take_str(r, e->encoding, sizeof e->encoding);
    take_str(r, e->reason, sizeof e->reason);
}

int iv_h5matrix_list(const char *path, iv_h5mx_list_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    iv_h5iso_result_t res;
    IV_TRY(iv_h5iso_run(path, list_child, (void *)path, NULL, NULL, &res, err));
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    int rc = 0;
    uint64_t magic = iv_h5iso_rd_u64(&r), n = iv_h5iso_rd_u64(&r), raw_var = iv_h5iso_rd_u64(&r);
    if (r.bad || magic != LIST_MAGIC || n > LIST_MAX + 1 || raw_var > 1) {
        rc = FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's layer list is malformed", path);
        goto done;
    }
    out->v = calloc(n ? n : 1, sizeof *out->v);
    if (!out->v) {
        rc = FAILF(IV_ENOMEM, "%s: out of memory listing layers", path);
        goto done;
    }
    out->raw_var = (int)raw_var;
    for (uint64_t i = 0; i < n && !r.bad; i++) {
        take_entry(&r, &out->v[i]);
        out->n = (size_t)i + 1;
    }
    if (r.bad || r.pos != r.len)
        rc = FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's layer list is malformed", path);
done:
    iv_h5iso_result_free(&res);
    if (rc != 0) iv_h5mx_list_free(out);
    return rc;
}

/* iv_h5matrix_describe: one element described in the reader child. */
typedef struct describe_ctx {
    const char *path, *name;
} describe_ctx_t;

#define DESCRIBE_MAGIC 0x3153454435485649ull   /* "IVH5DES1" */

static int describe_child(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    const describe_ctx_t *c = ctx;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    hid_t file = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return FAILF(IV_EBAD_FILE, "%s: HDF5 cannot open the file", c->path);
    iv_h5mx_entry_t e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", c->name);
    int present = group_path_exists(file, c->name) || H5Lexists(file, c->name, H5P_DEFAULT) > 0;
    iv_h5iso_stage(o, c->name);
    if (present) describe(file, c->name, &e);
    H5Fclose(file);
    uint64_t w[] = {DESCRIBE_MAGIC, (uint64_t)present, (uint64_t)e.shape[0], (uint64_t)e.shape[1],
                    (uint64_t)e.packed};
    int rc = iv_h5iso_put(o, w, sizeof w);
    if (rc == 0) rc = put_str(o, e.encoding);
    if (rc == 0) rc = put_str(o, e.reason);
    if (rc < 0) return iv_fail(err, rc, "%s: cannot pass the description to the server", c->path);
    return 0;
}

int iv_h5matrix_describe(const char *path, const char *name, iv_h5mx_entry_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    describe_ctx_t c = {path, name};
    iv_h5iso_result_t res;
    IV_TRY(iv_h5iso_run(path, describe_child, &c, NULL, NULL, &res, err));
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    uint64_t magic = iv_h5iso_rd_u64(&r), present = iv_h5iso_rd_u64(&r);
    out->shape[0] = (int64_t)iv_h5iso_rd_u64(&r);
    out->shape[1] = (int64_t)iv_h5iso_rd_u64(&r);
    uint64_t packed = iv_h5iso_rd_u64(&r);
    take_str(&r, out->encoding, sizeof out->encoding);
    take_str(&r, out->reason, sizeof out->reason);
    int rc = 0;
    if (r.bad || r.pos != r.len || magic != DESCRIBE_MAGIC || present > 1 || packed > 1)
        rc = FAILF(IV_EBAD_FILE, "%s: the HDF5 reader's description of %s is malformed", path, name);
    else if (!present)
        rc = FAILF(IV_EBAD_FILE, "%s: no element %s in the file", path, name);
    out->packed = (int)packed;
    iv_h5iso_result_free(&res);
    return rc;
}

void iv_h5mx_list_free(iv_h5mx_list_t *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}
