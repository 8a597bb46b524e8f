/*
 * A query stream's decode jobs, both halves: prepare (prep_job), one
 * block (block_job), a whole JSON document (whole_job), a count
 * (count_job).  The run half decodes and encodes on a worker (gzip
 * included, as pieces of the stream's member); the done half, on the
 * loop, hands the result to the stream (qstream.c orders the blocks and
 * writes them) or sends the one-job answer.
 */
#include "srv_conn.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include <stdlib.h>
#include <string.h>

#include "encode.h"

/* ---- the run half (worker) ---------------------------------------------- */

/* A streamed query's prepare step (see iv_query_prepare). */
static void prep_run(job_t *j)
{
    j->rc = iv_query_prepare(j->qs->q, j->srv->pool, &j->err);
}

/* A streamed block's bytes are compressed in pieces of this size on the
 * pool: a gene over ten million cells is one block of about 1-3 MB, which
 * took 12 ms on one core (10 M cells, 16 cores; 4.8 ms unencoded).  64 KiB
 * spreads such a block over the 16 cores, and leaves at most one piece a
 * block with both a binary frame's indices and its values, so that
 * iv_gz_block's choice (stored or compressed) sees them apart. */
#define GZ_BLOCK_PIECE ((size_t)64 << 10)

/* Compresses a job's output where it was encoded, on the worker: a block
 * becomes one piece of the stream's gzip member (gzip_stream.h), the whole
 * JSON document (whole) a member of its own (its pieces on the free
 * workers). */
static int gz_job_out(job_t *j, int whole, int level)
{
    iv_buf_t z;
    iv_buf_init(&z);
    j->raw_len = j->out.len;
    int rc = whole ? iv_gz_member(&z, j->out.data, j->out.len, level, j->srv->pool)
                   : iv_gz_pieces(&z, j->out.data, j->out.len, GZ_BLOCK_PIECE, level, &j->crc,
                                  j->srv->pool);
    iv_buf_free(&j->out);
    if (rc != 0) {
        iv_buf_free(&z);
        return iv_fail(&j->err, rc, rc == IV_ENOMEM ? "out of memory compressing the answer"
                                                     : "the compressor failed");
    }
    j->out = z;
    return 0;
}

/* A binary block's indices and values of at least this many bytes are
 * sent from the engine's arrays rather than copied into the frame. */
#define TAIL_MIN_BYTES ((size_t)64 << 10)

/*
 * Block b of query q, decoded and encoded into j's out (rows, nnz, and
 * for gzip its CRC).  With tails, a large
 * binary block's indices and values stay in the engine's arrays, taken
 * into j->tail, and j->out holds only the rest of the frame: the answer's
 * bytes are the same and one copy of them is saved.
 */
void stream_encode_block(job_t *j, iv_query_t *q, int64_t b, iv_fmt_t fmt, int dense, int gz_level,
                         int tails)
{
    iv_block_t blk;
    memset(&blk, 0, sizeof blk);
    j->rc = iv_query_decode_block(q, b, &blk, &j->err);
    if (j->rc == 0) {
        iv_stream_hdr_t h = iv_stream_hdr_of(q, dense);
        size_t ib = iv_block_array_bytes(&blk, 0), vb = iv_block_array_bytes(&blk, 1);
        if (tails && fmt == IV_FMT_BINARY && !h.dense && !gz_level && ib + vb >= TAIL_MIN_BYTES) {
            iv_enc_block_head(&j->out, &h, &blk, 0);
            j->tail[0] = blk.indices;
            j->tail[1] = blk.data;
            j->tail_len[0] = ib;
            j->tail_len[1] = vb;
            blk.indices = blk.data = NULL;
        } else {
            iv_enc_block_h(&j->out, fmt, &h, &blk);
        }
        j->rows = blk.n_rows;
        j->nnz = blk.nnz;
        if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory encoding a block");
        else if (gz_level) j->rc = gz_job_out(j, 0, gz_level);
    }
    iv_block_free(&blk);
}

/* One block of a streamed query, decoded and encoded. */
static void block_run(job_t *j)
{
    qstream_t *qs = j->qs;
    stream_encode_block(j, qs->q, j->b, qs->fmt, qs->dense, qs->gz_level, 1);
}

/* Block blk of a whole-document or count job: its stored values counted
 * (and summed for a count the metadata does not know), or its rows added
 * to the document within the JSON limit. */
static void take_block(job_t *j, iv_jdoc_t *d, const iv_stream_hdr_t *h, const iv_block_t *blk, int count)
{
    qstream_t *qs = j->qs;
    j->nnz += blk->nnz;
    if (count) {
        if (!qs->have_total)
            for (int64_t k = 0; k < blk->nnz; k++) j->total += iv_dtype_get_f64(blk->dtype, blk->data, (size_t)k);
        return;
    }
    size_t limit = j->srv->cfg->limits.json_bytes;
    iv_jdoc_add_h(d, h, blk);
    if (iv_jdoc_oom(d))
        j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory building the JSON result");
    else if (iv_jdoc_bytes(d) > limit)
        j->rc = iv_fail(&j->err, IV_ETOO_LARGE,
                        "the result exceeds the JSON limit of %zu bytes; ask for "
                        "application/vnd.ivserve.csr or application/x-ndjson",
                        limit);
}

/* Every block of a query in one job: the whole JSON document, or (count)
 * the stored values and their sum, unless the metadata already knows. */
static void decode_all(job_t *j, int count)
{
    qstream_t *qs = j->qs;
    j->rc = iv_query_prepare(qs->q, j->srv->pool, &j->err);
    int64_t hint = iv_query_nnz_hint(qs->q);
    iv_jdoc_t d;
    iv_jdoc_init(&d);
    iv_stream_hdr_t h = iv_stream_hdr_of(qs->q, qs->dense);
    int64_t nb = iv_query_n_blocks(qs->q);
    if (count && hint >= 0 && qs->have_total) {
        j->nnz = hint;
        nb = 0;
    }
    for (int64_t b = 0; j->rc == 0 && b < nb; b++) {
        if (job_cancelled(j)) {
            j->rc = job_cancel_rc(j);
            break;
        }
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        j->rc = iv_query_decode_block(qs->q, b, &blk, &j->err);
        if (j->rc == 0) take_block(j, &d, &h, &blk, count);
        iv_block_free(&blk);
    }
    if (j->rc == 0 && !count) {
        iv_jdoc_finish(&d, &h, &j->out);
        if (j->out.oom) j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory building the JSON result");
        else if (qs->gz_level) j->rc = gz_job_out(j, 1, qs->gz_level);
    }
    j->rows = iv_query_n_rows(qs->q);
    iv_jdoc_free(&d);
}

static void whole_run(job_t *j)
{
    decode_all(j, 0);
}

static void count_run(job_t *j)
{
    decode_all(j, 1);
}

/* ---- the done half (loop thread) ---------------------------------------- */

/* qs_piece_back for a decode job (prepare, block, whole, count), whose
 * time the metrics count. */
static int decode_back(job_t *j)
{
    LP_METRIC(j->lp, m_->decode_seconds += j->secs);
    return qs_piece_back(j);
}

static void prep_done(job_t *j)
{
    if (!decode_back(j)) return;
    qstream_t *qs = j->qs;
    qs->prepared = 1;
    qs->n_blocks = iv_query_n_blocks(qs->q);
    job_free(j);
    qs_pump(qs);
}

static void block_done(job_t *j)
{
    if (!decode_back(j)) return;
    qstream_t *qs = j->qs;
    LP_METRIC(j->lp, m_->blocks_decoded++);
    qs->slots[j->b % qs->ahead] = j;
    qs_pump(qs);
}

/* A one-job answer (a whole JSON document, a count) is back: its stream
 * is done and the access log gets its size.  NULL when decode_back took
 * the job (the client left, or the job's error was answered). */
static conn_t *whole_back(job_t *j)
{
    if (!decode_back(j)) return NULL;
    conn_t *c = j->qs->c;
    j->qs->done = 1;
    c->rows = j->rows;
    c->nnz = j->nnz;
    return c;
}

static void whole_done(job_t *j)
{
    conn_t *c = whole_back(j);
    if (!c) return;
    if (budget_admit(c, j->out.len) == 0) send_owned(c, 200, "application/json", &j->out, stream_extra(j->qs));
    job_free(j);
}

static void count_done(job_t *j)
{
    conn_t *c = whole_back(j);
    if (!c) return;
    qstream_t *qs = j->qs;
    iv_buf_t body;
    iv_buf_init(&body);
    count_body(&body, c, qs->q, j->nnz, qs->have_total ? qs->total : j->total);
    send_owned(c, 200, "application/json", &body, NULL);
    job_free(j);
}

const job_type_t prep_job = {prep_run, prep_done};
const job_type_t block_job = {block_run, block_done};
const job_type_t whole_job = {whole_run, whole_done};
const job_type_t count_job = {count_run, count_done};
