/* Tests of server/http.c: one request at a time, split input, pipelining, limits. */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>

#include "http.h"

/* Feeds s byte by byte (the hardest split) and returns the first request. */
static iv_http_req_t *feed_bytewise(iv_http_in_t *in, const char *s, size_t *used)
{
    size_t n = strlen(s), off = 0;
    while (off < n) {
        size_t c;
        iv_http_req_t *r;
        int rc = iv_http_in_feed(in, s + off, 1, &c, &r);
        off += c;
        if (rc == 1) {
            *used = off;
            return r;
        }
        ck_assert_int_eq(rc, 0);
    }
    *used = off;
    return NULL;
}

START_TEST(test_split_request)
{
    iv_http_in_t in;
    iv_http_in_init(&in, 4096, 1024);
    const char *s = "POST /v1/datasets/a/query?x=1 HTTP/1.1\r\nHost: h\r\nAccept: application/json\r\n"
                    "accept: text/plain\r\nContent-Length: 5\r\n\r\nhello";
    size_t used;
    iv_http_req_t *r = feed_bytewise(&in, s, &used);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(used, strlen(s));
    ck_assert_int_eq(r->method, HTTP_POST);
    ck_assert_str_eq(r->path, "/v1/datasets/a/query");
    ck_assert_str_eq(r->query, "x=1");
    ck_assert_str_eq(r->hdr[IV_H_ACCEPT], "application/json, text/plain");
    ck_assert_uint_eq(r->body.len, 5);
    ck_assert_int_eq(memcmp(r->body.data, "hello", 5), 0);
    ck_assert_int_eq(r->keep_alive, 1);
    iv_http_req_free(r);
    free(r);
    iv_http_in_free(&in);
}
END_TEST

START_TEST(test_pipelined_in_order)
{
    iv_http_in_t in;
    iv_http_in_init(&in, 4096, 1024);
    const char *s = "GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /c";
    size_t n = strlen(s), off = 0, c;
    iv_http_req_t *r;
    ck_assert_int_eq(iv_http_in_feed(&in, s, n, &c, &r), 1);
    ck_assert_str_eq(r->path, "/a");
    ck_assert_uint_eq(c, strlen("GET /a HTTP/1.1\r\nHost: h\r\n\r\n"));
    iv_http_req_free(r);
    free(r);
    off += c;
    ck_assert_int_eq(iv_http_in_feed(&in, s + off, n - off, &c, &r), 1);
    ck_assert_str_eq(r->path, "/b");
    ck_assert_int_eq(r->keep_alive, 0);
    iv_http_req_free(r);
    free(r);
    iv_http_in_free(&in);
}
END_TEST

START_TEST(test_limits_and_garbage)
{
    iv_http_in_t in;
    size_t c;
    iv_http_req_t *r;
    iv_http_in_init(&in, 64, 1024);
    const char *big = "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(iv_http_in_feed(&in, big, strlen(big), &c, &r), -1);
    ck_assert_int_eq(in.err_status, 431);
    iv_http_in_free(&in);

    iv_http_in_init(&in, 4096, 10);
    const char *body = "POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n";
    ck_assert_int_eq(iv_http_in_feed(&in, body, strlen(body), &c, &r), -1);
    ck_assert_int_eq(in.err_status, 413);
    iv_http_in_free(&in);

    iv_http_in_init(&in, 4096, 10);
    const char *chunked = "POST /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
    ck_assert_int_eq(iv_http_in_feed(&in, chunked, strlen(chunked), &c, &r), -1);
    ck_assert_int_eq(in.err_status, 413);
    iv_http_in_free(&in);

    iv_http_in_init(&in, 4096, 10);
    const char *junk = "\x01\x02 nonsense\r\n\r\n";
    ck_assert_int_eq(iv_http_in_feed(&in, junk, strlen(junk), &c, &r), -1);
    ck_assert_int_eq(in.err_status, 400);
    /* Stays failed. */
    ck_assert_int_eq(iv_http_in_feed(&in, "GET / HTTP/1.1\r\n\r\n", 18, &c, &r), -1);
    iv_http_in_free(&in);

    /* An unfinished request frees cleanly. */
    iv_http_in_init(&in, 4096, 10);
    ck_assert_int_eq(iv_http_in_feed(&in, "GET /x HTTP/1.1\r\nAcc", 20, &c, &r), 0);
    ck_assert_int_eq(iv_http_in_active(&in), 1);
    iv_http_in_free(&in);
}
END_TEST

START_TEST(test_http10_not_keepalive)
{
    iv_http_in_t in;
    size_t c;
    iv_http_req_t *r;
    iv_http_in_init(&in, 4096, 10);
    const char *s = "GET /healthz HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(iv_http_in_feed(&in, s, strlen(s), &c, &r), 1);
    ck_assert_int_eq(r->keep_alive, 0);
    ck_assert_int_eq(r->http_minor, 0);
    iv_http_req_free(r);
    free(r);
    iv_http_in_free(&in);
}
END_TEST

/* Feeds all of s at once; returns the feed's result, *status the error status. */
static int feed_all(const char *s, size_t max_header, int *status)
{
    iv_http_in_t in;
    size_t c;
    iv_http_req_t *r = NULL;
    iv_http_in_init(&in, max_header, 1 << 20);
    int rc = iv_http_in_feed(&in, s, strlen(s), &c, &r);
    *status = in.err_status;
    if (r) {
        iv_http_req_free(r);
        free(r);
    }
    iv_http_in_free(&in);
    return rc;
}

/* Strict parsing (issue 9, item 13): each of these passed the lenient parser. */
START_TEST(test_strict_chunk_end)
{
    int st;
    /* Two bytes other than CRLF after the chunk data. */
    ck_assert_int_eq(feed_all("POST /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "3\r\nabcXY0\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
    /* The same with CRLF is a request. */
    ck_assert_int_eq(feed_all("POST /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "3\r\nabc\r\n0\r\n\r\n", 4096, &st), 1);
}
END_TEST

START_TEST(test_strict_folded_header)
{
    int st;
    ck_assert_int_eq(feed_all("GET /q HTTP/1.1\r\nHost: h\r\nAccept: text/csv,\r\n application/json\r\n\r\n",
                              4096, &st), -1);
    ck_assert_int_eq(st, 400);
}
END_TEST

START_TEST(test_strict_space_before_colon)
{
    int st;
    ck_assert_int_eq(feed_all("GET /q HTTP/1.1\r\nHost : x\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
}
END_TEST

START_TEST(test_host_required)
{
    int st;
    ck_assert_int_eq(feed_all("GET /q HTTP/1.1\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
    ck_assert_int_eq(feed_all("GET /q HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
    /* HTTP/1.0 may leave it out. */
    ck_assert_int_eq(feed_all("GET /q HTTP/1.0\r\n\r\n", 4096, &st), 1);
}
END_TEST

/* The header limit counts whole lines: 5,000 headers of 6 bytes of name
 * and value are 50 kB on the wire, over a 16 KiB limit. */
START_TEST(test_header_limit_counts_lines)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_buf_puts(&b, "GET /q HTTP/1.1\r\nHost: h\r\n");
    for (int i = 0; i < 5000; i++) iv_buf_puts(&b, "a: b\r\n");
    iv_buf_append(&b, "\r\n", 3);
    int st;
    ck_assert_int_eq(feed_all(b.data, 16384, &st), -1);
    ck_assert_int_eq(st, 431);
    iv_buf_free(&b);
    /* 2,000 of them (14 kB) still pass. */
    iv_buf_init(&b);
    iv_buf_puts(&b, "GET /q HTTP/1.1\r\nHost: h\r\n");
    for (int i = 0; i < 2000; i++) iv_buf_puts(&b, "a: b\r\n");
    iv_buf_append(&b, "\r\n", 3);
    ck_assert_int_eq(feed_all(b.data, 16384, &st), 1);
    iv_buf_free(&b);
}
END_TEST

/* RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message is faulty
 * framing (a 1.0 recipient would read the body another way), so the
 * request is refused and the connection closed (issue 30). */
START_TEST(test_http10_transfer_encoding_is_400)
{
    int st;
    ck_assert_int_eq(feed_all("POST /q HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "3\r\nabc\r\n0\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
    ck_assert_int_eq(feed_all("POST /q HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                              "3\r\nabc\r\n0\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 400);
    ck_assert_int_eq(feed_all("GET /q HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                              4096, &st), -1);
    ck_assert_int_eq(st, 400);
    /* HTTP/1.0 with a Content-Length, and HTTP/1.1 chunked, still pass. */
    ck_assert_int_eq(feed_all("POST /q HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", 4096, &st), 1);
    ck_assert_int_eq(feed_all("POST /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "3\r\nabc\r\n0\r\n\r\n", 4096, &st), 1);
}
END_TEST

/* Parses one complete request (all at once) and returns it. */
static iv_http_req_t *parse_one(iv_http_in_t *in, const char *s)
{
    size_t c;
    iv_http_req_t *r = NULL;
    iv_http_in_init(in, 4096, 1024);
    ck_assert_int_eq(iv_http_in_feed(in, s, strlen(s), &c, &r), 1);
    return r;
}

/* RFC 9112 3.2.2: a server accepts the absolute form of a request target
 * and routes by its path and query (issue 30). */
START_TEST(test_absolute_form_target)
{
    static const struct { const char *req, *path, *query; } cases[] = {
        {"GET http://h:8080/v1/datasets HTTP/1.1\r\nHost: h:8080\r\n\r\n", "/v1/datasets", ""},
        {"GET HTTPS://h/v1/datasets/a/query?obs=1,2&x=a/b HTTP/1.1\r\nHost: h\r\n\r\n",
         "/v1/datasets/a/query", "obs=1,2&x=a/b"},
        {"GET http://h?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", "/", "x=1"},
        {"GET http://user@h:1 HTTP/1.0\r\n\r\n", "/", ""},
        {"GET /plain?q HTTP/1.1\r\nHost: h\r\n\r\n", "/plain", "q"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        iv_http_in_t in;
        iv_http_req_t *r = parse_one(&in, cases[i].req);
        ck_assert_msg(!strcmp(r->path, cases[i].path), "%s: path %s", cases[i].req, r->path);
        ck_assert_msg(!strcmp(r->query, cases[i].query), "%s: query %s", cases[i].req, r->query);
        iv_http_req_free(r);
        free(r);
        iv_http_in_free(&in);
    }
}
END_TEST

START_TEST(test_http2_is_505)
{
    int st;
    ck_assert_int_eq(feed_all("GET /q HTTP/2.0\r\nHost: h\r\n\r\n", 4096, &st), -1);
    ck_assert_int_eq(st, 505);
}
END_TEST

START_TEST(test_redact_paths)
{
    char out[256];
    iv_http_redact_paths(out, sizeof out, "cannot read /srv/data/lupus.h5ad: bad heap");
    ck_assert_str_eq(out, "cannot read lupus.h5ad: bad heap");
    iv_http_redact_paths(out, sizeof out, "file '/a/b/c.h5ad' (group /X) at /x");
    ck_assert_str_eq(out, "file 'c.h5ad' (group /X) at /x");
    iv_http_redact_paths(out, sizeof out, "/root/x/y.h5ad");
    ck_assert_str_eq(out, "y.h5ad");
    iv_http_redact_paths(out, 8, "/root/x/yyyyyyyyyy.h5ad");
    ck_assert_str_eq(out, "yyyyyyy");
    iv_http_redact_paths(out, sizeof out, "ratio 3/4 of obs/var");
    ck_assert_str_eq(out, "ratio 3/4 of obs/var");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("http_parse");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_split_request);
    tcase_add_test(tc, test_pipelined_in_order);
    tcase_add_test(tc, test_limits_and_garbage);
    tcase_add_test(tc, test_http10_not_keepalive);
    tcase_add_test(tc, test_strict_chunk_end);
    tcase_add_test(tc, test_strict_folded_header);
    tcase_add_test(tc, test_strict_space_before_colon);
    tcase_add_test(tc, test_host_required);
    tcase_add_test(tc, test_header_limit_counts_lines);
    tcase_add_test(tc, test_http2_is_505);
    tcase_add_test(tc, test_http10_transfer_encoding_is_400);
    tcase_add_test(tc, test_absolute_form_target);
    tcase_add_test(tc, test_redact_paths);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
