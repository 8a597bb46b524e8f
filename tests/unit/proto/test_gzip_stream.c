/* gzip members of independently compressed pieces (proto/gzip_stream.c):
 * whatever the pieces, zlib inflates the member to exactly their
 * concatenation and accepts its CRC-32 and length. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "error.h"
#include "gzip_stream.h"
#include "pool.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random bytes (incompressible) or text-like ones (NDJSON numbers). */
static void fill(unsigned char *p, size_t n, int compressible)
{
    for (size_t i = 0; i < n; i++) {
        if (!compressible) p[i] = (unsigned char)rnd();
        else p[i] = "0123456789,.[]\"e\n"[rnd() % (rnd() % 3 ? 11 : 17)];
    }
}

/* One piece of a body: compressed at level, or stored when level is 0. */
typedef struct {
    const unsigned char *p;
    size_t n;
    int level;
} piece_t;

/* The member of the pieces, each compressed into a buffer of its own
 * (last first, as parallel workers may finish), then joined in order. */
static void build(iv_buf_t *out, const piece_t *pc, size_t k)
{
    iv_buf_t *parts = calloc(k ? k : 1, sizeof *parts);
    uint32_t *crc = calloc(k ? k : 1, sizeof *crc);
    ck_assert_ptr_nonnull(parts);
    ck_assert_ptr_nonnull(crc);
    for (size_t i = k; i-- > 0;) {
        iv_buf_init(&parts[i]);
        if (pc[i].level) ck_assert_int_eq(iv_gz_block(&parts[i], pc[i].p, pc[i].n, pc[i].level, &crc[i]), 0);
        else iv_gz_stored(&parts[i], pc[i].p, pc[i].n, &crc[i]);
        ck_assert(!parts[i].oom);
        ck_assert_uint_eq(crc[i], crc32(crc32(0, Z_NULL, 0), pc[i].p, (uInt)pc[i].n));
        if (pc[i].n == 0 && pc[i].level) ck_assert_uint_eq(parts[i].len, 0);
    }
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    iv_buf_init(out);
    iv_gz_header(out);
    for (size_t i = 0; i < k; i++) {
        iv_buf_append(out, parts[i].data, parts[i].len);
        iv_gz_sum_add(&s, crc[i], pc[i].n);
        iv_buf_free(&parts[i]);
    }
    iv_gz_finish(out, &s);
    ck_assert(!out->oom);
    free(parts);
    free(crc);
}

/* Inflates a whole gzip member with zlib (which checks the CRC and ISIZE)
 * and asserts that it gives exactly want[0..n) and nothing follows. */
static void check_inflates_to(const iv_buf_t *gz, const unsigned char *want, size_t n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(inflateInit2(&z, 15 + 16), Z_OK);
    unsigned char *got = malloc(n + 64);
    ck_assert_ptr_nonnull(got);
    z.next_in = (Bytef *)gz->data;
    z.avail_in = (uInt)gz->len;
    z.next_out = got;
    z.avail_out = (uInt)(n + 64);
    int zr = inflate(&z, Z_FINISH);
    ck_assert_int_eq(zr, Z_STREAM_END);
    ck_assert_uint_eq(z.avail_in, 0);
    ck_assert_uint_eq(z.total_out, n);
    ck_assert(n == 0 || memcmp(got, want, n) == 0);
    inflateEnd(&z);
    free(got);
}

/* The pieces' concatenation, the identity body. */
static unsigned char *concat(const piece_t *pc, size_t k, size_t *n)
{
    size_t t = 0;
    for (size_t i = 0; i < k; i++) t += pc[i].n;
    unsigned char *b = malloc(t + 1), *w = b;
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < k; i++) {
        if (pc[i].n) memcpy(w, pc[i].p, pc[i].n);
        w += pc[i].n;
    }
    *n = t;
    return b;
}

static void roundtrip(const piece_t *pc, size_t k)
{
    iv_buf_t gz;
    build(&gz, pc, k);
    size_t n;
    unsigned char *body = concat(pc, k, &n);
    check_inflates_to(&gz, body, n);
    free(body);
    iv_buf_free(&gz);
}

START_TEST(empty_body)
{
    /* No piece at all: header, empty final block, trailer of zeros. */
    iv_buf_t gz;
    build(&gz, NULL, 0);
    ck_assert_uint_eq(gz.len, IV_GZ_HEADER_BYTES + IV_GZ_TRAILER_BYTES);
    check_inflates_to(&gz, NULL, 0);
    iv_buf_free(&gz);
}
END_TEST

START_TEST(one_block)
{
    static const int levels[] = {1, 3, 6, 9};
    for (int c = 0; c < 2; c++) {
        for (size_t li = 0; li < sizeof levels / sizeof *levels; li++) {
            size_t n = 200000 + (size_t)(rnd() % 1000);
            unsigned char *b = malloc(n);
            ck_assert_ptr_nonnull(b);
            fill(b, n, c);
            piece_t pc = {b, n, levels[li]};
            roundtrip(&pc, 1);
            /* The member ends with the empty final block and the trailer
             * of the body's CRC and length. */
            iv_buf_t gz;
            build(&gz, &pc, 1);
            const unsigned char *t = (const unsigned char *)gz.data + gz.len - 10;
            uint32_t crc = (uint32_t)crc32(crc32(0, Z_NULL, 0), b, (uInt)n);
            ck_assert_uint_eq(t[0], 0x03);
            ck_assert_uint_eq(t[1], 0x00);
            ck_assert_uint_eq((uint32_t)t[2] | (uint32_t)t[3] << 8 | (uint32_t)t[4] << 16 | (uint32_t)t[5] << 24,
                              crc);
            ck_assert_uint_eq((uint32_t)t[6] | (uint32_t)t[7] << 8 | (uint32_t)t[8] << 16 | (uint32_t)t[9] << 24,
                              (uint32_t)n);
            /* Compressible input shrinks; random input stays near its size. */
            if (c) ck_assert_uint_lt(gz.len, n * 3 / 4);
            else ck_assert_uint_lt(gz.len, n + n / 50 + 64);
            iv_buf_free(&gz);
            free(b);
        }
    }
}
END_TEST

START_TEST(many_blocks_with_empty_ones)
{
    for (int iter = 0; iter < 20; iter++) {
        size_t k = 1 + (size_t)(rnd() % 60);
        piece_t *pc = calloc(k, sizeof *pc);
        unsigned char **bufs = calloc(k, sizeof *bufs);
        ck_assert_ptr_nonnull(pc);
        ck_assert_ptr_nonnull(bufs);
        for (size_t i = 0; i < k; i++) {
            size_t r = rnd() % 8;
            /* Empty pieces, tiny ones, and ones past a stored block's
             * 65,535 bytes. */
            size_t n = r == 0 ? 0 : r == 1 ? 1 + rnd() % 16 : r == 2 ? 65535 + rnd() % 70000 : rnd() % 30000;
            bufs[i] = malloc(n + 1);
            ck_assert_ptr_nonnull(bufs[i]);
            fill(bufs[i], n, (int)(rnd() % 2));
            int lv = (int)(rnd() % 5);
            pc[i] = (piece_t){bufs[i], n, lv == 4 ? 6 : lv};  /* 0 = stored */
        }
        roundtrip(pc, k);
        for (size_t i = 0; i < k; i++) free(bufs[i]);
        free(bufs);
        free(pc);
    }
}
END_TEST

START_TEST(stored_pieces)
{
    /* The loop writes the stream's header and trailer records stored. */
    static unsigned char big[200000];
    fill(big, sizeof big, 1);
    piece_t pc[] = {{(const unsigned char *)"IVQS", 4, 0}, {big, sizeof big, 1},
                    {big, 65535, 0}, {big, 65536, 0}, {big, 0, 0}, {(const unsigned char *)"end\n", 4, 0}};
    roundtrip(pc, sizeof pc / sizeof *pc);
    /* A stored piece is its bytes plus five per 65,535. */
    iv_buf_t b;
    iv_buf_init(&b);
    uint32_t crc;
    iv_gz_stored(&b, big, 65536, &crc);
    ck_assert_uint_eq(b.len, 65536 + 10);
    iv_buf_free(&b);
}
END_TEST

START_TEST(a_piece_that_shrinks_little_goes_stored)
{
    /* Bytes of six random bits each: deflate leaves them at about three
     * quarters of their size.  At a fast level the piece is sent stored
     * (its bytes, five more in 65,535), byte for byte what iv_gz_stored
     * writes; at level 6 it is compressed all the same; a piece that
     * shrinks by more than a third is compressed at level 1.  All three
     * inflate to their bytes. */
    static unsigned char six[200000], text[200000];
    for (size_t i = 0; i < sizeof six; i++) six[i] = (unsigned char)(rnd() & 63);
    fill(text, sizeof text, 1);
    iv_buf_t fast, stored, slow, small;
    iv_buf_init(&fast);
    iv_buf_init(&stored);
    iv_buf_init(&slow);
    iv_buf_init(&small);
    uint32_t c1, c2, c3, c4;
    ck_assert_int_eq(iv_gz_block(&fast, six, sizeof six, 1, &c1), 0);
    iv_gz_stored(&stored, six, sizeof six, &c2);
    ck_assert_uint_eq(c1, c2);
    ck_assert_uint_eq(fast.len, sizeof six + 5 * 4);
    ck_assert_mem_eq(fast.data, stored.data, stored.len);
    ck_assert_int_eq(iv_gz_block(&slow, six, sizeof six, IV_GZ_FAST_LEVEL + 1, &c3), 0);
    ck_assert_uint_lt(slow.len, sizeof six * 4 / 5);
    ck_assert_int_eq(iv_gz_block(&small, text, sizeof text, 1, &c4), 0);
    ck_assert_uint_lt(small.len * 3, sizeof text * 2);
    piece_t pc[] = {{six, sizeof six, 1}, {text, sizeof text, 1}, {six, sizeof six, IV_GZ_FAST_LEVEL + 1},
                    {six, 1000, IV_GZ_FAST_LEVEL}};
    roundtrip(pc, sizeof pc / sizeof *pc);
    iv_buf_free(&fast);
    iv_buf_free(&stored);
    iv_buf_free(&slow);
    iv_buf_free(&small);
}
END_TEST

START_TEST(bad_level)
{
    iv_buf_t b;
    iv_buf_init(&b);
    uint32_t crc;
    ck_assert_int_eq(iv_gz_block(&b, "abc", 3, 0, &crc), IV_EINVALID_ARG);
    ck_assert_int_eq(iv_gz_block(&b, "abc", 3, 10, &crc), IV_EINVALID_ARG);
    ck_assert_uint_eq(b.len, 0);
    iv_buf_free(&b);
}
END_TEST

START_TEST(sum_counts_length_mod_2_32)
{
    /* Lengths past 4 GiB, simulated: ISIZE is the length mod 2^32, and the
     * combined CRC does not depend on how the body was cut. */
    static unsigned char zeros[1 << 20];
    uint32_t cz = (uint32_t)crc32(crc32(0, Z_NULL, 0), zeros, sizeof zeros);
    iv_gz_sum_t a, b;
    iv_gz_sum_init(&a);
    iv_gz_sum_init(&b);
    for (int i = 0; i < 5 * 1024; i++) iv_gz_sum_add(&a, cz, sizeof zeros);  /* 5 GiB in 1 MiB pieces */
    uint32_t c5 = 0;
    for (int i = 0; i < 5 * 1024; i++) c5 = (uint32_t)crc32_combine(c5, cz, (z_off_t)sizeof zeros);
    iv_gz_sum_add(&b, c5, (uint64_t)5 << 30);  /* one 5 GiB piece */
    ck_assert_uint_eq(a.isize, (uint32_t)1 << 30);
    ck_assert_uint_eq(b.isize, (uint32_t)1 << 30);
    ck_assert_uint_eq(a.crc, b.crc);
    ck_assert_uint_eq(a.crc, c5);
    /* An empty piece changes nothing. */
    iv_gz_sum_add(&a, 0, 0);
    ck_assert_uint_eq(a.crc, c5);
    iv_gz_sum_t e;
    iv_gz_sum_init(&e);
    iv_gz_sum_add(&e, 0xdeadbeef, (uint64_t)1 << 32);
    ck_assert_uint_eq(e.isize, 0);
}
END_TEST

START_TEST(inflates_past_4_gib)
{
    /* A real member of 4 GiB + 1 MiB of body, inflated by zlib, which
     * checks ISIZE mod 2^32 and the CRC: every piece is the same 1 MiB of
     * zeros, and a fresh deflate state gives the same bytes each time, so
     * the member is one small compressed piece written 4,097 times. */
    static unsigned char zeros[1 << 20], out[1 << 20];
    iv_buf_t piece;
    iv_buf_init(&piece);
    uint32_t cz;
    ck_assert_int_eq(iv_gz_block(&piece, zeros, sizeof zeros, 1, &cz), 0);
    const int k = 4097;
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    iv_buf_t gz;
    iv_buf_init(&gz);
    iv_gz_header(&gz);
    for (int i = 0; i < k; i++) {
        iv_buf_append(&gz, piece.data, piece.len);
        iv_gz_sum_add(&s, cz, sizeof zeros);
    }
    iv_gz_finish(&gz, &s);
    ck_assert(!gz.oom);
    ck_assert_uint_eq(s.isize, (uint32_t)sizeof zeros);
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(inflateInit2(&z, 15 + 16), Z_OK);
    z.next_in = (Bytef *)gz.data;
    z.avail_in = (uInt)gz.len;
    int zr = Z_OK;
    uint64_t total = 0;
    while (zr == Z_OK) {
        z.next_out = out;
        z.avail_out = sizeof out;
        zr = inflate(&z, Z_NO_FLUSH);
        size_t got = sizeof out - z.avail_out;
        ck_assert(got == 0 || (out[0] == 0 && memcmp(out, out + 1, got - 1) == 0));
        total += got;
    }
    ck_assert_int_eq(zr, Z_STREAM_END);
    ck_assert_uint_eq(z.avail_in, 0);
    ck_assert_uint_eq(total, (uint64_t)k << 20);
    inflateEnd(&z);
    iv_buf_free(&gz);
    iv_buf_free(&piece);
}
END_TEST

START_TEST(crc_mismatch_is_caught)
{
    /* The check above can fail: a trailer summed over a wrong length is
     * refused by zlib. */
    unsigned char b[1000];
    fill(b, sizeof b, 1);
    iv_buf_t gz;
    iv_buf_init(&gz);
    iv_gz_header(&gz);
    uint32_t crc;
    ck_assert_int_eq(iv_gz_block(&gz, b, sizeof b, 1, &crc), 0);
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    iv_gz_sum_add(&s, crc, sizeof b + 1);
    iv_gz_finish(&gz, &s);
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(inflateInit2(&z, 15 + 16), Z_OK);
    unsigned char out[2000];
    z.next_in = (Bytef *)gz.data;
    z.avail_in = (uInt)gz.len;
    z.next_out = out;
    z.avail_out = sizeof out;
    ck_assert_int_eq(inflate(&z, Z_FINISH), Z_DATA_ERROR);
    inflateEnd(&z);
    iv_buf_free(&gz);
}
END_TEST

START_TEST(whole_member_in_parallel)
{
    /* A whole body (the JSON document) in 1 MiB pieces on a pool, and on
     * the caller alone: both inflate to the body, and give equal bytes. */
    size_t sizes[] = {0, 1, IV_GZ_PIECE_BYTES, 3 * IV_GZ_PIECE_BYTES + 12345};
    iv_pool_t *pool = iv_pool_create(2, 0);
    ck_assert_ptr_nonnull(pool);
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        size_t n = sizes[t];
        unsigned char *b = malloc(n + 1);
        ck_assert_ptr_nonnull(b);
        fill(b, n, (int)(t % 2));
        iv_buf_t a, c;
        iv_buf_init(&a);
        iv_buf_init(&c);
        ck_assert_int_eq(iv_gz_member(&a, b, n, 1, pool), 0);
        ck_assert_int_eq(iv_gz_member(&c, b, n, 1, NULL), 0);
        check_inflates_to(&a, b, n);
        ck_assert_uint_eq(a.len, c.len);
        ck_assert(memcmp(a.data, c.data, a.len) == 0);
        iv_buf_free(&a);
        iv_buf_free(&c);
        free(b);
    }
    iv_pool_destroy(pool);
}
END_TEST

START_TEST(one_block_in_parallel_pieces)
{
    /* A streamed block's bytes cut in pieces on a pool (iv_gz_pieces),
     * between two plain pieces of the same member: the member inflates to
     * the three bodies in order, the pieces' CRC is the block's own, and
     * the bytes do not depend on the pool. */
    const size_t piece = 4096;
    size_t sizes[] = {0, 1, piece, piece + 1, 37 * piece + 123};
    iv_pool_t *pool = iv_pool_create(3, 0);
    ck_assert_ptr_nonnull(pool);
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        size_t n = sizes[t], m = 1000, all = m + n + m;
        unsigned char *b = malloc(all + 1);
        ck_assert_ptr_nonnull(b);
        fill(b, all, (int)(t % 2));
        iv_buf_t a, c;
        iv_buf_init(&a);
        iv_buf_init(&c);
        uint32_t c0, c1, c2, cc;
        iv_gz_header(&a);
        ck_assert_int_eq(iv_gz_block(&a, b, m, 1, &c0), 0);
        ck_assert_int_eq(iv_gz_pieces(&a, b + m, n, piece, 1, &c1, pool), 0);
        ck_assert_int_eq(iv_gz_pieces(&c, b + m, n, piece, 1, &cc, NULL), 0);
        ck_assert_int_eq(iv_gz_block(&a, b + m + n, m, 1, &c2), 0);
        ck_assert_uint_eq(c1, crc32(crc32(0, Z_NULL, 0), b + m, (uInt)n));
        ck_assert_uint_eq(cc, c1);
        iv_gz_sum_t s;
        iv_gz_sum_init(&s);
        iv_gz_sum_add(&s, c0, m);
        iv_gz_sum_add(&s, c1, n);
        iv_gz_sum_add(&s, c2, m);
        iv_gz_finish(&a, &s);
        check_inflates_to(&a, b, all);
        /* The pooled pieces equal the caller's, byte for byte. */
        iv_buf_t a2;
        iv_buf_init(&a2);
        ck_assert_int_eq(iv_gz_pieces(&a2, b + m, n, piece, 1, &cc, pool), 0);
        ck_assert_uint_eq(a2.len, c.len);
        ck_assert(c.len == 0 || memcmp(a2.data, c.data, c.len) == 0);
        iv_buf_free(&a);
        iv_buf_free(&a2);
        iv_buf_free(&c);
        free(b);
    }
    uint32_t crc;
    iv_buf_t z;
    iv_buf_init(&z);
    ck_assert_int_eq(iv_gz_pieces(&z, "abc", 3, 1, 0, &crc, pool), IV_EINVALID_ARG);
    iv_buf_free(&z);
    iv_pool_destroy(pool);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gzip_stream");
    TCase *tc = tcase_create("member");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, empty_body);
    tcase_add_test(tc, one_block_in_parallel_pieces);
    tcase_add_test(tc, one_block);
    tcase_add_test(tc, many_blocks_with_empty_ones);
    tcase_add_test(tc, stored_pieces);
    tcase_add_test(tc, a_piece_that_shrinks_little_goes_stored);
    tcase_add_test(tc, bad_level);
    tcase_add_test(tc, sum_counts_length_mod_2_32);
    tcase_add_test(tc, inflates_past_4_gib);
    tcase_add_test(tc, crc_mismatch_is_caught);
    tcase_add_test(tc, whole_member_in_parallel);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
