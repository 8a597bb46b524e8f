/* Worker pool: every item runs once, nested parallel_for cannot deadlock,
 * a full queue is reported as overload, a started range finishes on the
 * caller when the workers are busy, free workers are counted. */
#include <check.h>

#include "check_main.h"
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "error.h"
#include "pool.h"

struct counts {
    atomic_int hits[1000];
    iv_pool_t *pool;
    atomic_int inner;
};

static void mark(void *arg, size_t i)
{
    struct counts *c = arg;
    atomic_fetch_add(&c->hits[i], 1);
}

START_TEST(parallel_for_runs_each_item_once)
{
    for (unsigned threads = 0; threads <= 4; threads++) {
        iv_pool_t *p = threads ? iv_pool_create(threads, 16) : NULL;
        struct counts *c = calloc(1, sizeof *c);
        iv_pool_parallel_for(p, 1000, 0, mark, c);
        for (int i = 0; i < 1000; i++) ck_assert_int_eq(atomic_load(&c->hits[i]), 1);
        free(c);
        iv_pool_destroy(p);
    }
}
END_TEST

static void inner_item(void *arg, size_t i)
{
    (void)i;
    struct counts *c = arg;
    atomic_fetch_add(&c->inner, 1);
}

static void outer_item(void *arg, size_t i)
{
    (void)i;
    struct counts *c = arg;
    /* Runs on a worker while every worker may be busy. */
    iv_pool_parallel_for(c->pool, 50, 0, inner_item, c);
}

START_TEST(nested_parallel_for_completes)
{
    iv_pool_t *p = iv_pool_create(2, 8);
    struct counts *c = calloc(1, sizeof *c);
    c->pool = p;
    iv_pool_parallel_for(p, 40, 0, outer_item, c);
    ck_assert_int_eq(atomic_load(&c->inner), 40 * 50);
    free(c);
    iv_pool_destroy(p);
}
END_TEST

static atomic_int gate;
static void wait_gate(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate)) usleep(1000);
}

START_TEST(full_queue_is_overload)
{
    atomic_store(&gate, 0);
    iv_pool_t *p = iv_pool_create(1, 2);
    int ok = 0, over = 0;
    for (int i = 0; i < 10; i++) {
        int rc = iv_pool_try_submit(p, wait_gate, NULL);
        if (rc == 0) ok++;
        else if (rc == IV_EOVERLOADED) over++;
    }
    /* One running plus two queued at most. */
    ck_assert_int_le(ok, 3);
    ck_assert_int_ge(over, 7);
    atomic_store(&gate, 1);
    iv_pool_destroy(p);
}
END_TEST

/* The server's own jobs (iv_pool_submit) are queued past the limit that
 * refuses clients' (the ring grows, wrapped or not), and run in the order
 * they were queued; the limit still holds for try_submit afterwards. */
static atomic_int seq_next;
static int seq_seen[64];
static void record(void *arg)
{
    seq_seen[atomic_fetch_add(&seq_next, 1)] = (int)(intptr_t)arg;
}

START_TEST(server_jobs_queue_past_the_limit_in_order)
{
    atomic_store(&gate, 0);
    atomic_store(&seq_next, 0);
    iv_pool_t *p = iv_pool_create(1, 3);
    ck_assert_int_eq(iv_pool_try_submit(p, wait_gate, NULL), 0);
    for (int i = 0; i < 200 && iv_pool_queued(p) != 0; i++) usleep(1000);  /* the worker holds it */
    ck_assert_int_eq(iv_pool_try_submit(p, record, (void *)(intptr_t)0), 0);
    ck_assert_int_eq(iv_pool_try_submit(p, record, (void *)(intptr_t)1), 0);
    for (int i = 2; i < 40; i++) ck_assert_int_eq(iv_pool_submit(p, record, (void *)(intptr_t)i), 0);
    ck_assert_uint_eq(iv_pool_queued(p), 40);
    ck_assert_int_eq(iv_pool_try_submit(p, record, NULL), IV_EOVERLOADED);
    atomic_store(&gate, 1);
    iv_pool_destroy(p);   /* runs what is queued and joins the worker: its writes are seen */
    ck_assert_int_eq(atomic_load(&seq_next), 40);
    for (int i = 0; i < 40; i++) ck_assert_int_eq(seq_seen[i], i);
}
END_TEST

/* Free workers: all of them when idle, one less a running or queued job,
 * none while jobs wait, all again once they finished. */
START_TEST(free_workers_counts_running_and_queued)
{
    atomic_store(&gate, 0);
    iv_pool_t *p = iv_pool_create(3, 8);
    ck_assert_uint_eq(iv_pool_free_workers(p), 3);
    ck_assert_int_eq(iv_pool_try_submit(p, wait_gate, NULL), 0);
    ck_assert_uint_eq(iv_pool_free_workers(p), 2);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(iv_pool_try_submit(p, wait_gate, NULL), 0);
    ck_assert_uint_eq(iv_pool_free_workers(p), 0);
    atomic_store(&gate, 1);
    for (int i = 0; i < 2000 && (iv_pool_free_workers(p) != 3 || iv_pool_queued(p) != 0); i++)
        usleep(1000);
    ck_assert_uint_eq(iv_pool_free_workers(p), 3);
    iv_pool_destroy(p);
}
END_TEST

START_TEST(for_start_finish_runs_each_item_once)
{
    /* Workers free, no pool, and every worker blocked until after finish:
     * finish must run what nobody claimed and never wait on a queued job. */
    for (int mode = 0; mode < 3; mode++) {
        atomic_store(&gate, mode != 2);
        iv_pool_t *p = mode == 1 ? NULL : iv_pool_create(2, 16);
        if (mode == 2)
            for (int k = 0; k < 2; k++) ck_assert_int_eq(iv_pool_try_submit(p, wait_gate, NULL), 0);
        struct counts *c = calloc(1, sizeof *c);
        iv_pool_for_t *h = iv_pool_for_start(p, 1000, mark, c);
        iv_pool_for_finish(h);
        for (int i = 0; i < 1000; i++) ck_assert_int_eq(atomic_load(&c->hits[i]), 1);
        atomic_store(&gate, 1);
        iv_pool_destroy(p);   /* helper jobs that start late find nothing left */
        free(c);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_add_test(tc, parallel_for_runs_each_item_once);
    tcase_add_test(tc, nested_parallel_for_completes);
    tcase_add_test(tc, full_queue_is_overload);
    tcase_add_test(tc, server_jobs_queue_past_the_limit_in_order);
    tcase_add_test(tc, for_start_finish_runs_each_item_once);
    tcase_add_test(tc, free_workers_counts_running_and_queued);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
