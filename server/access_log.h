/*
 * The server's log lines: events (start-up, datasets, shutdown), always
 * on stderr, and one access line per answer, to stderr, a file or
 * nowhere; both as JSON lines (default) or text.
 *
 * The server writes one line per answer when the answer is over; a
 * connection's last answer is logged at the close, with the bytes the
 * client acknowledged.  Loop thread only.
 */
#ifndef IV_ACCESS_LOG_H
#define IV_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#include "cidr.h"

typedef struct iv_alog {
    FILE *f;              /* access lines; NULL when off */
    int owned;            /* f was opened here */
    int json;
} iv_alog_t;

/* One answer, as logged.  dataset, error, token and peer may be NULL or
 * "".  client is who asked (iv_alog_client), peer the socket's other
 * end, logged besides client only when they differ (a proxy).  token is
 * the token's name, never the token.  cells x genes is the query's
 * selection (-1: not a query, or not known). */
typedef struct iv_alog_entry {
    const char *method, *path, *dataset, *error;
    const char *client, *peer, *token;
    int64_t cells, genes;
    int status;
    int64_t rows, nnz;
    uint64_t bytes;
    double ms;
} iv_alog_entry_t;

/* access: a path, "-" (stderr) or "off"; format: "json" or "text".
 * Returns 0, or -1 with the reason printed on stderr. */
int iv_alog_open(iv_alog_t *l, const char *access, const char *format);
void iv_alog_close(iv_alog_t *l);
/* Opens the access log file again (access as given to iv_alog_open), for
 * logrotate: after the old file was renamed, new lines go to a new file at
 * the configured path.  The old file is closed only once the new one is
 * open.  A no-op for stderr and "off".  0, or -1 with the old file kept. */
int iv_alog_reopen(iv_alog_t *l, const char *access);

void iv_alog_event(const iv_alog_t *l, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void iv_alog_access(const iv_alog_t *l, const iv_alog_entry_t *e);

/* The peer of a connected socket, as text (out) and IPv4-mapped (ip).
 * 0, or -1 (out then "-"). */
int iv_alog_peer(const uv_tcp_t *tcp, char *out, size_t cap, unsigned char ip[16]);

/*
 * Who asked: the peer, unless the peer is a trusted proxy and the request
 * has X-Forwarded-For (xff, entries joined by ", ").  Then the entries
 * are read from the right, skipping trusted proxies, and the first
 * untrusted address is the client (all trusted: the leftmost).  An entry
 * that is not an IP address stops the walk: the last address reached is
 * the client, so a forged header never puts free text in the log.
 * peer_ip NULL: the peer is unknown (client = peer text).
 */
void iv_alog_client(char *out, size_t cap, const char *peer, const unsigned char *peer_ip,
                    const char *xff, const iv_cidr_t *trusted, size_t n_trusted);

#endif
