/*
 * One memory budget for the decompressed-chunk caches of every dataset of
 * a process.
 *
 * Each cache (a stream, stream.h) joins the budget as a client.  Bytes a
 * client holds are charged to one process-wide counter; when a client
 * needs room and the counter would pass the budget, the budget evicts the
 * entry that was used least recently among all clients: every client
 * publishes the use tick of its own LRU-oldest evictable entry, and the
 * smallest of those is, by construction, the oldest entry of the whole
 * process (the clients' LRU lists merged by tick).  So the budget is split
 * among datasets by use, with no shares to tune: a dataset nobody queries
 * gives its memory up to the ones being queried.
 *
 * A client may have a floor: other clients' pressure does not evict it
 * below that many bytes (it can still evict itself).  With floors the
 * bound is max(budget, sum of floors), plus the entries pinned at the
 * moment.  A per-client cap is the client's own business (stream.h).
 *
 * Threads: any thread may call any function.  Charging is a lock-free
 * counter; making room takes the budget's mutex and then, one at a time,
 * a client's own lock through its evict callback.  The lock order is
 * therefore budget, then client: a client must never call
 * iv_membudget_make_room, join or leave while holding its own lock.
 *
 * The default budget is a share of the memory the machine (or the
 * cgroup the process runs in) has available when the server starts
 * (iv_membudget_default).
 */
#ifndef IV_MEMBUDGET_H
#define IV_MEMBUDGET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct iv_membudget iv_membudget_t;

typedef struct iv_mb_client {
    /* Set by the owner before joining. */
    /* Frees the client's LRU-oldest evictable entry and uncharges it;
     * returns the bytes freed, 0 when nothing can go.  Called with the
     * budget's mutex held and no lock of the client held. */
    size_t (*evict)(void *ctx);
    void *ctx;
    size_t floor;                   /* others do not evict it below this */
    /* Owned by the budget. */
    atomic_size_t used;             /* bytes charged */
    atomic_uint_fast64_t oldest;    /* tick of its oldest evictable entry; UINT64_MAX: none */
    atomic_size_t oldest_bytes;     /* that entry's size */
    atomic_uint_fast64_t evicted;   /* entries taken by make_room (any requester) */
    iv_membudget_t *mb;
    struct iv_mb_client *prev, *next;
} iv_mb_client_t;

/* A budget of `bytes`; NULL when out of memory. */
iv_membudget_t *iv_membudget_new(size_t bytes);
/* Every client must have left. */
void iv_membudget_free(iv_membudget_t *mb);

size_t iv_membudget_bytes(const iv_membudget_t *mb);
size_t iv_membudget_used(const iv_membudget_t *mb);
/* Sum of the clients' floors. */
size_t iv_membudget_floors(iv_membudget_t *mb);
/* Changes the budget; when it shrinks, evicts down to it at once (as far
 * as unpinned entries allow). */
void iv_membudget_set_bytes(iv_membudget_t *mb, size_t bytes);

/* c->evict, c->ctx and c->floor set; c is linked in until it leaves. */
void iv_membudget_join(iv_membudget_t *mb, iv_mb_client_t *c);
/* Unlinks c (waiting for an eviction under way); c's charge stays until
 * it uncharges it, which it does as it frees its entries. */
void iv_membudget_leave(iv_mb_client_t *c);

/* A fresh, increasing use tick (for LRU order across clients). */
uint64_t iv_membudget_tick(iv_membudget_t *mb);
void iv_membudget_charge(iv_mb_client_t *c, size_t n);
void iv_membudget_uncharge(iv_mb_client_t *c, size_t n);
/* The client's oldest evictable entry (UINT64_MAX: none) and its size. */
static inline void iv_membudget_publish(iv_mb_client_t *c, uint64_t oldest_tick, size_t bytes)
{
    atomic_store_explicit(&c->oldest_bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&c->oldest, oldest_tick, memory_order_relaxed);
}

/*
 * Evicts entries, globally least recently used first, until `need` more
 * bytes fit in the budget or nothing evictable is left: any client above
 * its floor, and `self` (may be NULL) whatever its floor.  The caller
 * holds no client lock.  Returns 0 when the bytes fit, -1 when they do
 * not (the caller may still go over: entries in use are never refused).
 */
int iv_membudget_make_room(iv_membudget_t *mb, iv_mb_client_t *self, size_t need);

/*
 * Room for memory about to be touched ahead of its use (a cache arena
 * faulted in while a file loads): takes up to `want` bytes of what is
 * free now, charged as used, and returns how many; hand them back with
 * iv_membudget_unreserve once the entries themselves are charged.
 */
size_t iv_membudget_reserve(iv_membudget_t *mb, size_t want);
void iv_membudget_unreserve(iv_membudget_t *mb, size_t n);

/*
 * Memory this process may count on, read at start: the smaller of
 * MemAvailable (/proc/meminfo) and, when the process's cgroup (v2, or
 * v1's memory controller) sets a limit, that limit less the cgroup's
 * current use, the tightest over the cgroup's ancestors.  *source (may be
 * NULL) names where the figure came from ("meminfo" or "cgroup").  0 when
 * nothing could be read.
 */
uint64_t iv_mem_available(const char **source);
/* `percent` of iv_mem_available(), or `fallback` when that is unknown. */
size_t iv_membudget_default(unsigned percent, size_t fallback, const char **source,
                            uint64_t *available);

/* The process's resident and anonymous resident bytes (/proc/self/status);
 * 0 when unknown. */
void iv_mem_process(uint64_t *rss, uint64_t *anon);
/* Of the resident bytes, those freed with MADV_FREE that the kernel has
 * not taken back yet (LazyFree in /proc/self/smaps_rollup): the allocator
 * keeps freed pages so (server/alloc_conf.c), and the kernel reclaims them
 * before it runs short.  0 when unknown. */
uint64_t iv_mem_process_lazyfree(void);

#endif
