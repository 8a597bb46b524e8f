/* Internals of iv_dataset_t shared by dataset.c and query.c only. */
#ifndef IV_DATASET_IMPL_H
#define IV_DATASET_IMPL_H

#include "dataset.h"
#include "h5matrix.h"
#include "rowindex.h"
#include "stream.h"

struct iv_dataset {
    char path[4096];
    char group[256];
    char where[4400];
    iv_h5matrix_t m;          /* pointers, values, mapping */
    iv_stream_t *stream;
    iv_rowindex_t ri;
    iv_dataset_info_t info;
};

#endif
