/*
 * Viewer routes (see viewer.h): the route table, a request's life
 * (iv_vreq_new, iv_vreq_run, iv_vreq_free), ETags and the body's coding.
 * Each route's handler is a file of its own (viewer_impl.h lists them).
 *
 * Design.  Every route here answers with one body built on a worker, of
 * a size the request bounds (an embedding is at most the array; a search
 * is `limit` rows; an aggregate is groups x genes x stats), so nothing is
 * streamed block by block: the server sends the finished buffer with a
 * Content-Length.  The expensive part of an aggregate, the decode of the
 * selection, is spread over the pool with iv_pool_parallel_for from the
 * worker that runs the request; the caller takes part, so it cannot
 * deadlock on a busy pool.
 *
 * Selections reuse the query route's parser and name/filter resolution
 * unchanged, so "any selection form the query route takes" is literally
 * the same code: the route's own parameters (dtype, q, group_by, ...) are
 * taken out of the query string or JSON body first and the rest goes to
 * iv_qreq_parse_*.
 *
 * Every answer here depends only on the dataset's content and the
 * request, which is what makes HTTP caching sound: the ETag is a hash of
 * the file's identity and the request's bytes, computed before any work,
 * so a revalidation costs a hash.  Compression runs on the same worker
 * over the finished body.  The obs/var metadata pages are routed here too
 * (built by meta_doc.c) to get the same caching and encoding.
 */
#include "viewer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coding.h"
#include "uns_doc.h"
#include "zarr.h"

/* ---- routing ------------------------------------------------------------ */

/* Routes whose path is the whole sub-path. */
static const struct exact_route {
    const char *path;
    int route;
} exact_routes[] = {
    {"/aggregate", IV_VR_AGGREGATE},
    {"/diffexp", IV_VR_DIFFEXP},
    {"/uns", IV_VR_UNS},
    {"/obsp", IV_VR_OBSP_LIST},
    {"/var/search", IV_VR_VAR_SEARCH},
    {"/obs/search", IV_VR_OBS_SEARCH},
    {"/raw/var", IV_VR_RAW_VAR_TABLE},
    {"/raw/var/search", IV_VR_RAW_VAR_SEARCH},
    {"/obs", IV_VR_OBS_TABLE},
    {"/var", IV_VR_VAR_TABLE},
};

/* Routes whose path ends in a name (an array, a column, a zarr key): the
 * prefix before it.  A zarr key may hold slashes (any_rest); the other
 * names are one non-empty segment. */
static const struct named_route {
    const char *prefix;
    int route;
    int any_rest;
} named_routes[] = {
    {"/zarr/", IV_VR_ZARR, 1},
    {"/raw/var/", IV_VR_RAW_VAR_COLUMN, 0},
    {"/obsm/", IV_VR_OBSM, 0},
    {"/varm/", IV_VR_VARM, 0},
    {"/obsp/", IV_VR_OBSP, 0},
    {"/obs/", IV_VR_OBS_COLUMN, 0},
    {"/var/", IV_VR_VAR_COLUMN, 0},
};

static int named_route_match(const struct named_route *nr, const char *sub)
{
    size_t n = strlen(nr->prefix);
    if (strncmp(sub, nr->prefix, n) != 0) return 0;
    return nr->any_rest || (sub[n] && !strchr(sub + n, '/'));
}

int iv_vroute_match(const char *sub)
{
    for (size_t i = 0; i < N_OF(exact_routes); i++)
        if (!strcmp(sub, exact_routes[i].path)) return exact_routes[i].route;
    for (size_t i = 0; i < N_OF(named_routes); i++)
        if (named_route_match(&named_routes[i], sub)) return named_routes[i].route;
    return IV_VR_NONE;
}

/* The name in sub of a route that has one, else NULL. */
static const char *route_name(int route, const char *sub)
{
    for (size_t i = 0; i < N_OF(named_routes); i++)
        if (named_routes[i].route == route) return sub + strlen(named_routes[i].prefix);
    return NULL;
}

int iv_vroute_allows_post(int route)
{
    return route == IV_VR_OBSM || route == IV_VR_VARM || route == IV_VR_AGGREGATE || route == IV_VR_DIFFEXP ||
           route == IV_VR_OBS_TABLE || route == IV_VR_VAR_TABLE || route == IV_VR_RAW_VAR_TABLE ||
           route == IV_VR_OBS_COLUMN || route == IV_VR_VAR_COLUMN || route == IV_VR_RAW_VAR_COLUMN ||
           route == IV_VR_OBSP;
}

iv_vreq_t *iv_vreq_new(int route, const char *sub, int is_post, const char *query, char *body,
                       size_t body_len, const char *accept, int *bad_name)
{
    *bad_name = 0;
    iv_vreq_t *r = calloc(1, sizeof *r);
    if (!r) {
        free(body);
        return NULL;
    }
    iv_buf_init(&r->out);
    r->route = route;
    r->is_post = is_post;
    r->body = body;
    r->body_len = body_len;
    r->query = strdup(query ? query : "");
    if (accept) r->accept = strdup(accept);
    const char *nm = route_name(route, sub);
    if (nm) {
        r->name = iv_url_decode(nm, strlen(nm));
        if (!r->name) *bad_name = 1;
    }
    if (!r->query || (accept && !r->accept) || *bad_name) {
        iv_vreq_free(r);
        return NULL;
    }
    return r;
}

void iv_vreq_free(iv_vreq_t *r)
{
    if (!r) return;
    free(r->name);
    free(r->query);
    free(r->body);
    free(r->accept);
    free(r->if_none_match);
    free(r->accept_encoding);
    free(r->dropped);
    iv_buf_free(&r->out);
    free(r);
}

/* ---- caching and compression ---------------------------------------------- */

static int etag_listed(const char *inm, const char *etag)
{
    const char *p = inm;
    size_t el = strlen(etag);
    while (p && *p) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == '*') return 1;
        if (!strncmp(p, "W/", 2)) p += 2;  /* If-None-Match compares weakly */
        if (!strncmp(p, etag, el) && (p[el] == '\0' || p[el] == ',' || p[el] == ' ')) return 1;
        p = strchr(p, ',');
    }
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    /* The NUL separates fields, so "ab"+"c" and "a"+"bc" differ. */
    return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1);
}

/* Two tags: the identity body's and the encoded body's.  Which one a
 * response gets is known only after the work (a body may not be worth
 * encoding), so a conditional request matching either is answered 304
 * with the tag it matched: both bodies stand for this request. */
static void vreq_etags(const iv_vreq_t *r, iv_coding_t coding, char tag_id[24], char tag_coded[24])
{
    static const char *const suffix[] = {"", "-gz", "-br"};
    uint64_t h = 1469598103934665603ull;
    h = fnv_str(h, iv_vds_identity(r->vx));
    h = fnv(h, &r->route, sizeof r->route);
    if (r->route == IV_VR_ZARR) {
        /* The store's bytes also depend on its format and chunking. */
        static const int64_t zarr_format[3] = {IV_ZARR_STORE_FORMAT, IV_ZARR_X_CHUNK, IV_ZARR_ZSTD_LEVEL};
        h = fnv(h, zarr_format, sizeof zarr_format);
    }
    if (r->route == IV_VR_UNS) {
        static const int uns_format = IV_API_UNS_FORMAT;
        h = fnv(h, &uns_format, sizeof uns_format);
    }
    h = fnv_str(h, r->name);
    h = fnv_str(h, r->query);
    h = fnv(h, r->body ? r->body : "", r->body_len);
    h = fnv_str(h, r->accept);
    snprintf(tag_id, 24, "\"%016llx\"", (unsigned long long)h);
    snprintf(tag_coded, 24, "\"%016llx%s\"", (unsigned long long)(h ^ (uint64_t)coding), suffix[coding]);
}

/* The tag of If-None-Match that stands for this request, or NULL. */
static const char *vreq_match(const iv_vreq_t *r, iv_coding_t coding, const char *tag_id,
                              const char *tag_coded)
{
    if (!r->if_none_match) return NULL;
    if (coding && etag_listed(r->if_none_match, tag_coded)) return tag_coded;
    if (etag_listed(r->if_none_match, tag_id)) return tag_id;
    return NULL;
}

typedef int (*route_run_fn)(iv_vreq_t *r, iv_err_t *err);

/* Each route's handler. */
static const route_run_fn route_runs[] = {
    [IV_VR_OBSM] = vr_run_marray,
    [IV_VR_VARM] = vr_run_marray,
    [IV_VR_OBS_SEARCH] = vr_run_search,
    [IV_VR_VAR_SEARCH] = vr_run_search,
    [IV_VR_RAW_VAR_SEARCH] = vr_run_search,
    [IV_VR_AGGREGATE] = vr_run_aggregate,
    [IV_VR_DIFFEXP] = vr_run_diffexp,
    [IV_VR_OBS_TABLE] = vr_run_meta,
    [IV_VR_VAR_TABLE] = vr_run_meta,
    [IV_VR_OBS_COLUMN] = vr_run_meta,
    [IV_VR_VAR_COLUMN] = vr_run_meta,
    [IV_VR_RAW_VAR_TABLE] = vr_run_meta,
    [IV_VR_RAW_VAR_COLUMN] = vr_run_meta,
    [IV_VR_ZARR] = vr_run_zarr,
    [IV_VR_UNS] = vr_run_uns,
    [IV_VR_OBSP_LIST] = vr_run_obsp_list,
    [IV_VR_OBSP] = vr_run_obsp,
};

/* Encodes r->out with the coding where that pays; 1 when it did.  Float
 * arrays (embeddings) shrink by under 10% at a cost of 10 to 300 MB/s a
 * thread: they go out as they are, compressible bodies (JSON, NDJSON, the
 * aggregate's binary with its JSON prelude) are encoded.  Zarr chunks go
 * as they are too (docs/zarr.md): their metadata is encoded. */
static int encode_body(iv_vreq_t *r, iv_coding_t coding)
{
    int worth = r->route == IV_VR_ZARR ? r->ctype == MEDIA_ZARR_META : strcmp(r->ctype, MEDIA_ARRAY) != 0;
    if (!coding || !worth || r->out.len < 1024) return 0;
    return iv_coding_encode(&r->out, coding, GZIP_LEVEL, r->pool);
}

int iv_vreq_run(iv_vreq_t *r, iv_err_t *err)
{
    /* The coding is chosen before the work so that the ETag (which names
     * it) is known before it, and a match costs nothing more. */
    iv_coding_t coding = iv_coding_pick(r->accept_encoding, IV_ANSWER_DOCUMENT, GZIP_LEVEL);
    char tag_id[24], tag_coded[24];
    vreq_etags(r, coding, tag_id, tag_coded);
    char cc[80];
    if (r->max_age)
        snprintf(cc, sizeof cc, "Cache-Control: %s, max-age=%u\r\n", r->private_cache ? "private" : "public",
                 (unsigned)r->max_age);
    else
        snprintf(cc, sizeof cc, "Cache-Control: no-cache\r\n");
    r->status = 200;
    const char *match = vreq_match(r, coding, tag_id, tag_coded);
    if (match) {
        snprintf(r->extra, sizeof r->extra, "ETag: %s\r\n%sVary: Accept, Accept-Encoding\r\n", match, cc);
        r->status = 304;
        return 0;
    }
    route_run_fn run = r->route > 0 && (size_t)r->route < N_OF(route_runs) ? route_runs[r->route] : NULL;
    if (!run) return iv_fail(err, IV_ENOT_FOUND, "no such path");
    IV_TRY(run(r, err));
    int encoded = encode_body(r, coding);
    snprintf(r->extra, sizeof r->extra, "ETag: %s\r\n%sVary: Accept, Accept-Encoding\r\n%s%s%s",
             encoded ? tag_coded : tag_id, cc, encoded ? "Content-Encoding: " : "",
             encoded ? iv_coding_name(coding) : "", encoded ? "\r\n" : "");
    return 0;
}
