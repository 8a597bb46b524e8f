/*
 * The gzip level for streamed query answers (proto/gzip_stream.c), chosen
 * from real blocks: a random selection of cells (default 1% of them, all
 * genes) is decoded by the engine and each block encoded as the server
 * sends it (binary, NDJSON; and the whole JSON document), then compressed
 * on one thread the way the workers do, a piece a block with a fresh
 * deflate state, at levels 1, 2, 3 and 6 (a level marked "i" ran on ISA-L's
 * igzip, see gzip_stream.h).  Printed per format and level:
 * the identity bytes, the gzip bytes, the ratio, one thread's MB/s of
 * identity input, and, as the baseline measured in the same run, one
 * thread's MB/s for decoding and encoding the same blocks (what the
 * workers already spend on them).
 *
 * Two more rows per format answer the other questions:
 *   gz-whole   one deflate stream over the whole body at level 1: the
 *              ratio lost by compressing blocks independently;
 *   zlib-1     zlib level 1 a piece (what gzip-1 is without ISA-L);
 *   br-serial  brotli quality 1 through ONE encoder, flushed after each
 *              block: what serializing a stream through one encoder off
 *              the loop would give (brotli pieces from separate encoders
 *              do not concatenate), at one thread's speed for the whole
 *              answer.
 *
 *   bench_gzip_stream FILE.h5ad [--cells-percent P] [--reps R] [--seed S]
 *
 * Built with -DIV_BENCH=ON (target bench_gzip_stream).  Best of R runs,
 * timed in the thread's CPU time.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <brotli/encode.h>
#include <zlib.h>

#include "dataset.h"
#include "encode.h"
#include "gzip_stream.h"
#include "pool.h"
#include "query.h"

static double now_s(void)
{
    struct timespec ts;
    /* CPU time of this thread: the cost per thread, steady on a shared
     * machine where wall time also counts other processes. */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *msg, const char *what)
{
    fprintf(stderr, "bench_gzip_stream: %s%s%s\n", msg, what ? ": " : "", what ? what : "");
    exit(1);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The encoded pieces of one format: what the workers hand to the loop. */
typedef struct {
    const char *name;
    iv_buf_t *piece;
    size_t n;
    double encode_s;  /* decode + encode, one thread */
} body_t;

static size_t body_bytes(const body_t *b)
{
    size_t t = 0;
    for (size_t i = 0; i < b->n; i++) t += b->piece[i].len;
    return t;
}

/* Compresses every piece as the workers do; returns the member's bytes. */
static size_t run_pieces(const body_t *b, int level, double *secs)
{
    iv_gz_sum_t s;
    iv_gz_sum_init(&s);
    iv_buf_t out;
    iv_buf_init(&out);
    size_t total = IV_GZ_HEADER_BYTES + IV_GZ_TRAILER_BYTES;
    double t0 = now_s();
    for (size_t i = 0; i < b->n; i++) {
        uint32_t crc;
        out.len = 0;
        if (iv_gz_block(&out, b->piece[i].data, b->piece[i].len, level, &crc) != 0) die("deflate failed", NULL);
        iv_gz_sum_add(&s, crc, b->piece[i].len);
        total += out.len;
    }
    *secs = now_s() - t0;
    iv_buf_free(&out);
    return total;
}

/* zlib at level 1 a piece, as iv_gz_block does without ISA-L. */
static size_t run_zlib_pieces(const body_t *b, int level, double *secs)
{
    static unsigned char out[1 << 20];
    size_t total = IV_GZ_HEADER_BYTES + IV_GZ_TRAILER_BYTES;
    double t0 = now_s();
    for (size_t i = 0; i < b->n; i++) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (deflateInit2(&z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) die("zlib", NULL);
        z.next_in = (Bytef *)b->piece[i].data;
        z.avail_in = (uInt)b->piece[i].len;
        do {
            z.next_out = out;
            z.avail_out = sizeof out;
            deflate(&z, Z_SYNC_FLUSH);
            total += sizeof out - z.avail_out;
        } while (z.avail_in > 0 || z.avail_out == 0);
        (void)crc32(0, (const Bytef *)b->piece[i].data, (uInt)b->piece[i].len);
        deflateEnd(&z);
    }
    *secs = now_s() - t0;
    return total;
}

/* One deflate stream over the whole body (the ratio's upper reference). */
static size_t run_whole(const body_t *b, int level, double *secs)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) die("zlib", NULL);
    static unsigned char out[1 << 20];
    size_t total = 0;
    double t0 = now_s();
    for (size_t i = 0; i < b->n; i++) {
        z.next_in = (Bytef *)b->piece[i].data;
        z.avail_in = (uInt)b->piece[i].len;
        int fl = i + 1 == b->n ? Z_FINISH : Z_NO_FLUSH;
        do {
            z.next_out = out;
            z.avail_out = sizeof out;
            deflate(&z, fl);
            total += sizeof out - z.avail_out;
        } while (z.avail_in > 0 || z.avail_out == 0);
    }
    *secs = now_s() - t0;
    deflateEnd(&z);
    return total;
}

/* Brotli through one encoder, flushed after each block. */
static size_t run_brotli_serial(const body_t *b, int quality, double *secs)
{
    BrotliEncoderState *e = BrotliEncoderCreateInstance(NULL, NULL, NULL);
    if (!e) die("brotli", NULL);
    BrotliEncoderSetParameter(e, BROTLI_PARAM_QUALITY, (uint32_t)quality);
    size_t total = 0;
    double t0 = now_s();
    for (size_t i = 0; i <= b->n; i++) {
        const uint8_t *in = i < b->n ? (const uint8_t *)b->piece[i].data : NULL;
        size_t avail_in = i < b->n ? b->piece[i].len : 0;
        BrotliEncoderOperation op = i < b->n ? BROTLI_OPERATION_FLUSH : BROTLI_OPERATION_FINISH;
        do {
            size_t avail_out = 0;
            if (!BrotliEncoderCompressStream(e, op, &avail_in, &in, &avail_out, NULL, NULL)) die("brotli", NULL);
            size_t got = 0;
            BrotliEncoderTakeOutput(e, &got);
            total += got;
        } while (avail_in > 0 || BrotliEncoderHasMoreOutput(e));
    }
    *secs = now_s() - t0;
    BrotliEncoderDestroyInstance(e);
    return total;
}

int main(int argc, char **argv)
{
    if (argc < 2) die("usage: bench_gzip_stream FILE.h5ad [--cells-percent P] [--reps R] [--seed S]", NULL);
    double pct = 1.0;
    int reps = 3;
    uint64_t seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--cells-percent") == 0) pct = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seed") == 0) seed = strtoull(argv[i + 1], NULL, 10);
        else die("unknown option", argv[i]);
    }
    if (reps < 1) reps = 1;
    iv_pool_t *pool = iv_pool_create(0, 0);
    iv_dataset_opts_t o;
    iv_dataset_opts_init(&o);
    o.pool = pool;
    iv_dataset_t *ds;
    iv_err_t err = {0};
    if (iv_dataset_open(argv[1], &o, &ds, &err) < 0) die("cannot open", err.msg);
    const iv_dataset_info_t *info = iv_dataset_info(ds);
    int64_t n = (int64_t)((double)info->n_rows * pct / 100.0);
    if (n < 1) n = 1;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) die("out of memory", NULL);
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) idx[i] = (int64_t)(rng_next(&s) % (uint64_t)info->n_rows);
    qsort(idx, (size_t)n, sizeof *idx, cmp_i64);
    iv_sel_t obs = {.all = 0, .n = n, .idx = idx}, var = {.all = 1};

    /* Decode and encode the blocks once per format (best of reps for the
     * encode time), keeping the encoded pieces. */
    body_t bodies[3] = {{"binary", NULL, 0, 1e30}, {"ndjson", NULL, 0, 1e30}, {"json", NULL, 0, 1e30}};
    int64_t nnz = 0;
    for (int f = 0; f < 3; f++) {
        for (int rep = 0; rep < reps; rep++) {
            iv_query_t *q;
            iv_query_opts_t qo = {.axis = IV_OUT_ROWS, .pick = IV_PICK_AUTO};
            if (iv_query_new(ds, &obs, &var, &qo, &q, &err) < 0 || iv_query_prepare(q, pool, &err) < 0)
                die("query failed", err.msg);
            size_t nb = (size_t)iv_query_n_blocks(q);
            iv_stream_hdr_t h = iv_stream_hdr_of(q, 0);
            body_t *b = &bodies[f];
            for (size_t i = 0; i < b->n; i++) iv_buf_free(&b->piece[i]);
            free(b->piece);
            b->n = f == 2 ? 1 : nb;
            b->piece = calloc(b->n ? b->n : 1, sizeof *b->piece);
            if (!b->piece) die("out of memory", NULL);
            iv_jdoc_t jd;
            iv_jdoc_init(&jd);
            nnz = 0;
            double t0 = now_s();
            for (size_t k = 0; k < nb; k++) {
                iv_block_t blk;
                memset(&blk, 0, sizeof blk);
                if (iv_query_decode_block(q, (int64_t)k, &blk, &err) < 0) die("decode failed", err.msg);
                nnz += blk.nnz;
                if (f == 2) iv_jdoc_add_h(&jd, &h, &blk);
                else iv_enc_block_h(&b->piece[k], f == 0 ? IV_FMT_BINARY : IV_FMT_NDJSON, &h, &blk);
                iv_block_free(&blk);
            }
            if (f == 2) iv_jdoc_finish(&jd, &h, &b->piece[0]);
            double t = now_s() - t0;
            if (t < b->encode_s) b->encode_s = t;
            iv_jdoc_free(&jd);
            iv_query_free(q);
        }
    }
    printf("selection: %" PRId64 " random cells (%.2f%%) x all %" PRId64 " genes, %" PRId64
           " stored values; one thread, best of %d\n", n, pct, info->n_cols, nnz, reps);
    printf("%-7s %-10s %7s %11s %11s %7s %9s %14s\n", "format", "coding", "blocks", "identity_MB", "coded_MB",
           "ratio", "MB/s", "vs_encode_MB/s");
    for (int f = 0; f < 3; f++) {
        const body_t *b = &bodies[f];
        double mb = (double)body_bytes(b) / 1e6;
        printf("%-7s %-10s %7zu %11.2f %11s %7s %9.1f %14s\n", b->name, "identity", b->n, mb, "-", "-",
               mb / b->encode_s, "(decode+enc)");
        static const int levels[] = {1, 2, 3, 6};
        for (int li = 0; li < 4; li++) {
            double best = 1e30, t;
            size_t out = 0;
            for (int rep = 0; rep < reps; rep++) {
                out = run_pieces(b, levels[li], &t);
                if (t < best) best = t;
            }
            char name[16];
            snprintf(name, sizeof name, "gzip-%d%s", levels[li], strcmp(iv_gz_engine(levels[li]), "isa-l") ? "" : "i");
            printf("%-7s %-10s %7zu %11.2f %11.2f %7.3f %9.1f %14.1f\n", b->name, name, b->n, mb,
                   (double)out / 1e6, (double)out / (mb * 1e6), mb / best, mb / b->encode_s);
        }
        double best = 1e30, t;
        size_t out = 0;
        for (int rep = 0; rep < reps; rep++) {
            out = run_zlib_pieces(b, 1, &t);
            if (t < best) best = t;
        }
        printf("%-7s %-10s %7zu %11.2f %11.2f %7.3f %9.1f %14.1f\n", b->name, "zlib-1", b->n, mb,
               (double)out / 1e6, (double)out / (mb * 1e6), mb / best, mb / b->encode_s);
        best = 1e30;
        for (int rep = 0; rep < reps; rep++) {
            out = run_whole(b, 1, &t);
            if (t < best) best = t;
        }
        printf("%-7s %-10s %7zu %11.2f %11.2f %7.3f %9.1f %14s\n", b->name, "gz-whole-1", (size_t)1, mb,
               (double)out / 1e6, (double)out / (mb * 1e6), mb / best, "-");
        best = 1e30;
        for (int rep = 0; rep < reps; rep++) {
            out = run_brotli_serial(b, 1, &t);
            if (t < best) best = t;
        }
        printf("%-7s %-10s %7zu %11.2f %11.2f %7.3f %9.1f %14s\n", b->name, "br-serial1", b->n, mb,
               (double)out / 1e6, (double)out / (mb * 1e6), mb / best, "-");
    }
    for (int f = 0; f < 3; f++) {
        for (size_t i = 0; i < bodies[f].n; i++) iv_buf_free(&bodies[f].piece[i]);
        free(bodies[f].piece);
    }
    free(idx);
    iv_dataset_close(ds);
    iv_pool_destroy(pool);
    return 0;
}
