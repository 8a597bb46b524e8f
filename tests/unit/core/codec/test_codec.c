/*
 * Tests of core/codec/codec.c: the zstd, deflate and lz4 wrappers, and the HDF5
 * pipeline undo checked against chunks that libhdf5 itself wrote (deflate,
 * shuffle and fletcher32 in both orders, odd lengths) into an in-memory
 * file, read back raw with H5Dread_chunk.
 */
#include <check.h>

#include "check_main.h"
#include <hdf5.h>
#include <lz4.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "blosc2_enc.h"
#include "codec.h"
#include "codec_tls.h"

static uint32_t seed = 777;

static uint8_t rb(void)
{
    seed = seed * 1103515245u + 12345u;
    return (uint8_t)(seed >> 16);
}

static void fill(uint8_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i % 97 < 40 ? 0 : rb() % 16);
}

START_TEST(test_zstd)
{
    size_t n = 50000;
    uint8_t *d = malloc(n), *c = malloc(ZSTD_compressBound(n) * 2), *out = malloc(2 * n);
    fill(d, n);
    size_t clen = ZSTD_compress(c, ZSTD_compressBound(n), d, n, 3), got;
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, clen, out, n, &got, &e), 0);
    ck_assert_uint_eq(got, n);
    ck_assert(memcmp(out, d, n) == 0);
    /* too small */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, clen, out, n - 1, &got, &e), IV_ECORRUPT);
    /* truncated, garbage */
    for (size_t cut = 0; cut < clen; cut += 1 + cut / 8) {
        iv_err_clear(&e);
        ck_assert_int_lt(iv_zstd_decode(c, cut, out, n, &got, &e), 0);
    }
    memset(c, 0x42, 64);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, 64, out, n, &got, &e), IV_ECORRUPT);

    /* Frames without a content size decode by streaming; two frames
     * concatenated decode to both. */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    size_t l1 = ZSTD_compress2(cc, c, ZSTD_compressBound(n), d, n);
    ck_assert(!ZSTD_isError(l1));
    ck_assert_uint_eq(ZSTD_getFrameContentSize(c, l1), ZSTD_CONTENTSIZE_UNKNOWN);
    size_t l2 = ZSTD_compress2(cc, c + l1, ZSTD_compressBound(n), d, 1000);
    ZSTD_freeCCtx(cc);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, l1, out, n, &got, &e), 0);
    ck_assert_uint_eq(got, n);
    ck_assert(memcmp(out, d, n) == 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, l1 + l2, out, 2 * n, &got, &e), 0);
    ck_assert_uint_eq(got, n + 1000);
    ck_assert(memcmp(out + n, d, 1000) == 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, l1, out, n - 1, &got, &e), IV_ECORRUPT);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_zstd_decode(c, l1 - 3, out, n, &got, &e), IV_ECORRUPT);
    free(d);
    free(c);
    free(out);
}
END_TEST

START_TEST(test_deflate_and_lz4)
{
    size_t n = 30000;
    uint8_t *d = malloc(n), *c = malloc(compressBound(n)), *out = malloc(n + 1);
    fill(d, n);
    uLongf cl = compressBound(n);
    ck_assert_int_eq(compress2(c, &cl, d, n, 6), Z_OK);
    size_t got;
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_deflate_decode(c, cl, out, n, &got, &e), 0);
    ck_assert_uint_eq(got, n);
    ck_assert(memcmp(out, d, n) == 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_deflate_decode(c, cl, out, n - 1, &got, &e), IV_ECORRUPT);
    for (size_t cut = 0; cut < cl; cut += 1 + cut / 4) {
        iv_err_clear(&e);
        ck_assert_int_lt(iv_deflate_decode(c, cut, out, n, &got, &e), 0);
    }
    int ll = LZ4_compress_default((const char *)d, (char *)c, (int)n, (int)compressBound(n));
    ck_assert_int_gt(ll, 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_lz4_decode(c, (size_t)ll, out, n, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    /* exact length required both ways */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_lz4_decode(c, (size_t)ll, out, n + 1, &e), IV_ECORRUPT);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_lz4_decode(c, (size_t)ll, out, n - 1, &e), IV_ECORRUPT);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_lz4_decode(c, (size_t)ll - 1, out, n, &e), IV_ECORRUPT);
    free(d);
    free(c);
    free(out);
}
END_TEST

/* Reads the dataset's pipeline into p. */
static void load_pipeline(hid_t dset, iv_pipeline_t *p)
{
    hid_t dcpl = H5Dget_create_plist(dset);
    hid_t t = H5Dget_type(dset);
    memset(p, 0, sizeof *p);
    p->elem_size = H5Tget_size(t);
    int nf = H5Pget_nfilters(dcpl);
    ck_assert_int_le(nf, IV_PIPELINE_MAX);
    p->n = (size_t)nf;
    for (int i = 0; i < nf; i++) {
        unsigned flags;
        size_t ncd = IV_FILTER_MAX_CD;
        char name[64];
        unsigned fc;
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, p->f[i].cd,
                                         sizeof name, name, &fc);
        p->f[i].id = (int)id;
        p->f[i].flags = flags;
        p->f[i].n_cd = ncd;
    }
    H5Tclose(t);
    H5Pclose(dcpl);
}

/*
 * Writes n elements of type `type` (elem bytes each) with chunk length
 * chunk and the filters set by setup(), then decodes every raw chunk
 * with iv_pipeline_decode and compares with H5Dread and the source.
 */
static void hdf5_oracle(hid_t type, size_t elem, size_t n, size_t chunk,
                        void (*setup)(hid_t dcpl), const char *want_name)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 20, 0); /* in memory, never written */
    hid_t f = H5Fcreate("codec-oracle.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    ck_assert_int_ge(f, 0);
    hsize_t dims[1] = {n}, cdims[1] = {chunk};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, cdims);
    setup(dcpl);
    hid_t d = H5Dcreate2(f, "x", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    uint8_t *src = malloc(n * elem), *full = malloc(n * elem);
    fill(src, n * elem);
    ck_assert_int_ge(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, src), 0);
    H5Dflush(d);
    ck_assert_int_ge(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, full), 0);
    ck_assert(memcmp(full, src, n * elem) == 0);

    iv_pipeline_t p;
    load_pipeline(d, &p);
    char name[64];
    iv_pipeline_describe(&p, name, sizeof name);
    ck_assert_str_eq(name, want_name);

    size_t clen = chunk * elem;
    /* fletcher32 lengthens intermediate stages by its 4 bytes. */
    size_t cap = clen + 4;
    uint8_t *raw = malloc(2 * clen + 64), *out = malloc(cap), *scratch = malloc(cap);
    for (size_t k = 0; k * chunk < n; k++) {
        hsize_t off[1] = {k * chunk};
        hsize_t sz = 0;
        ck_assert_int_ge(H5Dget_chunk_storage_size(d, off, &sz), 0);
        ck_assert_uint_le(sz, 2 * clen + 64);
        uint32_t mask = 0;
        ck_assert_int_ge(H5Dread_chunk(d, H5P_DEFAULT, off, &mask, raw), 0);
        size_t got = 0;
        iv_err_t e;
        iv_err_clear(&e);
        int rc = iv_pipeline_decode(&p, mask, raw, (size_t)sz, out, cap, scratch, cap, clen,
                                    &got, &e);
        ck_assert_msg(rc == 0, "chunk %zu: %s", k, e.msg);
        ck_assert_uint_eq(got, clen);
        size_t valid = (n - k * chunk < chunk ? n - k * chunk : chunk) * elem;
        ck_assert_msg(memcmp(out, full + k * chunk * elem, valid) == 0, "chunk %zu differs", k);
        /* One flipped stored byte must be caught by the checksum or the codec. */
        raw[sz / 2] ^= 0x10;
        iv_err_clear(&e);
        rc = iv_pipeline_decode(&p, mask, raw, (size_t)sz, out, cap, scratch, cap, clen, &got, &e);
        if (strstr(want_name, "fletcher32")) ck_assert_int_eq(rc, IV_ECORRUPT);
    }
    free(raw);
    free(out);
    free(scratch);
    free(src);
    free(full);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
    H5Pclose(fapl);
}

static void setup_fl_sh_def(hid_t dcpl)
{
    H5Pset_fletcher32(dcpl);
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 4);
}

static void setup_sh_def_fl(hid_t dcpl)
{
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 6);
    H5Pset_fletcher32(dcpl);
}

static void setup_sh_def(hid_t dcpl)
{
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 1);
}

START_TEST(test_pipeline_hdf5_oracle)
{
    hdf5_oracle(H5T_NATIVE_UINT16, 2, 10007, 1000, setup_fl_sh_def, "deflate+shuffle+fletcher32");
    hdf5_oracle(H5T_NATIVE_UINT8, 1, 1001, 333, setup_sh_def_fl, "deflate+fletcher32+shuffle");
    hdf5_oracle(H5T_NATIVE_INT64, 8, 5000, 777, setup_sh_def, "deflate+shuffle");
    hdf5_oracle(H5T_NATIVE_FLOAT, 4, 4097, 4097, setup_fl_sh_def, "deflate+shuffle+fletcher32");
    /* Odd byte counts through fletcher32 (chunks of 333 one-byte values
     * and a 3-byte element type). */
    hid_t t3 = H5Tcopy(H5T_NATIVE_UINT32);
    H5Tset_precision(t3, 24);
    H5Tset_size(t3, 3);
    hdf5_oracle(t3, 3, 999, 111, setup_sh_def_fl, "deflate+fletcher32+shuffle");
    H5Tclose(t3);
}
END_TEST

START_TEST(test_pipeline_mask_and_errors)
{
    size_t n = 4000;
    uint8_t *d = malloc(n), *c = malloc(compressBound(n)), *out = malloc(n), *sc = malloc(n);
    fill(d, n);
    uLongf cl = compressBound(n);
    ck_assert_int_eq(compress2(c, &cl, d, n, 6), Z_OK);
    iv_pipeline_t p;
    memset(&p, 0, sizeof p);
    p.n = 2;
    p.elem_size = 4;
    p.f[0].id = IV_FILTER_SHUFFLE;
    p.f[1].id = IV_FILTER_DEFLATE;
    size_t got;
    iv_err_t e;
    /* Shuffle skipped for this chunk (mask bit 0): deflate only. */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 1u, c, cl, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    /* Not skipped: the result is the unshuffle of d. */
    uint8_t *ref = malloc(n);
    iv_unshuffle_scalar(d, ref, n, 4);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, c, cl, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, ref, n) == 0);
    /* shuffle's cd_values[0] overrides the element size */
    p.f[0].n_cd = 1;
    p.f[0].cd[0] = 2;
    iv_unshuffle_scalar(d, ref, n, 2);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, c, cl, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, ref, n) == 0);
    /* Wrong expected length */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 1u, c, cl, out, n, sc, n, n - 8, &got, &e),
                     IV_ECORRUPT);
    /* Both skipped: the stored bytes are the result (and must be n long). */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 3u, d, n, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    /* Unknown filter names its id. */
    p.f[1].id = 307;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, c, cl, out, n, sc, n, n, &got, &e),
                     IV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.msg, "307"));
    /* zstd in the pipeline */
    p.n = 1;
    p.f[0].id = IV_FILTER_ZSTD;
    p.f[0].n_cd = 1;
    size_t zl = ZSTD_compress(c, compressBound(n), d, n, 1);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, c, zl, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    free(ref);
    free(d);
    free(c);
    free(out);
    free(sc);
}
END_TEST

START_TEST(test_pipeline_blosc2)
{
    size_t n = 9000;
    uint8_t *d = malloc(n), *f = malloc(4 * n), *out = malloc(n), *sc = malloc(n);
    fill(d, n);
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_LZ4;
    o.typesize = 8;
    o.filters[5] = 1;
    size_t fl = iv_b2e_frame(d, n, n, &o, NULL, f, 4 * n);
    ck_assert_uint_gt(fl, 0);
    iv_pipeline_t p;
    memset(&p, 0, sizeof p);
    p.n = 1;
    p.elem_size = 8;
    p.f[0].id = IV_FILTER_BLOSC2;
    p.f[0].n_cd = 7;
    unsigned cd[7] = {1, 0, 8, (unsigned)n, 5, 1, 1};
    memcpy(p.f[0].cd, cd, sizeof cd);
    size_t got;
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, f, fl, out, n, sc, n, n, &got, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0u, f, fl - 1, out, n, sc, n, n, &got, &e),
                     IV_ECORRUPT);
    free(d);
    free(f);
    free(out);
    free(sc);
}
END_TEST

START_TEST(test_describe)
{
    iv_pipeline_t p;
    char b[64];
    memset(&p, 0, sizeof p);
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "none");
    p.n = 1;
    p.f[0].id = IV_FILTER_ZSTD;
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "zstd");
    p.f[0].id = IV_FILTER_BLOSC2;
    p.f[0].n_cd = 7;
    unsigned cd[7] = {1, 0, 4, 4000, 5, 1, 1};
    memcpy(p.f[0].cd, cd, sizeof cd);
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "blosc2-lz4+shuffle");
    p.f[0].cd[5] = 2;
    p.f[0].cd[6] = 5;
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "blosc2-zstd+bitshuffle");
    p.f[0].cd[5] = 0;
    p.f[0].cd[6] = 0;
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "blosc2-blosclz");
    p.n = 2;
    p.f[0].id = IV_FILTER_SHUFFLE;
    p.f[0].n_cd = 0;
    p.f[1].id = IV_FILTER_DEFLATE;
    iv_pipeline_describe(&p, b, sizeof b);
    ck_assert_str_eq(b, "deflate+shuffle");
    /* Truncated output stays terminated. */
    iv_pipeline_describe(&p, b, 5);
    ck_assert_str_eq(b, "defl");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("codec");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_zstd);
    tcase_add_test(tc, test_deflate_and_lz4);
    tcase_add_test(tc, test_pipeline_hdf5_oracle);
    tcase_add_test(tc, test_pipeline_mask_and_errors);
    tcase_add_test(tc, test_pipeline_blosc2);
    tcase_add_test(tc, test_describe);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int rc = iv_check_run(suite());
    iv_codec_thread_release();
    return rc;
}
