/*
 * Library codecs (zstd, deflate, lz4), HDF5 pipeline undo, and the
 * per-thread decoder state.
 *
 * Design: decoders are pure functions over caller-owned buffers; the only
 * state is per thread (a zstd context and a scratch buffer, see
 * codec_tls.h), so the worker pool can decode chunks in parallel without
 * locks and without a malloc per chunk.  The pipeline undo walks the HDF5
 * filters in reverse, ping-ponging between the caller's dst and scratch so
 * that the last stage lands in dst without a final copy; checksum
 * stripping (fletcher32) only shortens the current view.
 */
#include "codec.h"
#include "codec_tls.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zlib.h>

/* ---- per-thread state ---------------------------------------------------- */

typedef struct codec_tls {
    ZSTD_DCtx *dctx;
    uint8_t *buf;
    size_t cap;
} codec_tls_t;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_key_ok;

static void tls_free(void *p)
{
    codec_tls_t *t = p;
    if (!t) return;
    ZSTD_freeDCtx(t->dctx);
    free(t->buf);
    free(t);
}

static void tls_init_key(void)
{
    tls_key_ok = pthread_key_create(&tls_key, tls_free) == 0;
}

static codec_tls_t *tls_get(void)
{
    pthread_once(&tls_once, tls_init_key);
    if (!tls_key_ok) return NULL;
    codec_tls_t *t = pthread_getspecific(tls_key);
    if (t) return t;
    t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (pthread_setspecific(tls_key, t) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

ZSTD_DCtx *iv_codec_zstd_dctx(void)
{
    codec_tls_t *t = tls_get();
    if (!t) return NULL;
    if (!t->dctx) t->dctx = ZSTD_createDCtx();
    return t->dctx;
}

uint8_t *iv_codec_scratch(size_t cap)
{
    codec_tls_t *t = tls_get();
    if (!t) return NULL;
    if (t->cap < cap) {
        /* Grow geometrically so that a mix of chunk sizes settles fast. */
        size_t want = cap < 65536 ? 65536 : cap;
        if (t->cap && want < t->cap * 2 && t->cap <= SIZE_MAX / 2) want = t->cap * 2;
        uint8_t *nb = malloc(want);
        if (!nb) return NULL;
        free(t->buf);
        t->buf = nb;
        t->cap = want;
    }
    return t->buf;
}

void iv_codec_thread_release(void)
{
    pthread_once(&tls_once, tls_init_key);
    if (!tls_key_ok) return;
    codec_tls_t *t = pthread_getspecific(tls_key);
    if (t) {
        pthread_setspecific(tls_key, NULL);
        tls_free(t);
    }
}

/* ---- library codecs ------------------------------------------------------ */

int iv_zstd_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                   size_t *out_len, iv_err_t *err)
{
    *out_len = 0;
    ZSTD_DCtx *dctx = iv_codec_zstd_dctx();
    if (!dctx) return iv_fail(err, IV_ENOMEM, "zstd: cannot create a decompression context");
    unsigned long long fcs = ZSTD_getFrameContentSize(src, src_len);
    IV_RETURN_IF(fcs == ZSTD_CONTENTSIZE_ERROR, err, IV_ECORRUPT, "zstd: not a zstd frame");
    if (fcs != ZSTD_CONTENTSIZE_UNKNOWN) {
        IV_RETURN_IF(fcs > dst_cap, err, IV_ECORRUPT,
                     "zstd: content size %llu exceeds capacity %zu", fcs, dst_cap);
        size_t r = ZSTD_decompressDCtx(dctx, dst, dst_cap, src, src_len);
        IV_RETURN_IF(ZSTD_isError(r), err, IV_ECORRUPT, "zstd: %s", ZSTD_getErrorName(r));
        *out_len = r;
        return 0;
    }
    /* No content size in the header: stream into dst until the input ends.
     * Every round must make progress; a round that makes none means the
     * output is full (too large) or the input ran out (truncated). */
    ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {src, src_len, 0};
    ZSTD_outBuffer out = {dst, dst_cap, 0};
    for (;;) {
        size_t in0 = in.pos, out0 = out.pos;
        size_t r = ZSTD_decompressStream(dctx, &out, &in);
        if (ZSTD_isError(r)) {
            ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
            return IV_FAIL(err, IV_ECORRUPT, "zstd: %s", ZSTD_getErrorName(r));
        }
        if (r == 0 && in.pos == in.size) break;
        if (in.pos == in0 && out.pos == out0) {
            ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
            if (out.pos == out.size)
                return IV_FAIL(err, IV_ECORRUPT, "zstd: output exceeds capacity %zu", dst_cap);
            return IV_FAIL(err, IV_ECORRUPT, "zstd: truncated frame");
        }
    }
    *out_len = out.pos;
    return 0;
}

int iv_deflate_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_cap,
                      size_t *out_len, iv_err_t *err)
{
    *out_len = 0;
    IV_RETURN_IF(src_len > UINT_MAX || dst_cap > UINT_MAX, err, IV_EUNSUPPORTED,
                 "deflate: buffer larger than 4 GiB");
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit(&zs) != Z_OK) return iv_fail(err, IV_ENOMEM, "deflate: inflateInit failed");
    zs.next_in = (Bytef *)src;
    zs.avail_in = (uInt)src_len;
    zs.next_out = dst;
    zs.avail_out = (uInt)dst_cap;
    int rc = inflate(&zs, Z_FINISH);
    size_t produced = dst_cap - zs.avail_out;
    const char *msg = zs.msg;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        if (rc == Z_BUF_ERROR && zs.avail_out == 0)
            return IV_FAIL(err, IV_ECORRUPT, "deflate: output exceeds capacity %zu", dst_cap);
        return IV_FAIL(err, IV_ECORRUPT, "deflate: %s", msg ? msg : "truncated or invalid stream");
    }
    *out_len = produced;
    return 0;
}

int iv_lz4_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                  iv_err_t *err)
{
    IV_RETURN_IF(src_len > INT_MAX || dst_len > INT_MAX, err, IV_EUNSUPPORTED,
                 "lz4: block larger than 2 GiB");
    int r = LZ4_decompress_safe((const char *)src, (char *)dst, (int)src_len, (int)dst_len);
    IV_RETURN_IF(r < 0, err, IV_ECORRUPT, "lz4: invalid block");
    IV_RETURN_IF((size_t)r != dst_len, err, IV_ECORRUPT,
                 "lz4: block decodes to %d bytes, expected %zu", r, dst_len);
    return 0;
}

/* ---- HDF5 fletcher32 ------------------------------------------------------ */

/*
 * HDF5's Fletcher-32: 16-bit words read big-endian (first byte high), sums
 * folded every 360 words, a trailing odd byte taken as a word with a zero
 * low byte.  The filter appends the sum little-endian; files written on
 * big-endian hosts by old versions hold it byte-swapped, which HDF5 also
 * accepts, so this does too.
 */
static uint32_t fletcher32(const uint8_t *data, size_t len)
{
    uint32_t sum1 = 0, sum2 = 0;
    size_t words = len / 2;
    while (words) {
        size_t t = words > 360 ? 360 : words;
        words -= t;
        do {
            sum1 += ((uint32_t)data[0] << 8) | data[1];
            data += 2;
            sum2 += sum1;
        } while (--t);
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    if (len % 2) {
        sum1 += (uint32_t)data[0] << 8;
        sum2 += sum1;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    return (sum2 << 16) | sum1;
}

static int fletcher32_check(const uint8_t *p, size_t *len, iv_err_t *err)
{
    IV_RETURN_IF(*len < 4, err, IV_ECORRUPT, "fletcher32: chunk of %zu bytes has no checksum",
                 *len);
    size_t n = *len - 4;
    uint32_t stored = (uint32_t)p[n] | (uint32_t)p[n + 1] << 8 | (uint32_t)p[n + 2] << 16 |
                      (uint32_t)p[n + 3] << 24;
    uint32_t sum = fletcher32(p, n);
    uint32_t swapped = (sum >> 24) | ((sum >> 8) & 0xff00) | ((sum << 8) & 0xff0000) | (sum << 24);
    IV_RETURN_IF(stored != sum && stored != swapped, err, IV_ECORRUPT,
                 "fletcher32: checksum mismatch (stored %08x, computed %08x)", stored, sum);
    *len = n;
    return 0;
}

/* ---- pipeline -------------------------------------------------------------- */

static int filter_active(size_t i, unsigned mask)
{
    return !(i < sizeof(unsigned) * CHAR_BIT && (mask >> i) & 1u);
}

/* Whether filter id copies into a new buffer (rather than trimming in place). */
static int filter_copies(int id)
{
    return id != IV_FILTER_FLETCHER32;
}

/* Undoes one copying filter f of pipeline p: cur_len bytes at cur into
 * out (cap bytes), their length into *got. */
static int undo_stage(const iv_pipeline_t *p, const iv_filter_t *f, const uint8_t *cur,
                      size_t cur_len, uint8_t *out, size_t cap, size_t *got, iv_err_t *err)
{
    switch (f->id) {
    case IV_FILTER_DEFLATE: return iv_deflate_decode(cur, cur_len, out, cap, got, err);
    case IV_FILTER_ZSTD: return iv_zstd_decode(cur, cur_len, out, cap, got, err);
    case IV_FILTER_BLOSC2: return iv_blosc2_frame_decode(cur, cur_len, out, cap, got, err);
    case IV_FILTER_LZF:
        /* h5py records the chunk's byte size in cd_values[2]; without
         * it (h5py leaves it out for variable-length strings) the
         * stream is measured first. */
        if (f->n_cd >= 3 && f->cd[2] > 0) *got = f->cd[2];
        else IV_TRY(iv_lzf_decoded_size(cur, cur_len, cap, got, err));
        IV_RETURN_IF(*got > cap, err, IV_ECORRUPT,
                     "lzf: chunk of %zu bytes exceeds capacity %zu", *got, cap);
        return iv_lzf_decode(cur, cur_len, out, *got, err);
    case IV_FILTER_SHUFFLE: {
        size_t es = f->n_cd > 0 ? f->cd[0] : p->elem_size;
        IV_RETURN_IF(cur_len > cap, err, IV_ECORRUPT,
                     "shuffle: %zu bytes exceed capacity %zu", cur_len, cap);
        iv_unshuffle(cur, out, cur_len, es);
        *got = cur_len;
        return 0;
    }
    default:
        return IV_FAIL(err, IV_EUNSUPPORTED, "HDF5 filter %d is not supported", f->id);
    }
}

int iv_pipeline_decode(const iv_pipeline_t *p, unsigned filter_mask, const uint8_t *src,
                       size_t src_len, uint8_t *dst, size_t dst_cap, uint8_t *scratch,
                       size_t scratch_cap, size_t expected_len, size_t *out_len,
                       iv_err_t *err)
{
    *out_len = 0;
    IV_RETURN_IF(p == NULL || p->n > IV_PIPELINE_MAX, err, IV_EINVALID_ARG,
                 "pipeline: invalid filter count");
    IV_RETURN_IF(dst_cap < expected_len, err, IV_EINVALID_ARG,
                 "pipeline: capacity %zu below expected length %zu", dst_cap, expected_len);

    /* Count the copying stages so that the last one writes into dst. */
    size_t copies = 0;
    for (size_t i = 0; i < p->n; i++)
        if (filter_active(i, filter_mask) && filter_copies(p->f[i].id)) copies++;
    IV_RETURN_IF(copies > 1 && (scratch == NULL || scratch_cap < dst_cap), err,
                 IV_EINVALID_ARG, "pipeline: scratch of %zu bytes below capacity %zu",
                 scratch_cap, dst_cap);

    const uint8_t *cur = src;
    size_t cur_len = src_len;
    size_t left = copies;
    for (size_t k = p->n; k-- > 0;) {
        if (!filter_active(k, filter_mask)) continue;
        const iv_filter_t *f = &p->f[k];
        if (!filter_copies(f->id)) {
            IV_TRY(fletcher32_check(cur, &cur_len, err));
            continue;
        }
        /* Remaining copies odd: write dst; even: scratch. */
        uint8_t *out = (left % 2 == 1) ? dst : scratch;
        size_t cap = (out == dst) ? dst_cap : scratch_cap;
        left--;
        size_t got = 0;
        IV_TRY(undo_stage(p, f, cur, cur_len, out, cap, &got, err));
        cur = out;
        cur_len = got;
    }
    IV_RETURN_IF(cur_len != expected_len, err, IV_ECORRUPT,
                 "pipeline: chunk decodes to %zu bytes, expected %zu", cur_len, expected_len);
    if (cur != dst) memcpy(dst, cur, cur_len);
    *out_len = cur_len;
    return 0;
}

static void append(char *buf, size_t cap, size_t *pos, const char *s)
{
    if (cap == 0) return;
    int n = snprintf(buf + *pos, cap - *pos, "%s", s);
    if (n < 0) return;
    *pos += (size_t)n;
    if (*pos >= cap) *pos = cap - 1;
}

static const char *blosc2_codec_name(unsigned code)
{
    switch (code) {
    case 0: return "blosclz";
    case 1: return "lz4";
    case 2: return "lz4hc";
    case 4: return "zlib";
    case 5: return "zstd";
    default: return "unknown";
    }
}

/* Filter f's name into tmp; 1 when it is a compressor, 0 when a filter
 * a compressor wraps. */
static int stage_name(const iv_filter_t *f, char *tmp, size_t cap)
{
    switch (f->id) {
    case IV_FILTER_DEFLATE: snprintf(tmp, cap, "deflate"); return 1;
    case IV_FILTER_ZSTD: snprintf(tmp, cap, "zstd"); return 1;
    case IV_FILTER_LZF: snprintf(tmp, cap, "lzf"); return 1;
    case IV_FILTER_BLOSC2:
        if (f->n_cd >= 7) {
            const char *sh = f->cd[5] == 1 ? "+shuffle" : f->cd[5] == 2 ? "+bitshuffle" : "";
            snprintf(tmp, cap, "blosc2-%s%s", blosc2_codec_name(f->cd[6]), sh);
        } else {
            snprintf(tmp, cap, "blosc2");
        }
        return 1;
    case IV_FILTER_SHUFFLE: snprintf(tmp, cap, "shuffle"); return 0;
    case IV_FILTER_FLETCHER32: snprintf(tmp, cap, "fletcher32"); return 0;
    default: snprintf(tmp, cap, "filter-%d", f->id); return 0;
    }
}

void iv_pipeline_describe(const iv_pipeline_t *p, char *buf, size_t cap)
{
    if (cap == 0) return;
    buf[0] = '\0';
    size_t pos = 0;
    int any = 0;
    size_t n = p ? (p->n > IV_PIPELINE_MAX ? IV_PIPELINE_MAX : p->n) : 0;
    /* Compressors first (outermost first), then the filters they wrap. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = n; k-- > 0;) {
            char tmp[64];
            if (stage_name(&p->f[k], tmp, sizeof tmp) != (pass == 0)) continue;
            if (any) append(buf, cap, &pos, "+");
            append(buf, cap, &pos, tmp);
            any = 1;
        }
    }
    if (!any) append(buf, cap, &pos, "none");
}
