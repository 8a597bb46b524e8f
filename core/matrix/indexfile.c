/*
 * The start-up index kept on disk (see indexfile.h).
 */
#include "indexfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"
#include "dtype.h"

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
               : h->stride != want->stride ? "made with another row-index stride"
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
    iv_cachedir_part_t whole = {buf, total};
    int rc = iv_cachedir_write(path, &whole, 1, err);
    free(buf);
    return rc;
}

/* ---- the kept pointer and value arrays ---- */

static const char ARR_MAGIC[8] = {'I', 'V', 'A', 'R', 'R', 0, 1, 0};
#define ARR_VERSION 2u
/* Each array is summed in blocks of this many bytes (its last shorter),
 * so that the check at a restart runs on the pool's idle workers while
 * the reader process loads the rest (IV_ARRAYSFILE_BLOCK in the header). */
#define BLOCK IV_ARRAYSFILE_BLOCK

/* 344 bytes, a multiple of 8: the arrays after it are aligned. */
struct arr_head {
    char magic[8];
    uint32_t version, value_dtype;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
    uint64_t n_major, n_unique, nnz;
    uint64_t value_size;
    char group[256];
};

static void arr_head_fill(struct arr_head *h, const iv_indexfile_for_t *f)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, ARR_MAGIC, sizeof ARR_MAGIC);
    h->version = ARR_VERSION;
    h->dev = f->file.dev;
    h->ino = f->file.ino;
    h->size = f->file.size;
    h->mtime_s = f->file.mtime_s;
    h->mtime_ns = f->file.mtime_ns;
    snprintf(h->group, sizeof h->group, "%s", f->group ? f->group : "X");
}

/* The bytes of each array in the file (values unpadded), or 0 when the
 * counts cannot be a file's. */
static int arr_sizes(const struct arr_head *h, uint64_t sz[3])
{
    uint64_t lim = (uint64_t)1 << 48;
    if (h->n_major >= lim || h->n_unique >= lim || h->value_size == 0 || h->value_size > 8)
        return 0;
    sz[0] = (h->n_major + 1) * 8;
    sz[1] = (h->n_unique + 1) * 8;
    sz[2] = h->n_unique * h->value_size;
    return 1;
}

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }
static uint64_t blocks_of(uint64_t n) { return (n + BLOCK - 1) / BLOCK; }

/* The trailer's sums: the header's, then each array's blocks in order. */
static uint64_t n_sums(const uint64_t sz[3])
{
    return 1 + blocks_of(sz[0]) + blocks_of(sz[1]) + blocks_of(sz[2]);
}

/* The header against the one wanted: the identity and group fields
 * equal, the counts plausible, the file's size the one they give.  1, or
 * 0 with *why set. */
static int arr_head_check(const struct arr_head *h, const struct arr_head *want, uint64_t file_len,
                          const char **why)
{
    if (memcmp(h->magic, ARR_MAGIC, sizeof ARR_MAGIC) != 0 || h->version != ARR_VERSION) {
        *why = "another format";
        return 0;
    }
    if (h->dev != want->dev || h->ino != want->ino || h->size != want->size ||
        h->mtime_s != want->mtime_s || h->mtime_ns != want->mtime_ns ||
        memcmp(h->group, want->group, sizeof h->group) != 0) {
        *why = "made for another file or matrix";
        return 0;
    }
    uint64_t sz[3];
    if (h->value_dtype >= IV_DT_COUNT || !arr_sizes(h, sz) ||
        h->value_size != iv_dtype_size((iv_dtype_t)h->value_dtype)) {
        *why = "damaged";
        return 0;
    }
    if (file_len != sizeof *h + sz[0] + sz[1] + pad8(sz[2]) + 8 * n_sums(sz)) {
        *why = "truncated";
        return 0;
    }
    return 1;
}

/* Stages: the file mapped whole and its header against the one wanted;
 * the arrays then point into the map, their sums not yet checked. */
int iv_arraysfile_open(const char *path, const iv_indexfile_for_t *f, iv_arraysfile_t *a,
                       const char **why, iv_err_t *err)
{
    const char *dummy;
    if (!why) why = &dummy;
    memset(a, 0, sizeof *a);
    *why = "none kept";
    void *map;
    size_t len;
    int got = iv_cachedir_map(path, sizeof(struct arr_head), &map, &len, why, err);
    if (got <= 0) return got;
    struct arr_head h, want;
    memcpy(&h, map, sizeof h);
    arr_head_fill(&want, f);
    if (!arr_head_check(&h, &want, len, why)) {
        munmap(map, len);
        return 0;
    }
    /* The sums read every page next, from several threads. */
    madvise(map, len, MADV_WILLNEED);
    uint64_t sz[3];
    arr_sizes(&h, sz);
    uint8_t *base = map;
    a->map = map;
    a->len = len;
    a->major_ptr = (int64_t *)(void *)(base + sizeof h);
    a->value_ptr = (int64_t *)(void *)(base + sizeof h + sz[0]);
    a->values = base + sizeof h + sz[0] + sz[1];
    a->n_major = h.n_major;
    a->n_unique = h.n_unique;
    a->nnz = h.nnz;
    a->value_dtype = (int)h.value_dtype;
    a->n_blocks = (size_t)n_sums(sz);
    *why = "mapped";
    return 1;
}

/* Block i's bytes: 0 the header, then each array's blocks in order. */
static const uint8_t *arr_block(const iv_arraysfile_t *a, size_t i, size_t *n)
{
    const struct arr_head *h = a->map;
    uint64_t sz[3];
    arr_sizes(h, sz);
    const uint8_t *at[3] = {(const uint8_t *)a->major_ptr, (const uint8_t *)a->value_ptr,
                            (const uint8_t *)a->values};
    if (i == 0) {
        *n = sizeof *h;
        return a->map;
    }
    i--;
    for (int k = 0; k < 3; k++) {
        uint64_t nb = blocks_of(sz[k]);
        if (i < nb) {
            uint64_t off = (uint64_t)i * BLOCK;
            *n = (size_t)(sz[k] - off < BLOCK ? sz[k] - off : BLOCK);
            return at[k] + off;
        }
        i -= (size_t)nb;
    }
    *n = 0;
    return NULL;
}

int iv_arraysfile_check_block(const iv_arraysfile_t *a, size_t i)
{
    if (i >= a->n_blocks) return 0;
    size_t n;
    const uint8_t *p = arr_block(a, i, &n);
    uint64_t want;
    memcpy(&want, (const uint8_t *)a->map + a->len - 8 * (a->n_blocks - i), 8);
    if (i == 0) {
        /* The padding after values is zeros: no byte of the file unchecked. */
        const struct arr_head *h = a->map;
        uint64_t sz[3];
        arr_sizes(h, sz);
        const uint8_t *val = a->values;
        for (uint64_t j = sz[2]; j < pad8(sz[2]); j++)
            if (val[j] != 0) return 0;
    }
    return iv_file_sum(p, n) == want;
}

int iv_arraysfile_map(const char *path, const iv_indexfile_for_t *f, iv_arraysfile_t *a,
                      const char **why, iv_err_t *err)
{
    int rc = iv_arraysfile_open(path, f, a, why, err);
    if (rc != 1) return rc;
    for (size_t i = 0; i < a->n_blocks; i++)
        if (!iv_arraysfile_check_block(a, i)) {
            iv_arraysfile_unmap(a);
            if (why) *why = "damaged";
            return 0;
        }
    return 1;
}

void iv_arraysfile_unmap(iv_arraysfile_t *a)
{
    if (a->map) munmap(a->map, a->len);
    memset(a, 0, sizeof *a);
}

int iv_arraysfile_save(const char *path, const iv_indexfile_for_t *f, const int64_t *major_ptr,
                       const int64_t *value_ptr, const void *values, int value_dtype,
                       iv_err_t *err)
{
    struct arr_head h;
    arr_head_fill(&h, f);
    h.value_dtype = (uint32_t)value_dtype;
    h.value_size = value_dtype >= 0 && value_dtype < IV_DT_COUNT
                       ? iv_dtype_size((iv_dtype_t)value_dtype) : 0;
    h.n_major = f->n_major;
    h.n_unique = f->n_unique;
    h.nnz = f->nnz;
    uint64_t sz[3];
    if (!arr_sizes(&h, sz))
        return iv_fail(err, IV_EINVALID_ARG, "%s: arrays of these sizes cannot be kept", path);
    /* The sums where the arrays are, without a copy into one buffer (a
     * gigabyte at ten million cells). */
    size_t ns = (size_t)n_sums(sz);
    uint64_t *sums = malloc(ns * 8);
    if (!sums) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    sums[0] = iv_file_sum(&h, sizeof h);
    const uint8_t *at[3] = {(const uint8_t *)major_ptr, (const uint8_t *)value_ptr, values};
    size_t j = 1;
    for (int k = 0; k < 3; k++)
        for (uint64_t off = 0; off < sz[k]; off += BLOCK)
            sums[j++] = iv_file_sum(at[k] + off, (size_t)(sz[k] - off < BLOCK ? sz[k] - off : BLOCK));
    static const uint8_t zeros[8];
    iv_cachedir_part_t parts[] = {
        {&h, sizeof h}, {major_ptr, sz[0]}, {value_ptr, sz[1]}, {values, sz[2]},
        {zeros, pad8(sz[2]) - sz[2]}, {sums, ns * 8},
    };
    int rc = iv_cachedir_write(path, parts, sizeof parts / sizeof parts[0], err);
    free(sums);
    return rc;
}
