/*
 * Tokens file (see tokens_file.h).
 *
 * The file is parsed into a new vector that replaces the configuration's
 * only when every line is good, so a mistake while editing the file is
 * refused with its line number and never leaves half the tokens loaded
 * (a reload keeps the tokens it had).  Duplicate names and duplicate
 * hashes are errors: either would make the access log's name for a
 * request ambiguous.
 */
#include "tokens_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

#define MAX_NAME 64

void iv_token_conf_free(iv_token_conf_t *t)
{
    if (!t) return;
    free(t->name);
    for (size_t i = 0; i < t->n_datasets; i++) free(t->datasets[i]);
    free(t->datasets);
    free(t->where);
    memset(t, 0, sizeof *t);
}

/* ch is an ASCII letter or digit, or one of punct. */
static int word_char(char ch, const char *punct)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != '\0' && strchr(punct, ch) != NULL);
}

/* 1 to max characters, each a word_char. */
static int word_ok(const char *s, size_t len, size_t max, const char *punct)
{
    if (len == 0 || len > max) return 0;
    for (size_t i = 0; i < len; i++)
        if (!word_char(s[i], punct)) return 0;
    return 1;
}

int iv_token_name_ok(const char *s, size_t len)
{
    return word_ok(s, len, MAX_NAME, "._-@");
}

static int ds_id_ok(const char *s, size_t len)
{
    return word_ok(s, len, 128, "._-");
}

/* Appends a copy of the dataset id [id, id+len) to *ds: 0 or -1. */
static int push_dataset(const char *id, size_t len, char ***ds, size_t *nds)
{
    char **nv = realloc(*ds, (*nds + 1) * sizeof *nv);
    if (!nv) return -1;
    *ds = nv;
    if (!(nv[*nds] = strndup(id, len))) return -1;
    (*nds)++;
    return 0;
}

/* One word [w, w+wl) of a scope: 0, 1 when it names no scope, -1 when
 * out of memory. */
static int scope_word(const char *w, size_t wl, unsigned *scope, char ***ds, size_t *nds)
{
    static const struct {
        const char *word;
        unsigned bit;
    } words[] = {{"read", IV_SCOPE_READ}, {"metrics", IV_SCOPE_METRICS}, {"admin", IV_SCOPE_ADMIN}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (wl == strlen(words[k].word) && !memcmp(w, words[k].word, wl)) {
            *scope |= words[k].bit;
            return 0;
        }
    if (wl > 8 && !memcmp(w, "dataset:", 8) && ds_id_ok(w + 8, wl - 8))
        return push_dataset(w + 8, wl - 8, ds, nds);
    return 1;
}

int iv_token_scope_parse(const char *s, size_t len, unsigned *scope, char ***ds, size_t *nds,
                         char *bad, size_t bad_cap)
{
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && s[j] != ',') j++;
        int rc = scope_word(s + i, j - i, scope, ds, nds);
        if (rc < 0) snprintf(bad, bad_cap, "(out of memory)");
        if (rc > 0) snprintf(bad, bad_cap, "%.*s", (int)(j - i > 80 ? 80 : j - i), s + i);
        if (rc != 0) return -1;
        i = j + 1;
    }
    return 0;
}

static void entries_free(iv_token_conf_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) iv_token_conf_free(&v[i]);
    free(v);
}

/* The next field of a line: skips blanks, returns its start and length. */
static const char *field(const char **p, const char *end, size_t *len)
{
    while (*p < end && (**p == ' ' || **p == '\t')) (*p)++;
    const char *f = *p;
    while (*p < end && **p != ' ' && **p != '\t') (*p)++;
    *len = (size_t)(*p - f);
    return *len ? f : NULL;
}

static int parse_line(const char *line, const char *end, const char *src, size_t lineno,
                      iv_token_conf_t *t, iv_err_t *err)
{
    const char *p = line;
    size_t nl, hl, sl, xl;
    const char *name = field(&p, end, &nl);
    const char *hex = field(&p, end, &hl);
    const char *sc = field(&p, end, &sl);
    const char *extra = field(&p, end, &xl);
    if (!hex)
        return iv_fail(err, IV_EINVALID_ARG,
                       "tokens file %s line %zu: expected 'NAME SHA256HEX [SCOPE]'", src, lineno);
    if (extra)
        return iv_fail(err, IV_EINVALID_ARG,
                       "tokens file %s line %zu: more than three fields (scopes are separated by "
                       "commas, without spaces)", src, lineno);
    if (!iv_token_name_ok(name, nl))
        return iv_fail(err, IV_EINVALID_ARG,
                       "tokens file %s line %zu: the name must be 1 to %d letters, digits, '.', "
                       "'_', '-' or '@'", src, lineno, MAX_NAME);
    if (iv_sha256_from_hex(hex, hl, t->sha256) != 0)
        return iv_fail(err, IV_EINVALID_ARG,
                       "tokens file %s line %zu: the hash must be 64 hex digits (SHA-256 of the "
                       "token; see ivserve token-hash), not %zu characters", src, lineno, hl);
    if (!(t->name = strndup(name, nl))) return iv_fail(err, IV_ENOMEM, "tokens file: out of memory");
    char where[600];
    snprintf(where, sizeof where, "%s:%zu", src, lineno);
    if (!(t->where = strdup(where))) return iv_fail(err, IV_ENOMEM, "tokens file: out of memory");
    if (!sc) {
        t->scope = IV_SCOPE_READ;
        return 0;
    }
    char bad[96];
    if (iv_token_scope_parse(sc, sl, &t->scope, &t->datasets, &t->n_datasets, bad, sizeof bad) != 0)
        return iv_fail(err, IV_EINVALID_ARG,
                       "tokens file %s line %zu: unknown scope '%s' (read, dataset:ID, metrics, "
                       "admin)", src, lineno, bad);
    return 0;
}

/* The entry v[n-1] against the earlier ones: a name or a token given
 * twice is an error. */
static int check_unique(const iv_token_conf_t *v, size_t n, const char *src, size_t lineno,
                        iv_err_t *err)
{
    const iv_token_conf_t *t = &v[n - 1];
    for (size_t k = 0; k + 1 < n; k++) {
        if (!strcmp(v[k].name, t->name))
            return iv_fail(err, IV_EINVALID_ARG, "tokens file %s line %zu: the name '%s' is "
                           "already used at %s", src, lineno, v[k].name, v[k].where);
        if (!memcmp(v[k].sha256, t->sha256, sizeof v[k].sha256))
            return iv_fail(err, IV_EINVALID_ARG, "tokens file %s line %zu: the same token as "
                           "'%s' at %s", src, lineno, v[k].name, v[k].where);
    }
    return 0;
}

/* One line [p, le) of the file: a blank line or a comment is skipped,
 * anything else appended to *v as an entry. */
static int add_line(iv_token_conf_t **v, size_t *n, const char *p, const char *le, const char *src,
                    size_t lineno, iv_err_t *err)
{
    if (le > p && memchr(p, '\0', (size_t)(le - p)))
        return iv_fail(err, IV_EINVALID_ARG, "tokens file %s line %zu: holds a NUL byte", src, lineno);
    const char *q = p;
    while (q < le && (*q == ' ' || *q == '\t')) q++;
    if (q == le || *q == '#') return 0;
    iv_token_conf_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (!nv) return iv_fail(err, IV_ENOMEM, "tokens file %s: out of memory", src);
    *v = nv;
    memset(&nv[*n], 0, sizeof nv[*n]);
    (*n)++;
    IV_TRY(parse_line(q, le, src, lineno, &nv[*n - 1], err));
    return check_unique(nv, *n, src, lineno, err);
}

int iv_tokens_file_parse(iv_config_t *c, const char *text, size_t len, const char *src,
                         iv_err_t *err)
{
    iv_token_conf_t *v = NULL;
    size_t n = 0, lineno = 0;
    int rc = 0;
    const char *p = text, *end = text + len;
    while (p < end && rc == 0) {
        lineno++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t ll = (size_t)((eol ? eol : end) - p);
        if (ll > 0 && p[ll - 1] == '\r') ll--;
        rc = add_line(&v, &n, p, p + ll, src, lineno, err);
        p = eol ? eol + 1 : end;
    }
    if (rc) {
        entries_free(v, n);
        return rc;
    }
    entries_free(c->token_entries, c->n_token_entries);
    c->token_entries = v;
    c->n_token_entries = n;
    return 0;
}

int iv_tokens_file_load(iv_config_t *c, const char *path, iv_err_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return iv_fail(err, IV_EIO, "tokens file %s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= (16u << 20)) {
                rc = iv_fail(err, IV_ETOO_LARGE, "tokens file %s: larger than 16 MiB", path);
                break;
            }
            cap = cap ? cap * 2 : 4096;
            char *t = realloc(text, cap);
            if (!t) {
                rc = iv_fail(err, IV_ENOMEM, "tokens file %s: out of memory", path);
                break;
            }
            text = t;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = iv_fail(err, IV_EIO, "tokens file %s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) rc = iv_tokens_file_parse(c, text, len, path, err);
    free(text);
    return rc;
}
