/*
 * libFuzzer target: the file validator's own checks (pointer arrays, then
 * the row-index pass over the packed stream) and, when a made-up matrix
 * passes them, every decode path over it.  HDF5 itself is not fuzzed: the
 * input describes the arrays an IVCSR/IVCSC group would hold.
 *
 * Layout: 5 header bytes (major count, minor count, chunk length, index
 * stride, flags: orientation, contiguous or chunked, raw pointers), then
 * one byte per major_ptr and value_ptr step, then the packed stream.  With
 * the raw-pointer flag the steps are signed, so pointers can go backwards.
 * The row-index pass must agree with a plain varint-by-varint reading of
 * its checks (verdict and checkpoint offsets); past that, any outcome is
 * fine as long as nothing reads or writes out of bounds, leaks or aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset_impl.h"
#include "query.h"
#include "varint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads n + 1 pointers from steps; returns NULL when the input is short. */
static int64_t *pointers(const uint8_t **p, const uint8_t *end, int64_t n, int raw)
{
    if (end - *p < n) return NULL;
    int64_t *v = malloc((size_t)(n + 1) * sizeof *v);
    v[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int step = raw ? (int)(int8_t)(*p)[i] : (*p)[i] % 8;
        v[i + 1] = v[i] + step;
    }
    *p += n;
    return v;
}

static void decode_all(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var, int64_t bnnz)
{
    iv_query_opts_t qo = {.axis = IV_OUT_ROWS, .block_nnz = bnnz, .pick = IV_PICK_AUTO};
    iv_query_t *q = NULL;
    iv_err_t e = {0};
    if (iv_query_new(ds, obs, var, &qo, &q, &e) != 0) return;
    if (iv_query_prepare(q, NULL, &e) == 0) {
        for (int64_t b = 0; b < iv_query_n_blocks(q); b++) {
            iv_block_t blk;
            memset(&blk, 0, sizeof blk);
            iv_err_clear(&e);
            if (iv_query_decode_block(q, b, &blk, &e) != 0) break;
            iv_block_free(&blk);
        }
    }
    iv_query_free(q);
}

/*
 * The row-index checks read plainly, varint by varint: the stream must hold
 * exactly nnz varints and nothing after the last, each decodable, each
 * value group's sum of d + 1 at most n_minor.  When it passes, off gets
 * every checkpoint's offset.  Returns 1 when the stream passes.
 */
static int reference_index(const uint8_t *s, size_t len, const iv_h5matrix_t *m, uint32_t stride,
                           uint64_t *off)
{
    size_t *start = malloc((size_t)(m->nnz + 1) * sizeof *start);
    uint64_t *idx = malloc((size_t)(m->nnz + 1) * sizeof *idx);
    size_t pos = 0;
    int ok = 1;
    for (int64_t g = 0; ok && g < m->n_unique; g++) {
        uint64_t acc = 0;
        for (int64_t k = m->value_ptr[g]; ok && k < m->value_ptr[g + 1]; k++) {
            uint64_t d;
            start[k] = pos;
            size_t u = iv_varint_read(s + pos, s + len, &d);
            if (u == 0 || d >= (uint64_t)m->n_minor) ok = 0;
            acc += d + 1;
            if (acc > (uint64_t)m->n_minor) ok = 0;
            idx[k] = acc - 1;
            pos += u;
        }
    }
    if (ok && pos != len) ok = 0;
    /* No slice lists a minor index twice (across its groups). */
    uint8_t *seen = calloc((size_t)m->n_minor, 1);
    for (int64_t r = 0; ok && r < m->n_major; r++) {
        int64_t a = m->value_ptr[m->major_ptr[r]], b = m->value_ptr[m->major_ptr[r + 1]];
        for (int64_t k = a; k < b; k++) ok &= !seen[idx[k]]++;
        for (int64_t k = a; k < b; k++) seen[idx[k]] = 0;
    }
    free(seen);
    free(idx);
    if (ok) {
        start[m->nnz] = pos;
        uint64_t n_ckpt = m->n_major == 0 ? 0 : (uint64_t)(m->n_major - 1) / stride + 1;
        for (uint64_t j = 0; j < n_ckpt; j++)
            off[j] = start[m->value_ptr[m->major_ptr[j * stride]]];
    }
    free(start);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5) return 0;
    const uint8_t *p = data + 5, *end = data + size;
    int64_t n_major = data[0] % 16, n_minor = data[1] % 48 + 1;
    uint64_t chunk_len = data[2] % 40 + 1;
    uint32_t stride = data[3] % 8 + 1;
    int csc = data[4] & 1, contiguous = data[4] & 2, raw = data[4] & 4;
    if (data[4] & 8) n_minor += 1 << 14;   /* three-byte varints */

    iv_dataset_t *ds = calloc(1, sizeof *ds);
    snprintf(ds->where, sizeof ds->where, "fuzz:/X");
    iv_h5matrix_t *m = &ds->m;
    m->orient = csc ? IV_IVCSC : IV_IVCSR;
    m->n_major = n_major;
    m->n_minor = n_minor;
    m->n_rows = csc ? n_minor : n_major;
    m->n_cols = csc ? n_major : n_minor;
    m->value_dtype = IV_DT_INT32;
    m->major_ptr = pointers(&p, end, n_major, raw);
    if (!m->major_ptr) goto out;
    m->n_unique = m->major_ptr[n_major];
    if (m->n_unique < 0 || m->n_unique > 4096) goto out;
    m->value_ptr = pointers(&p, end, m->n_unique, raw);
    if (!m->value_ptr) goto out;
    m->nnz = m->value_ptr[m->n_unique];
    int32_t *vals = malloc((size_t)(m->n_unique + 1) * sizeof *vals);
    for (int64_t g = 0; g < m->n_unique; g++) vals[g] = (int32_t)(g * 7 - 3);
    m->values = vals;

    /* The stream: an exact-size copy, as one block or in full-size chunks
     * (the last one zero-padded, as HDF5 stores it). */
    size_t len = (size_t)(end - p);
    iv_stream_desc_t d;
    memset(&d, 0, sizeof d);
    d.length = len;
    d.label = "fuzz:/X/packed_indices";
    if (contiguous || len == 0) {
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, p, len);
        d.contig = d.owned_buf = buf;
    } else {
        uint64_t nc = (len + chunk_len - 1) / chunk_len;
        uint8_t *buf = calloc(nc, chunk_len);
        memcpy(buf, p, len);
        d.owned_buf = buf;   /* freed by the stream */
        d.chunked = 1;
        d.chunk_len = chunk_len;
        d.n_chunks = nc;
        d.map = buf;
        d.map_len = nc * chunk_len;
        d.chunk_addr = malloc(nc * sizeof *d.chunk_addr);
        d.chunk_size = malloc(nc * sizeof *d.chunk_size);
        d.chunk_mask = calloc(nc, sizeof *d.chunk_mask);
        for (uint64_t c = 0; c < nc; c++) {
            d.chunk_addr[c] = c * chunk_len;
            d.chunk_size[c] = chunk_len;
        }
    }
    m->stream.length = len;
    iv_err_t e = {0};
    if (iv_h5matrix_check_pointers(m, ds->where, &e) != 0) {
        free(d.chunk_addr);
        free(d.chunk_size);
        free(d.chunk_mask);
        free(d.owned_buf);
        goto out;
    }
    memset(&m->stream, 0, sizeof m->stream);
    if (iv_stream_create(&d, (data[4] & 16) ? 0 : (size_t)1 << 20, &ds->stream, &e) != 0) goto out;
    iv_rowindex_src_t src = {
        .s = ds->stream, .major_ptr = m->major_ptr, .value_ptr = m->value_ptr,
        .n_major = n_major, .n_unique = m->n_unique, .nnz = m->nnz, .n_minor = n_minor,
        .where = ds->where,
    };
    /* The pass must agree with the plain reading: the same verdict and,
     * when the stream passes, the same checkpoint offsets. */
    uint64_t *want = malloc(((size_t)n_major / stride + 2) * sizeof *want);
    int want_ok = reference_index(p, len, m, stride, want);
    int got_ok = iv_rowindex_build(&src, stride, NULL, &ds->ri, &e) == 0;
    if (got_ok != want_ok) abort();
    for (uint64_t j = 0; got_ok && j < ds->ri.n_ckpt; j++)
        if (ds->ri.off[j] != want[j]) abort();
    free(want);
    if (!got_ok) goto out;
    ds->info.orient = m->orient;
    ds->info.n_rows = m->n_rows;
    ds->info.n_cols = m->n_cols;

    /* Every path: the whole matrix, rows in a made-up order with a
     * repeat, a gene subset with a repeat, tiny blocks. */
    iv_sel_t all = {.all = 1};
    decode_all(ds, &all, &all, 0);
    decode_all(ds, &all, &all, 3);
    int64_t ro[4] = {m->n_rows - 1, 0, m->n_rows / 2, 0};
    int64_t co[3] = {m->n_cols / 2, 0, m->n_cols / 2};
    iv_sel_t rows = {.n = m->n_rows > 0 ? 4 : 0, .idx = ro};
    iv_sel_t cols = {.n = m->n_cols > 0 ? 3 : 0, .idx = co};
    decode_all(ds, &rows, &all, 0);
    decode_all(ds, &all, &cols, 0);
    decode_all(ds, &rows, &cols, 2);
out:
    iv_dataset_close(ds);
    return 0;
}
