/*
 * The served file's checks (core/base/filecheck.c) and the stream's use of them
 * (core/matrix/stream.c): the checksum sees every changed bit, the identity tells
 * a file written in place from one renamed over or deleted, a short read
 * is an error and not a fault, and a stored chunk whose bytes changed
 * after the row-index pass fails its check even when the file's size and
 * modification time were put back.
 */
#include <check.h>

#include "check_main.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "filecheck.h"
#include "stream.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A temporary file holding n bytes of buf, modified a day ago, so that
 * a write now moves its modification time even on a coarse clock. */
static void make_file(char *path, const uint8_t *buf, size_t n)
{
    snprintf(path, 64, "/tmp/iv_filecheck_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, buf, n), (ssize_t)n);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 86400;
    ts[1] = ts[0];
    ck_assert_int_eq(futimens(fd, ts), 0);
    close(fd);
}

/* Writes n bytes at off in place, then puts the modification time back
 * (cp -p, touch -r): only the content checks can see it. */
static void write_keep_mtime(const char *path, size_t off, const void *p, size_t n)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, p, n, (off_t)off), (ssize_t)n);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ck_assert_int_eq(futimens(fd, ts), 0);
    close(fd);
}

START_TEST(sum_sees_every_bit)
{
    uint8_t buf[1003];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rnd();
    /* Every length, so that the 32-byte lanes and the tail are all hit. */
    for (size_t n = 0; n <= 100; n++) ck_assert_uint_ne(iv_file_sum(buf, n), 0);
    uint64_t base = iv_file_sum(buf, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++) {
        for (int b = 0; b < 8; b++) {
            buf[i] ^= (uint8_t)(1u << b);
            ck_assert_msg(iv_file_sum(buf, sizeof buf) != base, "flip of byte %zu bit %d unseen",
                          i, b);
            buf[i] ^= (uint8_t)(1u << b);
        }
    }
    /* Two words swapped, and a zero byte more, are other contents too. */
    uint8_t sw[64];
    memcpy(sw, buf, 64);
    memcpy(sw, buf + 8, 8);
    memcpy(sw + 8, buf, 8);
    ck_assert_uint_ne(iv_file_sum(sw, 64), iv_file_sum(buf, 64));
    uint8_t z[65] = {0};
    ck_assert_uint_ne(iv_file_sum(z, 64), iv_file_sum(z, 65));
    ck_assert_uint_eq(iv_file_sum(buf, sizeof buf), base);
}
END_TEST

START_TEST(sum_matches_the_portable_reference)
{
    /* The CRC32C instruction against the table version, bit for bit, at
     * every length up to 300 and every alignment. */
    static uint8_t buf[400];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n <= 300; n++)
            ck_assert_uint_eq(iv_file_sum(buf + off, n), iv_file_sum_portable(buf + off, n));
}
END_TEST

START_TEST(compare_tells_the_cases)
{
    uint8_t data[100] = {1, 2, 3};
    char path[64], other[64];
    make_file(path, data, sizeof data);
    make_file(other, data, sizeof data);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    iv_file_id_t id;
    iv_file_id_of(&st, &id);
    ck_assert_int_eq(iv_file_compare(&id, &st), IV_FILE_OK);
    ck_assert_int_eq(iv_file_compare(&id, NULL), IV_FILE_DELETED);

    /* chmod moves only the change time: not a change of the bytes. */
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(iv_file_compare(&id, &st), IV_FILE_OK);

    FILE *f = fopen(path, "ab");
    fputc(7, f);
    fclose(f);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(iv_file_compare(&id, &st), IV_FILE_CHANGED);
    char msg[200];
    iv_file_describe(&id, &st, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "size 100 -> 101"), "%s", msg);

    ck_assert_int_eq(rename(other, path), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(iv_file_compare(&id, &st), IV_FILE_REPLACED);
    unlink(path);
}
END_TEST

START_TEST(short_read_is_an_error)
{
    uint8_t data[8192];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rnd();
    char path[64];
    make_file(path, data, sizeof data);
    iv_file_t *f;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_file_open(path, &f, &err), 0);
    uint8_t got[4096];
    ck_assert_int_eq(iv_file_read(f, 4096, got, 4096, "chunk 1", &err), 0);
    ck_assert_int_eq(memcmp(got, data + 4096, 4096), 0);
    ck_assert_int_eq(iv_file_state(f, NULL, 0), IV_FILE_OK);

    /* Truncated under the reader: a mapping would fault here. */
    ck_assert_int_eq(truncate(path, 5000), 0);
    ck_assert_int_eq(iv_file_read(f, 4096, got, 4096, "chunk 1", &err), IV_EFILE_CHANGED);
    ck_assert_msg(strstr(err.msg, "shorter") && strstr(err.msg, "chunk 1"), "%s", err.msg);
    char msg[480];
    ck_assert_int_eq(iv_file_state(f, msg, sizeof msg), IV_FILE_CHANGED);
    ck_assert_ptr_nonnull(strstr(msg, path));
    ck_assert_int_eq(iv_file_news(f), 1);
    ck_assert_int_eq(iv_file_news(f), 0);

    /* Changed stays changed: bytes that are still there are refused too,
     * and a later look that finds the path fine does not undo it. */
    iv_err_clear(&err);
    ck_assert_int_eq(iv_file_read(f, 0, got, 100, "chunk 0", &err), IV_EFILE_CHANGED);
    ck_assert_int_eq(iv_file_mark(f, IV_FILE_OK, "fine"), 0);
    ck_assert_int_eq(iv_file_state(f, NULL, 0), IV_FILE_CHANGED);
    iv_file_close(f);
    unlink(path);
}
END_TEST

START_TEST(write_in_place_is_seen_by_the_read)
{
    uint8_t data[4096] = {0};
    char path[64];
    make_file(path, data, sizeof data);
    iv_file_t *f;
    iv_err_t err = {0};
    ck_assert_int_eq(iv_file_open(path, &f, &err), 0);
    int fd = open(path, O_WRONLY);
    ck_assert_int_eq(pwrite(fd, "x", 1, 10), 1);
    close(fd);
    uint8_t got[16];
    /* The bytes read may be the new ones; the identity check after the
     * read refuses them. */
    ck_assert_int_eq(iv_file_read(f, 0, got, 16, "chunk 0", &err), IV_EFILE_CHANGED);
    ck_assert_msg(strstr(err.msg, "written in place"), "%s", err.msg);
    iv_file_close(f);
    unlink(path);
}
END_TEST

/* A stream of NC unfiltered chunks of CL bytes read from a file. */
#define CL 4096
#define NC 4

static iv_stream_t *file_stream(const char *path)
{
    iv_stream_desc_t d;
    memset(&d, 0, sizeof d);
    iv_err_t err = {0};
    ck_assert_int_eq(iv_file_open(path, &d.file, &err), 0);
    d.length = NC * CL;
    d.chunked = 1;
    d.chunk_len = CL;
    d.n_chunks = NC;
    d.max_stored = CL;
    d.chunk_addr = malloc(NC * sizeof *d.chunk_addr);
    d.chunk_size = malloc(NC * sizeof *d.chunk_size);
    d.chunk_mask = calloc(NC, sizeof *d.chunk_mask);
    d.chunk_sum = calloc(NC, sizeof *d.chunk_sum);
    /* Stored in reverse order in the file, as HDF5 may place them. */
    for (int c = 0; c < NC; c++) {
        d.chunk_addr[c] = (uint64_t)(NC - 1 - c) * CL;
        d.chunk_size[c] = CL;
    }
    d.label = "test:/X/packed_indices";
    iv_stream_t *s;
    /* No cache: every acquire reads the file. */
    ck_assert_int_eq(iv_stream_create(&d, 0, &s, &err), 0);
    return s;
}

static int acquire(iv_stream_t *s, uint64_t c, const uint8_t *want, iv_err_t *err)
{
    const uint8_t *p;
    size_t len;
    int rc = iv_stream_acquire(s, c, &p, &len, NULL, err);
    if (rc < 0) return rc;
    ck_assert_uint_eq(len, CL);
    if (want) ck_assert_int_eq(memcmp(p, want, CL), 0);
    iv_stream_release(s, c);
    return 0;
}

START_TEST(changed_chunk_fails_its_check)
{
    static uint8_t data[NC * CL];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rnd();
    char path[64];
    make_file(path, data, sizeof data);
    iv_stream_t *s = file_stream(path);
    iv_err_t err = {0};
    /* The row-index pass: every chunk read once, its checksum taken. */
    for (uint64_t c = 0; c < NC; c++)
        ck_assert_int_eq(acquire(s, c, data + (NC - 1 - c) * CL, &err), 0);
    ck_assert_int_eq(iv_stream_seal(s, &err), 0);
    ck_assert_int_eq(acquire(s, 2, data + 1 * CL, &err), 0);

    /* Chunk 2 (file offset CL) gets other bytes; size and time stay. */
    uint8_t junk[16];
    memset(junk, 0x5a, sizeof junk);
    write_keep_mtime(path, CL + 100, junk, sizeof junk);
    /* A chunk whose bytes did not change still reads (and is right). */
    ck_assert_int_eq(acquire(s, 0, data + 3 * CL, &err), 0);
    ck_assert_int_eq(acquire(s, 2, NULL, &err), IV_EFILE_CHANGED);
    ck_assert_msg(strstr(err.msg, "chunk 2") && strstr(err.msg, "differ"), "%s", err.msg);
    ck_assert_int_eq(iv_file_state(iv_stream_file(s), NULL, 0), IV_FILE_CHANGED);
    /* From then on the file answers nothing: no mix of two files. */
    iv_err_clear(&err);
    ck_assert_int_eq(acquire(s, 0, NULL, &err), IV_EFILE_CHANGED);
    iv_stream_destroy(s);
    unlink(path);
}
END_TEST

START_TEST(seal_takes_the_sums_the_pass_missed)
{
    static uint8_t data[NC * CL];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rnd();
    char path[64];
    make_file(path, data, sizeof data);
    iv_stream_t *s = file_stream(path);
    iv_err_t err = {0};
    /* Chunk 3 (file offset 0) is never read before the seal. */
    for (uint64_t c = 0; c < 3; c++) ck_assert_int_eq(acquire(s, c, NULL, &err), 0);
    ck_assert_int_eq(iv_stream_seal(s, &err), 0);
    uint8_t junk = 0xee;
    write_keep_mtime(path, 7, &junk, 1);
    ck_assert_int_eq(acquire(s, 3, NULL, &err), IV_EFILE_CHANGED);
    iv_stream_destroy(s);
    unlink(path);
}
END_TEST

START_TEST(learning_compares_a_second_read)
{
    /* Before the seal a chunk read twice (two workers racing in the pass)
     * is compared with the first read, not learned again. */
    static uint8_t data[NC * CL];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rnd();
    char path[64];
    make_file(path, data, sizeof data);
    iv_stream_t *s = file_stream(path);
    iv_err_t err = {0};
    ck_assert_int_eq(acquire(s, 1, NULL, &err), 0);
    uint8_t junk = 0x11;
    write_keep_mtime(path, 2 * CL + 5, &junk, 1);
    ck_assert_int_eq(acquire(s, 1, NULL, &err), IV_EFILE_CHANGED);
    iv_stream_destroy(s);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("filecheck");
    TCase *tc = tcase_create("checks");
    tcase_add_test(tc, sum_sees_every_bit);
    tcase_add_test(tc, sum_matches_the_portable_reference);
    tcase_add_test(tc, compare_tells_the_cases);
    tcase_add_test(tc, short_read_is_an_error);
    tcase_add_test(tc, write_in_place_is_seen_by_the_read);
    tcase_add_test(tc, changed_chunk_fails_its_check);
    tcase_add_test(tc, seal_takes_the_sums_the_pass_missed);
    tcase_add_test(tc, learning_compares_a_second_read);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
