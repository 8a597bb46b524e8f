/*
 * The tiny fixture's obs and var metadata for unit tests, or NULL when
 * the shared fixtures are absent (IV_FIXTURES names their folder, else
 * the build's default).  The caller frees it with iv_meta_free.
 */
#ifndef IV_TEST_TINY_META_H
#define IV_TEST_TINY_META_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "meta.h"

static inline iv_meta_t *iv_test_tiny_meta(void)
{
    const char *env = getenv("IV_FIXTURES");
    char path[1200];
    snprintf(path, sizeof path, "%s/tiny.ivcsr.blosc2-lz4.h5ad", env ? env : IV_FIXTURES);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_msg(iv_meta_load(path, NULL, &m, &e) == 0, "%s", e.msg);
    return m;
}
#endif
