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

/*
 * Four CRC32C lanes over the 8-byte words (word k feeds lane k mod 4),
 * mixed at the end with the length.  CRC32C is one instruction a word on
 * any x86-64-v2 CPU (SSE4.2), and four independent lanes keep it busy
 * every cycle: 2-2.5x the multiply-based checksum this replaced (measured), which
 * cost a third more CPU on a cold query of a poorly compressible stream.
 * A CRC sees every burst of up to 32 changed bits in what its lane reads,
 * and the final mix is a bijection of each half, so a burst within one
 * word (a flipped bit, a changed byte) always changes the sum; other
 * changes go unseen with a chance of about 2^-32 when they touch one lane
 * only, 2^-64 when they touch several (another file's bytes touch all).
 * The portable table version below is the reference the instruction is
 * tested against, bit for bit.
 */
#define K1 0x9fb21c651e98df25ull
#define K2 0xd6e8feb86659fd93ull

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int t = 1; t < 8; t++)
            crc_table[t][b] = (crc_table[t - 1][b] >> 8) ^ crc_table[0][crc_table[t - 1][b] & 0xff];
}

/* CRC32C of the 8 little-endian bytes of w, from c (no inversions), as
 * the crc32q instruction computes it. */
static inline uint32_t crc_word_table(uint32_t c, uint64_t w)
{
    uint64_t x = w ^ c;
    return crc_table[7][x & 0xff] ^ crc_table[6][(x >> 8) & 0xff] ^
           crc_table[5][(x >> 16) & 0xff] ^ crc_table[4][(x >> 24) & 0xff] ^
           crc_table[3][(x >> 32) & 0xff] ^ crc_table[2][(x >> 40) & 0xff] ^
           crc_table[1][(x >> 48) & 0xff] ^ crc_table[0][x >> 56];
}

#if defined(__SSE4_2__)
#include <nmmintrin.h>
static inline uint32_t crc_word_hw(uint32_t c, uint64_t w) { return (uint32_t)_mm_crc32_u64(c, w); }
#endif

static inline uint64_t word_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t fmix(uint64_t x)
{
    x ^= x >> 32;
    x *= K2;
    x ^= x >> 29;
    x *= K1;
    return x ^ (x >> 32);
}

/* The lanes' end: the tail (under 8 bytes, zero-padded) goes to the next
 * lane in turn, then the length and the halves are mixed. */
#define SUM_BODY(CRC)                                                                  \
    const uint8_t *p = vp;                                                             \
    uint32_t l[4] = {0x01234567u, 0x89abcdefu, 0xfedcba98u, 0x76543210u};              \
    size_t i = 0;                                                                      \
    for (; i + 32 <= n; i += 32) {                                                     \
        l[0] = CRC(l[0], word_at(p + i));                                              \
        l[1] = CRC(l[1], word_at(p + i + 8));                                          \
        l[2] = CRC(l[2], word_at(p + i + 16));                                         \
        l[3] = CRC(l[3], word_at(p + i + 24));                                         \
    }                                                                                  \
    size_t k = 0;                                                                      \
    for (; i + 8 <= n; i += 8, k++) l[k] = CRC(l[k], word_at(p + i));                  \
    if (i < n) {                                                                       \
        uint64_t w = 0;                                                                \
        memcpy(&w, p + i, n - i);                                                      \
        l[k] = CRC(l[k], w);                                                           \
    }                                                                                  \
    uint64_t h = fmix(((uint64_t)l[0] << 32 | l[1]) ^ K2) +                             \
                 fmix(((uint64_t)l[2] << 32 | l[3]) + (uint64_t)n * K1);                \
    return h ? h : 1;

uint64_t iv_file_sum_portable(const void *vp, size_t n)
{
    pthread_once(&crc_once, crc_init);
    SUM_BODY(crc_word_table)
}

uint64_t iv_file_sum(const void *vp, size_t n)
{
#if defined(__SSE4_2__)
    SUM_BODY(crc_word_hw)
#else
    return iv_file_sum_portable(vp, n);
#endif
}

int iv_file_same(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
