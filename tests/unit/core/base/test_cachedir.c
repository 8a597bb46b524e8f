/*
 * The cache folder of core/base/cachedir.c: the folder made with 0700; a
 * key that follows the source's bytes even when its size and time are
 * put back; derived names; the sweep removing stale derived files, dead
 * producers' temporary files and notes left alone, then the least
 * recently used files down to the bound, never a file kept.
 */
#include <check.h>

#include "check_main.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cachedir.h"

static char root[64];

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/cachedirXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void rm_rf(const char *p)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    ck_assert_int_eq(system(cmd), 0);
}

static void write_bytes(const char *path, size_t n, unsigned char fill)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (size_t i = 0; i < n; i++) fputc((int)((fill + i * 7) & 0xff), f);
    fclose(f);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

START_TEST(prepare_makes_private_folders)
{
    setup();
    char dir[200];
    snprintf(dir, sizeof dir, "%s/a/b/cache", root);
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_cachedir_prepare(dir, &err), 0);
    struct stat st;
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    ck_assert_int_eq(iv_cachedir_prepare(dir, &err), 0); /* twice is fine */
    char file[220];
    snprintf(file, sizeof file, "%s/plain", root);
    write_bytes(file, 3, 0);
    ck_assert_int_eq(iv_cachedir_prepare(file, &err), IV_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "not a folder"));
    rm_rf(root);
}
END_TEST

START_TEST(key_follows_the_bytes)
{
    setup();
    char src[200];
    snprintf(src, sizeof src, "%s/s.h5ad", root);
    size_t n = (3u << 20) + 123;
    write_bytes(src, n, 1);
    iv_err_t err;
    iv_err_clear(&err);
    char k1[IV_CACHEDIR_KEY_LEN], k2[IV_CACHEDIR_KEY_LEN], k3[IV_CACHEDIR_KEY_LEN];
    ck_assert_int_eq(iv_cachedir_key(src, k1, &err), 0);
    ck_assert_int_eq(strlen(k1), 32);
    ck_assert_int_eq(iv_cachedir_key(src, k2, &err), 0);
    ck_assert_str_eq(k1, k2);
    /* One byte of the last MiB changed, size and times put back. */
    struct stat st;
    ck_assert_int_eq(stat(src, &st), 0);
    int fd = open(src, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "\xff", 1, (off_t)n - 10), 1);
    close(fd);
    struct timespec t[2] = {st.st_atim, st.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, src, t, 0), 0);
    ck_assert_int_eq(iv_cachedir_key(src, k3, &err), 0);
    ck_assert_str_ne(k1, k3);
    snprintf(src, sizeof src, "%s/missing.h5ad", root);
    ck_assert_int_eq(iv_cachedir_key(src, k3, &err), IV_EIO);
    rm_rf(root);
}
END_TEST

START_TEST(derived_names)
{
    iv_err_t err;
    iv_err_clear(&err);
    char buf[300];
    const char *key = "0123456789abcdef0123456789abcdef";
    ck_assert_int_eq(iv_cachedir_path("/c", "/data/my atlas.h5ad", key, "ivcsr.h5ad", buf,
                                      sizeof buf, &err), 0);
    ck_assert_str_eq(buf, "/c/my_atlas-0123456789abcdef0123456789abcdef.ivcsr.h5ad");
    ck_assert_int_eq(iv_cachedir_path("/c", "x.h5ad", key, "ivcsr.h5ad", buf, 20, &err),
                     IV_EINVALID_ARG);
}
END_TEST

static void derived(const char *dir, const char *src, const char *stem, char *out, size_t cap,
                    size_t bytes, time_t used)
{
    iv_err_t err;
    iv_err_clear(&err);
    char key[IV_CACHEDIR_KEY_LEN];
    ck_assert_int_eq(iv_cachedir_key(src, key, &err), 0);
    char named[200];
    snprintf(named, sizeof named, "%s/%s.h5ad", dir, stem);
    ck_assert_int_eq(iv_cachedir_path(dir, named, key, "ivcsr.h5ad", out, cap, &err), 0);
    ck_assert_int_eq(iv_cachedir_note(out, src, key, &err), 0);
    write_bytes(out, bytes, 9);
    /* The note's time is the last use (iv_cachedir_touch). */
    struct timespec t[2] = {{used, 0}, {used, 0}};
    char note[400];
    snprintf(note, sizeof note, "%s.src", out);
    ck_assert_int_eq(utimensat(AT_FDCWD, note, t, 0), 0);
}

START_TEST(sweep_removes_stale_dead_and_least_recent)
{
    setup();
    char dir[200], s1[200], s2[200], s3[200];
    snprintf(dir, sizeof dir, "%s/cache", root);
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_cachedir_prepare(dir, &err), 0);
    snprintf(s1, sizeof s1, "%s/one.h5ad", root);
    snprintf(s2, sizeof s2, "%s/two.h5ad", root);
    snprintf(s3, sizeof s3, "%s/three.h5ad", root);
    write_bytes(s1, 1000, 1);
    write_bytes(s2, 1000, 2);
    write_bytes(s3, 1000, 3);
    char d1[300], d2[300], d3[300], d4[300];
    derived(dir, s1, "one", d1, sizeof d1, 4000, 1000);   /* oldest */
    derived(dir, s2, "two", d2, sizeof d2, 4000, 2000);
    derived(dir, s3, "three", d3, sizeof d3, 4000, 3000); /* newest */
    derived(dir, s2, "two_b", d4, sizeof d4, 100, 500);
    /* A dead producer's temporary file, a live one's, a foreign file. */
    pid_t kid = fork();
    if (kid == 0) _exit(0);
    waitpid(kid, NULL, 0);
    char dead[300], live[300], foreign[300], dead_n[300], live_n[300];
    snprintf(dead, sizeof dead, "%s/x.ivcsr.h5ad.tmp%ld", dir, (long)kid);
    snprintf(live, sizeof live, "%s/y.ivcsr.h5ad.tmp%ld", dir, (long)getpid());
    snprintf(foreign, sizeof foreign, "%s/notes.txt", dir);
    /* The same with a writer's number (iv_cachedir_temp's form). */
    snprintf(dead_n, sizeof dead_n, "%s/x.X.zarr-csr.tmp%ld-7", dir, (long)kid);
    char z[300], other[300];
    snprintf(z, sizeof z, "%s/z.X.zarr-csc", dir);
    ck_assert_int_eq(iv_cachedir_temp(z, live_n, sizeof live_n, &err), 0);
    ck_assert_int_eq(iv_cachedir_temp(z, other, sizeof other, &err), 0);
    ck_assert_str_ne(live_n, other);  /* two writers, two names */
    write_bytes(dead, 10, 0);
    write_bytes(live, 10, 0);
    write_bytes(foreign, 10, 0);
    write_bytes(dead_n, 10, 0);
    write_bytes(live_n, 10, 0);
    /* two.h5ad changes: both of its derived files are stale, unless kept. */
    write_bytes(s2, 1001, 2);
    const char *keep[] = {d4};
    iv_cachedir_sweep_t rep;
    ck_assert_int_eq(iv_cachedir_sweep(dir, 0, keep, 1, &rep, &err), 0);
    ck_assert_int_eq(rep.stale, 1);
    ck_assert_int_eq(rep.temps, 2);
    ck_assert_int_eq(rep.evicted, 0);
    ck_assert(!exists(d2));
    char note[320];
    snprintf(note, sizeof note, "%s.src", d2);
    ck_assert(!exists(note));
    ck_assert(exists(d4) && exists(d1) && exists(d3));
    ck_assert(!exists(dead) && exists(live) && exists(foreign));
    ck_assert(!exists(dead_n) && exists(live_n));
    ck_assert_uint_eq(rep.bytes_left, 8100);
    /* Bound 5000: the least recently used unkept goes (d1), then d3
     * would be next but the total fits. */
    ck_assert_int_eq(iv_cachedir_sweep(dir, 5000, keep, 1, &rep, &err), 0);
    ck_assert_int_eq(rep.evicted, 1);
    ck_assert(!exists(d1) && exists(d3) && exists(d4));
    ck_assert_uint_eq(rep.bytes_left, 4100);
    /* A note written before its copy (the producer has not begun its
     * temporary file): kept while its name is kept, removed after. */
    char d5[300], note5[320];
    iv_err_t e5;
    iv_err_clear(&e5);
    char k5[IV_CACHEDIR_KEY_LEN];
    ck_assert_int_eq(iv_cachedir_key(s3, k5, &e5), 0);
    char named5[260];
    snprintf(named5, sizeof named5, "%s/five.h5ad", dir);
    ck_assert_int_eq(iv_cachedir_path(dir, named5, k5, "ivcsr.h5ad", d5, sizeof d5, &e5), 0);
    ck_assert_int_eq(iv_cachedir_note(d5, s3, k5, &e5), 0);
    snprintf(note5, sizeof note5, "%s.src", d5);
    unlink(live);
    unlink(live_n);
    const char *keep5[] = {d4, d5};
    ck_assert_int_eq(iv_cachedir_sweep(dir, 0, keep5, 2, &rep, &err), 0);
    ck_assert(exists(note5));
    ck_assert_int_eq(iv_cachedir_sweep(dir, 0, keep, 1, &rep, &err), 0);
    ck_assert(!exists(note5));
    /* A touched file is recent: with d3 kept, nothing else can go.  The
     * touch moves the note, never the derived file (its time is part of
     * the identity of what is derived from it in turn). */
    struct stat before, after;
    ck_assert_int_eq(stat(d3, &before), 0);
    iv_cachedir_touch(d3);
    ck_assert_int_eq(stat(d3, &after), 0);
    ck_assert(before.st_mtim.tv_sec == after.st_mtim.tv_sec &&
              before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
    const char *keep2[] = {d3, d4};
    ck_assert_int_eq(iv_cachedir_sweep(dir, 1, keep2, 2, &rep, &err), 0);
    ck_assert_int_eq(rep.evicted, 0);
    ck_assert(exists(d3) && exists(d4));
    rm_rf(root);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cachedir");
    TCase *tc = tcase_create("cachedir");
    tcase_add_test(tc, prepare_makes_private_folders);
    tcase_add_test(tc, key_follows_the_bytes);
    tcase_add_test(tc, derived_names);
    tcase_add_test(tc, sweep_removes_stale_dead_and_least_recent);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
