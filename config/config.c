/*
 * Settings (see config.h).
 *
 * Numeric settings are described once, in a table that maps a config key,
 * an environment variable and a flag to one field with its bounds; the
 * three sources go through the same setter, so a value is checked the
 * same way wherever it came from, and an error names the key the user
 * actually wrote.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "tokens_file.h"

enum num_kind { NK_U32, NK_SIZE, NK_I64, NK_INT, NK_UINT };

struct num_opt {
    const char *key;      /* config key ("limits.max_rows") */
    const char *env;      /* IVSERVE_* or NULL */
    const char *flag;     /* --flag or NULL */
    size_t off;
    enum num_kind kind;
    int64_t min, max;
};

#define OFF(f) offsetof(iv_config_t, f)
static const struct num_opt num_opts[] = {
    {"port", "IVSERVE_PORT", "--port", OFF(port), NK_INT, 0, 65535},
    {"threads", "IVSERVE_THREADS", "--threads", OFF(threads), NK_UINT, 0, 1024},
    {"loops", "IVSERVE_LOOPS", "--loops", OFF(loops), NK_UINT, 0, 64},
    {"queue", "IVSERVE_QUEUE", "--queue", OFF(queue), NK_SIZE, 1, 1 << 24},
    {"cache_bytes", "IVSERVE_CACHE_BYTES", "--cache-bytes", OFF(cache_bytes), NK_SIZE, 0, INT64_MAX},
    {"memory_bytes", "IVSERVE_MEMORY_BYTES", "--memory-bytes", OFF(memory_bytes), NK_SIZE, 0, INT64_MAX},
    {"cache_share_percent", "IVSERVE_CACHE_SHARE_PERCENT", "--cache-share-percent", OFF(cache_share_percent), NK_UINT, 1, 100},
    {"transpose_bytes", "IVSERVE_TRANSPOSE_BYTES", "--transpose-bytes", OFF(transpose_bytes), NK_SIZE, 0, INT64_MAX},
    {"cache_dir_bytes", "IVSERVE_CACHE_DIR_BYTES", "--cache-dir-bytes", OFF(cache_dir_bytes), NK_SIZE, 0, INT64_MAX},
    {"zarr_keep_entries", "IVSERVE_ZARR_KEEP_ENTRIES", "--zarr-keep-entries", OFF(zarr_keep_entries), NK_I64, 0, INT64_MAX},
    {"cache_max_age", "IVSERVE_CACHE_MAX_AGE", "--cache-max-age", OFF(cache_max_age), NK_U32, 0, 31536000},
    {"gzip_level", "IVSERVE_GZIP_LEVEL", "--gzip-level", OFF(gzip_level), NK_INT, 0, 9},
    {"limits.header_bytes", NULL, "--max-header-bytes", OFF(limits.header_bytes), NK_SIZE, 256, 1 << 24},
    {"limits.body_bytes", NULL, "--max-body-bytes", OFF(limits.body_bytes), NK_SIZE, 0, 1 << 30},
    {"limits.header_timeout_ms", NULL, "--header-timeout-ms", OFF(limits.header_timeout_ms), NK_U32, 1, 86400000},
    {"limits.body_timeout_ms", NULL, "--body-timeout-ms", OFF(limits.body_timeout_ms), NK_U32, 1, 86400000},
    {"limits.keepalive_ms", NULL, "--keepalive-ms", OFF(limits.keepalive_ms), NK_U32, 1, 86400000},
    {"limits.write_timeout_ms", NULL, "--write-timeout-ms", OFF(limits.write_timeout_ms), NK_U32, 1, 86400000},
    {"limits.compute_timeout_ms", NULL, "--compute-timeout-ms", OFF(limits.compute_timeout_ms), NK_U32, 1, 86400000},
    {"limits.write_budget_bytes", NULL, "--write-budget-bytes", OFF(limits.write_budget_bytes), NK_SIZE, 1 << 20, INT64_MAX},
    {"limits.shutdown_grace_ms", NULL, "--shutdown-grace-ms", OFF(limits.shutdown_grace_ms), NK_U32, 0, 3600000},
    {"limits.max_connections", "IVSERVE_MAX_CONNECTIONS", "--max-connections", OFF(limits.max_connections), NK_U32, 1, 1000000},
    {"limits.max_rows", NULL, "--max-rows", OFF(limits.max_rows), NK_I64, 1, INT64_MAX},
    {"limits.max_nnz", NULL, "--max-nnz", OFF(limits.max_nnz), NK_I64, 1, INT64_MAX},
    {"limits.json_bytes", NULL, "--max-json-bytes", OFF(limits.json_bytes), NK_SIZE, 1024, INT64_MAX},
    {"limits.max_answer_bytes", NULL, "--max-answer-bytes", OFF(limits.max_answer_bytes), NK_SIZE, 1 << 16, INT64_MAX},
    {"limits.blocks_ahead", NULL, "--blocks-ahead", OFF(limits.blocks_ahead), NK_U32, 1, 64},
    {"limits.answer_wait_ms", NULL, "--answer-wait-ms", OFF(limits.answer_wait_ms), NK_U32, 0, 60000},
    {"limits.max_pipeline", NULL, "--max-pipeline", OFF(limits.max_pipeline), NK_U32, 1, 1024},
};
#undef OFF
#define N_NUM_OPTS (sizeof num_opts / sizeof num_opts[0])

void iv_config_init(iv_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->listen = strdup("127.0.0.1");
    c->port = 8080;
    c->threads = 0;
    c->queue = 1024;
    /* A share of what the machine has free when the server starts (see
     * iv_membudget_default and docs/sizing.md for why half). */
    c->cache_bytes = IV_CACHE_AUTO;
    c->cache_share_percent = 50;
    c->transpose_bytes = (size_t)4 << 30;
    c->zarr_keep_entries = IV_ZARR_KEEP_ENTRIES;
    c->cache_max_age = 604800;  /* a week, as cellxgene caches */
    /* Level 1, ISA-L's igzip level 1 where the build has it: on real 1%
     * query blocks one thread compresses 340-430 MB/s, five times zlib
     * level 1, to 0.35-0.37 of the identity bytes (zlib 1: 0.31-0.38).
     * Level 3 gives 3-9% fewer bytes at 0.7-0.9x the speed; a binary
     * answer decodes at about 350 MB/s a thread when its chunks are
     * cached, so even the fastest level leaves binary gzip answers near
     * half the identity throughput (0.47x on a 2-core VM; NDJSON 0.72x):
     * benchmarks/bench_gzip_stream.c, bench_http_gzip.sh. */
    c->gzip_level = 1;
    c->log_format = strdup("json");
    c->access_log = strdup("-");
    c->autopack = 1;
    c->limits.header_bytes = 16384;
    c->limits.body_bytes = (size_t)8 << 20;
    c->limits.header_timeout_ms = 10000;
    c->limits.body_timeout_ms = 30000;
    c->limits.keepalive_ms = 60000;
    c->limits.write_timeout_ms = 60000;
    c->limits.compute_timeout_ms = 300000;
    c->limits.write_budget_bytes = (size_t)1 << 30;
    c->limits.shutdown_grace_ms = 10000;
    c->limits.max_connections = 1024;
    c->limits.max_rows = (int64_t)1 << 31;
    c->limits.max_nnz = (int64_t)1 << 36;
    c->limits.json_bytes = (size_t)64 << 20;
    /* Answers streamed block by block are bounded by the blocks and the
     * write budget; this bounds the rest, whose whole answer or working
     * set exists before the first byte goes out, where duplicates in the
     * request could make it larger than the dataset's own arrays: a 1 MB
     * body listing one gene 500,000 times must not hold gigabytes.  An
     * answer no larger than its whole-array form (an embedding, every
     * gene's aggregate) is not refused by it (docs/config.md, the `limits.*` settings). */
    c->limits.max_answer_bytes = (size_t)64 << 20;
    c->limits.blocks_ahead = 3;
    c->limits.answer_wait_ms = 1000;
    c->limits.max_pipeline = 32;
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

void iv_ds_conf_free(iv_ds_conf_t *d)
{
    free(d->id);
    free(d->path);
    free(d->group);
    free(d->title);
    free(d->companion);
    free(d->companion_group);
    free_strv(d->tokens, d->n_tokens);
}

/* The string fields of a dataset's settings, copied and compared alike. */
static const size_t ds_str_fields[] = {
    offsetof(iv_ds_conf_t, id),        offsetof(iv_ds_conf_t, path),
    offsetof(iv_ds_conf_t, group),     offsetof(iv_ds_conf_t, title),
    offsetof(iv_ds_conf_t, companion), offsetof(iv_ds_conf_t, companion_group),
};
#define N_DS_STR_FIELDS (sizeof ds_str_fields / sizeof ds_str_fields[0])

static char **ds_str(iv_ds_conf_t *d, size_t k)
{
    return (char **)((char *)d + ds_str_fields[k]);
}

static const char *ds_str_c(const iv_ds_conf_t *d, size_t k)
{
    return *(char *const *)((const char *)d + ds_str_fields[k]);
}

int iv_ds_conf_copy(iv_ds_conf_t *out, const iv_ds_conf_t *in)
{
    memset(out, 0, sizeof *out);
    out->transpose_bytes = in->transpose_bytes;
    out->cache_bytes = in->cache_bytes;
    out->cache_floor_bytes = in->cache_floor_bytes;
    for (size_t k = 0; k < N_DS_STR_FIELDS; k++)
        if (ds_str_c(in, k) && !(*ds_str(out, k) = strdup(ds_str_c(in, k)))) goto fail;
    if (in->n_tokens) {
        out->tokens = calloc(in->n_tokens, sizeof *out->tokens);
        if (!out->tokens) goto fail;
        for (size_t i = 0; i < in->n_tokens; i++, out->n_tokens++)
            if (!(out->tokens[i] = strdup(in->tokens[i]))) goto fail;
    }
    return 0;
fail:
    iv_ds_conf_free(out);
    memset(out, 0, sizeof *out);
    return IV_ENOMEM;
}

static int str_eq(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

int iv_ds_conf_equal(const iv_ds_conf_t *a, const iv_ds_conf_t *b)
{
    for (size_t k = 0; k < N_DS_STR_FIELDS; k++)
        if (!str_eq(ds_str_c(a, k), ds_str_c(b, k))) return 0;
    if (a->transpose_bytes != b->transpose_bytes || a->cache_bytes != b->cache_bytes ||
        a->cache_floor_bytes != b->cache_floor_bytes || a->n_tokens != b->n_tokens)
        return 0;
    for (size_t i = 0; i < a->n_tokens; i++)
        if (strcmp(a->tokens[i], b->tokens[i])) return 0;
    return 1;
}

void iv_config_free(iv_config_t *c)
{
    if (!c) return;
    free(c->listen);
    for (size_t i = 0; i < c->n_datasets; i++) iv_ds_conf_free(&c->datasets[i]);
    free(c->datasets);
    free_strv(c->tokens, c->n_tokens);
    free(c->tokens_file);
    for (size_t i = 0; i < c->n_token_entries; i++) iv_token_conf_free(&c->token_entries[i]);
    free(c->token_entries);
    free(c->trusted_proxies);
    free_strv(c->cors_origins, c->n_cors);
    free(c->log_format);
    free(c->access_log);
    free(c->cache_dir);
    free(c->config_dir);
    memset(c, 0, sizeof *c);
}

static int set_str(char **dst, const char *v, const char *key, iv_err_t *err)
{
    char *s = strdup(v);
    if (!s) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    free(*dst);
    *dst = s;
    return 0;
}

static int set_num(iv_config_t *c, const struct num_opt *o, int64_t v, iv_err_t *err)
{
    if (v < o->min || v > o->max)
        return iv_fail(err, IV_EINVALID_ARG, "%s: %lld is out of range [%lld, %lld]", o->key,
                       (long long)v, (long long)o->min, (long long)o->max);
    char *base = (char *)c + o->off;
    switch (o->kind) {
    case NK_U32: *(uint32_t *)base = (uint32_t)v; break;
    case NK_SIZE: *(size_t *)base = (size_t)v; break;
    case NK_I64: *(int64_t *)base = v; break;
    case NK_INT: *(int *)base = (int)v; break;
    case NK_UINT: *(unsigned *)base = (unsigned)v; break;
    }
    return 0;
}

static int set_num_str(iv_config_t *c, const struct num_opt *o, const char *s, const char *src,
                       iv_err_t *err)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0')
        return iv_fail(err, IV_EINVALID_ARG, "%s (%s): '%s' is not an integer", o->key, src, s);
    return set_num(c, o, v, err);
}

static const struct num_opt *find_num(const char *key)
{
    for (size_t i = 0; i < N_NUM_OPTS; i++)
        if (!strcmp(num_opts[i].key, key)) return &num_opts[i];
    return NULL;
}

static int set_log_format(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    if (strcmp(v, "json") && strcmp(v, "text"))
        return iv_fail(err, IV_EINVALID_ARG, "%s: must be \"json\" or \"text\", not '%s'", key, v);
    return set_str(&c->log_format, v, key, err);
}

static int set_metrics_auth(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    if (strcmp(v, "open") && strcmp(v, "token"))
        return iv_fail(err, IV_EINVALID_ARG, "%s: must be \"open\" or \"token\", not '%s'", key, v);
    c->metrics_auth = !strcmp(v, "token");
    return 0;
}

/* Appends one range to trusted_proxies. */
static int push_cidr(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    iv_cidr_t r;
    if (iv_cidr_parse(v, &r) != 0)
        return iv_fail(err, IV_EINVALID_ARG,
                       "%s: '%s' is not an IP address or range (like 10.0.0.0/8 or ::1)", key, v);
    iv_cidr_t *nv = realloc(c->trusted_proxies, (c->n_trusted_proxies + 1) * sizeof *nv);
    if (!nv) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    c->trusted_proxies = nv;
    nv[c->n_trusted_proxies++] = r;
    return 0;
}

/* A comma-separated list of ranges (replacing the list). */
static int set_cidrs(iv_config_t *c, const char *s, const char *key, iv_err_t *err)
{
    c->n_trusted_proxies = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char tmp[96];
        if (l >= sizeof tmp) return iv_fail(err, IV_EINVALID_ARG, "%s: item too long", key);
        memcpy(tmp, p, l);
        tmp[l] = '\0';
        if (l) IV_TRY(push_cidr(c, tmp, key, err));
        p = e ? e + 1 : p + l;
    }
    return 0;
}

/* "all": /readyz answers 200 once every configured dataset is loaded (a
 * failed one keeps it 503); "any": once at least one is. */
static int set_autopack(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    if (!strcmp(v, "on") || !strcmp(v, "1") || !strcmp(v, "true")) c->autopack = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "false")) c->autopack = 0;
    else return iv_fail(err, IV_EINVALID_ARG, "%s: must be on or off, not '%s'", key, v);
    return 0;
}

static int set_other_orientation(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    if (!strcmp(v, "auto")) c->other_orientation = IV_OTHER_AUTO;
    else if (!strcmp(v, "memory")) c->other_orientation = IV_OTHER_MEMORY;
    else if (!strcmp(v, "disk")) c->other_orientation = IV_OTHER_DISK;
    else return iv_fail(err, IV_EINVALID_ARG, "%s: must be auto, memory or disk, not '%s'", key, v);
    return 0;
}

/* auto, on or off (IV_PLAIN_*) into *out. */
static int auto_on_off(int *out, const char *v, const char *key, iv_err_t *err)
{
    if (!strcmp(v, "auto")) *out = IV_PLAIN_AUTO;
    else if (!strcmp(v, "on")) *out = IV_PLAIN_ON;
    else if (!strcmp(v, "off")) *out = IV_PLAIN_OFF;
    else return iv_fail(err, IV_EINVALID_ARG, "%s: must be auto, on or off, not '%s'", key, v);
    return 0;
}

static int set_plain_copy(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return auto_on_off(&c->plain_copy, v, key, err);
}

static int set_wide_copy(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return auto_on_off(&c->wide_copy, v, key, err);
}

const char *iv_config_cache_dir(const iv_config_t *c, char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (c->cache_dir) snprintf(buf, cap, "%s", c->cache_dir);
    else if (c->config_dir) snprintf(buf, cap, "%s/ivserve-cache", c->config_dir);
    else if (xdg && xdg[0] == '/') snprintf(buf, cap, "%s/ivserve", xdg);
    else if (home && home[0] == '/') snprintf(buf, cap, "%s/.cache/ivserve", home);
    else snprintf(buf, cap, "ivserve-cache");
    return buf;
}

static int set_readyz(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    if (strcmp(v, "all") && strcmp(v, "any"))
        return iv_fail(err, IV_EINVALID_ARG, "%s: must be \"all\" or \"any\", not '%s'", key, v);
    c->readyz_any = !strcmp(v, "any");
    return 0;
}

static int push_str(char ***v, size_t *n, const char *s, const char *key, iv_err_t *err)
{
    if (!s[0]) return iv_fail(err, IV_EINVALID_ARG, "%s: empty string", key);
    char **nv = realloc(*v, (*n + 1) * sizeof **v);
    if (!nv) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    *v = nv;
    if (!(nv[*n] = strdup(s))) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    (*n)++;
    return 0;
}

/* Comma-separated list into a string vector (replacing it). */
static int set_list(char ***v, size_t *n, const char *s, const char *key, iv_err_t *err)
{
    free_strv(*v, *n);
    *v = NULL;
    *n = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char tmp[1024];
        if (l >= sizeof tmp) return iv_fail(err, IV_EINVALID_ARG, "%s: item too long", key);
        memcpy(tmp, p, l);
        tmp[l] = '\0';
        if (l) IV_TRY(push_str(v, n, tmp, key, err));
        p = e ? e + 1 : p + l;
    }
    return 0;
}

static int json_str_list(const cJSON *a, char ***v, size_t *n, const char *key, iv_err_t *err)
{
    if (!cJSON_IsArray(a)) return iv_fail(err, IV_EINVALID_ARG, "%s: must be an array of strings", key);
    free_strv(*v, *n);
    *v = NULL;
    *n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        if (!cJSON_IsString(e))
            return iv_fail(err, IV_EINVALID_ARG, "%s: must be an array of strings", key);
        IV_TRY(push_str(v, n, e->valuestring, key, err));
    }
    return 0;
}

/* The string settings, each under its config key, environment variable
 * and flag (NULL where a source has none or reads it its own way: the
 * file's cache_dir and tokens_file are relative to its folder, its
 * autopack is a boolean, and repeated flags add to a list). */
typedef int (*str_setter_fn)(iv_config_t *c, const char *v, const char *key, iv_err_t *err);

static int set_listen(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_str(&c->listen, v, key, err);
}

static int set_access_log(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_str(&c->access_log, v, key, err);
}

static int set_cache_dir(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_str(&c->cache_dir, v, key, err);
}

static int set_tokens_file(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_str(&c->tokens_file, v, key, err);
}

static int set_tokens(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_list(&c->tokens, &c->n_tokens, v, key, err);
}

static int set_cors(iv_config_t *c, const char *v, const char *key, iv_err_t *err)
{
    return set_list(&c->cors_origins, &c->n_cors, v, key, err);
}

static const struct str_opt {
    const char *key, *env, *flag;
    str_setter_fn set;
} str_opts[] = {
    {"listen", "IVSERVE_LISTEN", "--listen", set_listen},
    {"log_format", "IVSERVE_LOG_FORMAT", "--log-format", set_log_format},
    {"access_log", "IVSERVE_ACCESS_LOG", "--access-log", set_access_log},
    {"readyz", "IVSERVE_READYZ", "--readyz", set_readyz},
    {NULL, "IVSERVE_CACHE_DIR", "--cache-dir", set_cache_dir},
    {NULL, "IVSERVE_AUTOPACK", "--autopack", set_autopack},
    {"other_orientation", "IVSERVE_OTHER_ORIENTATION", "--other-orientation", set_other_orientation},
    {"plain_copy", "IVSERVE_PLAIN_COPY", "--plain-copy", set_plain_copy},
    {"wide_copy", "IVSERVE_WIDE_COPY", "--wide-copy", set_wide_copy},
    {NULL, "IVSERVE_TOKENS", NULL, set_tokens},
    {NULL, "IVSERVE_TOKEN_FILE", "--token-file", set_tokens_file},
    {"metrics_auth", "IVSERVE_METRICS_AUTH", "--metrics-auth", set_metrics_auth},
    {NULL, "IVSERVE_TRUSTED_PROXIES", NULL, set_cidrs},
    {NULL, "IVSERVE_CORS_ORIGINS", NULL, set_cors},
};

/* The string setting named name in one source (which: the offset of key,
 * env or flag in struct str_opt), or NULL. */
static const struct str_opt *find_str_opt(size_t which, const char *name)
{
    for (size_t i = 0; i < sizeof str_opts / sizeof str_opts[0]; i++) {
        const char *n = *(const char *const *)((const char *)&str_opts[i] + which);
        if (n && !strcmp(n, name)) return &str_opts[i];
    }
    return NULL;
}

/* A dataset id: 1 to 128 of A-Z a-z 0-9 . _ -, and not "." or "..". */
static int id_ok(const char *id)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    size_t n = strlen(id);
    return n > 0 && n <= 128 && strspn(id, chars) == n && strcmp(id, ".") && strcmp(id, "..");
}

/* The id a file gives itself: its name without the folder and without a
 * final ".h5ad" (any case), so that "a.ivcsr.h5ad" and "a.ivcsc.h5ad", or
 * "lupus.v2.h5ad" and "lupus.v3.h5ad", name different datasets.  A name
 * without that suffix is its own id. */
static char *id_from_path(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcasecmp(b + n - 5, ".h5ad") == 0) n -= 5;
    return strndup(b, n);
}

static iv_ds_conf_t *ds_push(iv_config_t *c, iv_err_t *err)
{
    iv_ds_conf_t *nd = realloc(c->datasets, (c->n_datasets + 1) * sizeof *nd);
    if (!nd) {
        iv_fail(err, IV_ENOMEM, "datasets: out of memory");
        return NULL;
    }
    c->datasets = nd;
    memset(&nd[c->n_datasets], 0, sizeof *nd);
    nd[c->n_datasets].transpose_bytes = -1;
    nd[c->n_datasets].cache_bytes = -1;
    return &nd[c->n_datasets++];
}

static char *join_path(const char *base, const char *p)
{
    if (!base || p[0] == '/') return strdup(p);
    size_t n = strlen(base) + strlen(p) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", base, p);
    return s;
}

/* The keys of a dataset entry; the last three are byte counts. */
static const char *const ds_keys[] = {"id", "path", "group", "title", "tokens", "companion",
                                      "companion_group", "transpose_bytes", "cache_bytes",
                                      "cache_floor_bytes"};
#define N_DS_KEYS (sizeof ds_keys / sizeof ds_keys[0])
#define DS_FIRST_BYTES 7

/* Each key of a dataset entry known and of its type: byte counts
 * non-negative integers, tokens checked later, the rest strings. */
static int check_dataset_keys(const cJSON *o, const char *key, iv_err_t *err)
{
    const cJSON *kv;
    cJSON_ArrayForEach(kv, o)
    {
        const char *k = kv->string;
        size_t ki = 0;
        while (ki < N_DS_KEYS && strcmp(k, ds_keys[ki])) ki++;
        if (ki == N_DS_KEYS) return iv_fail(err, IV_EINVALID_ARG, "%s.%s: unknown key", key, k);
        /* 2^62 bounds a byte count well inside int64 and far above any
         * machine's memory. */
        if (ki >= DS_FIRST_BYTES &&
            (!cJSON_IsNumber(kv) || kv->valuedouble < 0 || kv->valuedouble > 4611686018427387904.0 ||
             kv->valuedouble != (double)(int64_t)kv->valuedouble))
            return iv_fail(err, IV_EINVALID_ARG, "%s.%s: must be a non-negative integer", key, k);
        if (ki < DS_FIRST_BYTES && strcmp(k, "tokens") && !cJSON_IsString(kv))
            return iv_fail(err, IV_EINVALID_ARG, "%s.%s: must be a string", key, k);
    }
    return 0;
}

/* The entry's id, or the file's own id as for a file named on the
 * command line, checked. */
static int dataset_id(iv_ds_conf_t *d, const cJSON *id, const cJSON *path, const char *key,
                      iv_err_t *err)
{
    d->id = id ? strdup(id->valuestring) : id_from_path(path->valuestring);
    if (!d->id) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    if (!id_ok(d->id))
        return iv_fail(err, IV_EINVALID_ARG, "%s.id: '%s' must be letters, digits, '.', '_' or '-'",
                       key, d->id);
    return 0;
}

/* A copy of the optional string o[name] in *dst (joined to base_dir
 * when join); IV_ENOMEM with no message when it cannot be made. */
static int dataset_str(char **dst, const cJSON *o, const char *name, const char *base_dir,
                       int join)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v) return 0;
    *dst = join ? join_path(base_dir, v->valuestring) : strdup(v->valuestring);
    return *dst ? 0 : IV_ENOMEM;
}

static int64_t dataset_bytes(const cJSON *o, const char *name, int64_t absent)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v ? (int64_t)v->valuedouble : absent;
}

/* One entry of "datasets": keys checked, path and id, the optional
 * strings, the byte counts, the tokens. */
static int load_dataset(iv_config_t *c, const cJSON *o, size_t i, const char *base_dir,
                        iv_err_t *err)
{
    char key[64];
    snprintf(key, sizeof key, "datasets[%zu]", i);
    if (!cJSON_IsObject(o)) return iv_fail(err, IV_EINVALID_ARG, "%s: must be an object", key);
    IV_TRY(check_dataset_keys(o, key, err));
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(o, "path");
    if (!path) return iv_fail(err, IV_EINVALID_ARG, "%s.path: required", key);
    iv_ds_conf_t *d = ds_push(c, err);
    if (!d) return IV_ENOMEM;
    d->path = join_path(base_dir, path->valuestring);
    if (!d->path) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    IV_TRY(dataset_id(d, cJSON_GetObjectItemCaseSensitive(o, "id"), path, key, err));
    IV_TRY(dataset_str(&d->group, o, "group", base_dir, 0));
    IV_TRY(dataset_str(&d->companion, o, "companion", base_dir, 1));
    IV_TRY(dataset_str(&d->companion_group, o, "companion_group", base_dir, 0));
    d->transpose_bytes = dataset_bytes(o, "transpose_bytes", -1);
    d->cache_bytes = dataset_bytes(o, "cache_bytes", -1);
    d->cache_floor_bytes = dataset_bytes(o, "cache_floor_bytes", 0);
    if (cJSON_GetObjectItemCaseSensitive(o, "cache_bytes") && d->cache_floor_bytes > d->cache_bytes)
        return iv_fail(err, IV_EINVALID_ARG, "%s.cache_floor_bytes: %lld is over its cache_bytes %lld",
                       key, (long long)d->cache_floor_bytes, (long long)d->cache_bytes);
    IV_TRY(dataset_str(&d->title, o, "title", base_dir, 0));
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    if (tk) {
        char k2[80];
        snprintf(k2, sizeof k2, "%s.tokens", key);
        IV_TRY(json_str_list(tk, &d->tokens, &d->n_tokens, k2, err));
    }
    return 0;
}

static int load_num(iv_config_t *c, const char *key, const cJSON *v, iv_err_t *err)
{
    const struct num_opt *o = find_num(key);
    if (!o) return iv_fail(err, IV_EINVALID_ARG, "%s: unknown key", key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return iv_fail(err, IV_EINVALID_ARG, "%s: must be an integer", key);
    /* Converting a double outside int64's range is undefined behaviour:
     * range-check it as a double first (2^63 is exact in a double). */
    double d = v->valuedouble;
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
        return iv_fail(err, IV_EINVALID_ARG, "%s: %g is out of range [%lld, %lld]", key, d,
                       (long long)o->min, (long long)o->max);
    return set_num(c, o, (int64_t)d, err);
}

/* True when a JSON string in text[0..len) holds \u0000 or a raw NUL:
 * cJSON would hand back a C string cut there, turning a token
 * "abc\u0000xyz" into "abc" without a word. */
static int json_has_nul(const char *text, size_t len)
{
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (!in_str) in_str = ch == '"';
        else if (ch == '\0') return 1;
        else if (ch == '"') in_str = 0;
        else if (ch == '\\') {
            if (len - i >= 6 && !memcmp(text + i + 1, "u0000", 5)) return 1;
            i++;
        }
    }
    return 0;
}

/* A path setting of the config file: a non-empty string, relative to the
 * config file's folder as dataset paths are; replaces *dst. */
static int set_json_path(char **dst, const cJSON *kv, const char *base_dir, const char *key,
                         const char *what, iv_err_t *err)
{
    if (!cJSON_IsString(kv) || !kv->valuestring[0])
        return iv_fail(err, IV_EINVALID_ARG, "%s: must be %s", key, what);
    char *pth = join_path(base_dir, kv->valuestring);
    if (!pth) return iv_fail(err, IV_ENOMEM, "%s: out of memory", key);
    free(*dst);
    *dst = pth;
    return 0;
}

/* "trusted_proxies": an array of ranges, replacing the list. */
static int load_json_proxies(iv_config_t *c, const cJSON *kv, iv_err_t *err)
{
    if (!cJSON_IsArray(kv))
        return iv_fail(err, IV_EINVALID_ARG, "trusted_proxies: must be an array of strings");
    c->n_trusted_proxies = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, kv)
    {
        if (!cJSON_IsString(e))
            return iv_fail(err, IV_EINVALID_ARG, "trusted_proxies: must be an array of strings");
        IV_TRY(push_cidr(c, e->valuestring, kv->string, err));
    }
    return 0;
}

static int load_json_datasets(iv_config_t *c, const cJSON *kv, const char *base_dir, iv_err_t *err)
{
    if (!cJSON_IsArray(kv)) return iv_fail(err, IV_EINVALID_ARG, "datasets: must be an array of objects");
    size_t i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, kv) IV_TRY(load_dataset(c, d, i++, base_dir, err));
    return 0;
}

static int load_json_limits(iv_config_t *c, const cJSON *kv, iv_err_t *err)
{
    if (!cJSON_IsObject(kv)) return iv_fail(err, IV_EINVALID_ARG, "limits: must be an object");
    const cJSON *l;
    cJSON_ArrayForEach(l, kv)
    {
        char key[96];
        snprintf(key, sizeof key, "limits.%s", l->string);
        IV_TRY(load_num(c, key, l, err));
    }
    return 0;
}

/* One top-level key of the config file: a string setting of the table,
 * one the file reads its own way, or a number. */
static int load_json_key(iv_config_t *c, const cJSON *kv, const char *base_dir, iv_err_t *err)
{
    const char *k = kv->string;
    const struct str_opt *so = find_str_opt(offsetof(struct str_opt, key), k);
    if (so && !cJSON_IsString(kv)) return iv_fail(err, IV_EINVALID_ARG, "%s: must be a string", k);
    if (so) return so->set(c, kv->valuestring, k, err);
    if (!strcmp(k, "cache_dir")) return set_json_path(&c->cache_dir, kv, base_dir, k, "a folder name", err);
    if (!strcmp(k, "tokens_file")) return set_json_path(&c->tokens_file, kv, base_dir, k, "a file name", err);
    if (!strcmp(k, "autopack")) {
        if (!cJSON_IsBool(kv)) return iv_fail(err, IV_EINVALID_ARG, "autopack: must be true or false");
        c->autopack = cJSON_IsTrue(kv);
        return 0;
    }
    if (!strcmp(k, "tokens")) return json_str_list(kv, &c->tokens, &c->n_tokens, k, err);
    if (!strcmp(k, "cors_origins")) return json_str_list(kv, &c->cors_origins, &c->n_cors, k, err);
    if (!strcmp(k, "trusted_proxies")) return load_json_proxies(c, kv, err);
    if (!strcmp(k, "datasets")) return load_json_datasets(c, kv, base_dir, err);
    if (!strcmp(k, "limits")) return load_json_limits(c, kv, err);
    if (!strcmp(k, "$comment")) return 0;  /* free text for people reading the file */
    return load_num(c, k, kv, err);
}

int iv_config_load_json(iv_config_t *c, const char *text, size_t len, const char *base_dir,
                        iv_err_t *err)
{
    if (json_has_nul(text, len))
        return iv_fail(err, IV_EBAD_JSON, "config: a string holds \\u0000 (NUL), which no "
                       "setting can contain");
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return iv_fail(err, IV_EBAD_JSON, "config: not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(root)) rc = iv_fail(err, IV_EINVALID_ARG, "config: must be a JSON object");
    const cJSON *kv;
    for (kv = rc ? NULL : root->child; kv && rc == 0; kv = kv->next)
        rc = load_json_key(c, kv, base_dir, err);
    cJSON_Delete(root);
    return rc;
}

/* The whole of f (at most 16 MiB) in *text (owned), *len bytes. */
static int read_config_text(FILE *f, const char *path, char **text, size_t *len, iv_err_t *err)
{
    size_t cap = 0;
    *text = NULL;
    *len = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? cap * 2 : 4096;
            if (cap > (16u << 20)) return iv_fail(err, IV_ETOO_LARGE, "config %s: larger than 16 MiB", path);
            char *t = realloc(*text, cap);
            if (!t) return iv_fail(err, IV_ENOMEM, "config %s: out of memory", path);
            *text = t;
        }
        size_t got = fread(*text + *len, 1, cap - *len, f);
        *len += got;
        if (got == 0) return 0;
    }
}

int iv_config_load_file(iv_config_t *c, const char *path, iv_err_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return iv_fail(err, IV_EIO, "config %s: cannot open: %s", path, strerror(errno));
    char *text;
    size_t len;
    int rc = read_config_text(f, path, &text, &len, err);
    fclose(f);
    if (rc != 0) {
        free(text);
        return rc;
    }
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    const char *base = NULL;
    if (slash) {
        *slash = '\0';
        base = dir[0] ? dir : "/";
    }
    free(c->config_dir);
    c->config_dir = strdup(base ? base : ".");
    iv_err_t sub;
    iv_err_clear(&sub);
    rc = iv_config_load_json(c, text, len, base, &sub);
    if (rc) iv_fail(err, rc, "config %s: %s", path, sub.msg);
    free(dir);
    free(text);
    return rc;
}

/* One IVSERVE_* variable: a string setting of the table or a number of
 * num_opts; other IVSERVE_* names (IVSERVE_BIN of the test harness) are
 * not settings. */
static int apply_env_var(iv_config_t *c, const char *name, const char *v, iv_err_t *err)
{
    const struct str_opt *so = find_str_opt(offsetof(struct str_opt, env), name);
    if (so) return so->set(c, v, name, err);
    for (size_t i = 0; i < N_NUM_OPTS; i++)
        if (num_opts[i].env && !strcmp(num_opts[i].env, name))
            IV_TRY(set_num_str(c, &num_opts[i], v, name, err));
    return 0;
}

int iv_config_apply_env(iv_config_t *c, char *const *envp, iv_err_t *err)
{
    for (; envp && *envp; envp++) {
        const char *kv = *envp;
        if (strncmp(kv, "IVSERVE_", 8)) continue;
        const char *eq = strchr(kv, '=');
        if (!eq) continue;
        char name[64];
        size_t nl = (size_t)(eq - kv);
        if (nl >= sizeof name) continue;
        memcpy(name, kv, nl);
        name[nl] = '\0';
        IV_TRY(apply_env_var(c, name, eq + 1, err));
    }
    return 0;
}

int iv_config_add_path(iv_config_t *c, const char *path, iv_err_t *err)
{
    iv_ds_conf_t *d = ds_push(c, err);
    if (!d) return IV_ENOMEM;
    d->path = strdup(path);
    d->id = id_from_path(path);
    if (!d->path || !d->id) return iv_fail(err, IV_ENOMEM, "out of memory");
    if (!id_ok(d->id))
        return iv_fail(err, IV_EINVALID_ARG,
                       "%s: the file name '%s' (less .h5ad) is not a valid dataset id: use "
                       "letters, digits, '.', '_' or '-', or give an id in a --config file",
                       path, d->id);
    return 0;
}

const char *iv_config_usage(void)
{
    return "usage: ivserve [--config FILE] [options] [FILE.h5ad ...]\n"
           "       ivserve check FILE | export FILE ... -o OUT.npz\n"
           "       ivserve token-hash NAME [SCOPE] < token   (prints a tokens-file line)\n"
           "options (each overrides the config file and IVSERVE_* variables):\n"
           "  --listen ADDR  --port N  --threads N  --loops N  --queue N  --cache-bytes N  --transpose-bytes N\n"
           "  --cache-share-percent P  --cache-max-age S  --gzip-level L\n"
           "  --token-file FILE (lines 'NAME SHA256HEX [SCOPE]'; ivserve token-hash NAME makes one)\n"
           "  --token T (repeatable; deprecated: other users see it in ps until start-up\n"
           "    overwrites it; prefer --token-file or IVSERVE_TOKENS)\n"
           "  --metrics-auth open|token  --trusted-proxy ADDR[/LEN] (repeatable)\n"
           "  --cors ORIGIN (repeatable)  --log-format json|text\n"
           "  --access-log PATH|-|off  --readyz all|any  --max-connections N  --max-rows N  --max-nnz N\n"
           "  --max-json-bytes N  --max-header-bytes N  --max-body-bytes N\n"
           "  --header-timeout-ms N  --body-timeout-ms N  --keepalive-ms N\n"
           "  --write-timeout-ms N  --shutdown-grace-ms N  --blocks-ahead N  --max-pipeline N\n"
           "  --answer-wait-ms N\n"
           "  --compute-timeout-ms N  --write-budget-bytes N\n"
           "  --memory-bytes N: the process's memory budget (caches, in-memory copies, answers,\n"
           "    writes, builds); default 90% of the memory available at start\n"
           "  --cache-dir DIR  --cache-dir-bytes N  --no-autopack (or --autopack on|off):\n"
           "    an ordinary .h5ad (csr/csc/dense X) is packed once into DIR and served\n"
           "  --other-orientation auto|memory|disk: the gene-major copy built in memory at each\n"
           "    start, or packed once into the cache folder (auto: memory up to 64 MiB)\n"
           "  --plain-copy auto|on|off: a compressed stream kept uncompressed in the cache folder\n"
           "    for the cell queries to read (auto: when it is larger than the chunk caches)\n"
           "  --wide-copy auto|on|off: the gene indices kept as two-byte integers in the cache\n"
           "    folder for cell queries that select genes (auto: at most 65,536 genes, 64 MiB)\n"
           "  --help  --version\n";
}

/* The first pass over the flags: 1 for --help, -h or --version, else
 * each --config file loaded in order. */
static int load_config_flags(iv_config_t *c, int argc, char **argv, iv_err_t *err)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strcmp(argv[i], "--version"))
            return 1;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return iv_fail(err, IV_EINVALID_ARG, "--config: needs a file");
            IV_TRY(iv_config_load_file(c, argv[i + 1], err));
            i++;
        }
    }
    return 0;
}

/* Which repeatable flags have replaced the list from the file and the
 * environment yet: the first one replaces it, the others add to it. */
struct flag_resets {
    int tokens, cors, proxies;
};

/* The first use of a list flag empties the list it replaces. */
static void reset_strv(char ***v, size_t *n, int *done)
{
    if ((*done)++) return;
    free_strv(*v, *n);
    *v = NULL;
    *n = 0;
}

/* --trusted-proxy, --token and --cors: 1 when a is none of them. */
static int apply_list_flag(iv_config_t *c, const char *a, const char *v, struct flag_resets *r,
                           iv_err_t *err)
{
    if (!strcmp(a, "--trusted-proxy")) {
        if (!r->proxies++) c->n_trusted_proxies = 0;
        return push_cidr(c, v, a, err);
    }
    if (!strcmp(a, "--token")) {
        reset_strv(&c->tokens, &c->n_tokens, &r->tokens);
        return push_str(&c->tokens, &c->n_tokens, v, a, err);
    }
    if (!strcmp(a, "--cors")) {
        reset_strv(&c->cors_origins, &c->n_cors, &r->cors);
        return push_str(&c->cors_origins, &c->n_cors, v, a, err);
    }
    return 1;
}

/* One flag with its value: a string setting, a list, or a number. */
static int apply_flag(iv_config_t *c, const char *a, const char *v, struct flag_resets *r,
                      iv_err_t *err)
{
    if (!strcmp(a, "--config")) return 0;  /* loaded by the first pass */
    const struct str_opt *so = find_str_opt(offsetof(struct str_opt, flag), a);
    if (so) return so->set(c, v, a, err);
    int rc = apply_list_flag(c, a, v, r, err);
    if (rc <= 0) return rc;
    const struct num_opt *o = NULL;
    for (size_t k = 0; k < N_NUM_OPTS; k++)
        if (num_opts[k].flag && !strcmp(num_opts[k].flag, a)) o = &num_opts[k];
    if (!o) return iv_fail(err, IV_EINVALID_ARG, "%s: unknown option (see ivserve --help)", a);
    return set_num_str(c, o, v, a, err);
}

/* Settings in order of precedence: --config files, IVSERVE_* variables,
 * then the other flags and the files named, then the tokens file. */
int iv_config_from_args(iv_config_t *c, int argc, char **argv, char *const *envp, iv_err_t *err)
{
    int rc = load_config_flags(c, argc, argv, err);
    if (rc != 0) return rc;
    IV_TRY(iv_config_apply_env(c, envp, err));
    struct flag_resets resets = {0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] != '-') {
            IV_TRY(iv_config_add_path(c, a, err));
        } else if (!strcmp(a, "--no-autopack")) {
            c->autopack = 0;
        } else if (i + 1 >= argc) {
            return iv_fail(err, IV_EINVALID_ARG, "%s: needs a value (see ivserve --help)", a);
        } else {
            IV_TRY(apply_flag(c, a, argv[++i], &resets, err));
        }
    }
    IV_TRY(iv_config_load_tokens(c, err));
    return iv_config_validate(c, err);
}

int iv_config_load_tokens(iv_config_t *c, iv_err_t *err)
{
    if (!c->tokens_file) return 0;
    return iv_tokens_file_load(c, c->tokens_file, err);
}

int iv_config_scrub_argv(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--token") != 0) continue;
        /* volatile: the compiler must not drop stores to memory it sees
         * no later read of. */
        volatile char *p = argv[i + 1];
        for (; *p; p++) *p = '\0';
        n++;
        i++;
    }
    return n;
}

/* Name the files, not a position in a list the user may never have
 * written (files from the command line have none). */
static int check_unique_ids(const iv_config_t *c, iv_err_t *err)
{
    for (size_t i = 0; i < c->n_datasets; i++)
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->datasets[i].id, c->datasets[j].id))
                return iv_fail(err, IV_EINVALID_ARG,
                               "datasets: '%s' and '%s' both have the id '%s'; rename one file "
                               "or give the datasets distinct ids in a --config file",
                               c->datasets[j].path, c->datasets[i].path, c->datasets[i].id);
    return 0;
}

/* A token that names a dataset the server does not have is a typo or a
 * stale line: refused, so that nobody believes it opens something. */
static int check_token_datasets(const iv_config_t *c, iv_err_t *err)
{
    for (size_t i = 0; i < c->n_token_entries; i++) {
        const iv_token_conf_t *t = &c->token_entries[i];
        for (size_t k = 0; k < t->n_datasets; k++) {
            size_t j = 0;
            while (j < c->n_datasets && strcmp(c->datasets[j].id, t->datasets[k])) j++;
            if (j == c->n_datasets)
                return iv_fail(err, IV_EINVALID_ARG,
                               "tokens file %s: token '%s' has the scope dataset:%s, but no "
                               "dataset has that id", t->where, t->name, t->datasets[k]);
        }
    }
    return 0;
}

int iv_config_validate(const iv_config_t *c, iv_err_t *err)
{
    if (c->n_datasets == 0)
        return iv_fail(err, IV_EINVALID_ARG,
                       "datasets: none configured (name FILE.h5ad arguments or use --config)");
    IV_TRY(check_unique_ids(c, err));
    IV_TRY(check_token_datasets(c, err));
    /* Floors the budget cannot honour all at once; with the automatic
     * budget the server checks (and warns) once it knows the figure. */
    uint64_t floors = 0;
    for (size_t i = 0; i < c->n_datasets; i++) floors += (uint64_t)c->datasets[i].cache_floor_bytes;
    if (c->cache_bytes != IV_CACHE_AUTO && floors > c->cache_bytes)
        return iv_fail(err, IV_EINVALID_ARG,
                       "datasets: the cache_floor_bytes add up to %llu bytes, over cache_bytes %zu",
                       (unsigned long long)floors, c->cache_bytes);
    return 0;
}
