/* A receive buffer for one HTTP answer, filled as the bytes arrive (read
 * from the curl package's connection by ivs_sink_fill) and read in place
 * by the decoder.
 *
 * Why not httr2::req_perform's body: curl_fetch_memory grows its own
 * buffer and then copies the whole answer into a raw vector, so a 220 MB
 * result stream touched 440 MB of fresh memory before any decoding (and
 * readBin on a connection allocates a raw vector per chunk); on a
 * virtual machine each first touch of a 4 KiB page is a fault that costs
 * microseconds (measured: about 1 s of CPU per 330 MB), more than the
 * decoding.  Here the answer lands once, in a buffer that grows by
 * doubling and is advised to use 2 MiB pages, so that touching it costs a
 * few hundred faults instead of tens of thousands.  On Linux the buffer is
 * its own mapping, grown by moving its pages into a larger one (mremap,
 * never a copy): the same advice on a buffer grown by glibc's realloc made
 * no difference (measured: 1 s against 0.03 s of CPU for 220 MB received
 * in 1 MB chunks).  Elsewhere it is plain realloc.
 *
 * The buffer belongs to an external pointer: R's garbage collector frees
 * it through the finalizer, and ivs_sink_release frees it at once when the
 * caller is done (a large answer should not wait for a collection). */
#if defined(__linux__)
#define _GNU_SOURCE /* mremap */
#include <sys/mman.h>
#define SINK_MMAP 1
#else
#define SINK_MMAP 0
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ivserve.h"

#include <R_ext/Connections.h>
#if R_CONNECTIONS_VERSION != 1
#error "this package reads R connections through version 1 of their C interface"
#endif

struct sink {
    unsigned char *buf;
    size_t len, cap;
};

#define HUGE_PAGE ((uintptr_t)1 << 21)
/* The first allocation; the buffer doubles from it. */
#define SINK_FIRST ((size_t)HUGE_PAGE)

void advise_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
    if (p && e > a) (void)madvise((void *)a, (size_t)(e - a), MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

static struct sink *sink_of(SEXP s)
{
    if (TYPEOF(s) != EXTPTRSXP) return NULL;
    return (struct sink *)R_ExternalPtrAddr(s);
}

static void sink_free(struct sink *k)
{
#if SINK_MMAP
    if (k->buf) munmap(k->buf, k->cap);
#else
    free(k->buf);
#endif
    k->buf = NULL;
    k->len = k->cap = 0;
}

static void sink_finalize(SEXP s)
{
    struct sink *k = sink_of(s);
    if (!k) return;
    sink_free(k);
    free(k);
    R_ClearExternalPtr(s);
}

#if SINK_MMAP
/* A fresh mapping of cap bytes (a multiple of HUGE_PAGE) starting on a
 * HUGE_PAGE boundary, advised to huge pages; NULL when none can be had.
 * Aligned, so that the huge pages of one mapping move whole into the next
 * (sink_grow) on kernels that do not align large mappings themselves. */
static unsigned char *map_aligned(size_t cap)
{
    size_t span = cap + HUGE_PAGE;
    unsigned char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    unsigned char *a = (unsigned char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    if (a > m) munmap(m, (size_t)(a - m));
    size_t tail = (size_t)((m + span) - (a + cap));
    if (tail) munmap(a + cap, tail);
    advise_huge(a, cap);
    return a;
}
#endif

/* The buffer grown to cap bytes, its contents kept; NULL when out of
 * memory (the old buffer then stays as it was).  On Linux the old pages
 * are moved, not copied, to the start of a new aligned mapping. */
static unsigned char *sink_grow(struct sink *k, size_t cap)
{
#if SINK_MMAP
    unsigned char *b = map_aligned(cap);
    if (!b || !k->buf) return b;
    if (mremap(k->buf, k->cap, k->cap, MREMAP_MAYMOVE | MREMAP_FIXED, b) == MAP_FAILED) {
        munmap(b, cap);
        return NULL;
    }
    return b;
#else
    unsigned char *b = realloc(k->buf, cap);
    if (b) advise_huge(b, cap);
    return b;
#endif
}

const unsigned char *sink_bytes(SEXP s, size_t *len)
{
    struct sink *k = sink_of(s);
    *len = k && k->buf ? k->len : 0;
    return k ? k->buf : NULL;
}

/* .Call entry: a new, empty sink. */
SEXP ivs_sink_new(void)
{
    struct sink *k = calloc(1, sizeof *k);
    if (!k) error("ivserve: out of memory for a receive buffer");
    SEXP s = PROTECT(R_MakeExternalPtr(k, install("ivs_sink"), R_NilValue));
    R_RegisterCFinalizerEx(s, sink_finalize, TRUE);
    UNPROTECT(1);
    return s;
}

/* Room for n more bytes; an R error when there is none. */
static void sink_reserve(struct sink *k, size_t n)
{
    if (n > SIZE_MAX / 4 - k->len) error("ivserve: the answer is larger than this process can address");
    if (k->len + n <= k->cap) return;
    /* Doubling from SINK_FIRST: a multiple of HUGE_PAGE, below SIZE_MAX / 2. */
    size_t cap = k->cap ? k->cap : SINK_FIRST;
    while (cap < k->len + n) cap *= 2;
    unsigned char *b = sink_grow(k, cap);
    if (!b) error("ivserve: out of memory receiving an answer of %.0f bytes", (double)(k->len + n));
    k->buf = b;
    k->cap = cap;
}

/* The most one read from a connection asks for. */
#define FILL_PIECE ((size_t)1 << 20)

/* .Call entry: reads an open, blocking connection (the curl package's
 * connection to the answer) to its end straight into the sink, without
 * the raw vector per chunk that readBin would allocate; returns the bytes
 * held.  A failed transfer is the connection's own R error. */
SEXP ivs_sink_fill(SEXP s, SEXP con)
{
    struct sink *k = sink_of(s);
    if (!k) error("ivserve: not a receive buffer");
    Rconnection c = R_GetConnection(con);
    for (;;) {
        sink_reserve(k, FILL_PIECE);
        size_t got = R_ReadConnection(c, k->buf + k->len, FILL_PIECE);
        if (!got) break;
        k->len += got;
        R_CheckUserInterrupt();
    }
    return ScalarReal((double)k->len);
}

/* .Call entry: the first max bytes held (all when max is NA), as a raw
 * vector: error answers are read from it as text. */
SEXP ivs_sink_raw(SEXP s, SEXP max)
{
    size_t len;
    const unsigned char *b = sink_bytes(s, &len);
    double m = asReal(max);
    if (!ISNAN(m) && m >= 0 && m < (double)len) len = (size_t)m;
    SEXP out = allocVector(RAWSXP, (R_xlen_t)len);
    if (len) memcpy(RAW(out), b, len);
    return out;
}

/* .Call entry: frees the bytes now; the sink is empty afterwards. */
SEXP ivs_sink_release(SEXP s)
{
    struct sink *k = sink_of(s);
    if (k) sink_free(k);
    return R_NilValue;
}
