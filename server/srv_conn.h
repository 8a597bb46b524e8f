/*
 * Connections (conn.c): struct conn and its states, and the functions
 * that make, start, find and close one.  A connection belongs to one loop
 * (its lp) and is touched only on that loop's thread; it is freed only
 * from its close callbacks.  Its transport (transport.h) is TCP
 * (transport_tcp.c) or the unit tests' fake one.
 */
#ifndef IV_SRV_CONN_H
#define IV_SRV_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "http.h"
#include "metrics.h"
#include "srv_common.h"
#include "srv_ostream.h"
#include "transport.h"

#define TOKNAME_BYTES 72  /* token names are at most 64 bytes (tokens_file.h) */

/*
 * A connection is always in exactly one of these states, and the state
 * alone decides which timer runs (see conn_set_state):
 *
 *   IDLE        keep-alive: no byte of the next request yet (keepalive_ms)
 *   READ_HEAD   request line and headers arriving; a new connection starts
 *               here (header_timeout_ms)
 *   READ_BODY   the body arriving (body_timeout_ms)
 *   DISPATCHED  a complete request is being worked on and nothing of its
 *               answer is written yet (compute_timeout_ms)
 *   RESPONDING  the answer is being written (write_timeout_ms while bytes
 *               wait for the socket, compute_timeout_ms while a stream
 *               waits for its next block); ends when the answer's last
 *               write completes, and only then is the next pipelined
 *               request parsed
 *   DRAINING    the last answer is out and the write side shut: input is
 *               read and dropped, for a bounded time and size, until the
 *               client has acknowledged every byte (polled)
 *   CLOSING     uv_close called; freed in the close callbacks
 */
typedef enum conn_state {
    CS_IDLE, CS_READ_HEAD, CS_READ_BODY, CS_DISPATCHED, CS_RESPONDING, CS_DRAINING, CS_CLOSING
} conn_state_t;

struct conn {
    uv_tcp_t tcp;         /* the TCP transport's handle (transport_tcp.c) */
    uv_timer_t timer;
    const iv_transport_t *tp;  /* its transport (transport.h) */
    void *tp_ctx;         /* the transport's own state, if any */
    server_t *srv;
    loop_t *lp;           /* the loop that owns its socket and timer */
    uint64_t id;          /* unique in the server's life (a reload's answer finds it by id) */
    conn_t *prev, *next;
    conn_state_t state;
    iv_http_in_t in;
    char *rbuf;
    size_t rlen, rcap;
    int handles_open;     /* its handles not closed yet (freed at 0) */
    /* Its flags, by the side of the connection they are about (besides
     * the state, which no flag duplicates). */
    struct conn_input_flags {
        bool reading;         /* the transport's reads are on */
        bool in_pump;         /* conn_pump runs: a nested call returns at once */
        bool peer_eof;        /* the client half-closed */
        bool expect_checked;  /* Expect of the request being read was answered */
        bool ahead_err;       /* the parser failed after the requests read ahead */
    } in_f;
    struct conn_answer_flags {
        bool active;          /* between resp_begin and req_done */
        bool ended;           /* its last bytes are queued (req_done ran) */
        bool log_pending;     /* its log line waits for the last write, or the
                               * close (bytes delivered) */
        bool close_after;     /* the connection ends after it */
        bool shutting;        /* uv_shutdown called */
    } ans_f;
    ostream_t out;        /* the answer's output chain (ostream.c) */
    struct conn_life_flags {
        bool tp_open;         /* the transport is open: closed with the connection */
        bool peer_ok;         /* peer_ip is known */
        bool reload_wait;     /* an admin reload's answer is awaited */
    } life_f;
    size_t wpending;      /* bytes in uv_write calls whose callbacks have not run */
    uint64_t last_progress; /* uv_now of the last completed write, for the write budget */
    uint64_t seq;         /* the answer being written: its sequence number */
    /* Requests parsed ahead while an answer is in flight, oldest first
     * (at most limits.max_pipeline of them, AHEAD_MAX_BYTES in all), and
     * whether the parser failed after them. */
    iv_http_req_t **ahead;
    unsigned n_ahead, ahead_first, ahead_cap;
    size_t ahead_bytes;
    /* DRAINING bookkeeping. */
    uint64_t drain_t0, drain_last_in, outq_t;
    size_t drain_bytes, outq_last;
    /* The request being answered. */
    iv_http_req_t *req;
    iv_route_t route;
    uint64_t t0, t_end;
    int status;
    char dsid[136];
    char tokname[TOKNAME_BYTES]; /* the answer's token name (never the token), or "" */
    int64_t cells, genes; /* the query's selection, -1 unknown */
    char peer[48];        /* the socket's peer address, as text */
    unsigned char peer_ip[16]; /* the same, IPv4-mapped (cidr.h); life_f.peer_ok: known */
    int64_t rows, nnz;
    uint64_t bytes;
    char errmsg[520];
    qstream_t *qs;
    char *dropped;        /* JSON {"obs":[...],"var":[...]} of names dropped by missing=ignore */
    char *dropped_hdr;    /* the same, bounded, for the header */
};

/* Connections (conn.c).  Loop thread. */
void conn_set_state(conn_t *c, conn_state_t st);
int is_reading_state(const conn_t *c);
void resp_finished(conn_t *c);
void conn_close(conn_t *c);
/* Loop lp takes the accepted socket fd (closes it on failure). */
void conn_adopt(loop_t *lp, int fd);
/* The steps of conn_adopt, for any transport: a connection on loop lp
 * (NULL when out of memory), counted and listed, its transport not yet
 * open; conn_attached once the transport is open (it is closed with the
 * connection); conn_start to read the first request. */
conn_t *conn_create(loop_t *lp, const iv_transport_t *tp);
void conn_attached(conn_t *c);
void conn_start(conn_t *c);
conn_t *conn_by_id(loop_t *lp, uint64_t id);

#endif
