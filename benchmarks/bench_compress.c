/*
 * Compression cost per thread, to choose the levels the server uses for
 * Content-Encoding (api/viewer_impl.h GZIP_LEVEL, proto/coding.c BR_QUALITY): for each
 * input file (response bodies saved with curl), MB/s of one thread and
 * the compressed size, for zlib (gzip) levels 1, 3, 6 and brotli
 * qualities 1, 4, 6, best of 3 runs.
 *
 * Built with -DIV_BENCH=ON (target bench_compress), or by hand:
 *   cc -O2 -std=c11 -D_GNU_SOURCE benchmarks/bench_compress.c -lz -lbrotlienc -o bench_compress
 * Run: ./bench_compress BODY...   (see benchmarks/README.md for the bodies)
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <brotli/encode.h>
#include <zlib.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t gz(const unsigned char *in, size_t n, unsigned char *out, size_t cap, int level)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t r = z.total_out;
    deflateEnd(&z);
    return r;
}

static size_t br(const unsigned char *in, size_t n, unsigned char *out, size_t cap, int q)
{
    size_t m = cap;
    if (!BrotliEncoderCompress(q, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, n, in, &m, out)) return 0;
    return m;
}

int main(int argc, char **argv)
{
    printf("%-28s %10s %-6s %10s %8s %9s\n", "body", "bytes", "codec", "out", "ratio", "MB/s");
    for (int a = 1; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (!f) {
            perror(argv[a]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        size_t n = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        unsigned char *in = malloc(n + 1), *out = malloc(n + n / 2 + 65536);
        if (fread(in, 1, n, f) != n) return 1;
        fclose(f);
        const char *base = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        static const struct { const char *name; int br, level; } cs[] = {
            {"gzip-1", 0, 1}, {"gzip-3", 0, 3}, {"gzip-6", 0, 6}, {"br-1", 1, 1}, {"br-4", 1, 4}, {"br-6", 1, 6}};
        for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
            double best = 1e30;
            size_t m = 0;
            for (int r = 0; r < 3; r++) {
                double t0 = now();
                m = cs[c].br ? br(in, n, out, n + n / 2 + 65536, cs[c].level)
                             : gz(in, n, out, n + n / 2 + 65536, cs[c].level);
                double t = now() - t0;
                if (t < best) best = t;
            }
            printf("%-28s %10zu %-6s %10zu %7.2fx %9.1f\n", base, n, cs[c].name, m, (double)n / (double)m,
                   (double)n / best / 1e6);
        }
        free(in);
        free(out);
    }
    return 0;
}
