/*
 * Row-index build pass (see rowindex.h).
 *
 * The stream is processed in one parallel pass over its chunks, in windows
 * of at most WINDOW_CHUNKS chunks (to bound the per-chunk state).  Each
 * chunk is one task, and tasks are claimed in increasing order (see
 * iv_pool_parallel_for).  A task:
 *  1. decompresses its chunk (pinned in the cache) and counts terminators;
 *  2. waits until the previous chunk has published the rank after it and
 *     the bytes of a varint left open at its end, then publishes its own:
 *     the ranks form a chain along the stream, and the oldest task in
 *     flight never waits, so the chain always moves;
 *  3. decodes the varints that END in the chunk (the first one completed
 *     with the carried bytes), walks the value groups those ranks belong
 *     to, checks every group's running index against n_minor and records
 *     checkpoint offsets, while the chunk is still in the core's cache.
 *  4. checks that no slice lists a minor index twice (see dup_check).
 * After a window, group sums that span chunk boundaries are joined and
 * checked, in order.  Decoding in step 3 is what makes the "no index >=
 * n_minor" check exact.  Only each group's sum of d + 1 is needed (its
 * last index + 1), so the chunk is walked 32 bytes at a time with byte
 * masks (iv_varint_walk3), which reports the running sum where each group
 * ends and the offset of each checkpoint; varints are never decoded one by
 * one, except those over 3 bytes and those split across chunks.
 *
 * Errors are kept per position: when several chunks fail, the one nearest
 * the start of the stream is reported, whatever the thread timing.
 */
#include "rowindex.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cursor.h"
#include "varint.h"

/* Chunks per window: bounds the state below (about 100 bytes a chunk). */
#define WINDOW_CHUNKS 4096

struct chunk_state {
    /* Published by the chunk's task (ready = 1, release) for the next one. */
    uint64_t rank_after;   /* varints that end in this chunk or before it */
    uint8_t carry[IV_VARINT_MAX];
    uint8_t carry_len;     /* bytes of a varint still open after this chunk */
    atomic_int ready;
    /* Read by the join after the window. */
    uint64_t count;        /* terminators in the chunk */
    int head_open;         /* first group started before this chunk */
    int head_closed;
    uint64_t head_acc, tail_acc;
    int tail_open;         /* a group started here is still open at the end */
};

struct build {
    const iv_rowindex_src_t *src;
    iv_rowindex_t *ri;
    uint64_t c0;           /* first chunk of the window */
    uint64_t rank0;        /* varints before the window */
    uint8_t carry0[IV_VARINT_MAX];
    uint8_t carry0_len;
    struct chunk_state *cs;
    pthread_mutex_t mu;
    atomic_uint_fast64_t fail_at;   /* lowest chunk with an error; UINT64_MAX: none */
    iv_err_t err;
    struct seen *spare;    /* step 4's bitmaps not in use (under mu) */
};

/*
 * Step 4's bitmap of the minor indices one slice has listed so far, one
 * per task at a time, kept between tasks: all bits are clear between
 * slices.  The bits a slice set are cleared one by one from `set` (only
 * while they are fewer than the bitmap's words; past that, the whole
 * bitmap), so a slice costs what it lists, not n_minor.
 */
struct seen {
    struct seen *next;
    uint64_t n_words;
    uint64_t *set;         /* up to n_words indices set by the current slice */
    uint64_t n_set;
    uint64_t bits[];
};

static void set_error(struct build *b, uint64_t c, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_error(struct build *b, uint64_t c, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&b->mu);
    if (c < atomic_load(&b->fail_at)) {
        atomic_store(&b->fail_at, c);
        va_list ap;
        va_start(ap, fmt);
        iv_vfail(&b->err, code, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&b->mu);
}

/* A chunk after the first failure has nothing left to tell. */
static inline int skip_chunk(struct build *b, uint64_t c)
{
    return atomic_load_explicit(&b->fail_at, memory_order_relaxed) < c;
}

static void wait_ready(const struct chunk_state *st)
{
    for (unsigned spins = 0; !atomic_load_explicit(&st->ready, memory_order_acquire); spins++) {
        if (spins < 1024) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* Rank of the first varint of checkpoint j's slice; UINT64_MAX past the last. */
static inline uint64_t ckpt_rank(const struct build *b, uint64_t j)
{
    if (j >= b->ri->n_ckpt) return UINT64_MAX;
    return (uint64_t)b->src->value_ptr[b->src->major_ptr[j * b->ri->stride]];
}

/* First checkpoint j whose slice starts at rank >= r. */
static uint64_t first_ckpt_at(const struct build *b, uint64_t r)
{
    uint64_t lo = 0, hi = b->ri->n_ckpt;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ckpt_rank(b, mid) < r) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Marks handed to one walk call. */
#define WALK_BATCH 256

/* Decodes the varint at w->p one by one, with every check, and steps over
 * it.  pend/pend_len: bytes of it that earlier chunks carried (w->p is
 * then the chunk's start).  Returns -1 after recording an error. */
static int slow_step(struct build *b, uint64_t c, uint64_t chunk_start, const uint8_t *data,
                     const uint8_t *end, iv_varint_walk_t *w, const uint8_t *pend, size_t pend_len)
{
    const iv_rowindex_src_t *src = b->src;
    uint64_t n_minor = (uint64_t)src->n_minor;
    uint64_t at = chunk_start + (uint64_t)(w->p - data) - pend_len;
    uint64_t d;
    size_t used;
    if (pend_len) {
        uint8_t tmp[2 * IV_VARINT_MAX];
        size_t n = pend_len, t = 0;
        memcpy(tmp, pend, n);
        while (n < sizeof tmp && w->p + t < end) {
            tmp[n++] = w->p[t];
            if (w->p[t++] < 0x80) break;
        }
        used = iv_varint_read_slow(tmp, tmp + n, &d) == n ? t : 0;
    } else {
        used = iv_varint_read_slow(w->p, end, &d);
    }
    if (used == 0) {
        set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: malformed varint (over 64 bits) at "
                  "stream offset %" PRIu64, src->where, at);
        return -1;
    }
    if (d >= n_minor) {
        set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: varint at stream offset %" PRIu64
                  " gives an index >= n_minor (%" PRIu64 ")", src->where, at, n_minor);
        return -1;
    }
    /* d < n_minor keeps each step small; the bound keeps the sums exact
     * (a walk call adds at most 2^21 a varint). */
    if (w->sum + d + 1 > ((uint64_t)1 << 62)) {
        set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: index sums overflow near stream offset %"
                  PRIu64, src->where, at);
        return -1;
    }
    w->p += used;
    w->n++;
    w->sum += d + 1;
    return 0;
}

/* Step 3's walk through one chunk (see decode_chunk). */
struct chunk_walk {
    struct build *b;
    struct chunk_state *st;
    uint64_t c, chunk_start;
    const uint8_t *data, *end;
    iv_varint_walk_t w;
    int64_t x;                /* the next group end to reach (a value_ptr entry) */
    uint64_t gsum, grank;     /* where the current group started in this chunk */
    int in_head;              /* still in the group open from an earlier chunk */
};

/* Group containing `rank`: last g with vp[g] <= rank (skipping empty
 * groups); then *x, the next group end, and *x_end, the last <= stop;
 * *head_open when that group started before `rank`. */
static void group_span(const iv_rowindex_src_t *src, uint64_t rank, uint64_t stop, int64_t *x,
                       int64_t *x_end, int *head_open)
{
    const int64_t *vp = src->value_ptr;
    int64_t lo = 0, hi = src->n_unique;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)vp[mid + 1] <= rank) lo = mid + 1;
        else hi = mid;
    }
    *x = lo + 1;
    *head_open = (uint64_t)vp[lo] < rank;
    lo = *x, hi = src->n_unique + 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)vp[mid] <= stop) lo = mid + 1;
        else hi = mid;
    }
    *x_end = lo - 1;
}

/* The sums where r groups from k->x on end: each group's sum of d + 1 is
 * its last index + 1; a head group's part here is checked too, and whole
 * in the join.  Returns -1 after recording an error. */
static int take_group_ends(struct chunk_walk *k, const uint64_t *sum_at, size_t r)
{
    uint64_t n_minor = (uint64_t)k->b->src->n_minor;
    for (size_t t = 0; t < r; t++) {
        if (sum_at[t] - k->gsum > n_minor) {
            set_error(k->b, k->c, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64
                      " holds an index >= n_minor (%" PRIu64 ")", k->b->src->where,
                      k->x + (int64_t)t - 1, n_minor);
            return -1;
        }
        if (k->in_head) {
            k->st->head_acc = sum_at[t] - k->gsum;
            k->st->head_closed = 1;
            k->in_head = 0;
        }
        k->gsum = sum_at[t];
    }
    return 0;
}

/* Walks the group ends up to x_seg, WALK_BATCH marks a call, stepping
 * the slow way over varints the walk leaves.  -1 after an error. */
static int walk_groups(struct chunk_walk *k, int64_t x_seg)
{
    const uint64_t *marks = (const uint64_t *)(const void *)k->b->src->value_ptr;   /* validated >= 0 */
    uint64_t sum_at[WALK_BATCH];
    const uint8_t *p_at[WALK_BATCH];
    while (k->x <= x_seg) {
        size_t r = 0, n = (size_t)(x_seg - k->x + 1);
        if (n > WALK_BATCH) n = WALK_BATCH;
        if (marks[k->x] == k->w.n) {
            sum_at[0] = k->w.sum;          /* reached already */
            r = n = 1;
        } else {
            r = iv_varint_walk3(&k->w, k->end, marks + k->x, n, sum_at, p_at);
        }
        if (take_group_ends(k, sum_at, r) < 0) return -1;
        if (r > 0) k->grank = marks[k->x + (int64_t)r - 1];
        k->x += (int64_t)r;
        if (r < n && slow_step(k->b, k->c, k->chunk_start, k->data, k->end, &k->w, NULL, 0) < 0)
            return -1;
    }
    return 0;
}

/* Walks on to rank target (a checkpoint's, or the chunk's end). */
static int walk_to_rank(struct chunk_walk *k, uint64_t target)
{
    while (k->w.n < target) {
        uint64_t s1;
        const uint8_t *p1;
        if (iv_varint_walk3(&k->w, k->end, &target, 1, &s1, &p1) == 0 &&
            slow_step(k->b, k->c, k->chunk_start, k->data, k->end, &k->w, NULL, 0) < 0)
            return -1;
    }
    return 0;
}

/* The chunk's end: the group still open here, checked so far and left
 * for the join as the head's part or the tail's. */
static void close_chunk(struct chunk_walk *k)
{
    uint64_t n_minor = (uint64_t)k->b->src->n_minor;
    struct chunk_state *st = k->st;
    if (k->w.sum - k->gsum > n_minor) {
        set_error(k->b, k->c, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an "
                  "index >= n_minor (%" PRIu64 ")", k->b->src->where, k->x - 1, n_minor);
        return;
    }
    if (k->in_head) {
        st->head_acc = k->w.sum - k->gsum;
        st->head_closed = 0;
    } else if (k->w.n > k->grank) {
        st->tail_open = 1;
        st->tail_acc = k->w.sum - k->gsum;
    }
}

/*
 * Step 3 for chunk c: the varints of ranks [rank, stop) end in data[0, len);
 * pend holds the bytes of the first one that earlier chunks carried.
 *
 * The walk's marks are value_ptr itself: entry x is the rank where group
 * x - 1 ends (empty groups repeat a mark and sum to 0).  The walk runs in
 * segments that end at each checkpoint's rank, whose byte offset it gives,
 * and at `stop`.
 */
static void decode_chunk(struct build *b, struct chunk_state *st, uint64_t c, const uint8_t *data,
                         size_t len, uint64_t rank, uint64_t stop, const uint8_t *pend,
                         size_t pend_len)
{
    const iv_rowindex_src_t *src = b->src;
    struct chunk_walk k = {.b = b, .st = st, .c = c, .chunk_start = c * iv_stream_chunk_len(src->s),
                           .data = data, .end = data + len, .w = {.p = data, .n = rank, .sum = 0},
                           .grank = rank};
    int64_t x_end;
    group_span(src, rank, stop, &k.x, &x_end, &st->head_open);
    k.in_head = st->head_open;
    uint64_t j = first_ckpt_at(b, rank);
    if (pend_len) {
        /* Checkpoints at the carried varint (several when slices before
         * it are empty) start in the earlier chunk. */
        while (ckpt_rank(b, j) == rank) b->ri->off[j++] = k.chunk_start - pend_len;
        if (slow_step(b, c, k.chunk_start, data, k.end, &k.w, pend, pend_len) < 0) return;
    }
    for (;;) {
        uint64_t ck = ckpt_rank(b, j);
        uint64_t target = ck < stop ? ck : stop;
        /* Group ends up to the target: value_ptr[major_ptr[slice]] is the
         * checkpoint's rank, so they are the entries up to major_ptr's. */
        int64_t x_seg = ck < stop ? src->major_ptr[j * b->ri->stride] : x_end;
        if (walk_groups(&k, x_seg) < 0 || walk_to_rank(&k, target) < 0) return;
        if (target != ck || ck >= stop) break;
        b->ri->off[j++] = k.chunk_start + (uint64_t)(k.w.p - data);
    }
    close_chunk(&k);
}

static struct seen *seen_take(struct build *b)
{
    pthread_mutex_lock(&b->mu);
    struct seen *m = b->spare;
    if (m) b->spare = m->next;
    pthread_mutex_unlock(&b->mu);
    if (m) return m;
    uint64_t words = ((uint64_t)b->src->n_minor + 63) / 64;
    if (words == 0) words = 1;
    if (words > (SIZE_MAX - sizeof *m) / 16) return NULL;
    m = calloc(1, sizeof *m + (size_t)words * sizeof(uint64_t));
    if (m && !(m->set = malloc((size_t)words * sizeof(uint64_t)))) {
        free(m);
        m = NULL;
    }
    if (m) m->n_words = words;
    return m;
}

static void seen_give(struct build *b, struct seen *m)
{
    pthread_mutex_lock(&b->mu);
    m->next = b->spare;
    b->spare = m;
    pthread_mutex_unlock(&b->mu);
}

static void seen_clear(struct seen *m)
{
    if (m->n_set <= m->n_words) {
        for (uint64_t i = 0; i < m->n_set; i++) m->bits[m->set[i] >> 6] = 0;
    } else {
        memset(m->bits, 0, (size_t)m->n_words * sizeof(uint64_t));
    }
    m->n_set = 0;
}

/* First slice that starts at rank >= `rank`. */
static int64_t first_slice_at(const iv_rowindex_src_t *src, uint64_t rank)
{
    const int64_t *mp = src->major_ptr, *vp = src->value_ptr;
    int64_t lo = 0, hi = src->n_major;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)vp[mp[mid]] < rank) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Whether groups [g0, g1) hold something in two of them or more. */
static int two_groups_filled(const int64_t *vp, int64_t g0, int64_t g1)
{
    int groups = 0;
    for (int64_t g = g0; g < g1 && groups < 2; g++) groups += vp[g + 1] > vp[g];
    return groups >= 2;
}

/*
 * Slice sl's indices set in m's bitmap, the cursor at its first varint:
 * 1 when none repeats, 0 when one does (recorded) or a varint is bad
 * (left to its chunk's task).  Varints of one or two bytes straight from
 * the pinned chunk, with the cursor's position in a register; the longer
 * ones and the chunk's end through the cursor.  The bitmap is left for
 * the caller to clear.
 */
static int check_slice(struct build *b, uint64_t c, int64_t sl, struct seen *m, iv_cursor_t *cur,
                       iv_err_t *e)
{
    const iv_rowindex_src_t *src = b->src;
    const int64_t *mp = src->major_ptr, *vp = src->value_ptr;
    uint64_t n_minor = (uint64_t)src->n_minor;
    uint64_t *bits = m->bits, n_set = m->n_set;
    const uint8_t *p = cur->p;
    const uint8_t *lim = cur->end - cur->p < IV_VARINT_MAX ? cur->p : cur->end - IV_VARINT_MAX;
    int ok = 1;
    for (int64_t g = mp[sl]; ok && g < mp[sl + 1]; g++) {
        uint64_t idx = UINT64_MAX;   /* + 1 + d wraps to d for the first */
        for (int64_t k = vp[g], k_end = vp[g + 1]; k < k_end; k++) {
            uint64_t d;
            if (p < lim && p[0] < 0x80) {
                d = p[0];
                p++;
            } else if (p < lim && p[1] < 0x80) {
                d = (uint64_t)(p[0] & 0x7f) | (uint64_t)p[1] << 7;
                p += 2;
            } else {
                cur->p = p;
                if (iv_cursor_read(cur, &d, e) < 0) {
                    ok = 0;
                    break;
                }
                p = cur->p;
                lim = cur->end - cur->p < IV_VARINT_MAX ? cur->p : cur->end - IV_VARINT_MAX;
            }
            idx += 1 + d;
            if (d >= n_minor || idx >= n_minor) {
                ok = 0;
                break;
            }
            uint64_t *w = &bits[idx >> 6], bit = (uint64_t)1 << (idx & 63);
            if (*w & bit) {
                set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: slice %" PRId64 " stores "
                          "minor index %" PRIu64 " twice (in two value groups)", src->where,
                          sl, idx);
                ok = 0;
                break;
            }
            *w |= bit;
            if (n_set < m->n_words) m->set[n_set] = idx;
            n_set++;
        }
    }
    cur->p = p;
    m->n_set = n_set;
    return ok;
}

/*
 * Step 4 for chunk c: the slices whose first varint ends in the chunk
 * (ranks [rank, stop)), read on through later chunks with a cursor when a
 * slice goes on past the chunk's end.  Within a group indices rise by
 * construction (each is the last one + 1 + d), so a minor index listed
 * twice is in two groups of the slice: each index of a slice of two
 * groups or more is set in a bitmap, and one already set is the error.
 * A slice of one group is skipped.  Whatever else is wrong (a varint
 * that is malformed, or past n_minor, in a later chunk) is left to the
 * task of the chunk it is in, which reports it: this step just stops.
 */
static void dup_check(struct build *b, uint64_t c, uint64_t rank, uint64_t stop, size_t pend_len)
{
    const iv_rowindex_src_t *src = b->src;
    const int64_t *mp = src->major_ptr, *vp = src->value_ptr;
    int64_t sl = first_slice_at(src, rank);
    if (sl >= src->n_major || (uint64_t)vp[mp[sl]] >= stop) return;
    struct seen *m = seen_take(b);
    if (!m) {
        set_error(b, c, IV_ENOMEM, "%s: out of memory for the row index", src->where);
        return;
    }
    iv_cursor_t cur;
    iv_cursor_init(&cur, src->s);
    iv_err_t e = {0};
    uint64_t at = rank;   /* the cursor's rank */
    int ok = iv_cursor_seek(&cur, c * iv_stream_chunk_len(src->s) - pend_len, &e) == 0;
    for (; ok && sl < src->n_major && (uint64_t)vp[mp[sl]] < stop; sl++) {
        /* Groups that hold something; a slice of fewer than two is skipped. */
        if (!two_groups_filled(vp, mp[sl], mp[sl + 1])) continue;
        uint64_t first = (uint64_t)vp[mp[sl]];
        ok = iv_cursor_skip(&cur, first - at, &e) == 0;
        at = first;
        if (ok) {
            ok = check_slice(b, c, sl, m, &cur, &e);
            at = (uint64_t)vp[mp[sl + 1]];
        }
        seen_clear(m);
    }
    iv_cursor_done(&cur);
    seen_clear(m);
    seen_give(b, m);
}

/* Step 1: chunk c decompressed and pinned (0 when skipped or failed). */
static int acquire_chunk(struct build *b, uint64_t c, const uint8_t **data, size_t *len)
{
    if (skip_chunk(b, c)) return 0;
    iv_err_t e = {0};
    if (iv_stream_acquire(b->src->s, c, data, len, NULL, &e) < 0) {
        set_error(b, c, e.code, "%s", e.msg);
        return 0;
    }
    return 1;
}

/* Step 2's input: the rank at task i's chunk and the bytes carried into
 * it, from the window's start or once the previous task published them. */
static uint64_t carried_in(struct build *b, size_t i, uint8_t *pend, size_t *pend_len)
{
    if (i == 0) {
        *pend_len = b->carry0_len;
        memcpy(pend, b->carry0, *pend_len);
        return b->rank0;
    }
    const struct chunk_state *prev = &b->cs[i - 1];
    wait_ready(prev);
    *pend_len = prev->carry_len;
    memcpy(pend, prev->carry, *pend_len);
    return prev->rank_after;
}

/* Step 2's output: the bytes of a varint left open at the chunk's end
 * (with those carried in, when no varint ends in it), for the next task. */
static void carry_out(struct build *b, struct chunk_state *st, uint64_t c, const uint8_t *data,
                      size_t len, const uint8_t *pend, size_t pend_len)
{
    const iv_rowindex_src_t *src = b->src;
    if (st->rank_after > (uint64_t)src->nnz) {
        set_error(b, c, IV_EBAD_FILE, "%s/packed_indices holds more varints than value_ptr's "
                  "nnz (%" PRId64 ")", src->where, src->nnz);
    } else if (st->count > 0) {
        size_t t = 0;
        while (t < len && t <= IV_VARINT_MAX && data[len - 1 - t] >= 0x80) t++;
        if (t > IV_VARINT_MAX) {
            set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: varint longer than 10 bytes at "
                      "the end of chunk %" PRIu64, src->where, c);
        } else {
            memcpy(st->carry, data + len - t, t);
            st->carry_len = (uint8_t)t;
        }
    } else if (pend_len + len > IV_VARINT_MAX) {
        set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: varint longer than 10 bytes "
                  "through chunk %" PRIu64, src->where, c);
    } else {
        memcpy(st->carry, pend, pend_len);
        memcpy(st->carry + pend_len, data, len);
        st->carry_len = (uint8_t)(pend_len + len);
    }
}

/* One chunk: steps 1 to 4 of the pass. */
static void step_chunk(void *arg, size_t i)
{
    struct build *b = arg;
    struct chunk_state *st = &b->cs[i];
    uint64_t c = b->c0 + i;
    const uint8_t *data = NULL;
    size_t len = 0;
    int have = acquire_chunk(b, c, &data, &len);
    uint64_t count = have ? iv_varint_count_ends(data, len) : 0;

    /* Step 2: the chain of ranks and carried bytes. */
    uint8_t pend[IV_VARINT_MAX];
    size_t pend_len;
    uint64_t rank = carried_in(b, i, pend, &pend_len);
    st->count = count;
    st->rank_after = rank + count;
    st->carry_len = 0;
    if (have && !skip_chunk(b, c)) carry_out(b, st, c, data, len, pend, pend_len);
    atomic_store_explicit(&st->ready, 1, memory_order_release);

    if (have && count > 0 && !skip_chunk(b, c))
        decode_chunk(b, st, c, data, len, rank, st->rank_after, pend, pend_len);
    if (have && count > 0 && !skip_chunk(b, c)) dup_check(b, c, rank, st->rank_after, pend_len);
    if (have) iv_stream_release(b->src->s, c);
}

static uint32_t pick_stride(uint32_t stride)
{
    return stride ? stride : IV_ROWINDEX_DEFAULT_STRIDE;
}

/* After a window of n chunks, up to the first failure: joins the value
 * groups that span chunks (*group_acc: the running sum of the one open
 * across them) and checks each against n_minor. */
static void join_window(struct build *b, uint64_t n, uint64_t *group_acc)
{
    const iv_rowindex_src_t *src = b->src;
    for (uint64_t i = 0; i < n && b->c0 + i < atomic_load(&b->fail_at); i++) {
        const struct chunk_state *st = &b->cs[i];
        if (st->count == 0) continue;
        if (st->head_open) {
            *group_acc += st->head_acc;
            if (*group_acc > (uint64_t)src->n_minor) {
                set_error(b, b->c0 + i, IV_EBAD_FILE, "%s/packed_indices: a value group spanning "
                          "chunk %" PRIu64 " reaches an index >= n_minor (%" PRId64 ")",
                          src->where, b->c0 + i, src->n_minor);
                break;
            }
            if (!st->head_closed) continue;
        }
        *group_acc = st->tail_open ? st->tail_acc : 0;
    }
}

/* Every window of the pass in turn, until the first failure. */
static void run_windows(struct build *b, iv_pool_t *pool, uint64_t n_chunks, uint64_t per_window)
{
    uint64_t group_acc = 0;   /* running sum of the group open across chunks */
    for (uint64_t c0 = 0; c0 < n_chunks && atomic_load(&b->fail_at) == UINT64_MAX; c0 += per_window) {
        uint64_t n = n_chunks - c0 < per_window ? n_chunks - c0 : per_window;
        memset(b->cs, 0, n * sizeof *b->cs);
        for (uint64_t i = 0; i < n; i++) atomic_init(&b->cs[i].ready, 0);
        b->c0 = c0;
        iv_pool_parallel_for(pool, (size_t)n, 0, step_chunk, b);
        join_window(b, n, &group_acc);
        b->rank0 = b->cs[n - 1].rank_after;
        b->carry0_len = b->cs[n - 1].carry_len;
        memcpy(b->carry0, b->cs[n - 1].carry, b->carry0_len);
    }
}

static void free_spares(struct build *b)
{
    while (b->spare) {
        struct seen *m = b->spare;
        b->spare = m->next;
        free(m->set);
        free(m);
    }
}

/* Checkpoints the pass did not reach: slices that start at rank nnz
 * (empty tails) begin at the stream's end; any other is a bug. */
static int fill_tail_ckpts(const iv_rowindex_src_t *src, iv_rowindex_t *out, iv_err_t *err)
{
    uint64_t len = iv_stream_length(src->s);
    for (uint64_t j = 0; j < out->n_ckpt; j++) {
        if (out->off[j] != UINT64_MAX) continue;
        if (src->value_ptr[src->major_ptr[j * out->stride]] != src->nnz)
            return iv_fail(err, IV_EINTERNAL, "%s: checkpoint %" PRIu64 " not found", src->where, j);
        out->off[j] = len;
    }
    return 0;
}

/* The pass's verdict: its first error, or the stream's end checked
 * against value_ptr, then the checkpoints completed. */
static int finish_build(const struct build *b, iv_rowindex_t *out, iv_err_t *err)
{
    const iv_rowindex_src_t *src = b->src;
    if (atomic_load(&b->fail_at) != UINT64_MAX) return iv_fail(err, b->err.code, "%s", b->err.msg);
    if (b->rank0 != (uint64_t)src->nnz)
        return iv_fail(err, IV_EBAD_FILE, "%s/packed_indices holds %" PRIu64 " varints but value_ptr "
                       "says nnz = %" PRId64, src->where, b->rank0, src->nnz);
    if (b->carry0_len != 0)
        return iv_fail(err, IV_EBAD_FILE, "%s/packed_indices: unterminated last varint (%u trailing "
                       "continuation bytes)", src->where, (unsigned)b->carry0_len);
    return fill_tail_ckpts(src, out, err);
}

int iv_rowindex_build(const iv_rowindex_src_t *src, uint32_t stride, iv_pool_t *pool,
                      iv_rowindex_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    out->stride = pick_stride(stride);
    out->n_ckpt = src->n_major == 0 ? 0 : (uint64_t)(src->n_major - 1) / out->stride + 1;
    out->off = malloc((out->n_ckpt ? out->n_ckpt : 1) * sizeof *out->off);
    uint64_t n_chunks = iv_stream_n_chunks(src->s);
    uint64_t per_window = n_chunks < WINDOW_CHUNKS ? (n_chunks ? n_chunks : 1) : WINDOW_CHUNKS;
    struct chunk_state *cs = calloc(per_window, sizeof *cs);
    if (!out->off || !cs) {
        free(cs);
        iv_rowindex_free(out);
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the row index", src->where);
    }
    for (uint64_t j = 0; j < out->n_ckpt; j++) out->off[j] = UINT64_MAX;

    struct build b = {.src = src, .ri = out, .cs = cs};
    atomic_init(&b.fail_at, UINT64_MAX);
    pthread_mutex_init(&b.mu, NULL);
    run_windows(&b, pool, n_chunks, per_window);
    free_spares(&b);
    pthread_mutex_destroy(&b.mu);
    int rc = finish_build(&b, out, err);
    free(cs);
    if (rc < 0) iv_rowindex_free(out);
    return rc;
}

void iv_rowindex_free(iv_rowindex_t *ri)
{
    free(ri->off);
    ri->off = NULL;
    ri->n_ckpt = 0;
}

size_t iv_rowindex_bytes(const iv_rowindex_t *ri)
{
    return (size_t)ri->n_ckpt * sizeof *ri->off;
}
