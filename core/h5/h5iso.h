/*
 * HDF5 reads isolated in a child process.
 *
 * libhdf5 is not safe on damaged input: one changed byte in a global heap
 * or an object header can make it read or write out of bounds and kill
 * the process.  A server holding many datasets must not die for one bad
 * file, so every HDF5 read of a file runs in a forked child:
 * iv_h5iso_run() forks, the child runs fn, which writes its results as
 * bytes into an anonymous memory file (iv_h5iso_put), and the parent maps
 * those bytes and parses them with bounds checks (iv_h5iso_rd_*).  A child
 * that dies by a signal, exits without an answer or outlives the timeout
 * becomes one clear error naming the file and what was being read; the
 * server and its other datasets go on.
 *
 * Thread rules: iv_h5iso_run may be called from any thread, concurrently;
 * it blocks the caller until the child is done.  The child runs with one
 * thread (the caller's copy): fn must not use the worker pool, locks that
 * other threads may hold, stdio or the parent's event loop.  malloc is
 * fork-safe (glibc and jemalloc take their locks around fork).  HDF5 is
 * called only in children; code that calls HDF5 in the parent process
 * must hold iv_h5iso_lock() around its calls, so that no fork copies the
 * library in the middle of a call (its global state then stays locked or
 * half-written in the child).
 */
#ifndef IV_H5ISO_H
#define IV_H5ISO_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* ------------------------------------------------------------ child side */

typedef struct iv_h5iso_out iv_h5iso_out_t;

/* Appends n bytes to the result.  0 or IV_EIO (the memory file refused). */
int iv_h5iso_put(iv_h5iso_out_t *o, const void *p, size_t n);
int iv_h5iso_put_u64(iv_h5iso_out_t *o, uint64_t v);
/* A length-prefixed byte array (u64 length, then the bytes). */
int iv_h5iso_put_blob(iv_h5iso_out_t *o, const void *p, uint64_t n);

/* Names what the child reads now ("obs/_index"); a crash message names
 * the last stage told.  Copied; at most IV_H5ISO_STAGE_MAX - 1 bytes. */
#define IV_H5ISO_STAGE_MAX 256
void iv_h5iso_stage(iv_h5iso_out_t *o, const char *stage);

/* Sends a small message (at most IV_H5ISO_NOTE_MAX bytes) that the parent
 * hands to its note callback while the child goes on. */
#define IV_H5ISO_NOTE_MAX 256
void iv_h5iso_note(iv_h5iso_out_t *o, const void *msg, size_t n);

/* The child's work: read the file, put the results.  Returns 0 or a
 * negative error with err set; the parent's iv_h5iso_run returns the same
 * code and message. */
typedef int (*iv_h5iso_child_fn)(void *ctx, iv_h5iso_out_t *out, iv_err_t *err);

/* ----------------------------------------------------------- parent side */

typedef void (*iv_h5iso_note_fn)(void *ctx, const void *msg, size_t n);

/* The child's result: read-only bytes, valid until iv_h5iso_result_free. */
typedef struct iv_h5iso_result {
    const uint8_t *data;
    size_t len;
} iv_h5iso_result_t;

/*
 * Runs fn(ctx) in a child process.  path names the file in error
 * messages.  note (may be NULL) receives the child's notes on the calling
 * thread, in order, while the child runs.  On success res holds what the
 * child put.  Errors: the child's own error; IV_EBAD_FILE when the child
 * died by a signal or exited without answering ("PATH: HDF5 crashed
 * reading obs/_index (signal 11, Segmentation fault); the file is
 * damaged"); IV_ETIMEOUT when it ran past the timeout (it is killed);
 * IV_EINTERNAL when no child could be started.
 */
int iv_h5iso_run(const char *path, iv_h5iso_child_fn fn, void *ctx, iv_h5iso_note_fn note,
                 void *note_ctx, iv_h5iso_result_t *res, iv_err_t *err);
void iv_h5iso_result_free(iv_h5iso_result_t *res);

/* The longest a child may run, process-wide (default 300 s; 0 = default).
 * Loads of large files take seconds; a child past this is hung. */
void iv_h5iso_set_timeout_ms(unsigned ms);

/* How often a child that sends nothing is looked at, process-wide
 * (default 1000 ms; 0 = default): it counts as deadlocked after 3 looks
 * asleep on a futex or 8 spinning without a read or write.  The tests of
 * that detection shorten it. */
void iv_h5iso_set_check_ms(unsigned ms);

/* Held by iv_h5iso_run around its fork; any HDF5 call made in the parent
 * process must hold it too (see the top of this file). */
void iv_h5iso_lock(void);
void iv_h5iso_unlock(void);

/* Bounds-checked reader of a result.  A read past the end returns zeros
 * or NULL and sets bad; callers check bad once at the end of a section. */
typedef struct iv_h5iso_rd {
    const uint8_t *p;
    size_t len, pos;
    int bad;
} iv_h5iso_rd_t;

void iv_h5iso_rd_init(iv_h5iso_rd_t *r, const iv_h5iso_result_t *res);
uint64_t iv_h5iso_rd_u64(iv_h5iso_rd_t *r);
/* n raw bytes (NULL and bad when fewer remain). */
const void *iv_h5iso_rd_raw(iv_h5iso_rd_t *r, size_t n);
/* A blob of exactly `want` bytes (want = (size_t)-1: any length, given in
 * *n).  NULL with bad set when the length differs or overruns.  A blob is
 * its length (u64), its bytes and zeros up to a multiple of 8 bytes
 * (iv_h5iso_put_blob), so a blob of an answer made of u64s and blobs
 * starts 8-aligned when the answer does (results are page-aligned). */
const void *iv_h5iso_rd_blob(iv_h5iso_rd_t *r, size_t want, size_t *n);

/* A string blob copied NUL-terminated into out (cap bytes): 0, or -1
 * when it is malformed or does not fit (bad set only when malformed). */
int iv_h5iso_rd_str(iv_h5iso_rd_t *r, char *out, size_t cap);

#endif /* IV_H5ISO_H */
