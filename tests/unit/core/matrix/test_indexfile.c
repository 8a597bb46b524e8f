/*
 * The row index kept in the cache folder (core/matrix/indexfile.c and its
 * use by iv_dataset_open): a second open of the same file reads the kept
 * index instead of making the pass, and gets exactly the checkpoints and
 * chunk checksums the pass gave; a kept index that is damaged, truncated,
 * of another format or made for another file or stride is never taken.
 * The file is the bundled example (examples/pbmc_example.h5ad), copied.
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

static void setup(void) { iv_test_kept_setup(&kr, "indexfile"); }
static void teardown(void) { iv_test_kept_teardown(&kr); }

static iv_dataset_t *open_kept(uint32_t stride)
{
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.index_dir = kr.dir;
    o.index_stride = stride;
    iv_dataset_t *ds = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_msg(iv_dataset_open(kr.file, &o, &ds, &err) == 0, "open: %s", err.msg);
    return ds;
}

/* The kept index's path, as dataset.c names it. */
static void kept_path(char *out, size_t cap)
{
    char key[IV_CACHEDIR_KEY_LEN];
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_cachedir_key(kr.file, key, &err), 0);
    ck_assert_int_eq(iv_cachedir_path(kr.dir, kr.file, key, "X.index", out, cap, &err), 0);
}

/* Same checkpoints, and every stored chunk read back without a changed-
 * file error: the kept sums are the pass's. */
static void same_index(iv_dataset_t *a, iv_dataset_t *b)
{
    ck_assert_uint_eq(a->ri.stride, b->ri.stride);
    ck_assert_uint_eq(a->ri.n_ckpt, b->ri.n_ckpt);
    ck_assert(memcmp(a->ri.off, b->ri.off, a->ri.n_ckpt * sizeof *a->ri.off) == 0);
    uint64_t n = iv_stream_n_chunks(a->stream);
    ck_assert_uint_eq(n, iv_stream_n_chunks(b->stream));
    uint64_t *sa = calloc(n + 1, 8), *sb = calloc(n + 1, 8);
    ck_assert_uint_eq(iv_stream_sums(a->stream, sa), n);
    ck_assert_uint_eq(iv_stream_sums(b->stream, sb), n);
    ck_assert(memcmp(sa, sb, n * 8) == 0);
    free(sa);
    free(sb);
    iv_dataset_cache_drop(b);
    for (uint64_t c = 0; c < n; c++) {
        const uint8_t *p;
        size_t len;
        iv_err_t err;
        iv_err_clear(&err);
        ck_assert_msg(iv_stream_acquire(b->stream, c, &p, &len, NULL, &err) == 0, "chunk %llu: %s",
                      (unsigned long long)c, err.msg);
        iv_stream_release(b->stream, c);
    }
}

START_TEST(second_open_reads_the_kept_index)
{
    setup();
    iv_dataset_t *a = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(a)->index_kept, 0);
    ck_assert_uint_gt(iv_stream_n_chunks(a->stream), 1);
    char at[4400];
    kept_path(at, sizeof at);
    ck_assert_msg(access(at, R_OK) == 0, "no kept index at %s", at);
    iv_dataset_t *b = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(b)->index_kept, 1);
    same_index(a, b);
    iv_dataset_close(b);
    /* Another stride: made again, not taken. */
    iv_dataset_t *c = open_kept(7);
    ck_assert_int_eq(iv_dataset_info(c)->index_kept, 0);
    ck_assert_uint_eq(c->ri.stride, 7);
    iv_dataset_close(c);
    iv_dataset_close(a);
    teardown();
}
END_TEST

START_TEST(damaged_kept_index_is_not_taken)
{
    setup();
    iv_dataset_t *a = open_kept(0);
    char at[4400];
    kept_path(at, sizeof at);
    struct stat st;
    ck_assert_int_eq(stat(at, &st), 0);
    /* A flipped byte in the checkpoints. */
    int fd = open(at, O_RDWR);
    ck_assert_int_ge(fd, 0);
    off_t pos = st.st_size - 16;
    uint8_t byte;
    ck_assert_int_eq(pread(fd, &byte, 1, pos), 1);
    byte ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &byte, 1, pos), 1);
    close(fd);
    iv_dataset_t *b = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(b)->index_kept, 0);
    same_index(a, b);
    iv_dataset_close(b);
    /* The open above wrote it again: taken once more. */
    b = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(b)->index_kept, 1);
    iv_dataset_close(b);
    /* A checkpoint past the stream's end under a checksum that holds (a
     * file written to lie): checked, not taken. */
    {
        int fd2 = open(at, O_RDWR);
        ck_assert_int_ge(fd2, 0);
        struct stat st2;
        ck_assert_int_eq(fstat(fd2, &st2), 0);
        size_t n = (size_t)st2.st_size;
        uint8_t *all = malloc(n);
        ck_assert_int_eq(pread(fd2, all, n, 0), (ssize_t)n);
        size_t head = n - 8 - 8 * (size_t)(a->ri.n_ckpt + iv_stream_n_chunks(a->stream));
        uint64_t past = iv_stream_length(a->stream) + 1;
        memcpy(all + head + 8 * (a->ri.n_ckpt - 1), &past, 8);
        uint64_t sum = iv_file_sum(all, n - 8);
        memcpy(all + n - 8, &sum, 8);
        ck_assert_int_eq(pwrite(fd2, all, n, 0), (ssize_t)n);
        close(fd2);
        free(all);
        b = open_kept(0);
        ck_assert_int_eq(iv_dataset_info(b)->index_kept, 0);
        same_index(a, b);
        iv_dataset_close(b);
        ck_assert_int_eq(stat(at, &st), 0);
    }
    /* Truncated. */
    ck_assert_int_eq(truncate(at, st.st_size - 8), 0);
    b = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(b)->index_kept, 0);
    same_index(a, b);
    iv_dataset_close(b);
    iv_dataset_close(a);
    teardown();
}
END_TEST

START_TEST(kept_index_of_another_file_is_not_taken)
{
    setup();
    iv_dataset_t *a = open_kept(0);
    char at[4400];
    kept_path(at, sizeof at);
    /* What iv_indexfile_load compares: a different file identity (here
     * the inode) or matrix is "made for another" and changes nothing. */
    iv_indexfile_for_t f = {.file = *iv_file_loaded_id(iv_stream_file(a->stream)),
                            .group = "X",
                            .n_major = (uint64_t)a->m.n_major,
                            .n_unique = (uint64_t)a->m.n_unique,
                            .nnz = (uint64_t)a->m.nnz};
    iv_rowindex_t ri = {0};
    const char *why = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    iv_indexfile_for_t g = f;
    g.file.ino++;
    ck_assert_int_eq(iv_indexfile_load(at, &g, a->stream, &ri, &why, &err), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    ck_assert_ptr_null(ri.off);
    g = f;
    g.group = "layers/counts";
    ck_assert_int_eq(iv_indexfile_load(at, &g, a->stream, &ri, &why, &err), 0);
    g = f;
    g.nnz++;
    ck_assert_int_eq(iv_indexfile_load(at, &g, a->stream, &ri, &why, &err), 0);
    /* One kept with another stride (as before stride 1 was the default)
     * says so. */
    g = f;
    g.stride = IV_ROWINDEX_DEFAULT_STRIDE + 3;
    ck_assert_int_eq(iv_indexfile_load(at, &g, a->stream, &ri, &why, &err), 0);
    ck_assert_str_eq(why, "made with another row-index stride");
    ck_assert_ptr_null(ri.off);
    char missing[4500];
    snprintf(missing, sizeof missing, "%s.none", at);
    ck_assert_int_eq(iv_indexfile_load(missing, &f, a->stream, &ri, &why, &err), 0);
    ck_assert_str_eq(why, "none kept");
    /* Another format: the magic. */
    int fd = open(at, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "NOTANIDX", 8, 0), 8);
    close(fd);
    ck_assert_int_eq(iv_indexfile_load(at, &f, a->stream, &ri, &why, &err), 0);
    ck_assert_str_eq(why, "another format");
    /* The file itself rewritten (its time moved): a new key, a new name,
     * and the pass again. */
    struct timespec t[2] = {{1000000, 0}, {1000000, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, kr.file, t, 0), 0);
    iv_dataset_t *b = open_kept(0);
    ck_assert_int_eq(iv_dataset_info(b)->index_kept, 0);
    iv_dataset_close(b);
    iv_dataset_close(a);
    teardown();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("indexfile");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, second_open_reads_the_kept_index);
    tcase_add_test(tc, damaged_kept_index_is_not_taken);
    tcase_add_test(tc, kept_index_of_another_file_is_not_taken);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return iv_check_run(suite()); }
