/*
 * The X chunks served last, and uns (see zarr_cache.h).
 *
 * Design.  Chunk k of X/indices and chunk k of X/data are the same
 * entries: one decode gives both.  Clients ask for the two together
 * (Vitessce at once, zarr-python one array after the other), so the
 * decode of a chunk fills both parts, encoded as they are served (zstd,
 * zarr_chunk.c), into a slot of a small table and the request for the
 * other part copies them out; a client reading the same region again
 * costs a copy, not a decode and a compression.  A request that finds
 * its chunk being filled waits for it (single flight) instead of
 * decoding it a second time.  The parts held are bounded by CACHE_BYTES
 * a dataset, in at most SLOTS slots; chunks whose both parts were served
 * are dropped first, then the least recently used.
 */
#include "zarr_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 512
/* The encoded parts held, all slots together.  A whole-matrix reader
 * (anndata's read_zarr, zarr-python's X["data"][:]) reads one array after
 * the other: every chunk's second part is asked for after all the first
 * parts, so the table must hold one part of every chunk for the chunks to
 * be decoded once, not twice.  48 MiB hold that for about 300 chunks at
 * zstd's ratio on counts (a 20,000-cell dataset of 14.5 M entries). */
#define CACHE_BYTES ((size_t)48 << 20)
/* The decoded slices kept beside them (zarr_slices.h): 2.8 M entries,
 * counted at 12 bytes an entry (an 8-byte index bound and a float32
 * value), two genes of a million cells. */
#define SLICES_BYTES ((size_t)32 << 20)

enum { SLOT_EMPTY = 0, SLOT_FILLING, SLOT_READY };

/* X's kept chunks of one orientation (zarr_kept.h): mx and chunk are
 * written before k is published (release), and never after. */
typedef struct kept {
    _Atomic(iv_zarr_kept_t *) k;
    const void *mx;
    int64_t chunk;
    atomic_int dropped;       /* a read failed its checks: not read again */
} kept_t;

typedef struct slot {
    int state;
    const void *mx;
    int csr;
    int64_t chunk, k;
    iv_buf_t parts[2];        /* indices, values: the bytes served */
    unsigned served;          /* bit p: part p was served (both: dropped first) */
    uint64_t used;            /* last use, for LRU */
} slot_t;

struct iv_zarr_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t clock;
    size_t bytes;             /* of the READY slots' parts */
    slot_t s[SLOTS];
    int uns_state;            /* UNS_* */
    iv_uns_t *uns;
    iv_err_t uns_err;         /* UNS_DONE with uns NULL: why */
    iv_zarr_slices_t *slices; /* long slices decoded for the chunks they span, or NULL */
    kept_t kept[2];           /* [csr] */
};

enum { UNS_UNREAD = 0, UNS_READING, UNS_DONE };

iv_zarr_cache_t *iv_zarr_cache_new(void)
{
    iv_zarr_cache_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->slices = iv_zarr_slices_new(SLICES_BYTES);  /* NULL: each chunk decodes its slices */
    for (int i = 0; i < SLOTS; i++) {
        iv_buf_init(&c->s[i].parts[0]);
        iv_buf_init(&c->s[i].parts[1]);
    }
    return c;
}

static void slot_drop(iv_zarr_cache_t *c, slot_t *s)
{
    if (s->state == SLOT_READY) c->bytes -= s->parts[0].len + s->parts[1].len;
    iv_buf_free(&s->parts[0]);
    iv_buf_free(&s->parts[1]);
    iv_buf_init(&s->parts[0]);
    iv_buf_init(&s->parts[1]);
    s->state = SLOT_EMPTY;
}

void iv_zarr_cache_free(iv_zarr_cache_t *c)
{
    if (!c) return;
    for (int i = 0; i < SLOTS; i++) slot_drop(c, &c->s[i]);
    iv_uns_free(c->uns);
    iv_zarr_slices_free(c->slices);
    for (int i = 0; i < 2; i++) iv_zarr_kept_close(atomic_load(&c->kept[i].k));
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int copy_part(const iv_buf_t *part, iv_buf_t *out, iv_err_t *err)
{
    iv_buf_append(out, part->data, part->len);
    return out->oom ? iv_fail(err, IV_ENOMEM, "out of memory for a chunk") : 0;
}

static int fill_scratch(int want_val, iv_buf_t *out, iv_zarr_fill_fn fill, void *ctx, iv_err_t *err)
{
    iv_buf_t parts[2];
    iv_buf_init(&parts[0]);
    iv_buf_init(&parts[1]);
    int rc = fill(ctx, parts, err);
    if (rc == 0) rc = copy_part(&parts[want_val ? 1 : 0], out, err);
    iv_buf_free(&parts[0]);
    iv_buf_free(&parts[1]);
    return rc;
}

/* Whether slot a should be dropped before slot b: empty ones first, then
 * those whose both parts were served, then the least recently used. */
static int drop_before(const slot_t *a, const slot_t *b)
{
    if (!b) return 1;
    if ((a->state == SLOT_EMPTY) != (b->state == SLOT_EMPTY)) return a->state == SLOT_EMPTY;
    if ((a->served == 3) != (b->served == 3)) return a->served == 3;
    return a->used < b->used;
}

/* The slot of the chunk, or a free one to fill (NULL: every slot busy). */
static slot_t *find_locked(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                           int *hit)
{
    slot_t *victim = NULL;
    for (int i = 0; i < SLOTS; i++) {
        slot_t *s = &c->s[i];
        if (s->state != SLOT_EMPTY && s->mx == mx && s->csr == csr && s->chunk == chunk && s->k == k) {
            *hit = 1;
            return s;
        }
        if (s->state != SLOT_FILLING && drop_before(s, victim)) victim = s;
    }
    *hit = 0;
    return victim;
}

/* Drops ready slots but keep (drop_before's order) until the parts held
 * fit CACHE_BYTES. */
static void trim_locked(iv_zarr_cache_t *c, const slot_t *keep)
{
    while (c->bytes > CACHE_BYTES) {
        slot_t *lru = NULL;
        for (int i = 0; i < SLOTS; i++) {
            slot_t *s = &c->s[i];
            if (s != keep && s->state == SLOT_READY && drop_before(s, lru)) lru = s;
        }
        if (!lru) return;
        slot_drop(c, lru);
    }
}

int iv_zarr_cache_get(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                      int want_val, iv_buf_t *out, iv_zarr_fill_fn fill, void *ctx, iv_err_t *err)
{
    if (!c) return fill_scratch(want_val, out, fill, ctx, err);
    pthread_mutex_lock(&c->mu);
    slot_t *s;
    int hit;
    for (;;) {
        s = find_locked(c, mx, csr, chunk, k, &hit);
        if (!hit || s->state == SLOT_READY) break;
        pthread_cond_wait(&c->cv, &c->mu);  /* being filled by another request */
    }
    if (hit || !s) {
        int rc = 0;
        if (hit) {
            s->used = ++c->clock;
            s->served |= 1u << (want_val ? 1 : 0);
            rc = copy_part(&s->parts[want_val ? 1 : 0], out, err);
        }
        pthread_mutex_unlock(&c->mu);
        return hit ? rc : fill_scratch(want_val, out, fill, ctx, err);
    }
    if (s->state == SLOT_READY) c->bytes -= s->parts[0].len + s->parts[1].len;
    s->parts[0].len = s->parts[1].len = 0;
    s->state = SLOT_FILLING;
    s->served = 1u << (want_val ? 1 : 0);
    s->mx = mx;
    s->csr = csr;
    s->chunk = chunk;
    s->k = k;
    s->used = ++c->clock;
    pthread_mutex_unlock(&c->mu);
    /* The slot is this request's while FILLING: no one else touches its parts. */
    int rc = fill(ctx, s->parts, err);
    if (rc == 0) rc = copy_part(&s->parts[want_val ? 1 : 0], out, err);
    pthread_mutex_lock(&c->mu);
    if (rc == 0) {
        s->state = SLOT_READY;
        c->bytes += s->parts[0].len + s->parts[1].len;
        trim_locked(c, s);
    } else {
        slot_drop(c, s);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int iv_zarr_cache_uns_get(iv_zarr_cache_t *c, const char *path, const iv_uns_t **out, iv_err_t *err)
{
    *out = NULL;
    IV_RETURN_IF(!c, err, IV_ENOMEM, "out of memory for the dataset's uns");
    pthread_mutex_lock(&c->mu);
    while (c->uns_state == UNS_READING) pthread_cond_wait(&c->cv, &c->mu);
    if (c->uns_state == UNS_DONE) {
        *out = c->uns;
        iv_err_t e = c->uns_err;
        pthread_mutex_unlock(&c->mu);
        return *out ? 0 : iv_fail(err, e.code < 0 ? e.code : IV_EBAD_FILE, "%s", e.msg);
    }
    c->uns_state = UNS_READING;
    pthread_mutex_unlock(&c->mu);
    iv_uns_t *u = NULL;
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_uns_load(path, &u, &e);
    /* A reader past its time on uns is HDF5 looping on the file's bytes:
     * the file's fault, not a request that waited too long. */
    if (rc == IV_ETIMEOUT) rc = IV_EBAD_FILE;
    pthread_mutex_lock(&c->mu);
    c->uns = rc == 0 ? u : NULL;
    c->uns_err = e;
    if (rc < 0) c->uns_err.code = rc;
    /* Out of memory is this moment's, not the file's: the next request
     * reads again.  Any other failure is kept, a reader that stalled
     * included (h5iso gives up on it after tens of seconds: a damaged
     * file must not cost that on every request). */
    c->uns_state = rc == IV_ENOMEM ? UNS_UNREAD : UNS_DONE;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    *out = rc == 0 ? u : NULL;
    return rc == 0 ? 0 : iv_fail(err, rc, "%s", e.msg);
}

int iv_zarr_cache_keep(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, iv_zarr_kept_t *k)
{
    kept_t *s = c ? &c->kept[csr ? 1 : 0] : NULL;
    if (!s || atomic_load(&s->k)) return -1;
    s->mx = mx;
    s->chunk = chunk;
    atomic_store_explicit(&s->k, k, memory_order_release);
    return 0;
}

int iv_zarr_cache_kept_read(iv_zarr_cache_t *c, const void *mx, int csr, int64_t chunk, int64_t k,
                            int want_val, iv_buf_t *out, iv_err_t *err)
{
    kept_t *s = c ? &c->kept[csr ? 1 : 0] : NULL;
    iv_zarr_kept_t *kp = s ? atomic_load_explicit(&s->k, memory_order_acquire) : NULL;
    if (!kp || s->mx != mx || s->chunk != chunk || atomic_load_explicit(&s->dropped, memory_order_relaxed))
        return 0;
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_zarr_kept_read(kp, k, want_val ? 1 : 0, out, &e);
    if (rc == 0) return 1;
    if (rc == IV_ENOMEM) return iv_fail(err, rc, "%s", e.msg);
    /* Its bytes failed their checks: the chunks are decoded again from
     * now on, and the next start writes the file again. */
    if (!atomic_exchange(&s->dropped, 1)) unlink(iv_zarr_kept_path(kp));
    return 0;
}

void iv_zarr_cache_kept_state(iv_zarr_cache_t *c, int csr, uint64_t *bytes, int *dropped)
{
    kept_t *s = c ? &c->kept[csr ? 1 : 0] : NULL;
    iv_zarr_kept_t *kp = s ? atomic_load_explicit(&s->k, memory_order_acquire) : NULL;
    *bytes = kp ? iv_zarr_kept_bytes(kp) : 0;
    *dropped = kp && atomic_load(&s->dropped);
}

iv_zarr_slices_t *iv_zarr_cache_slices(iv_zarr_cache_t *c)
{
    return c ? c->slices : NULL;
}

const iv_uns_t *iv_zarr_cache_uns(iv_zarr_cache_t *c, const char *path)
{
    /* A file whose uns cannot be read serves the rest of its store: the
     * error is not an answer to the request that happened to come first. */
    const iv_uns_t *u = NULL;
    iv_err_t e;
    iv_err_clear(&e);
    return iv_zarr_cache_uns_get(c, path, &u, &e) == 0 ? u : NULL;
}
