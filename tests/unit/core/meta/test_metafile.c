/*
 * The metadata kept between runs (core/meta/metafile.c): an answer saved
 * and mapped back is the same bytes, 8-aligned; a kept file is taken only
 * for the same source identity and group, and one truncated, of another
 * format or with any flipped byte is passed over with the reason.
 */
#include <check.h>

#include "check_main.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metafile.h"

static char root[64], kept[128];
static uint8_t answer[4000];
static const iv_file_id_t SRC = {.dev = 7, .ino = 99, .size = 123456, .mtime_s = 1700000000,
                                 .mtime_ns = 5};

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/metafileXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(kept, sizeof kept, "%s/a-key.X.meta", root);
    for (size_t i = 0; i < sizeof answer; i++) answer[i] = (uint8_t)(i * 131 + 7);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_metafile_save(kept, &SRC, "X", answer, sizeof answer, &err), 0);
}

static void teardown(void)
{
    unlink(kept);
    rmdir(root);
}

/* Opens kept for src and group; returns what open returned, *why set. */
static int open_kept(const iv_file_id_t *src, const char *group, const char **why)
{
    iv_metafile_t mf;
    iv_err_t err = {0};
    int rc = iv_metafile_open(kept, src, group, &mf, why, &err);
    if (rc == 1) {
        ck_assert_uint_eq(mf.answer_len, sizeof answer);
        ck_assert_int_eq(memcmp(mf.answer, answer, sizeof answer), 0);
        ck_assert_uint_eq((uintptr_t)mf.answer % 8, 0);
        iv_metafile_unmap(&mf);
        ck_assert_ptr_null(mf.map);
    } else {
        ck_assert_ptr_null(mf.map);
    }
    return rc;
}

START_TEST(saved_answer_maps_back_whole)
{
    const char *why = NULL;
    ck_assert_int_eq(open_kept(&SRC, "X", &why), 1);
    ck_assert_str_eq(why, "mapped");
    ck_assert_int_eq(open_kept(&SRC, NULL, &why), 1);   /* NULL group: "X" */
}
END_TEST

START_TEST(another_source_or_group_is_not_taken)
{
    const char *why = NULL;
    iv_file_id_t other = SRC;
    other.mtime_ns++;
    ck_assert_int_eq(open_kept(&other, "X", &why), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    other = SRC;
    other.size--;
    ck_assert_int_eq(open_kept(&other, "X", &why), 0);
    ck_assert_int_eq(open_kept(&SRC, "layers/counts", &why), 0);
    ck_assert_str_eq(why, "made for another file or matrix");
    unlink(kept);
    ck_assert_int_eq(open_kept(&SRC, "X", &why), 0);
    ck_assert_str_eq(why, "none kept");
}
END_TEST

static void flip(long at)
{
    FILE *f = fopen(kept, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x01, f);
    fclose(f);
}

START_TEST(any_flipped_byte_is_seen)
{
    /* Every byte of the header and a spread of the answer's. */
    long len = 0;
    FILE *f = fopen(kept, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fclose(f);
    for (long at = 0; at < len; at += at < 400 ? 1 : 97) {
        flip(at);
        const char *why = NULL;
        ck_assert_msg(open_kept(&SRC, "X", &why) == 0, "byte %ld flipped was taken", at);
        flip(at);
    }
    const char *why = NULL;
    ck_assert_int_eq(open_kept(&SRC, "X", &why), 1);
}
END_TEST

START_TEST(truncated_is_not_taken)
{
    const char *why = NULL;
    ck_assert_int_eq(truncate(kept, (off_t)sizeof answer), 0);
    ck_assert_int_eq(open_kept(&SRC, "X", &why), 0);
    ck_assert_str_eq(why, "truncated");
    ck_assert_int_eq(truncate(kept, 10), 0);
    ck_assert_int_eq(open_kept(&SRC, "X", &why), 0);
    ck_assert_str_eq(why, "truncated");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("metafile");
    TCase *tc = tcase_create("metafile");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, saved_answer_maps_back_whole);
    tcase_add_test(tc, another_source_or_group_is_not_taken);
    tcase_add_test(tc, any_flipped_byte_is_seen);
    tcase_add_test(tc, truncated_is_not_taken);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return iv_check_run(suite());
}
