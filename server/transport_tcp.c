/*
 * The TCP transport (transport.h): a connection's socket as a libuv TCP
 * handle.  Each libuv callback enters the connection's loop (loop_enter)
 * and hands the event to the connection.
 */
#include "srv_conn.h"
#include "srv_loop.h"

#include <stdlib.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#endif

static void tcp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    if (c->rlen >= c->rcap) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init(c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void tcp_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    conn_t *c = st->data;
    loop_t *lp = c->lp;
    loop_enter(lp);
    conn_input(c, n);
    loop_leave(lp);
}

static int tcp_read_start(conn_t *c)
{
    return uv_read_start((uv_stream_t *)&c->tcp, tcp_alloc, tcp_on_read);
}

static void tcp_read_stop(conn_t *c)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
}

static void tcp_on_write(uv_write_t *w, int status)
{
    loop_t *lp = ((conn_t *)w->handle->data)->lp;
    loop_enter(lp);
    conn_wrote(w, status);
    loop_leave(lp);
}

static int tcp_write(conn_t *c, uv_write_t *w, const uv_buf_t *bufs, unsigned n)
{
    return uv_write(w, (uv_stream_t *)&c->tcp, bufs, n, tcp_on_write);
}

static void tcp_on_shutdown(uv_shutdown_t *req, int status)
{
    conn_t *c = req->data;
    loop_t *lp = c->lp;
    free(req);
    loop_enter(lp);
    conn_shut(c, status);
    loop_leave(lp);
}

static int tcp_shutdown(conn_t *c)
{
    uv_shutdown_t *sr = malloc(sizeof *sr);
    if (!sr) return UV_ENOMEM;
    sr->data = c;
    int rc = uv_shutdown(sr, (uv_stream_t *)&c->tcp, tcp_on_shutdown);
    if (rc != 0) free(sr);
    return rc;
}

static void tcp_on_closed(uv_handle_t *h)
{
    conn_transport_closed(h->data);
}

static void tcp_close(conn_t *c)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_close((uv_handle_t *)&c->tcp, tcp_on_closed);
}

/* Bytes the kernel still holds for the client: unsent or unacknowledged.
 * Linux says (SIOCOUTQ); elsewhere 0, and closing relies on the client's
 * EOF or the drain time. */
static size_t tcp_unacked(conn_t *c)
{
#ifdef __linux__
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &n) == 0 && n > 0)
        return (size_t)n;
#else
    (void)c;
#endif
    return 0;
}

/*
 * A request arrived in part.  Clients that write the headers and the body
 * in two calls with Nagle on (Python's http.client does) hold the second
 * part until the first is acknowledged, and a delayed ACK makes that wait
 * tens of milliseconds: acknowledge now.  Linux only; a hint elsewhere.
 */
static void tcp_quickack(conn_t *c)
{
#if defined(__linux__) && defined(TCP_QUICKACK)
    uv_os_fd_t fd;
    int one = 1;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
#else
    (void)c;
#endif
}

const iv_transport_t iv_tcp_transport = {
    .read_start = tcp_read_start,
    .read_stop = tcp_read_stop,
    .write = tcp_write,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
    .unacked = tcp_unacked,
    .quickack = tcp_quickack,
};

/*
 * Opens the accepted socket fd as c's TCP handle (c->tcp, on c's loop),
 * attached to c (conn_attached) as soon as the handle exists, so that the
 * connection's close closes it.  Returns 0, or -1 with fd closed.
 */
int iv_tcp_open(conn_t *c, int fd)
{
    if (uv_tcp_init(&c->lp->loop, &c->tcp) != 0) {
        close(fd);
        return -1;
    }
    c->tcp.data = c;
    conn_attached(c);
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        return -1;
    }
    /* Answers go out as soon as they are written: with Nagle on, the last
     * small write of an answer waits for the client's delayed ACK. */
    uv_tcp_nodelay(&c->tcp, 1);
    c->life_f.peer_ok = iv_alog_peer(&c->tcp, c->peer, sizeof c->peer, c->peer_ip) == 0;
    return 0;
}
