/*
 * Differential expression (see diffexp.h).
 *
 * Design.  One gene at a time, all groups at once.  Most genes of count
 * data hold a few dozen distinct values: those are counted per label in a
 * small hash table straight from the decoded block (HASH_DISTINCT
 * values at most), and everything both tests need comes from the table:
 * per label the stored and non-zero counts, the mean, then the squared
 * deviations (two passes over the distinct values), and the rank sums
 * from the distinct values in order.  A gene with more distinct values
 * is converted into 64-bit keys that sort like the values (the IEEE bits
 * with the sign folded) next to each entry's label, in the work's
 * scratch: 12 bytes an entry, so a gene stored in every cell of the
 * universe needs 12 bytes a cell and nothing else does; the moments
 * take two passes over the entries and the rank-sum test sorts them (an
 * in-place MSD radix sort, American flag, on the bytes that vary: no
 * second buffer).
 *
 *  - The t-test's implicit zeros add (n - stored) * mean^2 to the squared
 *    deviations; a "rest" is the other labels' moments merged (Chan et
 *    al.), so every group of a one-versus-rest request comes out of the
 *    same pass over the gene.
 *  - The rank-sum test walks tie blocks.  The zeros (implicit, and stored
 *    zeros) are one tie block placed where 0 sorts among the stored
 *    values, added per label as counts.  Ranks are over the whole
 *    universe, which is what every group-versus-rest test needs, so one
 *    walk gives every group's rank sum; against a reference group each
 *    pair walks again, counting only the two labels.
 *
 * The special functions are written out here rather than taken from libm
 * where libm has no equivalent (the incomplete beta) or where its lgamma
 * writes the global signgam (a data race between workers).
 */
#include "diffexp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SORT_SMALL 32
/* log1p of whole numbers below this comes from a table: counts are
 * mostly small, and log1p costs about 20 ns. */
#define LP_TABLE 4096
/* A gene's distinct values are counted in a hash table when there are at
 * most HASH_DISTINCT of them (counts have a few dozen) and at most
 * HASH_LABELS labels: O(nnz) with no scratch; the entries are loaded
 * (and sorted) otherwise. */
#define HASH_SLOTS 1024
#define HASH_DISTINCT 512
#define HASH_LABELS 64

struct iv_de {
    iv_de_spec_t s;
    iv_de_row_t *rows;         /* n_tested * n_genes, group-major */
    int8_t *label8;            /* the labels as bytes when n_labels <= 127: the
                                * random lookups per entry then fit in a quarter
                                * of the cache lines; else NULL */
};

struct iv_de_work {
    const iv_de_t *de;
    int64_t *st, *nz;          /* per label: stored entries, non-zero entries */
    double *s1, *mean, *m2, *rs;
    double *mn, *mx;           /* per label: the least and greatest stored value */
    uint64_t *key;
    int32_t *lab;
    int64_t cap;
    double *lp;                /* log1p(k) for whole k < LP_TABLE */
    uint64_t *hk;              /* the distinct-value table: keys (0 = free), */
    int64_t *hc;               /* HASH_SLOTS x n_labels counts, */
    int32_t *hused;            /* its used slots in order of first use */
    uint64_t *dkey;            /* and, sorted, the distinct keys */
    int32_t *dslot;
    int32_t hn;                /* slots in use */
    int gated;                 /* never allocate scratch in iv_de_gene */
};

/* ---- special functions ---------------------------------------------- */

/* exp(-x*x) with the rounding error of x*x taken into account: the
 * tail of the normal distribution is exp(-x^2) times a slowly varying
 * factor, and an ulp of x^2 = 700 would cost 1e-13 relative. */
static double exp_neg_sq(double x)
{
    double hi = x * x, lo = fma(x, x, -hi);
    return exp(-hi) * (1.0 - lo);
}

double iv_de_erfc(double x)
{
    static const double two_over_sqrt_pi = 1.1283791670955125739;
    static const double one_over_sqrt_pi = 0.56418958354775628695;
    if (isnan(x)) return x;
    if (x < 0) return 2.0 - iv_de_erfc(-x);
    if (x < 0.5) {
        /* erf by its Taylor series; alternating but |x| < 0.5. */
        double sum = x, term = x, x2 = x * x;
        for (int n = 1; n < 60; n++) {
            term *= -x2 / n;
            double t = term / (2 * n + 1);
            sum += t;
            if (fabs(t) < 1e-17 * fabs(sum)) break;
        }
        return 1.0 - two_over_sqrt_pi * sum;
    }
    if (x < 2.5) {
        /* erf(x) = 2/sqrt(pi) exp(-x^2) sum 2^n x^(2n+1) / (1*3*...*(2n+1)):
         * all terms positive, so no cancellation inside the sum. */
        double sum = x, term = x, x2 = x * x;
        for (int n = 1; n < 200; n++) {
            term *= 2.0 * x2 / (2 * n + 1);
            sum += term;
            if (term < 1e-17 * sum) break;
        }
        return 1.0 - two_over_sqrt_pi * exp_neg_sq(x) * sum;
    }
    if (x > 27.5) return 0.0;  /* below the smallest subnormal */
    /* Laplace's continued fraction erfc(x) = exp(-x^2)/sqrt(pi) /
     * (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), by modified Lentz. */
    const double tiny = 1e-300;
    double f = x, c = x, d = 0;
    for (int i = 1; i < 5000; i++) {
        double a = 0.5 * i;
        d = x + a * d;
        if (d == 0) d = tiny;
        c = x + a / c;
        if (c == 0) c = tiny;
        d = 1.0 / d;
        double delta = c * d;
        f *= delta;
        if (fabs(delta - 1.0) < 1e-16) break;
    }
    return one_over_sqrt_pi * exp_neg_sq(x) / f;
}

double iv_de_norm_p2(double z)
{
    if (isnan(z)) return z;
    double p = iv_de_erfc(fabs(z) * 0.70710678118654752440);
    return p > 1.0 ? 1.0 : p;
}

/*
 * The incomplete beta function is computed in long double.  Its continued
 * fraction for the t-test's I_x(df/2, 1/2) runs with x within t^2/df of 1,
 * where the recurrence's terms cancel to about 1/df: with a million cells
 * six digits are lost, which double precision cannot spare (5e-10
 * relative against scipy at df = 1e7) and x87's 64-bit significand can
 * (under 1e-13).  On targets whose long double is double this degrades
 * gracefully to that accuracy.
 */
typedef long double ld_t;

/* Stirling's series' correction term: lnGamma(x) - ((x - 1/2) ln x - x +
 * ln(2 pi) / 2), for x >= 10 (the next term is under 1e-12 / x^9). */
static ld_t stirling_corr(ld_t x)
{
    ld_t r = 1.0L / x, r2 = r * r;
    return r * (1.0L / 12 - r2 * (1.0L / 360 - r2 * (1.0L / 1260 - r2 * (1.0L / 1680 - r2 / 1188))));
}

static const ld_t half_ln_2pi = 0.918938533204672741780329736405617639861L;

/* ln Gamma(x), x > 0: shifted up to 16 and Stirling there. */
static ld_t ln_gamma(ld_t x)
{
    ld_t shift = 0.0L, prod = 1.0L;
    while (x < 16.0L) {
        prod *= x;
        x += 1.0L;
        if (prod > 1e250L) {
            shift += logl(prod);
            prod = 1.0L;
        }
    }
    shift += logl(prod);
    return (x - 0.5L) * logl(x) - x + half_ln_2pi + stirling_corr(x) - shift;
}

/* ln B(a, b).  For a large a the difference lnGamma(a + b) - lnGamma(a)
 * is taken from Stirling's series directly rather than as the difference
 * of two values of order a ln a. */
static ld_t ln_beta(ld_t a, ld_t b)
{
    ld_t big = a > b ? a : b, small = a > b ? b : a;
    if (big < 16.0L) return ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b);
    if (small < 16.0L) {
        ld_t diff = (big - 0.5L) * log1pl(small / big) + small * logl(big + small) - small +
                    stirling_corr(big + small) - stirling_corr(big);
        return ln_gamma(small) - diff;
    }
    ld_t s = a + b;
    return half_ln_2pi + (a - 0.5L) * logl(a / s) + (b - 0.5L) * logl(b / s) - 0.5L * logl(s) +
           stirling_corr(a) + stirling_corr(b) - stirling_corr(s);
}

/* The continued fraction of I_x(a, b) (Abramowitz and Stegun 26.5.8) by
 * modified Lentz, for x < (a + 1) / (a + b + 2); y = 1 - x, given
 * separately because the first denominator, 1 - (a + b) x / (a + 1), is
 * (1 - b + (a + b) y) / (a + 1) without cancellation. */
static ld_t beta_cf(ld_t a, ld_t b, ld_t x, ld_t y)
{
    const ld_t tiny = 1e-300L;
    ld_t qab = a + b, qap = a + 1.0L, qam = a - 1.0L;
    ld_t c = 1.0L, d = (1.0L - b + qab * y) / qap;
    if (fabsl(d) < tiny) d = tiny;
    d = 1.0L / d;
    ld_t h = d;
    for (int m = 1; m < 200000; m++) {
        ld_t m2 = 2.0L * m;
        ld_t aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0L + aa * d;
        if (fabsl(d) < tiny) d = tiny;
        c = 1.0L + aa / c;
        if (fabsl(c) < tiny) c = tiny;
        d = 1.0L / d;
        h *= d * c;
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0L + aa * d;
        if (fabsl(d) < tiny) d = tiny;
        c = 1.0L + aa / c;
        if (fabsl(c) < tiny) c = tiny;
        d = 1.0L / d;
        ld_t del = d * c;
        h *= del;
        if (fabsl(del - 1.0L) < 1e-18L) break;
    }
    return h;
}

/* I_x(a, b) from x, y = 1 - x, ln x and ln y (callers often know y and
 * the logarithms more precisely than they would follow from x). */
static double betainc_xy(ld_t a, ld_t b, ld_t x, ld_t y, ld_t ln_x, ld_t ln_y)
{
    if (x <= 0) return 0.0;
    if (y <= 0) return 1.0;
    ld_t front = expl(a * ln_x + b * ln_y - ln_beta(a, b));
    ld_t p;
    if (x < (a + 1.0L) / (a + b + 2.0L)) p = front * beta_cf(a, b, x, y) / a;
    else p = 1.0L - front * beta_cf(b, a, y, x) / b;
    return p < 0 ? 0.0 : p > 1 ? 1.0 : (double)p;
}

double iv_de_betainc(double a, double b, double x)
{
    if (isnan(a) || isnan(b) || isnan(x) || a <= 0 || b <= 0 || x < 0 || x > 1) return NAN;
    ld_t lx = x;
    return betainc_xy(a, b, lx, 1.0L - lx, logl(lx), log1pl(-lx));
}

double iv_de_t_p2(double t, double df)
{
    if (isnan(t) || isnan(df) || df <= 0) return NAN;
    if (isinf(t)) return 0.0;
    ld_t lt = t, r = lt * lt / (ld_t)df;
    if (r == 0) return 1.0;
    if (isinf(r)) return 0.0;
    /* p = I_x(df/2, 1/2) with x = df / (df + t^2) = 1 / (1 + r). */
    ld_t l1r = log1pl(r);
    return betainc_xy(0.5L * df, 0.5L, 1.0L / (1.0L + r), r / (1.0L + r), -l1r, logl(r) - l1r);
}

typedef struct pidx {
    double p;
    int64_t i;
} pidx_t;

static int pidx_cmp(const void *x, const void *y)
{
    const pidx_t *a = x, *b = y;
    if (a->p < b->p) return -1;
    if (a->p > b->p) return 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

int iv_de_bh(const double *p, int64_t n, double *adj)
{
    if (n <= 0) return 0;
    pidx_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return IV_ENOMEM;
    for (int64_t i = 0; i < n; i++) v[i] = (pidx_t){isnan(p[i]) ? 1.0 : p[i], i};
    qsort(v, (size_t)n, sizeof *v, pidx_cmp);
    double run = 1.0;
    for (int64_t k = n - 1; k >= 0; k--) {
        double q = v[k].p * (double)n / (double)(k + 1);
        if (q < run) run = q;
        v[k].p = run;
    }
    for (int64_t k = 0; k < n; k++) adj[v[k].i] = v[k].p;
    free(v);
    return 0;
}

/* ---- keys and sorting ----------------------------------------------- */

/* The value's bits turned so that unsigned order is numeric order (-0
 * was made +0 by the caller; NaN sorts above +inf). */
static inline uint64_t okey(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return (u >> 63) ? ~u : u | ((uint64_t)1 << 63);
}

static inline double kval(uint64_t k)
{
    uint64_t u = (k >> 63) ? k & ~((uint64_t)1 << 63) : ~k;
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

#define ZERO_KEY ((uint64_t)1 << 63)

static void isort(uint64_t *k, int32_t *l, int64_t n)
{
    for (int64_t i = 1; i < n; i++) {
        uint64_t kv = k[i];
        int32_t lv = l[i];
        int64_t j = i;
        while (j > 0 && k[j - 1] > kv) {
            k[j] = k[j - 1];
            l[j] = l[j - 1];
            j--;
        }
        k[j] = kv;
        l[j] = lv;
    }
}

/* American flag sort of k (l follows) on bits shift+7 .. 0. */
static void afsort(uint64_t *k, int32_t *l, int64_t n, int shift)
{
    for (;;) {
        if (n <= SORT_SMALL) {
            isort(k, l, n);
            return;
        }
        int64_t count[256] = {0};
        for (int64_t i = 0; i < n; i++) count[(k[i] >> shift) & 255]++;
        int one = 0;
        for (int b = 0; b < 256; b++)
            if (count[b] == n) one = 1;
        if (one) {
            if (shift == 0) return;  /* all equal */
            shift -= 8;
            continue;
        }
        int64_t head[256], tail[256];
        int64_t at = 0;
        for (int b = 0; b < 256; b++) {
            head[b] = at;
            at += count[b];
            tail[b] = at;
        }
        for (int b = 0; b < 256; b++) {
            while (head[b] < tail[b]) {
                uint64_t v = k[head[b]];
                int32_t lv = l[head[b]];
                int d = (int)((v >> shift) & 255);
                while (d != b) {
                    int64_t p = head[d]++;
                    uint64_t tk = k[p];
                    int32_t tl = l[p];
                    k[p] = v;
                    l[p] = lv;
                    v = tk;
                    lv = tl;
                    d = (int)((v >> shift) & 255);
                }
                k[head[b]] = v;
                l[head[b]] = lv;
                head[b]++;
            }
        }
        if (shift == 0) return;
        at = 0;
        for (int b = 0; b < 256; b++) {
            if (count[b] > 1) afsort(k + at, l + at, count[b], shift - 8);
            at += count[b];
        }
        return;
    }
}

/* ---- the accumulator ------------------------------------------------ */

size_t iv_de_result_bytes(const iv_de_spec_t *s)
{
    return (size_t)(s->n_tested > 0 ? s->n_tested : 0) * (size_t)(s->n_genes > 0 ? s->n_genes : 0) *
           sizeof(iv_de_row_t);
}

/* Whether the groups, the reference and the method fit together. */
static int spec_consistent(const iv_de_spec_t *s)
{
    if (s->n_labels < 1 || s->n_tested < 1 || s->n_tested > s->n_labels || s->n_genes < 0)
        return 0;
    if (s->reference >= 0 && (s->reference < s->n_tested || s->reference >= s->n_labels))
        return 0;
    return s->reference >= -1 && (s->method == IV_DE_TTEST || s->method == IV_DE_WILCOXON);
}

int iv_de_new(const iv_de_spec_t *s, iv_de_t **out, iv_err_t *err)
{
    *out = NULL;
    if (!spec_consistent(s))
        return iv_fail(err, IV_EINVALID_ARG, "differential expression: inconsistent groups");
    iv_de_t *de = calloc(1, sizeof *de);
    if (!de) return iv_fail(err, IV_ENOMEM, "out of memory");
    de->s = *s;
    size_t n = (size_t)s->n_tested * (size_t)s->n_genes;
    de->rows = calloc(n ? n : 1, sizeof *de->rows);
    if (!de->rows) {
        free(de);
        return iv_fail(err, IV_ENOMEM, "out of memory for %zu results", n);
    }
    if (s->n_labels <= 127) {
        de->label8 = malloc((size_t)(s->n_universe > 0 ? s->n_universe : 1));
        if (!de->label8) {
            iv_de_free(de);
            return iv_fail(err, IV_ENOMEM, "out of memory");
        }
        for (int64_t i = 0; i < s->n_universe; i++) de->label8[i] = (int8_t)s->label[i];
    }
    *out = de;
    return 0;
}

void iv_de_set_log1p(iv_de_t *de, int on)
{
    de->s.log1p = on != 0;
}

void iv_de_free(iv_de_t *de)
{
    if (!de) return;
    free(de->rows);
    free(de->label8);
    free(de);
}

/* The distinct-value table of a work over nl labels: 0 or -1. */
static int hash_alloc(iv_de_work_t *w, size_t nl)
{
    w->hk = calloc(HASH_SLOTS, sizeof *w->hk);
    w->hc = calloc((size_t)HASH_SLOTS * nl, sizeof *w->hc);
    w->hused = malloc(HASH_DISTINCT * sizeof *w->hused);
    w->dkey = malloc(HASH_DISTINCT * sizeof *w->dkey);
    w->dslot = malloc(HASH_DISTINCT * sizeof *w->dslot);
    return w->hk && w->hc && w->hused && w->dkey && w->dslot ? 0 : -1;
}

iv_de_work_t *iv_de_work_new(const iv_de_t *de)
{
    iv_de_work_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    size_t nl = (size_t)de->s.n_labels;
    w->de = de;
    w->st = calloc(nl, sizeof *w->st);
    w->nz = calloc(nl, sizeof *w->nz);
    w->s1 = calloc(nl, sizeof *w->s1);
    w->mean = calloc(nl, sizeof *w->mean);
    w->m2 = calloc(nl, sizeof *w->m2);
    w->rs = calloc(nl, sizeof *w->rs);
    w->mn = calloc(nl, sizeof *w->mn);
    w->mx = calloc(nl, sizeof *w->mx);
    w->lp = malloc(LP_TABLE * sizeof *w->lp);
    if (!w->st || !w->nz || !w->s1 || !w->mean || !w->m2 || !w->rs || !w->mn || !w->mx || !w->lp) {
        iv_de_work_free(w);
        return NULL;
    }
    for (int k = 0; k < LP_TABLE; k++) w->lp[k] = log1p((double)k);
    if (de->s.n_labels <= HASH_LABELS && hash_alloc(w, nl) != 0) {
        iv_de_work_free(w);
        return NULL;
    }
    return w;
}

void iv_de_work_set_gated(iv_de_work_t *w, int gated)
{
    w->gated = gated != 0;
}

void iv_de_work_drop(iv_de_work_t *w)
{
    free(w->key);
    free(w->lab);
    w->key = NULL;
    w->lab = NULL;
    w->cap = 0;
}

void iv_de_work_free(iv_de_work_t *w)
{
    if (!w) return;
    iv_de_work_drop(w);
    free(w->st);
    free(w->nz);
    free(w->s1);
    free(w->mean);
    free(w->m2);
    free(w->rs);
    free(w->mn);
    free(w->mx);
    free(w->lp);
    free(w->hk);
    free(w->hc);
    free(w->hused);
    free(w->dkey);
    free(w->dslot);
    free(w);
}

size_t iv_de_scratch_bytes(const iv_de_t *de, int64_t nnz)
{
    (void)de;
    return (size_t)(nnz > 0 ? nnz : 0) * (sizeof(uint64_t) + sizeof(int32_t));
}

size_t iv_de_work_held(const iv_de_work_t *w)
{
    return iv_de_scratch_bytes(w->de, w->cap);
}

int iv_de_work_reserve(iv_de_work_t *w, int64_t n)
{
    if (n <= w->cap) return 0;
    iv_de_work_drop(w);
    w->key = malloc((size_t)n * sizeof *w->key);
    w->lab = malloc((size_t)n * sizeof *w->lab);
    if (!w->key || !w->lab) {
        iv_de_work_drop(w);
        return IV_ENOMEM;
    }
    w->cap = n;
    return 0;
}

static inline double log1p_fast(const iv_de_work_t *w, double v)
{
    if (v >= 0 && v < LP_TABLE) {
        int i = (int)v;
        if ((double)i == v) return w->lp[i];
    }
    return log1p(v);
}

/* The label of entry k of a block, or -1 when its cell is outside the
 * universe or in no label (load and hash_direct skip those). */
static inline int32_t entry_label(const iv_de_spec_t *s, const int8_t *l8, const void *indices,
                                  int index_size, int64_t k)
{
    int64_t pos = index_size == 4 ? ((const int32_t *)indices)[k] : ((const int64_t *)indices)[k];
    if (pos < 0 || pos >= s->n_universe) return -1;
    int32_t l = l8 ? l8[pos] : s->label[pos];
    return l >= s->n_labels ? -1 : l;
}

/* A stored value as the tests see it: log1p'ed when asked, -0 as +0. */
static inline double entry_value(const iv_de_spec_t *s, iv_de_work_t *w, double v)
{
    if (s->log1p) v = log1p_fast(w, v);
    return v == 0 ? 0 : v;
}

/* Loads the gene's entries into keys and labels, with the per-label
 * counts and sums; returns the entries kept. */
#define LOAD_LOOP(T)                                                           \
    do {                                                                       \
        const T *dv = data;                                                    \
        for (int64_t k = 0; k < nnz; k++) {                                    \
            int32_t l = entry_label(s, l8, indices, index_size, k);            \
            if (l < 0) continue;                                               \
            double v = entry_value(s, w, (double)dv[k]);                       \
            w->key[n] = okey(v);                                               \
            w->lab[n] = l;                                                     \
            n++;                                                               \
            if (w->st[l] == 0 || v < w->mn[l]) w->mn[l] = v;                   \
            if (w->st[l] == 0 || v > w->mx[l]) w->mx[l] = v;                   \
            w->st[l]++;                                                        \
            if (v != 0) {                                                      \
                w->nz[l]++;                                                    \
                w->s1[l] += v;                                                 \
            }                                                                  \
        }                                                                      \
    } while (0)

static int64_t load(iv_de_work_t *w, int64_t nnz, const void *indices, int index_size, const void *data,
                    iv_dtype_t dtype)
{
    const iv_de_spec_t *s = &w->de->s;
    const int8_t *l8 = w->de->label8;
    int64_t n = 0;
    switch (dtype) {
    case IV_DT_INT8: LOAD_LOOP(int8_t); break;
    case IV_DT_INT16: LOAD_LOOP(int16_t); break;
    case IV_DT_INT32: LOAD_LOOP(int32_t); break;
    case IV_DT_INT64: LOAD_LOOP(int64_t); break;
    case IV_DT_UINT8: LOAD_LOOP(uint8_t); break;
    case IV_DT_UINT16: LOAD_LOOP(uint16_t); break;
    case IV_DT_UINT32: LOAD_LOOP(uint32_t); break;
    case IV_DT_UINT64: LOAD_LOOP(uint64_t); break;
    case IV_DT_FLOAT32: LOAD_LOOP(float); break;
    case IV_DT_FLOAT64: LOAD_LOOP(double); break;
    default: break;
    }
    return n;
}

/* Ranks over the universe: every label's rank sum, and the tie term
 * sum(t^3 - t). */
static double walk_all(iv_de_work_t *w, int64_t n)
{
    const iv_de_spec_t *s = &w->de->s;
    double pos = 0, tie = 0;
    int zero_done = 0;
    int64_t i = 0;
    for (;;) {
        if (!zero_done && (i == n || w->key[i] >= ZERO_KEY)) {
            while (i < n && w->key[i] == ZERO_KEY) i++;
            double t0 = 0;
            for (int32_t l = 0; l < s->n_labels; l++) t0 += (double)(s->n_cells[l] - w->nz[l]);
            if (t0 > 0) {
                double avg = pos + 0.5 * (t0 + 1);
                for (int32_t l = 0; l < s->n_labels; l++) w->rs[l] += (double)(s->n_cells[l] - w->nz[l]) * avg;
                tie += t0 * t0 * t0 - t0;
                pos += t0;
            }
            zero_done = 1;
        }
        if (i >= n) break;
        int64_t j = i + 1;
        while (j < n && w->key[j] == w->key[i]) j++;
        double t = (double)(j - i), avg = pos + 0.5 * (t + 1);
        for (int64_t k = i; k < j; k++) w->rs[w->lab[k]] += avg;
        if (j - i > 1) tie += t * t * t - t;
        pos += t;
        i = j;
    }
    return tie;
}

/* Ranks among labels a and b only: a's rank sum, and the tie term. */
static double walk_pair(const iv_de_work_t *w, int64_t n, int32_t a, int32_t b, double *ra)
{
    const iv_de_spec_t *s = &w->de->s;
    double pos = 0, tie = 0, r = 0;
    int zero_done = 0;
    int64_t i = 0;
    double za = (double)(s->n_cells[a] - w->nz[a]), zb = (double)(s->n_cells[b] - w->nz[b]);
    for (;;) {
        if (!zero_done && (i == n || w->key[i] >= ZERO_KEY)) {
            while (i < n && w->key[i] == ZERO_KEY) i++;
            double t0 = za + zb;
            if (t0 > 0) {
                r += za * (pos + 0.5 * (t0 + 1));
                tie += t0 * t0 * t0 - t0;
                pos += t0;
            }
            zero_done = 1;
        }
        if (i >= n) break;
        int64_t j = i, ca = 0, cb = 0;
        for (; j < n && w->key[j] == w->key[i]; j++) {
            ca += w->lab[j] == a;
            cb += w->lab[j] == b;
        }
        double t = (double)(ca + cb);
        if (t > 0) {
            r += (double)ca * (pos + 0.5 * (t + 1));
            tie += t * t * t - t;
            pos += t;
        }
        i = j;
    }
    *ra = r;
    return tie;
}

/* Empties the table for the next gene (only the slots used). */
static void hash_clear(iv_de_work_t *w)
{
    const size_t nl = (size_t)w->de->s.n_labels;
    for (int32_t i = 0; i < w->hn; i++) {
        int32_t h = w->hused[i];
        w->hk[h] = 0;
        memset(w->hc + (size_t)h * nl, 0, nl * sizeof *w->hc);
    }
    w->hn = 0;
}

/* walk_all over the distinct values' counts. */
static double walk_all_h(iv_de_work_t *w, int32_t nd)
{
    const iv_de_spec_t *s = &w->de->s;
    const size_t nl = (size_t)s->n_labels;
    double pos = 0, tie = 0;
    int zero_done = 0;
    for (int32_t i = 0;; i++) {
        if (!zero_done && (i == nd || w->dkey[i] >= ZERO_KEY)) {
            double t0 = 0;
            for (size_t l = 0; l < nl; l++) t0 += (double)(s->n_cells[l] - w->nz[l]);
            if (t0 > 0) {
                double avg = pos + 0.5 * (t0 + 1);
                for (size_t l = 0; l < nl; l++) w->rs[l] += (double)(s->n_cells[l] - w->nz[l]) * avg;
                tie += t0 * t0 * t0 - t0;
                pos += t0;
            }
            zero_done = 1;
        }
        if (i >= nd) break;
        if (w->dkey[i] == ZERO_KEY) continue;  /* stored zeros: in the zero block */
        const int64_t *c = w->hc + (size_t)w->dslot[i] * nl;
        double t = 0;
        for (size_t l = 0; l < nl; l++) t += (double)c[l];
        double avg = pos + 0.5 * (t + 1);
        for (size_t l = 0; l < nl; l++) w->rs[l] += (double)c[l] * avg;
        if (t > 1) tie += t * t * t - t;
        pos += t;
    }
    return tie;
}

/* walk_pair over the distinct values' counts. */
static double walk_pair_h(const iv_de_work_t *w, int32_t nd, int32_t a, int32_t b, double *ra)
{
    const iv_de_spec_t *s = &w->de->s;
    const size_t nl = (size_t)s->n_labels;
    double pos = 0, tie = 0, r = 0;
    int zero_done = 0;
    double za = (double)(s->n_cells[a] - w->nz[a]), zb = (double)(s->n_cells[b] - w->nz[b]);
    for (int32_t i = 0;; i++) {
        if (!zero_done && (i == nd || w->dkey[i] >= ZERO_KEY)) {
            double t0 = za + zb;
            if (t0 > 0) {
                r += za * (pos + 0.5 * (t0 + 1));
                tie += t0 * t0 * t0 - t0;
                pos += t0;
            }
            zero_done = 1;
        }
        if (i >= nd) break;
        if (w->dkey[i] == ZERO_KEY) continue;
        const int64_t *c = w->hc + (size_t)w->dslot[i] * nl;
        double ca = (double)c[a], t = ca + (double)c[b];
        if (t > 0) {
            r += ca * (pos + 0.5 * (t + 1));
            tie += t * t * t - t;
            pos += t;
        }
    }
    *ra = r;
    return tie;
}

/* Counts the gene's entries straight from the block into the table, per
 * distinct value and label, and sorts the distinct values: the number of
 * them, or -1 (the table emptied) past HASH_DISTINCT or on a key the
 * table cannot hold. */
#define HASH_LOOP(T)                                                                          \
    do {                                                                                      \
        const T *dv = data;                                                                   \
        for (int64_t k = 0; k < nnz; k++) {                                                   \
            int32_t l = entry_label(s, l8, indices, index_size, k);                           \
            if (l < 0) continue;                                                              \
            uint64_t key = okey(entry_value(s, w, (double)dv[k]));                            \
            if (key == 0) goto fail;                                                          \
            uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 54);                     \
            while (w->hk[h] != 0 && w->hk[h] != key) h = (h + 1) & (HASH_SLOTS - 1);          \
            if (w->hk[h] == 0) {                                                              \
                if (nd == HASH_DISTINCT) goto fail;                                           \
                w->hk[h] = key;                                                               \
                w->hused[nd++] = (int32_t)h;                                                  \
                w->hn = nd;                                                                   \
            }                                                                                 \
            w->hc[(size_t)h * nl + (size_t)l]++;                                              \
        }                                                                                     \
    } while (0)

static int32_t hash_direct(iv_de_work_t *w, int64_t nnz, const void *indices, int index_size, const void *data,
                           iv_dtype_t dtype)
{
    const iv_de_spec_t *s = &w->de->s;
    const int8_t *l8 = w->de->label8;
    const size_t nl = (size_t)s->n_labels;
    int32_t nd = 0;
    w->hn = 0;
    switch (dtype) {
    case IV_DT_INT8: HASH_LOOP(int8_t); break;
    case IV_DT_INT16: HASH_LOOP(int16_t); break;
    case IV_DT_INT32: HASH_LOOP(int32_t); break;
    case IV_DT_INT64: HASH_LOOP(int64_t); break;
    case IV_DT_UINT8: HASH_LOOP(uint8_t); break;
    case IV_DT_UINT16: HASH_LOOP(uint16_t); break;
    case IV_DT_UINT32: HASH_LOOP(uint32_t); break;
    case IV_DT_UINT64: HASH_LOOP(uint64_t); break;
    case IV_DT_FLOAT32: HASH_LOOP(float); break;
    case IV_DT_FLOAT64: HASH_LOOP(double); break;
    default: goto fail;
    }
    for (int32_t i = 0; i < nd; i++) {
        w->dkey[i] = w->hk[w->hused[i]];
        w->dslot[i] = w->hused[i];
    }
    afsort(w->dkey, w->dslot, nd, 56);
    return nd;
fail:
    hash_clear(w);
    return -1;
}

/* Per label: stored and non-zero counts, sums, least and greatest value,
 * mean and squared deviations of the stored entries, from the table. */
static void moments_from_table(iv_de_work_t *w, int32_t nd)
{
    const iv_de_spec_t *s = &w->de->s;
    const size_t nl = (size_t)s->n_labels;
    for (int32_t i = 0; i < nd; i++) {  /* ascending values */
        double v = kval(w->dkey[i]);
        const int64_t *c = w->hc + (size_t)w->dslot[i] * nl;
        for (size_t l = 0; l < nl; l++) {
            if (!c[l]) continue;
            if (w->st[l] == 0) w->mn[l] = v;
            w->mx[l] = v;
            w->st[l] += c[l];
            if (v != 0) {
                w->nz[l] += c[l];
                w->s1[l] += (double)c[l] * v;
            }
        }
    }
    for (size_t l = 0; l < nl; l++) w->mean[l] = s->n_cells[l] > 0 ? w->s1[l] / (double)s->n_cells[l] : 0;
    for (int32_t i = 0; i < nd; i++) {
        double v = kval(w->dkey[i]);
        const int64_t *c = w->hc + (size_t)w->dslot[i] * nl;
        for (size_t l = 0; l < nl; l++)
            if (c[l]) {
                double d = v - w->mean[l];
                w->m2[l] += (double)c[l] * d * d;
            }
    }
}

static void welch(iv_de_row_t *o, double n1, double m1, double q1, double n2, double m2, double q2)
{
    double v1 = q1 / (n1 - 1), v2 = q2 / (n2 - 1);
    double vn1 = v1 / n1, vn2 = v2 / n2, se2 = vn1 + vn2;
    double df = se2 * se2 / (vn1 * vn1 / (n1 - 1) + vn2 * vn2 / (n2 - 1));
    if (isnan(df)) df = 1;  /* scipy's choice where both variances are 0 */
    double t = (m1 - m2) / sqrt(se2);
    if (isnan(t)) {
        o->score = 0;
        o->pval = 1;
        return;
    }
    o->score = t;
    o->pval = isinf(t) ? 0.0 : iv_de_t_p2(t, df);
}

static void ranksum(iv_de_row_t *o, double n1, double n2, double r1, double tie)
{
    double n = n1 + n2;
    double s2 = n1 * n2 / 12.0 * ((n + 1) - tie / (n * (n - 1)));
    if (n1 < 1 || n2 < 1 || !(s2 > 0)) {
        o->score = 0;
        o->pval = 1;
        return;
    }
    double u1 = r1 - n1 * (n1 + 1) / 2.0;
    double z = (u1 - n1 * n2 / 2.0) / sqrt(s2);
    o->score = z;
    o->pval = iv_de_norm_p2(z);
}

/* One side of a comparison: its cells, mean, squared deviations and
 * non-zero entries. */
typedef struct de_side {
    double n, mean, m2, nz;
} de_side_t;

/* Second pass over loaded entries: per label squared deviations from the
 * mean, the implicit zeros left to settle_moments. */
static void m2_from_entries(iv_de_work_t *w, int64_t n)
{
    const size_t nl = (size_t)w->de->s.n_labels;
    if (nl <= 16) {
        /* Four interleaved accumulators: one running sum per label would
         * chain every entry of that label through a store and a load. */
        double acc[4][16];
        memset(acc, 0, sizeof acc);
        int64_t k = 0;
        for (; k + 4 <= n; k += 4)
            for (int u = 0; u < 4; u++) {
                double d = kval(w->key[k + u]) - w->mean[w->lab[k + u]];
                acc[u][w->lab[k + u]] += d * d;
            }
        for (; k < n; k++) {
            double d = kval(w->key[k]) - w->mean[w->lab[k]];
            acc[0][w->lab[k]] += d * d;
        }
        for (size_t l = 0; l < nl; l++) w->m2[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    } else {
        for (int64_t k = 0; k < n; k++) {
            double d = kval(w->key[k]) - w->mean[w->lab[k]];
            w->m2[w->lab[k]] += d * d;
        }
    }
}

/* Adds the implicit zeros to each label's squared deviations and range. */
static void settle_moments(iv_de_work_t *w)
{
    const iv_de_spec_t *s = &w->de->s;
    for (size_t l = 0; l < (size_t)s->n_labels; l++) {
        w->m2[l] += (double)(s->n_cells[l] - w->st[l]) * w->mean[l] * w->mean[l];
        /* A group whose cells all hold one value has that mean and no
         * variance exactly: a sum rounded to an ulp would otherwise give
         * a variance of 1e-32 and a t of any size. */
        if (w->st[l] < s->n_cells[l]) {
            if (w->st[l] > 0 && w->mn[l] > 0) w->mn[l] = 0;
            if (w->st[l] > 0 && w->mx[l] < 0) w->mx[l] = 0;
            if (w->st[l] == 0) w->mn[l] = w->mx[l] = 0;
        }
        if (s->n_cells[l] > 0 && w->mn[l] == w->mx[l]) {
            w->mean[l] = w->mn[l];
            w->m2[l] = 0;
        }
    }
}

/* Label l's side of a comparison. */
static de_side_t label_side(const iv_de_work_t *w, int32_t l)
{
    de_side_t o = {(double)w->de->s.n_cells[l], w->mean[l], w->m2[l], (double)w->nz[l]};
    return o;
}

/* Every label but g merged (Chan et al.): the "rest" side. */
static de_side_t rest_side(const iv_de_work_t *w, int32_t g)
{
    const iv_de_spec_t *s = &w->de->s;
    de_side_t o = {0, 0, 0, 0};
    double sum = 0, lo = INFINITY, hi = -INFINITY;
    for (int32_t l = 0; l < s->n_labels; l++)
        if (l != g && s->n_cells[l] > 0) {
            o.n += (double)s->n_cells[l];
            sum += w->s1[l];
            o.nz += (double)w->nz[l];
            if (w->mn[l] < lo) lo = w->mn[l];
            if (w->mx[l] > hi) hi = w->mx[l];
        }
    o.mean = o.n > 0 ? sum / o.n : 0;
    for (int32_t l = 0; l < s->n_labels; l++)
        if (l != g && s->n_cells[l] > 0) {
            double d = w->mean[l] - o.mean;
            o.m2 += w->m2[l] + (double)s->n_cells[l] * d * d;
        }
    if (o.n > 0 && lo == hi) {
        o.mean = lo;  /* the rest is constant (see settle_moments) */
        o.m2 = 0;
    }
    return o;
}

/* Group g of gene j against its reference or the rest: one result row.
 * nd >= 0 when the gene was counted in the table, else its n entries are
 * loaded and sorted. */
static void test_group(iv_de_t *de, iv_de_work_t *w, int64_t j, int32_t g, int32_t nd, int64_t n,
                       double tie_all)
{
    const iv_de_spec_t *s = &de->s;
    iv_de_row_t *o = &de->rows[(size_t)g * (size_t)s->n_genes + (size_t)j];
    de_side_t a = label_side(w, g);
    de_side_t b = s->reference >= 0 ? label_side(w, s->reference) : rest_side(w, g);
    o->mean1 = a.mean;
    o->mean2 = b.mean;
    o->frac1 = a.n > 0 ? a.nz / a.n : 0;
    o->frac2 = b.n > 0 ? b.nz / b.n : 0;
    o->lfc = log2((expm1(a.mean) + 1e-9) / (expm1(b.mean) + 1e-9));
    if (s->method == IV_DE_TTEST) {
        welch(o, a.n, a.mean, a.m2, b.n, b.mean, b.m2);
    } else if (s->reference < 0) {
        ranksum(o, a.n, b.n, w->rs[g], tie_all);
    } else {
        double r1 = 0;
        double tie = nd >= 0 ? walk_pair_h(w, nd, g, s->reference, &r1) : walk_pair(w, n, g, s->reference, &r1);
        ranksum(o, a.n, b.n, r1, tie);
    }
}

/* Loads the gene's n entries into the work's scratch and takes each
 * label's mean and squared deviations from them: 0, IV_DE_NEED_SCRATCH
 * (gated work too small) or IV_ENOMEM. */
static int moments_from_entries(iv_de_work_t *w, int64_t nnz, const void *indices, int index_size,
                                const void *data, iv_dtype_t dtype, int64_t *n)
{
    const iv_de_spec_t *s = &w->de->s;
    if (w->gated && nnz > w->cap) return IV_DE_NEED_SCRATCH;
    if (iv_de_work_reserve(w, nnz) != 0) return IV_ENOMEM;
    *n = load(w, nnz, indices, index_size, data, dtype);
    for (size_t l = 0; l < (size_t)s->n_labels; l++)
        w->mean[l] = s->n_cells[l] > 0 ? w->s1[l] / (double)s->n_cells[l] : 0;
    m2_from_entries(w, *n);
    return 0;
}

/* For the rank-sum test: sorts loaded entries, and against the rest
 * walks the universe once for every label's rank sum; the tie term. */
static double rank_all(iv_de_work_t *w, int32_t nd, int64_t n)
{
    const iv_de_spec_t *s = &w->de->s;
    if (s->method != IV_DE_WILCOXON) return 0;
    if (nd < 0) afsort(w->key, w->lab, n, 56);
    if (s->reference >= 0) return 0;
    return nd >= 0 ? walk_all_h(w, nd) : walk_all(w, n);
}

int iv_de_gene(iv_de_t *de, iv_de_work_t *w, int64_t j, int64_t nnz, const void *indices, int index_size,
               const void *data, iv_dtype_t dtype)
{
    const iv_de_spec_t *s = &de->s;
    if (j < 0 || j >= s->n_genes) return IV_EINVALID_ARG;
    size_t nl = (size_t)s->n_labels;
    memset(w->st, 0, nl * sizeof *w->st);
    memset(w->nz, 0, nl * sizeof *w->nz);
    memset(w->s1, 0, nl * sizeof *w->s1);
    memset(w->m2, 0, nl * sizeof *w->m2);
    memset(w->rs, 0, nl * sizeof *w->rs);
    /* Few distinct values (counts): everything from the table, straight
     * from the block.  Otherwise the entries are loaded, and sorted for
     * the rank-sum test. */
    int32_t nd = w->hk ? hash_direct(w, nnz, indices, index_size, data, dtype) : -1;
    int64_t n = 0;
    if (nd >= 0) {
        moments_from_table(w, nd);
    } else {
        int rc = moments_from_entries(w, nnz, indices, index_size, data, dtype, &n);
        if (rc != 0) return rc;
    }
    settle_moments(w);
    double tie_all = rank_all(w, nd, n);
    for (int32_t g = 0; g < s->n_tested; g++) test_group(de, w, j, g, nd, n, tie_all);
    if (nd >= 0) hash_clear(w);
    return 0;
}

int iv_de_finish(iv_de_t *de, iv_err_t *err)
{
    const iv_de_spec_t *s = &de->s;
    if (s->n_genes == 0) return 0;
    double *p = malloc((size_t)s->n_genes * sizeof *p);
    if (!p) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int32_t g = 0; g < s->n_tested; g++) {
        iv_de_row_t *rows = de->rows + (size_t)g * (size_t)s->n_genes;
        for (int64_t j = 0; j < s->n_genes; j++) p[j] = rows[j].pval;
        if (iv_de_bh(p, s->n_genes, p) != 0) {
            free(p);
            return iv_fail(err, IV_ENOMEM, "out of memory");
        }
        for (int64_t j = 0; j < s->n_genes; j++) rows[j].pval_adj = p[j];
    }
    free(p);
    return 0;
}

const iv_de_row_t *iv_de_row(const iv_de_t *de, int32_t g, int64_t j)
{
    return &de->rows[(size_t)g * (size_t)de->s.n_genes + (size_t)j];
}
