/* Tests of proto/request.c and proto/base64.c: selections, formats, negotiation. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base64.h"
#include "buf.h"
#include "encode.h"
#include "request.h"

static int parse_json(const char *s, iv_qreq_t *q, iv_err_t *e)
{
    iv_err_clear(e);
    return iv_qreq_parse_json(s, strlen(s), 60, 50, q, e);
}

static int parse_qs(const char *s, iv_qreq_t *q, iv_err_t *e)
{
    iv_err_clear(e);
    return iv_qreq_parse_query(s, strlen(s), 60, 50, q, e);
}

START_TEST(test_index_keeps_order_and_duplicates)
{
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[5,1,5,59]}}", &q, &e), 0);
    ck_assert_int_eq(q.obs.kind, IV_PSEL_INDEX);
    ck_assert_int_eq(q.obs.n, 4);
    ck_assert_int_eq(q.obs.idx[0], 5);
    ck_assert_int_eq(q.obs.idx[1], 1);
    ck_assert_int_eq(q.obs.idx[2], 5);
    ck_assert_int_eq(q.obs.idx[3], 59);
    ck_assert_int_eq(q.var.kind, IV_PSEL_ALL);
    iv_sel_t v = iv_psel_view(&q.var);
    ck_assert_int_eq(v.all, 1);
    iv_sel_t o = iv_psel_view(&q.obs);
    ck_assert_int_eq(o.all, 0);
    ck_assert_int_eq(o.n, 4);
    iv_qreq_free(&q);
}
END_TEST

START_TEST(test_out_of_range_names_value)
{
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[1,60]}}", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "obs.index[1] = 60"));
    ck_assert_int_eq(parse_json("{\"var\":{\"index\":[-1]}}", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "var.index[0] = -1"));
    ck_assert_int_eq(parse_json("{\"var\":{\"index\":[1.5]}}", &q, &e), IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_json("{\"var\":{\"range\":[3,51]}}", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_int_eq(parse_json("{\"var\":{\"range\":[4,3]}}", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_int_eq(parse_json("{\"var\":{\"range\":[4]}}", &q, &e), IV_EBAD_SELECTION);
    /* An integer too large for any axis is out of range like 60 is, not
     * "not an integer" (issue 30): 2^64-1, 2^63, 1e300, -(2^64-1), and
     * 2^53+1 (read as 2^53, the last integer a double holds exactly). */
    const char *huge[] = {"18446744073709551615", "9223372036854775808", "1e300",
                          "-18446744073709551615", "9007199254740993"};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"obs\":{\"index\":[1,%s]}}", huge[i]);
        ck_assert_msg(parse_json(body, &q, &e) == IV_EOUT_OF_RANGE, "%s: %s", huge[i], e.msg);
        ck_assert_msg(!strncmp(e.msg, "obs.index[1] = ", 15), "%s: %s", huge[i], e.msg);
        const char *tail = strstr(e.msg, " is out of range [0, 60)");
        ck_assert_msg(tail && tail[24] == '\0', "%s: %s", huge[i], e.msg);
        snprintf(body, sizeof body, "{\"var\":{\"range\":[0,%s]}}", huge[i]);
        ck_assert_msg(parse_json(body, &q, &e) == IV_EOUT_OF_RANGE, "%s: %s", huge[i], e.msg);
        ck_assert_msg(strstr(e.msg, "is not within [0, 50)"), "%s: %s", huge[i], e.msg);
    }
    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[\"1\"]}}", &q, &e), IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_json("{\"obs\":{\"range\":[0.5,2]}}", &q, &e), IV_EBAD_SELECTION);
}
END_TEST

START_TEST(test_range_and_empty)
{
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_json("{\"var\":{\"range\":[48,50]},\"obs\":{\"range\":[7,7]}}", &q, &e), 0);
    ck_assert_int_eq(q.var.n, 2);
    ck_assert_int_eq(q.var.idx[0], 48);
    ck_assert_int_eq(q.var.idx[1], 49);
    ck_assert_int_eq(q.obs.n, 0);
    ck_assert_int_eq(iv_psel_view(&q.obs).all, 0);
    iv_qreq_free(&q);
    ck_assert_int_eq(parse_json("", &q, &e), 0);
    ck_assert_int_eq(q.obs.kind, IV_PSEL_ALL);
    ck_assert_int_eq(parse_json("{}", &q, &e), 0);
    ck_assert_int_eq(parse_json("{\"obs\":null,\"var\":{}}", &q, &e), 0);
    ck_assert_int_eq(q.var.kind, IV_PSEL_ALL);
}
END_TEST

START_TEST(test_mask_base64_and_bools)
{
    /* 60 obs -> 8 bytes; set bits 0, 9 and 59. */
    uint8_t bits[8] = {0};
    bits[0] = 1;
    bits[1] = 2;
    bits[7] = 1u << 3;
    char b64[16];
    iv_base64_encode(bits, 8, b64);
    char body[128];
    snprintf(body, sizeof body, "{\"obs\":{\"mask\":\"%s\"}}", b64);
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_json(body, &q, &e), 0);
    ck_assert_int_eq(q.obs.kind, IV_PSEL_MASK);
    ck_assert_int_eq(q.obs.n, 3);
    ck_assert_int_eq(q.obs.idx[0], 0);
    ck_assert_int_eq(q.obs.idx[1], 9);
    ck_assert_int_eq(q.obs.idx[2], 59);
    iv_qreq_free(&q);

    /* A bit past the axis (bit 60) is an error, not silently dropped. */
    bits[7] |= 1u << 4;
    iv_base64_encode(bits, 8, b64);
    snprintf(body, sizeof body, "{\"obs\":{\"mask\":\"%s\"}}", b64);
    ck_assert_int_eq(parse_json(body, &q, &e), IV_EOUT_OF_RANGE);
    /* Wrong length. */
    ck_assert_int_eq(parse_json("{\"obs\":{\"mask\":\"AAAA\"}}", &q, &e), IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_json("{\"obs\":{\"mask\":\"!!!!\"}}", &q, &e), IV_EBAD_SELECTION);

    /* Booleans: length must equal the axis. */
    char arr[1024] = "{\"var\":{\"mask\":[";
    for (int i = 0; i < 50; i++) strcat(arr, i == 0 ? (i % 7 ? "false" : "true") : (i % 7 ? ",false" : ",true"));
    strcat(arr, "]}}");
    ck_assert_int_eq(parse_json(arr, &q, &e), 0);
    ck_assert_int_eq(q.var.n, 8);
    ck_assert_int_eq(q.var.idx[7], 49);
    iv_qreq_free(&q);
    ck_assert_int_eq(parse_json("{\"var\":{\"mask\":[true,false]}}", &q, &e), IV_EBAD_SELECTION);
}
END_TEST

START_TEST(test_names_and_errors)
{
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_json("{\"var\":{\"names\":[\"CD3E\",\"MS4A1\"]}}", &q, &e), 0);
    ck_assert_int_eq(q.var.kind, IV_PSEL_NAMES);
    ck_assert_int_eq(q.var.n, 2);
    ck_assert_str_eq(q.var.names[1], "MS4A1");
    int64_t *idx = malloc(sizeof *idx);
    idx[0] = 3;
    iv_psel_set_indices(&q.var, idx, 1);
    ck_assert_int_eq(iv_psel_view(&q.var).idx[0], 3);
    iv_qreq_free(&q);

    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[1]", &q, &e), IV_EBAD_JSON);
    ck_assert_int_eq(parse_json("[1,2]", &q, &e), IV_EBAD_JSON);
    ck_assert_int_eq(parse_json("{\"cells\":{}}", &q, &e), IV_EBAD_SELECTION);
    ck_assert_ptr_nonnull(strstr(e.msg, "cells"));
    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[1],\"range\":[0,1]}}", &q, &e),
                     IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_json("{\"obs\":{\"rows\":[1]}}", &q, &e), IV_EBAD_SELECTION);
    ck_assert_ptr_nonnull(strstr(e.msg, "rows"));
    ck_assert_int_eq(parse_json("{\"format\":\"xml\"}", &q, &e), IV_ENOT_ACCEPTABLE);
    ck_assert_int_eq(parse_json("{\"format\":\"json\"}", &q, &e), 0);
    ck_assert_int_eq(q.format, IV_FMT_JSON);
}
END_TEST

START_TEST(test_query_string)
{
    iv_qreq_t q;
    iv_err_t e;
    ck_assert_int_eq(parse_qs("obs=3,1,3&var=10:12&format=binary", &q, &e), 0);
    ck_assert_int_eq(q.obs.n, 3);
    ck_assert_int_eq(q.obs.idx[2], 3);
    ck_assert_int_eq(q.var.kind, IV_PSEL_RANGE);
    ck_assert_int_eq(q.var.n, 2);
    ck_assert_int_eq(q.var.idx[1], 11);
    ck_assert_int_eq(q.format, IV_FMT_BINARY);
    iv_qreq_free(&q);
    ck_assert_int_eq(parse_qs("var_names=A%20B,C", &q, &e), 0);
    ck_assert_str_eq(q.var.names[0], "A B");
    ck_assert_str_eq(q.var.names[1], "C");
    iv_qreq_free(&q);
    ck_assert_int_eq(parse_qs("obs=1,x", &q, &e), IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_qs("obs=1,60", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_int_eq(parse_qs("obs=1&obs=2", &q, &e), IV_EBAD_SELECTION);
    ck_assert_int_eq(parse_qs("bogus=1", &q, &e), IV_EBAD_SELECTION);
    ck_assert_ptr_nonnull(strstr(e.msg, "bogus"));
    ck_assert_int_eq(parse_qs("obs=%zz", &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(parse_qs("obs=1%00", &q, &e), IV_EBAD_REQUEST);
    ck_assert_int_eq(parse_qs("", &q, &e), 0);
    ck_assert_int_eq(q.obs.kind, IV_PSEL_ALL);
}
END_TEST

/* Integers past INT64_MAX in a query string are an error naming the value
 * as written: no signed overflow (UBSan), no wrapped negative index. */
START_TEST(test_query_string_huge_integers)
{
    iv_qreq_t q;
    iv_err_t e;
    const char *cases[] = {
        "obs=9999999999999999999",             /* 19 digits, above INT64_MAX */
        "obs=9223372036854775808",             /* INT64_MAX + 1 */
        "obs=1,99999999999999999999999999999", /* far past 19 digits */
        "obs=0:9999999999999999999",
        "obs=9999999999999999999:9999999999999999999",
        "var=18446744073709551617",            /* 2^64 + 1, wraps to 1 in uint64 */
        "obs=18446744073709551615",            /* 2^64 - 1, -1 as an int64 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        iv_err_clear(&e);
        ck_assert_msg(parse_qs(cases[i], &q, &e) == IV_EOUT_OF_RANGE, "%s: %s", cases[i], e.msg);
        ck_assert_msg(strchr(e.msg, '-') == NULL, "%s: %s", cases[i], e.msg);
        ck_assert_msg(strstr(e.msg, "99999") || strstr(e.msg, "922337") || strstr(e.msg, "184467"),
                      "%s: %s", cases[i], e.msg);
    }
    /* INT64_MAX itself parses, and is out of range like any large index. */
    iv_err_clear(&e);
    ck_assert_int_eq(parse_qs("obs=9223372036854775807", &q, &e), IV_EOUT_OF_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "9223372036854775807"));
    /* Leading zeros are not a large number. */
    ck_assert_int_eq(parse_qs("obs=000000000000000000000000000005", &q, &e), 0);
    ck_assert_int_eq(q.obs.idx[0], 5);
    iv_qreq_free(&q);
}
END_TEST

/* A key given twice in a request body is a 400 naming it (cJSON keeps
 * both and reads the first; other parsers read the last). */
START_TEST(test_json_duplicate_keys)
{
    iv_qreq_t q;
    iv_err_t e;
    const char *cases[][2] = {
        {"{\"obs\":{\"index\":[1]},\"obs\":{\"index\":[2]}}", "'obs'"},
        {"{\"format\":\"json\",\"var\":{},\"format\":\"binary\"}", "'format'"},
        {"{\"obs\":{\"where\":\"a == 1\",\"where\":\"a == 2\"}}", "'where'"},
        {"{\"var\":{\"names\":[\"a\"],\"by\":\"x\",\"by\":\"y\"}}", "'by'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse_json(cases[i][0], &q, &e);
        ck_assert_msg(rc == IV_EBAD_REQUEST && iv_error_status(rc) == 400, "%s: %d %s",
                      cases[i][0], rc, e.msg);
        ck_assert_msg(strstr(e.msg, cases[i][1]) && strstr(e.msg, "more than once"), "%s: %s",
                      cases[i][0], e.msg);
    }
    /* Two different keys are still fine. */
    ck_assert_int_eq(parse_json("{\"obs\":{\"index\":[1]},\"var\":{\"index\":[2]}}", &q, &e), 0);
    iv_qreq_free(&q);
}
END_TEST

/* \u0000 in a JSON string is refused (400), not a string cut short at the
 * NUL; an escaped backslash followed by "u0000" is ordinary text. */
START_TEST(test_json_nul_escape)
{
    iv_qreq_t q;
    iv_err_t e;
    int rc = parse_json("{\"obs\":{\"names\":[\"c1\\u0000junk\"]}}", &q, &e);
    ck_assert_msg(rc == IV_EBAD_JSON && iv_error_status(rc) == 400, "%d %s", rc, e.msg);
    ck_assert_ptr_nonnull(strstr(e.msg, "u0000"));
    rc = parse_json("{\"obs\":{\"where\":\"note == 'a\\u0000'\"}}", &q, &e);
    ck_assert_int_eq(rc, IV_EBAD_JSON);
    /* A raw NUL byte inside a string is refused the same way. */
    const char raw[] = "{\"obs\":{\"names\":[\"a\0b\"]}}";
    iv_err_clear(&e);
    ck_assert_int_eq(iv_qreq_parse_json(raw, sizeof raw - 1, 60, 50, &q, &e), IV_EBAD_JSON);
    /* "\\u0000" is a backslash and the text u0000. */
    ck_assert_int_eq(parse_json("{\"obs\":{\"names\":[\"a\\\\u0000\"]}}", &q, &e), 0);
    ck_assert_str_eq(q.obs.names[0], "a\\u0000");
    iv_qreq_free(&q);
}
END_TEST

/* True when s[0..n) is well-formed UTF-8 (enough for the checks below). */
static int utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!l || i + l > n || (l == 2 && c < 0xC2)) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* An error that echoes request bytes that are not UTF-8 (or cuts a
 * character in two when it shortens them) still encodes as valid JSON. */
START_TEST(test_error_body_stays_utf8)
{
    const char *qs[] = {
        "%FF%FE=1",                                          /* bytes that are not UTF-8 */
        "obs=1,a%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9"
        "%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9",  /* cut mid-character */
        "obs_missing=%ED%A0%80",                             /* a UTF-16 surrogate */
        "format=%C0%AF",                                     /* an overlong '/' */
    };
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        iv_qreq_t q;
        iv_err_t e;
        ck_assert_int_ne(parse_qs(qs[i], &q, &e), 0);
        iv_buf_t b;
        iv_buf_init(&b);
        iv_enc_error(&b, "bad_selection", e.msg);
        ck_assert_msg(utf8_ok((const unsigned char *)b.data, b.len), "%s: %.*s", qs[i],
                      (int)b.len, b.data);
        cJSON *j = cJSON_ParseWithLength(b.data, b.len);
        ck_assert_msg(j != NULL, "%s", qs[i]);
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        ck_assert(cJSON_IsString(m));
        /* The bad bytes became U+FFFD; the rest of the message is kept. */
        ck_assert_msg(strstr(m->valuestring, "\xef\xbf\xbd"), "%s: %s", qs[i], m->valuestring);
        cJSON_Delete(j);
        iv_buf_free(&b);
    }
    /* Valid multi-byte text passes through unchanged. */
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_json_str(&b, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \"q\"\n");
    ck_assert_int_eq((int)b.len, (int)strlen("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\\"q\\\"\\u000a\""));
    ck_assert(memcmp(b.data, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\\"q\\\"\\u000a\"", b.len) == 0);
    iv_buf_free(&b);
}
END_TEST

START_TEST(test_by_and_dense)
{
    iv_qreq_t q;
    iv_err_t err = {0};
    const char *ok[] = {"{\"by\":\"var\"}", "{\"dense\":true}", "{\"by\":\"var\",\"dense\":true}",
                        "{\"by\":\"obs\"}", "{\"dense\":false}"};
    int want_by[] = {1, 1, 1, 0, 0}, want_dense[] = {0, 1, 1, 0, 0};
    for (int i = 0; i < 5; i++) {
        ck_assert_msg(iv_qreq_parse_json(ok[i], strlen(ok[i]), 10, 10, &q, &err) == 0, "%s", err.msg);
        ck_assert_int_eq(q.by_var, want_by[i]);
        ck_assert_int_eq(q.dense, want_dense[i]);
        iv_qreq_free(&q);
    }
    const char *bad[] = {"{\"by\":\"genes\"}", "{\"by\":1}", "{\"dense\":1}",
                         "{\"by\":\"obs\",\"dense\":true}"};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(iv_qreq_parse_json(bad[i], strlen(bad[i]), 10, 10, &q, &err), IV_EBAD_REQUEST);
    const char *qs = "var=1,2&by=var&dense=true";
    ck_assert_int_eq(iv_qreq_parse_query(qs, strlen(qs), 10, 10, &q, &err), 0);
    ck_assert(q.by_var == 1 && q.dense == 1 && q.var.n == 2);
    iv_qreq_free(&q);
    qs = "dense=yes";
    ck_assert_int_eq(iv_qreq_parse_query(qs, strlen(qs), 10, 10, &q, &err), IV_EBAD_REQUEST);
    qs = "by=obs&dense=1";
    ck_assert_int_eq(iv_qreq_parse_query(qs, strlen(qs), 10, 10, &q, &err), IV_EBAD_REQUEST);
}
END_TEST

START_TEST(test_accept_negotiation)
{
    ck_assert_int_eq(iv_fmt_from_accept(NULL), IV_FMT_NDJSON);
    ck_assert_int_eq(iv_fmt_from_accept("*/*"), IV_FMT_NDJSON);
    ck_assert_int_eq(iv_fmt_from_accept("application/vnd.ivserve.csr"), IV_FMT_BINARY);
    ck_assert_int_eq(iv_fmt_from_accept("text/html, application/json;q=0.9"), IV_FMT_JSON);
    ck_assert_int_eq(iv_fmt_from_accept("application/json;q=0.5, application/x-ndjson"),
                     IV_FMT_NDJSON);
    ck_assert_int_eq(iv_fmt_from_accept("text/html"), IV_FMT_NONE);
    ck_assert_int_eq(iv_fmt_from_accept("application/json;q=0"), IV_FMT_NONE);
}
END_TEST

START_TEST(test_base64_roundtrip)
{
    uint8_t src[17], dst[32];
    char enc[64];
    for (size_t n = 0; n <= sizeof src; n++) {
        for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 37 + n);
        size_t el = iv_base64_encode(src, n, enc);
        ck_assert_uint_eq(el, (n + 2) / 3 * 4);
        ck_assert_int_eq(iv_base64_decode(enc, el, dst, sizeof dst), (long)n);
        ck_assert_int_eq(memcmp(src, dst, n), 0);
        /* Without padding too. */
        size_t np = el;
        while (np && enc[np - 1] == '=') np--;
        ck_assert_int_eq(iv_base64_decode(enc, np, dst, sizeof dst), (long)n);
    }
    ck_assert_int_eq(iv_base64_decode("A", 1, dst, sizeof dst), -1);
    ck_assert_int_eq(iv_base64_decode("AB=C", 4, dst, sizeof dst), -1);
    ck_assert_int_eq(iv_base64_decode("AAAAAAAA", 8, dst, 5), -1);
    ck_assert_int_eq(iv_base64_decode("_-8=", 4, dst, sizeof dst), 2);
}
END_TEST

/* The dropped-names document: each axis's list or [], and "folded" only
 * when asked for. */
START_TEST(test_dropped_doc)
{
    iv_buf_t drop[2], fold[2];
    for (int a = 0; a < 2; a++) {
        iv_buf_init(&drop[a]);
        iv_buf_init(&fold[a]);
    }
    char *d = iv_psel_dropped_doc(drop, fold, 0);
    ck_assert_str_eq(d, "{\"obs\":[],\"var\":[]}");
    free(d);
    iv_buf_puts(&drop[1], "[\"G1\",\"g2\"]");
    iv_buf_puts(&fold[0], "[\"cellA\"]");
    d = iv_psel_dropped_doc(drop, fold, 1);
    ck_assert_str_eq(d, "{\"obs\":[],\"var\":[\"G1\",\"g2\"],\"folded\":{\"obs\":[\"cellA\"],\"var\":[]}}");
    free(d);
    d = iv_psel_dropped_doc(drop, fold, 0);
    ck_assert_str_eq(d, "{\"obs\":[],\"var\":[\"G1\",\"g2\"]}");
    free(d);
    for (int a = 0; a < 2; a++) {
        iv_buf_free(&drop[a]);
        iv_buf_free(&fold[a]);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto_request");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_index_keeps_order_and_duplicates);
    tcase_add_test(tc, test_out_of_range_names_value);
    tcase_add_test(tc, test_range_and_empty);
    tcase_add_test(tc, test_mask_base64_and_bools);
    tcase_add_test(tc, test_names_and_errors);
    tcase_add_test(tc, test_query_string);
    tcase_add_test(tc, test_query_string_huge_integers);
    tcase_add_test(tc, test_json_duplicate_keys);
    tcase_add_test(tc, test_json_nul_escape);
    tcase_add_test(tc, test_error_body_stays_utf8);
    tcase_add_test(tc, test_accept_negotiation);
    tcase_add_test(tc, test_by_and_dense);
    tcase_add_test(tc, test_base64_roundtrip);
    tcase_add_test(tc, test_dropped_doc);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
