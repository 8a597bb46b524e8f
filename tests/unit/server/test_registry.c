/* Tests of server/registry.c: file identity, lookup, readiness counts, and
 * the reference counts that let a reload drop an entry under running
 * requests (the sanitizer builds see a leak or a double free). */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry.h"

static iv_ds_conf_t conf_of(const char *id, const char *path)
{
    iv_ds_conf_t c;
    memset(&c, 0, sizeof c);
    c.id = (char *)id;
    c.path = (char *)path;
    c.transpose_bytes = -1;
    return c;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_file_identity)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ivregXXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    write_file(a, "one");
    iv_path_id_t x, y;
    iv_path_id_read(a, &x);
    ck_assert(x.ok);
    iv_path_id_read(a, &y);
    ck_assert(iv_path_id_same(&x, &y));
    /* Written in place, longer: another size. */
    write_file(a, "one more");
    iv_path_id_read(a, &y);
    ck_assert(!iv_path_id_same(&x, &y));
    /* The same size, another modification time. */
    iv_path_id_read(a, &x);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 678}};
    ck_assert_int_eq(utimensat(AT_FDCWD, a, ts, 0), 0);
    iv_path_id_read(a, &y);
    ck_assert(!iv_path_id_same(&x, &y));
    /* Written in place with the same size, the modification time put back
     * (touch -r): the change time, which cannot be set back, tells. */
    iv_path_id_read(a, &x);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);   /* past the clock's tick */
    write_file(a, "one MORE");
    ck_assert_int_eq(utimensat(AT_FDCWD, a, ts, 0), 0);
    iv_path_id_read(a, &y);
    ck_assert(y.ok && x.size == y.size && x.mtime_ns == y.mtime_ns && x.ino == y.ino);
    ck_assert(!iv_path_id_same(&x, &y));
    /* Renamed over with the same size and time: another inode. */
    iv_path_id_read(a, &x);
    write_file(b, "one more");
    ck_assert_int_eq(utimensat(AT_FDCWD, b, ts, 0), 0);
    ck_assert_int_eq(rename(b, a), 0);
    iv_path_id_read(a, &y);
    ck_assert(y.ok && x.size == y.size && x.mtime_ns == y.mtime_ns);
    ck_assert(!iv_path_id_same(&x, &y));
    /* Gone: not ok, and not the same as a file that was there. */
    ck_assert_int_eq(unlink(a), 0);
    iv_path_id_read(a, &x);
    ck_assert(!x.ok);
    ck_assert(!iv_path_id_same(&x, &y));
    iv_path_id_t z;
    iv_path_id_read(a, &z);
    ck_assert(iv_path_id_same(&x, &z));
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_entries_copy_their_settings)
{
    char id[] = "ds1", path[] = "/data/x.h5ad", title[] = "X", tok[] = "secret";
    char *toks[] = {tok};
    iv_ds_conf_t c = conf_of(id, path);
    c.title = title;
    c.tokens = toks;
    c.n_tokens = 1;
    iv_rds_t *d = iv_rds_new(&c);
    ck_assert_ptr_nonnull(d);
    /* The caller's strings may go (the reload frees its config). */
    memset(path, 'z', sizeof path - 1);
    memset(tok, 'z', sizeof tok - 1);
    ck_assert_str_eq(d->conf->path, "/data/x.h5ad");
    ck_assert_ptr_ne(d->conf->title, title);
    ck_assert_int_eq(d->state, IV_RDS_LOADING);
    ck_assert_uint_eq(d->conf->n_tokens, 1);
    ck_assert_str_eq(d->conf->tokens[0], "secret");
    iv_rds_unref(d);
}
END_TEST

START_TEST(test_lookup_and_readiness)
{
    iv_ds_conf_t ca = conf_of("a", "/a"), cb = conf_of("ab", "/b");
    iv_registry_t r = {0};
    r.v = calloc(2, sizeof *r.v);
    ck_assert_ptr_nonnull(r.v);
    r.v[r.n++] = iv_rds_new(&ca);
    r.v[r.n++] = iv_rds_new(&cb);
    ck_assert_ptr_eq(iv_registry_find(&r, "ab", 2), r.v[1]);
    ck_assert_ptr_eq(iv_registry_find(&r, "abc", 1), r.v[0]);  /* by length: "a" */
    ck_assert_ptr_null(iv_registry_find(&r, "b", 1));
    iv_registry_counts_t n;
    iv_registry_count(&r, &n);
    ck_assert_uint_eq(n.loading, 2);
    ck_assert(!iv_registry_ready(&r, 0) && !iv_registry_ready(&r, 1));
    r.v[0]->state = IV_RDS_READY;
    ck_assert(!iv_registry_ready(&r, 0) && iv_registry_ready(&r, 1));
    r.v[1]->state = IV_RDS_FAILED;
    iv_registry_count(&r, &n);
    ck_assert(n.ready == 1 && n.failed == 1 && n.loading == 0);
    ck_assert(!iv_registry_ready(&r, 0) && iv_registry_ready(&r, 1));
    r.v[1]->state = IV_RDS_READY;
    ck_assert(iv_registry_ready(&r, 0));
    iv_registry_free(&r);
    ck_assert_ptr_null(r.v);
}
END_TEST

START_TEST(test_retired_entry_lives_until_its_last_reference)
{
    iv_ds_conf_t c = conf_of("a", "/a");
    iv_rds_t *d = iv_rds_new(&c);
    iv_rds_t *p = iv_rds_new(&c);
    ck_assert(d && p);
    d->pending = p;       /* d holds p's reference */
    iv_rds_ref(p);        /* p's load job */
    iv_rds_ref(d);        /* a stream */
    iv_rds_retire(d);     /* the list lets go: the pending one is dropped with it */
    ck_assert(d->retired && p->retired);
    ck_assert_ptr_null(d->pending);
    ck_assert_uint_eq(d->refs, 1);
    ck_assert_uint_eq(p->refs, 1);
    ck_assert_str_eq(d->conf->id, "a");  /* still readable by the stream */
    iv_rds_unref(p);      /* the load job returns: freed */
    iv_rds_unref(d);      /* the stream ends: freed */
    iv_rds_unref(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_file_identity);
    tcase_add_test(tc, test_entries_copy_their_settings);
    tcase_add_test(tc, test_lookup_and_readiness);
    tcase_add_test(tc, test_retired_entry_lives_until_its_last_reference);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
