/*
 * Row bitmaps (see bitmap.h).  Filters evaluate every leaf to a bitmap
 * and combine them word by word: for a million cells one leaf is 16 KiB
 * and an and/or is 20,000 word operations, far cheaper than the leaf
 * scans themselves, so the tree needs no cleverer planner.
 */
#include "bitmap.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

size_t iv_bitmap_words(const iv_bitmap_t *b)
{
    return b->n > 0 ? (size_t)((b->n + 63) / 64) : 0;
}

int iv_bitmap_init(iv_bitmap_t *b, int64_t n)
{
    b->n = n < 0 ? 0 : n;
    b->w = NULL;
    size_t nw = iv_bitmap_words(b);
    /* calloc(0) may return NULL legitimately; keep one word so that w is
     * always a valid pointer. */
    b->w = calloc(nw ? nw : 1, sizeof(uint64_t));
    if (!b->w) {
        b->n = 0;
        return IV_ENOMEM;
    }
    return 0;
}

void iv_bitmap_free(iv_bitmap_t *b)
{
    if (!b) return;
    free(b->w);
    b->w = NULL;
    b->n = 0;
}

/* Clears the bits past n in the last word, which and/or never set but
 * not and fill would. */
static void clear_tail(iv_bitmap_t *b)
{
    size_t nw = iv_bitmap_words(b);
    if (nw && (b->n & 63)) b->w[nw - 1] &= ((uint64_t)1 << (b->n & 63)) - 1;
}

void iv_bitmap_fill(iv_bitmap_t *b, int value)
{
    memset(b->w, value ? 0xff : 0, iv_bitmap_words(b) * sizeof(uint64_t));
    clear_tail(b);
}

void iv_bitmap_and(iv_bitmap_t *dst, const iv_bitmap_t *src)
{
    size_t nw = iv_bitmap_words(dst);
    for (size_t i = 0; i < nw; i++) dst->w[i] &= src->w[i];
}

void iv_bitmap_or(iv_bitmap_t *dst, const iv_bitmap_t *src)
{
    size_t nw = iv_bitmap_words(dst);
    for (size_t i = 0; i < nw; i++) dst->w[i] |= src->w[i];
}

void iv_bitmap_not(iv_bitmap_t *dst)
{
    size_t nw = iv_bitmap_words(dst);
    for (size_t i = 0; i < nw; i++) dst->w[i] = ~dst->w[i];
    clear_tail(dst);
}

int64_t iv_bitmap_count(const iv_bitmap_t *b)
{
    size_t nw = iv_bitmap_words(b);
    int64_t c = 0;
    for (size_t i = 0; i < nw; i++) c += __builtin_popcountll(b->w[i]);
    return c;
}

int iv_bitmap_to_index(const iv_bitmap_t *b, int64_t **out, int64_t *n_out)
{
    int64_t c = iv_bitmap_count(b);
    *out = NULL;
    *n_out = 0;
    if (c == 0) return 0;
    int64_t *idx = malloc((size_t)c * sizeof(int64_t));
    if (!idx) return IV_ENOMEM;
    size_t nw = iv_bitmap_words(b);
    int64_t k = 0;
    for (size_t i = 0; i < nw; i++) {
        uint64_t w = b->w[i];
        while (w) {
            idx[k++] = (int64_t)(i * 64 + (size_t)__builtin_ctzll(w));
            w &= w - 1;
        }
    }
    *out = idx;
    *n_out = k;
    return 0;
}

int64_t iv_bitmap_filter_index(const iv_bitmap_t *b, const int64_t *idx, int64_t n,
                               int64_t *out)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = idx[i];
        if (r >= 0 && r < b->n && iv_bitmap_get(b, r)) out[k++] = r;
    }
    return k;
}
