/*
 * The file writers (`pack`, `export`, `check`) run in a guarded child.
 *
 * libhdf5 is not safe on damaged input, and the writers copy whole
 * objects of their input (H5Ocopy of obs, var, obsm, uns) and read
 * arrays with H5Dread in their own process: a damaged heap or header
 * there kills the process, and a killed writer used to leave its
 * temporary output behind.  The readers of the server run each HDF5 read
 * in a small child (h5iso.h), which suits reads that return a few
 * arrays; a writer's work is long, multi-threaded and writes a file, so
 * the whole command runs in one child instead:
 *
 *   parent: iv_h5guard_run() forks, forwards SIGINT/SIGTERM/SIGHUP to the
 *           child and waits;
 *   child:  runs the command, naming what it reads or copies
 *           (iv_h5guard_stage) and the temporary file it writes
 *           (iv_h5guard_temp) in a page shared with the parent.
 *
 * A child that dies by a signal becomes exit status 1 and one message
 * naming the input, the element and the signal; its temporary file is
 * removed by the parent.  A child that exits returns its own status.
 *
 * Thread rules: iv_h5guard_run must be called while the process has one
 * thread (before any pool is created: the child must be able to create
 * threads and take every lock).  iv_h5guard_stage and iv_h5guard_temp may
 * be called from any thread of the child, and do nothing outside a guard.
 */
#ifndef IV_H5GUARD_H
#define IV_H5GUARD_H

/* The command run in the child; its return value is the exit status
 * (0..255). */
typedef int (*iv_h5guard_fn)(void *ctx);

/*
 * Runs fn(ctx) in a child process and returns its exit status.  input
 * names the file in the message printed when the child dies by a signal
 * ("ivserve: error: IN: HDF5 crashed copying obs/cell_type (signal 11,
 * Segmentation fault); the file is damaged; nothing was written"), after
 * which 1 is returned.  A child ended by a signal the parent forwarded
 * returns 128 + that signal, quietly.  With IVSERVE_NO_GUARD=1 in the
 * environment fn runs in this process (for debuggers).
 */
int iv_h5guard_run(const char *input, iv_h5guard_fn fn, void *ctx);

/* Names what the child reads or copies now ("copying obs"); printf-style,
 * cut to 255 bytes. */
void iv_h5guard_stage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The temporary file the child is writing (removed by the parent if the
 * child fails), or NULL once it is renamed into place or removed. */
void iv_h5guard_temp(const char *path);

/*
 * Puts the finished temporary file tmp in place as out.  Outside a guard
 * this is rename(2).  In the child the rename is left to the parent,
 * which does it only once the child has exited with status 0: a child
 * that finished its file but died after (libhdf5 can crash closing a
 * damaged input) leaves out as it was.  At most IV_H5GUARD_MAX_COMMITS
 * files a run; past that the child renames them itself.  0, or -1 with
 * errno set (outside a guard, or past the limit).
 */
#define IV_H5GUARD_MAX_COMMITS 4
int iv_h5guard_commit(const char *tmp, const char *out);

/* Tells the parent that the child makes progress (cheap: one store).  A
 * child that neither beats nor names a new stage for the stall timeout
 * is killed: libhdf5 loops forever on some damaged structures.  The
 * timeout is 300 s, or IVSERVE_STALL_TIMEOUT_S seconds. */
void iv_h5guard_beat(void);

#endif /* IV_H5GUARD_H */
