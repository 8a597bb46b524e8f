/*
 * libFuzzer target: the reader of X's Zarr chunks kept in the cache
 * folder (api/zarr_kept.c), against files written by its own writer and
 * then damaged.
 *
 * Input: 4 bytes (chunk count 0..15, damage kind, damage position's two
 * bytes), then the parts' bytes: each of the 2 x n parts takes a length
 * byte (0..63) and that many bytes (short input: the rest are empty).
 * The store is written with iv_zarr_kept_save, then damaged:
 *   0: not at all; 1: one byte flipped; 2: cut at a position; 3: a byte
 *   appended; 4: one byte flipped in the last 8 (the last part, or the
 *   table when the parts are empty).
 * Then the file is opened and every part read.  Checks (abort otherwise):
 *   - undamaged: it opens and every part reads back as written;
 *   - a flipped byte: it does not open, or exactly the part holding the
 *     byte fails its read (IV_ECORRUPT) and every other reads as written;
 *   - cut short or grown: it does not open;
 *   - nothing reads or writes out of bounds or leaks (the sanitizers).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zarr_kept.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_CHUNKS 15

typedef struct parts {
    const uint8_t *p[MAX_CHUNKS * 2];
    size_t n[MAX_CHUNKS * 2];
} parts_t;

static int fill(void *ctx, int64_t k, iv_buf_t out[2], iv_err_t *err)
{
    const parts_t *ps = ctx;
    for (int i = 0; i < 2; i++) {
        iv_buf_append(&out[i], ps->p[k * 2 + i], ps->n[k * 2 + i]);
        if (out[i].oom) return iv_fail(err, IV_ENOMEM, "oom");
    }
    return 0;
}

static void damage(const char *path, int kind, unsigned at)
{
    struct stat st;
    if (stat(path, &st) != 0) abort();
    long size = (long)st.st_size;
    FILE *fp = fopen(path, "r+b");
    if (!fp) abort();
    if (kind == 1 || kind == 4) {
        long off = kind == 1 ? (long)(at % (unsigned)size) : size - 1 - (long)(at % 8u);
        if (off < 0) off = 0;
        fseek(fp, off, SEEK_SET);
        int c = fgetc(fp);
        fseek(fp, off, SEEK_SET);
        fputc(c ^ (1 << (at % 8u)), fp);
    } else if (kind == 3) {
        fseek(fp, 0, SEEK_END);
        fputc(0, fp);
    }
    fclose(fp);
    if (kind == 2 && truncate(path, (off_t)(at % (unsigned)size)) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    int64_t n = data[0] % (MAX_CHUNKS + 1);
    int kind = data[1] % 5;
    unsigned at = (unsigned)data[2] << 8 | data[3];
    const uint8_t *p = data + 4, *end = data + size;
    parts_t ps;
    memset(&ps, 0, sizeof ps);
    for (int64_t i = 0; i < n * 2 && p < end; i++) {
        size_t len = *p++ % 64u;
        if (len > (size_t)(end - p)) len = (size_t)(end - p);
        ps.p[i] = p;
        ps.n[i] = len;
        p += len;
    }
    iv_zarr_kept_for_t f = {.csr = 1, .chunk = 7, .nnz = n * 7, .n_major = 3, .n_minor = 5,
                            .idx_size = 4, .val_dtype = IV_DT_FLOAT32, .ptr_sum = 42};
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_zarr_kept_%ld", (long)getpid());
    iv_err_t err = {0};
    iv_zarr_save_t sv = {.fill = fill, .ctx = &ps};
    if (iv_zarr_kept_save(path, &f, &sv, &err) != 0) abort();
    if (kind) damage(path, kind, at);
    iv_zarr_kept_t *k = NULL;
    const char *why = NULL;
    int rc = iv_zarr_kept_open(path, &f, &k, &why, &err);
    if (rc < 0) abort();
    if (rc == 0 && (kind == 0 || !why)) abort();
    if (rc == 1 && (kind == 2 || kind == 3)) abort();
    int failed = 0;
    iv_buf_t b;
    iv_buf_init(&b);
    for (int64_t i = 0; rc == 1 && i < n * 2; i++) {
        b.len = 0;
        iv_err_clear(&err);
        int r = iv_zarr_kept_read(k, i / 2, (int)(i % 2), &b, &err);
        if (r == 0) {
            if (b.len != ps.n[i] || (b.len && memcmp(b.data, ps.p[i], b.len) != 0)) abort();
        } else {
            if (r != IV_ECORRUPT || b.len != 0 || kind == 0) abort();
            failed++;
        }
    }
    /* A flipped byte that the open took lies in exactly one part. */
    if (rc == 1 && (kind == 1 || kind == 4) && failed != 1) abort();
    iv_buf_free(&b);
    iv_zarr_kept_close(k);
    unlink(path);
    return 0;
}
