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
 * ...) is left out with everything below it.  What is left out is sent
 * too, as a SKIP record naming the element and the reason, so that an
 * answer built from the list can say what it lacks.  An object that a
 * hard link names but HDF5 cannot open, or a group whose members cannot
 * be listed, means damaged bytes: the child fails with IV_EBAD_FILE
 * rather than send a list that silently lacks part of uns.
 */
#include "uns.h"

#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "h5iso.h"
#include "h5util.h"
#include "utf8.h"

#define PATH_CAP 1024
/* The kind of a record naming what was left out (not an iv_uns_kind_t). */
#define KIND_SKIP 4
#define WHY_CAP 256

/* ---- child: the walk --------------------------------------------------------- */

typedef struct walk {
    iv_h5iso_out_t *o;
    char path[PATH_CAP];
    int depth;
    size_t n_entries;
    uint64_t bytes;
    size_t n_skip;
    int bad;                  /* the answer could not be put */
    int damaged;              /* an object or a group's members could not be read */
    char damaged_at[PATH_CAP];
} walk_t;

/* Names w->path as left out, for the reason printf'd; past
 * IV_UNS_MAX_SKIPPED + 1 records nothing more is sent (the parent keeps
 * IV_UNS_MAX_SKIPPED and flags the rest). */
static void put_skip(walk_t *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void put_skip(walk_t *w, const char *fmt, ...)
{
    if (w->n_skip > IV_UNS_MAX_SKIPPED) return;
    w->n_skip++;
    char why[WHY_CAP];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof why ? (size_t)n : sizeof why - 1;
    w->bad |= iv_h5iso_put_u64(w->o, KIND_SKIP) | iv_h5iso_put_u64(w->o, 0) |
              iv_h5iso_put_u64(w->o, 0) | iv_h5iso_put_u64(w->o, 0) |
              iv_h5iso_put_blob(w->o, w->path, strlen(w->path)) | iv_h5iso_put_blob(w->o, why, len);
}

static void put_entry(walk_t *w, iv_uns_kind_t kind, int scalar, iv_dtype_t dt, int64_t n,
                      const void *data, size_t bytes)
{
    if (w->n_entries >= IV_UNS_MAX_ENTRIES) {
        put_skip(w, "past the limit of %d uns entries", IV_UNS_MAX_ENTRIES);
        return;
    }
    if (w->bytes + bytes > IV_UNS_MAX_BYTES) {
        put_skip(w, "past the limit of %llu MiB of uns values", (unsigned long long)(IV_UNS_MAX_BYTES >> 20));
        return;
    }
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
    else put_skip(w, "strings that cannot be read, are not UTF-8 or hold a NUL");
    free(b.p);
}

/* Numbers or bools (an enum or integer of one byte, as h5py stores numpy
 * bools) read in their native type. */
static void take_numbers(walk_t *w, hid_t d, hid_t ft, int scalar, int64_t n)
{
    H5T_class_t cls = H5Tget_class(ft);
    iv_dtype_t dt = IV_DT_UINT8;
    int is_bool = cls == H5T_ENUM;
    if (is_bool ? H5Tget_size(ft) != 1 : iv_h5_dtype_of(ft, &dt) != 0) {
        put_skip(w, is_bool ? "an enum that is not a bool" : "a number type without a numpy dtype here "
                                                           "(float16, or more than 64 bits)");
        return;
    }
    hid_t mt = is_bool ? H5Tget_native_type(ft, H5T_DIR_ASCEND) : iv_h5_native(dt);
    size_t bytes = (size_t)n * iv_dtype_size(dt);
    uint8_t *v = malloc(bytes ? bytes : 1);
    if (v && mt >= 0 && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0) {
        for (size_t i = 0; is_bool && i < bytes; i++) v[i] = v[i] != 0;
        put_entry(w, is_bool ? IV_UNS_BOOL : IV_UNS_NUM, scalar, dt, n, v, bytes);
    } else {
        put_skip(w, "its values cannot be read");
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
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    if (ft < 0 || rank < 0 || np < 0) put_skip(w, "its type or shape cannot be read");
    else if (rank > 1) put_skip(w, "a %d-D array (only scalars and 1-D arrays are served)", rank);
    else if (np > IV_UNS_MAX_ELEMS) put_skip(w, "more than %lld elements", (long long)IV_UNS_MAX_ELEMS);
    else if (cls != H5T_STRING && cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)
        put_skip(w, "a %s type", cls == H5T_COMPOUND ? "compound (record)" : cls == H5T_OPAQUE ? "opaque"
                                 : cls == H5T_REFERENCE ? "reference" : cls == H5T_VLEN ? "variable-length"
                                 : cls == H5T_ARRAY ? "array" : cls == H5T_BITFIELD ? "bitfield"
                                 : "time or other");
    else if (iv_h5_check_stored(d, w->path, &e) != 0) put_skip(w, "%s", e.msg);
    else if (cls == H5T_STRING) take_strings(w, d, ft, rank == 0, (int64_t)np);
    else take_numbers(w, d, ft, rank == 0, (int64_t)np);
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
}

/* Whether group g is a dict; enc gets its encoding-type ("" when none). */
static int is_dict(hid_t g, char enc[64])
{
    if (iv_h5_read_str_attr(g, "encoding-type", enc, 64) != 0) {
        enc[0] = '\0';
        return 1;
    }
    return !strcmp(enc, "dict");
}

static void mark_damaged(walk_t *w)
{
    if (w->damaged) return;
    w->damaged = 1;
    snprintf(w->damaged_at, sizeof w->damaged_at, "%s", w->path);
}

static void walk_group(walk_t *w, hid_t g);

static herr_t visit(hid_t g, const char *name, const H5L_info_t *info, void *ctx)
{
    walk_t *w = ctx;
    size_t base = strlen(w->path);
    if (w->bad || w->damaged) return -1;
    size_t len = strlen(name);
    if (base + 1 + len >= sizeof w->path) return 0;
    if (base) w->path[base] = '/';
    memcpy(w->path + base + (base ? 1 : 0), name, len + 1);
    iv_h5iso_stage(w->o, w->path);
    char enc[64];
    hid_t o = -1;
    if (info->type != H5L_TYPE_HARD) {
        put_skip(w, info->type == H5L_TYPE_SOFT ? "a soft link" : "an external or user-defined link");
    } else if ((o = H5Oopen(g, name, H5P_DEFAULT)) < 0) {
        mark_damaged(w);
    } else {
        H5I_type_t ty = H5Iget_type(o);
        if (ty == H5I_GROUP && is_dict(o, enc)) {
            put_entry(w, IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0);
            walk_group(w, o);
        } else if (ty == H5I_GROUP) {
            put_skip(w, "encoding-type %s", enc);
        } else if (ty == H5I_DATASET) {
            take_dataset(w, o);
        } else {
            put_skip(w, "a named datatype");
        }
    }
    if (o >= 0) H5Oclose(o);
    w->path[base] = '\0';
    return w->bad || w->damaged ? -1 : 0;
}

static void walk_group(walk_t *w, hid_t g)
{
    if (w->depth >= IV_UNS_MAX_DEPTH) {
        put_skip(w, "its members: nested deeper than %d groups", IV_UNS_MAX_DEPTH);
        return;
    }
    w->depth++;
    hsize_t idx = 0;
    if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, visit, w) < 0 && !w->bad) mark_damaged(w);
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
    char enc[64];
    H5E_BEGIN_TRY
    {
        f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        htri_t has = f >= 0 ? H5Lexists(f, "uns", H5P_DEFAULT) : 0;
        hid_t g = has > 0 ? H5Gopen(f, "uns", H5P_DEFAULT) : -1;
        if (has < 0 || (has > 0 && g < 0)) mark_damaged(&w);
        /* A uns that is not a dict (anndata writes none such) reads as empty. */
        if (g >= 0 && is_dict(g, enc)) walk_group(&w, g);
        if (g >= 0) H5Gclose(g);
        if (f >= 0) H5Fclose(f);
    }
    H5E_END_TRY;
    if (f < 0) return iv_fail(err, IV_EIO, "%s: cannot open as HDF5", path);
    if (w.bad) return iv_fail(err, IV_EIO, "%s: cannot pass uns to the server", path);
    if (w.damaged)
        return iv_fail(err, IV_EBAD_FILE, "%s: uns%s%s cannot be read; the file is damaged there", path,
                       w.damaged_at[0] ? "/" : "", w.damaged_at);
    return 0;
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
    for (size_t i = 0; i < u->n_skip; i++) {
        free(u->skip[i].path);
        free(u->skip[i].why);
    }
    free(u->e);
    free(u->skip);
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

/* A copy of n bytes with a NUL after them, or NULL. */
static char *dup_bytes(const char *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* One record's header, path and value bytes as the child put them. */
typedef struct record {
    uint64_t kind, scalar, dt, n;
    const char *path;
    size_t plen;
    const void *v;
    size_t bytes;
} record_t;

static int read_record(iv_h5iso_rd_t *r, record_t *rec)
{
    rec->kind = iv_h5iso_rd_u64(r);
    rec->scalar = iv_h5iso_rd_u64(r);
    rec->dt = iv_h5iso_rd_u64(r);
    rec->n = iv_h5iso_rd_u64(r);
    rec->path = iv_h5iso_rd_blob(r, (size_t)-1, &rec->plen);
    rec->v = iv_h5iso_rd_blob(r, (size_t)-1, &rec->bytes);
    return r->bad || !rec->path || rec->plen == 0 || rec->plen >= PATH_CAP ||
                   memchr(rec->path, '\0', rec->plen) ? -1 : 0;
}

/* A SKIP record: kept while there is room, else flagged. */
static int take_skip(const record_t *rec, iv_uns_t *u, size_t *cap)
{
    /* The path may hold any bytes but NUL, as an entry's may: a JSON
     * writer replaces what is not UTF-8. */
    if (rec->bytes >= WHY_CAP || (rec->bytes && (!rec->v || memchr(rec->v, '\0', rec->bytes))))
        return -1;
    if (u->n_skip >= IV_UNS_MAX_SKIPPED) {
        u->more_skipped = 1;
        return 0;
    }
    if (u->n_skip == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        iv_uns_skip_t *ns = realloc(u->skip, nc * sizeof *ns);
        if (!ns) return -1;
        u->skip = ns;
        *cap = nc;
    }
    iv_uns_skip_t *k = &u->skip[u->n_skip];
    k->path = dup_bytes(rec->path, rec->plen);
    k->why = dup_bytes(rec->bytes ? rec->v : "", rec->bytes);
    if (!k->path || !k->why) {
        free(k->path);
        free(k->why);
        return -1;
    }
    u->n_skip++;
    return 0;
}

static int take_entry(const record_t *rec, iv_uns_entry_t *e)
{
    uint64_t kind = rec->kind, scalar = rec->scalar, dt = rec->dt, n = rec->n;
    size_t plen = rec->plen, bytes = rec->bytes;
    const char *p = rec->path;
    const void *v = rec->v;
    if (scalar > 1 || dt > IV_DT_FLOAT64 || n > (uint64_t)IV_UNS_MAX_ELEMS) return -1;
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
    size_t cap = 0, skip_cap = 0;
    while (r.pos < r.len) {
        record_t rec;
        if (read_record(&r, &rec) != 0)
            return iv_fail(err, IV_EINTERNAL, "%s: the uns reader's answer is malformed", path);
        if (rec.kind == KIND_SKIP) {
            if (take_skip(&rec, u, &skip_cap) != 0)
                return iv_fail(err, IV_EINTERNAL, "%s: the uns reader's answer is malformed", path);
            continue;
        }
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
        if (take_entry(&rec, e) != 0)
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
