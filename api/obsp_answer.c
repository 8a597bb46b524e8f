/*
 * The obsp routes' bodies (see obsp_answer.h).
 *
 * The answer reuses the /query encoders block by block, so that its bytes
 * are a /query stream's in every encoding: blocks of at most
 * IV_API_OBSP_BLOCK_ROWS rows as /query sends (the client's frame bound
 * holds), cut earlier past IV_API_OBSP_BLOCK_NNZ entries.  Indices go out
 * as int32 when the selection has fewer than 2^31 cells, as /query's do.
 */
#include "obsp_answer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "encode.h"

int iv_api_obsp_list_doc(const iv_obsp_list_t *l, iv_buf_t *out, iv_err_t *err)
{
    iv_buf_puts(out, "{\"obsp\":[");
    for (size_t i = 0; l && i < l->n; i++) {
        const iv_obsp_elem_t *e = &l->e[i];
        int ok = e->kind != IV_OBSP_OTHER;
        iv_buf_puts(out, i ? ",{\"name\":" : "{\"name\":");
        iv_buf_json_str(out, e->name);
        iv_buf_puts(out, ",\"format\":");
        iv_buf_json_str(out, e->format[0] ? e->format : "unknown");
        if (e->n_rows >= 0 && e->n_cols >= 0)
            iv_buf_printf(out, ",\"shape\":[%" PRId64 ",%" PRId64 "]", e->n_rows, e->n_cols);
        else
            iv_buf_puts(out, ",\"shape\":null");
        if (ok) iv_buf_printf(out, ",\"dtype\":\"%s\"", iv_dtype_name(e->dtype));
        if (e->nnz >= 0) iv_buf_printf(out, ",\"nnz\":%" PRId64, e->nnz);
        iv_buf_printf(out, ",\"servable\":%s", ok ? "true" : "false");
        if (!ok) {
            iv_buf_puts(out, ",\"reason\":");
            iv_buf_json_str(out, e->why);
        }
        iv_buf_puts(out, "}");
    }
    iv_buf_puts(out, "]}");
    return out->oom ? iv_fail(err, IV_ENOMEM, "out of memory listing obsp") : 0;
}

/* Block [r0, r1) of m as an iv_block_t; ids and indices in caller-owned
 * scratch (idx32 when index_size is 4). */
static void make_block(const iv_obsp_csr_t *m, const int64_t *ids, int64_t r0, int64_t r1, int index_size,
                       int64_t *bids, int64_t *bptr, int32_t *idx32, iv_block_t *blk)
{
    int64_t a = m->indptr[r0], nnz = m->indptr[r1] - a;
    for (int64_t r = r0; r < r1; r++) bids[r - r0] = ids ? ids[r] : r;
    for (int64_t r = r0; r <= r1; r++) bptr[r - r0] = m->indptr[r] - a;
    if (index_size == 4)
        for (int64_t j = 0; j < nnz; j++) idx32[j] = (int32_t)m->indices[a + j];
    memset(blk, 0, sizeof *blk);
    blk->row0 = r0;
    blk->n_rows = r1 - r0;
    blk->ids = bids;
    blk->indptr = bptr;
    blk->indices = index_size == 4 ? (void *)idx32 : (void *)(m->indices + a);
    blk->data = (char *)m->data + (size_t)a * iv_dtype_size(m->dtype);
    blk->nnz = nnz;
    blk->index_size = index_size;
    blk->dtype = m->dtype;
}

/* The end of the block starting at row r0. */
static int64_t block_end(const iv_obsp_csr_t *m, int64_t r0)
{
    int64_t r1 = r0 + 1;
    while (r1 < m->n_rows && r1 - r0 < IV_API_OBSP_BLOCK_ROWS &&
           m->indptr[r1 + 1] - m->indptr[r0] <= IV_API_OBSP_BLOCK_NNZ)
        r1++;
    return r1;
}

/* The most entries of one block, and the number of blocks. */
static void block_stats(const iv_obsp_csr_t *m, int64_t *longest, int64_t *blocks)
{
    *longest = 0;
    *blocks = 0;
    for (int64_t r0 = 0; r0 < m->n_rows; ++*blocks) {
        int64_t r1 = block_end(m, r0);
        if (m->indptr[r1] - m->indptr[r0] > *longest) *longest = m->indptr[r1] - m->indptr[r0];
        r0 = r1;
    }
}

/* The blocks, each added to the JSON document or encoded into out. */
static int encode_blocks(const iv_obsp_csr_t *m, const int64_t *ids, iv_fmt_t fmt, size_t json_bytes,
                         int index_size, int64_t *bids, int64_t *bptr, int32_t *idx32, iv_jdoc_t *jd,
                         iv_buf_t *out, iv_err_t *err)
{
    for (int64_t r0 = 0; r0 < m->n_rows;) {
        int64_t r1 = block_end(m, r0);
        iv_block_t blk;
        make_block(m, ids, r0, r1, index_size, bids, bptr, idx32, &blk);
        if (fmt != IV_FMT_JSON) {
            iv_enc_block(out, fmt, &blk);
        } else {
            iv_jdoc_add(jd, &blk);
            if (iv_jdoc_bytes(jd) > json_bytes)
                return iv_fail(err, IV_ETOO_LARGE, "the obsp subset exceeds the JSON limit of %zu bytes; ask "
                               "for application/vnd.ivserve.csr or fewer cells", json_bytes);
        }
        r0 = r1;
    }
    return 0;
}

int iv_api_obsp_encode(const iv_obsp_csr_t *m, const int64_t *ids, iv_fmt_t fmt, size_t json_bytes,
                       iv_buf_t *out, iv_err_t *err)
{
    int index_size = m->n_cols <= INT32_MAX ? 4 : 8;
    iv_stream_hdr_t h = {m->n_rows, m->n_cols, m->dtype, index_size, 0, 0};
    int64_t longest, blocks;
    block_stats(m, &longest, &blocks);
    int64_t rows = m->n_rows < IV_API_OBSP_BLOCK_ROWS ? m->n_rows : IV_API_OBSP_BLOCK_ROWS;
    int64_t *bids = malloc((size_t)(rows + 1) * sizeof *bids);
    int64_t *bptr = malloc((size_t)(rows + 1) * sizeof *bptr);
    int32_t *idx32 = index_size == 4 ? malloc((size_t)(longest ? longest : 1) * sizeof *idx32) : NULL;
    int rc = 0;
    if (!bids || !bptr || (index_size == 4 && !idx32)) rc = iv_fail(err, IV_ENOMEM, "out of memory");
    iv_jdoc_t jd;
    iv_jdoc_init(&jd);
    /* Binary: the exact size, reserved once, so the body is never copied
     * as it grows. */
    if (rc == 0 && fmt == IV_FMT_BINARY)
        iv_buf_reserve(out, (size_t)iv_enc_binary_size(m->n_rows, blocks, m->nnz, index_size, m->dtype));
    if (rc == 0 && fmt != IV_FMT_JSON) iv_enc_header(out, fmt, &h);
    if (rc == 0) rc = encode_blocks(m, ids, fmt, json_bytes, index_size, bids, bptr, idx32, &jd, out, err);
    if (rc == 0 && fmt == IV_FMT_JSON) iv_jdoc_finish(&jd, &h, out);
    else if (rc == 0) iv_enc_trailer(out, fmt, 0, NULL, NULL, m->n_rows, m->nnz);
    if (rc == 0 && (out->oom || iv_jdoc_oom(&jd))) rc = iv_fail(err, IV_ENOMEM, "out of memory encoding obsp");
    iv_jdoc_free(&jd);
    free(bids);
    free(bptr);
    free(idx32);
    return rc;
}
