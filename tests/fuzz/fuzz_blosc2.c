/*
 * libFuzzer target: Blosc2 frame and chunk decoders on arbitrary bytes.
 * The first byte picks the output capacity (so that both "fits" and
 * "too small" paths run); the rest is fed to both decoders.  Any result
 * is fine as long as nothing reads or writes out of bounds or leaks, and
 * a success never reports more bytes than the capacity.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t cap = (size_t)data[0] * 512 + 64;
    data++;
    size--;
    /* Exact-size copy so that reads past the end are caught. */
    uint8_t *in = malloc(size ? size : 1);
    memcpy(in, data, size);
    uint8_t *out = malloc(cap);
    size_t got = 0;
    iv_err_t e = {0};
    if (iv_blosc2_frame_decode(in, size, out, cap, &got, &e) == 0 && got > cap) abort();
    iv_err_clear(&e);
    if (iv_blosc2_chunk_decode(in, size, out, cap, &got, &e) == 0 && got > cap) abort();
    iv_err_clear(&e);
    if (iv_blosclz_decode(in, size, out, cap, &e) == 0) (void)out[cap - 1];
    free(in);
    free(out);
    return 0;
}
