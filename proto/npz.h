/*
 * A writer of .npz files (a stored, uncompressed ZIP of .npy arrays), the
 * format scipy.sparse.save_npz writes and load_npz reads.  Arrays may be
 * given in pieces so that decoded blocks need not be concatenated.  ZIP64
 * records are written when an entry or offset passes 4 GiB.
 */
#ifndef IV_NPZ_H
#define IV_NPZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct iv_npz iv_npz_t;

/* Starts an archive on f (the caller closes f after iv_npz_finish). */
iv_npz_t *iv_npz_begin(FILE *f);

/*
 * Adds NAME.npy holding an array of numpy type `descr` ("<i4", "|S3") and
 * shape (ndim 0, 1 or 2) whose bytes are the concatenation of n_pieces
 * pieces.  Returns 0, or -1 on a write error.
 */
int iv_npz_add(iv_npz_t *z, const char *name, const char *descr, int ndim, const int64_t *shape,
               size_t n_pieces, const void *const *pieces, const size_t *lens);

/* Writes the central directory and frees z.  0, or -1 on a write error. */
int iv_npz_finish(iv_npz_t *z);

#endif
