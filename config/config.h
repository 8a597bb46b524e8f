/*
 * Server settings: defaults, then a JSON config file, then environment
 * variables, then command-line flags, each overriding the one before.
 *
 * Everything is validated when loaded: an unknown key, a value of the
 * wrong type or out of range, a duplicate or malformed dataset id is an
 * error whose message names the key (for example "limits.max_rows: must be
 * a positive integer").  The resulting iv_config_t is plain data owned by
 * the caller; the server reads it and never changes it.  Not thread-safe
 * while loading; read-only afterwards.
 */
#ifndef IV_CONFIG_H
#define IV_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "cidr.h"
#include "error.h"

/* What a token may do; a token holds a set of these.  READ opens every
 * dataset; a token that should open only some lists them instead (the
 * datasets of iv_token_conf_t, like a dataset's own "tokens").  METRICS
 * opens /metrics when metrics_auth is "token"; ADMIN opens the admin
 * routes (reload) and /metrics, but no dataset unless READ is given too. */
enum { IV_SCOPE_READ = 1, IV_SCOPE_METRICS = 2, IV_SCOPE_ADMIN = 4 };

/* One named token from the tokens file: its SHA-256, never the token. */
typedef struct iv_token_conf {
    char *name;          /* [A-Za-z0-9._@-]{1,64}: what the access log shows */
    unsigned char sha256[32];
    unsigned scope;      /* IV_SCOPE_* bits */
    char **datasets;     /* ids this token reads (besides READ's all) */
    size_t n_datasets;
    char *where;         /* "FILE:LINE", for messages */
} iv_token_conf_t;

typedef struct iv_ds_conf {
    char *id;            /* [A-Za-z0-9._-]+, unique: the only way a request names a dataset */
    char *path;
    char *group;         /* matrix group; NULL = "X" */
    char *title;         /* NULL = the id */
    char **tokens;       /* bearer tokens that open this dataset (besides global ones) */
    size_t n_tokens;
    char *companion;     /* file holding the other orientation, or NULL */
    char *companion_group;   /* its matrix group; NULL = "X" */
    int64_t transpose_bytes; /* memory for the other orientation built in memory; -1 = the global */
    int64_t cache_bytes;     /* cap on this dataset's share of the cache budget; -1 = none */
    int64_t cache_floor_bytes; /* cache the other datasets' pressure leaves it; 0 = none */
} iv_ds_conf_t;

typedef struct iv_limits {
    size_t header_bytes;          /* request line + headers */
    size_t body_bytes;
    uint32_t header_timeout_ms;   /* from the first byte of a request to its last header */
    uint32_t body_timeout_ms;     /* from the end of the headers to the end of the body */
    uint32_t keepalive_ms;        /* idle connection between requests */
    uint32_t write_timeout_ms;    /* a response that makes no progress for this long is cut */
    uint32_t compute_timeout_ms;  /* a job (set-up, prepare, whole JSON, count, one block) longer than this is answered 503 */
    size_t write_budget_bytes;    /* bytes waiting to be written, across all connections */
    uint32_t shutdown_grace_ms;   /* SIGTERM: how long streams in flight may finish */
    uint32_t max_connections;
    int64_t max_rows;             /* rows a query may return */
    int64_t max_nnz;              /* stored entries a query may return (when known up front) */
    size_t json_bytes;            /* largest application/json result */
    size_t max_answer_bytes;      /* memory one request may fill before its first byte goes out
                                   * (a whole body, a transpose, an aggregate's accumulators) */
    uint32_t blocks_ahead;        /* decoded-but-unsent blocks per response */
    uint32_t answer_wait_ms;      /* a query waits this long for the answers' memory before 503 */
    uint32_t max_pipeline;        /* requests parsed ahead of their responses */
} iv_limits_t;

#define IV_CACHE_AUTO SIZE_MAX

/*
 * Where a dataset's other orientation (the gene-major copy of a
 * cell-major file, and the reverse) lives when no companion file is
 * configured.  DISK: packed once into the cache folder (autopack.h) and
 * served from there like the file itself, so a restart finds it; MEMORY:
 * built in memory at every start within transpose_bytes; AUTO (the
 * default): in memory when the packed stream is at most
 * IV_OTHER_MEMORY_MAX bytes (it builds in well under a second and costs
 * no more than that), on disk above.
 */
enum { IV_OTHER_AUTO = 0, IV_OTHER_MEMORY, IV_OTHER_DISK };
enum { IV_PLAIN_AUTO = 0, IV_PLAIN_ON, IV_PLAIN_OFF };
#define IV_OTHER_MEMORY_MAX ((uint64_t)64 << 20)

/* X's Zarr chunks (api/zarr_kept.h) are kept in the cache folder for
 * matrices of at most this many stored entries by default: about 170 MB
 * an orientation on disk at zstd's ratio on counts, written once in
 * seconds of one worker's time. */
#define IV_ZARR_KEEP_ENTRIES ((int64_t)64 << 20)

typedef struct iv_config {
    char *listen;                 /* address, default 127.0.0.1 */
    int port;                     /* default 8080; 0 = any free port (printed at start) */
    unsigned threads;             /* 0 = number of cores */
    unsigned loops;               /* event loops; 0 = one for every two cores (one below eight) */
    size_t queue;                 /* worker job queue length; full = 503 */
    size_t cache_bytes;           /* decompressed-chunk cache of the whole process; IV_CACHE_AUTO = a share of the memory available at start */
    unsigned cache_share_percent; /* that share (default 50) */
    size_t memory_bytes;          /* the whole process's budget (parts: server.c start_memory);
                                   * 0 = 90% of the memory available at start (machine or cgroup) */
    size_t transpose_bytes;       /* all in-memory other orientations together; 0 = none */
    int other_orientation;        /* where the other orientation lives (IV_OTHER_AUTO, ...) */
    int plain_copy;               /* a compressed stream's plain copy in the cache folder (IV_PLAIN_AUTO:
                                   * when the stream is larger than the chunk caches' part) */
    int wide_copy;                /* the minor indices as uint16 in the cache folder (widefile.h; IV_PLAIN_AUTO:
                                   * at most 65,536 minor elements and a stream kept like the row index) */
    int64_t zarr_keep_entries;    /* X's Zarr chunks kept in the cache folder up to this many entries; 0 = never */
    uint32_t cache_max_age;       /* Cache-Control max-age (s) of content-only responses; 0 = no-cache */
    int gzip_level;               /* gzip level of query answers (1..9, see gzip_stream.h); 0 = never compressed */
    iv_ds_conf_t *datasets;
    size_t n_datasets;
    char **tokens;                /* global bearer tokens (plain text); none and no READ token = open */
    size_t n_tokens;
    char *tokens_file;            /* named token hashes (tokens_file.h), or NULL */
    iv_token_conf_t *token_entries; /* read from tokens_file */
    size_t n_token_entries;
    int metrics_auth;             /* 1: /metrics needs a METRICS or ADMIN token */
    iv_cidr_t *trusted_proxies;   /* peers whose X-Forwarded-For is believed */
    size_t n_trusted_proxies;
    char **cors_origins;          /* "*" allows any origin */
    size_t n_cors;
    char *log_format;             /* "json" (default) or "text" */
    char *access_log;             /* file path, "-" = stderr (default), "off" */
    int readyz_any;               /* /readyz: 0 = every dataset loaded ("all"), 1 = at least one ("any") */
    char *cache_dir;              /* derived files (packed copies of ordinary .h5ad); NULL = the default (iv_config_cache_dir) */
    size_t cache_dir_bytes;       /* bound of the cache folder, least recently used out first; 0 = none */
    int autopack;                 /* 1 (default): an ordinary .h5ad is packed into the cache folder and served */
    char *config_dir;             /* the folder of the --config file, or NULL */
    iv_limits_t limits;
} iv_config_t;

/* The cache folder: cache_dir; else "ivserve-cache" beside the config
 * file; else $XDG_CACHE_HOME/ivserve, or ~/.cache/ivserve; else
 * ./ivserve-cache.  Written into buf (cap bytes). */
const char *iv_config_cache_dir(const iv_config_t *c, char *buf, size_t cap);

/* Fills defaults. */
void iv_config_init(iv_config_t *c);
void iv_config_free(iv_config_t *c);

/* Applies a JSON document; relative dataset paths are resolved against
 * base_dir (NULL = as given). */
int iv_config_load_json(iv_config_t *c, const char *text, size_t len, const char *base_dir,
                        iv_err_t *err);
int iv_config_load_file(iv_config_t *c, const char *path, iv_err_t *err);
/* Applies IVSERVE_* variables from envp ("KEY=VALUE" strings, NULL-terminated). */
int iv_config_apply_env(iv_config_t *c, char *const *envp, iv_err_t *err);
/*
 * The whole chain for the server binary: --config FILE first (wherever it
 * appears), then the environment, then the other flags and positional
 * FILE.h5ad arguments (each a dataset named by its file name less .h5ad).  Returns 1
 * (not an error) when --help or --version was handled and the caller
 * should exit 0.
 */
int iv_config_from_args(iv_config_t *c, int argc, char **argv, char *const *envp, iv_err_t *err);
/* Adds a dataset from a path; the id is the file name without its folder
 * and its ".h5ad" suffix ("data/lupus.v2.h5ad" is "lupus.v2"). */
int iv_config_add_path(iv_config_t *c, const char *path, iv_err_t *err);
/* Final cross-checks (at least one dataset, unique ids; two files with one
 * id are an error naming both files). */
int iv_config_validate(const iv_config_t *c, iv_err_t *err);

/* Reads c->tokens_file (when set) into c->token_entries, replacing them;
 * iv_config_from_args calls it, and so must any other path that builds
 * a configuration (a reload). */
int iv_config_load_tokens(iv_config_t *c, iv_err_t *err);

/* Overwrites the value of every --token in argv with zero bytes, so that
 * ps and /proc/PID/cmdline no longer show it (they read this memory).
 * Call after iv_config_from_args copied the values; returns how many
 * were scrubbed.  A token is visible until this runs: --token-file and
 * IVSERVE_TOKENS never are. */
int iv_config_scrub_argv(int argc, char **argv);

/* A deep copy of one dataset's settings into out (0, or IV_ENOMEM with
 * out left empty); iv_ds_conf_free releases one. */
int iv_ds_conf_copy(iv_ds_conf_t *out, const iv_ds_conf_t *in);
void iv_ds_conf_free(iv_ds_conf_t *d);
/* True when two dataset settings are the same in every field (tokens in
 * order): a reload reopens a dataset whose settings differ. */
int iv_ds_conf_equal(const iv_ds_conf_t *a, const iv_ds_conf_t *b);

/* Usage text for --help. */
const char *iv_config_usage(void);

#endif
