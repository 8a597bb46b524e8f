/*
 * Small HDF5 helpers shared by the readers (matrix, metadata, embeddings,
 * which run in the reader child process) and the writers (pack, export).
 */
#include "h5util.h"

#include <stdio.h>
#include <stdlib.h>

int iv_h5_dtype_of(hid_t t, iv_dtype_t *out)
{
    H5T_class_t cls = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    if (cls == H5T_INTEGER) {
        int sgn = H5Tget_sign(t) == H5T_SGN_2;
        switch (sz) {
        case 1: *out = sgn ? IV_DT_INT8 : IV_DT_UINT8; return 0;
        case 2: *out = sgn ? IV_DT_INT16 : IV_DT_UINT16; return 0;
        case 4: *out = sgn ? IV_DT_INT32 : IV_DT_UINT32; return 0;
        case 8: *out = sgn ? IV_DT_INT64 : IV_DT_UINT64; return 0;
        }
    } else if (cls == H5T_FLOAT) {
        /* Only IEEE binary32/64 map exactly onto float/double. */
        if (sz == 4 && H5Tget_precision(t) == 32) { *out = IV_DT_FLOAT32; return 0; }
        if (sz == 8 && H5Tget_precision(t) == 64) { *out = IV_DT_FLOAT64; return 0; }
    }
    return -1;
}

hid_t iv_h5_native(iv_dtype_t t)
{
    switch (t) {
    case IV_DT_INT8: return H5T_NATIVE_INT8;
    case IV_DT_INT16: return H5T_NATIVE_INT16;
    case IV_DT_INT32: return H5T_NATIVE_INT32;
    case IV_DT_INT64: return H5T_NATIVE_INT64;
    case IV_DT_UINT8: return H5T_NATIVE_UINT8;
    case IV_DT_UINT16: return H5T_NATIVE_UINT16;
    case IV_DT_UINT32: return H5T_NATIVE_UINT32;
    case IV_DT_UINT64: return H5T_NATIVE_UINT64;
    case IV_DT_FLOAT32: return H5T_NATIVE_FLOAT;
    case IV_DT_FLOAT64: return H5T_NATIVE_DOUBLE;
    default: return -1;
    }
}

int iv_h5_read_str_attr(hid_t obj, const char *name, char *buf, size_t cap)
{
    int rc = -1;
    hid_t a = -1, t = -1, mt = -1, sp = -1;
    buf[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return -1;
    if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0) goto done;
    if ((t = H5Aget_type(a)) < 0 || H5Tget_class(t) != H5T_STRING) goto done;
    if ((sp = H5Aget_space(a)) < 0 || H5Sget_simple_extent_npoints(sp) != 1) goto done;
    if (H5Tis_variable_str(t) > 0) {
        char *s = NULL;
        mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        if (H5Aread(a, mt, &s) < 0) goto done;
        if (s) {
            snprintf(buf, cap, "%s", s);
            H5free_memory(s);
        }
    } else {
        size_t n = H5Tget_size(t);
        char *tmp = calloc(1, n + 1);
        if (!tmp) goto done;
        mt = H5Tcopy(t);
        if (H5Aread(a, mt, tmp) < 0) {
            free(tmp);
            goto done;
        }
        snprintf(buf, cap, "%s", tmp);
        free(tmp);
    }
    rc = 0;
done:
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}
