/*
 * Answers and writes (respond.c): the writes of an answer (the last
 * stage of its output chain, srv_ostream.h), its end and its access-log
 * line, the whole answers (send_*, through the chain), and the write
 * budget (the bytes waiting to be written, one budget for all loops).
 * All of it on the loop thread of the connection.
 */
#ifndef IV_SRV_RESPOND_H
#define IV_SRV_RESPOND_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "buf.h"
#include "error.h"
#include "http.h"
#include "srv_common.h"

/* Request method m's name (llhttp's), for the access log. */
static inline const char *method_name(int m)
{
    return llhttp_method_name((llhttp_method_t)m);
}

/* Answers, the end of a request, the write budget (respond.c).  Loop thread.
 *
 * conn_writev (the output chain's write, srv_ostream.h; and the interim
 * 100 Continue) queues head (owned, may be NULL) then the pieces in order
 * (at most three of them owned, freed when written; the others must
 * outlive the write), the pieces framed as one chunk when chunk is set.
 * A block of stream qs is credited to it when written; last marks the
 * answer's final bytes.  Returns 0, or -1 when the connection was closed
 * instead (what was owned is freed).  conn_write is the same for one
 * payload (owned when own). */
typedef struct wpiece {
    const char *p;
    size_t len;
    int own;
} wpiece_t;
int conn_writev(conn_t *c, char *head, size_t hlen, const wpiece_t *pieces, unsigned n_pieces,
                int chunk, qstream_t *qs, int last);
int conn_write(conn_t *c, char *head, size_t hlen, const char *payload, size_t plen, int own,
               int chunk, qstream_t *qs, int last);
void send_simple(conn_t *c, int status, const char *ctype, const char *body, size_t len,
                 const char *extra);
void send_owned(conn_t *c, int status, const char *ctype, iv_buf_t *body, const char *extra);
void send_error(conn_t *c, int status, const char *code, const char *msg, const char *extra);
void send_iv_error(conn_t *c, int rc, const iv_err_t *e);
/* The message a client is shown for engine error rc: msg, or for a 5xx
 * msg with the server's paths taken out (written to red, of cap bytes).
 * The access log keeps msg whole (callers put it in c->errmsg). */
const char *error_for_client(int rc, const char *msg, char *red, size_t cap);
void access_log(conn_t *c, uint64_t bytes);
void req_reset(conn_t *c);
void resp_begin(conn_t *c, iv_http_req_t *req);
void resp_begin_error(conn_t *c);
void req_done(conn_t *c);
int budget_room(conn_t *c);
int budget_admit(conn_t *c, size_t len);
void budget_wake(loop_t *lp);
#define BUDGET_TICK_MS 100
void budget_tick(uv_timer_t *t);
/* A stream of lp starts (+1) or stops (-1) waiting for the budget. */
void budget_wait_count(loop_t *lp, int d);

#endif
