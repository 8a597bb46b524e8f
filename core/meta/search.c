/*
 * Name search (see search.h).
 *
 * Design.  The names are copied once, lower-cased, into one arena with a
 * NUL after each, plus an offset per row.  A query lower-cases the
 * fragment and runs memmem() over the whole arena: glibc's memmem skips
 * through non-matching text far faster than a loop of per-name calls, and
 * because the fragment holds no NUL a match never spans two names.  Each
 * hit is mapped to its row by advancing a row cursor (hits come in arena
 * order), classified (exact, prefix, substring by its position and the
 * name's length), and the search resumes at the next name, so a name is
 * counted once.  The best `limit` hits are kept in a bounded max-heap,
 * so a fragment matching a million cell names costs O(hits log limit)
 * and no allocation proportional to the hits.
 */
#include "search.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct iv_search {
    uint64_t freq[256];    /* how often each byte occurs in lower */
    int64_t n;
    char *lower;           /* n lower-cased names, each NUL-terminated */
    int64_t *off;          /* n + 1 offsets into lower */
    iv_search_get_fn get;
    const void *ctx;
};

static inline char lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
}

int iv_search_build(int64_t n, iv_search_get_fn get, const void *ctx, iv_search_t **out,
                    iv_err_t *err)
{
    *out = NULL;
    IV_RETURN_IF(n < 0, err, IV_EINVALID_ARG, "search index: negative row count");
    iv_search_t *s = calloc(1, sizeof *s);
    IV_RETURN_IF(!s, err, IV_ENOMEM, "search index: out of memory");
    s->n = n;
    s->get = get;
    s->ctx = ctx;
    s->off = malloc((size_t)(n + 1) * sizeof *s->off);
    size_t total = 0;
    for (int64_t i = 0; s->off && i < n; i++) {
        const char *x = get(ctx, i);
        total += (x ? strlen(x) : 0) + 1;
    }
    s->lower = malloc(total ? total : 1);
    if (!s->off || !s->lower) {
        iv_search_free(s);
        return iv_fail(err, IV_ENOMEM, "search index: out of memory for %lld names", (long long)n);
    }
    size_t p = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *x = get(ctx, i);
        s->off[i] = (int64_t)p;
        for (; x && *x; x++) {
            char c = lower(*x);
            s->freq[(unsigned char)c]++;
            s->lower[p++] = c;
        }
        s->lower[p++] = '\0';
    }
    s->off[n] = (int64_t)p;
    *out = s;
    return 0;
}

void iv_search_free(iv_search_t *s)
{
    if (!s) return;
    free(s->lower);
    free(s->off);
    free(s);
}

size_t iv_search_bytes(const iv_search_t *s)
{
    return s ? sizeof *s + (size_t)s->off[s->n] + (size_t)(s->n + 1) * sizeof *s->off : 0;
}

const char *iv_match_name(iv_match_t k)
{
    switch (k) {
    case IV_MATCH_EXACT: return "exact";
    case IV_MATCH_PREFIX: return "prefix";
    default: return "substring";
    }
}

/* A hit with its rank key; smaller ranks first. */
typedef struct hit {
    int kind;
    int case_differs;
    int64_t len, pos, row;
} hit_t;

static int hit_before(const hit_t *a, const hit_t *b)
{
    if (a->kind != b->kind) return a->kind < b->kind;
    if (a->case_differs != b->case_differs) return a->case_differs < b->case_differs;
    if (a->len != b->len) return a->len < b->len;
    if (a->pos != b->pos) return a->pos < b->pos;
    return a->row < b->row;
}

/* Max-heap on rank: the root is the worst hit kept. */
static void heap_sift_down(hit_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && hit_before(&h[w], &h[l])) w = l;
        if (r < n && hit_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        hit_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void heap_sift_up(hit_t *h, int64_t i)
{
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!hit_before(&h[p], &h[i])) return;
        hit_t t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static int cmp_hit(const void *a, const void *b)
{
    const hit_t *x = a, *y = b;
    return hit_before(x, y) ? -1 : hit_before(y, x) ? 1 : 0;
}

/* One query's scan over the arena: the lower-cased fragment, how
 * candidates are found, and the heap of the best hits so far. */
typedef struct scan {
    const iv_search_t *s;
    const char *q, *ql;    /* the fragment as given, and lower-cased */
    size_t qlen, rj;       /* its length, and the offset of its rarest byte */
    int use_memchr;
    const char *base, *end;
    hit_t *heap;
    int64_t limit, kept, count, row;
} scan_t;

/* The fragment's rarest byte (by the arena's byte counts) and how often
 * it occurs: when it is rare, memchr() for it and a memcmp() at each
 * candidate beat memmem(), whose set-up cost is paid again after every
 * hit (a fragment such as "rpl" hits a tenth of gene names). */
static void choose_scan(scan_t *c)
{
    const iv_search_t *s = c->s;
    size_t rj = 0;
    for (size_t i = 1; i < c->qlen; i++)
        if (s->freq[(unsigned char)c->ql[i]] < s->freq[(unsigned char)c->ql[rj]]) rj = i;
    uint64_t total_bytes = (uint64_t)s->off[s->n];
    c->rj = rj;
    c->use_memchr = c->qlen > 1 && s->freq[(unsigned char)c->ql[rj]] * 16 < total_bytes;
}

/* The next occurrence of the fragment at or after p, or NULL. */
static inline const char *next_match(const scan_t *c, const char *p)
{
    if (!c->use_memchr) return memmem(p, (size_t)(c->end - p), c->ql, c->qlen);
    size_t rj = c->rj;
    while (p < c->end) {
        const char *b = p + rj < c->end ? memchr(p + rj, c->ql[rj], (size_t)(c->end - p - (ptrdiff_t)rj)) : NULL;
        if (!b) return NULL;
        const char *m = b - rj;
        if (m + c->qlen <= c->end && memcmp(m, c->ql, c->qlen) == 0) return m;
        p = m + 1;
    }
    return NULL;
}

/* Counts the hit at m, keeps it when it ranks among the best, and
 * returns where the scan resumes: the next name, so each row counts
 * once. */
static inline const char *take_hit(scan_t *c, const char *m)
{
    const iv_search_t *s = c->s;
    int64_t at = (int64_t)(m - c->base);
    /* Hits come in arena order: move the row cursor forward to the
     * name that holds this one (the fragment has no NUL, so it lies
     * inside a single name). */
    while (s->off[c->row + 1] <= at) c->row++;
    int64_t row = c->row;
    hit_t h;
    h.row = row;
    h.len = s->off[row + 1] - s->off[row] - 1;
    h.pos = at - s->off[row];
    h.kind = h.pos > 0 ? IV_MATCH_SUBSTRING
             : (size_t)h.len == c->qlen ? IV_MATCH_EXACT : IV_MATCH_PREFIX;
    c->count++;
    /* Reading the original name (for the case rank) is a random
     * access: skip it when even a same-case match would not be kept. */
    h.case_differs = 0;
    if (c->kept == c->limit && !hit_before(&h, &c->heap[0])) return c->base + s->off[row + 1];
    const char *orig = s->get(s->ctx, row);
    h.case_differs = !orig || memcmp(orig + h.pos, c->q, c->qlen) != 0;
    if (c->kept < c->limit) {
        c->heap[c->kept] = h;
        heap_sift_up(c->heap, c->kept);
        c->kept++;
    } else if (hit_before(&h, &c->heap[0])) {
        c->heap[0] = h;
        heap_sift_down(c->heap, c->kept, 0);
    }
    return c->base + s->off[row + 1];
}

int64_t iv_search_run(const iv_search_t *s, const char *q, size_t qlen, int64_t limit,
                      iv_search_hit_t *hits, int64_t *total)
{
    *total = 0;
    if (qlen == 0 || limit <= 0 || memchr(q, 0, qlen)) return 0;
    char qsmall[256];
    char *ql = qlen <= sizeof qsmall ? qsmall : malloc(qlen);
    hit_t *heap = malloc((size_t)limit * sizeof *heap);
    if (!ql || !heap) {
        if (ql != qsmall) free(ql);
        free(heap);
        return IV_ENOMEM;
    }
    for (size_t i = 0; i < qlen; i++) ql[i] = lower(q[i]);
    scan_t c = {s, q, ql, qlen, 0, 0, s->lower, s->lower + s->off[s->n], heap, limit, 0, 0, 0};
    choose_scan(&c);
    const char *p = c.base, *m;
    while (p < c.end && (m = next_match(&c, p))) p = take_hit(&c, m);
    qsort(heap, (size_t)c.kept, sizeof *heap, cmp_hit);
    for (int64_t i = 0; i < c.kept; i++) {
        hits[i].row = heap[i].row;
        hits[i].kind = (iv_match_t)heap[i].kind;
    }
    if (ql != qsmall) free(ql);
    free(heap);
    *total = c.count;
    return c.kept;
}
