/*
 * The dataset registry: the datasets the server serves now, each an entry
 * with its own copy of its settings, its loaded state and a reference
 * count.
 *
 * A reload (reload.h) changes which entries the list holds while requests
 * still run on the entries it drops: the list holds one reference to each
 * entry, every stream and every load job another, and an entry is freed
 * at its last reference.  A dropped entry is "retired": no new request
 * finds it, the requests already running on it finish on it.  A changed
 * dataset gets a new entry that loads beside the old one (the old entry's
 * `pending`) and takes the old one's place in the list only once it is
 * ready, so that the old one serves until then.
 *
 * Loop thread only, except that a load job fills a LOADING entry's
 * ds/meta/vx/doc/mx on a worker before handing it back to the loop (nothing
 * else reads those fields of an entry that is still loading).
 */
#ifndef IV_REGISTRY_H
#define IV_REGISTRY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "autopack.h"
#include "buf.h"
#include "config.h"
#include "dataset.h"
#include "meta.h"
#include "viewer.h"

typedef enum iv_rds_state { IV_RDS_LOADING, IV_RDS_READY, IV_RDS_FAILED } iv_rds_state_t;

/* The copies of a dataset's stream kept for cell queries (iv_rds.copy). */
enum { IV_COPY_PLAIN, IV_COPY_WIDE, IV_N_COPIES };

/* What identifies the bytes of a file: a file renamed over it has another
 * inode, one written in place another size, modification time or inode
 * change time.  The change time is there because the modification time
 * can be set back (touch -r, os.utime) after an edit, and it cannot: the
 * kernel sets it to now at every write, and at a chmod too (a reload that
 * follows one loads the file again, which costs a load, nothing else). */
typedef struct iv_path_id {
    uint64_t dev, ino;
    int64_t size, mtime_ns, ctime_ns;
    int ok;               /* 0: stat failed (the file is missing) */
} iv_path_id_t;

/*
 * One selectable matrix of a dataset besides X: a member of `layers` or
 * raw/X.  A packed one (IVCSR/IVCSC) is opened as a dataset of its own,
 * with its own row index and chunk cache (under the same shared budget);
 * any other is listed with the reason it is not served.  Only X gets the
 * gene-major copy or a companion file.  Layers share obs and var with X;
 * raw/X shares obs and has its own var (raw/var: var_meta).
 */
typedef struct iv_rmx {
    char name[256];       /* "layers/counts", "raw/X" */
    char encoding[32];    /* the element's encoding-type */
    int64_t shape[2];     /* -1: unknown */
    iv_dataset_t *ds;     /* owned; NULL: not servable */
    iv_meta_t *var_meta;  /* owned; raw/X's genes (raw/var), NULL: X's var */
    int raw_var;          /* raw/X: the file has raw/var (else genes are named 0..n-1) */
    char reason[512];     /* not servable: why */
} iv_rmx_t;

typedef struct iv_rds {
    const iv_ds_conf_t *conf;   /* points at conf_own */
    iv_ds_conf_t conf_own;
    iv_dataset_t *ds;
    iv_meta_t *meta;
    iv_rds_state_t state;
    char err[512];        /* FAILED: why; READY: why the metadata is missing, or "" */
    char meta_note[160];  /* how the metadata came (iv_meta_keep_t.note) */
    iv_vds_t *vx;         /* viewer state: obsm/varm arrays, search indexes */
    char *doc;            /* GET /v1/datasets/{id} document */
    size_t doc_len;
    char etag[24];
    iv_path_id_t fid;     /* the file as it was when the load began */
    iv_path_id_t cfid;    /* its companion file's, when it has one */
    atomic_uint refs;     /* taken and dropped by every loop (atomic) */
    int retired;          /* out of the list: freed at its last reference */
    struct iv_rds *pending;   /* a replacement being loaded (one reference), or NULL */
    char reload_err[512]; /* the last replacement's failure, "" when none */
    iv_rmx_t *mx;         /* the other matrices (layers, raw/X), filled with ds */
    size_t n_mx;
    /* The file loaded: conf->path, or the packed copy of an ordinary
     * .h5ad in the cache folder (autopack.h; pinned while the entry
     * lives).  Set by the load job before anything is read. */
    char served[4096];
    int pinned;
    iv_autopack_progress_t pack;  /* packing now: the load job's progress */
    /* The other orientation on disk (autopack.h), pinned while the entry
     * lives ("" when none), and its pack's progress. */
    char other_path[4096];
    /* The copies kept in the cache folder for cell queries (load.c's
     * copy kinds: [IV_COPY_PLAIN] the stream uncompressed, [IV_COPY_WIDE]
     * the gene indices as two-byte integers): each one's outcome for the
     * log ("" when none was wanted) and the path read (pinned against the
     * sweep), or "". */
    struct {
        char note[600];
        char path[4096];
    } copy[IV_N_COPIES];
    /* X's Zarr chunks kept and served ([1] csr, [0] csc; pinned), "" when
     * none or dropped after a failed check (loop 0's: set by the keep
     * job's done half from zarr_made, which its run half wrote with the
     * outcome for the log, zarr_note). */
    char zarr_path[2][4096];
    char zarr_made[2][4096];
    char zarr_note[1000];
    iv_autopack_progress_t other_pack;
    /* A packed copy's source as the watcher last saw it, and the identity
     * a reload was last asked for (loop 0 only). */
    iv_path_id_t src_seen, src_asked;
} iv_rds_t;

/* The file an entry reads: its packed copy, or its configured path. */
const char *iv_rds_path(const iv_rds_t *d);

typedef struct iv_registry {
    iv_rds_t **v;         /* in configuration order; one reference each */
    size_t n;
} iv_registry_t;

/* A new LOADING entry with a copy of conf, holding one reference (the
 * caller's).  NULL out of memory.  Tokens live in the server's auth table
 * (auth.h), rebuilt by a reload. */
iv_rds_t *iv_rds_new(const iv_ds_conf_t *conf);
void iv_rds_ref(iv_rds_t *d);
/* Drops a reference; the last one frees the entry and what it loaded. */
/* Drops a reference; 1 when it was the last and d is freed. */
int iv_rds_unref(iv_rds_t *d);
/* Takes d out of service: marks it (and its pending replacement) retired
 * and drops the list's reference.  The caller has removed it from the
 * list. */
void iv_rds_retire(iv_rds_t *d);

/*
 * Lists and opens the dataset's other matrices (iv_h5matrix_list), each
 * packed one with tmpl's options and group = its name, after d->ds and
 * d->meta loaded (on the load job's worker, like them).  A layer must
 * have X's shape; raw/X X's rows, and its genes are raw/var's (read with
 * iv_meta_load_groups; no raw/var: genes named 0..n-1).  What is not a
 * packed matrix, or is packed in a form this build cannot read
 * (IV_EUNSUPPORTED), is listed as not servable with the reason.  A
 * damaged packed matrix, a shape that disagrees or a listing the reader
 * could not finish is this load's error, as a damaged X or obs is: the
 * file is left out whole.  On error nothing is kept.
 */
int iv_rds_load_matrices(iv_rds_t *d, const iv_dataset_opts_t *tmpl, iv_err_t *err);

/*
 * The matrix name (NULL or "X": X) of a ready entry: its dataset and the
 * metadata its genes resolve against (NULL when the entry has none).
 * IV_EUNKNOWN_MATRIX naming the available matrices when there is no such
 * matrix; IV_EUNSERVABLE with the reason when it is listed but not
 * servable.  Any thread (the matrices are immutable once loaded).
 */
int iv_rds_matrix(const iv_rds_t *d, const char *name, iv_dataset_t **ds, iv_meta_t **var_meta,
                  iv_err_t *err);
/* iv_rds_matrix's axis lengths, as request.h's iv_qreq_matrix_fn (ctx is
 * the entry). */
int iv_rds_matrix_shape(void *ctx, const char *name, int64_t *n_obs, int64_t *n_var,
                        iv_err_t *err);

/* The name of the entry's i-th other matrix ("layers/counts", "raw/X";
 * servable or not), NULL past the last: for listings (the Zarr store).
 * ctx is the entry, as iv_rds_matrix_shape's.  Any thread. */
const char *iv_rds_matrix_name(void *ctx, size_t i);

/* Appends ,"matrices":[...] to the dataset document: X first, then each
 * other matrix with name, shape, nnz, orientation, dtype, stream_bytes,
 * index_bytes, servable (or the reason), and for raw/X "var": "raw/var". */
void iv_rds_matrices_doc(iv_buf_t *b, const iv_rds_t *d);

/* Adds the memory the other matrices hold now to *m, part by part, and
 * raw/var's metadata bytes to *meta_bytes; their caches' budget
 * evictions to *evictions (any may be NULL but m).  Any thread. */
void iv_rds_matrices_memory(const iv_rds_t *d, iv_dataset_memory_t *m, size_t *meta_bytes,
                            uint64_t *evictions);

/* Adds the other matrices' cache use, hits and misses to *cs. */
void iv_rds_matrices_cache(const iv_rds_t *d, iv_cache_stats_t *cs);

/* Reads path's identity (ok = 0 when it cannot be read). */
void iv_path_id_read(const char *path, iv_path_id_t *out);
int iv_path_id_same(const iv_path_id_t *a, const iv_path_id_t *b);

/* The entry with this id (n bytes), or NULL. */
iv_rds_t *iv_registry_find(const iv_registry_t *r, const char *id, size_t n);

typedef struct iv_registry_counts {
    size_t ready, loading, failed;
} iv_registry_counts_t;
void iv_registry_count(const iv_registry_t *r, iv_registry_counts_t *out);
/* /readyz: every entry ready (any = 0), or at least one (any = 1). */
int iv_registry_ready(const iv_registry_t *r, int any);

/* Retires every entry and frees the list. */
void iv_registry_free(iv_registry_t *r);

#endif
