/*
 * The integer arrays of a request body's "obs": {"index": [...]} and
 * "var": {"index": [...]}, read ahead of cJSON.
 *
 * cJSON makes a node of every array element (an allocation, and a
 * strtod that asks the C library for the locale's decimal point): a
 * 10,000-index body cost about 1.5 ms, and on 16 cores the parse and its
 * allocations were a tenth of a 10,000-cell query's CPU.  These arrays
 * are read here instead, straight into int64s, and blanked (their
 * insides overwritten by spaces) in a copy of the body that cJSON then
 * reads: it sees an empty array where each was, and the selection takes
 * the integers from here.  Everything else, errors included, is cJSON's
 * as before.
 *
 * Only what is unambiguous is taken: the first "index" key of the root
 * object's first "obs" or "var" object, holding an array of nothing but
 * integers written as -?(0|[1-9][0-9]*) with at most 15 digits (exact in
 * a double, as cJSON reads them).  The scan must also get through the
 * whole root object to its closing brace, with every key of the root and
 * of those two objects written without escapes and nothing but JSON's
 * four white-space bytes between tokens (what follows the root is not
 * looked at).  Any other array, and any body the scan does not get
 * through, is left whole to cJSON.  The body is copied only when an
 * array was taken.
 */
#ifndef IV_INDEX_ARRAYS_H
#define IV_INDEX_ARRAYS_H

#include <stddef.h>
#include <stdint.h>

typedef struct iv_index_array {
    int taken;      /* 1: read here; the body's copy holds [ ] in its place */
    int64_t n;
    int64_t *v;     /* owned (malloc), at least one slot; NULL once handed on */
} iv_index_array_t;

/*
 * Reads the arrays into pre[0] (obs) and pre[1] (var).  Returns a malloc'd
 * copy of body's len bytes with the taken arrays blanked, or NULL when
 * none was taken (or memory ran out): cJSON then reads body itself, and
 * pre is left untaken.
 */
char *iv_index_arrays_take(const char *body, size_t len, iv_index_array_t pre[2]);
void iv_index_arrays_free(iv_index_array_t pre[2]);

/* Tests: 0 turns the reading off (every array goes to cJSON), 1 on. */
void iv_index_arrays_enable(int on);

#endif
