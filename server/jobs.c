/*
 * Jobs: the work the loop hands to the worker pool, and the way back.
 *
 * A job runs on a worker and ends with loop_post (server.c), which pushes
 * it on its loop's locked list of finished jobs and wakes that loop
 * (uv_async_send); the loop takes the whole list in one swap (on_async)
 * and hands each job to the completion of its kind.  Workers
 * never touch loop objects: a job's inputs are copies (setup_t), and its
 * results travel back in the job.  The query jobs here (a query's set-up,
 * a metadata page, prepare, one block, a whole JSON document or a count)
 * look at their stream's cancel flag between phases, so that work for a
 * client that left stops early.
 */
#include "server_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "encode.h"
#include "routes_meta.h"

void setup_free(setup_t *st)
{
    if (!st) return;
    free(st->body);
    free(st->query);
    free(st->accept);
    iv_query_free(st->q);
    free(st->dropped);
    iv_vreq_free(st->vr);
    free(st->dropped_hdr);
    free(st);
}

/* Loop thread (or after the loop stopped): a load job's reference on its
 * dataset is dropped here. */
void job_free(job_t *j)
{
    iv_buf_free(&j->out);
    free(j->tail[0]);
    free(j->tail[1]);
    setup_free(j->setup);
    ds_unref(j->srv, j->ds);
    free(j);
}

/* ---- query jobs (worker) ------------------------------------------------ */

/* True when the stream's client left or the server stops: a worker drops
 * the rest of the job.  Checked between the phases of a job. */
static int job_cancelled(job_t *j)
{
    return j->qs && atomic_load_explicit(&j->qs->cancelled, memory_order_relaxed);
}

static int job_cancel_rc(job_t *j)
{
    return iv_fail(&j->err, IV_ECANCELLED, "the client went away");
}

/* Length of the longest prefix of the JSON string array arr (of len
 * bytes) that ends at an element and fits in max bytes with its closing
 * ']'; *total and *kept count the elements. */
static size_t json_array_cut(const char *arr, size_t len, size_t max, size_t *total, size_t *kept)
{
    size_t cut = 1, n = 0, k = 0;
    int in_str = 0, esc = 0;
    for (size_t i = 1; i < len; i++) {
        char ch = arr[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (ch == '\\') esc = 1;
            else if (ch == '"') {
                in_str = 0;
                n++;
                if (i + 2 <= max) {
                    cut = i + 1;
                    k = n;
                }
            }
        } else if (ch == '"') {
            in_str = 1;
        }
    }
    *total = n;
    *kept = k;
    return cut;
}

/* Appends one axis of the bounded header form: the names that fit, and
 * when some did not, the count of all of them. */
static void dropped_hdr_axis(iv_buf_t *b, const char *key, const iv_buf_t *arr, size_t budget)
{
    iv_buf_printf(b, "\"%s\":", key);
    if (!arr->len) {
        iv_buf_puts(b, "[]");
        return;
    }
    size_t total, kept, cut = json_array_cut(arr->data, arr->len, budget, &total, &kept);
    if (kept == total) {
        iv_buf_append(b, arr->data, arr->len);
        return;
    }
    iv_buf_append(b, arr->data, cut);
    iv_buf_printf(b, "],\"%s_count\":%zu,\"%s_truncated\":true", key, total, key);
}

/* The worker half of a query's set-up (see setup_t). */
static void setup_fuse(job_t *j);

/* a * b, or UINT64_MAX when that overflows. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/*
 * A dense answer (gene rows of one value per selected cell) costs its
 * size in encoding work whatever is stored: genes x cells values of at
 * least two bytes each in NDJSON or JSON ("0,"), the value's size in
 * binary.  A small body listing genes or cells again and again could ask
 * for gigabytes of zeros (0.4 MB made 800 MB of NDJSON and 16 s of CPU),
 * so, as an embedding's rows are (routes_viewer.c), a dense answer past
 * limits.max_answer_bytes is refused before any work, unless it is no
 * larger than the same encoding of the whole matrix: only duplicates
 * can make it larger, and a selection without them is served as before.
 * Sparse answers stream as stored and are not bounded here.
 */
static int dense_refused(const iv_dataset_info_t *info, iv_fmt_t fmt, const iv_sel_t *so,
                         const iv_sel_t *sv, size_t limit, iv_err_t *err)
{
    uint64_t per = fmt == IV_FMT_BINARY ? iv_dtype_size(info->value_dtype) : 2;
    uint64_t cells = (uint64_t)(so->all ? info->n_rows : so->n);
    uint64_t genes = (uint64_t)(sv->all ? info->n_cols : sv->n);
    uint64_t answer = mul_sat(mul_sat(genes, cells), per);
    uint64_t whole = mul_sat(mul_sat((uint64_t)info->n_rows, (uint64_t)info->n_cols), per);
    if (!limit || answer <= limit || answer <= whole) return 0;
    return iv_fail(err, IV_ETOO_LARGE,
                   "dense gene rows of %" PRIu64 " genes x %" PRIu64 " cells take at least %" PRIu64
                   " bytes as %s: more than the %zu an answer may hold (max_answer_bytes) and more "
                   "than the whole matrix dense; select fewer genes or cells, or ask for sparse "
                   "gene rows (without dense)",
                   genes, cells, answer, iv_fmt_media_type(fmt), limit);
}

/* IV_ECANCELLED when the job is to stop (see job_cancelled), else 0. */
static int job_check_cancel(job_t *j)
{
    return job_cancelled(j) ? job_cancel_rc(j) : 0;
}

/* Parses the request into *qr and opens the matrix it names: "matrix" is
 * X, a layer or raw/X; its axis lengths bound the selection, raw/X's
 * genes are raw/var's (registry.h).  *qr is owned by the caller on 0. */
static int setup_parse(job_t *j, iv_qreq_t *qr, iv_dataset_t **mds, iv_meta_t **var_meta)
{
    setup_t *st = j->setup;
    sds_t *d = j->qs->ds;
    int rc;
    if (st->is_post)
        rc = iv_qreq_parse_json_m(st->body ? st->body : "", st->body_len, iv_rds_matrix_shape, d,
                                  qr, &j->err);
    else
        rc = iv_qreq_parse_query_m(st->query, strlen(st->query), iv_rds_matrix_shape, d, qr,
                                   &j->err);
    if (rc == 0 && (rc = iv_rds_matrix(d, qr->matrix, mds, var_meta, &j->err)) != 0)
        iv_qreq_free(qr);
    return rc;
}

/* The names a resolution reports on: those dropped and those matched
 * only by ignoring case, of each axis (JSON arrays, or empty). */
typedef struct name_report {
    iv_buf_t drop_obs, drop_var, fold_obs, fold_var;
} name_report_t;

static void name_report_init(name_report_t *nr)
{
    iv_buf_init(&nr->drop_obs);
    iv_buf_init(&nr->drop_var);
    iv_buf_init(&nr->fold_obs);
    iv_buf_init(&nr->fold_var);
}

static void name_report_free(name_report_t *nr)
{
    iv_buf_free(&nr->drop_obs);
    iv_buf_free(&nr->drop_var);
    iv_buf_free(&nr->fold_obs);
    iv_buf_free(&nr->fold_var);
}

/* Appends a reported list, "[]" when empty.  Buffers are not
 * NUL-terminated: copied by length. */
static void put_name_list(iv_buf_t *b, const iv_buf_t *list)
{
    if (list->len) iv_buf_append(b, list->data, list->len);
    else iv_buf_puts(b, "[]");
}

/* The count body's form of the report, whole: names matched only by
 * ignoring case are reported beside the dropped ones, under "folded". */
static char *dropped_body(const name_report_t *nr, int folded)
{
    char *s = NULL;
    iv_buf_t dj;
    iv_buf_init(&dj);
    iv_buf_puts(&dj, "{\"obs\":");
    put_name_list(&dj, &nr->drop_obs);
    iv_buf_puts(&dj, ",\"var\":");
    put_name_list(&dj, &nr->drop_var);
    if (folded) {
        iv_buf_puts(&dj, ",\"folded\":{\"obs\":");
        put_name_list(&dj, &nr->fold_obs);
        iv_buf_puts(&dj, ",\"var\":");
        put_name_list(&dj, &nr->fold_var);
        iv_buf_puts(&dj, "}");
    }
    iv_buf_append(&dj, "}", 2);  /* the NUL makes it a C string */
    if (!dj.oom) s = iv_buf_steal(&dj, NULL);
    iv_buf_free(&dj);
    return s;
}

/* The header form of the report, bounded: a request of a million unknown
 * names would otherwise send a header of megabytes. */
static char *dropped_header(const name_report_t *nr, int folded)
{
    char *s = NULL;
    size_t share = folded ? DROPPED_HDR_MAX / 4 : DROPPED_HDR_MAX / 2;
    iv_buf_t dh;
    iv_buf_init(&dh);
    iv_buf_puts(&dh, "{");
    dropped_hdr_axis(&dh, "obs", &nr->drop_obs, share);
    iv_buf_puts(&dh, ",");
    dropped_hdr_axis(&dh, "var", &nr->drop_var, share);
    if (folded) {
        iv_buf_puts(&dh, ",\"folded\":{");
        dropped_hdr_axis(&dh, "obs", &nr->fold_obs, share);
        iv_buf_puts(&dh, ",");
        dropped_hdr_axis(&dh, "var", &nr->fold_var, share);
        iv_buf_puts(&dh, "}");
    }
    iv_buf_append(&dh, "}", 2);
    if (!dh.oom) s = iv_buf_steal(&dh, NULL);
    iv_buf_free(&dh);
    return s;
}

/* Resolves both axes' names and filters, checking for a cancel before,
 * between and after. */
static int resolve_names(job_t *j, iv_qreq_t *qr, iv_meta_t *var_meta, name_report_t *nr)
{
    IV_TRY(job_check_cancel(j));
    IV_TRY(iv_rmeta_resolve_ex(j->qs->ds->meta, IV_AXIS_OBS, &qr->obs, &nr->drop_obs, &nr->fold_obs,
                               &j->err));
    IV_TRY(job_check_cancel(j));
    IV_TRY(iv_rmeta_resolve_ex(var_meta, IV_AXIS_VAR, &qr->var, &nr->drop_var, &nr->fold_var, &j->err));
    return job_check_cancel(j);
}

/* Names and filters: a bitmap pass over the axis (about 1.5 ms for a
 * four-term filter on 200,000 cells).  The names dropped (when the
 * request asked to ignore missing ones) or folded go to st->dropped and
 * st->dropped_hdr. */
static int setup_names(job_t *j, iv_qreq_t *qr, iv_meta_t *var_meta)
{
    setup_t *st = j->setup;
    int show = qr->obs.missing_ignore || qr->var.missing_ignore;
    name_report_t nr;
    name_report_init(&nr);
    int rc = resolve_names(j, qr, var_meta, &nr);
    int folded = nr.fold_obs.len || nr.fold_var.len;
    if (rc == 0 && (show || folded)) {
        st->dropped = dropped_body(&nr, folded);
        st->dropped_hdr = dropped_header(&nr, folded);
    }
    name_report_free(&nr);
    return rc;
}

/* Total counts without decoding: the computed per-row sums of the axis
 * whose opposite axis is wholly selected. */
static void setup_total(job_t *j, const iv_qreq_t *qr, iv_dataset_t *mds)
{
    setup_t *st = j->setup;
    sds_t *d = j->qs->ds;
    if (!st->count || !d->meta || mds != d->ds) return;
    iv_axis_t maj = iv_dataset_info(mds)->orient == IV_IVCSR ? IV_AXIS_OBS : IV_AXIS_VAR;
    const iv_psel_t *pm = maj == IV_AXIS_OBS ? &qr->obs : &qr->var;
    const iv_psel_t *po = maj == IV_AXIS_OBS ? &qr->var : &qr->obs;
    if (po->kind == IV_PSEL_ALL)
        st->have_total = iv_rmeta_total_counts(d->meta, maj, pm->kind == IV_PSEL_ALL ? NULL : pm->idx,
                                               pm->n, &st->total) == 0;
}

/* The answer's encoding: the format parameter, else Accept. */
static int setup_format(job_t *j, const iv_qreq_t *qr)
{
    setup_t *st = j->setup;
    st->fmt = qr->format ? qr->format : iv_fmt_from_accept(st->accept);
    if (!st->count && st->fmt == IV_FMT_NONE)
        return iv_fail(&j->err, IV_ENOT_ACCEPTABLE,
                       "acceptable encodings: application/vnd.ivserve.csr, "
                       "application/x-ndjson, application/json");
    return 0;
}

/* The query over the matrix, after the dense-answer bound. */
static int setup_query(job_t *j, const iv_qreq_t *qr, iv_dataset_t *mds)
{
    setup_t *st = j->setup;
    iv_sel_t so = iv_psel_view(&qr->obs), sv = iv_psel_view(&qr->var);
    if (qr->dense && !st->count)
        IV_TRY(dense_refused(iv_dataset_info(mds), st->fmt, &so, &sv,
                             j->srv->cfg->limits.max_answer_bytes, &j->err));
    iv_query_opts_t qo = {.axis = qr->by_var ? IV_OUT_VARS : IV_OUT_ROWS,
                          .pick = IV_PICK_AUTO,
                          .max_work_bytes = (int64_t)j->srv->cfg->limits.max_answer_bytes};
    st->dense = qr->dense;
    if (qr->dense) {
        /* A dense gene row holds one value per selected cell: about 8 MiB
         * of them a block. */
        int64_t cells = so.all ? st->n_rows : so.n;
        qo.block_rows = cells > 0 ? ((int64_t)8 << 20) / (cells * 8) : 0;
        if (qo.block_rows < 1) qo.block_rows = 1;
    }
    return iv_query_new(mds, &so, &sv, &qo, &st->q, &j->err);
}

int setup_selection(job_t *j, iv_qreq_t *qr, iv_dataset_t **mds)
{
    iv_meta_t *var_meta = NULL;
    IV_TRY(job_check_cancel(j));
    IV_TRY(setup_parse(j, qr, mds, &var_meta));
    int rc = setup_names(j, qr, var_meta);
    if (rc != 0) iv_qreq_free(qr);
    return rc;
}

/* A query's set-up on a worker: parse, resolve names, the answer's form,
 * the query; then, for a small one, its first steps too (setup_fuse). */
void setup_run(job_t *j)
{
    iv_qreq_t qr;
    iv_dataset_t *mds = NULL;
    iv_meta_t *var_meta = NULL;
    if ((j->rc = job_check_cancel(j)) != 0) return;
    if ((j->rc = setup_parse(j, &qr, &mds, &var_meta)) != 0) return;
    j->rc = setup_names(j, &qr, var_meta);
    if (j->rc == 0) setup_total(j, &qr, mds);
    if (j->rc == 0) j->rc = setup_format(j, &qr);
    if (j->rc == 0) j->rc = job_check_cancel(j);
    if (j->rc == 0) j->rc = setup_query(j, &qr, mds);
    iv_qreq_free(&qr);
    if (j->rc == 0) setup_fuse(j);
}

/* A viewer route's answer (routes_viewer.h), built whole on a worker: its
 * cost grows with the page (a 100,000-row CSV page takes about 90 ms). */
void viewer_run(job_t *j)
{
    j->setup->vr->cancel = &j->qs->cancelled;
    j->rc = iv_vreq_run(j->setup->vr, &j->err);
}

/* A streamed query's prepare step (see iv_query_prepare). */
void prep_run(job_t *j)
{
    j->rc = iv_query_prepare(j->qs->q, j->srv->pool, &j->err);
}

/* A streamed block's bytes are compressed in pieces of this size on the
 * pool: a gene over ten million cells is one block of about 3 MB, which
 * took 12 ms on one core (10 M cells, 16 cores; 4.8 ms unencoded). */
#define GZ_BLOCK_PIECE ((size_t)256 << 10)

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
static void encode_block(job_t *j, iv_query_t *q, int64_t b, iv_fmt_t fmt, int dense, int gz_level,
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
void block_run(job_t *j)
{
    qstream_t *qs = j->qs;
    encode_block(j, qs->q, j->b, qs->fmt, qs->dense, qs->gz_level, 1);
}

/* The most a query may select to be answered by its set-up job alone. */
#define FUSE_MAX_ROWS 4096
#define FUSE_MAX_NNZ ((int64_t)1 << 16)

/* Whether the set-up's query is a small stream within every limit. */
static int fusable(const setup_t *st, const iv_limits_t *lim)
{
    iv_query_t *q = st->q;
    int64_t rows = iv_query_n_rows(q);
    if (!st->fuse || st->count || (st->fmt != IV_FMT_BINARY && st->fmt != IV_FMT_NDJSON) ||
        rows > FUSE_MAX_ROWS || rows > lim->max_rows ||
        (st->dense && rows * iv_query_n_cols(q) > lim->max_nnz))
        return 0;
    /* The stored values the decode visits bound the answer's. */
    int64_t bound = iv_query_stored_bound(q, FUSE_MAX_NNZ);
    return bound <= FUSE_MAX_NNZ && bound <= lim->max_nnz;
}

/*
 * A small streamed query (a cell, a few genes of a few cells: the bulk of
 * a viewer's requests) goes on in its set-up job: prepare, and when it is
 * one block, that block decoded and encoded.  Three hand-offs between the
 * loop and the workers become one.  Only queries within every limit are
 * taken on (the loop still checks them and answers 413 for the others),
 * and the answer is the same bytes the prepare and block jobs write.
 */
static void setup_fuse(job_t *j)
{
    setup_t *st = j->setup;
    iv_query_t *q = st->q;
    if (!fusable(st, &j->srv->cfg->limits)) return;
    if ((j->rc = iv_query_prepare(q, j->srv->pool, &j->err)) != 0) return;
    st->prepared = 1;
    if (iv_query_n_blocks(q) != 1 || job_cancelled(j)) return;
    encode_block(j, q, 0, st->fmt, st->dense, st->gz_level, 0);
    if (j->rc != 0) {
        /* Failed here as it would have in its block job: the stream ends
         * with the error, as there. */
        iv_buf_free(&j->out);
        return;
    }
    st->block0 = 1;
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

void whole_run(job_t *j)
{
    decode_all(j, 0);
}

void count_run(job_t *j)
{
    decode_all(j, 1);
}

/* ---- running a job ------------------------------------------------------- */

/* The pool's entry for every job: its type's run half, unless the client
 * left while the job waited in the queue, then the hand-off. */
static void job_exec(void *arg)
{
    job_t *j = arg;
    double t0 = now_s();
    if (job_cancelled(j)) {
        j->rc = job_cancel_rc(j);
        j->cancelled = 1;
    } else {
        j->type->run(j);
    }
    j->secs = now_s() - t0;
    loop_post(j->lp, j);
}

int job_submit(job_t *j)
{
    if (!j->lp) j->lp = &j->srv->loops[0];
    return iv_pool_try_submit(j->srv->pool, job_exec, j);
}

int job_submit_server(job_t *j)
{
    if (!j->lp) j->lp = &j->srv->loops[0];
    return iv_pool_submit(j->srv->pool, job_exec, j);
}
