/* Tests of server/auth.c: who may read what, from the tokens of a
 * configuration (named hashes, global and per-dataset plain tokens). */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "config.h"
#include "sha256.h"
#include "tokens_file.h"

/* A configuration of three datasets: "pub" (no token), "emb" (its own
 * plain token "emb-secret"), "lab" (named by file token "bob"), plus the
 * file tokens alice (read), bob (dataset:lab), prom (metrics), ops
 * (admin).  global: also a plain global token "g1" (so nothing is
 * public). */
static void make_cfg(iv_config_t *c, int global, int metrics_auth)
{
    iv_config_init(c);
    iv_err_t e;
    iv_err_clear(&e);
    const char *ids[] = {"pub", "emb", "lab"};
    for (int i = 0; i < 3; i++) {
        char p[32];
        snprintf(p, sizeof p, "%s.h5ad", ids[i]);
        ck_assert_int_eq(iv_config_add_path(c, p, &e), 0);
    }
    c->datasets[1].tokens = calloc(1, sizeof(char *));
    c->datasets[1].tokens[0] = strdup("emb-secret");
    c->datasets[1].n_tokens = 1;
    char text[1024], hex[5][65];
    const char *toks[] = {"alice-secret", "bob-secret", "prom-secret", "ops-secret", "emb-secret"};
    for (int i = 0; i < 5; i++) {
        unsigned char d[32];
        iv_sha256(toks[i], strlen(toks[i]), d);
        iv_sha256_hex(d, hex[i]);
    }
    snprintf(text, sizeof text,
             "alice %s\nbob %s dataset:lab\nprom %s metrics\nops %s admin\n", hex[0], hex[1], hex[2],
             hex[3]);
    ck_assert_int_eq(iv_tokens_file_parse(c, text, strlen(text), "t.txt", &e), 0);
    if (global) {
        c->tokens = calloc(1, sizeof(char *));
        c->tokens[0] = strdup("g1");
        c->n_tokens = 1;
    } else {
        /* Without a global plain token, alice's read still closes everything;
         * drop it to have public datasets. */
        c->token_entries[0].scope = 0;
    }
    c->metrics_auth = metrics_auth;
    ck_assert_int_eq(iv_config_validate(c, &e), 0);
}

static iv_auth_verdict_t ds(const iv_auth_t *a, const char *hdr, const char *id, const char **name)
{
    const iv_auth_token_t *t;
    iv_auth_verdict_t v = iv_auth_dataset(a, hdr, id, &t);
    if (name) *name = t ? t->name : NULL;
    return v;
}

START_TEST(test_identify)
{
    iv_config_t c;
    make_cfg(&c, 1, 0);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    const iv_auth_token_t *t;
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer alice-secret", &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "alice");
    ck_assert_int_eq(iv_auth_identify(&a, "bearer   ops-secret  ", &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "ops");
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer g1", &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "tokens[0]");
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer emb-secret", &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "emb.tokens[0]");
    /* Not a token: prefixes, extensions, case, empty. */
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer alice-secre", &t), IV_AUTH_BAD_TOKEN);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer alice-secrett", &t), IV_AUTH_BAD_TOKEN);
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer ALICE-SECRET", &t), IV_AUTH_BAD_TOKEN);
    ck_assert_int_eq(iv_auth_identify(&a, "Bearer ", &t), IV_AUTH_BAD_TOKEN);
    /* No bearer token at all. */
    ck_assert_int_eq(iv_auth_identify(&a, NULL, &t), IV_AUTH_MISSING);
    ck_assert_int_eq(iv_auth_identify(&a, "Basic YWxpY2U6eA==", &t), IV_AUTH_MISSING);
    /* The table holds hashes only: no byte of it spells a token. */
    for (size_t i = 0; i < a.n; i++) ck_assert(memmem(a.t[i].sha256, 32, "secret", 6) == NULL);
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_per_dataset_and_public)
{
    iv_config_t c;
    make_cfg(&c, 0, 0);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    const char *n;
    ck_assert(!iv_auth_protected(&a, "pub"));
    ck_assert(iv_auth_protected(&a, "emb"));
    ck_assert(iv_auth_protected(&a, "lab"));
    /* No token: the public one only; protected and unknown alike 401. */
    ck_assert_int_eq(ds(&a, NULL, "pub", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, NULL, "emb", NULL), IV_AUTH_MISSING);
    ck_assert_int_eq(ds(&a, NULL, NULL, NULL), IV_AUTH_MISSING);
    /* A per-dataset token: its own and the public one; another protected
     * one and an unknown id alike 403. */
    ck_assert_int_eq(ds(&a, "Bearer bob-secret", "lab", &n), IV_AUTH_OK);
    ck_assert_str_eq(n, "bob");
    ck_assert_int_eq(ds(&a, "Bearer bob-secret", "pub", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer bob-secret", "emb", NULL), IV_AUTH_DENIED);
    ck_assert_int_eq(ds(&a, "Bearer bob-secret", NULL, NULL), IV_AUTH_DENIED);
    ck_assert_int_eq(ds(&a, "Bearer emb-secret", "emb", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer emb-secret", "lab", NULL), IV_AUTH_DENIED);
    /* A wrong token is 401 everywhere, the public dataset included. */
    ck_assert_int_eq(ds(&a, "Bearer nope", "pub", NULL), IV_AUTH_BAD_TOKEN);
    ck_assert_int_eq(ds(&a, "Bearer nope", NULL, NULL), IV_AUTH_BAD_TOKEN);
    /* An admin-only token reads nothing protected. */
    ck_assert_int_eq(ds(&a, "Bearer ops-secret", "lab", NULL), IV_AUTH_DENIED);
    ck_assert(iv_auth_may_read(&a, NULL, "pub"));
    ck_assert(!iv_auth_may_read(&a, NULL, "lab"));
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_global_read)
{
    iv_config_t c;
    make_cfg(&c, 1, 0);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    ck_assert(iv_auth_protected(&a, "pub"));
    ck_assert_int_eq(ds(&a, NULL, "pub", NULL), IV_AUTH_MISSING);
    ck_assert_int_eq(ds(&a, "Bearer alice-secret", "emb", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer g1", "lab", NULL), IV_AUTH_OK);
    /* Whoever reads everything learns nothing from a 404. */
    ck_assert_int_eq(ds(&a, "Bearer g1", NULL, NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer bob-secret", "pub", NULL), IV_AUTH_DENIED);
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_open_server)
{
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    ck_assert_int_eq(iv_config_add_path(&c, "x.h5ad", &e), 0);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    ck_assert_int_eq(ds(&a, NULL, "x", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer whatever", "x", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, NULL, NULL, NULL), IV_AUTH_OK);  /* then 404 */
    const iv_auth_token_t *t;
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_METRICS, &t), IV_AUTH_OK);
    /* Without tokens the admin routes are open too ... */
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_ADMIN, &t), IV_AUTH_OK);
    iv_auth_free(&a);
    /* ... but one read token closes them to all but admin tokens. */
    c.tokens = calloc(1, sizeof(char *));
    c.tokens[0] = strdup("r");
    c.n_tokens = 1;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_ADMIN, &t), IV_AUTH_MISSING);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer x", IV_SCOPE_ADMIN, &t), IV_AUTH_BAD_TOKEN);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer r", IV_SCOPE_ADMIN, &t), IV_AUTH_DENIED);
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_scopes)
{
    iv_config_t c;
    make_cfg(&c, 1, 1);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    const iv_auth_token_t *t;
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_METRICS, &t), IV_AUTH_MISSING);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer bad", IV_SCOPE_METRICS, &t), IV_AUTH_BAD_TOKEN);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer alice-secret", IV_SCOPE_METRICS, &t), IV_AUTH_DENIED);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer prom-secret", IV_SCOPE_METRICS, &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "prom");
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer ops-secret", IV_SCOPE_METRICS, &t), IV_AUTH_OK);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer ops-secret", IV_SCOPE_ADMIN, &t), IV_AUTH_OK);
    ck_assert_str_eq(t->name, "ops");
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer prom-secret", IV_SCOPE_ADMIN, &t), IV_AUTH_DENIED);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer alice-secret", IV_SCOPE_ADMIN, &t), IV_AUTH_DENIED);
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_ADMIN, &t), IV_AUTH_MISSING);
    iv_auth_free(&a);
    /* metrics_auth off: /metrics is open to all. */
    iv_config_free(&c);
    make_cfg(&c, 1, 0);
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    ck_assert_int_eq(iv_auth_scope(&a, NULL, IV_SCOPE_METRICS, &t), IV_AUTH_OK);
    ck_assert_int_eq(iv_auth_scope(&a, "Bearer bad", IV_SCOPE_METRICS, &t), IV_AUTH_OK);
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_equal_plain_tokens_merge)
{
    /* One plain token listed on two datasets opens both; the file's
     * name wins over the plain token's. */
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    ck_assert_int_eq(iv_config_add_path(&c, "a.h5ad", &e), 0);
    ck_assert_int_eq(iv_config_add_path(&c, "b.h5ad", &e), 0);
    ck_assert_int_eq(iv_config_add_path(&c, "c.h5ad", &e), 0);
    for (int i = 0; i < 2; i++) {
        c.datasets[i].tokens = calloc(1, sizeof(char *));
        c.datasets[i].tokens[0] = strdup("shared");
        c.datasets[i].n_tokens = 1;
    }
    unsigned char d[32];
    char hex[65], text[200];
    iv_sha256("shared", 6, d);
    iv_sha256_hex(d, hex);
    snprintf(text, sizeof text, "carol %s dataset:c\n", hex);
    ck_assert_int_eq(iv_tokens_file_parse(&c, text, strlen(text), "t", &e), 0);
    iv_auth_t a;
    ck_assert_int_eq(iv_auth_build(&a, &c), 0);
    ck_assert_uint_eq(a.n, 1);
    const char *n;
    ck_assert_int_eq(ds(&a, "Bearer shared", "a", &n), IV_AUTH_OK);
    ck_assert_str_eq(n, "carol");
    ck_assert_int_eq(ds(&a, "Bearer shared", "b", NULL), IV_AUTH_OK);
    ck_assert_int_eq(ds(&a, "Bearer shared", "c", NULL), IV_AUTH_OK);
    iv_auth_free(&a);
    iv_config_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_identify);
    tcase_add_test(tc, test_per_dataset_and_public);
    tcase_add_test(tc, test_global_read);
    tcase_add_test(tc, test_open_server);
    tcase_add_test(tc, test_scopes);
    tcase_add_test(tc, test_equal_plain_tokens_merge);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
