/*
 * Names index (see names.h).
 *
 * Two open-addressing tables of 32-bit slots, one keyed by the exact
 * bytes and one by the ASCII-lower-cased bytes, each at most half full,
 * so a lookup is one hash and about 1.5 probes.  Slots hold row + 1 (0 is
 * empty); strings are not copied but fetched through the caller's
 * callback, which keeps the index at 8 bytes a row per table on average:
 * about 20 MB for 1.26 million cell names with both tables.  In the fold
 * table bit 31 marks a key shared by several distinct strings, which a
 * lookup reports as ambiguous instead of picking one arbitrarily.
 */
#include "names.h"

#include <stdlib.h>
#include <string.h>

#define AMBIG 0x80000000u

struct iv_names {
    int64_t n;
    iv_names_get_fn get;
    const void *ctx;
    uint32_t mask;        /* table size - 1 (power of two) */
    uint32_t *exact;
    uint32_t *fold;
};

static inline unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

uint64_t iv_names_hash(const char *s, size_t len, int fold)
{
    /* FNV-1a over bytes with a final avalanche; names are short, so a
     * byte loop costs less than the cache miss of the probe. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (fold) c = lower(c);
        h ^= c;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static int eq_exact(const char *a, const char *b, size_t blen)
{
    return strncmp(a, b, blen) == 0 && a[blen] == '\0';
}

static int eq_fold(const char *a, const char *b, size_t blen)
{
    for (size_t i = 0; i < blen; i++) {
        if (a[i] == '\0' || lower((unsigned char)a[i]) != lower((unsigned char)b[i])) return 0;
    }
    return a[blen] == '\0';
}

/* Row i (name s of len bytes) into the exact table. */
static inline void insert_exact(iv_names_t *h, int64_t i, const char *s, size_t len)
{
    uint32_t j = (uint32_t)iv_names_hash(s, len, 0) & h->mask;
    for (;;) {
        uint32_t v = h->exact[j];
        if (v == 0) {
            h->exact[j] = (uint32_t)(i + 1);
            return;
        }
        /* Duplicates keep the first row, as a lookup promises. */
        if (eq_exact(h->get(h->ctx, (int64_t)v - 1), s, len)) return;
        j = (j + 1) & h->mask;
    }
}

/* Row i into the case-folded table; a second name of the same folding
 * marks the first entry ambiguous. */
static inline void insert_fold(iv_names_t *h, int64_t i, const char *s, size_t len)
{
    uint32_t j = (uint32_t)iv_names_hash(s, len, 1) & h->mask;
    for (;;) {
        uint32_t v = h->fold[j];
        if (v == 0) {
            h->fold[j] = (uint32_t)(i + 1);
            return;
        }
        const char *t = h->get(h->ctx, (int64_t)(v & ~AMBIG) - 1);
        if (eq_fold(t, s, len)) {
            if (!eq_exact(t, s, len)) h->fold[j] = v | AMBIG;
            return;
        }
        j = (j + 1) & h->mask;
    }
}

int iv_names_build(int64_t n, iv_names_get_fn get, const void *ctx, iv_names_t **out,
                   iv_err_t *err)
{
    *out = NULL;
    IV_RETURN_IF(n < 0 || n >= (int64_t)0x7fffffff, err, IV_ETOO_LARGE,
                 "names index: %lld rows is more than supported", (long long)n);
    uint64_t size = 16;
    while (size < (uint64_t)n * 2) size <<= 1;
    iv_names_t *h = calloc(1, sizeof(*h));
    if (!h) return iv_fail(err, IV_ENOMEM, "names index: out of memory");
    h->n = n;
    h->get = get;
    h->ctx = ctx;
    h->mask = (uint32_t)(size - 1);
    h->exact = calloc(size, sizeof(uint32_t));
    h->fold = calloc(size, sizeof(uint32_t));
    if (!h->exact || !h->fold) {
        iv_names_free(h);
        return iv_fail(err, IV_ENOMEM, "names index: out of memory for %lld rows", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        const char *s = get(ctx, i);
        if (!s) continue;
        size_t len = strlen(s);
        insert_exact(h, i, s, len);
        insert_fold(h, i, s, len);
    }
    *out = h;
    return 0;
}

void iv_names_free(iv_names_t *h)
{
    if (!h) return;
    free(h->exact);
    free(h->fold);
    free(h);
}

int64_t iv_names_find(const iv_names_t *h, const char *s, size_t len)
{
    /* Stored strings are NUL-terminated, so a key holding a NUL matches
     * none; checking here keeps the comparisons inside both strings. */
    if (memchr(s, 0, len)) return -1;
    uint32_t j = (uint32_t)iv_names_hash(s, len, 0) & h->mask;
    for (;;) {
        uint32_t v = h->exact[j];
        if (v == 0) return -1;
        if (eq_exact(h->get(h->ctx, (int64_t)v - 1), s, len)) return (int64_t)v - 1;
        j = (j + 1) & h->mask;
    }
}

int64_t iv_names_find_fold(const iv_names_t *h, const char *s, size_t len)
{
    if (memchr(s, 0, len)) return -1;
    uint32_t j = (uint32_t)iv_names_hash(s, len, 1) & h->mask;
    for (;;) {
        uint32_t v = h->fold[j];
        if (v == 0) return -1;
        if (eq_fold(h->get(h->ctx, (int64_t)(v & ~AMBIG) - 1), s, len))
            return (v & AMBIG) ? -2 : (int64_t)(v & ~AMBIG) - 1;
        j = (j + 1) & h->mask;
    }
}

size_t iv_names_bytes(const iv_names_t *h)
{
    return h ? sizeof(*h) + 2 * ((size_t)h->mask + 1) * sizeof(uint32_t) : 0;
}
