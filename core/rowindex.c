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
 * After a window, group sums that span chunk boundaries are joined and
 * checked, in order.  Decoding in step 3 is what makes the "no index >=
 * n_minor" check exact.  Only each group's sum of d + 1 is needed (its
 * last index + 1), so runs of short varints are summed 16 or 32 bytes at a
 * time with byte masks (iv_varint_sum3), never decoded one by one.
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

/* Events of step 3, at ranks: a value group ends, a checkpoint's slice
 * starts, the chunk's last varint ends. */
enum { EV_GROUP_END, EV_CKPT, EV_STOP };
#define EVENT_BATCH 256

struct walk {
    struct build *b;
    struct chunk_state *st;
    uint64_t c, chunk_start;
    const uint8_t *data;
    int64_t g;             /* group of the next group-end event (messages) */
    uint64_t j;            /* checkpoint of the next checkpoint event */
    uint64_t gsum;         /* walk sum where the current group started in this chunk */
    uint64_t grank;        /* rank where it started in this chunk */
    size_t back;           /* bytes of the carried varint before data, until it is passed */
    int in_head;           /* the current group started before this chunk */
};

/* Applies one event reached with walk sum `sum` and the next varint at p.
 * Returns -1 after recording an error. */
static int apply_event(struct walk *k, int kind, uint64_t rank, uint64_t sum, const uint8_t *p)
{
    struct build *b = k->b;
    uint64_t n_minor = (uint64_t)b->src->n_minor;
    switch (kind) {
    case EV_CKPT:
        b->ri->off[k->j++] = k->chunk_start + (uint64_t)(p - k->data) - k->back;
        return 0;
    case EV_GROUP_END:
        /* One group's sum of d + 1 is its last index + 1; a head group's
         * part here is checked too, and whole in the join. */
        if (sum - k->gsum > n_minor) {
            set_error(b, k->c, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an "
                      "index >= n_minor (%" PRIu64 ")", b->src->where, k->g, n_minor);
            return -1;
        }
        if (k->in_head) {
            k->st->head_acc = sum - k->gsum;
            k->st->head_closed = 1;
            k->in_head = 0;
        }
        k->gsum = sum;
        k->grank = rank;
        return 0;
    default:
        if (sum - k->gsum > n_minor) {
            set_error(b, k->c, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an "
                      "index >= n_minor (%" PRIu64 ")", b->src->where, k->g, n_minor);
            return -1;
        }
        if (k->in_head) {
            k->st->head_acc = sum - k->gsum;
            k->st->head_closed = 0;
        } else if (rank > k->grank) {
            k->st->tail_open = 1;
            k->st->tail_acc = sum - k->gsum;
        }
        return 0;
    }
}

/* Step 3 for chunk c: the varints of ranks [rank, stop) end in data[0, len);
 * pend holds the bytes of the first one that earlier chunks carried. */
static void decode_chunk(struct build *b, struct chunk_state *st, uint64_t c, const uint8_t *data,
                         size_t len, uint64_t rank, uint64_t stop, const uint8_t *pend,
                         size_t pend_len)
{
    const iv_rowindex_src_t *src = b->src;
    const int64_t *vp = src->value_ptr;
    uint64_t n_minor = (uint64_t)src->n_minor;
    struct walk k = {.b = b, .st = st, .c = c, .data = data,
                     .chunk_start = c * iv_stream_chunk_len(src->s), .grank = rank,
                     .back = pend_len};
    /* Group containing `rank`: last g with vp[g] <= rank (skipping empty groups). */
    int64_t lo = 0, hi = src->n_unique;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)vp[mid + 1] <= rank) lo = mid + 1;
        else hi = mid;
    }
    k.g = lo;
    st->head_open = k.in_head = (uint64_t)vp[k.g] < rank;
    k.j = first_ckpt_at(b, rank);

    /* Event generator: the next group end and checkpoint, in rank order. */
    int64_t gen_g = k.g;
    uint64_t gen_j = k.j;
    int gen_done = 0;

    iv_varint_walk_t w = {.p = data, .n = rank, .sum = 0};
    const uint8_t *end = data + len;
    uint64_t marks[EVENT_BATCH], sum_at[EVENT_BATCH];
    const uint8_t *p_at[EVENT_BATCH];
    uint8_t kinds[EVENT_BATCH];
    size_t n_ev = 0, e = 0;
    int carried = pend_len > 0;
    for (;;) {
        if (e == n_ev) {
            if (gen_done) return;
            n_ev = e = 0;
            while (n_ev < EVENT_BATCH && !gen_done) {
                uint64_t ge = gen_g < src->n_unique ? (uint64_t)vp[gen_g + 1] : UINT64_MAX;
                uint64_t ck = ckpt_rank(b, gen_j);
                if (ge <= stop && ge <= ck) {
                    marks[n_ev] = ge;
                    kinds[n_ev++] = EV_GROUP_END;
                    /* The next group with entries. */
                    do gen_g++;
                    while (gen_g < src->n_unique && (uint64_t)vp[gen_g + 1] <= ge);
                } else if (ck < stop) {
                    marks[n_ev] = ck;
                    kinds[n_ev++] = EV_CKPT;
                    gen_j++;
                } else {
                    marks[n_ev] = stop;
                    kinds[n_ev++] = EV_STOP;
                    gen_done = 1;
                }
            }
        }
        /* Events at the walk's position: reached already. */
        if (marks[e] == w.n) {
            if (apply_event(&k, kinds[e], marks[e], w.sum, w.p) < 0) return;
            if (kinds[e] == EV_GROUP_END)
                do k.g++;
                while (k.g < src->n_unique && (uint64_t)vp[k.g + 1] <= marks[e]);
            e++;
            continue;
        }
        if (!carried) {
            size_t r = iv_varint_walk3(&w, end, marks + e, n_ev - e, sum_at + e, p_at + e);
            for (size_t t = e; t < e + r; t++) {
                if (apply_event(&k, kinds[t], marks[t], sum_at[t], p_at[t]) < 0) return;
                if (kinds[t] == EV_GROUP_END)
                    do k.g++;
                    while (k.g < src->n_unique && (uint64_t)vp[k.g + 1] <= marks[t]);
            }
            e += r;
            if (e == n_ev) continue;
        }
        /* One varint the walk left: carried in from earlier chunks, longer
         * than 3 bytes, or cut by the chunk's end; decoded with checks. */
        uint64_t d;
        size_t used;
        uint64_t at = k.chunk_start + (uint64_t)(w.p - data);
        if (carried) {
            uint8_t tmp[2 * IV_VARINT_MAX];
            size_t n = pend_len, t = 0;
            memcpy(tmp, pend, n);
            while (n < sizeof tmp && data + t < end) {
                tmp[n++] = data[t];
                if (data[t++] < 0x80) break;
            }
            used = iv_varint_read_slow(tmp, tmp + n, &d);
            if (used == 0 || used != n) used = 0;
            else used = t;
            at -= pend_len;
            carried = 0;
            k.back = 0;
        } else {
            used = iv_varint_read_slow(w.p, end, &d);
        }
        if (used == 0) {
            set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: malformed varint (over 64 bits) at "
                      "stream offset %" PRIu64, src->where, at);
            return;
        }
        if (d >= n_minor) {
            set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: varint at stream offset %" PRIu64
                      " gives an index >= n_minor (%" PRIu64 ")", src->where, at, n_minor);
            return;
        }
        /* d < n_minor keeps each step small; the bound keeps sums exact. */
        if (w.sum + d + 1 > ((uint64_t)1 << 62)) {
            set_error(b, c, IV_EBAD_FILE, "%s/packed_indices: index sums overflow near stream "
                      "offset %" PRIu64, src->where, at);
            return;
        }
        w.p += used;
        w.n++;
        w.sum += d + 1;
    }
}

/* One chunk: steps 1 to 3 of the pass. */
static void step_chunk(void *arg, size_t i)
{
    struct build *b = arg;
    const iv_rowindex_src_t *src = b->src;
    struct chunk_state *st = &b->cs[i];
    uint64_t c = b->c0 + i;
    const uint8_t *data = NULL;
    size_t len = 0;
    int have = 0;
    if (!skip_chunk(b, c)) {
        iv_err_t e = {0};
        if (iv_stream_acquire(src->s, c, &data, &len, NULL, &e) < 0) set_error(b, c, e.code, "%s", e.msg);
        else have = 1;
    }
    uint64_t count = have ? iv_varint_count_ends(data, len) : 0;

    /* Step 2: the chain of ranks and carried bytes. */
    uint8_t pend[IV_VARINT_MAX];
    size_t pend_len;
    uint64_t rank;
    if (i == 0) {
        rank = b->rank0;
        pend_len = b->carry0_len;
        memcpy(pend, b->carry0, pend_len);
    } else {
        const struct chunk_state *prev = &b->cs[i - 1];
        wait_ready(prev);
        rank = prev->rank_after;
        pend_len = prev->carry_len;
        memcpy(pend, prev->carry, pend_len);
    }
    st->count = count;
    st->rank_after = rank + count;
    st->carry_len = 0;
    if (have && !skip_chunk(b, c)) {
        if (st->rank_after > (uint64_t)src->nnz) {
            set_error(b, c, IV_EBAD_FILE, "%s/packed_indices holds more varints than value_ptr's "
                      "nnz (%" PRId64 ")", src->where, src->nnz);
        } else if (count > 0) {
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
    atomic_store_explicit(&st->ready, 1, memory_order_release);

    if (have && count > 0 && !skip_chunk(b, c))
        decode_chunk(b, st, c, data, len, rank, st->rank_after, pend, pend_len);
    if (have) iv_stream_release(src->s, c);
}

static uint32_t pick_stride(uint32_t stride)
{
    return stride ? stride : IV_ROWINDEX_DEFAULT_STRIDE;
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
    uint64_t group_acc = 0;   /* running sum of the group open across chunks */
    int rc = 0;

    for (uint64_t c0 = 0; c0 < n_chunks && atomic_load(&b.fail_at) == UINT64_MAX; c0 += per_window) {
        uint64_t n = n_chunks - c0 < per_window ? n_chunks - c0 : per_window;
        memset(cs, 0, n * sizeof *cs);
        for (uint64_t i = 0; i < n; i++) atomic_init(&cs[i].ready, 0);
        b.c0 = c0;
        iv_pool_parallel_for(pool, (size_t)n, 0, step_chunk, &b);
        /* Step 4, up to the first failure: join the groups that span chunks. */
        for (uint64_t i = 0; i < n && c0 + i < atomic_load(&b.fail_at); i++) {
            struct chunk_state *st = &cs[i];
            if (st->count == 0) continue;
            if (st->head_open) {
                group_acc += st->head_acc;
                if (group_acc > (uint64_t)src->n_minor) {
                    set_error(&b, c0 + i, IV_EBAD_FILE, "%s/packed_indices: a value group spanning "
                              "chunk %" PRIu64 " reaches an index >= n_minor (%" PRId64 ")",
                              src->where, c0 + i, src->n_minor);
                    break;
                }
                if (!st->head_closed) continue;
            }
            group_acc = st->tail_open ? st->tail_acc : 0;
        }
        b.rank0 = cs[n - 1].rank_after;
        b.carry0_len = cs[n - 1].carry_len;
        memcpy(b.carry0, cs[n - 1].carry, b.carry0_len);
    }
    pthread_mutex_destroy(&b.mu);
    if (atomic_load(&b.fail_at) != UINT64_MAX) {
        rc = iv_fail(err, b.err.code, "%s", b.err.msg);
    } else if (b.rank0 != (uint64_t)src->nnz) {
        rc = iv_fail(err, IV_EBAD_FILE, "%s/packed_indices holds %" PRIu64 " varints but value_ptr "
                     "says nnz = %" PRId64, src->where, b.rank0, src->nnz);
    } else if (b.carry0_len != 0) {
        rc = iv_fail(err, IV_EBAD_FILE, "%s/packed_indices: unterminated last varint (%u trailing "
                     "continuation bytes)", src->where, (unsigned)b.carry0_len);
    } else {
        uint64_t len = iv_stream_length(src->s);
        for (uint64_t j = 0; j < out->n_ckpt; j++) {
            if (out->off[j] != UINT64_MAX) continue;
            /* Slices that start at rank nnz (empty tails) begin at the end. */
            if (src->value_ptr[src->major_ptr[j * out->stride]] == src->nnz) {
                out->off[j] = len;
            } else {
                rc = iv_fail(err, IV_EINTERNAL, "%s: checkpoint %" PRIu64 " not found", src->where, j);
                break;
            }
        }
    }
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
