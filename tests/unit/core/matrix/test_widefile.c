/*
 * The wide copy (core/matrix/widefile.c, iv_dataset_use_wide and
 * query.c's decode_slice_wide): the copy holds each entry's minor index,
 * as decoding the packed stream from its start gives them; a fill begun
 * at any entry (inside a value group, a slice) gives the same; queries
 * that read it answer, block for block, as the packed stream does, with
 * the vector kernel and without, and do read it; a second use takes the
 * kept copy; a copy changed under a running dataset is dropped, its file
 * removed, and the very query that met it still answers right.  The file
 * is the bundled example, copied.
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

#include "cursor.h"
#include "dataset.h"
#include "dataset_impl.h"
#include "query.h"
#include "widefile.h"

static iv_test_kept_root_t kr;

static void setup(void) { iv_test_kept_setup(&kr, "widefile"); }
static void teardown(void)
{
    iv_query_set_vector(1);
    iv_test_kept_teardown(&kr);
}

static iv_dataset_t *open_ds(void)
{
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_dir = kr.dir;
    iv_dataset_t *ds = NULL;
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(kr.file, &o, &ds, &err) == 0, "%s", err.msg);
    return ds;
}

/* Opens the dataset and its wide copy: the use's result (1 kept, 2 written). */
static iv_dataset_t *open_wide(int want)
{
    iv_dataset_t *ds = open_ds();
    ck_assert_int_eq(iv_dataset_wide_wanted(ds), 1);
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_dir = kr.dir;
    iv_err_t err = {0};
    int rc = iv_dataset_use_wide(ds, &o, 1, &err);
    ck_assert_msg(rc == want, "use_wide gave %d (%s), expected %d", rc, err.msg, want);
    ck_assert_ptr_nonnull(iv_dataset_wide_stream(ds));
    ck_assert_ptr_nonnull(iv_dataset_wide_path(ds));
    return ds;
}

/* Every entry's minor index, decoded from the packed stream's start, one
 * value group after another: the reference. */
static uint16_t *all_indices(iv_dataset_t *ds)
{
    const iv_h5matrix_t *m = &ds->m;
    uint16_t *out = malloc((size_t)m->nnz * 2);
    ck_assert_ptr_nonnull(out);
    iv_cursor_t cur;
    iv_cursor_init(&cur, ds->stream);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_cursor_seek(&cur, 0, &err), 0);
    for (int64_t g = 0; g < m->n_unique; g++) {
        int64_t prev = -1;
        for (int64_t k = m->value_ptr[g]; k < m->value_ptr[g + 1]; k++) {
            uint64_t d;
            ck_assert_int_eq(iv_cursor_read(&cur, &d, &err), 0);
            prev += 1 + (int64_t)d;
            ck_assert_int_lt(prev, m->n_minor);
            out[k] = (uint16_t)prev;
        }
    }
    iv_cursor_done(&cur);
    return out;
}

/* The wide stream's bytes, all of them. */
static void same_as_copy(iv_stream_t *w, const uint16_t *want, int64_t nnz)
{
    ck_assert_uint_eq(iv_stream_length(w), 2 * (uint64_t)nnz);
    for (uint64_t c = 0; c < iv_stream_n_chunks(w); c++) {
        const uint8_t *d;
        size_t n;
        iv_err_t err = {0};
        ck_assert_msg(iv_stream_acquire(w, c, &d, &n, NULL, &err) == 0, "%s", err.msg);
        ck_assert_msg(memcmp((const uint8_t *)want + c * IV_PLAIN_CHUNK, d, n) == 0, "chunk %llu differs",
                      (unsigned long long)c);
        iv_stream_release(w, c);
    }
}

static uint64_t rs = 4242;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

START_TEST(copy_holds_the_indices_and_answers_the_same)
{
    iv_dataset_t *ref = open_ds();
    uint16_t *want = all_indices(ref);
    int64_t nnz = ref->m.nnz;
    /* A fill from any entry to any other, inside groups and slices. */
    uint16_t *got = malloc((size_t)nnz * 2);
    for (int i = 0; i < 300; i++) {
        int64_t a = (int64_t)(rnd() % (uint64_t)nnz), b = a + 1 + (int64_t)(rnd() % 5000);
        if (b > nnz) b = nnz;
        iv_err_t err = {0};
        ck_assert_msg(iv_widefile_fill(ref, ref->stream, a, b, got, &err) == 0, "%s", err.msg);
        ck_assert_msg(memcmp(got, want + a, (size_t)(b - a) * 2) == 0, "entries %lld..%lld differ", (long long)a,
                      (long long)b);
    }
    free(got);
    iv_dataset_t *ds = open_wide(2);
    same_as_copy(iv_dataset_wide_stream(ds), want, nnz);
    /* Its slots are the dataset's index memory, its chunks the cache. */
    iv_dataset_memory_t mr, mw;
    iv_stream_stats_t ws;
    iv_dataset_memory(ref, &mr);
    iv_dataset_memory(ds, &mw);
    iv_stream_stats(iv_dataset_wide_stream(ds), &ws);
    ck_assert_uint_gt(ws.table_bytes, 0);
    ck_assert_uint_eq(mw.index, mr.index + ws.table_bytes);
    ck_assert_uint_eq(mw.cache, mr.cache + ws.used);
    for (int vec = 1; vec >= 0; vec--) {
        iv_query_set_vector(vec);
        iv_stream_stats_t before, after;
        iv_stream_stats(iv_dataset_wide_stream(ds), &before);
        iv_test_same_answers(ref, ds, 40);
        iv_stream_stats(iv_dataset_wide_stream(ds), &after);
        /* The queries that select genes did read the copy. */
        ck_assert_uint_gt(after.hits + after.misses, before.hits + before.misses);
    }
    iv_dataset_close(ds);
    /* The next use takes the kept copy, which answers the same. */
    ds = open_wide(1);
    iv_test_same_answers(ref, ds, 10);
    iv_dataset_close(ds);
    free(want);
    iv_dataset_close(ref);
}
END_TEST

/* The genes of a query that reads the copy: every tenth, ascending. */
static iv_sel_t some_genes(const iv_dataset_t *ds, int64_t **idx)
{
    int64_t n = (ds->m.n_minor + 9) / 10;
    *idx = malloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) (*idx)[k] = 10 * k;
    return (iv_sel_t){.n = n, .idx = *idx};
}

/* A byte of the copy's indices changed under a running dataset, with the
 * file's time put back (so that only the chunk checksum can see it): the
 * query that reads it still answers as the packed stream does, the copy
 * is dropped and its file removed, and later queries do not read it. */
START_TEST(copy_changed_under_a_dataset_is_dropped)
{
    iv_dataset_t *ds = open_wide(2);
    char at[4400];
    snprintf(at, sizeof at, "%s", iv_dataset_wide_path(ds));
    iv_dataset_close(ds);
    ds = open_wide(1);
    iv_dataset_t *ref = open_ds();
    iv_test_change_unseen(at, 4096 + 100);
    int64_t *vi;
    iv_sel_t all = {.all = 1}, var = some_genes(ds, &vi);
    iv_test_same_answer(ref, ds, &all, &var, IV_OUT_ROWS);
    ck_assert_ptr_null(iv_dataset_wide_stream(ds));
    ck_assert_ptr_null(iv_dataset_wide_path(ds));
    struct stat st;
    ck_assert_int_ne(stat(at, &st), 0);
    iv_orient_status_t os;
    iv_dataset_orientations(ds, &os);
    ck_assert_int_eq(os.wide, 2);
    iv_test_same_answers(ref, ds, 5);
    /* The source itself is unharmed. */
    char msg[256];
    ck_assert_int_eq(iv_dataset_file_state(ds, msg, sizeof msg), IV_FILE_OK);
    free(vi);
    iv_dataset_close(ds);
    iv_dataset_close(ref);
}
END_TEST

/* Queries made while the copy is turned off read the packed stream. */
START_TEST(turned_off_reads_the_packed_stream)
{
    iv_dataset_t *ds = open_wide(2);
    iv_stream_t *w = iv_dataset_wide_stream(ds);
    int64_t *vi;
    iv_sel_t all = {.all = 1}, var = some_genes(ds, &vi);
    iv_stream_stats_t a, b;
    iv_query_set_wide(0);
    iv_stream_stats(w, &a);
    iv_block_t *bl;
    int64_t nb;
    iv_err_t err = {0};
    ck_assert_msg(iv_test_run_query(ds, &all, &var, IV_OUT_ROWS, &bl, &nb, &err) == 0, "%s", err.msg);
    iv_test_free_blocks(bl, nb);
    iv_stream_stats(w, &b);
    iv_query_set_wide(1);
    ck_assert_uint_eq(a.hits + a.misses, b.hits + b.misses);
    ck_assert_msg(iv_test_run_query(ds, &all, &var, IV_OUT_ROWS, &bl, &nb, &err) == 0, "%s", err.msg);
    iv_test_free_blocks(bl, nb);
    iv_stream_stats(w, &b);
    ck_assert_uint_gt(b.hits + b.misses, a.hits + a.misses);
    free(vi);
    iv_dataset_close(ds);
}
END_TEST

/* No cache folder: no copy, and nothing published. */
START_TEST(copy_needs_a_cache_folder)
{
    iv_dataset_t *ds = open_ds();
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_dataset_use_wide(ds, &o, 1, &err), IV_EUNSUPPORTED);
    ck_assert_ptr_null(iv_dataset_wide_stream(ds));
    /* Asked only to take a kept one: none yet. */
    o.index_dir = kr.dir;
    ck_assert_int_eq(iv_dataset_use_wide(ds, &o, 0, &err), 0);
    ck_assert_ptr_null(iv_dataset_wide_stream(ds));
    iv_dataset_close(ds);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("widefile");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, copy_holds_the_indices_and_answers_the_same);
    tcase_add_test(tc, copy_changed_under_a_dataset_is_dropped);
    tcase_add_test(tc, turned_off_reads_the_packed_stream);
    tcase_add_test(tc, copy_needs_a_cache_folder);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return iv_check_run(suite()); }
