/*
 * The reader process of core/h5/h5iso.c: results cross intact (small puts,
 * arrays larger than the child's buffer, notes in order); a child's
 * error, crash, silent exit and hang each become one clear error; the
 * child holds no descriptor of the parent's but its own; a child that
 * inherited a held lock is retried, then refused; concurrent runs
 * from several threads do not wait on each other's pipes; the reader
 * refuses to read past the end.
 */
#include <check.h>

#include "check_main.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "h5iso.h"

#define BIG ((size_t)3 << 20)

static int child_roundtrip(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    for (uint64_t i = 0; i < 5; i++) iv_h5iso_note(o, &i, sizeof i);
    uint8_t *big = malloc(BIG);
    if (!big) return IV_ENOMEM;
    for (size_t i = 0; i < BIG; i++) big[i] = (uint8_t)(i * 7 + 3);
    IV_TRY(iv_h5iso_put_u64(o, 42));
    IV_TRY(iv_h5iso_put_blob(o, "abc", 4));
    IV_TRY(iv_h5iso_put_blob(o, big, BIG));
    IV_TRY(iv_h5iso_put_u64(o, 43));
    free(big);
    return 0;
}

struct notes {
    uint64_t seen[8];
    int n;
};

static void on_note(void *ctx, const void *msg, size_t n)
{
    struct notes *ns = ctx;
    ck_assert_uint_eq(n, 8);
    if (ns->n < 8) memcpy(&ns->seen[ns->n++], msg, 8);
}

START_TEST(test_roundtrip)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    struct notes ns = {0};
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_roundtrip, NULL, on_note, &ns, &res, &e), 0);
    ck_assert_int_eq(ns.n, 5);
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(ns.seen[i], (uint64_t)i);
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    ck_assert_uint_eq(iv_h5iso_rd_u64(&r), 42);
    size_t n = 0;
    const char *s = iv_h5iso_rd_blob(&r, (size_t)-1, &n);
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(s, "abc");
    const uint8_t *big = iv_h5iso_rd_blob(&r, BIG, NULL);
    ck_assert_ptr_nonnull(big);
    for (size_t i = 0; i < BIG; i++)
        if (big[i] != (uint8_t)(i * 7 + 3)) ck_abort_msg("byte %zu differs", i);
    ck_assert_uint_eq(iv_h5iso_rd_u64(&r), 43);
    ck_assert_int_eq(r.bad, 0);
    ck_assert_uint_eq(r.pos, r.len);
    /* Past the end: zeros, NULL, and the flag. */
    ck_assert_uint_eq(iv_h5iso_rd_u64(&r), 0);
    ck_assert_int_eq(r.bad, 1);
    ck_assert_ptr_null(iv_h5iso_rd_raw(&r, 1));
    iv_h5iso_result_free(&res);
}
END_TEST

START_TEST(test_blob_length_checked)
{
    /* A blob whose length word promises more than the answer holds. */
    uint64_t bytes[3] = {1000, 1, 2};
    iv_h5iso_result_t res = {(const uint8_t *)bytes, sizeof bytes};
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    ck_assert_ptr_null(iv_h5iso_rd_blob(&r, (size_t)-1, NULL));
    ck_assert_int_eq(r.bad, 1);
    /* A blob of the wrong length for what the caller expects. */
    uint64_t two[3] = {8, 5, 0};
    res.data = (const uint8_t *)two;
    iv_h5iso_rd_init(&r, &res);
    ck_assert_ptr_null(iv_h5iso_rd_blob(&r, 16, NULL));
    ck_assert_int_eq(r.bad, 1);
    /* An empty answer reads as empty, not as a crash. */
    iv_h5iso_result_t none = {NULL, 0};
    iv_h5iso_rd_init(&r, &none);
    ck_assert_ptr_nonnull(iv_h5iso_rd_raw(&r, 0));
    ck_assert_ptr_null(iv_h5iso_rd_raw(&r, 1));
}
END_TEST

static int child_error(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)o;
    return iv_fail(err, IV_EUNSUPPORTED, "f.h5: obs/x: encoding 'weird' is not supported");
}

START_TEST(test_child_error)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_error, NULL, NULL, NULL, &res, &e),
                     IV_EUNSUPPORTED);
    ck_assert_str_eq(e.msg, "f.h5: obs/x: encoding 'weird' is not supported");
    ck_assert_ptr_null(res.data);
}
END_TEST

static int child_crash(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    iv_h5iso_stage(o, "obs/_index");
    raise(*(int *)ctx);
    return 0;
}

START_TEST(test_child_crash)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    int sig = SIGABRT;
    ck_assert_int_eq(iv_h5iso_run("dir/f.h5", child_crash, &sig, NULL, NULL, &res, &e),
                     IV_EBAD_FILE);
    ck_assert_msg(strstr(e.msg, "dir/f.h5: HDF5 crashed reading obs/_index (signal 6") &&
                      strstr(e.msg, "the file is damaged"), "%s", e.msg);
    /* SIGSEGV: a sanitizer may catch it first and exit instead. */
    iv_err_clear(&e);
    sig = SIGSEGV;
    ck_assert_int_eq(iv_h5iso_run("dir/f.h5", child_crash, &sig, NULL, NULL, &res, &e),
                     IV_EBAD_FILE);
    ck_assert_msg(strstr(e.msg, "reading obs/_index") && strstr(e.msg, "damaged") &&
                      (strstr(e.msg, "signal 11") || strstr(e.msg, "exit status")),
                  "%s", e.msg);
}
END_TEST

static int child_exit(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    iv_h5iso_put_u64(o, 1);
    syscall(SYS_exit_group, 7);   /* not _exit: no sanitizer finalisation */
    return 0;
}

START_TEST(test_child_exits_silently)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_exit, NULL, NULL, NULL, &res, &e), IV_EBAD_FILE);
    ck_assert_msg(strstr(e.msg, "exit status 7") && strstr(e.msg, "reading the file"), "%s",
                  e.msg);
}
END_TEST

static int child_hang(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    iv_h5iso_stage(o, "X/packed_indices");
    for (;;) pause();
    return 0;
}

START_TEST(test_child_hangs)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    iv_h5iso_set_timeout_ms(300);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = iv_h5iso_run("f.h5", child_hang, NULL, NULL, NULL, &res, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    iv_h5iso_set_timeout_ms(0);
    ck_assert_int_eq(rc, IV_ETIMEOUT);
    ck_assert_msg(strstr(e.msg, "did not finish reading X/packed_indices"), "%s", e.msg);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ck_assert_msg(secs < 20, "the hung child was stopped after %.1f s", secs);
}
END_TEST

static int child_fds(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)err;
    const int *fds = ctx;
    uint64_t open_ = 0;
    for (int i = 0; i < 2; i++)
        if (fcntl(fds[i], F_GETFD) != -1 || errno != EBADF) open_++;
    return iv_h5iso_put_u64(o, open_);
}

START_TEST(test_child_closes_parent_fds)
{
    /* A client socket of the server must not stay open in the child. */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_fds, fds, NULL, NULL, &res, &e), 0);
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    ck_assert_uint_eq(iv_h5iso_rd_u64(&r), 0);
    ck_assert_int_eq(r.bad, 0);
    iv_h5iso_result_free(&res);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;

static int child_lock(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    /* Held by the parent at the fork: this child sleeps forever, as one
     * does that inherits an allocator lock another thread held. */
    pthread_mutex_lock(&held);
    pthread_mutex_unlock(&held);
    return iv_h5iso_put_u64(o, 5);
}

/* A spin lock held at the fork, as AddressSanitizer's allocator can
 * leave one: the child yields the processor between tries forever. */
static atomic_int spin_held;

static int child_spin(void *ctx, iv_h5iso_out_t *o, iv_err_t *err)
{
    (void)ctx;
    (void)err;
    while (atomic_load(&spin_held)) sched_yield();
    return iv_h5iso_put_u64(o, 6);
}

START_TEST(test_child_spinning_on_a_lock_retried)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    /* Looked at every 250 ms: 8 looks spinning make 2 s an attempt. */
    iv_h5iso_set_check_ms(250);
    atomic_store(&spin_held, 1);
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_spin, NULL, NULL, NULL, &res, &e), IV_EINTERNAL);
    ck_assert_msg(strstr(e.msg, "deadlocked"), "%s", e.msg);
    atomic_store(&spin_held, 0);
    iv_err_clear(&e);
    ck_assert_msg(iv_h5iso_run("f.h5", child_spin, NULL, NULL, NULL, &res, &e) == 0, "%s", e.msg);
    iv_h5iso_result_free(&res);
}
END_TEST

static sem_t locked;

/* Holds the lock for one second (the owner unlocks it, as it must).  A
 * child forked while it is held never sees it free, so at 400 ms a look
 * (3 looks, 1.2 s an attempt) the first attempt fails and the third,
 * forked 2.4 s on or later, finds it free even if this thread wakes late. */
static void *hold_a_while(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&held);
    sem_post(&locked);
    sleep(1);
    pthread_mutex_unlock(&held);
    return NULL;
}

START_TEST(test_child_deadlock_retried)
{
    iv_h5iso_result_t res;
    iv_err_t e = {0};
    iv_h5iso_set_check_ms(400);
    /* Held through every attempt: a clear error, well before the timeout. */
    pthread_mutex_lock(&held);
    ck_assert_int_eq(iv_h5iso_run("f.h5", child_lock, NULL, NULL, NULL, &res, &e), IV_EINTERNAL);
    ck_assert_msg(strstr(e.msg, "deadlocked"), "%s", e.msg);
    pthread_mutex_unlock(&held);
    /* Released during the first attempt: a later fork succeeds. */
    pthread_t t;
    ck_assert_int_eq(sem_init(&locked, 0, 0), 0);
    ck_assert_int_eq(pthread_create(&t, NULL, hold_a_while, NULL), 0);
    sem_wait(&locked);
    iv_err_clear(&e);
    ck_assert_msg(iv_h5iso_run("f.h5", child_lock, NULL, NULL, NULL, &res, &e) == 0, "%s",
                  e.msg);
    pthread_join(t, NULL);
    iv_h5iso_rd_t r;
    iv_h5iso_rd_init(&r, &res);
    ck_assert_uint_eq(iv_h5iso_rd_u64(&r), 5);
    iv_h5iso_result_free(&res);
}
END_TEST

static void *runner(void *arg)
{
    intptr_t ok = 1;
    (void)arg;
    for (int k = 0; k < 8; k++) {
        iv_h5iso_result_t res;
        iv_err_t e = {0};
        struct notes ns = {0};
        if (iv_h5iso_run("f.h5", child_roundtrip, NULL, on_note, &ns, &res, &e) != 0 ||
            res.len < BIG || ns.n != 5)
            ok = 0;
        iv_h5iso_result_free(&res);
    }
    return (void *)ok;
}

START_TEST(test_concurrent_runs)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, runner, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *ok;
        pthread_join(t[i], &ok);
        ck_assert_ptr_eq(ok, (void *)1);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("h5iso");
    TCase *tc = tcase_create("child");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_blob_length_checked);
    tcase_add_test(tc, test_child_error);
    tcase_add_test(tc, test_child_crash);
    tcase_add_test(tc, test_child_exits_silently);
    tcase_add_test(tc, test_child_hangs);
    tcase_add_test(tc, test_child_closes_parent_fds);
    tcase_add_test(tc, test_concurrent_runs);
    tcase_add_test(tc, test_child_deadlock_retried);
    tcase_add_test(tc, test_child_spinning_on_a_lock_retried);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
