/*
 * X's Zarr chunks kept in the cache folder (see zarr_kept.h).
 */
#include "zarr_kept.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"
#include "clock.h"
#include "filecheck.h"
#include "h5write.h"
#include "zarr_cache.h"
#include "zarr_impl.h"

static const char MAGIC[8] = {'I', 'V', 'Z', 'A', 'R', 'X', 0, 1};
#define VERSION 1u

struct head {
    char magic[8];
    uint32_t version, store_format;
    int32_t level, csr, idx_size, val_dtype;
    int64_t chunk, nnz, n_major, n_minor, n_chunks;
    uint64_t ptr_sum;
    uint64_t sum;             /* iv_file_sum of the header (this field 0) mixed with the table's */
};

/* One part's place in the file. */
struct part {
    uint64_t off, len, sum;
};

struct iv_zarr_kept {
    iv_file_t *file;
    int64_t n_chunks;
    uint64_t bytes;
    struct part *table;       /* 2 a chunk: indices, values */
};

static int64_t n_chunks_of(const iv_zarr_kept_for_t *f)
{
    return (f->nnz + f->chunk - 1) / f->chunk;
}

static void head_fill(struct head *h, const iv_zarr_kept_for_t *f)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, sizeof MAGIC);
    h->version = VERSION;
    h->store_format = IV_ZARR_STORE_FORMAT;
    h->level = IV_ZARR_ZSTD_LEVEL;
    h->csr = f->csr;
    h->idx_size = f->idx_size;
    h->val_dtype = (int32_t)f->val_dtype;
    h->chunk = f->chunk;
    h->nnz = f->nnz;
    h->n_major = f->n_major;
    h->n_minor = f->n_minor;
    h->n_chunks = n_chunks_of(f);
    h->ptr_sum = f->ptr_sum;
}

static uint64_t sum_of(const struct head *h, const struct part *t, int64_t n_chunks)
{
    struct head z = *h;
    z.sum = 0;
    uint64_t a = iv_file_sum(&z, sizeof z), b = iv_file_sum(t, (size_t)n_chunks * 2 * sizeof *t);
    return a ^ (b * 0x9e3779b97f4a7c15ull);
}

/* A batch's parts are held until written in order (about 0.35 MB a
 * chunk of counts, both parts, in buffers of their bound: 0.5 MB); the
 * caller bounds the batch (sv->width) by its budget (iv_zarr_keep_bytes). */
#define BATCH IV_ZARR_SAVE_MAX

/* One batch of chunks made on the pool, each item its own parts and
 * outcome. */
typedef struct batch {
    iv_zarr_chunk_fn fill;
    void *ctx;
    int64_t k0;
    iv_buf_t parts[BATCH][2];
    int rc[BATCH];
    iv_err_t err[BATCH];
} batch_t;

static void batch_item(void *arg, size_t i)
{
    batch_t *b = arg;
    b->parts[i][0].len = b->parts[i][1].len = 0;
    iv_err_clear(&b->err[i]);
    b->rc[i] = b->fill(b->ctx, b->k0 + (int64_t)i, b->parts[i], &b->err[i]);
}

/* The parts in order after the header and table, then the two.  Chunks
 * are made a batch at a time on the pool (any thread: fill must allow
 * it) and written in order by this thread. */
static int save_body(int fd, const char *tmp, const iv_zarr_kept_for_t *f, const iv_zarr_save_t *sv,
                     iv_err_t *err)
{
    struct head h;
    head_fill(&h, f);
    struct part *t = calloc((size_t)h.n_chunks * 2 + 1, sizeof *t);
    batch_t *b = calloc(1, sizeof *b);
    if (!t || !b) {
        free(t);
        free(b);
        return iv_fail(err, IV_ENOMEM, "out of memory for a kept store's table");
    }
    b->fill = sv->fill;
    b->ctx = sv->ctx;
    uint64_t off = sizeof h + (uint64_t)h.n_chunks * 2 * sizeof *t;
    int rc = 0;
    size_t width = sv->width ? sv->width : sv->pool ? IV_ZARR_SAVE_WIDTH(iv_pool_threads(sv->pool)) : 1;
    if (width > BATCH) width = BATCH;
    size_t held = 0;
    for (int64_t k0 = 0; rc == 0 && k0 < h.n_chunks; k0 += (int64_t)width) {
        if (sv->stop && atomic_load(sv->stop)) {
            rc = iv_fail(err, IV_ECANCELLED, "%s: cancelled", tmp);
            break;
        }
        size_t n = (size_t)(h.n_chunks - k0 < (int64_t)width ? h.n_chunks - k0 : (int64_t)width);
        b->k0 = k0;
        iv_pool_parallel_for(sv->pool, n, 0, batch_item, b);
        size_t now = 0;
        for (size_t i = 0; i < BATCH; i++) now += b->parts[i][0].cap + b->parts[i][1].cap;
        if (now > held) held = now;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            if ((rc = b->rc[i]) != 0) {
                *err = b->err[i];
                break;
            }
            for (int p = 0; rc == 0 && p < 2; p++) {
                const iv_buf_t *pt = &b->parts[i][p];
                t[(k0 + (int64_t)i) * 2 + p] = (struct part){off, pt->len, iv_file_sum(pt->data, pt->len)};
                if (iv_cachedir_pwrite(fd, pt->data, pt->len, off) != 0)
                    rc = iv_fail(err, IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
                off += pt->len;
            }
        }
    }
    for (size_t i = 0; i < BATCH; i++) {
        iv_buf_free(&b->parts[i][0]);
        iv_buf_free(&b->parts[i][1]);
    }
    free(b);
    if (sv->held) *sv->held = held;
    if (rc == 0) {
        h.sum = sum_of(&h, t, h.n_chunks);
        if (iv_cachedir_pwrite(fd, &h, sizeof h, 0) != 0 ||
            iv_cachedir_pwrite(fd, t, (size_t)h.n_chunks * 2 * sizeof *t, sizeof h) != 0)
            rc = iv_fail(err, IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    free(t);
    return rc;
}

int iv_zarr_kept_save(const char *path, const iv_zarr_kept_for_t *f, const iv_zarr_save_t *sv, iv_err_t *err)
{
    IV_RETURN_IF(f->chunk <= 0 || f->nnz < 0, err, IV_EINVALID_ARG, "a kept store needs a chunk size");
    char tmp[4200];
    IV_TRY(iv_cachedir_temp(path, tmp, sizeof tmp, err));
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return iv_fail(err, IV_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = save_body(fd, tmp, f, sv, err);
    if (close(fd) != 0 && rc == 0) rc = iv_fail(err, IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = iv_fail(err, IV_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
    if (rc != 0) unlink(tmp);
    return rc;
}

/* 1 when h is the header of the store f (its sum checked by the caller),
 * else 0 with *why. */
static int head_matches(const struct head *h, const iv_zarr_kept_for_t *f, const char **why)
{
    struct head want;
    head_fill(&want, f);
    if (memcmp(h->magic, MAGIC, sizeof MAGIC) || h->version != VERSION || h->store_format != want.store_format ||
        h->level != want.level) {
        *why = "another format";
        return 0;
    }
    if (h->csr != want.csr || h->idx_size != want.idx_size || h->val_dtype != want.val_dtype ||
        h->chunk != want.chunk || h->nnz != want.nnz || h->n_major != want.n_major ||
        h->n_minor != want.n_minor || h->n_chunks != want.n_chunks || h->ptr_sum != want.ptr_sum) {
        *why = "made for another matrix";
        return 0;
    }
    return 1;
}

/* Whether the parts, in order, fill the file from data_off to its end:
 * 1 yes, -1 when a part runs past the end (cut short), 0 when bytes
 * follow the last part. */
static int table_fits(const struct part *t, int64_t n_chunks, uint64_t data_off, uint64_t size)
{
    uint64_t at = data_off;
    for (int64_t i = 0; i < n_chunks * 2; i++) {
        if (t[i].off != at) return 0;
        if (t[i].len > size - at) return -1;
        at += t[i].len;
    }
    return at == size;
}

static int open_checked(iv_file_t *file, const iv_zarr_kept_for_t *f, iv_zarr_kept_t *k, const char **why,
                        iv_err_t *err)
{
    uint64_t size = iv_file_loaded_id(file)->size;
    struct head h;
    if (size < sizeof h) {
        *why = "truncated";
        return 0;
    }
    if (iv_file_read(file, 0, &h, sizeof h, "the header", err) != 0) return err->code;
    if (!head_matches(&h, f, why)) return 0;
    uint64_t table_bytes = (uint64_t)h.n_chunks * 2 * sizeof(struct part);
    if (size - sizeof h < table_bytes) {
        *why = "truncated";
        return 0;
    }
    k->table = malloc((size_t)table_bytes + 1);
    if (!k->table) return iv_fail(err, IV_ENOMEM, "out of memory for a kept store's table");
    if (iv_file_read(file, sizeof h, k->table, (size_t)table_bytes, "the table", err) != 0) return err->code;
    if (sum_of(&h, k->table, h.n_chunks) != h.sum) {
        *why = "damaged";
        return 0;
    }
    int fits = table_fits(k->table, h.n_chunks, sizeof h + table_bytes, size);
    if (fits != 1) {
        *why = fits < 0 ? "truncated" : "damaged";
        return 0;
    }
    k->n_chunks = h.n_chunks;
    k->bytes = size;
    return 1;
}

int iv_zarr_kept_open(const char *path, const iv_zarr_kept_for_t *f, iv_zarr_kept_t **out,
                      const char **why, iv_err_t *err)
{
    const char *w = NULL;
    *out = NULL;
    iv_zarr_kept_t *k = calloc(1, sizeof *k);
    if (!k) return iv_fail(err, IV_ENOMEM, "out of memory for a kept store");
    iv_err_t e;
    iv_err_clear(&e);
    int rc = iv_file_open(path, &k->file, &e);
    if (rc != 0) {
        w = "none kept";
        rc = 0;
    } else {
        rc = open_checked(k->file, f, k, &w, err);
    }
    if (why) *why = w;
    if (rc == 1) *out = k;
    else iv_zarr_kept_close(k);
    /* A file read short while it was checked is one that is not the store. */
    if (rc == IV_EFILE_CHANGED) {
        if (why) *why = "truncated";
        rc = 0;
    }
    return rc;
}

void iv_zarr_kept_close(iv_zarr_kept_t *k)
{
    if (!k) return;
    if (k->file) iv_file_close(k->file);
    free(k->table);
    free(k);
}

int iv_zarr_kept_read(iv_zarr_kept_t *k, int64_t chunk, int part, iv_buf_t *out, iv_err_t *err)
{
    IV_RETURN_IF(chunk < 0 || chunk >= k->n_chunks || part < 0 || part > 1, err, IV_ENOT_FOUND,
                 "no chunk %lld in the kept store", (long long)chunk);
    const struct part *p = &k->table[chunk * 2 + part];
    if (iv_buf_reserve(out, (size_t)p->len + 1) != 0)
        return iv_fail(err, IV_ENOMEM, "out of memory for a chunk");
    uint8_t *dst = (uint8_t *)out->data + out->len;
    char what[64];
    snprintf(what, sizeof what, "chunk %lld's %s", (long long)chunk, part ? "values" : "indices");
    IV_TRY(iv_file_read(k->file, p->off, dst, (size_t)p->len, what, err));
    if (iv_file_sum(dst, (size_t)p->len) != p->sum)
        return iv_fail(err, IV_ECORRUPT, "%s: %s fail their checksum", iv_file_path(k->file), what);
    out->len += (size_t)p->len;
    return 0;
}

uint64_t iv_zarr_kept_bytes(const iv_zarr_kept_t *k)
{
    return k->bytes;
}

const char *iv_zarr_kept_path(const iv_zarr_kept_t *k)
{
    return iv_file_path(k->file);
}

/* ---- X of a dataset, kept ---------------------------------------------------- */

typedef struct keep_fill {
    const iv_zarr_src_t *src;
    iv_dataset_t *md;
    int csr;
    int64_t C;
} keep_fill_t;

/* iv_zarr_chunk_fn: a chunk as the store computes it. */
static int keep_chunk(void *ctx, int64_t k, iv_buf_t parts[2], iv_err_t *err)
{
    const keep_fill_t *f = ctx;
    return zarr_x_parts(f->src, f->src->ds, f->md, f->csr, f->C, k, parts, err);
}

/* One orientation: taken when kept, written otherwise, then given to the
 * store's cache.  Its outcome in note; at set to the file in use. */
static void keep_one(const iv_zarr_src_t *src, int csr, const iv_zarr_keep_in_t *in, char *note, size_t n,
                     char *at, size_t at_cap, size_t *held)
{
    const char *name = csr ? "csr" : "csc";
    iv_dataset_t *md = NULL;
    iv_err_t e;
    iv_err_clear(&e);
    at[0] = '\0';
    if (zarr_x_orient(src->ds, csr, &md, &e) != 0) {
        snprintf(note, n, "%s: none (%.200s)", name, e.msg);
        return;
    }
    const iv_dataset_info_t *info = iv_dataset_info(src->ds);
    int64_t n_major = csr ? info->n_rows : info->n_cols, n_minor = csr ? info->n_cols : info->n_rows;
    iv_zarr_kept_for_t f = {
        .csr = csr, .chunk = zarr_x_chunk(src), .nnz = info->nnz, .n_major = n_major, .n_minor = n_minor,
        .idx_size = n_minor <= INT32_MAX ? 4 : 8, .val_dtype = info->value_dtype,
        .ptr_sum = zarr_x_ptr_sum(md, n_major),
    };
    char key[IV_CACHEDIR_KEY_LEN], path[4096];
    if (!f.ptr_sum) {
        snprintf(note, n, "%s: not kept (out of memory)", name);
        return;
    }
    if (iv_cachedir_key(in->path, key, &e) != 0 ||
        iv_cachedir_path(in->dir, in->path, key, csr ? "X.zarr-csr" : "X.zarr-csc", path, sizeof path, &e) != 0) {
        snprintf(note, n, "%s: not kept (%.200s)", name, e.msg);
        return;
    }
    double t0 = iv_now_s();
    iv_zarr_kept_t *k = NULL;
    const char *why = NULL;
    int rc = iv_zarr_kept_open(path, &f, &k, &why, &e);
    int written = 0;
    if (rc == 0) {
        keep_fill_t kf = {src, md, csr, f.chunk};
        iv_zarr_save_t sv = {.fill = keep_chunk, .ctx = &kf, .pool = in->pool, .stop = in->stop,
                             .width = in->width, .held = held};
        rc = iv_cachedir_prepare(in->dir, &e);
        if (rc == 0) rc = iv_cachedir_note(path, in->path, key, &e);
        if (rc == 0) rc = iv_zarr_kept_save(path, &f, &sv, &e);
        if (rc == 0 && (rc = iv_zarr_kept_open(path, &f, &k, &why, &e)) == 0)
            rc = iv_fail(&e, IV_EIO, "%s was written but is not taken (%s)", path, why);
        written = 1;
    } else if (rc == 1) {
        iv_cachedir_touch(path);
    }
    if (rc < 0) {
        snprintf(note, n, "%s: failed (%.300s)", name, e.msg);
        return;
    }
    if (iv_zarr_cache_keep(src->cache, src->ds, csr, f.chunk, k) != 0) {
        snprintf(note, n, "%s: not served (no store state)", name);
        iv_zarr_kept_close(k);
        return;
    }
    snprintf(note, n, "%s: %s (%llu bytes, %.2f s)", name, written ? "written" : "kept",
             (unsigned long long)iv_zarr_kept_bytes(k), iv_now_s() - t0);
    snprintf(at, at_cap, "%s", path);
}

void iv_zarr_keep_x(const iv_zarr_src_t *src, const iv_zarr_keep_in_t *in, iv_zarr_keep_out_t *out)
{
    memset(out, 0, sizeof *out);
    /* Cell-major first: it is there at load; the gene-major one may be
     * the copy built after. */
    for (int i = 0; i < 2; i++) {
        int csr = i == 0;
        size_t held = 0;
        keep_one(src, csr, in, out->note[csr], sizeof out->note[csr], out->path[csr], sizeof out->path[csr],
                 &held);
        if (held > out->held) out->held = held;
    }
}

/* The capacity iv_buf_reserve gives an empty buffer for n bytes. */
static size_t buf_cap(size_t n)
{
    size_t cap = 256;
    while (cap < n) cap *= 2;
    return cap;
}

size_t iv_zarr_keep_bytes(const iv_zarr_src_t *src, size_t threads, size_t width)
{
    const iv_dataset_info_t *info = iv_dataset_info(src->ds);
    int64_t C = zarr_x_chunk(src);
    size_t n_chunks = (size_t)((info->nnz + C - 1) / C);
    /* The larger of the two orientations: its pointers, its indices' width. */
    int64_t larger = info->n_rows > info->n_cols ? info->n_rows : info->n_cols;
    size_t idx = (size_t)C * (larger <= INT32_MAX ? 4 : 8), val = (size_t)C * iv_dtype_size(info->value_dtype);
    const iv_h5w_codec_t z = {IV_H5W_ZSTD, IV_ZARR_ZSTD_LEVEL};
    size_t part = IV_ZARR_ZSTD_LEVEL > 0 ? buf_cap(iv_h5w_bound(&z, idx)) + buf_cap(iv_h5w_bound(&z, val))
                                         : buf_cap(idx) + buf_cap(val);
    size_t raw = idx + val, ctx = IV_ZARR_ZSTD_LEVEL > 0 ? iv_h5w_ctx_bytes(&z, idx) : 0;
    if (width == 0) width = 1;
    if (width > IV_ZARR_SAVE_MAX) width = IV_ZARR_SAVE_MAX;
    if (width > n_chunks && n_chunks > 0) width = n_chunks;
    size_t makers = width < threads + 1 ? width : threads + 1;
    /* X/indptr's int64 copy is summed and freed before the write, which
     * holds the table and the batch. */
    size_t write = n_chunks * 2 * sizeof(struct part) + sizeof(batch_t) + width * part + makers * (raw + ctx);
    size_t ptrs = ((size_t)larger + 1) * sizeof(int64_t);
    return write > ptrs ? write : ptrs;
}
