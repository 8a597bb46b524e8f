/*
 * The X chunks decoded last (see zarr_cache.h).
 *
 * Design.  Chunk k of X/indices and chunk k of X/data are the same
 * entries: one decode gives both.  Clients ask for the two together
 * (Vitessce at once, zarr-python one array after the other), so the
 * decode of a chunk fills both parts into a slot of a small table and the
 * request for the other part copies them out.  A request that finds its
 * chunk being filled waits for it (single flight) instead of decoding it
 * a second time.  SLOTS slots of at most IV_ZARR_X_CHUNK entries (12 bytes
 * an entry at most) bound the memory to about 12 MB a dataset; the least
 * recently used free slot is reused.
 */
#include "zarr_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 16

enum { SLOT_EMPTY = 0, SLOT_FILLING, SLOT_READY };

typedef struct slot {
    int state;
    const void *mx;
    int csr;
    int64_t chunk, k;
    size_t n_idx, n_val;
    uint8_t *bytes;           /* n_idx bytes of indices, then n_val of values */
    size_t cap;
    uint64_t used;            /* last use, for LRU */
} slot_t;

struct iv_zarr_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t clock;
    slot_t s[SLOTS];
    int uns_state;            /* UNS_* */
    iv_uns_t *uns;
};

enum { UNS_UNREAD = 0, UNS_READING, UNS_DONE };

iv_zarr_cache_t *iv_zarr_cache_new(void)
{
    iv_zarr_cache_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

void iv_zarr_cache_free(iv_zarr_cache_t *c)
{
    if (!c) return;
    for (int i = 0; i < SLOTS; i++) free(c->s[i].bytes);
    iv_uns_free(c->uns);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void copy_part(const slot_t *s, int want_val, uint8_t *dst)
{
    if (want_val) memcpy(dst, s->bytes + s->n_idx, s->n_val);
    else memcpy(dst, s->bytes, s->n_idx);
}

static int fill_scratch(size_t n_idx, size_t n_val, int want_val, uint8_t *dst, iv_zarr_fill_fn fill,
                        void *ctx, iv_err_t *err)
{
    uint8_t *b = malloc(n_idx + n_val);
    if (!b) return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    int rc = fill(ctx, b, b + n_idx, err);
    if (rc == 0) memcpy(dst, want_val ? b + n_idx : b, want_val ? n_val : n_idx);
    free(b);
    return rc;
}

/* The slot of the chunk, or a free one to fill (NULL: every slot busy). */
static slot_t *find_locked(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k, int *hit)
{
    slot_t *victim = NULL;
    for (int i = 0; i < SLOTS; i++) {
        slot_t *s = &c->s[i];
        if (s->state != SLOT_EMPTY && s->mx == mx && s->csr == csr && s->chunk == chunk && s->k == k) {
            *hit = 1;
            return s;
        }
        if (s->state != SLOT_FILLING && (!victim || s->used < victim->used)) victim = s;
    }
    *hit = 0;
    return victim;
}

int iv_zarr_cache_get(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k, size_t n_idx,
                      size_t n_val, int want_val, uint8_t *dst, iv_zarr_fill_fn fill, void *ctx,
                      iv_err_t *err)
{
    if (!c) return fill_scratch(n_idx, n_val, want_val, dst, fill, ctx, err);
    pthread_mutex_lock(&c->mu);
    slot_t *s;
    int hit;
    for (;;) {
        s = find_locked(c, mx, csr, chunk, k, &hit);
        if (!hit || s->state == SLOT_READY) break;
        pthread_cond_wait(&c->cv, &c->mu);  /* being filled by another request */
    }
    if (hit) {
        s->used = ++c->clock;
        copy_part(s, want_val, dst);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (!s) {
        pthread_mutex_unlock(&c->mu);
        return fill_scratch(n_idx, n_val, want_val, dst, fill, ctx, err);
    }
    if (s->cap < n_idx + n_val) {
        uint8_t *nb = realloc(s->bytes, n_idx + n_val);
        if (!nb) {
            pthread_mutex_unlock(&c->mu);
            return fill_scratch(n_idx, n_val, want_val, dst, fill, ctx, err);
        }
        s->bytes = nb;
        s->cap = n_idx + n_val;
    }
    *s = (slot_t){.state = SLOT_FILLING, .mx = mx, .csr = csr, .chunk = chunk, .k = k, .n_idx = n_idx,
                  .n_val = n_val, .bytes = s->bytes, .cap = s->cap, .used = ++c->clock};
    pthread_mutex_unlock(&c->mu);
    /* The slot is this request's while FILLING: no one else touches its bytes. */
    int rc = fill(ctx, s->bytes, s->bytes + n_idx, err);
    pthread_mutex_lock(&c->mu);
    s->state = rc == 0 ? SLOT_READY : SLOT_EMPTY;
    if (rc == 0) copy_part(s, want_val, dst);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

const iv_uns_t *iv_zarr_cache_uns(iv_zarr_cache_t *c, const char *path)
{
    if (!c) return NULL;
    pthread_mutex_lock(&c->mu);
    while (c->uns_state == UNS_READING) pthread_cond_wait(&c->cv, &c->mu);
    if (c->uns_state == UNS_DONE) {
        pthread_mutex_unlock(&c->mu);
        return c->uns;
    }
    c->uns_state = UNS_READING;
    pthread_mutex_unlock(&c->mu);
    /* A file whose uns cannot be read serves the rest of its store: the
     * error is not an answer to the request that happened to come first. */
    iv_uns_t *u = NULL;
    iv_err_t e = {0};
    if (iv_uns_load(path, &u, &e) != 0) u = NULL;
    pthread_mutex_lock(&c->mu);
    c->uns = u;
    c->uns_state = UNS_DONE;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return u;
}
