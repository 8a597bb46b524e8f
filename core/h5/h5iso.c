/*
 * HDF5 reads in a child process (see h5iso.h).
 *
 * Why a fork per read, with the results passed back as bytes: the three
 * designs weighed were (a) fork, read in the child, pass the results in
 * a memory file; (b) spawn the binary again as a helper over a pipe; (c)
 * fork a child that reads as a dry run, then read again in the parent.
 * (c) pays for every load twice, still runs libhdf5 in the server on
 * bytes that may have changed between the two reads, and leaves the
 * server's own HDF5 calls racing each other on the worker pool (the
 * Debian library is not thread-safe).  (b) needs every binary that links
 * the engine (the server, the unit tests) to carry the helper's entry
 * point.  (a) keeps libhdf5 out of the server process altogether: the
 * parent only maps the child's bytes and checks them, so a damaged file
 * costs that file alone, concurrent loads run in separate processes, and
 * the engine stays a library.
 *
 * Fork in a threaded process: the child has one thread, the copy of the
 * caller, and every lock another thread held at the fork stays held in
 * the child.  So the child uses malloc (fork-safe in glibc and jemalloc)
 * and HDF5 (never running in the parent, or only under iv_h5iso_lock,
 * which is held across the fork) and nothing else of the parent's: no
 * pool, no stdio, no event loop.  It closes every descriptor but its two
 * (a client socket must not stay open in it), restores default signal
 * actions (a crash must kill it, not run the server's handlers), and ends
 * with _exit so that no atexit handler of the parent's libraries runs.
 *
 * The parent reads a pipe of small framed messages (the stage being read,
 * notes, and the final answer) with poll, so it can stop a hung child
 * after the timeout; the results themselves travel through a memfd,
 * whose size is only known at the end and may be gigabytes.
 */
#include "h5iso.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MSG_STAGE = 'S', MSG_NOTE = 'N', MSG_DONE = 'D' };
#define MSG_HEAD 3                    /* type, u16 payload length */
#define MSG_MAX (MSG_HEAD + 1024)     /* under PIPE_BUF: one write each */
#define OUT_BUF ((size_t)64 << 10)
#define DEFAULT_TIMEOUT_MS 300000u
#define DEFAULT_CHECK_MS 1000u        /* how often a silent child is looked at */

static pthread_mutex_t h5_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned timeout_ms = DEFAULT_TIMEOUT_MS;
static unsigned check_ms = DEFAULT_CHECK_MS;
static pthread_mutex_t timeout_mu = PTHREAD_MUTEX_INITIALIZER;

void iv_h5iso_lock(void) { pthread_mutex_lock(&h5_mu); }
void iv_h5iso_unlock(void) { pthread_mutex_unlock(&h5_mu); }

void iv_h5iso_set_timeout_ms(unsigned ms)
{
    pthread_mutex_lock(&timeout_mu);
    timeout_ms = ms ? ms : DEFAULT_TIMEOUT_MS;
    pthread_mutex_unlock(&timeout_mu);
}

void iv_h5iso_set_check_ms(unsigned ms)
{
    pthread_mutex_lock(&timeout_mu);
    check_ms = ms ? ms : DEFAULT_CHECK_MS;
    pthread_mutex_unlock(&timeout_mu);
}

static unsigned get_check_ms(void)
{
    pthread_mutex_lock(&timeout_mu);
    unsigned c = check_ms;
    pthread_mutex_unlock(&timeout_mu);
    return c;
}

static unsigned get_timeout_ms(void)
{
    pthread_mutex_lock(&timeout_mu);
    unsigned t = timeout_ms;
    pthread_mutex_unlock(&timeout_mu);
    return t;
}

/* ------------------------------------------------------------ child side */

struct iv_h5iso_out {
    int pipe_fd, mem_fd;
    int failed;           /* a write to the memory file failed */
    uint64_t total;       /* bytes put */
    size_t used;
    uint8_t buf[OUT_BUF];
};

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int out_flush(iv_h5iso_out_t *o)
{
    if (o->used && !o->failed && write_all(o->mem_fd, o->buf, o->used) != 0) o->failed = 1;
    o->used = 0;
    return o->failed ? IV_EIO : 0;
}

int iv_h5iso_put(iv_h5iso_out_t *o, const void *p, size_t n)
{
    if (o->failed) return IV_EIO;
    o->total += n;
    if (o->used + n <= OUT_BUF) {
        if (n) memcpy(o->buf + o->used, p, n);
        o->used += n;
        return 0;
    }
    /* Large arrays go straight to the file, without the copy. */
    if (out_flush(o) < 0) return IV_EIO;
    if (n <= OUT_BUF / 2) {
        memcpy(o->buf, p, n);
        o->used = n;
        return 0;
    }
    if (write_all(o->mem_fd, p, n) != 0) o->failed = 1;
    return o->failed ? IV_EIO : 0;
}

int iv_h5iso_put_u64(iv_h5iso_out_t *o, uint64_t v) { return iv_h5iso_put(o, &v, sizeof v); }

/* Zero bytes after a blob of n bytes up to the next multiple of 8, so
 * that every blob starts 8-aligned when the answer does: a reader may
 * then use an array in place (the metadata kept between runs). */
static size_t blob_pad(uint64_t n) { return (size_t)((8 - (n & 7)) & 7); }

int iv_h5iso_put_blob(iv_h5iso_out_t *o, const void *p, uint64_t n)
{
    static const uint8_t zeros[8];
    IV_TRY(iv_h5iso_put_u64(o, n));
    IV_TRY(iv_h5iso_put(o, p, (size_t)n));
    return iv_h5iso_put(o, zeros, blob_pad(n));
}

static void send_msg(int fd, int type, const void *payload, size_t n)
{
    uint8_t m[MSG_MAX];
    if (n > MSG_MAX - MSG_HEAD) n = MSG_MAX - MSG_HEAD;
    m[0] = (uint8_t)type;
    m[1] = (uint8_t)(n & 0xff);
    m[2] = (uint8_t)(n >> 8);
    if (n) memcpy(m + MSG_HEAD, payload, n);
    (void)write_all(fd, m, MSG_HEAD + n);
}

void iv_h5iso_stage(iv_h5iso_out_t *o, const char *stage)
{
    size_t n = strnlen(stage, IV_H5ISO_STAGE_MAX - 1);
    send_msg(o->pipe_fd, MSG_STAGE, stage, n);
}

void iv_h5iso_note(iv_h5iso_out_t *o, const void *msg, size_t n)
{
    send_msg(o->pipe_fd, MSG_NOTE, msg, n < IV_H5ISO_NOTE_MAX ? n : IV_H5ISO_NOTE_MAX);
}

/* Closes every descriptor above stderr except a and b. */
static void close_others(int a, int b)
{
    int lo = a < b ? a : b, hi = a < b ? b : a;
    unsigned ranges[3][2] = {{3, (unsigned)lo - 1}, {(unsigned)lo + 1, (unsigned)hi - 1},
                             {(unsigned)hi + 1, ~0u}};
    for (int i = 0; i < 3; i++) {
        if (ranges[i][0] > ranges[i][1] || (int)ranges[i][0] < 3) continue;
        if (close_range(ranges[i][0], ranges[i][1], 0) == 0) continue;
        /* Kernels before 5.9: close one by one up to a sane bound. */
        long max = sysconf(_SC_OPEN_MAX);
        unsigned top = ranges[i][1];
        if (max > 0 && (unsigned long)max - 1 < top) top = (unsigned)max - 1;
        if (top > 65535) top = 65535;
        for (unsigned fd = ranges[i][0]; fd <= top; fd++) close((int)fd);
    }
}

static void child_reset_signals(void)
{
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS,
                               SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD,
                               SIGUSR1, SIGUSR2, SIGALRM};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
}

/* Ends the child at once: no atexit handler, no stdio flush, and no
 * sanitizer finalisation (ThreadSanitizer's _exit would report the
 * parent's other threads, which the child does not have, as leaked). */
static _Noreturn void child_exit(int code)
{
    syscall(SYS_exit_group, code);
    _exit(code);
}

static void child_main(pid_t parent, int wfd, int mfd, iv_h5iso_child_fn fn, void *ctx)
{
    /* The copy of the lock taken around the fork belongs to this thread. */
    iv_h5iso_unlock();
    child_reset_signals();
    /* Die with the thread that forked (a server worker lives as long as
     * the server); a parent already gone leaves nobody to answer. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) child_exit(2);
    close_others(wfd, mfd);
    iv_h5iso_out_t *o = malloc(sizeof *o);
    if (!o) child_exit(3);
    o->pipe_fd = wfd;
    o->mem_fd = mfd;
    o->failed = 0;
    o->total = 0;
    o->used = 0;
    iv_err_t err;
    iv_err_clear(&err);
    int rc = fn(ctx, o, &err);
    if (rc == 0 && out_flush(o) < 0)
        rc = iv_fail(&err, IV_EIO, "cannot pass the results to the server: %s", strerror(errno));
    /* The answer: rc (i32), bytes put (u64), then the message. */
    uint8_t done[4 + 8 + sizeof err.msg];
    int32_t rc32 = rc;
    uint64_t total = o->total;
    size_t ml = rc < 0 ? strnlen(err.msg, sizeof err.msg) : 0;
    memcpy(done, &rc32, 4);
    memcpy(done + 4, &total, 8);
    memcpy(done + 12, err.msg, ml);
    send_msg(wfd, MSG_DONE, done, 12 + ml);
    child_exit(0);
}

/* ----------------------------------------------------------- parent side */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

struct wait_state {
    char stage[IV_H5ISO_STAGE_MAX];
    int done;
    int32_t rc;
    uint64_t total;
    char msg[sizeof(((iv_err_t *)0)->msg)];
    uint8_t in[2 * MSG_MAX];
    size_t in_len;
};

/* Handles the complete messages in ws->in; returns -1 on a malformed one. */
static int take_msgs(struct wait_state *ws, iv_h5iso_note_fn note, void *note_ctx)
{
    size_t pos = 0;
    while (ws->in_len - pos >= MSG_HEAD) {
        const uint8_t *m = ws->in + pos;
        size_t n = (size_t)m[1] | ((size_t)m[2] << 8);
        if (n > MSG_MAX - MSG_HEAD) return -1;
        if (ws->in_len - pos < MSG_HEAD + n) break;
        const uint8_t *pl = m + MSG_HEAD;
        switch (m[0]) {
        case MSG_STAGE: {
            size_t k = n < sizeof ws->stage - 1 ? n : sizeof ws->stage - 1;
            memcpy(ws->stage, pl, k);
            ws->stage[k] = '\0';
            break;
        }
        case MSG_NOTE:
            if (note && !ws->done) note(note_ctx, pl, n);
            break;
        case MSG_DONE: {
            if (n < 12) return -1;
            memcpy(&ws->rc, pl, 4);
            memcpy(&ws->total, pl + 4, 8);
            size_t k = n - 12 < sizeof ws->msg - 1 ? n - 12 : sizeof ws->msg - 1;
            memcpy(ws->msg, pl + 12, k);
            ws->msg[k] = '\0';
            ws->done = 1;
            break;
        }
        default:
            return -1;
        }
        pos += MSG_HEAD + n;
    }
    memmove(ws->in, ws->in + pos, ws->in_len - pos);
    ws->in_len -= pos;
    return 0;
}

/* The system call the child is blocked in, or -1 when it is running
 * (or cannot be seen). */
static long child_syscall(pid_t pid)
{
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0 || buf[0] < '0' || buf[0] > '9') return -1;
    buf[n] = '\0';
    return strtol(buf, NULL, 10);
}

/* The child's read and write system calls so far (/proc/PID/io), or
 * UINT64_MAX when they cannot be seen. */
static uint64_t child_io_calls(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return UINT64_MAX;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return UINT64_MAX;
    buf[n] = '\0';
    const char *r = strstr(buf, "syscr:"), *w = strstr(buf, "syscw:");
    if (!r || !w) return UINT64_MAX;
    return strtoull(r + 6, NULL, 10) + strtoull(w + 6, NULL, 10);
}

/*
 * A deadlocked child.  It has one thread, so no lock of its own can ever
 * be released: it inherited one that another thread of the parent held at
 * the fork.  glibc's malloc and jemalloc take their locks around fork,
 * but an allocator without fork handlers (AddressSanitizer's, before LLVM
 * 16) can leave one held, and the child then waits forever in its first
 * malloc of that size: asleep on a futex (seen at once), or spinning on a
 * lock that yields the processor between tries, which looks like running.
 * A spinning child makes no read or write call; a reader makes one for
 * every chunk it reads or block it writes, and one blocked in any other
 * call (a slow disk) is waiting, not stuck.
 */
#define FUTEX_STUCK_CHECKS 3   /* checks (seconds by default) asleep on a futex */
#define SPIN_STUCK_CHECKS 8    /* checks running without a read or write */

struct stuck {
    int futex, spin;
    uint64_t io;
};

/* Called once a check (iv_h5iso_set_check_ms) without a message: 1 when
 * the child counts as deadlocked. */
static int child_stuck(pid_t pid, struct stuck *st)
{
    long nr = child_syscall(pid);
    uint64_t io = child_io_calls(pid);
    st->futex = nr == SYS_futex ? st->futex + 1 : 0;
    int idle = io != UINT64_MAX && io == st->io && (nr < 0 || nr == SYS_sched_yield);
    st->spin = idle ? st->spin + 1 : 0;
    st->io = io;
    return st->futex >= FUTEX_STUCK_CHECKS || st->spin >= SPIN_STUCK_CHECKS;
}

/* Reads the child's messages until its answer or its end (0), the
 * deadline (1), a malformed message (-1) or a deadlock of the child (2). */
static int read_msgs(int rfd, pid_t pid, double deadline, struct wait_state *ws,
                     iv_h5iso_note_fn note, void *note_ctx)
{
    struct stuck st = {0, 0, UINT64_MAX};
    const double every = get_check_ms();
    for (;;) {
        double left = deadline - now_ms();
        if (left <= 0) return 1;
        struct pollfd pfd = {.fd = rfd, .events = POLLIN};
        int pr = poll(&pfd, 1, left > every ? (int)every : (int)left + 1);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr == 0 && child_stuck(pid, &st)) return 2;
        if (pr <= 0) continue;
        ssize_t r = read(rfd, ws->in + ws->in_len, sizeof ws->in - ws->in_len);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -1;
        }
        if (r == 0) return 0;
        ws->in_len += (size_t)r;
        if (take_msgs(ws, note, note_ctx) < 0) return -1;
        if (ws->done) return 0;   /* the answer is the child's last word */
    }
}

static int wait_child(pid_t pid, int *status)
{
    for (;;) {
        pid_t w = waitpid(pid, status, 0);
        if (w == pid) return 0;
        if (w < 0 && errno == EINTR) continue;
        return -1;   /* ECHILD: SIGCHLD ignored, the kernel reaped it */
    }
}

/*
 * The result memfd's size and close, apart: ThreadSanitizer does not see
 * memfd_create, nor libuv's raw close of a connection's socket, so when
 * the memfd gets a number the loop thread used for a connection it
 * counts the worker's use of the memfd as a race with the loop's old
 * socket.  tests/tsan.supp names these two functions, and nothing else
 * of this file, to take those reports out.
 */
__attribute__((noinline)) static int iso_memfd_size(int mfd, off_t *size)
{
    struct stat st;
    if (fstat(mfd, &st) != 0) return -1;
    *size = st.st_size;
    return 0;
}

__attribute__((noinline)) static void iso_memfd_close(int mfd)
{
    close(mfd);
}

#define RETRY_DEADLOCK 1   /* run_once: the child deadlocked, fork again */
#define MAX_ATTEMPTS 3

/* Creates the pipe (pfd) and the result memfd (*mfd) and forks the
 * reader, which runs fn; its pid, or -1 with an error. */
static pid_t start_reader(const char *path, iv_h5iso_child_fn fn, void *ctx, int pfd[2], int *mfd,
                          iv_err_t *err)
{
    /* The lock spans the pipe's creation to the close of its write end in
     * the parent: a concurrent fork would copy that end into another child
     * and delay this pipe's end-of-file until that child closes it. */
    iv_h5iso_lock();
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        iv_h5iso_unlock();
        iv_fail(err, IV_EINTERNAL, "%s: cannot create a pipe: %s", path, strerror(errno));
        return -1;
    }
    *mfd = memfd_create("ivserve-h5iso", MFD_CLOEXEC);
    if (*mfd < 0) {
        iv_h5iso_unlock();
        iv_fail(err, IV_EINTERNAL, "%s: cannot create a memory file: %s", path, strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) child_main(parent, pfd[1], *mfd, fn, ctx);   /* never returns */
    int fork_errno = errno;
    close(pfd[1]);
    pfd[1] = -1;
    iv_h5iso_unlock();
    if (pid < 0)
        iv_fail(err, IV_EINTERNAL, "%s: cannot start the HDF5 reader process: %s", path,
                strerror(fork_errno));
    return pid;
}

/* Why the reader gave no usable answer (read_msgs said got; waited: it
 * was reaped with status), or 0 when it did: RETRY_DEADLOCK or an
 * error. */
static int reader_failure(const char *path, int got, int waited, int status,
                          const struct wait_state *ws, unsigned tmo, iv_err_t *err)
{
    if (got == 2) {
        iv_fail(err, IV_EINTERNAL,
                "%s: the HDF5 reader deadlocked reading %s (a lock held at its fork), %d times",
                path, ws->stage, MAX_ATTEMPTS);
        return RETRY_DEADLOCK;
    }
    if (got == 1)
        return iv_fail(err, IV_ETIMEOUT,
                       "%s: HDF5 did not finish reading %s within %.0f s (the reader was stopped); "
                       "the file is damaged or its storage does not answer",
                       path, ws->stage, tmo / 1000.0);
    if (waited && WIFSIGNALED(status) && !(got == 0 && ws->done)) {
        int sig = WTERMSIG(status);
        const char *d = sigdescr_np(sig);
        return iv_fail(err, IV_EBAD_FILE,
                       "%s: HDF5 crashed reading %s (signal %d, %s); the file is damaged", path,
                       ws->stage, sig, d ? d : "unknown signal");
    }
    if ((got < 0 || !ws->done) && waited && WIFEXITED(status))
        return iv_fail(err, IV_EBAD_FILE,
                       "%s: the HDF5 reader died reading %s (exit status %d) without an "
                       "answer; the file is damaged", path, ws->stage, WEXITSTATUS(status));
    if (got < 0 || !ws->done)
        return iv_fail(err, IV_EBAD_FILE,
                       "%s: the HDF5 reader died reading %s without an answer; the file is "
                       "damaged", path, ws->stage);
    if (ws->rc < 0) return iv_fail(err, ws->rc, "%s", ws->msg[0] ? ws->msg : iv_error_message(ws->rc));
    return 0;
}

/* Maps the reader's results, which must be as long as it said, into res. */
static int map_results(const char *path, int mfd, const struct wait_state *ws,
                       iv_h5iso_result_t *res, iv_err_t *err)
{
    off_t size;
    if (iso_memfd_size(mfd, &size) != 0 || (uint64_t)size != ws->total)
        return iv_fail(err, IV_EINTERNAL, "%s: the HDF5 reader's results are incomplete", path);
    if (ws->total == 0) return 0;
    void *p = mmap(NULL, (size_t)ws->total, PROT_READ, MAP_PRIVATE, mfd, 0);
    if (p == MAP_FAILED)
        return iv_fail(err, IV_ENOMEM, "%s: cannot map the HDF5 reader's results: %s", path,
                       strerror(errno));
    res->data = p;
    res->len = (size_t)ws->total;
    return 0;
}

static int run_once(const char *path, iv_h5iso_child_fn fn, void *ctx, iv_h5iso_note_fn note,
                    void *note_ctx, iv_h5iso_result_t *res, iv_err_t *err)
{
    res->data = NULL;
    res->len = 0;
    int pfd[2] = {-1, -1}, mfd = -1, rc = 0;
    struct wait_state *ws = calloc(1, sizeof *ws);
    if (!ws) return iv_fail(err, IV_ENOMEM, "%s: out of memory", path);
    snprintf(ws->stage, sizeof ws->stage, "the file");
    pid_t pid = start_reader(path, fn, ctx, pfd, &mfd, err);
    if (pid < 0) {
        rc = IV_EINTERNAL;   /* start_reader's every error */
        goto out;
    }
    unsigned tmo = get_timeout_ms();
    int got = read_msgs(pfd[0], pid, now_ms() + tmo, ws, note, note_ctx);
    if (got != 0) kill(pid, SIGKILL);
    int status = 0;
    int waited = wait_child(pid, &status) == 0;
    rc = reader_failure(path, got, waited, status, ws, tmo, err);
    if (rc == 0) rc = map_results(path, mfd, ws, res, err);
out:
    if (pfd[0] >= 0) close(pfd[0]);
    if (pfd[1] >= 0) close(pfd[1]);
    if (mfd >= 0) iso_memfd_close(mfd);
    free(ws);
    return rc;
}

int iv_h5iso_run(const char *path, iv_h5iso_child_fn fn, void *ctx, iv_h5iso_note_fn note,
                 void *note_ctx, iv_h5iso_result_t *res, iv_err_t *err)
{
    /* A deadlocked child did no work and says nothing about the file: the
     * next fork finds the parent's locks in another state. */
    for (int attempt = 1;; attempt++) {
        iv_err_t e;
        iv_err_clear(&e);
        int rc = run_once(path, fn, ctx, note, note_ctx, res, &e);
        if (rc != RETRY_DEADLOCK || attempt == MAX_ATTEMPTS) {
            if (rc == 0) return 0;
            return iv_fail(err, rc == RETRY_DEADLOCK ? IV_EINTERNAL : rc, "%s", e.msg);
        }
    }
}

void iv_h5iso_result_free(iv_h5iso_result_t *res)
{
    if (res->data) munmap((void *)res->data, res->len);
    res->data = NULL;
    res->len = 0;
}

/* ---------------------------------------------------------------- reader */

void iv_h5iso_rd_init(iv_h5iso_rd_t *r, const iv_h5iso_result_t *res)
{
    r->p = res->data;
    r->len = res->len;
    r->pos = 0;
    r->bad = 0;
}

const void *iv_h5iso_rd_raw(iv_h5iso_rd_t *r, size_t n)
{
    if (r->bad || n > r->len - r->pos) {
        r->bad = 1;
        return NULL;
    }
    if (!r->p) return "";   /* an empty result: no pointer arithmetic on NULL */
    const void *p = r->p + r->pos;
    r->pos += n;
    return p;
}

int iv_h5iso_rd_str(iv_h5iso_rd_t *r, char *out, size_t cap)
{
    size_t n;
    const char *p = iv_h5iso_rd_blob(r, (size_t)-1, &n);
    if (!p || n >= cap) return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

uint64_t iv_h5iso_rd_u64(iv_h5iso_rd_t *r)
{
    uint64_t v = 0;
    const void *p = iv_h5iso_rd_raw(r, sizeof v);
    if (p) memcpy(&v, p, sizeof v);
    return v;
}

const void *iv_h5iso_rd_blob(iv_h5iso_rd_t *r, size_t want, size_t *n)
{
    uint64_t len = iv_h5iso_rd_u64(r);
    if (r->bad || (want != (size_t)-1 && len != want) || len > r->len - r->pos) {
        r->bad = 1;
        return NULL;
    }
    if (n) *n = (size_t)len;
    /* A zero-length blob is a valid empty array: return a non-NULL pointer. */
    const void *p = iv_h5iso_rd_raw(r, (size_t)len);
    if (p) iv_h5iso_rd_raw(r, blob_pad(len));
    return r->bad ? NULL : p;
}
