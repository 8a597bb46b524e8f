/*
 * token-hash (see cli_token.h).
 *
 * The token is the whole of stdin: one line, with or without its line
 * end ("\n" or "\r\n").  It is checked the way the server will see it
 * (an Authorization header value cannot hold NUL, control characters or
 * line breaks, and the server trims blanks around it), so input that
 * could never match, or that would be hashed only in part (a NUL byte, a
 * second line), is refused here rather than silently never opening
 * anything.  The name and scope are checked by the tokens file's own
 * parser functions.
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
          "  prints 'NAME SHA256HEX [SCOPE]' for the token on stdin (one line), a line for\n"
          "  the tokens file (--token-file).  SCOPE: read (default), dataset:ID, metrics,\n"
          "  admin, comma-separated (read,admin).\n",
          stderr);
    return 2;
}

/* NAME and SCOPE checked by the tokens file's parsers: 0, or 1 with the
 * error printed. */
static int check_name_scope(const char *name, const char *scope)
{
    if (!iv_token_name_ok(name, strlen(name))) {
        fprintf(stderr, "ivserve: error: token name '%s': use 1 to 64 letters, digits, '.', '_', "
                        "'-' or '@'\n", name);
        return 1;
    }
    if (!scope) return 0;
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
    return 0;
}

/* Reads stdin into buf (cap bytes: one more than the longest token and
 * its "\r\n" tells a longer input apart).  NULL, or why it cannot be a
 * token (in why_buf when it needs one). */
static const char *read_token(char *buf, size_t cap, size_t *n_out, char *why_buf, size_t why_cap)
{
    size_t n = 0, got;
    while (n < cap && (got = fread(buf + n, 1, cap - n, stdin)) > 0) n += got;
    *n_out = n;
    if (ferror(stdin)) return "cannot read stdin";
    if (n == cap) {
        snprintf(why_buf, why_cap, "the token is longer than %zu bytes", cap - 3);
        return why_buf;
    }
    if (n == 0) return "no token on stdin";
    const char *nul = memchr(buf, '\0', n);
    if (nul) {
        snprintf(why_buf, why_cap, "the token holds a NUL byte (at byte %zu)", (size_t)(nul - buf));
        return why_buf;
    }
    return NULL;
}

/* The first control character of buf[0..n) (a tab is not one), or n. */
static size_t control_char_at(const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n && !(((unsigned char)buf[i] < 0x20 && buf[i] != '\t') || buf[i] == 0x7f)) i++;
    return i;
}

/* Drops the line end from the n_io bytes read; NULL, or why the line
 * cannot be a token as the server sees an Authorization value. */
static const char *check_token(const char *buf, size_t *n_io, char *why_buf, size_t why_cap)
{
    size_t n = *n_io;
    if (buf[n - 1] == '\n') n--;
    if (n > 0 && buf[n - 1] == '\r' && buf[n] == '\n') n--;
    *n_io = n;
    if (memchr(buf, '\n', n)) return "stdin holds more than one line: give the token alone, on one line";
    if (n == 0) return "the token is empty";
    size_t i = control_char_at(buf, n);
    if (i < n) {
        snprintf(why_buf, why_cap, "the token holds a control character (byte 0x%02x at %zu)",
                 (unsigned char)buf[i], i);
        return why_buf;
    }
    if (buf[0] == ' ' || buf[0] == '\t' || buf[n - 1] == ' ' || buf[n - 1] == '\t')
        return "the token has blanks at its ends (the server trims them from the header)";
    return NULL;
}

int iv_cli_token_main(int argc, char **argv)
{
    if (argc < 3 || argc > 4 || argv[2][0] == '-') return usage();
    const char *name = argv[2], *scope = argc == 4 ? argv[3] : NULL;
    if (check_name_scope(name, scope)) return 1;
    char buf[4096], why_buf[96];
    size_t n;
    const char *why = read_token(buf, sizeof buf, &n, why_buf, sizeof why_buf);
    if (!why) why = check_token(buf, &n, why_buf, sizeof why_buf);
    if (why) {
        memset(buf, 0, sizeof buf);
        fprintf(stderr, "ivserve: error: %s\n", why);
        return 1;
    }
    if (n < 16)
        fprintf(stderr, "ivserve: warning: a token of %zu bytes is easy to guess; 32 random bytes "
                        "(openssl rand -hex 32) are not\n", n);
    unsigned char d[IV_SHA256_BYTES];
    char hex[2 * IV_SHA256_BYTES + 1];
    iv_sha256(buf, n, d);
    memset(buf, 0, sizeof buf);
    iv_sha256_hex(d, hex);
    printf("%s %s%s%s\n", name, hex, scope ? " " : "", scope ? scope : "");
    return 0;
}
