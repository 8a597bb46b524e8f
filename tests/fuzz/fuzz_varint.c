/*
 * libFuzzer target: the varint kernels on arbitrary bytes.  The first byte
 * picks k, the number of varints a group-sum call is asked for; the rest
 * is the stream.  Every iv_varint_sum3 variant the CPU runs is finished by
 * one-by-one decoding wherever it stops, and must agree with a plain
 * decode of the same stream on the sum of d + 1 and the end position,
 * consume no more than k varints and read nothing past the end (the input
 * is an exact-size copy).  The counting and skipping kernels are checked
 * against their scalar references on the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef uint64_t (*sum3_fn)(const uint8_t *, const uint8_t *, uint64_t, size_t *, uint64_t *);

/* The plain decode of up to k varints: their sum, where it ends and how
 * many there were (fewer than k when the stream ends or a varint is bad). */
static uint64_t plain(const uint8_t *p, const uint8_t *end, uint64_t k, const uint8_t **at,
                      uint64_t *sum)
{
    uint64_t n = 0;
    *sum = 0;
    while (n < k) {
        uint64_t d;
        size_t u = iv_varint_read(p, end, &d);
        if (u == 0) break;
        *sum += d + 1;
        p += u;
        n++;
    }
    *at = p;
    return n;
}

static void check(sum3_fn fn, const uint8_t *buf, const uint8_t *end, uint64_t k)
{
    const uint8_t *want_at;
    uint64_t want_sum, want_n = plain(buf, end, k, &want_at, &want_sum);
    const uint8_t *q = buf;
    uint64_t sum = 0, done = 0;
    while (done < want_n) {
        size_t used = 0;
        uint64_t got = fn(q, end, want_n - done, &used, &sum);
        if (got > want_n - done || used > (size_t)(end - q)) abort();
        q += used;
        done += got;
        if (done == want_n) break;
        uint64_t d;
        size_t u = iv_varint_read(q, end, &d);
        if (u == 0) abort();  /* the plain decode read it */
        sum += d + 1;
        q += u;
        done++;
    }
    if (sum != want_sum || q != want_at) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint64_t k = data[0];
    data++;
    size--;
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    const uint8_t *end = buf + size;
    check(iv_varint_sum3, buf, end, k);
    check(iv_varint_sum3_portable, buf, end, k);
    if (iv_varint_have_ssse3()) check(iv_varint_sum3_ssse3, buf, end, k);
    if (iv_varint_have_avx2()) check(iv_varint_sum3_avx2, buf, end, k);
    if (iv_varint_count_ends(buf, size) != iv_varint_count_ends_scalar(buf, size)) abort();
    uint64_t s1, s2;
    if (iv_varint_skip(buf, size, k, &s1) != iv_varint_skip_scalar(buf, size, k, &s2) || s1 != s2)
        abort();
    free(buf);
    return 0;
}
