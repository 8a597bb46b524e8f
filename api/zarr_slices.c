/*
 * Decoded slices kept for the chunks they span (see zarr_slices.h).
 *
 * Design.  A few slots, each one slice's block with a pin count: a
 * reader pins its slot under the mutex and copies without it; a slot is
 * dropped (least recently used first) only when unpinned.  A slot being
 * decoded is DECODING, and a reader of the same slice waits on the
 * condition variable until it is READY or gone (the decode failed: the
 * reader then decodes it itself and reports its own error).
 */
#include "zarr_slices.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { SLICE_SLOTS = 8 };
enum { EMPTY = 0, DECODING, READY };

typedef struct sslot {
    int state;
    const void *mx;
    int csr;
    int64_t j;
    int pins;
    size_t bytes;
    uint64_t used;
    iv_block_t blk;
} sslot_t;

struct iv_zarr_slices {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t max_bytes, bytes;  /* bytes: of the slots not EMPTY */
    uint64_t clock;
    sslot_t s[SLICE_SLOTS];
};

iv_zarr_slices_t *iv_zarr_slices_new(size_t max_bytes)
{
    iv_zarr_slices_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->max_bytes = max_bytes;
    return m;
}

void iv_zarr_slices_free(iv_zarr_slices_t *m)
{
    if (!m) return;
    for (int i = 0; i < SLICE_SLOTS; i++) iv_block_free(&m->s[i].blk);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static sslot_t *find_locked(iv_zarr_slices_t *m, const void *mx, int csr, int64_t j)
{
    for (int i = 0; i < SLICE_SLOTS; i++) {
        sslot_t *s = &m->s[i];
        if (s->state != EMPTY && s->mx == mx && s->csr == csr && s->j == j) return s;
    }
    return NULL;
}

static void drop_locked(iv_zarr_slices_t *m, sslot_t *s)
{
    iv_block_free(&s->blk);
    memset(&s->blk, 0, sizeof s->blk);
    m->bytes -= s->bytes;
    s->state = EMPTY;
    s->bytes = 0;
}

/* A free slot with room for bytes, dropping unpinned READY slots least
 * recently used first; NULL when the pinned and decoding ones leave none. */
static sslot_t *claim_locked(iv_zarr_slices_t *m, size_t bytes)
{
    for (;;) {
        sslot_t *empty = NULL, *old = NULL;
        for (int i = 0; i < SLICE_SLOTS; i++) {
            sslot_t *s = &m->s[i];
            if (s->state == EMPTY) empty = empty ? empty : s;
            else if (s->state == READY && s->pins == 0 && (!old || s->used < old->used)) old = s;
        }
        if (empty && m->bytes + bytes <= m->max_bytes) return empty;
        if (!old) return NULL;
        drop_locked(m, old);
    }
}

int iv_zarr_slices_get(iv_zarr_slices_t *m, const void *mx, int csr, int64_t j, size_t bytes,
                       iv_zarr_slice_fn fn, void *ctx, iv_block_t *scratch, const iv_block_t **out,
                       iv_err_t *err)
{
    memset(scratch, 0, sizeof *scratch);
    *out = NULL;
    if (!m || bytes > m->max_bytes) goto alone;
    pthread_mutex_lock(&m->mu);
    sslot_t *s;
    while ((s = find_locked(m, mx, csr, j)) && s->state == DECODING) pthread_cond_wait(&m->cv, &m->mu);
    if (s) {
        s->pins++;
        s->used = ++m->clock;
        pthread_mutex_unlock(&m->mu);
        *out = &s->blk;
        return 0;
    }
    s = claim_locked(m, bytes);
    if (!s) {
        pthread_mutex_unlock(&m->mu);
        goto alone;
    }
    *s = (sslot_t){.state = DECODING, .mx = mx, .csr = csr, .j = j, .pins = 1, .bytes = bytes};
    m->bytes += bytes;
    pthread_mutex_unlock(&m->mu);
    iv_block_t blk;
    memset(&blk, 0, sizeof blk);
    int rc = fn(ctx, j, &blk, err);
    pthread_mutex_lock(&m->mu);
    if (rc == 0) {
        s->blk = blk;
        s->state = READY;
        s->used = ++m->clock;
        *out = &s->blk;
    } else {
        iv_block_free(&blk);
        drop_locked(m, s);
        s->pins = 0;
    }
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return rc;
alone:
    IV_TRY(fn(ctx, j, scratch, err));
    *out = scratch;
    return 0;
}

void iv_zarr_slices_release(iv_zarr_slices_t *m, const iv_block_t *b, iv_block_t *scratch)
{
    if (!b) return;
    if (b == scratch) {
        iv_block_free(scratch);
        return;
    }
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SLICE_SLOTS; i++)
        if (&m->s[i].blk == b) m->s[i].pins--;
    pthread_mutex_unlock(&m->mu);
}
