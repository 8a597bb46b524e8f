#include "fixtures.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

const char *iv_test_fixture(const char *name)
{
    static char p[1200];
    const char *env = getenv("IV_FIXTURES");
    snprintf(p, sizeof p, "%s/%s", env ? env : IV_FIXTURES, name);
    struct stat st;
    if (stat(p, &st) != 0) {
        printf("fixture %s absent, skipping the checks that read it\n", name);
        return NULL;
    }
    return p;
}

iv_meta_t *iv_test_meta(const char *name)
{
    const char *path = iv_test_fixture(name);
    if (!path) return NULL;
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    ck_assert_msg(iv_meta_load(path, NULL, &m, &e) == 0, "%s: %s", name, e.msg);
    return m;
}
