/* Element type table (see dtype.h). */
#include "dtype.h"

#include <stdint.h>
#include <string.h>

static const struct {
    const char *name, *descr;
    size_t size;
} dtypes[IV_DT_COUNT] = {
    [IV_DT_INT8] = {"int8", "|i1", 1},       [IV_DT_INT16] = {"int16", "<i2", 2},
    [IV_DT_INT32] = {"int32", "<i4", 4},     [IV_DT_INT64] = {"int64", "<i8", 8},
    [IV_DT_UINT8] = {"uint8", "|u1", 1},     [IV_DT_UINT16] = {"uint16", "<u2", 2},
    [IV_DT_UINT32] = {"uint32", "<u4", 4},   [IV_DT_UINT64] = {"uint64", "<u8", 8},
    [IV_DT_FLOAT32] = {"float32", "<f4", 4}, [IV_DT_FLOAT64] = {"float64", "<f8", 8},
};

size_t iv_dtype_size(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? dtypes[t].size : 0;
}

const char *iv_dtype_name(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? dtypes[t].name : "unknown";
}

const char *iv_dtype_descr(iv_dtype_t t)
{
    return (unsigned)t < IV_DT_COUNT ? dtypes[t].descr : "|V0";
}

int iv_dtype_parse(const char *name, iv_dtype_t *out)
{
    for (int t = 0; t < IV_DT_COUNT; t++) {
        if (strcmp(name, dtypes[t].name) == 0) {
            *out = (iv_dtype_t)t;
            return 0;
        }
    }
    return -1;
}

double iv_dtype_get_f64(iv_dtype_t t, const void *base, size_t i)
{
    const char *p = (const char *)base + i * iv_dtype_size(t);
    switch (t) {
    case IV_DT_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
    case IV_DT_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case IV_DT_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case IV_DT_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case IV_DT_UINT8: { uint8_t v; memcpy(&v, p, 1); return v; }
    case IV_DT_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case IV_DT_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case IV_DT_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case IV_DT_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    case IV_DT_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
    default: return 0;
    }
}
