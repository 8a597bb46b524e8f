/*
 * A file's obs/var metadata kept in the cache folder between runs, so
 * that a restart maps it instead of reading every column through HDF5
 * again (at ten million cells that read is most of a restart).
 *
 * What is kept is the HDF5 reader's answer as iv_meta_load's reader
 * process writes it (meta.c's format, u64 words and 8-byte padded
 * blobs), with a header naming the source file's identity (device,
 * inode, size, modification time), the matrix group whose shape the rows
 * were checked against, the answer's length and its checksum.  A kept
 * answer is taken only when all of these match; the meta then uses its
 * arrays in place, through the same checks as a fresh answer (meta.c
 * take_meta), so a damaged file is refused, never read out of bounds.
 *
 * Format (native byte order; the magic tells another): the header
 * (struct in metafile.c, a multiple of 8 bytes), then the answer.
 *
 * Thread rules: plain functions of their arguments.
 */
#ifndef IV_METAFILE_H
#define IV_METAFILE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "filecheck.h"

typedef struct iv_metafile {
    void *map;                /* the whole file, mapped read-only */
    size_t len;
    const uint8_t *answer;    /* inside map, 8-aligned */
    size_t answer_len;
} iv_metafile_t;

/*
 * Maps the answer kept at path for the source src (as stat gives it now)
 * and matrix group.  1 when mapped (its checksum holds), 0 when there is
 * none or it was made for something else or is damaged (*why says which;
 * nothing mapped), or IV_ENOMEM.
 */
int iv_metafile_open(const char *path, const iv_file_id_t *src, const char *group,
                     iv_metafile_t *mf, const char **why, iv_err_t *err);
void iv_metafile_unmap(iv_metafile_t *mf);

/* Writes the answer for src and group to path (iv_cachedir_write: a
 * temporary name renamed into place).  IV_EIO when it cannot. */
int iv_metafile_save(const char *path, const iv_file_id_t *src, const char *group,
                     const uint8_t *answer, size_t answer_len, iv_err_t *err);

#endif /* IV_METAFILE_H */
