/* Tests of server/routes_static.c: the embedded viewer files, ETag
 * matching, Accept-Encoding negotiation and the answers of the route. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>
#include <zlib.h>

#include "coding.h"
#include "routes_static.h"

#ifndef IV_SOURCE_DIR
#error "IV_SOURCE_DIR must name the source tree"
#endif

/* The file web/<rel> as read from the source tree (caller frees). */
static unsigned char *read_source(const char *rel, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/web%s", IV_SOURCE_DIR, rel);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

START_TEST(test_assets_equal_sources)
{
    ck_assert_uint_ge(iv_static_n_assets, 5);
    int seen_page = 0, seen_app = 0;
    for (size_t i = 0; i < iv_static_n_assets; i++) {
        const iv_static_asset_t *a = &iv_static_assets[i];
        size_t n;
        unsigned char *src = read_source(a->path, &n);
        ck_assert_uint_eq(a->len, n);
        ck_assert_int_eq(memcmp(a->data, src, n), 0);
        /* The gzip copy inflates to the same bytes. */
        unsigned char *out = malloc(n + 1);
        z_stream z;
        memset(&z, 0, sizeof z);
        ck_assert_int_eq(inflateInit2(&z, 16 + MAX_WBITS), Z_OK);
        z.next_in = (unsigned char *)a->gz;
        z.avail_in = (uInt)a->gz_len;
        z.next_out = out;
        z.avail_out = (uInt)n + 1;
        ck_assert_int_eq(inflate(&z, Z_FINISH), Z_STREAM_END);
        ck_assert_uint_eq(z.total_out, n);
        ck_assert_int_eq(memcmp(out, src, n), 0);
        inflateEnd(&z);
        /* Strong tags: quoted, 32 hex digits, the gzip one marked. */
        ck_assert_uint_eq(strlen(a->etag), 34);
        ck_assert_int_eq(a->etag[0], '"');
        ck_assert_int_eq(strncmp(a->gz_etag, a->etag, 33), 0);
        ck_assert_str_eq(a->gz_etag + 33, "-gz\"");
        if (!strcmp(a->path, "/index.html")) {
            seen_page = 1;
            ck_assert_str_eq(a->ctype, "text/html; charset=utf-8");
        }
        if (!strcmp(a->path, "/viewer/app.js")) {
            seen_app = 1;
            ck_assert_str_eq(a->ctype, "text/javascript; charset=utf-8");
        }
        free(out);
        free(src);
    }
    ck_assert(seen_page && seen_app);
    ck_assert_ptr_eq(iv_static_find("/"), iv_static_find("/index.html"));
    ck_assert_ptr_null(iv_static_find("/viewer/"));
    ck_assert_ptr_null(iv_static_find("/viewer/../index.html"));
    ck_assert_ptr_null(iv_static_find(""));
}
END_TEST

START_TEST(test_etag_match)
{
    const char *t = "\"abc\"";
    ck_assert(iv_static_etag_match("\"abc\"", t));
    ck_assert(iv_static_etag_match("W/\"abc\"", t));
    ck_assert(iv_static_etag_match("\"x\", \"abc\"", t));
    ck_assert(iv_static_etag_match("\"x\",W/\"abc\" ,", t));
    ck_assert(iv_static_etag_match("*", t));
    ck_assert(iv_static_etag_match(" * ", t));
    ck_assert(!iv_static_etag_match(NULL, t));
    ck_assert(!iv_static_etag_match("", t));
    ck_assert(!iv_static_etag_match("\"abcd\"", t));
    ck_assert(!iv_static_etag_match("\"ab\"", t));
    ck_assert(!iv_static_etag_match("abc", t));
    ck_assert(!iv_static_etag_match("\"abc\"x", t));
    ck_assert(!iv_static_etag_match(",,,", t));
    ck_assert(!iv_static_etag_match("W/", t));
}
END_TEST

/* Whether the static routes send gzip for this Accept-Encoding: the q
 * proto/coding.h gives it is above 0. */
static int accepts_gzip(const char *h)
{
    return iv_coding_q(h, "gzip") > 0;
}

START_TEST(test_accept_encoding)
{
    ck_assert(accepts_gzip("gzip"));
    ck_assert(accepts_gzip("gzip, deflate, br"));
    ck_assert(accepts_gzip("br;q=1.0, GZIP;q=0.5"));
    ck_assert(accepts_gzip("*"));
    ck_assert(accepts_gzip("identity;q=0.5, *;q=0.1"));
    ck_assert(!accepts_gzip(NULL));
    ck_assert(!accepts_gzip(""));
    ck_assert(!accepts_gzip("identity"));
    ck_assert(!accepts_gzip("gzip;q=0"));
    ck_assert(!accepts_gzip("gzip ; q=0.000"));
    ck_assert(!accepts_gzip("*, gzip;q=0"));
    ck_assert(!accepts_gzip("*;q=0"));
    ck_assert(!accepts_gzip("x-gzip"));
    ck_assert(!accepts_gzip("gzipx"));
    ck_assert(accepts_gzip("deflate;level=1, gzip"));
    ck_assert(accepts_gzip("gzip;q=0.001"));
}
END_TEST

START_TEST(test_route_answers)
{
    iv_static_resp_t r;
    ck_assert_int_eq(iv_static_route("/v1/datasets", HTTP_GET, NULL, NULL, &r), 0);
    ck_assert_int_eq(iv_static_route("/healthz", HTTP_GET, NULL, NULL, &r), 0);
    ck_assert_int_eq(iv_static_route("/viewerx", HTTP_GET, NULL, NULL, &r), 0);

    const iv_static_asset_t *page = iv_static_find("/index.html");
    ck_assert_int_eq(iv_static_route("/", HTTP_GET, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_eq(r.body, (const char *)page->data);
    ck_assert_uint_eq(r.len, page->len);
    ck_assert_ptr_nonnull(strstr(r.extra, page->etag));
    ck_assert_ptr_nonnull(strstr(r.extra, "Content-Security-Policy: "));
    ck_assert_ptr_null(strstr(r.extra, "Content-Encoding"));
    ck_assert_ptr_nonnull(strstr(r.extra, "Vary: Accept-Encoding\r\n"));
    /* Every header line ends in CRLF; the block does too. */
    size_t el = strlen(r.extra);
    ck_assert(el >= 2 && r.extra[el - 2] == '\r' && r.extra[el - 1] == '\n');

    ck_assert_int_eq(iv_static_route("/index.html", HTTP_HEAD, NULL, "gzip", &r), 1);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_eq(r.body, (const char *)page->gz);
    ck_assert_ptr_nonnull(strstr(r.extra, "Content-Encoding: gzip\r\n"));
    ck_assert_ptr_nonnull(strstr(r.extra, page->gz_etag));

    /* 304 for the tag of the representation that would be sent. */
    ck_assert_int_eq(iv_static_route("/", HTTP_GET, page->etag, NULL, &r), 1);
    ck_assert_int_eq(r.status, 304);
    ck_assert_ptr_null(r.body);
    ck_assert_uint_eq(r.len, 0);
    ck_assert_ptr_nonnull(strstr(r.extra, page->etag));
    ck_assert_int_eq(iv_static_route("/", HTTP_GET, page->etag, "gzip", &r), 1);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(iv_static_route("/", HTTP_GET, page->gz_etag, "gzip", &r), 1);
    ck_assert_int_eq(r.status, 304);

    const iv_static_asset_t *app = iv_static_find("/viewer/app.js");
    ck_assert_int_eq(iv_static_route("/viewer/app.js", HTTP_GET, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.ctype, app->ctype);
    ck_assert_ptr_null(strstr(r.extra, "Content-Security-Policy"));

    ck_assert_int_eq(iv_static_route("/viewer/nope.js", HTTP_GET, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 404);
    ck_assert_str_eq(r.ctype, "application/json");
    ck_assert_ptr_nonnull(strstr(r.body, "\"not_found\""));
    ck_assert_int_eq(iv_static_route("/viewer/../index.html", HTTP_GET, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 404);
    ck_assert_int_eq(iv_static_route("/viewer/", HTTP_GET, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 404);

    ck_assert_int_eq(iv_static_route("/", HTTP_POST, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 405);
    ck_assert_ptr_nonnull(strstr(r.extra, "Allow: GET, HEAD"));
    ck_assert_int_eq(iv_static_route("/viewer/app.js", HTTP_DELETE, NULL, NULL, &r), 1);
    ck_assert_int_eq(r.status, 405);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("routes_static");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_assets_equal_sources);
    tcase_add_test(tc, test_etag_match);
    tcase_add_test(tc, test_accept_encoding);
    tcase_add_test(tc, test_route_answers);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
