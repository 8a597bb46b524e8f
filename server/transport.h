/*
 * The byte transport under a connection: what conn.c and respond.c ask of
 * a socket, and how the socket's events come back to them.  The server's
 * transport is TCP through libuv (transport_tcp.c); the unit tests drive
 * the connection state machine through a fake one that holds every write
 * and shutdown until the test completes it and feeds input by hand.
 *
 * Every operation is called on the connection's loop thread, and every
 * completion is reported there, never from inside the operation itself:
 *
 *   input          the bytes it placed at c->rbuf + c->rlen (at most
 *                  c->rcap - c->rlen), or UV_EOF, or another negative
 *                  error: conn_input(c, n)
 *   write          conn_wrote(w, status) once the bytes are handed to the
 *                  kernel or failed; w is the write's request, whose first
 *                  member is the uv_write_t that the TCP transport uses
 *   shutdown       conn_shut(c, status)
 *   close          conn_transport_closed(c), after which it touches
 *                  nothing of c
 */
#ifndef IV_TRANSPORT_H
#define IV_TRANSPORT_H

#include <stddef.h>
#include <sys/types.h>

#include <uv.h>

struct conn;

typedef struct iv_transport {
    /* 0, or a negative libuv error (input did not start). */
    int (*read_start)(struct conn *c);
    void (*read_stop)(struct conn *c);
    /* Queues bufs[0..n) in order; 0, or a negative error and no
     * completion will come. */
    int (*write)(struct conn *c, uv_write_t *w, const uv_buf_t *bufs, unsigned n);
    /* Half-closes after the queued writes; 0, or a negative error and no
     * completion will come. */
    int (*shutdown)(struct conn *c);
    void (*close)(struct conn *c);
    /* Bytes written but not yet acknowledged by the peer (0 if unknown). */
    size_t (*unacked)(struct conn *c);
    /* Part of a request arrived: acknowledge at once (a hint). */
    void (*quickack)(struct conn *c);
} iv_transport_t;

/* The TCP transport; conn_adopt opens the accepted socket with it. */
extern const iv_transport_t iv_tcp_transport;
int iv_tcp_open(struct conn *c, int fd);

/* The completions, each on the connection's loop thread. */
void conn_input(struct conn *c, ssize_t n);
void conn_wrote(uv_write_t *w, int status);
void conn_shut(struct conn *c, int status);
void conn_transport_closed(struct conn *c);

#endif
