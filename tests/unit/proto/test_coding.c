/* Tests of the content coding of answers (proto/coding.c): the q-value
 * parser of Accept-Encoding, the coding each kind of answer gets, and a
 * document's encoding.  The table pins the choices the query streams and
 * the viewer routes made before the choice was one function, malformed
 * headers included.  br output is decoded by the viewer's Python tests
 * (test_http_viewer.py, with the system's libbrotlidec). */
#include <check.h>

#include "check_main.h"
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "coding.h"

#define ID IV_CODING_IDENTITY
#define GZ IV_CODING_GZIP
#define BR IV_CODING_BR

START_TEST(test_coding_q)
{
    ck_assert(iv_coding_q(NULL, "gzip") == -1);
    ck_assert(iv_coding_q("", "gzip") == -1);
    ck_assert(iv_coding_q("gzip", "gzip") == 1);
    ck_assert(iv_coding_q("GZip", "gzip") == 1);
    ck_assert(iv_coding_q("br", "gzip") == -1);
    ck_assert(iv_coding_q("br;q=0.9, gzip;q=0.5", "gzip") == 0.5);
    ck_assert(iv_coding_q("br;q=0.9, gzip;q=0.5", "br") == 0.9);
    ck_assert(iv_coding_q("gzip;q=0", "gzip") == 0);
    ck_assert(iv_coding_q("*", "gzip") == 1);
    ck_assert(iv_coding_q("*;q=0", "gzip") == 0);
    ck_assert(iv_coding_q("*;q=0.2, gzip", "gzip") == 1);   /* the named entry wins */
    ck_assert(iv_coding_q("gzip;q=0, *", "gzip") == 0);
    ck_assert(iv_coding_q("identity;q=0", "identity") == 0);
    ck_assert(iv_coding_q("identity;q=0", "gzip") == -1);
    ck_assert(iv_coding_q("deflate, gzip ;q=0.3", "gzip") == 0.3);
    ck_assert(iv_coding_q("gzipx", "gzip") == -1);
    /* The last entry naming a coding counts; a negative q on it falls
     * back to "*", whose q is taken whatever it is. */
    ck_assert(iv_coding_q("gzip;q=0.5, gzip;q=0.25", "gzip") == 0.25);
    ck_assert(iv_coding_q("gzip;q=0.5, gzip;q=-1", "gzip") == -1);
    ck_assert(iv_coding_q("gzip;q=-1, *;q=0.5", "gzip") == 0.5);
    ck_assert(iv_coding_q("*;q=-2", "gzip") == -2);
    ck_assert(iv_coding_q("gzip;q=abc", "gzip") == 0);
    ck_assert(iv_coding_q("gzip;Q=0", "gzip") == 1);
    ck_assert(iv_coding_q("gzip;q=0.5;q=0", "gzip") == 0.5);
    /* A "q=" of the next entry is not this entry's. */
    ck_assert(iv_coding_q("gzip;level=1, br;q=0", "gzip") == 1);
}
END_TEST

/* A header and the coding of a query stream (gzip level 1) and of a
 * document (the viewer routes' level). */
static const struct {
    const char *h;
    iv_coding_t stream, document;
} picks[] = {
    /* No header, or one that names nothing. */
    {NULL, ID, ID},
    {"", ID, ID},
    {" ", ID, ID},
    {",", ID, ID},
    {" , ,", ID, ID},
    {";", ID, ID},
    {";q=0", ID, ID},
    {"identity", ID, ID},
    {"identity;q=0.5", ID, ID},
    {"deflate", ID, ID},
    {"compress, deflate", ID, ID},
    {"x-gzip", ID, ID},
    {"gzipx", ID, ID},
    {"**", ID, ID},
    /* gzip named: case, spaces around the token and empty entries do not
     * matter; an entry without a q, or with one the parser does not see
     * ("Q=", "q = 0"), has q 1. */
    {"gzip", GZ, GZ},
    {"GZIP", GZ, GZ},
    {"GZip", GZ, GZ},
    {" gzip ", GZ, GZ},
    {"gzip,", GZ, GZ},
    {",gzip", GZ, GZ},
    {"gzip;", GZ, GZ},
    {"gzip;q", GZ, GZ},
    {"gzip;q=1", GZ, GZ},
    {"gzip;q=1.0", GZ, GZ},
    {"gzip;q=0.001", GZ, GZ},
    {"gzip;q=2", GZ, GZ},
    {"gzip ;q=0.3", GZ, GZ},
    {"deflate, gzip ;q=0.3", GZ, GZ},
    {"gzip ; q = 0", GZ, GZ},
    {"gzip;Q=0", GZ, GZ},
    {"gzip;level=1", GZ, GZ},
    {"gzip;q=0.5;q=0", GZ, GZ},
    {"gzip;q=inf", GZ, GZ},
    {"gzip;q=0x1", GZ, GZ},
    /* gzip refused: a q of 0 however written.  The parser takes the first
     * "q=" after the ';' ("xq=0" too) and the number strtod reads there,
     * so "q=", "q=abc" and "q= 0" are 0. */
    {"gzip;q=0", ID, ID},
    {"gzip;q=0.0", ID, ID},
    {"gzip;q=0.000", ID, ID},
    {"gzip; q=0", ID, ID},
    {"gzip;xq=0", ID, ID},
    {"gzip;q=", ID, ID},
    {"gzip;q=abc", ID, ID},
    {"gzip;q= 0", ID, ID},
    /* A negative or NaN q on the named entry counts as not naming it. */
    {"gzip;q=-1", ID, ID},
    {"gzip;q=nan", ID, ID},
    {"gzip;q=-1, *", GZ, BR},
    /* A tab is not skipped, and "gzip x" is one token. */
    {"\tgzip", ID, ID},
    {"gzip\t", ID, ID},
    {"gzip x", ID, ID},
    /* The last entry naming a coding is the one that counts. */
    {"gzip, gzip;q=0", ID, ID},
    {"gzip;q=0, gzip", GZ, GZ},
    /* br: documents only, when its q is above 0 and not below gzip's. */
    {"br", ID, BR},
    {"BR", ID, BR},
    {"br;q=1e-9", ID, BR},
    {"br;q=0", ID, ID},
    {"br;q=-1", ID, ID},
    {"br, gzip", GZ, BR},
    {"gzip, br", GZ, BR},
    {"br;q=0.5, gzip;q=0.5", GZ, BR},
    {"br;q=1e-9, gzip;q=1e-9", GZ, BR},
    {"br;q=0.9, gzip;q=0.5", GZ, BR},
    {"br;q=0.4, gzip;q=0.5", GZ, GZ},
    {"br;q=0.1, gzip", GZ, GZ},
    {"br;q=2, gzip;q=3", GZ, GZ},
    {"br;q=nan, gzip", GZ, GZ},
    {"gzip;q=0, br;q=0.1", ID, BR},
    /* "*" stands for every coding not named. */
    {"*", GZ, BR},
    {"*;q=0.5", GZ, BR},
    {"* ;q=0.5", GZ, BR},
    {"*;q=0", ID, ID},
    {"*;q=nan", ID, ID},
    {"*;q=0, gzip", GZ, GZ},
    {"gzip;q=0, *", ID, BR},
    {"*;q=0.2, gzip", GZ, GZ},
    {"*;q=0.2, br;q=0.1", GZ, GZ},
    {"*;q=0.2, br;q=0.2", GZ, BR},
    {"*, br;q=0", GZ, GZ},
    {"identity;q=0.5, *;q=0.1", GZ, BR},
    /* A refusal of identity: a stream goes gzip when no entry gives gzip
     * a q (neither named nor "*"); a document does not (coding.h). */
    {"identity;q=0", GZ, ID},
    {"IDENTITY;q=0", GZ, ID},
    {"identity ;q=0", GZ, ID},
    {"identity;q=0.0", GZ, ID},
    {"identity;q=-0", GZ, ID},
    {"identity;q=abc", GZ, ID},
    {"identity;q=0, deflate", GZ, ID},
    {"identity;q=0, br", GZ, BR},
    {"identity;q=0, br;q=0", GZ, ID},
    {"br;q=0, identity;q=0", GZ, ID},
    {"gzip;q=-1, identity;q=0", GZ, ID},
    {"*;q=nan, identity;q=0", GZ, ID},
    {"identity;q=0, *", GZ, BR},
    {"identity;q=0, *;q=0.5", GZ, BR},
    /* ... but not when gzip is refused, directly or through "*". */
    {"identity;q=0, gzip;q=0", ID, ID},
    {"identity;q=0, *;q=0", ID, ID},
    {"*;q=0, identity", ID, ID},
};

START_TEST(test_pick)
{
    for (size_t i = 0; i < sizeof picks / sizeof *picks; i++) {
        const char *h = picks[i].h;
        ck_assert_msg(iv_coding_pick(h, IV_ANSWER_STREAM, 1) == picks[i].stream, "stream, [%s]",
                      h ? h : "(none)");
        ck_assert_msg(iv_coding_pick(h, IV_ANSWER_DOCUMENT, 1) == picks[i].document, "document, [%s]",
                      h ? h : "(none)");
        /* The level is the stream's gzip level, not part of the choice. */
        ck_assert(iv_coding_pick(h, IV_ANSWER_STREAM, 9) == picks[i].stream);
        /* gzip_level 0 turns gzip off: identity instead, br unchanged. */
        ck_assert_msg(iv_coding_pick(h, IV_ANSWER_STREAM, 0) == ID, "stream off, [%s]", h ? h : "(none)");
        iv_coding_t off = picks[i].document == GZ ? ID : picks[i].document;
        ck_assert_msg(iv_coding_pick(h, IV_ANSWER_DOCUMENT, 0) == off, "document off, [%s]",
                      h ? h : "(none)");
    }
}
END_TEST

START_TEST(test_name)
{
    ck_assert_str_eq(iv_coding_name(IV_CODING_GZIP), "gzip");
    ck_assert_str_eq(iv_coding_name(IV_CODING_BR), "br");
    ck_assert_str_eq(iv_coding_name(IV_CODING_IDENTITY), "identity");
}
END_TEST

/* A JSON-like body of n bytes that compresses well. */
static void fill_text(iv_buf_t *b, size_t n)
{
    iv_buf_init(b);
    while (b->len < n) iv_buf_printf(b, "{\"cell\":\"AAAC%05zu\",\"n\":%zu},", b->len % 997, b->len % 13);
    b->len = n;
}

START_TEST(test_encode_gzip_round_trip)
{
    iv_buf_t b;
    fill_text(&b, 20000);
    char *plain = malloc(b.len);
    memcpy(plain, b.data, b.len);
    ck_assert_int_eq(iv_coding_encode(&b, IV_CODING_GZIP, 1, NULL), 1);
    ck_assert(b.len < 20000 / 4);
    ck_assert(b.len > 2 && (unsigned char)b.data[0] == 0x1f && (unsigned char)b.data[1] == 0x8b);
    unsigned char *out = malloc(20000 + 1);
    z_stream z = {0};
    ck_assert_int_eq(inflateInit2(&z, 15 + 16), Z_OK);
    z.next_in = (unsigned char *)b.data;
    z.avail_in = (uInt)b.len;
    z.next_out = out;
    z.avail_out = 20000 + 1;
    ck_assert_int_eq(inflate(&z, Z_FINISH), Z_STREAM_END);
    ck_assert_uint_eq(z.total_out, 20000);
    ck_assert_uint_eq(z.avail_in, 0);
    ck_assert(memcmp(out, plain, 20000) == 0);
    inflateEnd(&z);
    free(out);
    free(plain);
    iv_buf_free(&b);
}
END_TEST

START_TEST(test_encode_br_smaller)
{
    iv_buf_t b;
    fill_text(&b, 20000);
    ck_assert_int_eq(iv_coding_encode(&b, IV_CODING_BR, 1, NULL), 1);
    ck_assert(b.len < 20000 / 4 && b.len <= b.cap);
    iv_buf_free(&b);
}
END_TEST

/* Identity, and bodies that would not shrink, are left as they are. */
START_TEST(test_encode_keeps_identity)
{
    iv_buf_t b;
    fill_text(&b, 5000);
    char *data = b.data;
    ck_assert_int_eq(iv_coding_encode(&b, IV_CODING_IDENTITY, 1, NULL), 0);
    ck_assert_ptr_eq(b.data, data);
    ck_assert_uint_eq(b.len, 5000);
    iv_buf_free(&b);
    iv_buf_init(&b);
    uint32_t x = 2463534242u;
    for (int i = 0; i < 4096; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        iv_buf_append(&b, &x, 1);
    }
    data = b.data;
    for (iv_coding_t c = IV_CODING_GZIP; c <= IV_CODING_BR; c++) {
        ck_assert_int_eq(iv_coding_encode(&b, c, 1, NULL), 0);
        ck_assert_ptr_eq(b.data, data);
        ck_assert_uint_eq(b.len, 4096);
    }
    iv_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("coding");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_coding_q);
    tcase_add_test(tc, test_pick);
    tcase_add_test(tc, test_name);
    tcase_add_test(tc, test_encode_gzip_round_trip);
    tcase_add_test(tc, test_encode_br_smaller);
    tcase_add_test(tc, test_encode_keeps_identity);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
