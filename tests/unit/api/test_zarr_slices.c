/*
 * The memo of decoded slices (api/zarr_slices.h): callers of the same
 * time share one decode, a slice over the bound is decoded by each
 * caller, a failed decode is the caller's error and is tried again, and
 * pinned slices outlive the eviction that a full memo makes.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "zarr_slices.h"

static atomic_int decodes;
static atomic_int fail_next;

/* A block of slice j: one row, one entry holding j. */
static int fake_slice(void *ctx, int64_t j, iv_block_t *out, iv_err_t *err)
{
    (void)ctx;
    atomic_fetch_add(&decodes, 1);
    usleep(20000);  /* long enough for the other callers to arrive meanwhile */
    if (atomic_exchange(&fail_next, 0)) return iv_fail(err, IV_ECORRUPT, "slice %lld is damaged", (long long)j);
    out->n_rows = 1;
    out->ids = malloc(sizeof *out->ids);
    out->indptr = malloc(2 * sizeof *out->indptr);
    out->indices = malloc(sizeof(int32_t));
    out->data = malloc(sizeof(float));
    out->ids[0] = j;
    out->indptr[0] = 0;
    out->indptr[1] = 1;
    ((int32_t *)out->indices)[0] = (int32_t)j;
    ((float *)out->data)[0] = (float)j;
    return 0;
}

typedef struct call {
    iv_zarr_slices_t *m;
    int64_t j;
    size_t bytes;
    int rc;
    int32_t got;
} call_t;

static void *caller(void *arg)
{
    call_t *c = arg;
    iv_block_t scratch;
    const iv_block_t *b = NULL;
    iv_err_t err = {0};
    c->rc = iv_zarr_slices_get(c->m, "X", 0, c->j, c->bytes, fake_slice, NULL, &scratch, &b, &err);
    if (c->rc == 0) c->got = ((const int32_t *)b->indices)[0];
    iv_zarr_slices_release(c->m, b, &scratch);
    return NULL;
}

static void run_callers(iv_zarr_slices_t *m, int n, int64_t j, size_t bytes, call_t *calls)
{
    pthread_t t[16];
    for (int i = 0; i < n; i++) {
        calls[i] = (call_t){.m = m, .j = j, .bytes = bytes, .got = -1};
        pthread_create(&t[i], NULL, caller, &calls[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

START_TEST(one_decode_for_callers_of_the_same_time)
{
    iv_zarr_slices_t *m = iv_zarr_slices_new(1000);
    ck_assert_ptr_nonnull(m);
    call_t calls[16];
    atomic_store(&decodes, 0);
    run_callers(m, 16, 5, 100, calls);
    ck_assert_int_eq(atomic_load(&decodes), 1);
    for (int i = 0; i < 16; i++) {
        ck_assert_int_eq(calls[i].rc, 0);
        ck_assert_int_eq(calls[i].got, 5);
    }
    /* Kept: a later caller decodes nothing. */
    run_callers(m, 1, 5, 100, calls);
    ck_assert_int_eq(atomic_load(&decodes), 1);
    iv_zarr_slices_free(m);
}
END_TEST

START_TEST(over_the_bound_each_decodes)
{
    iv_zarr_slices_t *m = iv_zarr_slices_new(1000);
    call_t calls[4];
    atomic_store(&decodes, 0);
    run_callers(m, 4, 9, 1001, calls);
    ck_assert_int_eq(atomic_load(&decodes), 4);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(calls[i].got, 9);
    /* Without a memo at all too. */
    run_callers(NULL, 2, 3, 10, calls);
    ck_assert_int_eq(atomic_load(&decodes), 6);
    ck_assert_int_eq(calls[1].got, 3);
    iv_zarr_slices_free(m);
}
END_TEST

START_TEST(failure_is_the_callers_and_tried_again)
{
    iv_zarr_slices_t *m = iv_zarr_slices_new(1000);
    call_t calls[1];
    atomic_store(&decodes, 0);
    atomic_store(&fail_next, 1);
    run_callers(m, 1, 2, 10, calls);
    ck_assert_int_eq(calls[0].rc, IV_ECORRUPT);
    run_callers(m, 1, 2, 10, calls);
    ck_assert_int_eq(calls[0].rc, 0);
    ck_assert_int_eq(calls[0].got, 2);
    ck_assert_int_eq(atomic_load(&decodes), 2);
    iv_zarr_slices_free(m);
}
END_TEST

START_TEST(pinned_slices_outlive_eviction)
{
    /* Room for two slices of 400 bytes: the third evicts the older one
     * that is not pinned, and a pinned one is never freed under its reader. */
    iv_zarr_slices_t *m = iv_zarr_slices_new(800);
    iv_block_t s1, s2, s3;
    const iv_block_t *b1, *b2, *b3;
    iv_err_t err = {0};
    atomic_store(&decodes, 0);
    ck_assert_int_eq(iv_zarr_slices_get(m, "X", 0, 1, 400, fake_slice, NULL, &s1, &b1, &err), 0);
    ck_assert_int_eq(iv_zarr_slices_get(m, "X", 0, 2, 400, fake_slice, NULL, &s2, &b2, &err), 0);
    iv_zarr_slices_release(m, b2, &s2);
    /* 1 is pinned, 2 is not: 3 takes 2's room. */
    ck_assert_int_eq(iv_zarr_slices_get(m, "X", 0, 3, 400, fake_slice, NULL, &s3, &b3, &err), 0);
    ck_assert_ptr_ne(b3, &s3);
    ck_assert_int_eq(((const int32_t *)b1->indices)[0], 1);
    ck_assert_int_eq(((const int32_t *)b3->indices)[0], 3);
    /* With both pinned and no room, a fourth is decoded apart. */
    iv_block_t s4;
    const iv_block_t *b4;
    ck_assert_int_eq(iv_zarr_slices_get(m, "X", 0, 4, 400, fake_slice, NULL, &s4, &b4, &err), 0);
    ck_assert_ptr_eq(b4, &s4);
    iv_zarr_slices_release(m, b4, &s4);
    iv_zarr_slices_release(m, b1, &s1);
    iv_zarr_slices_release(m, b3, &s3);
    /* 2 was dropped: asking again decodes it. */
    int before = atomic_load(&decodes);
    ck_assert_int_eq(iv_zarr_slices_get(m, "X", 0, 2, 400, fake_slice, NULL, &s2, &b2, &err), 0);
    iv_zarr_slices_release(m, b2, &s2);
    ck_assert_int_eq(atomic_load(&decodes), before + 1);
    /* Another matrix's slice 1 is another slice. */
    ck_assert_int_eq(iv_zarr_slices_get(m, "L", 0, 1, 400, fake_slice, NULL, &s1, &b1, &err), 0);
    iv_zarr_slices_release(m, b1, &s1);
    ck_assert_int_eq(atomic_load(&decodes), before + 2);
    iv_zarr_slices_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zarr_slices");
    TCase *tc = tcase_create("zarr_slices");
    tcase_add_test(tc, one_decode_for_callers_of_the_same_time);
    tcase_add_test(tc, over_the_bound_each_decodes);
    tcase_add_test(tc, failure_is_the_callers_and_tried_again);
    tcase_add_test(tc, pinned_slices_outlive_eviction);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
