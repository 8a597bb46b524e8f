/* A scratch folder for the tests of files kept in the cache folder
 * (indexfile, arraysfile, plainfile): the bundled example copied in, and
 * a cache folder beside it. */
#ifndef IV_TEST_KEPT_ROOT_H
#define IV_TEST_KEPT_ROOT_H

/* The folder's paths, filled by iv_test_kept_setup. */
typedef struct iv_test_kept_root {
    char root[256];   /* /tmp/iv_TAG_PID */
    char file[300];   /* root/a.h5ad: examples/pbmc_example.h5ad, copied */
    char dir[300];    /* root/cache, made */
} iv_test_kept_root_t;

/* Makes the folder (failing the test when it cannot). */
void iv_test_kept_setup(iv_test_kept_root_t *k, const char *tag);
/* Removes it and everything in it. */
void iv_test_kept_teardown(const iv_test_kept_root_t *k);

/* Flips the low bit of the byte at off in the file at path and puts its
 * times back, so that only a checksum of its bytes can see the change. */
void iv_test_change_unseen(const char *path, long off);

#endif
