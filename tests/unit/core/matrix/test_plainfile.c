/*
 * The plain copy (core/matrix/plainfile.c and iv_dataset_use_plain): a
 * compressed stream written uncompressed to the cache folder holds
 * exactly the stream's bytes; queries that read it give, block for
 * block, the answers of the compressed stream (random selections with
 * duplicates, both output axes); a second use takes the kept copy; a
 * copy that is damaged, truncated, of another format or made for
 * another file is never taken; a copy whose bytes change under a running
 * dataset fails that read, is dropped (file removed) and the source
 * serves again.  The file is the bundled example (zstd, 16 KiB chunks),
 * copied.
 */
#include <check.h>

#include "check_main.h"
#include "kept_root.h"
#include "same_answers.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"
#include "dataset.h"
#include "dataset_impl.h"
#include "plainfile.h"
#include "query.h"

static iv_test_kept_root_t kr;

static void setup(void) { iv_test_kept_setup(&kr, "plainfile"); }
static void teardown(void) { iv_test_kept_teardown(&kr); }

static iv_dataset_opts_t opts(void)
{
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_dir = kr.dir;
    return o;
}

static iv_dataset_t *open_ds(void)
{
    iv_dataset_opts_t o = opts();
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(kr.file, &o, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

/* Opens the dataset and its plain copy: the use's result (1 kept, 2 written). */
static iv_dataset_t *open_plain(int want)
{
    iv_dataset_t *ds = open_ds();
    ck_assert_int_eq(iv_dataset_plain_wanted(ds), 1);
    iv_dataset_opts_t o = opts();
    iv_err_t err = {0};
    int rc = iv_dataset_use_plain(ds, &o, 1, &err);
    ck_assert_msg(rc == want, "use_plain gave %d (%s), expected %d", rc, err.msg, want);
    ck_assert_ptr_nonnull(atomic_load(&ds->plain));
    ck_assert_ptr_eq(iv_dataset_read_stream(ds), atomic_load(&ds->plain));
    return ds;
}

/* Every byte of the copy, read through its stream, is the source's. */
static void same_bytes(iv_stream_t *a, iv_stream_t *b)
{
    ck_assert_uint_eq(iv_stream_length(a), iv_stream_length(b));
    ck_assert_uint_eq(iv_stream_chunk_len(b), IV_PLAIN_CHUNK);
    uint64_t len = iv_stream_length(a), cl = iv_stream_chunk_len(a);
    uint8_t *all = malloc((size_t)len);
    for (uint64_t c = 0; c < iv_stream_n_chunks(a); c++) {
        const uint8_t *d;
        size_t n;
        iv_err_t err = {0};
        ck_assert_msg(iv_stream_acquire(a, c, &d, &n, NULL, &err) == 0, "%s", err.msg);
        memcpy(all + c * cl, d, n);
        iv_stream_release(a, c);
    }
    for (uint64_t c = 0; c < iv_stream_n_chunks(b); c++) {
        const uint8_t *d;
        size_t n;
        iv_err_t err = {0};
        ck_assert_msg(iv_stream_acquire(b, c, &d, &n, NULL, &err) == 0, "%s", err.msg);
        uint64_t want = len - c * IV_PLAIN_CHUNK < IV_PLAIN_CHUNK ? len - c * IV_PLAIN_CHUNK : IV_PLAIN_CHUNK;
        ck_assert_uint_eq(n, want);
        ck_assert_msg(memcmp(all + c * IV_PLAIN_CHUNK, d, n) == 0, "chunk %llu differs", (unsigned long long)c);
        iv_stream_release(b, c);
    }
    free(all);
}

START_TEST(copy_holds_the_stream_and_answers_the_same)
{
    /* Asked only to take a kept one: none yet, nothing published. */
    iv_dataset_t *ds = open_ds();
    iv_dataset_opts_t o = opts();
    iv_err_t err = {0};
    ck_assert_int_eq(iv_dataset_use_plain(ds, &o, 0, &err), 0);
    ck_assert_ptr_null(atomic_load(&ds->plain));
    iv_dataset_close(ds);
    ds = open_plain(2);
    same_bytes(ds->stream, atomic_load(&ds->plain));
    iv_dataset_t *ref = open_ds();
    ck_assert_ptr_null(atomic_load(&ref->plain));
    iv_test_same_answers(ref, ds, 40);
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    ck_assert_int_eq(st.plain, 1);
    iv_dataset_close(ds);
    /* The next use takes the kept copy, which answers the same. */
    ds = open_plain(1);
    iv_test_same_answers(ref, ds, 10);
    iv_dataset_close(ds);
    iv_dataset_close(ref);
}
END_TEST

/* iv_stream_prefetch is a hint: at any offset, in range or past the end,
 * cached or not, before and after a chunk is read, it pins, loads and
 * counts nothing (the sanitizer builds also check it reads nothing out
 * of bounds). */
START_TEST(prefetch_changes_nothing)
{
    iv_dataset_t *ds = open_plain(2);
    iv_stream_t *streams[2] = {ds->stream, atomic_load(&ds->plain)};
    for (int k = 0; k < 2; k++) {
        iv_stream_t *s = streams[k];
        ck_assert_ptr_nonnull(s);
        uint64_t len = iv_stream_chunk_len(s) * iv_stream_n_chunks(s);
        const uint8_t *data;
        size_t n;
        iv_err_t err = {0};
        ck_assert_int_eq(iv_stream_acquire(s, 0, &data, &n, NULL, &err), 0);
        iv_stream_release(s, 0);
        iv_stream_stats_t a, b;
        iv_stream_stats(s, &a);
        const uint64_t offs[] = {0, 1, len / 2, len ? len - 1 : 0, len, len + 1, len * 4 + 12345,
                                 UINT64_MAX};
        for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
            for (uint64_t l = 0; l < 6000; l += l < 2 ? 1 : 997) iv_stream_prefetch(s, offs[i], l);
        iv_stream_stats(s, &b);
        ck_assert_uint_eq(a.used, b.used);
        ck_assert_uint_eq(a.hits, b.hits);
        ck_assert_uint_eq(a.misses, b.misses);
        ck_assert_uint_eq(a.bytes_decompressed, b.bytes_decompressed);
        ck_assert_uint_eq(a.pinned_over_budget, b.pinned_over_budget);
    }
    iv_dataset_close(ds);
}
END_TEST

/* The kept copy's path (after a first use wrote it). */
static void written_copy(char *out, size_t cap)
{
    iv_dataset_t *ds = open_plain(2);
    snprintf(out, cap, "%s", ds->plain_at);
    iv_dataset_close(ds);
    struct stat st;
    ck_assert_int_eq(stat(out, &st), 0);
}

static void poke(const char *path, long off, int whence, uint8_t x)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, off, whence), 0);
    long at = ftell(f);
    int c = fgetc(f);
    ck_assert_int_ne(c, EOF);
    ck_assert_int_eq(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ x, f);
    fclose(f);
}

START_TEST(damaged_copy_is_not_taken)
{
    char at[4400];
    written_copy(at, sizeof at);
    struct stat st;
    ck_assert_int_eq(stat(at, &st), 0);
    iv_dataset_t *ref = open_ds();
    /* The header's magic, the header's source, a chunk checksum, the
     * trailer: each is written again (2), and the new copy is sound. */
    const long where[][2] = {{0, SEEK_SET}, {24, SEEK_SET}, {-16, SEEK_END}, {-1, SEEK_END}};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        poke(at, where[i][0], (int)where[i][1], 0x20);
        iv_dataset_t *ds = open_plain(2);
        iv_test_same_answers(ref, ds, 3);
        iv_dataset_close(ds);
    }
    /* Truncated. */
    ck_assert_int_eq(truncate(at, st.st_size - 8), 0);
    iv_dataset_t *ds = open_plain(2);
    iv_dataset_close(ds);
    /* Made for another stream or group: not taken, says why. */
    iv_plainfile_for_t f = {.file = *iv_file_loaded_id(iv_stream_file(ref->stream)), .group = "X",
                            .length = iv_stream_length(ref->stream)};
    iv_stream_t *s = NULL;
    const char *why = NULL;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_plainfile_open(at, &f, IV_PLAIN_CHUNK, 1 << 20, &s, &why, &err), 1);
    iv_stream_destroy(s);
    f.length--;
    ck_assert_int_eq(iv_plainfile_open(at, &f, IV_PLAIN_CHUNK, 1 << 20, &s, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    f.length++;
    f.group = "layers/counts";
    ck_assert_int_eq(iv_plainfile_open(at, &f, IV_PLAIN_CHUNK, 1 << 20, &s, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    f.group = "X";
    f.file.mtime_ns++;
    ck_assert_int_eq(iv_plainfile_open(at, &f, IV_PLAIN_CHUNK, 1 << 20, &s, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    ck_assert_int_eq(iv_plainfile_open("/nonexistent/x.plain", &f, IV_PLAIN_CHUNK, 1 << 20, &s, &why, &err), 0);
    ck_assert_str_eq(why, "none kept");
    ck_assert_ptr_null(s);
    iv_dataset_close(ref);
}
END_TEST

/* A byte of the copy's data changed under a running dataset, with the
 * file's time put back (so that only the chunk checksum can see it): the
 * query that reads it fails (IV_EFILE_CHANGED), the copy is dropped and
 * its file removed, and the next query is answered from the source. */
START_TEST(copy_changed_under_a_dataset_is_dropped)
{
    char at[4400];
    written_copy(at, sizeof at);
    iv_dataset_t *ds = open_plain(1);
    iv_dataset_t *ref = open_ds();
    iv_test_change_unseen(at, 4096 + 100);
    struct stat st;
    iv_sel_t all = {.all = 1};
    iv_block_t *b;
    int64_t nb;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_test_run_query(ds, &all, &all, IV_OUT_ROWS, &b, &nb, &err), IV_EFILE_CHANGED);
    ck_assert_msg(strstr(err.msg, ".X.plain changed on disk") != NULL, "%s", err.msg);
    iv_test_free_blocks(b, nb);
    ck_assert_ptr_eq(iv_dataset_read_stream(ds), ds->stream);
    ck_assert_int_ne(stat(at, &st), 0);
    iv_orient_status_t os;
    iv_dataset_orientations(ds, &os);
    ck_assert_int_eq(os.plain, 2);
    iv_test_same_answers(ref, ds, 5);
    /* The source itself is unharmed. */
    char msg[256];
    ck_assert_int_eq(iv_dataset_file_state(ds, msg, sizeof msg), IV_FILE_OK);
    iv_dataset_close(ds);
    iv_dataset_close(ref);
}
END_TEST

/* A write told to stop ends with IV_ECANCELLED and leaves no file, not
 * even its temporary one. */
START_TEST(stopped_write_leaves_nothing)
{
    iv_dataset_t *ds = open_ds();
    char at[400];
    snprintf(at, sizeof at, "%s/x.plain", kr.root);
    iv_plainfile_for_t f = {.file = *iv_file_loaded_id(iv_stream_file(ds->stream)), .group = "X",
                            .length = iv_stream_length(ds->stream)};
    atomic_int stop;
    atomic_init(&stop, 1);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_plainfile_save(at, &f, ds->stream, NULL, &stop, &err), IV_ECANCELLED);
    struct stat st;
    ck_assert_int_ne(stat(at, &st), 0);
    char tmp[500];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", at, (long)getpid());
    ck_assert_int_ne(stat(tmp, &st), 0);
    atomic_store(&stop, 0);
    ck_assert_int_eq(iv_plainfile_save(at, &f, ds->stream, NULL, &stop, &err), 0);
    ck_assert_int_eq(stat(at, &st), 0);
    iv_dataset_close(ds);
}
END_TEST

/* A stream with no stored chunks to speak of gets no copy. */
START_TEST(copy_needs_a_cache_folder)
{
    iv_dataset_t *ds = open_ds();
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_dataset_use_plain(ds, &o, 1, &err), IV_EUNSUPPORTED);
    ck_assert_ptr_null(atomic_load(&ds->plain));
    ck_assert_ptr_eq(iv_dataset_read_stream(ds), ds->stream);
    iv_dataset_close(ds);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("plainfile");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, copy_holds_the_stream_and_answers_the_same);
    tcase_add_test(tc, damaged_copy_is_not_taken);
    tcase_add_test(tc, copy_changed_under_a_dataset_is_dropped);
    tcase_add_test(tc, copy_needs_a_cache_folder);
    tcase_add_test(tc, stopped_write_leaves_nothing);
    tcase_add_test(tc, prefetch_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return iv_check_run(suite()); }
