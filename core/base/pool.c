/*
 * Worker pool (see pool.h).
 *
 * One mutex guards a ring buffer of jobs; workers sleep on a condition
 * variable.  The queue is bounded so that overload is visible at submit
 * time.  parallel_for uses an atomic item counter shared by the caller and
 * helper jobs: each participant claims the next item until none are left,
 * then the caller waits until the participants that did claim items have
 * finished.  Helper jobs that start after the range is exhausted return at
 * once, so a busy pool only delays them, never blocks the caller.
 */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "error.h"

struct iv_job {
    iv_job_fn fn;
    void *arg;
};

struct iv_pool {
    pthread_mutex_t mu;
    pthread_cond_t nonempty;
    pthread_cond_t idle;       /* a worker started, or the pool went idle */
    struct iv_job *ring;
    size_t cap, head, count;   /* ring size, first job, jobs queued */
    size_t limit;              /* queued jobs iv_pool_try_submit allows */
    unsigned n_threads;
    unsigned running;   /* jobs being executed */
    unsigned waiting;   /* workers asleep on nonempty */
    unsigned started;   /* workers that reached their loop */
    int stopping;
    pthread_t *threads;
};

static void *worker_main(void *arg)
{
    iv_pool_t *p = arg;
    pthread_mutex_lock(&p->mu);
    p->started++;
    pthread_cond_broadcast(&p->idle);
    for (;;) {
        while (p->count == 0 && !p->stopping) {
            p->waiting++;
            pthread_cond_wait(&p->nonempty, &p->mu);
            p->waiting--;
        }
        if (p->count == 0 && p->stopping) break;
        struct iv_job job = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        p->running++;
        pthread_mutex_unlock(&p->mu);
        job.fn(job.arg);
        pthread_mutex_lock(&p->mu);
        p->running--;
        if (p->count == 0 && p->running == 0) pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

iv_pool_t *iv_pool_create(unsigned n_threads, size_t queue_cap)
{
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (unsigned)n : 1;
    }
    if (queue_cap == 0) queue_cap = 4096;
    iv_pool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ring = calloc(queue_cap, sizeof *p->ring);
    p->threads = calloc(n_threads, sizeof *p->threads);
    if (!p->ring || !p->threads) goto fail_alloc;
    p->cap = p->limit = queue_cap;
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_alloc;
    if (pthread_cond_init(&p->nonempty, NULL) != 0) goto fail_mutex;
    if (pthread_cond_init(&p->idle, NULL) != 0) goto fail_cond;
    for (unsigned i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->n_threads = i;
            iv_pool_destroy(p);
            return NULL;
        }
        p->n_threads = i + 1;
    }
    /* The pool is ready when it is returned: every worker has started and
     * waits for work.  A thread still starting may hold a lock of the C
     * library or of a sanitizer's runtime, and a process forked just then
     * (an HDF5 reader, core/h5/h5iso.c) would inherit it held: such a
     * child of an AddressSanitizer build once spun for minutes. */
    pthread_mutex_lock(&p->mu);
    while (p->started < p->n_threads) pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return p;

fail_cond:
    pthread_cond_destroy(&p->nonempty);
fail_mutex:
    pthread_mutex_destroy(&p->mu);
fail_alloc:
    free(p->threads);
    free(p->ring);
    free(p);
    return NULL;
}

void iv_pool_destroy(iv_pool_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->nonempty);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->nonempty);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->ring);
    free(p);
}

unsigned iv_pool_threads(const iv_pool_t *p)
{
    return p ? p->n_threads : 0;
}

/* Queues a job (p->mu held) and unlocks; a sleeping worker is woken
 * after the unlock, so that it does not wake only to wait for the mutex
 * its waker still holds. */
static void queue_job_unlock(iv_pool_t *p, iv_job_fn fn, void *arg)
{
    p->ring[(p->head + p->count) % p->cap] = (struct iv_job){fn, arg};
    p->count++;
    int wake = p->waiting > 0;
    pthread_mutex_unlock(&p->mu);
    if (wake) pthread_cond_signal(&p->nonempty);
}

int iv_pool_try_submit(iv_pool_t *p, iv_job_fn fn, void *arg)
{
    pthread_mutex_lock(&p->mu);
    if (p->count >= p->limit || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return IV_EOVERLOADED;
    }
    queue_job_unlock(p, fn, arg);
    return 0;
}

int iv_pool_submit(iv_pool_t *p, iv_job_fn fn, void *arg)
{
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return IV_EOVERLOADED;
    }
    if (p->count == p->cap) {
        /* A full ring doubles, its jobs moved to the front in order. */
        struct iv_job *r = malloc(2 * p->cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&p->mu);
            return IV_ENOMEM;
        }
        for (size_t i = 0; i < p->count; i++) r[i] = p->ring[(p->head + i) % p->cap];
        free(p->ring);
        p->ring = r;
        p->head = 0;
        p->cap *= 2;
    }
    queue_job_unlock(p, fn, arg);
    return 0;
}

unsigned iv_pool_free_workers(iv_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    size_t busy = (size_t)p->running + p->count;
    unsigned n = busy >= p->n_threads ? 0 : p->n_threads - (unsigned)busy;
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t iv_pool_queued(iv_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->count;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Shared state of one parallel_for, on the heap and reference counted:
 * helper jobs still queued when the range is finished may run long after
 * the caller returned, and must find live (if exhausted) state. */
struct pfor {
    atomic_size_t next;
    size_t n;
    iv_range_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t done;
    size_t finished;    /* items completed */
    unsigned refs;      /* caller + helper jobs not yet finished */
};

static void pfor_unref(struct pfor *f)
{
    pthread_mutex_lock(&f->mu);
    unsigned left = --f->refs;
    pthread_mutex_unlock(&f->mu);
    if (left == 0) {
        pthread_cond_destroy(&f->done);
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
}

static void pfor_run_items(struct pfor *f)
{
    size_t mine = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&f->next, 1);
        if (i >= f->n) break;
        f->fn(f->arg, i);
        mine++;
    }
    if (mine) {
        pthread_mutex_lock(&f->mu);
        f->finished += mine;
        if (f->finished == f->n) pthread_cond_broadcast(&f->done);
        pthread_mutex_unlock(&f->mu);
    }
}

static void pfor_helper(void *arg)
{
    struct pfor *f = arg;
    pfor_run_items(f);
    pfor_unref(f);
}

/* Allocates the shared state and queues up to max_helpers helper jobs;
 * NULL when there is no pool to help or no memory. */
static struct pfor *pfor_begin(iv_pool_t *p, size_t n, unsigned max_helpers, iv_range_fn fn,
                               void *arg)
{
    unsigned helpers = p ? p->n_threads : 0;
    if (max_helpers < helpers) helpers = max_helpers;
    struct pfor *f = helpers ? calloc(1, sizeof *f) : NULL;
    if (f == NULL) return NULL;
    atomic_init(&f->next, 0);
    f->n = n;
    f->fn = fn;
    f->arg = arg;
    f->refs = 1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->done, NULL);
    for (unsigned h = 0; h < helpers; h++) {
        pthread_mutex_lock(&f->mu);
        f->refs++;
        pthread_mutex_unlock(&f->mu);
        if (iv_pool_try_submit(p, pfor_helper, f) != 0) {
            pthread_mutex_lock(&f->mu);
            f->refs--;
            pthread_mutex_unlock(&f->mu);
            break;  /* queue full: the caller and the helpers queued so far do the rest */
        }
    }
    return f;
}

/* The caller's part: the items nobody has claimed yet, then a wait for the
 * ones other participants are running, never for helper jobs that have
 * not started. */
static void pfor_end(struct pfor *f)
{
    pfor_run_items(f);
    pthread_mutex_lock(&f->mu);
    while (f->finished < f->n) pthread_cond_wait(&f->done, &f->mu);
    pthread_mutex_unlock(&f->mu);
    pfor_unref(f);
}

void iv_pool_parallel_for(iv_pool_t *p, size_t n, unsigned width, iv_range_fn fn, void *arg)
{
    if (n == 0) return;
    unsigned helpers = width > 0 ? width - 1 : UINT32_MAX;
    if (helpers > n - 1) helpers = (unsigned)(n - 1);
    struct pfor *f = pfor_begin(p, n, helpers, fn, arg);
    if (f == NULL) {
        for (size_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    pfor_end(f);
}

struct iv_pool_for {
    struct pfor *f;        /* NULL: the caller runs everything in finish */
    size_t n;
    iv_range_fn fn;
    void *arg;
};

iv_pool_for_t *iv_pool_for_start(iv_pool_t *p, size_t n, iv_range_fn fn, void *arg)
{
    iv_pool_for_t *h = malloc(sizeof *h);
    if (!h) {
        for (size_t i = 0; i < n; i++) fn(arg, i);
        return NULL;
    }
    h->n = n;
    h->fn = fn;
    h->arg = arg;
    h->f = n ? pfor_begin(p, n, n > UINT32_MAX ? UINT32_MAX : (unsigned)n, fn, arg) : NULL;
    return h;
}

void iv_pool_for_finish(iv_pool_for_t *h)
{
    if (!h) return;
    if (h->f) pfor_end(h->f);
    else
        for (size_t i = 0; i < h->n; i++) h->fn(h->arg, i);
    free(h);
}
