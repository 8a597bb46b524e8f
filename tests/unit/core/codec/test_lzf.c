/*
 * Tests of core/codec/lzf.c (and LZF's place in the pipeline and the HDF5
 * filter of h5filters.c): hand-made streams (literal runs, back-references,
 * overlapping copies, the extra length byte, the farthest distance), a
 * chunk h5py wrote with compression="lzf", every error (a truncated run,
 * a missing length or distance byte, a reference before the start, an
 * output short of or past the expected size) with no byte written past
 * the output, the size measure agreeing with the decoder, and an HDF5
 * dataset read through H5Dread with the registered filter (a damaged
 * chunk is a failed read, not a crash).
 */
#include <check.h>

#include "check_main.h"
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"

/* Decodes src into exactly want bytes in a buffer of want + 8 bytes whose
 * tail is a canary; returns the decoder's code and checks the canary. */
static int decode(const uint8_t *src, size_t n, size_t want, uint8_t *out)
{
    uint8_t *buf = malloc(want + 8);
    memset(buf, 0xA5, want + 8);
    iv_err_t e = {0};
    int rc = iv_lzf_decode(src, n, buf, want, &e);
    for (size_t i = want; i < want + 8; i++) ck_assert_uint_eq(buf[i], 0xA5);
    if (rc == 0) {
        ck_assert_int_eq(e.code, 0);
        if (out) memcpy(out, buf, want);
    } else {
        ck_assert_int_eq(rc, e.code);
        ck_assert_msg(strncmp(e.msg, "lzf:", 4) == 0, "message names the codec: %s", e.msg);
    }
    /* The measure agrees with the decoder on every stream it accepts. */
    size_t got = 0;
    iv_err_t e2 = {0};
    if (rc == 0) {
        ck_assert_int_eq(iv_lzf_decoded_size(src, n, want, &got, &e2), 0);
        ck_assert_uint_eq(got, want);
    }
    free(buf);
    return rc;
}

START_TEST(test_literal_runs)
{
    const uint8_t s[] = {0x02, 'a', 'b', 'c', 0x00, 'd'};
    uint8_t out[4];
    ck_assert_int_eq(decode(s, sizeof s, 4, out), 0);
    ck_assert(memcmp(out, "abcd", 4) == 0);
    /* The longest literal run: 32 bytes. */
    uint8_t l[33];
    l[0] = 31;
    for (int i = 0; i < 32; i++) l[1 + i] = (uint8_t)(i * 7);
    uint8_t o2[32];
    ck_assert_int_eq(decode(l, sizeof l, 32, o2), 0);
    ck_assert(memcmp(o2, l + 1, 32) == 0);
    /* An empty stream is an empty output. */
    ck_assert_int_eq(decode(NULL, 0, 0, NULL), 0);
}
END_TEST

START_TEST(test_back_references)
{
    /* "abc", then 3 bytes from 3 back: length field 1, distance 2 + 1. */
    const uint8_t s[] = {0x02, 'a', 'b', 'c', 0x20, 0x02};
    uint8_t out[6];
    ck_assert_int_eq(decode(s, sizeof s, 6, out), 0);
    ck_assert(memcmp(out, "abcabc", 6) == 0);
    /* Length field 6 (8 bytes) from 4 back, then a literal. */
    const uint8_t t[] = {0x03, 'w', 'x', 'y', 'z', 0xc0, 0x03, 0x00, '!'};
    uint8_t o2[13];
    ck_assert_int_eq(decode(t, sizeof t, 13, o2), 0);
    ck_assert(memcmp(o2, "wxyzwxyzwxyz!", 13) == 0);
}
END_TEST

START_TEST(test_overlapping_copy)
{
    /* 'x', then 4 bytes from 1 back: the copy reads what it writes. */
    const uint8_t s[] = {0x00, 'x', 0x40, 0x00};
    uint8_t out[5];
    ck_assert_int_eq(decode(s, sizeof s, 5, out), 0);
    ck_assert(memcmp(out, "xxxxx", 5) == 0);
    /* "ab" and 7 bytes from 2 back: a period-2 pattern. */
    const uint8_t t[] = {0x01, 'a', 'b', 0xa0, 0x01};
    uint8_t o2[9];
    ck_assert_int_eq(decode(t, sizeof t, 9, o2), 0);
    ck_assert(memcmp(o2, "ababababa", 9) == 0);
}
END_TEST

START_TEST(test_length_byte)
{
    /* Length field 7 adds the next byte: 7 + 10 + 2 = 19 bytes; the
     * distance byte comes after the length byte. */
    const uint8_t s[] = {0x01, 'a', 'b', 0xe0, 10, 0x01};
    uint8_t out[21];
    ck_assert_int_eq(decode(s, sizeof s, 21, out), 0);
    for (int i = 0; i < 21; i++) ck_assert_uint_eq(out[i], i % 2 ? 'b' : 'a');
    /* The longest reference: 7 + 255 + 2 = 264 bytes. */
    const uint8_t t[] = {0x00, 'z', 0xe0, 0xff, 0x00};
    uint8_t o2[265];
    ck_assert_int_eq(decode(t, sizeof t, 265, o2), 0);
    for (int i = 0; i < 265; i++) ck_assert_uint_eq(o2[i], 'z');
}
END_TEST

START_TEST(test_farthest_distance)
{
    /* 8192 literal bytes (256 runs of 32), then 3 bytes from 8192 back:
     * distance bits 0x1f and 0xff. */
    size_t n = 256 * 33 + 2;
    uint8_t *s = malloc(n);
    uint8_t *want = malloc(8195);
    for (size_t r = 0; r < 256; r++) {
        s[r * 33] = 31;
        for (size_t i = 0; i < 32; i++) s[r * 33 + 1 + i] = want[r * 32 + i] = (uint8_t)(r ^ i * 13);
    }
    s[256 * 33] = 0x3f;
    s[256 * 33 + 1] = 0xff;
    memcpy(want + 8192, want, 3);
    uint8_t *out = malloc(8195);
    ck_assert_int_eq(decode(s, n, 8195, out), 0);
    ck_assert(memcmp(out, want, 8195) == 0);
    free(s);
    free(want);
    free(out);
}
END_TEST

/* A chunk h5py 3.7 wrote for a uint8 dataset of 133 bytes with
 * compression="lzf" (read back with read_direct_chunk). */
static const uint8_t h5py_chunk[] = {
    0x13, 0x69, 0x76, 0x73, 0x65, 0x72, 0x76, 0x65, 0x20, 0x72, 0x65, 0x61, 0x64, 0x73, 0x20,
    0x4c, 0x5a, 0x46, 0x3a, 0x20, 0x69, 0xe0, 0x07, 0x12, 0x18, 0x20, 0x63, 0x68, 0x75, 0x6e,
    0x6b, 0x73, 0x3b, 0x20, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
    0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xe0, 0x18, 0x0f, 0xe0, 0x1c, 0x00, 0x01, 0x00, 0x00};

static void h5py_expected(uint8_t *raw)
{
    const char *text = "ivserve reads LZF: ivserve reads LZF chunks; ";
    size_t k = strlen(text);
    memcpy(raw, text, k);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 16; i++) raw[k++] = (uint8_t)i;
    while (k < 133) raw[k++] = 0;
}

START_TEST(test_h5py_chunk)
{
    uint8_t raw[133], out[133];
    h5py_expected(raw);
    ck_assert_int_eq(decode(h5py_chunk, sizeof h5py_chunk, 133, out), 0);
    ck_assert(memcmp(out, raw, 133) == 0);
}
END_TEST

static void expect_error(const uint8_t *s, size_t n, size_t want, const char *words)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, s, n);
    ck_assert_int_eq(decode(copy, n, want, NULL), IV_ECORRUPT);
    uint8_t *buf = malloc(want + 1);
    iv_err_t e = {0};
    ck_assert_int_lt(iv_lzf_decode(copy, n, buf, want, &e), 0);
    ck_assert_msg(strstr(e.msg, words) != NULL, "'%s' lacks '%s'", e.msg, words);
    free(buf);
    free(copy);
}

START_TEST(test_errors)
{
    /* A literal run longer than the input left. */
    const uint8_t a[] = {0x05, 'a', 'b'};
    expect_error(a, sizeof a, 6, "only 2 left");
    /* A length-7 reference cut before its length byte, and before its
     * distance byte. */
    const uint8_t b[] = {0x01, 'a', 'b', 0xe0};
    expect_error(b, sizeof b, 30, "lacks its length byte");
    const uint8_t c[] = {0x01, 'a', 'b', 0xe0, 0x03};
    expect_error(c, sizeof c, 14, "lacks its distance byte");
    const uint8_t d[] = {0x01, 'a', 'b', 0x20};
    expect_error(d, sizeof d, 5, "lacks its distance byte");
    /* A reference as the very first run, and one a byte too far back. */
    const uint8_t f[] = {0x20, 0x00};
    expect_error(f, sizeof f, 3, "before the start");
    const uint8_t g[] = {0x02, 'a', 'b', 'c', 0x20, 0x03};
    expect_error(g, sizeof g, 6, "before the start");
    /* Outputs short of the expected size, and past it (a literal run, a
     * reference). */
    const uint8_t h[] = {0x02, 'a', 'b', 'c'};
    expect_error(h, sizeof h, 4, "expected 4");
    expect_error(h, sizeof h, 2, "passes the output size");
    expect_error(h, 0, 1, "expected 1");
    const uint8_t k[] = {0x00, 'x', 0x40, 0x00};
    expect_error(k, sizeof k, 4, "passes the output size");
    /* The h5py chunk cut anywhere, and to one byte less output. */
    for (size_t n = 1; n < sizeof h5py_chunk; n++) {
        uint8_t out[133];
        iv_err_t e = {0};
        ck_assert_int_lt(iv_lzf_decode(h5py_chunk, n, out, 133, &e), 0);
    }
    expect_error(h5py_chunk, sizeof h5py_chunk, 132, "passes the output size");
    /* The measure refuses what passes its limit and what is damaged. */
    size_t got = 0;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_lzf_decoded_size(h5py_chunk, sizeof h5py_chunk, 132, &got, &e),
                     IV_ECORRUPT);
    ck_assert_int_eq(iv_lzf_decoded_size(f, sizeof f, 100, &got, &e), IV_ECORRUPT);
    ck_assert_int_eq(iv_lzf_decoded_size(h5py_chunk, sizeof h5py_chunk, 1000, &got, &e), 0);
    ck_assert_uint_eq(got, 133);
}
END_TEST

START_TEST(test_pipeline)
{
    uint8_t raw[133], dst[133], scratch[133];
    h5py_expected(raw);
    /* As h5py declares it: revision, LZF version, chunk bytes. */
    iv_pipeline_t p = {1, 1, {{IV_FILTER_LZF, 1, 3, {4, 261, 133}}}};
    size_t got = 0;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_pipeline_decode(&p, 0, h5py_chunk, sizeof h5py_chunk, dst, sizeof dst,
                                        scratch, sizeof scratch, 133, &got, &e), 0);
    ck_assert_uint_eq(got, 133);
    ck_assert(memcmp(dst, raw, 133) == 0);
    /* Without the size (h5py's variable-length strings): measured. */
    p.f[0].n_cd = 0;
    memset(dst, 0, sizeof dst);
    ck_assert_int_eq(iv_pipeline_decode(&p, 0, h5py_chunk, sizeof h5py_chunk, dst, sizeof dst,
                                        scratch, sizeof scratch, 133, &got, &e), 0);
    ck_assert(memcmp(dst, raw, 133) == 0);
    /* A size that disagrees with the stream is an error. */
    p.f[0].n_cd = 3;
    p.f[0].cd[2] = 132;
    ck_assert_int_lt(iv_pipeline_decode(&p, 0, h5py_chunk, sizeof h5py_chunk, dst, sizeof dst,
                                        scratch, sizeof scratch, 133, &got, &e), 0);
    /* A chunk LZF did not shrink is stored raw with the filter's mask bit. */
    p.f[0].cd[2] = 133;
    ck_assert_int_eq(iv_pipeline_decode(&p, 1, raw, 133, dst, sizeof dst, scratch,
                                        sizeof scratch, 133, &got, &e), 0);
    ck_assert(memcmp(dst, raw, 133) == 0);
    /* Behind a shuffle of 1-byte elements (a copy), into dst. */
    iv_pipeline_t q = {2, 1, {{IV_FILTER_SHUFFLE, 1, 1, {1}}, {IV_FILTER_LZF, 1, 3, {4, 261, 133}}}};
    memset(dst, 0, sizeof dst);
    ck_assert_int_eq(iv_pipeline_decode(&q, 0, h5py_chunk, sizeof h5py_chunk, dst, sizeof dst,
                                        scratch, sizeof scratch, 133, &got, &e), 0);
    ck_assert(memcmp(dst, raw, 133) == 0);
    char name[64];
    iv_pipeline_describe(&q, name, sizeof name);
    ck_assert_str_eq(name, "lzf+shuffle");
}
END_TEST

/* A file of one chunked uint8 dataset whose only chunk is the given
 * bytes, stored under filter 32000; returns its path (static buffer). */
static const char *write_lzf_file(const uint8_t *chunk, size_t n, unsigned filter_mask,
                                  size_t n_cd)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/iv_lzf_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    hsize_t dims[1] = {133};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, dims);
    const unsigned cd[3] = {4, 261, 133};
    ck_assert_int_ge(H5Pset_filter(dcpl, IV_FILTER_LZF, H5Z_FLAG_OPTIONAL, n_cd, cd), 0);
    hid_t d = H5Dcreate2(f, "a", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hsize_t off[1] = {0};
    ck_assert_int_ge(H5Dwrite_chunk(d, H5P_DEFAULT, filter_mask, off, n, chunk), 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
    H5Fclose(f);
    return path;
}

static int read_lzf_file(const char *path, uint8_t *out)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    hid_t d = H5Dopen2(f, "a", H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    herr_t rc = H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
    H5Dclose(d);
    H5Fclose(f);
    return rc < 0 ? -1 : 0;
}

START_TEST(test_hdf5_filter)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    ck_assert_int_eq(iv_h5filters_register(), 0);
    ck_assert_int_gt(H5Zfilter_avail(IV_FILTER_LZF), 0);
    uint8_t raw[133], out[133];
    h5py_expected(raw);
    for (size_t n_cd = 0; n_cd <= 3; n_cd += 3) {
        const char *path = write_lzf_file(h5py_chunk, sizeof h5py_chunk, 0, n_cd);
        memset(out, 0, sizeof out);
        ck_assert_int_eq(read_lzf_file(path, out), 0);
        ck_assert(memcmp(out, raw, 133) == 0);
        unlink(path);
    }
    /* Stored raw, the filter skipped by the chunk's mask. */
    const char *path = write_lzf_file(raw, sizeof raw, 1, 3);
    memset(out, 0, sizeof out);
    ck_assert_int_eq(read_lzf_file(path, out), 0);
    ck_assert(memcmp(out, raw, 133) == 0);
    unlink(path);
    /* Damaged: cut short, and a reference before the start. */
    path = write_lzf_file(h5py_chunk, sizeof h5py_chunk - 3, 0, 3);
    ck_assert_int_lt(read_lzf_file(path, out), 0);
    unlink(path);
    const uint8_t bad[] = {0x20, 0x00, 0x00, 0x00};
    path = write_lzf_file(bad, sizeof bad, 0, 0);
    ck_assert_int_lt(read_lzf_file(path, out), 0);
    unlink(path);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("lzf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_literal_runs);
    tcase_add_test(tc, test_back_references);
    tcase_add_test(tc, test_overlapping_copy);
    tcase_add_test(tc, test_length_byte);
    tcase_add_test(tc, test_farthest_distance);
    tcase_add_test(tc, test_h5py_chunk);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_pipeline);
    tcase_add_test(tc, test_hdf5_filter);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
