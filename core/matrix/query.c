/*
 * Selective decode (see query.h).
 *
 * Data path: a block of output rows is decoded by one thread with its own
 * cursor.  For every major slice it needs, the cursor seeks the nearest
 * row-index checkpoint (or simply continues when slices are consecutive),
 * decodes the slice's value groups, maps every minor index through the
 * selection's lookup table (identity when all are selected; a gene listed
 * twice maps to two output columns) and collects (column, group) pairs.
 * Pairs are put in column order either by a bitmap over the output
 * columns (dense slices) or by sorting (sparse ones); a column seen twice
 * means the file is corrupt.  Values are copied from `values` by group.
 *
 * IVCSC delivered as cell rows is a transpose: prepare() decodes the
 * selected gene columns twice (count, then fill) in column order, so each
 * cell row receives its columns already sorted; memory is the output plus
 * one count array per participating thread.
 */
#include "query.h"

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

/*
 * The dense decode loop and its emitters are compiled twice, for the
 * build's target and for x86-64-v3 (BMI2's shifts, AVX2), and the loader
 * picks one for the CPU (an ifunc): 13% faster full decodes on a v3 CPU,
 * and the same binary still runs on older ones.  Not under
 * ThreadSanitizer: the loader runs the ifunc resolvers before the
 * sanitizer's runtime is up, and its instrumented resolvers crash.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__)
#define IV_HOT_CLONES __attribute__((target_clones("default", "arch=x86-64-v3")))
#else
#define IV_HOT_CLONES
#endif

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cursor.h"
#include "dataset_impl.h"
#include "plainfile.h"
#include "widepick.h"

#define DEFAULT_BLOCK_NNZ ((int64_t)1 << 18)
#define DEFAULT_BLOCK_ROWS ((int64_t)1 << 16)

enum mode { MODE_MAJOR, MODE_TRANSPOSE };

/* Varints the vector kernel decodes a call (iv_varint_pick_avx512).  A
 * call costs about 25-40 ns of its own (its last block, its loops' exits);
 * at 512 the atlas's largest value group (435 of a cell's 725) is one
 * call: bench_varint_pick 1.23-1.25 -> 1.20-1.21 ns a varint against 256,
 * bench_select 10k x 2,000 one thread 14.7-15.0 -> 14.5-14.7 ms (2 cores). */
enum { PICK_BATCH = 512 };

/* Per-thread working memory of one decode call. */
struct work {
    struct work *next_free;
    iv_cursor_t cur;
    int64_t next_slice;       /* slice whose first varint is at the cursor, or -1 */
    int64_t *pos;             /* pair: output position */
    int64_t *gid;             /* pair: value group */
    int64_t pairs_cap;
    uint64_t *bits;           /* bitmap over output columns (lazily allocated) */
    int64_t *gid_at;
    uint8_t *tag;             /* dense path: group of each column, relative to the slice */
    uint64_t *summ;           /* dense path: one bit per nonzero word of bits */
    uint64_t vals[256];       /* dense path: the slice's values (DENSE_MAX_GROUPS) */
    int64_t n_words;
    struct scratch *scratch;  /* bits, summ and tag, when they came from the kept scratch */
    uint32_t picked[PICK_BATCH + 16];  /* the vector kernel's kept indices (decode_slice) */
};

static void work_free(struct work *w);

struct iv_query {
    iv_dataset_t *ds;         /* the orientation serving the query */
    iv_stream_t *stream;      /* the stream it reads: ds's own or its plain copy */
    iv_stream_t *wide;        /* ds's wide copy (widefile.h), or NULL: decode_slice_wide */
    enum mode mode;
    int by_var;               /* output rows are genes */
    int64_t n_out_rows, n_out_cols;
    int64_t *row_ids;         /* n_out_rows original indices (NULL: identity) */
    int64_t *col_ids;         /* n_out_cols original indices (NULL: identity) */
    /* Minor lookup: minor j -> output positions lut_pos[lut_ptr[j] .. lut_ptr[j+1]). */
    int minor_all;
    int64_t *lut_ptr, *lut_pos;
    /* One bit per minor element, set when it is selected (NULL when the
     * axis is too long for a bitmap to pay): the decoders test it before
     * touching either table. */
    uint64_t *sel_bits;
    /* Sparse form, when the minor axis is much longer than the selection:
     * sorted (minor id, position) pairs searched by binary search. */
    int lut_sparse;
    int64_t *lut_keys;        /* n_sel sorted minor ids */
    /* Strictly ascending selections (filters, masks): a minor's position is
     * its rank among the selected, set bits before it in sel_bits, from
     * the count before each word (n_minor / 64 + 1) and a popcount. */
    int64_t *lut_rank;
    int64_t n_lut;
    /* decode_slice decodes with the AVX-512 kernel (query_alloc). */
    int pick;
    int64_t n_blocks;
    int64_t *block_start;     /* n_blocks + 1 output-row boundaries */
    int64_t block_nnz, block_rows;
    int index_size;
    iv_dtype_t dtype;
    int64_t nnz_hint;
    atomic_int cancelled;
    atomic_uint_fast64_t decompressed;
    /* Recycled per-thread working memory (struct work), so that decoding
     * many small blocks does not allocate bitmaps and pair arrays each time. */
    pthread_mutex_t work_mu;
    struct work *free_work;
    /* Minor selections with duplicates (MODE_MAJOR): the most times one
     * minor element is listed, which bounds an output row at its slice's
     * entries times that, so that blocks stay near block_nnz however a
     * small body repeats a gene. */
    int64_t max_mult;
    int64_t work_bytes;       /* the most memory prepare may hold; 0 = no bound */
    /*
     * MODE_TRANSPOSE.  The transpose is built once over the distinct
     * elements of each axis, never over the duplicates a request lists:
     * its rows are "slots", one per distinct output row (row_slot[r] for
     * output row r; NULL when the rows are distinct, slot = r), its
     * columns the distinct major slices in the order they are first
     * listed (t_cols; col_kptr/col_k the output columns each one fills,
     * ascending; NULL when the columns are distinct, column = position).
     * Duplicates are expanded as each block is copied out.
     */
    int64_t n_slots;
    int64_t *row_slot;
    int64_t n_t_cols;
    int64_t *t_cols;          /* owned when col_kptr, else col_ids */
    int64_t *col_kptr, *col_k;
    int64_t *t_exp;           /* n_slots + 1 prefix of expanded row sizes (col_kptr only) */
    int prepared;
    int64_t *t_indptr;        /* n_slots + 1 */
    void *t_indices;
    void *t_data;
};

/* ---- selections and lookup tables ---- */

static int copy_sel(const iv_sel_t *sel, int64_t axis_len, const char *axis, int64_t **out,
                    int64_t *n_out, iv_err_t *err)
{
    *out = NULL;
    if (!sel || sel->all) {
        *n_out = axis_len;
        return 0;
    }
    if (sel->n < 0) return iv_fail(err, IV_EBAD_SELECTION, "%s selection has negative length", axis);
    for (int64_t i = 0; i < sel->n; i++)
        if (sel->idx[i] < 0 || sel->idx[i] >= axis_len)
            return iv_fail(err, IV_EOUT_OF_RANGE,
                           "%s index %" PRId64 " at position %" PRId64 " is out of range [0, %" PRId64 ")",
                           axis, sel->idx[i], i, axis_len);
    *out = malloc((size_t)(sel->n ? sel->n : 1) * sizeof(int64_t));
    if (!*out) return iv_fail(err, IV_ENOMEM, "out of memory for the %s selection", axis);
    memcpy(*out, sel->idx, (size_t)sel->n * sizeof(int64_t));
    *n_out = sel->n;
    return 0;
}

static int pair_cmp(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* True when v[0..n) never falls (strict: always rises). */
static int ascending(const int64_t *v, int64_t n, int strict)
{
    for (int64_t k = 1; k < n; k++)
        if (strict ? v[k - 1] >= v[k] : v[k - 1] > v[k]) return 0;
    return 1;
}

/* The (id, position) pairs of ids[0..n), sorted by id then position;
 * NULL when out of memory.  Owned by the caller. */
static int64_t *sorted_pairs(const int64_t *ids, int64_t n)
{
    int64_t *pairs = malloc((size_t)(n ? n : 1) * 2 * sizeof(int64_t));
    if (!pairs) return NULL;
    for (int64_t k = 0; k < n; k++) {
        pairs[2 * k] = ids[k];
        pairs[2 * k + 1] = k;
    }
    qsort(pairs, (size_t)n, 2 * sizeof(int64_t), pair_cmp);
    return pairs;
}

/* The distinct ids among n sorted pairs, and the longest run of one id. */
static void count_runs(const int64_t *pairs, int64_t n, int64_t *n_uniq, int64_t *most)
{
    int64_t nu = 0, run = 0;
    *most = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * (i - 1)]) {
            nu++;
            run = 0;
        }
        if (++run > *most) *most = run;
    }
    *n_uniq = nu;
}

/* What sel_dups returns when some id repeats: walks the sorted pairs once
 * for the distinct ids (u), each position's rank (rk) and where its id
 * is first listed (fi); a NULL array is not filled. */
static void fill_dups(const int64_t *pairs, int64_t n, int64_t *u, int64_t *rk, int64_t *fi)
{
    int64_t r = -1, at = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = pairs[2 * i], k = pairs[2 * i + 1];
        if (i == 0 || id != pairs[2 * (i - 1)]) {
            r++;
            at = k;   /* pairs of one id are in ascending position */
            if (u) u[r] = id;
        }
        if (rk) rk[k] = r;
        if (fi) fi[k] = at;
    }
}

/* sel_dups' arrays for n sorted pairs of nu distinct ids: the distinct
 * ids and ranks when rank_of is not NULL, first positions when first is. */
static int dup_tables(const int64_t *pairs, int64_t n, int64_t nu, int64_t **uniq,
                      int64_t **rank_of, int64_t **first, iv_err_t *err)
{
    int64_t *u = rank_of ? malloc((size_t)nu * sizeof *u) : NULL;
    int64_t *rk = rank_of ? malloc((size_t)n * sizeof *rk) : NULL;
    int64_t *fi = first ? malloc((size_t)n * sizeof *fi) : NULL;
    if ((rank_of && (!u || !rk)) || (first && !fi)) {
        free(u);
        free(rk);
        free(fi);
        return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    }
    fill_dups(pairs, n, u, rk, fi);
    if (rank_of) {
        *uniq = u;
        *rank_of = rk;
    }
    if (first) *first = fi;
    return 0;
}

/*
 * Duplicates of a selection, from its (id, position) pairs sorted once.
 * *max_mult: the most times one id is listed.  When rank_of is not NULL
 * and some id repeats: *uniq the distinct ids ascending (n_uniq of them)
 * and rank_of[k] the rank of ids[k] among them.  When first is not NULL
 * and some id repeats: first[k] the position where ids[k] is first listed.
 * Arrays it returns are owned by the caller; none when nothing repeats.
 */
static int sel_dups(const int64_t *ids, int64_t n, int64_t *max_mult, int64_t **uniq,
                    int64_t *n_uniq, int64_t **rank_of, int64_t **first, iv_err_t *err)
{
    *max_mult = n > 0 ? 1 : 0;
    if (uniq) *uniq = NULL;
    if (rank_of) *rank_of = NULL;
    if (first) *first = NULL;
    if (n_uniq) *n_uniq = n;
    if (!ids || n < 2 || ascending(ids, n, 1)) return 0;
    int64_t *pairs = sorted_pairs(ids, n);
    if (!pairs) return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    int64_t nu;
    count_runs(pairs, n, &nu, max_mult);
    if (n_uniq) *n_uniq = nu;
    int rc = 0;
    if (*max_mult > 1 && (rank_of || first)) rc = dup_tables(pairs, n, nu, uniq, rank_of, first, err);
    free(pairs);
    return rc;
}

/* Dense bitmap of the selected minor elements, and their ranks when the
 * selection strictly rises.  Returns 1 when the rank table serves as the
 * lookup, 0 when another table is still needed, or a negative error. */
static int build_rank_lut(struct iv_query *q, const int64_t *ids, int64_t n_sel, int64_t n_minor,
                          iv_err_t *err)
{
    q->sel_bits = calloc((size_t)(n_minor / 64 + 1), sizeof *q->sel_bits);
    if (!q->sel_bits) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    for (int64_t k = 0; k < n_sel; k++) q->sel_bits[ids[k] >> 6] |= (uint64_t)1 << (ids[k] & 63);
    if (!ascending(ids, n_sel, 1)) return 0;
    /* A table of 1/64th of the axis instead of two of it whole:
     * a 138,000-cell filter over 1.26 M cells built 20 MB of them. */
    size_t nw = (size_t)(n_minor / 64 + 1);
    q->lut_rank = malloc(nw * sizeof *q->lut_rank);
    if (!q->lut_rank) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    int64_t r = 0;
    for (size_t x = 0; x < nw; x++) {
        q->lut_rank[x] = r;
        r += __builtin_popcountll(q->sel_bits[x]);
    }
    return 1;
}

/* Sorted (minor id, position) keys, searched by binary search. */
static int build_sorted_lut(struct iv_query *q, const int64_t *ids, int64_t n_sel, iv_err_t *err)
{
    q->lut_keys = malloc((size_t)(n_sel ? n_sel : 1) * sizeof(int64_t));
    q->lut_pos = malloc((size_t)(n_sel ? n_sel : 1) * sizeof(int64_t));
    if (!q->lut_keys || !q->lut_pos) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    q->lut_sparse = 1;
    q->n_lut = n_sel;
    /* Selections from filters and masks come ascending: no sort. */
    if (ascending(ids, n_sel, 0)) {
        memcpy(q->lut_keys, ids, (size_t)n_sel * sizeof(int64_t));
        for (int64_t k = 0; k < n_sel; k++) q->lut_pos[k] = k;
        return 0;
    }
    int64_t *pairs = sorted_pairs(ids, n_sel);
    if (!pairs) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    for (int64_t k = 0; k < n_sel; k++) {
        q->lut_keys[k] = pairs[2 * k];
        q->lut_pos[k] = pairs[2 * k + 1];
    }
    free(pairs);
    return 0;
}

/* Per-minor ranges of output positions (lut_ptr, lut_pos). */
static int build_dense_lut(struct iv_query *q, const int64_t *ids, int64_t n_sel, int64_t n_minor,
                           iv_err_t *err)
{
    q->lut_ptr = calloc((size_t)n_minor + 1, sizeof(int64_t));
    q->lut_pos = malloc((size_t)(n_sel ? n_sel : 1) * sizeof(int64_t));
    if (!q->lut_ptr || !q->lut_pos) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    for (int64_t k = 0; k < n_sel; k++) q->lut_ptr[ids[k] + 1]++;
    for (int64_t j = 0; j < n_minor; j++) q->lut_ptr[j + 1] += q->lut_ptr[j];
    /* Fill in increasing k so each minor's positions are ascending. */
    int64_t *fill = malloc((size_t)(n_minor ? n_minor : 1) * sizeof(int64_t));
    if (!fill) return iv_fail(err, IV_ENOMEM, "out of memory for the lookup table");
    memcpy(fill, q->lut_ptr, (size_t)n_minor * sizeof(int64_t));
    for (int64_t k = 0; k < n_sel; k++) q->lut_pos[fill[ids[k]]++] = k;
    free(fill);
    return 0;
}

/*
 * The minor lookup table: dense (O(n_minor) to build, one load per entry)
 * or sorted (O(n_sel log n_sel), a binary search per entry).  Sorted is
 * chosen when the minor axis dwarfs the selection, or when the query
 * decodes too few entries (`decoded`, from the pointers) to pay for a
 * dense table: a one-cell, 50-gene query on 33,000 genes would otherwise
 * spend most of its time zeroing and filling a 264 KB table.
 */
static int build_lut(struct iv_query *q, const int64_t *ids, int64_t n_sel, int64_t n_minor,
                     int64_t decoded, iv_err_t *err)
{
    if (n_minor <= ((int64_t)1 << 26) && decoded >= n_minor / 64) {
        int rc = build_rank_lut(q, ids, n_sel, n_minor, err);
        if (rc != 0) return rc < 0 ? rc : 0;
    }
    if (n_minor > 4 * n_sel + (1 << 20) || decoded < n_minor / 4)
        return build_sorted_lut(q, ids, n_sel, err);
    return build_dense_lut(q, ids, n_sel, n_minor, err);
}

static int64_t slice_nnz(const iv_dataset_t *ds, int64_t s)
{
    const int64_t *at = atomic_load_explicit(&ds->nnz_at, memory_order_acquire);
    if (at) return at[s + 1] - at[s];
    return ds->m.value_ptr[ds->m.major_ptr[s + 1]] - ds->m.value_ptr[ds->m.major_ptr[s]];
}

/* Below this many slices the pointers stay in cache: no table. */
static _Atomic int64_t nnz_at_min_slices = (int64_t)1 << 16;

void iv_query_set_nnz_table_min(int64_t slices) { atomic_store(&nnz_at_min_slices, slices); }

/*
 * Makes ds->nnz_at if it is missing and the matrix is large (see
 * dataset_impl.h).  Any thread: two racing queries each build one and the
 * loser frees its own.  Out of memory leaves it missing (planning then
 * reads the pointers).
 */
static void ensure_nnz_at(iv_dataset_t *ds)
{
    if (!ds || ds->m.n_major < atomic_load(&nnz_at_min_slices) ||
        atomic_load_explicit(&ds->nnz_at, memory_order_acquire))
        return;
    int64_t S = ds->m.n_major;
    int64_t *at = malloc((size_t)(S + 1) * sizeof *at);
    if (!at) return;
    for (int64_t s = 0; s <= S; s++) at[s] = ds->m.value_ptr[ds->m.major_ptr[s]];
    int64_t *none = NULL;
    if (!atomic_compare_exchange_strong_explicit(&ds->nnz_at, &none, at, memory_order_acq_rel,
                                                 memory_order_acquire))
        free(at);
}

/* The output entries of row r: exact once a transpose is prepared; for a
 * direct decode a bound, its slice's entries (times the most times a
 * listed minor element repeats, never past the output's columns). */
/* The most output entries a row of `total` stored entries can have: each
 * as many times as the selection repeats a column, never past them all. */
static int64_t row_out_bound(const struct iv_query *q, int64_t total)
{
    if (q->max_mult <= 1) return total;
    return total > q->n_out_cols / q->max_mult ? q->n_out_cols : total * q->max_mult;
}

static int64_t out_row_size(const struct iv_query *q, int64_t r)
{
    if (q->mode == MODE_TRANSPOSE) {
        int64_t s = q->row_slot ? q->row_slot[r] : r;
        return q->t_exp ? q->t_exp[s + 1] - q->t_exp[s] : q->t_indptr[s + 1] - q->t_indptr[s];
    }
    return row_out_bound(q, slice_nnz(q->ds, q->row_ids ? q->row_ids[r] : r));
}

/* Appends row r to the block starts bs[0..*n) (capacity *cap, grown by
 * doubling); on failure frees bs. */
static int push_start(int64_t **bs, int64_t *n, int64_t *cap, int64_t r, iv_err_t *err)
{
    if (*n == *cap) {
        int64_t *nb = realloc(*bs, (size_t)(*cap *= 2) * sizeof **bs);
        if (!nb) {
            free(*bs);
            return iv_fail(err, IV_ENOMEM, "out of memory planning blocks");
        }
        *bs = nb;
    }
    (*bs)[(*n)++] = r;
    return 0;
}

/* Splits output rows into blocks of bounded (estimated) nnz and rows. */
static int plan_blocks(struct iv_query *q, iv_err_t *err)
{
    int64_t cap = 16, n = 0;
    int64_t *bs = malloc((size_t)cap * sizeof *bs);
    if (!bs) return iv_fail(err, IV_ENOMEM, "out of memory planning blocks");
    bs[n++] = 0;
    int64_t rows = 0, nnz = 0;
    for (int64_t r = 0; r < q->n_out_rows; r++) {
        int64_t z = out_row_size(q, r);
        if (rows > 0 && (rows >= q->block_rows || nnz + z > q->block_nnz)) {
            IV_TRY(push_start(&bs, &n, &cap, r, err));
            rows = 0;
            nnz = 0;
        }
        rows++;
        nnz += z;
    }
    if (q->n_out_rows > 0) IV_TRY(push_start(&bs, &n, &cap, q->n_out_rows, err));
    q->block_start = bs;
    q->n_blocks = q->n_out_rows > 0 ? n - 1 : 0;
    return 0;
}

/* Stored entries of the selected major slices of d. */
static double major_entries(const iv_dataset_t *d, const iv_sel_t *major)
{
    if (!major || major->all) return (double)d->m.nnz;
    double z = 0;
    for (int64_t i = 0; i < major->n; i++) {
        int64_t s = major->idx[i];
        if (s >= 0 && s < d->m.n_major) z += (double)slice_nnz(d, s);
    }
    return z;
}

static double plan_cost(const iv_dataset_t *d, const iv_sel_t *obs, const iv_sel_t *var,
                        iv_out_axis_t axis)
{
    int csr = d->m.orient == IV_IVCSR;
    double per = d->m.nnz > 0 ? (double)iv_stream_length(d->stream) / (double)d->m.nnz : 1.0;
    double entries = major_entries(d, csr ? obs : var);
    double cost = entries * per;
    int out_obs = axis == IV_OUT_ROWS;
    if (axis != IV_OUT_MAJOR && out_obs != csr) {
        /* A transpose holds its whole output in memory before the first
         * block goes out: its counters, and each output entry written and
         * copied once more.  The output is the decoded entries times the
         * share of the minor axis selected (duplicates count). */
        const iv_sel_t *rows = out_obs ? obs : var;
        double n_axis = (double)(out_obs ? d->m.n_rows : d->m.n_cols);
        double n = !rows || rows->all ? n_axis : (double)rows->n;
        double out = n_axis > 0 ? entries * n / n_axis : 0;
        cost += 4.0 * n + 8.0 * out;
    }
    return cost;
}

iv_orient_t iv_plan_orient(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                           iv_out_axis_t axis, double bytes_est[2])
{
    iv_dataset_t *o = iv_dataset_other(ds);
    ensure_nnz_at(ds);
    ensure_nnz_at(o);
    double own = plan_cost(ds, obs, var, axis), alt = o ? plan_cost(o, obs, var, axis) : -1;
    if (bytes_est) {
        bytes_est[ds->m.orient] = own;
        bytes_est[!ds->m.orient] = alt;
    }
    return o && alt < own ? o->m.orient : ds->m.orient;
}

/* A transpose's distinct columns (see struct iv_query), from where each
 * output column's slice is first listed. */
static int distinct_cols(struct iv_query *q, const int64_t *first, iv_err_t *err)
{
    int64_t n = q->n_out_cols, nu = 0;
    int64_t *u_of = malloc((size_t)n * sizeof *u_of);
    if (!u_of) return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    for (int64_t k = 0; k < n; k++) u_of[k] = first[k] == k ? nu++ : u_of[first[k]];
    q->t_cols = malloc((size_t)nu * sizeof *q->t_cols);
    q->col_kptr = calloc((size_t)nu + 1, sizeof *q->col_kptr);
    q->col_k = malloc((size_t)n * sizeof *q->col_k);
    if (!q->t_cols || !q->col_kptr || !q->col_k) {
        free(u_of);
        return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    }
    for (int64_t k = 0; k < n; k++) {
        if (first[k] == k) q->t_cols[u_of[k]] = q->col_ids[k];
        q->col_kptr[u_of[k] + 1]++;
    }
    for (int64_t u = 0; u < nu; u++) q->col_kptr[u + 1] += q->col_kptr[u];
    /* Positions in ascending k: each column's list comes out sorted.  The
     * fill cursors reuse nothing: one more array of nu. */
    int64_t *fill = malloc((size_t)(nu ? nu : 1) * sizeof *fill);
    if (!fill) {
        free(u_of);
        return iv_fail(err, IV_ENOMEM, "out of memory for a selection's duplicates");
    }
    memcpy(fill, q->col_kptr, (size_t)nu * sizeof *fill);
    for (int64_t k = 0; k < n; k++) q->col_k[fill[u_of[k]]++] = k;
    free(fill);
    free(u_of);
    q->n_t_cols = nu;
    return 0;
}

/*
 * Whether a transpose of the orientation w would pass the request's bound
 * (opts->max_work_bytes): its entries, each with a 4-byte counter share
 * and its value, and 20 bytes a row.
 */
static int transpose_over_bound(const iv_dataset_t *w, const iv_sel_t *obs, const iv_sel_t *var,
                                iv_out_axis_t axis, int64_t max_work_bytes)
{
    int out_obs = axis == IV_OUT_ROWS;
    const iv_sel_t *rows = out_obs ? obs : var;
    double n_rows = !rows || rows->all ? (double)(out_obs ? w->m.n_rows : w->m.n_cols)
                                       : (double)rows->n;
    double entries = major_entries(w, w->m.orient == IV_IVCSR ? obs : var);
    double need = entries * (4.0 + (double)iv_dtype_size(w->m.value_dtype)) + 20.0 * n_rows;
    return need > (double)max_work_bytes;
}

/* The orientation that should serve the query (it may not exist). */
static iv_orient_t wanted_orient(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                                 const iv_query_opts_t *opts, iv_out_axis_t axis, iv_pick_t pick)
{
    iv_dataset_t *other = iv_dataset_other(ds);
    if (pick != IV_PICK_AUTO) return pick == IV_PICK_CELLS ? IV_IVCSR : IV_IVCSC;
    /* IV_OUT_MAJOR names the serving orientation's slices: left to
     * the planner, its meaning would change with the choice. */
    if (axis == IV_OUT_MAJOR) return ds->m.orient;
    iv_orient_t want = iv_plan_orient(ds, obs, var, axis, NULL);
    /* A transpose that could pass the request's bound is left for the
     * direct decode of the other orientation when there is one. */
    if (other && opts && opts->max_work_bytes > 0 && (axis == IV_OUT_ROWS) != (want == IV_IVCSR) &&
        transpose_over_bound(want == ds->m.orient ? ds : other, obs, var, axis, opts->max_work_bytes))
        want = want == IV_IVCSR ? IV_IVCSC : IV_IVCSR;
    return want;
}

/*
 * Resolves *ds to the orientation that serves the query.  Selections are
 * checked later against the shape, which both orientations share; the
 * planner skips out-of-range indices.
 */
static int resolve_orient(iv_dataset_t **ds, const iv_sel_t *obs, const iv_sel_t *var,
                          const iv_query_opts_t *opts, iv_out_axis_t axis, iv_pick_t pick,
                          iv_err_t *err)
{
    iv_orient_t want = wanted_orient(*ds, obs, var, opts, axis, pick);
    if (want == (*ds)->m.orient) return 0;
    iv_dataset_t *other = iv_dataset_other(*ds);
    if (!other)
        return iv_fail(err, IV_EINVALID_ARG, "%s: no %s orientation (neither built nor "
                       "attached)", (*ds)->where, want == IV_IVCSR ? "cell-major" : "gene-major");
    *ds = other;
    return 0;
}

static _Atomic int pick_allowed = 1;

void iv_query_set_vector(int on) { atomic_store(&pick_allowed, on); }

static _Atomic int wide_allowed = 1;

void iv_query_set_wide(int on) { atomic_store(&wide_allowed, on); }

/* A query on ds with the options' block sizes and bound, no selection yet. */
static struct iv_query *query_alloc(iv_dataset_t *ds, const iv_query_opts_t *opts)
{
    struct iv_query *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->ds = ds;
    q->stream = iv_dataset_read_stream(ds);
    q->wide = atomic_load(&wide_allowed) ? iv_dataset_wide_stream(ds) : NULL;
    q->block_nnz = opts && opts->block_nnz > 0 ? opts->block_nnz : DEFAULT_BLOCK_NNZ;
    q->block_rows = opts && opts->block_rows > 0 ? opts->block_rows : DEFAULT_BLOCK_ROWS;
    q->work_bytes = opts && opts->max_work_bytes > 0 ? opts->max_work_bytes : 0;
    q->dtype = ds->m.value_dtype;
    q->nnz_hint = -1;
    q->pick = atomic_load(&pick_allowed) && iv_varint_have_avx512() &&
              ds->m.n_minor < ((int64_t)1 << 31);
    atomic_init(&q->cancelled, 0);
    atomic_init(&q->decompressed, 0);
    pthread_mutex_init(&q->work_mu, NULL);
    return q;
}

/*
 * Output rows and columns from the selections (q takes obs_ids and
 * var_ids): the major slices decoded directly, or the minor axis as rows
 * of a transpose.
 */
static void set_axes(struct iv_query *q, iv_out_axis_t axis, int64_t *obs_ids, int64_t n_obs,
                     int64_t *var_ids, int64_t n_var)
{
    int csr = q->ds->m.orient == IV_IVCSR;
    int64_t *maj_ids = csr ? obs_ids : var_ids, *minor_ids = csr ? var_ids : obs_ids;
    int64_t n_maj = csr ? n_obs : n_var, n_minor_sel = csr ? n_var : n_obs;
    q->by_var = axis == IV_OUT_VARS || (axis == IV_OUT_MAJOR && !csr);
    if (axis == IV_OUT_MAJOR || (axis == IV_OUT_ROWS) == csr) {
        /* Output rows are the major slices: decoded directly. */
        q->mode = MODE_MAJOR;
        q->row_ids = maj_ids;
        q->col_ids = minor_ids;
        q->n_out_rows = n_maj;
        q->n_out_cols = n_minor_sel;
    } else {
        /* Output rows are the minor axis: a transpose. */
        q->mode = MODE_TRANSPOSE;
        q->row_ids = minor_ids;
        q->col_ids = maj_ids;
        q->n_out_rows = n_minor_sel;
        q->n_out_cols = n_maj;
    }
    q->index_size = q->n_out_cols > INT32_MAX ? 8 : 4;
    q->n_slots = q->n_out_rows;
    q->t_cols = q->col_ids;
    q->n_t_cols = q->n_out_cols;
}

/*
 * Duplicates in the selections.  A direct decode needs only the most
 * times one column is listed; a transpose also its distinct rows (the
 * lookup's positions, slots: *uniq, owned by the caller, when rows
 * repeat) and its distinct columns (the slices decoded).
 */
static int find_dups(struct iv_query *q, int64_t **uniq, iv_err_t *err)
{
    if (q->mode == MODE_MAJOR)
        return sel_dups(q->col_ids, q->n_out_cols, &q->max_mult, NULL, NULL, NULL, NULL, err);
    int64_t most, *first = NULL;
    int rc = sel_dups(q->row_ids, q->n_out_rows, &q->max_mult, uniq, &q->n_slots, &q->row_slot,
                      NULL, err);
    if (q->max_mult < 1) q->max_mult = 1;
    if (rc == 0) rc = sel_dups(q->col_ids, q->n_out_cols, &most, NULL, NULL, NULL, &first, err);
    if (rc == 0 && first) rc = distinct_cols(q, first, err);
    free(first);
    return rc;
}

/* Entries the decode will visit: those of every selected major slice,
 * counted until they reach the minor axis's length. */
static int64_t decoded_entries(const struct iv_query *q)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *major_ids = q->mode == MODE_MAJOR ? q->row_ids : q->t_cols;
    int64_t n_major_sel = q->mode == MODE_MAJOR ? q->n_out_rows : q->n_t_cols;
    if (!major_ids) return ds->m.nnz;
    int64_t decoded = 0;
    for (int64_t r = 0; r < n_major_sel && decoded < ds->m.n_minor; r++)
        decoded += slice_nnz(ds, major_ids[r]);
    return decoded;
}

/* The minor lookup over the selected minor ids, or over the distinct
 * ones (uniq) when a transpose's rows repeat; none when all are selected. */
static int build_minor_lut(struct iv_query *q, const int64_t *uniq, iv_err_t *err)
{
    if (q->minor_all) return 0;
    const int64_t *minor_ids = q->mode == MODE_MAJOR ? q->col_ids : q->row_ids;
    int64_t n_minor_sel = q->mode == MODE_MAJOR ? q->n_out_cols : q->n_out_rows;
    if (q->row_slot) {
        minor_ids = uniq;
        n_minor_sel = q->n_slots;
    }
    return build_lut(q, minor_ids, n_minor_sel, q->ds->m.n_minor, decoded_entries(q), err);
}

/* A direct decode is planned at once: its blocks, and its exact size
 * when every column is selected. */
static int plan_direct(struct iv_query *q, iv_err_t *err)
{
    IV_TRY(plan_blocks(q, err));
    if (q->minor_all) {
        int64_t z = 0;
        for (int64_t r = 0; r < q->n_out_rows; r++)
            z += slice_nnz(q->ds, q->row_ids ? q->row_ids[r] : r);
        q->nnz_hint = z;
    }
    q->prepared = 1;
    return 0;
}

int iv_query_new(iv_dataset_t *ds, const iv_sel_t *obs, const iv_sel_t *var,
                 const iv_query_opts_t *opts, iv_query_t **out, iv_err_t *err)
{
    *out = NULL;
    iv_out_axis_t axis = opts ? opts->axis : IV_OUT_ROWS;
    iv_pick_t pick = opts ? opts->pick : IV_PICK_AUTO;
    if ((unsigned)axis > IV_OUT_VARS || (unsigned)pick > IV_PICK_GENES)
        return iv_fail(err, IV_EINVALID_ARG, "unknown output axis or orientation");
    IV_TRY(resolve_orient(&ds, obs, var, opts, axis, pick, err));
    ensure_nnz_at(ds);
    struct iv_query *q = query_alloc(ds, opts);
    if (!q) return iv_fail(err, IV_ENOMEM, "out of memory for a query");
    int rc;
    int64_t *obs_ids = NULL, *var_ids = NULL, *uniq = NULL, n_obs, n_var;
    if ((rc = copy_sel(obs, ds->m.n_rows, "obs", &obs_ids, &n_obs, err)) < 0) goto fail;
    if ((rc = copy_sel(var, ds->m.n_cols, "var", &var_ids, &n_var, err)) < 0) goto fail;
    const iv_sel_t *minor_sel = ds->m.orient == IV_IVCSR ? var : obs;
    q->minor_all = !minor_sel || minor_sel->all;
    set_axes(q, axis, obs_ids, n_obs, var_ids, n_var);
    obs_ids = var_ids = NULL;
    if ((rc = find_dups(q, &uniq, err)) < 0) goto fail;
    if ((rc = build_minor_lut(q, uniq, err)) < 0) goto fail;
    free(uniq);
    uniq = NULL;
    if (q->mode == MODE_MAJOR && (rc = plan_direct(q, err)) < 0) goto fail;
    *out = q;
    return 0;
fail:
    free(uniq);
    free(obs_ids);
    free(var_ids);
    iv_query_free(q);
    return rc;
}

void iv_query_free(iv_query_t *q)
{
    if (!q) return;
    free(q->row_ids);
    free(q->col_ids);
    free(q->lut_ptr);
    free(q->lut_pos);
    free(q->lut_keys);
    free(q->lut_rank);
    free(q->sel_bits);
    free(q->block_start);
    free(q->row_slot);
    if (q->col_kptr) free(q->t_cols);
    free(q->col_kptr);
    free(q->col_k);
    free(q->t_exp);
    free(q->t_indptr);
    free(q->t_indices);
    free(q->t_data);
    while (q->free_work) {
        struct work *w = q->free_work;
        q->free_work = w->next_free;
        work_free(w);
    }
    pthread_mutex_destroy(&q->work_mu);
    free(q);
}

int64_t iv_query_n_blocks(const iv_query_t *q) { return q->n_blocks; }
int64_t iv_query_n_rows(const iv_query_t *q) { return q->n_out_rows; }
int64_t iv_query_n_cols(const iv_query_t *q) { return q->n_out_cols; }
int64_t iv_query_nnz_hint(const iv_query_t *q) { return q->nnz_hint; }

int64_t iv_query_stored_bound(const iv_query_t *q, int64_t cap)
{
    if (q->nnz_hint >= 0) return q->nnz_hint;
    /* The stored entries of every selected major slice: the output rows
     * of a plain query, its columns of a transpose. */
    int64_t z = 0;
    if (q->mode == MODE_MAJOR) {
        for (int64_t r = 0; r < q->n_out_rows && z <= cap; r++) z += out_row_size(q, r);
        return z;
    }
    /* A transpose's output column holds its slice's entries, each as
     * many times as its cell is listed (at most max_mult), at most one
     * per output row. */
    for (int64_t k = 0; k < q->n_out_cols && z <= cap; k++) {
        int64_t e = slice_nnz(q->ds, q->col_ids ? q->col_ids[k] : k);
        z += e > q->n_out_rows / q->max_mult ? q->n_out_rows : e * q->max_mult;
    }
    return z;
}
int iv_query_index_size(const iv_query_t *q) { return q->index_size; }
iv_dtype_t iv_query_dtype(const iv_query_t *q) { return q->dtype; }
iv_orient_t iv_query_orient(const iv_query_t *q) { return q->ds->m.orient; }
int iv_query_by_var(const iv_query_t *q) { return q->by_var; }
void iv_query_cancel(iv_query_t *q) { atomic_store(&q->cancelled, 1); }
uint64_t iv_query_bytes_decompressed(const iv_query_t *q) { return atomic_load(&q->decompressed); }

void iv_block_free(iv_block_t *b)
{
    if (!b) return;
    free(b->ids);
    free(b->indptr);
    free(b->indices);
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- slice decoding ---- */


/*
 * The dense path's bitmaps and tags, kept between queries.  A gene's
 * slice over every cell has a tag byte per cell: 10 MB at ten million
 * cells, and a fresh one costs a page fault for each of its pages that the
 * gene touches (2,500 faults, 13 ms of a 21 ms gene on a 10 M-cell atlas)
 * and a shootdown when it is freed.  A work struct takes a scratch of its
 * size from here and gives it back when the query ends; up to
 * scratch_keep_bytes of them stay (iv_query_set_scratch_keep, 64 MiB by
 * default), the most recent first.  A scratch comes
 * and goes with bits and summ all zero (the dense path and the bitmap
 * order leave them cleared, on errors too); the tags need no clearing.
 */
struct scratch {
    struct scratch *next;
    int64_t n_words;
    uint64_t *bits, *summ;
    uint8_t *tag;
};

static _Atomic size_t scratch_keep_bytes = (size_t)64 << 20;
static pthread_mutex_t scratch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct scratch *scratch_head;
static size_t scratch_bytes;

void iv_query_set_scratch_keep(size_t bytes) { atomic_store(&scratch_keep_bytes, bytes); }

static size_t scratch_size(int64_t n_words)
{
    return (size_t)n_words * (sizeof(uint64_t) + 64) + (size_t)(n_words + 63) / 64 * sizeof(uint64_t);
}

static void scratch_free(struct scratch *sc)
{
    free(sc->bits);
    free(sc->summ);
    free(sc->tag);
    free(sc);
}

/* A cleared scratch over n_words bitmap words: a kept one, or a new one
 * (NULL when out of memory). */
static struct scratch *scratch_take(int64_t n_words)
{
    pthread_mutex_lock(&scratch_mu);
    struct scratch **pp = &scratch_head, *sc;
    while ((sc = *pp) && sc->n_words != n_words) pp = &sc->next;
    if (sc) {
        *pp = sc->next;
        scratch_bytes -= scratch_size(n_words);
    }
    pthread_mutex_unlock(&scratch_mu);
    if (sc) return sc;
    sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->n_words = n_words;
    sc->bits = calloc((size_t)n_words, sizeof *sc->bits);
    sc->summ = calloc((size_t)(n_words + 63) / 64, sizeof *sc->summ);
    /* Every column a bitmap word can name, so that the emitters' padding
     * slots read inside the array (zeroed so that what they read is
     * defined). */
    sc->tag = calloc((size_t)n_words, 64);
    if (!sc->bits || !sc->summ || !sc->tag) {
        scratch_free(sc);
        return NULL;
    }
    return sc;
}

/* Keeps sc (cleared bitmaps) if it fits, dropping the least recent ones
 * past the bound; frees it otherwise. */
static void scratch_give(struct scratch *sc)
{
#ifndef NDEBUG
    for (int64_t i = 0; i < sc->n_words; i++) assert(sc->bits[i] == 0);
    for (int64_t i = 0; i < (sc->n_words + 63) / 64; i++) assert(sc->summ[i] == 0);
#endif
    size_t keep = atomic_load(&scratch_keep_bytes), sz = scratch_size(sc->n_words);
    struct scratch *drop = NULL;
    pthread_mutex_lock(&scratch_mu);
    if (sz <= keep) {
        sc->next = scratch_head;
        scratch_head = sc;
        scratch_bytes += sz;
        sc = NULL;
    }
    /* Past the bound (which may have shrunk): cut the list after the
     * kept prefix. */
    size_t run = 0;
    for (struct scratch **pp = &scratch_head; *pp; pp = &(*pp)->next) {
        run += scratch_size((*pp)->n_words);
        if (run > keep) {
            drop = *pp;
            *pp = NULL;
            break;
        }
    }
    for (struct scratch *d = drop; d; d = d->next) scratch_bytes -= scratch_size(d->n_words);
    pthread_mutex_unlock(&scratch_mu);
    if (sc) scratch_free(sc);
    while (drop) {
        struct scratch *next = drop->next;
        scratch_free(drop);
        drop = next;
    }
}

size_t iv_query_scratch_kept(void)
{
    pthread_mutex_lock(&scratch_mu);
    size_t n = scratch_bytes;
    pthread_mutex_unlock(&scratch_mu);
    return n;
}

static void work_free(struct work *w)
{
    iv_cursor_done(&w->cur);
    free(w->pos);
    free(w->gid);
    free(w->gid_at);
    if (w->scratch) {
        scratch_give(w->scratch);
    } else {
        free(w->bits);
        free(w->tag);
        free(w->summ);
    }
    free(w);
}

/* Takes a recycled work struct (or a new one) positioned nowhere. */
static struct work *work_get(struct iv_query *q)
{
    pthread_mutex_lock(&q->work_mu);
    struct work *w = q->free_work;
    if (w) q->free_work = w->next_free;
    pthread_mutex_unlock(&q->work_mu);
    if (!w) w = calloc(1, sizeof *w);
    if (!w) return NULL;
    iv_cursor_init(&w->cur, q->stream);
    w->next_slice = -1;
    return w;
}

/* Unpins the cursor's chunk and returns w to the query's free list. */
static void work_put(struct iv_query *q, struct work *w)
{
    atomic_fetch_add(&q->decompressed, w->cur.decompressed);
    iv_cursor_done(&w->cur);
    pthread_mutex_lock(&q->work_mu);
    w->next_free = q->free_work;
    q->free_work = w;
    pthread_mutex_unlock(&q->work_mu);
}

static int pairs_reserve(struct work *w, int64_t n, iv_err_t *err)
{
    if (n <= w->pairs_cap) return 0;
    int64_t cap = w->pairs_cap ? w->pairs_cap : 1024;
    while (cap < n) cap *= 2;
    int64_t *p = realloc(w->pos, (size_t)cap * sizeof *p);
    if (p) w->pos = p;
    int64_t *g = realloc(w->gid, (size_t)cap * sizeof *g);
    if (g) w->gid = g;
    if (!p || !g) return iv_fail(err, IV_ENOMEM, "out of memory decoding a slice");
    w->pairs_cap = cap;
    return 0;
}

/* Moves the cursor to the first varint of slice s. */
static int seek_slice(const struct iv_query *q, struct work *w, int64_t s, iv_err_t *err)
{
    const iv_dataset_t *ds = q->ds;
    if (w->next_slice == s) return 0;
    uint64_t off, skip;
    iv_rowindex_locate(&ds->ri, ds->m.major_ptr, ds->m.value_ptr, s, &off, &skip);
    /* Continuing forward from the cursor is cheaper when it is already
     * past the checkpoint that covers s. */
    int64_t ck_slice = (s / (int64_t)ds->ri.stride) * (int64_t)ds->ri.stride;
    if (w->next_slice >= 0 && w->next_slice < s && w->next_slice >= ck_slice) {
        skip = (uint64_t)(ds->m.value_ptr[ds->m.major_ptr[s]] -
                          ds->m.value_ptr[ds->m.major_ptr[w->next_slice]]);
    } else {
        IV_TRY(iv_cursor_seek(&w->cur, off, err));
    }
    IV_TRY(iv_cursor_skip(&w->cur, skip, err));
    w->next_slice = s;
    return 0;
}

/*
 * A window over the packed stream for the slice decoders.  Varints are
 * found through 64 bytes of terminator bits: wb is the window's base, tm
 * its terminators not yet consumed, off the offset of the next varint.
 * Walking tm with ctz and clear-lowest keeps the decoders' dependency chain
 * off the loaded bytes.  vwin_next2 takes one- and two-byte varints inside
 * the window and makes no calls, so that the decoders' inner loops keep
 * their state in registers; vwin_next_slow takes everything else: a
 * refill (only with VWIN_READ bytes left in the chunk), three bytes or
 * more, and, near the end of a chunk or across chunks, the cursor.
 */
struct vwin {
    const uint8_t *wb, *end;
    uint64_t tm;
    unsigned off;
};

enum { VWIN_READ = 64 + 8 };

static inline int vwin_next2(struct vwin *v, uint64_t *d)
{
    if (v->tm == 0) return 0;
    unsigned e = (unsigned)__builtin_ctzll(v->tm), len = e - v->off + 1;
    if (len > 2) return 0;
    uint16_t u16;
    memcpy(&u16, v->wb + v->off, 2);
    uint32_t u = u16;
    /* One byte, or two: the second's bits only when len is 2. */
    *d = (u & 0x7f) | ((u >> 1) & 0x3f80 & (0u - (len >> 1)));
    v->tm &= v->tm - 1;
    v->off = e + 1;
    return 1;
}

/* 0 with *d set; 1 when the varint is malformed or >= n_minor; or a
 * negative error from the cursor (with its message). */
static int vwin_next_slow(struct vwin *v, iv_cursor_t *cur, uint64_t n_minor, uint64_t *d,
                          iv_err_t *err)
{
    uint64_t x;
    if (v->tm == 0) {
        v->wb += v->off;
        v->off = 0;
        if (v->end - v->wb >= VWIN_READ) v->tm = ~iv_varint_cont64(v->wb);
    }
    if (v->tm != 0) {
        unsigned e = (unsigned)__builtin_ctzll(v->tm);
        if (iv_varint_read_slow(v->wb + v->off, v->end, &x) != e - v->off + 1 || x >= n_minor)
            return 1;
        v->tm &= v->tm - 1;
        v->off = e + 1;
    } else {
        cur->p = v->wb + v->off;
        IV_TRY(iv_cursor_read(cur, &x, err));
        v->wb = cur->p;
        v->end = cur->end;
        v->off = 0;
        if (x >= n_minor) return 1;
    }
    *d = x;
    return 0;
}

/* The next varint of the window: vwin_next2's short one, else the checked
 * way (vwin_next_slow's returns). */
static inline int vwin_next(struct vwin *v, iv_cursor_t *cur, uint64_t n_minor, uint64_t *d, iv_err_t *err)
{
    if (vwin_next2(v, d)) return 0;
    struct vwin t = *v;
    int rc = vwin_next_slow(&t, cur, n_minor, d, err);
    *v = t;
    return rc;
}

/* A group's next varint through vwin_next, added to its running sum
 * *acc: 0 with *j the entry's minor index; 1 when the varint is
 * malformed or the index past the axis; or a negative error. */
static inline int vwin_step(struct vwin *v, iv_cursor_t *cur, uint64_t n_minor, uint64_t *acc, uint64_t *j,
                            iv_err_t *err)
{
    uint64_t d;
    int rc = vwin_next(v, cur, n_minor, &d, err);
    if (rc != 0) return rc;
    *acc += d + 1;
    if (*acc > n_minor) return 1;
    *j = *acc - 1;
    return 0;
}

/* Up to PICK_BATCH of a value group's `left` varints through the vector
 * kernel, from v: how many it took, with v and *acc past them and the
 * kept ones (bit set in sel, or all) in w->picked, *kept of them.  0 when
 * the kernel is off or leaves the next varint (a long one, the end of a
 * chunk, a bad index) to the caller's own decode. */
static inline size_t pick_some(const struct iv_query *q, struct work *w, struct vwin *v, int64_t left,
                               uint64_t n_minor, uint64_t *acc, const uint64_t *sel, size_t *kept)
{
    if (!q->pick || !v->wb) return 0;
    const uint8_t *at = v->wb + v->off;
    size_t got = iv_varint_pick_avx512(&at, v->end, left < PICK_BATCH ? (size_t)left : PICK_BATCH, n_minor,
                                       acc, sel, w->picked, kept);
    if (got > 0) {
        v->wb = at;
        v->off = 0;
        v->tm = 0;
    }
    return got;
}

/* The error of slice s holding an index past the minor axis. */
static int slice_bad_index(const struct iv_query *q, int64_t s, iv_err_t *err)
{
    return iv_fail(err, IV_ECORRUPT, "%s: slice %" PRId64 " has an index >= %" PRId64, q->ds->where, s,
                   q->ds->m.n_minor);
}

/* Output positions lut_pos[*a .. *b) of selected minor element j. */
static inline void lut_range(const struct iv_query *q, uint64_t j, int64_t *a, int64_t *b)
{
    if (!q->lut_sparse) {
        *a = q->lut_ptr[j];
        *b = q->lut_ptr[j + 1];
        return;
    }
    int64_t lo = 0, hi = q->n_lut;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (q->lut_keys[mid] < (int64_t)j) lo = mid + 1;
        else hi = mid;
    }
    *a = *b = lo;
    while (*b < q->n_lut && q->lut_keys[*b] == (int64_t)j) (*b)++;
}

/* Output position of selected minor element j of an ascending selection
 * (lut_rank): its rank among the selected. */
static inline int64_t sel_rank(const struct iv_query *q, uint64_t j)
{
    return q->lut_rank[j >> 6] +
           __builtin_popcountll(q->sel_bits[j >> 6] & (((uint64_t)1 << (j & 63)) - 1));
}

/* Appends the (position, group) pairs of a selected entry, minor index j
 * of group g, after the *n pairs w holds.  0 or a negative error. */
static inline int map_hit(const struct iv_query *q, struct work *w, int64_t *n, uint64_t j, int64_t g,
                          iv_err_t *err)
{
    if (q->minor_all) {
        w->pos[*n] = (int64_t)j;
        w->gid[*n] = g;
        (*n)++;
        return 0;
    }
    if (q->lut_rank) {
        IV_TRY(pairs_reserve(w, *n + 1, err));
        w->pos[*n] = sel_rank(q, j);
        w->gid[*n] = g;
        (*n)++;
        return 0;
    }
    int64_t a, b;
    lut_range(q, j, &a, &b);
    if (a == b) return 0;
    IV_TRY(pairs_reserve(w, *n + (b - a), err));
    for (int64_t t = a; t < b; t++) {
        w->pos[*n] = q->lut_pos[t];
        w->gid[*n] = g;
        (*n)++;
    }
    return 0;
}

/* map_hit of the kept indices the vector kernel left in w->picked: the
 * pairs' room reserved once, and a sorted selection's ranks (the common
 * case) counted in one loop. */
static int map_hits(const struct iv_query *q, struct work *w, int64_t *n, size_t kept, int64_t g,
                    iv_err_t *err)
{
    if (!q->lut_rank || q->minor_all) {
        for (size_t i = 0; i < kept; i++) IV_TRY(map_hit(q, w, n, w->picked[i], g, err));
        return 0;
    }
    IV_TRY(pairs_reserve(w, *n + (int64_t)kept, err));
    int64_t m = *n;
    for (size_t i = 0; i < kept; i++) {
        uint32_t j = w->picked[i];
        w->pos[m] = sel_rank(q, j);
        w->gid[m] = g;
        m++;
    }
    *n = m;
    return 0;
}

/* Puts w's n pairs in position order through the bitmap over n_cols
 * positions (dense slices).  Returns n, or a negative error when slice s
 * stores a position twice (the bitmap is left cleared). */
static int64_t order_by_bitmap(const struct iv_query *q, struct work *w, int64_t n, int64_t n_cols,
                               int64_t s, iv_err_t *err)
{
    /* Each array on its own: the dense path allocates bits without
     * gid_at, and a slice with too many groups for it comes here. */
    w->n_words = (n_cols + 63) / 64;
    if (!w->bits) w->bits = calloc((size_t)w->n_words, sizeof *w->bits);
    if (!w->gid_at) w->gid_at = malloc((size_t)n_cols * sizeof *w->gid_at);
    if (!w->bits || !w->gid_at) return iv_fail(err, IV_ENOMEM, "out of memory for a bitmap");
    /* The arrays in locals: the stores below could otherwise alias w's
     * fields, which the loops would then load again at every step. */
    uint64_t *restrict bits = w->bits;
    int64_t *restrict pos = w->pos, *restrict gid = w->gid, *restrict gid_at = w->gid_at;
    int64_t lo = w->n_words, hi = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = pos[i], wd = p >> 6;
        uint64_t bit = (uint64_t)1 << (p & 63);
        if (bits[wd] & bit) {
            for (int64_t x = lo; x <= hi; x++) bits[x] = 0;
            if (wd < lo || wd > hi) bits[wd] = 0;
            return iv_fail(err, IV_ECORRUPT, "%s: slice %" PRId64 " stores a minor index twice",
                           q->ds->where, s);
        }
        bits[wd] |= bit;
        gid_at[p] = gid[i];
        if (wd < lo) lo = wd;
        if (wd > hi) hi = wd;
    }
    int64_t m = 0;
    for (int64_t wd = lo; wd <= hi; wd++) {
        uint64_t x = bits[wd];
        bits[wd] = 0;
        while (x) {
            int64_t p = wd * 64 + __builtin_ctzll(x);
            x &= x - 1;
            pos[m] = p;
            gid[m] = gid_at[p];
            m++;
        }
    }
    return m;
}

/* Puts w's n pairs in position order by sorting them (sparse slices). */
static int64_t order_by_sort(const struct iv_query *q, struct work *w, int64_t n, int64_t s,
                             iv_err_t *err)
{
    int64_t *tmp = malloc((size_t)n * 2 * sizeof(int64_t));
    if (!tmp) return iv_fail(err, IV_ENOMEM, "out of memory sorting a slice");
    for (int64_t i = 0; i < n; i++) {
        tmp[2 * i] = w->pos[i];
        tmp[2 * i + 1] = w->gid[i];
    }
    qsort(tmp, (size_t)n, 2 * sizeof(int64_t), pair_cmp);
    for (int64_t i = 0; i < n; i++) {
        w->pos[i] = tmp[2 * i];
        w->gid[i] = tmp[2 * i + 1];
        if (i > 0 && w->pos[i] == w->pos[i - 1]) {
            free(tmp);
            return iv_fail(err, IV_ECORRUPT, "%s: slice %" PRId64 " stores a minor index twice",
                           q->ds->where, s);
        }
    }
    free(tmp);
    return n;
}

/* Puts the n pairs decoded from slice s in position order: returns n,
 * or a negative error when the slice stores a position twice. */
static int64_t order_pairs(const struct iv_query *q, struct work *w, int64_t n, int64_t s,
                           iv_err_t *err)
{
    if (n <= 1) return n;
    /* Positions index the minor selection: output columns, or output rows
     * when transposing. */
    int64_t n_cols = q->mode == MODE_MAJOR ? q->n_out_cols : q->n_slots;
    if (n * 64 >= n_cols / 16 && n_cols > 0 && n_cols <= ((int64_t)1 << 26))
        return order_by_bitmap(q, w, n, n_cols, s, err);  /* dense enough */
    return order_by_sort(q, w, n, s, err);
}

/*
 * Decodes slice s into w->pos/w->gid, sorted by output position.
 * Returns the pair count, or a negative error.
 */
static int64_t decode_slice(const struct iv_query *q, struct work *w, int64_t s, iv_err_t *err)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *mp = ds->m.major_ptr, *vp = ds->m.value_ptr;
    uint64_t n_minor = (uint64_t)ds->m.n_minor;
    IV_TRY(seek_slice(q, w, s, err));
    int64_t n = 0;
    int64_t total = vp[mp[s + 1]] - vp[mp[s]];
    if (q->minor_all) IV_TRY(pairs_reserve(w, total, err));
    /* Every entry is a hit when all are selected or there is no bitmap. */
    const uint64_t *sel = q->minor_all ? NULL : q->sel_bits;
    int all_hit = q->minor_all || !sel;
    struct vwin v = {w->cur.p, w->cur.end, 0, 0};
    int rc = 0;
    for (int64_t g = mp[s]; g < mp[s + 1]; g++) {
        uint64_t acc = 0, d = 0, j = 0;
        int64_t left = vp[g + 1] - vp[g];
        while (left > 0) {
            /* Sixteen bytes at a time; what the kernel leaves goes the
             * way below. */
            size_t kept, got = pick_some(q, w, &v, left, n_minor, &acc, sel, &kept);
            if (got > 0) {
                left -= (int64_t)got;
                if ((rc = map_hits(q, w, &n, kept, g, err)) < 0) goto fail;
                continue;
            }
            /* Call-free inner loop: short varints, entries not selected. */
            while (left > 0 && vwin_next2(&v, &d)) {
                acc += d + 1;
                if (acc > n_minor) goto bad_index;
                left--;
                j = acc - 1;
                if (all_hit || ((sel[j >> 6] >> (j & 63)) & 1)) goto hit;
            }
            if (left == 0) break;
            rc = vwin_step(&v, &w->cur, n_minor, &acc, &j, err);
            if (rc > 0) goto bad_index;
            if (rc < 0) goto fail;
            left--;
            if (!all_hit && !((sel[j >> 6] >> (j & 63)) & 1)) continue;
        hit:
            if ((rc = map_hit(q, w, &n, j, g, err)) < 0) goto fail;
        }
    }
    w->cur.p = v.wb ? v.wb + v.off : v.wb;  /* no offset on a NULL window (an empty slice) */
    w->next_slice = s + 1;
    return order_pairs(q, w, n, s, err);
bad_index:
    rc = slice_bad_index(q, s, err);
fail:
    /* The cursor is somewhere inside the slice: the next one seeks. */
    w->next_slice = -1;
    return rc;
}

/* Growable output arrays of a block. */
struct outbuf {
    void *indices, *data;
    int64_t n, cap;
    int isz;
    size_t esz;
};

static int outbuf_reserve(struct outbuf *o, int64_t need, iv_err_t *err)
{
    if (need <= o->cap) return 0;
    int64_t cap = o->cap ? o->cap * 2 : 4096;
    if (cap < need) cap = need;
    void *i = realloc(o->indices, (size_t)cap * (size_t)o->isz);
    if (i) o->indices = i;
    void *d = realloc(o->data, (size_t)cap * o->esz);
    if (d) o->data = d;
    if (!i || !d) return iv_fail(err, IV_ENOMEM, "out of memory for a block");
    o->cap = cap;
    return 0;
}

static void copy_value(void *dst, const void *values, int64_t g, size_t esz)
{
    const char *src = (const char *)values + (size_t)g * esz;
    switch (esz) {
    case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    default: memcpy(dst, src, 8); break;
    }
}

static void emit_pairs(struct outbuf *o, const struct work *w, int64_t n, const void *values)
{
    /* Nothing to emit may come with no buffer yet (NULL + 0 is undefined). */
    if (n == 0) return;
    char *data = (char *)o->data + (size_t)o->n * o->esz;
    if (o->isz == 4) {
        int32_t *ix = (int32_t *)o->indices + o->n;
        for (int64_t i = 0; i < n; i++) ix[i] = (int32_t)w->pos[i];
    } else {
        int64_t *ix = (int64_t *)o->indices + o->n;
        for (int64_t i = 0; i < n; i++) ix[i] = w->pos[i];
    }
    for (int64_t i = 0; i < n; i++) copy_value(data + (size_t)i * o->esz, values, w->gid[i], o->esz);
    o->n += n;
}

/*
 * Emitters of the dense fast path, one per index and value width, so that
 * the inner loop is plain loads and stores.  Values are copied as unsigned
 * integers of their width, which keeps every bit (float NaN payloads too).
 *
 * The summary bitmap `summ` has one bit per nonzero word of `bits`, so the
 * walk visits only words that hold entries.  With summ NULL, s_lo..s_hi
 * are words, not summary words, and every one is visited: cheaper when
 * most words hold entries (no summary to build, no ctz per word; 5% on a
 * full decode of the atlas).  A word's first DENSE_SLACK entries are
 * written without a branch on how many there are: slots past
 * the word's count get a column from the word's top bit and a value from
 * the slice's 256-entry value table, both in bounds, and are overwritten
 * by the next word (the output has DENSE_SLACK entries of slack).  Words
 * with more entries loop for the rest.  Three slots measured faster than
 * two or four: most words of a 2%-dense row hold one to three entries.
 * Both bitmaps are left cleared.
 * Returns the number of entries written.
 */
#define DENSE_MAX_GROUPS 256
#define DENSE_SLACK 3

/* Emits bitmap word wd (and clears it): the body shared by both walks. */
#define IV_DENSE_WORD(IT)                                                                     \
    do {                                                                                      \
        uint64_t x = bits[wd];                                                                \
        bits[wd] = 0;                                                                         \
        int64_t base = wd * 64;                                                               \
        int c = __builtin_popcountll(x);                                                      \
        for (int k = 0; k < DENSE_SLACK; k++) {                                               \
            int64_t j = base + __builtin_ctzll(x | ((uint64_t)1 << 63));                      \
            x &= x - 1;                                                                       \
            idx[n + k] = (IT)j;                                                               \
            out[n + k] = vals[tag[j]];                                                        \
        }                                                                                     \
        if (c > DENSE_SLACK) {                                                                \
            for (int k = DENSE_SLACK; k < c; k++) {                                           \
                int64_t j = base + __builtin_ctzll(x);                                        \
                x &= x - 1;                                                                   \
                idx[n + k] = (IT)j;                                                           \
                out[n + k] = vals[tag[j]];                                                    \
            }                                                                                 \
        }                                                                                     \
        n += c;                                                                               \
    } while (0)

#define IV_DENSE_EMITTER(NAME, IT, VT)                                                        \
    IV_HOT_CLONES static int64_t NAME(uint64_t *restrict bits, uint64_t *restrict summ, int64_t s_lo,       \
                        int64_t s_hi, const uint8_t *restrict tag, const void *restrict vals_, \
                        void *restrict idx_, void *restrict out_)                             \
    {                                                                                         \
        const VT *vals = vals_;                                                               \
        IT *idx = idx_;                                                                       \
        VT *out = out_;                                                                       \
        int64_t n = 0;                                                                        \
        if (!summ) {                                                                          \
            for (int64_t wd = s_lo; wd <= s_hi; wd++) IV_DENSE_WORD(IT);                      \
            return n;                                                                         \
        }                                                                                     \
        for (int64_t sw = s_lo; sw <= s_hi; sw++) {                                           \
            uint64_t y = summ[sw];                                                            \
            summ[sw] = 0;                                                                     \
            while (y) {                                                                       \
                int64_t wd = sw * 64 + __builtin_ctzll(y);                                    \
                y &= y - 1;                                                                   \
                IV_DENSE_WORD(IT);                                                            \
            }                                                                                 \
        }                                                                                     \
        return n;                                                                             \
    }
IV_DENSE_EMITTER(emit_dense_i4v1, int32_t, uint8_t)
IV_DENSE_EMITTER(emit_dense_i4v2, int32_t, uint16_t)
IV_DENSE_EMITTER(emit_dense_i4v4, int32_t, uint32_t)
IV_DENSE_EMITTER(emit_dense_i4v8, int32_t, uint64_t)
IV_DENSE_EMITTER(emit_dense_i8v1, int64_t, uint8_t)
IV_DENSE_EMITTER(emit_dense_i8v2, int64_t, uint16_t)
IV_DENSE_EMITTER(emit_dense_i8v4, int64_t, uint32_t)
IV_DENSE_EMITTER(emit_dense_i8v8, int64_t, uint64_t)
#undef IV_DENSE_EMITTER
#undef IV_DENSE_WORD

typedef int64_t (*dense_emit_fn)(uint64_t *, uint64_t *, int64_t, int64_t, const uint8_t *,
                                 const void *, void *, void *);

static dense_emit_fn dense_emitter(int isz, size_t esz)
{
    static const dense_emit_fn by4[] = {emit_dense_i4v1, emit_dense_i4v2, emit_dense_i4v4,
                                        emit_dense_i4v8};
    static const dense_emit_fn by8[] = {emit_dense_i8v1, emit_dense_i8v2, emit_dense_i8v4,
                                        emit_dense_i8v8};
    int k = esz == 1 ? 0 : esz == 2 ? 1 : esz == 4 ? 2 : 3;
    return isz == 4 ? by4[k] : by8[k];
}

/* Sets summ's bit for every nonzero word of bits[lo..hi] (lo > hi: none). */
static void summarize(const uint64_t *bits, uint64_t *summ, int64_t lo, int64_t hi)
{
    int64_t i = lo;
#if defined(__SSE4_1__)
    const __m128i zero = _mm_setzero_si128();
    for (i = lo & ~(int64_t)1; i + 1 <= hi; i += 2) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(bits + i));
        unsigned z = (unsigned)_mm_movemask_pd(_mm_castsi128_pd(_mm_cmpeq_epi64(v, zero)));
        summ[i >> 6] |= (uint64_t)(~z & 3u) << (i & 63);
    }
#endif
    for (; i <= hi; i++) summ[i >> 6] |= (uint64_t)(bits[i] != 0) << (i & 63);
}

static void dense_clear(struct work *w)
{
    memset(w->bits, 0, (size_t)w->n_words * sizeof *w->bits);
    memset(w->summ, 0, (size_t)((w->n_words + 63) / 64) * sizeof *w->summ);
}

/* The dense path's bitmaps and tags over n_cols columns, allocated on a
 * work struct's first dense slice and left cleared by every slice. */
static int dense_buffers(struct work *w, int64_t n_cols, iv_err_t *err)
{
    w->n_words = (n_cols + 63) / 64;
    if (!w->bits && !w->summ && !w->tag) {
        w->scratch = scratch_take(w->n_words);
        if (!w->scratch) return iv_fail(err, IV_ENOMEM, "out of memory for a bitmap");
        w->bits = w->scratch->bits;
        w->summ = w->scratch->summ;
        w->tag = w->scratch->tag;
        return 0;
    }
    if (!w->bits) w->bits = calloc((size_t)w->n_words, sizeof *w->bits);
    if (!w->summ) w->summ = calloc((size_t)(w->n_words + 63) / 64, sizeof *w->summ);
    /* Every column a bitmap word can name, so that the emitters' padding
     * slots read inside the array. */
    if (!w->tag) w->tag = calloc((size_t)w->n_words, 64);
    if (!w->bits || !w->summ || !w->tag) return iv_fail(err, IV_ENOMEM, "out of memory for a bitmap");
    return 0;
}

/* A dense slice decode that stopped half-way (error rc): the cursor is
 * somewhere inside the slice, so the next one seeks, and the bitmaps are
 * cleared for the next slice. */
static int dense_slice_failed(struct work *w, int rc)
{
    w->next_slice = -1;
    dense_clear(w);
    return rc;
}

/* Emits slice s from the bitmap words w_lo..w_hi that decode_slice_dense
 * (or decode_slice_ranked) filled into o, in column order, and clears the
 * bitmaps.  Returns the number of entries, `total`, or a negative error
 * when there are fewer: a column stored twice. */
static int64_t emit_dense_slice(const struct iv_query *q, struct work *w, int64_t s,
                                struct outbuf *o, int64_t w_lo, int64_t w_hi, int64_t total,
                                iv_err_t *err)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *mp = ds->m.major_ptr;
    /* With at least one entry a word on average, most words hold some
     * (63% at one): walking every word beats summarizing them first. */
    int walk_all = total >= w_hi - w_lo + 1;
    if (!walk_all) summarize(w->bits, w->summ, w_lo, w_hi);
    /* The slice's values in a 256-entry table (zeroed once), so that
     * any tag, even a stale one in a padding slot, reads in bounds. */
    size_t ng = (size_t)(mp[s + 1] - mp[s]);
    memcpy(w->vals, (const char *)ds->m.values + (size_t)mp[s] * o->esz, ng * o->esz);
    int64_t n = dense_emitter(o->isz, o->esz)(w->bits, walk_all ? NULL : w->summ,
                                              walk_all ? w_lo : w_lo >> 6,
                                              walk_all ? w_hi : w_hi >> 6, w->tag, w->vals,
                                              (char *)o->indices + (size_t)o->n * (size_t)o->isz,
                                              (char *)o->data + (size_t)o->n * o->esz);
    if (n != total)
        return iv_fail(err, IV_ECORRUPT, "%s: slice %" PRId64 " stores a minor index twice",
                       ds->where, s);
    o->n += n;
    return n;
}

/*
 * Fast path for the common case: every minor element selected, a slice
 * dense enough for the bitmap and at most DENSE_MAX_GROUPS value groups.
 * Decodes straight into the bitmap, tagging each column with its group
 * (one byte, so the tag array of a 33,000-gene matrix stays in L1), then
 * emits indices and values in column order.  Varints are walked as in
 * struct vwin (a 64-byte window of terminator bits, one- and two-byte
 * varints in a call-free loop, the checked path for the rest), written
 * out inline: through the helpers the loop measured 7% slower.  The
 * summary bitmap is built afterwards from the words the slice's groups
 * span, two words per SSE4.1 compare.  Duplicated columns are found by
 * count: indices rise strictly within a group, so a column stored twice
 * can only come from two groups and makes the bitmap hold fewer entries
 * than the slice.
 * The caller reserved room for the slice's entries plus DENSE_SLACK in o.
 * Returns the number of entries emitted or a negative error.
 */
IV_HOT_CLONES static int64_t decode_slice_dense(const struct iv_query *q, struct work *w,
                                                int64_t s, struct outbuf *o, iv_err_t *err)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *mp = ds->m.major_ptr, *vp = ds->m.value_ptr;
    uint64_t n_minor = (uint64_t)ds->m.n_minor;
    int64_t n_cols = q->n_out_cols;
    IV_TRY(seek_slice(q, w, s, err));
    IV_TRY(dense_buffers(w, n_cols, err));
    uint64_t *restrict bits = w->bits;
    uint8_t *restrict tag = w->tag;
    /* Words 0..w_hi may hold entries (the lowest is not tracked: a dense
     * slice starts near 0 anyway, and summarizing is two words an op). */
    int64_t w_lo = 0, w_hi = -1;
    iv_cursor_t *cur = &w->cur;
    /* Varints are found through a 64-byte window of terminator bits: wb is
     * the window's base, tm its terminators not yet consumed, off the offset
     * of the next varint.  Walking tm with ctz and clear-lowest keeps the
     * loop's dependency chain off the loaded bytes.  The window is refilled
     * only with WINDOW_READ bytes left in the chunk; closer to the end, and
     * across chunks, varints go through the cursor one by one. */
    enum { WINDOW_READ = 64 + 8 };
    const uint8_t *wb = cur->p, *end = cur->end;
    uint64_t tm = 0;
    unsigned off = 0;
    int rc = 0;
    for (int64_t g = mp[s]; g < mp[s + 1]; g++) {
        uint64_t left = (uint64_t)(vp[g + 1] - vp[g]);
        if (left == 0) continue;
        const uint8_t t = (uint8_t)(g - mp[s]);
        uint64_t acc = 0;
        while (left > 0) {
            if (q->pick && wb) {
                /* Sixteen bytes at a time, as in decode_slice. */
                const uint8_t *at = wb + off;
                size_t n_got;
                size_t got = iv_varint_pick_avx512(&at, end, left < PICK_BATCH ? (size_t)left : PICK_BATCH,
                                                   n_minor, &acc, NULL, w->picked, &n_got);
                if (got > 0) {
                    for (size_t i = 0; i < got; i++) {
                        uint32_t j = w->picked[i];
                        bits[j >> 6] |= (uint64_t)1 << (j & 63);
                        tag[j] = t;
                    }
                    wb = at;
                    off = 0;
                    tm = 0;
                    left -= got;
                    continue;
                }
            }
            /* Hot loop, free of calls so that its state stays in registers:
             * one- and two-byte varints inside the window. */
            while (left > 0 && tm != 0) {
                unsigned e = (unsigned)__builtin_ctzll(tm), len = e - off + 1;
                if (len > 2) break;
                uint16_t u16;
                memcpy(&u16, wb + off, 2);
                uint32_t u = u16;
                /* One byte, or two: the second's bits only when len is 2. */
                acc += ((u & 0x7f) | ((u >> 1) & 0x3f80 & (0u - (len >> 1)))) + 1;
                if (acc > n_minor) goto bad_index;
                bits[(acc - 1) >> 6] |= (uint64_t)1 << ((acc - 1) & 63);
                tag[acc - 1] = t;
                tm &= tm - 1;
                off = e + 1;
                left--;
            }
            if (left == 0) break;
            if (tm == 0) {
                wb += off;
                off = 0;
                if (end - wb >= WINDOW_READ) {
                    tm = ~iv_varint_cont64(wb);
                    if (tm != 0) continue;
                }
            }
            /* One varint the checked way: three bytes or more, or near the
             * end of the chunk, or crossing into the next one. */
            uint64_t d;
            if (tm != 0) {
                unsigned e = (unsigned)__builtin_ctzll(tm);
                if (iv_varint_read_slow(wb + off, end, &d) != e - off + 1 || d >= n_minor)
                    goto bad_index;
                tm &= tm - 1;
                off = e + 1;
            } else {
                cur->p = wb + off;
                if ((rc = iv_cursor_read(cur, &d, err)) < 0) goto fail;
                wb = cur->p;
                end = cur->end;
                off = 0;
                if (d >= n_minor) goto bad_index;
            }
            acc += d + 1;
            if (acc > n_minor) goto bad_index;
            bits[(acc - 1) >> 6] |= (uint64_t)1 << ((acc - 1) & 63);
            tag[acc - 1] = t;
            left--;
        }
        /* A group's indices rise: its last is its largest. */
        if ((int64_t)((acc - 1) >> 6) > w_hi) w_hi = (int64_t)((acc - 1) >> 6);
    }
    /* wb is NULL for a slice with no bytes (off 0): NULL + 0 is undefined. */
    cur->p = off ? wb + off : wb;
    w->next_slice = s + 1;
    return emit_dense_slice(q, w, s, o, w_lo, w_hi, vp[mp[s + 1]] - vp[mp[s]], err);
bad_index:
    rc = slice_bad_index(q, s, err);
fail:
    return dense_slice_failed(w, rc);
}

/* Output column p of a kept entry of group t, set in the bitmap. */
static inline void ranked_set(uint64_t *restrict bits, uint8_t *restrict tag, int64_t p, uint8_t t,
                              int64_t *w_lo, int64_t *w_hi)
{
    bits[p >> 6] |= (uint64_t)1 << (p & 63);
    tag[p] = t;
    if (p >> 6 < *w_lo) *w_lo = p >> 6;
    if (p >> 6 > *w_hi) *w_hi = p >> 6;
}

/* Entry j kept by decode_slice_ranked: its output columns (its rank among
 * the selected for an ascending selection, else the positions the lookup
 * table lists: several when the request repeats j), set and tagged with
 * group t.  Returns how many. */
static inline int64_t ranked_hit(const struct iv_query *q, uint64_t *restrict bits, uint8_t *restrict tag,
                                 uint64_t j, uint8_t t, int64_t *w_lo, int64_t *w_hi)
{
    if (q->lut_rank) {
        ranked_set(bits, tag, sel_rank(q, j), t, w_lo, w_hi);
        return 1;
    }
    int64_t a, b;
    lut_range(q, j, &a, &b);
    for (int64_t k = a; k < b; k++) ranked_set(bits, tag, q->lut_pos[k], t, w_lo, w_hi);
    return b - a;
}

/*
 * decode_slice_dense for a selection of minor elements (one with the
 * selection's bitmap, sel_bits): each kept entry goes straight into the
 * bitmap over the output columns at its output column (its rank, for an
 * ascending selection), tagged with its group, and the slice is emitted
 * from there as the dense path's are: no pairs, no ordering pass, no
 * emit_pairs.  Varints are walked as in decode_slice.  A column stored
 * twice (only two groups can hold one) leaves the bitmap with fewer
 * entries than were kept, which emit_dense_slice reports.  The caller
 * reserved room for the row's entries (row_out_bound) plus DENSE_SLACK.
 */
static int64_t decode_slice_ranked(const struct iv_query *q, struct work *w, int64_t s,
                                   struct outbuf *o, iv_err_t *err)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *mp = ds->m.major_ptr, *vp = ds->m.value_ptr;
    uint64_t n_minor = (uint64_t)ds->m.n_minor;
    const uint64_t *sel = q->sel_bits;
    IV_TRY(seek_slice(q, w, s, err));
    IV_TRY(dense_buffers(w, q->n_out_cols, err));
    uint64_t *restrict bits = w->bits;
    uint8_t *restrict tag = w->tag;
    int64_t w_lo = INT64_MAX, w_hi = -1, kept_all = 0;
    struct vwin v = {w->cur.p, w->cur.end, 0, 0};
    int rc = 0;
    for (int64_t g = mp[s]; g < mp[s + 1]; g++) {
        const uint8_t t = (uint8_t)(g - mp[s]);
        uint64_t acc = 0, j = 0;
        int64_t left = vp[g + 1] - vp[g];
        while (left > 0) {
            size_t kept, got = pick_some(q, w, &v, left, n_minor, &acc, sel, &kept);
            if (got > 0) {
                left -= (int64_t)got;
                for (size_t i = 0; i < kept; i++)
                    kept_all += ranked_hit(q, bits, tag, w->picked[i], t, &w_lo, &w_hi);
                continue;
            }
            rc = vwin_step(&v, &w->cur, n_minor, &acc, &j, err);
            if (rc > 0) goto bad_index;
            if (rc < 0) goto fail;
            left--;
            if ((sel[j >> 6] >> (j & 63)) & 1) kept_all += ranked_hit(q, bits, tag, j, t, &w_lo, &w_hi);
        }
    }
    w->cur.p = v.wb ? v.wb + v.off : v.wb;  /* no offset on a NULL window (an empty slice) */
    w->next_slice = s + 1;
    if (kept_all == 0) return 0;
    return emit_dense_slice(q, w, s, o, w_lo, w_hi, kept_all, err);
bad_index:
    rc = slice_bad_index(q, s, err);
fail:
    return dense_slice_failed(w, rc);
}

/* decode_slice_wide's answer when a chunk of the wide copy could not be
 * read: the slice is left untouched for the packed stream. */
enum { WIDE_UNREAD = -1000000 };

/*
 * decode_slice_ranked over the wide copy (widefile.h): a slice's entries
 * are the two-byte indices k = value_ptr[g] .. value_ptr[g + 1] of each of
 * its groups g, at byte 2k of the copy, each run of them tested against
 * the selection sixteen at a time (widepick.h), the kept set in the
 * bitmap over the output columns as decode_slice_ranked sets them.  No
 * row index, no cursor: the packed cursor is left where it was.  When a
 * chunk of the copy cannot be read (it failed its checks: the copy is
 * dropped, iv_dataset_drop_wide), the bitmap is cleared and WIDE_UNREAD
 * returned, so that the caller decodes the slice from the packed stream
 * and the answer stays the same.
 */
static int64_t decode_slice_wide(const struct iv_query *q, struct work *w, int64_t s, struct outbuf *o,
                                 iv_err_t *err)
{
    iv_dataset_t *ds = q->ds;
    const int64_t *mp = ds->m.major_ptr, *vp = ds->m.value_ptr;
    const uint64_t *sel = q->sel_bits;
    const uint64_t per = IV_PLAIN_CHUNK / 2;   /* entries a chunk of the copy */
    IV_TRY(dense_buffers(w, q->n_out_cols, err));
    uint64_t *restrict bits = w->bits;
    uint8_t *restrict tag = w->tag;
    int64_t w_lo = INT64_MAX, w_hi = -1, kept_all = 0;
    uint64_t held = UINT64_MAX;
    const uint8_t *data = NULL;
    size_t len = 0;
    int64_t rc = 0;
    for (int64_t g = mp[s]; g < mp[s + 1]; g++) {
        const uint8_t t = (uint8_t)(g - mp[s]);
        for (uint64_t k = (uint64_t)vp[g], end = (uint64_t)vp[g + 1]; k < end;) {
            uint64_t c = k / per, at = k - c * per;
            if (c != held) {
                if (held != UINT64_MAX) iv_stream_release(q->wide, held);
                held = UINT64_MAX;
                iv_err_t sub;
                iv_err_clear(&sub);
                if (iv_stream_acquire(q->wide, c, &data, &len, NULL, &sub) < 0) {
                    iv_dataset_drop_wide(ds);
                    rc = WIDE_UNREAD;
                    goto out;
                }
                held = c;
            }
            uint64_t n = end - k < per - at ? end - k : per - at;
            if (n > IV_WIDE_PICK_MAX) n = IV_WIDE_PICK_MAX;
            if ((at + n) * 2 > len) {
                rc = iv_fail(err, IV_ECORRUPT, "%s: its wide copy ends inside slice %" PRId64, ds->where, s);
                goto out;
            }
            int64_t kept = q->pick ? iv_wide_pick_avx512(data + 2 * at, (size_t)n, (uint32_t)ds->m.n_minor, sel,
                                                         w->picked)
                                   : iv_wide_pick(data + 2 * at, (size_t)n, (uint32_t)ds->m.n_minor, sel,
                                                  w->picked);
            if (kept < 0) {
                rc = slice_bad_index(q, s, err);
                goto out;
            }
            for (int64_t i = 0; i < kept; i++)
                kept_all += ranked_hit(q, bits, tag, w->picked[i], t, &w_lo, &w_hi);
            k += n;
        }
    }
out:
    if (held != UINT64_MAX) iv_stream_release(q->wide, held);
    if (rc < 0) {
        dense_clear(w);
        return rc;
    }
    if (kept_all == 0) return 0;
    return emit_dense_slice(q, w, s, o, w_lo, w_hi, kept_all, err);
}

/* Whether slice s can go through the bitmap over the output columns (the
 * dense and ranked decoders): a bitmap of at most 2^26 columns, and a
 * group tag of one byte. */
static int bitmap_fits(const struct iv_query *q, int64_t s)
{
    return q->n_out_cols > 0 && q->n_out_cols <= ((int64_t)1 << 26) &&
           q->ds->m.major_ptr[s + 1] - q->ds->m.major_ptr[s] <= DENSE_MAX_GROUPS;
}

/* Whether slice s takes decode_slice_ranked. */
static int ranked_fits(const struct iv_query *q, int64_t s)
{
    return q->sel_bits && !q->minor_all && bitmap_fits(q, s);
}

/* Whether slice s, of `total` entries, takes decode_slice_dense. */
static int dense_fits(const struct iv_query *q, int64_t s, int64_t total)
{
    return q->minor_all && total * 64 >= q->n_out_cols / 16 && bitmap_fits(q, s);
}

/* Appends the output row of slice s to o: 0 or a negative error. */
static int decode_row(const struct iv_query *q, struct work *w, int64_t s, struct outbuf *o,
                      iv_err_t *err)
{
    int64_t total = slice_nnz(q->ds, s);
    if (dense_fits(q, s, total)) {
        IV_TRY(outbuf_reserve(o, o->n + total + DENSE_SLACK, err));
        int64_t n = decode_slice_dense(q, w, s, o, err);
        return n < 0 ? (int)n : 0;
    }
    if (ranked_fits(q, s)) {
        IV_TRY(outbuf_reserve(o, o->n + row_out_bound(q, total) + DENSE_SLACK, err));
        int64_t n = q->wide ? decode_slice_wide(q, w, s, o, err) : WIDE_UNREAD;
        if (n == WIDE_UNREAD) n = decode_slice_ranked(q, w, s, o, err);
        return n < 0 ? (int)n : 0;
    }
    int64_t n = decode_slice(q, w, s, err);
    if (n < 0) return (int)n;
    IV_TRY(outbuf_reserve(o, o->n + n, err));
    emit_pairs(o, w, n, q->ds->m.values);
    return 0;
}

/* A block's row arrays, and its output arrays at once when the pointers
 * give its size (every column selected). */
static int alloc_major_block(const iv_query_t *q, int64_t r0, int64_t r1, iv_block_t *out,
                             struct outbuf *o, iv_err_t *err)
{
    int64_t nr = r1 - r0;
    out->ids = malloc((size_t)(nr ? nr : 1) * sizeof(int64_t));
    out->indptr = malloc((size_t)(nr + 1) * sizeof(int64_t));
    if (!out->ids || !out->indptr) return iv_fail(err, IV_ENOMEM, "out of memory for a block");
    out->indptr[0] = 0;
    if (!q->minor_all) return 0;
    int64_t want = 0;
    for (int64_t r = r0; r < r1; r++) want += slice_nnz(q->ds, q->row_ids ? q->row_ids[r] : r);
    return outbuf_reserve(o, want + DENSE_SLACK, err);
}

/*
 * Rows ahead of the one being decoded whose memory is asked for early: a
 * random selection's rows are each a few dependent cache misses away.
 * PREFETCH_FAR rows ahead: the entry table, the group pointers, the
 * checkpoint; PREFETCH_NEAR: the entry pointers and values those name;
 * PREFETCH_SLOT: the stream chunk's slot; PREFETCH_NEXT: all the row's
 * bytes in the chunk, when cached.  Each stage reads only what an earlier
 * one asked for: the wide copy's slot is found from the entry pointers,
 * which NEAR only asks for (asking for the slot there waited for them:
 * bench_select, one thread, 1.26 M atlas, 2 cores: 12.10-12.16 ->
 * 11.65-11.81 ms best).  A row's entry pointers (about 8.6 of 8 bytes)
 * mostly straddle two cache lines, and its group pointers one time in
 * eight: both lines asked for, wide copy 12.24-12.85 -> 11.24-11.39 ms,
 * packed stream 15.5-15.9 -> 13.9-14.7 ms (builds alternating).
 * Measured over HTTP on 2 cores (1.26 M atlas, 1 GiB, the plain copy,
 * 10k x 2,000 at 4 connections, builds alternating): 64.0 req/s without,
 * 73.3 with the pointers, 79.0 with the stream's bytes too.
 * The engine alone, the stream all cached (bench_select, one thread):
 * 23.5-24.8 -> 19.9-20.4 ms, where the pointers alone gained nothing.
 * Asking for a row's first cache line only, against all of its bytes:
 * 15.6-16.5 -> 14.7-15.2 ms there, and +1 to +11% on the 16-core
 * machine's 10 M-cell loads (docs/scale.md).
 */
enum { PREFETCH_NEXT = 2, PREFETCH_SLOT = 3, PREFETCH_NEAR = 4, PREFETCH_FAR = 8 };

static void prefetch_far(const iv_query_t *q, int64_t s)
{
    const iv_dataset_t *ds = q->ds;
    const int64_t *at = atomic_load_explicit(&ds->nnz_at, memory_order_relaxed);
    if (at) __builtin_prefetch(&at[s]);
    __builtin_prefetch(&ds->m.major_ptr[s]);
    __builtin_prefetch(&ds->m.major_ptr[s + 1]);
    if (ds->ri.off) __builtin_prefetch(&ds->ri.off[ds->ri.stride == 1 ? s : s / (int64_t)ds->ri.stride]);
}

/* Slice s's place in the stream: its chunk's slot (bytes 0), or all its
 * cached bytes (1), up to the next slice's checkpoint (a row of the atlas
 * is about 14 cache lines; asking for the first alone left the kernel
 * waiting for the rest).  Only where every slice is a checkpoint. */
static void prefetch_stream(const iv_query_t *q, int64_t s, int bytes)
{
    const iv_dataset_t *ds = q->ds;
    if (q->wide && ranked_fits(q, s)) {   /* decode_slice_wide's bytes */
        uint64_t at = 2 * (uint64_t)ds->m.value_ptr[ds->m.major_ptr[s]];
        iv_stream_prefetch(q->wide, at, bytes ? 2 * (uint64_t)slice_nnz(ds, s) : 0);
        return;
    }
    if (ds->ri.stride != 1 || !ds->ri.off || !q->stream) return;
    uint64_t at = ds->ri.off[s], len = 0;
    if (bytes) len = (uint64_t)s + 1 < ds->ri.n_ckpt && ds->ri.off[s + 1] > at ? ds->ri.off[s + 1] - at : 1;
    iv_stream_prefetch(q->stream, at, len);
}

static void prefetch_near(const iv_query_t *q, int64_t s)
{
    const iv_dataset_t *ds = q->ds;
    int64_t g = ds->m.major_ptr[s], e = ds->m.major_ptr[s + 1];
    size_t esz = iv_dtype_size(q->dtype);
    /* A row's eight or so entry pointers mostly straddle two lines: both. */
    __builtin_prefetch(&ds->m.value_ptr[g]);
    __builtin_prefetch(&ds->m.value_ptr[e]);
    __builtin_prefetch((const char *)ds->m.values + (size_t)g * esz);
    if (e > g) __builtin_prefetch((const char *)ds->m.values + (size_t)(e - 1) * esz);
}

static int decode_major_block(iv_query_t *q, int64_t r0, int64_t r1, iv_block_t *out, iv_err_t *err)
{
    struct work *w = work_get(q);
    if (!w) return iv_fail(err, IV_ENOMEM, "out of memory for a block");
    struct outbuf o = {.isz = q->index_size, .esz = iv_dtype_size(q->dtype)};
    int rc = alloc_major_block(q, r0, r1, out, &o, err);
    if (rc < 0) goto done;
    for (int64_t r = r0; r < r1; r++) {
        if (atomic_load_explicit(&q->cancelled, memory_order_relaxed)) {
            rc = iv_fail(err, IV_ECANCELLED, "query cancelled");
            goto done;
        }
        int64_t s = q->row_ids ? q->row_ids[r] : r;
        if (q->row_ids) {
            if (r + PREFETCH_FAR < r1) prefetch_far(q, q->row_ids[r + PREFETCH_FAR]);
            if (r + PREFETCH_NEAR < r1) prefetch_near(q, q->row_ids[r + PREFETCH_NEAR]);
            if (r + PREFETCH_SLOT < r1) prefetch_stream(q, q->row_ids[r + PREFETCH_SLOT], 0);
            if (r + PREFETCH_NEXT < r1) prefetch_stream(q, q->row_ids[r + PREFETCH_NEXT], 1);
        }
        out->ids[r - r0] = s;
        if ((rc = decode_row(q, w, s, &o, err)) < 0) goto done;
        out->indptr[r - r0 + 1] = o.n;
    }
done:
    work_put(q, w);
    out->indices = o.indices;
    out->data = o.data;
    out->nnz = o.n;
    if (rc < 0) iv_block_free(out);
    return rc;
}

/* ---- IVCSC transpose ---- */

struct tpass {
    iv_query_t *q;
    int fill;                 /* 0: count, 1: fill */
    int64_t n_parts;
    uint32_t **cnt;           /* per part: n_out_rows counters / write offsets (fill) */
    int64_t **off;            /* fill: per part write offsets */
    iv_err_t err;
    atomic_int failed;
};

/* Counts the n pairs decoded for transposed column k per output row
 * (count pass), or writes them at the part's offsets (fill pass). */
static void tpass_slice(const struct tpass *t, size_t part, const struct work *w, int64_t n,
                        int64_t k)
{
    const iv_query_t *q = t->q;
    if (!t->fill) {
        uint32_t *c = t->cnt[part];
        for (int64_t i = 0; i < n; i++) c[w->pos[i]]++;
        return;
    }
    size_t esz = iv_dtype_size(q->dtype);
    int64_t *off = t->off[part];
    for (int64_t i = 0; i < n; i++) {
        int64_t at = off[w->pos[i]]++;
        if (q->index_size == 4) ((int32_t *)q->t_indices)[at] = (int32_t)k;
        else ((int64_t *)q->t_indices)[at] = k;
        copy_value((char *)q->t_data + (size_t)at * esz, q->ds->m.values, w->gid[i], esz);
    }
}

static void tpass_part(void *arg, size_t part)
{
    struct tpass *t = arg;
    iv_query_t *q = t->q;
    int64_t k0 = q->n_t_cols * (int64_t)part / t->n_parts;
    int64_t k1 = q->n_t_cols * (int64_t)(part + 1) / t->n_parts;
    struct work *w = work_get(q);
    iv_err_t e = {0};
    if (!w) {
        if (atomic_exchange(&t->failed, 1) == 0) iv_fail(&t->err, IV_ENOMEM, "out of memory");
        return;
    }
    for (int64_t k = k0; k < k1 && !atomic_load(&t->failed); k++) {
        if (atomic_load_explicit(&q->cancelled, memory_order_relaxed)) {
            iv_fail(&e, IV_ECANCELLED, "query cancelled");
            break;
        }
        int64_t n = decode_slice(q, w, q->t_cols ? q->t_cols[k] : k, &e);
        if (n < 0) break;
        tpass_slice(t, part, w, n, k);
    }
    work_put(q, w);
    if (e.code != 0 && atomic_exchange(&t->failed, 1) == 0) t->err = e;
}

/*
 * The rows' totals and the parts' write offsets, over a range of output
 * rows.  First call (offsets 0): each range's number of entries, in
 * range_tot[i + 1].  Second call, once range_tot holds the prefix sums:
 * the row pointers and, per part, where its entries of each row start
 * (the parts in order, since they hold ascending output columns).
 */
struct tsum {
    struct tpass *t;
    int64_t nr, n_ranges;
    int64_t *range_tot;   /* n_ranges + 1 */
    int offsets;
};

static void tsum_range(void *arg, size_t i)
{
    struct tsum *ts = arg;
    struct tpass *t = ts->t;
    int64_t *indptr = t->q->t_indptr;
    int64_t r0 = ts->nr * (int64_t)i / ts->n_ranges, r1 = ts->nr * (int64_t)(i + 1) / ts->n_ranges;
    if (!ts->offsets) {
        int64_t tot = 0;
        for (int64_t p = 0; p < t->n_parts; p++) {
            const uint32_t *c = t->cnt[p];
            for (int64_t r = r0; r < r1; r++) tot += c[r];
        }
        ts->range_tot[i + 1] = tot;
        return;
    }
    int64_t at = ts->range_tot[i];
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t p = 0; p < t->n_parts; p++) {
            t->off[p][r] = at;
            at += t->cnt[p][r];
        }
        indptr[r + 1] = at;
    }
}

/* A transpose over the request's bound: IV_ETOO_LARGE naming it. */
static int too_big(const iv_query_t *q, uint64_t need, iv_err_t *err)
{
    return iv_fail(err, IV_ETOO_LARGE,
                   "turning %" PRId64 " %s into %" PRId64 " %s rows needs %" PRIu64
                   " bytes in memory before the first byte is sent, more than the %" PRId64
                   " a request may hold (max_answer_bytes); ask for %s rows (by=%s), or select less",
                   q->n_t_cols, q->by_var ? "cells" : "genes", q->n_slots,
                   q->by_var ? "gene" : "cell", need, q->work_bytes, q->by_var ? "cell" : "gene",
                   q->by_var ? "obs" : "var");
}

/* The expanded size of every slot's row when columns repeat: each entry
 * counts as many times as its slice is listed. */
static int expand_sizes(iv_query_t *q, iv_err_t *err)
{
    q->t_exp = malloc((size_t)(q->n_slots + 1) * sizeof *q->t_exp);
    if (!q->t_exp) return iv_fail(err, IV_ENOMEM, "out of memory preparing a transpose");
    q->t_exp[0] = 0;
    for (int64_t s = 0; s < q->n_slots; s++) {
        int64_t z = 0;
        for (int64_t i = q->t_indptr[s]; i < q->t_indptr[s + 1]; i++) {
            int64_t u = q->index_size == 4 ? ((const int32_t *)q->t_indices)[i]
                                           : ((const int64_t *)q->t_indices)[i];
            z += q->col_kptr[u + 1] - q->col_kptr[u];
        }
        q->t_exp[s + 1] = q->t_exp[s] + z;
    }
    return 0;
}

/*
 * How many parts (each a counter and an offset per output row) the
 * transpose's passes split its columns into.
 */
static int64_t transpose_parts(const iv_query_t *q, iv_pool_t *pool)
{
    int64_t nr = q->n_slots;
    int64_t parts = (int64_t)iv_pool_threads(pool) + 1;
    /* Bound the per-part counters to about 512 MiB in all, and to the
     * request's bound; one part's and the row pointers must fit it. */
    uint64_t cap = (uint64_t)512 << 20;
    if (q->work_bytes > 0 && (uint64_t)q->work_bytes < cap) cap = (uint64_t)q->work_bytes;
    while (parts > 1 && (uint64_t)parts * (uint64_t)nr * 12 + (uint64_t)nr * 8 > cap) parts--;
    if (parts > q->n_t_cols) parts = q->n_t_cols;
    /* Each part has a counter and an offset per output row, which it
     * zeroes, sums and faults in whatever its slices hold: p parts cost
     * about p * rows on top of the decode, which p divides.  For a few
     * genes over a million cells one part or two are fastest (the pool's
     * 17 parts spent most of 50 genes' time on 260 MB of counters); the
     * count is the largest p with p^2 * rows <= 4 * entries decoded. */
    double work = 0;
    for (int64_t k = 0; k < q->n_t_cols; k++)
        work += (double)slice_nnz(q->ds, q->t_cols ? q->t_cols[k] : k);
    while (parts > 1 && (double)parts * (double)parts * (double)nr > 4.0 * work) parts--;
    if (parts < 1) parts = 1;
    return parts;
}

/* The parts' counter arrays (zeroed) and the row pointers. */
static int tpass_alloc(struct tpass *t, int64_t nr, iv_err_t *err)
{
    t->cnt = calloc((size_t)t->n_parts, sizeof *t->cnt);
    t->off = calloc((size_t)t->n_parts, sizeof *t->off);
    t->q->t_indptr = calloc((size_t)nr + 1, sizeof(int64_t));
    if (!t->cnt || !t->off || !t->q->t_indptr)
        return iv_fail(err, IV_ENOMEM, "out of memory preparing a transpose");
    for (int64_t p = 0; p < t->n_parts; p++) {
        t->cnt[p] = calloc((size_t)(nr ? nr : 1), sizeof(uint32_t));
        if (!t->cnt[p]) return iv_fail(err, IV_ENOMEM, "out of memory preparing a transpose");
    }
    return 0;
}

static void tpass_free(struct tpass *t)
{
    if (t->cnt)
        for (int64_t p = 0; p < t->n_parts; p++) free(t->cnt[p]);
    if (t->off)
        for (int64_t p = 0; p < t->n_parts; p++) free(t->off[p]);
    free(t->cnt);
    free(t->off);
}

/* One pass over the selected columns on the pool: count or fill. */
static int tpass_run(iv_pool_t *pool, struct tpass *t, int fill, iv_err_t *err)
{
    t->fill = fill;
    iv_pool_parallel_for(pool, (size_t)t->n_parts, 0, tpass_part, t);
    if (atomic_load(&t->failed)) return iv_fail(err, t->err.code, "%s", t->err.msg);
    return 0;
}

/* Row totals in parallel over ranges of rows: the counters are parts x
 * rows whatever the selection holds, which one thread walks slowly for
 * a million cells.  Leaves the prefix sums in ts->range_tot. */
static int sum_ranges(iv_pool_t *pool, struct tsum *ts, iv_err_t *err)
{
    int64_t nr = ts->nr, parts = ts->t->n_parts;
    ts->n_ranges = parts * 4 < nr ? parts * 4 : (nr ? nr : 1);
    ts->range_tot = calloc((size_t)ts->n_ranges + 1, sizeof *ts->range_tot);
    if (!ts->range_tot) return iv_fail(err, IV_ENOMEM, "out of memory preparing a transpose");
    iv_pool_parallel_for(pool, (size_t)ts->n_ranges, 0, tsum_range, ts);
    for (int64_t i = 0; i < ts->n_ranges; i++) ts->range_tot[i + 1] += ts->range_tot[i];
    return 0;
}

/* The transpose's nnz entries and the parts' write offsets, once the
 * request's bound (if any) is known to hold them. */
static int alloc_entries(struct tpass *t, int64_t nr, int64_t nnz, iv_err_t *err)
{
    iv_query_t *q = t->q;
    size_t esz = iv_dtype_size(q->dtype);
    if (q->work_bytes > 0) {
        /* What the fill holds at once: the entries, the row pointers, each
         * part's offsets, and the expanded sizes when columns repeat. */
        uint64_t need = (uint64_t)nnz * ((uint64_t)q->index_size + esz) +
                        (uint64_t)(nr + 1) * 8 * (q->col_kptr ? 2 : 1) + (uint64_t)t->n_parts * nr * 8;
        if (need > (uint64_t)q->work_bytes) return too_big(q, need, err);
    }
    q->t_indices = malloc((size_t)(nnz ? nnz : 1) * (size_t)q->index_size);
    q->t_data = malloc((size_t)(nnz ? nnz : 1) * esz);
    if (!q->t_indices || !q->t_data)
        return iv_fail(err, IV_ENOMEM, "out of memory for %" PRId64 " transposed entries", nnz);
    for (int64_t p = 0; p < t->n_parts; p++) {
        t->off[p] = malloc((size_t)(nr ? nr : 1) * sizeof(int64_t));
        if (!t->off[p]) return iv_fail(err, IV_ENOMEM, "out of memory preparing a transpose");
    }
    return 0;
}

/* Once filled: rows expanded for repeated columns, the exact output
 * size, and the blocks. */
static int plan_transposed(iv_query_t *q, iv_err_t *err)
{
    if (q->col_kptr) IV_TRY(expand_sizes(q, err));
    int64_t out = 0;
    for (int64_t r = 0; r < q->n_out_rows; r++) out += out_row_size(q, r);
    q->nnz_hint = out;
    IV_TRY(plan_blocks(q, err));
    q->prepared = 1;
    return 0;
}

/*
 * The transpose in stages: count each output row's entries per part,
 * sum the counts into row pointers and per-part offsets, allocate the
 * entries, fill them, then plan the blocks.
 */
int iv_query_prepare(iv_query_t *q, iv_pool_t *pool, iv_err_t *err)
{
    if (q->prepared) return 0;
    int64_t nr = q->n_slots;
    if (q->work_bytes > 0 && (uint64_t)nr * 20 > (uint64_t)q->work_bytes)
        return too_big(q, (uint64_t)nr * 20, err);
    struct tpass t = {.q = q, .n_parts = transpose_parts(q, pool)};
    struct tsum ts = {.t = &t, .nr = nr};
    atomic_init(&t.failed, 0);
    int rc;
    if ((rc = tpass_alloc(&t, nr, err)) < 0) goto done;
    if ((rc = tpass_run(pool, &t, 0, err)) < 0) goto done;
    if ((rc = sum_ranges(pool, &ts, err)) < 0) goto done;
    if ((rc = alloc_entries(&t, nr, ts.range_tot[ts.n_ranges], err)) < 0) goto done;
    ts.offsets = 1;
    iv_pool_parallel_for(pool, (size_t)ts.n_ranges, 0, tsum_range, &ts);
    for (int64_t p = 0; p < t.n_parts; p++) {
        free(t.cnt[p]);
        t.cnt[p] = NULL;
    }
    if ((rc = tpass_run(pool, &t, 1, err)) < 0) goto done;
    rc = plan_transposed(q, err);
done:
    tpass_free(&t);
    free(ts.range_tot);
    return rc;
}

/* The block's arrays for output rows [r0, r1), and in *pairs room for
 * the widest row's expanded pairs when columns repeat (else NULL). */
static int alloc_transposed_block(const iv_query_t *q, int64_t r0, int64_t r1, iv_block_t *out,
                                  int64_t **pairs, iv_err_t *err)
{
    int64_t nr = r1 - r0, nnz = 0, widest = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t z = out_row_size(q, r);
        nnz += z;
        if (z > widest) widest = z;
    }
    size_t esz = iv_dtype_size(q->dtype), isz = (size_t)q->index_size;
    out->ids = malloc((size_t)(nr ? nr : 1) * sizeof(int64_t));
    out->indptr = malloc((size_t)(nr + 1) * sizeof(int64_t));
    out->indices = malloc((size_t)(nnz ? nnz : 1) * isz);
    out->data = malloc((size_t)(nnz ? nnz : 1) * esz);
    *pairs = q->col_kptr && widest ? malloc((size_t)widest * 2 * sizeof **pairs) : NULL;
    if (!out->ids || !out->indptr || !out->indices || !out->data || (q->col_kptr && widest && !*pairs)) {
        free(*pairs);
        iv_block_free(out);
        return iv_fail(err, IV_ENOMEM, "out of memory for a block");
    }
    return 0;
}

/* Copies slot entries [a, b) to out at entry `at` once per output column
 * their slice fills, in column order (pairs: scratch for them all).
 * Returns the number of entries written. */
static int64_t copy_expanded_row(const iv_query_t *q, int64_t a, int64_t b, int64_t *pairs,
                                 iv_block_t *out, int64_t at)
{
    size_t esz = iv_dtype_size(q->dtype), isz = (size_t)q->index_size;
    int64_t m = 0;
    for (int64_t i = a; i < b; i++) {
        int64_t u = isz == 4 ? ((const int32_t *)q->t_indices)[i] : ((const int64_t *)q->t_indices)[i];
        for (int64_t t = q->col_kptr[u]; t < q->col_kptr[u + 1]; t++) {
            pairs[2 * m] = q->col_k[t];
            pairs[2 * m + 1] = i;
            m++;
        }
    }
    /* pairs is NULL when every row of the block is empty (widest 0),
     * and qsort's pointer may not be, even for no elements. */
    if (m > 1) qsort(pairs, (size_t)m, 2 * sizeof *pairs, pair_cmp);
    for (int64_t x = 0; x < m; x++, at++) {
        if (isz == 4) ((int32_t *)out->indices)[at] = (int32_t)pairs[2 * x];
        else ((int64_t *)out->indices)[at] = pairs[2 * x];
        memcpy((char *)out->data + (size_t)at * esz,
               (const char *)q->t_data + (size_t)pairs[2 * x + 1] * esz, esz);
    }
    return m;
}

/*
 * Output rows [r0, r1) from the prepared transpose: each row is its
 * slot's, copied as it is when columns are distinct, else every entry
 * once per output column its slice fills, put in column order.
 */
static int copy_transposed_block(iv_query_t *q, int64_t r0, int64_t r1, iv_block_t *out,
                                 iv_err_t *err)
{
    int64_t *pairs;
    IV_TRY(alloc_transposed_block(q, r0, r1, out, &pairs, err));
    size_t esz = iv_dtype_size(q->dtype), isz = (size_t)q->index_size;
    int64_t at = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t s = q->row_slot ? q->row_slot[r] : r, a = q->t_indptr[s], b = q->t_indptr[s + 1];
        out->ids[r - r0] = q->row_ids ? q->row_ids[r] : r;
        out->indptr[r - r0] = at;
        if (q->col_kptr) {
            at += copy_expanded_row(q, a, b, pairs, out, at);
            continue;
        }
        memcpy((char *)out->indices + (size_t)at * isz, (char *)q->t_indices + (size_t)a * isz,
               (size_t)(b - a) * isz);
        memcpy((char *)out->data + (size_t)at * esz, (char *)q->t_data + (size_t)a * esz,
               (size_t)(b - a) * esz);
        at += b - a;
    }
    out->indptr[r1 - r0] = at;
    out->nnz = at;
    free(pairs);
    return 0;
}

int iv_query_decode_block(iv_query_t *q, int64_t b, iv_block_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (!q->prepared) return iv_fail(err, IV_EINTERNAL, "query decoded before prepare");
    if (b < 0 || b >= q->n_blocks)
        return iv_fail(err, IV_EINTERNAL, "block %" PRId64 " of %" PRId64, b, q->n_blocks);
    if (atomic_load(&q->cancelled)) return iv_fail(err, IV_ECANCELLED, "query cancelled");
    int64_t r0 = q->block_start[b], r1 = q->block_start[b + 1];
    out->row0 = r0;
    out->n_rows = r1 - r0;
    out->index_size = q->index_size;
    out->dtype = q->dtype;
    if (q->mode == MODE_TRANSPOSE) return copy_transposed_block(q, r0, r1, out, err);
    return decode_major_block(q, r0, r1, out, err);
}
