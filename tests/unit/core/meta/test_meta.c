/*
 * Tests of core/meta/meta.c: obs/var of every fixture, compressed and plain,
 * names lookups, computed columns against the expected CSR matrices.
 *
 * The executable has a second mode used by tests/python/test_meta.py:
 * `test_meta --dump FILE [XGROUP]` prints every column of FILE as JSON
 * (one object per line), which the Python side compares with what
 * anndata reads, column by column, nulls included; `test_meta --validate
 * FILE [XGROUP]` prints iv_meta_validate_file's verdict ("ok" or the
 * error code, the message on stderr).
 */
#include <check.h>

#include "check_main.h"
#include <cjson/cJSON.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "meta.h"

static const char *fixtures(void)
{
    static char dir[1024];
    const char *env = getenv("IV_FIXTURES");
    snprintf(dir, sizeof dir, "%s", env ? env : IV_FIXTURES);
    return dir;
}

static int have_fixtures(void)
{
    struct stat st;
    char p[1100];
    snprintf(p, sizeof p, "%s/manifest.json", fixtures());
    return stat(p, &st) == 0;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    return b;
}

/* Every (file, expected_meta) pair of both manifests. */
typedef struct pair {
    char file[1100], meta[1100];
} pair_t;

static int manifest_pairs(pair_t *out, int cap)
{
    const char *subs[] = {"", "/real"};
    int n = 0;
    for (int s = 0; s < 2; s++) {
        char p[1200];
        snprintf(p, sizeof p, "%s%s/manifest.json", fixtures(), subs[s]);
        char *txt = slurp(p);
        if (!txt) continue;
        cJSON *j = cJSON_Parse(txt);
        free(txt);
        cJSON *e;
        cJSON_ArrayForEach(e, j)
        {
            cJSON *f = cJSON_GetObjectItem(e, "file"), *m = cJSON_GetObjectItem(e, "expected_meta");
            if (!cJSON_IsString(f) || !cJSON_IsString(m) || n >= cap) continue;
            snprintf(out[n].file, sizeof out[n].file, "%s%s/%s", fixtures(), subs[s],
                     f->valuestring);
            snprintf(out[n].meta, sizeof out[n].meta, "%s%s/%s", fixtures(), subs[s],
                     m->valuestring);
            n++;
        }
        cJSON_Delete(j);
    }
    return n;
}

/* Asserts two columns hold the same values and missing flags. */
static void assert_col_equal(const iv_meta_col_t *a, const iv_meta_col_t *b, const char *ctx)
{
    ck_assert_msg(strcmp(a->name, b->name) == 0, "%s: %s vs %s", ctx, a->name, b->name);
    ck_assert_msg(a->type == b->type, "%s/%s: types differ", ctx, a->name);
    ck_assert_int_eq(a->n, b->n);
    ck_assert_int_eq(a->null_count, b->null_count);
    for (int64_t i = 0; i < a->n; i++) {
        int ma = a->mask ? a->mask[i] : 0, mb = b->mask ? b->mask[i] : 0;
        ck_assert_msg(ma == mb, "%s/%s row %lld: missing flag differs", ctx, a->name,
                      (long long)i);
        if (ma) continue;
        switch (a->type) {
        case IV_COL_INT: ck_assert_int_eq(a->i64[i], b->i64[i]); break;
        case IV_COL_FLOAT: ck_assert_msg(a->f64[i] == b->f64[i], "%s/%s row %lld", ctx,
                                         a->name, (long long)i); break;
        case IV_COL_BOOL: ck_assert_int_eq(a->b[i], b->b[i]); break;
        case IV_COL_STRING: ck_assert_str_eq(iv_meta_col_str(a, i), iv_meta_col_str(b, i)); break;
        case IV_COL_CATEGORICAL: ck_assert_int_eq(a->codes[i], b->codes[i]); break;
        }
    }
    if (a->type == IV_COL_CATEGORICAL) {
        ck_assert_int_eq(a->n_cats, b->n_cats);
        for (int64_t k = 0; k < a->n_cats; k++) {
            ck_assert_str_eq(iv_meta_col_cat(a, k), iv_meta_col_cat(b, k));
            ck_assert_int_eq(a->cat_counts[k], b->cat_counts[k]);
        }
    }
}

/* The compressed fixture reads exactly like its uncompressed copy. */
START_TEST(test_fixtures_compressed_equal_plain)
{
    if (!have_fixtures()) {
        printf("test_meta: fixtures folder %s absent, skipping\n", fixtures());
        return;
    }
    pair_t pairs[32];
    int np = manifest_pairs(pairs, 32);
    ck_assert_int_ge(np, 10);
    for (int p = 0; p < np; p++) {
        iv_err_t e1 = {0}, e2 = {0};
        iv_meta_t *a = NULL, *b = NULL;
        int rc = iv_meta_load(pairs[p].file, NULL, &a, &e1);
        ck_assert_msg(rc == 0, "%s: %s", pairs[p].file, e1.msg);
        rc = iv_meta_load(pairs[p].meta, NULL, &b, &e2);
        ck_assert_msg(rc == 0, "%s: %s", pairs[p].meta, e2.msg);
        for (int ax = 0; ax < 2; ax++) {
            ck_assert_int_eq(iv_meta_n_rows(a, ax), iv_meta_n_rows(b, ax));
            ck_assert_uint_eq(iv_meta_n_cols(a, ax), iv_meta_n_cols(b, ax));
            ck_assert_uint_gt(iv_meta_n_cols(a, ax), 0);
            assert_col_equal(iv_meta_index(a, ax), iv_meta_index(b, ax), pairs[p].file);
            for (size_t c = 0; c < iv_meta_n_cols(a, ax); c++)
                assert_col_equal(iv_meta_col(a, ax, c), iv_meta_col(b, ax, c), pairs[p].file);
        }
        iv_meta_free(a);
        iv_meta_free(b);
    }
}
END_TEST

static const char *fx(const char *name)
{
    static char p[1200];
    snprintf(p, sizeof p, "%s/%s", fixtures(), name);
    return p;
}

/* Column order, types and encodings of the tiny fixture, as its writer
 * made them (see the fixture manifest and h5py's view of the file). */
START_TEST(test_tiny_columns)
{
    if (!have_fixtures()) return;
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_msg(iv_meta_load(fx("tiny.ivcsr.blosc2-lz4.h5ad"), NULL, &m, &e) == 0, "%s", e.msg);
    const char *names[] = {"sample", "cell_type", "condition", "n_counts_reported",
                           "age", "is_doublet", "batch", "note"};
    iv_col_type_t types[] = {IV_COL_CATEGORICAL, IV_COL_CATEGORICAL, IV_COL_CATEGORICAL,
                             IV_COL_FLOAT, IV_COL_INT, IV_COL_BOOL, IV_COL_INT, IV_COL_STRING};
    ck_assert_int_eq(iv_meta_n_rows(m, IV_AXIS_OBS), 60);
    ck_assert_int_eq(iv_meta_n_rows(m, IV_AXIS_VAR), 50);
    ck_assert_uint_eq(iv_meta_n_cols(m, IV_AXIS_OBS), 8);
    for (size_t i = 0; i < 8; i++) {
        const iv_meta_col_t *c = iv_meta_col(m, IV_AXIS_OBS, i);
        ck_assert_str_eq(c->name, names[i]);
        ck_assert_int_eq(c->type, types[i]);
        ck_assert_ptr_eq(iv_meta_find_col(m, IV_AXIS_OBS, names[i]), c);
    }
    const iv_meta_col_t *batch = iv_meta_find_col(m, IV_AXIS_OBS, "batch");
    ck_assert_str_eq(batch->encoding, "nullable-integer");
    ck_assert_int_gt(batch->null_count, 0);
    const iv_meta_col_t *ct = iv_meta_find_col(m, IV_AXIS_OBS, "cell_type");
    ck_assert_int_eq(ct->n_cats, 8);
    int64_t tot = 0;
    for (int64_t k = 0; k < ct->n_cats; k++) tot += ct->cat_counts[k];
    ck_assert_int_eq(tot + ct->null_count, 60);
    ck_assert_ptr_null(iv_meta_find_col(m, IV_AXIS_OBS, "nope"));
    ck_assert_ptr_nonnull(iv_meta_find_col(m, IV_AXIS_VAR, "gene_ids"));
    iv_meta_stats_t st;
    iv_meta_stats(m, &st);
    ck_assert_uint_gt(st.bytes, 60 * 8);
    iv_meta_free(m);

    /* A file that is not HDF5 is a clear error. */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_meta_load(fx("manifest.json"), NULL, &m, &e), IV_EIO);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(e.msg, "manifest.json"));
}
END_TEST

START_TEST(test_names_lookup)
{
    if (!have_fixtures()) return;
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_msg(iv_meta_load(fx("wide.ivcsr.zstd.h5ad"), NULL, &m, &e) == 0, "%s", e.msg);
    const iv_meta_col_t *gi = iv_meta_index(m, IV_AXIS_VAR);
    const iv_meta_col_t *ids = iv_meta_find_col(m, IV_AXIS_VAR, "gene_ids");
    ck_assert_int_eq(gi->n, 20000);
    /* Every gene name finds its own row (names are unique in the fixture). */
    int64_t n = gi->n;
    const char **nm = malloc((size_t)n * sizeof(char *));
    int64_t *idx = malloc((size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) nm[i] = iv_meta_col_str(gi, n - 1 - i);
    iv_names_report_t rep;
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_VAR, NULL, nm, n, 0, idx, &rep, &e), 0);
    for (int64_t i = 0; i < n; i++) ck_assert_int_eq(idx[i], n - 1 - i);
    ck_assert_int_eq(rep.n_found, n);
    ck_assert_int_eq(rep.n_missing, 0);
    iv_names_report_free(&rep);

    /* By another column. */
    for (int64_t i = 0; i < 100; i++) nm[i] = iv_meta_col_str(ids, i * 7);
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_VAR, "gene_ids", nm, 100, 0, idx, NULL, &e), 0);
    for (int64_t i = 0; i < 100; i++) ck_assert_int_eq(idx[i], i * 7);

    /* Case-insensitive fallback is reported; unknown names are listed. */
    char low[256], up[256];
    snprintf(low, sizeof low, "%s", iv_meta_col_str(gi, 5));
    for (char *p = low; *p; p++) *p = (char)((*p >= 'A' && *p <= 'Z') ? *p + 32 : *p);
    snprintf(up, sizeof up, "%s", iv_meta_col_str(gi, 5));
    for (char *p = up; *p; p++) *p = (char)((*p >= 'a' && *p <= 'z') ? *p - 32 : *p);
    const char *q[] = {"NO_SUCH_GENE", low, iv_meta_col_str(gi, 9), "ALSO_NOT", up};
    iv_err_clear(&e);
    int rc = iv_meta_find_names(m, IV_AXIS_VAR, NULL, q, 5, 0, idx, &rep, &e);
    ck_assert_int_eq(rc, IV_EUNKNOWN_NAME);
    ck_assert_ptr_nonnull(strstr(e.msg, "'NO_SUCH_GENE'"));
    ck_assert_ptr_nonnull(strstr(e.msg, "'ALSO_NOT'"));
    ck_assert_ptr_nonnull(strstr(e.msg, "2 of 5"));
    ck_assert_int_eq(idx[0], -1);
    ck_assert_int_eq(idx[2], 9);
    ck_assert_int_eq(idx[3], -1);
    ck_assert_int_eq(rep.n_missing, 2);
    ck_assert_int_eq(rep.missing[0], 0);
    ck_assert_int_eq(rep.missing[1], 3);
    if (strcmp(low, iv_meta_col_str(gi, 5)) != 0) {
        ck_assert_int_eq(idx[1], 5);
        ck_assert_int_ge(rep.n_folded, 1);
        ck_assert_int_eq(rep.folded[0], 1);
    }
    ck_assert_int_eq(idx[4], 5);
    iv_names_report_free(&rep);
    /* missing = ignore */
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_VAR, NULL, q, 5, 1, idx, &rep, &e), 0);
    ck_assert_int_eq(rep.n_found, 3);
    iv_names_report_free(&rep);
    /* A bad `by` column. */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_VAR, "mean_counts", q, 1, 0, idx, NULL, &e),
                     IV_EBAD_SELECTION);
    ck_assert_ptr_nonnull(strstr(e.msg, "mean_counts"));
    iv_err_clear(&e);
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_VAR, "nope", q, 1, 0, idx, NULL, &e),
                     IV_EBAD_SELECTION);
    /* Obs names by a categorical column: the first row of that category. */
    const iv_meta_col_t *ct = iv_meta_find_col(m, IV_AXIS_OBS, "cell_type");
    const char *cq[] = {iv_meta_col_cat(ct, 0)};
    ck_assert_int_eq(iv_meta_find_names(m, IV_AXIS_OBS, "cell_type", cq, 1, 0, idx, NULL, &e), 0);
    int64_t first = -1;
    for (int64_t i = 0; i < ct->n && first < 0; i++)
        if (ct->codes[i] == 0) first = i;
    ck_assert_int_eq(idx[0], first);
    free(nm);
    free(idx);
    iv_meta_free(m);
}
END_TEST

/* Reads a 1-D dataset of a plain HDF5 file as int64 or double. */
static void *read_ds(hid_t f, const char *name, hid_t mt, size_t es, int64_t *n)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hid_t s = H5Dget_space(d);
    *n = H5Sget_simple_extent_npoints(s);
    void *b = malloc((size_t)(*n ? *n : 1) * es);
    ck_assert_int_ge(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, b), 0);
    H5Sclose(s);
    H5Dclose(d);
    return b;
}

/* Computed columns from the file's own pointer arrays agree with sums,
 * counts and maxima of the expected canonical CSR matrix. */
static void check_computed(const char *file, const char *csr, int ivcsc)
{
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_msg(iv_meta_load(file, NULL, &m, &e) == 0, "%s", e.msg);
    /* The load reads in a child process; this one reads the file itself
     * and needs the project's filters registered here too. */
    ck_assert_int_eq(iv_h5filters_register(), 0);
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    int64_t n_mp, n_vp, n_v, n_ip, n_d, n_ix;
    int64_t *mp = read_ds(f, "X/major_ptr", H5T_NATIVE_INT64, 8, &n_mp);
    int64_t *vp = read_ds(f, "X/value_ptr", H5T_NATIVE_INT64, 8, &n_vp);
    double *v = read_ds(f, "X/values", H5T_NATIVE_DOUBLE, 8, &n_v);
    H5Fclose(f);
    hid_t g = H5Fopen(csr, H5F_ACC_RDONLY, H5P_DEFAULT);
    int64_t *ip = read_ds(g, "indptr", H5T_NATIVE_INT64, 8, &n_ip);
    int64_t *ix = read_ds(g, "indices", H5T_NATIVE_INT64, 8, &n_ix);
    double *d = read_ds(g, "data", H5T_NATIVE_DOUBLE, 8, &n_d);
    H5Fclose(g);
    int64_t n_rows = iv_meta_n_rows(m, IV_AXIS_OBS), n_cols = iv_meta_n_rows(m, IV_AXIS_VAR);
    int64_t n_major = ivcsc ? n_cols : n_rows, n_minor = ivcsc ? n_rows : n_cols;
    /* Values are passed as float64 here; the dtype path is the same code. */
    ck_assert_int_eq(iv_meta_add_computed_arrays(m, ivcsc ? IV_IVCSC : IV_IVCSR, n_major,
                                                 n_minor, mp, vp, n_v, v, IV_DT_FLOAT64, &e),
                     0);
    /* Reference per major slice from the canonical CSR. */
    double *tot = calloc((size_t)n_major, 8), *mx = calloc((size_t)n_major, 8);
    int64_t *cnt = calloc((size_t)n_major, 8);
    for (int64_t i = 0; i < n_major; i++) mx[i] = -INFINITY;
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t k = ip[r]; k < ip[r + 1]; k++) {
            int64_t j = ivcsc ? ix[k] : r;
            tot[j] += d[k];
            cnt[j]++;
            if (d[k] > mx[j]) mx[j] = d[k];
        }
    }
    iv_axis_t ax = ivcsc ? IV_AXIS_VAR : IV_AXIS_OBS;
    const iv_meta_col_t *ct = iv_meta_find_col(m, ax, "total_counts");
    const iv_meta_col_t *cn = iv_meta_find_col(m, ax, ivcsc ? "n_cells" : "n_genes");
    const iv_meta_col_t *cm = iv_meta_find_col(m, ax, "max_count");
    ck_assert(ct && cn && cm && ct->computed);
    for (int64_t i = 0; i < n_major; i++) {
        if (cnt[i] < n_minor && mx[i] < 0) mx[i] = 0;
        ck_assert_int_eq(cn->i64[i], cnt[i]);
        ck_assert_msg(fabs(ct->f64[i] - tot[i]) <= 1e-6 * (1 + fabs(tot[i])),
                      "%s slice %lld: total %g vs %g", file, (long long)i, ct->f64[i], tot[i]);
        ck_assert_msg(cm->f64[i] == mx[i], "%s slice %lld: max %g vs %g", file, (long long)i,
                      cm->f64[i], mx[i]);
    }
    free(tot), free(mx), free(cnt), free(mp), free(vp), free(v), free(ip), free(ix), free(d);
    iv_meta_free(m);
}

START_TEST(test_computed_columns)
{
    if (!have_fixtures()) return;
    char csr[1200];
    snprintf(csr, sizeof csr, "%s/expected/tiny.csr.h5", fixtures());
    check_computed(fx("tiny.ivcsr.raw.h5ad"), csr, 0);
    check_computed(fx("tiny.ivcsc.blosc2-lz4.h5ad"), csr, 1);
    snprintf(csr, sizeof csr, "%s/expected/floaty.csr.h5", fixtures());
    check_computed(fx("floaty.ivcsr.gzip.h5ad"), csr, 0);
    snprintf(csr, sizeof csr, "%s/expected/chunky.csr.h5", fixtures());
    check_computed(fx("chunky.ivcsc.blosc2-lz4.h5ad"), csr, 1);
}
END_TEST

/* Integer values keep integer computed columns; a name clash is
 * prefixed; a pointer array that goes backwards is refused. */
START_TEST(test_computed_int_and_errors)
{
    if (!have_fixtures()) return;
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_int_eq(iv_meta_load(fx("tiny.ivcsr.raw.h5ad"), NULL, &m, &e), 0);
    /* 60 cells over 50 genes: cell 0 has groups {3 x2, -1 x1}, the rest empty. */
    int64_t mp[61], vp[3] = {0, 2, 3};
    int32_t vals[2] = {3, -1};
    mp[0] = 0;
    for (int i = 1; i <= 60; i++) mp[i] = 2;
    ck_assert_int_eq(iv_meta_add_computed_arrays(m, IV_IVCSR, 60, 50, mp, vp, 2, vals,
                                                 IV_DT_INT32, &e), 0);
    const iv_meta_col_t *t = iv_meta_find_col(m, IV_AXIS_OBS, "total_counts");
    ck_assert_int_eq(t->type, IV_COL_INT);
    ck_assert_int_eq(t->i64[0], 5);
    ck_assert_int_eq(t->i64[1], 0);
    ck_assert_int_eq(iv_meta_find_col(m, IV_AXIS_OBS, "max_count")->i64[0], 3);
    ck_assert_int_eq(iv_meta_find_col(m, IV_AXIS_OBS, "n_genes")->i64[0], 3);
    /* Second time: names clash, computed ones get the iv_ prefix. */
    ck_assert_int_eq(iv_meta_add_computed_arrays(m, IV_IVCSR, 60, 50, mp, vp, 2, vals,
                                                 IV_DT_INT32, &e), 0);
    ck_assert_ptr_nonnull(iv_meta_find_col(m, IV_AXIS_OBS, "iv_total_counts"));
    mp[30] = 3;
    mp[31] = 1;
    ck_assert_int_eq(iv_meta_add_computed_arrays(m, IV_IVCSR, 60, 50, mp, vp, 2, vals,
                                                 IV_DT_INT32, &e), IV_EBAD_FILE);
    /* Wrong slice count. */
    ck_assert_int_eq(iv_meta_add_computed_arrays(m, IV_IVCSR, 59, 50, mp, vp, 2, vals,
                                                 IV_DT_INT32, &e), IV_EBAD_FILE);
    iv_meta_free(m);
}
END_TEST

/* --dump mode: one JSON object per column. */
static void dump_col(const char *axis, const iv_meta_col_t *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "axis", axis);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "type", iv_col_type_name(c->type));
    cJSON_AddStringToObject(o, "encoding", c->encoding);
    cJSON_AddBoolToObject(o, "index", c->is_index);
    cJSON_AddNumberToObject(o, "null_count", (double)c->null_count);
    cJSON *vals = cJSON_AddArrayToObject(o, "values");
    for (int64_t i = 0; i < c->n; i++) {
        if (c->mask && c->mask[i]) {
            cJSON_AddItemToArray(vals, cJSON_CreateNull());
            continue;
        }
        switch (c->type) {
        case IV_COL_INT: {
            char b[32];
            snprintf(b, sizeof b, "%lld", (long long)c->i64[i]);
            cJSON_AddItemToArray(vals, cJSON_CreateRaw(b));
            break;
        }
        case IV_COL_FLOAT: {
            char b[40];
            if (isinf(c->f64[i])) snprintf(b, sizeof b, "\"%sinf\"", c->f64[i] < 0 ? "-" : "");
            else snprintf(b, sizeof b, "%.17g", c->f64[i]);
            cJSON_AddItemToArray(vals, cJSON_CreateRaw(b));
            break;
        }
        case IV_COL_BOOL: cJSON_AddItemToArray(vals, cJSON_CreateBool(c->b[i])); break;
        case IV_COL_STRING:
            cJSON_AddItemToArray(vals, cJSON_CreateString(iv_meta_col_str(c, i)));
            break;
        case IV_COL_CATEGORICAL:
            cJSON_AddItemToArray(vals, cJSON_CreateString(iv_meta_col_cat(c, c->codes[i])));
            break;
        }
    }
    if (c->type == IV_COL_CATEGORICAL) {
        cJSON *cats = cJSON_AddArrayToObject(o, "categories");
        cJSON *cnt = cJSON_AddArrayToObject(o, "counts");
        for (int64_t k = 0; k < c->n_cats; k++) {
            cJSON_AddItemToArray(cats, cJSON_CreateString(iv_meta_col_cat(c, k)));
            cJSON_AddItemToArray(cnt, cJSON_CreateNumber((double)c->cat_counts[k]));
        }
        cJSON_AddBoolToObject(o, "ordered", c->ordered);
        cJSON_AddBoolToObject(o, "cats_numeric", c->cats_numeric);
    }
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

static int dump(const char *path, const char *xg)
{
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    int rc = iv_meta_load(path, xg, &m, &e);
    if (rc < 0) {
        printf("{\"error\":\"%s\",\"status\":%d}\n", iv_error_code(rc), iv_error_status(rc));
        fprintf(stderr, "%s\n", e.msg);
        return 0;
    }
    const char *ax[] = {"obs", "var"};
    for (int a = 0; a < 2; a++) {
        dump_col(ax[a], iv_meta_index(m, a));
        for (size_t i = 0; i < iv_meta_n_cols(m, a); i++) dump_col(ax[a], iv_meta_col(m, a, i));
    }
    iv_meta_free(m);
    return 0;
}

/* --validate mode: iv_meta_validate_file's verdict, "ok" or the error on
 * stderr; exit status 0 either way (1 only for a usage error). */
static int validate(const char *path, const char *xg)
{
    iv_err_t e = {0};
    int rc = iv_meta_validate_file(path, xg, &e);
    printf("%s\n", rc == 0 ? "ok" : iv_error_code(rc));
    if (rc < 0) fprintf(stderr, "%s\n", e.msg);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--dump") == 0) return dump(argv[2], argc > 3 ? argv[3] : NULL);
    if (argc >= 3 && strcmp(argv[1], "--validate") == 0)
        return validate(argv[2], argc > 3 ? argv[3] : NULL);
    Suite *s = suite_create("meta");
    TCase *tc = tcase_create("meta");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fixtures_compressed_equal_plain);
    tcase_add_test(tc, test_tiny_columns);
    tcase_add_test(tc, test_names_lookup);
    tcase_add_test(tc, test_computed_columns);
    tcase_add_test(tc, test_computed_int_and_errors);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
