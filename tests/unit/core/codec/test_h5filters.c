/*
 * Tests of core/codec/h5filters.c against the shared fixtures (written by the
 * real HDF5 Blosc2 and Zstandard plugins):
 *   - every obs/var dataset read through H5Dread with our registered
 *     filters equals the uncompressed copy in expected/<base>.meta.h5ad;
 *   - the X arrays of the Blosc2-lz4 files equal those of the zstd files;
 *   - every stored chunk of every filtered dataset, taken raw with
 *     H5Dget_chunk_info_by_coord + H5Dread_chunk and decoded with
 *     iv_pipeline_decode (also from several threads at once), equals the
 *     H5Dread result.
 * Skips with a message when the fixtures folder is absent.
 */
#include <check.h>

#include "check_main.h"
#include <dirent.h>
#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "codec_tls.h"

static int have_fixtures(void)
{
    struct stat st;
    return stat(IV_FIXTURES, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- helpers --------------------------------------------------------------- */

typedef struct names {
    char **v;
    size_t n, cap;
} names_t;

static void names_add(names_t *l, const char *s)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = strdup(s);
}

static void names_free(names_t *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static herr_t collect_datasets(hid_t obj, const char *name, const H5O_info_t *info, void *op)
{
    (void)obj;
    if (info->type == H5O_TYPE_DATASET) names_add(op, name);
    return 0;
}

/* Every .h5ad under the fixtures folder and its real/ subfolder. */
static void fixture_files(names_t *out)
{
    const char *subs[] = {"", "real/"};
    for (int s = 0; s < 2; s++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", IV_FIXTURES, subs[s]);
        DIR *d = opendir(dir);
        if (!d) continue;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            size_t l = strlen(de->d_name);
            if (l > 5 && strcmp(de->d_name + l - 5, ".h5ad") == 0) {
                char p[1200];
                snprintf(p, sizeof p, "%s%s", subs[s], de->d_name);
                names_add(out, p);
            }
        }
        closedir(d);
    }
}

static hid_t open_fixture(const char *rel)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", IV_FIXTURES, rel);
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "cannot open %s", rel);
    return f;
}

/* Whether the dataset's pipeline holds filter id. */
static int has_filter(hid_t d, int id)
{
    hid_t dcpl = H5Dget_create_plist(d);
    int n = H5Pget_nfilters(dcpl), found = 0;
    for (int i = 0; i < n; i++) {
        unsigned flags, cd[16], fc;
        size_t ncd = 16;
        char nm[32];
        if (H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof nm, nm, &fc) == id)
            found = 1;
    }
    H5Pclose(dcpl);
    return found;
}

/*
 * Reads a whole dataset as bytes of its file type (vlen strings become
 * one '\n'-joined string), so two datasets compare with memcmp.
 */
static uint8_t *read_all(hid_t d, size_t *len)
{
    hid_t ft = H5Dget_type(d);
    hid_t sp = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    ck_assert_int_ge(n, 0);
    uint8_t *buf;
    if (H5Tget_class(ft) == H5T_STRING && H5Tis_variable_str(ft)) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(ft)); /* HDF5 converts no charsets */
        char **s = calloc((size_t)n + 1, sizeof *s);
        ck_assert_int_ge(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, s), 0);
        size_t tot = 1;
        for (hssize_t i = 0; i < n; i++) tot += (s[i] ? strlen(s[i]) : 0) + 1;
        buf = malloc(tot);
        size_t pos = 0;
        for (hssize_t i = 0; i < n; i++) {
            size_t l = s[i] ? strlen(s[i]) : 0;
            memcpy(buf + pos, s[i] ? s[i] : "", l);
            pos += l;
            buf[pos++] = '\n';
        }
        *len = pos;
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, s);
        free(s);
        H5Tclose(mt);
    } else {
        hid_t mt = H5Tget_native_type(ft, H5T_DIR_ASCEND);
        size_t es = H5Tget_size(mt);
        buf = malloc((size_t)n * es + 1);
        ck_assert_int_ge(H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
        *len = (size_t)n * es;
        H5Tclose(mt);
    }
    H5Sclose(sp);
    H5Tclose(ft);
    return buf;
}

/* ---- tests ----------------------------------------------------------------- */

START_TEST(test_register_idempotent)
{
    ck_assert_int_eq(iv_h5filters_register(), 0);
    ck_assert_int_eq(iv_h5filters_register(), 0);
    ck_assert_int_gt(H5Zfilter_avail(IV_FILTER_BLOSC2), 0);
    ck_assert_int_gt(H5Zfilter_avail(IV_FILTER_ZSTD), 0);
}
END_TEST

START_TEST(test_meta_equals_uncompressed)
{
    if (!have_fixtures()) {
        printf("SKIP: fixtures folder %s absent\n", IV_FIXTURES);
        return;
    }
    ck_assert_int_eq(iv_h5filters_register(), 0);
    names_t files = {0};
    fixture_files(&files);
    ck_assert_uint_gt(files.n, 0);
    size_t compared = 0, compressed = 0;
    for (size_t fi = 0; fi < files.n; fi++) {
        const char *rel = files.v[fi];
        /* expected/<base>.meta.h5ad next to the file, base = up to the first dot */
        const char *slash = strrchr(rel, '/');
        const char *base = slash ? slash + 1 : rel;
        char meta[1200];
        snprintf(meta, sizeof meta, "%.*sexpected/%.*s.meta.h5ad", (int)(base - rel), rel,
                 (int)strcspn(base, "."), base);
        hid_t f = open_fixture(rel), m = open_fixture(meta);
        const char *groups[] = {"obs", "var"};
        for (int g = 0; g < 2; g++) {
            names_t ds = {0};
            hid_t grp = H5Gopen2(f, groups[g], H5P_DEFAULT);
            ck_assert_int_ge(grp, 0);
            H5Ovisit(grp, H5_INDEX_NAME, H5_ITER_NATIVE, collect_datasets, &ds);
            H5Gclose(grp);
            for (size_t i = 0; i < ds.n; i++) {
                char path[512];
                snprintf(path, sizeof path, "%s/%s", groups[g], ds.v[i]);
                hid_t a = H5Dopen2(f, path, H5P_DEFAULT);
                hid_t b = H5Dopen2(m, path, H5P_DEFAULT);
                ck_assert_msg(a >= 0 && b >= 0, "%s: %s missing", rel, path);
                if (has_filter(a, IV_FILTER_BLOSC2) || has_filter(a, IV_FILTER_ZSTD)) compressed++;
                size_t la, lb;
                uint8_t *ba = read_all(a, &la), *bb = read_all(b, &lb);
                ck_assert_msg(la == lb && memcmp(ba, bb, la) == 0, "%s: %s differs from %s", rel,
                              path, meta);
                compared++;
                free(ba);
                free(bb);
                H5Dclose(a);
                H5Dclose(b);
            }
            names_free(&ds);
        }
        H5Fclose(f);
        H5Fclose(m);
    }
    printf("meta: %zu datasets compared, %zu of them compressed, in %zu files\n", compared,
           compressed, files.n);
    ck_assert_uint_gt(compressed, 20);
    names_free(&files);
}
END_TEST

START_TEST(test_x_blosc2_equals_zstd)
{
    if (!have_fixtures()) {
        printf("SKIP: fixtures folder %s absent\n", IV_FIXTURES);
        return;
    }
    ck_assert_int_eq(iv_h5filters_register(), 0);
    const char *pairs[][2] = {{"chunky.ivcsr.blosc2-lz4.h5ad", "chunky.ivcsr.zstd.h5ad"},
                              {"wide.ivcsr.blosc2-lz4.h5ad", "wide.ivcsr.zstd.h5ad"}};
    const char *arrays[] = {"X/packed_indices", "X/values", "X/major_ptr", "X/value_ptr"};
    for (int p = 0; p < 2; p++) {
        hid_t a = open_fixture(pairs[p][0]), b = open_fixture(pairs[p][1]);
        for (int k = 0; k < 4; k++) {
            hid_t da = H5Dopen2(a, arrays[k], H5P_DEFAULT), db = H5Dopen2(b, arrays[k], H5P_DEFAULT);
            ck_assert(has_filter(da, IV_FILTER_BLOSC2));
            ck_assert(has_filter(db, IV_FILTER_ZSTD));
            size_t la, lb;
            uint8_t *ba = read_all(da, &la), *bb = read_all(db, &lb);
            ck_assert_uint_gt(la, 0);
            ck_assert_msg(la == lb && memcmp(ba, bb, la) == 0, "%s %s differs", pairs[p][0],
                          arrays[k]);
            free(ba);
            free(bb);
            H5Dclose(da);
            H5Dclose(db);
        }
        H5Fclose(a);
        H5Fclose(b);
    }
}
END_TEST

/* One stored chunk, raw, with what it must decode to. */
typedef struct raw_chunk {
    iv_pipeline_t p;
    unsigned mask;
    uint8_t *raw;
    size_t raw_len;
    uint8_t *want;     /* full chunk bytes (the H5Dread slice; padding unchecked) */
    size_t want_len;   /* valid bytes of want */
    size_t full_len;   /* chunk_len * elem */
} raw_chunk_t;

typedef struct chunk_set {
    raw_chunk_t *v;
    size_t n, cap;
} chunk_set_t;

static void load_pipeline(hid_t d, iv_pipeline_t *p)
{
    hid_t dcpl = H5Dget_create_plist(d), t = H5Dget_type(d);
    memset(p, 0, sizeof *p);
    p->elem_size = H5Tget_size(t);
    int nf = H5Pget_nfilters(dcpl);
    ck_assert_int_le(nf, IV_PIPELINE_MAX);
    p->n = (size_t)nf;
    for (int i = 0; i < nf; i++) {
        size_t ncd = IV_FILTER_MAX_CD;
        char nm[64];
        unsigned fc;
        p->f[i].id = (int)H5Pget_filter2(dcpl, (unsigned)i, &p->f[i].flags, &ncd, p->f[i].cd,
                                          sizeof nm, nm, &fc);
        p->f[i].n_cd = ncd;
    }
    H5Tclose(t);
    H5Pclose(dcpl);
}

/* Collects every stored chunk of every filtered 1-D dataset in file. */
static void collect_chunks(const char *rel, chunk_set_t *cs)
{
    hid_t f = open_fixture(rel);
    names_t ds = {0};
    H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, collect_datasets, &ds);
    for (size_t i = 0; i < ds.n; i++) {
        hid_t d = H5Dopen2(f, ds.v[i], H5P_DEFAULT);
        hid_t dcpl = H5Dget_create_plist(d);
        hid_t ft = H5Dget_type(d);
        int chunked = H5Pget_layout(dcpl) == H5D_CHUNKED;
        int nf = H5Pget_nfilters(dcpl);
        int vlen = H5Tis_variable_str(ft) > 0 || H5Tget_class(ft) == H5T_VLEN;
        hid_t sp = H5Dget_space(d);
        int rank = H5Sget_simple_extent_ndims(sp);
        if (!chunked || nf <= 0 || vlen || rank != 1) {
            H5Sclose(sp);
            H5Tclose(ft);
            H5Pclose(dcpl);
            H5Dclose(d);
            continue;
        }
        hsize_t dims[1], cdims[1];
        H5Sget_simple_extent_dims(sp, dims, NULL);
        H5Pget_chunk(dcpl, 1, cdims);
        size_t es = H5Tget_size(ft);
        size_t total = (size_t)dims[0] * es;
        uint8_t *full = malloc(total + 1);
        ck_assert_int_ge(H5Dread(d, ft, H5S_ALL, H5S_ALL, H5P_DEFAULT, full), 0);
        iv_pipeline_t p;
        load_pipeline(d, &p);
        for (hsize_t start = 0; start < dims[0]; start += cdims[0]) {
            hsize_t off[1] = {start};
            unsigned mask = 0;
            haddr_t addr = HADDR_UNDEF;
            hsize_t size = 0;
            ck_assert_int_ge(H5Dget_chunk_info_by_coord(d, off, &mask, &addr, &size), 0);
            if (addr == HADDR_UNDEF || size == 0) continue; /* fill value */
            if (cs->n == cs->cap) {
                cs->cap = cs->cap ? 2 * cs->cap : 64;
                cs->v = realloc(cs->v, cs->cap * sizeof *cs->v);
            }
            raw_chunk_t *c = &cs->v[cs->n++];
            c->p = p;
            c->raw = malloc((size_t)size);
            c->raw_len = (size_t)size;
            uint32_t m2 = 0;
            ck_assert_int_ge(H5Dread_chunk(d, H5P_DEFAULT, off, &m2, c->raw), 0);
            ck_assert_uint_eq(m2, mask);
            c->mask = mask;
            c->full_len = (size_t)cdims[0] * es;
            size_t valid_elems = dims[0] - start < cdims[0] ? dims[0] - start : cdims[0];
            c->want_len = (size_t)valid_elems * es;
            c->want = malloc(c->want_len);
            memcpy(c->want, full + start * es, c->want_len);
        }
        free(full);
        H5Sclose(sp);
        H5Tclose(ft);
        H5Pclose(dcpl);
        H5Dclose(d);
    }
    names_free(&ds);
    H5Fclose(f);
}

static int decode_all(const chunk_set_t *cs, char *why, size_t why_cap)
{
    size_t maxlen = 0;
    for (size_t i = 0; i < cs->n; i++)
        if (cs->v[i].full_len > maxlen) maxlen = cs->v[i].full_len;
    uint8_t *out = malloc(maxlen + 4), *sc = malloc(maxlen + 4);
    int bad = 0;
    for (size_t i = 0; i < cs->n && !bad; i++) {
        const raw_chunk_t *c = &cs->v[i];
        size_t got = 0;
        iv_err_t e;
        iv_err_clear(&e);
        int rc = iv_pipeline_decode(&c->p, c->mask, c->raw, c->raw_len, out, maxlen + 4, sc,
                                    maxlen + 4, c->full_len, &got, &e);
        if (rc != 0) {
            snprintf(why, why_cap, "chunk %zu: %s", i, e.msg);
            bad = 1;
        } else if (got != c->full_len || memcmp(out, c->want, c->want_len) != 0) {
            snprintf(why, why_cap, "chunk %zu: bytes differ", i);
            bad = 1;
        }
    }
    free(out);
    free(sc);
    iv_codec_thread_release();
    return bad;
}

typedef struct thr_arg {
    const chunk_set_t *cs;
    int bad;
    char why[600];
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    for (int round = 0; round < 3 && !a->bad; round++) a->bad = decode_all(a->cs, a->why, sizeof a->why);
    return NULL;
}

START_TEST(test_raw_chunks_through_pipeline)
{
    if (!have_fixtures()) {
        printf("SKIP: fixtures folder %s absent\n", IV_FIXTURES);
        return;
    }
    ck_assert_int_eq(iv_h5filters_register(), 0);
    names_t files = {0};
    fixture_files(&files);
    chunk_set_t cs = {0};
    for (size_t i = 0; i < files.n; i++) collect_chunks(files.v[i], &cs);
    size_t nb = 0, nz = 0, nd = 0;
    for (size_t i = 0; i < cs.n; i++)
        for (size_t k = 0; k < cs.v[i].p.n; k++) {
            nb += cs.v[i].p.f[k].id == IV_FILTER_BLOSC2;
            nz += cs.v[i].p.f[k].id == IV_FILTER_ZSTD;
            nd += cs.v[i].p.f[k].id == IV_FILTER_DEFLATE;
        }
    printf("raw chunks: %zu (blosc2 %zu, zstd %zu, deflate %zu)\n", cs.n, nb, nz, nd);
    ck_assert_uint_gt(nb, 50);
    ck_assert_uint_gt(nz, 10);
    ck_assert_uint_gt(nd, 1);
    char why[600] = "";
    ck_assert_msg(decode_all(&cs, why, sizeof why) == 0, "%s", why);

    /* The same from four threads at once (per-thread scratch and zstd
     * contexts must not interfere). */
    pthread_t th[4];
    thr_arg_t args[4];
    for (int t = 0; t < 4; t++) {
        memset(&args[t], 0, sizeof args[t]);
        args[t].cs = &cs;
        ck_assert_int_eq(pthread_create(&th[t], NULL, thr_main, &args[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        ck_assert_msg(!args[t].bad, "thread %d: %s", t, args[t].why);
    }

    /* Stored bytes cut short must fail, never crash. */
    for (size_t i = 0; i < cs.n; i += 7) {
        raw_chunk_t *c = &cs.v[i];
        uint8_t *out = malloc(c->full_len), *sc = malloc(c->full_len);
        for (size_t cut = 0; cut < c->raw_len; cut += 1 + c->raw_len / 16) {
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, c->raw, cut);
            size_t got;
            iv_err_t e;
            iv_err_clear(&e);
            ck_assert_int_lt(iv_pipeline_decode(&c->p, c->mask, t, cut, out, c->full_len, sc,
                                                c->full_len, c->full_len, &got, &e),
                             0);
            free(t);
        }
        free(out);
        free(sc);
    }
    for (size_t i = 0; i < cs.n; i++) {
        free(cs.v[i].raw);
        free(cs.v[i].want);
    }
    free(cs.v);
    names_free(&files);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("h5filters");
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_register_idempotent);
    tcase_add_test(tc, test_meta_equals_uncompressed);
    tcase_add_test(tc, test_x_blosc2_equals_zstd);
    tcase_add_test(tc, test_raw_chunks_through_pipeline);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int rc = iv_check_run(suite());
    iv_codec_thread_release();
    return rc;
}
