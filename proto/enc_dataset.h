/*
 * The JSON documents that describe a dataset and a count: the parts of
 * the dataset document (GET /v1/datasets/{id}) and of its entry in the
 * list that come from the matrix, and the body of a count answer
 * (POST /v1/datasets/{id}/count).  The server adds what only it knows
 * (metadata schema, viewer arrays, memory, auth) around them.
 *
 * Each writer appends to a caller-owned buffer (its oom flag says whether
 * it ran out of memory) and keeps the members in a fixed order, so that a
 * document's bytes, and the ETag taken of them, change only when the data
 * does.  Any thread, as long as the dataset or query is not being freed.
 */
#ifndef IV_ENC_DATASET_H
#define IV_ENC_DATASET_H

#include <stdint.h>

#include "buf.h"
#include "dataset.h"
#include "query.h"

/* From '{' up to "ready":true: id, title (the id when NULL), shape,
 * orientation, nnz, dtype, the indices dtype when with_indices_dtype is
 * set, codec.  The object is left open. */
void iv_enc_ds_summary(iv_buf_t *b, const char *id, const char *title,
                       const iv_dataset_info_t *in, int with_indices_dtype);

/* ,"orientations":{"cells":{...},"genes":{...}}: which copies of the
 * matrix serve queries ("source": "file", "memory", "companion", or
 * "cache" when other_cached: the copy in the cache folder), and the
 * memory each takes now. */
void iv_enc_orientations(iv_buf_t *b, iv_dataset_t *ds, int other_cached);

/* ,"file":{"state":...}: whether the path still names the file loaded,
 * unchanged (filecheck.h), with the message when it does not (its paths
 * shortened by iv_enc_file_msg). */
void iv_enc_file_state(iv_buf_t *b, iv_dataset_t *ds);

/* Copies msg, a message about ds's files (a file state's, or a failed
 * read's: filecheck.c, stream.c and watch.c begin theirs with the path),
 * into out (cap bytes, NUL-terminated) with the path of ds's file and of
 * its companion's each shortened to the file's base name, for answers
 * that must not show clients where the server keeps its files; the log
 * keeps msg.  Found by the whole path, so folders with spaces go too.
 * Returns out. */
char *iv_enc_file_msg(iv_dataset_t *ds, const char *msg, char *out, size_t cap);

/* A count answer's whole body for query q: shape (cells x genes, whatever
 * the rows are), nnz and total (from the caller), the exact binary size,
 * the orientation that serves q, and ds's orientations when ds is not
 * NULL; dropped (a JSON object, or NULL) becomes "dropped". */
void iv_enc_count(iv_buf_t *b, const iv_query_t *q, int64_t nnz, double total, iv_dataset_t *ds,
                  const char *dropped);

#endif
