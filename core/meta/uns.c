/*
 * A file's uns entries (see uns.h).
 *
 * Design.  uns is small and read once per dataset, on the first request
 * that needs it, so the reader walks it whole in a child process (h5iso.h)
 * and sends every servable entry as (kind, scalar, dtype, n, path,
 * values); the parent checks each length as it takes them back and holds
 * the list.  The walk follows hard links only (a soft link could make a
 * cycle) to IV_UNS_MAX_DEPTH groups, and reads a dataset only after
 * iv_h5_check_stored() agreed that its bytes are there, so a few bytes of
 * file cannot declare gigabytes of values.  A group is a dict when its
 * encoding-type says so or when it has none (files written before
 * anndata 0.8); any other encoding (dataframe, csr_matrix, categorical,
 * ...) is left out with everything below it.
 */
#include "uns.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "h5iso.h"
#include "h5util.h"
#include "utf8.h"

#define PATH_CAP 1024

/* ---- child: the walk --------------------------------------------------------- */

typedef struct walk {
    iv_h5iso_out_t *o;
    char path[PATH_CAP];
    int depth;
    size_t n_entries;
    uint64_t bytes;
    int bad;                  /* the answer could not be put */
} walk_t;

static void put_entry(walk_t *w, iv_uns_kind_t kind, int scalar, iv_dtype_t dt, int64_t n,
                      const void *data, size_t bytes)
{
    if (w->n_entries >= IV_UNS_MAX_ENTRIES || w->bytes + bytes > IV_UNS_MAX_BYTES) return;
    w->n_entries++;
    w->bytes += bytes;
    w->bad |= iv_h5iso_put_u64(w->o, (uint64_t)kind) | iv_h5iso_put_u64(w->o, (uint64_t)scalar) |
              iv_h5iso_put_u64(w->o, (uint64_t)dt) | iv_h5iso_put_u64(w->o, (uint64_t)n) |
              iv_h5iso_put_blob(w->o, w->path, strlen(w->path)) |
              iv_h5iso_put_blob(w->o, data, bytes);
}

/* A growing byte string (core/ has no buffer of its own; proto/'s is
 * above it). */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

static int sbuf_add(sbuf_t *b, const void *s, size_t n)
{
    if (n == 0) return 0;  /* b->p may still be NULL: memcpy must not see it */
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* Appends string s (len bytes) and its NUL to buf; -1 when it is not
 * UTF-8 or holds a NUL. */
static int push_str(sbuf_t *b, const char *s, size_t len)
{
    if (memchr(s, '\0', len) || iv_utf8_bad_at(s, len) != len) return -1;
    return sbuf_add(b, s, len) | sbuf_add(b, "", 1);
}

/* Variable-length strings of dataset d into b; -1 when unreadable. */
static int read_vlen(hid_t d, hid_t ft, int64_t n, sbuf_t *b)
{
    hid_t mt = H5Tcopy(H5T_C_S1), sp = H5Dget_space(d);
    char **vl = calloc((size_t)(n > 0 ? n : 1), sizeof *vl);
    int rc = -1;
    if (mt >= 0 && sp >= 0 && vl && H5Tset_size(mt, H5T_VARIABLE) >= 0 &&
        H5Tset_cset(mt, H5Tget_cset(ft)) >= 0 &&
        H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, vl) >= 0) {
        rc = 0;
        for (int64_t i = 0; i < n && rc == 0; i++)
            rc = push_str(b, vl[i] ? vl[i] : "", vl[i] ? strlen(vl[i]) : 0);
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, vl);
    }
    free(vl);
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    return rc;
}

/* Fixed-length strings (ending at the first NUL, space padding cut). */
static int read_fixed(hid_t d, hid_t ft, int64_t n, sbuf_t *b)
{
    size_t L = H5Tget_size(ft);
    if (L == 0 || (uint64_t)L * (uint64_t)n > IV_UNS_MAX_BYTES) return -1;
    char *fx = malloc(L * (size_t)(n > 0 ? n : 1));
    int rc = fx && H5Dread(d, ft, H5S_ALL, H5S_ALL, H5P_DEFAULT, fx) >= 0 ? 0 : -1;
    int spacepad = H5Tget_strpad(ft) == H5T_STR_SPACEPAD;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const char *s = fx + (size_t)i * L;
        size_t len = strnlen(s, L);
        while (spacepad && len > 0 && s[len - 1] == ' ') len--;
        rc = push_str(b, s, len);
    }
    free(fx);
    return rc;
}

static void take_strings(walk_t *w, hid_t d, hid_t ft, int scalar, int64_t n)
{
    sbuf_t b = {0};
    htri_t var = H5Tis_variable_str(ft);
    int rc = var > 0 ? read_vlen(d, ft, n, &b) : var == 0 ? read_fixed(d, ft, n, &b) : -1;
    if (rc == 0) put_entry(w, IV_UNS_STR, scalar, IV_DT_UINT8, n, b.p ? b.p : "", b.len);
    free(b.p);
}

/* Numbers or bools (an enum or integer of one byte, as h5py stores numpy
 * bools) read in their native type. */
static void take_numbers(walk_t *w, hid_t d, hid_t ft, int scalar, int64_t n)
{
    H5T_class_t cls = H5Tget_class(ft);
    iv_dtype_t dt = IV_DT_UINT8;
    int is_bool = cls == H5T_ENUM;
    if (is_bool ? H5Tget_size(ft) != 1 : iv_h5_dtype_of(ft, &dt) != 0) return;
    hid_t mt = is_bool ? H5Tget_native_type(ft, H5T_DIR_ASCEND) : iv_h5_native(dt);
    size_t bytes = (size_t)n * iv_dtype_size(dt);
    uint8_t *v = malloc(bytes ? bytes : 1);
    if (v && mt >= 0 && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0) {
        for (size_t i = 0; is_bool && i < bytes; i++) v[i] = v[i] != 0;
        put_entry(w, is_bool ? IV_UNS_BOOL : IV_UNS_NUM, scalar, dt, n, v, bytes);
    }
    free(v);
    if (is_bool && mt >= 0) H5Tclose(mt);
}

static void take_dataset(walk_t *w, hid_t d)
{
    hid_t sp = H5Dget_space(d), ft = H5Dget_type(d);
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    iv_err_t e = {0};
    if (ft >= 0 && (rank == 0 || rank == 1) && np >= 0 && np <= IV_UNS_MAX_ELEMS &&
        iv_h5_check_stored(d, w->path, &e) == 0) {
        H5T_class_t cls = H5Tget_class(ft);
        if (cls == H5T_STRING) take_strings(w, d, ft, rank == 0, (int64_t)np);
        else if (cls == H5T_INTEGER || cls == H5T_FLOAT || cls == H5T_ENUM)
            take_numbers(w, d, ft, rank == 0, (int64_t)np);
    }
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
}

static int is_dict(hid_t g)
{
    char enc[64];
    return iv_h5_read_str_attr(g, "encoding-type", enc, sizeof enc) != 0 || !strcmp(enc, "dict");
}

static void walk_group(walk_t *w, hid_t g);

static herr_t visit(hid_t g, const char *name, const H5L_info_t *info, void *ctx)
{
    walk_t *w = ctx;
    size_t base = strlen(w->path);
    if (info->type != H5L_TYPE_HARD || w->bad) return w->bad ? -1 : 0;
    size_t len = strlen(name);
    if (base + 1 + len >= sizeof w->path) return 0;
    if (base) w->path[base] = '/';
    memcpy(w->path + base + (base ? 1 : 0), name, len + 1);
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    H5I_type_t ty = o >= 0 ? H5Iget_type(o) : H5I_BADID;
    iv_h5iso_stage(w->o, w->path);
    if (ty == H5I_GROUP && is_dict(o)) {
        put_entry(w, IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0);
        walk_group(w, o);
    } else if (ty == H5I_DATASET) {
        take_dataset(w, o);
    }
    if (o >= 0) H5Oclose(o);
    w->path[base] = '\0';
    return w->bad ? -1 : 0;
}

static void walk_group(walk_t *w, hid_t g)
{
    if (w->depth >= IV_UNS_MAX_DEPTH) return;
    w->depth++;
    hsize_t idx = 0;
    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, visit, w);
    w->depth--;
}

static int uns_child(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    const char *path = ctx;
    if (iv_h5filters_register() < 0)
        return iv_fail(err, IV_EINTERNAL, "%s: cannot register HDF5 filters", path);
    walk_t w = {.o = o};
    iv_h5iso_stage(o, "uns");
    hid_t f = -1;
    H5E_BEGIN_TRY
    {
        f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f >= 0 && H5Lexists(f, "uns", H5P_DEFAULT) > 0) {
            hid_t g = H5Gopen(f, "uns", H5P_DEFAULT);
            if (g >= 0 && is_dict(g)) walk_group(&w, g);
            if (g >= 0) H5Gclose(g);
        }
        if (f >= 0) H5Fclose(f);
    }
    H5E_END_TRY;
    if (f < 0) return iv_fail(err, IV_EIO, "%s: cannot open as HDF5", path);
    return w.bad ? iv_fail(err, IV_EIO, "%s: cannot pass uns to the server", path) : 0;
}

/* ---- parent: taking the answer ----------------------------------------------- */

void iv_uns_free(iv_uns_t *u)
{
    if (!u) return;
    for (size_t i = 0; i < u->n; i++) {
        free(u->e[i].path);
        free(u->e[i].data);
        free(u->e[i].off);
    }
    free(u->e);
    free(u);
}

/* The offsets of a STR entry's n strings; -1 when the bytes do not hold
 * exactly n NUL-terminated UTF-8 strings. */
static int str_offsets(iv_uns_entry_t *e, size_t bytes)
{
    const char *p = e->data;
    e->off = malloc(((size_t)e->n + 1) * sizeof *e->off);
    if (!e->off) return -1;
    size_t at = 0;
    for (int64_t i = 0; i < e->n; i++) {
        const char *z = at < bytes ? memchr(p + at, '\0', bytes - at) : NULL;
        size_t len = z ? (size_t)(z - p) - at : 0;
        if (!z || iv_utf8_bad_at(p + at, len) != len) return -1;
        e->off[i] = at;
        at += len + 1;
    }
    e->off[e->n] = at;
    return at == bytes ? 0 : -1;
}

/* Checks an entry's header against its values' length. */
static int entry_ok(const iv_uns_entry_t *e, uint64_t kind, size_t bytes)
{
    if (kind > IV_UNS_STR || e->n < 0 || e->n > IV_UNS_MAX_ELEMS || (e->scalar && e->n != 1))
        return 0;
    if (kind == IV_UNS_DICT) return bytes == 0 && !e->scalar;
    if (kind == IV_UNS_NUM)
        return iv_dtype_size(e->dtype) > 0 && bytes == (size_t)e->n * iv_dtype_size(e->dtype);
    if (kind == IV_UNS_BOOL) return bytes == (size_t)e->n;
    return 1;
}

static int take_entry(iv_h5iso_rd_t *r, iv_uns_entry_t *e)
{
    uint64_t kind = iv_h5iso_rd_u64(r), scalar = iv_h5iso_rd_u64(r), dt = iv_h5iso_rd_u64(r);
    uint64_t n = iv_h5iso_rd_u64(r);
    size_t plen, bytes;
    const char *p = iv_h5iso_rd_blob(r, (size_t)-1, &plen);
    const void *v = iv_h5iso_rd_blob(r, (size_t)-1, &bytes);
    if (r->bad || !p || plen == 0 || plen >= PATH_CAP || memchr(p, '\0', plen) || scalar > 1 ||
        dt > IV_DT_FLOAT64 || n > (uint64_t)IV_UNS_MAX_ELEMS)
        return -1;
    e->kind = (iv_uns_kind_t)kind;
    e->scalar = (int)scalar;
    e->dtype = (iv_dtype_t)dt;
    e->n = (int64_t)n;
    if (!entry_ok(e, kind, bytes)) return -1;
    e->path = malloc(plen + 1);
    e->data = malloc(bytes ? bytes : 1);
    if (!e->path || !e->data) return -1;
    memcpy(e->path, p, plen);
    e->path[plen] = '\0';
    if (bytes) memcpy(e->data, v, bytes);
    return e->kind == IV_UNS_STR ? str_offsets(e, bytes) : 0;
}

static int take_uns(const char *path, const iv_h5iso_result_t *res, iv_uns_t *u, iv_err_t *err)
{
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, res);
    size_t cap = 0;
    while (r.pos < r.len) {
        if (u->n >= IV_UNS_MAX_ENTRIES) break;
        if (u->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            iv_uns_entry_t *ne = realloc(u->e, nc * sizeof *ne);
            if (!ne) return iv_fail(err, IV_ENOMEM, "%s: out of memory for uns", path);
            u->e = ne;
            cap = nc;
        }
        iv_uns_entry_t *e = &u->e[u->n];
        memset(e, 0, sizeof *e);
        u->n++;
        if (take_entry(&r, e) != 0)
            return iv_fail(err, IV_EINTERNAL, "%s: the uns reader's answer is malformed", path);
    }
    return r.pos == r.len ? 0 : iv_fail(err, IV_EINTERNAL, "%s: the uns reader's answer is malformed", path);
}

int iv_uns_load(const char *path, iv_uns_t **out, iv_err_t *err)
{
    *out = NULL;
    iv_uns_t *u = calloc(1, sizeof *u);
    IV_RETURN_IF(!u, err, IV_ENOMEM, "%s: out of memory", path);
    iv_h5iso_result_t res;
    int rc = iv_h5iso_run(path, uns_child, (void *)path, NULL, NULL, &res, err);
    if (rc < 0) {
        iv_uns_free(u);
        return rc;
    }
    rc = take_uns(path, &res, u, err);
    iv_h5iso_result_free(&res);
    if (rc < 0) {
        iv_uns_free(u);
        return rc;
    }
    *out = u;
    return 0;
}
