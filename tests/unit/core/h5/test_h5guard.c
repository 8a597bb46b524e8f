/*
 * The writers' guarded child of core/h5/h5guard.c: an exit status comes
 * back as it is; a crash is status 1, its stage named and its temporary
 * file removed; the finished files are renamed into place only after a
 * clean exit (a child that finished its file and then died leaves the old
 * one); a child that ends inside the command (exit called by a library)
 * is an error; a child that stops beating is stopped after the stall
 * timeout.
 */
#include <check.h>

#include "check_main.h"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "h5guard.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/h5guardXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static int file_is(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int exit_with(void *ctx)
{
    return *(int *)ctx;
}

START_TEST(exit_status_comes_back)
{
    int codes[] = {0, 1, 3, 77};
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        ck_assert_int_eq(iv_h5guard_run("in.h5ad", exit_with, &codes[i]), codes[i]);
}
END_TEST

/* Writes tmp, commits it as out, then does what ctx says. */
struct job {
    int then_crash;
    int no_commit;
};

static int write_and_commit(void *ctx)
{
    struct job *j = ctx;
    char tmp[128], out[128];
    path_in(tmp, sizeof tmp, "out.tmp1");
    path_in(out, sizeof out, "out");
    iv_h5guard_temp(tmp);
    write_file(tmp, "new");
    iv_h5guard_stage("copying obs/%s", "cell_type");
    if (j->no_commit) raise(SIGSEGV);
    if (iv_h5guard_commit(tmp, out) != 0) return 9;
    /* The rename is the parent's: out is still the old file here. */
    if (!file_is(out, "old")) return 8;
    if (j->then_crash) raise(SIGSEGV);
    return 0;
}

START_TEST(commit_renames_after_a_clean_exit_only)
{
    make_dir();
    char out[128], tmp[128];
    path_in(out, sizeof out, "out");
    path_in(tmp, sizeof tmp, "out.tmp1");
    write_file(out, "old");
    struct job crash_after = {1, 0}, crash_before = {0, 1}, ok = {0, 0};
    ck_assert_int_eq(iv_h5guard_run("in.h5ad", write_and_commit, &crash_after), 1);
    ck_assert(file_is(out, "old"));
    ck_assert(!exists(tmp));
    ck_assert_int_eq(iv_h5guard_run("in.h5ad", write_and_commit, &crash_before), 1);
    ck_assert(file_is(out, "old"));
    ck_assert(!exists(tmp));
    ck_assert_int_eq(iv_h5guard_run("in.h5ad", write_and_commit, &ok), 0);
    ck_assert(file_is(out, "new"));
    ck_assert(!exists(tmp));
    unlink(out);
    rmdir(dir);
}
END_TEST

START_TEST(crash_message_names_the_stage)
{
    make_dir();
    char log[128];
    path_in(log, sizeof log, "stderr");
    /* The parent's message goes to stderr: catch it in a file. */
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    struct job crash_before = {0, 1};
    int rc = iv_h5guard_run("in.h5ad", write_and_commit, &crash_before);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    ck_assert_int_eq(rc, 1);
    char buf[1024] = "";
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    ck_assert_msg(strstr(buf, "ivserve: error: in.h5ad: HDF5 crashed copying obs/cell_type "
                              "(signal 11") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "partial output was removed") != NULL, "%s", buf);
    unlink(log);
    rmdir(dir);
}
END_TEST

/* Ends inside the command, as a library calling exit() or a sanitizer
 * stopping on a fault in libhdf5 does: status 3, but never returned. */
static int exit_inside(void *ctx)
{
    (void)ctx;
    char tmp[128];
    path_in(tmp, sizeof tmp, "out.tmp2");
    iv_h5guard_temp(tmp);
    write_file(tmp, "half");
    iv_h5guard_stage("copying /uns");
    exit(3);
}

START_TEST(an_exit_inside_the_command_is_an_error)
{
    make_dir();
    char tmp[128];
    path_in(tmp, sizeof tmp, "out.tmp2");
    ck_assert_int_eq(iv_h5guard_run("in.h5ad", exit_inside, NULL), 1);
    ck_assert(!exists(tmp));
    rmdir(dir);
}
END_TEST

static int spin(void *ctx)
{
    int beats = *(int *)ctx;
    for (int i = 0; i < beats; i++) {
        usleep(300 * 1000);
        iv_h5guard_beat();
    }
    for (;;) pause();
    return 0;
}

START_TEST(a_stalled_child_is_stopped)
{
    setenv("IVSERVE_STALL_TIMEOUT_S", "1", 1);
    /* Beats every 0.3 s for 1.5 s keep it alive past the 1 s timeout; the
     * silence after is cut. */
    int beats = 5;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(iv_h5guard_run("in.h5ad", spin, &beats), 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ck_assert_msg(el > 2.0 && el < 20.0, "stopped after %.2f s", el);
    unsetenv("IVSERVE_STALL_TIMEOUT_S");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("h5guard");
    TCase *tc = tcase_create("run");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, exit_status_comes_back);
    tcase_add_test(tc, commit_renames_after_a_clean_exit_only);
    tcase_add_test(tc, crash_message_names_the_stage);
    tcase_add_test(tc, a_stalled_child_is_stopped);
    tcase_add_test(tc, an_exit_inside_the_command_is_an_error);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
