/*
 * A writer command in a guarded child (see h5guard.h).
 *
 * The parent and the child share one anonymous mapping: the child writes
 * there the stage it is in, the temporary file it writes, the finished
 * files it wants renamed into place, and a progress counter; the parent
 * watches the counter while it waits and reads the rest once the child
 * is gone.  The child may die half-way through a write to the mapping, so
 * the parent copies each string with a bound and ends it itself: a torn
 * name costs a message or a failed rename, never a read past the mapping.
 *
 * Why the parent renames: a child whose file is complete can still die
 * after it, when libhdf5 closes a damaged input and walks what it cached.
 * Renaming only after a clean exit keeps the rule of every writer here:
 * OUT is the old file or the whole new one written by a run that ended
 * well.
 */
#include "h5guard.h"
#include "clock.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STAGE_MAX 256
#define PATH_MAX_ 4352
#define DEFAULT_STALL_S 300

typedef struct shared_page {
    volatile uint64_t beats;
    volatile int returned;    /* the command returned (else it ended inside: exit from a library) */
    char stage[STAGE_MAX];
    char temp[PATH_MAX_];
    volatile int n_commits;
    struct {
        char tmp[PATH_MAX_];
        char out[PATH_MAX_];
    } commit[IV_H5GUARD_MAX_COMMITS];
} shared_page_t;

/* Set in the child only (the parent's copy stays NULL). */
static shared_page_t *page;
/* The child, for the parent's forwarding handler. */
static volatile pid_t child_pid;

void iv_h5guard_beat(void)
{
    if (page) __atomic_add_fetch(&page->beats, 1, __ATOMIC_RELAXED);
}

void iv_h5guard_stage(const char *fmt, ...)
{
    if (!page) return;
    char buf[STAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(page->stage, buf, sizeof buf);
    iv_h5guard_beat();
}

void iv_h5guard_temp(const char *path)
{
    if (!page) return;
    if (!path) {
        page->temp[0] = '\0';
        return;
    }
    snprintf(page->temp, sizeof page->temp, "%s", path);
}

int iv_h5guard_commit(const char *tmp, const char *out)
{
    if (!page || page->n_commits >= IV_H5GUARD_MAX_COMMITS ||
        strlen(tmp) >= PATH_MAX_ || strlen(out) >= PATH_MAX_) {
        int rc = rename(tmp, out);
        if (rc == 0) iv_h5guard_temp(NULL);
        return rc;
    }
    int k = page->n_commits;
    snprintf(page->commit[k].tmp, PATH_MAX_, "%s", tmp);
    snprintf(page->commit[k].out, PATH_MAX_, "%s", out);
    page->n_commits = k + 1;
    page->temp[0] = '\0'; /* now the commit list's */
    return 0;
}

static void forward(int sig)
{
    pid_t p = child_pid;
    if (p > 0) kill(p, sig);
}

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
#define N_FORWARDED (sizeof forwarded / sizeof forwarded[0])

/* The crash signals get their default action back in the child, so that
 * a crash inside libhdf5 ends the child by that signal (a sanitizer's
 * handler would print a report and exit with a status instead, and the
 * parent could not tell a damaged file from a failure). */
static void child_setup(pid_t parent)
{
    static const int crash[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash / sizeof crash[0]; i++) sigaction(crash[i], &sa, NULL);
    for (size_t i = 0; i < N_FORWARDED; i++) sigaction(forwarded[i], &sa, NULL);
    /* A parent killed outright leaves nobody to clean up: end with it,
     * by a signal the command's own handlers may catch to remove their
     * temporary file. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
}

static void copy_bounded(char *dst, const char *src, size_t cap)
{
    memcpy(dst, src, cap - 1);
    dst[cap - 1] = '\0';
}

static unsigned stall_seconds(void)
{
    const char *v = getenv("IVSERVE_STALL_TIMEOUT_S");
    if (!v || !*v) return DEFAULT_STALL_S;
    char *end;
    unsigned long s = strtoul(v, &end, 10);
    return *end || s == 0 || s > 86400 ? DEFAULT_STALL_S : (unsigned)s;
}

/* Waits for the child, killing it when its beats stop for the stall
 * timeout; 1 when it was killed for that. */
static int wait_child(pid_t pid, shared_page_t *sp, int *status)
{
    unsigned stall = stall_seconds();
    uint64_t seen = __atomic_load_n(&sp->beats, __ATOMIC_RELAXED);
    double last = iv_now_s();
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid) return 0;
        if (w < 0 && errno != EINTR) return -1;
        uint64_t b = __atomic_load_n(&sp->beats, __ATOMIC_RELAXED);
        double t = iv_now_s();
        if (b != seen) {
            seen = b;
            last = t;
        } else if (t - last > (double)stall) {
            kill(pid, SIGKILL);
            while (waitpid(pid, status, 0) < 0 && errno == EINTR) {}
            return 1;
        }
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* Renames the child's finished files into place (it exited 0); removes
 * them all when it did not.  The status to return. */
static int settle_commits(shared_page_t *sp, int ok)
{
    int n = sp->n_commits, rc = 0;
    if (n < 0) n = 0;
    if (n > IV_H5GUARD_MAX_COMMITS) n = IV_H5GUARD_MAX_COMMITS;
    for (int k = 0; k < n; k++) {
        char tmp[PATH_MAX_], out[PATH_MAX_];
        copy_bounded(tmp, sp->commit[k].tmp, sizeof tmp);
        copy_bounded(out, sp->commit[k].out, sizeof out);
        if (ok && rc == 0 && rename(tmp, out) != 0) {
            fprintf(stderr, "ivserve: error: %s: cannot rename the finished file into place: %s\n",
                    out, strerror(errno));
            rc = 1;
        }
        if (!ok || rc) unlink(tmp);
    }
    return rc;
}

/* Forks the writer with the forwarded signals blocked (so that one
 * arriving before child_pid is set is not lost: it waits for the
 * handler), their mask before in *old.  The child runs fn and exits; the
 * parent gets its pid, or -1 with the mask restored and a message. */
static pid_t fork_writer(shared_page_t *sp, iv_h5guard_fn fn, void *ctx, sigset_t *old)
{
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < N_FORWARDED; i++) sigaddset(&block, forwarded[i]);
    sigprocmask(SIG_BLOCK, &block, old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        sigprocmask(SIG_SETMASK, old, NULL);
        fprintf(stderr, "ivserve: error: cannot start the writer process: %s\n", strerror(e));
        return -1;
    }
    if (pid == 0) {
        page = sp;
        child_setup(parent);
        sigprocmask(SIG_SETMASK, old, NULL);
        int rc = fn(ctx);
        sp->returned = 1;
        fflush(stdout);
        fflush(stderr);
        /* exit, not _exit: the sanitizers' leak check runs at exit. */
        exit(rc & 0xff);
    }
    return pid;
}

/* Waits for the writer with the forwarded signals passed on to it and
 * the mask old restored; wait_child's answer. */
static int wait_forwarding(pid_t pid, shared_page_t *sp, const sigset_t *old, int *status)
{
    child_pid = pid;
    struct sigaction sa, saved[N_FORWARDED];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < N_FORWARDED; i++) sigaction(forwarded[i], &sa, &saved[i]);
    sigprocmask(SIG_SETMASK, old, NULL);
    int stalled = wait_child(pid, sp, status);
    for (size_t i = 0; i < N_FORWARDED; i++) sigaction(forwarded[i], &saved[i], NULL);
    child_pid = 0;
    return stalled;
}

/* How a writer that was killed by signal sig ended, told; the status. */
static int report_signal(const char *input, int sig, const char *stage, const char *left)
{
    for (size_t i = 0; i < N_FORWARDED; i++)
        if (sig == forwarded[i]) return 128 + sig;
    if (sig == SIGKILL) {
        fprintf(stderr, "ivserve: error: %s: the writer was killed (signal %d)%s%s; out of memory? "
                "%s\n", input, sig, stage[0] ? " while " : "", stage, left);
        return 1;
    }
    fprintf(stderr, "ivserve: error: %s: HDF5 crashed%s%s (signal %d, %s); the file is damaged; "
            "%s\n", input, stage[0] ? " " : "", stage, sig, strsignal(sig), left);
    return 1;
}

/* How the writer ended, told on stderr unless cleanly; the status to
 * return (rc: settle_commits'). */
static int report_end(const char *input, int stalled, int returned, int status, int rc,
                      const char *stage, const char *left)
{
    if (stalled < 0) {
        fprintf(stderr, "ivserve: error: lost the writer process: %s\n", strerror(errno));
        return 1;
    }
    if (stalled) {
        fprintf(stderr, "ivserve: error: %s: the writer made no progress for %u s%s%s and was "
                "stopped (libhdf5 loops on some damaged files; IVSERVE_STALL_TIMEOUT_S sets the "
                "limit); %s\n", input, stall_seconds(), stage[0] ? " while " : "", stage, left);
        return 1;
    }
    if (WIFEXITED(status) && !returned) {
        /* Ended inside the command, not by its return: a library called
         * exit, or a sanitizer stopped it on a fault inside libhdf5. */
        fprintf(stderr, "ivserve: error: %s: the writer stopped (exit status %d)%s%s before it "
                "finished; the file is damaged; %s\n", input, WEXITSTATUS(status),
                stage[0] ? " while " : "", stage, left);
        return 1;
    }
    if (WIFEXITED(status)) return rc ? rc : WEXITSTATUS(status);
    return report_signal(input, WTERMSIG(status), stage, left);
}

int iv_h5guard_run(const char *input, iv_h5guard_fn fn, void *ctx)
{
    const char *off = getenv("IVSERVE_NO_GUARD");
    if (off && strcmp(off, "1") == 0) return fn(ctx);
    shared_page_t *sp = mmap(NULL, sizeof *sp, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sp == MAP_FAILED) {
        fprintf(stderr, "ivserve: error: cannot map the guard page: %s\n", strerror(errno));
        return 1;
    }
    memset(sp, 0, sizeof *sp);
    /* Nothing buffered may be written twice, once by each process. */
    fflush(stdout);
    fflush(stderr);
    sigset_t old;
    pid_t pid = fork_writer(sp, fn, ctx, &old);
    if (pid < 0) {
        munmap(sp, sizeof *sp);
        return 1;
    }
    int status = 0;
    int stalled = wait_forwarding(pid, sp, &old, &status);
    int returned = sp->returned;
    int clean = stalled == 0 && returned && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int rc = settle_commits(sp, clean);
    char stage[STAGE_MAX], temp[PATH_MAX_];
    copy_bounded(stage, sp->stage, sizeof stage);
    copy_bounded(temp, sp->temp, sizeof temp);
    munmap(sp, sizeof *sp);
    /* The child's temporary file is gone once it succeeded (renamed) or
     * failed cleanly (removed); anything left is the dead child's. */
    int removed = temp[0] && unlink(temp) == 0;
    const char *left = removed ? "the partial output was removed" : "nothing was written";
    return report_end(input, stalled, returned, status, rc, stage, left);
}
