/*
 * Chunk access and the decompressed-chunk cache (see stream.h).
 *
 * Each chunk has a slot: its buffer (NULL when not resident), a pin count
 * and links in an LRU list that holds every resident chunk.  A hit takes
 * no lock (see struct slot): with one mutex for the stream, every row of
 * a random-cell query took it twice, and a 10,000-cell query on 16 threads
 * took twice the time it takes without.  A miss decompresses outside the
 * lock into a fresh buffer; if another thread installed the same chunk
 * meanwhile, the later copy is dropped.  Scratch
 * buffers for multi-stage pipelines come from a small free list so that
 * the hot path does not allocate them per call.
 *
 * Chunk buffers come from an arena: one anonymous mapping of as many
 * chunk-sized slots as the budget holds (at most one per chunk), asked for
 * transparent huge pages.  Start-up decompresses the whole stream into the
 * cache, and taking that memory as 2 MiB pages instead of 4 KiB faults
 * roughly halves the kernel's share of the row-index pass; the dataset
 * layer can also make the arena early and fault it in on idle workers
 * while the file loads (iv_stream_arena_new).  Freed slots go on a free
 * list; chunks pinned past the budget fall back to malloc.  Memory that is
 * never touched is never committed.
 *
 * A stream may also share a process-wide budget with other streams
 * (membudget.h): its cached bytes are charged there, a miss first makes
 * room in it (which may evict another stream's oldest chunk, or its own),
 * and the stream publishes the use tick of its LRU tail so that the
 * budget can find the oldest chunk of the process.  Its own budget then
 * acts as a per-dataset cap.  A freed arena slot keeps its pages only
 * while the free list is short (a miss about to reuse it); past that its
 * pages go back to the OS, so that bytes evicted for another dataset
 * leave this one's resident memory too and the process stays near the
 * shared budget.
 */
#include "stream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT64_MAX

/* A slot's pins while the evictor takes its chunk (see try_evict). */
#define PIN_DEAD 0x80000000u

/*
 * A chunk's slot.  A hit takes no lock: it pins the chunk with an atomic
 * add (refused while PIN_DEAD is set), reads buf and marks the chunk
 * used (ref).  Everything else happens under the stream's mutex: buf is
 * set by a miss and cleared by an eviction, which first swaps pins from
 * 0 to PIN_DEAD, so a chunk is never freed while pinned.  A cached
 * chunk stays in the LRU list while pinned; the list is put in order
 * lazily, by the evictors (a clock: a chunk used or pinned since it was
 * listed goes back to the head with a fresh tick instead of going).
 */
struct slot {
    _Atomic(uint8_t *) buf;
    atomic_uint pins;
    atomic_uchar ref;      /* used since it was (re)listed */
    atomic_uint_fast64_t hits;
    uint64_t prev, next;   /* LRU links, NIL when not listed (mu) */
    uint64_t tick;         /* when it was (re)listed (shared budget's clock; mu) */
};

struct scratch {
    struct scratch *next;
    uint8_t data[];
};

struct iv_stream {
    iv_stream_desc_t d;
    char label[256];
    pthread_mutex_t mu;
    struct slot *slots;
    uint64_t lru_head, lru_tail;  /* head = most recently (re)listed */
    uint64_t n_listed;            /* cached chunks, all listed (mu) */
    int recompared;               /* evict_oldest last answered 0 to be compared again (mu) */
    size_t budget;                /* fixed at creation */
    atomic_size_t used;           /* changed under mu, read by releases without it */
    atomic_int republish;         /* the shared budget was told nothing is evictable */
    struct scratch *free_scratch;
    uint64_t misses, evictions, bytes_decompressed;
    /* Buffer arena (NULL: none) and its use (mu): never-used slots from
     * arena_next on, freed ones on the arena's stack of slot numbers. */
    iv_stream_arena_t *arena;
    size_t arena_next;
    size_t arena_out;      /* slots handed out and not yet returned */
    size_t arena_free_n;   /* slots on that stack whose pages are kept */
    /* Shared budget (NULL: none); mbc's charge is `used`. */
    iv_membudget_t *mb;
    iv_mb_client_t mbc;
};

/* Freed arena slots that keep their pages for the next miss. */
#define KEEP_FREE_SLOTS 2

static void desc_free(iv_stream_desc_t *d)
{
    free(d->chunk_addr);
    free(d->chunk_size);
    free(d->chunk_mask);
    free(d->owned_buf);
    free((void *)d->chunk_sum);
    iv_file_close(d->file);
    if (d->owned_map) munmap(d->owned_map, d->owned_map_len);
    d->chunk_addr = d->chunk_size = NULL;
    d->chunk_mask = NULL;
    d->chunk_sum = NULL;
    d->file = NULL;
    d->owned_buf = NULL;
    d->owned_map = NULL;
}

/* Bytes a chunk buffer needs: stages before a fletcher32 check produce 4
 * bytes more than the chunk. */
static size_t cap_for(uint64_t chunk_len) { return (size_t)chunk_len + 64; }
/* Unfiltered chunks need their bytes alone (a 4 KiB chunk stays in one
 * allocator size class). */
static size_t buf_cap(const iv_stream_t *s)
{
    return s->d.pipe.n ? cap_for(s->d.chunk_len) : (size_t)s->d.chunk_len;
}

/* AddressSanitizer cannot see past a slot into the next one: sanitized
 * builds take every buffer from malloc so that it checks them. */
#if defined(__SANITIZE_ADDRESS__)
#define IV_ARENA 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IV_ARENA 0
#endif
#endif
#ifndef IV_ARENA
#define IV_ARENA 1
#endif

struct iv_stream_arena {
    uint8_t *base;
    size_t slot_size, n_slots;
    uint64_t chunk_len;
    /* Freed slots, most recent on top: slot number << 1 | 1 while the
     * slot's pages are still there (kept for the next miss). */
    size_t *free_stack;
    size_t free_top;
};

/* Slots are whole pages, so that a freed slot's pages can all go back to
 * the OS (only address space is spent on the rounding). */
static size_t slot_size_for(uint64_t chunk_len) { return (cap_for(chunk_len) + 4095) & ~(size_t)4095; }

iv_stream_arena_t *iv_stream_arena_new(uint64_t length, uint64_t chunk_len, size_t cache_budget)
{
    if (!IV_ARENA || chunk_len == 0) return NULL;
    size_t slot = slot_size_for(chunk_len);
    uint64_t n_chunks = (length + chunk_len - 1) / chunk_len;
    size_t n = cache_budget / slot;
    if (n > n_chunks) n = (size_t)n_chunks;
    if (n == 0) return NULL;
    iv_stream_arena_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->free_stack = malloc(n * sizeof *a->free_stack);
    if (!a->free_stack) {
        free(a);
        return NULL;
    }
    void *m = mmap(NULL, n * slot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        free(a->free_stack);
        free(a);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(m, n * slot, MADV_HUGEPAGE);
#endif
    a->base = m;
    a->slot_size = slot;
    a->n_slots = n;
    a->chunk_len = chunk_len;
    return a;
}

size_t iv_stream_arena_bytes(const iv_stream_arena_t *a) { return a ? a->slot_size * a->n_slots : 0; }

void iv_stream_arena_touch(iv_stream_arena_t *a, size_t from, size_t to)
{
    size_t n = iv_stream_arena_bytes(a);
    if (to > n) to = n;
    /* A write: a read would map the shared zero page and commit nothing. */
    for (size_t i = from & ~(size_t)4095; i < to; i += 4096) ((volatile uint8_t *)a->base)[i] = 0;
}

void iv_stream_arena_free(iv_stream_arena_t *a)
{
    if (!a) return;
    munmap(a->base, a->slot_size * a->n_slots);
    free(a->free_stack);
    free(a);
}

/* Takes the arena over (made ahead, or made here when NULL); without one
 * every buffer comes from malloc. */
static void arena_adopt(iv_stream_t *s, iv_stream_arena_t *a)
{
    if (a && a->chunk_len != s->d.chunk_len) {
        iv_stream_arena_free(a);
        a = NULL;
    }
    if (s->d.no_arena) {
        iv_stream_arena_free(a);
        a = NULL;
    } else if (!a) {
        a = iv_stream_arena_new(s->d.length, s->d.chunk_len, s->budget);
    }
    s->arena = a;
}

static int in_arena(const iv_stream_t *s, const uint8_t *p)
{
    return s->arena && p >= s->arena->base && p < s->arena->base + iv_stream_arena_bytes(s->arena);
}

/* A buffer of buf_cap bytes; the caller does not hold mu. */
static uint8_t *buf_alloc(iv_stream_t *s)
{
    uint8_t *b = NULL;
    if (s->arena) {
        pthread_mutex_lock(&s->mu);
        iv_stream_arena_t *a = s->arena;
        if (a->free_top) {
            size_t e = a->free_stack[--a->free_top];
            b = a->base + a->slot_size * (e >> 1);
            if (e & 1) s->arena_free_n--;
        } else if (s->arena_next < s->arena->n_slots) {
            b = s->arena->base + s->arena->slot_size * s->arena_next++;
        }
        if (b) s->arena_out++;
        pthread_mutex_unlock(&s->mu);
    }
    return b ? b : malloc(buf_cap(s));
}

/* Returns a buffer; the caller holds mu, or is the only user of s. */
static void buf_free(iv_stream_t *s, uint8_t *b)
{
    if (!b) return;
    if (!in_arena(s, b)) {
        free(b);
        return;
    }
    iv_stream_arena_t *a = s->arena;
    size_t slot = (size_t)(b - a->base) / a->slot_size;
    int keep = s->arena_free_n < KEEP_FREE_SLOTS;
    if (keep) {
        s->arena_free_n++;
    } else {
        /* The slot's pages go back to the OS; its next use faults them
         * in afresh. */
        (void)madvise(b, a->slot_size, MADV_DONTNEED);
    }
    a->free_stack[a->free_top++] = slot << 1 | (size_t)keep;
    s->arena_out--;
}

static void buf_put(iv_stream_t *s, uint8_t *b)
{
    pthread_mutex_lock(&s->mu);
    buf_free(s, b);
    pthread_mutex_unlock(&s->mu);
}

int iv_stream_create(iv_stream_desc_t *desc, size_t cache_budget, iv_stream_t **out, iv_err_t *err)
{
    return iv_stream_create_in(desc, cache_budget, NULL, out, err);
}

int iv_stream_create_in(iv_stream_desc_t *desc, size_t cache_budget, iv_stream_arena_t *arena,
                        iv_stream_t **out, iv_err_t *err)
{
    *out = NULL;
    iv_stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        iv_stream_arena_free(arena);
        desc_free(desc);
        return iv_fail(err, IV_ENOMEM, "out of memory creating stream");
    }
    s->d = *desc;
    snprintf(s->label, sizeof s->label, "%s", desc->label ? desc->label : "packed_indices");
    s->d.label = s->label;
    s->budget = cache_budget;
    atomic_init(&s->used, 0);
    atomic_init(&s->republish, 0);
    s->lru_head = s->lru_tail = NIL;
    if (s->d.chunked) {
        s->slots = calloc(s->d.n_chunks ? s->d.n_chunks : 1, sizeof *s->slots);
        if (!s->slots) {
            iv_stream_arena_free(arena);
            desc_free(&s->d);
            free(s);
            return iv_fail(err, IV_ENOMEM, "out of memory for %llu chunk slots",
                           (unsigned long long)desc->n_chunks);
        }
        for (uint64_t c = 0; c < s->d.n_chunks; c++) {
            struct slot *e = &s->slots[c];
            atomic_init(&e->buf, NULL);
            atomic_init(&e->pins, 0);
            atomic_init(&e->ref, 0);
            atomic_init(&e->hits, 0);
            e->prev = e->next = NIL;
        }
        arena_adopt(s, arena);
    } else {
        iv_stream_arena_free(arena);
        /* Contiguous bytes are served in place, in virtual chunks of 1 MiB
         * so that the readers see one chunk model. */
        s->d.chunk_len = 1u << 20;
        s->d.n_chunks = (s->d.length + s->d.chunk_len - 1) / s->d.chunk_len;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void iv_stream_destroy(iv_stream_t *s)
{
    if (!s) return;
    /* Out of the shared budget first: no eviction can reach s after this. */
    if (s->mb) {
        iv_membudget_leave(&s->mbc);
        iv_membudget_uncharge(&s->mbc, atomic_load(&s->used));
    }
    if (s->slots) {
        for (uint64_t c = 0; c < s->d.n_chunks; c++) buf_free(s, atomic_load(&s->slots[c].buf));
        free(s->slots);
    }
    iv_stream_arena_free(s->arena);
    while (s->free_scratch) {
        struct scratch *n = s->free_scratch->next;
        free(s->free_scratch);
        s->free_scratch = n;
    }
    desc_free(&s->d);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

uint64_t iv_stream_length(const iv_stream_t *s) { return s->d.length; }
uint64_t iv_stream_chunk_len(const iv_stream_t *s) { return s->d.chunk_len; }
uint64_t iv_stream_n_chunks(const iv_stream_t *s) { return s->d.n_chunks; }

int iv_stream_desc_contig(iv_stream_desc_t *d, uint64_t addr, uint64_t len)
{
    return iv_stream_desc_contig_len(d, addr, len, IV_STREAM_CONTIG_CHUNK);
}

void iv_stream_desc_virtual(iv_stream_desc_t *d, uint64_t addr, uint64_t len, uint64_t cl)
{
    d->chunked = 1;
    d->file_contig = 1;
    d->pipe.n = 0;
    d->chunk_len = cl;
    d->n_chunks = (len + cl - 1) / cl;
    d->chunk_addr = d->chunk_size = NULL;
    d->chunk_mask = NULL;
    d->contig_addr = addr;
}

int iv_stream_desc_contig_len(iv_stream_desc_t *d, uint64_t addr, uint64_t len, uint64_t cl)
{
    iv_stream_desc_virtual(d, addr, len, cl);
    size_t nc = (size_t)(d->n_chunks ? d->n_chunks : 1);
    d->chunk_addr = malloc(nc * sizeof *d->chunk_addr);
    d->chunk_size = malloc(nc * sizeof *d->chunk_size);
    d->chunk_mask = calloc(nc, sizeof *d->chunk_mask);
    if (!d->chunk_addr || !d->chunk_size || !d->chunk_mask) return -1;
    for (uint64_t c = 0; c < d->n_chunks; c++) {
        uint64_t left = len - c * cl;
        d->chunk_addr[c] = addr + c * cl;
        d->chunk_size[c] = left < cl ? left : cl;
    }
    return 0;
}

static size_t chunk_bytes(const iv_stream_t *s, uint64_t c)
{
    uint64_t start = c * s->d.chunk_len;
    uint64_t left = s->d.length - start;
    return (size_t)(left < s->d.chunk_len ? left : s->d.chunk_len);
}

/* Chunk c's place and stored bytes: from the table, or, for virtual
 * chunks (no table), from where the range starts. */
static uint64_t stored_at(const iv_stream_t *s, uint64_t c)
{
    return s->d.chunk_addr ? s->d.chunk_addr[c] : s->d.contig_addr + c * s->d.chunk_len;
}

static uint64_t stored_size(const iv_stream_t *s, uint64_t c)
{
    return s->d.chunk_size ? s->d.chunk_size[c] : chunk_bytes(s, c);
}

/* Tells the shared budget the tick of the LRU tail (UINT64_MAX: nothing
 * listed, or every listed chunk pinned when `none`); the caller holds mu. */
static void publish_as(iv_stream_t *s, int none)
{
    if (!s->mb) return;
    if (s->lru_tail != NIL && !none)
        iv_membudget_publish(&s->mbc, s->slots[s->lru_tail].tick, chunk_bytes(s, s->lru_tail));
    else
        iv_membudget_publish(&s->mbc, UINT64_MAX, 0);
    if (!none) atomic_store(&s->republish, 0);
}

static void publish(iv_stream_t *s) { publish_as(s, 0); }

/* LRU list operations; the caller holds mu. */
static void lru_unlink(iv_stream_t *s, uint64_t c)
{
    struct slot *e = &s->slots[c];
    if (e->prev != NIL) s->slots[e->prev].next = e->next;
    else if (s->lru_head == c) s->lru_head = e->next;
    if (e->next != NIL) s->slots[e->next].prev = e->prev;
    else if (s->lru_tail == c) s->lru_tail = e->prev;
    e->prev = e->next = NIL;
}

static void lru_push_head(iv_stream_t *s, uint64_t c)
{
    struct slot *e = &s->slots[c];
    e->tick = s->mb ? iv_membudget_tick(s->mb) : 0;
    atomic_store_explicit(&e->ref, 0, memory_order_relaxed);
    e->prev = NIL;
    e->next = s->lru_head;
    if (s->lru_head != NIL) s->slots[s->lru_head].prev = c;
    s->lru_head = c;
    if (s->lru_tail == NIL) s->lru_tail = c;
}

/* Sends listed chunk c back to the head (a second chance); mu held. */
static void lru_again(iv_stream_t *s, uint64_t c)
{
    lru_unlink(s, c);
    lru_push_head(s, c);
}

/* Second chances one eviction gives (used chunks sent back to the head)
 * before used chunks may go too: it bounds the work under the lock when
 * every chunk is in use. */
#define SECOND_CHANCES 32

/* Whether listed chunk c must not go now: pinned, or used since it was
 * listed when honor_ref.  mu held.  Sequentially consistent against the
 * release's unpin (see iv_stream_release). */
static int keep_chunk(iv_stream_t *s, uint64_t c, int honor_ref)
{
    struct slot *e = &s->slots[c];
    if (atomic_load(&e->pins) != 0) return 1;
    return honor_ref && atomic_load_explicit(&e->ref, memory_order_relaxed);
}

/* Frees the cached chunk c unless a reader holds it (mu held): its
 * bytes, or 0 when pinned.  No hit can pin it once pins is PIN_DEAD. */
static size_t try_evict(iv_stream_t *s, uint64_t c)
{
    struct slot *e = &s->slots[c];
    unsigned none = 0;
    if (!atomic_compare_exchange_strong(&e->pins, &none, PIN_DEAD)) return 0;
    size_t n = chunk_bytes(s, c);
    lru_unlink(s, c);
    s->n_listed--;
    s->recompared = 0;
    atomic_fetch_sub(&s->used, n);
    if (s->mb) iv_membudget_uncharge(&s->mbc, n);
    uint8_t *b = atomic_load_explicit(&e->buf, memory_order_relaxed);
    atomic_store_explicit(&e->buf, NULL, memory_order_relaxed);
    buf_free(s, b);
    s->evictions++;
    atomic_store_explicit(&e->pins, 0, memory_order_release);
    return n;
}

/* Frees chunks from the LRU tail, giving a used or pinned one a second
 * chance, until the stream is within its budget or every chunk left is
 * pinned.  mu held. */
static void evict_over(iv_stream_t *s)
{
    unsigned chances = 0;
    uint64_t steps = 2 * s->n_listed + 2;
    while (atomic_load(&s->used) > s->budget && s->lru_tail != NIL && steps-- > 0) {
        uint64_t c = s->lru_tail;
        if (keep_chunk(s, c, chances < SECOND_CHANCES) || try_evict(s, c) == 0) {
            lru_again(s, c);
            chances++;
        }
    }
    publish(s);
}

/* evict_oldest's walk from the tail, under mu: the bytes evicted (0:
 * none); *moved when a tail went back to the head, *all_pinned cleared
 * when one seen was not pinned. */
static size_t evict_tail(iv_stream_t *s, int *moved, int *all_pinned)
{
    int honor = !s->recompared;
    unsigned chances = 0;
    size_t n = 0;
    for (uint64_t steps = s->n_listed; s->lru_tail != NIL && steps > 0; steps--) {
        uint64_t t = s->lru_tail;
        int keep = keep_chunk(s, t, honor && chances < SECOND_CHANCES);
        if (!keep && *moved) {
            *all_pinned = 0;
            break;
        }
        if (!keep && (n = try_evict(s, t)) > 0) break;
        /* Used, pinned, or pinned just now: a second chance. */
        if (atomic_load(&s->slots[t].pins) == 0) *all_pinned = 0;
        lru_again(s, t);
        *moved = 1;
        chances++;
    }
    return n;
}

/* Whether every listed chunk is pinned (under mu). */
static int all_still_pinned(iv_stream_t *s)
{
    for (uint64_t t = s->lru_tail; t != NIL; t = s->slots[t].prev)
        if (atomic_load(&s->slots[t].pins) == 0) return 0;
    return 1;
}

/*
 * The shared budget's evict callback.  The tail goes when it is neither
 * pinned nor used since it was listed.  Otherwise such tails go back to
 * the head and the callback answers 0 with the new tail published, so
 * that the budget compares it with the other streams' again; the next
 * call then takes the first unpinned tail even if used (at most one such
 * round an eviction).  When every chunk is pinned it publishes none.
 */
static size_t evict_oldest(void *ctx)
{
    iv_stream_t *s = ctx;
    pthread_mutex_lock(&s->mu);
    int moved = 0, all_pinned = 1;
    size_t n = evict_tail(s, &moved, &all_pinned);
    int none = n == 0 && moved && all_pinned;
    if (none) {
        /* Say so before looking once more: a release that unpins a chunk
         * after this look sees the flag and publishes again (both
         * sequentially consistent, so one sees the other). */
        atomic_store(&s->republish, 1);
        none = all_still_pinned(s);
    }
    if (n == 0 && moved && !none) s->recompared = 1;
    publish_as(s, none);
    pthread_mutex_unlock(&s->mu);
    return n;
}

void iv_stream_join_budget(iv_stream_t *s, iv_membudget_t *mb, size_t floor)
{
    if (!s->d.chunked || !mb || s->mb) return;
    s->mbc.evict = evict_oldest;
    s->mbc.ctx = s;
    s->mbc.floor = floor;
    iv_membudget_join(mb, &s->mbc);
    pthread_mutex_lock(&s->mu);
    s->mb = mb;
    iv_membudget_charge(&s->mbc, atomic_load(&s->used));
    for (uint64_t c = s->lru_head; c != NIL; c = s->slots[c].next)
        s->slots[c].tick = iv_membudget_tick(mb);
    publish(s);
    pthread_mutex_unlock(&s->mu);
}

/* Scratch buffers serve two uses: a pipeline stage's output and the
 * stored bytes of a chunk read from the file; one size fits both. */
static size_t scratch_cap(const iv_stream_t *s)
{
    size_t c = (size_t)s->d.chunk_len + 64;
    return s->d.file && s->d.max_stored > c ? (size_t)s->d.max_stored : c;
}

static struct scratch *scratch_get(iv_stream_t *s)
{
    pthread_mutex_lock(&s->mu);
    struct scratch *sc = s->free_scratch;
    if (sc) s->free_scratch = sc->next;
    pthread_mutex_unlock(&s->mu);
    if (!sc) sc = malloc(sizeof *sc + scratch_cap(s));
    return sc;
}

static void scratch_put(iv_stream_t *s, struct scratch *sc)
{
    if (!sc) return;
    pthread_mutex_lock(&s->mu);
    sc->next = s->free_scratch;
    s->free_scratch = sc;
    pthread_mutex_unlock(&s->mu);
}

/* Checks the stored bytes of chunk c read from the file against the
 * checksum the row-index pass took, or takes it during that pass.  Two
 * threads may read the same chunk in the pass; both store the same
 * value, or the second one compares. */
static int sum_check(iv_stream_t *s, uint64_t c, const uint8_t *p, size_t n, iv_err_t *err)
{
    if (!s->d.chunk_sum) return 0;
    /* One sum a chunk (even an empty one), or one a piece of sum_len
     * bytes, the last shorter. */
    size_t step = s->d.sum_len ? (size_t)s->d.sum_len : n;
    uint64_t k = s->d.sum_len ? c * (s->d.chunk_len / s->d.sum_len) : c;
    size_t i = 0;
    int bad = 0;
    do {
        size_t len = n - i < step ? n - i : step;
        uint64_t h = iv_file_sum(p + i, len);
        uint64_t want = atomic_load_explicit(&s->d.chunk_sum[k], memory_order_relaxed);
        if (want == 0 && !s->d.sums_sealed) atomic_store_explicit(&s->d.chunk_sum[k], h, memory_order_relaxed);
        else bad = want != h;
        i += len;
        k++;
    } while (!bad && i < n);
    if (!bad) return 0;
    char m[480];
    snprintf(m, sizeof m, "%.160s changed on disk after it was loaded (the stored bytes of chunk %llu "
             "at offset %llu differ from those indexed at load); reload the dataset",
             iv_file_path(s->d.file), (unsigned long long)c,
             (unsigned long long)stored_at(s, c));
    iv_file_mark(s->d.file, IV_FILE_CHANGED, m);
    return iv_fail(err, IV_EFILE_CHANGED, "%s", m);
}

/* The stored bytes of chunk c, read into `into` (at least chunk_size[c]
 * bytes) and checked; `into` is the decode's source from then on.  A read
 * or a check that fails says so for the whole stream (IV_EFILE_CHANGED):
 * the bytes are never decoded, so no other file's data is ever served. */
static int fetch_chunk(iv_stream_t *s, uint64_t c, uint8_t *into, iv_err_t *err)
{
    size_t n = (size_t)stored_size(s, c);
    char what[64];
    snprintf(what, sizeof what, "chunk %llu", (unsigned long long)c);
    iv_err_t sub = {0};
    int rc = iv_file_read(s->d.file, stored_at(s, c), into, n, what, &sub);
    if (rc < 0) return iv_fail(err, rc, "%s", sub.msg);
    return sum_check(s, c, into, n, err);
}

/* A decode failure of chunk c (its message in sub), said with where the
 * chunk is stored. */
static int chunk_fail(const iv_stream_t *s, uint64_t c, int rc, const iv_err_t *sub, iv_err_t *err)
{
    return iv_fail(err, rc, "%s: chunk %llu (file offset %llu, %zu stored bytes): %s",
                   s->label, (unsigned long long)c, (unsigned long long)stored_at(s, c),
                   (size_t)stored_size(s, c), sub->msg);
}

/* Whether chunk c is stored as is: no filter, or every one skipped. */
static int unfiltered(const iv_stream_t *s, uint64_t c)
{
    unsigned all = (1u << s->d.pipe.n) - 1;
    return s->d.pipe.n == 0 || (s->d.chunk_mask[c] & all) == all;
}

/* Chunk c stored as is, want bytes: read straight into the cache buffer
 * when it comes from the file. */
static int load_unfiltered(iv_stream_t *s, uint64_t c, uint8_t *buf, size_t want, iv_err_t *err)
{
    size_t src_len = (size_t)stored_size(s, c);
    if (src_len != want) {
        iv_err_t sub = {0};
        int rc = iv_fail(&sub, IV_ECORRUPT, "unfiltered chunk holds %zu bytes, expected %zu",
                         src_len, want);
        return chunk_fail(s, c, rc, &sub, err);
    }
    if (s->d.file) return fetch_chunk(s, c, buf, err);
    memcpy(buf, s->d.map + stored_at(s, c), want);
    return 0;
}

/* Chunk c through its filter pipeline into buf, with a scratch buffer for
 * the stages and, from a file, one for the stored bytes. */
static int load_filtered(iv_stream_t *s, uint64_t c, uint8_t *buf, iv_err_t *err)
{
    size_t full = (size_t)s->d.chunk_len, src_len = (size_t)stored_size(s, c);
    const uint8_t *src = s->d.file ? NULL : s->d.map + stored_at(s, c);
    struct scratch *sc = scratch_get(s), *rd = NULL;
    if (sc && s->d.file) {
        if (src_len > scratch_cap(s)) {
            scratch_put(s, sc);
            return iv_fail(err, IV_ECORRUPT, "%s: chunk %llu stores %zu bytes, more than "
                           "the chunk table allows (%zu)", s->label, (unsigned long long)c,
                           src_len, scratch_cap(s));
        }
        rd = scratch_get(s);
    }
    if (!sc || (s->d.file && !rd)) {
        scratch_put(s, sc);
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for scratch", s->label);
    }
    int rc = rd ? fetch_chunk(s, c, rd->data, err) : 0;
    if (rc == 0) {
        iv_err_t sub = {0};
        size_t got = 0;
        rc = iv_pipeline_decode(&s->d.pipe, s->d.chunk_mask[c], rd ? rd->data : src, src_len, buf,
                                buf_cap(s), sc->data, full + 64, full, &got, &sub);
        if (rc < 0) rc = chunk_fail(s, c, rc, &sub, err);
    }
    scratch_put(s, rd);
    scratch_put(s, sc);
    return rc;
}

/* Decompresses chunk c into a new buffer of chunk_len bytes. */
static int load_chunk(iv_stream_t *s, uint64_t c, uint8_t **out, iv_err_t *err)
{
    size_t full = (size_t)s->d.chunk_len;
    uint8_t *buf = buf_alloc(s);
    if (!buf) return iv_fail(err, IV_ENOMEM, "%s: out of memory for chunk %llu", s->label,
                             (unsigned long long)c);
    int rc = 0;
    if (stored_at(s, c) == UINT64_MAX)
        memset(buf, 0, full);   /* never written: HDF5's fill value, zero */
    else if (unfiltered(s, c))
        /* A contiguous range's last virtual chunk is what is left of it. */
        rc = load_unfiltered(s, c, buf, s->d.file_contig ? chunk_bytes(s, c) : full, err);
    else
        rc = load_filtered(s, c, buf, err);
    if (rc < 0) {
        buf_put(s, buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* Takes the checksum of stored chunk c when the pass did not read it,
 * reading it into *rd (a scratch buffer taken on first use). */
static int sum_unread(iv_stream_t *s, uint64_t c, struct scratch **rd, iv_err_t *err)
{
    uint64_t k = s->d.sum_len ? c * (s->d.chunk_len / s->d.sum_len) : c;
    if (stored_at(s, c) == UINT64_MAX || atomic_load(&s->d.chunk_sum[k]) != 0) return 0;
    if (!*rd && !(*rd = scratch_get(s)))
        return iv_fail(err, IV_ENOMEM, "%s: out of memory for scratch", s->label);
    if (stored_size(s, c) > scratch_cap(s))
        return iv_fail(err, IV_ECORRUPT, "%s: chunk %llu stores %llu bytes, more than the "
                       "chunk table allows", s->label, (unsigned long long)c,
                       (unsigned long long)stored_size(s, c));
    return fetch_chunk(s, c, (*rd)->data, err);
}

int iv_stream_seal(iv_stream_t *s, iv_err_t *err)
{
    if (!s->d.chunked || !s->d.file || !s->d.chunk_sum || s->d.sums_sealed) return 0;
    struct scratch *rd = NULL;
    int rc = 0;
    for (uint64_t c = 0; c < s->d.n_chunks && rc == 0; c++) rc = sum_unread(s, c, &rd, err);
    scratch_put(s, rd);
    if (rc == 0) s->d.sums_sealed = 1;
    return rc;
}

uint64_t iv_stream_desc_n_sums(const iv_stream_desc_t *d)
{
    return d->sum_len ? (d->length + d->sum_len - 1) / d->sum_len : d->n_chunks;
}

uint64_t iv_stream_sums(const iv_stream_t *s, uint64_t *out)
{
    if (!s->d.chunked || !s->d.file || !s->d.chunk_sum || !s->d.sums_sealed || s->d.sum_len) return 0;
    for (uint64_t c = 0; c < s->d.n_chunks; c++) out[c] = atomic_load(&s->d.chunk_sum[c]);
    return s->d.n_chunks;
}

int iv_stream_seal_with(iv_stream_t *s, const uint64_t *sums, uint64_t n, iv_err_t *err)
{
    if (!s->d.chunked || !s->d.file || !s->d.chunk_sum || s->d.sums_sealed || n != iv_stream_desc_n_sums(&s->d))
        return iv_fail(err, IV_EINTERNAL, "%s: checksums kept for another stream", s->label);
    for (uint64_t c = 0; c < n; c++)
        if ((s->d.sum_len || stored_at(s, c) != UINT64_MAX) && sums[c] == 0)
            return iv_fail(err, IV_ECORRUPT, "%s: kept checksum of chunk %llu missing", s->label,
                           (unsigned long long)c);
    for (uint64_t c = 0; c < n; c++) atomic_store(&s->d.chunk_sum[c], sums[c]);
    s->d.sums_sealed = 1;
    return 0;
}

iv_file_t *iv_stream_file(const iv_stream_t *s) { return s->d.file; }

/* The cache lines of p[0 .. n), asked for. */
static void prefetch_lines(const uint8_t *p, uint64_t n)
{
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, e = (uintptr_t)p + n; a < e; a += 64)
        __builtin_prefetch((const void *)a);
}

void iv_stream_prefetch(iv_stream_t *s, uint64_t off, uint64_t len)
{
    if (len > IV_STREAM_PREFETCH_MAX) len = IV_STREAM_PREFETCH_MAX;
    if (!s->d.chunked) {   /* one piece of memory: no slot, its bytes (at least the first) */
        if (len == 0) len = 1;
        if (s->d.contig && off < s->d.length)
            prefetch_lines(s->d.contig + off, len < s->d.length - off ? len : s->d.length - off);
        return;
    }
    uint64_t c = off / s->d.chunk_len;
    if (c >= s->d.n_chunks) return;
    if (!len) {
        __builtin_prefetch(&s->slots[c]);
        return;
    }
    /* A prefetch never faults: a buffer freed meanwhile costs nothing,
     * and every line asked for lies in a slot's buffer. */
    uint64_t in = off % s->d.chunk_len, here = s->d.chunk_len - in;
    const uint8_t *b = atomic_load_explicit(&s->slots[c].buf, memory_order_relaxed);
    if (b) prefetch_lines(b + in, len < here ? len : here);
    if (len > here && c + 1 < s->d.n_chunks) {
        b = atomic_load_explicit(&s->slots[c + 1].buf, memory_order_relaxed);
        if (b) prefetch_lines(b, len - here < s->d.chunk_len ? len - here : s->d.chunk_len);
    }
}

/* A hit: pin without the lock.  The pin holds only if buf is still set
 * once it is taken (an eviction may have come between).  1 when pinned,
 * with *data set. */
static int pin_unlocked(struct slot *e, const uint8_t **data)
{
    if (!atomic_load_explicit(&e->buf, memory_order_acquire)) return 0;
    unsigned p = atomic_load_explicit(&e->pins, memory_order_relaxed);
    while (!(p & PIN_DEAD)) {
        if (!atomic_compare_exchange_weak_explicit(&e->pins, &p, p + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        uint8_t *b = atomic_load_explicit(&e->buf, memory_order_acquire);
        if (b) {
            if (!atomic_load_explicit(&e->ref, memory_order_relaxed))
                atomic_store_explicit(&e->ref, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&e->hits, 1, memory_order_relaxed);
            *data = b;
            return 1;
        }
        atomic_fetch_sub_explicit(&e->pins, 1, memory_order_release);
        break;
    }
    return 0;
}

/* A hit under the lock, or a miss counted: 1 when pinned. */
static int pin_locked(iv_stream_t *s, struct slot *e, const uint8_t **data)
{
    pthread_mutex_lock(&s->mu);
    uint8_t *have = atomic_load_explicit(&e->buf, memory_order_relaxed);
    if (have) {
        atomic_fetch_add_explicit(&e->pins, 1, memory_order_acq_rel);
        atomic_store_explicit(&e->ref, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&e->hits, 1, memory_order_relaxed);
        *data = have;
    } else {
        s->misses++;
    }
    pthread_mutex_unlock(&s->mu);
    return have != NULL;
}

/* Puts the len bytes just decompressed for chunk c in the cache, pinned,
 * unless another thread installed it first (then theirs is kept).
 * Returns the buffer now cached. */
static const uint8_t *install_chunk(iv_stream_t *s, uint64_t c, uint8_t *buf, size_t len)
{
    struct slot *e = &s->slots[c];
    pthread_mutex_lock(&s->mu);
    s->bytes_decompressed += len;
    uint8_t *have = atomic_load_explicit(&e->buf, memory_order_relaxed);
    if (have) {
        /* Another thread installed it first; keep theirs. */
        buf_free(s, buf);
        atomic_fetch_add_explicit(&e->pins, 1, memory_order_acq_rel);
        atomic_store_explicit(&e->ref, 1, memory_order_relaxed);
    } else {
        /* Counted first: a release that unpins a chunk after evict_over
         * looked at it sees the stream over budget and evicts (both
         * sequentially consistent, so one sees the other). */
        atomic_fetch_add(&s->used, len);
        if (s->mb) iv_membudget_charge(&s->mbc, len);
        evict_over(s);
        atomic_fetch_add_explicit(&e->pins, 1, memory_order_acq_rel);
        atomic_store_explicit(&e->buf, buf, memory_order_release);
        lru_push_head(s, c);
        s->n_listed++;
        publish(s);
        have = buf;
    }
    pthread_mutex_unlock(&s->mu);
    return have;
}

int iv_stream_acquire(iv_stream_t *s, uint64_t c, const uint8_t **data, size_t *len,
                      uint64_t *decompressed, iv_err_t *err)
{
    if (decompressed) *decompressed = 0;
    if (c >= s->d.n_chunks)
        return iv_fail(err, IV_EINTERNAL, "%s: chunk %llu past the end (%llu chunks)", s->label,
                       (unsigned long long)c, (unsigned long long)s->d.n_chunks);
    *len = chunk_bytes(s, c);
    if (!s->d.chunked) {
        *data = s->d.contig + c * s->d.chunk_len;
        return 0;
    }
    struct slot *e = &s->slots[c];
    if (pin_unlocked(e, data) || pin_locked(s, e, data)) return 0;
    uint8_t *buf = NULL;
    IV_TRY(load_chunk(s, c, &buf, err));
    /* Room in the shared budget first (never under mu: see membudget.h). */
    if (s->mb) (void)iv_membudget_make_room(s->mb, &s->mbc, *len);
    *data = install_chunk(s, c, buf, *len);
    if (decompressed) *decompressed = *len;
    return 0;
}

void iv_stream_release(iv_stream_t *s, uint64_t c)
{
    if (!s->d.chunked) return;
    struct slot *e = &s->slots[c];
    unsigned left = atomic_fetch_sub(&e->pins, 1) - 1;
    /* Over budget (everything else was pinned when it came in), or the
     * shared budget was told that nothing here could go (evict_oldest):
     * the lock, now that this chunk can. */
    if (left == 0 && (atomic_load(&s->used) > s->budget || atomic_load(&s->republish))) {
        pthread_mutex_lock(&s->mu);
        evict_over(s);
        pthread_mutex_unlock(&s->mu);
    }
    /* Over the shared budget for the same reason: the process's oldest
     * chunk goes, which may be this one or another dataset's. */
    if (s->mb && iv_membudget_used(s->mb) > iv_membudget_bytes(s->mb))
        (void)iv_membudget_make_room(s->mb, &s->mbc, 0);
}

/* Bytes of the scratch buffers kept for reuse (under mu). */
static size_t free_scratch_bytes(const iv_stream_t *s)
{
    size_t n = 0;
    for (struct scratch *sc = s->free_scratch; sc; sc = sc->next)
        n += sizeof *sc + (size_t)s->d.chunk_len + 64;
    return n;
}

static uint64_t total_hits(const iv_stream_t *s)
{
    uint64_t n = 0;
    for (uint64_t c = 0; s->d.chunked && c < s->d.n_chunks; c++)
        n += atomic_load_explicit(&s->slots[c].hits, memory_order_relaxed);
    return n;
}

void iv_stream_stats(iv_stream_t *s, iv_stream_stats_t *out)
{
    pthread_mutex_lock(&s->mu);
    out->budget = s->budget;
    out->shared_budget = s->mb ? iv_membudget_bytes(s->mb) : 0;
    out->floor = s->mb ? s->mbc.floor : 0;
    out->budget_evictions = s->mb ? (uint64_t)atomic_load(&s->mbc.evicted) : 0;
    out->used = atomic_load(&s->used);
    out->owned_bytes = s->d.owned_buf ? (size_t)s->d.length : 0;
    if (s->d.owned_map) out->owned_bytes += s->d.owned_map_len;
    /* Slots, then the table (addresses, sizes, masks) unless the chunks are virtual. */
    out->table_bytes = s->d.chunked ? (size_t)s->d.n_chunks * (sizeof *s->slots + (s->d.chunk_addr ? 20 : 0)) : 0;
    out->scratch_bytes = free_scratch_bytes(s);
    size_t used = atomic_load(&s->used);
    out->pinned_over_budget = used > s->budget ? used - s->budget : 0;
    out->hits = total_hits(s);
    out->misses = s->misses;
    out->evictions = s->evictions;
    out->bytes_decompressed = s->bytes_decompressed;
    pthread_mutex_unlock(&s->mu);
}

void iv_stream_drop_cache(iv_stream_t *s)
{
    if (!s->d.chunked) return;
    pthread_mutex_lock(&s->mu);
    for (uint64_t c = s->lru_tail; c != NIL;) {
        uint64_t up = s->slots[c].prev;
        (void)try_evict(s, c);   /* a pinned chunk stays */
        c = up;
    }
    publish(s);
    if (s->arena && s->arena_out == 0) {
        /* No slot is cached, pinned or being filled: hand the arena's pages
         * back to the OS and start it afresh, so that dropping the cache
         * lowers RSS. */
        (void)madvise(s->arena->base, iv_stream_arena_bytes(s->arena), MADV_DONTNEED);
        s->arena_next = 0;
        s->arena->free_top = 0;
        s->arena_free_n = 0;
    }
    pthread_mutex_unlock(&s->mu);
}
