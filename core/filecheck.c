/*
 * The served file read through a descriptor, its identity and the chunk
 * checksum (see filecheck.h for why a descriptor and not a mapping).
 *
 * The state is an atomic so that the read path (workers) and the
 * watcher (the loop) can look at it without a lock; its message sits
 * behind a mutex taken only when the state moves or is reported, both
 * rare.
 */
#include "filecheck.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct iv_file {
    int fd;
    iv_file_id_t id;
    atomic_int state;        /* iv_file_state_t */
    atomic_int news;         /* the state moved since iv_file_news last said so */
    pthread_mutex_t mu;      /* guards msg */
    char msg[480];
    char path[4096];
};

const char *iv_file_state_name(iv_file_state_t st)
{
    switch (st) {
    case IV_FILE_OK: return "ok";
    case IV_FILE_DELETED: return "deleted";
    case IV_FILE_REPLACED: return "replaced";
    case IV_FILE_CHANGED: return "changed";
    }
    return "unknown";
}

void iv_file_id_of(const struct stat *st, iv_file_id_t *id)
{
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->size = (uint64_t)st->st_size;
    id->mtime_s = (int64_t)st->st_mtim.tv_sec;
    id->mtime_ns = (int64_t)st->st_mtim.tv_nsec;
    id->ctime_s = (int64_t)st->st_ctim.tv_sec;
    id->ctime_ns = (int64_t)st->st_ctim.tv_nsec;
}

/* Same inode, size and modification time: the bytes were not written
 * (short of a write that put the time back, which the checksums see). */
static int same_content(const iv_file_id_t *a, const iv_file_id_t *b)
{
    return a->size == b->size && a->mtime_s == b->mtime_s && a->mtime_ns == b->mtime_ns;
}

static int same_inode(const iv_file_id_t *a, const iv_file_id_t *b)
{
    return a->dev == b->dev && a->ino == b->ino;
}

iv_file_state_t iv_file_compare(const iv_file_id_t *loaded, const struct stat *now)
{
    if (!now) return IV_FILE_DELETED;
    iv_file_id_t id;
    iv_file_id_of(now, &id);
    if (!same_inode(loaded, &id)) return IV_FILE_REPLACED;
    return same_content(loaded, &id) ? IV_FILE_OK : IV_FILE_CHANGED;
}

void iv_file_describe(const iv_file_id_t *loaded, const struct stat *now, char *out, size_t n)
{
    if (!n) return;
    if (!now) {
        snprintf(out, n, "the path names no file any more");
        return;
    }
    iv_file_id_t id;
    iv_file_id_of(now, &id);
    if (!same_inode(loaded, &id)) {
        snprintf(out, n, "the path names another file now (inode %" PRIu64 " -> %" PRIu64
                 ", %" PRIu64 " -> %" PRIu64 " bytes)", loaded->ino, id.ino, loaded->size, id.size);
    } else if (loaded->size != id.size) {
        snprintf(out, n, "written in place: size %" PRIu64 " -> %" PRIu64 " bytes", loaded->size,
                 id.size);
    } else {
        snprintf(out, n, "written in place: modified at %" PRId64 ".%09" PRId64 " s, loaded as of %"
                 PRId64 ".%09" PRId64 " s", id.mtime_s, id.mtime_ns, loaded->mtime_s,
                 loaded->mtime_ns);
    }
}

int iv_file_open(const char *path, iv_file_t **out, iv_err_t *err)
{
    *out = NULL;
    iv_file_t *f = calloc(1, sizeof *f);
    if (!f) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        free(f);
        return iv_fail(err, IV_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        int e = errno;
        close(f->fd);
        free(f);
        return iv_fail(err, IV_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    iv_file_id_of(&st, &f->id);
    atomic_init(&f->state, IV_FILE_OK);
    atomic_init(&f->news, 0);
    pthread_mutex_init(&f->mu, NULL);
    snprintf(f->path, sizeof f->path, "%s", path);
    *out = f;
    return 0;
}

void iv_file_close(iv_file_t *f)
{
    if (!f) return;
    close(f->fd);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

const iv_file_id_t *iv_file_loaded_id(const iv_file_t *f) { return &f->id; }
const char *iv_file_path(const iv_file_t *f) { return f->path; }

static int rank_of(iv_file_state_t st) { return st == IV_FILE_CHANGED ? 2 : st == IV_FILE_OK ? 0 : 1; }

int iv_file_mark(iv_file_t *f, iv_file_state_t st, const char *msg)
{
    pthread_mutex_lock(&f->mu);
    iv_file_state_t was = (iv_file_state_t)atomic_load(&f->state);
    int moved = was != st && !(rank_of(was) == 2);
    if (moved) {
        snprintf(f->msg, sizeof f->msg, "%s", msg ? msg : "");
        atomic_store(&f->state, (int)st);
        atomic_store(&f->news, 1);
    }
    pthread_mutex_unlock(&f->mu);
    return moved;
}

int iv_file_news(iv_file_t *f) { return atomic_exchange(&f->news, 0); }

iv_file_state_t iv_file_state(iv_file_t *f, char *msg, size_t n)
{
    iv_file_state_t st = (iv_file_state_t)atomic_load(&f->state);
    if (msg && n) {
        msg[0] = '\0';
        if (st != IV_FILE_OK) {
            pthread_mutex_lock(&f->mu);
            st = (iv_file_state_t)atomic_load(&f->state);
            snprintf(msg, n, "%s", f->msg);
            pthread_mutex_unlock(&f->mu);
        }
    }
    return st;
}

/* Marks the file changed and fails the read with a message that says
 * what was seen; the first such message is the one kept. */
static int changed(iv_file_t *f, const char *what, const char *seen, iv_err_t *err)
{
    char m[480];
    snprintf(m, sizeof m, "%.160s changed on disk after it was loaded (%.200s, read of %.40s); "
             "reload the dataset", f->path, seen, what);
    iv_file_mark(f, IV_FILE_CHANGED, m);
    return iv_fail(err, IV_EFILE_CHANGED, "%s", m);
}

int iv_file_read(iv_file_t *f, uint64_t off, void *buf, size_t len, const char *what, iv_err_t *err)
{
    if (atomic_load(&f->state) == IV_FILE_CHANGED) {
        char m[480];
        iv_file_state(f, m, sizeof m);
        return iv_fail(err, IV_EFILE_CHANGED, "%s", m);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(f->fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            char seen[160];
            snprintf(seen, sizeof seen, "read error: %s", strerror(errno));
            return changed(f, what, seen, err);
        }
        if (r == 0) {
            char seen[160];
            snprintf(seen, sizeof seen, "%zu of %zu bytes at offset %" PRIu64 " are gone: it is shorter",
                     got, len, off);
            return changed(f, what, seen, err);
        }
        got += (size_t)r;
    }
    /* After the read: a write that raced it moved the modification time
     * before its bytes landed, so it shows here. */
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        char seen[160];
        snprintf(seen, sizeof seen, "fstat failed: %s", strerror(errno));
        return changed(f, what, seen, err);
    }
    if (iv_file_compare(&f->id, &st) != IV_FILE_OK) {
        char seen[200];
        iv_file_describe(&f->id, &st, seen, sizeof seen);
        return changed(f, what, seen, err);
    }
    return 0;
}

/* ------------------------------------------------------------ checksum */

#define K1 0x9fb21c651e98df25ull
#define K2 0xd6e8feb86659fd93ull

static inline uint64_t word_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t lane(uint64_t acc, uint64_t w)
{
    acc = (acc ^ w) * K1;
    return acc ^ (acc >> 29);
}

static inline uint64_t fmix(uint64_t x)
{
    x ^= x >> 32;
    x *= K2;
    x ^= x >> 29;
    x *= K1;
    return x ^ (x >> 32);
}

uint64_t iv_file_sum(const void *vp, size_t n)
{
    const uint8_t *p = vp;
    uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xbf58476d1ce4e5b9ull, c = 0x94d049bb133111ebull,
             d = (uint64_t)n;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a = lane(a, word_at(p + i));
        b = lane(b, word_at(p + i + 8));
        c = lane(c, word_at(p + i + 16));
        d = lane(d, word_at(p + i + 24));
    }
    /* The tail, one byte at a time into its own accumulator: under 32
     * bytes, and position-dependent through the multiply. */
    uint64_t t = 0x2545f4914f6cdd1dull;
    for (; i < n; i++) t = (t ^ p[i]) * K1;
    uint64_t h = fmix(a) + fmix(b ^ K2) * 3 + fmix(c + K1) * 5 + fmix(d) * 7 + fmix(t);
    return h ? h : 1;
}
