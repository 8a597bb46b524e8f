/*
 * LZF decoder (HDF5 filter 32000, what h5py and anndata write for
 * compression="lzf").
 *
 * Design: an LZF stream is a sequence of runs, each led by a control
 * byte c.  c < 32 is a literal run of c + 1 bytes copied from the input.
 * Otherwise it is a back-reference: its length field is c >> 5 (7 means
 * that a length byte follows and is added), then a byte completes the
 * 13-bit distance ((c & 0x1f) << 8 | byte) + 1, and length + 2 bytes are
 * copied from that far back in the output.  A reference may overlap the
 * bytes it produces (distance 1 repeats the last byte).  There is no
 * header, no end marker and no checksum: the stream ends with the input,
 * so the only check on the whole is that it produced exactly the size
 * the caller expected.
 *
 * One walker serves both the decoder and the size measure (which passes
 * dst = NULL): they then agree on every stream by construction, and the
 * checks on untrusted bytes (input left, output left, distance within
 * what was written) sit in one place.
 */
#include "codec.h"

#include <string.h>

/*
 * Walks the stream; writes into dst (capacity cap) unless dst is NULL,
 * in which case it only counts.  *out_len is the count produced.
 */
static int lzf_walk(const uint8_t *src, size_t src_len, uint8_t *dst, size_t cap,
                    size_t *out_len, iv_err_t *err)
{
    size_t ip = 0, op = 0;
    *out_len = 0;
    while (ip < src_len) {
        size_t at = ip;
        unsigned c = src[ip++];
        if (c < 32) {
            size_t n = (size_t)c + 1;
            IV_RETURN_IF(n > src_len - ip, err, IV_ECORRUPT,
                         "lzf: literal run of %zu bytes at input byte %zu, only %zu left", n, at,
                         src_len - ip);
            IV_RETURN_IF(n > cap - op, err, IV_ECORRUPT,
                         "lzf: literal run at input byte %zu passes the output size %zu", at,
                         cap);
            if (dst) memcpy(dst + op, src + ip, n);
            ip += n;
            op += n;
            continue;
        }
        size_t len = c >> 5;
        if (len == 7) {
            IV_RETURN_IF(ip >= src_len, err, IV_ECORRUPT,
                         "lzf: back-reference at input byte %zu lacks its length byte", at);
            len += src[ip++];
        }
        IV_RETURN_IF(ip >= src_len, err, IV_ECORRUPT,
                     "lzf: back-reference at input byte %zu lacks its distance byte", at);
        size_t dist = ((size_t)(c & 0x1f) << 8 | src[ip++]) + 1;
        len += 2;
        IV_RETURN_IF(dist > op, err, IV_ECORRUPT,
                     "lzf: back-reference at input byte %zu reaches %zu bytes back, before the "
                     "start of the output (%zu bytes written)", at, dist, op);
        IV_RETURN_IF(len > cap - op, err, IV_ECORRUPT,
                     "lzf: back-reference at input byte %zu passes the output size %zu", at, cap);
        if (dst) {
            uint8_t *d = dst + op;
            const uint8_t *s = d - dist;
            if (dist >= len) {
                memcpy(d, s, len);
            } else {
                /* Overlapping: each byte may be one this copy wrote. */
                for (size_t k = 0; k < len; k++) d[k] = s[k];
            }
        }
        op += len;
    }
    *out_len = op;
    return 0;
}

int iv_lzf_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                  iv_err_t *err)
{
    IV_RETURN_IF(dst == NULL && dst_len > 0, err, IV_EINVALID_ARG, "lzf: no output buffer");
    size_t got = 0;
    /* A NULL dst would only count; an empty output needs no writes. */
    uint8_t none;
    IV_TRY(lzf_walk(src, src_len, dst ? dst : &none, dst_len, &got, err));
    IV_RETURN_IF(got != dst_len, err, IV_ECORRUPT,
                 "lzf: stream of %zu bytes decodes to %zu bytes, expected %zu", src_len, got,
                 dst_len);
    return 0;
}

int iv_lzf_decoded_size(const uint8_t *src, size_t src_len, size_t max_len, size_t *out_len,
                        iv_err_t *err)
{
    return lzf_walk(src, src_len, NULL, max_len, out_len, err);
}
