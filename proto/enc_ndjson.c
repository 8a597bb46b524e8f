/*
 * The NDJSON stream encoding, application/x-ndjson (encode.h): a header
 * line, a line a block (cell rows under "obs", gene rows under "var",
 * dense gene rows as one "data" array a gene), an end line.  Numbers use
 * the shortest printf forms that round-trip (iv_enc_json_value), the
 * expensive part of the encoding.  Pure, any thread.
 */
#include <inttypes.h>

#include "enc_impl.h"

static void nd_header(iv_buf_t *b, const iv_stream_hdr_t *h)
{
    iv_buf_printf(b,
                  "{\"type\":\"header\",\"shape\":[%" PRId64 ",%" PRId64
                  "],\"dtype\":\"%s\",\"index_dtype\":\"%s\"%s%s}\n",
                  h->n_rows, h->n_cols, iv_wire_dtype_name(h->dtype),
                  h->index_size == 4 ? "int32" : "int64", h->by_var ? ",\"by\":\"var\"" : "",
                  h->dense ? ",\"dense\":true" : "");
}

/* A block's line: its rows under "obs" (cells) or "var" (genes), then its
 * CSR arrays, or (dense gene rows) one array of values a gene. */
static void nd_block(iv_buf_t *b, const iv_stream_hdr_t *h, const iv_block_t *blk)
{
    iv_buf_printf(b, "{\"type\":\"block\",\"row0\":%" PRId64 ",\"n_rows\":%" PRId64
                  ",\"nnz\":%" PRId64 ",\"%s\":[", blk->row0, blk->n_rows, blk->nnz,
                  h->by_var ? "var" : "obs");
    iv_enc_put_i64_list(b, blk->ids, blk->n_rows, 0, 0);
    if (h->by_var && h->dense) {
        iv_buf_puts(b, "],\"data\":[");
        for (int64_t r = 0; r < blk->n_rows; r++) {
            if (r) iv_buf_append(b, ",", 1);
            iv_enc_put_dense_json(b, blk, r, h->n_rows);
        }
        iv_buf_puts(b, "]}\n");
        return;
    }
    iv_buf_puts(b, "],\"indptr\":[");
    iv_enc_put_i64_list(b, blk->indptr, blk->n_rows + 1, 0, 0);
    iv_buf_puts(b, "],\"indices\":[");
    iv_enc_put_indices(b, blk, 0);
    iv_buf_puts(b, "],\"data\":[");
    iv_enc_put_values(b, blk, 0);
    iv_buf_puts(b, "]}\n");
}

static void nd_trailer(iv_buf_t *b, int err_status, const char *code, const char *msg, int64_t rows,
                       int64_t nnz)
{
    if (!err_status) {
        iv_buf_printf(b, "{\"type\":\"end\",\"status\":\"ok\",\"rows\":%" PRId64
                         ",\"nnz\":%" PRId64 "}\n", rows, nnz);
        return;
    }
    iv_buf_printf(b, "{\"type\":\"end\",\"status\":\"error\",\"http_status\":%d,", err_status);
    iv_buf_puts(b, "\"error\":{\"code\":");
    iv_buf_json_str(b, code);
    iv_buf_puts(b, ",\"message\":");
    iv_buf_json_str(b, msg);
    iv_buf_printf(b, "},\"rows\":%" PRId64 ",\"nnz\":%" PRId64 "}\n", rows, nnz);
}

const iv_encoder_t iv_enc_ndjson = {IV_FMT_NDJSON, nd_header, nd_block, nd_trailer};
