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

#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
