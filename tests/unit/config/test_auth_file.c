/* Tests of config/tokens_file.c, the auth keys of config/config.c
 * (tokens_file, metrics_auth, trusted_proxies, --token scrubbing),
 * config/cidr.c and the access log's choice of client (server/access_log.c). */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access_log.h"
#include "cidr.h"
#include "config.h"
#include "sha256.h"
#include "tokens_file.h"

#define H1 "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"
#define H2 "2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824"

static int parse(iv_config_t *c, const char *text, char *msg, size_t cap)
{
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_tokens_file_parse(c, text, strlen(text), "tok.txt", &e);
    snprintf(msg, cap, "%s", e.msg);
    return rc;
}

START_TEST(test_file_good)
{
    iv_config_t c;
    iv_config_init(&c);
    char m[512];
    const char *text = "# lab tokens\n"
                       "\n"
                       "alice " H1 "\r\n"
                     "   \t\n"
                     "  bob\t" H2 "   dataset:a,dataset:b.2,metrics  \n"
                     "# ops\n"
                     "ops@lab 0000000000000000000000000000000000000000000000000000000000000000 admin,read";
    ck_assert_int_eq(parse(&c, text, m, sizeof m), 0);
    ck_assert_uint_eq(c.n_token_entries, 3);
    ck_assert_str_eq(c.token_entries[0].name, "alice");
    ck_assert_uint_eq(c.token_entries[0].scope, IV_SCOPE_READ);  /* the default */
    unsigned char d[32];
    iv_sha256("s3cret", 6, d);
    ck_assert(!memcmp(c.token_entries[0].sha256, d, 32));
    ck_assert_str_eq(c.token_entries[0].where, "tok.txt:3");
    ck_assert_str_eq(c.token_entries[1].name, "bob");
    ck_assert_uint_eq(c.token_entries[1].scope, IV_SCOPE_METRICS);
    ck_assert_uint_eq(c.token_entries[1].n_datasets, 2);
    ck_assert_str_eq(c.token_entries[1].datasets[1], "b.2");
    iv_sha256("hello", 5, d);
    ck_assert(!memcmp(c.token_entries[1].sha256, d, 32));   /* upper-case hex */
    ck_assert_str_eq(c.token_entries[2].name, "ops@lab");
    ck_assert_uint_eq(c.token_entries[2].scope, IV_SCOPE_ADMIN | IV_SCOPE_READ);
    /* An empty file (or only comments) is no tokens. */
    ck_assert_int_eq(parse(&c, "# none\n", m, sizeof m), 0);
    ck_assert_uint_eq(c.n_token_entries, 0);
    iv_config_free(&c);
}
END_TEST

START_TEST(test_file_errors_name_the_line)
{
    static const struct { const char *text, *want; } v[] = {
        {"alice\n", "line 1: expected 'NAME SHA256HEX"},
        {"# c\nalice 1234\n", "line 2: the hash must be 64 hex digits"},
        {"alice " H1 "x\n", "line 1: the hash must be 64 hex digits"},
        {"alice zz" H1 "\n", "line 1: the hash"},
        {"al ice " H1 "\n", "line 1: the hash"},
        {"al/ice " H1 "\n", "line 1: the name must be"},
        {"alice " H1 " read write\n", "line 1: more than three fields"},
        {"alice " H1 " write\n", "line 1: unknown scope 'write'"},
        {"alice " H1 " read,dataset:\n", "line 1: unknown scope 'dataset:'"},
        {"alice " H1 " read,,admin\n", "line 1: unknown scope ''"},
        {"alice " H1 "\n\nalice " H2 "\n", "line 3: the name 'alice' is already used at tok.txt:1"},
        {"alice " H1 "\nbob " H1 "\n", "line 2: the same token as 'alice' at tok.txt:1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        iv_config_t c;
        iv_config_init(&c);
        char m[512];
        /* A good file first: a bad one must leave its tokens in place. */
        ck_assert_int_eq(parse(&c, "keep " H2 "\n", m, sizeof m), 0);
        ck_assert_int_ne(parse(&c, v[i].text, m, sizeof m), 0);
        ck_assert_msg(strstr(m, v[i].want) && strstr(m, "tokens file tok.txt"), "case %zu: %s", i, m);
        ck_assert_uint_eq(c.n_token_entries, 1);
        ck_assert_str_eq(c.token_entries[0].name, "keep");
        iv_config_free(&c);
    }
    /* A NUL byte inside a line. */
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    const char nul[] = "alice " H1 "\0x\n";
    ck_assert_int_ne(iv_tokens_file_parse(&c, nul, sizeof nul - 1, "tok.txt", &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "line 1: holds a NUL"));
    iv_config_free(&c);
}
END_TEST

static char *write_tmp(const char *text)
{
    char *path = strdup("tokXXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

START_TEST(test_config_keys)
{
    char *tf = write_tmp("alice " H1 " dataset:a\n");
    /* The flag, the environment and the config file all name the file. */
    char *argv[] = {"ivserve", "a.h5ad", "--token-file", tf, "--metrics-auth", "token",
                    "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "::1", NULL};
    iv_config_t c;
    iv_config_init(&c);
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_config_from_args(&c, 10, argv, NULL, &e), 0);
    ck_assert_uint_eq(c.n_token_entries, 1);
    ck_assert_int_eq(c.metrics_auth, 1);
    ck_assert_uint_eq(c.n_trusted_proxies, 2);
    iv_config_free(&c);

    char envtf[256];
    snprintf(envtf, sizeof envtf, "IVSERVE_TOKEN_FILE=%s", tf);
    char *envp[] = {envtf, "IVSERVE_METRICS_AUTH=token", "IVSERVE_TRUSTED_PROXIES=127.0.0.1,fd00::/8", NULL};
    char *argv2[] = {"ivserve", "a.h5ad", NULL};
    iv_config_init(&c);
    ck_assert_int_eq(iv_config_from_args(&c, 2, argv2, envp, &e), 0);
    ck_assert_uint_eq(c.n_token_entries, 1);
    ck_assert_int_eq(c.metrics_auth, 1);
    ck_assert_uint_eq(c.n_trusted_proxies, 2);
    iv_config_free(&c);

    /* A token naming a dataset the server lacks is refused, naming the line. */
    char *argv3[] = {"ivserve", "b.h5ad", "--token-file", tf, NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_ne(iv_config_from_args(&c, 4, argv3, NULL, &e), 0);
    ck_assert_msg(strstr(e.msg, ":1") && strstr(e.msg, "dataset:a"), "%s", e.msg);
    iv_config_free(&c);

    /* JSON keys; tokens_file is relative to the config file's folder. */
    iv_config_init(&c);
    iv_err_clear(&e);
    const char *j = "{\"tokens_file\":\"t.txt\",\"metrics_auth\":\"token\","
                    "\"trusted_proxies\":[\"192.168.0.0/16\"]}";
    ck_assert_int_eq(iv_config_load_json(&c, j, strlen(j), "etc", &e), 0);
    ck_assert_str_eq(c.tokens_file, "etc/t.txt");
    ck_assert_int_eq(c.metrics_auth, 1);
    ck_assert_uint_eq(c.n_trusted_proxies, 1);
    iv_config_free(&c);

    static const struct { const char *j, *want; } bad[] = {
        {"{\"metrics_auth\":\"maybe\"}", "metrics_auth: must be \"open\" or \"token\""},
        {"{\"trusted_proxies\":[\"10.0.0.0/33\"]}", "trusted_proxies: '10.0.0.0/33'"},
        {"{\"trusted_proxies\":[\"proxy.lan\"]}", "trusted_proxies: 'proxy.lan'"},
        {"{\"trusted_proxies\":\"10.0.0.1\"}", "trusted_proxies: must be an array"},
        {"{\"tokens_file\":3}", "tokens_file: must be a file name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        iv_config_init(&c);
        iv_err_clear(&e);
        ck_assert_int_ne(iv_config_load_json(&c, bad[i].j, strlen(bad[i].j), NULL, &e), 0);
        ck_assert_msg(strstr(e.msg, bad[i].want), "%s", e.msg);
        iv_config_free(&c);
    }
    /* A missing file is an error naming it. */
    char *argv4[] = {"ivserve", "a.h5ad", "--token-file", "no-such-tokens.txt", NULL};
    iv_config_init(&c);
    iv_err_clear(&e);
    ck_assert_int_ne(iv_config_from_args(&c, 4, argv4, NULL, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "no-such-tokens.txt"));
    iv_config_free(&c);
    unlink(tf);
    free(tf);
}
END_TEST

START_TEST(test_scrub_argv)
{
    char a0[] = "ivserve", a1[] = "--token", a2[] = "topsecret", a3[] = "x.h5ad", a4[] = "--token",
         a5[] = "second", a6[] = "--port", a7[] = "1";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, NULL};
    ck_assert_int_eq(iv_config_scrub_argv(8, argv), 2);
    ck_assert(memcmp(a2, "\0\0\0\0\0\0\0\0\0", sizeof a2) == 0);
    ck_assert(memcmp(a5, "\0\0\0\0\0\0", sizeof a5) == 0);
    ck_assert_str_eq(a3, "x.h5ad");
    ck_assert_str_eq(a7, "1");
}
END_TEST

static int in(const char *range, const char *addr)
{
    iv_cidr_t r;
    unsigned char ip[16];
    ck_assert_int_eq(iv_cidr_parse(range, &r), 0);
    ck_assert_int_eq(iv_cidr_addr(addr, ip), 0);
    return iv_cidr_match(&r, ip);
}

START_TEST(test_cidr)
{
    ck_assert(in("10.0.0.0/8", "10.255.3.4"));
    ck_assert(!in("10.0.0.0/8", "11.0.0.1"));
    ck_assert(in("10.1.2.3/8", "10.9.9.9"));        /* host bits ignored */
    ck_assert(in("192.168.1.7", "192.168.1.7"));
    ck_assert(!in("192.168.1.7", "192.168.1.8"));
    ck_assert(in("192.168.1.0/25", "192.168.1.127"));
    ck_assert(!in("192.168.1.0/25", "192.168.1.128"));
    ck_assert(in("0.0.0.0/0", "8.8.8.8"));
    ck_assert(!in("0.0.0.0/0", "::1"));             /* IPv4 ranges hold IPv4 only */
    ck_assert(in("::ffff:127.0.0.1", "127.0.0.1")); /* mapped form of a v4 peer */
    ck_assert(in("fd00::/8", "fd12:3456::1"));
    ck_assert(!in("fd00::/8", "fe80::1"));
    ck_assert(in("::1", "::1"));
    iv_cidr_t r;
    const char *bad[] = {"", "/8", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/+8",
                         "::/129", "10.0.0", "host.example", "10.0.0.0/8x", "1.2.3.4/8/9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(iv_cidr_parse(bad[i], &r) != 0, "%s", bad[i]);
}
END_TEST

static const char *client(const char *peer, const char *xff, const char *const *trusted, size_t nt)
{
    static char out[64];
    iv_cidr_t t[4];
    for (size_t i = 0; i < nt; i++) ck_assert_int_eq(iv_cidr_parse(trusted[i], &t[i]), 0);
    unsigned char ip[16];
    ck_assert_int_eq(iv_cidr_addr(peer, ip), 0);
    iv_alog_client(out, sizeof out, peer, ip, xff, t, nt);
    return out;
}

START_TEST(test_forwarded_client)
{
    const char *lb[] = {"10.0.0.0/8"};
    const char *two[] = {"10.0.0.0/8", "172.16.0.0/12"};
    /* Not from a trusted proxy: the header is ignored. */
    ck_assert_str_eq(client("203.0.113.9", "1.2.3.4", lb, 1), "203.0.113.9");
    ck_assert_str_eq(client("10.0.0.5", "1.2.3.4", NULL, 0), "10.0.0.5");
    /* From one: the rightmost address it added. */
    ck_assert_str_eq(client("10.0.0.5", "198.51.100.7", lb, 1), "198.51.100.7");
    /* A forged left part is not believed: the first untrusted from the right. */
    ck_assert_str_eq(client("10.0.0.5", "6.6.6.6, 198.51.100.7", lb, 1), "198.51.100.7");
    /* A chain of trusted proxies is walked through. */
    ck_assert_str_eq(client("10.0.0.5", "198.51.100.7, 172.16.3.3", two, 2), "198.51.100.7");
    ck_assert_str_eq(client("10.0.0.5", "198.51.100.7,172.16.3.3 ,10.1.1.1", two, 2), "198.51.100.7");
    /* All trusted: the leftmost. */
    ck_assert_str_eq(client("10.0.0.5", "10.2.2.2, 10.3.3.3", lb, 1), "10.2.2.2");
    /* Garbage stops the walk at the last real address. */
    ck_assert_str_eq(client("10.0.0.5", "bad name", lb, 1), "10.0.0.5");
    ck_assert_str_eq(client("10.0.0.5", "x\",\"admin\":1, 10.9.9.9", lb, 1), "10.9.9.9");
    ck_assert_str_eq(client("10.0.0.5", "2001:db8::1", lb, 1), "2001:db8::1");
    ck_assert_str_eq(client("10.0.0.5", "", lb, 1), "10.0.0.5");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth_file");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_file_good);
    tcase_add_test(tc, test_file_errors_name_the_line);
    tcase_add_test(tc, test_config_keys);
    tcase_add_test(tc, test_scrub_argv);
    tcase_add_test(tc, test_cidr);
    tcase_add_test(tc, test_forwarded_client);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
