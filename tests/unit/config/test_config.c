/* Tests of config/config.c: defaults, file keys, precedence, errors naming the key. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

START_TEST(test_defaults_and_json)
{
    iv_config_t c;
    iv_config_init(&c);
    ck_assert_str_eq(c.listen, "127.0.0.1");
    ck_assert_int_eq(c.port, 8080);
    const char *j = "{\"port\":9000,\"tokens\":[\"a\",\"b\"],\"limits\":{\"max_rows\":5},"
                    "\"datasets\":[{\"id\":\"x1\",\"path\":\"d/x.h5ad\",\"title\":\"T\",\"tokens\":[\"s\"]},"
                    "{\"path\":\"/abs/pbmc.v2.h5ad\"}]}";
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_load_json(&c, j, strlen(j), "base", &e), 0);
    ck_assert_int_eq(c.port, 9000);
    ck_assert_int_eq(c.limits.max_rows, 5);
    ck_assert_uint_eq(c.n_tokens, 2);
    ck_assert_uint_eq(c.n_datasets, 2);
    ck_assert_str_eq(c.datasets[0].path, "base/d/x.h5ad");
    ck_assert_str_eq(c.datasets[0].title, "T");
    ck_assert_uint_eq(c.datasets[0].n_tokens, 1);
    ck_assert_str_eq(c.datasets[1].id, "pbmc.v2");  /* the name less .h5ad */
    ck_assert_str_eq(c.datasets[1].path, "/abs/pbmc.v2.h5ad");
    ck_assert_int_eq(iv_config_validate(&c, &e), 0);
    iv_config_free(&c);
}
END_TEST

static int load_err(const char *j, char *msg, size_t cap)
{
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_config_load_json(&c, j, strlen(j), NULL, &e);
    snprintf(msg, cap, "%s", e.msg);
    iv_config_free(&c);
    return rc;
}

START_TEST(test_orientation_settings)
{
    iv_config_t c;
    iv_config_init(&c);
    ck_assert_uint_eq(c.transpose_bytes, (size_t)4 << 30);
    const char *j = "{\"transpose_bytes\":1000,\"datasets\":[{\"path\":\"a.h5ad\","
                    "\"companion\":\"a.csc.h5ad\",\"companion_group\":\"Y\"},"
                    "{\"path\":\"b.h5ad\",\"transpose_bytes\":0}]}";
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_load_json(&c, j, strlen(j), "base", &e), 0);
    ck_assert_uint_eq(c.transpose_bytes, 1000);
    ck_assert_str_eq(c.datasets[0].companion, "base/a.csc.h5ad");
    ck_assert_str_eq(c.datasets[0].companion_group, "Y");
    ck_assert_int_eq(c.datasets[0].transpose_bytes, -1);
    ck_assert_int_eq(c.datasets[1].transpose_bytes, 0);
    ck_assert_int_eq(iv_config_add_path(&c, "c.h5ad", &e), 0);
    ck_assert_int_eq(c.datasets[2].transpose_bytes, -1);
    iv_config_free(&c);
    iv_config_init(&c);
    j = "{\"datasets\":[{\"path\":\"a.h5ad\",\"transpose_bytes\":-5}]}";
    ck_assert_int_ne(iv_config_load_json(&c, j, strlen(j), NULL, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "datasets[0].transpose_bytes"));
    iv_config_free(&c);
    iv_config_init(&c);
    iv_err_clear(&e);
    j = "{\"datasets\":[{\"path\":\"a.h5ad\",\"companion\":3}]}";
    ck_assert_int_ne(iv_config_load_json(&c, j, strlen(j), NULL, &e), 0);
    ck_assert_msg(strstr(e.msg, "datasets[0].companion") != NULL, "%s", e.msg);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_errors_name_the_key)
{
    char m[512];
    ck_assert_int_ne(load_err("{\"prot\":1}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "prot"));
    ck_assert_int_ne(load_err("{\"limits\":{\"max_rows\":0}}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "limits.max_rows"));
    ck_assert_int_ne(load_err("{\"limits\":{\"max_rowz\":1}}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "limits.max_rowz"));
    ck_assert_int_ne(load_err("{\"port\":\"80\"}", m, sizeof m), 0);
    ck_assert_int_ne(load_err("{\"port\":70000}", m, sizeof m), 0);
    ck_assert_int_ne(load_err("{\"log_format\":\"xml\"}", m, sizeof m), 0);
    ck_assert_int_ne(load_err("{\"datasets\":[{\"id\":\"../x\",\"path\":\"a\"}]}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "datasets[0].id"));
    ck_assert_int_ne(load_err("{\"datasets\":[{\"id\":\"a\"}]}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "datasets[0].path"));
    ck_assert_int_ne(load_err("{\"datasets\":[{\"path\":\"a\",\"colour\":\"x\"}]}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "colour"));
    /* Numbers outside int64 are range errors, not undefined conversions. */
    ck_assert_int_ne(load_err("{\"limits\":{\"max_rows\":1e19}}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "limits.max_rows"));
    ck_assert_ptr_nonnull(strstr(m, "out of range"));
    ck_assert_int_ne(load_err("{\"port\":-1e300}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "out of range"));
    ck_assert_int_ne(load_err("{\"limits\":{\"max_nnz\":9223372036854775808}}", m, sizeof m), 0);
    ck_assert_ptr_nonnull(strstr(m, "out of range"));
    /* A NUL would cut a token short without a word. */
    ck_assert_int_eq(load_err("{\"tokens\":[\"abc\\u0000xyz\"]}", m, sizeof m), IV_EBAD_JSON);
    ck_assert_ptr_nonnull(strstr(m, "u0000"));
    ck_assert_int_eq(load_err("{\"tokens\":[\"abc\\\\u0000xyz\"]}", m, sizeof m), 0);
    ck_assert_int_ne(load_err("{\"tokens\":[1]}", m, sizeof m), 0);
    ck_assert_int_ne(load_err("[1]", m, sizeof m), 0);
    ck_assert_int_ne(load_err("{", m, sizeof m), 0);
}
END_TEST

START_TEST(test_precedence_file_env_flags)
{
    char path[] = "cfgXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"port\":9000,\"threads\":3,\"listen\":\"0.0.0.0\",\"datasets\":[{\"id\":\"a\",\"path\":\"a.h5ad\"}]}", f);
    fclose(f);
    char *argv[] = {"ivserve", "--port", "9100", "--config", path, "b.h5ad", "--token", "t1", NULL};
    char *envp[] = {"IVSERVE_PORT=9050", "IVSERVE_THREADS=7", "IVSERVE_BIN=/x", "OTHER=1", NULL};
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_from_args(&c, 8, argv, envp, &e), 0);
    ck_assert_int_eq(c.port, 9100);     /* flag beats env beats file */
    ck_assert_uint_eq(c.threads, 7);    /* env beats file */
    ck_assert_str_eq(c.listen, "0.0.0.0");
    ck_assert_uint_eq(c.n_datasets, 2);
    ck_assert_str_eq(c.datasets[1].id, "b");
    ck_assert_uint_eq(c.n_tokens, 1);
    iv_config_free(&c);

    char *bad[] = {"ivserve", "--porridge", "1", "x.h5ad", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_ne(iv_config_from_args(&c, 4, bad, NULL, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "--porridge"));
    iv_config_free(&c);

    char *envbad[] = {"IVSERVE_PORT=eighty", NULL};
    char *ok[] = {"ivserve", "x.h5ad", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_ne(iv_config_from_args(&c, 2, ok, envbad, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "IVSERVE_PORT"));
    iv_config_free(&c);

    char *dup[] = {"ivserve", "d/x.h5ad", "e/x.h5ad", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_ne(iv_config_from_args(&c, 3, dup, NULL, &e), 0);
    iv_config_free(&c);
    remove(path);
}
END_TEST

/* A file's id is its name less ".h5ad": dots before the suffix stay, so
 * encodings and versions of one dataset can be served side by side. */
START_TEST(test_dataset_ids_from_file_names)
{
    char *argv[] = {"ivserve", "d/a.ivcsr.h5ad", "e/a.ivcsc.h5ad", "lupus.v2.h5ad",
                    "/x/lupus.v3.H5AD", "plain", "f/g.h5", NULL};
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_msg(iv_config_from_args(&c, 7, argv, NULL, &e) == 0, "%s", e.msg);
    ck_assert_uint_eq(c.n_datasets, 6);
    const char *want[] = {"a.ivcsr", "a.ivcsc", "lupus.v2", "lupus.v3", "plain", "g.h5"};
    for (size_t i = 0; i < 6; i++) ck_assert_str_eq(c.datasets[i].id, want[i]);
    ck_assert_str_eq(c.datasets[0].path, "d/a.ivcsr.h5ad");
    iv_config_free(&c);

    /* Two files that still give one id: the error names both files and
     * no list position that nobody wrote. */
    char *dup[] = {"ivserve", "one/lupus.v2.h5ad", "x.h5ad", "two/lupus.v2.h5ad", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_from_args(&c, 4, dup, NULL, &e), IV_EINVALID_ARG);
    ck_assert_msg(strstr(e.msg, "one/lupus.v2.h5ad") && strstr(e.msg, "two/lupus.v2.h5ad") &&
                  strstr(e.msg, "'lupus.v2'") && !strstr(e.msg, "datasets["), "%s", e.msg);
    iv_config_free(&c);

    /* A file name that is no valid id says so and names the file. */
    char *bad[] = {"ivserve", "d/a b.h5ad", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_from_args(&c, 2, bad, NULL, &e), IV_EINVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "d/a b.h5ad"));
    iv_config_free(&c);
}
END_TEST

START_TEST(test_example_config_loads)
{
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_msg(iv_config_load_file(&c, IV_SOURCE_DIR "/config/example.json", &e) == 0, "%s", e.msg);
    ck_assert_uint_eq(c.n_datasets, 1);
    ck_assert_ptr_nonnull(strstr(c.datasets[0].path, "examples/pbmc_example.h5ad"));
    iv_config_free(&c);
}
END_TEST

START_TEST(test_readyz_and_dataset_copies)
{
    iv_config_t c;
    iv_config_init(&c);
    ck_assert_int_eq(c.readyz_any, 0);  /* "all" */
    iv_err_t e;
    iv_err_clear(&e);
    const char *j = "{\"readyz\":\"any\",\"datasets\":[{\"id\":\"a\",\"path\":\"/x\",\"title\":\"T\","
                    "\"tokens\":[\"t1\",\"t2\"],\"companion\":\"/y\",\"transpose_bytes\":7}]}";
    ck_assert_int_eq(iv_config_load_json(&c, j, strlen(j), NULL, &e), 0);
    ck_assert_int_eq(c.readyz_any, 1);
    const char *bad = "{\"readyz\":\"most\"}";
    ck_assert_int_ne(iv_config_load_json(&c, bad, strlen(bad), NULL, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "readyz"));
    char *env[] = {"IVSERVE_READYZ=all", NULL};
    ck_assert_int_eq(iv_config_apply_env(&c, env, &e), 0);
    ck_assert_int_eq(c.readyz_any, 0);
    /* A copy equals its source; every field is compared. */
    iv_ds_conf_t d;
    ck_assert_int_eq(iv_ds_conf_copy(&d, &c.datasets[0]), 0);
    ck_assert(iv_ds_conf_equal(&d, &c.datasets[0]));
    ck_assert_ptr_ne(d.path, c.datasets[0].path);
    ck_assert_str_eq(d.tokens[1], "t2");
    d.transpose_bytes = 8;
    ck_assert(!iv_ds_conf_equal(&d, &c.datasets[0]));
    d.transpose_bytes = 7;
    /* The cache settings are copied and compared too. */
    ck_assert_int_eq(d.cache_bytes, c.datasets[0].cache_bytes);
    ck_assert_int_eq(d.cache_floor_bytes, c.datasets[0].cache_floor_bytes);
    d.cache_bytes = c.datasets[0].cache_bytes + 1;
    ck_assert(!iv_ds_conf_equal(&d, &c.datasets[0]));
    d.cache_bytes = c.datasets[0].cache_bytes;
    d.cache_floor_bytes = c.datasets[0].cache_floor_bytes + 1;
    ck_assert(!iv_ds_conf_equal(&d, &c.datasets[0]));
    d.cache_floor_bytes = c.datasets[0].cache_floor_bytes;
    ck_assert(iv_ds_conf_equal(&d, &c.datasets[0]));
    free(d.tokens[1]);
    d.tokens[1] = strdup("t3");
    ck_assert(!iv_ds_conf_equal(&d, &c.datasets[0]));
    free(d.title);
    d.title = NULL;  /* absent differs from present */
    free(d.tokens[1]);
    d.tokens[1] = strdup("t2");
    ck_assert(!iv_ds_conf_equal(&d, &c.datasets[0]));
    iv_ds_conf_free(&d);
    iv_config_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_defaults_and_json);
    tcase_add_test(tc, test_errors_name_the_key);
    tcase_add_test(tc, test_orientation_settings);
    tcase_add_test(tc, test_precedence_file_env_flags);
    tcase_add_test(tc, test_dataset_ids_from_file_names);
    tcase_add_test(tc, test_example_config_loads);
    tcase_add_test(tc, test_readyz_and_dataset_copies);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
