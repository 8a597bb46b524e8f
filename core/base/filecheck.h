/*
 * The served file as an open descriptor: reads that can fail but never
 * fault, the identity of the file as loaded, and the checks that tell a
 * file replaced under a running server from the one it indexed.
 *
 * Why not a mapping.  A dataset used to read its packed chunks through
 * a read-only mapping of the whole file.  When an administrator runs
 * `cp new.h5ad served.h5ad`, cp truncates the very inode that is mapped
 * and writes it again: a worker touching a page past the new end gets
 * SIGBUS and the whole server dies, every dataset with it; a page read
 * while cp writes gives a mix of two files.  A descriptor read with
 * pread() turns the first case into a short read (an error for one
 * query) and this file's checks turn the second into one too:
 *
 *  - identity: after every read, fstat() of the descriptor is compared
 *    with what it was at load (size and modification time).  Any write
 *    moves the modification time before its bytes land (the kernel
 *    updates it first), so a read that raced a write is seen by the
 *    fstat that follows it.  The inode change time is kept but not
 *    compared: chmod, chown or a new hard link move it without touching
 *    a byte.
 *  - content: a 64-bit checksum of every stored chunk's bytes, taken in
 *    the row-index pass at load (which reads every chunk anyway) and
 *    checked at every later read of that chunk.  It catches what the
 *    identity cannot: a same-size write whose modification time was put
 *    back (touch -r, cp -p, rsync -t).
 *
 * A descriptor also pins the inode: `mv new.h5ad served.h5ad` or `rm`
 * leave the loaded file alive and unchanged for as long as the dataset
 * holds it, so such a dataset keeps answering with exactly the matrix it
 * loaded (its disk space is freed when the dataset is closed).  What the
 * path names now is the watcher's business (server/watch.c), through
 * iv_file_compare().
 *
 * Once a read sees the file changed in place, the file is marked
 * IV_FILE_CHANGED for good (iv_file_state): its dataset answers
 * IV_EFILE_CHANGED until it is reloaded.  Marks are sticky and ordered
 * (OK < DELETED, REPLACED < CHANGED; a path that names the loaded file
 * again is OK again unless CHANGED).
 *
 * Threads: iv_file_read, iv_file_state and iv_file_mark may be called
 * from any thread at once; open and close by the owner only.
 */
#ifndef IV_FILECHECK_H
#define IV_FILECHECK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "error.h"

typedef struct iv_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
    int64_t ctime_s, ctime_ns;
} iv_file_id_t;

typedef enum iv_file_state {
    IV_FILE_OK = 0,        /* the path names the loaded file, unchanged */
    IV_FILE_DELETED,       /* the path names nothing; the loaded file is still held */
    IV_FILE_REPLACED,      /* the path names another file; the loaded one is still held */
    IV_FILE_CHANGED,       /* the loaded file itself was written: it cannot answer */
} iv_file_state_t;

/* "ok", "deleted", "replaced", "changed". */
const char *iv_file_state_name(iv_file_state_t st);

void iv_file_id_of(const struct stat *st, iv_file_id_t *id);

/* What the path's stat says of the loaded file: now == NULL means the
 * path names nothing (ENOENT).  Never returns CHANGED for another inode. */
iv_file_state_t iv_file_compare(const iv_file_id_t *loaded, const struct stat *now);

/* One line for a log or a document, e.g. "size 1000 -> 0 bytes". */
void iv_file_describe(const iv_file_id_t *loaded, const struct stat *now, char *out, size_t n);

/* 1 when both paths name one file (symbolic links followed, hard links
 * seen), 0 otherwise, and when either names nothing.  The writers refuse
 * an output that is one of their inputs: writing it would replace what
 * they read. */
int iv_file_same(const char *a, const char *b);

typedef struct iv_file iv_file_t;

/* Opens path read-only (close-on-exec) and records its identity. */
int iv_file_open(const char *path, iv_file_t **out, iv_err_t *err);
void iv_file_close(iv_file_t *f);

const iv_file_id_t *iv_file_loaded_id(const iv_file_t *f);
const char *iv_file_path(const iv_file_t *f);

/* Reads exactly len bytes at off into buf, then checks that the file is
 * still the one loaded.  A short read, an I/O error or a changed
 * identity marks the file CHANGED and is IV_EFILE_CHANGED naming what
 * moved; `what` names the bytes for the message ("chunk 12"). */
int iv_file_read(iv_file_t *f, uint64_t off, void *buf, size_t len, const char *what,
                 iv_err_t *err);

/* The state and, when not OK, a one-line message (msg may be NULL). */
iv_file_state_t iv_file_state(iv_file_t *f, char *msg, size_t n);
/* Records an observation; CHANGED stays.  Returns 1 when the state moved. */
int iv_file_mark(iv_file_t *f, iv_file_state_t st, const char *msg);
/* 1 once after each move of the state, by whichever thread saw it (a
 * read or the watcher): the reporter's cue to log it. */
int iv_file_news(iv_file_t *f);

/*
 * The content checksum: 64 bits over the bytes, never 0 (0 means "not
 * taken"): four CRC32C lanes over the 8-byte words, mixed with the length
 * (see filecheck.c).  Up to 32 changed bits within one 8-byte word (a
 * flipped bit, a changed byte) always change the sum; other changes go
 * unseen with a chance of about 2^-32 or less.  Not cryptographic: it
 * finds accidents (another file's bytes), not forgeries.  With SSE4.2 (x86-64-v2, the build's default) about 1 ms of
 * CPU per 20 MB; iv_file_sum_portable is the table version, the same
 * function bit for bit (the reference for the tests, and the fallback).
 */
uint64_t iv_file_sum(const void *p, size_t n);
uint64_t iv_file_sum_portable(const void *p, size_t n);

#endif
