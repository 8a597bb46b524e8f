/*
 * The start-up index kept on disk (see indexfile.h).
 */
#include "indexfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = {'I', 'V', 'I', 'D', 'X', 0, 1, 0};
#define VERSION 1u

struct head {
    char magic[8];
    uint32_t version, stride;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
    uint64_t n_major, n_unique, nnz;
    uint64_t length, n_chunks, chunk_len;
    uint64_t n_ckpt;
    char group[256];
};

static void head_fill(struct head *h, const iv_indexfile_for_t *f, const iv_stream_t *s,
                      uint64_t n_ckpt)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, sizeof MAGIC);
    h->version = VERSION;
    h->stride = f->stride;
    h->dev = f->file.dev;
    h->ino = f->file.ino;
    h->size = f->file.size;
    h->mtime_s = f->file.mtime_s;
    h->mtime_ns = f->file.mtime_ns;
    h->n_major = f->n_major;
    h->n_unique = f->n_unique;
    h->nnz = f->nnz;
    h->length = iv_stream_length(s);
    h->n_chunks = iv_stream_n_chunks(s);
    h->chunk_len = iv_stream_chunk_len(s);
    h->n_ckpt = n_ckpt;
    snprintf(h->group, sizeof h->group, "%s", f->group ? f->group : "X");
}

/* The checkpoints a stride gives (rowindex.c: one per stride slices). */
static uint64_t ckpts_for(uint64_t n_major, uint32_t stride)
{
    return stride ? (n_major + stride - 1) / stride : 0;
}

static int read_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return -1;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

/* The kept file's header: 1 when it is the one wanted and the file has
 * exactly the size it gives, else 0 with *why set. */
static int read_head(int fd, const struct head *want, struct head *h, const char **why)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || read_all(fd, h, sizeof *h) != 0) {
        *why = "unreadable";
        return 0;
    }
    if (memcmp(h, want, sizeof *h) != 0) {
        *why = memcmp(h->magic, MAGIC, sizeof MAGIC) || h->version != VERSION
                   ? "another format"
                   : "made for another file or matrix";
        return 0;
    }
    /* The header equals the one wanted, so the sizes below are this
     * stream's own, not the file's word. */
    uint64_t n_words = h->n_ckpt + h->n_chunks + 1;
    if ((uint64_t)st.st_size != sizeof *h + n_words * 8) {
        *why = "truncated";
        return 0;
    }
    return 1;
}

/* The whole file (header h, then its words) into *buf, with its checksum
 * checked: 1; 0 with *why set; or a negative error. */
static int read_body(int fd, const char *path, const struct head *h, uint8_t **buf,
                     const char **why, iv_err_t *err)
{
    size_t total = sizeof *h + (size_t)(h->n_ckpt + h->n_chunks + 1) * 8;
    *buf = malloc(total);
    if (!*buf) return iv_fail(err, IV_ENOMEM, "%s: out of memory for the kept index", path);
    memcpy(*buf, h, sizeof *h);
    int bad = read_all(fd, *buf + sizeof *h, total - sizeof *h);
    uint64_t sum;
    if (!bad) memcpy(&sum, *buf + total - 8, 8);
    if (bad || sum != iv_file_sum(*buf, total - 8)) {
        free(*buf);
        *buf = NULL;
        *why = "damaged";
        return 0;
    }
    return 1;
}

/* The checkpoints of a checked file, into *out (owned by the caller):
 * they start at 0, never go back and stay inside the stream, so that a
 * reader seeks to them without further checks.  1; 0 with *why set; or
 * a negative error. */
static int take_offsets(const uint8_t *buf, const struct head *h, uint64_t **out,
                        const char *path, const char **why, iv_err_t *err)
{
    uint64_t *off = malloc((size_t)(h->n_ckpt ? h->n_ckpt : 1) * sizeof *off);
    if (!off) return iv_fail(err, IV_ENOMEM, "%s: out of memory for the kept index", path);
    memcpy(off, buf + sizeof *h, (size_t)h->n_ckpt * 8);
    for (uint64_t k = 0; k < h->n_ckpt; k++)
        if ((k == 0 && off[k] != 0) || (k > 0 && off[k] < off[k - 1]) || off[k] > h->length) {
            free(off);
            *why = "damaged";
            return 0;
        }
    *out = off;
    return 1;
}

/* In stages: the header against the one this stream wants, the body and
 * its checksum, the checkpoints, then the stream sealed with the kept
 * chunk checksums. */
int iv_indexfile_load(const char *path, const iv_indexfile_for_t *f, iv_stream_t *s,
                      iv_rowindex_t *ri, const char **why, iv_err_t *err)
{
    const char *dummy;
    if (!why) why = &dummy;
    *why = "none kept";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct head h, want;
    uint32_t stride = f->stride ? f->stride : IV_ROWINDEX_DEFAULT_STRIDE;
    iv_indexfile_for_t ff = *f;
    ff.stride = stride;
    head_fill(&want, &ff, s, ckpts_for(f->n_major, stride));
    uint8_t *buf = NULL;
    int rc = read_head(fd, &want, &h, why);
    if (rc == 1) rc = read_body(fd, path, &h, &buf, why, err);
    close(fd);
    if (rc != 1) return rc;
    uint64_t *off = NULL;
    rc = take_offsets(buf, &h, &off, path, why, err);
    if (rc == 1) {
        const uint64_t *sums = (const uint64_t *)(void *)(buf + sizeof h + (size_t)h.n_ckpt * 8);
        iv_err_t serr;
        iv_err_clear(&serr);
        if (iv_stream_seal_with(s, sums, h.n_chunks, &serr) != 0) {
            free(off);
            *why = "its checksums do not fit the stream";
            rc = 0;
        }
    }
    free(buf);
    if (rc != 1) return rc;
    ri->stride = stride;
    ri->n_ckpt = h.n_ckpt;
    ri->off = off;
    *why = "loaded";
    return 1;
}

int iv_indexfile_save(const char *path, const iv_indexfile_for_t *f, const iv_stream_t *s,
                      const iv_rowindex_t *ri, iv_err_t *err)
{
    uint64_t n_chunks = iv_stream_n_chunks(s);
    if (n_chunks == 0)
        return iv_fail(err, IV_EUNSUPPORTED, "%s: a stream in memory has no index to keep", path);
    iv_indexfile_for_t ff = *f;
    ff.stride = ri->stride;
    struct head h;
    head_fill(&h, &ff, s, ri->n_ckpt);
    size_t total = sizeof h + (size_t)(ri->n_ckpt + n_chunks + 1) * 8;
    uint8_t *buf = malloc(total);
    if (!buf) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, ri->off, (size_t)ri->n_ckpt * 8);
    uint64_t *sums = (uint64_t *)(void *)(buf + sizeof h + (size_t)ri->n_ckpt * 8);
    if (iv_stream_sums(s, sums) != n_chunks) {
        free(buf);
        return iv_fail(err, IV_EUNSUPPORTED, "%s: the stream has no checksums to keep", path);
    }
    uint64_t sum = iv_file_sum(buf, total - 8);
    memcpy(buf + total - 8, &sum, 8);
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid()) >= sizeof tmp) {
        free(buf);
        return iv_fail(err, IV_EINVALID_ARG, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        free(buf);
        return iv_fail(err, IV_EIO, "%s: cannot create: %s", tmp, strerror(e));
    }
    int bad = write_all(fd, buf, total);
    free(buf);
    if (close(fd) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return iv_fail(err, IV_EIO, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}
