/*
 * X's Zarr chunks kept in the cache folder (api/zarr_kept.h), on the
 * bundled example, written on a pool (batches of chunks made at once,
 * written in order): every chunk served from the kept file is the chunk
 * decoded on request, byte for byte, in both orientations; a second keep
 * takes the file rather than writing it; a file that is not the store
 * (another chunking, another magic, cut short, a damaged table, absent)
 * is refused with its reason; a part whose bytes were changed after the
 * file was taken is refused by its checksum, and the store then serves
 * the decoded chunk and removes the file; a cancelled write leaves
 * nothing behind; two writes of one file at once both succeed.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "dataset.h"
#include "kept_root.h"
#include "transpose.h"
#include "zarr.h"
#include "zarr_cache.h"
#include "zarr_impl.h"
#include "zarr_kept.h"

#define C 997  /* entries a chunk: more than 128 chunks (two of the largest batches, zarr_kept.c), boundaries inside slices */

typedef struct fx {
    iv_test_kept_root_t k;
    iv_dataset_t *ds;
    iv_zarr_src_t plain;      /* decodes every chunk */
    iv_zarr_src_t kept;       /* with a cache given the kept files */
    iv_zarr_keep_out_t out;
    iv_pool_t *pool;          /* makes the chunks of a write, 3 workers and the caller */
} fx_t;

static void fx_open(fx_t *f, const char *tag)
{
    memset(f, 0, sizeof *f);
    iv_test_kept_setup(&f->k, tag);
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    iv_err_t err = {0};
    ck_assert_msg(iv_dataset_open(f->k.file, &o, &f->ds, &err) == 0, "%s", err.msg);
    iv_transpose_opts_t to = {.budget = UINT64_MAX};
    ck_assert_msg(iv_dataset_build_other(f->ds, &to, &err) == 0, "%s", err.msg);
    f->plain = (iv_zarr_src_t){.ds = f->ds, .x_chunk = C};
    f->kept = (iv_zarr_src_t){.ds = f->ds, .x_chunk = C, .cache = iv_zarr_cache_new()};
    ck_assert_ptr_nonnull(f->kept.cache);
    f->pool = iv_pool_create(3, 0);
    ck_assert_ptr_nonnull(f->pool);
}

/* Keeps X's chunks, `width` chunks at a time (0: the pool's width). */
static void fx_keep_width(fx_t *f, size_t width)
{
    iv_zarr_keep_in_t in = {.dir = f->k.dir, .path = f->k.file, .pool = f->pool, .width = width};
    iv_zarr_keep_x(&f->kept, &in, &f->out);
}

static void fx_keep(fx_t *f)
{
    fx_keep_width(f, 0);
}

/* A fresh store state (a restart): nothing kept in it yet. */
static void fx_new_cache(fx_t *f)
{
    iv_zarr_cache_free(f->kept.cache);
    f->kept.cache = iv_zarr_cache_new();
    ck_assert_ptr_nonnull(f->kept.cache);
}

static void fx_close(fx_t *f)
{
    iv_zarr_cache_free(f->kept.cache);
    iv_dataset_close(f->ds);
    iv_pool_destroy(f->pool);
    iv_test_kept_teardown(&f->k);
}

static int64_t n_chunks(const fx_t *f)
{
    return (iv_dataset_info(f->ds)->nnz + C - 1) / C;
}

static int get(const iv_zarr_src_t *src, const char *key, iv_buf_t *out)
{
    iv_zarr_kind_t kind;
    iv_err_t err = {0};
    out->len = 0;
    int rc = iv_zarr_get(src, key, out, &kind, &err);
    ck_assert_msg(rc == 0, "%s: %s", key, err.msg);
    return rc;
}

/* Every X chunk of both orientations the same from both sources. */
static void same_chunks(const fx_t *f)
{
    iv_buf_t a, b;
    iv_buf_init(&a);
    iv_buf_init(&b);
    char key[96];
    for (int csr = 0; csr < 2; csr++)
        for (int64_t k = 0; k < n_chunks(f); k++)
            for (int part = 0; part < 2; part++) {
                snprintf(key, sizeof key, "%sX/%s/%lld", csr ? "csr/" : "", part ? "data" : "indices",
                         (long long)k);
                get(&f->plain, key, &a);
                get(&f->kept, key, &b);
                ck_assert_msg(a.len == b.len && memcmp(a.data, b.data, a.len) == 0, "%s differs", key);
            }
    iv_buf_free(&a);
    iv_buf_free(&b);
}

/* What a kept file of orientation csr must have been made for. */
static iv_zarr_kept_for_t for_of(const fx_t *f, int csr)
{
    const iv_dataset_info_t *in = iv_dataset_info(f->ds);
    iv_dataset_t *md = NULL;
    iv_err_t err = {0};
    ck_assert_int_eq(zarr_x_orient(f->ds, csr, &md, &err), 0);
    int64_t n_major = csr ? in->n_rows : in->n_cols;
    return (iv_zarr_kept_for_t){.csr = csr, .chunk = C, .nnz = in->nnz, .n_major = n_major,
                                .n_minor = csr ? in->n_cols : in->n_rows, .idx_size = 4,
                                .val_dtype = in->value_dtype, .ptr_sum = zarr_x_ptr_sum(md, n_major)};
}

static void flip_byte(const char *path, long off)
{
    FILE *fp = fopen(path, "r+b");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fseek(fp, off, off < 0 ? SEEK_END : SEEK_SET), 0);
    int c = fgetc(fp);
    ck_assert_int_ne(c, EOF);
    ck_assert_int_eq(fseek(fp, -1, SEEK_CUR), 0);
    fputc(c ^ 0x5a, fp);
    fclose(fp);
}

/* The reason iv_zarr_kept_open gives for path, or "taken". */
static const char *open_why(const char *path, const iv_zarr_kept_for_t *kf)
{
    iv_zarr_kept_t *k = NULL;
    const char *why = NULL;
    iv_err_t err = {0};
    int rc = iv_zarr_kept_open(path, kf, &k, &why, &err);
    ck_assert_msg(rc >= 0, "%s", err.msg);
    iv_zarr_kept_close(k);
    return rc == 1 ? "taken" : why;
}

static void copy_file(const char *from, const char *to, long cut)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    ck_assert(in && out);
    ck_assert_int_eq(fseek(in, 0, SEEK_END), 0);
    long n = ftell(in) - cut;
    rewind(in);
    for (long i = 0; i < n; i++) fputc(fgetc(in), out);
    fclose(in);
    fclose(out);
}

START_TEST(kept_chunks_are_the_decoded_ones)
{
    fx_t f;
    fx_open(&f, "zkept_same");
    ck_assert_int_gt(n_chunks(&f), 2 * 64);  /* many batches of 8 (3 workers), the last cut short */
    fx_keep(&f);
    for (int csr = 0; csr < 2; csr++) {
        ck_assert_msg(strstr(f.out.note[csr], "written"), "%s", f.out.note[csr]);
        ck_assert_msg(f.out.path[csr][0], "%s", f.out.note[csr]);
        uint64_t bytes;
        int dropped;
        iv_zarr_cache_kept_state(f.kept.cache, csr, &bytes, &dropped);
        ck_assert(bytes > 0 && !dropped);
    }
    same_chunks(&f);
    /* Another cache (a restart): the files are taken, not written again. */
    struct stat st0, st1;
    ck_assert_int_eq(stat(f.out.path[1], &st0), 0);
    fx_new_cache(&f);
    fx_keep(&f);
    for (int csr = 0; csr < 2; csr++) ck_assert_msg(strstr(f.out.note[csr], "kept"), "%s", f.out.note[csr]);
    ck_assert_int_eq(stat(f.out.path[1], &st1), 0);
    ck_assert(st0.st_ino == st1.st_ino && st0.st_mtim.tv_nsec == st1.st_mtim.tv_nsec);
    same_chunks(&f);
    /* A cache that has an orientation's files refuses a second. */
    iv_zarr_kept_t *k = NULL;
    iv_zarr_kept_for_t kf = for_of(&f, 1);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_zarr_kept_open(f.out.path[1], &kf, &k, NULL, &err), 1);
    ck_assert_int_eq(iv_zarr_cache_keep(f.kept.cache, f.ds, 1, C, k), -1);
    iv_zarr_kept_close(k);
    fx_close(&f);
}
END_TEST

START_TEST(a_file_not_the_store_is_refused)
{
    fx_t f;
    fx_open(&f, "zkept_refuse");
    fx_keep(&f);
    const char *path = f.out.path[1];
    iv_zarr_kept_for_t kf = for_of(&f, 1);
    ck_assert_str_eq(open_why(path, &kf), "taken");
    iv_zarr_kept_for_t other = kf;
    other.chunk = C + 1;
    ck_assert_str_eq(open_why(path, &other), "made for another matrix");
    other = kf;
    other.ptr_sum ^= 1;
    ck_assert_str_eq(open_why(path, &other), "made for another matrix");
    /* The gene-major file is not the cell-major store. */
    ck_assert_str_eq(open_why(f.out.path[0], &kf), "made for another matrix");
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s/cut", f.k.root);
    copy_file(path, tmp, 1);
    ck_assert_str_eq(open_why(tmp, &kf), "truncated");
    copy_file(path, tmp, 0);
    FILE *fp = fopen(tmp, "ab");
    fputc(0, fp);         /* a byte after the last part */
    fclose(fp);
    ck_assert_str_eq(open_why(tmp, &kf), "damaged");
    copy_file(path, tmp, 0);
    flip_byte(tmp, 100);  /* inside the table */
    ck_assert_str_eq(open_why(tmp, &kf), "damaged");
    copy_file(path, tmp, 0);
    flip_byte(tmp, 2);    /* the magic */
    ck_assert_str_eq(open_why(tmp, &kf), "another format");
    snprintf(tmp, sizeof tmp, "%s/absent", f.k.root);
    ck_assert_str_eq(open_why(tmp, &kf), "none kept");
    fx_close(&f);
}
END_TEST

START_TEST(a_damaged_part_is_decoded_instead)
{
    fx_t f;
    fx_open(&f, "zkept_damaged");
    fx_keep(&f);
    const char *path = f.out.path[1];
    /* The last byte of the file: the last chunk's values. */
    flip_byte(path, -1);
    int64_t last = n_chunks(&f) - 1;
    iv_zarr_kept_for_t kf = for_of(&f, 1);
    iv_zarr_kept_t *k = NULL;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_zarr_kept_open(path, &kf, &k, NULL, &err), 1);
    iv_buf_t b;
    iv_buf_init(&b);
    ck_assert_int_eq(iv_zarr_kept_read(k, last, 0, &b, &err), 0);
    size_t had = b.len;
    ck_assert_int_eq(iv_zarr_kept_read(k, last, 1, &b, &err), IV_ECORRUPT);
    ck_assert_uint_eq(b.len, had);  /* nothing appended */
    ck_assert_int_eq(iv_zarr_kept_read(k, last + 1, 0, &b, &err), IV_ENOT_FOUND);
    iv_zarr_kept_close(k);
    iv_buf_free(&b);
    /* Through the store: the decoded chunk, and the file removed. */
    same_chunks(&f);
    struct stat st;
    ck_assert_int_ne(stat(path, &st), 0);
    uint64_t bytes;
    int dropped;
    iv_zarr_cache_kept_state(f.kept.cache, 1, &bytes, &dropped);
    ck_assert(dropped);
    iv_zarr_cache_kept_state(f.kept.cache, 0, &bytes, &dropped);
    ck_assert(bytes > 0 && !dropped);  /* the other orientation's file stays */
    fx_close(&f);
}
END_TEST

static int fill_never(void *ctx, int64_t k, iv_buf_t parts[2], iv_err_t *err)
{
    (void)ctx, (void)k, (void)parts;
    return iv_fail(err, IV_EINTERNAL, "not to be called");
}

START_TEST(a_cancelled_write_leaves_nothing)
{
    fx_t f;
    fx_open(&f, "zkept_stop");
    char path[400];
    snprintf(path, sizeof path, "%s/x.zarr", f.k.dir);
    iv_zarr_kept_for_t kf = for_of(&f, 1);
    atomic_int stop = 1;
    iv_err_t err = {0};
    iv_zarr_save_t sv = {.fill = fill_never, .stop = &stop};
    ck_assert_int_eq(iv_zarr_kept_save(path, &kf, &sv, &err), IV_ECANCELLED);
    stop = 0;
    ck_assert_int_eq(iv_zarr_kept_save(path, &kf, &sv, &err), IV_EINTERNAL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", f.k.dir);
    ck_assert_msg(system(cmd) == 0, "files left in %s", f.k.dir);
    fx_close(&f);
}
END_TEST

/* A slow chunk maker, so that two writes of one file overlap. */
static int fill_slow(void *ctx, int64_t k, iv_buf_t parts[2], iv_err_t *err)
{
    (void)ctx, (void)err;
    usleep(1000);
    uint8_t b[2] = {(uint8_t)k, (uint8_t)(k >> 8)};
    iv_buf_append(&parts[0], b, 2);
    iv_buf_append(&parts[1], b, 1);
    return 0;
}

/* A store of 40 chunks of 10 entries, for writes whose fill makes up
 * the parts, at path in a fresh folder. */
#define FORTY                                                                                    \
    ((iv_zarr_kept_for_t){.csr = 1, .chunk = 10, .nnz = 10 * 40, .n_major = 3, .n_minor = 5, \
                          .idx_size = 4, .val_dtype = IV_DT_FLOAT32, .ptr_sum = 42})

static void forty_root(iv_test_kept_root_t *k, const char *tag, char *path, size_t cap)
{
    iv_test_kept_setup(k, tag);
    snprintf(path, cap, "%s/x.X.zarr-csr", k->dir);
}

typedef struct writer {
    const char *path;
    const iv_zarr_kept_for_t *f;
    int rc;
} writer_t;

static void *write_one(void *arg)
{
    writer_t *w = arg;
    iv_zarr_save_t sv = {.fill = fill_slow};
    iv_err_t err = {0};
    w->rc = iv_zarr_kept_save(w->path, w->f, &sv, &err);
    return NULL;
}

/* Two datasets of one file keep the same file at once (two threads of
 * one process): each writes its own temporary name, both succeed, and
 * the file is whole. */
START_TEST(two_writers_of_one_file)
{
    iv_test_kept_root_t k;
    char path[400];
    forty_root(&k, "zkept_two", path, sizeof path);
    iv_zarr_kept_for_t kf = FORTY;
    writer_t w[2] = {{path, &kf, -1}, {path, &kf, -1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, write_one, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    ck_assert_int_eq(w[0].rc, 0);
    ck_assert_int_eq(w[1].rc, 0);
    iv_zarr_kept_t *kp = NULL;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_zarr_kept_open(path, &kf, &kp, NULL, &err), 1);
    iv_buf_t b;
    iv_buf_init(&b);
    ck_assert_int_eq(iv_zarr_kept_read(kp, 39, 0, &b, &err), 0);
    ck_assert_uint_eq(b.len, 2);
    ck_assert_int_eq(((uint8_t *)b.data)[0], 39);
    iv_buf_free(&b);
    iv_zarr_kept_close(kp);
    iv_test_kept_teardown(&k);
}
END_TEST

/* A chunk maker whose parts are 3,000 and 1,000 bytes, in buffers of
 * 4,096 and 1,024 (iv_buf doubles from 256). */
static int fill_sized(void *ctx, int64_t k, iv_buf_t parts[2], iv_err_t *err)
{
    (void)ctx;
    uint8_t b[3000];
    memset(b, (int)(k & 0xff), sizeof b);
    iv_buf_append(&parts[0], b, 3000);
    iv_buf_append(&parts[1], b, 1000);
    return parts[0].oom || parts[1].oom ? iv_fail(err, IV_ENOMEM, "out of memory") : 0;
}

/* A write makes sv->width chunks at a time (two a pool thread and two
 * more when 0), and its batch's parts hold that many chunks' buffers,
 * no more; the file is the same whatever the width. */
START_TEST(a_write_holds_its_width_of_chunks)
{
    iv_test_kept_root_t k;
    char path[400];
    forty_root(&k, "zkept_width", path, sizeof path);
    iv_zarr_kept_for_t kf = FORTY;
    iv_pool_t *pool = iv_pool_create(3, 0);
    ck_assert_ptr_nonnull(pool);
    ck_assert_uint_eq(IV_ZARR_SAVE_WIDTH(3), 8);
    const size_t widths[] = {1, 2, 5, 0}, per_chunk = 4096 + 1024;
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
        size_t held = 0;
        iv_err_t err = {0};
        iv_zarr_save_t sv = {.fill = fill_sized, .pool = pool, .width = widths[i], .held = &held};
        ck_assert_msg(iv_zarr_kept_save(path, &kf, &sv, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(held, (widths[i] ? widths[i] : 8) * per_chunk);
        iv_zarr_kept_t *kp = NULL;
        ck_assert_int_eq(iv_zarr_kept_open(path, &kf, &kp, NULL, &err), 1);
        iv_buf_t b;
        iv_buf_init(&b);
        for (int64_t c = 0; c < 40; c++) {
            b.len = 0;
            ck_assert_int_eq(iv_zarr_kept_read(kp, c, 0, &b, &err), 0);
            ck_assert_uint_eq(b.len, 3000);
            ck_assert_int_eq(((uint8_t *)b.data)[2999], (int)c);
        }
        iv_buf_free(&b);
        iv_zarr_kept_close(kp);
        ck_assert_int_eq(unlink(path), 0);
    }
    iv_pool_destroy(pool);
    iv_test_kept_teardown(&k);
}
END_TEST

/* A keep told to make one chunk at a time holds less than one of the
 * pool's width, each within what iv_zarr_keep_bytes says the keep holds
 * (what the server reserves for it), and its files serve the decoded
 * chunks. */
START_TEST(a_keep_holds_what_it_says)
{
    fx_t f;
    fx_open(&f, "zkept_bytes");
    size_t one = iv_zarr_keep_bytes(&f.kept, 3, 1), wide = iv_zarr_keep_bytes(&f.kept, 3, IV_ZARR_SAVE_WIDTH(3));
    ck_assert_uint_lt(one, wide);
    fx_keep_width(&f, 1);
    for (int csr = 0; csr < 2; csr++) ck_assert_msg(strstr(f.out.note[csr], "written"), "%s", f.out.note[csr]);
    size_t held_one = f.out.held;
    ck_assert(held_one > 0 && held_one <= one);
    same_chunks(&f);
    for (int csr = 0; csr < 2; csr++) ck_assert_int_eq(unlink(f.out.path[csr]), 0);
    fx_new_cache(&f);
    fx_keep(&f);
    for (int csr = 0; csr < 2; csr++) ck_assert_msg(strstr(f.out.note[csr], "written"), "%s", f.out.note[csr]);
    ck_assert(f.out.held > held_one && f.out.held <= wide);
    same_chunks(&f);
    fx_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zarr_kept");
    TCase *tc = tcase_create("kept");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, kept_chunks_are_the_decoded_ones);
    tcase_add_test(tc, a_file_not_the_store_is_refused);
    tcase_add_test(tc, a_damaged_part_is_decoded_instead);
    tcase_add_test(tc, a_cancelled_write_leaves_nothing);
    tcase_add_test(tc, two_writers_of_one_file);
    tcase_add_test(tc, a_write_holds_its_width_of_chunks);
    tcase_add_test(tc, a_keep_holds_what_it_says);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
