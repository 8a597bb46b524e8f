/*
 * A run of fixed-width (uint16) minor indices tested against a selection
 * bitmap: the kernel of the wide copy (widefile.h).
 *
 * Why.  A cell query of a few thousand genes reads every stored entry of
 * its cells to keep the few selected.  Through the packed stream each
 * index is a delta varint: a prefix sum before the test.  Stored as the
 * index itself in two bytes, sixteen entries are a load, a gather of
 * their bitmap words and a test, each block independent of the last.
 *
 * Thread rules: plain functions of their arguments.
 */
#ifndef IV_WIDEPICK_H
#define IV_WIDEPICK_H

#include <stddef.h>
#include <stdint.h>

/* The most entries one call takes: out holds n + 16 (a vector store
 * writes whole blocks). */
enum { IV_WIDE_PICK_MAX = 512 };

/* Of the n (<= IV_WIDE_PICK_MAX) indices at p (native byte order, any
 * alignment), the ones whose bit is set in bits (bits has a bit for
 * every index below limit), in order, into out.  Returns how many, or
 * -1 when an index is >= limit (out then holds nothing to trust).  The
 * portable loop; iv_wide_pick_avx512 is the same sixteen at a time, for
 * where iv_varint_have_avx512() (varint.h). */
int64_t iv_wide_pick(const uint8_t *p, size_t n, uint32_t limit, const uint64_t *bits, uint32_t *out);
int64_t iv_wide_pick_avx512(const uint8_t *p, size_t n, uint32_t limit, const uint64_t *bits,
                            uint32_t *out);

#endif
