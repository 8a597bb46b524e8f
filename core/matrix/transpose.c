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
 *     the rest of its varints; when the windows are several, the first
 *     fill keeps each group's place there and the next windows resume
 *     it (band_resume), so that a varint is decoded once over them all
 *     and a window costs the source's chunks and a look at each group.
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
 *
 * iv_dataset_build_other, at the end of this file, calls one function a
 * stage in this order: number_values (1), plan_build (estimate and
 * budget, bands, entry width), plan_blocks_or_count (2), run_windows (3
 * and 4, window by window), check_exact_size (the budgets again) and
 * make_copy; build_free is the one cleanup, on success and on failure.
 *
 * iv_transpose_to_sink, for a writer of the copy on disk, runs the same
 * stages up to run_windows, but the copy is never held: each window
 * goes to the sink in pieces (sink_pieces), runs of its blocks whose
 * varints are moved to a buffer of about an eighth of the window's
 * worst case (reused by the next piece) and handed over with their
 * slices and groups.  The temporary and that buffer share the one
 * bound, so the windows are as many as it needs.
 */
#include "transpose.h"
#include "plainfile.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

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

/* Doubles h's capacity, every key rehashed.  0, or -1 out of memory
 * (h unchanged but for a longer list). */
static int vset_grow(struct vset *h)
{
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
    return 0;
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
        /* Grow first, then place k. */
        if (vset_grow(h) < 0) return -1;
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

/* Parts collect their distinct values in parallel, then the merged set
 * takes each part's, in part order.  0, -1 out of memory, -2 too many
 * values. */
static int collect_values(struct vparts *v, iv_pool_t *pool, struct vset *all)
{
    iv_pool_parallel_for(pool, (size_t)v->n_parts, 0, vpart_collect, v);
    int rc = atomic_load(&v->rc);
    for (int64_t p = 0; rc == 0 && p < v->n_parts; p++) {
        for (size_t x = 0; rc == 0 && x < v->local[p].used; x++) {
            uint32_t id;
            rc = vset_add(all, v->local[p].list[x], &id);
        }
    }
    return rc;
}

/*
 * The distinct values of all in value order, each one's id in all set
 * to its rank; NULL when out of memory.  The comparator's dtype is a
 * file-level static, so the sort runs under a lock (it is over distinct
 * values only).
 */
static uint64_t *rank_values(struct vset *all, iv_dtype_t dtype)
{
    size_t used = all->used;
    uint64_t *sorted = malloc((used ? used : 1) * sizeof *sorted);
    if (!sorted) return NULL;
    memcpy(sorted, all->list, used * sizeof *sorted);
    static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&sort_mu);
    cmp_dtype = dtype;
    qsort(sorted, used, sizeof *sorted, cmp_values);
    pthread_mutex_unlock(&sort_mu);
    for (size_t r = 0; r < used; r++) all->ids[vset_slot(all, sorted[r])] = (uint32_t)r;
    return sorted;
}

/* Frees the parts' sets and the merged one. */
static void vparts_free(struct vparts *v, struct vset *all)
{
    for (int64_t p = 0; v->local && p < v->n_parts; p++) vset_free(&v->local[p]);
    free(v->local);
    vset_free(all);
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
    v.vid = malloc((size_t)(n ? n : 1) * sizeof *v.vid);
    v.local = calloc((size_t)np, sizeof *v.local);
    int rc = !v.vid || !v.local || vset_init(&all) < 0 ? -1 : collect_values(&v, pool, &all);
    if (rc == 0 && !(sorted = rank_values(&all, m->value_dtype))) rc = -1;
    if (rc == 0) {
        v.all = &all;
        iv_pool_parallel_for(pool, (size_t)np, 0, vpart_map, &v);
        *n_distinct = all.used;
    }
    vparts_free(&v, &all);
    if (rc == 0) {
        *vid_out = v.vid;
        *distinct_out = sorted;
        return 0;
    }
    free(v.vid);
    free(sorted);
    if (rc == -2) return iv_fail(err, IV_EUNSUPPORTED, "more than 2^32 distinct values");
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
    uint32_t *next;            /* per chunk: the next one of its chain (next_cap allocated) */
    size_t next_cap;
    uint32_t *head, *tail;     /* n_bands x n_blk: first and last chunk of each part */
    uint64_t *fill_n;          /* n_bands x n_blk: entries of each part */
    uint8_t *tmp;
    const uint64_t *start;     /* n_new_major + 1 entry offsets */
    uint64_t *nbytes;          /* per new slice: encoded bytes */
    uint32_t *ngrp;            /* per new slice: groups */
    struct item *items;
    int64_t n_items;
    uint8_t *out;              /* the copy's stream, or a sink's window of it */
    uint64_t out_at;           /* the copy's byte offset of out[0] (0 but for a sink) */
    int64_t mv_k0;             /* a sink's piece: its first block (move_block) */
    uint64_t *byte_at;         /* per new slice: its offset in out (n_new_major + 1) */
    uint64_t *band_entries;    /* n_bands: each band's entries in the window */
    uint64_t *est_start;       /* n_new_major + 1: estimated entry offsets (one pass) */
    /* Resuming (windows after the first; see band_resume): per source
     * group, its next varint's offset from its band's first byte, the
     * index before it plus one, and its entries left (0: used up); when
     * both of these fit 16 bits (rs_narrow), one word at rs_acc holds
     * them, left in the high half. */
    int resume;                /* the windows resume each group */
    int recorded;              /* a fill has recorded every group's place */
    int rs_narrow;
    atomic_int too_far;        /* a place did not fit 32 bits: resume off */
    uint32_t *rs_off, *rs_acc, *rs_left;  /* one mapping of rs_bytes, at rs_off */
    size_t rs_bytes;
    uint64_t *band_at;         /* n_bands: stream offset of each band's first slice */
    iv_stream_t *replica;      /* the resumed fills' source stream, uncompressed on disk, or NULL */
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
    big_unmap(t->rs_off, t->rs_bytes);
    free(t->band_at);
    if (t->replica) iv_stream_destroy(t->replica);
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
enum { WALK_COUNT, WALK_SAMPLE, WALK_FILL, WALK_FILL_RECORD };

/*
 * A pass's state for one band: the counts (the band's row of t->off) and
 * new slices; for the fill, the window, the temporary, the band's parts
 * (entries, first and last chunk of each block's chain, from fill_n, head
 * and tail), the rest of its share of chunks [c_next, c_end), and its
 * write-combining lines (NULL: plain stores).  band_walk holds it by
 * value, so that it stays in registers: the stores to the temporary could
 * alias a struct's fields.
 */
struct band_pass {
    uint64_t *off;
    uint64_t n_minor;
    const uint64_t *blk_of;
    uint64_t g0, g1;
    uint8_t *tmp;
    size_t esz;
    uint32_t *next, *head, *tail;
    uint64_t *fill_n;
    uint64_t chunk, cmask, lmask;
    uint64_t c_next, c_end;
    uint8_t *wc;
};

/*
 * Band b's pass state (the fill's part zeros for the passes that only
 * count).  Write combining: each block owns one cache line of buffer
 * that mirrors the temporary's line its next entry goes to (same slot),
 * so a finished line goes out as one aligned 64-byte store (see
 * wc_flush).  A chunk is
 * whole lines, so no line is shared with another part.  Blocks are few
 * (a few thousand lines, in the core's own cache) and each part is
 * written in order, so the writes are a few thousand sequential streams
 * rather than one scattered store per entry.
 */
static struct band_pass band_pass_begin(const struct tb *t, size_t b, int fill)
{
    struct band_pass f = {0};
    f.off = t->off + (size_t)b * (size_t)t->n_new_major;
    f.n_minor = (uint64_t)t->n_new_major;
    if (!fill) return f;
    int64_t nk = t->n_blk;
    size_t at_band = (size_t)b * (size_t)(nk ? nk : 1);
    f.blk_of = t->blk_of;
    f.g0 = (uint64_t)t->g0;
    f.g1 = (uint64_t)t->g1;
    f.tmp = t->tmp;
    f.esz = t->esz;
    f.next = t->next;
    f.head = t->head + at_band;
    f.tail = t->tail + at_band;
    f.fill_n = t->fill_n + at_band;
    f.chunk = t->chunk;
    f.cmask = t->chunk - 1;
    f.lmask = WC_LINE / t->esz - 1;
    f.c_next = t->cfirst[b];
    f.c_end = t->cfirst[b + 1];
    if (!t->plain_stores && (uint64_t)nk * WC_LINE <= WC_MAX_BYTES)
        f.wc = aligned_alloc(WC_LINE, (size_t)(nk ? nk : 1) * WC_LINE);
    return f;
}

/* Writes the write-combining lines begun and not finished (when the
 * fill went well) and frees them. */
static void band_pass_end(const struct tb *t, struct band_pass f, int rc)
{
    if (!f.wc) return;
    for (int64_t k = 0; rc == 0 && k < t->n_blk; k++) {
        uint64_t n = f.fill_n[k], r = n & f.lmask;
        if (r)
            memcpy(f.tmp + ((uint64_t)f.tail[k] * f.chunk + ((n - 1) & f.cmask & ~f.lmask)) * f.esz,
                   f.wc + (size_t)k * WC_LINE, (size_t)r * f.esz);
    }
    free(f.wc);
}

/* A band's pass done: its cursor let go, its write-combining lines
 * written, its stores fenced, its error (rc < 0) recorded. */
static void band_finish(struct tb *t, iv_cursor_t *cur, struct band_pass f, int rc, const iv_err_t *e)
{
    iv_cursor_done(cur);
    band_pass_end(t, f, rc);
#if IV_TP_STREAM
    /* Streaming stores are weakly ordered: make them visible before the
     * pool reports the band done. */
    _mm_sfence();
#endif
    if (rc < 0) tb_fail(t, e);
}

/* A cursor at source slice s's first entry. */
static int band_seek(const struct tb *t, int64_t s, iv_cursor_t *cur, iv_err_t *e)
{
    const iv_dataset_t *ds = t->src;
    iv_cursor_init(cur, ds->stream);
    uint64_t at, skip;
    iv_rowindex_locate(&ds->ri, t->mp, t->vp, s, &at, &skip);
    int rc = iv_cursor_seek(cur, at, e);
    if (rc == 0) rc = iv_cursor_skip(cur, skip, e);
    return rc;
}

/*
 * The next varint of cur: one- and two-byte varints inline and without a
 * branch on which (most of a cell-major stream, mixed about evenly, so
 * that a branch would often be mispredicted); the rest through the
 * cursor.
 */
static inline __attribute__((always_inline)) int read_delta(iv_cursor_t *cur, uint64_t *d, iv_err_t *e)
{
    if (cur->end - cur->p >= 2) {
        uint64_t b0 = cur->p[0], b1 = cur->p[1], two = b0 >> 7;
        *d = (b0 & 0x7f) | ((b1 << 7) & (0 - two));
        int fast = !(two & (b1 >> 7));
        cur->p += fast ? 1 + two : 0;
        if (fast) return 0;
    }
    return iv_cursor_read(cur, d, e);
}

/*
 * Appends entry en to the end of block kb's part: the part's next chunk
 * comes from the band's share when its last one is full; the entry goes
 * to the block's write-combining line, which goes out when whole, or
 * straight to the temporary.
 */
static inline __attribute__((always_inline)) int fill_put(struct band_pass *f, size_t kb, uint64_t en,
                                                          const struct tb *t, size_t b, iv_err_t *e)
{
    uint64_t n = f->fill_n[kb]++, in = n & f->cmask;
    if (in == 0) {
        if (f->c_next >= f->c_end)
            return iv_fail(e, IV_EINTERNAL, "%s: the transpose's band %zu outgrew its share", t->src->where,
                           b);
        if (n == 0) f->head[kb] = (uint32_t)f->c_next;
        else f->next[f->tail[kb]] = (uint32_t)f->c_next;
        f->tail[kb] = (uint32_t)f->c_next++;
    }
    uint64_t p = (uint64_t)f->tail[kb] * f->chunk + in;
    if (!f->wc) {
        put_entry(f->tmp, f->esz, p, en);
        return 0;
    }
    uint8_t *line = f->wc + kb * WC_LINE;
    put_entry(line, f->esz, in & f->lmask, en);
    if ((in & f->lmask) == f->lmask) wc_flush(f->tmp + (p - f->lmask) * f->esz, line);
    return 0;
}

/* Group k stops at offset `rel` of its band (a varint past the window),
 * after index acc - 1, with `left` entries from there.  (The band's
 * whole span is checked against 32 bits when its walk ends.) */
static inline void record_stop(struct tb *t, int64_t k, uint64_t rel, uint64_t acc, uint64_t left)
{
    t->rs_off[k] = (uint32_t)rel;
    if (t->rs_narrow) {
        t->rs_acc[k] = (uint32_t)(acc | left << 16);
        return;
    }
    t->rs_acc[k] = (uint32_t)acc;
    t->rs_left[k] = (uint32_t)left;
}

/* Group k's entries left (0: used up) and, through *acc, the index
 * before them plus one. */
static inline uint64_t place_left(const struct tb *t, int64_t k, uint64_t *acc)
{
    uint32_t a = t->rs_acc[k];
    if (t->rs_narrow) {
        *acc = a & 0xffffu;
        return a >> 16;
    }
    *acc = a;
    return t->rs_left[k];
}

/*
 * One value group of source slice s in band b: its `left` delta varints.
 * The counting passes add each index to f->off[]; the fill appends each
 * entry of the window, hi | its new slice's place, to its block's part.
 * Recording (rec, group k of a band starting at stream offset band_at),
 * the fill also keeps where the group stops: before the first varint
 * past the window, or used up (see band_resume).
 */
static inline __attribute__((always_inline)) int walk_group(iv_cursor_t *cur, uint64_t left, uint64_t hi,
                                                            struct band_pass *f, const int fill,
                                                            struct tb *t, int64_t s, size_t b,
                                                            iv_err_t *e, const int rec, int64_t k,
                                                            uint64_t band_at)
{
    const uint64_t n_minor = f->n_minor;
    uint64_t acc = 0, d, at = 0;
    while (left > 0) {
        if (rec) at = iv_cursor_tell(cur);
        int rc = read_delta(cur, &d, e);
        if (rc < 0) return rc;
        left--;
        acc += d + 1;
        if (d >= n_minor || acc > n_minor)
            return iv_fail(e, IV_ECORRUPT, "%s: slice %" PRId64 " has an index >= %" PRIu64, t->src->where, s,
                           n_minor);
        uint64_t j = acc - 1;
        if (!fill) {
            f->off[j]++;
            continue;
        }
        if (j < f->g0) continue;
        /* The group's indices rise: the rest lie past the window. */
        if (j >= f->g1) {
            if (rec) record_stop(t, k, at - band_at, acc - d - 1, left + 1);
            return iv_cursor_skip(cur, left, e);
        }
        uint64_t code = f->blk_of[j - f->g0];
        if ((rc = fill_put(f, (size_t)(code >> 32), hi | (code & 0xffffffffu), t, b, e)) < 0) return rc;
    }
    if (rec) record_stop(t, k, 0, 0, 0);
    return 0;
}

/*
 * A pass over band b's source slices.  WALK_COUNT adds up the entries of
 * each new slice; WALK_SAMPLE does that for the band's first
 * 1/SAMPLE_SHARE of slices only; WALK_FILL writes each entry of the
 * window (source slice less the band's first, value id, place of the new
 * slice in its block: one word) to the end of its (band, block) part.
 */
static inline __attribute__((always_inline)) void band_walk(struct tb *t, size_t b, const int mode)
{
    const int fill = mode >= WALK_FILL, rec = mode == WALK_FILL_RECORD;
    int64_t s0 = t->band[b], s1 = t->band[b + 1];
    if (mode == WALK_SAMPLE) s1 = s0 + (s1 - s0 + SAMPLE_SHARE - 1) / SAMPLE_SHARE;
    if (s0 >= s1 || atomic_load(&t->failed)) return;
    iv_cursor_t cur;
    iv_err_t e = {0};
    int rc = band_seek(t, s0, &cur, &e);
    uint64_t at0 = rec ? iv_cursor_tell(&cur) : 0;
    if (rec) t->band_at[b] = at0;
    /* Locals: the stores below could alias the struct's fields. */
    struct band_pass f = band_pass_begin(t, b, fill);
    const unsigned gbits = t->gbits, sv = t->gbits + t->vbits;
    const uint32_t *vid = t->vid;
    const int64_t *mp = t->mp, *vp = t->vp;
    for (int64_t s = s0; rc == 0 && s < s1; s++) {
        uint64_t sl = (uint64_t)(s - s0) << sv;
        for (int64_t k = mp[s]; rc == 0 && k < mp[s + 1]; k++) {
            uint64_t hi = fill ? sl | (uint64_t)vid[k] << gbits : 0;
            rc = walk_group(&cur, (uint64_t)(vp[k + 1] - vp[k]), hi, &f, fill, t, s, b, &e, rec, k, at0);
        }
        if (atomic_load_explicit(&t->failed, memory_order_relaxed)) break;
    }
    /* A band past 32 bits of stream cannot keep its places. */
    if (rec && rc == 0 && iv_cursor_tell(&cur) - at0 > UINT32_MAX)
        atomic_store_explicit(&t->too_far, 1, memory_order_relaxed);
    band_finish(t, &cur, f, rc, &e);
}

static void band_count(void *arg, size_t b) { band_walk(arg, b, WALK_COUNT); }
static void band_sample(void *arg, size_t b) { band_walk(arg, b, WALK_SAMPLE); }
static void band_fill(void *arg, size_t b) { band_walk(arg, b, WALK_FILL); }
static void band_fill_record(void *arg, size_t b) { band_walk(arg, b, WALK_FILL_RECORD); }

/*
 * Group k of a fill after the recording one, from where the last window
 * left it (after index acc - 1, `left` entries to go): its entries of the window, up to (and not reading past) its
 * first varint beyond the window, whose place it keeps for the next.
 */
static inline __attribute__((always_inline)) int resume_group(iv_cursor_t *cur, struct tb *t, struct band_pass *f,
                                                              int64_t k, uint64_t acc, uint64_t left, uint64_t hi,
                                                              int64_t s, size_t b, uint64_t band_at, iv_err_t *e)
{
    const uint64_t n_minor = f->n_minor;
    uint64_t d;
    while (left > 0) {
        uint64_t at = iv_cursor_tell(cur);
        int rc = read_delta(cur, &d, e);
        if (rc < 0) return rc;
        if (d >= n_minor || acc + d >= n_minor)
            return iv_fail(e, IV_ECORRUPT, "%s: slice %" PRId64 " has an index >= %" PRIu64, t->src->where, s,
                           n_minor);
        uint64_t j = acc + d;
        if (j >= f->g1) {
            record_stop(t, k, at - band_at, acc, left);
            return 0;
        }
        if (j < f->g0)
            return iv_fail(e, IV_EINTERNAL, "%s: the transpose resumed slice %" PRId64 " before its window",
                           t->src->where, s);
        left--;
        acc = j + 1;
        uint64_t code = f->blk_of[j - f->g0];
        if ((rc = fill_put(f, (size_t)(code >> 32), hi | (code & 0xffffffffu), t, b, e)) < 0) return rc;
    }
    record_stop(t, k, 0, 0, 0);
    return 0;
}

/*
 * The fill of a window after the recording one: each group of band b
 * picks up where the last window left it (a seek forward, within the
 * chunk pinned already but for a group's first in a new chunk) instead
 * of being decoded from its start, so that over all the windows every
 * varint is read once.  Groups used up are passed over.
 */
static void band_resume(void *arg, size_t b)
{
    struct tb *t = arg;
    int64_t s0 = t->band[b], s1 = t->band[b + 1];
    if (s0 >= s1 || atomic_load(&t->failed)) return;
    iv_cursor_t cur;
    iv_cursor_init(&cur, t->replica ? t->replica : t->src->stream);
    iv_err_t e = {0};
    int rc = 0;
    struct band_pass f = band_pass_begin(t, b, 1);
    const unsigned gbits = t->gbits, sv = t->gbits + t->vbits;
    const uint32_t *vid = t->vid, *rs_off = t->rs_off;
    const int64_t *mp = t->mp;
    const uint64_t at0 = t->band_at[b];
    for (int64_t s = s0; rc == 0 && s < s1; s++) {
        uint64_t sl = (uint64_t)(s - s0) << sv;
        for (int64_t k = mp[s]; rc == 0 && k < mp[s + 1]; k++) {
            uint64_t acc, left = place_left(t, k, &acc);
            if (left == 0) continue;
            if ((rc = iv_cursor_seek(&cur, at0 + rs_off[k], &e)) == 0)
                rc = resume_group(&cur, t, &f, k, acc, left, sl | (uint64_t)vid[k] << gbits, s, b, at0, &e);
        }
        if (atomic_load_explicit(&t->failed, memory_order_relaxed)) break;
    }
    band_finish(t, &cur, f, rc, &e);
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

/* The delta varints of the ascending source slices cells[from, to) at
 * dst (the first delta is the index itself); returns their bytes. */
static inline uint64_t put_deltas(uint8_t *dst, const uint32_t *cells, uint64_t from, uint64_t to)
{
    uint64_t w = 0, last = UINT64_MAX;   /* -1: the first delta is the index itself */
    for (uint64_t x = from; x < to; x++) {
        w += iv_varint_put_slack(dst + w, cells[x] - last - 1);
        last = cells[x];
    }
    return w;
}

/*
 * An encode worker's buffers, sized for the largest block of its item:
 * cells (source slices in group order), lo (per new slice: its entries,
 * then where they go), nmin (per new slice: one past the last source
 * slice read, for the order check) and eb (the block's varints, and
 * iv_varint_put_slack's byte of slack); hist for the joint sort, and cnt,
 * touched and loc for the per-slice one, taken when a block first needs
 * them.
 */
struct enc {
    uint64_t big_blk;
    int64_t big_genes;
    uint32_t *cells, *hist, *cnt, *touched;
    uint64_t *lo, *nmin;
    uint8_t *eb, *loc;
};

/*
 * encode_slice for a new slice whose n entries at r all have value id v:
 * its source slices are in order already.
 */
static int encode_one_value(struct tb *t, struct item *it, int64_t g, const uint8_t *r, uint64_t n, uint32_t v,
                            uint8_t *dst, iv_err_t *e)
{
    const size_t lsz = t->lsz;
    if (grp_push(it, v, (uint32_t)n) < 0) return iv_fail(e, IV_ENOMEM, "out of memory encoding the copy");
    size_t w = 0;
    uint64_t last = UINT64_MAX;   /* -1: the first delta is the index itself */
    for (uint64_t x = 0; x < n; x++) {
        uint64_t s = get_entry(r, lsz, x) >> t->vbits;
        w += iv_varint_put_slack(dst + w, s - last - 1);
        last = s;
    }
    t->nbytes[g] = w;
    t->ngrp[g] = 1;
    return 0;
}

/*
 * Step 4 for one new slice: its n entries (source slice << vbits | value
 * id, in source slice order) at r become groups in value order, each one
 * a run of delta varints written at dst.  0, or -1 with e set.
 */
static int encode_slice(struct tb *t, struct item *it, int64_t g, const uint8_t *r, uint64_t n,
                        uint8_t *dst, const struct enc *x, iv_err_t *e)
{
    uint32_t *cnt = x->cnt, *touched = x->touched, *cells = x->cells;
    size_t nt = 0;
    const size_t lsz = t->lsz;
    /* The order of the source slices was checked by the block's first
     * read (encode_item). */
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)(get_entry(r, lsz, i) & t->vmask);
        if (cnt[v]++ == 0) touched[nt++] = v;
    }
    if (nt == 1) {
        cnt[touched[0]] = 0;
        return encode_one_value(t, it, g, r, n, touched[0], dst, e);
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
    for (uint64_t i = 0; i < n; i++) {
        uint64_t en = get_entry(r, lsz, i);
        cells[cnt[en & t->vmask]++] = (uint32_t)(en >> t->vbits);
    }
    size_t w = 0;
    uint32_t from = 0;
    for (size_t k = 0; k < nt; k++) {
        uint32_t to = cnt[touched[k]];
        w += put_deltas(dst + w, cells, from, to);
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

/* x's buffers for the blocks of item it.  0, or -1 when out of memory
 * (what was taken is freed by enc_free). */
static int enc_init(struct enc *x, const struct tb *t, const struct item *it)
{
    memset(x, 0, sizeof *x);
    for (int64_t k = it->k0; k < it->k1; k++) {
        uint64_t n = t->blk_at[k + 1] - t->blk_at[k];
        if (n > x->big_blk) x->big_blk = n;
        if (t->blk[k + 1] - t->blk[k] > x->big_genes) x->big_genes = t->blk[k + 1] - t->blk[k];
    }
    size_t blk = (size_t)(x->big_blk ? x->big_blk : 1), genes = (size_t)(x->big_genes ? x->big_genes : 1);
    x->cells = malloc(blk * sizeof *x->cells);
    x->lo = malloc(genes * sizeof *x->lo);
    x->nmin = malloc(genes * sizeof *x->nmin);
    x->eb = malloc(blk * t->maxlen + 1);   /* + iv_varint_put_slack's slack */
    return x->cells && x->lo && x->nmin && x->eb ? 0 : -1;
}

/* The joint sort's counters, or the per-slice sort's buffers, the first
 * time a block needs them.  0, or -1 when out of memory. */
static int enc_need(struct enc *x, const struct tb *t, int joint)
{
    if (joint) return x->hist || (x->hist = malloc(HIST_MAX * sizeof *x->hist)) ? 0 : -1;
    if (x->loc) return 0;
    size_t nv = t->n_vals ? (size_t)t->n_vals : 1;
    x->cnt = calloc(nv, sizeof *x->cnt);
    x->touched = malloc(nv * sizeof *x->touched);
    x->loc = malloc((size_t)(x->big_blk ? x->big_blk : 1) * t->lsz);
    return x->cnt && x->touched && x->loc ? 0 : -1;
}

static void enc_free(struct enc *x)
{
    free(x->cnt);
    free(x->touched);
    free(x->hist);
    free(x->cells);
    free(x->loc);
    free(x->lo);
    free(x->nmin);
    free(x->eb);
}

/*
 * Read 1 of block k, whose first new slice is a: each new slice's
 * entries (x->lo), the check that no source slice comes twice in a new
 * slice (its parts are read in band order, so source slices come
 * ascending), and, for the joint sort, the (new slice, value id) counts.
 * 0, or -1 with e set.
 */
static int block_count(const struct tb *t, const struct enc *x, int64_t k, int64_t a, int joint, iv_err_t *e)
{
    const uint64_t gmask = t->gbits ? ((uint64_t)1 << t->gbits) - 1 : 0;
    const unsigned gbits = t->gbits, vbits = t->vbits, sv = t->gbits + t->vbits;
    const uint64_t vmask = t->vmask, chunk = t->chunk;
    const uint8_t *tmp = t->tmp;
    const size_t esz = t->esz;
    uint64_t *lo = x->lo, *nmin = x->nmin;
    uint32_t *hist = x->hist;
    for (int64_t b = 0; b < t->n_bands; b++) {
        size_t at = (size_t)b * (size_t)t->n_blk + (size_t)k;
        uint64_t first = (uint64_t)t->band[b], left = t->fill_n[at];
        uint32_t c = left ? t->head[at] : 0;
        while (left > 0) {
            uint64_t x0 = (uint64_t)c * chunk, x1 = x0 + (left < chunk ? left : chunk);
            left -= x1 - x0;
            for (uint64_t i = x0; i < x1; i++) {
                uint64_t en = get_entry(tmp, esz, i), p = en & gmask;
                uint64_t s = first + (en >> sv);
                if (s < nmin[p])
                    return iv_fail(e, IV_ECORRUPT, "%s: slice %" PRIu64 " stores minor index %" PRId64
                                   " twice", t->src->where, s, a + (int64_t)p);
                nmin[p] = s + 1;
                lo[p]++;
                if (joint) hist[p << vbits | ((en >> gbits) & vmask)]++;
            }
            if (left) c = t->next[c];
        }
    }
    return 0;
}

/* Where each new slice's entries go (x->lo), or each (new slice, value
 * id)'s (x->hist, joint): the counts of read 1 turned into offsets. */
static void block_offsets(const struct enc *x, size_t genes, uint64_t vspan, int joint)
{
    uint64_t run = 0;
    if (joint) {
        for (size_t i = 0; i < genes * vspan; i++) {
            uint32_t h = x->hist[i];
            x->hist[i] = (uint32_t)run;
            run += h;
        }
        return;
    }
    for (size_t p = 0; p < genes; p++) {
        uint64_t h = x->lo[p];
        x->lo[p] = run;
        run += h;
    }
}

/*
 * Read 2's sort of the temporary's entries [x0, x1), of a band whose
 * first source slice is `first`: by (new slice, value id) into cells
 * (joint), or by new slice into the local buffer.  The 4-byte loops are
 * the common cases, spelled out.
 */
static inline void sort_chunk(const struct tb *t, const struct enc *x, int joint, uint64_t first, uint64_t x0,
                              uint64_t x1)
{
    const uint64_t gmask = t->gbits ? ((uint64_t)1 << t->gbits) - 1 : 0;
    const unsigned gbits = t->gbits, vbits = t->vbits, sv = t->gbits + t->vbits;
    const uint64_t vmask = t->vmask, add = first << vbits;
    const uint8_t *tmp = t->tmp;
    const size_t esz = t->esz, lsz = t->lsz;
    uint32_t *hist = x->hist, *cells = x->cells;
    uint64_t *lo = x->lo;
    uint8_t *loc = x->loc;
    if (joint && esz == 4) {
        const uint32_t *src = (const uint32_t *)(const void *)tmp;
        for (uint64_t i = x0; i < x1; i++) {
            uint32_t en = src[i];
            cells[hist[(en & gmask) << vbits | ((en >> gbits) & vmask)]++] = (uint32_t)(first + (en >> sv));
        }
    } else if (joint) {
        for (uint64_t i = x0; i < x1; i++) {
            uint64_t en = get_entry(tmp, esz, i);
            cells[hist[(en & gmask) << vbits | ((en >> gbits) & vmask)]++] = (uint32_t)(first + (en >> sv));
        }
    } else if (esz == 4 && lsz == 4) {
        const uint32_t *src = (const uint32_t *)(const void *)tmp;
        uint32_t *dl = (uint32_t *)(void *)loc;
        for (uint64_t i = x0; i < x1; i++) {
            uint32_t en = src[i];
            dl[lo[en & gmask]++] = (uint32_t)((en >> gbits) + add);
        }
    } else {
        for (uint64_t i = x0; i < x1; i++) {
            uint64_t en = get_entry(tmp, esz, i);
            put_entry(loc, lsz, lo[en & gmask]++, (en >> gbits) + add);
        }
    }
}

/* Read 2 of block k: its parts' chunks, bands in order, sorted (see
 * sort_chunk). */
static void block_sort(const struct tb *t, const struct enc *x, int64_t k, int joint)
{
    const uint64_t chunk = t->chunk;
    for (int64_t b = 0; b < t->n_bands; b++) {
        size_t at = (size_t)b * (size_t)t->n_blk + (size_t)k;
        uint64_t first = (uint64_t)t->band[b], left = t->fill_n[at];
        uint32_t c = left ? t->head[at] : 0;
        while (left > 0) {
            uint64_t x0 = (uint64_t)c * chunk, x1 = x0 + (left < chunk ? left : chunk);
            left -= x1 - x0;
            sort_chunk(t, x, joint, first, x0, x1);
            if (left) c = t->next[c];
        }
    }
}

/*
 * The varints of the `genes` new slices from a, sorted jointly: each
 * (new slice, value id) run of cells is a group.  *w gets the bytes
 * written to x->eb.  0, or -1 with e set.
 */
static int block_varints_joint(struct tb *t, struct item *it, const struct enc *x, int64_t a, size_t genes,
                               uint64_t *w_out, iv_err_t *e)
{
    const unsigned vbits = t->vbits;
    const uint64_t vspan = (uint64_t)1 << vbits;
    const uint32_t *hist = x->hist, *cells = x->cells;
    uint8_t *eb = x->eb;
    uint64_t w = 0, from = 0;
    for (size_t p = 0; p < genes; p++) {
        uint64_t w0 = w;
        uint32_t ng = 0;
        for (uint64_t v = 0; v < vspan; v++) {
            uint64_t to = hist[p << vbits | v];
            if (to == from) continue;
            if (grp_push(it, (uint32_t)v, (uint32_t)(to - from)) < 0)
                return iv_fail(e, IV_ENOMEM, "out of memory encoding the copy");
            ng++;
            w += put_deltas(eb + w, cells, from, to);
            from = to;
        }
        t->nbytes[a + (int64_t)p] = w - w0;
        t->ngrp[a + (int64_t)p] = ng;
    }
    *w_out = w;
    return 0;
}

/* The varints of the `genes` new slices from a, each sorted by value id
 * on its own (encode_slice).  As block_varints_joint. */
static int block_varints_by_slice(struct tb *t, struct item *it, const struct enc *x, int64_t a, size_t genes,
                                  uint64_t *w_out, iv_err_t *e)
{
    uint64_t w = 0, from = 0;
    for (size_t p = 0; p < genes; p++) {
        int64_t g = a + (int64_t)p;
        if (encode_slice(t, it, g, x->loc + (size_t)from * t->lsz, x->lo[p] - from, x->eb + w, x, e) < 0)
            return -1;
        w += t->nbytes[g];
        from = x->lo[p];
    }
    *w_out = w;
    return 0;
}

/*
 * Step 4 for block k of item it.  A first read counts each new slice's
 * entries and checks the source slices' order (block_count).  Then:
 *  - when the block's new slices times the value ids are few (at most
 *    HIST_MAX, and at most the block's entries), one counting sort by
 *    (new slice, value id), stable, puts every group's source slices in
 *    order at once;
 *  - otherwise the entries are sorted by new slice into a local buffer
 *    (stable), then each new slice by value id (encode_slice).
 * The block's varints go to a local buffer and then over its own chunks.
 * 0, or -1 with e set.
 */
static int encode_block(struct tb *t, struct item *it, struct enc *x, int64_t k, iv_err_t *e)
{
    int64_t a = t->blk[k];
    uint64_t n_blk = t->blk_at[k + 1] - t->blk_at[k], vspan = (uint64_t)1 << t->vbits;
    size_t genes = (size_t)(t->blk[k + 1] - a);
    int joint = (uint64_t)genes * vspan <= HIST_MAX && (uint64_t)genes * vspan <= n_blk;
    if (enc_need(x, t, joint) < 0) return iv_fail(e, IV_ENOMEM, "out of memory encoding the copy");
    memset(x->lo, 0, genes * sizeof *x->lo);
    memset(x->nmin, 0, genes * sizeof *x->nmin);
    if (joint) memset(x->hist, 0, (size_t)(genes * vspan) * sizeof *x->hist);
    if (block_count(t, x, k, a, joint, e) < 0) return -1;
    block_offsets(x, genes, vspan, joint);
    block_sort(t, x, k, joint);
    uint64_t w = 0;
    int rc = joint ? block_varints_joint(t, it, x, a, genes, &w, e)
                   : block_varints_by_slice(t, it, x, a, genes, &w, e);
    if (rc < 0) return rc;
    block_chunks(t, k, x->eb, w, 1);
    return 0;
}

/* Step 4 for the blocks of item i (encode_block), with one set of
 * buffers. */
static void encode_item(void *arg, size_t i)
{
    struct tb *t = arg;
    struct item *it = &t->items[i];
    iv_err_t e = {0};
    struct enc x;
    int rc = enc_init(&x, t, it) < 0 ? iv_fail(&e, IV_ENOMEM, "out of memory encoding the copy") : 0;
    for (int64_t k = it->k0; rc == 0 && k < it->k1 && !atomic_load(&t->failed); k++)
        rc = encode_block(t, it, &x, k, &e);
    enc_free(&x);
    if (e.code) tb_fail(t, &e);
}

/* Moves block k's encoded slices from its chunks to their place in
 * t->out (the copy's stream, or a sink's piece from t->out_at). */
static void move_one_block(struct tb *t, int64_t k)
{
    uint64_t at = t->byte_at[t->blk[k]];
    block_chunks(t, k, t->out + (at - t->out_at), t->byte_at[t->blk[k + 1]] - at, 0);
}

/* Moves item i's blocks (the copy in memory). */
static void move_item(void *arg, size_t i)
{
    struct tb *t = arg;
    for (int64_t k = t->items[i].k0; k < t->items[i].k1; k++) move_one_block(t, k);
}

/* Moves block mv_k0 + i (a sink's piece). */
static void move_block(void *arg, size_t i)
{
    struct tb *t = arg;
    move_one_block(t, t->mv_k0 + (int64_t)i);
}

/* Frees the previous window's blocks and parts. */
static void blocks_free(struct tb *t)
{
    free(t->blk);
    free(t->blk_at);
    free(t->head);
    free(t->tail);
    free(t->fill_n);
    t->blk = NULL;
    t->blk_at = NULL;
    t->head = t->tail = NULL;
    t->fill_n = NULL;
}

/* Cuts the window into blocks (see plan_blocks): blk and blk_of; returns
 * the number of blocks. */
static int64_t cut_blocks(struct tb *t, uint64_t target)
{
    int64_t g0 = t->g0, g1 = t->g1, cap = (int64_t)1 << t->gbits, n = 0;
    for (int64_t g = g0; g < g1;) {
        int64_t e = g + 1;
        while (e < g1 && e - g < cap && t->start[e + 1] - t->start[g] <= target) e++;
        t->blk[n++] = g;
        for (int64_t x = g; x < e; x++) t->blk_of[x - g0] = (uint64_t)(n - 1) << 32 | (uint64_t)(x - g);
        g = e;
    }
    t->blk[n] = g1;
    return n;
}

/*
 * Cuts the window [g0, g1) into blocks of at most 2^gbits new slices and
 * about `target` entries by t->start (a slice with more is a block of
 * its own), and makes the parts' empty chains.  0, or -1 when out of
 * memory.
 */
static int plan_blocks(struct tb *t, uint64_t target)
{
    blocks_free(t);
    t->blk = malloc((size_t)(t->g1 - t->g0 + 1) * sizeof *t->blk);
    if (!t->blk) return -1;
    int64_t n = t->n_blk = cut_blocks(t, target);
    t->blk_at = malloc((size_t)(n + 1) * sizeof *t->blk_at);
    if (!t->blk_at) return -1;
    size_t parts = (size_t)t->n_bands * (size_t)(n ? n : 1);
    t->head = malloc(parts * sizeof *t->head);
    t->tail = malloc(parts * sizeof *t->tail);
    t->fill_n = calloc(parts, sizeof *t->fill_n);
    if (!t->head || !t->tail || !t->fill_n) return -1;
    return 0;
}

/* The entries of a chunk for `all` entries of the window (see
 * plan_shares). */
static uint64_t chunk_entries(const struct tb *t, uint64_t all)
{
    uint64_t parts_all = (uint64_t)t->n_bands * (uint64_t)(t->n_blk ? t->n_blk : 1);
    uint64_t chunk = t->chunk_asked ? t->chunk_asked : all / parts_all / 4;
    if (chunk > CHUNK_MAX_ENTRIES) chunk = CHUNK_MAX_ENTRIES;
    while (chunk & (chunk - 1)) chunk &= chunk - 1;
    if (chunk == 0) chunk = 1;
    if (!t->plain_stores && chunk < WC_LINE / t->esz) chunk = WC_LINE / t->esz;
    return chunk;
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
    uint64_t all = 0;
    for (int64_t b = 0; b < t->n_bands; b++) all += t->band_entries[b];
    t->chunk = chunk_entries(t, all);
    uint64_t total = 0;
    t->cfirst[0] = 0;
    for (int64_t b = 0; b < t->n_bands; b++) {
        uint64_t e = t->band_entries[b], parts = (uint64_t)t->n_blk < e ? (uint64_t)t->n_blk : e;
        total += e / t->chunk + parts;
        t->cfirst[b + 1] = total;
    }
    if (total > UINT32_MAX) return -1;
    /* Kept from the window before when it is large enough: a new mapping
     * a window is a page fault for each of its pages (at 10 M cells, 16
     * threads, 47 windows of 3 GB: a quarter of the pack's CPU time was
     * the kernel's). */
    size_t need = (size_t)(total ? total : 1) * (size_t)t->chunk * t->esz;
    if (!t->tmp || need > t->tmp_cap) {
        big_unmap(t->tmp, t->tmp_cap);
        t->tmp_cap = need;
        t->tmp = big_map(t->tmp_cap);
        if (!t->tmp) t->tmp_cap = 0;
    }
    size_t links = (size_t)(total ? total : 1);
    if (!t->next || links > t->next_cap) {
        free(t->next);
        t->next = malloc(links * sizeof *t->next);
        t->next_cap = t->next ? links : 0;
    }
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

/* Wall and CPU seconds of the build's phases (opts->phase_seconds),
 * and when the last one ended. */
struct phases {
    double t0, tp, tc;
    double wall[IV_TRANSPOSE_PHASES], cpu[IV_TRANSPOSE_PHASES];
};

/* Adds the wall and CPU time since the last phase ended to phase k. */
static void phase_end(struct phases *p, int k)
{
    double now = iv_now_s();
    double cpu = cpu_s();
    p->wall[k] += now - p->tp;
    p->cpu[k] += cpu - p->tc;
    p->tp = now;
    p->tc = cpu;
}

/*
 * The build's state besides the passes' (struct tb): the source and the
 * options, the value ids, the exact entry offsets of a count pass, the
 * copy's groups as the windows give them, its stream and, at the end,
 * the copy itself.  build_free frees it on success (the copy and its
 * stream handed on) and on failure.
 */
struct build {
    struct tb t;
    iv_dataset_t *ds;
    const iv_h5matrix_t *m;
    const iv_transpose_opts_t *opts;
    struct phases clock;
    size_t vsz;                /* bytes a value */
    int64_t G, S;              /* new and source slices */
    uint64_t nnz;
    uint32_t stride;           /* of the copy's row index */
    unsigned threads;
    unsigned sbits;            /* bits of a source slice */
    uint32_t *vid;             /* per source group: its value's id */
    uint64_t *distinct;        /* per value id: its bits */
    uint64_t *start;           /* n_new_major + 1 entry offsets (count pass) */
    uint64_t tmp_bytes;        /* bound on the temporary */
    uint64_t win_entries;      /* most entries a window (count pass) */
    int64_t want_items;        /* encode items a window */
    uint32_t *vlist;           /* per group of the copy: its value id */
    uint64_t *vsize;           /* per group of the copy: its entries */
    size_t n_groups, cap_groups;
    uint8_t *out;              /* the copy's stream, until the copy owns it (a sink: one window's) */
    size_t out_cap;
    const iv_transpose_sink_t *sink;  /* NULL: the copy is built in memory */
    uint64_t piece_cap;        /* a sink's: bytes of varints a piece of a window aims at */
    int windows;               /* windows begun */
    uint8_t *wvals;            /* a sink's window: its groups' values */
    size_t wvals_cap;
    uint64_t len;              /* the stream's bytes */
    uint64_t n_ckpt;           /* the copy's row-index checkpoints */
    uint64_t bytes;            /* the copy's exact size */
    int took_global;           /* bytes charged to opts->global */
    iv_dataset_t *c;           /* the copy */
};

static void build_init(struct build *b, iv_dataset_t *ds, const iv_transpose_opts_t *opts)
{
    memset(b, 0, sizeof *b);
    b->clock.t0 = b->clock.tp = iv_now_s();
    b->clock.tc = cpu_s();
    atomic_init(&b->t.failed, 0);
    atomic_init(&b->t.too_far, 0);
    pthread_mutex_init(&b->t.mu, NULL);
    b->ds = ds;
    b->m = &ds->m;
    b->opts = opts;
    b->vsz = iv_dtype_size(b->m->value_dtype);
    b->G = b->m->n_minor;
    b->S = b->m->n_major;
    b->nnz = (uint64_t)b->m->nnz;
    b->stride = ds->ri.stride ? ds->ri.stride : IV_ROWINDEX_DEFAULT_STRIDE;
    b->threads = iv_pool_threads(opts->pool) + 1;
}

/* Frees the copy (its stream owns the stream's mapping). */
static void copy_free(iv_dataset_t *c)
{
    iv_stream_destroy(c->stream);
    iv_rowindex_free(&c->ri);
    iv_h5matrix_free(&c->m);
    free(c);
}

/* Frees the build's state; after a failure (rc < 0) also the copy and
 * the global budget's charge. */
static void build_free(struct build *b, int rc)
{
    if (rc < 0 && b->took_global) iv_budget_give(b->opts->global, b->bytes);
    if (rc < 0 && b->c) copy_free(b->c);
    big_unmap(b->out, b->out_cap);
    free(b->vid);
    free(b->distinct);
    free(b->vlist);
    free(b->vsize);
    free(b->wvals);
    free(b->start);
    tb_free(&b->t);
}

/* The error a pass's worker recorded, as the build's. */
static int pass_error(const struct tb *t, iv_err_t *err)
{
    return iv_fail(err, t->err.code, "%s", t->err.msg);
}

/* 1. Value ids. */
static int number_values(struct build *b, iv_err_t *err)
{
    int rc = value_ids(b->m, b->opts->pool, b->threads, &b->vid, &b->distinct, &b->t.n_vals, err);
    if (rc == 0) phase_end(&b->clock, IV_TP_VALUES);
    return rc;
}

/* The estimate before anything large: a stream as long as the source's,
 * the pointers, one group per distinct value at least; against both
 * budgets. */
static int check_estimate(const struct build *b, iv_err_t *err)
{
    const iv_transpose_opts_t *opts = b->opts;
    uint64_t est = iv_stream_length(b->ds->stream) + (uint64_t)(b->G + 1) * 8 + b->t.n_vals * (8 + b->vsz) +
                   (uint64_t)(b->G / b->stride + 1) * 8;
    if (est <= opts->budget && !(opts->global && atomic_load(&opts->global->left) < est)) return 0;
    return iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation needs about %" PRIu64
                   " bytes; the budget allows %" PRIu64, b->ds->where, est,
                   opts->global && atomic_load(&opts->global->left) < opts->budget
                       ? (uint64_t)atomic_load(&opts->global->left) : opts->budget);
}

/* The passes' view of the source, and what an entry packs: a source
 * slice (32 bits at most) and a value id, together in 64 bits. */
static int check_packing(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    t->src = b->ds;
    t->mp = b->m->major_ptr;
    t->vp = b->m->value_ptr;
    t->n_src_major = b->S;
    t->n_new_major = b->G;
    t->vid = b->vid;
    t->vbits = bits_for(t->n_vals);
    t->vmask = t->vbits ? (((uint64_t)1 << t->vbits) - 1) : 0;
    b->sbits = bits_for((uint64_t)b->S);
    t->maxlen = varint_len(b->S > 0 ? (uint64_t)b->S - 1 : 0);
    if (b->sbits + t->vbits > 64 || (uint64_t)b->S > UINT32_MAX)
        return iv_fail(err, IV_EUNSUPPORTED, "%s: %" PRIu64 " distinct values and %" PRId64
                       " slices do not pack in 64 bits", b->ds->where, t->n_vals, b->S);
    return 0;
}

/* Cuts the source slices into t->n_bands bands of about equal nnz. */
static void cut_bands(struct tb *t, int64_t S, uint64_t nnz)
{
    int64_t nb = t->n_bands;
    t->band[0] = 0;
    for (int64_t b = 1; b < nb; b++) {
        uint64_t want = nnz * (uint64_t)b / (uint64_t)nb;
        int64_t lo = t->band[b - 1], hi = S;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if ((uint64_t)t->vp[t->mp[mid]] < want) lo = mid + 1;
            else hi = mid;
        }
        t->band[b] = lo;
    }
    t->band[nb] = S;
}

/* The per-band counters and the per-new-slice arrays.  0, or -1 when
 * out of memory. */
static int alloc_counters(struct build *b)
{
    struct tb *t = &b->t;
    int64_t G = b->G, nb = t->n_bands;
    size_t g_or_1 = (size_t)(G ? G : 1);
    t->band = malloc((size_t)(nb + 1) * sizeof *t->band);
    t->off = calloc((size_t)nb * g_or_1, sizeof *t->off);
    b->start = malloc((size_t)(G + 1) * sizeof *b->start);
    t->nbytes = calloc(g_or_1, sizeof *t->nbytes);
    t->ngrp = calloc(g_or_1, sizeof *t->ngrp);
    t->byte_at = malloc((size_t)(G + 1) * sizeof *t->byte_at);
    t->blk_of = malloc(g_or_1 * sizeof *t->blk_of);
    return t->band && t->off && b->start && t->nbytes && t->ngrp && t->byte_at && t->blk_of ? 0 : -1;
}

/* Bands of about equal nnz, as many as the counters allow, and the
 * counters. */
static int plan_bands(struct build *b, iv_err_t *err)
{
    int64_t nb = (int64_t)b->threads * 4;
    if (nb > b->S) nb = b->S;
    while (nb > 1 && (uint64_t)nb * (uint64_t)b->G * 8 > COUNTER_BYTES) nb--;
    if (nb < 1) nb = 1;
    b->t.n_bands = nb;
    if (alloc_counters(b) < 0)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose counters", b->ds->where);
    cut_bands(&b->t, b->S, b->nnz);
    return 0;
}

/* Source slices of the widest band. */
static int64_t widest_band(const struct tb *t)
{
    int64_t widest = 0;
    for (int64_t b = 0; b < t->n_bands; b++)
        if (t->band[b + 1] - t->band[b] > widest) widest = t->band[b + 1] - t->band[b];
    return widest;
}

/* A temporary entry is (source slice less its band's first, value id,
 * place of the new slice in its block): 4 bytes when that leaves the
 * blocks a few bits (and a varint never outgrows its entry), else 8. */
static void choose_entry_width(struct build *b)
{
    struct tb *t = &b->t;
    const iv_transpose_opts_t *opts = b->opts;
    unsigned bbits = bits_for((uint64_t)widest_band(t));
    if (bbits + t->vbits + BLOCK_MIN_BITS <= 32 && t->maxlen <= 4 && !opts->wide_entries) {
        t->esz = 4;
        t->gbits = 32 - bbits - t->vbits;
    } else {
        t->esz = 8;
        t->gbits = 64 - bbits - t->vbits;
    }
    if (t->gbits > BLOCK_MAX_BITS) t->gbits = BLOCK_MAX_BITS;
    t->lsz = b->sbits + t->vbits <= 32 && !opts->wide_entries ? 4 : 8;
    while (opts->block_slices && t->gbits > 0 && ((uint64_t)1 << t->gbits) > opts->block_slices) t->gbits--;
}

/* The entries a block aims at in a window of `entries`. */
static uint64_t block_target(const struct build *b, uint64_t entries)
{
    uint64_t target = entries / BLOCKS_A_WINDOW;
    if (target < BLOCK_MIN_ENTRIES) target = BLOCK_MIN_ENTRIES;
    if (b->opts->block_entries) target = b->opts->block_entries;
    return target;
}

/* A sink's window goes out in pieces, runs of its blocks whose varints
 * fill about one PIECES-th of what the window's entries could take at
 * most (a piece holds one block at least). */
#define PIECES 8

/* The temporary's share of a bound of `whole` bytes: all of it, or for
 * a sink, what the buffer of a window's pieces (maxlen bytes an entry
 * at most, a PIECES-th of the window at a time) leaves: esz an entry,
 * and a quarter more at most for its chains' last chunks.  Sets the
 * pieces' size. */
static uint64_t tmp_share(struct build *b, uint64_t whole)
{
    const struct tb *t = &b->t;
    if (!b->sink) return whole;
    uint64_t eighths = 8 * (t->esz + t->esz / 4) + 8 * t->maxlen / PIECES;
    uint64_t entries = whole / eighths * 8;
    b->piece_cap = entries * t->maxlen / PIECES;
    return entries * t->esz;
}

/* Entries of the source's largest group. */
static uint64_t widest_group(const struct tb *t, uint64_t groups)
{
    uint64_t widest = 0;
    for (uint64_t k = 0; k < groups; k++)
        if ((uint64_t)(t->vp[k + 1] - t->vp[k]) > widest) widest = (uint64_t)(t->vp[k + 1] - t->vp[k]);
    return widest;
}

/*
 * The temporary's bound (b->tmp_bytes, from the bound on the whole
 * build), and resuming: when the entries take more than one window, the
 * windows after the first resume each source group where the last one
 * left it (band_resume) if its places, 8 bytes a group (12 where a
 * group or the new slices pass 16 bits), take at most half the bound;
 * they come out of it.  Each window then costs its own
 * varints and a look at every group, not a decode of the whole source.
 * 0, or -1 when out of memory.
 */
static int plan_resume(struct build *b)
{
    struct tb *t = &b->t;
    uint64_t whole = b->tmp_bytes, groups = (uint64_t)t->mp[b->S];
    int ask = b->opts->resume;
    b->tmp_bytes = tmp_share(b, whole);
    if (ask < 0 || groups == 0 || b->nnz * t->esz <= b->tmp_bytes || (uint64_t)b->G >= UINT32_MAX) return 0;
    t->rs_narrow = ask != 2 && b->G <= 0xffff && widest_group(t, groups) <= 0xffff;
    uint64_t bytes = groups * (t->rs_narrow ? 2 : 3) * sizeof(uint32_t);
    if (ask == 0 && bytes > whole / 2) return 0;
    t->rs_bytes = (size_t)bytes;
    t->rs_off = big_map(t->rs_bytes);
    t->band_at = malloc((size_t)t->n_bands * sizeof *t->band_at);
    if (!t->rs_off || !t->band_at) return -1;
    t->rs_acc = t->rs_off + groups;
    t->rs_left = t->rs_narrow ? NULL : t->rs_acc + groups;
    t->resume = 1;
    if (ask == 0) b->tmp_bytes = tmp_share(b, whole - bytes);
    return 0;
}

/* The copy's stream (one mapping sized for the worst case), the
 * temporary's bound, the encode's items and the windows' per-band and
 * per-slice arrays. */
static int alloc_windows(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    int64_t nb = t->n_bands;
    if (!b->sink) {
        b->out_cap = (size_t)(b->nnz * t->maxlen + 1);
        b->out = big_map(b->out_cap);
    }
    b->tmp_bytes = b->opts->tmp_bytes;
    if (b->tmp_bytes == 0) {
        /* Four times the stream holds every entry of a count matrix (1 to
         * 2 bytes a varint, 4 an entry) in one window. */
        b->tmp_bytes = 4 * iv_stream_length(b->ds->stream);
        if (b->tmp_bytes < ((uint64_t)64 << 20)) b->tmp_bytes = (uint64_t)64 << 20;
    }
    if (plan_resume(b) < 0)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose's places", b->ds->where);
    b->want_items = (int64_t)b->threads * 8;
    t->items = calloc((size_t)b->want_items, sizeof *t->items);
    t->items_cap = t->items ? b->want_items : 0;
    t->cfirst = malloc((size_t)(nb + 1) * sizeof *t->cfirst);
    t->band_entries = malloc((size_t)nb * sizeof *t->band_entries);
    t->est_start = malloc((size_t)(b->G + 1) * sizeof *t->est_start);
    if ((!b->sink && !b->out) || !t->items || !t->cfirst || !t->band_entries || !t->est_start)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose", b->ds->where);
    t->out = b->out;
    t->chunk_asked = b->opts->chunk_entries;
    t->plain_stores = b->opts->plain_stores;
    for (int64_t k = 0; k < nb; k++)
        t->band_entries[k] = (uint64_t)(t->vp[t->mp[t->band[k + 1]]] - t->vp[t->mp[t->band[k]]]);
    return 0;
}

/* The plan's first part (see the top of this file): entry ids and
 * bands, the entry's width, and the stream and window arrays. */
static int plan_build(struct build *b, iv_err_t *err)
{
    int rc;
    if ((!b->sink && (rc = check_estimate(b, err)) < 0) || (rc = check_packing(b, err)) < 0 ||
        (rc = plan_bands(b, err)) < 0)
        return rc;
    choose_entry_width(b);
    return alloc_windows(b, err);
}

/* Entry offsets of the new slices (t->est_start) scaled to nnz from the
 * sample's counts (t->off), or spread evenly when the sample is empty. */
static void estimate_starts(struct tb *t, uint64_t nnz)
{
    int64_t G = t->n_new_major, nb = t->n_bands;
    uint64_t sampled = 0;
    t->est_start[0] = 0;
    for (int64_t g = 0; g < G; g++) {
        for (int64_t b = 0; b < nb; b++) sampled += t->off[(size_t)b * (size_t)G + (size_t)g];
        t->est_start[g + 1] = sampled;
    }
    for (int64_t g = 1; g <= G; g++)
        t->est_start[g] = sampled ? (uint64_t)((double)t->est_start[g] / (double)sampled * (double)nnz)
                         : (uint64_t)((double)g / (double)G * (double)nnz);
}

/*
 * 2, when every entry fits the temporary at once: the blocks are cut by
 * counts estimated from a sample of each band (their sizes only balance
 * the work; the copy does not depend on them), and the source is
 * decoded once, by the fill, if the chains fit the temporary too
 * (t->one_pass).
 */
static int plan_one_pass(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    iv_pool_parallel_for(b->opts->pool, (size_t)t->n_bands, 0, band_sample, t);
    if (atomic_load(&t->failed)) return pass_error(t, err);
    estimate_starts(t, b->nnz);
    t->g0 = 0;
    t->g1 = b->G;
    t->start = t->est_start;
    if (plan_blocks(t, block_target(b, b->nnz)) < 0 || plan_shares(t) < 0)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose's blocks", b->ds->where);
    t->one_pass = t->tmp_cap <= b->tmp_bytes;
    memset(t->off, 0, (size_t)t->n_bands * (size_t)(b->G ? b->G : 1) * sizeof *t->off);
    return 0;
}

/* 2, otherwise: a count pass, the exact entry offsets (b->start), and
 * the most entries a window takes: the temporary's, at least the
 * largest new slice's. */
static int count_pass(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    iv_pool_parallel_for(b->opts->pool, (size_t)t->n_bands, 0, band_count, t);
    if (atomic_load(&t->failed)) return pass_error(t, err);
    int rc = sum_counts(t, b->start, b->nnz, err);
    if (rc < 0) return rc;
    uint64_t biggest = 0;
    for (int64_t g = 0; g < b->G; g++)
        if (b->start[g + 1] - b->start[g] > biggest) biggest = b->start[g + 1] - b->start[g];
    b->win_entries = b->tmp_bytes / t->esz;
    if (b->win_entries < biggest) b->win_entries = biggest;
    if (b->win_entries > b->nnz) b->win_entries = b->nnz;
    return 0;
}

/* 2. Counts and blocks: by a sample when every entry fits the temporary
 * at once, else by a count pass (then the new slices go in windows). */
static int plan_blocks_or_count(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    int rc;
    if (b->nnz * t->esz <= b->tmp_bytes && (rc = plan_one_pass(b, err)) < 0) return rc;
    if (!t->one_pass && (rc = count_pass(b, err)) < 0) return rc;
    phase_end(&b->clock, IV_TP_COUNT);
    return 0;
}

/* The window from g0 by the exact counts: its new slices [g0, *g1), its
 * blocks and the bands' shares of the temporary. */
static int plan_window(struct build *b, int64_t g0, int64_t *g1_out, iv_err_t *err)
{
    struct tb *t = &b->t;
    const uint64_t *start = b->start;
    int64_t g1 = g0 + 1;
    while (g1 < b->G && start[g1 + 1] - start[g0] <= b->win_entries) g1++;
    t->g0 = g0;
    t->g1 = g1;
    t->start = start;
    for (int64_t k = 0; k < t->n_bands; k++) {
        const uint64_t *cnt = t->off + (size_t)k * (size_t)b->G;
        t->band_entries[k] = 0;
        for (int64_t g = g0; g < g1; g++) t->band_entries[k] += cnt[g];
    }
    if (plan_blocks(t, block_target(b, start[g1] - start[g0])) < 0 || plan_shares(t) < 0)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the transpose's blocks", b->ds->where);
    *g1_out = g1;
    return 0;
}

/* ---- the replica (see iv_transpose_opts_t.replica_dir) ---- */

/* What a plain copy of the source must have been made from (plainfile.h);
 * a source read from memory has no file, and a zero identity. */
static iv_plainfile_for_t replica_for(const struct build *b)
{
    iv_file_t *fl = iv_stream_file(b->ds->stream);
    iv_plainfile_for_t f = {.group = b->ds->group, .length = iv_stream_length(b->ds->stream)};
    if (fl) f.file = *iv_file_loaded_id(fl);
    return f;
}

/* The replica read from the plain copy at path, in the replica's chunks,
 * each read checked against the copy's kept checksums: 1 when taken. */
static int open_replica(struct build *b, const char *path)
{
    iv_plainfile_for_t f = replica_for(b);
    iv_err_t e;
    iv_err_clear(&e);
    return iv_plainfile_open(path, &f, IV_TRANSPOSE_REPLICA_CHUNK, IV_TRANSPOSE_REPLICA_CACHE, &b->t.replica,
                             NULL, &e) == 1;
}

/*
 * The source stream written out uncompressed, for the resumed fills to
 * read instead of decompressing every chunk again each window (the page
 * cache holds it where memory allows; it is not the process's).  Only
 * for a compressed chunked source whose windows resume.  The source's
 * plain copy (opts->replica_from) when it was made from this file; else
 * one written as a plain copy on the pool to an unlinked file in
 * opts->replica_dir (a build killed on the way leaves nothing).  A
 * failure to make it is not the build's: the fills then read the source.
 */
static void make_replica(struct build *b)
{
    struct tb *t = &b->t;
    const iv_dataset_info_t *in = &b->ds->info;
    if (!t->resume || !in->chunked || strncmp(in->codec, "none", 4) == 0) return;
    if (b->opts->replica_from && iv_stream_file(b->ds->stream) && open_replica(b, b->opts->replica_from)) {
        if (b->opts->replica_reused) *b->opts->replica_reused = 1;
        return;
    }
    if (!b->opts->replica_dir) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/.ivserve-transpose-XXXXXX", b->opts->replica_dir);
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return;
    unlink(path);
    iv_plainfile_for_t f = replica_for(b);
    iv_err_t e;
    iv_err_clear(&e);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (iv_plainfile_write(fd, "the transpose's replica", &f, b->ds->stream, b->opts->pool, NULL, &e) == 0 &&
        open_replica(b, path) && b->opts->replica_made)
        *b->opts->replica_made = 1;
    close(fd);
}

/* 3. Fill (skipped when the window holds nothing). */
static int fill_window(struct build *b, uint64_t wanted, iv_err_t *err)
{
    struct tb *t = &b->t;
    if (wanted > 0) {
        void (*walk)(void *, size_t) = !t->resume ? band_fill : t->recorded ? band_resume : band_fill_record;
        iv_pool_parallel_for(b->opts->pool, (size_t)t->n_bands, 0, walk, t);
        if (atomic_load(&t->failed)) return pass_error(t, err);
        if (walk == band_resume && b->opts->resumed_fills) (*b->opts->resumed_fills)++;
        /* After the recording fill, resume unless a band was too long. */
        if (t->resume && !t->recorded) {
            t->recorded = 1;
            if (atomic_load(&t->too_far)) t->resume = 0;
            make_replica(b);
        }
    }
    phase_end(&b->clock, IV_TP_FILL);
    return 0;
}

/* 4. Encode: the items, a check that the fill took the window's
 * `wanted` entries, the encode. */
static int encode_window(struct build *b, uint64_t wanted, iv_err_t *err)
{
    struct tb *t = &b->t;
    t->n_items = plan_items(t, b->want_items);
    if (t->blk_at[t->n_blk] != wanted)
        return iv_fail(err, IV_EINTERNAL, "%s: transpose filled %" PRIu64 " entries, not %" PRIu64,
                       b->ds->where, t->blk_at[t->n_blk], wanted);
    iv_pool_parallel_for(b->opts->pool, (size_t)t->n_items, 0, encode_item, t);
    if (atomic_load(&t->failed)) return pass_error(t, err);
    phase_end(&b->clock, IV_TP_ENCODE);
    return 0;
}

/* A sink's buffer for a piece of `bytes` of varints, mapped again only
 * when a piece needs more than any before it.  0, or -1 when out of memory. */
static int window_buffer(struct build *b, uint64_t bytes)
{
    struct tb *t = &b->t;
    if (!b->out || bytes + 1 > b->out_cap) {
        big_unmap(b->out, b->out_cap);
        b->out_cap = (size_t)bytes + 1;
        b->out = big_map(b->out_cap);
        if (!b->out) b->out_cap = 0;
    }
    t->out = b->out;
    return b->out ? 0 : -1;
}

/* Place: the window's new slices' byte offsets and, in memory, their
 * varints moved to the copy's stream (a sink's go piece by piece, see
 * sink_pieces). */
static void place_window(struct build *b, int64_t g0, int64_t g1)
{
    struct tb *t = &b->t;
    for (int64_t g = g0; g < g1; g++) t->byte_at[g + 1] = t->byte_at[g] + t->nbytes[g];
    if (!b->sink) iv_pool_parallel_for(b->opts->pool, (size_t)t->n_items, 0, move_item, t);
    phase_end(&b->clock, IV_TP_MOVE);
}

/* Room for `need` groups of the copy.  0, or -1 when out of memory. */
static int grow_groups(struct build *b, size_t need)
{
    if (need <= b->cap_groups) return 0;
    size_t cap = b->cap_groups ? b->cap_groups : 4096;
    while (cap < need) cap *= 2;
    uint32_t *nl = realloc(b->vlist, cap * sizeof *nl);
    if (nl) b->vlist = nl;
    uint64_t *ns = realloc(b->vsize, cap * sizeof *ns);
    if (ns) b->vsize = ns;
    if (!nl || !ns) return -1;
    b->cap_groups = cap;
    return 0;
}

/* The window's groups of the copy (each item's, items in order) added
 * to the copy's. */
static int gather_groups(struct build *b, iv_err_t *err)
{
    const struct tb *t = &b->t;
    for (int64_t k = 0; k < t->n_items; k++) {
        const struct item *it = &t->items[k];
        size_t ng = it->n_grp / 2;
        if (grow_groups(b, b->n_groups + ng) < 0)
            return iv_fail(err, IV_ENOMEM, "%s: out of memory for the copy's groups", b->ds->where);
        for (size_t x = 0; x < ng; x++) {
            b->vlist[b->n_groups + x] = it->grp[2 * x];
            b->vsize[b->n_groups + x] = it->grp[2 * x + 1];
        }
        b->n_groups += ng;
    }
    return 0;
}

/* A sink's piece [ga, gb) of the window handed over: its varints (in
 * b->out), per-slice lengths and groups (the window's from group gat,
 * ng of them), the groups' values taken from their ids; kb its end
 * block. */
static int sink_piece(struct build *b, int64_t ga, int64_t gb, size_t gat, size_t ng, int64_t kb,
                      iv_err_t *err)
{
    const struct tb *t = &b->t;
    size_t need = (ng ? ng : 1) * b->vsz;
    if (need > b->wvals_cap) {
        uint8_t *nv = realloc(b->wvals, need);
        if (!nv) return iv_fail(err, IV_ENOMEM, "%s: out of memory for a window's values", b->ds->where);
        b->wvals = nv;
        b->wvals_cap = need;
    }
    for (size_t k = 0; k < ng; k++) memcpy(b->wvals + k * b->vsz, &b->distinct[b->vlist[gat + k]], b->vsz);
    iv_transpose_window_t w = {
        .g0 = ga, .g1 = gb, .bytes = b->out, .n_bytes = t->byte_at[gb] - t->byte_at[ga],
        .slice_bytes = t->nbytes + ga, .slice_groups = t->ngrp + ga, .values = b->wvals,
        .group_sizes = b->vsize + gat, .n_groups = ng,
        .entries_done = (t->one_pass ? 0 : b->start[t->g0]) + t->blk_at[kb], .nnz = b->nnz,
        .count_pass = !t->one_pass, .window = b->windows,
    };
    return b->sink->window(b->sink->ctx, &w, err);
}

/*
 * A sink's window, piece by piece: each a run of blocks whose varints
 * take at most b->piece_cap bytes (one block at least, however many),
 * moved to the pieces' buffer (sized for the largest piece so far) and
 * handed over, so that the window's varints are never held whole.
 */
static int sink_pieces(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    size_t gat = 0;
    for (int64_t k0 = 0, k1; k0 < t->n_blk; k0 = k1) {
        uint64_t base = t->byte_at[t->blk[k0]];
        for (k1 = k0 + 1; k1 < t->n_blk && t->byte_at[t->blk[k1 + 1]] - base <= b->piece_cap; k1++) {}
        int64_t ga = t->blk[k0], gb = t->blk[k1];
        if (window_buffer(b, t->byte_at[gb] - base) < 0)
            return iv_fail(err, IV_ENOMEM, "%s: out of memory for a window of the transpose", b->ds->where);
        t->out_at = base;
        t->mv_k0 = k0;
        iv_pool_parallel_for(b->opts->pool, (size_t)(k1 - k0), 0, move_block, t);
        size_t ng = 0;
        for (int64_t g = ga; g < gb; g++) ng += t->ngrp[g];
        int rc = sink_piece(b, ga, gb, gat, ng, k1, err);
        if (rc < 0) return rc;
        gat += ng;
    }
    return 0;
}

/* Steps 3 and 4 for the window from g0 (all new slices in one pass):
 * fill, encode, place, and its groups gathered (a sink's: handed over
 * with the window); *g1 its end. */
static int run_window(struct build *b, int64_t g0, int64_t *g1, iv_err_t *err)
{
    const struct tb *t = &b->t;
    int rc;
    *g1 = b->G;
    if (!t->one_pass && (rc = plan_window(b, g0, g1, err)) < 0) return rc;
    uint64_t wanted = t->one_pass ? b->nnz : b->start[*g1] - b->start[g0];
    b->windows++;
    if ((rc = fill_window(b, wanted, err)) < 0 || (rc = encode_window(b, wanted, err)) < 0) return rc;
    place_window(b, g0, *g1);
    if (b->sink) b->n_groups = 0;
    if ((rc = gather_groups(b, err)) < 0) return rc;
    return b->sink ? sink_pieces(b, err) : 0;
}

/* Steps 3 and 4, window by window; then the temporary and the counters
 * are given back. */
static int run_windows(struct build *b, iv_err_t *err)
{
    struct tb *t = &b->t;
    int rc;
    t->byte_at[0] = 0;
    for (int64_t g0 = 0, g1 = 0; g0 < b->G; g0 = g1)
        if ((rc = run_window(b, g0, &g1, err)) < 0) return rc;
    big_unmap(t->tmp, t->tmp_cap);
    t->tmp = NULL;
    free(t->off);
    t->off = NULL;
    b->len = t->byte_at[b->G];
    return 0;
}

/* The exact size, against both budgets (the global one charged), and
 * the tail of the stream's mapping past its length handed back. */
static int check_exact_size(struct build *b, iv_err_t *err)
{
    const iv_transpose_opts_t *opts = b->opts;
    int64_t G = b->G;
    b->n_ckpt = G == 0 ? 0 : (uint64_t)(G - 1) / b->stride + 1;
    b->bytes = b->len + (uint64_t)(G + 1) * 8 + (uint64_t)(b->n_groups + 1) * 8 + (uint64_t)b->n_groups * b->vsz +
               b->n_ckpt * 8;
    if (b->bytes > opts->budget)
        return iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation takes %" PRIu64
                       " bytes; the budget allows %" PRIu64, b->ds->where, b->bytes, opts->budget);
    if (opts->global) {
        if (iv_budget_take(opts->global, b->bytes) < 0)
            return iv_fail(err, IV_ETOO_LARGE, "%s: the other orientation takes %" PRIu64
                           " bytes; the global transpose budget has %" PRIu64 " left", b->ds->where,
                           b->bytes, (uint64_t)atomic_load(&opts->global->left));
        b->took_global = 1;
    }
    size_t keep = big_len((size_t)b->len), cap = big_len(b->out_cap);
    if (keep < cap) munmap(b->out + keep, cap - keep);
    b->out_cap = (size_t)b->len;
    return 0;
}

/* The copy's names, flags and shape: the source's, turned around. */
static void copy_header(const struct build *b, iv_dataset_t *c)
{
    const iv_dataset_t *ds = b->ds;
    const iv_h5matrix_t *m = b->m;
    snprintf(c->path, sizeof c->path, "%s", ds->path);
    snprintf(c->group, sizeof c->group, "%s", ds->group);
    snprintf(c->where, sizeof c->where, "%.4300s (%s copy in memory)", ds->where,
             m->orient == IV_IVCSR ? "gene-major" : "cell-major");
    c->is_copy = 1;
    atomic_init(&c->other, NULL);
    atomic_init(&c->nnz_at, NULL);
    atomic_init(&c->plain, NULL);
    atomic_init(&c->plain_dropped, 0);
    atomic_init(&c->other_state, IV_OTHER_NONE);
    iv_h5matrix_t *cm = &c->m;
    cm->orient = m->orient == IV_IVCSR ? IV_IVCSC : IV_IVCSR;
    cm->n_rows = m->n_rows;
    cm->n_cols = m->n_cols;
    cm->n_major = b->G;
    cm->n_minor = b->S;
    cm->nnz = m->nnz;
    cm->n_unique = (int64_t)b->n_groups;
    cm->value_dtype = m->value_dtype;
    cm->indices_dtype = m->indices_dtype;
    snprintf(cm->codec, sizeof cm->codec, "none (in memory)");
    c->ri.stride = b->stride;
    c->ri.n_ckpt = b->n_ckpt;
}

/* The copy's major_ptr, value_ptr, values and row-index checkpoints. */
static int copy_pointers(const struct build *b, iv_dataset_t *c, iv_err_t *err)
{
    const struct tb *t = &b->t;
    iv_h5matrix_t *cm = &c->m;
    size_t n_groups = b->n_groups, vsz = b->vsz;
    cm->major_ptr = malloc((size_t)(b->G + 1) * sizeof *cm->major_ptr);
    cm->value_ptr = malloc((n_groups + 1) * sizeof *cm->value_ptr);
    cm->values = malloc((n_groups ? n_groups : 1) * vsz);
    c->ri.off = malloc((size_t)(b->n_ckpt ? b->n_ckpt : 1) * sizeof *c->ri.off);
    if (!cm->major_ptr || !cm->value_ptr || !cm->values || !c->ri.off)
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the copy's pointers", b->ds->where);
    cm->major_ptr[0] = 0;
    for (int64_t g = 0; g < b->G; g++) cm->major_ptr[g + 1] = cm->major_ptr[g] + t->ngrp[g];
    cm->value_ptr[0] = 0;
    for (size_t k = 0; k < n_groups; k++) {
        cm->value_ptr[k + 1] = cm->value_ptr[k] + (int64_t)b->vsize[k];
        memcpy((char *)cm->values + k * vsz, &b->distinct[b->vlist[k]], vsz);
    }
    for (uint64_t j = 0; j < b->n_ckpt; j++) c->ri.off[j] = t->byte_at[j * b->stride];
    return 0;
}

/* The copy's stream over the build's mapping, which it owns from here
 * on, also on failure. */
static int copy_stream(struct build *b, iv_dataset_t *c, iv_err_t *err)
{
    char label[sizeof c->where + 32];
    snprintf(label, sizeof label, "%s/packed_indices", c->where);
    iv_stream_desc_t desc = {.length = b->len, .chunked = 0, .contig = b->out, .owned_map = b->out,
                             .owned_map_len = big_len(b->out_cap), .label = label};
    b->out = NULL;
    return iv_stream_create(&desc, 0, &c->stream, err);
}

/* The copy's dataset info. */
static void copy_info(const struct build *b, iv_dataset_t *c)
{
    const iv_h5matrix_t *cm = &c->m;
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
    in->stream_bytes = b->len;
    in->stored_bytes = 0;
    in->n_chunks = iv_stream_n_chunks(c->stream);
    in->chunk_len = iv_stream_chunk_len(c->stream);
    in->index_stride = b->stride;
    in->index_bytes = iv_rowindex_bytes(&c->ri);
    in->open_seconds = iv_now_s() - b->clock.t0;
}

/* The copy as a dataset (b->c). */
static int make_copy(struct build *b, iv_err_t *err)
{
    iv_dataset_t *c = b->c = calloc(1, sizeof *c);
    if (!c) return iv_fail(err, IV_ENOMEM, "%s: out of memory", b->ds->where);
    copy_header(b, c);
    int rc;
    if ((rc = copy_pointers(b, c, err)) < 0 || (rc = copy_stream(b, c, err)) < 0) return rc;
    copy_info(b, c);
    return 0;
}

/* The build's phase times, to the caller's arrays when it asked. */
static void report_phases(const struct build *b)
{
    const iv_transpose_opts_t *opts = b->opts;
    if (opts->phase_seconds) memcpy(opts->phase_seconds, b->clock.wall, sizeof b->clock.wall);
    if (opts->phase_cpu_seconds) memcpy(opts->phase_cpu_seconds, b->clock.cpu, sizeof b->clock.cpu);
}

/* Publishes the copy on the source, with the budget it is charged to and
 * the build's times. */
static void publish_copy(struct build *b)
{
    iv_dataset_t *ds = b->ds;
    const iv_transpose_opts_t *opts = b->opts;
    report_phases(b);
    if (b->took_global) {
        ds->other_budget = opts->global;
        ds->other_charged = b->bytes;
    }
    ds->other_source = IV_SRC_MEMORY;
    ds->other_seconds = iv_now_s() - b->clock.t0;
    atomic_store_explicit(&ds->other, b->c, memory_order_release);
    iv_dataset_set_other_state(ds, IV_OTHER_READY);
}

int iv_dataset_build_other(iv_dataset_t *ds, const iv_transpose_opts_t *opts, iv_err_t *err)
{
    if (iv_dataset_other(ds) || ds->is_copy)
        return iv_fail(err, IV_EINVALID_ARG, "%s: the other orientation exists already", ds->where);
    iv_dataset_set_other_state(ds, IV_OTHER_BUILDING);
    struct build b;
    build_init(&b, ds, opts);
    int rc;
    if ((rc = number_values(&b, err)) < 0 || (rc = plan_build(&b, err)) < 0 ||
        (rc = plan_blocks_or_count(&b, err)) < 0 || (rc = run_windows(&b, err)) < 0 ||
        (rc = check_exact_size(&b, err)) < 0 || (rc = make_copy(&b, err)) < 0) {
        build_free(&b, rc);
        iv_dataset_set_other_state(ds, rc == IV_ETOO_LARGE ? IV_OTHER_SKIPPED : IV_OTHER_FAILED);
        return rc;
    }
    build_free(&b, 0);
    phase_end(&b.clock, IV_TP_FINISH);
    publish_copy(&b);
    return 0;
}

int iv_transpose_to_sink(iv_dataset_t *ds, const iv_transpose_opts_t *opts, const iv_transpose_sink_t *sink,
                         iv_err_t *err)
{
    struct build b;
    build_init(&b, ds, opts);
    b.sink = sink;
    int rc;
    if ((rc = number_values(&b, err)) == 0 && (rc = plan_build(&b, err)) == 0 &&
        (rc = plan_blocks_or_count(&b, err)) == 0 && (rc = run_windows(&b, err)) == 0) {
        phase_end(&b.clock, IV_TP_FINISH);
        report_phases(&b);
    }
    build_free(&b, rc);
    return rc;
}
