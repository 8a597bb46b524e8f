/*
 * The plain copy of a packed stream (see plainfile.h).
 */
#include "plainfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"

static const char MAGIC[8] = {'I', 'V', 'P', 'L', 'N', 0, 1, 0};
#define VERSION 1u
#define DATA_OFF 4096u
/* Bytes of the stream one save task copies: a multiple of the chunk. */
#define TASK_BYTES ((uint64_t)4 << 20)

struct head {
    char magic[8];
    uint32_t version, chunk_len;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
    uint64_t length, n_chunks, data_off;
    char group[256];
};

_Static_assert(sizeof(struct head) <= DATA_OFF, "the header fits before the data");
_Static_assert(TASK_BYTES % IV_PLAIN_CHUNK == 0, "a task holds whole chunks");

static uint64_t n_chunks_of(uint64_t length)
{
    return (length + IV_PLAIN_CHUNK - 1) / IV_PLAIN_CHUNK;
}

/* Where the chunk checksums start: 8-aligned after the data. */
static uint64_t sums_off(uint64_t length)
{
    return DATA_OFF + (length + 7) / 8 * 8;
}

static void head_fill(struct head *h, const iv_plainfile_for_t *f)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, sizeof MAGIC);
    h->version = VERSION;
    h->chunk_len = IV_PLAIN_CHUNK;
    h->dev = f->file.dev;
    h->ino = f->file.ino;
    h->size = f->file.size;
    h->mtime_s = f->file.mtime_s;
    h->mtime_ns = f->file.mtime_ns;
    h->length = f->length;
    h->n_chunks = n_chunks_of(f->length);
    h->data_off = DATA_OFF;
    snprintf(h->group, sizeof h->group, "%s", f->group ? f->group : "X");
}

/* The trailer: the header's checksum mixed with the chunk checksums'. */
static uint64_t trailer_of(const struct head *h, const uint64_t *sums, uint64_t n)
{
    uint64_t a = iv_file_sum(h, sizeof *h), b = iv_file_sum(sums, (size_t)n * 8);
    return a ^ (b * 0x9e3779b97f4a7c15ull);
}

/* ---- save ------------------------------------------------------------- */

struct save {
    iv_plainfile_fill_fn fill;
    void *ctx;
    int fd;
    uint64_t length;
    uint64_t *sums;
    const atomic_int *stop;
    atomic_int failed;          /* 0, or the first task's error code */
    iv_err_t err;               /* that task's message */
    atomic_flag err_taken;
};

static void save_fail(struct save *sv, int code, const iv_err_t *e)
{
    if (atomic_flag_test_and_set(&sv->err_taken)) return;
    sv->err = *e;
    atomic_store(&sv->failed, code);
}

/* The plain copy's fill: src's bytes [a, b) copied into buf. */
static int gather(void *ctx, uint64_t a, uint64_t b, uint8_t *buf, iv_err_t *e)
{
    iv_stream_t *src = ctx;
    uint64_t chunk_len = iv_stream_chunk_len(src);
    for (uint64_t off = a; off < b;) {
        uint64_t c = off / chunk_len, at = off - c * chunk_len;
        const uint8_t *data;
        size_t len;
        IV_TRY(iv_stream_acquire(src, c, &data, &len, NULL, e));
        if (at >= len) {
            iv_stream_release(src, c);
            return iv_fail(e, IV_ECORRUPT, "chunk %llu of the stream is shorter than its place",
                           (unsigned long long)c);
        }
        uint64_t take = len - at < b - off ? len - at : b - off;
        memcpy(buf + (off - a), data + at, (size_t)take);
        iv_stream_release(src, c);
        off += take;
    }
    return 0;
}

/* Task i: the copy's bytes [i * TASK_BYTES, ...) made by the fill, their
 * chunk checksums taken, written at their place. */
static void save_task(void *arg, size_t i)
{
    struct save *sv = arg;
    if (atomic_load(&sv->failed)) return;
    iv_err_t e;
    iv_err_clear(&e);
    if (sv->stop && atomic_load(sv->stop)) {
        iv_fail(&e, IV_ECANCELLED, "plain copy stopped");
        save_fail(sv, IV_ECANCELLED, &e);
        return;
    }
    uint64_t a = (uint64_t)i * TASK_BYTES, b = a + TASK_BYTES < sv->length ? a + TASK_BYTES : sv->length;
    uint8_t *buf = malloc((size_t)(b - a));
    if (!buf) {
        iv_fail(&e, IV_ENOMEM, "out of memory writing a plain copy");
        save_fail(sv, IV_ENOMEM, &e);
        return;
    }
    int rc = sv->fill(sv->ctx, a, b, buf, &e);
    if (rc == 0) {
        for (uint64_t off = a; off < b; off += IV_PLAIN_CHUNK) {
            uint64_t n = b - off < IV_PLAIN_CHUNK ? b - off : IV_PLAIN_CHUNK;
            sv->sums[off / IV_PLAIN_CHUNK] = iv_file_sum(buf + (off - a), (size_t)n);
        }
        if (iv_cachedir_pwrite(sv->fd, buf, (size_t)(b - a), DATA_OFF + a) != 0)
            rc = iv_fail(&e, IV_EIO, "cannot write a plain copy: %s", strerror(errno));
    }
    free(buf);
    if (rc < 0) save_fail(sv, rc, &e);
}

/* The body of the copy written to sv->fd, then its tail (checksums and
 * trailer) and last its header, so that a file cut short has none. */
static int save_body(struct save *sv, const struct head *h, iv_pool_t *pool, const char *tmp, iv_err_t *err)
{
    uint64_t n = h->n_chunks, at = sums_off(h->length);
    if (ftruncate(sv->fd, (off_t)(at + n * 8 + 8)) != 0)
        return iv_fail(err, IV_EIO, "%s: cannot size: %s", tmp, strerror(errno));
    iv_pool_parallel_for(pool, (size_t)((h->length + TASK_BYTES - 1) / TASK_BYTES), 0, save_task, sv);
    int rc = atomic_load(&sv->failed);
    if (rc != 0) {
        *err = sv->err;
        return rc;
    }
    uint64_t tr = trailer_of(h, sv->sums, n);
    if (iv_cachedir_pwrite(sv->fd, sv->sums, (size_t)n * 8, at) != 0 ||
        iv_cachedir_pwrite(sv->fd, &tr, 8, at + n * 8) != 0 || iv_cachedir_pwrite(sv->fd, h, sizeof *h, 0) != 0)
        return iv_fail(err, IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    return 0;
}

/* The copy of f's length, its bytes from fill, written to the open, empty
 * file fd (named `what` in messages). */
static int write_filled(int fd, const char *what, const iv_plainfile_for_t *f, iv_plainfile_fill_fn fill,
                        void *ctx, iv_pool_t *pool, const atomic_int *stop, iv_err_t *err)
{
    struct head h;
    head_fill(&h, f);
    struct save sv = {.fill = fill, .ctx = ctx, .fd = fd, .length = f->length, .stop = stop,
                      .err_taken = ATOMIC_FLAG_INIT};
    atomic_init(&sv.failed, 0);
    sv.sums = calloc((size_t)(h.n_chunks ? h.n_chunks : 1), sizeof *sv.sums);
    if (!sv.sums) return iv_fail(err, IV_ENOMEM, "out of memory for a plain copy's checksums");
    int rc = save_body(&sv, &h, pool, what, err);
    free(sv.sums);
    return rc;
}

int iv_plainfile_write(int fd, const char *what, const iv_plainfile_for_t *f, iv_stream_t *src,
                       iv_pool_t *pool, const atomic_int *stop, iv_err_t *err)
{
    if (iv_stream_length(src) != f->length)
        return iv_fail(err, IV_EINTERNAL, "%s: plain copy of a stream of another length", what);
    return write_filled(fd, what, f, gather, src, pool, stop, err);
}

int iv_plainfile_save_filled(const char *path, const iv_plainfile_for_t *f, iv_plainfile_fill_fn fill,
                             void *ctx, iv_pool_t *pool, const atomic_int *stop, iv_err_t *err)
{
    char tmp[4200];
    if (iv_cachedir_temp(path, tmp, sizeof tmp, err) != 0)
        return iv_fail(err, IV_EINVALID_ARG, "cache path too long: %s", path);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return iv_fail(err, IV_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_filled(fd, tmp, f, fill, ctx, pool, stop, err);
    if (close(fd) != 0 && rc == 0) rc = iv_fail(err, IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = iv_fail(err, IV_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
    if (rc != 0) unlink(tmp);
    return rc;
}

int iv_plainfile_save(const char *path, const iv_plainfile_for_t *f, iv_stream_t *src,
                      iv_pool_t *pool, const atomic_int *stop, iv_err_t *err)
{
    if (iv_stream_length(src) != f->length)
        return iv_fail(err, IV_EINTERNAL, "%s: plain copy of a stream of another length", path);
    return iv_plainfile_save_filled(path, f, gather, src, pool, stop, err);
}

/* ---- open ------------------------------------------------------------- */

/* The kept checksums of the copy opened as fl, checked: 1 with *out
 * (malloc'd), 0 with *why set, or a negative error. */
static int read_sums(iv_file_t *fl, const struct head *want, uint64_t **out, const char **why,
                     iv_err_t *err)
{
    struct head h;
    iv_err_t sub;
    iv_err_clear(&sub);
    if (iv_file_loaded_id(fl)->size < sizeof h || iv_file_read(fl, 0, &h, sizeof h, "header", &sub) != 0) {
        *why = "truncated";
        return 0;
    }
    if (memcmp(&h, want, sizeof h) != 0) {
        *why = memcmp(h.magic, MAGIC, sizeof MAGIC) || h.version != VERSION ? "another format"
                                                                          : "made for another file or matrix";
        return 0;
    }
    /* The header equals the one wanted: the sizes below are the stream's. */
    uint64_t n = h.n_chunks, at = sums_off(h.length);
    if (iv_file_loaded_id(fl)->size != at + n * 8 + 8) {
        *why = "truncated";
        return 0;
    }
    uint64_t *sums = malloc((size_t)(n + 1) * 8);
    if (!sums) return iv_fail(err, IV_ENOMEM, "out of memory for a plain copy's checksums");
    if (iv_file_read(fl, at, sums, (size_t)(n + 1) * 8, "checksums", &sub) != 0 ||
        trailer_of(&h, sums, n) != sums[n]) {
        free(sums);
        *why = "damaged";
        return 0;
    }
    for (uint64_t c = 0; c < n; c++)
        if (sums[c] == 0) {
            free(sums);
            *why = "damaged";
            return 0;
        }
    *out = sums;
    return 1;
}

/* The stream over the copy opened as fl (which it takes, also on
 * failure), in chunk_len chunks, sealed with its checksums: 0 with *out
 * set, or a negative error. */
static int plain_stream(const char *path, iv_file_t *fl, const iv_plainfile_for_t *f, uint64_t chunk_len,
                        size_t cache_budget, const uint64_t *sums, iv_stream_t **out, iv_err_t *err)
{
    char label[400];
    snprintf(label, sizeof label, "%.300s (plain copy)", path);
    uint64_t n = n_chunks_of(f->length);
    /* Small chunks come from malloc: an arena slot rounds up to pages. */
    iv_stream_desc_t d = {.length = f->length, .file = fl, .max_stored = chunk_len, .label = label,
                          .no_arena = chunk_len < ((uint64_t)64 << 10), .sum_len = IV_PLAIN_CHUNK};
    d.chunk_sum = calloc((size_t)(n ? n : 1), sizeof *d.chunk_sum);
    if (!d.chunk_sum) {
        iv_file_close(fl);
        return iv_fail(err, IV_ENOMEM, "out of memory for a plain copy's checksums");
    }
    iv_stream_desc_virtual(&d, DATA_OFF, f->length, chunk_len);
    iv_stream_t *s = NULL;
    int rc = iv_stream_create(&d, cache_budget, &s, err);
    if (rc == 0) rc = iv_stream_seal_with(s, sums, n, err);
    if (rc < 0) {
        iv_stream_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int iv_plainfile_open(const char *path, const iv_plainfile_for_t *f, uint64_t chunk_len,
                      size_t cache_budget, iv_stream_t **out, const char **why, iv_err_t *err)
{
    if (chunk_len == 0 || chunk_len % IV_PLAIN_CHUNK)
        return iv_fail(err, IV_EINVALID_ARG, "%s: chunks of %llu bytes are not whole pieces", path,
                       (unsigned long long)chunk_len);
    const char *dummy;
    if (!why) why = &dummy;
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        *why = "none kept";
        return 0;
    }
    iv_file_t *fl = NULL;
    iv_err_t sub;
    iv_err_clear(&sub);
    if (iv_file_open(path, &fl, &sub) != 0) {
        *why = "unreadable";
        return 0;
    }
    struct head want;
    head_fill(&want, f);
    uint64_t *sums = NULL;
    int rc = read_sums(fl, &want, &sums, why, err);
    if (rc <= 0) {
        iv_file_close(fl);
        return rc;
    }
    rc = plain_stream(path, fl, f, chunk_len, cache_budget, sums, out, err);
    free(sums);
    return rc < 0 ? rc : 1;
}
