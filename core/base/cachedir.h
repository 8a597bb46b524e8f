/*
 * The cache folder: where every file the server derives from a source
 * file lives (a packed copy of an ordinary .h5ad today; the other
 * orientation and start-up indexes are meant to go there too).
 *
 * A derived file is named after its source and the source's identity
 * key, `STEM-KEY.KIND` (KIND e.g. "ivcsr.h5ad"), so a changed source
 * gives a new name and an old derived file can never be taken for the
 * new one.  The key hashes the source's device, inode, size and
 * modification time with its first and last MiB (SHA-256, 32 hex
 * digits): a file rewritten in place with its size and time put back is
 * still told apart unless its first and last MiB are unchanged too.
 * Beside each derived file a note `NAME.src` records the source's path
 * and key; the sweep reads the notes to remove derived files whose
 * source changed or went away.  Derived files are written by their
 * producer under `NAME.tmpPID-N` (iv_cachedir_temp: N tells apart two
 * writers of one process, such as two datasets of one file keeping the
 * same derived file at once) and renamed into place; the sweep removes
 * such temporary files whose process is gone.
 *
 * Bounded: after removing stale files the sweep removes the least
 * recently used derived files (their notes' modification time, set to
 * now by iv_cachedir_touch at every use) until the folder holds at most
 * max_bytes, never one named in keep (the files in use).
 *
 * Thread rules: every function may be called from any thread; two sweeps
 * of one folder at once remove each file at most once (unlink is atomic)
 * but may count a file both removed.  No state of its own.
 */
#ifndef IV_CACHEDIR_H
#define IV_CACHEDIR_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define IV_CACHEDIR_KEY_LEN 33   /* 32 hex digits and the NUL */

/* Creates dir (and its missing parents) with mode 0700 when absent.  An
 * existing folder is used as it is; one that is not a folder, or that
 * this process cannot write, is IV_EIO naming it. */
int iv_cachedir_prepare(const char *dir, iv_err_t *err);

/* The identity key of the source file (see the top of this file). */
int iv_cachedir_key(const char *src, char key[IV_CACHEDIR_KEY_LEN], iv_err_t *err);

/* dir/STEM-KEY.KIND, STEM the source's file name less ".h5ad" (cut to 80
 * bytes).  IV_EINVALID_ARG when it does not fit cap. */
int iv_cachedir_path(const char *dir, const char *src, const char *key, const char *kind,
                     char *buf, size_t cap, iv_err_t *err);

/* Writes derived + ".src" (source path and key), replacing an old one. */
int iv_cachedir_note(const char *derived, const char *src, const char *key, iv_err_t *err);

/* One piece of a file iv_cachedir_write writes. */
typedef struct iv_cachedir_part {
    const void *p;
    size_t n;
} iv_cachedir_part_t;

/* A temporary name for a file written at path, into buf (cap bytes):
 * path.tmpPID-N, N a counter of the process, so that no two writers
 * share one; the sweep knows the form.  IV_EINVALID_ARG when it does not
 * fit. */
int iv_cachedir_temp(const char *path, char *buf, size_t cap, iv_err_t *err);

/* Writes the parts in order to path under a temporary name (iv_cachedir_temp,
 * which the sweep knows), then renames it into place: a reader, or a
 * map, never sees a half-written file.  IV_EIO naming path otherwise. */
int iv_cachedir_write(const char *path, const iv_cachedir_part_t *parts, size_t n_parts,
                      iv_err_t *err);

/* Writes all n bytes of buf at off of fd (pwrite, retried when cut
 * short or interrupted): 0, or -1 with errno set.  For the producers of
 * derived files that write their parts out of order. */
int iv_cachedir_pwrite(int fd, const void *buf, size_t n, uint64_t off);

/*
 * Maps a kept file whole, read-only (MAP_PRIVATE), for its reader to
 * check: 1 with *map and *len set, 0 with *why set when there is none
 * ("none kept"), it is shorter than min_len ("truncated") or cannot be
 * read ("unreadable"), or IV_ENOMEM when the map does not fit.
 */
int iv_cachedir_map(const char *path, size_t min_len, void **map, size_t *len, const char **why,
                    iv_err_t *err);

/* Marks derived used now (its note's modification time, which the sweep
 * reads as the derived file's last use), for the LRU order. */
void iv_cachedir_touch(const char *derived);

typedef struct iv_cachedir_sweep {
    size_t stale;             /* derived files removed: source changed or gone */
    size_t evicted;           /* removed to fit max_bytes, least recently used first */
    size_t temps;             /* temporary files of processes that are gone */
    uint64_t bytes_left;      /* what the folder's derived files hold after */
} iv_cachedir_sweep_t;

/*
 * Removes stale derived files and dead producers' temporary files, then
 * evicts to max_bytes (0: no bound).  keep: paths (as the caller names
 * them under dir) never removed, n_keep of them.  out may be NULL.  A
 * folder that cannot be listed is IV_EIO; a file that cannot be removed
 * is left and counted as kept.
 */
int iv_cachedir_sweep(const char *dir, uint64_t max_bytes, const char *const *keep, size_t n_keep,
                      iv_cachedir_sweep_t *out, iv_err_t *err);

#endif /* IV_CACHEDIR_H */
