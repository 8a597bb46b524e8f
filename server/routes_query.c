/*
 * The routes whose answers are computed on a worker: a query or count
 * (route_query) and the viewer routes (route_viewer), which include the
 * obs and var tables and columns.  Each copies what the worker needs from
 * the request into a setup_t and hands it to the first job of a new
 * stream (submit_setup): setup_job.c holds that job's two halves.
 */
#include "srv_conn.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_qstream.h"
#include "srv_respond.h"
#include "srv_routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coding.h"
#include "enc_dataset.h"

/* The body of a count answer; nnz and total from the pointer arrays and the
 * computed metadata columns, or from a decode when those do not suffice. */
void count_body(iv_buf_t *b, const conn_t *c, const iv_query_t *q, int64_t nnz, double total)
{
    iv_enc_count(b, q, nnz, total, c->qs && c->qs->ds ? c->qs->ds->ds : NULL, c->dropped);
}

/* Hands st (owned from here on) to a worker as the first job (of type
 * type) of a new stream for c, a count answer when count is set.  The
 * stream exists from now on, so that a client that goes away detaches it;
 * failures are answered here. */
static void submit_setup(conn_t *c, sds_t *d, setup_t *st, int count, const job_type_t *type)
{
    qstream_t *qs = qs_new(c, d, count);
    if (!qs) {
        setup_free(st);
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    c->qs = qs;
    int rc = qs_submit_job(qs, type, -1, st);
    if (rc != 0) {
        /* A full queue is 503 with Retry-After; out of memory is its own error. */
        c->qs = NULL;
        qs->c = NULL;
        qs_free(qs);
        send_iv_error(c, rc, NULL);
    }
}

/* A dataset whose file was written in place can no longer read all of its
 * matrix: its queries are refused, all alike, until it is reloaded
 * (filecheck.h).  Answers under way finish from the chunks they find
 * cached, or end with the same error at the first chunk they would read. */
static int file_refused(conn_t *c, sds_t *d)
{
    char msg[480], shown[480];
    if (iv_dataset_file_state(d->ds, msg, sizeof msg) != IV_FILE_CHANGED) return 0;
    /* The client is told the file's name, not the folder it is served
     * from; the log keeps the whole message. */
    send_error(c, iv_error_status(IV_EFILE_CHANGED), iv_error_code(IV_EFILE_CHANGED),
               iv_enc_file_msg(d->ds, msg, shown, sizeof shown), "Retry-After: 10\r\n");
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    return 1;
}

/* Refuses (415) a POST body that is not JSON.  curl -d sends
 * form-urlencoded by default; its body is still our JSON.  1 when it was
 * refused. */
int body_type_refused(conn_t *c)
{
    iv_http_req_t *r = c->req;
    const char *ct = r->hdr[IV_H_CONTENT_TYPE];
    if (r->method != HTTP_POST || !ct || !r->body.len || strncasecmp(ct, "application/json", 16) == 0 ||
        strncasecmp(ct, "application/x-www-form-urlencoded", 33) == 0 || strncasecmp(ct, "text/plain", 10) == 0)
        return 0;
    send_error(c, 415, "unsupported_media", "the request body must be application/json", NULL);
    return 1;
}

/* The set-up's copy of the request for the worker (see setup_t), or NULL
 * when out of memory. */
static setup_t *query_setup_new(conn_t *c, const iv_dataset_info_t *info, int count)
{
    iv_http_req_t *r = c->req;
    setup_t *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->is_post = r->method == HTTP_POST;
    st->count = count;
    st->n_rows = info->n_rows;
    st->n_cols = info->n_cols;
    if (st->is_post) st->body = iv_buf_steal(&r->body, &st->body_len);
    else st->query = strdup(r->query ? r->query : "");
    if (r->hdr[IV_H_ACCEPT]) st->accept = strdup(r->hdr[IV_H_ACCEPT]);
    st->fuse = !count && r->method != HTTP_HEAD;
    /* A count is never compressed; a query answer is gzip or identity. */
    int level = c->srv->cfg->gzip_level;
    if (!count && iv_coding_pick(r->hdr[IV_H_ACCEPT_ENCODING], IV_ANSWER_STREAM, level) == IV_CODING_GZIP)
        st->gz_level = level;
    if ((!st->is_post && !st->query) || (r->hdr[IV_H_ACCEPT] && !st->accept)) {
        setup_free(st);
        return NULL;
    }
    return st;
}

void route_query(conn_t *c, sds_t *d, int count)
{
    if (!method_ok(c, 1) || file_refused(c, d) || body_type_refused(c)) return;
    /* The rest of the set-up runs on a worker (see setup_t). */
    setup_t *st = query_setup_new(c, iv_dataset_info(d->ds), count);
    if (!st) {
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    submit_setup(c, d, st, count, &setup_job);
}

/* api/viewer.h's matrix_open over the registry entry (ctx). */
static int viewer_matrix(void *ctx, const char *name, iv_dataset_t **ds, iv_meta_t **var_meta,
                         iv_err_t *err)
{
    return iv_rds_matrix(ctx, name, ds, var_meta, err);
}

/* The dataset, the server's limits and the caching headers of a viewer
 * request; -1 when out of memory. */
static int vreq_bind(iv_vreq_t *vr, conn_t *c, sds_t *d)
{
    const iv_http_req_t *r = c->req;
    vr->ds = d->ds;
    vr->meta = d->meta;
    vr->vx = d->vx;
    vr->pool = c->srv->pool;
    vr->matrix_shape = iv_rds_matrix_shape;
    vr->matrix_open = viewer_matrix;
    vr->matrix_name = iv_rds_matrix_name;
    vr->matrix_ctx = d;
    vr->json_bytes = c->srv->cfg->limits.json_bytes;
    vr->answer_bytes = c->srv->cfg->limits.max_answer_bytes;
    vr->max_age = c->srv->cfg->cache_max_age;
    vr->private_cache = iv_auth_protected(&c->srv->auth, d->conf->id);
    if (r->hdr[IV_H_IF_NONE_MATCH] && !(vr->if_none_match = strdup(r->hdr[IV_H_IF_NONE_MATCH]))) return -1;
    if (r->hdr[IV_H_ACCEPT_ENCODING] && !(vr->accept_encoding = strdup(r->hdr[IV_H_ACCEPT_ENCODING])))
        return -1;
    return 0;
}

/* GET/POST of a viewer route (api/viewer.h): copied for a worker, which
 * builds the whole answer; route_viewer_finish sends it. */
void route_viewer(conn_t *c, sds_t *d, int vroute, const char *sub)
{
    iv_http_req_t *r = c->req;
    if (!method_ok(c, iv_vroute_allows_post(vroute)) || body_type_refused(c)) return;
    int bad_name = 0;
    size_t blen = 0;
    char *body = r->method == HTTP_POST ? iv_buf_steal(&r->body, &blen) : NULL;
    iv_vreq_t *vr = iv_vreq_new(vroute, sub, r->method == HTTP_POST, r->query, body, blen,
                                r->hdr[IV_H_ACCEPT], &bad_name);
    setup_t *st = vr ? calloc(1, sizeof *st) : NULL;
    if (!st) {
        iv_vreq_free(vr);
        if (bad_name) send_error(c, 400, "bad_request", "bad percent-escape in the path", NULL);
        else send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    if (vreq_bind(vr, c, d) != 0) {
        iv_vreq_free(vr);
        free(st);
        send_iv_error(c, IV_ENOMEM, NULL);
        return;
    }
    st->vr = vr;
    submit_setup(c, d, st, 0, &viewer_job);
}

