/*
 * BloscLZ block decoder.
 *
 * Design: BloscLZ is a FastLZ-style LZ77 format.  Each instruction starts
 * with a control byte; the first one is always a literal run and only its
 * low five bits count.  A control byte below 32 is a literal run of
 * ctrl+1 bytes.  Otherwise the top three bits c give the match length
 * (c + 2 for c < 7; for c == 7, 9 plus extension bytes summed until one
 * is not 255), and the low five bits with the next byte give the distance
 * minus one (up to 8190); the escape low bits 31 with byte 255 is
 * followed by a 16-bit big-endian distance counted from 8192.  Matches may
 * overlap their own output (distance < length), so they are copied byte
 * by byte when close, with 8-byte moves when the distance allows.
 *
 * The reference decoder trusts its input; this one checks every read of
 * the input, every match distance and every write against its bounds,
 * and succeeds only when the block decodes to exactly dst_len bytes.
 */
#include "codec.h"

#include <string.h>

enum { BLOSCLZ_MAX_DISTANCE = 8191 };

static void copy_match(uint8_t *op, const uint8_t *ref, size_t len, size_t dist)
{
    if (dist >= 8) {
        /* Non-overlapping in 8-byte steps: each move reads bytes that were
         * already final before it started. */
        while (len >= 8) {
            uint64_t w;
            memcpy(&w, ref, 8);
            memcpy(op, &w, 8);
            op += 8;
            ref += 8;
            len -= 8;
        }
    } else if (dist == 1) {
        memset(op, ref[0], len);
        return;
    }
    while (len--) *op++ = *ref++;
}

int iv_blosclz_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                      iv_err_t *err)
{
    IV_RETURN_IF(src_len == 0, err, IV_ECORRUPT, "blosclz: empty block");
    const uint8_t *ip = src;
    const uint8_t *ip_end = src + src_len;
    size_t op = 0;
    unsigned ctrl = *ip++ & 31u;

    for (;;) {
        if (ctrl < 32) {
            size_t run = (size_t)ctrl + 1;
            IV_RETURN_IF(run > (size_t)(ip_end - ip), err, IV_ECORRUPT,
                         "blosclz: literal run past the end of the input");
            IV_RETURN_IF(run > dst_len - op, err, IV_ECORRUPT,
                         "blosclz: literal run past the end of the output");
            memcpy(dst + op, ip, run);
            ip += run;
            op += run;
        } else {
            size_t len = (ctrl >> 5) - 1;
            size_t ofs = (size_t)(ctrl & 31u) << 8;
            if (len == 6) {
                uint8_t code;
                do {
                    IV_RETURN_IF(ip >= ip_end, err, IV_ECORRUPT,
                                 "blosclz: match length past the end of the input");
                    code = *ip++;
                    len += code;
                } while (code == 255);
            }
            IV_RETURN_IF(ip >= ip_end, err, IV_ECORRUPT,
                         "blosclz: match distance past the end of the input");
            uint8_t code = *ip++;
            size_t dist;
            if (code == 255 && ofs == (31u << 8)) {
                IV_RETURN_IF(ip_end - ip < 2, err, IV_ECORRUPT,
                             "blosclz: far distance past the end of the input");
                dist = ((size_t)ip[0] << 8 | ip[1]) + BLOSCLZ_MAX_DISTANCE + 1;
                ip += 2;
            } else {
                dist = ofs + code + 1;
            }
            len += 3;
            IV_RETURN_IF(dist > op, err, IV_ECORRUPT,
                         "blosclz: match distance %zu before the start of the block", dist);
            IV_RETURN_IF(len > dst_len - op, err, IV_ECORRUPT,
                         "blosclz: match past the end of the output");
            copy_match(dst + op, dst + op - dist, len, dist);
            op += len;
        }
        if (ip >= ip_end) break;
        ctrl = *ip++;
    }
    IV_RETURN_IF(op != dst_len, err, IV_ECORRUPT,
                 "blosclz: block decodes to %zu bytes, expected %zu", op, dst_len);
    return 0;
}
