/*
 * Ordinary .h5ad files packed into the cache folder (see autopack.h).
 */
#include "autopack.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "cachedir.h"
#include "h5matrix.h"
#include "membudget.h"

extern char **environ;

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)

/* ---- the copies in use ---------------------------------------------------- */

static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;
static char **pins;
static size_t n_pins, cap_pins;

void iv_autopack_pin(const char *path)
{
    pthread_mutex_lock(&pin_mu);
    if (n_pins == cap_pins) {
        size_t nc = cap_pins ? cap_pins * 2 : 16;
        char **nv = realloc(pins, nc * sizeof *nv);
        if (nv) {
            pins = nv;
            cap_pins = nc;
        }
    }
    /* Out of memory: not pinned, so at worst evicted while served; the
     * served copy stays readable through its open descriptor. */
    if (n_pins < cap_pins && (pins[n_pins] = strdup(path))) n_pins++;
    pthread_mutex_unlock(&pin_mu);
}

void iv_autopack_unpin(const char *path)
{
    pthread_mutex_lock(&pin_mu);
    for (size_t i = 0; i < n_pins; i++)
        if (!strcmp(pins[i], path)) {
            free(pins[i]);
            pins[i] = pins[--n_pins];
            break;
        }
    if (!n_pins) {
        free(pins);
        pins = NULL;
        cap_pins = 0;
    }
    pthread_mutex_unlock(&pin_mu);
}

/* A sweep keeping the pinned copies and `also`; its counts logged. */
static void sweep(const iv_config_t *cfg, const iv_alog_t *log, const char *dir, const char *also)
{
    pthread_mutex_lock(&pin_mu);
    const char **keep = malloc((n_pins + 1) * sizeof *keep);
    size_t n = 0;
    if (keep) {
        for (size_t i = 0; i < n_pins; i++) keep[n++] = pins[i];
        keep[n++] = also;
    }
    iv_cachedir_sweep_t rep;
    iv_err_t err;
    iv_err_clear(&err);
    /* Under the lock: a copy pinned while the sweep runs is not evicted. */
    int rc = keep ? iv_cachedir_sweep(dir, cfg->cache_dir_bytes, keep, n, &rep, &err) : -1;
    pthread_mutex_unlock(&pin_mu);
    free(keep);
    if (rc != 0) {
        iv_alog_event(log, "warn", "cache folder %s: %s", dir, keep ? err.msg : "out of memory");
        return;
    }
    if (rep.stale || rep.evicted || rep.temps)
        iv_alog_event(log, "info", "cache folder %s: removed %zu stale, %zu least recently used, "
                      "%zu abandoned temporary files; %.1f MB left", dir, rep.stale, rep.evicted,
                      rep.temps, (double)rep.bytes_left / 1e6);
}

/* ---- progress ------------------------------------------------------------- */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void iv_autopack_progress_json(iv_buf_t *b, const iv_autopack_progress_t *p)
{
    if (!atomic_load(&p->active)) return;
    double f = atomic_load(&p->permille) / 1000.0;
    double el = (double)(now_ms() - atomic_load(&p->t0_ms)) / 1000.0;
    double mbs = el > 0 ? (double)atomic_load(&p->bytes) / 1e6 / el : 0;
    iv_buf_printf(b, ",\"packing\":{\"fraction\":%.3f,\"rows_done\":%lld,\"rows\":%lld,"
                  "\"mb_per_s\":%.1f,\"seconds\":%.1f", f, atomic_load(&p->done),
                  atomic_load(&p->total), mbs, el);
    if (f > 0.001) iv_buf_printf(b, ",\"seconds_left\":%.1f", el * (1 - f) / f);
    iv_buf_puts(b, "}");
}

/* One "progress F DONE TOTAL BYTES PASS PASSES" line into p; the decile
 * logged last in *decile.  A "turned-around HOW" line (the pack's last,
 * when it changed the orientation) is logged as it is. */
static void take_line(const char *line, iv_autopack_progress_t *p, int *decile,
                      const iv_alog_t *log, const char *id)
{
    if (strncmp(line, "turned-around ", 14) == 0) {
        iv_alog_event(log, "info", "dataset %s: the pack turned it around by %s", id, line + 14);
        return;
    }
    double f;
    long long done, total;
    unsigned long long bytes;
    int pass, passes;
    if (sscanf(line, "progress %lf %lld %lld %llu %d %d", &f, &done, &total, &bytes, &pass,
               &passes) != 6 || f < 0 || f > 1)
        return;
    atomic_store(&p->permille, (int)(f * 1000));
    atomic_store(&p->done, done);
    atomic_store(&p->total, total);
    atomic_store(&p->bytes, bytes);
    int d = (int)(f * 10);
    if (d > *decile) {
        *decile = d;
        double el = (double)(now_ms() - atomic_load(&p->t0_ms)) / 1000.0;
        double left = f > 0 ? el * (1 - f) / f : 0;
        iv_alog_event(log, "info", "dataset %s: packing %d%% (pass %d/%d, rows %lld/%lld, "
                      "%.1f MB/s, %.0f s left)", id, d * 10, pass, passes, done, total,
                      el > 0 ? (double)bytes / 1e6 / el : 0.0, left);
    }
}

/* ---- the pack process ----------------------------------------------------- */

static atomic_size_t build_memory;

void iv_autopack_set_memory(size_t bytes) { atomic_store(&build_memory, bytes); }

/* The pack's --memory-mb: the builds' part of the memory budget (or a
 * quarter of the memory available), at least 512 MiB; the pack works in
 * bands within it. */
static size_t pack_memory(void)
{
    size_t mem = atomic_load(&build_memory);
    if (!mem) mem = iv_membudget_default(25, (size_t)2 << 30, NULL, NULL);
    if (mem < ((size_t)512 << 20)) mem = (size_t)512 << 20;
    return mem;
}

/* The child's output as it is read: its progress lines, parsed as they
 * end, and the tail of its stderr, whose last line is the error. */
typedef struct pack_out {
    char pbuf[512], ebuf[2048];
    size_t plen, elen;
    int decile;
    iv_autopack_progress_t *p;
    const iv_alog_t *log;
    const char *id;
} pack_out_t;

/* Keeps the last sizeof ebuf - 1 bytes of stderr. */
static void keep_err_tail(pack_out_t *o, const char *tmp, size_t got)
{
    size_t room = sizeof o->ebuf - 1;
    if (got > room - o->elen) {
        size_t drop = o->elen + got - room;
        if (drop > o->elen) drop = o->elen;
        memmove(o->ebuf, o->ebuf + drop, o->elen - drop);
        o->elen -= drop;
    }
    size_t take = got < room - o->elen ? got : room - o->elen;
    memcpy(o->ebuf + o->elen, tmp + got - take, take);
    o->elen += take;
}

static void take_progress(pack_out_t *o, const char *tmp, size_t got)
{
    for (size_t i = 0; i < got; i++) {
        if (tmp[i] == '\n' || o->plen == sizeof o->pbuf - 1) {
            o->pbuf[o->plen] = '\0';
            take_line(o->pbuf, o->p, &o->decile, o->log, o->id);
            o->plen = 0;
        } else {
            o->pbuf[o->plen++] = tmp[i];
        }
    }
}

/* Reads what pipe k (0 progress, 1 stderr) holds; 1 when it closed (and
 * is closed here), else 0. */
static int read_pipe(pack_out_t *o, struct pollfd *pf, int k)
{
    char tmp[1024];
    ssize_t got = read(pf[k].fd, tmp, sizeof tmp);
    if (got < 0 && errno == EINTR) return 0;
    if (got <= 0) {
        close(pf[k].fd);
        pf[k].fd = -1;
        return 1;
    }
    if (k == 1) keep_err_tail(o, tmp, (size_t)got);
    else take_progress(o, tmp, (size_t)got);
    return 0;
}

/* Reads both pipes until the child closes them, sending it SIGTERM once
 * stop is set; 1 when it was stopped so. */
static int watch_pack(pid_t pid, int prog, int errp, const atomic_int *stop, pack_out_t *o)
{
    int open_fds = 2, stopped = 0;
    struct pollfd pf[2] = {{prog, POLLIN, 0}, {errp, POLLIN, 0}};
    while (open_fds > 0) {
        if (!stopped && stop && atomic_load(stop)) {
            kill(pid, SIGTERM);
            stopped = 1;
        }
        int r = poll(pf, 2, 200);
        if (r < 0 && errno != EINTR) break;
        for (int k = 0; k < 2; k++)
            if (pf[k].fd >= 0 && (pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                open_fds -= read_pipe(o, pf, k);
    }
    for (int k = 0; k < 2; k++)
        if (pf[k].fd >= 0) close(pf[k].fd);
    return stopped;
}

/* Starts argv[0] with fd 3 on prog, stderr on errp, stdin and stdout on
 * /dev/null.  The server blocks its signals on the loops' threads: the
 * pack starts with none blocked and every handler at its default.
 * Returns posix_spawn's error number. */
static int spawn_pack(char **argv, int prog, int errp, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, prog, 3);
    posix_spawn_file_actions_adddup2(&fa, errp, 2);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_init(&at);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawn(pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    return rc;
}

/* The pack's exit, as an error when it failed: the last line of its
 * stderr, without the "ivserve: error: " prefix. */
static int pack_result(int status, int stopped, pack_out_t *o, const char *src, iv_err_t *err)
{
    if (stopped) return FAILF(IV_ECANCELLED, "%s: packing stopped: the server is stopping", src);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char *ebuf = o->ebuf;
    size_t elen = o->elen;
    ebuf[elen] = '\0';
    while (elen && (ebuf[elen - 1] == '\n' || ebuf[elen - 1] == ' ')) ebuf[--elen] = '\0';
    const char *last = strrchr(ebuf, '\n');
    last = last ? last + 1 : ebuf;
    if (!strncmp(last, "ivserve: error: ", 16)) last += 16;
    return FAILF(IV_EBAD_FILE, "packing it failed (%s %d): %s", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                 *last ? last : "no message");
}

/*
 * Runs `ivserve pack src out --quiet --progress-fd 3 ...` and waits,
 * reading its progress and keeping the tail of its stderr for the error.
 */
static int run_pack(const iv_config_t *cfg, const iv_alog_t *log, const char *id, const char *src,
                    const char *out, const char *const *more, iv_autopack_progress_t *p,
                    const atomic_int *stop, iv_err_t *err)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return FAILF(IV_EINTERNAL, "cannot find the ivserve binary to pack %s", src);
    exe[n] = '\0';
    int prog[2], errp[2];
    if (pipe2(prog, O_CLOEXEC) != 0) return FAILF(IV_EINTERNAL, "pipe: %s", strerror(errno));
    if (pipe2(errp, O_CLOEXEC) != 0) {
        close(prog[0]);
        close(prog[1]);
        return FAILF(IV_EINTERNAL, "pipe: %s", strerror(errno));
    }
    char mem_mb[32], threads[16];
    snprintf(mem_mb, sizeof mem_mb, "%zu", pack_memory() >> 20);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(threads, sizeof threads, "%u", cfg->threads ? cfg->threads : (unsigned)(cores > 0 ? cores : 1));
    char *argv[20] = {exe, "pack", (char *)src, (char *)out, "--quiet", "--progress-fd", "3",
                      "--memory-mb", mem_mb, "--threads", threads};
    size_t argc = 11;
    for (size_t i = 0; more && more[i] && argc < sizeof argv / sizeof *argv - 1; i++)
        argv[argc++] = (char *)more[i];
    argv[argc] = NULL;
    pid_t pid;
    int spawn_rc = spawn_pack(argv, prog[1], errp[1], &pid);
    close(prog[1]);
    close(errp[1]);
    if (spawn_rc != 0) {
        close(prog[0]);
        close(errp[0]);
        return FAILF(IV_EINTERNAL, "cannot start `ivserve pack` for %s: %s", src, strerror(spawn_rc));
    }
    pack_out_t o = {.decile = -1, .p = p, .log = log, .id = id};
    int stopped = watch_pack(pid, prog[0], errp[0], stop, &o);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return pack_result(status, stopped, &o, src, err);
}

/* ---- a derived copy in the cache folder ------------------------------------ */

/*
 * The derived copy of src of kind `kind` (cachedir.h): dir receives the
 * folder (4096 bytes), copy its path (4400 bytes), also written to out.
 * Pinned before it exists: another dataset's pack sweeps the folder when
 * it ends, and must not take this copy the moment it appears.  1 when it
 * is there (marked used), 0 when it must be written (its note written
 * first), or an error with nothing left pinned.
 */
static int copy_slot(const iv_config_t *cfg, const char *src, const char *kind, char *dir,
                     char *copy, char *out, size_t cap, iv_err_t *err)
{
    char key[IV_CACHEDIR_KEY_LEN];
    iv_config_cache_dir(cfg, dir, 4096);
    IV_TRY(iv_cachedir_prepare(dir, err));
    IV_TRY(iv_cachedir_key(src, key, err));
    IV_TRY(iv_cachedir_path(dir, src, key, kind, copy, 4400, err));
    if ((size_t)snprintf(out, cap, "%s", copy) >= cap)
        return FAILF(IV_EINVALID_ARG, "%s: path too long", copy);
    iv_autopack_pin(copy);
    struct stat st;
    if (stat(copy, &st) == 0 && S_ISREG(st.st_mode)) {
        iv_cachedir_touch(copy);
        return 1;
    }
    int rc = iv_cachedir_note(copy, src, key, err);
    if (rc != 0) iv_autopack_unpin(copy);
    return rc;
}

/* The progress counters at the start of a pack of `total` output slices. */
static void progress_start(iv_autopack_progress_t *p, long long total)
{
    atomic_store(&p->permille, 0);
    atomic_store(&p->done, 0);
    atomic_store(&p->total, total > 0 ? total : 0);
    atomic_store(&p->bytes, 0);
    atomic_store(&p->t0_ms, now_ms());
    atomic_store(&p->active, 1);
}

/* ---- resolving a dataset's file ------------------------------------------- */

static int packable(const iv_h5mx_entry_t *e)
{
    return !strcmp(e->encoding, "csr_matrix") || !strcmp(e->encoding, "csc_matrix") ||
           !strcmp(e->encoding, "array") || !strcmp(e->encoding, "csr") ||
           !strcmp(e->encoding, "csc");
}

int iv_autopack_resolve(const iv_config_t *cfg, const iv_alog_t *log, const char *id,
                        const char *src, const char *group, iv_autopack_progress_t *prog,
                        const atomic_int *stop, char *out, size_t cap, iv_err_t *err)
{
    snprintf(out, cap, "%s", src);
    /* Only X is packed into a copy: a dataset served from another group
     * is served as configured. */
    if (group && *group && strcmp(group, "X") != 0) return 0;
    iv_h5mx_entry_t e;
    iv_err_t probe;
    iv_err_clear(&probe);
    /* A file the probe cannot read is left to the load, which says why. */
    if (iv_h5matrix_describe(src, "X", &e, &probe) != 0 || e.packed || !packable(&e)) return 0;
    if (!cfg->autopack) {
        char stem[4096];
        snprintf(stem, sizeof stem, "%s", src);
        size_t n = strlen(stem);
        if (n > 5 && !strcmp(stem + n - 5, ".h5ad")) stem[n - 5] = '\0';
        return FAILF(IV_EUNSUPPORTED, "%s: X is an ordinary %s, not packed, and autopack is off; "
                     "pack it once with `ivserve pack %s %s.ivcsr.h5ad` and serve that file (or "
                     "start without --no-autopack)", src, e.encoding, src, stem);
    }
    char dir[4096], copy[4400];
    int rc = copy_slot(cfg, src, "ivcsr.h5ad", dir, copy, out, cap, err);
    if (rc < 0) return rc;
    if (rc == 1) {
        iv_alog_event(log, "info", "dataset %s: %s is an ordinary %s; serving its packed copy %s",
                      id, src, e.encoding, copy);
        sweep(cfg, log, dir, copy);
        return 0;
    }
    iv_alog_event(log, "info", "dataset %s: %s is an ordinary %s (%lld x %lld); packing it into %s",
                  id, src, e.encoding, (long long)e.shape[0], (long long)e.shape[1], copy);
    progress_start(prog, e.shape[0]);
    long long t0 = now_ms();
    rc = run_pack(cfg, log, id, src, copy, NULL, prog, stop, err);
    atomic_store(&prog->active, 0);
    if (rc != 0) {
        iv_autopack_unpin(copy);
        return rc;
    }
    iv_alog_event(log, "info", "dataset %s: packed in %.2f s into %s", id,
                  (double)(now_ms() - t0) / 1000.0, copy);
    sweep(cfg, log, dir, copy);
    return 0;
}

/* ---- the other orientation ------------------------------------------------ */

int iv_autopack_other(const iv_config_t *cfg, const iv_alog_t *log, const char *id,
                      const char *served, const char *group, int to_ivcsc, const char *plain,
                      iv_autopack_progress_t *prog, const atomic_int *stop, char *out, size_t cap,
                      int *built, iv_err_t *err)
{
    char dir[4096], copy[4400];
    *built = 0;
    int rc = copy_slot(cfg, served, to_ivcsc ? "ivcsc.h5ad" : "ivcsr.h5ad", dir, copy, out, cap,
                       err);
    if (rc != 0) return rc < 0 ? rc : 0;
    const char *matrix = group && *group ? group : "X";
    iv_h5mx_entry_t e;
    iv_err_t probe;
    iv_err_clear(&probe);
    long long major = 0;
    if (iv_h5matrix_describe(served, matrix, &e, &probe) == 0) major = e.shape[to_ivcsc ? 1 : 0];
    iv_alog_event(log, "info", "dataset %s: writing its %s orientation into %s", id,
                  to_ivcsc ? "gene-major" : "cell-major", copy);
    progress_start(prog, major);
    const char *more[] = {"--layout", to_ivcsc ? "ivcsc" : "ivcsr", "--matrix-only", "--matrix",
                          matrix, "--engine-index-from", dir, plain ? "--engine-replica-from" : NULL,
                          plain, NULL};
    rc = run_pack(cfg, log, id, served, copy, more, prog, stop, err);
    atomic_store(&prog->active, 0);
    if (rc != 0) {
        iv_autopack_unpin(copy);
        return rc;
    }
    *built = 1;
    sweep(cfg, log, dir, copy);
    return 0;
}
