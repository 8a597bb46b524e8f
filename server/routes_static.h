/*
 * The web viewer's files, compiled into the binary (web/embed.cmake makes
 * iv_static_assets[] from the files under web/ at build time), and the
 * route that serves them: "/" and "/index.html" give the page, and
 * "/viewer/NAME" its scripts and style sheet.
 *
 * Socket-free like api/meta_doc.c: iv_static_route() decides the whole
 * answer (status, media type, body, headers) and routes.c sends it, so
 * the route is tested without a loop and routes.c keeps one call.
 *
 * Every answer carries a strong ETag (a SHA-256 prefix of the file, with
 * "-gz" for the gzip copy) and "Cache-Control: no-cache": browsers keep
 * the files and revalidate them with If-None-Match, which is answered 304
 * without a body.  The files are public: the page must load before the
 * user can type the token the API asks for.
 *
 * Threads: the table is constant; any thread may call these.
 */
#ifndef IV_ROUTES_STATIC_H
#define IV_ROUTES_STATIC_H

#include <stddef.h>

typedef struct iv_static_asset {
    const char *path;                 /* URL path, "/index.html", "/viewer/app.js" */
    const char *ctype;                /* media type with charset where textual */
    const unsigned char *data;
    size_t len;
    const unsigned char *gz;          /* the same bytes, gzip-compressed */
    size_t gz_len;
    const char *etag;                 /* "\"<32 hex>\"" */
    const char *gz_etag;              /* "\"<32 hex>-gz\"" */
} iv_static_asset_t;

/* Generated (web_assets.c in the build folder). */
extern const iv_static_asset_t iv_static_assets[];
extern const size_t iv_static_n_assets;

typedef struct iv_static_resp {
    int status;                       /* 200, 304, 404 or 405 */
    const char *ctype;                /* NULL for 304 */
    const char *body;                 /* static storage; NULL for 304 */
    size_t len;
    char extra[384];                  /* header lines, each ending in \r\n */
} iv_static_resp_t;

/* The asset of a URL path ("/" is "/index.html"); NULL when there is none. */
const iv_static_asset_t *iv_static_find(const char *path);

/*
 * Answers path when it belongs to the viewer ("/", "/index.html" or under
 * "/viewer/"): fills *out and returns 1.  Returns 0 for every other path,
 * which stays the API's.  method is llhttp's (GET and HEAD are served;
 * anything else is 405 with Allow).  if_none_match and accept_encoding are
 * the request's headers or NULL: a matching tag (weak comparison, lists
 * and "*" understood) gives 304; gzip is sent when accept_encoding gives
 * it a q above 0 (proto/coding.h, iv_coding_q).  An unknown file under /viewer/ is a JSON 404.
 */
int iv_static_route(const char *path, int method, const char *if_none_match,
                    const char *accept_encoding, iv_static_resp_t *out);

/* True when the If-None-Match value inm names etag (RFC 9110 weak comparison). */
int iv_static_etag_match(const char *inm, const char *etag);

#endif
