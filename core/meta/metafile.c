/*
 * The metadata kept between runs (see metafile.h).
 */
#include "metafile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedir.h"

static const char MAGIC[8] = {'I', 'V', 'M', 'E', 'T', 'A', 0, 1};
#define VERSION 1u

/* 328 bytes, a multiple of 8: the answer after it is 8-aligned. */
struct head {
    char magic[8];
    uint32_t version, reserved;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
    uint64_t answer_len, answer_sum;
    char group[256];
};

_Static_assert(sizeof(struct head) % 8 == 0, "the answer after the header must be 8-aligned");

static void head_fill(struct head *h, const iv_file_id_t *src, const char *group)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, MAGIC, sizeof MAGIC);
    h->version = VERSION;
    h->dev = src->dev;
    h->ino = src->ino;
    h->size = src->size;
    h->mtime_s = src->mtime_s;
    h->mtime_ns = src->mtime_ns;
    snprintf(h->group, sizeof h->group, "%s", group && *group ? group : "X");
}

/* The kept header against the one wanted and the file's length: 1, or 0
 * with *why set. */
static int head_check(const struct head *h, const struct head *want, size_t file_len,
                      const char **why)
{
    if (memcmp(h->magic, MAGIC, sizeof MAGIC) != 0 || h->version != VERSION || h->reserved != 0) {
        *why = "another format";
        return 0;
    }
    if (h->dev != want->dev || h->ino != want->ino || h->size != want->size ||
        h->mtime_s != want->mtime_s || h->mtime_ns != want->mtime_ns ||
        memcmp(h->group, want->group, sizeof h->group) != 0) {
        *why = "made for another file or matrix";
        return 0;
    }
    if (h->answer_len != file_len - sizeof *h) {
        *why = "truncated";
        return 0;
    }
    return 1;
}

int iv_metafile_open(const char *path, const iv_file_id_t *src, const char *group,
                     iv_metafile_t *mf, const char **why, iv_err_t *err)
{
    const char *dummy;
    if (!why) why = &dummy;
    memset(mf, 0, sizeof *mf);
    *why = "none kept";
    void *map;
    size_t len;
    int got = iv_cachedir_map(path, sizeof(struct head), &map, &len, why, err);
    if (got <= 0) return got;
    struct head h, want;
    memcpy(&h, map, sizeof h);
    head_fill(&want, src, group);
    const uint8_t *answer = (const uint8_t *)map + sizeof h;
    int ok = head_check(&h, &want, len, why);
    if (ok) {
        /* The checksum reads every page; the take that follows reads them
         * again, from the page cache. */
        madvise(map, len, MADV_WILLNEED);
        ok = iv_file_sum(answer, (size_t)h.answer_len) == h.answer_sum;
        if (!ok) *why = "damaged (checksum)";
    }
    if (!ok) {
        munmap(map, len);
        return 0;
    }
    mf->map = map;
    mf->len = len;
    mf->answer = answer;
    mf->answer_len = (size_t)h.answer_len;
    *why = "mapped";
    return 1;
}

void iv_metafile_unmap(iv_metafile_t *mf)
{
    if (mf->map) munmap(mf->map, mf->len);
    memset(mf, 0, sizeof *mf);
}

int iv_metafile_save(const char *path, const iv_file_id_t *src, const char *group,
                     const uint8_t *answer, size_t answer_len, iv_err_t *err)
{
    struct head h;
    head_fill(&h, src, group);
    h.answer_len = answer_len;
    h.answer_sum = iv_file_sum(answer, answer_len);
    iv_cachedir_part_t parts[] = {{&h, sizeof h}, {answer, answer_len}};
    return iv_cachedir_write(path, parts, 2, err);
}
