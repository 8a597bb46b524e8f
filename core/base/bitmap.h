/*
 * Row bitmaps: one bit per row of an axis, the common currency of filter
 * evaluation.  Words are 64-bit so that and/or/not and population counts
 * run a word at a time; bits past n in the last word are kept zero, so
 * that counts and conversions never see phantom rows.
 *
 * A bitmap is owned by whoever created it; none of these functions keeps
 * state, so different bitmaps may be used from different threads freely.
 */
#ifndef IV_BITMAP_H
#define IV_BITMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct iv_bitmap {
    int64_t n;        /* rows */
    uint64_t *w;      /* (n + 63) / 64 words */
} iv_bitmap_t;

/* Allocates n zero bits; 0 or IV_ENOMEM. */
int iv_bitmap_init(iv_bitmap_t *b, int64_t n);
void iv_bitmap_free(iv_bitmap_t *b);
size_t iv_bitmap_words(const iv_bitmap_t *b);

static inline void iv_bitmap_set(iv_bitmap_t *b, int64_t i)
{
    b->w[i >> 6] |= (uint64_t)1 << (i & 63);
}
static inline int iv_bitmap_get(const iv_bitmap_t *b, int64_t i)
{
    return (int)((b->w[i >> 6] >> (i & 63)) & 1);
}

void iv_bitmap_fill(iv_bitmap_t *b, int value);
/* dst &= src, dst |= src (same n); dst = ~dst (tail kept zero). */
void iv_bitmap_and(iv_bitmap_t *dst, const iv_bitmap_t *src);
void iv_bitmap_or(iv_bitmap_t *dst, const iv_bitmap_t *src);
void iv_bitmap_not(iv_bitmap_t *dst);
int64_t iv_bitmap_count(const iv_bitmap_t *b);

/* Set rows in ascending order into a new malloc'd array (*out may be NULL
 * when *n_out is 0).  0 or IV_ENOMEM. */
int iv_bitmap_to_index(const iv_bitmap_t *b, int64_t **out, int64_t *n_out);

/* Keeps the entries of idx[0..n) whose bit is set, in idx's order (an
 * index list gives the order; duplicates stay).  Entries outside [0, b->n)
 * are dropped.  Writes to out (capacity n; it may be idx itself); returns
 * how many were kept. */
int64_t iv_bitmap_filter_index(const iv_bitmap_t *b, const int64_t *idx, int64_t n,
                               int64_t *out);

#endif /* IV_BITMAP_H */
