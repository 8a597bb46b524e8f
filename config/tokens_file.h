/*
 * The tokens file: named bearer tokens, stored as their SHA-256, so the
 * file can be read by anyone who may read the configuration without
 * giving a token away.  One token a line:
 *
 *     # comment
 *     NAME  SHA256HEX  [SCOPE[,SCOPE...]]
 *
 * NAME is [A-Za-z0-9._@-]{1,64} and unique in the file; SHA256HEX is 64
 * hex digits (`ivserve token-hash NAME` prints such a line from a token
 * read on stdin); SCOPE is `read` (every dataset; the default when none
 * is given), `dataset:ID` (that dataset; repeatable), `metrics` or
 * `admin`.  Fields are separated by spaces or tabs; blank lines, lines
 * starting with '#' and a trailing CR are allowed.  Any other line is an
 * error naming the file and the line.  Loading is all or nothing.
 */
#ifndef IV_TOKENS_FILE_H
#define IV_TOKENS_FILE_H

#include <stddef.h>

#include "config.h"

/* Parses text (len bytes; src names it in messages) and replaces
 * c->token_entries with its tokens.  On error c is unchanged. */
int iv_tokens_file_parse(iv_config_t *c, const char *text, size_t len, const char *src,
                         iv_err_t *err);
/* Reads the file at path (at most 16 MiB) and parses it. */
int iv_tokens_file_load(iv_config_t *c, const char *path, iv_err_t *err);

/* Parses a comma-separated scope list into scope bits and dataset ids
 * (appended to *ds); 0, or -1 with the offending word in bad. */
int iv_token_scope_parse(const char *s, size_t len, unsigned *scope, char ***ds, size_t *nds,
                         char *bad, size_t bad_cap);
/* True for a valid token name. */
int iv_token_name_ok(const char *s, size_t len);

void iv_token_conf_free(iv_token_conf_t *t);

#endif
