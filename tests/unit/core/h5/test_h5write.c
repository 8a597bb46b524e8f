/* core/h5/h5write.c: codec names, compressed chunks that the decoders read
 * back, and growing arrays written across many chunks (with and without a
 * pool, every codec) that HDF5 reads back through the registered filters
 * exactly, with the chunk shape and filter asked for. */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "h5util.h"
#include "h5write.h"
#include "pool.h"

START_TEST(codec_parse)
{
    iv_h5w_codec_t c;
    ck_assert_int_eq(iv_h5w_codec_parse("zstd", &c), 0);
    ck_assert(c.kind == IV_H5W_ZSTD && c.level == 1);
    ck_assert_int_eq(iv_h5w_codec_parse("zstd:9", &c), 0);
    ck_assert_int_eq(c.level, 9);
    ck_assert_int_eq(iv_h5w_codec_parse("deflate", &c), 0);
    ck_assert(c.kind == IV_H5W_DEFLATE && c.level == 4);
    ck_assert_int_eq(iv_h5w_codec_parse("deflate:9", &c), 0);
    ck_assert_int_eq(iv_h5w_codec_parse("none", &c), 0);
    ck_assert(c.kind == IV_H5W_NONE);
    const char *bad[] = {"", "zstd:", "zstd:0", "zstd:99", "zstd:x", "deflate:10", "deflate:-1",
                         "none:1", "lz4", "zstdx", "zst"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(iv_h5w_codec_parse(bad[i], &c) < 0, "%s accepted", bad[i]);
}
END_TEST

START_TEST(compress_round_trip)
{
    size_t n = 100000;
    uint8_t *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 7 / 13);
    iv_h5w_codec_t cs[] = {{IV_H5W_ZSTD, 1}, {IV_H5W_ZSTD, 19}, {IV_H5W_DEFLATE, 6}};
    for (size_t k = 0; k < 3; k++) {
        size_t cap = iv_h5w_bound(&cs[k], n);
        uint8_t *dst = malloc(cap);
        size_t len = iv_h5w_compress(&cs[k], src, n, dst, cap), got = 0;
        ck_assert(len > 0 && len < n);
        iv_err_t e = {0};
        int rc = cs[k].kind == IV_H5W_ZSTD ? iv_zstd_decode(dst, len, back, n, &got, &e)
                                            : iv_deflate_decode(dst, len, back, n, &got, &e);
        ck_assert_int_eq(rc, 0);
        ck_assert_uint_eq(got, n);
        ck_assert(memcmp(src, back, n) == 0);
        /* Too small an output is a failure, not an overflow. */
        ck_assert_uint_eq(iv_h5w_compress(&cs[k], src, n, dst, 8), 0);
        free(dst);
    }
    free(src);
    free(back);
}
END_TEST

START_TEST(array_append_read_back)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    char path[] = "/tmp/iv_h5write_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const uint64_t total = 250007, chunk = 4096;
    int64_t *v = malloc(total * sizeof *v), *back = malloc(total * sizeof *back);
    for (uint64_t i = 0; i < total; i++) v[i] = (int64_t)(i * i % 1000003) - 5;
    iv_h5w_codec_t cs[] = {{IV_H5W_NONE, 0}, {IV_H5W_ZSTD, 3}, {IV_H5W_DEFLATE, 1}};
    int ids[] = {-1, IV_FILTER_ZSTD, IV_FILTER_DEFLATE};
    for (int threads = 1; threads <= 3; threads += 2) {
        iv_pool_t *pool = threads > 1 ? iv_pool_create((unsigned)threads - 1, 0) : NULL;
        for (size_t k = 0; k < 3; k++) {
            hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
            ck_assert_int_ge(f, 0);
            iv_h5w_array_t *a;
            iv_err_t e = {0};
            ck_assert_int_eq(iv_h5w_array_create(f, "a", IV_DT_INT64, chunk, &cs[k], pool, 0, "t",
                                                 &a, &e), 0);
            /* Appends of odd sizes, across chunk and batch boundaries. */
            for (uint64_t i = 0, step = 1; i < total; i += step, step = step * 3 % 9973 + 1) {
                uint64_t n = i + step > total ? total - i : step;
                ck_assert_int_eq(iv_h5w_array_append(a, v + i, n, &e), 0);
            }
            ck_assert_int_eq(iv_h5w_array_finish(a, &e), 0);
            ck_assert_uint_eq(iv_h5w_array_length(a), total);
            iv_h5w_array_free(a);
            H5Fclose(f);
            f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
            hid_t d = H5Dopen2(f, "a", H5P_DEFAULT), sp = H5Dget_space(d), pl = H5Dget_create_plist(d);
            hsize_t dims[1], cd[1];
            H5Sget_simple_extent_dims(sp, dims, NULL);
            ck_assert_uint_eq(dims[0], total);
            ck_assert_int_eq(H5Pget_chunk(pl, 1, cd), 1);
            ck_assert_uint_eq(cd[0], chunk);
            ck_assert_int_eq(H5Pget_nfilters(pl), ids[k] < 0 ? 0 : 1);
            if (ids[k] >= 0) {
                unsigned flags, vals[4];
                size_t nv = 4;
                ck_assert_int_eq(H5Pget_filter2(pl, 0, &flags, &nv, vals, 0, NULL, NULL), ids[k]);
                ck_assert_uint_eq(nv, 1);
                ck_assert_uint_eq(vals[0], (unsigned)cs[k].level);
            }
            memset(back, 0, total * sizeof *back);
            ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, back), 0);
            ck_assert(memcmp(v, back, total * sizeof *v) == 0);
            char enc[32];
            ck_assert_int_eq(iv_h5_read_str_attr(d, "encoding-type", enc, sizeof enc), 0);
            ck_assert_str_eq(enc, "array");
            H5Pclose(pl);
            H5Sclose(sp);
            H5Dclose(d);
            H5Fclose(f);
        }
        iv_pool_destroy(pool);
    }
    unlink(path);
    free(v);
    free(back);
}
END_TEST

/* The registered zstd filter encodes too (HDF5 refuses to create a
 * dataset whose filter cannot): an ordinary H5Dwrite through it reads
 * back exactly, and its chunks are single frames the decoder takes. */
START_TEST(zstd_filter_encodes_through_hdf5)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    iv_h5filters_register();
    char path[] = "/tmp/iv_h5zstd_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    enum { N = 50000 };
    int32_t *v = malloc(N * sizeof *v), *back = calloc(N, sizeof *back);
    for (int i = 0; i < N; i++) v[i] = i % 977 - 300;
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[1] = {N}, cd[1] = {4096};
    hid_t sp = H5Screate_simple(1, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    unsigned level[1] = {3};
    H5Pset_chunk(pl, 1, cd);
    ck_assert_int_ge(H5Pset_filter(pl, IV_FILTER_ZSTD, H5Z_FLAG_MANDATORY, 1, level), 0);
    hid_t d = H5Dcreate2(f, "z", H5T_STD_I32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
    H5Dclose(d);
    H5Fclose(f);
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    d = H5Dopen2(f, "z", H5P_DEFAULT);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, back), 0);
    ck_assert(memcmp(v, back, N * sizeof *v) == 0);
    hsize_t off[1] = {4096}, size = 0;
    unsigned mask = 1;
    ck_assert_int_ge(H5Dget_chunk_storage_size(d, off, &size), 0);
    uint8_t *raw = malloc(size), *dec = malloc(4096 * 4);
    ck_assert_int_ge(H5Dread_chunk(d, H5P_DEFAULT, off, &mask, raw), 0);
    ck_assert_uint_eq(mask, 0);
    size_t got = 0;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_zstd_decode(raw, size, dec, 4096 * 4, &got, &e), 0);
    ck_assert_uint_eq(got, 4096 * 4);
    ck_assert(memcmp(dec, v + 4096, got) == 0);
    free(raw);
    free(dec);
    H5Dclose(d);
    H5Fclose(f);
    H5Pclose(pl);
    H5Sclose(sp);
    unlink(path);
    free(v);
    free(back);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("h5write");
    TCase *tc = tcase_create("h5write");
    tcase_add_test(tc, codec_parse);
    tcase_add_test(tc, compress_round_trip);
    tcase_add_test(tc, array_append_read_back);
    tcase_add_test(tc, zstd_filter_encodes_through_hdf5);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
