/*
 * Both orientations (core/matrix/transpose.c, the planner in core/matrix/query.c, the
 * companion check in core/matrix/dataset.c) on random matrices written here as
 * IVCSR and IVCSC files: every selection form (indices in any order with
 * duplicates, ranges, masks, empty, all) asked by obs and by var must give
 * byte-identical answers through the cell-major and the gene-major copy,
 * and equal a gather from the dense matrix (explicit zeros, -0.0 and NaN
 * payloads kept bit for bit).
 */
#include <check.h>
#include <dirent.h>

#include "check_main.h"
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "dataset_impl.h"
#include "pool.h"
#include "query.h"
#include "transpose.h"
#include "plainfile.h"

#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

static uint64_t rs = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* A dense matrix: value bits per cell, present flags. */
struct mat {
    int64_t n_rows, n_cols;
    iv_dtype_t dt;
    uint64_t *bits;
    char *has;
    int64_t nnz;
};

static void mat_free(struct mat *m)
{
    free(m->bits);
    free(m->has);
}

/* A value of dtype dt as bits, from a small palette (explicit zeros, a
 * negative zero and NaN for floats), so that groups repeat. */
static uint64_t pick_value(iv_dtype_t dt)
{
    int k = (int)(rnd() % 7);
    uint64_t b = 0;
    if (dt == IV_DT_FLOAT32) {
        float pal[7] = {0.0f, 1.0f, 2.0f, 3.5f, -1.25f, -0.0f, NAN};
        memcpy(&b, &pal[k], 4);
    } else if (dt == IV_DT_FLOAT64) {
        double pal[7] = {0.0, 1.0, 2.0, 1e300, -7.5, -0.0, NAN};
        memcpy(&b, &pal[k], 8);
    } else if (dt == IV_DT_INT64) {
        int64_t pal[7] = {0, 1, 2, -3, INT64_MAX, INT64_MIN, 5};
        memcpy(&b, &pal[k], 8);
    } else {
        uint16_t pal[7] = {0, 1, 2, 3, 65535, 7, 9};
        memcpy(&b, &pal[k], 2);
    }
    return b;
}

static void mat_random(struct mat *m, int64_t nr, int64_t nc, iv_dtype_t dt, double dens)
{
    m->n_rows = nr;
    m->n_cols = nc;
    m->dt = dt;
    m->bits = calloc((size_t)(nr * nc + 1), sizeof *m->bits);
    m->has = calloc((size_t)(nr * nc + 1), 1);
    m->nnz = 0;
    for (int64_t i = 0; i < nr * nc; i++) {
        if ((double)(rnd() % 10000) / 10000.0 < dens) {
            m->has[i] = 1;
            m->bits[i] = pick_value(dt);
            m->nnz++;
        }
    }
}

static hid_t h5type(iv_dtype_t dt)
{
    switch (dt) {
    case IV_DT_FLOAT32: return H5T_IEEE_F32LE;
    case IV_DT_FLOAT64: return H5T_IEEE_F64LE;
    case IV_DT_INT64: return H5T_STD_I64LE;
    default: return H5T_STD_U16LE;
    }
}

static void put_str_attr(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v));
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

static void put_1d(hid_t g, const char *name, hid_t t, const void *data, hsize_t n, hsize_t chunk)
{
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    /* HDF5 wants chunks no longer than a fixed-size dataset. */
    if (chunk > n) chunk = n;
    if (chunk && n > 0) H5Pset_chunk(dcpl, 1, &chunk);
    /* Odd chunk lengths are stored compressed (deflate), so that both
     * kinds of chunked stream are read, and the replica is made. */
    if (chunk && n > 0 && chunk % 2) H5Pset_deflate(dcpl, 1);
    hid_t d = H5Dcreate2(g, name, t, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (n > 0) H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/*
 * Writes m in the packed layout, cell-major (csc = 0) or gene-major, with
 * the groups of each slice in a shuffled order (readers must not depend
 * on it).  dup_slice >= 0 stores one index of that slice twice (in two
 * groups): a corrupt file that the row index does not see.  chunk > 0
 * stores packed_indices in chunks of that many bytes (unfiltered).
 */
static void write_packed(const char *path, const struct mat *m, int csc, int64_t dup_slice,
                         hsize_t chunk)
{
    int64_t nmaj = csc ? m->n_cols : m->n_rows, nmin = csc ? m->n_rows : m->n_cols;
    size_t esz = iv_dtype_size(m->dt);
    int64_t cap = m->nnz + 2;
    int64_t *mp = malloc((size_t)(nmaj + 1) * sizeof *mp);
    int64_t *vp = malloc((size_t)(cap + 1) * sizeof *vp);
    uint8_t *vals = malloc((size_t)cap * esz + 1);
    uint8_t *pk = malloc((size_t)(cap + 1) * 10);
    uint64_t *distinct = malloc((size_t)(nmin + 1) * sizeof *distinct);
    int64_t ng = 0, rank = 0;
    size_t nb = 0;
    vp[0] = 0;
    mp[0] = 0;
    for (int64_t s = 0; s < nmaj; s++) {
        size_t nd = 0;
        for (int64_t j = 0; j < nmin; j++) {
            int64_t at = csc ? j * m->n_cols + s : s * m->n_cols + j;
            if (m->has[at]) distinct[nd++] = m->bits[at];
        }
        qsort(distinct, nd, sizeof *distinct, cmp_u64);
        size_t u = 0;
        for (size_t k = 0; k < nd; k++)
            if (k == 0 || distinct[k] != distinct[u - 1]) distinct[u++] = distinct[k];
        for (size_t k = u; k > 1; k--) {   /* shuffled group order */
            size_t r = (size_t)(rnd() % k);
            uint64_t x = distinct[k - 1];
            distinct[k - 1] = distinct[r];
            distinct[r] = x;
        }
        for (size_t k = 0; k < u; k++) {
            int64_t prev = -1;
            for (int64_t j = 0; j < nmin; j++) {
                int64_t at = csc ? j * m->n_cols + s : s * m->n_cols + j;
                if (!m->has[at] || m->bits[at] != distinct[k]) continue;
                uint64_t d = (uint64_t)(j - prev - 1);
                while (d >= 0x80) {
                    pk[nb++] = (uint8_t)(d | 0x80);
                    d >>= 7;
                }
                pk[nb++] = (uint8_t)d;
                prev = j;
                rank++;
            }
            memcpy(vals + (size_t)ng * esz, &distinct[k], esz);
            vp[++ng] = rank;
        }
        if (s == dup_slice && u > 0 && ng < cap) {
            /* A second group holding the slice's first index again. */
            int64_t first = -1;
            for (int64_t j = 0; j < nmin && first < 0; j++) {
                int64_t at = csc ? j * m->n_cols + s : s * m->n_cols + j;
                if (m->has[at]) first = j;
            }
            pk[nb++] = (uint8_t)first;   /* test matrices have < 128 minor */
            rank++;
            memcpy(vals + (size_t)ng * esz, &distinct[0], esz);
            vp[++ng] = rank;
        }
        mp[s + 1] = ng;
    }
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Gcreate2(f, "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    put_str_attr(g, "encoding-type", csc ? "ivcsc" : "ivcsr");
    put_str_attr(g, "encoding-version", "0.1.0");
    put_str_attr(g, "indices_dtype", "int32");
    int64_t shape[2] = {m->n_rows, m->n_cols};
    hsize_t two = 2;
    hid_t sp = H5Screate_simple(1, &two, NULL);
    hid_t a = H5Acreate2(g, "shape", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, shape);
    H5Aclose(a);
    H5Sclose(sp);
    put_1d(g, "major_ptr", H5T_NATIVE_INT64, mp, (hsize_t)nmaj + 1, 0);
    put_1d(g, "value_ptr", H5T_NATIVE_INT64, vp, (hsize_t)ng + 1, 0);
    put_1d(g, "values", h5type(m->dt), vals, (hsize_t)ng, 0);
    put_1d(g, "packed_indices", H5T_NATIVE_UINT8, pk, (hsize_t)nb, chunk);
    H5Gclose(g);
    H5Fclose(f);
    free(mp);
    free(vp);
    free(vals);
    free(pk);
    free(distinct);
}

/* One selection; idx owned. */
struct sel {
    iv_sel_t s;
    int64_t *idx;
};

/* Every selection form over an axis of length n, by kind. */
static void make_sel(struct sel *o, int kind, int64_t n)
{
    memset(o, 0, sizeof *o);
    int64_t cap = 3 * n + 4;
    o->idx = malloc((size_t)cap * sizeof *o->idx);
    int64_t k = 0;
    switch (kind) {
    case 0: o->s.all = 1; return;                          /* all */
    case 1: break;                                          /* empty */
    case 2:                                                 /* any order, duplicates */
        if (n > 0)
            for (int64_t t = (int64_t)(rnd() % (uint64_t)(2 * n + 1)); t > 0; t--)
                o->idx[k++] = (int64_t)(rnd() % (uint64_t)n);
        break;
    case 3: {                                               /* a range */
        int64_t a = n ? (int64_t)(rnd() % (uint64_t)(n + 1)) : 0;
        int64_t b = a + (n - a ? (int64_t)(rnd() % (uint64_t)(n - a + 1)) : 0);
        for (int64_t x = a; x < b; x++) o->idx[k++] = x;
        break;
    }
    case 4:                                                 /* a mask: ascending, no duplicates */
        for (int64_t x = 0; x < n; x++)
            if (rnd() % 3 == 0) o->idx[k++] = x;
        break;
    default:                                                /* one element */
        if (n > 0) o->idx[k++] = (int64_t)(rnd() % (uint64_t)n);
        break;
    }
    o->s.n = k;
    o->s.idx = o->idx;
}

/* A whole result as one CSR: ids, global indptr, indices, value bits. */
struct res {
    int64_t n_rows, n_cols, nnz;
    int64_t *ids, *indptr, *indices;
    uint64_t *vals;
    iv_orient_t orient;
};

static void res_free(struct res *r)
{
    free(r->ids);
    free(r->indptr);
    free(r->indices);
    free(r->vals);
}

static int run(iv_dataset_t *ds, iv_pool_t *pool, const iv_sel_t *obs, const iv_sel_t *var,
               iv_out_axis_t axis, iv_pick_t pick, int64_t block_nnz, struct res *r, iv_err_t *err)
{
    memset(r, 0, sizeof *r);
    iv_query_t *q;
    iv_query_opts_t qo = {.axis = axis, .pick = pick, .block_nnz = block_nnz};
    if (iv_query_new(ds, obs, var, &qo, &q, err) < 0) return -1;
    if (iv_query_prepare(q, pool, err) < 0) {
        iv_query_free(q);
        return -1;
    }
    r->orient = iv_query_orient(q);
    r->n_rows = iv_query_n_rows(q);
    r->n_cols = iv_query_n_cols(q);
    r->ids = malloc((size_t)(r->n_rows + 1) * sizeof *r->ids);
    r->indptr = malloc((size_t)(r->n_rows + 1) * sizeof *r->indptr);
    r->indptr[0] = 0;
    int64_t cap = 16;
    r->indices = malloc((size_t)cap * sizeof *r->indices);
    r->vals = malloc((size_t)cap * sizeof *r->vals);
    for (int64_t b = 0; b < iv_query_n_blocks(q); b++) {
        iv_block_t blk;
        if (iv_query_decode_block(q, b, &blk, err) < 0) {
            iv_query_free(q);
            return -1;
        }
        size_t esz = iv_dtype_size(blk.dtype);
        /* Grown only when full: ASan's realloc copies even to the same
         * size, and thousands of blocks made that quadratic. */
        if (r->nnz + blk.nnz > cap) {
            while (r->nnz + blk.nnz > cap) cap *= 2;
            r->indices = realloc(r->indices, (size_t)cap * sizeof *r->indices);
            r->vals = realloc(r->vals, (size_t)cap * sizeof *r->vals);
        }
        for (int64_t x = 0; x < blk.n_rows; x++) {
            r->ids[blk.row0 + x] = blk.ids[x];
            r->indptr[blk.row0 + x + 1] = r->nnz + blk.indptr[x + 1];
        }
        for (int64_t t = 0; t < blk.nnz; t++) {
            r->indices[r->nnz + t] = blk.index_size == 4 ? ((int32_t *)blk.indices)[t]
                                                         : ((int64_t *)blk.indices)[t];
            uint64_t v = 0;
            memcpy(&v, (char *)blk.data + (size_t)t * esz, esz);
            r->vals[r->nnz + t] = v;
        }
        r->nnz += blk.nnz;
        iv_block_free(&blk);
    }
    iv_query_free(q);
    return 0;
}

/* The result against the dense matrix: rows are obs (or var) selections. */
static void check_ref(const struct mat *m, const iv_sel_t *obs, const iv_sel_t *var, int by_var,
                      const struct res *r, const char *label)
{
    int64_t no = obs->all ? m->n_rows : obs->n, nv = var->all ? m->n_cols : var->n;
    int64_t nr = by_var ? nv : no, nc = by_var ? no : nv;
    EXPECT(r->n_rows == nr && r->n_cols == nc, "%s: shape %ld x %ld, expected %ld x %ld", label,
           (long)r->n_rows, (long)r->n_cols, (long)nr, (long)nc);
    int64_t t = 0;
    for (int64_t i = 0; i < nr; i++) {
        int64_t id = by_var ? (var->all ? i : var->idx[i]) : (obs->all ? i : obs->idx[i]);
        EXPECT(r->ids[i] == id, "%s: row %ld id %ld, expected %ld", label, (long)i, (long)r->ids[i],
               (long)id);
        for (int64_t j = 0; j < nc; j++) {
            int64_t o = by_var ? (obs->all ? j : obs->idx[j]) : id;
            int64_t v = by_var ? id : (var->all ? j : var->idx[j]);
            int64_t at = o * m->n_cols + v;
            if (!m->has[at]) continue;
            EXPECT(t < r->indptr[i + 1] && r->indices[t] == j && r->vals[t] == m->bits[at],
                   "%s: row %ld col %ld missing or wrong", label, (long)i, (long)j);
            t++;
        }
        EXPECT(t == r->indptr[i + 1], "%s: row %ld has extra entries", label, (long)i);
    }
    EXPECT(t == r->nnz, "%s: nnz %ld, expected %ld", label, (long)r->nnz, (long)t);
}

static int res_equal(const struct res *a, const struct res *b)
{
    return a->n_rows == b->n_rows && a->n_cols == b->n_cols && a->nnz == b->nnz &&
           !memcmp(a->ids, b->ids, (size_t)a->n_rows * 8) &&
           !memcmp(a->indptr, b->indptr, (size_t)(a->n_rows + 1) * 8) &&
           !memcmp(a->indices, b->indices, (size_t)a->nnz * 8) &&
           !memcmp(a->vals, b->vals, (size_t)a->nnz * 8);
}

static void tmp_path(char *buf, size_t cap, const char *tag)
{
    snprintf(buf, cap, "/tmp/ivtest_transpose_%d_%s.h5ad", (int)getpid(), tag);
}

static iv_dataset_t *open_ds(const char *path, iv_pool_t *pool)
{
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.pool = pool;
    o.index_stride = (uint32_t)(1 + rnd() % 5);
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(path, &o, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

static const iv_dtype_t dtypes[4] = {IV_DT_FLOAT32, IV_DT_UINT16, IV_DT_FLOAT64, IV_DT_INT64};

/* Random matrices, both file orientations, built copies, every selection
 * form by obs and by var through both orientations. */
/* The selection (obs, var) by axis ax (by var when 1), served by each
 * orientation with blocks of bn entries and by the planner's pick: the
 * first equals the matrix itself, the others equal the first. */
static void check_orientations(iv_dataset_t *ds, iv_pool_t *pool, const struct mat *m, const iv_sel_t *obs,
                               const iv_sel_t *var, int ax, int64_t bn, const char *label)
{
    iv_out_axis_t axis = ax ? IV_OUT_VARS : IV_OUT_ROWS;
    struct res a, b, c;
    iv_err_t err = {0};
    ck_assert_msg(run(ds, pool, obs, var, axis, IV_PICK_CELLS, bn, &a, &err) == 0, "%s: %s", label, err.msg);
    ck_assert_msg(run(ds, pool, obs, var, axis, IV_PICK_GENES, bn, &b, &err) == 0, "%s: %s", label, err.msg);
    ck_assert_msg(run(ds, pool, obs, var, axis, IV_PICK_AUTO, 0, &c, &err) == 0, "%s: %s", label, err.msg);
    ck_assert_int_eq(a.orient, IV_IVCSR);
    ck_assert_int_eq(b.orient, IV_IVCSC);
    check_ref(m, obs, var, ax, &a, label);
    EXPECT(res_equal(&a, &b), "%s: the orientations differ", label);
    EXPECT(res_equal(&a, &c), "%s: the planner's answer differs", label);
    res_free(&a);
    res_free(&b);
    res_free(&c);
}

START_TEST(differential_random)
{
    iv_pool_t *pool = iv_pool_create(2, 0);
    char path[256];
    tmp_path(path, sizeof path, "diff");
    for (int iter = 0; iter < 24; iter++) {
        struct mat m;
        int64_t nr = (int64_t)(rnd() % 90), nc = (int64_t)(rnd() % 100);
        if (iter == 0) nr = 0;
        if (iter == 1) nc = 0;
        double dens = iter % 5 == 0 ? 0.9 : (double)(rnd() % 40) / 100.0;
        mat_random(&m, nr, nc, dtypes[iter % 4], dens);
        int csc = iter % 2;
        write_packed(path, &m, csc, -1, iter % 3 == 0 ? 7 : 0);
        iv_dataset_t *ds = open_ds(path, pool);
        iv_err_t err = {0};
        /* Small temporaries make several windows. */
        iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = iter % 4 == 3 ? NULL : pool,
                                  .tmp_bytes = iter % 3 == 1 ? 64 : 0, .resume = iter % 2 ? 1 + iter % 4 / 2 : -1};
        ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "iter %d: %s", iter, err.msg);
        iv_orient_status_t st;
        iv_dataset_orientations(ds, &st);
        ck_assert_int_eq(st.other_state, IV_OTHER_READY);
        ck_assert_int_eq(st.other_source, IV_SRC_MEMORY);
        ck_assert(st.bytes[IV_IVCSR] > 0 && st.bytes[IV_IVCSC] > 0);
        for (int ko = 0; ko < 6; ko++) {
            for (int kv = 0; kv < 6; kv++) {
                struct sel so, sv;
                make_sel(&so, ko, nr);
                make_sel(&sv, kv, nc);
                for (int ax = 0; ax < 2; ax++) {
                    char label[96];
                    snprintf(label, sizeof label, "iter %d obs kind %d var kind %d axis %d", iter,
                             ko, kv, ax);
                    check_orientations(ds, pool, &m, &so.s, &sv.s, ax, 1 + (int64_t)(rnd() % 64), label);
                }
                free(so.idx);
                free(sv.idx);
            }
        }
        iv_dataset_close(ds);
        mat_free(&m);
    }
    unlink(path);
    iv_pool_destroy(pool);
}
END_TEST

/* Long slices, sparse: deltas of one, two and three varint bytes, in
 * both the source's stream (read by the fill) and the copy's (written by
 * the encode), every selection checked against the matrix itself. */
START_TEST(long_slices_all_varint_lengths)
{
    iv_pool_t *pool = iv_pool_create(2, 0);
    char path[256];
    tmp_path(path, sizeof path, "long");
    static const int64_t shapes[][2] = {{3, 40000}, {40000, 3}, {40, 20000}, {20000, 40}};
    static const double dens[] = {0.0002, 0.003, 0.05};
    int iter = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (size_t dn = 0; dn < sizeof dens / sizeof dens[0]; dn++, iter++) {
            struct mat m;
            int64_t nr = shapes[sh][0], nc = shapes[sh][1];
            mat_random(&m, nr, nc, dtypes[iter % 4], dens[dn]);
            int csc = iter % 2;
            write_packed(path, &m, csc, -1, 0);
            iv_dataset_t *ds = open_ds(path, pool);
            iv_err_t err = {0};
            iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
            ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "iter %d: %s", iter, err.msg);
            for (int ko = 0; ko < 3; ko += 2) {
                for (int kv = 0; kv < 3; kv += 2) {
                    struct sel so, sv;
                    make_sel(&so, ko, nr);
                    make_sel(&sv, kv, nc);
                    for (int ax = 0; ax < 2; ax++) {
                        char label[96];
                        snprintf(label, sizeof label, "%ld x %ld density %g obs kind %d var kind %d axis %d",
                                 (long)nr, (long)nc, dens[dn], ko, kv, ax);
                        check_orientations(ds, pool, &m, &so.s, &sv.s, ax, 0, label);
                    }
                    free(so.idx);
                    free(sv.idx);
                }
            }
            iv_dataset_close(ds);
            mat_free(&m);
        }
    unlink(path);
    iv_pool_destroy(pool);
}
END_TEST

/* The copy's parts, byte for byte: pointers, values, the packed stream. */
struct snap {
    int64_t n_major, n_unique;
    int64_t *mp, *vp;
    uint8_t *values, *stream;
    size_t values_len;
    uint64_t stream_len;
};

static void snap_take(iv_dataset_t *ds, struct snap *o)
{
    iv_dataset_t *c = iv_dataset_other(ds);
    ck_assert_ptr_nonnull(c);
    const iv_h5matrix_t *m = &c->m;
    o->n_major = m->n_major;
    o->n_unique = m->n_unique;
    o->mp = malloc((size_t)(m->n_major + 1) * sizeof *o->mp);
    o->vp = malloc((size_t)(m->n_unique + 1) * sizeof *o->vp);
    memcpy(o->mp, m->major_ptr, (size_t)(m->n_major + 1) * sizeof *o->mp);
    memcpy(o->vp, m->value_ptr, (size_t)(m->n_unique + 1) * sizeof *o->vp);
    o->values_len = (size_t)m->n_unique * iv_dtype_size(m->value_dtype);
    o->values = malloc(o->values_len + 1);
    memcpy(o->values, m->values, o->values_len);
    o->stream_len = iv_stream_length(c->stream);
    o->stream = malloc((size_t)o->stream_len + 1);
    uint64_t at = 0;
    iv_err_t err = {0};
    for (uint64_t k = 0; k < iv_stream_n_chunks(c->stream); k++) {
        const uint8_t *d;
        size_t len;
        ck_assert_msg(iv_stream_acquire(c->stream, k, &d, &len, NULL, &err) == 0, "%s", err.msg);
        ck_assert(at + len <= o->stream_len);
        memcpy(o->stream + at, d, len);
        at += len;
        iv_stream_release(c->stream, k);
    }
    ck_assert_uint_eq(at, o->stream_len);
}

static int snap_equal(const struct snap *a, const struct snap *b)
{
    return a->n_major == b->n_major && a->n_unique == b->n_unique &&
           !memcmp(a->mp, b->mp, (size_t)(a->n_major + 1) * sizeof *a->mp) &&
           !memcmp(a->vp, b->vp, (size_t)(a->n_unique + 1) * sizeof *a->vp) &&
           a->values_len == b->values_len && !memcmp(a->values, b->values, a->values_len) &&
           a->stream_len == b->stream_len && !memcmp(a->stream, b->stream, (size_t)a->stream_len);
}

static void snap_free(struct snap *o)
{
    free(o->mp);
    free(o->vp);
    free(o->values);
    free(o->stream);
}

/*
 * Every way the build can cut its work gives the same copy, byte for
 * byte, and that copy answers as the dense matrix does: blocks of one
 * slice, of two, of many; 8-byte temporary entries; windows of a few
 * entries; chunks of one cache line; plain stores; no pool.  Awkward shapes: no rows, no columns, one column,
 * one row, empty rows and columns, a single value everywhere (one group
 * a slice, explicit zeros), many distinct values (wide value ids), dense.
 */
START_TEST(every_cut_same_copy)
{
    iv_pool_t *pool = iv_pool_create(3, 0);
    char path[256];
    tmp_path(path, sizeof path, "cuts");
    static const struct {
        int64_t nr, nc;
        double dens;
        int kind;   /* 0 palette, 1 one value (0.0), 2 all distinct */
    } shapes[] = {
        {0, 17, 0.5, 0}, {23, 0, 0.5, 0}, {1, 1, 1.0, 0}, {61, 1, 0.6, 0}, {1, 77, 0.5, 0},
        {90, 80, 0.03, 0}, {50, 60, 0.4, 1}, {70, 40, 0.5, 2}, {40, 50, 0.97, 0}, {120, 9, 0.3, 2},
    };
    static const iv_transpose_opts_t cuts[] = {
        {.block_entries = 1},
        {.block_slices = 1},
        {.block_slices = 2, .block_entries = 5},
        {.block_entries = 40, .wide_entries = 1},
        {.wide_entries = 1, .block_slices = 1},
        {.tmp_bytes = 64, .block_entries = 3},
        {.tmp_bytes = 200, .block_slices = 3, .wide_entries = 1},
        /* Chains of short chunks (one cache line with write combining,
         * one or two entries with plain stores), in one window and in
         * several. */
        {.chunk_entries = 1, .block_slices = 4},
        {.chunk_entries = 1, .plain_stores = 1, .block_entries = 7},
        {.chunk_entries = 1, .tmp_bytes = 64, .wide_entries = 1},
        {.chunk_entries = 2, .plain_stores = 1, .wide_entries = 1, .block_slices = 2},
        /* Windows that resume each group where the last one left it, and
         * windows that decode every group from its start. */
        {.tmp_bytes = 64, .block_entries = 3, .resume = 1},
        {.tmp_bytes = 200, .block_slices = 3, .wide_entries = 1, .resume = 2},
        {.chunk_entries = 1, .tmp_bytes = 64, .plain_stores = 1, .resume = 1},
        {.tmp_bytes = 64, .resume = -1},
    };
    size_t n_shapes = sizeof shapes / sizeof shapes[0], n_cuts = sizeof cuts / sizeof cuts[0];
    for (size_t sh = 0; sh < n_shapes; sh++) {
        for (int csc = 0; csc < 2; csc++) {
            struct mat m;
            iv_dtype_t dt = shapes[sh].kind == 2 ? IV_DT_INT64 : dtypes[(sh + (size_t)csc) % 4];
            mat_random(&m, shapes[sh].nr, shapes[sh].nc, dt, shapes[sh].dens);
            /* A few empty rows and columns among the others. */
            for (int64_t i = 0; i < m.n_rows * m.n_cols; i++) {
                int64_t r = i / m.n_cols, c = i % m.n_cols;
                if ((m.n_rows > 3 && r % 7 == 3) || (m.n_cols > 3 && c % 5 == 2)) {
                    m.nnz -= m.has[i];
                    m.has[i] = 0;
                }
                if (!m.has[i]) continue;
                if (shapes[sh].kind == 1) m.bits[i] = 0;
                if (shapes[sh].kind == 2) m.bits[i] = (uint64_t)i * 2654435761u;
            }
            write_packed(path, &m, csc, -1, sh % 3 == 0 ? 5 : 0);
            iv_err_t err = {0};
            iv_dataset_t *ds = open_ds(path, pool);
            iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
            ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "shape %zu: %s", sh, err.msg);
            struct snap ref;
            snap_take(ds, &ref);
            /* The default copy answers as the dense matrix, by obs and by var. */
            iv_sel_t all = {.all = 1};
            for (int ax = 0; ax < 2; ax++) {
                struct res r;
                ck_assert_msg(run(ds, pool, &all, &all, ax ? IV_OUT_VARS : IV_OUT_ROWS, IV_PICK_GENES,
                                  0, &r, &err) == 0, "%s", err.msg);
                ck_assert_int_eq(r.orient, IV_IVCSC);
                char label[64];
                snprintf(label, sizeof label, "shape %zu csc %d axis %d", sh, csc, ax);
                check_ref(&m, &all, &all, ax, &r, label);
                res_free(&r);
            }
            iv_dataset_close(ds);
            for (size_t k = 0; k < n_cuts; k++) {
                ds = open_ds(path, pool);
                iv_transpose_opts_t o = cuts[k];
                o.budget = UINT64_MAX;
                o.pool = k % 2 ? NULL : pool;
                int resumed = 0;
                o.resumed_fills = &resumed;
                ck_assert_msg(iv_dataset_build_other(ds, &o, &err) == 0, "shape %zu cut %zu: %s", sh,
                              k, err.msg);
                struct snap got;
                snap_take(ds, &got);
                EXPECT(snap_equal(&ref, &got), "shape %zu csc %d cut %zu: the copy differs", sh, csc, k);
                if (o.resume < 0) ck_assert_int_eq(resumed, 0);
                snap_free(&got);
                iv_dataset_close(ds);
            }
            snap_free(&ref);
            mat_free(&m);
        }
    }
    unlink(path);
    iv_pool_destroy(pool);
}
END_TEST

/* 1 when dir holds a transpose replica's file (they are unlinked at once). */
static int replica_left(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".ivserve-transpose-", 19) == 0) found = 1;
    if (d) closedir(d);
    return found;
}

/* A sink that puts the windows back together as a copy (struct snap),
 * checking that they come in order and add up; fail_at > 0 makes that
 * window an error. */
struct gather {
    struct snap s;
    int64_t next_g;
    uint64_t groups, entries, bytes, last_done;
    size_t vsz;
    int windows, fail_at;
};

static int gather_window(void *ctx, const iv_transpose_window_t *w, iv_err_t *err)
{
    struct gather *k = ctx;
    if (++k->windows == k->fail_at) return iv_fail(err, IV_EIO, "sink refused window %d", k->windows);
    ck_assert_int_eq(w->g0, k->next_g);
    ck_assert(w->g1 > w->g0 && w->g1 <= k->s.n_major);
    ck_assert(w->entries_done >= k->last_done);
    ck_assert(w->entries_done <= w->nnz);
    k->last_done = w->entries_done;
    uint64_t nb = 0, ng = 0;
    for (int64_t g = w->g0; g < w->g1; g++) {
        nb += w->slice_bytes[g - w->g0];
        ng += w->slice_groups[g - w->g0];
        k->s.mp[g + 1] = k->s.mp[g] + w->slice_groups[g - w->g0];
    }
    ck_assert_uint_eq(nb, w->n_bytes);
    ck_assert_uint_eq(ng, w->n_groups);
    k->s.vp = realloc(k->s.vp, (size_t)(k->groups + ng + 1) * sizeof *k->s.vp);
    k->s.values = realloc(k->s.values, (size_t)(k->groups + ng) * k->vsz + 1);
    k->s.stream = realloc(k->s.stream, (size_t)(k->bytes + nb) + 1);
    k->s.vp[0] = 0;
    for (uint64_t x = 0; x < ng; x++) k->s.vp[k->groups + x + 1] = k->s.vp[k->groups + x] + (int64_t)w->group_sizes[x];
    memcpy(k->s.values + k->groups * k->vsz, w->values, (size_t)ng * k->vsz);
    memcpy(k->s.stream + k->bytes, w->bytes, (size_t)nb);
    k->groups += ng;
    k->bytes += nb;
    k->next_g = w->g1;
    return 0;
}

static void gather_init(struct gather *k, const iv_dataset_t *ds, int fail_at)
{
    memset(k, 0, sizeof *k);
    k->s.n_major = ds->m.n_minor;
    k->s.mp = calloc((size_t)(k->s.n_major + 1), sizeof *k->s.mp);
    k->s.vp = calloc(1, sizeof *k->s.vp);
    k->s.values = malloc(1);   /* compared with memcmp even when empty */
    k->s.stream = malloc(1);
    k->vsz = iv_dtype_size(ds->m.value_dtype);
    k->fail_at = fail_at;
}

/* ds's stream written as a plain copy at path (plainfile.h). */
static void write_plain(iv_dataset_t *ds, const char *path)
{
    iv_err_t err = {0};
    iv_plainfile_for_t f = {.file = *iv_file_loaded_id(iv_stream_file(ds->stream)), .group = "X",
                            .length = iv_stream_length(ds->stream)};
    ck_assert_msg(iv_plainfile_save(path, &f, ds->stream, NULL, NULL, &err) == 0, "%s", err.msg);
}

/*
 * iv_transpose_to_sink gives, window after window, exactly the copy that
 * iv_dataset_build_other builds (pointers, values, stream byte for byte),
 * whatever the cut: one window, windows of a few entries, 8-byte
 * entries, no pool; on awkward shapes.  The dataset's own other
 * orientation is left alone, and a sink's error stops the transpose
 * with that error.
 */
START_TEST(sink_windows_equal_copy)
{
    iv_pool_t *pool = iv_pool_create(2, 0);
    int reuses = 0;
    char path[256];
    tmp_path(path, sizeof path, "sink");
    static const struct {
        int64_t nr, nc;
        double dens;
    } shapes[] = {{0, 17, 0.5}, {23, 0, 0.5}, {1, 77, 0.5}, {61, 1, 0.6}, {90, 80, 0.2}, {40, 50, 0.97}};
    static const iv_transpose_opts_t cuts[] = {
        {0}, {.tmp_bytes = 64}, {.tmp_bytes = 300, .wide_entries = 1}, {.tmp_bytes = 1000, .block_slices = 2},
        {.tmp_bytes = 64, .resume = 1}, {.tmp_bytes = 300, .wide_entries = 1, .resume = 2},
    };
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        for (int csc = 0; csc < 2; csc++) {
            struct mat m;
            mat_random(&m, shapes[sh].nr, shapes[sh].nc, dtypes[(sh + (size_t)csc) % 4], shapes[sh].dens);
            write_packed(path, &m, csc, -1, sh % 2 ? 5 : 0);
            iv_err_t err = {0};
            iv_dataset_t *ds = open_ds(path, pool);
            iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
            ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "shape %zu: %s", sh, err.msg);
            struct snap ref;
            snap_take(ds, &ref);
            iv_dataset_close(ds);
            for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
                ds = open_ds(path, pool);
                iv_transpose_opts_t o = cuts[k];
                o.pool = k % 2 ? NULL : pool;
                int resumed = 0, replica = 0, reused = 0;
                o.resumed_fills = &resumed;
                o.replica_dir = k % 3 ? "/tmp" : NULL;
                o.replica_made = &replica;
                /* The source's plain copy as the replica (cut 4, resumed),
                 * or a path that names none (cut 3). */
                char plain[300];
                snprintf(plain, sizeof plain, "%s.plain", path);
                if (k == 4) write_plain(ds, plain);
                o.replica_from = k == 4 ? plain : k == 3 ? "/nonexistent/x.plain" : NULL;
                o.replica_reused = &reused;
                struct gather g;
                gather_init(&g, ds, 0);
                iv_transpose_sink_t sink = {.window = gather_window, .ctx = &g};
                ck_assert_msg(iv_transpose_to_sink(ds, &o, &sink, &err) == 0, "shape %zu cut %zu: %s", sh, k,
                              err.msg);
                ck_assert_int_eq(g.next_g, ref.n_major);
                ck_assert_uint_eq(g.last_done, (uint64_t)m.nnz);
                if (k == 1 && m.nnz > 40) ck_assert_int_gt(g.windows, 2);
                /* Every window after the first one that fills resumes. */
                if (o.resume > 0 && g.windows >= 3) ck_assert_int_ge(resumed, 1);
                if (o.resume < 0) ck_assert_int_eq(resumed, 0);
                /* The resumed windows of a compressed source read its
                 * replica: its plain copy when given one, else one made. */
                if (reused) ck_assert(k == 4 && sh % 2);
                if (k == 4 && resumed > 0 && sh % 2) ck_assert_int_eq(reused, 1);
                if (o.replica_dir && resumed > 0 && sh % 2 && !reused) ck_assert_int_eq(replica, 1);
                if (!o.replica_dir || sh % 2 == 0 || reused) ck_assert_int_eq(replica, 0);
                reuses += reused;
                ck_assert_msg(!replica_left("/tmp"), "a replica file was left behind");
                unlink(plain);
                g.s.n_unique = (int64_t)g.groups;
                g.s.values_len = (size_t)g.groups * g.vsz;
                g.s.stream_len = g.bytes;
                EXPECT(snap_equal(&ref, &g.s), "shape %zu csc %d cut %zu: the sink's copy differs", sh, csc, k);
                ck_assert_ptr_null(iv_dataset_other(ds));
                snap_free(&g.s);
                iv_dataset_close(ds);
            }
            if (m.nnz > 40) {
                /* The sink refuses the second window: that error, nothing kept. */
                ds = open_ds(path, pool);
                struct gather g;
                gather_init(&g, ds, 2);
                iv_transpose_sink_t sink = {.window = gather_window, .ctx = &g};
                iv_transpose_opts_t o = {.tmp_bytes = 64, .pool = pool};
                ck_assert_int_eq(iv_transpose_to_sink(ds, &o, &sink, &err), IV_EIO);
                ck_assert_msg(strstr(err.msg, "sink refused window 2"), "%s", err.msg);
                snap_free(&g.s);
                iv_dataset_close(ds);
            }
            snap_free(&ref);
            mat_free(&m);
        }
    }
    unlink(path);
    iv_pool_destroy(pool);
    ck_assert_int_gt(reuses, 0);
}
END_TEST

/* The planner picks the orientation that decodes fewer bytes. */
START_TEST(planner_picks_fewer_bytes)
{
    char path[256];
    tmp_path(path, sizeof path, "plan");
    struct mat m;
    mat_random(&m, 400, 300, IV_DT_FLOAT32, 0.2);
    write_packed(path, &m, 0, -1, 0);
    iv_dataset_t *ds = open_ds(path, NULL);
    iv_err_t err = {0};
    int64_t one = 5;
    iv_sel_t all = {.all = 1}, single = {.n = 1, .idx = &one};
    /* Before the copy exists, everything is cell-major; asking for the
     * gene-major one is an error. */
    ck_assert_int_eq(iv_plan_orient(ds, &all, &single, IV_OUT_ROWS, NULL), IV_IVCSR);
    iv_query_t *q;
    iv_query_opts_t qo = {.pick = IV_PICK_GENES};
    ck_assert_int_eq(iv_query_new(ds, &all, &single, &qo, &q, &err), IV_EINVALID_ARG);
    iv_transpose_opts_t to = {.budget = UINT64_MAX};
    ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "%s", err.msg);
    double est[2];
    /* One gene across all cells: gene-major.  One cell across all genes:
     * cell-major. */
    ck_assert_int_eq(iv_plan_orient(ds, &all, &single, IV_OUT_ROWS, est), IV_IVCSC);
    ck_assert(est[IV_IVCSC] < est[IV_IVCSR]);
    ck_assert_int_eq(iv_plan_orient(ds, &single, &all, IV_OUT_ROWS, est), IV_IVCSR);
    ck_assert(est[IV_IVCSR] < est[IV_IVCSC]);
    ck_assert_int_eq(iv_plan_orient(ds, &all, &single, IV_OUT_VARS, NULL), IV_IVCSC);
    /* Major-slice output keeps the file's orientation unless forced. */
    iv_query_opts_t qm = {.axis = IV_OUT_MAJOR};
    ck_assert_int_eq(iv_query_new(ds, &all, &single, &qm, &q, &err), 0);
    ck_assert_int_eq(iv_query_orient(q), IV_IVCSR);
    ck_assert_int_eq(iv_query_by_var(q), 0);
    iv_query_free(q);
    qm.pick = IV_PICK_GENES;
    ck_assert_int_eq(iv_query_new(ds, &all, &single, &qm, &q, &err), 0);
    ck_assert_int_eq(iv_query_orient(q), IV_IVCSC);
    ck_assert_int_eq(iv_query_by_var(q), 1);
    ck_assert_int_eq(iv_query_n_rows(q), 1);
    iv_query_free(q);
    iv_dataset_close(ds);
    mat_free(&m);
    unlink(path);
}
END_TEST

/* Over budget: skipped, nothing kept, the global budget unchanged; a
 * budget that fits is charged the copy's size. */
START_TEST(budget_skips)
{
    char path[256];
    tmp_path(path, sizeof path, "budget");
    struct mat m;
    mat_random(&m, 200, 150, IV_DT_UINT16, 0.3);
    write_packed(path, &m, 0, -1, 0);
    iv_dataset_t *ds = open_ds(path, NULL);
    iv_err_t err = {0};
    iv_transpose_opts_t to = {.budget = 100};
    ck_assert_int_eq(iv_dataset_build_other(ds, &to, &err), IV_ETOO_LARGE);
    ck_assert_ptr_null(iv_dataset_other(ds));
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    ck_assert_int_eq(st.other_state, IV_OTHER_SKIPPED);
    ck_assert_int_eq(st.bytes[IV_IVCSC], 0);
    iv_budget_t g;
    iv_budget_init(&g, 1000);
    to.budget = UINT64_MAX;
    to.global = &g;
    ck_assert_int_eq(iv_dataset_build_other(ds, &to, &err), IV_ETOO_LARGE);
    ck_assert_uint_eq(atomic_load(&g.left), 1000);
    iv_budget_init(&g, (uint64_t)1 << 30);
    ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "%s", err.msg);
    iv_dataset_orientations(ds, &st);
    ck_assert_int_eq(st.other_state, IV_OTHER_READY);
    ck_assert_uint_eq(((uint64_t)1 << 30) - atomic_load(&g.left), st.bytes[IV_IVCSC]);
    /* Closing the dataset (a reload dropping it) gives the copy's share
     * back to the global budget. */
    iv_dataset_close(ds);
    ck_assert_uint_eq(atomic_load(&g.left), (uint64_t)1 << 30);
    mat_free(&m);
    unlink(path);
}
END_TEST

/* A slice that stores an index twice (in two groups) no longer passes the
 * row index: the open refuses it, naming the slice, so the transpose (and
 * the queries, which answered 500) never see one from a file; their own
 * checks stay as a second line. */
START_TEST(duplicate_index_is_corrupt)
{
    char path[256];
    tmp_path(path, sizeof path, "dup");
    struct mat m;
    mat_random(&m, 30, 40, IV_DT_FLOAT32, 0.5);
    write_packed(path, &m, 0, 3, 0);
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_stride = (uint32_t)(1 + rnd() % 5);
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_dataset_open(path, &o, &ds, &err), IV_EBAD_FILE);
    ck_assert_msg(strstr(err.msg, "slice 3 stores minor index") != NULL, "%s", err.msg);
    ck_assert_ptr_null(ds);
    mat_free(&m);
    unlink(path);
}
END_TEST

/* The dense decode's bitmaps are kept between queries (query.c's
 * scratch): a query whose slice fails half-way (a chunk that changed on
 * disk, met mid-slice) must give its scratch back cleared, so that the
 * next query of the same width, on another file, is still exact; a bound
 * of 0 keeps none. */
START_TEST(kept_scratch_survives_a_failed_slice)
{
    char pa[256], pb[256];
    tmp_path(pa, sizeof pa, "scra");
    tmp_path(pb, sizeof pb, "scrb");
    struct mat a, b;
    mat_random(&a, 30, 100, IV_DT_FLOAT32, 0.5);
    mat_random(&b, 30, 100, IV_DT_FLOAT32, 0.5);
    /* 7-byte chunks: a slice (about 50 one-byte deltas) spans several. */
    write_packed(pa, &a, 0, -1, 7);
    write_packed(pb, &b, 0, -1, 7);
    iv_query_set_scratch_keep((size_t)64 << 20);
    iv_dataset_t *da = open_ds(pa, NULL), *db = open_ds(pb, NULL);
    iv_sel_t all = {.all = 1};
    struct res r;
    iv_err_t err = {0};
    ck_assert_msg(run(da, NULL, &all, &all, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err) == 0, "%s", err.msg);
    check_ref(&a, &all, &all, 0, &r, "a before");
    res_free(&r);
    ck_assert_uint_gt(iv_query_scratch_kept(), 0);

    /* The last chunk's bytes change on disk, the file's size and time put
     * back, so that only the chunk's checksum sees it; the last slice
     * starts in an earlier chunk, so its decode fails half-way. */
    struct stat st0;
    ck_assert_int_eq(stat(pa, &st0), 0);
    hid_t f = H5Fopen(pa, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "X/packed_indices", H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    uint8_t *pk = malloc((size_t)n);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pk), 0);
    /* Slice 29's first byte: after the terminators of the entries before it. */
    int64_t before = da->m.value_ptr[da->m.major_ptr[29]], last_start = 0;
    for (int64_t seen = 0; last_start < n && seen < before; last_start++)
        if (!(pk[last_start] & 0x80)) seen++;
    ck_assert_msg(last_start / 7 < (n - 1) / 7, "slice 29 starts in the last chunk");
    pk[n - 1] ^= 0x01;
    ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pk), 0);
    free(pk);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
    struct timespec times[2] = {st0.st_atim, st0.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, pa, times, 0), 0);
    iv_dataset_cache_drop(da);
    ck_assert_int_eq(run(da, NULL, &all, &all, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err), -1);
    ck_assert_int_eq(err.code, IV_EFILE_CHANGED);
    iv_err_clear(&err);
    res_free(&r);
    /* The same with an ascending selection of columns (decode_slice_ranked,
     * its bitmaps as wide as the selection). */
    int64_t even[50];
    for (int k = 0; k < 50; k++) even[k] = 2 * k;
    iv_sel_t half = {.n = 50, .idx = even};
    ck_assert_int_eq(run(da, NULL, &all, &half, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err), -1);
    ck_assert_int_eq(err.code, IV_EFILE_CHANGED);
    iv_err_clear(&err);
    res_free(&r);

    /* The same width on the other file takes the kept scratch. */
    ck_assert_msg(run(db, NULL, &all, &all, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err) == 0, "%s", err.msg);
    check_ref(&b, &all, &all, 0, &r, "b after a failed slice");
    res_free(&r);
    ck_assert_msg(run(db, NULL, &all, &half, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err) == 0, "%s", err.msg);
    check_ref(&b, &all, &half, 0, &r, "b's even columns after a failed slice");
    res_free(&r);

    iv_query_set_scratch_keep(0);
    ck_assert_msg(run(db, NULL, &all, &all, IV_OUT_ROWS, IV_PICK_CELLS, 0, &r, &err) == 0, "%s", err.msg);
    check_ref(&b, &all, &all, 0, &r, "b, none kept");
    res_free(&r);
    ck_assert_uint_eq(iv_query_scratch_kept(), 0);
    iv_query_set_scratch_keep((size_t)64 << 20);
    iv_dataset_close(da);
    iv_dataset_close(db);
    mat_free(&a);
    mat_free(&b);
    unlink(pa);
    unlink(pb);
}
END_TEST

/* A companion file: the same matrix the other way attaches and serves
 * identical answers; a different matrix is refused with a reason. */
START_TEST(companion_file)
{
    char p1[256], p2[256], p3[256];
    tmp_path(p1, sizeof p1, "c1");
    tmp_path(p2, sizeof p2, "c2");
    tmp_path(p3, sizeof p3, "c3");
    struct mat m, other;
    mat_random(&m, 70, 60, IV_DT_FLOAT32, 0.3);
    mat_random(&other, 70, 60, IV_DT_FLOAT32, 0.3);
    write_packed(p1, &m, 0, -1, 0);
    write_packed(p2, &m, 1, -1, 5);
    write_packed(p3, &other, 1, -1, 0);
    iv_dataset_t *ds = open_ds(p1, NULL);
    iv_err_t err = {0};
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    ck_assert_int_eq(iv_dataset_attach_other(ds, p1, &o, &err), IV_EBAD_FILE);
    ck_assert_msg(strstr(err.msg, "same orientation") != NULL, "%s", err.msg);
    ck_assert_int_eq(iv_dataset_attach_other(ds, p3, &o, &err), IV_EBAD_FILE);
    ck_assert_ptr_null(iv_dataset_other(ds));
    ck_assert_msg(iv_dataset_attach_other(ds, p2, &o, &err) == 0, "%s", err.msg);
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    ck_assert_int_eq(st.other_source, IV_SRC_FILE);
    struct sel so, sv;
    for (int k = 0; k < 20; k++) {
        make_sel(&so, (int)(rnd() % 6), m.n_rows);
        make_sel(&sv, (int)(rnd() % 6), m.n_cols);
        struct res a, b;
        ck_assert(run(ds, NULL, &so.s, &sv.s, IV_OUT_ROWS, IV_PICK_CELLS, 0, &a, &err) == 0);
        ck_assert(run(ds, NULL, &so.s, &sv.s, IV_OUT_ROWS, IV_PICK_GENES, 0, &b, &err) == 0);
        check_ref(&m, &so.s, &sv.s, 0, &a, "companion");
        ck_assert(res_equal(&a, &b));
        res_free(&a);
        res_free(&b);
        free(so.idx);
        free(sv.idx);
    }
    iv_dataset_close(ds);
    mat_free(&m);
    mat_free(&other);
    unlink(p1);
    unlink(p2);
    unlink(p3);
}
END_TEST

/*
 * One element listed many times, on either axis, through either
 * orientation: the answer equals the matrix, every block stays near the
 * block size (a direct decode's rows are planned from the repeats), and a
 * transpose holds the distinct sub-matrix once, so a bound of a few
 * hundred kilobytes serves 20,000 repeats of one gene by cell.  A bound
 * below the distinct sub-matrix is IV_ETOO_LARGE before any block.
 */
START_TEST(duplicates_held_once)
{
    iv_pool_t *pool = iv_pool_create(2, 0);
    char path[256];
    tmp_path(path, sizeof path, "dups");
    struct mat m;
    mat_random(&m, 300, 80, IV_DT_FLOAT32, 0.3);
    write_packed(path, &m, 0, -1, 0);
    iv_dataset_t *ds = open_ds(path, pool);
    iv_err_t err = {0};
    iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
    ck_assert_msg(iv_dataset_build_other(ds, &to, &err) == 0, "%s", err.msg);
    /* The ThreadSanitizer build repeats the two ids 5,000 times, still
     * dozens of blocks on every axis and pick: at 20,000 this test took
     * 37 s of the file's 108 s of CPU there, at 5,000 it takes 7 s. */
#if defined(__SANITIZE_THREAD__)
    enum { REP = 5000 };
#else
    enum { REP = 20000 };
#endif
    int64_t *rep = malloc(REP * sizeof *rep);
    for (int64_t k = 0; k < REP; k++) rep[k] = k % 97 == 0 ? 5 : 3;   /* two ids, interleaved */
    iv_sel_t all = {.all = 1}, many = {.n = REP, .idx = rep};
    for (int ax = 0; ax < 2; ax++)
        for (int side = 0; side < 2; side++) {
            const iv_sel_t *obs = side ? &many : &all, *var = side ? &all : &many;
            char label[64];
            snprintf(label, sizeof label, "repeats on %s, axis %d", side ? "obs" : "var", ax);
            check_orientations(ds, pool, &m, obs, var, ax, 512, label);
            /* Blocks of both orientations: none far past the block size. */
            for (int pk = IV_PICK_CELLS; pk <= IV_PICK_GENES; pk++) {
                iv_query_t *q;
                iv_query_opts_t qo = {.axis = ax ? IV_OUT_VARS : IV_OUT_ROWS, .pick = (iv_pick_t)pk,
                                      .block_nnz = 4096, .max_work_bytes = 256 << 10};
                ck_assert_msg(iv_query_new(ds, obs, var, &qo, &q, &err) == 0, "%s", err.msg);
                ck_assert_msg(iv_query_prepare(q, pool, &err) == 0, "%s: %s", label, err.msg);
                int64_t widest = iv_query_n_cols(q), total = 0;
                for (int64_t b = 0; b < iv_query_n_blocks(q); b++) {
                    iv_block_t blk;
                    ck_assert_msg(iv_query_decode_block(q, b, &blk, &err) == 0, "%s", err.msg);
                    EXPECT(blk.nnz <= 4096 + widest, "%s, pick %d: block %ld holds %ld entries", label,
                           pk, (long)b, (long)blk.nnz);
                    total += blk.nnz;
                    iv_block_free(&blk);
                }
                EXPECT(total == iv_query_nnz_hint(q) || iv_query_nnz_hint(q) < 0,
                       "%s, pick %d: %ld entries, hint %ld", label, pk, (long)total,
                       (long)iv_query_nnz_hint(q));
                iv_query_free(q);
            }
        }
    /* Every distinct gene by cell through the gene-major copy needs more
     * than 16 KB: refused, naming the bound. */
    iv_query_t *q;
    iv_query_opts_t tight = {.axis = IV_OUT_ROWS, .pick = IV_PICK_GENES, .max_work_bytes = 16 << 10};
    ck_assert_msg(iv_query_new(ds, &all, &all, &tight, &q, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(iv_query_prepare(q, pool, &err), IV_ETOO_LARGE);
    ck_assert_msg(strstr(err.msg, "max_answer_bytes") != NULL, "%s", err.msg);
    iv_query_free(q);
    free(rep);
    iv_dataset_close(ds);
    mat_free(&m);
    unlink(path);
    iv_pool_destroy(pool);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("transpose");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, differential_random);
    tcase_add_test(tc, long_slices_all_varint_lengths);
    tcase_add_test(tc, every_cut_same_copy);
    tcase_add_test(tc, sink_windows_equal_copy);
    tcase_add_test(tc, planner_picks_fewer_bytes);
    tcase_add_test(tc, budget_skips);
    tcase_add_test(tc, duplicate_index_is_corrupt);
    tcase_add_test(tc, kept_scratch_survives_a_failed_slice);
    tcase_add_test(tc, companion_file);
    tcase_add_test(tc, duplicates_held_once);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
