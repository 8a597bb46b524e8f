/*
 * libFuzzer target: HDF5 pipeline undo with the filters chosen by the
 * first bytes (up to four of deflate, shuffle, fletcher32, zstd, Blosc2,
 * LZF or an unknown id, each maybe masked out; LZF with or without the
 * chunk size h5py records, true or not), the element size and the
 * expected length from the next ones, and the rest as stored chunk bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int ids[] = {IV_FILTER_DEFLATE, IV_FILTER_SHUFFLE, IV_FILTER_FLETCHER32,
                              IV_FILTER_ZSTD,    IV_FILTER_BLOSC2,  IV_FILTER_LZF,
                              999};
    if (size < 4) return 0;
    iv_pipeline_t p;
    memset(&p, 0, sizeof p);
    p.n = (size_t)(data[0] % 5);
    for (size_t i = 0; i < p.n; i++) {
        p.f[i].id = ids[(data[0] >> 3 ^ (uint8_t)(i * 7)) % 7];
        if (p.f[i].id == IV_FILTER_SHUFFLE && (data[1] & 0x80)) {
            p.f[i].n_cd = 1;
            p.f[i].cd[0] = data[1] & 0x0f;
        }
        if (p.f[i].id == IV_FILTER_LZF && (data[1] & 0x40)) {
            p.f[i].n_cd = 3;
            p.f[i].cd[2] = (unsigned)data[3] * 97 + (data[1] & 0x20 ? 1u : 0u);
        }
    }
    p.elem_size = (size_t)(data[1] & 0x0f) + 1;
    unsigned mask = data[2] & 0x0f;
    size_t expected = (size_t)data[3] * 97;
    data += 4;
    size -= 4;
    uint8_t *in = malloc(size ? size : 1);
    memcpy(in, data, size);
    size_t cap = expected + 4;
    uint8_t *out = malloc(cap), *scratch = malloc(cap);
    size_t got = 0;
    iv_err_t e = {0};
    int rc = iv_pipeline_decode(&p, mask, in, size, out, cap, scratch, cap, expected, &got, &e);
    if (rc == 0 && got != expected) abort();
    char name[64];
    iv_pipeline_describe(&p, name, sizeof name);
    free(in);
    free(out);
    free(scratch);
    return 0;
}
