/*
 * Who may read what: the server's bearer tokens, each with a name and a
 * scope, and the decisions the router asks of them.
 *
 * Tokens come from the tokens file (named SHA-256 hashes), the config's
 * and IVSERVE_TOKENS' plain `tokens` (scope read, named "tokens[i]") and
 * each dataset's plain `tokens` (that dataset, named "ID.tokens[i]").
 * Only hashes are kept.  A candidate is hashed and compared with every
 * hash over all 32 bytes, without an early exit, so the time of an answer
 * says nothing about the tokens; equal plain tokens merge their scopes.
 *
 * A dataset is public when no token has the scope `read` and no token
 * names it; otherwise it needs a token that reads it.  Without any token
 * the server is open and every decision is yes.  The table is immutable
 * after iv_auth_build; the loop reads it, and a reload builds a new one
 * and frees the old one between requests (copy the token name out if it
 * must outlive that: iv_auth_token_t pointers die with the table).
 */
#ifndef IV_AUTH_H
#define IV_AUTH_H

#include <stddef.h>

#include "config.h"

typedef struct iv_auth_token {
    char *name;
    unsigned char sha256[32];
    unsigned scope;           /* IV_SCOPE_* (config.h) */
    char **datasets;          /* ids it reads besides READ's all */
    size_t n_datasets;
} iv_auth_token_t;

typedef struct iv_auth {
    iv_auth_token_t *t;
    size_t n;
    int any_read;             /* some token has READ: no dataset is public */
    int any_protected;        /* some dataset needs a token */
    int metrics_auth;         /* /metrics needs METRICS or ADMIN */
} iv_auth_t;

/* A decision; the router answers the non-zero ones (auth_status). */
typedef enum iv_auth_verdict {
    IV_AUTH_OK = 0,
    IV_AUTH_MISSING,          /* 401, WWW-Authenticate: Bearer realm="ivserve" */
    IV_AUTH_BAD_TOKEN,        /* 401, ... error="invalid_token" */
    IV_AUTH_DENIED,           /* 403 */
} iv_auth_verdict_t;

/* Builds the table from cfg (which may be freed afterwards).  0, or -1
 * out of memory (a is then empty). */
int iv_auth_build(iv_auth_t *a, const iv_config_t *cfg);
void iv_auth_free(iv_auth_t *a);

/* The token an Authorization header value carries: *tok is set (and OK
 * returned) for a known token; MISSING for no header or not "Bearer";
 * BAD_TOKEN for an unknown token.  Constant time in the tokens. */
iv_auth_verdict_t iv_auth_identify(const iv_auth_t *a, const char *authorization,
                                   const iv_auth_token_t **tok);

/* True when dsid needs a token. */
int iv_auth_protected(const iv_auth_t *a, const char *dsid);
/* True when tok (NULL: no token) may read dsid. */
int iv_auth_may_read(const iv_auth_t *a, const iv_auth_token_t *tok, const char *dsid);

/*
 * The token of a query string's "token=" parameter (percent-decoded) as
 * an Authorization value ("Bearer TOKEN") in buf, or NULL when there is
 * none or it does not fit.  For the Zarr store's routes only: zarrita
 * copies a store URL's query string onto every request it makes and
 * cannot set headers (the access log records paths without queries).
 */
const char *iv_auth_query_bearer(const char *query, char *buf, size_t cap);

/*
 * A dataset route.  dsid is the dataset, or NULL when the id names no
 * dataset: that case is answered as a dataset the client may not read
 * would be (401 without a valid token, 403 with one), unless the client
 * could read every dataset or none is protected, so that an unknown id
 * and a protected one cannot be told apart; the caller answers 404 on OK
 * for NULL.  *tok: the token, or NULL.
 */
iv_auth_verdict_t iv_auth_dataset(const iv_auth_t *a, const char *authorization, const char *dsid,
                                  const iv_auth_token_t **tok);

/*
 * A route that needs a scope: IV_SCOPE_METRICS (/metrics, only when
 * metrics_auth is on: OK otherwise) or IV_SCOPE_ADMIN (admin routes such
 * as POST /v1/admin/reload: an admin token once the server has any token;
 * a server without tokens is open, admin routes included).  ADMIN
 * includes METRICS.
 */
iv_auth_verdict_t iv_auth_scope(const iv_auth_t *a, const char *authorization, unsigned scope,
                                const iv_auth_token_t **tok);

#endif
