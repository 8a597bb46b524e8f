/* A scratch folder for kept-file tests (see kept_root.h). */
#include "kept_root.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    ck_assert_msg(in && out, "cannot copy %s", from);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

void iv_test_kept_setup(iv_test_kept_root_t *k, const char *tag)
{
    snprintf(k->root, sizeof k->root, "/tmp/iv_%s_%ld", tag, (long)getpid());
    ck_assert_int_eq(mkdir(k->root, 0700), 0);
    snprintf(k->file, sizeof k->file, "%s/a.h5ad", k->root);
    snprintf(k->dir, sizeof k->dir, "%s/cache", k->root);
    copy_file(IV_SOURCE_DIR "/examples/pbmc_example.h5ad", k->file);
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_cachedir_prepare(k->dir, &err), 0);
}

void iv_test_kept_teardown(const iv_test_kept_root_t *k)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", k->root);
    ck_assert_int_eq(system(cmd), 0);
}

void iv_test_change_unseen(const char *path, long off)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_ne(c, EOF);
    ck_assert_int_eq(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x01, f);
    ck_assert_int_eq(fclose(f), 0);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}
