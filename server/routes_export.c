/*
 * POST|GET|HEAD /v1/datasets/{id}/export: the selection as a .h5ad file
 * (api/h5ad_export.h, docs/export-route.md).
 *
 * Design.  The file is made whole on a worker before the first byte goes
 * out, because an HDF5 file is not written front to back (its superblock
 * and object headers are finished last), so the answer cannot be a
 * stream of blocks the way /query is.  What it can share with /query is
 * everything else: the set-up parses and resolves the selection with the
 * query set-up's own code (setup_job.c setup_selection), and the answer is a
 * query stream (qstream.c) whose blocks are pieces of the file: a piece
 * is read on a worker (pread of the unlinked temporary file) only when
 * fewer than EXPORT_AHEAD pieces are between "read" and "written", and
 * the write budget holds the stream like any other.  So a slow reader
 * costs at most EXPORT_AHEAD pieces of memory, and the file's bytes live
 * only as long as the stream's descriptor.
 */
#include "srv_conn.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_ostream.h"
#include "srv_qstream.h"
#include "srv_respond.h"
#include "srv_routes.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../api/h5ad_export.h"

#define EXPORT_PIECE ((size_t)1 << 20)
#define EXPORT_AHEAD 2

/* The file behind an export stream, owned by the stream (qs->file). */
struct export_file {
    int fd;               /* the unlinked temporary file, or -1 */
    int64_t size;
    int64_t cells, genes; /* the selection's shape */
};

void export_file_free(struct export_file *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f);
}

/* ---- worker halves --------------------------------------------------------- */

/* The folder the file is written in: the configured cache folder, else
 * TMPDIR, else /tmp. */
static const char *export_tmpdir(const server_t *s)
{
    const char *t = getenv("TMPDIR");
    if (s->cfg->cache_dir && s->cfg->cache_dir[0]) return s->cfg->cache_dir;
    return t && t[0] ? t : "/tmp";
}

/* Refuses (413) a selection past limits.max_rows cells or limits.max_nnz
 * stored values, counted from the row pointers before any decode, or
 * whose decoded matrix (indices, values, row pointers), which the file is
 * written from before its first byte goes out, would pass
 * limits.max_answer_bytes. */
static int export_refused(const server_t *s, const iv_query_t *q, iv_err_t *err)
{
    const iv_limits_t *lim = &s->cfg->limits;
    int64_t rows = iv_query_n_rows(q), bound = iv_query_stored_bound(q, lim->max_nnz);
    double bytes = (double)bound * (double)(iv_query_index_size(q) + (int)iv_dtype_size(iv_query_dtype(q))) +
                   (double)(rows + 1) * 8.0;
    if (rows > lim->max_rows)
        return iv_fail(err, IV_ETOO_LARGE, "the export selects %" PRId64 " cells; the limit is "
                       "limits.max_rows = %" PRId64, rows, lim->max_rows);
    if (bound > lim->max_nnz)
        return iv_fail(err, IV_ETOO_LARGE, "the export selects more than %" PRId64 " stored values "
                       "(%" PRId64 " cells x %" PRId64 " genes); the limit is limits.max_nnz = %" PRId64,
                       lim->max_nnz, rows, iv_query_n_cols(q), lim->max_nnz);
    if (lim->max_answer_bytes && bytes > (double)lim->max_answer_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "the export's matrix (%" PRId64 " cells x %" PRId64 " genes, up to %"
                       PRId64 " stored values) takes %.0f bytes in memory while the file is written; the limit "
                       "is limits.max_answer_bytes = %zu", rows, iv_query_n_cols(q), bound, bytes,
                       lim->max_answer_bytes);
    return 0;
}

/* The selection's query over X, cells as rows: what `ivserve export`
 * builds. */
static int export_query(job_t *j, iv_qreq_t *qr, iv_dataset_t *mds, iv_query_t **q)
{
    IV_RETURN_IF(qr->matrix || mds != j->qs->ds->ds, &j->err, IV_EBAD_REQUEST,
                 "export writes X with its obs and var; \"matrix\" is not taken");
    IV_RETURN_IF(qr->by_var || qr->dense, &j->err, IV_EBAD_REQUEST,
                 "export writes cells as rows; \"by\" and \"dense\" are not taken");
    iv_sel_t so = iv_psel_view(&qr->obs), sv = iv_psel_view(&qr->var);
    iv_query_opts_t qo = {.axis = IV_OUT_ROWS, .pick = IV_PICK_AUTO};
    IV_TRY(iv_query_new(mds, &so, &sv, &qo, q, &j->err));
    return export_refused(j->srv, *q, &j->err);
}

static void export_run(job_t *j)
{
    struct export_file *f = j->qs->file;
    iv_qreq_t qr;
    iv_dataset_t *mds = NULL;
    iv_query_t *q = NULL;
    if ((j->rc = setup_selection(j, &qr, &mds)) != 0) return;
    j->rc = export_query(j, &qr, mds, &q);
    if (j->rc == 0) {
        f->cells = iv_query_n_rows(q);
        f->genes = iv_query_n_cols(q);
        iv_sel_t so = iv_psel_view(&qr.obs), sv = iv_psel_view(&qr.var);
        j->rc = iv_api_export_h5ad(mds, q, j->srv->pool, &so, &sv, export_tmpdir(j->srv),
                                   &j->qs->cancelled, &f->fd, &f->size, &j->err);
    }
    iv_query_free(q);
    iv_qreq_free(&qr);
}

/* Piece b of the file, read into j->out. */
static void piece_run(job_t *j)
{
    const struct export_file *f = j->qs->file;
    int64_t off = j->b * (int64_t)EXPORT_PIECE;
    size_t want = f->size - off < (int64_t)EXPORT_PIECE ? (size_t)(f->size - off) : EXPORT_PIECE;
    if (iv_buf_reserve(&j->out, want) != 0) {
        j->rc = iv_fail(&j->err, IV_ENOMEM, "out of memory reading the export");
        return;
    }
    while (j->out.len < want) {
        ssize_t n = pread(f->fd, j->out.data + j->out.len, want - j->out.len, off + (int64_t)j->out.len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            j->rc = iv_fail(&j->err, IV_EIO, "cannot read the export back: %s",
                            n < 0 ? strerror(errno) : "the file is shorter than written");
            return;
        }
        j->out.len += (size_t)n;
    }
}

/* ---- loop halves ------------------------------------------------------------- */

static const job_type_t piece_job;

/* The next piece, when fewer than EXPORT_AHEAD are unwritten and the
 * write budget has room (budget_wake resumes a waiting stream). */
void export_pump(qstream_t *qs)
{
    if (!qs->c || qs->done || !qs->prepared || qs->inflight || qs->next_submit >= qs->n_blocks) return;
    if (qs->next_submit - qs->writes_done >= EXPORT_AHEAD) return;
    if (!budget_room(qs->c)) {
        if (!qs->budget_wait) {
            qs->budget_wait = 1;
            budget_wait_count(qs->lp, 1);
        }
        return;
    }
    int rc = qs_submit(qs, &piece_job, qs->next_submit);
    if (rc != 0) {
        iv_err_t e;
        iv_err_clear(&e);
        iv_fail(&e, rc, "%s", iv_error_message(rc));
        qs_fail(qs, rc, &e);
        return;
    }
    qs->next_submit++;
}

/* The name the browser saves: the dataset id (letters, digits, '.', '-'
 * and '_' kept, others '_') and the number of cells. */
static void export_disposition(char *out, size_t cap, const char *id, int64_t cells)
{
    char safe[136];
    size_t n = 0;
    for (; id[n] && n < sizeof safe - 1; n++) {
        char ch = id[n];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '.' || ch == '-' || ch == '_';
        safe[n] = ok ? ch : '_';
    }
    safe[n] = '\0';
    snprintf(out, cap,
             "Content-Disposition: attachment; filename=\"%s_%" PRId64 "_cells.h5ad\"\r\n"
             "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n",
             safe[0] ? safe : "export", cells);
}

static void export_done(job_t *j)
{
    if (!qs_job_back(j)) return;
    qstream_t *qs = j->qs;
    conn_t *c = qs->c;
    struct export_file *f = qs->file;
    c->dropped = j->setup->dropped;
    c->dropped_hdr = j->setup->dropped_hdr;
    j->setup->dropped = j->setup->dropped_hdr = NULL;
    if (j->rc != 0) {
        iv_err_t e = j->err;
        int rc = j->rc;
        job_free(j);
        qs_fail(qs, rc, &e);
        return;
    }
    job_free(j);
    c->cells = f->cells;
    c->genes = f->genes;
    c->rows = f->cells;
    char extra[400];
    export_disposition(extra, sizeof extra, c->dsid, f->cells);
    os_head(c, 200, "application/x-hdf5", f->size, extra, 0);
    qs->headers_sent = 1;
    if (c->req->method == HTTP_HEAD || f->size == 0) {
        qs->done = 1;
        os_end(c, NULL, NULL);
        return;
    }
    if (os_write(c, NULL, 0, 0, 0, NULL) != 0) return;
    qs->prepared = 1;
    qs->n_blocks = (f->size + (int64_t)EXPORT_PIECE - 1) / (int64_t)EXPORT_PIECE;
    export_pump(qs);
}

static void piece_done(job_t *j)
{
    if (!qs_piece_back(j)) return;
    qstream_t *qs = j->qs;
    conn_t *c = qs->c;
    int last = j->b + 1 == qs->n_blocks;
    size_t len;
    char *p = iv_buf_steal(&j->out, &len);
    job_free(j);
    qs->next_write++;
    if (last) qs->done = 1;
    wpiece_t w = {p, len, 1};
    if (last) {
        os_end(c, &w, qs);
        return;
    }
    if (os_write(c, &w, 1, 0, 0, qs) != 0) return;
    export_pump(qs);
}

static const job_type_t export_job = {export_run, export_done};
static const job_type_t piece_job = {piece_run, piece_done};

void route_export(conn_t *c, sds_t *d)
{
    if (!method_ok(c, 1) || body_type_refused(c)) return;
    iv_http_req_t *r = c->req;
    const iv_dataset_info_t *info = iv_dataset_info(d->ds);
    setup_t *st = calloc(1, sizeof *st);
    struct export_file *f = calloc(1, sizeof *f);
    qstream_t *qs = st && f ? qs_new(c, d, 0) : NULL;
    if (!qs) {
        free(st);
        free(f);
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    f->fd = -1;
    qs->file = f;
    st->is_post = r->method == HTTP_POST;
    st->n_rows = info->n_rows;
    st->n_cols = info->n_cols;
    if (st->is_post) st->body = iv_buf_steal(&r->body, &st->body_len);
    else st->query = strdup(r->query ? r->query : "");
    if (!st->is_post && !st->query) {
        setup_free(st);
        qs_free(qs);
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    c->qs = qs;
    int rc = qs_submit_job(qs, &export_job, -1, st);
    if (rc != 0) {
        c->qs = NULL;
        qs->c = NULL;
        qs_free(qs);
        send_iv_error(c, rc, NULL);
    }
}
