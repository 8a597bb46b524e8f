/*
 * Worker thread pool.
 *
 * A fixed set of threads drains one bounded FIFO of jobs.  Submission never
 * blocks: iv_pool_try_submit() fails with IV_EOVERLOADED when the queue is
 * full, so that a server answers 503 instead of stalling its loop.  Jobs
 * run to completion on one worker; they must not touch event-loop objects
 * (hand results back through the loop's own wake-up mechanism).
 *
 * iv_pool_parallel_for() splits a range of items across the workers and
 * the calling thread.  The caller claims items too, so it makes progress
 * (and cannot deadlock) even when every worker is busy, including when it
 * is itself running on a worker.  It returns when every item has run.
 */
#ifndef IV_POOL_H
#define IV_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct iv_pool iv_pool_t;
typedef void (*iv_job_fn)(void *arg);

/* Creates n_threads workers (0 = number of online CPUs) and a queue of
 * queue_cap jobs (0 = 4096).  Returns NULL on failure. */
iv_pool_t *iv_pool_create(unsigned n_threads, size_t queue_cap);

/* Waits for queued jobs to finish, stops and joins the workers, frees. */
void iv_pool_destroy(iv_pool_t *p);

unsigned iv_pool_threads(const iv_pool_t *p);

/* Queues fn(arg).  0, or IV_EOVERLOADED when the queue is full. */
int iv_pool_try_submit(iv_pool_t *p, iv_job_fn fn, void *arg);

/* Queues fn(arg) whatever the queue holds, growing it: for work the
 * server itself starts, bounded by its own count (dataset loads), which
 * must not fail because clients filled the queue.  0, IV_ENOMEM, or
 * IV_EOVERLOADED when the pool is being destroyed. */
int iv_pool_submit(iv_pool_t *p, iv_job_fn fn, void *arg);

/* Jobs waiting (not yet running); for metrics. */
size_t iv_pool_queued(iv_pool_t *p);

/* Workers with nothing to run and nothing queued for them (a snapshot). */
unsigned iv_pool_free_workers(iv_pool_t *p);

/*
 * Runs fn(arg, i) for every i in [0, n), on up to `width` threads (the
 * caller included; 0 = all workers + caller).  Items are claimed in
 * increasing order, one at a time, and a participant runs the item it
 * claimed at once: so an item may wait for a lower one to reach some
 * point (the lowest unfinished item never waits).  p may be NULL: then
 * the caller runs everything.
 */
typedef void (*iv_range_fn)(void *arg, size_t i);
void iv_pool_parallel_for(iv_pool_t *p, size_t n, unsigned width, iv_range_fn fn, void *arg);

/*
 * The same split in two, for work the caller overlaps with its own:
 * iv_pool_for_start() hands fn(arg, i), i in [0, n), to the free workers
 * (items claimed as above) and returns at once; iv_pool_for_finish() runs
 * the items no worker has claimed yet on the calling thread, waits for the
 * ones being run (never for a worker job still queued, so it cannot wait
 * on a pool whose workers are all busy, the caller included) and frees
 * the handle.  Every item has run when finish returns.  Without a pool or
 * memory for the handle, the items run in finish (or in start).
 */
typedef struct iv_pool_for iv_pool_for_t;
iv_pool_for_t *iv_pool_for_start(iv_pool_t *p, size_t n, iv_range_fn fn, void *arg);
void iv_pool_for_finish(iv_pool_for_t *h);

#endif /* IV_POOL_H */
