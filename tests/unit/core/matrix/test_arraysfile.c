/*
 * The pointer and value arrays kept in the cache folder
 * (core/matrix/indexfile.c iv_arraysfile_*, and their use by
 * iv_dataset_open): saved arrays map back equal; a file with any byte
 * changed, truncated, or made for another file or group is never taken;
 * and a second open of a dataset maps them (no arrays through the reader
 * process) and holds exactly the arrays a read gives, while kept arrays
 * that do not fit the file (another shape, pointers that fail the load's
 * checks) are ignored with the reason in info.arrays_note.  The file is
 * the bundled example (examples/pbmc_example.h5ad), copied.
 */
#include <check.h>

#include "check_main.h"
#include "kept_root.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"
#include "dataset.h"
#include "dataset_impl.h"
#include "indexfile.h"

static iv_test_kept_root_t kr;

static void setup(void) { iv_test_kept_setup(&kr, "arraysfile"); }
static void teardown(void) { iv_test_kept_teardown(&kr); }

static iv_dataset_t *open_kept(void)
{
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_dir = kr.dir;
    iv_dataset_t *ds = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_msg(iv_dataset_open(kr.file, &o, &ds, &err) == 0, "open: %s", err.msg);
    return ds;
}

/* The kept arrays' path, as dataset.c names it. */
static void arrays_path(char *out, size_t cap)
{
    char key[IV_CACHEDIR_KEY_LEN];
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_cachedir_key(kr.file, key, &err), 0);
    ck_assert_int_eq(iv_cachedir_path(kr.dir, kr.file, key, "X.arrays", out, cap, &err), 0);
}

/* The same arrays, element for element. */
static void same_arrays(const iv_dataset_t *a, const iv_dataset_t *b)
{
    ck_assert_int_eq(a->m.n_major, b->m.n_major);
    ck_assert_int_eq(a->m.n_unique, b->m.n_unique);
    ck_assert_int_eq(a->m.nnz, b->m.nnz);
    ck_assert_int_eq(a->m.value_dtype, b->m.value_dtype);
    ck_assert(memcmp(a->m.major_ptr, b->m.major_ptr, (size_t)(a->m.n_major + 1) * 8) == 0);
    ck_assert(memcmp(a->m.value_ptr, b->m.value_ptr, (size_t)(a->m.n_unique + 1) * 8) == 0);
    ck_assert(memcmp(a->m.values, b->m.values,
                     (size_t)a->m.n_unique * iv_dtype_size(a->m.value_dtype)) == 0);
}

/* A small matrix's arrays: 3 slices, 5 value groups, 9 entries. */
static const int64_t MP[] = {0, 2, 2, 5};
static const int64_t VP[] = {0, 1, 3, 4, 7, 9};
static const float VAL[] = {1, 2, 3, 4, 5};

static iv_indexfile_for_t small_for(void)
{
    struct stat st;
    ck_assert_int_eq(stat(kr.file, &st), 0);
    iv_indexfile_for_t f = {.group = "X", .n_major = 3, .n_unique = 5, .nnz = 9};
    iv_file_id_of(&st, &f.file);
    return f;
}

START_TEST(saved_arrays_map_back_and_nothing_else_is_taken)
{
    setup();
    char at[400];
    snprintf(at, sizeof at, "%s/small.arrays", kr.dir);
    iv_indexfile_for_t f = small_for();
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_arraysfile_save(at, &f, MP, VP, VAL, IV_DT_FLOAT32, &err), 0);
    iv_arraysfile_t a;
    const char *why = NULL;
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 1);
    ck_assert_str_eq(why, "mapped");
    ck_assert_uint_eq(a.n_major, 3);
    ck_assert_uint_eq(a.n_unique, 5);
    ck_assert_uint_eq(a.nnz, 9);
    ck_assert_int_eq(a.value_dtype, IV_DT_FLOAT32);
    ck_assert(memcmp(a.major_ptr, MP, sizeof MP) == 0);
    ck_assert(memcmp(a.value_ptr, VP, sizeof VP) == 0);
    ck_assert(memcmp(a.values, VAL, sizeof VAL) == 0);
    ck_assert_uint_eq((uintptr_t)a.value_ptr % 8, 0);
    size_t len = a.len;
    iv_arraysfile_unmap(&a);
    ck_assert_ptr_null(a.map);

    /* Another file (its inode, its time) or another group. */
    iv_indexfile_for_t g = f;
    g.file.ino++;
    ck_assert_int_eq(iv_arraysfile_map(at, &g, &a, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    ck_assert_ptr_null(a.map);
    g = f;
    g.file.mtime_ns++;
    ck_assert_int_eq(iv_arraysfile_map(at, &g, &a, &why, &err), 0);
    g = f;
    g.group = "layers/counts";
    ck_assert_int_eq(iv_arraysfile_map(at, &g, &a, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");

    /* Any one byte changed, anywhere: never taken. */
    int fd = open(at, O_RDWR);
    ck_assert_int_ge(fd, 0);
    for (off_t pos = 0; pos < (off_t)len; pos++) {
        uint8_t byte, flipped;
        ck_assert_int_eq(pread(fd, &byte, 1, pos), 1);
        flipped = byte ^ 0x01;
        ck_assert_int_eq(pwrite(fd, &flipped, 1, pos), 1);
        int rc = iv_arraysfile_map(at, &f, &a, &why, &err);
        ck_assert_msg(rc == 0, "a flipped byte at %lld was taken", (long long)pos);
        ck_assert_ptr_null(a.map);
        ck_assert_int_eq(pwrite(fd, &byte, 1, pos), 1);
    }
    close(fd);
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 1);
    iv_arraysfile_unmap(&a);

    /* Truncated, or longer than its header says. */
    ck_assert_int_eq(truncate(at, (off_t)len - 8), 0);
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 0);
    ck_assert_str_eq(why, "truncated");
    ck_assert_int_eq(truncate(at, (off_t)len + 8), 0);
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 0);
    ck_assert_int_eq(truncate(at, 10), 0);
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 0);
    ck_assert_str_eq(why, "truncated");
    ck_assert_int_eq(truncate(at, 0), 0);
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 0);

    char missing[500];
    snprintf(missing, sizeof missing, "%s.none", at);
    ck_assert_int_eq(iv_arraysfile_map(missing, &f, &a, &why, &err), 0);
    ck_assert_str_eq(why, "none kept");
    teardown();
}
END_TEST

/* Arrays longer than a checksum block: every block is checked, the last
 * shorter one too. */
START_TEST(every_block_of_long_arrays_is_checked)
{
    setup();
    char at[400];
    snprintf(at, sizeof at, "%s/long.arrays", kr.dir);
    uint64_t n_major = IV_ARRAYSFILE_BLOCK / 8 * 2 + 1000;   /* major_ptr in 3 blocks */
    int64_t *mp = malloc((n_major + 1) * 8);
    for (uint64_t i = 0; i <= n_major; i++) mp[i] = 0;
    int64_t vp[1] = {0};
    float val[1] = {0};
    iv_indexfile_for_t f = small_for();
    f.n_major = n_major;
    f.n_unique = 0;
    f.nnz = 0;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_arraysfile_save(at, &f, mp, vp, val, IV_DT_FLOAT32, &err), 0);
    iv_arraysfile_t a;
    const char *why = NULL;
    ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 1);
    ck_assert_uint_eq(a.n_blocks, 1 + 3 + 1 + 0);   /* header, major_ptr, value_ptr, no values */
    iv_arraysfile_unmap(&a);
    uint64_t head = 344;
    off_t in_block[] = {(off_t)(head + 5), (off_t)(head + IV_ARRAYSFILE_BLOCK + 3),
                        (off_t)(head + 2 * IV_ARRAYSFILE_BLOCK + 7999),
                        (off_t)(head + (n_major + 1) * 8 + 2)};
    int fd = open(at, O_RDWR);
    ck_assert_int_ge(fd, 0);
    for (size_t k = 0; k < sizeof in_block / sizeof in_block[0]; k++) {
        uint8_t byte, flipped;
        ck_assert_int_eq(pread(fd, &byte, 1, in_block[k]), 1);
        flipped = byte ^ 0x80;
        ck_assert_int_eq(pwrite(fd, &flipped, 1, in_block[k]), 1);
        ck_assert_int_eq(iv_arraysfile_map(at, &f, &a, &why, &err), 0);
        ck_assert_str_eq(why, "damaged");
        /* Opened, only that block fails. */
        ck_assert_int_eq(iv_arraysfile_open(at, &f, &a, &why, &err), 1);
        for (size_t i = 0; i < a.n_blocks; i++)
            ck_assert_int_eq(iv_arraysfile_check_block(&a, i), i != k + 1);
        iv_arraysfile_unmap(&a);
        ck_assert_int_eq(pwrite(fd, &byte, 1, in_block[k]), 1);
    }
    close(fd);
    free(mp);
    teardown();
}
END_TEST

START_TEST(second_open_maps_the_kept_arrays)
{
    setup();
    iv_dataset_t *a = open_kept();
    ck_assert_int_eq(iv_dataset_info(a)->arrays_kept, 0);
    ck_assert_str_eq(iv_dataset_info(a)->arrays_note, "read (none kept)");
    ck_assert_ptr_null(a->arrays.map);
    char at[4400];
    arrays_path(at, sizeof at);
    ck_assert_msg(access(at, R_OK) == 0, "no kept arrays at %s", at);
    iv_dataset_t *b = open_kept();
    ck_assert_int_eq(iv_dataset_info(b)->arrays_kept, 1);
    ck_assert_str_eq(iv_dataset_info(b)->arrays_note, "mapped from the cache folder");
    ck_assert_ptr_nonnull(b->arrays.map);
    /* The dataset's arrays are the map's. */
    ck_assert_ptr_eq(b->m.major_ptr, b->arrays.major_ptr);
    ck_assert_ptr_eq(b->m.values, b->arrays.values);
    same_arrays(a, b);
    ck_assert_int_eq(iv_dataset_major_nnz(a, 17), iv_dataset_major_nnz(b, 17));
    iv_dataset_close(b);
    iv_dataset_close(a);
    teardown();
}
END_TEST

/* Kept arrays with a checksum that holds but content that does not fit
 * the file: ignored, the reason noted, the arrays read. */
static void refused(const iv_dataset_t *a, const char *at, const iv_indexfile_for_t *f,
                    const int64_t *mp, const int64_t *vp, const char *note)
{
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_arraysfile_save(at, f, mp, vp, a->m.values, (int)a->m.value_dtype, &err), 0);
    iv_dataset_t *b = open_kept();
    ck_assert_int_eq(iv_dataset_info(b)->arrays_kept, 0);
    ck_assert_str_eq(iv_dataset_info(b)->arrays_note, note);
    ck_assert_ptr_null(b->arrays.map);
    same_arrays(a, b);
    iv_dataset_close(b);
}

START_TEST(kept_arrays_that_do_not_fit_are_read_again)
{
    setup();
    iv_dataset_t *a = open_kept();
    char at[4400];
    arrays_path(at, sizeof at);
    iv_indexfile_for_t f = {.file = *iv_file_loaded_id(iv_stream_file(a->stream)), .group = "X",
                            .n_major = (uint64_t)a->m.n_major, .n_unique = (uint64_t)a->m.n_unique,
                            .nnz = (uint64_t)a->m.nnz};
    /* One slice fewer. */
    iv_indexfile_for_t g = f;
    g.n_major--;
    refused(a, at, &g, a->m.major_ptr, a->m.value_ptr,
            "read (kept arrays ignored: made for another shape)");
    /* The right shape, but a major_ptr that goes backwards. */
    size_t n = (size_t)a->m.n_major + 1;
    int64_t *mp = malloc(n * 8);
    memcpy(mp, a->m.major_ptr, n * 8);
    int64_t t = mp[5];
    mp[5] = mp[6];
    mp[6] = t;
    ck_assert_int_ne(mp[5], mp[6]);
    refused(a, at, &f, mp, a->m.value_ptr,
            "read (kept arrays ignored: its pointers fail the load's checks)");
    free(mp);
    /* Each refusal wrote them whole again: the next open maps them. */
    iv_dataset_t *b = open_kept();
    ck_assert_int_eq(iv_dataset_info(b)->arrays_kept, 1);
    same_arrays(a, b);
    iv_dataset_close(b);
    iv_dataset_close(a);
    teardown();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("arraysfile");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, saved_arrays_map_back_and_nothing_else_is_taken);
    tcase_add_test(tc, every_block_of_long_arrays_is_checked);
    tcase_add_test(tc, second_open_maps_the_kept_arrays);
    tcase_add_test(tc, kept_arrays_that_do_not_fit_are_read_again);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return iv_check_run(suite()); }
