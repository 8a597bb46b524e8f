/*
 * Row-index build pass (see rowindex.h).
 *
 * The stream is processed in slabs of chunks.  For each slab:
 *  1. in parallel, every chunk is decompressed (pinned in the cache) and
 *     its terminators counted; its last bytes are remembered;
 *  2. sequentially, the counts become ranks (prefix sums) and the bytes of
 *     a varint left open at the end of a chunk are carried into the next;
 *  3. in parallel, each chunk decodes the varints that END in it (the first
 *     one completed with the carried bytes), walks the value groups those
 *     ranks belong to, checks every group's running index against n_minor
 *     and records checkpoint offsets;
 *  4. sequentially, group sums that span chunk boundaries are joined and
 *     checked.
 * Decoding inside step 3 is what makes the "no index >= n_minor" check
 * exact.  Only each group's sum of d + 1 is needed (its last index + 1),
 * so runs of short varints are summed 16 bytes at a time with byte masks
 * (iv_varint_sum3), never decoded one by one.
 */
#include "rowindex.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

/* A slab small enough to stay in the last-level cache between the count
 * and decode steps, large enough to keep every thread busy. */
#define SLAB_BYTES ((uint64_t)8 << 20)

struct chunk_state {
    const uint8_t *data;
    size_t len;
    uint64_t count;        /* terminators in the chunk */
    uint8_t tail[IV_VARINT_MAX];
    uint8_t tail_len;      /* trailing continuation bytes kept (<= 10) */
    uint8_t tail_over;     /* more than 10 trailing continuation bytes */
    uint8_t pend[IV_VARINT_MAX];
    uint8_t pend_len;      /* bytes carried in from earlier chunks */
    /* step 3 results */
    int head_open;         /* first group started before this chunk */
    int head_closed;
    uint64_t head_acc, tail_acc;
    int tail_open;         /* a group started here is still open at the end */
};

struct build {
    const iv_rowindex_src_t *src;
    iv_rowindex_t *ri;
    uint64_t c0;           /* first chunk of the slab */
    struct chunk_state *cs;
    uint64_t *prefix;      /* ranks before each chunk (n_chunks + 1) */
    pthread_mutex_t mu;
    iv_err_t err;
    int failed;
};

static void set_error(struct build *b, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(struct build *b, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&b->mu);
    if (!b->failed) {
        b->failed = 1;
        va_list ap;
        va_start(ap, fmt);
        iv_vfail(&b->err, code, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&b->mu);
}

static void step_count(void *arg, size_t i)
{
    struct build *b = arg;
    uint64_t c = b->c0 + i;
    struct chunk_state *st = &b->cs[i];
    iv_err_t e = {0};
    if (b->failed) return;
    if (iv_stream_acquire(b->src->s, c, &st->data, &st->len, NULL, &e) < 0) {
        st->data = NULL;
        set_error(b, e.code, "%s", e.msg);
        return;
    }
    st->count = iv_varint_count_ends(st->data, st->len);
    size_t t = 0;
    while (t < st->len && t <= IV_VARINT_MAX && st->data[st->len - 1 - t] >= 0x80) t++;
    st->tail_over = t > IV_VARINT_MAX;
    st->tail_len = (uint8_t)(t > IV_VARINT_MAX ? IV_VARINT_MAX : t);
    memcpy(st->tail, st->data + st->len - st->tail_len, st->tail_len);
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

static void step_decode(void *arg, size_t i)
{
    struct build *b = arg;
    const iv_rowindex_src_t *src = b->src;
    struct chunk_state *st = &b->cs[i];
    uint64_t c = b->c0 + i;
    uint64_t rank = b->prefix[c], stop = b->prefix[c + 1];
    if (b->failed || rank == stop) return;
    if (stop > (uint64_t)src->nnz) return; /* reported after the pass */

    const int64_t *vp = src->value_ptr;
    uint64_t n_minor = (uint64_t)src->n_minor;
    uint64_t chunk_start = c * iv_stream_chunk_len(src->s);
    /* Group containing `rank`: last g with vp[g] <= rank (skipping empty groups). */
    int64_t lo = 0, hi = src->n_unique;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)vp[mid + 1] <= rank) lo = mid + 1;
        else hi = mid;
    }
    int64_t g = lo;
    st->head_open = (uint64_t)vp[g] < rank;
    int in_head = st->head_open;
    uint64_t left = (uint64_t)vp[g + 1] - rank;
    uint64_t acc = 0;

    uint64_t j = first_ckpt_at(b, rank);
    uint64_t next_ck = ckpt_rank(b, j);

    const uint8_t *p = st->data, *end = st->data + st->len;
    if (st->pend_len) {
        /* Complete the varint carried in from earlier chunks. */
        uint8_t tmp[2 * IV_VARINT_MAX];
        size_t n = st->pend_len, k = 0;
        uint64_t d;
        memcpy(tmp, st->pend, n);
        while (n < sizeof tmp && p + k < end) {
            tmp[n++] = p[k];
            if (p[k++] < 0x80) break;
        }
        size_t used = iv_varint_read_slow(tmp, tmp + n, &d);
        if (used == 0 || used != n || d >= n_minor) {
            set_error(b, IV_EBAD_FILE, "%s/packed_indices: malformed varint or index >= n_minor "
                      "at stream offset %" PRIu64, src->where, chunk_start - st->pend_len);
            return;
        }
        while (rank == next_ck) {
            b->ri->off[j++] = chunk_start - st->pend_len;
            next_ck = ckpt_rank(b, j);
        }
        p += k;
        acc = d + 1;
        rank++;
        left--;
        goto group_end;
    }
    while (rank < stop) {
        /* Record checkpoints that start here, then decode a run of varints
         * up to the next event: a group end, a checkpoint or the chunk end. */
        while (rank == next_ck) {
            b->ri->off[j++] = chunk_start + (uint64_t)(p - st->data);
            next_ck = ckpt_rank(b, j);
        }
        uint64_t run = left;
        if (next_ck - rank < run) run = next_ck - rank;
        if (stop - rank < run) run = stop - rank;
        uint64_t done = run;
        while (run > 0) {
            /* Varints of up to 3 bytes are summed 16 bytes at a time; the
             * kernel stops at a longer one and 16 bytes before the end. */
            if (run >= 4) {
                /* Shorter runs (one-entry groups of float data) are not
                 * worth a vector kernel's set-up: one by one below. */
                size_t fast;
                run -= iv_varint_sum3(p, end, run, &fast, &acc);
                p += fast;
                if (run == 0 || acc > n_minor) break;
            }
            uint64_t d;
            size_t used = iv_varint_read_slow(p, end, &d);
            if (used == 0) {
                set_error(b, IV_EBAD_FILE, "%s/packed_indices: malformed varint (over 64 bits) at "
                          "stream offset %" PRIu64, src->where,
                          chunk_start + (uint64_t)(p - st->data));
                return;
            }
            if (d >= n_minor) {
                set_error(b, IV_EBAD_FILE, "%s/packed_indices: varint at stream offset %" PRIu64
                          " gives an index >= n_minor (%" PRIu64 ")", src->where,
                          chunk_start + (uint64_t)(p - st->data), n_minor);
                return;
            }
            p += used;
            acc += d + 1;
            if (acc > n_minor) break;   /* reported below; keeps acc from wrapping */
            run--;
        }
        if (run > 0) {
            set_error(b, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an index "
                      ">= n_minor (%" PRIu64 ")", src->where, g, n_minor);
            return;
        }
        rank += done;
        left -= done;
        /* One-byte varints add at most 128 each, so acc cannot wrap here;
         * longer ones were checked one by one above. */
        if (acc > n_minor) {
            set_error(b, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an index "
                      ">= n_minor (%" PRIu64 ")", src->where, g, n_minor);
            return;
        }
    group_end:
        if (left == 0) {
            if (acc > n_minor) {
                set_error(b, IV_EBAD_FILE, "%s/packed_indices: value group %" PRId64 " holds an "
                          "index >= n_minor (%" PRIu64 ")", src->where, g, n_minor);
                return;
            }
            if (in_head) {
                st->head_acc = acc;
                st->head_closed = 1;
                in_head = 0;
            }
            acc = 0;
            while (g < src->n_unique && (uint64_t)vp[g + 1] <= rank) g++;
            if (g >= src->n_unique) break;
            left = (uint64_t)vp[g + 1] - rank;
        }
    }
    if (in_head) {
        st->head_acc = acc;
        st->head_closed = 0;
    } else if (left > 0 && acc > 0) {
        /* acc > 0 exactly when the current group took a varint here. */
        st->tail_open = 1;
        st->tail_acc = acc;
    }
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
    uint64_t *prefix = calloc(n_chunks + 1, sizeof *prefix);
    uint64_t cl = iv_stream_chunk_len(src->s);
    uint64_t per_slab = cl ? SLAB_BYTES / cl : 1;
    unsigned threads = iv_pool_threads(pool) + 1;
    if (per_slab < 4 * (uint64_t)threads) per_slab = 4 * (uint64_t)threads;
    if (per_slab > n_chunks) per_slab = n_chunks ? n_chunks : 1;
    struct chunk_state *cs = calloc(per_slab, sizeof *cs);
    if (!out->off || !prefix || !cs) {
        free(prefix);
        free(cs);
        iv_rowindex_free(out);
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for the row index", src->where);
    }
    for (uint64_t j = 0; j < out->n_ckpt; j++) out->off[j] = UINT64_MAX;

    struct build b = {.src = src, .ri = out, .cs = cs, .prefix = prefix};
    pthread_mutex_init(&b.mu, NULL);
    uint8_t carry[IV_VARINT_MAX];
    size_t carry_len = 0;
    uint64_t group_acc = 0;   /* running sum of the group open across chunks */
    int rc = 0;

    for (uint64_t c0 = 0; c0 < n_chunks && !b.failed; c0 += per_slab) {
        uint64_t n = n_chunks - c0 < per_slab ? n_chunks - c0 : per_slab;
        memset(cs, 0, n * sizeof *cs);
        b.c0 = c0;
        iv_pool_parallel_for(pool, (size_t)n, 0, step_count, &b);
        for (uint64_t i = 0; i < n && !b.failed; i++) {
            struct chunk_state *st = &cs[i];
            prefix[c0 + i + 1] = prefix[c0 + i] + st->count;
            if (prefix[c0 + i + 1] > (uint64_t)src->nnz) {
                set_error(&b, IV_EBAD_FILE, "%s/packed_indices holds more varints than value_ptr's "
                          "nnz (%" PRId64 ")", src->where, src->nnz);
                break;
            }
            memcpy(st->pend, carry, carry_len);
            st->pend_len = (uint8_t)carry_len;
            if (st->count > 0) {
                if (st->tail_over) {
                    set_error(&b, IV_EBAD_FILE, "%s/packed_indices: varint longer than 10 bytes at "
                              "the end of chunk %" PRIu64, src->where, c0 + i);
                    break;
                }
                memcpy(carry, st->tail, st->tail_len);
                carry_len = st->tail_len;
            } else {
                if (carry_len + st->len > IV_VARINT_MAX) {
                    set_error(&b, IV_EBAD_FILE, "%s/packed_indices: varint longer than 10 bytes "
                              "through chunk %" PRIu64, src->where, c0 + i);
                    break;
                }
                memcpy(carry + carry_len, st->data, st->len);
                carry_len += st->len;
            }
        }
        if (!b.failed) iv_pool_parallel_for(pool, (size_t)n, 0, step_decode, &b);
        for (uint64_t i = 0; i < n && !b.failed; i++) {
            struct chunk_state *st = &cs[i];
            if (prefix[c0 + i] == prefix[c0 + i + 1]) continue;
            if (st->head_open) {
                group_acc += st->head_acc;
                if (group_acc > (uint64_t)src->n_minor) {
                    set_error(&b, IV_EBAD_FILE, "%s/packed_indices: a value group spanning chunk %"
                              PRIu64 " reaches an index >= n_minor (%" PRId64 ")", src->where,
                              c0 + i, src->n_minor);
                    break;
                }
                if (!st->head_closed) continue;
            }
            group_acc = st->tail_open ? st->tail_acc : 0;
        }
        for (uint64_t i = 0; i < n; i++)
            if (cs[i].data) iv_stream_release(src->s, c0 + i);
    }
    pthread_mutex_destroy(&b.mu);
    if (b.failed) {
        rc = iv_fail(err, b.err.code, "%s", b.err.msg);
    } else if (prefix[n_chunks] != (uint64_t)src->nnz) {
        rc = iv_fail(err, IV_EBAD_FILE, "%s/packed_indices holds %" PRIu64 " varints but value_ptr "
                     "says nnz = %" PRId64, src->where, prefix[n_chunks], src->nnz);
    } else if (carry_len != 0) {
        rc = iv_fail(err, IV_EBAD_FILE, "%s/packed_indices: unterminated last varint (%zu trailing "
                     "continuation bytes)", src->where, carry_len);
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
    free(prefix);
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
