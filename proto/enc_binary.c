/*
 * The binary stream encoding, application/vnd.ivserve.csr (encode.h has
 * the layout): the header, a block frame (cell rows, gene rows, dense gene
 * rows), the trailer.  The frames copy the engine's arrays as they are:
 * the engine hands out native-endian arrays and every supported host is
 * little-endian, which the check below pins, so a block costs one memcpy
 * per array.  Pure, any thread.
 */
#include <inttypes.h>
#include <string.h>

#include "enc_impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the binary wire format copies native arrays and needs a little-endian host"
#endif

static void put_descr(iv_buf_t *b, const char *d)
{
    char s[8] = {0};
    memcpy(s, d, strlen(d) < 8 ? strlen(d) : 8);
    iv_buf_append(b, s, 8);
}

static void bin_header(iv_buf_t *b, const iv_stream_hdr_t *h)
{
    iv_buf_append(b, IV_WIRE_MAGIC, 4);
    iv_buf_u32le(b, IV_WIRE_VERSION);
    iv_buf_i64le(b, h->n_rows);
    iv_buf_i64le(b, h->n_cols);
    put_descr(b, iv_wire_descr(h->dtype));
    put_descr(b, h->index_size == 4 ? "<i4" : "<i8");
}

/* A binary block frame: its kind (cell or gene rows), sizes, ids and
 * indptr, then (with arrays) its indices and values. */
static void enc_binary_block(iv_buf_t *b, uint32_t kind, const iv_block_t *blk, int arrays)
{
    size_t need = IV_WIRE_FRAME_BYTES + (size_t)blk->n_rows * 16 + 8 +
                  (arrays ? iv_block_array_bytes(blk, 0) + iv_block_array_bytes(blk, 1) : 0);
    if (iv_buf_reserve(b, need) != 0) return;
    iv_buf_u32le(b, kind);
    iv_buf_u32le(b, 0);
    iv_buf_i64le(b, blk->n_rows);
    iv_buf_i64le(b, blk->nnz);
    iv_buf_append(b, blk->ids, (size_t)blk->n_rows * 8);
    iv_buf_append(b, blk->indptr, (size_t)(blk->n_rows + 1) * 8);
    if (!arrays) return;
    iv_buf_append(b, blk->indices, iv_block_array_bytes(blk, 0));
    iv_buf_append(b, blk->data, iv_block_array_bytes(blk, 1));
}

size_t iv_block_array_bytes(const iv_block_t *blk, int values)
{
    return (size_t)blk->nnz * (values ? iv_enc_value_size(blk->dtype) : (size_t)blk->index_size);
}

void iv_enc_block_head(iv_buf_t *b, const iv_stream_hdr_t *h, const iv_block_t *blk, int arrays)
{
    enc_binary_block(b, h->by_var ? IV_WIRE_VAR_BLOCK : IV_WIRE_BLOCK, blk, arrays);
}

/* Row r of a gene-row block as n_cells values (zero bits where nothing is
 * stored), appended to b. */
static void put_dense_row(iv_buf_t *b, const iv_block_t *blk, int64_t r, int64_t n_cells)
{
    size_t vs = iv_enc_value_size(blk->dtype);
    if (iv_buf_reserve(b, (size_t)n_cells * vs) != 0) return;
    char *dst = b->data + b->len;
    memset(dst, 0, (size_t)n_cells * vs);
    for (int64_t p = blk->indptr[r]; p < blk->indptr[r + 1]; p++) {
        int64_t c = iv_enc_block_index(blk, p);
        if (c >= 0 && c < n_cells)
            memcpy(dst + (size_t)c * vs, (const char *)blk->data + (size_t)p * vs, vs);
    }
    b->len += (size_t)n_cells * vs;
}

/* A block of cell rows, gene rows, or dense gene rows. */
static void bin_block(iv_buf_t *b, const iv_stream_hdr_t *h, const iv_block_t *blk)
{
    if (!h->by_var || !h->dense) {
        iv_enc_block_head(b, h, blk, 1);
        return;
    }
    iv_buf_u32le(b, IV_WIRE_DENSE_BLOCK);
    iv_buf_u32le(b, 0);
    iv_buf_i64le(b, blk->n_rows);
    iv_buf_i64le(b, h->n_rows);
    iv_buf_append(b, blk->ids, (size_t)blk->n_rows * 8);
    for (int64_t r = 0; r < blk->n_rows; r++) put_dense_row(b, blk, r, h->n_rows);
}

static void bin_trailer(iv_buf_t *b, int err_status, const char *code, const char *msg, int64_t rows,
                        int64_t nnz)
{
    iv_buf_t m;
    iv_buf_init(&m);
    if (err_status) iv_enc_error(&m, code, msg);
    iv_buf_u32le(b, IV_WIRE_TRAILER);
    iv_buf_u32le(b, (uint32_t)err_status);
    iv_buf_i64le(b, rows);
    iv_buf_i64le(b, nnz);
    iv_buf_u32le(b, (uint32_t)m.len);
    iv_buf_append(b, m.data, m.len);
    if (m.oom) b->oom = 1;
    iv_buf_free(&m);
}

int64_t iv_enc_binary_size(int64_t n_rows, int64_t n_blocks, int64_t nnz, int index_size,
                           iv_dtype_t dtype)
{
    return IV_WIRE_HEADER_BYTES + n_blocks * (IV_WIRE_FRAME_BYTES + 8) + n_rows * 16 +
           nnz * (index_size + (int64_t)iv_enc_value_size(dtype)) + IV_WIRE_FRAME_BYTES + 4;
}

const iv_encoder_t iv_enc_binary = {IV_FMT_BINARY, bin_header, bin_block, bin_trailer};
