/* .npz writer (see npz.h).  CRC-32 comes from zlib. */
#include "npz.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

struct entry {
    char name[64];
    uint64_t offset, size;
    uint32_t crc;
};

struct iv_npz {
    FILE *f;
    uint64_t pos;
    struct entry *e;
    size_t n, cap;
    int failed;
};

static void put(iv_npz_t *z, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, z->f) != n) z->failed = 1;
    z->pos += n;
}

static void put16(iv_npz_t *z, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(z, b, 2);
}

static void put32(iv_npz_t *z, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(z, b, 4);
}

static void put64(iv_npz_t *z, uint64_t v)
{
    put32(z, (uint32_t)v);
    put32(z, (uint32_t)(v >> 32));
}

iv_npz_t *iv_npz_begin(FILE *f)
{
    iv_npz_t *z = calloc(1, sizeof *z);
    if (z) z->f = f;
    return z;
}

/* Builds the .npy header for descr/shape; returns its length. */
static size_t npy_header(char *out, size_t cap, const char *descr, int ndim, const int64_t *shape)
{
    char dict[256], shp[96];
    if (ndim == 0) snprintf(shp, sizeof shp, "()");
    else if (ndim == 1) snprintf(shp, sizeof shp, "(%" PRId64 ",)", shape[0]);
    else snprintf(shp, sizeof shp, "(%" PRId64 ", %" PRId64 ")", shape[0], shape[1]);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shp);
    /* magic(6) + version(2) + len(2) + dict + padding + '\n', a multiple of 64. */
    size_t total = 10 + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    if (padded > cap) return 0;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    uint16_t hl = (uint16_t)(padded - 10);
    out[8] = (char)(hl & 0xff);
    out[9] = (char)(hl >> 8);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', padded - total);
    out[padded - 1] = '\n';
    return padded;
}

/* The CRC-32 of the header and the pieces (zlib takes at most 4 GiB a
 * call, so pieces go in steps of 1 GiB); *size their length. */
static uint32_t member_crc(const char *hdr, size_t hl, size_t n_pieces, const void *const *pieces,
                           const size_t *lens, uint64_t *size)
{
    uLong crc = crc32(0L, (const Bytef *)hdr, (uInt)hl);
    *size = hl;
    for (size_t i = 0; i < n_pieces; i++) {
        *size += lens[i];
        const unsigned char *p = pieces[i];
        size_t left = lens[i];
        while (left) {
            uInt step = left > (1u << 30) ? (1u << 30) : (uInt)left;
            crc = crc32(crc, p, step);
            p += step;
            left -= step;
        }
    }
    return (uint32_t)crc;
}

/* The local file header of member e, with the zip64 extra field when it
 * is 4 GiB or more. */
static void put_local_header(iv_npz_t *z, const struct entry *e)
{
    int big = e->size >= 0xffffffffu;
    uint16_t nl = (uint16_t)strlen(e->name);
    put32(z, 0x04034b50);
    put16(z, big ? 45 : 20);      /* version needed */
    put16(z, 0);                  /* flags */
    put16(z, 0);                  /* stored */
    put16(z, 0);                  /* time */
    put16(z, 0x21);               /* date: 1980-01-01 */
    put32(z, e->crc);
    put32(z, big ? 0xffffffffu : (uint32_t)e->size);
    put32(z, big ? 0xffffffffu : (uint32_t)e->size);
    put16(z, nl);
    put16(z, big ? 20 : 0);
    put(z, e->name, nl);
    if (big) {
        put16(z, 0x0001);
        put16(z, 16);
        put64(z, e->size);
        put64(z, e->size);
    }
}

int iv_npz_add(iv_npz_t *z, const char *name, const char *descr, int ndim, const int64_t *shape,
               size_t n_pieces, const void *const *pieces, const size_t *lens)
{
    char hdr[512];
    size_t hl = npy_header(hdr, sizeof hdr, descr, ndim, shape);
    if (hl == 0) return -1;
    uint64_t size;
    uint32_t crc = member_crc(hdr, hl, n_pieces, pieces, lens, &size);
    if (z->n == z->cap) {
        size_t cap = z->cap ? z->cap * 2 : 8;
        struct entry *e = realloc(z->e, cap * sizeof *e);
        if (!e) return -1;
        z->e = e;
        z->cap = cap;
    }
    struct entry *e = &z->e[z->n++];
    snprintf(e->name, sizeof e->name, "%s.npy", name);
    e->offset = z->pos;
    e->size = size;
    e->crc = crc;
    put_local_header(z, e);
    put(z, hdr, hl);
    for (size_t i = 0; i < n_pieces; i++) put(z, pieces[i], lens[i]);
    return z->failed ? -1 : 0;
}

/* The central directory's entry for member e (zip64 fields for a size or
 * an offset of 4 GiB or more). */
static void put_central_entry(iv_npz_t *z, const struct entry *e)
{
    int big_size = e->size >= 0xffffffffu, big_off = e->offset >= 0xffffffffu;
    uint16_t extra = (uint16_t)((big_size ? 16 : 0) + (big_off ? 8 : 0));
    uint16_t nl = (uint16_t)strlen(e->name);
    put32(z, 0x02014b50);
    put16(z, 45);
    put16(z, (big_size || big_off) ? 45 : 20);
    put16(z, 0);
    put16(z, 0);
    put16(z, 0);
    put16(z, 0x21);
    put32(z, e->crc);
    put32(z, big_size ? 0xffffffffu : (uint32_t)e->size);
    put32(z, big_size ? 0xffffffffu : (uint32_t)e->size);
    put16(z, nl);
    put16(z, extra ? (uint16_t)(extra + 4) : 0);
    put16(z, 0);
    put16(z, 0);
    put16(z, 0);
    put32(z, 0);
    put32(z, big_off ? 0xffffffffu : (uint32_t)e->offset);
    put(z, e->name, nl);
    if (!extra) return;
    put16(z, 0x0001);
    put16(z, extra);
    if (big_size) {
        put64(z, e->size);
        put64(z, e->size);
    }
    if (big_off) put64(z, e->offset);
}

/* The zip64 end of central directory record and its locator. */
static void put_zip64_end(iv_npz_t *z, uint64_t cd_start, uint64_t cd_size)
{
    uint64_t z64 = z->pos;
    put32(z, 0x06064b50);
    put64(z, 44);
    put16(z, 45);
    put16(z, 45);
    put32(z, 0);
    put32(z, 0);
    put64(z, z->n);
    put64(z, z->n);
    put64(z, cd_size);
    put64(z, cd_start);
    put32(z, 0x07064b50);
    put32(z, 0);
    put64(z, z64);
    put32(z, 1);
}

/* The end of central directory record (its fields saturated where the
 * zip64 record holds the value). */
static void put_end(iv_npz_t *z, uint64_t cd_start, uint64_t cd_size)
{
    put32(z, 0x06054b50);
    put16(z, 0);
    put16(z, 0);
    put16(z, (uint16_t)(z->n >= 0xffff ? 0xffff : z->n));
    put16(z, (uint16_t)(z->n >= 0xffff ? 0xffff : z->n));
    put32(z, cd_size >= 0xffffffffu ? 0xffffffffu : (uint32_t)cd_size);
    put32(z, cd_start >= 0xffffffffu ? 0xffffffffu : (uint32_t)cd_start);
    put16(z, 0);
}

int iv_npz_finish(iv_npz_t *z)
{
    uint64_t cd_start = z->pos;
    for (size_t i = 0; i < z->n; i++) put_central_entry(z, &z->e[i]);
    uint64_t cd_size = z->pos - cd_start;
    if (cd_start >= 0xffffffffu || z->n >= 0xffff) put_zip64_end(z, cd_start, cd_size);
    put_end(z, cd_start, cd_size);
    int rc = z->failed ? -1 : 0;
    free(z->e);
    free(z);
    return rc;
}
