/*
 * The chunk table from the version 1 B-tree (see h5chunks.h).
 *
 * Three steps, each on bytes read with iv_file_read and checked before
 * use: the dataset's object header (version 1, or version 2 with its
 * "OHDR"/"OCHK" blocks) is walked message by message, following
 * continuation messages, to its data layout message; a version 3 layout
 * of class "chunked" gives the B-tree's address and the chunk shape;
 * the tree is then walked from its root, every node a "TREE" of type 1
 * (raw data chunks) one level below its parent, and each leaf key gives a
 * chunk's offset, stored size and filter mask next to its address.
 * Field layouts follow the HDF5 file format specification, version 3.
 */
#include "h5chunks.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

enum {
    MSG_CONTINUATION = 0x10,
    MSG_LAYOUT = 0x08,
    MAX_BLOCKS = 256,         /* header blocks followed (continuations) */
    MAX_LEVELS = 64,
    MAX_ENTRIES = 65536,      /* entries of one node (2 x the largest K HDF5 allows) */
};

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

typedef struct reader {
    iv_h5_read_fn read;
    void *ctx;
    uint64_t file_len, base;
    const char *where;
} reader_t;

/* Reads len bytes at the relative address a into a new buffer. */
static int fetch(const reader_t *r, uint64_t a, size_t len, uint8_t **out, iv_err_t *err)
{
    *out = NULL;
    if (a > r->file_len || r->base > r->file_len - a || len > r->file_len - a - r->base)
        return FAILF(IV_EBAD_FILE, "%s: chunk index: %zu bytes at address %" PRIu64
                     " lie past the end of the file", r->where, len, a);
    uint8_t *b = malloc(len ? len : 1);
    if (!b) return FAILF(IV_ENOMEM, "%s: out of memory for the chunk index", r->where);
    int rc = r->read(r->ctx, r->base + a, b, len, err);
    if (rc < 0) {
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}

typedef struct layout {
    int found;                /* a layout message was seen */
    int usable;               /* version 3, chunked, 1-D */
    uint64_t btree;
    uint64_t chunk_dims[2];
} layout_t;

static void read_layout(const uint8_t *m, size_t n, layout_t *lo)
{
    lo->found = 1;
    /* version 3, class 2: dimensionality, B-tree address, dimension sizes */
    if (n < 2 + 1 + 8 || m[0] != 3 || m[1] != 2) return;
    int nd = m[2];
    if (nd != 2 || n < 3 + 8 + 4 * (size_t)nd) return;
    lo->btree = le(m + 3, 8);
    lo->chunk_dims[0] = le(m + 11, 4);
    lo->chunk_dims[1] = le(m + 15, 4);
    lo->usable = 1;
}

/*
 * Walks the messages of one header block; continuation blocks found are
 * appended to blocks[].  v2: block holds messages only (signature and
 * checksum already cut off by the caller).
 */
static int walk_block(const reader_t *r, const uint8_t *b, size_t n, int v2, int creation_order,
                      uint64_t (*blocks)[2], int *n_blocks, layout_t *lo, iv_err_t *err)
{
    size_t p = 0, head = v2 ? (creation_order ? 6 : 4) : 8;
    while (p + head <= n) {
        uint64_t type = v2 ? b[p] : le(b + p, 2);
        size_t size = (size_t)le(b + p + (v2 ? 1 : 2), 2);
        const uint8_t *m = b + p + head;
        if (size > n - p - head) {
            if (v2) break; /* the gap before the checksum */
            return FAILF(IV_EBAD_FILE, "%s: object header message of %zu bytes overruns its block",
                         r->where, size);
        }
        if (type == MSG_CONTINUATION) {
            if (size < 16) return FAILF(IV_EBAD_FILE, "%s: short continuation message", r->where);
            if (*n_blocks >= MAX_BLOCKS)
                return FAILF(IV_EBAD_FILE, "%s: object header of over %d blocks", r->where,
                             MAX_BLOCKS);
            blocks[*n_blocks][0] = le(m, 8);
            blocks[*n_blocks][1] = le(m + 8, 8);
            (*n_blocks)++;
        } else if (type == MSG_LAYOUT && !lo->found) {
            read_layout(m, size, lo);
        }
        p += head + size;
    }
    return 0;
}

/* The messages of a v2 header block (*msgs, *n): without its checksum,
 * and for a continuation without its "OCHK" signature. */
static int v2_messages(const reader_t *r, int continuation, const uint8_t **msgs, size_t *n,
                       iv_err_t *err)
{
    if (continuation) {
        if (*n < 8 || memcmp(*msgs, "OCHK", 4) != 0)
            return FAILF(IV_EBAD_FILE, "%s: object header continuation without its "
                         "signature", r->where);
        *msgs += 4;
        *n -= 4;
    }
    if (*n < 4) return FAILF(IV_EBAD_FILE, "%s: object header block too short", r->where);
    *n -= 4;
    return 0;
}

/* Finds the layout message of the object header at address a. */
static int find_layout(const reader_t *r, uint64_t a, layout_t *lo, iv_err_t *err)
{
    uint8_t *h = NULL;
    uint64_t blocks[MAX_BLOCKS][2];
    int n_blocks = 0, v2, co = 0, rc;
    IV_TRY(fetch(r, a, 16, &h, err));
    if (h[0] == 1) {
        v2 = 0;
        blocks[n_blocks][0] = a + 16;
        blocks[n_blocks][1] = le(h + 8, 4);
        n_blocks++;
    } else if (memcmp(h, "OHDR", 4) == 0 && h[4] == 2) {
        v2 = 1;
        int flags = h[5];
        co = (flags & 0x04) != 0;
        size_t off = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
        int szb = 1 << (flags & 3);
        free(h);
        IV_TRY(fetch(r, a, off + (size_t)szb, &h, err));
        blocks[n_blocks][0] = a + off + (uint64_t)szb;
        blocks[n_blocks][1] = le(h + off, szb) + 4; /* the checksum after the messages */
        n_blocks++;
    } else {
        free(h);
        return 0; /* not a header this reads: the caller asks HDF5 */
    }
    free(h);
    for (int k = 0; k < n_blocks && !lo->found; k++) {
        uint64_t ba = blocks[k][0], bn = blocks[k][1];
        if (bn > ((uint64_t)1 << 24))
            return FAILF(IV_EBAD_FILE, "%s: object header block of %" PRIu64 " bytes", r->where, bn);
        uint8_t *b;
        IV_TRY(fetch(r, ba, (size_t)bn, &b, err));
        const uint8_t *msgs = b;
        size_t n = (size_t)bn;
        rc = v2 ? v2_messages(r, k > 0, &msgs, &n, err) : 0;
        if (rc == 0) rc = walk_block(r, msgs, n, v2, co, blocks, &n_blocks, lo, err);
        free(b);
        if (rc < 0) return rc;
    }
    return 0;
}

typedef struct walk {
    const reader_t *r;
    uint64_t chunk_len, n_chunks;
    uint64_t *addr, *size;
    uint32_t *mask;
    uint64_t nodes, max_nodes;
} walk_t;

/* A leaf entry (key k: stored bytes, filter mask, offset) of the chunk
 * stored at address child, into the table. */
static int take_leaf_entry(walk_t *w, const uint8_t *k, uint64_t child, iv_err_t *err)
{
    const reader_t *r = w->r;
    uint64_t stored = le(k, 4), off = le(k + 8, 8), c = off / w->chunk_len;
    if (off % w->chunk_len != 0 || le(k + 16, 8) != 0)
        return FAILF(IV_EBAD_FILE, "%s: chunk index: a chunk at element %" PRIu64
                     " is not on a chunk boundary", r->where, off);
    /* Past the extent (never read), or no bytes: not written. */
    if (c >= w->n_chunks || stored == 0) return 0;
    if (w->addr[c] != UINT64_MAX)
        return FAILF(IV_EBAD_FILE, "%s: chunk index lists chunk %" PRIu64 " twice", r->where, c);
    if (child >= r->file_len)
        return FAILF(IV_EBAD_FILE, "%s: chunk index: chunk %" PRIu64 " is stored at %" PRIu64
                     ", past the end of the file", r->where, c, child);
    w->addr[c] = child + r->base;
    w->size[c] = stored;
    w->mask[c] = (uint32_t)le(k + 4, 4);
    return 0;
}

static int walk_node(walk_t *w, uint64_t a, int level, iv_err_t *err)
{
    const reader_t *r = w->r;
    if (++w->nodes > w->max_nodes)
        return FAILF(IV_EBAD_FILE, "%s: chunk index: more B-tree nodes than chunks (a loop?)",
                     r->where);
    uint8_t *h;
    IV_TRY(fetch(r, a, 24, &h, err));
    int ok = memcmp(h, "TREE", 4) == 0 && h[4] == 1 && (level < 0 || h[5] == level);
    int lv = h[5];
    uint64_t n = le(h + 6, 2);
    free(h);
    if (!ok || lv >= MAX_LEVELS || n > MAX_ENTRIES)
        return FAILF(IV_EBAD_FILE, "%s: chunk index: B-tree node at %" PRIu64 " is damaged",
                     r->where, a);
    const size_t key = 4 + 4 + 8 * 2;
    size_t len = 24 + (size_t)(n + 1) * key + (size_t)n * 8;
    uint8_t *b;
    IV_TRY(fetch(r, a, len, &b, err));
    int rc = 0;
    for (uint64_t i = 0; i < n && rc == 0; i++) {
        const uint8_t *k = b + 24 + i * (key + 8);
        uint64_t child = le(k + key, 8);
        if (lv > 0) rc = walk_node(w, child, lv - 1, err);
        else rc = take_leaf_entry(w, k, child, err);
    }
    free(b);
    return rc;
}

int iv_h5_chunk_walk(iv_h5_read_fn read, void *ctx, uint64_t file_len, uint64_t base,
                     uint64_t header, uint64_t chunk_len, size_t elem_size, uint64_t n_chunks,
                     uint64_t *addr, uint64_t *size, uint32_t *mask, const char *where,
                     iv_err_t *err)
{
    reader_t r = {read, ctx, file_len, base, where};
    if (chunk_len == 0) return 0;
    layout_t lo = {0};
    IV_TRY(find_layout(&r, header, &lo, err));
    if (!lo.usable || lo.chunk_dims[0] != chunk_len || lo.chunk_dims[1] != elem_size) return 0;
    for (uint64_t c = 0; c < n_chunks; c++) {
        addr[c] = UINT64_MAX;
        size[c] = 0;
        mask[c] = 0;
    }
    if (lo.btree == UINT64_MAX) return 1; /* nothing written yet */
    walk_t w = {&r, chunk_len, n_chunks, addr, size, mask, 0, 2 * n_chunks + MAX_LEVELS};
    IV_TRY(walk_node(&w, lo.btree, -1, err));
    return 1;
}

static int file_read(void *ctx, uint64_t off, void *buf, size_t len, iv_err_t *err)
{
    return iv_file_read(ctx, off, buf, len, "the chunk index", err);
}

/* Whether d's file stores 8-byte offsets and lengths, the only ones
 * the walk reads. */
static int sizes_are_8(hid_t d)
{
    hid_t file = H5Iget_file_id(d), fcpl = file >= 0 ? H5Fget_create_plist(file) : -1;
    size_t so = 0, sl = 0;
    if (fcpl >= 0) H5Pget_sizes(fcpl, &so, &sl);
    if (fcpl >= 0) H5Pclose(fcpl);
    if (file >= 0) H5Fclose(file);
    return so == 8 && sl == 8;
}

/* Holds the table's entry for chunk c against HDF5's own answer. */
static int check_probe(hid_t d, uint64_t base, uint64_t chunk_len, uint64_t c,
                       const uint64_t *addr, const uint64_t *size, const uint32_t *mask,
                       const char *where, iv_err_t *err)
{
    hsize_t off[1] = {c * chunk_len}, sz = 0;
    haddr_t a = HADDR_UNDEF;
    unsigned mk = 0;
    if (H5Dget_chunk_info_by_coord(d, off, &mk, &a, &sz) < 0) return 0;
    uint64_t want = a == HADDR_UNDEF || sz == 0 ? UINT64_MAX : (uint64_t)a + base;
    if (want != addr[c] || (want != UINT64_MAX && (sz != size[c] || mk != mask[c])))
        return FAILF(IV_EBAD_FILE, "%s: chunk index: chunk %" PRIu64 " is at %" PRIu64
                     " in the B-tree and at %" PRIu64 " for HDF5", where, c, addr[c], want);
    return 0;
}

int iv_h5_chunk_table(hid_t d, iv_file_t *f, uint64_t file_len, uint64_t base,
                      uint64_t chunk_len, size_t elem_size, uint64_t n_chunks, uint64_t *addr,
                      uint64_t *size, uint32_t *mask, const char *where, iv_err_t *err)
{
    H5O_info_t oi;
    if (!sizes_are_8(d)) return 0;
    if (H5Oget_info2(d, &oi, H5O_INFO_BASIC) < 0 || oi.addr == HADDR_UNDEF) return 0;
    int rc = iv_h5_chunk_walk(file_read, f, file_len, base, (uint64_t)oi.addr, chunk_len,
                              elem_size, n_chunks, addr, size, mask, where, err);
    if (rc <= 0) return rc;
    /* Held against HDF5's own answer for the first and the last chunk. */
    uint64_t probe[2] = {0, n_chunks ? n_chunks - 1 : 0};
    for (int i = 0; i < (n_chunks > 1 ? 2 : (int)n_chunks); i++)
        IV_TRY(check_probe(d, base, chunk_len, probe[i], addr, size, mask, where, err));
    return 1;
}
