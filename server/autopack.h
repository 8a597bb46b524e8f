/*
 * Ordinary .h5ad files served: a configured file whose X is a plain
 * csr_matrix, csc_matrix or dense array is packed once into the cache
 * folder (core/base/cachedir.h) and the packed copy is served.
 *
 * The pack runs as `ivserve pack` in a process of its own, spawned from
 * the load job's worker, rather than on the server's own pool: libhdf5
 * crashes or loops on some damaged files, and the writer copies every
 * element of its input in process (h5guard.h), so a pack inside the
 * server could take the server down with it.  The process is the same
 * binary (/proc/self/exe), so the copy is exactly what `ivserve pack`
 * writes; it reports its progress on a pipe (`--progress-fd`), which the
 * worker reads into the entry's progress counters for the dataset
 * document and /readyz, logging every 10%.  A second start finds the
 * copy under the source's key and serves it without packing.
 *
 * Thread rules: iv_autopack_resolve runs on a worker (it blocks for the
 * whole pack); the progress counters are atomics read by the loops.  The
 * in-use list is locked.
 */
#ifndef IV_AUTOPACK_H
#define IV_AUTOPACK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "access_log.h"
#include "config.h"
#include "error.h"

typedef struct iv_autopack_progress {
    atomic_int active;            /* 1 while the pack runs */
    atomic_int permille;          /* 0..1000 of the whole pack */
    atomic_llong done, total;     /* output rows */
    atomic_ullong bytes;          /* input bytes read */
    atomic_llong t0_ms;           /* when it started (CLOCK_MONOTONIC) */
} iv_autopack_progress_t;

/*
 * The file to load for a dataset configured with path src and group
 * (NULL = "X"): src itself when its matrix is packed (or when it is not a
 * matrix pack can read: the load then says why), else the packed copy in
 * the cache folder, packed now when there is none.  out (cap bytes)
 * receives the path.  stop: set when the server stops; the pack is then
 * ended and IV_ECANCELLED returned.  With cfg->autopack 0 an ordinary
 * file is IV_EUNSUPPORTED naming the exact `ivserve pack` command.
 */
int iv_autopack_resolve(const iv_config_t *cfg, const iv_alog_t *log, const char *id,
                        const char *src, const char *group, iv_autopack_progress_t *prog,
                        const atomic_int *stop, char *out, size_t cap, iv_err_t *err);

/*
 * The other orientation of a served packed file, on disk: the copy
 * `ivserve pack SERVED --layout ivcsc|ivcsr --matrix-only` writes into
 * the cache folder under the served file's key (kind ivcsc.h5ad or
 * ivcsr.h5ad), written now when there is none (*built set), in bands
 * within the pack's memory budget.  Its path goes to out, pinned.  Runs
 * on a worker; blocks for the whole pack; stop as above.  plain, when not
 * NULL, is the served stream's plain copy (plainfile.h), which the pack
 * reads instead of writing a replica of its own.
 */
int iv_autopack_other(const iv_config_t *cfg, const iv_alog_t *log, const char *id,
                      const char *served, const char *group, int to_ivcsc, const char *plain,
                      iv_autopack_progress_t *prog, const atomic_int *stop, char *out, size_t cap,
                      int *built, iv_err_t *err);

/* The memory each pack may use (--memory-mb), the builds' part of the
 * server's memory budget; 0 (the default) = a quarter of what is
 * available when the pack starts.  At least 512 MiB either way. */
void iv_autopack_set_memory(size_t bytes);

/* The packed copies in use (never evicted by a sweep): iv_autopack_resolve
 * pins the copy it returns (when out is not src) before any other pack's
 * sweep can see it; the entry's release unpins it. */
void iv_autopack_pin(const char *path);
void iv_autopack_unpin(const char *path);

/* Renders ,"packing":{...} for a dataset being packed (nothing when not). */
struct iv_buf;
void iv_autopack_progress_json(struct iv_buf *b, const iv_autopack_progress_t *p);

#endif /* IV_AUTOPACK_H */
