/* The memory settings of config/config.c: the process-wide cache budget
 * (automatic by default, a share in percent), per-dataset caps and
 * floors, and the errors that name them. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

static int load(iv_config_t *c, const char *j, iv_err_t *e)
{
    iv_config_init(c);
    iv_err_clear(e);
    int rc = iv_config_load_json(c, j, strlen(j), NULL, e);
    if (rc == 0) rc = iv_config_validate(c, e);
    return rc;
}

START_TEST(defaults_are_automatic)
{
    iv_config_t c;
    iv_err_t e;
    ck_assert_int_eq(load(&c, "{\"datasets\":[{\"path\":\"a.h5ad\"}]}", &e), 0);
    ck_assert_uint_eq(c.cache_bytes, IV_CACHE_AUTO);
    ck_assert_uint_eq(c.cache_share_percent, 50);
    ck_assert_int_eq(c.datasets[0].cache_bytes, -1);
    ck_assert_int_eq(c.datasets[0].cache_floor_bytes, 0);
    iv_config_free(&c);
}
END_TEST

START_TEST(keys_from_file_environment_and_flags)
{
    iv_config_t c;
    iv_err_t e;
    const char *j = "{\"cache_bytes\":67108864,\"cache_share_percent\":30,\"datasets\":["
                    "{\"id\":\"a\",\"path\":\"a.h5ad\",\"cache_bytes\":1000,\"cache_floor_bytes\":500},"
                    "{\"id\":\"b\",\"path\":\"b.h5ad\",\"cache_floor_bytes\":2000}]}";
    ck_assert_msg(load(&c, j, &e) == 0, "%s", e.msg);
    ck_assert_uint_eq(c.cache_bytes, 67108864);
    ck_assert_uint_eq(c.cache_share_percent, 30);
    ck_assert_int_eq(c.datasets[0].cache_bytes, 1000);
    ck_assert_int_eq(c.datasets[0].cache_floor_bytes, 500);
    ck_assert_int_eq(c.datasets[1].cache_bytes, -1);
    ck_assert_int_eq(c.datasets[1].cache_floor_bytes, 2000);
    char *env[] = {"IVSERVE_CACHE_BYTES=1234", "IVSERVE_CACHE_SHARE_PERCENT=20", NULL};
    ck_assert_int_eq(iv_config_apply_env(&c, env, &e), 0);
    ck_assert_uint_eq(c.cache_bytes, 1234);
    ck_assert_uint_eq(c.cache_share_percent, 20);
    iv_config_free(&c);

    iv_config_init(&c);
    char *argv[] = {"ivserve", "--cache-share-percent", "75", "x.h5ad", NULL};
    char *noenv[] = {NULL};
    iv_err_clear(&e);
    ck_assert_msg(iv_config_from_args(&c, 4, argv, noenv, &e) == 0, "%s", e.msg);
    ck_assert_uint_eq(c.cache_share_percent, 75);
    ck_assert_uint_eq(c.cache_bytes, IV_CACHE_AUTO);
    iv_config_free(&c);
}
END_TEST

static void expect_error(const char *j, const char *needle)
{
    iv_config_t c;
    iv_err_t e;
    ck_assert_int_ne(load(&c, j, &e), 0);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "'%s' lacks '%s'", e.msg, needle);
    iv_config_free(&c);
}

START_TEST(bad_values_name_the_key)
{
    expect_error("{\"cache_share_percent\":0,\"datasets\":[{\"path\":\"a.h5ad\"}]}", "cache_share_percent");
    expect_error("{\"cache_share_percent\":101,\"datasets\":[{\"path\":\"a.h5ad\"}]}", "cache_share_percent");
    expect_error("{\"cache_bytes\":-1,\"datasets\":[{\"path\":\"a.h5ad\"}]}", "cache_bytes");
    expect_error("{\"datasets\":[{\"path\":\"a.h5ad\",\"cache_bytes\":\"big\"}]}", "datasets[0].cache_bytes");
    expect_error("{\"datasets\":[{\"path\":\"a.h5ad\",\"cache_floor_bytes\":-5}]}",
                 "datasets[0].cache_floor_bytes");
    expect_error("{\"datasets\":[{\"path\":\"a.h5ad\",\"cache_floor_bytes\":1.5}]}",
                 "datasets[0].cache_floor_bytes");
    expect_error("{\"datasets\":[{\"path\":\"a.h5ad\",\"cache_bytes\":10,\"cache_floor_bytes\":20}]}",
                 "over its cache_bytes");
    /* Floors an explicit budget cannot hold all at once. */
    expect_error("{\"cache_bytes\":100,\"datasets\":[{\"id\":\"a\",\"path\":\"a.h5ad\",\"cache_floor_bytes\":60},"
                 "{\"id\":\"b\",\"path\":\"b.h5ad\",\"cache_floor_bytes\":60}]}",
                 "cache_floor_bytes add up to 120");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("membudget_config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, defaults_are_automatic);
    tcase_add_test(tc, keys_from_file_environment_and_flags);
    tcase_add_test(tc, bad_values_name_the_key);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
