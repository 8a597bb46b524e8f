/*
 * The export's file without a socket (api/h5ad_export.h), on a shared
 * fixture: the answer is an open descriptor of an HDF5 file that no name
 * reaches any more (unlinked, its folder gone), of the size fstat gives;
 * a cancelled export and a temporary folder that cannot be made are
 * errors that leave nothing behind and no descriptor.
 */
#include <check.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "dataset.h"
#include "fixtures.h"
#include "h5ad_export.h"

static iv_dataset_t *open_fixture(const char *name)
{
    const char *path = iv_test_fixture(name);
    if (!path) return NULL;
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(path, &o, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

/* Entries of dir besides . and .. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* One export of rows {3, 1, 1} and every gene into a fresh folder. */
static int run_export(iv_dataset_t *ds, const char *tmpdir, const atomic_int *cancel, int *fd, int64_t *size,
                      iv_err_t *err)
{
    static const int64_t rows[] = {3, 1, 1};
    iv_sel_t obs = {.all = 0, .n = 3, .idx = rows}, var = {.all = 1};
    iv_query_opts_t qo = {.axis = IV_OUT_ROWS, .pick = IV_PICK_AUTO};
    iv_query_t *q = NULL;
    ck_assert_msg(iv_query_new(ds, &obs, &var, &qo, &q, err) == 0, "%s", err->msg);
    int rc = iv_api_export_h5ad(ds, q, NULL, &obs, &var, tmpdir, cancel, fd, size, err);
    iv_query_free(q);
    return rc;
}

START_TEST(file_is_open_unlinked_and_hdf5)
{
    iv_dataset_t *ds = open_fixture("tiny.ivcsr.raw.h5ad");
    if (!ds) return;
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ivexportXXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    int fd = -1;
    int64_t size = 0;
    iv_err_t err = {0};
    ck_assert_msg(run_export(ds, dir, NULL, &fd, &size, &err) == 0, "%s", err.msg);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    ck_assert_int_eq(st.st_nlink, 0);                 /* no name reaches it */
    ck_assert_int_eq((int64_t)st.st_size, size);
    ck_assert_int_eq(entries(dir), 0);                /* its folder is gone */
    char sig[8];
    ck_assert_int_eq(pread(fd, sig, 8, 0), 8);
    ck_assert(memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0);
    close(fd);
    /* A cancelled export: an error, nothing left, no descriptor. */
    atomic_int cancel = 1;
    ck_assert_int_eq(run_export(ds, dir, &cancel, &fd, &size, &err), IV_ECANCELLED);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(entries(dir), 0);
    /* A temporary folder that cannot be made. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/absent", dir);
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(run_export(ds, missing, NULL, &fd, &size, &err), IV_EIO);
    ck_assert_int_eq(fd, -1);
    ck_assert(strstr(err.msg, "absent") != NULL);
    ck_assert_int_eq(rmdir(dir), 0);
    iv_dataset_close(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("h5ad_export");
    TCase *tc = tcase_create("file");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, file_is_open_unlinked_and_hdf5);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
