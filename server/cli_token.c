/*
 * token-hash (see cli_token.h).
 *
 * The token is the first line of stdin, without its line end; it is
 * checked the way the server will see it (an Authorization header value
 * cannot hold control characters, and the server trims blanks around
 * it), so a line that could never match is refused here rather than
 * silently never opening anything.  The name and scope are checked by
 * the tokens file's own parser functions.
 */
#include "cli_token.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"
#include "tokens_file.h"

static int usage(void)
{
    fputs("usage: ivserve token-hash NAME [SCOPE] < token-file\n"
          "  prints 'NAME SHA256HEX [SCOPE]' for the token on stdin's first line, a line for\n"
          "  the tokens file (--token-file).  SCOPE: read (default), dataset:ID, metrics,\n"
          "  admin, comma-separated (read,admin).\n",
          stderr);
    return 2;
}

int iv_cli_token_main(int argc, char **argv)
{
    if (argc < 3 || argc > 4 || argv[2][0] == '-') return usage();
    const char *name = argv[2], *scope = argc == 4 ? argv[3] : NULL;
    if (!iv_token_name_ok(name, strlen(name))) {
        fprintf(stderr, "ivserve: error: token name '%s': use 1 to 64 letters, digits, '.', '_', "
                        "'-' or '@'\n", name);
        return 1;
    }
    if (scope) {
        unsigned bits = 0;
        char **ds = NULL, bad[96];
        size_t nds = 0;
        int rc = iv_token_scope_parse(scope, strlen(scope), &bits, &ds, &nds, bad, sizeof bad);
        for (size_t i = 0; i < nds; i++) free(ds[i]);
        free(ds);
        if (rc) {
            fprintf(stderr, "ivserve: error: unknown scope '%s' (read, dataset:ID, metrics, admin)\n", bad);
            return 1;
        }
    }
    char buf[4096];
    if (!fgets(buf, sizeof buf, stdin)) {
        fprintf(stderr, "ivserve: error: no token on stdin\n");
        return 1;
    }
    size_t n = strlen(buf);
    if (n == sizeof buf - 1 && buf[n - 1] != '\n') {
        fprintf(stderr, "ivserve: error: the token is longer than %zu bytes\n", sizeof buf - 2);
        return 1;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    int bad = n == 0 || buf[0] == ' ' || buf[0] == '\t' || buf[n - 1] == ' ' || buf[n - 1] == '\t';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x20 && buf[i] != '\t') bad = 1;
    if (bad) {
        fprintf(stderr, "ivserve: error: the token must be one non-empty line without control "
                        "characters or blanks at its ends\n");
        return 1;
    }
    unsigned char d[IV_SHA256_BYTES];
    char hex[2 * IV_SHA256_BYTES + 1];
    iv_sha256(buf, n, d);
    memset(buf, 0, sizeof buf);
    iv_sha256_hex(d, hex);
    printf("%s %s%s%s\n", name, hex, scope ? " " : "", scope ? scope : "");
    return 0;
}
