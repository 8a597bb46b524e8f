/*
 * Bearer tokens (see auth.h).
 *
 * Keeping SHA-256 hashes rather than tokens gives every comparison the
 * same length (32 bytes), which is what makes a constant-time comparison
 * simple: the candidate's hash is compared with every stored hash, byte
 * differences folded into one word without a branch, and the match (if
 * any) selected with a mask.  Hashing the candidate takes time that
 * depends only on the candidate's own length, which its sender knows.
 */
#include "auth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "request.h"
#include "sha256.h"

static void token_free(iv_auth_token_t *t)
{
    free(t->name);
    for (size_t i = 0; i < t->n_datasets; i++) free(t->datasets[i]);
    free(t->datasets);
}

void iv_auth_free(iv_auth_t *a)
{
    for (size_t i = 0; i < a->n; i++) token_free(&a->t[i]);
    free(a->t);
    memset(a, 0, sizeof *a);
}

static int has_ds(const iv_auth_token_t *t, const char *id)
{
    for (size_t i = 0; i < t->n_datasets; i++)
        if (!strcmp(t->datasets[i], id)) return 1;
    return 0;
}

/* Adds a token, or merges it into the one with the same hash. */
static int add(iv_auth_t *a, const char *name, const unsigned char h[32], unsigned scope,
               char *const *ds, size_t nds)
{
    iv_auth_token_t *t = NULL;
    for (size_t i = 0; i < a->n && !t; i++)
        if (!memcmp(a->t[i].sha256, h, 32)) t = &a->t[i];
    if (!t) {
        iv_auth_token_t *nv = realloc(a->t, (a->n + 1) * sizeof *nv);
        if (!nv) return -1;
        a->t = nv;
        t = &nv[a->n];
        memset(t, 0, sizeof *t);
        if (!(t->name = strdup(name))) return -1;
        memcpy(t->sha256, h, 32);
        a->n++;
    }
    t->scope |= scope;
    for (size_t k = 0; k < nds; k++) {
        if (has_ds(t, ds[k])) continue;
        char **nv = realloc(t->datasets, (t->n_datasets + 1) * sizeof *nv);
        if (!nv) return -1;
        t->datasets = nv;
        if (!(nv[t->n_datasets] = strdup(ds[k]))) return -1;
        t->n_datasets++;
    }
    return 0;
}

int iv_auth_build(iv_auth_t *a, const iv_config_t *cfg)
{
    memset(a, 0, sizeof *a);
    unsigned char h[32];
    char name[200];
    /* The file's names first: a plain token equal to a named one keeps
     * the file's name in the log. */
    for (size_t i = 0; i < cfg->n_token_entries; i++) {
        const iv_token_conf_t *e = &cfg->token_entries[i];
        if (add(a, e->name, e->sha256, e->scope, e->datasets, e->n_datasets)) goto fail;
    }
    for (size_t i = 0; i < cfg->n_tokens; i++) {
        iv_sha256(cfg->tokens[i], strlen(cfg->tokens[i]), h);
        snprintf(name, sizeof name, "tokens[%zu]", i);
        if (add(a, name, h, IV_SCOPE_READ, NULL, 0)) goto fail;
    }
    for (size_t d = 0; d < cfg->n_datasets; d++) {
        const iv_ds_conf_t *dc = &cfg->datasets[d];
        for (size_t i = 0; i < dc->n_tokens; i++) {
            iv_sha256(dc->tokens[i], strlen(dc->tokens[i]), h);
            snprintf(name, sizeof name, "%s.tokens[%zu]", dc->id, i);
            if (add(a, name, h, 0, &dc->id, 1)) goto fail;
        }
    }
    for (size_t i = 0; i < a->n; i++) {
        if (a->t[i].scope & IV_SCOPE_READ) a->any_read = 1;
        if ((a->t[i].scope & IV_SCOPE_READ) || a->t[i].n_datasets) a->any_protected = 1;
    }
    a->metrics_auth = cfg->metrics_auth;
    return 0;
fail:
    iv_auth_free(a);
    return -1;
}

iv_auth_verdict_t iv_auth_identify(const iv_auth_t *a, const char *authorization,
                                   const iv_auth_token_t **tok)
{
    *tok = NULL;
    const char *h = authorization;
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return IV_AUTH_MISSING;
    const char *p = h + 7;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen(p);
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    unsigned char c[32];
    iv_sha256(p, n, c);
    size_t which = 0;
    unsigned found = 0;
    for (size_t i = 0; i < a->n; i++) {
        unsigned diff = 0;
        for (int k = 0; k < 32; k++) diff |= (unsigned)(a->t[i].sha256[k] ^ c[k]);
        /* 1 when diff is 0: diff - 1 wraps to all ones only then. */
        unsigned eq = ((diff - 1u) >> 8) & 1u;
        which |= ((size_t)0 - (size_t)(eq & (found ^ 1u))) & i;
        found |= eq;
    }
    if (!found || n == 0) return IV_AUTH_BAD_TOKEN;
    *tok = &a->t[which];
    return IV_AUTH_OK;
}

int iv_auth_protected(const iv_auth_t *a, const char *dsid)
{
    if (a->any_read) return 1;
    for (size_t i = 0; i < a->n; i++)
        if (has_ds(&a->t[i], dsid)) return 1;
    return 0;
}

int iv_auth_may_read(const iv_auth_t *a, const iv_auth_token_t *tok, const char *dsid)
{
    if (!iv_auth_protected(a, dsid)) return 1;
    return tok && ((tok->scope & IV_SCOPE_READ) || has_ds(tok, dsid));
}

iv_auth_verdict_t iv_auth_dataset(const iv_auth_t *a, const char *authorization, const char *dsid,
                                  const iv_auth_token_t **tok)
{
    *tok = NULL;
    if (a->n == 0) return IV_AUTH_OK;
    iv_auth_verdict_t v = iv_auth_identify(a, authorization, tok);
    if (v == IV_AUTH_BAD_TOKEN) return v;
    if (dsid ? iv_auth_may_read(a, *tok, dsid)
             : !a->any_protected || (*tok && ((*tok)->scope & IV_SCOPE_READ)))
        return IV_AUTH_OK;
    return *tok ? IV_AUTH_DENIED : IV_AUTH_MISSING;
}

iv_auth_verdict_t iv_auth_scope(const iv_auth_t *a, const char *authorization, unsigned scope,
                                const iv_auth_token_t **tok)
{
    *tok = NULL;
    /* A server without tokens is open, its admin routes included (it has
     * no way to tell an operator from anyone else). */
    if (a->n == 0) return IV_AUTH_OK;
    if (scope == IV_SCOPE_METRICS && !a->metrics_auth) {
        /* Open; a token still names the client in the log when it is good. */
        iv_auth_identify(a, authorization, tok);
        return IV_AUTH_OK;
    }
    iv_auth_verdict_t v = iv_auth_identify(a, authorization, tok);
    if (v != IV_AUTH_OK) return v;
    unsigned have = (*tok)->scope;
    if (have & IV_SCOPE_ADMIN) have |= IV_SCOPE_METRICS;
    return (have & scope) == scope ? IV_AUTH_OK : IV_AUTH_DENIED;
}

const char *iv_auth_query_bearer(const char *query, char *buf, size_t cap)
{
    for (const char *p = query; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, "token=", 6) != 0) continue;
        const char *v = p + 6;
        size_t n = strcspn(v, "&");
        char *tok = iv_url_decode_form(v, n);
        if (!tok) return NULL;
        int w = snprintf(buf, cap, "Bearer %s", tok);
        free(tok);
        return w > 7 && (size_t)w < cap ? buf : NULL;
    }
    return NULL;
}
