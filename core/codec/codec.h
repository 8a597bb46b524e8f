/*
 * Chunk decoders: pure functions over bytes.
 *
 * Every decoder takes untrusted input (bytes from a mapped file) and a
 * caller-owned output buffer of known capacity.  It checks every length and
 * offset before use, never reads outside [src, src+src_len) nor writes
 * outside [dst, dst+dst_cap), and reports what went wrong in *err naming
 * the feature or the check.  No decoder allocates more than a bounded
 * scratch buffer (at most the size of its own output) and none keeps state
 * between calls, so any thread may call any decoder at any time.
 *
 * HDF5 filter pipelines are described by iv_filter_t: the filter id as
 * HDF5 stores it and its client data values.  iv_pipeline_decode() undoes
 * the pipeline of one chunk, honouring the chunk's filter mask.
 */
#ifndef IV_CODEC_H
#define IV_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* HDF5 filter ids. */
enum {
    IV_FILTER_DEFLATE = 1,
    IV_FILTER_SHUFFLE = 2,
    IV_FILTER_FLETCHER32 = 3,
    IV_FILTER_LZF = 32000,
    IV_FILTER_ZSTD = 32015,
    IV_FILTER_BLOSC2 = 32026,
};

#define IV_FILTER_MAX_CD 16
#define IV_PIPELINE_MAX 8

typedef struct iv_filter {
    int id;                          /* IV_FILTER_* */
    unsigned flags;                  /* HDF5 filter flags (optional etc.) */
    size_t n_cd;                     /* number of valid cd values */
    unsigned cd[IV_FILTER_MAX_CD];   /* client data values */
} iv_filter_t;

typedef struct iv_pipeline {
    size_t n;                        /* number of filters, applied 0..n-1 when writing */
    size_t elem_size;                /* dataset element size in bytes (shuffle) */
    iv_filter_t f[IV_PIPELINE_MAX];
} iv_pipeline_t;

/*
 * Decodes one zstd frame (or several concatenated frames) into dst.
 * Sets *out_len to the number of bytes written.  Fails with IV_ECORRUPT
 * when the data is not valid zstd or does not fit dst_cap.
 */
int iv_zstd_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                   size_t *out_len, iv_err_t *err);

/* zlib/deflate stream (HDF5 filter 1, zlib header) into dst. */
int iv_deflate_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                      size_t *out_len, iv_err_t *err);

/*
 * Raw LZ4 block (also produced by LZ4HC) into exactly dst_len bytes.
 * Fails unless the block decodes to exactly dst_len bytes.
 */
int iv_lz4_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                  iv_err_t *err);

/*
 * LZF stream (HDF5 filter 32000, as h5py writes each chunk: the bare
 * stream, no header) into exactly dst_len bytes.  Fails with IV_ECORRUPT
 * on a truncated run, a back-reference before the start of the output, or
 * an output that does not end exactly at dst_len.
 */
int iv_lzf_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                  iv_err_t *err);

/*
 * The size an LZF stream decodes to, found by walking it without writing
 * (every check of iv_lzf_decode but the final size); IV_ECORRUPT when it
 * is damaged or decodes to more than max_len bytes.  For chunks whose
 * writer did not record the size.
 */
int iv_lzf_decoded_size(const uint8_t *src, size_t src_len, size_t max_len, size_t *out_len,
                        iv_err_t *err);

/* BloscLZ block into exactly dst_len bytes. */
int iv_blosclz_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                      iv_err_t *err);

/*
 * Byte unshuffle of n bytes with element size ts: src holds ts planes of
 * n/ts bytes each; trailing n % ts bytes are copied unchanged.
 * src and dst must not overlap.  The scalar version is the reference the
 * fast one is tested against.
 */
void iv_unshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts);
void iv_unshuffle_scalar(const uint8_t *src, uint8_t *dst, size_t n, size_t ts);

/*
 * Bit unshuffle (Blosc2 filter 2) of n bytes with element size ts, as
 * c-blosc2 applies it: only the largest multiple of 8 elements is
 * bit-transposed, the remaining bytes are copied unchanged.
 */
int iv_bitunshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t ts, iv_err_t *err);

/*
 * Decodes one Blosc2 contiguous frame (as the HDF5 Blosc2 filter stores a
 * chunk) holding any number of Blosc2 chunks, into dst.  Supports
 * memcpyed and special chunks, split and run-length streams, the lz4,
 * lz4hc, zstd and blosclz codecs, shuffle, bitshuffle and delta; anything
 * else is IV_EUNSUPPORTED with a message naming the feature.
 */
int iv_blosc2_frame_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                           size_t *out_len, iv_err_t *err);

/*
 * Decodes one bare Blosc2 chunk (32-byte header + data) into dst; sets
 * *out_len to its nbytes.  Used by the frame decoder and the tests.
 */
int iv_blosc2_chunk_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                           size_t *out_len, iv_err_t *err);

/*
 * Undoes pipeline p for one stored chunk.  filter_mask bit i set means
 * filter i was skipped for this chunk.  The result (expected_len bytes, the
 * chunk's full uncompressed size) goes to dst (capacity dst_cap >=
 * expected_len); scratch must hold at least scratch_cap bytes >= dst_cap
 * and is used for intermediate stages.  Sets *out_len.  A result whose
 * length differs from expected_len is IV_ECORRUPT.
 */
int iv_pipeline_decode(const iv_pipeline_t *p, unsigned filter_mask, const uint8_t *src,
                       size_t src_len, uint8_t *dst, size_t dst_cap, uint8_t *scratch,
                       size_t scratch_cap, size_t expected_len, size_t *out_len,
                       iv_err_t *err);

/* A short name of the pipeline for humans: "zstd", "blosc2-lz4+shuffle", "deflate+shuffle", "none". */
void iv_pipeline_describe(const iv_pipeline_t *p, char *buf, size_t cap);

/*
 * Registers the zstd (32015), Blosc2 (32026) and LZF (32000) decoders with HDF5 through
 * H5Zregister so that H5Dread reads small compressed datasets.  Idempotent
 * and thread-safe; returns 0 or IV_EINTERNAL.  Declared here, defined in
 * h5filters.c (the only codec file that includes hdf5.h).
 */
int iv_h5filters_register(void);

#endif /* IV_CODEC_H */
