/*
 * Response encoders: query results (iv_block_t) to wire bytes.
 *
 * Three encodings share one sequence: a header, one piece per block, a
 * trailer that says whether the stream ended well.  A failure after the
 * first bytes went out can no longer change the HTTP status, so the
 * trailer carries it instead, and a client that checks the trailer never
 * mistakes a truncated matrix for a complete one.
 *
 * Binary framing (application/vnd.ivserve.csr), every integer little-endian:
 *
 *   stream header, 40 bytes:
 *     char[4]  magic "IVQS"
 *     u32      version (1)
 *     i64      total rows, i64 columns
 *     char[8]  value dtype, numpy descr NUL-padded ("<f4", "<u2", ...)
 *     char[8]  index dtype, "<i4" or "<i8"
 *   block frame:
 *     u32 kind = 1, u32 0, i64 n_rows, i64 nnz,
 *     i64 ids[n_rows]         original obs index of each output row
 *     i64 indptr[n_rows + 1]  starting at 0 within the block
 *     indices[nnz]            index dtype (output column positions)
 *     values[nnz]             value dtype
 *   gene-row block frame ("by": "var"), the same layout as a block frame:
 *     u32 kind = 3, u32 0, i64 n_rows (genes), i64 nnz, i64 ids[n_rows] (var
 *     indices), indptr, indices (positions in the obs selection), values
 *   dense gene-row frame ("dense": true):
 *     u32 kind = 4, u32 0, i64 n_rows (genes), i64 n_cols (selected cells),
 *     i64 ids[n_rows], values[n_rows * n_cols] (row-major, value dtype,
 *     zero where nothing is stored)
 *   The stream header's rows and columns are the result's shape (selected
 *   cells x selected genes) whatever the block rows are.
 *   trailer frame:
 *     u32 kind = 2, u32 status (0 = ok, else the HTTP status of the error),
 *     i64 rows sent, i64 nnz sent, u32 message length, message bytes
 *     (the JSON error object, empty when ok)
 *
 * NDJSON: {"type":"header",...}, one {"type":"block",...} per block, then
 * {"type":"end","status":"ok"|"error",...}.  By var the header says
 * "by":"var" (and "dense":true), blocks name their rows "var" instead of
 * "obs", and a dense block has "data" as one array of values per gene.  JSON: one document with the
 * whole CSR (iv_jdoc_*), built in memory and sent with Content-Length.
 * Non-finite floating-point values are written as null in both JSON forms
 * (JSON has no NaN); clients map null back to NaN.
 *
 * All functions append to a caller-owned iv_buf_t (check its oom flag);
 * pure, any thread.
 */
#ifndef IV_ENCODE_H
#define IV_ENCODE_H

#include <stdint.h>

#include "buf.h"
#include "query.h"
#include "request.h"

#define IV_WIRE_MAGIC "IVQS"
#define IV_WIRE_VERSION 1u
#define IV_WIRE_HEADER_BYTES 40
#define IV_WIRE_FRAME_BYTES 24    /* block frame header and trailer fixed part (+4 for msg length) */
#define IV_WIRE_BLOCK 1u
#define IV_WIRE_TRAILER 2u
#define IV_WIRE_VAR_BLOCK 3u
#define IV_WIRE_DENSE_BLOCK 4u

typedef struct iv_stream_hdr {
    int64_t n_rows, n_cols;   /* the result's shape: selected cells x selected genes */
    iv_dtype_t dtype;
    int index_size;       /* 4 or 8 */
    int by_var;           /* blocks are gene rows: the CSC of the result */
    int dense;            /* gene rows as dense vectors (by_var) */
} iv_stream_hdr_t;

/* The header of q's result; dense asks for dense gene rows. */
iv_stream_hdr_t iv_stream_hdr_of(const iv_query_t *q, int dense);

/* Header, block and trailer as above, for any iv_stream_hdr_t: with
 * by_var the block's rows are genes (ids = var indices, columns =
 * positions in the obs selection), with dense as well each gene row is
 * n_rows values (the result's cells), zero where nothing is stored. */
void iv_enc_block_h(iv_buf_t *b, iv_fmt_t f, const iv_stream_hdr_t *h, const iv_block_t *blk);

/* The binary frame of blk (not dense gene rows) as iv_enc_block_h writes
 * it, with arrays; without, only its fixed part, ids and indptr, so that
 * a sender can write blk's indices and then its values straight after,
 * from the block itself: iv_block_array_bytes(blk, 0) and (blk, 1) bytes. */
void iv_enc_block_head(iv_buf_t *b, const iv_stream_hdr_t *h, const iv_block_t *blk, int arrays);
size_t iv_block_array_bytes(const iv_block_t *blk, int values);

/* numpy descr of a dtype on the wire ("<f4"); "" for an unknown one. */
const char *iv_wire_descr(iv_dtype_t t);
const char *iv_wire_dtype_name(iv_dtype_t t);

/*
 * A streamed encoding: its header, one piece a block (any iv_stream_hdr_t,
 * as iv_enc_block_h), its trailer (err_status 0 = ok; otherwise an HTTP
 * status with code and message).  A new encoding is one file defining
 * one of these and one entry of encode.c's table.
 */
typedef struct iv_encoder {
    iv_fmt_t fmt;
    void (*header)(iv_buf_t *b, const iv_stream_hdr_t *h);
    void (*block)(iv_buf_t *b, const iv_stream_hdr_t *h, const iv_block_t *blk);
    void (*trailer)(iv_buf_t *b, int err_status, const char *code, const char *msg, int64_t rows,
                    int64_t nnz);
} iv_encoder_t;

/* The streamed encoding of f: binary (enc_binary.c), NDJSON
 * (enc_ndjson.c); NULL for the others (JSON is one document, iv_jdoc_*). */
const iv_encoder_t *iv_encoder_of(iv_fmt_t f);

/* Header, block and trailer through iv_encoder_of(f); nothing for a
 * format that is not streamed. */
void iv_enc_header(iv_buf_t *b, iv_fmt_t f, const iv_stream_hdr_t *h);
void iv_enc_block(iv_buf_t *b, iv_fmt_t f, const iv_block_t *blk);
/* err_status 0 = ok; otherwise an HTTP status with code and message. */
void iv_enc_trailer(iv_buf_t *b, iv_fmt_t f, int err_status, const char *code, const char *msg,
                    int64_t rows, int64_t nnz);

/* Exact byte size of a successful binary stream (for /count). */
int64_t iv_enc_binary_size(int64_t n_rows, int64_t n_blocks, int64_t nnz, int index_size,
                           iv_dtype_t dtype);

/* One number as JSON: integers exactly, floats round-trip (%.9g / %.17g),
 * non-finite as null (block values, dense arrays, aggregates). */
void iv_enc_json_value(iv_buf_t *b, iv_dtype_t t, const void *base, int64_t i);

/* The error document {"error":{"code":...,"message":...}}. */
void iv_enc_error(iv_buf_t *b, const char *code, const char *msg);

/* Whole-result JSON document, accumulated block by block. */
typedef struct iv_jdoc {
    iv_buf_t obs, indptr, indices, data;
    int64_t rows, nnz;
} iv_jdoc_t;
void iv_jdoc_init(iv_jdoc_t *d);
void iv_jdoc_free(iv_jdoc_t *d);
/* Appends a block (blocks must come in row order). */
void iv_jdoc_add(iv_jdoc_t *d, const iv_block_t *blk);
/* Bytes accumulated so far (to enforce the JSON size limit early). */
size_t iv_jdoc_bytes(const iv_jdoc_t *d);
/* The same for any header (gene rows, dense gene rows; see iv_enc_block_h). */
void iv_jdoc_add_h(iv_jdoc_t *d, const iv_stream_hdr_t *h, const iv_block_t *blk);
/* Writes the document into b. */
void iv_jdoc_finish(iv_jdoc_t *d, const iv_stream_hdr_t *h, iv_buf_t *b);
/* Any allocation failed. */
int iv_jdoc_oom(const iv_jdoc_t *d);

#endif
