/*
 * Tests of core/codec/blosc2.c and core/codec/blosclz.c: round trips through the
 * test-only encoder over every feature, hand-made BloscLZ streams, and
 * bad input (truncation at every length, seeded bit flips, lying sizes,
 * unsupported features), which must fail cleanly (run under ASan too).
 */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blosc2_enc.h"
#include "codec.h"
#include "codec_tls.h"

static uint64_t rng_state;

static uint32_t rnd(void)
{
    /* xorshift64*: deterministic, seeded per test. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * UINT64_C(2685821657736338717)) >> 32);
}

/* Data that looks like count-matrix columns: small integers of width ts,
 * some stretches of zeros and of one repeated value, some noise. */
static void fill_data(uint8_t *d, size_t n, size_t ts, int kind)
{
    size_t ne = n / ts;
    for (size_t i = 0; i < ne; i++) {
        uint64_t v;
        switch (kind) {
        case 0: v = (i / 50) % 3 == 0 ? 0 : rnd() % 40; break;  /* sparse-ish counts */
        case 1: v = i * 3 + 1000; break;                        /* increasing pointers */
        case 2: v = ((uint64_t)rnd() << 32) | rnd(); break;     /* noise */
        default: v = 7; break;                                   /* constant */
        }
        for (size_t k = 0; k < ts; k++) d[i * ts + k] = (uint8_t)(v >> (8 * (k % 8)));
    }
    for (size_t i = ne * ts; i < n; i++) d[i] = (uint8_t)(kind == 3 ? 7 : rnd());
}

static void check_chunk_roundtrip(const uint8_t *data, size_t n, const iv_b2e_opts_t *o)
{
    size_t cap = iv_b2e_chunk_bound(n, o);
    uint8_t *c = malloc(cap), *out = malloc(n + 16);
    size_t clen = iv_b2e_chunk(data, n, o, c, cap);
    ck_assert_msg(clen > 0, "encoder failed (codec %d ts %zu n %zu)", o->compcode, o->typesize, n);
    size_t got = 12345;
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_blosc2_chunk_decode(c, clen, out, n + 16, &got, &e);
    ck_assert_msg(rc == 0, "decode failed: %s (codec %d ts %zu n %zu bs %zu filters %d%d split %d)",
                  e.msg, o->compcode, o->typesize, n, o->blocksize, o->filters[4], o->filters[5],
                  !o->dont_split);
    ck_assert_uint_eq(got, n);
    ck_assert_msg(memcmp(out, data, n) == 0, "bytes differ (codec %d ts %zu n %zu filters %d%d)",
                  o->compcode, o->typesize, n, o->filters[4], o->filters[5]);
    free(c);
    free(out);
}

static const int codecs[] = {IV_B2E_BLOSCLZ, IV_B2E_LZ4, IV_B2E_LZ4HC, IV_B2E_ZLIB, IV_B2E_ZSTD};
static const size_t typesizes[] = {1, 2, 4, 8};

START_TEST(test_roundtrip_matrix)
{
    rng_state = 0x1234567ull + (uint64_t)_i;
    /* Filter layouts c-blosc2 writes: none, shuffle, bitshuffle, delta
     * (slot 4) under shuffle (slot 5), delta alone, shuffle with meta. */
    static const uint8_t layouts[][2] = {{0, 0}, {0, 1}, {0, 2}, {3, 1}, {3, 0}, {3, 2}};
    static const size_t sizes[] = {1, 7, 64, 1000, 4096, 12345};
    for (size_t ci = 0; ci < sizeof codecs / sizeof *codecs; ci++)
        for (size_t ti = 0; ti < 4; ti++)
            for (size_t li = 0; li < sizeof layouts / sizeof *layouts; li++)
                for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
                    for (int split = 0; split < 2; split++) {
                        size_t ts = typesizes[ti];
                        size_t n = sizes[si] * ts + (si % 2 ? ts / 2 : 0);
                        uint8_t *d = malloc(n);
                        fill_data(d, n, ts, (int)((si + li + ci) % 4));
                        iv_b2e_opts_t o;
                        memset(&o, 0, sizeof o);
                        o.compcode = codecs[ci];
                        o.typesize = ts;
                        o.blocksize = (si % 3 == 0) ? 0 : 256 * ts; /* odd last blocks */
                        o.filters[4] = layouts[li][0];
                        o.filters[5] = layouts[li][1];
                        o.dont_split = !split;
                        check_chunk_roundtrip(d, n, &o);
                        free(d);
                    }
}
END_TEST

START_TEST(test_stream_kinds)
{
    rng_state = 99;
    size_t n = 8192, ts = 4;
    uint8_t *d = malloc(n);
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_LZ4;
    o.typesize = ts;
    o.blocksize = 1024;
    o.filters[5] = 1;

    /* Zero streams: the whole chunk is header, table and 4-byte zero tokens. */
    memset(d, 0, n);
    uint8_t c[20000];
    size_t clen = iv_b2e_chunk(d, n, &o, c, sizeof c);
    ck_assert_uint_eq(clen, 32 + 4 * 8 + 8 * 4 * 4);
    check_chunk_roundtrip(d, n, &o);

    /* Run streams: 5-byte tokens, value bytes 7 and 0 after shuffle. */
    fill_data(d, n, ts, 3);
    clen = iv_b2e_chunk(d, n, &o, c, sizeof c);
    ck_assert_uint_lt(clen, 32 + 4 * 8 + 8 * 4 * 5 + 1);
    check_chunk_roundtrip(d, n, &o);

    /* Raw streams. */
    fill_data(d, n, ts, 2);
    o.raw_streams = 1;
    clen = iv_b2e_chunk(d, n, &o, c, sizeof c);
    ck_assert_uint_eq(clen, 32 + 4 * 8 + 8 * 4 * 4 + n);
    check_chunk_roundtrip(d, n, &o);

    /* Memcpyed. */
    o.raw_streams = 0;
    o.memcpyed = 1;
    clen = iv_b2e_chunk(d, n, &o, c, sizeof c);
    ck_assert_uint_eq(clen, 32 + n);
    ck_assert_uint_eq(c[2] & 0x02, 0x02);
    check_chunk_roundtrip(d, n, &o);
    free(d);
}
END_TEST

START_TEST(test_special_chunks)
{
    uint8_t c[64], out[64];
    size_t got;
    iv_err_t e;
    /* zeros */
    memset(out, 0xAA, sizeof out);
    size_t clen = iv_b2e_special_chunk(1, 40, 4, NULL, c, sizeof c);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
    ck_assert_uint_eq(got, 40);
    for (int i = 0; i < 40; i++) ck_assert_uint_eq(out[i], 0);
    ck_assert_uint_eq(out[40], 0xAA);
    /* NaN float32 and float64 */
    clen = iv_b2e_special_chunk(2, 16, 4, NULL, c, sizeof c);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
    for (int i = 0; i < 4; i++) {
        float f;
        memcpy(&f, out + 4 * i, 4);
        ck_assert(f != f);
    }
    clen = iv_b2e_special_chunk(2, 24, 8, NULL, c, sizeof c);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
    for (int i = 0; i < 3; i++) {
        double x;
        memcpy(&x, out + 8 * i, 8);
        ck_assert(x != x);
    }
    /* NaN of a 2-byte type is not defined */
    clen = iv_b2e_special_chunk(2, 8, 2, NULL, c, sizeof c);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), IV_EUNSUPPORTED);
    /* repeated value */
    const uint8_t v[2] = {0x34, 0x12};
    clen = iv_b2e_special_chunk(3, 10, 2, v, c, sizeof c);
    ck_assert_uint_eq(clen, 34);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
    ck_assert_uint_eq(got, 10);
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(out[2 * i] | out[2 * i + 1] << 8, 0x1234);
    /* the value must be present */
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, 33, out, sizeof out, &got, &e), IV_ECORRUPT);
    /* uninitialized comes out as zeros */
    memset(out, 0xAA, sizeof out);
    clen = iv_b2e_special_chunk(4, 12, 4, NULL, c, sizeof c);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
    for (int i = 0; i < 12; i++) ck_assert_uint_eq(out[i], 0);
}
END_TEST

static size_t make_frame(const uint8_t *d, size_t n, size_t chunksize, const iv_b2e_opts_t *o,
                         const uint8_t *special, uint8_t **frame)
{
    size_t cap = 2 * n + 4096 + (n / chunksize + 1) * 256;
    *frame = malloc(cap);
    size_t len = iv_b2e_frame(d, n, chunksize, o, special, *frame, cap);
    ck_assert_uint_gt(len, 0);
    return len;
}

START_TEST(test_frames)
{
    rng_state = 7;
    static const size_t sizes[] = {8, 1000, 8000, 65536, 100003 * 8};
    for (size_t ci = 0; ci < sizeof codecs / sizeof *codecs; ci++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            size_t n = sizes[si];
            uint8_t *d = malloc(n);
            fill_data(d, n, 8, (int)(si % 3));
            iv_b2e_opts_t o;
            memset(&o, 0, sizeof o);
            o.compcode = codecs[ci];
            o.typesize = 8;
            o.blocksize = 4096;
            o.filters[5] = 1;
            size_t chunksize = si % 2 ? 8000 : 32768; /* several chunks, odd last one */
            uint8_t *f;
            size_t flen = make_frame(d, n, chunksize, &o, NULL, &f);
            uint8_t *out = malloc(n);
            size_t got = 0;
            iv_err_t e;
            iv_err_clear(&e);
            int rc = iv_blosc2_frame_decode(f, flen, out, n, &got, &e);
            ck_assert_msg(rc == 0, "frame decode: %s", e.msg);
            ck_assert_uint_eq(got, n);
            ck_assert(memcmp(out, d, n) == 0);
            /* One byte less of capacity must be refused, not overflowed. */
            iv_err_clear(&e);
            ck_assert_int_lt(iv_blosc2_frame_decode(f, flen, out, n - 1, &got, &e), 0);
            free(out);
            free(f);
            free(d);
        }
}
END_TEST

START_TEST(test_frame_special_offsets)
{
    /* Four chunks of float32: data, zeros, NaN, uninit (last one short). */
    size_t chunk = 400, n = 3 * chunk + 100;
    uint8_t *d = malloc(n);
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i * 13);
    const uint8_t special[4] = {0, 1, 2, 4};
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_LZ4;
    o.typesize = 4;
    o.filters[5] = 1;
    uint8_t *f;
    size_t flen = make_frame(d, n, chunk, &o, special, &f);
    uint8_t *out = malloc(n);
    memset(out, 0xEE, n);
    size_t got;
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_frame_decode(f, flen, out, n, &got, &e), 0);
    ck_assert_uint_eq(got, n);
    ck_assert(memcmp(out, d, chunk) == 0);
    for (size_t i = chunk; i < 2 * chunk; i++) ck_assert_uint_eq(out[i], 0);
    for (size_t i = 2 * chunk; i < 3 * chunk; i += 4) {
        float x;
        memcpy(&x, out + i, 4);
        ck_assert(x != x);
    }
    for (size_t i = 3 * chunk; i < n; i++) ck_assert_uint_eq(out[i], 0);
    free(out);
    free(f);
    free(d);
}
END_TEST

/* ---- BloscLZ ------------------------------------------------------------ */

START_TEST(test_blosclz_hand_made)
{
    uint8_t out[4096];
    iv_err_t e;
    /* "ab" then a match of 10 at distance 2 (an overlapping copy); a
     * length above 8 takes the extension form: c = 7, ext = 10 - 9 = 1. */
    const uint8_t s1x[] = {0x01, 'a', 'b', 0xE0, 0x01, 0x01};
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s1x, sizeof s1x, out, 12, &e), 0);
    ck_assert(memcmp(out, "abababababab", 12) == 0);
    /* The first byte's top bits are ignored (level marker): literal
     * "xyz", a match of 3 at distance 1 ("zzz"), a literal "q". */
    const uint8_t s2b[] = {0x20 | 0x02, 'x', 'y', 'z', 0x20, 0x00, 0x00, 'q'};
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s2b, sizeof s2b, out, 7, &e), 0);
    ck_assert(memcmp(out, "xyzzzzq", 7) == 0);
    /* Near distance using the high bits: 300 literal bytes then copy 4
     * bytes from distance 300 (dd = 299 = 1<<8 | 43). */
    uint8_t s3[400];
    size_t k = 0;
    for (int run = 0; run < 10; run++) {
        s3[k++] = 29; /* 30 literals */
        for (int i = 0; i < 30; i++) s3[k++] = (uint8_t)(run * 30 + i);
    }
    s3[k++] = (uint8_t)(2 << 5 | 1); /* len 4, ofs high 1 */
    s3[k++] = 43;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s3, k, out, 304, &e), 0);
    for (int i = 0; i < 300; i++) ck_assert_uint_eq(out[i], (uint8_t)i);
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(out[300 + i], (uint8_t)i);
    /* Long length extension: 255 + 255 + 3 + 9 = 522 zeros after one. */
    const uint8_t s4[] = {0x00, 0x00, 0xE0, 255, 255, 3, 0x00};
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s4, sizeof s4, out, 523, &e), 0);
    for (int i = 0; i < 523; i++) ck_assert_uint_eq(out[i], 0);
    /* Errors: distance before the start, output overrun, truncated input. */
    const uint8_t b1[] = {0x00, 'a', 0x20, 0x05};
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(b1, sizeof b1, out, 4, &e), IV_ECORRUPT);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s1x, sizeof s1x, out, 11, &e), IV_ECORRUPT);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s1x, sizeof s1x, out, 13, &e), IV_ECORRUPT);
    for (size_t cut = 0; cut < sizeof s4; cut++) {
        iv_err_clear(&e);
        ck_assert_int_lt(iv_blosclz_decode(s4, cut, out, 523, &e), 0);
    }
}
END_TEST

START_TEST(test_blosclz_far_distance)
{
    /* 20000 distinct-ish bytes, then a copy of 40 from distance 10000:
     * needs the 16-bit far form (dist - 8192 = 1808). */
    size_t n = 20040;
    uint8_t *d = malloc(n), *out = malloc(n), *s = malloc(n * 2);
    rng_state = 5;
    for (size_t i = 0; i < 20000; i++) d[i] = (uint8_t)rnd();
    memcpy(d + 20000, d + 10000, 40);
    size_t k = 0;
    for (size_t i = 0; i < 20000; i += 32) {
        size_t run = 20000 - i < 32 ? 20000 - i : 32;
        s[k++] = (uint8_t)(run - 1);
        memcpy(s + k, d + i, run);
        k += run;
    }
    s[k++] = 0xE0 | 31;
    s[k++] = 40 - 9;
    s[k++] = 255;
    s[k++] = (uint8_t)((10000 - 8192) >> 8);
    s[k++] = (uint8_t)((10000 - 8192) & 255);
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s, k, out, n, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    /* The test encoder must produce decodable far matches too. */
    size_t clen = iv_b2e_blosclz(d, n, 0, s, n * 2);
    ck_assert_uint_gt(clen, 0);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s, clen, out, n, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    clen = iv_b2e_blosclz(d, n, 1, s, n * 2);
    ck_assert_uint_gt(clen, n);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosclz_decode(s, clen, out, n, &e), 0);
    ck_assert(memcmp(out, d, n) == 0);
    free(d);
    free(out);
    free(s);
}
END_TEST

/* ---- bad input ----------------------------------------------------------- */

START_TEST(test_truncation_every_length)
{
    rng_state = 11;
    size_t n = 3000;
    uint8_t *d = malloc(n), *out = malloc(n);
    fill_data(d, n, 4, 0);
    for (size_t ci = 0; ci < sizeof codecs / sizeof *codecs; ci++) {
        iv_b2e_opts_t o;
        memset(&o, 0, sizeof o);
        o.compcode = codecs[ci];
        o.typesize = 4;
        o.blocksize = 512;
        o.filters[5] = 1;
        uint8_t *f;
        size_t flen = make_frame(d, n, 1024, &o, NULL, &f);
        size_t got;
        iv_err_t e;
        for (size_t cut = 0; cut < flen; cut++) {
            /* A private copy of exactly cut bytes lets ASan see any read
             * past the end. */
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, f, cut);
            iv_err_clear(&e);
            int rc = iv_blosc2_frame_decode(t, cut, out, n, &got, &e);
            ck_assert_msg(rc < 0, "truncated frame (%zu of %zu) accepted", cut, flen);
            ck_assert(e.msg[0] != '\0');
            free(t);
        }
        /* Bare chunk truncated. */
        uint8_t c[8192];
        size_t clen = iv_b2e_chunk(d, n, &o, c, sizeof c);
        for (size_t cut = 0; cut < clen; cut++) {
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, c, cut);
            iv_err_clear(&e);
            ck_assert_int_lt(iv_blosc2_chunk_decode(t, cut, out, n, &got, &e), 0);
            free(t);
        }
        free(f);
    }
    free(d);
    free(out);
}
END_TEST

START_TEST(test_bit_flips)
{
    rng_state = 0xC0FFEE;
    size_t n = 5000;
    uint8_t *d = malloc(n), *out = malloc(n);
    fill_data(d, n, 2, 0);
    int failures = 0, trials = 0;
    for (size_t ci = 0; ci < sizeof codecs / sizeof *codecs; ci++) {
        iv_b2e_opts_t o;
        memset(&o, 0, sizeof o);
        o.compcode = codecs[ci];
        o.typesize = 2;
        o.blocksize = 1024;
        o.filters[5] = (uint8_t)(ci % 3);
        uint8_t *f;
        size_t flen = make_frame(d, n, 2048, &o, NULL, &f);
        uint8_t *t = malloc(flen);
        for (int trial = 0; trial < 600; trial++) {
            memcpy(t, f, flen);
            int flips = 1 + (int)(rnd() % 3);
            for (int k = 0; k < flips; k++) t[rnd() % flen] ^= (uint8_t)(1u << (rnd() % 8));
            size_t got = 0;
            iv_err_t e;
            iv_err_clear(&e);
            int rc = iv_blosc2_frame_decode(t, flen, out, n, &got, &e);
            trials++;
            if (rc < 0) {
                failures++;
                ck_assert(e.msg[0] != '\0');
            } else {
                ck_assert_uint_le(got, n);
            }
        }
        free(t);
        free(f);
    }
    /* Most flips land in data and still decode (to other bytes); the
     * point is that none crashes; some must be caught by the checks. */
    ck_assert_int_gt(failures, 0);
    ck_assert_int_gt(trials, failures - 1);
    free(d);
    free(out);
}
END_TEST

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * (7 - i)));
}

START_TEST(test_lying_sizes)
{
    rng_state = 3;
    size_t n = 4096;
    uint8_t *d = malloc(n), *out = malloc(2 * n);
    fill_data(d, n, 4, 0);
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_LZ4;
    o.typesize = 4;
    o.blocksize = 1024;
    o.filters[5] = 1;
    uint8_t c[8192], t[8192];
    size_t clen = iv_b2e_chunk(d, n, &o, c, sizeof c), got;
    iv_err_t e;

    /* nbytes larger than the capacity */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, n - 1, &got, &e), IV_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(e.msg, "nbytes"));
    /* nbytes larger than the data (more blocks than the table holds) */
    memcpy(t, c, clen);
    put_le32(t + 4, (uint32_t)(2 * n));
    iv_err_clear(&e);
    ck_assert_int_lt(iv_blosc2_chunk_decode(t, clen, out, 2 * n, &got, &e), 0);
    /* cbytes past the end of the input */
    memcpy(t, c, clen);
    put_le32(t + 12, (uint32_t)clen + 1);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, n, &got, &e), IV_ECORRUPT);
    /* a bstart past the end, and one pointing into the table */
    memcpy(t, c, clen);
    put_le32(t + 32 + 4 * 2, (uint32_t)clen + 100);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, n, &got, &e), IV_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(e.msg, "block 2"));
    memcpy(t, c, clen);
    put_le32(t + 32, 36);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, n, &got, &e), IV_ECORRUPT);
    /* a stream csize past the end */
    memcpy(t, c, clen);
    uint32_t b3 = (uint32_t)t[32 + 12] | (uint32_t)t[32 + 13] << 8;
    put_le32(t + b3, 0x7fff0000);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, n, &got, &e), IV_ECORRUPT);
    /* a memcpyed chunk whose cbytes disagree with nbytes */
    o.memcpyed = 1;
    size_t mlen = iv_b2e_chunk(d, 100, &o, t, sizeof t);
    put_le32(t + 4, 120);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, mlen, out, n, &got, &e), IV_ECORRUPT);
    o.memcpyed = 0;

    /* Frames: header_len past the end, frame_len past the end, cbytes
     * past the frame, nbytes past the capacity, offsets lying. */
    uint8_t *f;
    size_t flen = make_frame(d, n, 2048, &o, NULL, &f);
    uint8_t *g = malloc(flen);
    memcpy(g, f, flen);
    g[11] = 0x7f;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_frame_decode(g, flen, out, n, &got, &e), IV_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(e.msg, "header_len"));
    memcpy(g, f, flen);
    put_be64(g + 16, flen + 1);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_frame_decode(g, flen, out, n, &got, &e), IV_ECORRUPT);
    memcpy(g, f, flen);
    put_be64(g + 39, flen);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_frame_decode(g, flen, out, n, &got, &e), IV_ECORRUPT);
    memcpy(g, f, flen);
    put_be64(g + 30, 3 * n);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_frame_decode(g, flen, out, 2 * n, &got, &e), IV_ECORRUPT);
    /* offsets index lying: rebuild a frame whose index points past the data */
    {
        uint8_t raw[16];
        uint64_t offs[2] = {0, 1u << 20};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 8; i++) raw[8 * k + i] = (uint8_t)(offs[k] >> (8 * i));
        iv_b2e_opts_t io;
        memset(&io, 0, sizeof io);
        io.compcode = IV_B2E_LZ4;
        io.typesize = 8;
        io.memcpyed = 1;
        uint32_t hl = 97;
        uint64_t cb = 0;
        for (int i = 0; i < 8; i++) cb = cb << 8 | f[39 + i];
        memcpy(g, f, hl + cb);
        size_t il = iv_b2e_chunk(raw, 16, &io, g + hl + cb, flen - hl - cb);
        ck_assert_uint_gt(il, 0);
        put_be64(g + 16, hl + cb + il);
        iv_err_clear(&e);
        ck_assert_int_eq(iv_blosc2_frame_decode(g, hl + cb + il, out, n, &got, &e), IV_ECORRUPT);
        ck_assert_ptr_nonnull(strstr(e.msg, "offset"));
        /* an index with the wrong number of entries */
        il = iv_b2e_chunk(raw, 8, &io, g + hl + cb, flen - hl - cb);
        put_be64(g + 16, hl + cb + il);
        iv_err_clear(&e);
        ck_assert_int_eq(iv_blosc2_frame_decode(g, hl + cb + il, out, n, &got, &e), IV_ECORRUPT);
        /* a special offset of an unknown kind */
        offs[1] = (uint64_t)0x88 << 56;
        for (int i = 0; i < 8; i++) raw[8 + i] = (uint8_t)(offs[1] >> (8 * i));
        il = iv_b2e_chunk(raw, 16, &io, g + hl + cb, flen - hl - cb);
        put_be64(g + 16, hl + cb + il);
        iv_err_clear(&e);
        ck_assert_int_eq(iv_blosc2_frame_decode(g, hl + cb + il, out, n, &got, &e), IV_ECORRUPT);
    }
    free(g);
    free(f);
    free(d);
    free(out);
}
END_TEST

START_TEST(test_unsupported_features)
{
    uint8_t d[256], c[1024], out[256];
    for (int i = 0; i < 256; i++) d[i] = (uint8_t)i;
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_LZ4;
    o.typesize = 4;
    o.filters[5] = 1;
    size_t clen = iv_b2e_chunk(d, 256, &o, c, sizeof c), got;
    iv_err_t e;
    struct {
        int byte;
        uint8_t set;
        const char *word;
    } cases[] = {
        {31, 0x01, "dictionary"}, {31, 0x08, "lazy"}, {30, 0x01, "variable"},
        {2, 0xC0, "codec"},       {18, 0x05, "filter"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t t[1024];
        memcpy(t, c, clen);
        if (cases[i].byte == 2)
            t[2] = (uint8_t)((t[2] & 0x1f) | 0xC0); /* format 6: user-defined */
        else
            t[cases[i].byte] |= cases[i].set;
        iv_err_clear(&e);
        ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, sizeof out, &got, &e),
                         IV_EUNSUPPORTED);
        ck_assert_msg(strstr(e.msg, cases[i].word) != NULL, "message '%s' lacks '%s'", e.msg,
                      cases[i].word);
    }
    /* A Blosc1 (16-byte header) chunk is named as such. */
    uint8_t t[1024];
    memcpy(t, c, clen);
    t[2] &= (uint8_t)~0x04;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_blosc2_chunk_decode(t, clen, out, sizeof out, &got, &e), IV_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.msg, "Blosc1"));
}
END_TEST

START_TEST(test_scratch_release)
{
    /* Decoding allocates per-thread scratch once; releasing it and
     * decoding again must work (and leave nothing behind under ASan). */
    uint8_t d[4096], c[8192], out[4096];
    rng_state = 1;
    fill_data(d, sizeof d, 4, 0);
    iv_b2e_opts_t o;
    memset(&o, 0, sizeof o);
    o.compcode = IV_B2E_ZSTD;
    o.typesize = 4;
    o.filters[5] = 1;
    size_t clen = iv_b2e_chunk(d, sizeof d, &o, c, sizeof c), got;
    iv_err_t e;
    for (int k = 0; k < 3; k++) {
        iv_err_clear(&e);
        ck_assert_int_eq(iv_blosc2_chunk_decode(c, clen, out, sizeof out, &got, &e), 0);
        ck_assert(memcmp(out, d, sizeof d) == 0);
        iv_codec_thread_release();
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("blosc2");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_roundtrip_matrix, 0, 1);
    tcase_add_test(tc, test_stream_kinds);
    tcase_add_test(tc, test_special_chunks);
    tcase_add_test(tc, test_frames);
    tcase_add_test(tc, test_frame_special_offsets);
    tcase_add_test(tc, test_blosclz_hand_made);
    tcase_add_test(tc, test_blosclz_far_distance);
    tcase_add_test(tc, test_truncation_every_length);
    tcase_add_test(tc, test_bit_flips);
    tcase_add_test(tc, test_lying_sizes);
    tcase_add_test(tc, test_unsupported_features);
    tcase_add_test(tc, test_scratch_release);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int rc = iv_check_run(suite());
    iv_codec_thread_release();
    return rc;
}
