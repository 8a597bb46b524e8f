/*
 * The process-wide cache budget (see membudget.h).
 *
 * Why a merge of the clients' LRU lists and not per-dataset shares tuned
 * by hit rates: the merge is exact LRU over the whole process at the cost
 * of one scan of the clients per eviction (datasets number in tens, an
 * eviction frees a whole chunk), needs no tuning interval, and reacts at
 * once when the queries move from one dataset to another.  Shares
 * adjusted by hits and misses would lag behind a change of workload by
 * their adjustment period and still need a rule for the bytes between
 * shares.
 *
 * The counter is charged without the budget's mutex, so several threads
 * missing at once may each pass the budget by the entry they are adding;
 * make_room, run before an entry is added, brings the total back.  Over
 * budget beyond that only when everything left is pinned or protected by
 * a floor.
 */
#include "membudget.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct iv_membudget {
    atomic_size_t bytes;
    atomic_size_t used;
    atomic_uint_fast64_t tick;
    pthread_mutex_t mu;      /* the client list; held while evicting */
    iv_mb_client_t *clients;
};

iv_membudget_t *iv_membudget_new(size_t bytes)
{
    iv_membudget_t *mb = calloc(1, sizeof *mb);
    if (!mb) return NULL;
    if (pthread_mutex_init(&mb->mu, NULL) != 0) {
        free(mb);
        return NULL;
    }
    atomic_init(&mb->bytes, bytes);
    atomic_init(&mb->used, 0);
    atomic_init(&mb->tick, 1);
    return mb;
}

void iv_membudget_free(iv_membudget_t *mb)
{
    if (!mb) return;
    pthread_mutex_destroy(&mb->mu);
    free(mb);
}

size_t iv_membudget_bytes(const iv_membudget_t *mb) { return atomic_load(&((iv_membudget_t *)mb)->bytes); }
size_t iv_membudget_used(const iv_membudget_t *mb) { return atomic_load(&((iv_membudget_t *)mb)->used); }

size_t iv_membudget_floors(iv_membudget_t *mb)
{
    size_t sum = 0;
    pthread_mutex_lock(&mb->mu);
    for (iv_mb_client_t *c = mb->clients; c; c = c->next) sum += c->floor;
    pthread_mutex_unlock(&mb->mu);
    return sum;
}

void iv_membudget_set_bytes(iv_membudget_t *mb, size_t bytes)
{
    atomic_store(&mb->bytes, bytes);
    (void)iv_membudget_make_room(mb, NULL, 0);
}

void iv_membudget_join(iv_membudget_t *mb, iv_mb_client_t *c)
{
    atomic_init(&c->used, 0);
    atomic_init(&c->oldest, UINT64_MAX);
    atomic_init(&c->oldest_bytes, 0);
    atomic_init(&c->evicted, 0);
    c->mb = mb;
    pthread_mutex_lock(&mb->mu);
    c->prev = NULL;
    c->next = mb->clients;
    if (mb->clients) mb->clients->prev = c;
    mb->clients = c;
    pthread_mutex_unlock(&mb->mu);
}

void iv_membudget_leave(iv_mb_client_t *c)
{
    iv_membudget_t *mb = c->mb;
    if (!mb) return;
    pthread_mutex_lock(&mb->mu);
    if (c->prev) c->prev->next = c->next;
    else mb->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
    pthread_mutex_unlock(&mb->mu);
}

uint64_t iv_membudget_tick(iv_membudget_t *mb)
{
    return atomic_fetch_add_explicit(&mb->tick, 1, memory_order_relaxed);
}

void iv_membudget_charge(iv_mb_client_t *c, size_t n)
{
    atomic_fetch_add(&c->used, n);
    atomic_fetch_add(&c->mb->used, n);
}

void iv_membudget_uncharge(iv_mb_client_t *c, size_t n)
{
    atomic_fetch_sub(&c->used, n);
    atomic_fetch_sub(&c->mb->used, n);
}

static int fits(iv_membudget_t *mb, size_t need)
{
    size_t used = atomic_load(&mb->used), bytes = atomic_load(&mb->bytes);
    return used <= bytes && need <= bytes - used;
}

int iv_membudget_make_room(iv_membudget_t *mb, iv_mb_client_t *self, size_t need)
{
    if (fits(mb, need)) return 0;
    pthread_mutex_lock(&mb->mu);
    int rc = 0;
    while (!fits(mb, need)) {
        /* The oldest evictable entry of the process. */
        iv_mb_client_t *victim = NULL;
        uint64_t best = UINT64_MAX;
        for (iv_mb_client_t *c = mb->clients; c; c = c->next) {
            uint64_t t = atomic_load_explicit(&c->oldest, memory_order_relaxed);
            if (t >= best) continue;
            /* Others only while the eviction leaves them their floor. */
            if (c != self && atomic_load(&c->used) < c->floor + atomic_load(&c->oldest_bytes))
                continue;
            best = t;
            victim = c;
        }
        /* A client that publishes an entry may lose it to its own thread
         * meanwhile (a hit pins it): evict answers 0 and publishes its
         * next one, so the scan is repeated, not given up. */
        if (!victim) {
            rc = -1;
            break;
        }
        if (victim->evict(victim->ctx) > 0) {
            atomic_fetch_add(&victim->evicted, 1);
        } else if (atomic_load(&victim->oldest) == best) {
            rc = -1;   /* a client that cannot evict what it publishes */
            break;
        }
    }
    pthread_mutex_unlock(&mb->mu);
    return rc;
}

size_t iv_membudget_reserve(iv_membudget_t *mb, size_t want)
{
    size_t used = atomic_load(&mb->used);
    for (;;) {
        size_t bytes = atomic_load(&mb->bytes);
        size_t room = used < bytes ? bytes - used : 0;
        size_t take = want < room ? want : room;
        if (take == 0) return 0;
        if (atomic_compare_exchange_weak(&mb->used, &used, used + take)) return take;
    }
}

void iv_membudget_unreserve(iv_membudget_t *mb, size_t n)
{
    atomic_fetch_sub(&mb->used, n);
}

/* ---- how much memory there is ------------------------------------------ */

/* The first number in a small file; 0 when absent, UINT64_MAX for "max". */
static uint64_t read_u64(const char *path, int *ok)
{
    *ok = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[64];
    uint64_t v = 0;
    if (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "max", 3)) {
            v = UINT64_MAX;
            *ok = 1;
        } else if (sscanf(line, "%" SCNu64, &v) == 1) {
            *ok = 1;
        }
    }
    fclose(f);
    return v;
}

/* A "key value" line of a stat-like file (value in the file's unit). */
static uint64_t read_key(const char *path, const char *key, int *ok)
{
    *ok = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kl = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':')) continue;
        const char *p = line + kl + 1;
        while (*p == ' ' || *p == '\t') p++;
        if (sscanf(p, "%" SCNu64, &v) == 1) *ok = 1;
        break;
    }
    fclose(f);
    return v;
}

/* Room left under one cgroup folder's limit: limit - (usage - inactive
 * file pages, which the kernel reclaims before it kills); UINT64_MAX when
 * the folder sets no limit. */
static uint64_t cgroup_room(const char *dir, int v2)
{
    char p[4352];
    int ok;
    /* dir is at most 4200 bytes (cgroup_available), so none of these is cut. */
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes") >= sizeof p)
        return UINT64_MAX;
    uint64_t limit = read_u64(p, &ok);
    /* v1 spells "no limit" as a page-rounded 2^63. */
    if (!ok || limit == UINT64_MAX || limit >= ((uint64_t)1 << 62)) return UINT64_MAX;
    snprintf(p, sizeof p, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    uint64_t cur = read_u64(p, &ok);
    if (!ok) cur = 0;
    snprintf(p, sizeof p, "%s/memory.stat", dir);
    uint64_t inactive = read_key(p, v2 ? "inactive_file" : "total_inactive_file", &ok);
    if (!ok || inactive > cur) inactive = 0;
    cur -= inactive;
    return cur < limit ? limit - cur : 0;
}

/* The process's memory cgroup from /proc/self/cgroup: its path into
 * rel (cap bytes), and 1 for cgroup v2, 0 for v1, -1 when there is none. */
static int find_memory_cgroup(char *rel, size_t cap)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[4096];
    int v2 = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':');
        char *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        *b = '\0';
        const char *ctrl = a + 1;
        if (!strcmp(line, "0") && !ctrl[0] && v2 < 0) {
            v2 = 1;
            snprintf(rel, cap, "%s", b + 1);
        } else if (strstr(ctrl, "memory")) {
            /* v1's memory controller wins over a v2 line of a hybrid set-up. */
            v2 = 0;
            snprintf(rel, cap, "%s", b + 1);
        }
    }
    fclose(f);
    return v2;
}

/* The tightest room over the process's cgroup and its ancestors. */
static uint64_t cgroup_available(void)
{
    char rel[4096] = "";
    int v2 = find_memory_cgroup(rel, sizeof rel);
    if (v2 < 0) return UINT64_MAX;
    const char *root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    uint64_t best = UINT64_MAX;
    /* The folder and every ancestor up to the mount's root (a container's
     * own cgroup often appears as "/" there). */
    for (;;) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s%s", root, strcmp(rel, "/") ? rel : "");
        uint64_t r = cgroup_room(dir, v2);
        if (r < best) best = r;
        char *slash = strrchr(rel, '/');
        if (!slash || slash == rel) {
            if (!strcmp(rel, "/") || !rel[0]) break;
            snprintf(rel, sizeof rel, "/");
            continue;
        }
        *slash = '\0';
    }
    return best;
}

uint64_t iv_mem_available(const char **source)
{
    int ok;
    uint64_t kb = read_key("/proc/meminfo", "MemAvailable", &ok);
    uint64_t avail = ok ? kb * 1024 : 0;
    const char *src = ok ? "meminfo" : "none";
    uint64_t cg = cgroup_available();
    if (cg != UINT64_MAX && (!avail || cg < avail)) {
        avail = cg;
        src = "cgroup";
    }
    if (source) *source = src;
    return avail;
}

size_t iv_membudget_default(unsigned percent, size_t fallback, const char **source,
                            uint64_t *available)
{
    uint64_t a = iv_mem_available(source);
    if (available) *available = a;
    if (a == 0) return fallback;
    uint64_t b = a / 100 * percent + a % 100 * percent / 100;
    return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

void iv_mem_process(uint64_t *rss, uint64_t *anon)
{
    int ok;
    *rss = read_key("/proc/self/status", "VmRSS", &ok) * 1024;
    *anon = read_key("/proc/self/status", "RssAnon", &ok) * 1024;
}

uint64_t iv_mem_process_lazyfree(void)
{
    int ok;
    return read_key("/proc/self/smaps_rollup", "LazyFree", &ok) * 1024;
}
