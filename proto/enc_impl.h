/*
 * What the stream encoders (enc_binary.c, enc_ndjson.c) and encode.c's
 * JSON document share: the wire size of a value, a block's index i, and
 * the comma-separated number lists of the JSON forms.  Private to proto/;
 * pure, any thread; all append to a caller-owned iv_buf_t.
 */
#ifndef IV_ENC_IMPL_H
#define IV_ENC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "encode.h"

/* The bytes a value of dtype t takes on the wire (0: unknown). */
size_t iv_enc_value_size(iv_dtype_t t);
/* Index i of blk's indices, whatever their width. */
int64_t iv_enc_block_index(const iv_block_t *blk, int64_t i);
/* Comma-separated numbers, no brackets: v[i] + add, the indices, the
 * values (as iv_enc_json_value); sep_first puts a comma before the first. */
void iv_enc_put_i64_list(iv_buf_t *b, const int64_t *v, int64_t n, int64_t add, int sep_first);
void iv_enc_put_indices(iv_buf_t *b, const iv_block_t *blk, int sep_first);
void iv_enc_put_values(iv_buf_t *b, const iv_block_t *blk, int sep_first);
/* Row r of a gene-row block as a JSON array of n_cells values. */
void iv_enc_put_dense_json(iv_buf_t *b, const iv_block_t *blk, int64_t r, int64_t n_cells);

/* The streamed encodings (encode.h's iv_encoder_t), one a file. */
extern const iv_encoder_t iv_enc_binary;
extern const iv_encoder_t iv_enc_ndjson;

#endif
