/*
 * A query's set-up job and a viewer route's job, both halves.
 *
 * The route (routes_query.c) copies what the worker needs into a setup_t
 * and submits the job.  The run half, on a worker: parse the request,
 * resolve its names, choose the answer's form, build the query (setup_run;
 * for a small one, its prepare and only block too: setup_fuse), or build a
 * viewer route's whole answer (viewer_run).  The done half, on the loop:
 * check the limits, answer what needs no decode, reserve the answer's
 * memory and start the stream's decode jobs (route_query_finish, then
 * answer_go), or send the viewer's answer (route_viewer_finish).
 */
#include "srv_conn.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta_doc.h"

/* ---- the run half (worker) ---------------------------------------------- */

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
 * so, as an embedding's rows are (api/arrays_answer.c), a dense answer past
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
    iv_buf_t drop[2], fold[2];   /* index 0 obs, 1 var */
} name_report_t;

static void name_report_init(name_report_t *nr)
{
    for (int a = 0; a < 2; a++) {
        iv_buf_init(&nr->drop[a]);
        iv_buf_init(&nr->fold[a]);
    }
}

static void name_report_free(name_report_t *nr)
{
    for (int a = 0; a < 2; a++) {
        iv_buf_free(&nr->drop[a]);
        iv_buf_free(&nr->fold[a]);
    }
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
    dropped_hdr_axis(&dh, "obs", &nr->drop[0], share);
    iv_buf_puts(&dh, ",");
    dropped_hdr_axis(&dh, "var", &nr->drop[1], share);
    if (folded) {
        iv_buf_puts(&dh, ",\"folded\":{");
        dropped_hdr_axis(&dh, "obs", &nr->fold[0], share);
        iv_buf_puts(&dh, ",");
        dropped_hdr_axis(&dh, "var", &nr->fold[1], share);
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
    IV_TRY(iv_psel_resolve(&qr->obs, j->qs->ds->meta, IV_AXIS_OBS, &nr->drop[0], &nr->fold[0],
                           &j->err));
    IV_TRY(job_check_cancel(j));
    IV_TRY(iv_psel_resolve(&qr->var, var_meta, IV_AXIS_VAR, &nr->drop[1], &nr->fold[1], &j->err));
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
    int folded = nr.fold[0].len || nr.fold[1].len;
    if (rc == 0 && (show || folded)) {
        st->dropped = iv_psel_dropped_doc(nr.drop, nr.fold, folded);
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
static void setup_run(job_t *j)
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

/* A viewer route's answer (api/viewer.h), built whole on a worker: its
 * cost grows with the page (a 100,000-row CSV page takes about 90 ms). */
static void viewer_run(job_t *j)
{
    j->setup->vr->cancel = &j->qs->cancelled;
    j->rc = iv_vreq_run(j->setup->vr, &j->err);
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
    stream_encode_block(j, q, 0, st->fmt, st->dense, st->gz_level, 0);
    if (j->rc != 0) {
        /* Failed here as it would have in its block job: the stream ends
         * with the error, as there. */
        iv_buf_free(&j->out);
        return;
    }
    st->block0 = 1;
}

/* ---- the done half (loop thread) ---------------------------------------- */

/* Takes the set-up's results into the connection, the stream and *res.
 * The job is freed, or, when the set-up decoded block 0 of a fused
 * query (setup_fuse), waits in the stream's first slot (freed with the
 * stream if the answer is another). */
static void take_setup(job_t *j, setup_res_t *res)
{
    qstream_t *qs = j->qs;
    conn_t *c = qs->c;
    setup_t *st = j->setup;
    c->dropped = st->dropped;
    c->dropped_hdr = st->dropped_hdr;
    st->dropped = st->dropped_hdr = NULL;
    iv_query_t *q = qs->q = st->q;
    st->q = NULL;
    /* The access log's selection: cells x genes, whichever the rows are. */
    c->cells = iv_query_by_var(q) ? iv_query_n_cols(q) : iv_query_n_rows(q);
    c->genes = iv_query_by_var(q) ? iv_query_n_rows(q) : iv_query_n_cols(q);
    *res = (setup_res_t){.count = qs->count, .have_total = st->have_total, .dense = st->dense,
                         .prepared = st->prepared, .gz_level = st->gz_level, .total = st->total,
                         .fmt = st->fmt};
    if (!st->block0) {
        job_free(j);
        return;
    }
    setup_free(st);
    j->setup = NULL;
    j->b = 0;
    j->type = &block_job;
    qs->slots[0] = j;
}

/* Refuses (413) a matrix answer past the limits: rows or stored values,
 * dense cells, or a JSON document.  1 when it was refused. */
static int query_refused(conn_t *c, const iv_query_t *q, iv_fmt_t fmt, int dense)
{
    const iv_limits_t *lim = &c->srv->cfg->limits;
    int64_t rows = iv_query_n_rows(q), hint = iv_query_nnz_hint(q);
    char msg[256] = "";
    if (rows > lim->max_rows || hint > lim->max_nnz)
        snprintf(msg, sizeof msg,
                 "the query selects %" PRId64 " rows and %" PRId64
                 " stored values; the limits are %" PRId64 " rows and %" PRId64 " values",
                 rows, hint, lim->max_rows, lim->max_nnz);
    else if (dense && rows * iv_query_n_cols(q) > lim->max_nnz)
        /* Dense gene rows hold every (gene, cell) value. */
        snprintf(msg, sizeof msg,
                 "dense gene rows would hold %" PRId64 " x %" PRId64 " values; the limit is %" PRId64,
                 rows, iv_query_n_cols(q), lim->max_nnz);
    else if (fmt == IV_FMT_JSON && hint >= 0 && (uint64_t)hint * 4 + (uint64_t)rows * 4 > lim->json_bytes)
        /* Even at the shortest 4 bytes per number the document is too big. */
        snprintf(msg, sizeof msg,
                 "the result (%" PRId64 " values) exceeds the JSON limit of %zu bytes; ask for "
                 "application/vnd.ivserve.csr or application/x-ndjson",
                 hint, lim->json_bytes);
    if (!msg[0]) return 0;
    send_error(c, 413, "too_large", msg, NULL);
    return 1;
}

/* A count answered from the pointer arrays and computed columns, no
 * decode. */
static void answer_total(conn_t *c, iv_query_t *q, int64_t hint, double total)
{
    iv_buf_t body;
    iv_buf_init(&body);
    count_body(&body, c, q, hint, total);
    c->rows = iv_query_n_rows(q);
    c->nnz = hint;
    send_owned(c, 200, "application/json", &body, NULL);
}

/* HEAD of a matrix answer.  The length of a JSON document is not known
 * without building it: the head says nothing rather than something
 * false. */
static void answer_head(conn_t *c, qstream_t *qs, iv_fmt_t fmt)
{
    os_head(c, 200, iv_fmt_media_type(fmt), -1, stream_extra(qs), qs->gz_level > 0);
    os_end(c, NULL, NULL);
}

/* A count or a whole JSON document is one job; a stream is prepared, then
 * decoded block by block (qs_pump). */
static void start_answer(qstream_t *qs, const setup_res_t *res)
{
    conn_t *c = qs->c;
    const job_type_t *next = res->count ? &count_job : res->fmt == IV_FMT_JSON ? &whole_job : &prep_job;
    qs->fmt = res->fmt;
    qs->dense = res->dense;
    qs->have_total = res->have_total;
    qs->total = res->total;
    if (res->prepared) {
        /* Prepared on the set-up job (a stream: setup_fuse takes no
         * other): the blocks go on from here. */
        if (qs->slots[0]) {
            LP_METRIC(qs->lp, m_->blocks_decoded++);
            qs->next_submit = 1;
        }
        qs->prepared = 1;
        qs->n_blocks = iv_query_n_blocks(qs->q);
        qs_pump(qs);
        return;
    }
    int rc = qs_submit(qs, next, -1);
    if (rc != 0) {
        c->qs = NULL;
        qs->c = NULL;
        qs_free(qs);
        send_iv_error(c, rc, NULL);
    }
}

/* The loop half of a query's set-up, once the worker built the query: the
 * limits, the answers that need no decode, then the decode jobs. */
static void route_query_finish(job_t *j)
{
    if (!qs_job_back(j)) return;
    qstream_t *qs = j->qs;
    conn_t *c = qs->c;
    if (j->rc != 0) {
        iv_err_t e = j->err;
        int rc = j->rc;
        job_free(j);
        send_iv_error(c, rc, &e);
        return;
    }
    setup_res_t res;
    take_setup(j, &res);
    iv_query_t *q = qs->q;
    int64_t hint = iv_query_nnz_hint(q);
    if (!res.count) {
        if (query_refused(c, q, res.fmt, res.dense) || answer_reserve(c, qs, q, &res, hint) != 0) return;
    } else if (hint >= 0 && res.have_total) {
        answer_total(c, q, hint, res.total);
        return;
    }
    answer_go(qs, &res);
}

void answer_go(qstream_t *qs, const setup_res_t *res)
{
    conn_t *c = qs->c;
    if (!res->count) qs->gz_level = res->gz_level;
    if (!res->count && c->req->method == HTTP_HEAD) {
        answer_head(c, qs, res->fmt);
        return;
    }
    start_answer(qs, res);
}


/* The loop half of a viewer route: send what the worker built. */
static void route_viewer_finish(job_t *j)
{
    if (!qs_job_back(j)) return;
    conn_t *c = j->qs->c;
    setup_t *st = j->setup;
    if (j->rc == 0) {
        /* The header is bounded as the query route's is. */
        if (st->vr->dropped && strlen(st->vr->dropped) <= DROPPED_HDR_MAX) {
            c->dropped_hdr = st->vr->dropped;
            st->vr->dropped = NULL;
        } else if (st->vr->dropped) {
            c->dropped_hdr = strdup("{\"truncated\":true}");
        }
        if (st->vr->status == 304)
            send_simple(c, 304, NULL, NULL, 0, st->vr->extra);
        else if (budget_admit(c, st->vr->out.len) == 0)
            send_owned(c, 200, st->vr->ctype, &st->vr->out, st->vr->extra);
    } else {
        send_iv_error(c, j->rc, &j->err);
    }
    job_free(j);
}

const job_type_t setup_job = {setup_run, route_query_finish};
const job_type_t viewer_job = {viewer_run, route_viewer_finish};
