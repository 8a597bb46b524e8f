/* Two datasets of one matrix answering queries alike, block for block and
 * byte for byte: the tests of a copy read in a matrix's place (plainfile,
 * widefile) against the matrix read as it is. */
#ifndef IV_TEST_SAME_ANSWERS_H
#define IV_TEST_SAME_ANSWERS_H

#include <stdint.h>

#include "dataset.h"
#include "error.h"
#include "query.h"

/* The query's blocks (of about 500 entries), decoded on the calling
 * thread; 0 or the first error code.  *out is the caller's
 * (iv_test_free_blocks), also on failure. */
int iv_test_run_query(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var, iv_out_axis_t axis,
                      iv_block_t **out, int64_t *n_out, iv_err_t *err);
void iv_test_free_blocks(iv_block_t *b, int64_t n);

/* ref and ds answer obs x var alike (failing the test when not). */
void iv_test_same_answer(iv_dataset_t *ref, iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                         iv_out_axis_t axis);

/* `rounds` random selections answered alike: cells in any order with
 * duplicates; genes all, ascending and distinct, or in any order with
 * duplicates, in turn; both output axes; then the whole matrix. */
void iv_test_same_answers(iv_dataset_t *ref, iv_dataset_t *ds, int rounds);

#endif
