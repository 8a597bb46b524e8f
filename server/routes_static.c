/*
 * Serving the viewer's embedded files.
 *
 * The files are few (an HTML page, some script modules, a style sheet) and
 * fixed at build time, so they live in a constant table made by
 * web/embed.cmake: a lookup is a scan of a dozen exact path compares, and
 * no path ever reaches the file system, so "..", "%2e" or a NUL cannot
 * name anything outside the table.  The gzip copy is made at build time
 * because the files never change while the server runs; compressing them
 * per request would cost the loop time for the same bytes every time.
 */
#include "routes_static.h"
#include "coding.h"

#include <stdio.h>
#include <string.h>

#include <llhttp.h>

static const char not_found_body[] =
    "{\"error\":{\"code\":\"not_found\",\"message\":\"no such viewer file\"}}";
static const char bad_method_body[] =
    "{\"error\":{\"code\":\"method_not_allowed\",\"message\":\"the viewer's files are read with GET\"}}";

/* The page itself also gets a content security policy: it holds a bearer
 * token, so scripts and connections are limited to this origin. */
static const char page_policy[] =
    "Content-Security-Policy: default-src 'self'; img-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'self'; frame-ancestors 'self'\r\n";

const iv_static_asset_t *iv_static_find(const char *path)
{
    if (!strcmp(path, "/")) path = "/index.html";
    for (size_t i = 0; i < iv_static_n_assets; i++)
        if (!strcmp(iv_static_assets[i].path, path)) return &iv_static_assets[i];
    return NULL;
}

static int is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Whether one entity tag of If-None-Match, [t, e) without the spaces
 * around it, names etag: "*" names every one, and W/"x" names the same
 * file as "x" (If-None-Match compares weakly). */
static int tag_names(const char *t, const char *e, const char *etag, size_t elen)
{
    if (e - t == 1 && *t == '*') return 1;
    if (e - t >= 2 && t[0] == 'W' && t[1] == '/') t += 2;
    return (size_t)(e - t) == elen && !memcmp(t, etag, elen);
}

int iv_static_etag_match(const char *inm, const char *etag)
{
    if (!inm) return 0;
    size_t elen = strlen(etag);
    const char *p = inm;
    while (*p) {
        while (is_ows(*p) || *p == ',') p++;
        if (!*p) break;
        const char *t = p;
        while (*p && *p != ',') p++;
        const char *e = p;
        while (e > t && is_ows(e[-1])) e--;
        if (tag_names(t, e, etag, elen)) return 1;
    }
    return 0;
}

int iv_static_route(const char *path, int method, const char *if_none_match,
                    const char *accept_encoding, iv_static_resp_t *out)
{
    int page = !strcmp(path, "/") || !strcmp(path, "/index.html");
    if (!page && strncmp(path, "/viewer/", 8) != 0) return 0;
    memset(out, 0, sizeof *out);
    if (method != HTTP_GET && method != HTTP_HEAD) {
        out->status = 405;
        out->ctype = "application/json";
        out->body = bad_method_body;
        out->len = sizeof bad_method_body - 1;
        snprintf(out->extra, sizeof out->extra, "Allow: GET, HEAD, OPTIONS\r\n");
        return 1;
    }
    const iv_static_asset_t *a = iv_static_find(path);
    if (!a) {
        out->status = 404;
        out->ctype = "application/json";
        out->body = not_found_body;
        out->len = sizeof not_found_body - 1;
        return 1;
    }
    /* The gzip copy is only worth it when it is smaller (tiny files grow). */
    int gz = a->gz_len < a->len && iv_coding_q(accept_encoding, "gzip") > 0;
    const char *etag = gz ? a->gz_etag : a->etag;
    snprintf(out->extra, sizeof out->extra,
             "ETag: %s\r\nCache-Control: no-cache\r\nVary: Accept-Encoding\r\n"
             "X-Content-Type-Options: nosniff\r\n%s%s",
             etag, gz ? "Content-Encoding: gzip\r\n" : "", page ? page_policy : "");
    if (iv_static_etag_match(if_none_match, etag)) {
        out->status = 304;
        return 1;
    }
    out->status = 200;
    out->ctype = a->ctype;
    out->body = (const char *)(gz ? a->gz : a->data);
    out->len = gz ? a->gz_len : a->len;
    return 1;
}
