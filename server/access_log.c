/*
 * Log lines (see access_log.h).
 *
 * Lines are built whole in a buffer and written with one fwrite, so that
 * a line is never interleaved with another writer's; JSON escaping comes
 * from the same buffer code the API uses, so a path or message with
 * control characters or quotes stays one valid JSON line.
 */
#include "access_log.h"

#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "buf.h"

static void iso_time(char *out, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

int iv_alog_open(iv_alog_t *l, const char *access, const char *format)
{
    memset(l, 0, sizeof *l);
    l->json = strcmp(format, "text") != 0;
    if (!strcmp(access, "-")) {
        l->f = stderr;
    } else if (strcmp(access, "off") != 0) {
        l->f = fopen(access, "a");
        if (!l->f) {
            fprintf(stderr, "ivserve: cannot open access log %s\n", access);
            return -1;
        }
        l->owned = 1;
    }
    return 0;
}

void iv_alog_close(iv_alog_t *l)
{
    if (l->owned) fclose(l->f);
    l->f = NULL;
    l->owned = 0;
}

int iv_alog_reopen(iv_alog_t *l, const char *access)
{
    if (!l->owned) return 0;
    FILE *f = fopen(access, "a");
    if (!f) return -1;
    fclose(l->f);
    l->f = f;
    return 0;
}

void iv_alog_event(const iv_alog_t *l, const char *level, const char *fmt, ...)
{
    char msg[1024], t[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    iso_time(t, sizeof t);
    if (l->json) {
        iv_buf_t b;
        iv_buf_init(&b);
        iv_buf_printf(&b, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":", t, level);
        iv_buf_json_str(&b, msg);
        iv_buf_puts(&b, "}\n");
        if (!b.oom) fwrite(b.data, 1, b.len, stderr);
        iv_buf_free(&b);
    } else {
        fprintf(stderr, "%s %s %s\n", t, level, msg);
    }
    fflush(stderr);
}

/* A name fit for a text line: printable ASCII without spaces, else "?". */
static const char *text_safe(const char *v)
{
    if (!v || !v[0]) return "-";
    for (const char *p = v; *p; p++)
        if (*p <= ' ' || *p > '~') return "?";
    return v;
}

/* An entry's fields as a line shows them. */
typedef struct alog_fields {
    const char *err;      /* "" when none */
    const char *ds;       /* NULL when none */
    const char *client;   /* "-" when unknown */
    const char *tok;      /* NULL when none */
    const char *via;      /* the peer, only when a proxy stood between: it is the client otherwise */
} alog_fields_t;

static void put_json_or_null(iv_buf_t *b, const char *s)
{
    if (s) iv_buf_json_str(b, s);
    else iv_buf_puts(b, "null");
}

static void access_json(iv_buf_t *b, const char *t, const iv_alog_entry_t *e, const alog_fields_t *f)
{
    iv_buf_printf(b, "{\"time\":\"%s\",\"method\":\"%s\",\"path\":", t, e->method);
    iv_buf_json_str(b, e->path);
    iv_buf_puts(b, ",\"client\":");
    iv_buf_json_str(b, f->client);
    if (f->via) {
        iv_buf_puts(b, ",\"peer\":");
        iv_buf_json_str(b, f->via);
    }
    iv_buf_puts(b, ",\"token\":");
    put_json_or_null(b, f->tok);
    iv_buf_puts(b, ",\"dataset\":");
    put_json_or_null(b, f->ds);
    if (e->cells >= 0 && e->genes >= 0)
        iv_buf_printf(b, ",\"cells\":%" PRId64 ",\"genes\":%" PRId64, e->cells, e->genes);
    iv_buf_printf(b,
                  ",\"status\":%d,\"rows\":%" PRId64 ",\"nnz\":%" PRId64 ",\"bytes\":%" PRIu64
                  ",\"ms\":%.3f",
                  e->status, e->rows, e->nnz, e->bytes, e->ms);
    if (f->err[0]) {
        iv_buf_puts(b, ",\"error\":");
        iv_buf_json_str(b, f->err);
    }
    iv_buf_puts(b, "}\n");
}

static void access_text(iv_buf_t *b, const char *t, const iv_alog_entry_t *e, const alog_fields_t *f)
{
    iv_buf_printf(b, "%s %s %s %s %d rows=%" PRId64 " nnz=%" PRId64 " bytes=%" PRIu64 " ms=%.3f",
                  t, e->method, e->path, f->ds ? f->ds : "-", e->status, e->rows, e->nnz, e->bytes,
                  e->ms);
    iv_buf_printf(b, " client=%s token=%s", text_safe(f->client), text_safe(f->tok));
    if (e->cells >= 0 && e->genes >= 0)
        iv_buf_printf(b, " cells=%" PRId64 " genes=%" PRId64, e->cells, e->genes);
    if (f->via) iv_buf_printf(b, " peer=%s", text_safe(f->via));
    iv_buf_printf(b, "%s%s\n", f->err[0] ? " error=" : "", f->err);
}

void iv_alog_access(const iv_alog_t *l, const iv_alog_entry_t *e)
{
    if (!l->f) return;
    char t[40];
    iso_time(t, sizeof t);
    alog_fields_t f;
    f.err = e->error ? e->error : "";
    f.ds = e->dataset && e->dataset[0] ? e->dataset : NULL;
    f.client = e->client && e->client[0] ? e->client : "-";
    f.tok = e->token && e->token[0] ? e->token : NULL;
    f.via = e->peer && e->peer[0] && strcmp(e->peer, f.client) ? e->peer : NULL;
    iv_buf_t b;
    iv_buf_init(&b);
    if (l->json) access_json(&b, t, e, &f);
    else access_text(&b, t, e, &f);
    if (!b.oom) fwrite(b.data, 1, b.len, l->f);
    fflush(l->f);
    iv_buf_free(&b);
}

int iv_alog_peer(const uv_tcp_t *tcp, char *out, size_t cap, unsigned char ip[16])
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(out, cap, "-");
    memset(ip, 0, 16);
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        if (uv_ip4_name(a, out, cap) != 0) return -1;
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &a->sin_addr, 4);
        return 0;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        if (uv_ip6_name(a, out, cap) != 0) return -1;
        memcpy(ip, &a->sin6_addr, 16);
        return 0;
    }
    return -1;
}

static int trusted_ip(const unsigned char ip[16], const iv_cidr_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (iv_cidr_match(&t[i], ip)) return 1;
    return 0;
}

/* The X-Forwarded-For entry that ends at end (after its ','), trimmed,
 * into addr (64 bytes) as an address; *start is where it begins.  -1
 * when it is empty, too long or not an address. */
static int xff_entry(const char *xff, const char *end, char *addr, unsigned char ip[16], const char **start)
{
    const char *comma = end;
    while (comma > xff && comma[-1] != ',') comma--;
    *start = comma;
    const char *a = comma, *z = end;
    while (a < z && (*a == ' ' || *a == '\t')) a++;
    while (z > a && (z[-1] == ' ' || z[-1] == '\t')) z--;
    size_t n = (size_t)(z - a);
    if (n == 0 || n >= 64) return -1;
    memcpy(addr, a, n);
    addr[n] = '\0';
    return iv_cidr_addr(addr, ip) != 0 ? -1 : 0;
}

void iv_alog_client(char *out, size_t cap, const char *peer, const unsigned char *peer_ip,
                    const char *xff, const iv_cidr_t *trusted, size_t n_trusted)
{
    snprintf(out, cap, "%s", peer && peer[0] ? peer : "-");
    if (!peer_ip || !xff || !trusted_ip(peer_ip, trusted, n_trusted)) return;
    /* From the right: each entry was added by the hop after it. */
    const char *end = xff + strlen(xff);
    while (end > xff) {
        char addr[64];
        unsigned char ip[16];
        const char *comma;
        if (xff_entry(xff, end, addr, ip, &comma) != 0) return;
        snprintf(out, cap, "%s", addr);
        if (!trusted_ip(ip, trusted, n_trusted)) return;
        end = comma > xff ? comma - 1 : xff;
    }
}
