/* Element types of the files' arrays and of query results. */
#ifndef IV_DTYPE_H
#define IV_DTYPE_H

#include <stddef.h>

typedef enum iv_dtype {
    IV_DT_INT8, IV_DT_INT16, IV_DT_INT32, IV_DT_INT64,
    IV_DT_UINT8, IV_DT_UINT16, IV_DT_UINT32, IV_DT_UINT64,
    IV_DT_FLOAT32, IV_DT_FLOAT64,
    IV_DT_COUNT
} iv_dtype_t;

size_t iv_dtype_size(iv_dtype_t t);
/* numpy dtype name: "int32", "float64", ... */
const char *iv_dtype_name(iv_dtype_t t);
/* numpy array-protocol string, little-endian: "<i4", "<f8", "|u1", ... */
const char *iv_dtype_descr(iv_dtype_t t);
/* Parses a numpy dtype name ("int16"); 0 or -1 when unknown. */
int iv_dtype_parse(const char *name, iv_dtype_t *out);
/* Value i of an array of type t, as double (for sums and metadata). */
double iv_dtype_get_f64(iv_dtype_t t, const void *base, size_t i);

#endif
