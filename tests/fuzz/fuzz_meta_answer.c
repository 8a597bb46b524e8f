/*
 * libFuzzer target for the metadata answer of the reader process (the
 * bytes a forked HDF5 reader hands to the server, see core/meta/meta.c): any
 * bytes must build a meta or fail cleanly, and a meta built must be safe
 * to read in full (every string of every column, every category) and to
 * look names up in.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iv_err_t e = {0};
    iv_meta_t *m = NULL;
    if (iv_meta_from_bytes("fuzz.h5ad", data, size, &m, &e) < 0) {
        if (m) abort();
        return 0;
    }
    volatile size_t sink = 0;
    for (int a = 0; a < 2; a++) {
        iv_axis_t axis = a ? IV_AXIS_VAR : IV_AXIS_OBS;
        for (size_t k = 0; k <= iv_meta_n_cols(m, axis); k++) {
            const iv_meta_col_t *c = k < iv_meta_n_cols(m, axis) ? iv_meta_col(m, axis, k)
                                                                 : iv_meta_index(m, axis);
            for (int64_t i = 0; i < c->n; i++) {
                if (c->mask) sink += c->mask[i];
                if (c->type == IV_COL_STRING) sink += strlen(iv_meta_col_str(c, i));
                if (c->type == IV_COL_CATEGORICAL && c->codes[i] >= 0)
                    sink += strlen(iv_meta_col_cat(c, c->codes[i]));
            }
            for (int64_t j = 0; c->type == IV_COL_CATEGORICAL && j < c->n_cats; j++)
                sink += strlen(iv_meta_col_cat(c, j)) + (size_t)c->cat_counts[j];
        }
        const iv_meta_col_t *ix = iv_meta_index(m, axis);
        if (ix->n > 0 && !(ix->mask && ix->mask[ix->n - 1])) {
            const char *q[1] = {iv_meta_col_str(ix, ix->n - 1)};
            int64_t row = -1;
            iv_meta_find_names(m, axis, NULL, q, 1, 1, &row, NULL, &e);
            if (row < 0 || row >= ix->n) abort();
        }
    }
    (void)sink;
    iv_meta_free(m);
    return 0;
}
