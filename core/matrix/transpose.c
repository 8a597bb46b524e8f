/*
 * The other orientation built in memory (see transpose.h).
 *
 * The copy's entries are the source's (slice s, value v, index j) turned
 * into (slice j, value v, index s), ordered by j, then by v (ascending, as
 * the format's writer orders groups), then by s.  It is a counting sort
 * that never holds more than a bounded temporary:
 *
 *  1. Value ids.  The source's distinct values (by bit pattern, so that
 *     -0.0, 0.0 and NaN payloads stay apart and every value round-trips
 *     exactly) are numbered in value order; each source group gets the id
 *     of its value.  Parts of the groups collect their distinct values in
 *     parallel; the merged set is ranked once.
 *  2. Counts and blocks.  The source slices are cut into bands of about
 *     equal nnz.  New slices are taken in blocks: runs of consecutive new
 *     slices, a few thousand of them.  When every entry fits the
 *     temporary at once (the default for a count matrix), the blocks are
 *     cut by counts estimated from the first 1/64 of each band's slices
 *     and the source is decoded once, by the fill below; the encode
 *     counts each block's new slices.  Otherwise a count pass decodes
 *     the bands first, and the new slices go in windows whose entries fit
 *     the temporary, each cut in blocks by the exact counts.
 *  3. Fill.  A band's worker decodes its slices and appends each entry of
 *     the window to its (band, block) part, as one word: source slice
 *     less the band's first, value id, place of the new slice in its
 *     block (4 bytes when these fit, else 8).  A part is a chain of
 *     chunks taken from its band's share of the temporary, so no count is
 *     needed before the fill.  Writing to a few thousand sequential
 *     streams through line-aligned write-combining buffers, whole lines
 *     with streaming stores, replaced a scattered store per entry into
 *     one stretch per new slice (tens of thousands of targets, no cache
 *     or TLB held them): on the 2-core machine that halved the fill's
 *     CPU time.  A value group whose indices pass the window's end skips
 *     the rest of its varints.
 *  4. Encode, per block and in parallel: a first read of the block's
 *     parts, bands in order (so source slices come ascending within each
 *     new slice), counts each new slice's entries and checks that no
 *     source slice appears twice (a corrupt source); a stable counting
 *     sort by (new slice, value id), or by new slice and then per new
 *     slice by value id when value ids are many, orders each group's
 *     source slices; the delta varints go to a local buffer and then
 *     over the block's own chunks (a varint is never longer than an
 *     entry).  Once the window's byte offsets are known they are moved
 *     to the copy's stream.
 *
 * The copy's stream is one allocation sized for the worst case and
 * shrunk at the end: pages never written are never committed, so memory
 * is the stream's real size.  The row index of the copy comes from the
 * byte offset of every new slice, which the encode step knows, so no
 * second pass is needed.
 */
#include "transpose.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cursor.h"
#include "dataset_impl.h"
#include "clock.h"

/* Write-combining buffers of the fill: a cache line a new slice, at most
 * this many bytes a band (past that, entries go straight to the
 * temporary). */
#define WC_LINE 64
#define WC_MAX_BYTES ((uint64_t)8 << 20)

#if defined(__SSE2__)
#include <emmintrin.h>
#define IV_TP_STREAM 1
#else
#define IV_TP_STREAM 0
#endif

/* Blocks of new slices (see encode_item): about this many a window, of at
 * least this many entries, of at least 2^BLOCK_MIN_BITS slices when the
 * temporary's entries are 4 bytes, of at most 2^BLOCK_MAX_BITS slices. */
#define BLOCKS_A_WINDOW 2048
#define BLOCK_MIN_ENTRIES ((uint64_t)1 << 16)
#define BLOCK_MIN_BITS 3
#define BLOCK_MAX_BITS 16

/* Bound on the per-band counters, all bands together. */
#define COUNTER_BYTES ((uint64_t)256 << 20)

/* Most entries a chunk of the fill's chains (see plan_shares), and the
 * share of each band's slices whose counts estimate the blocks' sizes. */
#define CHUNK_MAX_ENTRIES 1024
#define SAMPLE_SHARE 64

/* Most (new slice, value id) counters of the encode's joint sort. */
#define HIST_MAX ((uint64_t)1 << 16)

void iv_budget_init(iv_budget_t *b, uint64_t bytes) { atomic_init(&b->left, bytes); }

int iv_budget_take(iv_budget_t *b, uint64_t n)
{
    uint_fast64_t cur = atomic_load(&b->left);
    do {
        if (cur < n) return -1;
    } while (!atomic_compare_exchange_weak(&b->left, &cur, cur - n));
    return 0;
}

void iv_budget_give(iv_budget_t *b, uint64_t n) { atomic_fetch_add(&b->left, n); }

/*
 * Large arrays of the build come from anonymous mappings asked for
 * transparent huge pages: the temporary and the copy's stream are written
 * once, scattered, and taking their memory 4 KiB a fault measured slower
 * than the writes themselves.  Pages never written are never committed.
 */
#define HUGE_ALIGN ((size_t)2 << 20)

static void *big_map(size_t bytes)
{
    size_t len = (bytes + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
    void *p = mmap(NULL, len ? len : HUGE_ALIGN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len ? len : HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    return p;
}

static size_t big_len(size_t bytes)
{
    size_t len = (bytes + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
    return len ? len : HUGE_ALIGN;
}

static void big_unmap(void *p, size_t bytes)
{
    if (p) munmap(p, big_len(bytes));
}

static unsigned bits_for(uint64_t n_values)
{
    unsigned b = 0;
    while (b < 64 && (n_values - 1) >> b && n_values > 1) b++;
    return b;
}

/* ---- 1. value ids ---- */

static uint64_t value_bits(const void *values, size_t esz, int64_t i)
{
    uint64_t x = 0;
    memcpy(&x, (const char *)values + (size_t)i * esz, esz);
    return x;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Orders two bit patterns of dtype t by value: integers by value, floats
 * by value with NaN last, ties (-0.0 and 0.0, NaN payloads) by bits. */
static iv_dtype_t cmp_dtype;
static int cmp_values(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    size_t esz = iv_dtype_size(cmp_dtype);
    switch (cmp_dtype) {
    case IV_DT_INT8: case IV_DT_INT16: case IV_DT_INT32: case IV_DT_INT64: {
        unsigned sh = (unsigned)(64 - 8 * esz);
        int64_t x = (int64_t)(a << sh) >> sh, y = (int64_t)(b << sh) >> sh;
        return (x > y) - (x < y);
    }
    case IV_DT_FLOAT32: case IV_DT_FLOAT64: {
        double x, y;
        if (esz == 4) {
            float f, g;
            uint32_t u = (uint32_t)a, v = (uint32_t)b;
            memcpy(&f, &u, 4);
            memcpy(&g, &v, 4);
            x = f;
            y = g;
        } else {
            memcpy(&x, &a, 8);
            memcpy(&y, &b, 8);
        }
        int nx = isnan(x), ny = isnan(y);
        if (nx != ny) return nx - ny;
        if (!nx && x != y) return (x > y) - (x < y);
        return (a > b) - (a < b);
    }
    default:
        return (a > b) - (a < b);
    }
}

/*
 * A set of bit patterns (open addressing, power-of-two capacity), each
 * with the id of its first addition; list[] holds them in that order.
 */
struct vset {
    uint64_t *keys, *list;
    uint32_t *ids;            /* UINT32_MAX: empty slot */
    size_t cap, used;
};

static int vset_init(struct vset *h)
{
    h->cap = 1024;
    h->used = 0;
    h->keys = malloc(h->cap * sizeof *h->keys);
    h->ids = malloc(h->cap * sizeof *h->ids);
    h->list = malloc(h->cap / 2 * sizeof *h->list);
    if (!h->keys || !h->ids || !h->list) return -1;
    memset(h->ids, 0xff, h->cap * sizeof *h->ids);
    return 0;
}

static void vset_free(struct vset *h)
{
    free(h->keys);
    free(h->ids);
    free(h->list);
    memset(h, 0, sizeof *h);
}

static inline size_t vset_slot(const struct vset *h, uint64_t k)
{
    size_t s = (size_t)mix64(k) & (h->cap - 1);
    while (h->ids[s] != UINT32_MAX && h->keys[s] != k) s = (s + 1) & (h->cap - 1);
    return s;
}

/* The id of k, added if new: 0, -1 out of memory, -2 too many values. */
static int vset_add(struct vset *h, uint64_t k, uint32_t *id)
{
    size_t s = vset_slot(h, k);
    if (h->ids[s] != UINT32_MAX) {
        *id = h->ids[s];
        return 0;
    }
    if (h->used >= UINT32_MAX - 1) return -2;
    if ((h->used + 1) * 2 >= h->cap) {
        /* Grow first: rehash every key, then place k. */
        size_t nc = h->cap * 2;
        uint64_t *nk = malloc(nc * sizeof *nk);
        uint32_t *ni = malloc(nc * sizeof *ni);
        uint64_t *nl = realloc(h->list, nc / 2 * sizeof *nl);
        if (nl) h->list = nl;
        if (!nk || !ni || !nl) {
            free(nk);
            free(ni);
            return -1;
        }
        memset(ni, 0xff, nc * sizeof *ni);
        for (size_t x = 0; x < h->cap; x++) {
            if (h->ids[x] == UINT32_MAX) continue;
            size_t g = (size_t)mix64(h->keys[x]) & (nc - 1);
            while (ni[g] != UINT32_MAX) g = (g + 1) & (nc - 1);
            nk[g] = h->keys[x];
            ni[g] = h->ids[x];
        }
        free(h->keys);
        free(h->ids);
        h->keys = nk;
        h->ids = ni;
        h->cap = nc;
        s = vset_slot(h, k);
    }
    h->keys[s] = k;
    h->ids[s] = (uint32_t)h->used;
    h->list[h->used++] = k;
    *id = h->ids[s];
    return 0;
}

/* Groups are numbered in parts, in parallel: each part first collects
 * its distinct values, then (once all are ranked) maps its groups. */
struct vparts {
    const iv_h5matrix_t *m;
    size_t esz;
    int64_t n_parts;
    struct vset *local;       /* per part */
    const struct vset *all;   /* ids = ranks, after the merge */
    uint32_t *vid;
    atomic_int rc;
};

static void vpart_collect(void *arg, size_t p)
{
    struct vparts *v = arg;
    int64_t n = v->m->n_unique, i0 = n * (int64_t)p / v->n_parts, i1 = n * (int64_t)(p + 1) / v->n_parts;
    struct vset *h = &v->local[p];
    if (vset_init(h) < 0) {
        atomic_store(&v->rc, -1);
        return;
    }
    uint64_t prev = 0;
    uint32_t id = 0;
    int have = 0;
    for (int64_t i = i0; i < i1; i++) {
        uint64_t k = value_bits(v->m->values, v->esz, i);
        if (!have || k != prev) {
            int rc = vset_add(h, k, &id);
            if (rc < 0) {
                atomic_store(&v->rc, rc);
                return;
            }
            prev = k;
            have = 1;
        }
        v->vid[i] = id;   /* the part's own id, ranked by vpart_map */
    }
}

static void vpart_map(void *arg, size_t p)
{
    struct vparts *v = arg;
    int64_t n = v->m->n_unique, i0 = n * (int64_t)p / v->n_parts, i1 = n * (int64_t)(p + 1) / v->n_parts;
    const struct vset *h = v->all;
    struct vset *l = &v->local[p];
    /* The part's ids to ranks: each of its values looked up once.  Its
     * own table is done with, so its id array (longer than its list)
     * holds the ranks by part id. */
    for (size_t x = 0; x < l->used; x++) l->ids[x] = h->ids[vset_slot(h, l->list[x])];
    for (int64_t i = i0; i < i1; i++) v->vid[i] = l->ids[v->vid[i]];
}

/*
 * Gives every source group the rank of its value among the distinct
 * values (vid, n_unique entries); *n_distinct and the distinct bit
 * patterns in rank order (*distinct) are returned.  Parts of the groups
 * collect their distinct values in parallel into small hash sets (values
 * of real matrices repeat: counts), which are merged, ranked and then
 * looked up in parallel.
 */
static int value_ids(const iv_h5matrix_t *m, iv_pool_t *pool, unsigned threads, uint32_t **vid_out,
                     uint64_t **distinct_out, uint64_t *n_distinct, iv_err_t *err)
{
    int64_t n = m->n_unique;
    int64_t np = (int64_t)threads * 4;
    if (np > n) np = n > 0 ? n : 1;
    struct vparts v = {.m = m, .esz = iv_dtype_size(m->value_dtype), .n_parts = np};
    atomic_init(&v.rc, 0);
    struct vset all = {0};
    uint64_t *sorted = NULL;
    uint32_t *vid = malloc((size_t)(n ? n : 1) * sizeof *vid);
    v.local = calloc((size_t)np, sizeof *v.local);
    v.vid = vid;
    int rc = 0;
    if (!vid || !v.local || vset_init(&all) < 0) goto oom;
    iv_pool_parallel_for(pool, (size_t)np, 0, vpart_collect, &v);
    if ((rc = atomic_load(&v.rc)) < 0) goto bad;
    for (int64_t p = 0; p < np; p++) {
        for (size_t x = 0; x < v.local[p].used; x++) {
            uint32_t id;
            if ((rc = vset_add(&all, v.local[p].list[x], &id)) < 0) goto bad;
        }
    }
    /* Rank the distinct values; the comparator's dtype is a file-level
     * static, so this runs under a lock (the sort is over distinct values
     * only). */
    size_t used = all.used;
    sorted = malloc((used ? used : 1) * sizeof *sorted);
    if (!sorted) goto oom;
    memcpy(sorted, all.list, used * sizeof *sorted);
    {
        static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&sort_mu);
        cmp_dtype = m->value_dtype;
        qsort(sorted, used, sizeof *sorted, cmp_values);
        pthread_mutex_unlock(&sort_mu);
    }
    for (size_t r = 0; r < used; r++) all.ids[vset_slot(&all, sorted[r])] = (uint32_t)r;
    v.all = &all;
    iv_pool_parallel_for(pool, (size_t)np, 0, vpart_map, &v);
    for (int64_t p = 0; p < np; p++) vset_free(&v.local[p]);
    free(v.local);
    vset_free(&all);
    *vid_out = vid;
    *distinct_out = sorted;
    *n_distinct = used;
    return 0;
bad:
    if (rc == -2) {
        for (int64_t p = 0; p < np; p++) vset_free(&v.local[p]);
        free(v.local);
        vset_free(&all);
        free(vid);
        return iv_fail(err, IV_EUNSUPPORTED, "more than 2^32 distinct values");
    }
oom:
    for (int64_t p = 0; v.local && p < np; p++) vset_free(&v.local[p]);
    free(v.local);
    vset_free(&all);
    free(vid);
    free(sorted);
    return iv_fail(err, IV_ENOMEM, "out of memory numbering the values");
}

/* ---- 2-4. passes ---- */

struct item {
    int64_t k0, k1;            /* blocks [k0, k1) */
    int64_t g0, g1;            /* their new slices [g0, g1) */
    uint32_t *grp;             /* (value id, size) per group, in slice order */
    size_t n_grp, cap_grp;
};

struct tb {
    const iv_dataset_t *src;
    const int64_t *mp, *vp;
    int64_t n_src_major, n_new_major;
    const uint32_t *vid;
    unsigned vbits;
    uint64_t vmask;
    size_t esz;                /* 4 or 8 bytes a temporary entry */
    size_t lsz;                /* 4 or 8 bytes an entry of the encode's local buffer */
    size_t maxlen;             /* bytes of the longest varint of a source slice */
    unsigned gbits;            /* bits of a new slice's place in its block */
    uint64_t n_vals;
    int64_t n_bands;
    int64_t *band;             /* n_bands + 1 source slice boundaries */
    uint64_t *off;             /* n_bands x n_new_major: counts */
    int one_pass;              /* no count pass: one window, blocks cut by a sample */
    int plain_stores;          /* the fill writes without write combining */
    /* The window being filled and encoded, cut in blocks of new slices. */
    int64_t g0, g1;
    int64_t n_blk;
    int64_t *blk;              /* n_blk + 1 new slice boundaries */
    uint64_t *blk_at;          /* n_blk + 1: entries before each block (after the fill) */
    uint64_t *blk_of;          /* per new slice of the window: block << 32 | place in it */
    /* The fill's parts, one a (band, block), each a chain of chunks of
     * the temporary taken from its band's share. */
    uint64_t chunk;            /* entries a chunk (see plan_shares) */
    uint64_t chunk_asked;      /* the options' chunk_entries */
    uint64_t *cfirst;          /* n_bands + 1: each band's share, in chunks */
    uint32_t *next;            /* per chunk: the next one of its chain */
    uint32_t *head, *tail;     /* n_bands x n_blk: first and last chunk of each part */
    uint64_t *fill_n;          /* n_bands x n_blk: entries of each part */
    uint8_t *tmp;
    const uint64_t *start;     /* n_new_major + 1 entry offsets */
    uint64_t *nbytes;          /* per new slice: encoded bytes */
    uint32_t *ngrp;            /* per new slice: groups */
    struct item *items;
    int64_t n_items;
    uint8_t *out;              /* the copy's stream */
    uint64_t *byte_at;         /* per new slice: its offset in out (n_new_major + 1) */
    uint64_t *band_entries;    /* n_bands: each band's entries in the window */
    uint64_t *est_start;       /* n_new_major + 1: estimated entry offsets (one pass) */
    size_t tmp_cap;            /* bytes mapped at tmp */
    int64_t items_cap;         /* items allocated */
    atomic_int failed;
    pthread_mutex_t mu;
    iv_err_t err;
};

/* Frees what t holds (the build's temporaries), on success or failure. */
static void tb_free(struct tb *t)
{
    free(t->band);
    free(t->off);
    big_unmap(t->tmp, t->tmp_cap);
    free(t->nbytes);
    free(t->ngrp);
    free(t->byte_at);
    free(t->blk_of);
    free(t->blk);
    free(t->blk_at);
    free(t->head);
    free(t->tail);
    free(t->fill_n);
    free(t->next);
    free(t->cfirst);
    free(t->band_entries);
    free(t->est_start);
    for (int64_t k = 0; t->items && k < t->items_cap; k++) free(t->items[k].grp);
    free(t->items);
    pthread_mutex_destroy(&t->mu);
}

static void tb_fail(struct tb *t, const iv_err_t *e)
{
    pthread_mutex_lock(&t->mu);
    if (!atomic_load(&t->failed)) {
        t->err = *e;
        atomic_store(&t->failed, 1);
    }
    pthread_mutex_unlock(&t->mu);
}

static inline void put_entry(uint8_t *tmp, size_t esz, uint64_t at, uint64_t e)
{
    if (esz == 4) ((uint32_t *)(void *)tmp)[at] = (uint32_t)e;
    else ((uint64_t *)(void *)tmp)[at] = e;
}

static inline uint64_t get_entry(const uint8_t *tmp, size_t esz, uint64_t at)
{
    return esz == 4 ? ((const uint32_t *)(const void *)tmp)[at] : ((const uint64_t *)(const void *)tmp)[at];
}

/*
 * Writes a whole write-combining line to its place dst (64-byte aligned)
 * in the temporary with streaming stores: the lines of the fill are
 * written once and read back only by the encode, so reading each line
 * into the cache before overwriting it (what an ordinary store does)
 * would double the fill's memory traffic.
 */
static inline void wc_flush(uint8_t *dst, const uint8_t *line)
{
#if IV_TP_STREAM
    const __m128i *src = (const __m128i *)(const void *)line;
    __m128i *d = (__m128i *)(void *)dst;
    _mm_stream_si128(d, _mm_load_si128(src));
    _mm_stream_si128(d + 1, _mm_load_si128(src + 1));
    _mm_stream_si128(d + 2, _mm_load_si128(src + 2));
    _mm_stream_si128(d + 3, _mm_load_si128(src + 3));
#else
    memcpy(dst, line, WC_LINE);
#endif
}

/* What a pass over a band does (see band_walk). */
enum { WALK_COUNT, WALK_SAMPLE, WALK_FILL };

/*
 * A pass over band b's source slices.  WALK_COUNT adds up the entries of
 * each new slice; WALK_SAMPLE does that for the band's first
 * 1/SAMPLE_SHARE of slices only; WALK_FILL writes each entry of the
 * window (source slice less the band's first, value id, place of the new
 * slice in its block: one word) to the end of its (band, block) part.
 */
static inline __attribute__((always_inline)) void band_walk(struct tb *t, size_t b, const int mode)
{
    const int fill = mode == WALK_FILL;
    const iv_dataset_t *ds = t->src;
    int64_t s0 = t->band[b], s1 = t->band[b + 1];
    if (mode == WALK_SAMPLE) s1 = s0 + (s1 - s0 + SAMPLE_SHARE - 1) / SAMPLE_SHARE;
    if (s0 >= s1 || atomic_load(&t->failed)) return;
    uint64_t *off = t->off + (size_t)b * (size_t)t->n_new_major;
    uint64_t n_minor = (uint64_t)t->n_new_major;
    iv_cursor_t cur;
    iv_err_t e = {0};
    iv_cursor_init(&cur, ds->stream);
    uint64_t at, skip;
    iv_rowindex_locate(&ds->ri, t->mp, t->vp, s0, &at, &skip);
    int rc = iv_cursor_seek(&cur, at, &e);
    if (rc == 0) rc = iv_cursor_skip(&cur, skip, &e);
    uint64_t g0 = (uint64_t)t->g0, g1 = (uint64_t)t->g1;
    unsigned gbits = t->gbits, sv = t->gbits + t->vbits;
    /* Locals: the stores below could alias the struct's fields. */
    const uint64_t *blk_of = t->blk_of;
    uint8_t *const tmp = t->tmp;
    const size_t esz = t->esz;
    const uint32_t *vid = t->vid;
    const int64_t *mp = t->mp, *vp = t->vp;
    int64_t nk = fill ? t->n_blk : 0;
    size_t at_band = (size_t)b * (size_t)(nk ? nk : 1);
    uint64_t *fill_n = fill ? t->fill_n + at_band : NULL;
    uint32_t *head = fill ? t->head + at_band : NULL, *tail = fill ? t->tail + at_band : NULL;
    uint32_t *next = t->next;
    uint64_t chunk = t->chunk, cmask = chunk - 1;
    uint64_t c_next = fill ? t->cfirst[b] : 0, c_end = fill ? t->cfirst[b + 1] : 0;
    /* Write combining for the fill: each block owns one cache line of
     * buffer that mirrors the temporary's line its next entry goes to
     * (same slot), so a finished line goes out as one aligned 64-byte
     * store (see wc_flush).  A chunk is whole lines, so no line is
     * shared with another part.  Blocks are few (a few thousand lines,
     * in the core's own cache) and each part is written in order, so the
     * writes are a few thousand sequential streams rather than one
     * scattered store per entry. */
    uint8_t *wc = NULL;
    const uint64_t lmask = WC_LINE / t->esz - 1;
    if (fill && !t->plain_stores && (uint64_t)nk * WC_LINE <= WC_MAX_BYTES)
        wc = aligned_alloc(WC_LINE, (size_t)(nk ? nk : 1) * WC_LINE);
    for (int64_t s = s0; rc == 0 && s < s1; s++) {
        uint64_t sl = (uint64_t)(s - s0) << sv;
        for (int64_t k = mp[s]; rc == 0 && k < mp[s + 1]; k++) {
            uint64_t left = (uint64_t)(vp[k + 1] - vp[k]), acc = 0, d;
            uint64_t hi = fill ? sl | (uint64_t)vid[k] << gbits : 0;
            while (left > 0) {
                /* One- and two-byte varints inline and without a branch
                 * on which (most of a cell-major stream, mixed about
                 * evenly, so that a branch would often be mispredicted);
                 * the rest through the cursor. */
                int fast = 0;
                if (cur.end - cur.p >= 2) {
                    uint64_t b0 = cur.p[0], b1 = cur.p[1], two = b0 >> 7;
                    d = (b0 & 0x7f) | ((b1 << 7) & (0 - two));
                    fast = !(two & (b1 >> 7));
                    cur.p += fast ? 1 + two : 0;
                }
                if (!fast && (rc = iv_cursor_read(&cur, &d, &e)) < 0) break;
                left--;
                acc += d + 1;
                if (d >= n_minor || acc > n_minor) {
                    rc = iv_fail(&e, IV_ECORRUPT, "%s: slice %" PRId64 " has an index >= %" PRIu64,
                                 ds->where, s, n_minor);
                    break;
                }
                uint64_t j = acc - 1;
                if (!fill) {
                    off[j]++;
                    continue;
                }
                if (j < g0) continue;
                if (j >= g1) {
                    /* The group's indices rise: the rest lie past the window. */
                    rc = iv_cursor_skip(&cur, left, &e);
                    break;
                }
                uint64_t code = blk_of[j - g0];
                size_t kb = (size_t)(code >> 32);
                uint64_t en = hi | (code & 0xffffffffu);
                uint64_t n = fill_n[kb]++, in = n & cmask;
                if (in == 0) {
                    /* The part's next chunk, from the band's share. */
                    if (c_next >= c_end) {
                        rc = iv_fail(&e, IV_EINTERNAL, "%s: the transpose's band %zu outgrew its share",
                                     ds->where, b);
                        break;
                    }
                    if (n == 0) head[kb] = (uint32_t)c_next;
                    else next[tail[kb]] = (uint32_t)c_next;
                    tail[kb] = (uint32_t)c_next++;
                }
                uint64_t p = (uint64_t)tail[kb] * chunk + in;
                if (!wc) {
                    put_entry(tmp, esz, p, en);
                    continue;
                }
                uint8_t *line = wc + kb * WC_LINE;
                put_entry(line, esz, in & lmask, en);
                if ((in & lmask) == lmask) wc_flush(tmp + (p - lmask) * esz, line);
            }
        }
        if (atomic_load_explicit(&t->failed, memory_order_relaxed)) break;
    }
    iv_cursor_done(&cur);
    if (wc) {
        /* The lines begun and not finished. */
        if (rc == 0)
            for (int64_t k = 0; k < nk; k++) {
                uint64_t n = fill_n[k], r = n & lmask;
                if (r)
                    memcpy(tmp + ((uint64_t)tail[k] * chunk + ((n - 1) & cmask & ~lmask)) * esz,
                           wc + (size_t)k * WC_LINE, (size_t)r * esz);
            }
        free(wc);
    }
#if IV_TP_STREAM
    /* Streaming stores are weakly ordered: make them visible before the
     * pool reports the band done. */
    _mm_sfence();
#endif
    if (rc < 0) tb_fail(t, &e);
}

static void band_count(void *arg, size_t b) { band_walk(arg, b, WALK_COUNT); }
static void band_sample(void *arg, size_t b) { band_walk(arg, b, WALK_SAMPLE); }
static void band_fill(void *arg, size_t b) { band_walk(arg, b, WALK_FILL); }

/* Writes v as LEB128 at p (exactly its bytes); returns the length. */
static inline size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/*
 * put_varint for the encode's buffers, which have a byte of slack past
 * their last varint (see encode_item): the one- and two-byte varints
 * (most of a gene-major stream, mixed) without a branch on which.
 */
static inline size_t put_varint_s(uint8_t *p, uint64_t v)
{
    if (v < ((uint64_t)1 << 14)) {
        uint64_t two = v >= 0x80;
        p[0] = (uint8_t)(v | two << 7);
        p[1] = (uint8_t)(v >> 7);
        return (size_t)(1 + two);
    }
    return put_varint(p, v);
}

static int grp_push(struct item *it, uint32_t v, uint32_t size)
{
    if (it->n_grp + 2 > it->cap_grp) {
        size_t cap = it->cap_grp ? it->cap_grp * 2 : 1024;
        uint32_t *g = realloc(it->grp, cap * sizeof *g);
        if (!g) return -1;
        it->grp = g;
        it->cap_grp = cap;
    }
    it->grp[it->n_grp++] = v;
    it->grp[it->n_grp++] = size;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/*
 * Step 4 for one new slice: its n entries (source slice << vbits | value
 * id, in source slice order) at r become groups in value order, each one
 * a run of delta varints written at dst.  0, or -1 with e set.
 */
static int encode_slice(struct tb *t, struct item *it, int64_t g, const uint8_t *r, uint64_t n,
                        uint8_t *dst, uint32_t *cnt, uint32_t *touched, uint32_t *cells, iv_err_t *e)
{
    size_t nt = 0;
    const size_t lsz = t->lsz;
    /* The order of the source slices was checked by the block's first
     * read (encode_item). */
    for (uint64_t x = 0; x < n; x++) {
        uint32_t v = (uint32_t)(get_entry(r, lsz, x) & t->vmask);
        if (cnt[v]++ == 0) touched[nt++] = v;
    }
    size_t w = 0;
    if (nt == 1) {
        /* One value: the slices are in order already. */
        cnt[touched[0]] = 0;
        if (grp_push(it, touched[0], (uint32_t)n) < 0)
            return iv_fail(e, IV_ENOMEM, "out of memory encoding the copy");
        uint64_t last = UINT64_MAX;   /* -1: the first delta is the index itself */
        for (uint64_t x = 0; x < n; x++) {
            uint64_t s = get_entry(r, lsz, x) >> t->vbits;
            w += put_varint_s(dst + w, s - last - 1);
            last = s;
        }
        t->nbytes[g] = w;
        t->ngrp[g] = 1;
        return 0;
    }
    if (nt > 1) qsort(touched, nt, sizeof *touched, cmp_u32);
    uint32_t run = 0;
    for (size_t k = 0; k < nt; k++) {
        uint32_t c = cnt[touched[k]];
        if (grp_push(it, touched[k], c) < 0) {
            for (; k < nt; k++) cnt[touched[k]] = 0;
            return iv_fail(e, IV_ENOMEM, "out of memory encoding the copy");
        }
        cnt[touched[k]] = run;
        run += c;
    }
    /* Stable: each group's slices stay ascending.  Source slices fit 32
     * bits (checked before the build). */
    for (uint64_t x = 0; x < n; x++) {
        uint64_t en = get_entry(r, lsz, x);
        cells[cnt[en & t->vmask]++] = (uint32_t)(en >> t->vbits);
    }
    uint32_t from = 0;
    for (size_t k = 0; k < nt; k++) {
        uint32_t to = cnt[touched[k]];
        uint64_t last = UINT64_MAX;
        for (uint32_t x = from; x < to; x++) {
            w += put_varint_s(dst + w, cells[x] - last - 1);
            last = cells[x];
        }
        from = to;
        cnt[touched[k]] = 0;
    }
    t->nbytes[g] = w;
    t->ngrp[g] = (uint32_t)nt;
    return 0;
}

/*
 * Copies n bytes between buf and block k's chunks, taken in the order
 * the encode read them (bands in order, each part's chain): into the
 * chunks when `in`, else out of them.  The encode puts a block's varints
 * there once it has read its entries: a chunk holds chunk * esz bytes,
 * and a varint is never longer than an entry (see maxlen), so they fit.
 */
static void block_chunks(const struct tb *t, int64_t k, uint8_t *buf, uint64_t n, int in)
{
    const uint64_t cap = t->chunk * t->esz;
    for (int64_t b = 0; b < t->n_bands && n > 0; b++) {
        size_t at = (size_t)b * (size_t)t->n_blk + (size_t)k;
        uint64_t left = t->fill_n[at];
        uint32_t c = left ? t->head[at] : 0;
        while (left > 0 && n > 0) {
            uint64_t m = n < cap ? n : cap;
            uint8_t *ch = t->tmp + (size_t)c * cap;
            if (in) memcpy(ch, buf, (size_t)m);
            else memcpy(buf, ch, (size_t)m);
            buf += m;
            n -= m;
            left -= left < t->chunk ? left : t->chunk;
            if (left) c = t->next[c];
        }
    }
}

/*
 * Step 4 for the blocks of item i.  A block's parts are read in band
 * order, so each new slice's source slices come ascending; a first read
 * counts each new slice's entries and checks that no source slice comes
 * twice (a corrupt source).  Then:
 *  - when the block's new slices times the value ids are few (at most
 *    HIST_MAX, and at most the block's entries), one counting sort by
 *    (new slice, value id), stable, puts every group's source slices in
 *    order at once;
 *  - otherwise the entries are sorted by new slice into a local buffer
 *    (stable), then each new slice by value id (encode_slice).
 * A block's varints go to a local buffer and then over its own chunks.
 */
static void encode_item(void *arg, size_t i)
{
    struct tb *t = arg;
    struct item *it = &t->items[i];
    iv_err_t e = {0};
    uint64_t big_blk = 0;
    int64_t big_genes = 0;
    for (int64_t k = it->k0; k < it->k1; k++) {
        uint64_t n = t->blk_at[k + 1] - t->blk_at[k];
        if (n > big_blk) big_blk = n;
        if (t->blk[k + 1] - t->blk[k] > big_genes) big_genes = t->blk[k + 1] - t->blk[k];
    }
    size_t nv = (size_t)t->n_vals;
    uint64_t vspan = (uint64_t)1 << t->vbits;
    uint32_t *cnt = NULL, *touched = NULL, *hist = NULL;
    uint8_t *loc = NULL;
    uint32_t *cells = malloc((size_t)(big_blk ? big_blk : 1) * sizeof *cells);
    uint64_t *lo = malloc((size_t)(big_genes ? big_genes : 1) * sizeof *lo);
    uint64_t *nmin = malloc((size_t)(big_genes ? big_genes : 1) * sizeof *nmin);
    uint8_t *eb = malloc((size_t)(big_blk ? big_blk : 1) * t->maxlen + 1);  /* + put_varint_s's slack */
    if (!cells || !lo || !nmin || !eb) {
        iv_fail(&e, IV_ENOMEM, "out of memory encoding the copy");
        goto done;
    }
    const uint64_t gmask = t->gbits ? ((uint64_t)1 << t->gbits) - 1 : 0;
    const unsigned gbits = t->gbits, vbits = t->vbits, sv = t->gbits + t->vbits;
    const uint64_t vmask = t->vmask, chunk = t->chunk;
    for (int64_t k = it->k0; k < it->k1 && !atomic_load(&t->failed); k++) {
        int64_t a = t->blk[k], z = t->blk[k + 1];
        uint64_t n_blk = t->blk_at[k + 1] - t->blk_at[k];
        size_t genes = (size_t)(z - a);
        int joint = (uint64_t)genes * vspan <= HIST_MAX && (uint64_t)genes * vspan <= n_blk;
        if (joint && !hist && !(hist = malloc(HIST_MAX * sizeof *hist))) {
            iv_fail(&e, IV_ENOMEM, "out of memory encoding the copy");
            goto done;
        }
        if (!joint && !loc) {
            cnt = calloc(nv ? nv : 1, sizeof *cnt);
            touched = malloc((nv ? nv : 1) * sizeof *touched);
            loc = malloc((size_t)(big_blk ? big_blk : 1) * t->lsz);
            if (!cnt || !touched || !loc) {
                iv_fail(&e, IV_ENOMEM, "out of memory encoding the copy");
                goto done;
            }
        }
        memset(lo, 0, genes * sizeof *lo);
        memset(nmin, 0, genes * sizeof *nmin);
        if (joint) memset(hist, 0, (size_t)(genes * vspan) * sizeof *hist);
        /* Read 1: counts, the order check, and the joint counts. */
        for (int64_t b = 0; b < t->n_bands; b++) {
            size_t at = (size_t)b * (size_t)t->n_blk + (size_t)k;
            uint64_t first = (uint64_t)t->band[b], left = t->fill_n[at];
            uint32_t c = left ? t->head[at] : 0;
            while (left > 0) {
                uint64_t x0 = (uint64_t)c * chunk, x1 = x0 + (left < chunk ? left : chunk);
                left -= x1 - x0;
                for (uint64_t x = x0; x < x1; x++) {
                    uint64_t en = get_entry(t->tmp, t->esz, x), p = en & gmask;
                    uint64_t s = first + (en >> sv);
                    if (s < nmin[p]) {
                        iv_fail(&e, IV_ECORRUPT, "%s: slice %" PRIu64 " stores minor index %" PRId64
                                " twice", t->src->where, s, a + (int64_t)p);
                        goto done;
                    }
                    nmin[p] = s + 1;
                    lo[p]++;
                    if (joint) hist[p << vbits | ((en >> gbits) & vmask)]++;
                }
                if (left) c = t->next[c];
            }
        }
        /* Where each new slice's (or each (slice, value)'s) entries go. */
        uint64_t run = 0;
        if (joint) {
            for (size_t x = 0; x < genes * vspan; x++) {
                uint32_t h = hist[x];
                hist[x] = (uint32_t)run;
                run += h;
            }
        } else {
            for (size_t p = 0; p < genes; p++) {
                uint64_t h = lo[p];
                lo[p] = run;
                run += h;
            }
        }
        /* Read 2: the sort. */
        for (int64_t b = 0; b < t->n_bands; b++) {
            size_t at = (size_t)b * (size_t)t->n_blk + (size_t)k;
            uint64_t first = (uint64_t)t->band[b], left = t->fill_n[at];
            uint64_t add = first << vbits;
            uint32_t c = left ? t->head[at] : 0;
            while (left > 0) {
                uint64_t x0 = (uint64_t)c * chunk, x1 = x0 + (left < chunk ? left : chunk);
                left -= x1 - x0;
                if (joint && t->esz == 4) {
                    const uint32_t *src = (const uint32_t *)(const void *)t->tmp;
                    for (uint64_t x = x0; x < x1; x++) {
                        uint32_t en = src[x];
                        cells[hist[(en & gmask) << vbits | ((en >> gbits) & vmask)]++] =
                            (uint32_t)(first + (en >> sv));
                    }
                } else if (joint) {
                    for (uint64_t x = x0; x < x1; x++) {
                        uint64_t en = get_entry(t->tmp, t->esz, x);
                        cells[hist[(en & gmask) << vbits | ((en >> gbits) & vmask)]++] =
                            (uint32_t)(first + (en >> sv));
                    }
                } else if (t->esz == 4 && t->lsz == 4) {
                    const uint32_t *src = (const uint32_t *)(const void *)t->tmp;
                    uint32_t *dl = (uint32_t *)(void *)loc;
                    for (uint64_t x = x0; x < x1; x++) {
                        uint32_t en = src[x];
                        dl[lo[en & gmask]++] = (uint32_t)((en >> gbits) + add);
                    }
                } else {
                    for (uint64_t x = x0; x < x1; x++) {
                        uint64_t en = get_entry(t->tmp, t->esz, x);
                        put_entry(loc, t->lsz, lo[en & gmask]++, (en >> gbits) + add);
                    }
                }
                if (left) c = t->next[c];
            }
        }
        /* The varints. */
        uint64_t w = 0;
        if (joint) {
            uint64_t from = 0;
            for (size_t p = 0; p < genes; p++) {
                int64_t g = a + (int64_t)p;
                uint64_t w0 = w;
                uint32_t ng = 0;
                for (uint64_t v = 0; v < vspan; v++) {
                    uint64_t to = hist[p << vbits | v];
                    if (to == from) continue;
                    if (grp_push(it, (uint32_t)v, (uint32_t)(to - from)) < 0) {
                        iv_fail(&e, IV_ENOMEM, "out of memory encoding the copy");
                        goto done;
                    }
                    ng++;
                    uint64_t last = UINT64_MAX;   /* -1: the first delta is the index itself */
                    for (uint64_t x = from; x < to; x++) {
                        w += put_varint_s(eb + w, cells[x] - last - 1);
                        last = cells[x];
                    }
                    from = to;
                }
                t->nbytes[g] = w - w0;
                t->ngrp[g] = ng;
            }
        } else {
            uint64_t from = 0;
            for (size_t p = 0; p < genes; p++) {
                int64_t g = a + (int64_t)p;
                uint64_t n = lo[p] - from;
                if (encode_slice(t, it, g, loc + (size_t)from * t->lsz, n, eb + w, cnt, touched, cells,
                                 &e) < 0)
                    goto done;
                w += t->nbytes[g];
                from = lo[p];
            }
        }
        block_chunks(t, k, eb, w, 1);
    }
done:
    free(cnt);
    free(touched);
    free(hist);
    free(cells);
    free(loc);
    free(lo);
    free(nmin);
    free(eb);
    if (e.code) tb_fail(t, &e);
}

/* Moves item i's encoded slices from their blocks' chunks to their place
 * in the copy's stream. */
static void move_item(void *arg, size_t i)
{
    struct tb *t = arg;
    const struct item *it = &t->items[i];
    for (int64_t k = it->k0; k < it->k1; k++) {
        uint64_t at = t->byte_at[t->blk[k]];
        block_chunks(t, k, t->out + at, t->byte_at[t->blk[k + 1]] - at, 0);
    }
}

/*
 * Cuts the window [g0, g1) into blocks of at most 2^gbits new slices and
 * about `target` entries by t->start (a slice with more is a block of
 * its own), and makes the parts' empty chains.  0, or -1 when out of
 * memory.
 */
static int plan_blocks(struct tb *t, uint64_t target)
{
    int64_t g0 = t->g0, g1 = t->g1, cap = (int64_t)1 << t->gbits, n = 0;
    free(t->blk);
    free(t->blk_at);
    t->blk_at = NULL;
    free(t->head);
    free(t->tail);
    free(t->fill_n);
    t->head = t->tail = NULL;
    t->fill_n = NULL;
    t->blk = malloc((size_t)(g1 - g0 + 1) * sizeof *t->blk);
    if (!t->blk) return -1;
    for (int64_t g = g0; g < g1;) {
        int64_t e = g + 1;
        while (e < g1 && e - g < cap && t->start[e + 1] - t->start[g] <= target) e++;
        t->blk[n++] = g;
        for (int64_t x = g; x < e; x++) t->blk_of[x - g0] = (uint64_t)(n - 1) << 32 | (uint64_t)(x - g);
        g = e;
    }
    t->blk[n] = g1;
    t->n_blk = n;
    t->blk_at = malloc((size_t)(n + 1) * sizeof *t->blk_at);
    if (!t->blk_at) return -1;
    size_t parts = (size_t)t->n_bands * (size_t)(n ? n : 1);
    t->head = malloc(parts * sizeof *t->head);
    t->tail = malloc(parts * sizeof *t->tail);
    t->fill_n = calloc(parts, sizeof *t->fill_n);
    if (!t->head || !t->tail || !t->fill_n) return -1;
    return 0;
}

/*
 * The chunk size and each band's share of the temporary for the window,
 * in chunks, from its entries there (t->band_entries).
 * Longer chunks read faster in the encode (a part is read chunk by
 * chunk); a part's last chunk is partly empty, so a chunk is at most a
 * quarter of the entries a part has on average (a power of two of whole
 * cache lines, at most CHUNK_MAX_ENTRIES).  A part of n entries takes
 * ceil(n / chunk) chunks, so a band with E entries in at most n_blk parts
 * takes at most floor(E / chunk) + min(n_blk, E).  The temporary and the
 * chains' links are (re)mapped for that many.  0, or -1 when out of
 * memory or past 2^32 chunks.
 */
static int plan_shares(struct tb *t)
{
    uint64_t all = 0, parts_all = (uint64_t)t->n_bands * (uint64_t)(t->n_blk ? t->n_blk : 1);
    for (int64_t b = 0; b < t->n_bands; b++) all += t->band_entries[b];
    uint64_t line = WC_LINE / t->esz;
    t->chunk = t->chunk_asked ? t->chunk_asked : all / parts_all / 4;
    if (t->chunk > CHUNK_MAX_ENTRIES) t->chunk = CHUNK_MAX_ENTRIES;
    while (t->chunk & (t->chunk - 1)) t->chunk &= t->chunk - 1;
    if (t->chunk == 0) t->chunk = 1;
    if (!t->plain_stores && t->chunk < line) t->chunk = line;
    uint64_t total = 0;
    t->cfirst[0] = 0;
    for (int64_t b = 0; b < t->n_bands; b++) {
        uint64_t e = t->band_entries[b], parts = (uint64_t)t->n_blk < e ? (uint64_t)t->n_blk : e;
        total += e / t->chunk + parts;
        t->cfirst[b + 1] = total;
    }
    if (total > UINT32_MAX) return -1;
    big_unmap(t->tmp, t->tmp_cap);
    free(t->next);
    t->tmp_cap = (size_t)(total ? total : 1) * (size_t)t->chunk * t->esz;
    t->tmp = big_map(t->tmp_cap);
    t->next = malloc((size_t)(total ? total : 1) * sizeof *t->next);
    return t->tmp && t->next ? 0 : -1;
}

/* Counts the entries the fill gave each block (blk_at), and cuts the
 * window's blocks into about `want` items of equal entries. */
static int64_t plan_items(struct tb *t, int64_t want)
{
    const int64_t *blk = t->blk;
    int64_t nk = t->n_blk, n = 0, k = 0;
    t->blk_at[0] = 0;
    for (int64_t x = 0; x < nk; x++) {
        uint64_t sum = 0;
        for (int64_t b = 0; b < t->n_bands; b++) sum += t->fill_n[(size_t)b * (size_t)nk + (size_t)x];
        t->blk_at[x + 1] = t->blk_at[x] + sum;
    }
    uint64_t total = t->blk_at[nk];
    for (int64_t x = 0; x < want && k < nk; x++) {
        uint64_t stop = total * (uint64_t)(x + 1) / (uint64_t)want;
        int64_t e = k + 1;
        while (e < nk && t->blk_at[e] < stop) e++;
        if (x == want - 1) e = nk;
        t->items[n].k0 = k;
        t->items[n].k1 = e;
        t->items[n].g0 = blk[k];
        t->items[n].g1 = blk[e];
        t->items[n].n_grp = 0;
        n++;
        k = e;
    }
    return n;
}

/* start[] (n_new_major + 1 entry offsets) from the bands' counts.  0, or
 * -1 with err set when they do not add up to nnz. */
static int sum_counts(const struct tb *t, uint64_t *start, uint64_t nnz, iv_err_t *err)
{
    int64_t G = t->n_new_major;
    memset(start, 0, (size_t)(G + 1) * sizeof *start);
    for (int64_t b = 0; b < t->n_bands; b++) {
        const uint64_t *cnt = t->off + (size_t)b * (size_t)G;
        for (int64_t g = 0; g < G; g++) start[g + 1] += cnt[g];
    }
    for (int64_t g = 0; g < G; g++) start[g + 1] += start[g];
    if (start[G] != nnz)
        return iv_fail(err, IV_EINTERNAL, "%s: transpose counted %" PRIu64 " entries, nnz %" PRIu64,
                       t->src->where, start[G], nnz);
    return 0;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* CPU seconds of the whole process (every worker's included). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Adds the wall and CPU time since the last phase ended to phase k. */
#define PHASE(k)                      \
    do {                              \
        double now_ = iv_now_s();        \
        double cpu_ = cpu_s();        \
        ph[(k)] += now_ - tp;         \
        pc[(k)] += cpu_ - tc;         \
        tp = now_;                    \
        tc = cpu_;                    \
    } while (0)

int iv_dataset_build_other(iv_dataset_t *ds, const iv_transpose_opts_t *opts, iv_err_t *err)
{
    double t0 = iv_now_s(), tp = t0, ph[IV_TRANSPOSE_PHASES] = {0};
    double tc = cpu_s(), pc[IV_TRANSPOSE_PHASES] = {0};
    const iv_h5matrix_t *m = &ds->m;
    if (iv_dataset_other(ds) || ds->is_copy)
        return iv_fail(err, IV_EINVALID_ARG, "%s: the other orientation exists already", ds->where);
    iv_dataset_set_other_state(ds, IV_OTHER_BUILDING);
    size_t vsz = iv_dtype_size(m->value_dtype);
    int64_t G = m->n_minor, S = m->n_major;
    uint64_t nnz = (uint64_t)m->nnz;
    uint32_t stride = ds->ri.stride ? ds->ri.stride : IV_ROWINDEX_DEFAULT_STRIDE;
    unsigned threads = iv_pool_threads(opts->pool) + 1;
    int rc = 0, took_global = 0;
    uint64_t charged = 0;

    struct tb t;
    memset(&t, 0, sizeof t);
    atomic_init(&t.failed, 0);
    pthread_mutex_init(&t.mu, NULL);
    uint64_t *distinct = NULL, *start = NULL;
    uint32_t *vid = NULL, *vlist = NULL;
    uint64_t *vsize = NULL;
    iv_dataset_t *c = NULL;
    uint8_t *out = NULL;
    size_t out_cap = 0;

    /* The estimate before anything large: a stream as long as the
     * source's, the pointers, one group per distinct value at least. */
    uint64_t n_vals = 0;
    if ((rc = value_ids(m, opts->pool, threads, &vid, &distinct, &n_vals, err)) < 0) goto fail;
    PHASE(IV_TP_VALUES);
    uint64_t est = iv_stream_length(ds->stream) + (uint64_t)(G + 1) * 8 + n_vals * (8 + vsz) +
                   (uint64_t)(G / stride + 1) * 8;
    if (est > opts->budget || (opts->global && atomic_load(&opts->global->left) < est)) {
        rc = iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation needs about %" PRIu64
                     " bytes; the budget allows %" PRIu64, ds->where, est,
                     opts->global && atomic_load(&opts->global->left) < opts->budget
                         ? (uint64_t)atomic_load(&opts->global->left) : opts->budget);
        goto fail;
    }

    t.src = ds;
    t.mp = m->major_ptr;
    t.vp = m->value_ptr;
    t.n_src_major = S;
    t.n_new_major = G;
    t.vid = vid;
    t.n_vals = n_vals;
    t.vbits = bits_for(n_vals);
    t.vmask = t.vbits ? (((uint64_t)1 << t.vbits) - 1) : 0;
    unsigned sbits = bits_for((uint64_t)S);
    size_t maxlen = varint_len(S > 0 ? (uint64_t)S - 1 : 0);
    t.maxlen = maxlen;
    if (sbits + t.vbits > 64 || (uint64_t)S > UINT32_MAX) {
        rc = iv_fail(err, IV_EUNSUPPORTED, "%s: %" PRIu64 " distinct values and %" PRId64
                     " slices do not pack in 64 bits", ds->where, n_vals, S);
        goto fail;
    }
    /* Bands of about equal nnz, as many as the counters allow. */
    int64_t nb = (int64_t)threads * 4;
    if (nb > S) nb = S;
    while (nb > 1 && (uint64_t)nb * (uint64_t)G * 8 > COUNTER_BYTES) nb--;
    if (nb < 1) nb = 1;
    t.n_bands = nb;
    t.band = malloc((size_t)(nb + 1) * sizeof *t.band);
    t.off = calloc((size_t)nb * (size_t)(G ? G : 1), sizeof *t.off);
    start = malloc((size_t)(G + 1) * sizeof *start);
    t.nbytes = calloc((size_t)(G ? G : 1), sizeof *t.nbytes);
    t.ngrp = calloc((size_t)(G ? G : 1), sizeof *t.ngrp);
    t.byte_at = malloc((size_t)(G + 1) * sizeof *t.byte_at);
    t.blk_of = malloc((size_t)(G ? G : 1) * sizeof *t.blk_of);
    if (!t.band || !t.off || !start || !t.nbytes || !t.ngrp || !t.byte_at || !t.blk_of) {
        rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose counters", ds->where);
        goto fail;
    }
    t.band[0] = 0;
    for (int64_t b = 1; b < nb; b++) {
        uint64_t want = nnz * (uint64_t)b / (uint64_t)nb;
        int64_t lo = t.band[b - 1], hi = S;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if ((uint64_t)t.vp[t.mp[mid]] < want) lo = mid + 1;
            else hi = mid;
        }
        t.band[b] = lo;
    }
    t.band[nb] = S;

    /* A temporary entry is (source slice less its band's first, value id,
     * place of the new slice in its block): 4 bytes when that leaves the
     * blocks a few bits (and a varint never outgrows its entry), else 8. */
    int64_t widest = 0;
    for (int64_t b = 0; b < nb; b++)
        if (t.band[b + 1] - t.band[b] > widest) widest = t.band[b + 1] - t.band[b];
    unsigned bbits = bits_for((uint64_t)widest);
    if (bbits + t.vbits + BLOCK_MIN_BITS <= 32 && maxlen <= 4 && !opts->wide_entries) {
        t.esz = 4;
        t.gbits = 32 - bbits - t.vbits;
    } else {
        t.esz = 8;
        t.gbits = 64 - bbits - t.vbits;
    }
    if (t.gbits > BLOCK_MAX_BITS) t.gbits = BLOCK_MAX_BITS;
    t.lsz = sbits + t.vbits <= 32 && !opts->wide_entries ? 4 : 8;
    while (opts->block_slices && t.gbits > 0 && ((uint64_t)1 << t.gbits) > opts->block_slices) t.gbits--;

    /* 2. The blocks.  When every entry fits the temporary at once, they
     * are cut by counts estimated from a sample of each band (their
     * sizes only balance the work; the copy does not depend on them),
     * and the source is decoded once, by the fill.  Otherwise a count
     * pass comes first and the new slices go in windows. */
    out_cap = (size_t)(nnz * maxlen + 1);
    out = big_map(out_cap);
    uint64_t tmp_bytes = opts->tmp_bytes;
    if (tmp_bytes == 0) {
        /* Four times the stream holds every entry of a count matrix (1 to
         * 2 bytes a varint, 4 an entry) in one window. */
        tmp_bytes = 4 * iv_stream_length(ds->stream);
        if (tmp_bytes < ((uint64_t)64 << 20)) tmp_bytes = (uint64_t)64 << 20;
    }
    int64_t want_items = (int64_t)threads * 8;
    t.items = calloc((size_t)want_items, sizeof *t.items);
    t.items_cap = t.items ? want_items : 0;
    t.cfirst = malloc((size_t)(nb + 1) * sizeof *t.cfirst);
    t.band_entries = malloc((size_t)nb * sizeof *t.band_entries);
    t.est_start = malloc((size_t)(G + 1) * sizeof *t.est_start);
    if (!out || !t.items || !t.cfirst || !t.band_entries || !t.est_start) {
        rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose", ds->where);
        goto fail;
    }
    t.out = out;
    t.chunk_asked = opts->chunk_entries;
    t.plain_stores = opts->plain_stores;
    uint64_t block_target = nnz / BLOCKS_A_WINDOW;
    if (block_target < BLOCK_MIN_ENTRIES) block_target = BLOCK_MIN_ENTRIES;
    if (opts->block_entries) block_target = opts->block_entries;
    for (int64_t b = 0; b < nb; b++)
        t.band_entries[b] = (uint64_t)(t.vp[t.mp[t.band[b + 1]]] - t.vp[t.mp[t.band[b]]]);
    if (nnz * t.esz <= tmp_bytes) {
        iv_pool_parallel_for(opts->pool, (size_t)nb, 0, band_sample, &t);
        if (atomic_load(&t.failed)) goto failed_pass;
        uint64_t sampled = 0;
        t.est_start[0] = 0;
        for (int64_t g = 0; g < G; g++) {
            for (int64_t b = 0; b < nb; b++) sampled += t.off[(size_t)b * (size_t)G + (size_t)g];
            t.est_start[g + 1] = sampled;
        }
        for (int64_t g = 1; g <= G; g++)
            t.est_start[g] = sampled ? (uint64_t)((double)t.est_start[g] / (double)sampled * (double)nnz)
                             : (uint64_t)((double)g / (double)G * (double)nnz);
        t.g0 = 0;
        t.g1 = G;
        t.start = t.est_start;
        if (plan_blocks(&t, block_target) < 0 || plan_shares(&t) < 0) {
            rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose's blocks", ds->where);
            goto fail;
        }
        t.one_pass = t.tmp_cap <= tmp_bytes;
        memset(t.off, 0, (size_t)nb * (size_t)(G ? G : 1) * sizeof *t.off);
    }
    uint64_t win_entries = 0;
    if (!t.one_pass) {
        iv_pool_parallel_for(opts->pool, (size_t)nb, 0, band_count, &t);
        if (atomic_load(&t.failed)) goto failed_pass;
        if ((rc = sum_counts(&t, start, nnz, err)) < 0) goto fail;
        uint64_t biggest = 0;
        for (int64_t g = 0; g < G; g++)
            if (start[g + 1] - start[g] > biggest) biggest = start[g + 1] - start[g];
        win_entries = tmp_bytes / t.esz;
        if (win_entries < biggest) win_entries = biggest;
        if (win_entries > nnz) win_entries = nnz;
    }
    PHASE(IV_TP_COUNT);
    /* Groups of the copy, gathered window by window. */
    size_t n_groups = 0, cap_groups = 0;

    t.byte_at[0] = 0;
    for (int64_t g0 = 0; g0 < G;) {
        int64_t g1 = G;
        if (!t.one_pass) {
            /* The window's slices and blocks, by the counts. */
            g1 = g0 + 1;
            while (g1 < G && start[g1 + 1] - start[g0] <= win_entries) g1++;
            t.g0 = g0;
            t.g1 = g1;
            t.start = start;
            uint64_t target = (start[g1] - start[g0]) / BLOCKS_A_WINDOW;
            if (target < BLOCK_MIN_ENTRIES) target = BLOCK_MIN_ENTRIES;
            if (opts->block_entries) target = opts->block_entries;
            for (int64_t b = 0; b < nb; b++) {
                const uint64_t *cnt = t.off + (size_t)b * (size_t)G;
                t.band_entries[b] = 0;
                for (int64_t g = g0; g < g1; g++) t.band_entries[b] += cnt[g];
            }
            if (plan_blocks(&t, target) < 0 || plan_shares(&t) < 0) {
                rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose's blocks", ds->where);
                goto fail;
            }
        }
        /* 3. Fill (skipped when the window holds nothing). */
        uint64_t wanted = t.one_pass ? nnz : start[g1] - start[g0];
        if (wanted > 0) {
            iv_pool_parallel_for(opts->pool, (size_t)nb, 0, band_fill, &t);
            if (atomic_load(&t.failed)) goto failed_pass;
        }
        PHASE(IV_TP_FILL);
        /* 4. Encode, then place. */
        t.n_items = plan_items(&t, want_items);
        if (t.blk_at[t.n_blk] != wanted) {
            rc = iv_fail(err, IV_EINTERNAL, "%s: transpose filled %" PRIu64 " entries, not %" PRIu64,
                         ds->where, t.blk_at[t.n_blk], wanted);
            goto fail;
        }
        iv_pool_parallel_for(opts->pool, (size_t)t.n_items, 0, encode_item, &t);
        if (atomic_load(&t.failed)) goto failed_pass;
        PHASE(IV_TP_ENCODE);
        for (int64_t g = g0; g < g1; g++) t.byte_at[g + 1] = t.byte_at[g] + t.nbytes[g];
        iv_pool_parallel_for(opts->pool, (size_t)t.n_items, 0, move_item, &t);
        PHASE(IV_TP_MOVE);
        for (int64_t k = 0; k < t.n_items; k++) {
            struct item *it = &t.items[k];
            size_t ng = it->n_grp / 2;
            if (n_groups + ng > cap_groups) {
                size_t cap = cap_groups ? cap_groups : 4096;
                while (cap < n_groups + ng) cap *= 2;
                uint32_t *nl = realloc(vlist, cap * sizeof *nl);
                if (nl) vlist = nl;
                uint64_t *ns = realloc(vsize, cap * sizeof *ns);
                if (ns) vsize = ns;
                if (!nl || !ns) {
                    rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the copy's groups", ds->where);
                    goto fail;
                }
                cap_groups = cap;
            }
            for (size_t x = 0; x < ng; x++) {
                vlist[n_groups + x] = it->grp[2 * x];
                vsize[n_groups + x] = it->grp[2 * x + 1];
            }
            n_groups += ng;
        }
        g0 = g1;
    }
    big_unmap(t.tmp, t.tmp_cap);
    t.tmp = NULL;
    free(t.off);
    t.off = NULL;
    uint64_t len = t.byte_at[G];

    /* The exact size, against both budgets. */
    uint64_t n_ckpt = G == 0 ? 0 : (uint64_t)(G - 1) / stride + 1;
    uint64_t bytes = len + (uint64_t)(G + 1) * 8 + (uint64_t)(n_groups + 1) * 8 +
                     (uint64_t)n_groups * vsz + n_ckpt * 8;
    if (bytes > opts->budget) {
        rc = iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation takes %" PRIu64
                     " bytes; the budget allows %" PRIu64, ds->where, bytes, opts->budget);
        goto fail;
    }
    if (opts->global) {
        if (iv_budget_take(opts->global, bytes) < 0) {
            rc = iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation takes %" PRIu64
                         " bytes; the global transpose budget has %" PRIu64 " left", ds->where,
                         bytes, (uint64_t)atomic_load(&opts->global->left));
            goto fail;
        }
        took_global = 1;
        charged = bytes;
    }
    {
        /* Hand the tail past the stream back. */
        size_t keep = big_len((size_t)len), cap = big_len(out_cap);
        if (keep < cap) munmap(out + keep, cap - keep);
        out_cap = (size_t)len;
    }

    /* The copy as a dataset. */
    c = calloc(1, sizeof *c);
    if (!c) {
        rc = iv_fail(err, IV_ENOMEM, "%s: out of memory", ds->where);
        goto fail;
    }
    snprintf(c->path, sizeof c->path, "%s", ds->path);
    snprintf(c->group, sizeof c->group, "%s", ds->group);
    snprintf(c->where, sizeof c->where, "%.4300s (%s copy in memory)", ds->where,
             m->orient == IV_IVCSR ? "gene-major" : "cell-major");
    c->is_copy = 1;
    atomic_init(&c->other, NULL);
    atomic_init(&c->nnz_at, NULL);
    atomic_init(&c->other_state, IV_OTHER_NONE);
    iv_h5matrix_t *cm = &c->m;
    cm->orient = m->orient == IV_IVCSR ? IV_IVCSC : IV_IVCSR;
    cm->n_rows = m->n_rows;
    cm->n_cols = m->n_cols;
    cm->n_major = G;
    cm->n_minor = S;
    cm->nnz = m->nnz;
    cm->n_unique = (int64_t)n_groups;
    cm->value_dtype = m->value_dtype;
    cm->indices_dtype = m->indices_dtype;
    snprintf(cm->codec, sizeof cm->codec, "none (in memory)");
    cm->major_ptr = malloc((size_t)(G + 1) * sizeof *cm->major_ptr);
    cm->value_ptr = malloc((n_groups + 1) * sizeof *cm->value_ptr);
    cm->values = malloc((n_groups ? n_groups : 1) * vsz);
    c->ri.stride = stride;
    c->ri.n_ckpt = n_ckpt;
    c->ri.off = malloc((size_t)(n_ckpt ? n_ckpt : 1) * sizeof *c->ri.off);
    if (!cm->major_ptr || !cm->value_ptr || !cm->values || !c->ri.off) {
        rc = iv_fail(err, IV_ENOMEM, "%s: out of memory for the copy's pointers", ds->where);
        goto fail;
    }
    cm->major_ptr[0] = 0;
    for (int64_t g = 0; g < G; g++) cm->major_ptr[g + 1] = cm->major_ptr[g] + t.ngrp[g];
    cm->value_ptr[0] = 0;
    for (size_t k = 0; k < n_groups; k++) {
        cm->value_ptr[k + 1] = cm->value_ptr[k] + (int64_t)vsize[k];
        memcpy((char *)cm->values + k * vsz, &distinct[vlist[k]], vsz);
    }
    for (uint64_t j = 0; j < n_ckpt; j++) c->ri.off[j] = t.byte_at[j * stride];
    {
        char label[sizeof c->where + 32];
        snprintf(label, sizeof label, "%s/packed_indices", c->where);
        iv_stream_desc_t desc = {.length = len, .chunked = 0, .contig = out, .owned_map = out,
                                 .owned_map_len = big_len(out_cap), .label = label};
        out = NULL;   /* the stream owns it, also on failure */
        if ((rc = iv_stream_create(&desc, 0, &c->stream, err)) < 0) goto fail;
    }
    iv_dataset_info_t *in = &c->info;
    in->path = c->path;
    in->group = c->group;
    in->orient = cm->orient;
    in->n_rows = cm->n_rows;
    in->n_cols = cm->n_cols;
    in->n_major = cm->n_major;
    in->n_minor = cm->n_minor;
    in->nnz = cm->nnz;
    in->n_unique = cm->n_unique;
    in->value_dtype = cm->value_dtype;
    in->indices_dtype = cm->indices_dtype;
    snprintf(in->codec, sizeof in->codec, "%s", cm->codec);
    in->chunked = 0;
    in->stream_bytes = len;
    in->stored_bytes = 0;
    in->n_chunks = iv_stream_n_chunks(c->stream);
    in->chunk_len = iv_stream_chunk_len(c->stream);
    in->index_stride = stride;
    in->index_bytes = iv_rowindex_bytes(&c->ri);
    in->open_seconds = iv_now_s() - t0;

    free(vid);
    free(distinct);
    free(vlist);
    free(vsize);
    free(start);
    tb_free(&t);
    PHASE(IV_TP_FINISH);
    if (opts->phase_seconds) memcpy(opts->phase_seconds, ph, sizeof ph);
    if (opts->phase_cpu_seconds) memcpy(opts->phase_cpu_seconds, pc, sizeof pc);
    if (took_global) {
        ds->other_budget = opts->global;
        ds->other_charged = charged;
    }
    ds->other_source = IV_SRC_MEMORY;
    ds->other_seconds = iv_now_s() - t0;
    atomic_store_explicit(&ds->other, c, memory_order_release);
    iv_dataset_set_other_state(ds, IV_OTHER_READY);
    return 0;

failed_pass:
    rc = iv_fail(err, t.err.code, "%s", t.err.msg);
fail:
    if (took_global) iv_budget_give(opts->global, charged);
    if (c) {
        iv_stream_destroy(c->stream);
        iv_rowindex_free(&c->ri);
        iv_h5matrix_free(&c->m);
        free(c);
    }
    big_unmap(out, out_cap);
    free(vid);
    free(distinct);
    free(vlist);
    free(vsize);
    free(start);
    tb_free(&t);
    iv_dataset_set_other_state(ds, rc == IV_ETOO_LARGE ? IV_OTHER_SKIPPED : IV_OTHER_FAILED);
    return rc;
}
