/*
 * TEST-ONLY Blosc2 encoder: writes chunks and contiguous frames in the
 * layout the decoders in core/codec/blosc2.c read, so that the tests can make
 * every feature on demand (memcpyed chunks, split and unsplit streams,
 * zero, run and raw streams, each codec, shuffle, bitshuffle, delta,
 * special chunks and special offsets, several chunks per frame).
 *
 * It is written from the format documents, independently of the decoder
 * (the forward filters are plain loops over the documented layouts), and
 * is not part of the server.  Functions return the number of bytes
 * written, or 0 when the output does not fit or an option is invalid.
 * Stateless; any thread may call them.
 */
#ifndef IV_BLOSC2_ENC_H
#define IV_BLOSC2_ENC_H

#include <stddef.h>
#include <stdint.h>

/* Codes as the HDF5 Blosc2 filter's cd_values name them. */
enum {
    IV_B2E_BLOSCLZ = 0,
    IV_B2E_LZ4 = 1,
    IV_B2E_LZ4HC = 2,
    IV_B2E_ZLIB = 4,
    IV_B2E_ZSTD = 5,
};

typedef struct iv_b2e_opts {
    int compcode;              /* IV_B2E_* */
    size_t typesize;           /* 1..255 */
    size_t blocksize;          /* 0: the whole chunk is one block */
    uint8_t filters[6];        /* Blosc2 filter codes, applied slot 0 to 5 */
    uint8_t filters_meta[6];
    int dont_split;            /* one stream per block */
    int memcpyed;              /* store the chunk memcpyed */
    int raw_streams;           /* store every stream raw (csize == size) */
    int no_runs;               /* never emit zero or run streams */
    uint8_t version;           /* chunk format version; 0 means 5 */
} iv_b2e_opts_t;

/* Worst-case size of a chunk of n bytes. */
size_t iv_b2e_chunk_bound(size_t n, const iv_b2e_opts_t *o);

/* One Blosc2 chunk of src[0..n). */
size_t iv_b2e_chunk(const uint8_t *src, size_t n, const iv_b2e_opts_t *o, uint8_t *dst,
                    size_t cap);

/*
 * A special chunk (kind 1 zeros, 2 NaN, 3 repeated value, 4 uninitialized)
 * of nbytes; value (typesize bytes) is only used for kind 3.
 */
size_t iv_b2e_special_chunk(int kind, size_t nbytes, size_t typesize, const uint8_t *value,
                            uint8_t *dst, size_t cap);

/*
 * A contiguous frame of src[0..n) in chunks of chunksize bytes.  When
 * special is not NULL and special[k] != 0, chunk k is not stored: its
 * offset is the special value special[k] (1 zeros, 2 NaN, 4 uninit).
 */
size_t iv_b2e_frame(const uint8_t *src, size_t n, size_t chunksize, const iv_b2e_opts_t *o,
                    const uint8_t *special, uint8_t *dst, size_t cap);

/* A BloscLZ block (greedy matches; literal_only: no matches at all). */
size_t iv_b2e_blosclz(const uint8_t *src, size_t n, int literal_only, uint8_t *dst, size_t cap);

/* Forward filters over one block, as documented. */
void iv_b2e_shuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts);
void iv_b2e_bitshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts);

#endif /* IV_BLOSC2_ENC_H */
