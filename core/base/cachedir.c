/*
 * The cache folder (see cachedir.h).
 *
 * Why a note beside each derived file rather than a database: the folder
 * is shared by processes that come and go (the server, a second server on
 * the same folder, `ivserve pack` run by hand), and a note written once
 * and renamed into place needs no lock.  The producer writes the note
 * before its derived file is renamed into place, so a derived file always
 * has one; a note whose derived file never came (the producer died) is
 * removed by the next sweep once no live producer's temporary file is
 * there.
 */
#include "cachedir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"

#define FAILF(code, ...) IV_FAIL(err, (code), __VA_ARGS__)
#define HASHED_BYTES ((size_t)1 << 20)
#define NOTE_SUFFIX ".src"

/* Each missing parent of path in turn, as mkdir -p does. */
static int make_parents(const char *dir, char *path, iv_err_t *err)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return FAILF(IV_EIO, "cache folder %s: cannot create %s: %s", dir, path, strerror(errno));
        *p = '/';
    }
    return 0;
}

int iv_cachedir_prepare(const char *dir, iv_err_t *err)
{
    char path[4096];
    if (!dir || !*dir) return FAILF(IV_EINVALID_ARG, "cache folder: no path given");
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return FAILF(IV_EINVALID_ARG, "cache folder %s: path too long", dir);
    IV_TRY(make_parents(dir, path, err));
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return FAILF(IV_EIO, "cache folder %s: cannot create it: %s", dir, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return FAILF(IV_EIO, "cache folder %s: not a folder", dir);
    if (access(path, W_OK | X_OK) != 0)
        return FAILF(IV_EIO, "cache folder %s: cannot write there: %s", dir, strerror(errno));
    return 0;
}

static int hash_range(int fd, off_t off, size_t len, iv_sha256_t *h)
{
    unsigned char buf[65536];
    while (len > 0) {
        size_t want = len < sizeof buf ? len : sizeof buf;
        ssize_t got = pread(fd, buf, want, off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        iv_sha256_update(h, buf, (size_t)got);
        off += got;
        len -= (size_t)got;
    }
    return 0;
}

int iv_cachedir_key(const char *src, char key[IV_CACHEDIR_KEY_LEN], iv_err_t *err)
{
    int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FAILF(IV_EIO, "%s: cannot open: %s", src, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return FAILF(IV_EIO, "%s: cannot stat: %s", src, strerror(e));
    }
    iv_sha256_t h;
    iv_sha256_init(&h);
    uint64_t id[5] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                      (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec};
    iv_sha256_update(&h, id, sizeof id);
    size_t size = (size_t)st.st_size, head = size < HASHED_BYTES ? size : HASHED_BYTES;
    int rc = hash_range(fd, 0, head, &h);
    if (rc == 0 && size > HASHED_BYTES) {
        size_t tail = size - HASHED_BYTES < HASHED_BYTES ? size - HASHED_BYTES : HASHED_BYTES;
        rc = hash_range(fd, (off_t)(size - tail), tail, &h);
    }
    close(fd);
    if (rc != 0) return FAILF(IV_EIO, "%s: cannot read it (changed while read?)", src);
    unsigned char d[IV_SHA256_BYTES];
    iv_sha256_final(&h, d);
    char hex[2 * IV_SHA256_BYTES + 1];
    iv_sha256_hex(d, hex);
    memcpy(key, hex, IV_CACHEDIR_KEY_LEN - 1);
    key[IV_CACHEDIR_KEY_LEN - 1] = '\0';
    return 0;
}

/* c where any file system takes it in a name, else '_'. */
static char stem_char(char c)
{
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    return ok ? c : '_';
}

int iv_cachedir_path(const char *dir, const char *src, const char *key, const char *kind,
                     char *buf, size_t cap, iv_err_t *err)
{
    const char *base = strrchr(src, '/');
    base = base ? base + 1 : src;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".h5ad") == 0) n -= 5;
    if (n > 80) n = 80;
    char stem[81];
    /* Only the characters a file name anywhere takes; the key keeps two
     * sources with the same stem apart. */
    for (size_t i = 0; i < n; i++) stem[i] = stem_char(base[i]);
    stem[n] = '\0';
    int w = snprintf(buf, cap, "%s/%s-%s.%s", dir, n ? stem : "data", key, kind);
    if (w < 0 || (size_t)w >= cap) return FAILF(IV_EINVALID_ARG, "cache folder %s: path too long", dir);
    return 0;
}

int iv_cachedir_pwrite(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t put = pwrite(fd, p, n, (off_t)off);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
            if (put == 0) errno = EIO;
            return -1;
        }
        p += put;
        n -= (size_t)put;
        off += (uint64_t)put;
    }
    return 0;
}

int iv_cachedir_temp(const char *path, char *buf, size_t cap, iv_err_t *err)
{
    static atomic_uint next;
    unsigned n = atomic_fetch_add(&next, 1);
    if ((size_t)snprintf(buf, cap, "%s.tmp%ld-%u", path, (long)getpid(), n) >= cap)
        return FAILF(IV_EINVALID_ARG, "%s: path too long", path);
    return 0;
}

int iv_cachedir_write(const char *path, const iv_cachedir_part_t *parts, size_t n_parts,
                      iv_err_t *err)
{
    char tmp[4200];
    IV_TRY(iv_cachedir_temp(path, tmp, sizeof tmp, err));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        return FAILF(IV_EIO, "%s: cannot create: %s", tmp, strerror(e));
    }
    int bad = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < n_parts && !bad; off += parts[i].n, i++)
        bad = iv_cachedir_pwrite(fd, parts[i].p, parts[i].n, off);
    if (close(fd) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return FAILF(IV_EIO, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}

int iv_cachedir_map(const char *path, size_t min_len, void **map, size_t *len, const char **why,
                    iv_err_t *err)
{
    *map = NULL;
    *len = 0;
    *why = "none kept";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < min_len) {
        close(fd);
        *why = "truncated";
        return 0;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        if (e == ENOMEM) return FAILF(IV_ENOMEM, "%s: cannot map: %s", path, strerror(e));
        *why = "unreadable";
        return 0;
    }
    *map = p;
    *len = (size_t)st.st_size;
    return 1;
}

int iv_cachedir_note(const char *derived, const char *src, const char *key, iv_err_t *err)
{
    char note[4200], tmp[4300];
    if (snprintf(note, sizeof note, "%s" NOTE_SUFFIX, derived) >= (int)sizeof note)
        return FAILF(IV_EINVALID_ARG, "%s: path too long", derived);
    IV_TRY(iv_cachedir_temp(note, tmp, sizeof tmp, err));
    FILE *f = fopen(tmp, "w");
    if (!f) return FAILF(IV_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    int bad = fprintf(f, "%s\n%s", key, src) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, note) != 0) {
        int e = errno;
        unlink(tmp);
        return FAILF(IV_EIO, "%s: cannot write: %s", note, strerror(e));
    }
    return 0;
}

/* The note's time, not the derived file's: a derived file's own time is
 * part of its identity key (a packed copy is itself the source of its
 * kept row index and of its other orientation), so a use must not move
 * it. */
void iv_cachedir_touch(const char *derived)
{
    char note[4400];
    if ((size_t)snprintf(note, sizeof note, "%s.src", derived) < sizeof note)
        utimensat(AT_FDCWD, note, NULL, 0);
}

/* ---- the sweep ------------------------------------------------------------ */

typedef struct entry {
    char name[512];
    uint64_t bytes;
    struct timespec used;
} entry_t;

/* NAME.tmpPID or NAME.tmpPID-N: the PID, or 0 when name is not of that
 * form. */
static long temp_pid(const char *name)
{
    const char *t = strstr(name, ".tmp");
    if (!t) return 0;
    const char *last;
    while ((last = strstr(t + 1, ".tmp"))) t = last;
    const char *p = t + 4;
    if (!*p) return 0;
    long pid = 0;
    for (; *p && *p != '-'; p++) {
        if (*p < '0' || *p > '9' || pid > 1 << 24) return 0;
        pid = pid * 10 + (*p - '0');
    }
    if (*p == '-') {  /* the writer's number: digits to the end */
        if (!p[1]) return 0;
        for (p++; *p; p++)
            if (*p < '0' || *p > '9') return 0;
    }
    return pid;
}

static int alive(long pid)
{
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Whether 32 lower-case hex digits and a '.' follow the dash. */
static int key_follows(const char *dash)
{
    for (int i = 1; i <= 32; i++) {
        char c = dash[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return dash[33] == '.';
}

/* Ours: STEM-KEY.KIND with 32 hex digits after the last '-' before a '.'. */
static int derived_name(const char *name)
{
    size_t n = strlen(name);
    if (n > strlen(NOTE_SUFFIX) && !strcmp(name + n - strlen(NOTE_SUFFIX), NOTE_SUFFIX)) return 0;
    if (temp_pid(name)) return 0;
    for (const char *dash = strchr(name, '-'); dash; dash = strchr(dash + 1, '-'))
        if (key_follows(dash)) return 1;
    return 0;
}

/* 1 when the note beside derived names a source that still has its key. */
static int source_unchanged(const char *dir, const char *name)
{
    char note[4700], buf[4200];
    snprintf(note, sizeof note, "%s/%s" NOTE_SUFFIX, dir, name);
    FILE *f = fopen(note, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *nl = strchr(buf, '\n');
    if (!nl || nl - buf != IV_CACHEDIR_KEY_LEN - 1) return 0;
    *nl = '\0';
    char key[IV_CACHEDIR_KEY_LEN];
    iv_err_t e;
    iv_err_clear(&e);
    return iv_cachedir_key(nl + 1, key, &e) == 0 && strcmp(key, buf) == 0;
}

static int kept(const char *name, const char *const *keep, size_t n_keep)
{
    for (size_t i = 0; i < n_keep; i++) {
        const char *b = strrchr(keep[i], '/');
        if (!strcmp(b ? b + 1 : keep[i], name)) return 1;
    }
    return 0;
}

static void remove_derived(const char *dir, const char *name)
{
    char p[4700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
    snprintf(p, sizeof p, "%s/%s" NOTE_SUFFIX, dir, name);
    unlink(p);
}

static int older_first(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    if (x->used.tv_nsec != y->used.tv_nsec) return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A sweep in progress: the folder, the names to keep, and the derived
 * files listed so far. */
typedef struct sweep {
    const char *dir;
    const char *const *keep;
    size_t n_keep;
    entry_t *v;
    size_t n, cap;
    int live_temps;
    iv_cachedir_sweep_t rep;
} sweep_t;

/* Appends derived file name (path p, status st) to the list, with the
 * time its note was last touched when it has one. */
static int list_derived(sweep_t *sw, const char *name, const char *p, const struct stat *st,
                        iv_err_t *err)
{
    if (sw->n == sw->cap) {
        entry_t *nv = realloc(sw->v, (sw->cap = sw->cap ? sw->cap * 2 : 64) * sizeof *nv);
        if (!nv) return FAILF(IV_ENOMEM, "cache folder %s: out of memory", sw->dir);
        sw->v = nv;
    }
    entry_t *e = &sw->v[sw->n];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->bytes = (uint64_t)st->st_size;
    e->used = st->st_mtim;
    char note[4400];
    struct stat nst;
    if ((size_t)snprintf(note, sizeof note, "%s.src", p) < sizeof note && stat(note, &nst) == 0)
        e->used = nst.st_mtim;
    sw->n++;
    return 0;
}

/* One folder entry of the first pass: a dead temporary file goes, a
 * derived file is listed. */
static int sweep_entry(sweep_t *sw, const char *name, iv_err_t *err)
{
    if (name[0] == '.' || strlen(name) >= sizeof sw->v->name) return 0;
    char p[4700];
    snprintf(p, sizeof p, "%s/%s", sw->dir, name);
    long pid = temp_pid(name);
    if (pid) {
        if (alive(pid)) sw->live_temps++;
        else if (unlink(p) == 0) sw->rep.temps++;
        return 0;
    }
    if (!derived_name(name)) return 0;
    struct stat st;
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return list_derived(sw, name, p, &st, err);
}

/* Stale: the source changed or went away. */
static void drop_stale(sweep_t *sw)
{
    size_t m = 0;
    for (size_t i = 0; i < sw->n; i++) {
        if (!kept(sw->v[i].name, sw->keep, sw->n_keep) && !source_unchanged(sw->dir, sw->v[i].name)) {
            remove_derived(sw->dir, sw->v[i].name);
            sw->rep.stale++;
        } else {
            sw->v[m++] = sw->v[i];
        }
    }
    sw->n = m;
}

/* A note whose derived file never came goes, unless kept. */
static void drop_orphan_note(const sweep_t *sw, const char *name)
{
    size_t l = strlen(name), sl = strlen(NOTE_SUFFIX);
    if (l <= sl || strcmp(name + l - sl, NOTE_SUFFIX) || l - sl >= sizeof sw->v->name) return;
    char derived[4700], base[sizeof sw->v->name];
    snprintf(base, sizeof base, "%.*s", (int)(l - sl), name);
    /* A kept name's note stays: its producer wrote it first and
     * may not have begun its temporary file yet. */
    if (kept(base, sw->keep, sw->n_keep)) return;
    snprintf(derived, sizeof derived, "%s/%s", sw->dir, base);
    struct stat st;
    if (stat(derived, &st) != 0 && errno == ENOENT) {
        char p[4700];
        snprintf(p, sizeof p, "%s/%s", sw->dir, name);
        unlink(p);
    }
}

/* Least recently used first, to the bound (0: none); the bytes left. */
static uint64_t evict_to(sweep_t *sw, uint64_t max_bytes)
{
    uint64_t total = 0;
    for (size_t i = 0; i < sw->n; i++) total += sw->v[i].bytes;
    if (!max_bytes || total <= max_bytes) return total;
    qsort(sw->v, sw->n, sizeof *sw->v, older_first);
    for (size_t i = 0; i < sw->n && total > max_bytes; i++) {
        if (kept(sw->v[i].name, sw->keep, sw->n_keep)) continue;
        remove_derived(sw->dir, sw->v[i].name);
        total -= sw->v[i].bytes;
        sw->rep.evicted++;
    }
    return total;
}

int iv_cachedir_sweep(const char *dir, uint64_t max_bytes, const char *const *keep, size_t n_keep,
                      iv_cachedir_sweep_t *out, iv_err_t *err)
{
    sweep_t sw = {dir, keep, n_keep, NULL, 0, 0, 0, {0}};
    DIR *d = opendir(dir);
    if (!d) return FAILF(IV_EIO, "cache folder %s: cannot list: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) rc = sweep_entry(&sw, de->d_name, err);
    if (rc == 0) {
        drop_stale(&sw);
        /* Orphan notes only once no producer is at work. */
        if (!sw.live_temps) {
            rewinddir(d);
            while ((de = readdir(d))) drop_orphan_note(&sw, de->d_name);
        }
        sw.rep.bytes_left = evict_to(&sw, max_bytes);
    }
    closedir(d);
    free(sw.v);
    if (out) *out = sw.rep;
    return rc;
}
