/*
 * libFuzzer target: the chunk-index walk (core/h5/h5chunks.c) on arbitrary
 * bytes.  The input is a 16-byte head, then "the file": the relative
 * address of the dataset's object header (u64), the chunk length in
 * elements (u16, 1-65535) and the chunk count (u16) the caller would
 * expect, all little-endian; the walk reads the file through a callback
 * over an exact-size copy, so any read past its end is the sanitizer's
 * finding (and a cycle in the tree, a hang or a stack overflow).
 * Whatever the bytes, the walk must return 0, 1 or an error with its
 * message, and in a filled table an absent chunk has no size.  (The
 * chunks' own bounds are the loader's check, after the walk.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "h5chunks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct mem {
    const uint8_t *p;
    size_t n;
};

static int mem_read(void *ctx, uint64_t off, void *buf, size_t len, iv_err_t *err)
{
    const struct mem *m = ctx;
    if (off > m->n || len > m->n - off) return iv_fail(err, IV_EBAD_FILE, "short read");
    memcpy(buf, m->p + off, len);
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 16) return 0;
    uint64_t header = le(data, 8);
    uint64_t chunk_len = le(data + 8, 2), n_chunks = le(data + 10, 2);
    size_t n = size - 16;
    uint8_t *file = malloc(n ? n : 1);
    if (!file) return 0;
    memcpy(file, data + 16, n);
    struct mem m = {file, n};
    size_t nc = n_chunks ? n_chunks : 1;
    uint64_t *addr = malloc(nc * sizeof *addr), *sz = malloc(nc * sizeof *sz);
    uint32_t *mask = malloc(nc * sizeof *mask);
    iv_err_t err = {0};
    if (addr && sz && mask) {
        int rc = iv_h5_chunk_walk(mem_read, &m, n, 0, header, chunk_len, 1, n_chunks, addr, sz,
                                  mask, "fuzz", &err);
        if (rc != 0 && rc != 1 && rc >= 0) abort();
        if (rc < 0 && err.msg[0] == '\0') abort();
        for (uint64_t c = 0; rc == 1 && c < n_chunks; c++)
            if (addr[c] == UINT64_MAX && sz[c] != 0) abort();
    }
    free(addr);
    free(sz);
    free(mask);
    free(file);
    return 0;
}
