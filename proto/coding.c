/*
 * The content coding of an answer (coding.h).
 *
 * Why one module: the query streams and the viewer routes used to read
 * Accept-Encoding each in their own way, with one q-value parser in the
 * HTTP layer.  The rules differ only by what an answer kind can be sent
 * in, so they are one function with the kind as an argument, and a unit
 * test pins its choice for every header form the routes have met.
 *
 * The parser is lenient on purpose (a malformed header picks a coding,
 * never an error): an entry is whatever lies between commas, its coding
 * the text before ';' less surrounding spaces, its q the number after the
 * first "q=" past the ';'.
 */
#include "coding.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <brotli/encode.h>

#include "gzip_stream.h"

/* br's quality for documents, from the compression table in
 * benchmarks/README.md: at quality 1 as small as gzip level 1 or smaller,
 * and faster, on every body measured. */
#define BR_QUALITY 1

/* The qvalue of the list element at p (1 when it has none); next is the
 * ',' after it or NULL. */
static double element_q(const char *p, const char *next)
{
    const char *semi = memchr(p, ';', next ? (size_t)(next - p) : strlen(p));
    if (!semi) return 1;
    const char *qq = strstr(semi, "q=");
    return qq && (!next || qq < next) ? strtod(qq + 2, NULL) : 1;
}

double iv_coding_q(const char *h, const char *coding)
{
    double star = -1, named = -1;
    const char *p = h;  /* NULL (no header) names nothing */
    while (p && *p) {
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ";,");
        while (n && p[n - 1] == ' ') n--;
        const char *next = strchr(p, ',');
        double q = element_q(p, next);
        if (n == strlen(coding) && !strncasecmp(p, coding, n)) named = q;
        else if (n == 1 && *p == '*') star = q;
        p = next;
    }
    return named >= 0 ? named : star;
}

iv_coding_t iv_coding_pick(const char *h, iv_answer_kind_t kind, int gzip_level)
{
    double qg = iv_coding_q(h, "gzip");
    if (kind == IV_ANSWER_DOCUMENT) {
        double qb = iv_coding_q(h, "br");
        if (qb > 0 && qb >= qg) return IV_CODING_BR;
    }
    if (gzip_level <= 0 || qg == 0) return IV_CODING_IDENTITY;
    if (qg > 0) return IV_CODING_GZIP;
    /* No entry gave gzip a q (qg is negative, or NaN from a malformed
     * "*" entry): only a stream takes a refusal of identity as a request
     * for gzip. */
    return kind == IV_ANSWER_STREAM && iv_coding_q(h, "identity") == 0 ? IV_CODING_GZIP
                                                                        : IV_CODING_IDENTITY;
}

const char *iv_coding_name(iv_coding_t c)
{
    return c == IV_CODING_BR ? "br" : c == IV_CODING_GZIP ? "gzip" : "identity";
}

/* gzip: keeps the identity body when compression does not pay. */
static int gzip_body(iv_buf_t *body, int level, struct iv_pool *pool)
{
    iv_buf_t z;
    iv_buf_init(&z);
    if (iv_gz_member(&z, body->data, body->len, level, pool) != 0 || z.len >= body->len) {
        iv_buf_free(&z);
        return 0;
    }
    iv_buf_free(body);
    *body = z;
    return 1;
}

/* br at BR_QUALITY, in one call; as gzip_body. */
static int brotli_body(iv_buf_t *body)
{
    size_t bound = BrotliEncoderMaxCompressedSize(body->len);
    if (bound == 0) return 0;
    uint8_t *dst = malloc(bound);
    if (!dst) return 0;
    size_t n = bound;
    if (!BrotliEncoderCompress(BR_QUALITY, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, body->len,
                               (const uint8_t *)body->data, &n, dst) ||
        n >= body->len) {
        free(dst);
        return 0;
    }
    free(body->data);
    body->data = (char *)dst;
    body->len = n;
    body->cap = bound;
    return 1;
}

int iv_coding_encode(iv_buf_t *body, iv_coding_t c, int gzip_level, struct iv_pool *pool)
{
    if (c == IV_CODING_BR) return brotli_body(body);
    if (c == IV_CODING_GZIP) return gzip_body(body, gzip_level, pool);
    return 0;
}
