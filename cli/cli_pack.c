/*
 * `ivserve pack` on the command line (see cli_pack.h and core/matrix/pack.h).
 *
 * Progress goes to stderr: on a terminal a bar redrawn at most five times
 * a second (percent, output rows done, input MB/s, time left), otherwise
 * one line per 10%, so that logs of batch jobs stay short.  With
 * --layout both the input is packed twice, into OUT's name with .ivcsr
 * and .ivcsc before its extension; each file is complete on its own.
 */
#include "cli_pack.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "filecheck.h"
#include "meta.h"
#include "pack.h"
#include "pool.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: ivserve pack IN.h5ad OUT.h5ad [--layout ivcsr|ivcsc|both]\n"
            "                    [--matrix X|layers/NAME|raw/X] [--group G]\n"
            "                    [--codec zstd[:LEVEL]|deflate[:LEVEL]|none] [--chunk-bytes N]\n"
            "                    [--threads N] [--memory-mb N] [--layers] [--matrix-only]\n"
            "                    [--quiet] [--progress-fd FD] [--transpose-engine on|off]\n"
            "  --layers  also pack every sparse or dense layer and raw/X (layers/NAME, raw/X\n"
            "            stay where they are, packed), so that the server serves them\n"
            "  --matrix-only  write the packed matrix alone, copying no other element\n"
            "  --transpose-engine off  turn a packed input around by counted bands instead\n"
            "            of the transpose engine (the default, on)\n"
            "  --progress-fd FD  also write 'progress FRACTION DONE TOTAL BYTES PASS PASSES'\n"
            "            lines to descriptor FD, at most five a second, and at the end\n"
            "            'turned-around HOW' when the pack changed the orientation\n");
    return 2;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bar {
    int tty, quiet;
    int progress_fd;          /* --progress-fd: machine lines, or -1 */
    double last_fd;
    double t0, last;
    int last_decile;
    const char *unit;         /* "rows" or "columns" */
    const char *name;
} bar_t;

static void fmt_time(double s, char *buf, size_t cap)
{
    if (s < 0 || s > 1e7) {
        snprintf(buf, cap, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* A line of n bytes (snprintf's count into line[cap]) to --progress-fd,
 * which server/autopack.c reads; a write that fails ends them. */
static void fd_line(bar_t *b, const char *line, int n, size_t cap)
{
    if (b->progress_fd < 0 || n <= 0) return;
    size_t len = (size_t)n < cap ? (size_t)n : cap - 1;
    if (write(b->progress_fd, line, len) < 0) b->progress_fd = -1;
}

/* One line a report, at most five a second, for the server's packing of
 * ordinary files. */
static void progress_line(bar_t *b, const iv_pack_progress_t *p, double t)
{
    b->last_fd = t;
    char line[160];
    int n = snprintf(line, sizeof line, "progress %.6f %" PRId64 " %" PRId64 " %" PRIu64 " %d %d\n",
                     p->fraction, p->slices_done, p->n_slices, p->bytes_read, p->pass, p->n_passes);
    fd_line(b, line, n, sizeof line);
}

static void on_progress(void *ctx, const iv_pack_progress_t *p)
{
    bar_t *b = ctx;
    double t = now(), el = t - b->t0;
    if (b->progress_fd >= 0 && (t - b->last_fd >= 0.2 || p->fraction >= 1)) progress_line(b, p, t);
    if (b->quiet) return;
    double mbs = el > 0 ? (double)p->bytes_read / 1e6 / el : 0;
    double left = p->fraction > 0 ? el * (1 - p->fraction) / p->fraction : -1;
    char eta[32];
    fmt_time(left, eta, sizeof eta);
    if (b->tty) {
        if (t - b->last < 0.2 && p->fraction < 1) return;
        b->last = t;
        char bar[31];
        int fill = (int)(p->fraction * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r%s [%s] %3.0f%%  pass %d/%d  %s %" PRId64 "/%" PRId64 "  %.1f MB/s  "
                "left %s ", b->name, bar, p->fraction * 100, p->pass, p->n_passes, b->unit,
                p->slices_done, p->n_slices, mbs, eta);
        fflush(stderr);
    } else {
        int d = (int)(p->fraction * 10);
        if (d <= b->last_decile) return;
        b->last_decile = d;
        fprintf(stderr, "ivserve: pack %s: %d%% (pass %d/%d, %s %" PRId64 "/%" PRId64 ", %.1f MB/s, "
                "%s left)\n", b->name, d * 10, p->pass, p->n_passes, b->unit, p->slices_done,
                p->n_slices, mbs, eta);
    }
}

/* The temporary file of the pack in progress, removed on SIGINT/SIGTERM
 * so that an interrupted pack leaves nothing behind (unlink and _exit are
 * async-signal-safe; the name is set before the handler is installed). */
static char tmp_name[4300];

static void on_signal(int sig)
{
    unlink(tmp_name);
    _exit(128 + sig);
}

/* OUT with ".ivcsr" / ".ivcsc" before its extension (or at its end). */
static void both_name(const char *out, const char *tag, char *buf, size_t cap)
{
    const char *base = strrchr(out, '/');
    base = base ? base + 1 : out;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base) snprintf(buf, cap, "%s.%s.h5ad", out, tag);
    else snprintf(buf, cap, "%.*s.%s%s", (int)(dot - out), out, tag, dot);
}

static int pack_one(const char *in, const char *out, iv_pack_opts_t *o, int quiet, int progress_fd)
{
    if (iv_file_same(in, out)) {
        fprintf(stderr, "ivserve: error: %s: the output is the input %s; writing it would replace "
                "what is read (choose another OUT)\n", out, in);
        return 1;
    }
    /* obs and var are copied as they are: what anndata could not read
     * (repeated categories, codes past them, names that are not UTF-8)
     * is refused here rather than written. */
    iv_err_t verr = {0};
    if (iv_meta_validate_file(in, NULL, &verr) < 0) {
        fprintf(stderr, "ivserve: error: %s\n", verr.msg);
        return 1;
    }
    bar_t b = {isatty(2), quiet, progress_fd, 0, now(), 0, 0,
               o->orient == IV_IVCSR ? "rows" : "columns", out};
    o->progress = on_progress;
    o->progress_ctx = &b;
    iv_pack_report_t rep;
    iv_err_t err = {0};
    iv_pack_temp_name(out, tmp_name, sizeof tmp_name);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = iv_pack_file(in, out, o, &rep, &err);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (b.tty && !quiet) fputc('\n', stderr);
    if (rc < 0) {
        fprintf(stderr, "ivserve: error: %s\n", err.msg);
        return 1;
    }
    double el = now() - b.t0;
    char codec[32];
    iv_h5w_codec_describe(&o->codec, codec, sizeof codec);
    printf("%s: %s %" PRId64 " x %" PRId64 ", %s, nnz %" PRId64 ", %" PRId64 " value groups, "
           "packed_indices %" PRIu64 " bytes, matrix stored in %" PRIu64 " bytes (%s); from %s "
           "in %d pass%s, %.2f s, %.1f MB/s\n",
           out, o->orient == IV_IVCSR ? "ivcsr" : "ivcsc", rep.n_rows, rep.n_cols,
           iv_dtype_name(rep.dtype), rep.nnz, rep.n_unique, rep.stream_bytes, rep.stored_bytes,
           codec, rep.input_kind, rep.n_passes, rep.n_passes == 1 ? "" : "es", el,
           el > 0 ? (double)rep.input_bytes / 1e6 / el : 0.0);
    if (rep.dropped[0]) printf("%s: not carried over from the input: %s\n", out, rep.dropped);
    if (o->layers) printf("%s: layers packed: %s\n", out, rep.packed[0] ? rep.packed : "none");
    if (rep.transpose[0]) printf("%s: turned around by %s\n", out, rep.transpose);
    if (rep.transpose[0]) {
        /* For the server's log (autopack.c). */
        char line[600];
        fd_line(&b, line, snprintf(line, sizeof line, "turned-around %s\n", rep.transpose), sizeof line);
    }
    return 0;
}

/* The command line of pack. */
typedef struct pack_args {
    const char *in, *out, *layout;
    iv_pack_opts_t o;
    unsigned threads;
    int quiet, progress_fd;
} pack_args_t;

/* What an argument parser returns besides an exit status (>= 0). */
enum { ARG_TAKEN = -1, ARG_NOT_MINE = -2 };

/* The options with a number: ARG_TAKEN, ARG_NOT_MINE or an exit status. */
static int pack_number_opt(pack_args_t *pa, const char *a, const char *v)
{
    char *end;
    if (strcmp(a, "--chunk-bytes") == 0) {
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end || n == 0 || n > (1ull << 30)) {
            fprintf(stderr, "ivserve: error: bad --chunk-bytes '%s' (1 to 2^30)\n", v);
            return 2;
        }
        pa->o.chunk_bytes = n;
    } else if (strcmp(a, "--threads") == 0) {
        pa->threads = (unsigned)strtoul(v, &end, 10);
        if (end == v || *end) return usage();
    } else if (strcmp(a, "--memory-mb") == 0) {
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end || n == 0) return usage();
        pa->o.memory_budget = (size_t)n << 20;
    } else if (strcmp(a, "--progress-fd") == 0) {
        long fd = strtol(v, &end, 10);
        if (end == v || *end || fd < 0 || fd > 1023) return usage();
        pa->progress_fd = (int)fd;
    } else {
        return ARG_NOT_MINE;
    }
    return ARG_TAKEN;
}

/* The options with a value: ARG_TAKEN, ARG_NOT_MINE or an exit status. */
static int pack_value_opt(pack_args_t *pa, const char *a, const char *v)
{
    if (strcmp(a, "--layout") == 0) {
        pa->layout = v;
    } else if (strcmp(a, "--matrix") == 0) {
        pa->o.matrix = v;
    } else if (strcmp(a, "--group") == 0) {
        pa->o.group = v;
    } else if (strcmp(a, "--transpose-engine") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
            fprintf(stderr, "ivserve: error: bad --transpose-engine '%s' (on or off)\n", v);
            return 2;
        }
        pa->o.transpose_engine = strcmp(v, "on") == 0;
    } else if (strcmp(a, "--engine-replica") == 0) {
        /* Not in the usage: benchmarks and tests compare with and without. */
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) return usage();
        pa->o.no_replica = strcmp(v, "off") == 0;
    } else if (strcmp(a, "--engine-replica-from") == 0) {
        /* Not in the usage: the server passes the input's plain copy. */
        pa->o.replica_from = v;
    } else if (strcmp(a, "--engine-index-from") == 0) {
        /* Not in the usage: the server passes its cache folder. */
        pa->o.index_dir = v;
    } else if (strcmp(a, "--engine-window-kb") == 0) {
        /* Not in the usage: tests make many windows of a small matrix. */
        char *end;
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end || n == 0 || n > (1ull << 30)) return usage();
        pa->o.engine_window_bytes = n << 10;
    } else if (strcmp(a, "--codec") == 0) {
        if (iv_h5w_codec_parse(v, &pa->o.codec) < 0) {
            fprintf(stderr, "ivserve: error: bad --codec '%s' (zstd[:1..22], deflate[:0..9], "
                    "none)\n", v);
            return 2;
        }
    } else {
        return pack_number_opt(pa, a, v);
    }
    return ARG_TAKEN;
}

/* A flag or an operand (IN, then OUT): ARG_TAKEN or an exit status. */
static int pack_word(pack_args_t *pa, const char *a)
{
    if (strcmp(a, "--layers") == 0) {
        pa->o.layers = 1;
    } else if (strcmp(a, "--matrix-only") == 0) {
        pa->o.matrix_only = 1;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
        pa->quiet = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        usage();
        return 0;
    } else if (a[0] == '-' && a[1]) {
        fprintf(stderr, "ivserve: unknown or incomplete argument '%s'\n", a);
        return usage();
    } else if (!pa->in) {
        pa->in = a;
    } else if (!pa->out) {
        pa->out = a;
    } else {
        return usage();
    }
    return ARG_TAKEN;
}

/* ARG_TAKEN when the command line is read whole, else an exit status. */
static int parse_pack_args(int argc, char **argv, pack_args_t *pa)
{
    memset(pa, 0, sizeof *pa);
    pa->layout = "ivcsr";
    pa->progress_fd = -1;
    iv_pack_opts_init(&pa->o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = v ? pack_value_opt(pa, a, v) : ARG_NOT_MINE;
        if (r == ARG_TAKEN) i++;
        else if (r == ARG_NOT_MINE) r = pack_word(pa, a);
        if (r >= 0) return r;
    }
    return pa->in && pa->out ? ARG_TAKEN : usage();
}

/* Packs the layouts asked for: OUT itself, or with --layout both OUT's
 * name with .ivcsr and .ivcsc. */
static int pack_layouts(pack_args_t *pa, int want_r, int want_c)
{
    int rc = 0;
    char name[4200];
    if (want_r) {
        pa->o.orient = IV_IVCSR;
        if (want_c) both_name(pa->out, "ivcsr", name, sizeof name);
        rc = pack_one(pa->in, want_c ? name : pa->out, &pa->o, pa->quiet, pa->progress_fd);
    }
    if (rc == 0 && want_c) {
        pa->o.orient = IV_IVCSC;
        if (want_r) both_name(pa->out, "ivcsc", name, sizeof name);
        rc = pack_one(pa->in, want_r ? name : pa->out, &pa->o, pa->quiet, pa->progress_fd);
    }
    return rc;
}

/* jemalloc's control, where the binary links jemalloc (server/alloc_conf.c;
 * not in the sanitizer builds). */
extern int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen)
    __attribute__((weak));

/*
 * A pack gives freed pages back to the kernel as they decay, where the
 * server keeps them lazily freed (alloc_conf.c: muzzy_decay_ms -1, so
 * that queries do not fault their buffers in again).  A lazily freed page
 * still counts in the resident size until the kernel wants it, and a
 * pack frees window after window on every thread: on 1.26 M cells at
 * --memory-mb 400 with 16 threads the peak was 535 MB this way, 457 MB
 * with the pages given back, at the same speed.
 */
static void pack_allocator(void)
{
    if (!mallctl) return;
    ssize_t zero = 0;
    (void)mallctl("arenas.muzzy_decay_ms", NULL, NULL, &zero, sizeof zero);
    (void)mallctl("arena.4096.muzzy_decay_ms", NULL, NULL, &zero, sizeof zero);  /* every arena */
}

int iv_cli_pack_main(int argc, char **argv)
{
    pack_allocator();
    pack_args_t pa;
    int rc = parse_pack_args(argc, argv, &pa);
    if (rc >= 0) return rc;
    int want_r = strcmp(pa.layout, "ivcsr") == 0 || strcmp(pa.layout, "both") == 0;
    int want_c = strcmp(pa.layout, "ivcsc") == 0 || strcmp(pa.layout, "both") == 0;
    if (!want_r && !want_c) {
        fprintf(stderr, "ivserve: error: bad --layout '%s' (ivcsr, ivcsc or both)\n", pa.layout);
        return 2;
    }
    iv_pool_t *pool = NULL;
    if (pa.threads != 1) {
        pool = iv_pool_create(pa.threads ? pa.threads - 1 : 0, 0);
        if (!pool) {
            fprintf(stderr, "ivserve: error: cannot start worker threads\n");
            return 1;
        }
    }
    pa.o.pool = pool;
    rc = pack_layouts(&pa, want_r, want_c);
    iv_pool_destroy(pool);
    return rc;
}
