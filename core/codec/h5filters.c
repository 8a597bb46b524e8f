/*
 * HDF5 filter registration for the Zstandard (32015), Blosc2 (32026) and
 * LZF (32000) decoders.
 *
 * Design: bulk reads take raw chunk bytes and decode them in the worker
 * pool, but small datasets (pointers, metadata columns) are simplest to
 * read with plain H5Dread, which needs the filters registered in-process
 * (Debian ships no plugin for either).  Blosc2 decodes only.  zstd also
 * encodes, as the HDF5 plugin does (one frame with its content size per
 * chunk, level cd_values[0]): HDF5 refuses to create a dataset whose
 * filter cannot encode, and `ivserve pack` creates zstd datasets (it
 * writes their chunks itself, compressed on its worker pool).  LZF
 * decodes only, but declares an encoder that always declines: HDF5's
 * H5Ocopy of a variable-length string dataset decodes each chunk, moves
 * its strings to the new file's heap and encodes the chunk again, and a
 * filter that declines is skipped for that chunk (h5py adds LZF as an
 * optional filter, and stores a chunk LZF does not shrink the same way),
 * so `pack` and `export` copy such columns with their chunks stored raw.
 *
 * The classes have no name (NULL).  A pipeline message stores a filter's
 * name only when its writer had the filter registered; HDF5 1.10.8 fills
 * in the registered class's name when it encodes a message, and H5Ocopy
 * of a variable-length dataset re-encodes the copy's pipeline message
 * into the space the stored one took.  A stored message without a name
 * (h5py's allow_unknown_filter writes them) then overflowed into the
 * rest of the object header, and `pack` wrote a file whose string column
 * could not be opened.  Without class names the two sizes agree.
 *
 * HDF5 hands the filter a buffer it owns and expects a replacement
 * allocated with the library's allocator: the new buffer comes from
 * H5allocate_memory and the old one goes back through H5free_memory, as
 * the HDF5 filter documentation asks of filters built outside the library.
 * Registration runs once per process under pthread_once.
 */
#include "codec.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <hdf5.h>
#include <zstd.h>

/* Largest chunk HDF5 can store (its chunk sizes are 32-bit). */
#define H5F_MAX_CHUNK ((size_t)UINT32_MAX)

/* Replaces *buf by out (of out_len bytes valid, out_cap allocated). */
static size_t hand_back(void **buf, size_t *buf_size, void *out, size_t out_cap, size_t out_len)
{
    H5free_memory(*buf);
    *buf = out;
    *buf_size = out_cap;
    return out_len;
}

static size_t zstd_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                          size_t nbytes, size_t *buf_size, void **buf)
{
    if (!(flags & H5Z_FLAG_REVERSE)) {
        int level = cd_nelmts > 0 ? (int)cd_values[0] : 1;
        size_t cap = ZSTD_compressBound(nbytes);
        void *out = H5allocate_memory(cap, 0);
        if (!out) return 0;
        size_t n = ZSTD_compress(out, cap, *buf, nbytes, level);
        if (ZSTD_isError(n)) {
            H5free_memory(out);
            return 0;
        }
        return hand_back(buf, buf_size, out, cap, n);
    }
    unsigned long long fcs = ZSTD_getFrameContentSize(*buf, nbytes);
    if (fcs == ZSTD_CONTENTSIZE_ERROR) return 0;
    size_t cap;
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) {
        /* The HDF5 plugin always records the size; other writers may not.
         * Try growing capacities until the frame fits. */
        cap = nbytes * 4 > 65536 ? nbytes * 4 : 65536;
    } else {
        if (fcs > H5F_MAX_CHUNK) return 0;
        cap = fcs ? (size_t)fcs : 1;
    }
    for (;;) {
        void *out = H5allocate_memory(cap, 0);
        if (!out) return 0;
        size_t got = 0;
        iv_err_t e = {0};
        int rc = iv_zstd_decode(*buf, nbytes, out, cap, &got, &e);
        if (rc == 0) return hand_back(buf, buf_size, out, cap, got);
        H5free_memory(out);
        if (fcs != ZSTD_CONTENTSIZE_UNKNOWN || cap >= H5F_MAX_CHUNK / 2) return 0;
        cap *= 2;
    }
}

static size_t blosc2_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                            size_t nbytes, size_t *buf_size, void **buf)
{
    (void)cd_nelmts;
    (void)cd_values;
    if (!(flags & H5Z_FLAG_REVERSE)) return 0; /* decode only */
    const uint8_t *src = *buf;
    if (nbytes < 38) return 0;
    /* The frame's nbytes (int64 big-endian at 30) sizes the output; the
     * decoder checks it against everything else. */
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n = n << 8 | src[30 + i];
    if (n > H5F_MAX_CHUNK) return 0;
    size_t cap = n ? (size_t)n : 1;
    void *out = H5allocate_memory(cap, 0);
    if (!out) return 0;
    size_t got = 0;
    iv_err_t e = {0};
    if (iv_blosc2_frame_decode(src, nbytes, out, cap, &got, &e) < 0 || got != n) {
        H5free_memory(out);
        return 0;
    }
    return hand_back(buf, buf_size, out, cap, got);
}

static size_t lzf_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                         size_t nbytes, size_t *buf_size, void **buf)
{
    if (!(flags & H5Z_FLAG_REVERSE)) return 0; /* declines: see the top of the file */
    size_t n = 0;
    iv_err_t e = {0};
    /* The stream is measured before anything is allocated by it, so a
     * few damaged bytes cannot ask for gigabytes.  h5py records the
     * chunk's byte size in cd_values[2] (it leaves it out for
     * variable-length strings): when given, the stream must match it. */
    if (iv_lzf_decoded_size(*buf, nbytes, H5F_MAX_CHUNK, &n, &e) < 0) return 0;
    if (cd_nelmts >= 3 && cd_values[2] > 0 && n != cd_values[2]) return 0;
    void *out = H5allocate_memory(n ? n : 1, 0);
    if (!out) return 0;
    if (iv_lzf_decode(*buf, nbytes, out, n, &e) < 0) {
        H5free_memory(out);
        return 0;
    }
    return hand_back(buf, buf_size, out, n ? n : 1, n);
}

static const H5Z_class2_t zstd_class = {
    H5Z_CLASS_T_VERS, (H5Z_filter_t)IV_FILTER_ZSTD, 1, 1, NULL,
    NULL, NULL, zstd_filter,
};

static const H5Z_class2_t blosc2_class = {
    H5Z_CLASS_T_VERS, (H5Z_filter_t)IV_FILTER_BLOSC2, 0, 1, NULL,
    NULL, NULL, blosc2_filter,
};

static const H5Z_class2_t lzf_class = {
    H5Z_CLASS_T_VERS, (H5Z_filter_t)IV_FILTER_LZF, 1, 1, NULL,
    NULL, NULL, lzf_filter,
};

static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int reg_rc;

static void do_register(void)
{
    if (H5Zregister(&zstd_class) < 0 || H5Zregister(&blosc2_class) < 0 ||
        H5Zregister(&lzf_class) < 0)
        reg_rc = IV_EINTERNAL;
}

int iv_h5filters_register(void)
{
    pthread_once(&reg_once, do_register);
    return reg_rc;
}
