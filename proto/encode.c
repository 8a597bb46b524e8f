/*
 * Response encoders (see encode.h for the wire formats): the table of
 * streamed encodings (one file each: enc_binary.c, enc_ndjson.c), the
 * whole JSON document (iv_jdoc_*), and what they share (enc_impl.h).
 *
 * JSON number formatting is the expensive part of the text encodings; it
 * uses the shortest printf forms that round-trip (%.9g for float32, %.17g
 * for float64) so a client reads back exactly the stored value.
 */
#include "encode.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "enc_impl.h"

/* The streamed encodings, by format. */
static const iv_encoder_t *const encoders[] = {&iv_enc_binary, &iv_enc_ndjson};

const iv_encoder_t *iv_encoder_of(iv_fmt_t f)
{
    for (size_t i = 0; i < sizeof encoders / sizeof encoders[0]; i++)
        if (encoders[i]->fmt == f) return encoders[i];
    return NULL;
}

void iv_enc_header(iv_buf_t *b, iv_fmt_t f, const iv_stream_hdr_t *h)
{
    const iv_encoder_t *e = iv_encoder_of(f);
    if (e) e->header(b, h);
}

void iv_enc_block_h(iv_buf_t *b, iv_fmt_t f, const iv_stream_hdr_t *h, const iv_block_t *blk)
{
    const iv_encoder_t *e = iv_encoder_of(f);
    if (e) e->block(b, h, blk);
}

/* A block of cell rows: the header that says so. */
void iv_enc_block(iv_buf_t *b, iv_fmt_t f, const iv_block_t *blk)
{
    iv_stream_hdr_t h = {.dtype = blk->dtype, .index_size = blk->index_size};
    iv_enc_block_h(b, f, &h, blk);
}

void iv_enc_trailer(iv_buf_t *b, iv_fmt_t f, int err_status, const char *code, const char *msg,
                    int64_t rows, int64_t nnz)
{
    const iv_encoder_t *e = iv_encoder_of(f);
    if (e) e->trailer(b, err_status, code, msg, rows, nnz);
}

/* The wire names are part of the documented format, so they live here
 * rather than depend on the engine's spelling. */
static const char *const wire_descr[IV_DT_COUNT] = {
    "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f4", "<f8",
};
static const char *const wire_name[IV_DT_COUNT] = {
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
};
static const uint8_t wire_size[IV_DT_COUNT] = {1, 2, 4, 8, 1, 2, 4, 8, 4, 8};

const char *iv_wire_descr(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? wire_descr[t] : "";
}

const char *iv_wire_dtype_name(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? wire_name[t] : "unknown";
}

size_t iv_enc_value_size(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? wire_size[t] : 0;
}

void iv_enc_json_value(iv_buf_t *b, iv_dtype_t t, const void *base, int64_t i)
{
    char s[40];
    int n = 0;
    switch (t) {
    case IV_DT_INT8: n = snprintf(s, sizeof s, "%d", ((const int8_t *)base)[i]); break;
    case IV_DT_INT16: n = snprintf(s, sizeof s, "%d", ((const int16_t *)base)[i]); break;
    case IV_DT_INT32: n = snprintf(s, sizeof s, "%" PRId32, ((const int32_t *)base)[i]); break;
    case IV_DT_INT64: n = snprintf(s, sizeof s, "%" PRId64, ((const int64_t *)base)[i]); break;
    case IV_DT_UINT8: n = snprintf(s, sizeof s, "%u", ((const uint8_t *)base)[i]); break;
    case IV_DT_UINT16: n = snprintf(s, sizeof s, "%u", ((const uint16_t *)base)[i]); break;
    case IV_DT_UINT32: n = snprintf(s, sizeof s, "%" PRIu32, ((const uint32_t *)base)[i]); break;
    case IV_DT_UINT64: n = snprintf(s, sizeof s, "%" PRIu64, ((const uint64_t *)base)[i]); break;
    case IV_DT_FLOAT32: {
        float v = ((const float *)base)[i];
        n = isfinite(v) ? snprintf(s, sizeof s, "%.9g", (double)v) : snprintf(s, sizeof s, "null");
        break;
    }
    case IV_DT_FLOAT64: {
        double v = ((const double *)base)[i];
        n = isfinite(v) ? snprintf(s, sizeof s, "%.17g", v) : snprintf(s, sizeof s, "null");
        break;
    }
    default: n = snprintf(s, sizeof s, "null"); break;
    }
    iv_buf_append(b, s, (size_t)n);
}

static void put_i64(iv_buf_t *b, int64_t v)
{
    char s[24];
    int n = snprintf(s, sizeof s, "%" PRId64, v);
    iv_buf_append(b, s, (size_t)n);
}

int64_t iv_enc_block_index(const iv_block_t *blk, int64_t i)
{
    return blk->index_size == 4 ? ((const int32_t *)blk->indices)[i]
                                : ((const int64_t *)blk->indices)[i];
}

/* Comma-separated numbers, no brackets; `sep_first` puts a comma before the first. */
void iv_enc_put_i64_list(iv_buf_t *b, const int64_t *v, int64_t n, int64_t add, int sep_first)
{
    for (int64_t i = 0; i < n; i++) {
        if (i || sep_first) iv_buf_append(b, ",", 1);
        put_i64(b, v[i] + add);
    }
}

void iv_enc_put_indices(iv_buf_t *b, const iv_block_t *blk, int sep_first)
{
    for (int64_t i = 0; i < blk->nnz; i++) {
        if (i || sep_first) iv_buf_append(b, ",", 1);
        put_i64(b, iv_enc_block_index(blk, i));
    }
}

void iv_enc_put_values(iv_buf_t *b, const iv_block_t *blk, int sep_first)
{
    for (int64_t i = 0; i < blk->nnz; i++) {
        if (i || sep_first) iv_buf_append(b, ",", 1);
        iv_enc_json_value(b, blk->dtype, blk->data, i);
    }
}

iv_stream_hdr_t iv_stream_hdr_of(const iv_query_t *q, int dense)
{
    iv_stream_hdr_t h = {iv_query_n_rows(q), iv_query_n_cols(q), iv_query_dtype(q),
                         iv_query_index_size(q), iv_query_by_var(q), 0};
    if (h.by_var) {
        h.n_rows = iv_query_n_cols(q);
        h.n_cols = iv_query_n_rows(q);
        h.dense = dense;
    }
    return h;
}

/* Row r of a gene-row block as a JSON array of n_cells values. */
void iv_enc_put_dense_json(iv_buf_t *b, const iv_block_t *blk, int64_t r, int64_t n_cells)
{
    iv_buf_puts(b, "[");
    int64_t p = blk->indptr[r], e = blk->indptr[r + 1];
    for (int64_t c = 0; c < n_cells; c++) {
        if (c) iv_buf_append(b, ",", 1);
        if (p < e && iv_enc_block_index(blk, p) == c) iv_enc_json_value(b, blk->dtype, blk->data, p++);
        else iv_buf_append(b, "0", 1);
    }
    iv_buf_puts(b, "]");
}

void iv_jdoc_add_h(iv_jdoc_t *d, const iv_stream_hdr_t *h, const iv_block_t *blk)
{
    if (!h->dense) {
        iv_jdoc_add(d, blk);
        return;
    }
    iv_enc_put_i64_list(&d->obs, blk->ids, blk->n_rows, 0, d->rows > 0);
    for (int64_t r = 0; r < blk->n_rows; r++) {
        if (d->rows + r > 0) iv_buf_append(&d->data, ",", 1);
        iv_enc_put_dense_json(&d->data, blk, r, h->n_rows);
    }
    d->rows += blk->n_rows;
    d->nnz += blk->nnz;
}

void iv_enc_error(iv_buf_t *b, const char *code, const char *msg)
{
    iv_buf_puts(b, "{\"error\":{\"code\":");
    iv_buf_json_str(b, code);
    iv_buf_puts(b, ",\"message\":");
    iv_buf_json_str(b, msg);
    iv_buf_puts(b, "}}");
}

void iv_jdoc_init(iv_jdoc_t *d)
{
    memset(d, 0, sizeof *d);
    iv_buf_puts(&d->indptr, "0");
}

void iv_jdoc_free(iv_jdoc_t *d)
{
    iv_buf_free(&d->obs);
    iv_buf_free(&d->indptr);
    iv_buf_free(&d->indices);
    iv_buf_free(&d->data);
}

void iv_jdoc_add(iv_jdoc_t *d, const iv_block_t *blk)
{
    iv_enc_put_i64_list(&d->obs, blk->ids, blk->n_rows, 0, d->rows > 0);
    /* indptr[0] of a block is 0 and is already present as the previous end. */
    iv_enc_put_i64_list(&d->indptr, blk->indptr + 1, blk->n_rows, d->nnz, 1);
    iv_enc_put_indices(&d->indices, blk, d->nnz > 0);
    iv_enc_put_values(&d->data, blk, d->nnz > 0);
    d->rows += blk->n_rows;
    d->nnz += blk->nnz;
}

size_t iv_jdoc_bytes(const iv_jdoc_t *d)
{
    return d->obs.len + d->indptr.len + d->indices.len + d->data.len;
}

int iv_jdoc_oom(const iv_jdoc_t *d)
{
    return d->obs.oom || d->indptr.oom || d->indices.oom || d->data.oom;
}

void iv_jdoc_finish(iv_jdoc_t *d, const iv_stream_hdr_t *h, iv_buf_t *b)
{
    iv_buf_reserve(b, iv_jdoc_bytes(d) + 256);
    iv_buf_printf(b,
                  "{\"shape\":[%" PRId64 ",%" PRId64 "],\"dtype\":\"%s\",\"nnz\":%" PRId64
                  "%s%s,\"%s\":[",
                  h->n_rows, h->n_cols, iv_wire_dtype_name(h->dtype), d->nnz,
                  h->by_var ? ",\"by\":\"var\"" : "", h->dense ? ",\"dense\":true" : "",
                  h->by_var ? "var" : "obs");
    iv_buf_append(b, d->obs.data, d->obs.len);
    if (h->dense) {
        iv_buf_puts(b, "],\"data\":[");
        iv_buf_append(b, d->data.data, d->data.len);
        iv_buf_puts(b, "]}");
        if (iv_jdoc_oom(d)) b->oom = 1;
        return;
    }
    iv_buf_puts(b, "],\"indptr\":[");
    iv_buf_append(b, d->indptr.data, d->indptr.len);
    iv_buf_puts(b, "],\"indices\":[");
    iv_buf_append(b, d->indices.data, d->indices.len);
    iv_buf_puts(b, "],\"data\":[");
    iv_buf_append(b, d->data.data, d->data.len);
    iv_buf_puts(b, "]}");
    if (iv_jdoc_oom(d)) b->oom = 1;
}
