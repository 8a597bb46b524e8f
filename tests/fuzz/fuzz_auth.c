/*
 * libFuzzer target for the auth parsers: the tokens file, address ranges,
 * the Authorization header and X-Forwarded-For.  The first byte picks
 * the parser, the rest is its input.  Any bytes must be taken or refused
 * cleanly, and the access log's client must always be an address (or the
 * peer): a forged header never reaches the log as free text.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "access_log.h"
#include "auth.h"
#include "cidr.h"
#include "config.h"
#include "tokens_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0] % 3;
    char *s = malloc(size);
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    if (mode == 0) {
        iv_config_t c;
        iv_config_init(&c);
        iv_err_t e = {0};
        if (iv_tokens_file_parse(&c, (const char *)data + 1, size - 1, "fuzz", &e) == 0) {
            iv_auth_t a;
            if (iv_auth_build(&a, &c) == 0) {
                const iv_auth_token_t *t;
                iv_auth_identify(&a, "Bearer x", &t);
                iv_auth_free(&a);
            }
        } else if (c.n_token_entries != 0 || !e.msg[0]) {
            abort();  /* a refused file changes nothing and says why */
        }
        iv_config_free(&c);
    } else if (mode == 1) {
        iv_cidr_t r;
        unsigned char ip[16];
        if (iv_cidr_parse(s, &r) == 0 && r.bits > 128) abort();
        if (iv_cidr_addr(s, ip) == 0 && iv_cidr_parse(s, &r) == 0 && !iv_cidr_match(&r, ip)) abort();
    } else {
        iv_cidr_t t[2];
        iv_cidr_parse("0.0.0.0/0", &t[0]);
        iv_cidr_parse("::/0", &t[1]);
        unsigned char peer[16], ip[16];
        iv_cidr_addr("10.0.0.1", peer);
        char out[48];
        iv_alog_client(out, sizeof out, "10.0.0.1", peer, s, t, 2);
        if (iv_cidr_addr(out, ip) != 0) abort();
        /* The header as an Authorization value of a server with one token. */
        iv_config_t c;
        iv_config_init(&c);
        char *toks[] = {"tok"};
        c.tokens = toks;
        c.n_tokens = 1;
        iv_auth_t a;
        if (iv_auth_build(&a, &c) == 0) {
            const iv_auth_token_t *tk;
            iv_auth_verdict_t v = iv_auth_identify(&a, s, &tk);
            if ((v == IV_AUTH_OK) != (tk != NULL)) abort();
            iv_auth_free(&a);
        }
        c.tokens = NULL;
        c.n_tokens = 0;
        iv_config_free(&c);
    }
    free(s);
    return 0;
}
