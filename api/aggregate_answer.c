/*
 * GET|POST /v1/datasets/{id}/aggregate: statistics of the selected genes
 * over groups of cells (core/meta/aggregate.c), the selection decoded on
 * the pool from the worker that runs the request.
 */
#include "viewer_impl.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregate.h"
#include "enc_viewer.h"
#include "meta_doc.h"
#include "query.h"
#include "select.h"

/* Most group combinations an aggregate may span, and the memory its
 * partial accumulators may take together. */
#define AGG_MAX_COMBOS ((int64_t)1 << 20)
#define AGG_PART_BUDGET ((size_t)512 << 20)
#define AGG_MAX_GROUP_BY 8

typedef struct aggrun {
    iv_query_t *q;
    iv_agg_t *acc;
    const int32_t *cell_group;   /* group of each position of the obs selection */
    int cell_major;              /* blocks are cell rows (IVCSR) */
    int64_t n_blocks;
    unsigned n_parts;
    const atomic_int *cancel;    /* the request's (iv_vreq_t.cancel), or NULL */
    atomic_int failed;
    pthread_mutex_t mu;
    int rc;
    iv_err_t err;
} aggrun_t;

/* Partial p takes blocks p, p + n_parts, ...: a fixed assignment, so the
 * float sums do not depend on which thread ran what. */
static void agg_part(void *arg, size_t part)
{
    aggrun_t *ar = arg;
    for (int64_t b = (int64_t)part; b < ar->n_blocks && !atomic_load(&ar->failed); b += ar->n_parts) {
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        iv_err_t e;
        iv_err_clear(&e);
        int rc = ar->cancel && atomic_load_explicit(ar->cancel, memory_order_relaxed)
                     ? iv_fail(&e, IV_ECANCELLED, "aggregate cancelled")
                     : iv_query_decode_block(ar->q, b, &blk, &e);
        if (rc != 0) {
            pthread_mutex_lock(&ar->mu);
            if (ar->rc == 0) {
                ar->rc = rc;
                ar->err = e;
            }
            pthread_mutex_unlock(&ar->mu);
            atomic_store(&ar->failed, 1);
            iv_block_free(&blk);
            return;
        }
        if (ar->cell_major)
            iv_agg_add_rows(ar->acc, (unsigned)part, blk.n_rows, ar->cell_group + blk.row0, blk.indptr,
                            blk.indices, blk.index_size, blk.data, blk.dtype);
        else
            iv_agg_add_cols(ar->acc, (unsigned)part, blk.row0, blk.n_rows, ar->cell_group, blk.indptr,
                            blk.indices, blk.index_size, blk.data, blk.dtype);
        iv_block_free(&blk);
    }
}

/* IV_ECANCELLED once the request's cancel flag is set, between phases. */
static int vreq_cancelled(const iv_vreq_t *r, iv_err_t *err)
{
    if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed))
        return iv_fail(err, IV_ECANCELLED, "request cancelled");
    return 0;
}

/* An aggregate through its stages: the request, the groups, the decode
 * and the result.  What it owns is freed by agg_free. */
typedef struct agg {
    params_t p;
    iv_dataset_t *mds;            /* the matrix aggregated: X, a layer or raw/X */
    iv_meta_t *var_meta;          /* its genes: var, or raw/var for raw/X */
    const iv_dataset_info_t *in;  /* mds's */
    const char **gb, **st;        /* group_by and stats as given (owned arrays) */
    size_t n_gb, n_st;
    int64_t ddof;                 /* 1 unless the request says 0 */
    const iv_meta_col_t *gcols[AGG_MAX_GROUP_BY];
    int stat_bits[IV_STAT_COUNT];  /* the stats in the order given */
    unsigned mask;
    int64_t n_combos;             /* category combinations of the group_by columns */
    iv_fmt_t fmt;
    iv_sel_t so, sv;              /* sv lists each distinct gene once (agg_distinct_genes) */
    int64_t n_obs, n_var;         /* cells and genes selected (genes as listed) */
    int32_t *cell_group;          /* group of each position of the obs selection, or -1 */
    int64_t *combo_dense;         /* group of each combination, or -1 */
    int64_t *n_cells, *combo_of_group;  /* each group's cells and combination */
    int64_t n_groups;
    int64_t *ugenes, *gene_at, n_ug;    /* the distinct genes, and where each listed one is among them */
    int64_t n_dv;                 /* genes decoded */
    size_t part;                  /* bytes of one partial accumulator */
    iv_query_t *q;
    iv_agg_t *acc;
    double *vals, *dvals;         /* the result (per stat, group-major); dvals: per distinct gene */
} agg_t;

static void agg_free(agg_t *a)
{
    iv_agg_free(a->acc);
    iv_query_free(a->q);
    free(a->vals);
    free(a->dvals);
    free(a->ugenes);
    free(a->gene_at);
    free(a->cell_group);
    free(a->combo_dense);
    free(a->combo_of_group);
    free(a->n_cells);
    free(a->gb);
    free(a->st);
    vr_params_free(&a->p);
}

/* The route's parameters, and the matrix "matrix" names. */
static int agg_parse(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(vr_params_parse(&a->p, r, a->in->n_rows, a->in->n_cols, err));
    IV_TRY(vr_param_list(&a->p, 0, &a->gb, &a->n_gb, err));
    IV_TRY(vr_param_list(&a->p, 1, &a->st, &a->n_st, err));
    IV_TRY(vr_param_int(&a->p, 2, 0, 1, &a->ddof, err));
    if (a->p.qr.matrix && r->matrix_open) {
        IV_TRY(r->matrix_open(r->matrix_ctx, a->p.qr.matrix, &a->mds, &a->var_meta, err));
        a->in = iv_dataset_info(a->mds);
    }
    return 0;
}

static int check_agg_lists(const agg_t *a, iv_err_t *err)
{
    if (a->n_gb == 0 || a->n_gb > AGG_MAX_GROUP_BY)
        return iv_fail(err, IV_EBAD_REQUEST, "group_by must name 1 to %d categorical obs columns",
                       AGG_MAX_GROUP_BY);
    if (a->n_st == 0)
        return iv_fail(err, IV_EBAD_REQUEST, "stats must name at least one of sum, mean, var, nnz, "
                       "frac_nonzero, max");
    return 0;
}

/* The statistics named, each once. */
static int agg_stats(agg_t *a, iv_err_t *err)
{
    for (size_t i = 0; i < a->n_st; i++) {
        int bit = iv_stat_parse(a->st[i]);
        if (!bit)
            return iv_fail(err, IV_EBAD_REQUEST, "unknown statistic '%.40s' (expected sum, mean, var, "
                           "nnz, frac_nonzero, max)", a->st[i]);
        if (a->mask & (unsigned)bit)
            return iv_fail(err, IV_EBAD_REQUEST, "statistic '%s' is named twice", a->st[i]);
        a->mask |= (unsigned)bit;
        a->stat_bits[i] = bit;
    }
    return 0;
}

/* The group_by columns: categorical obs columns spanning at most
 * AGG_MAX_COMBOS category combinations. */
static int agg_group_cols(const iv_meta_t *meta, agg_t *a, iv_err_t *err)
{
    a->n_combos = 1;
    for (size_t i = 0; i < a->n_gb; i++) {
        const iv_meta_col_t *c = iv_meta_find_col(meta, IV_AXIS_OBS, a->gb[i]);
        if (!c) return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs has no column '%.80s'", a->gb[i]);
        if (c->type != IV_COL_CATEGORICAL)
            return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs column '%.80s' is %s, not categorical",
                           a->gb[i], iv_col_type_name(c->type));
        a->gcols[i] = c;
        a->n_combos *= c->n_cats > 0 ? c->n_cats : 1;
        if (a->n_combos > AGG_MAX_COMBOS)
            return iv_fail(err, IV_ETOO_LARGE, "group_by spans more than %" PRId64 " category combinations",
                           AGG_MAX_COMBOS);
    }
    return 0;
}

/* The selection's names and filters, and the answer's format. */
static int agg_resolve(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(vreq_cancelled(r, err));
    IV_TRY(iv_rmeta_resolve_query(r->meta, a->var_meta, &a->p.qr, &r->dropped, err));
    IV_TRY(vreq_cancelled(r, err));
    IV_TRY(vr_pick_format(r, a->p.qr.format, MEDIA_AGG, IV_FMT_JSON, &a->fmt, err));
    if (a->fmt == IV_FMT_NDJSON)
        return iv_fail(err, IV_ENOT_ACCEPTABLE, "aggregate answers application/json or " MEDIA_AGG);
    a->so = iv_psel_view(&a->p.qr.obs);
    a->sv = iv_psel_view(&a->p.qr.var);
    a->n_obs = a->so.all ? a->in->n_rows : a->so.n;
    a->n_var = a->sv.all ? a->in->n_cols : a->sv.n;
    return 0;
}

/* The parse of an aggregate request, in order. */
static int agg_request(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(agg_parse(r, a, err));
    IV_TRY(check_agg_lists(a, err));
    IV_TRY(agg_stats(a, err));
    IV_TRY(agg_group_cols(r->meta, a, err));
    return agg_resolve(r, a, err);
}

/* The combination of the group_by categories of a row (mixed radix), or
 * -1: a cell missing any group value is left out, as pandas' groupby
 * drops NaN keys. */
static inline int64_t cell_combo(const agg_t *a, int64_t row)
{
    int64_t code = 0;
    for (size_t g = 0; g < a->n_gb; g++) {
        const iv_meta_col_t *c = a->gcols[g];
        int32_t k = c->codes[row];
        if (k < 0 || k >= c->n_cats || (c->mask && c->mask[row])) return -1;
        code = code * c->n_cats + k;
    }
    return code;
}

/* Observed combinations only, in category order (pandas observed=True):
 * combo_dense counts a combination's cells on entry and holds its group
 * (or -1) on return, and cell_group goes from combinations to groups. */
static int agg_number_groups(agg_t *a, iv_err_t *err)
{
    a->n_groups = 0;
    for (int64_t k = 0; k < a->n_combos; k++)
        if (a->combo_dense[k]) a->n_groups++;
    a->n_cells = malloc((size_t)(a->n_groups ? a->n_groups : 1) * sizeof *a->n_cells);
    a->combo_of_group = malloc((size_t)(a->n_groups ? a->n_groups : 1) * sizeof *a->combo_of_group);
    if (!a->n_cells || !a->combo_of_group) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int64_t k = 0, g = 0; k < a->n_combos; k++) {
        if (!a->combo_dense[k]) {
            a->combo_dense[k] = -1;
            continue;
        }
        a->n_cells[g] = a->combo_dense[k];
        a->combo_of_group[g] = k;
        a->combo_dense[k] = g++;
    }
    for (int64_t i = 0; i < a->n_obs; i++)
        if (a->cell_group[i] >= 0) a->cell_group[i] = (int32_t)a->combo_dense[a->cell_group[i]];
    return 0;
}

/* The obs selection as positions -> rows, and each position's group. */
static int agg_group_cells(agg_t *a, iv_err_t *err)
{
    a->cell_group = malloc((size_t)(a->n_obs ? a->n_obs : 1) * sizeof *a->cell_group);
    a->combo_dense = malloc((size_t)a->n_combos * sizeof *a->combo_dense);
    if (!a->cell_group || !a->combo_dense) return iv_fail(err, IV_ENOMEM, "out of memory");
    for (int64_t k = 0; k < a->n_combos; k++) a->combo_dense[k] = 0;
    for (int64_t i = 0; i < a->n_obs; i++) {
        int64_t code = cell_combo(a, a->so.all ? i : a->so.idx[i]);
        a->cell_group[i] = (int32_t)code;
        if (code >= 0) a->combo_dense[code]++;
    }
    return agg_number_groups(a, err);
}

/* Output size: refuse early rather than after the decode. */
static int check_agg_size(const iv_vreq_t *r, const agg_t *a, iv_err_t *err)
{
    uint64_t cells = (uint64_t)a->n_groups * (uint64_t)a->n_var * a->n_st;
    if (a->fmt == IV_FMT_JSON && cells * 2 > r->json_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes x %zu stats exceed the "
                       "JSON limit of %zu bytes; ask for " MEDIA_AGG,
                       a->n_groups, a->n_var, a->n_st, r->json_bytes);
    /* As for an embedding: never past what every gene once would take,
     * or max_answer_bytes, whichever is larger. */
    /* The values, each gene's entry of the document (about 40 bytes),
     * and the body they are copied into. */
    uint64_t every = (uint64_t)a->n_groups * (uint64_t)a->in->n_cols * a->n_st;
    uint64_t holds = 2 * (cells * sizeof(double) + (uint64_t)a->n_var * 40);
    if (r->answer_bytes && holds > r->answer_bytes && cells > every)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes x %zu stats need %"
                       PRIu64 " bytes, more than the %zu an answer may hold (max_answer_bytes) and "
                       "more than every gene once; select fewer genes or groups",
                       a->n_groups, a->n_var, a->n_st, holds, r->answer_bytes);
    return 0;
}

/* Each distinct gene is decoded and accumulated once; a gene listed
 * again repeats its results (a body naming one gene a million times
 * costs one gene's work).  The accumulators must fit AGG_PART_BUDGET. */
static int agg_distinct_genes(agg_t *a, iv_err_t *err)
{
    if (!a->sv.all) IV_TRY(iv_sel_distinct(a->sv.idx, a->sv.n, &a->ugenes, &a->gene_at, &a->n_ug, err));
    if (a->ugenes) {
        a->sv.n = a->n_ug;
        a->sv.idx = a->ugenes;
    }
    a->n_dv = a->sv.all ? a->in->n_cols : a->sv.n;
    a->part = iv_agg_part_bytes(a->n_groups, a->n_dv, a->mask);
    if (a->part > AGG_PART_BUDGET)
        return iv_fail(err, IV_ETOO_LARGE, "%" PRId64 " groups x %" PRId64 " genes need %zu bytes of "
                       "accumulators, more than the %zu allowed",
                       a->n_groups, a->n_var, a->part, AGG_PART_BUDGET);
    return 0;
}

/* The query's blocks accumulated in n_parts partials on the pool. */
static int agg_accumulate(iv_vreq_t *r, agg_t *a, int64_t nb, unsigned n_parts, iv_err_t *err)
{
    aggrun_t ar;
    memset(&ar, 0, sizeof ar);
    ar.q = a->q;
    ar.acc = a->acc;
    ar.cell_group = a->cell_group;
    ar.cell_major = iv_query_orient(a->q) == IV_IVCSR;
    ar.n_blocks = nb;
    ar.n_parts = n_parts;
    ar.cancel = r->cancel;
    atomic_init(&ar.failed, 0);
    pthread_mutex_init(&ar.mu, NULL);
    iv_err_clear(&ar.err);
    iv_pool_parallel_for(r->pool, n_parts, 0, agg_part, &ar);
    pthread_mutex_destroy(&ar.mu);
    if (ar.rc != 0) {
        *err = ar.err;
        return ar.rc;
    }
    return 0;
}

/*
 * The decode.  Blocks in the serving orientation's own slices, whichever
 * it is: the planner picks the copy that decodes fewer bytes (the
 * gene-major one for a few genes over many cells), and the accumulation
 * follows it.  The pick is explicit: IV_OUT_MAJOR left to the query keeps
 * the file's orientation (50 genes over 1.26 M cells scanned every cell:
 * 328 ms where the gene-major copy takes a few).
 */
static int agg_decode(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    iv_orient_t served = iv_plan_orient(a->mds, &a->so, &a->sv, IV_OUT_MAJOR, NULL);
    iv_query_opts_t qo = {.axis = IV_OUT_MAJOR,
                          .pick = served == IV_IVCSR ? IV_PICK_CELLS : IV_PICK_GENES};
    IV_TRY(iv_query_new(a->mds, &a->so, &a->sv, &qo, &a->q, err));
    int64_t nb = iv_query_n_blocks(a->q);
    unsigned n_parts = r->pool ? iv_pool_threads(r->pool) + 1 : 1;
    if ((int64_t)n_parts > nb) n_parts = nb > 0 ? (unsigned)nb : 1;
    while (n_parts > 1 && a->part * n_parts > AGG_PART_BUDGET) n_parts--;
    IV_TRY(iv_agg_new(a->n_groups, a->n_dv, a->mask, n_parts, &a->acc, err));
    return agg_accumulate(r, a, nb, n_parts, err);
}

/* Each stat's values, per listed gene: a gene listed again repeats its
 * distinct gene's results. */
static int agg_results(agg_t *a, iv_err_t *err)
{
    size_t per = (size_t)a->n_groups * (size_t)a->n_var, dper = (size_t)a->n_groups * (size_t)a->n_dv;
    a->vals = malloc((per ? per : 1) * a->n_st * sizeof *a->vals);
    a->dvals = a->ugenes ? malloc((dper ? dper : 1) * sizeof *a->dvals) : NULL;
    if (!a->vals || (a->ugenes && !a->dvals)) return iv_fail(err, IV_ENOMEM, "out of memory for the result");
    for (size_t s = 0; s < a->n_st; s++) {
        double *out = a->vals + s * per;
        if (!a->ugenes) {
            iv_agg_result(a->acc, a->stat_bits[s], a->n_cells, (int)a->ddof, out);
            continue;
        }
        iv_agg_result(a->acc, a->stat_bits[s], a->n_cells, (int)a->ddof, a->dvals);
        for (int64_t g = 0; g < a->n_groups; g++)
            for (int64_t j = 0; j < a->n_var; j++)
                out[(size_t)(g * a->n_var + j)] = a->dvals[(size_t)(g * a->n_dv + a->gene_at[j])];
    }
    return 0;
}

/* The computation: groups, the size checks, the decode and the result. */
static int agg_compute(iv_vreq_t *r, agg_t *a, iv_err_t *err)
{
    IV_TRY(agg_group_cells(a, err));
    IV_TRY(check_agg_size(r, a, err));
    IV_TRY(agg_distinct_genes(a, err));
    IV_TRY(agg_decode(r, a, err));
    return agg_results(a, err);
}

/* Group g's key: its mixed-radix combination decoded back into category
 * labels. */
static void put_group_key(iv_buf_t *doc, const agg_t *a, int64_t g)
{
    int64_t k = a->combo_of_group[g];
    int64_t div = 1;
    for (size_t i = 1; i < a->n_gb; i++) div *= a->gcols[i]->n_cats;
    for (size_t i = 0; i < a->n_gb; i++) {
        int64_t code = k / div;
        k %= div;
        if (i + 1 < a->n_gb) div /= a->gcols[i + 1]->n_cats;
        if (i) iv_buf_puts(doc, ",");
        iv_buf_json_str(doc, iv_meta_col_cat(a->gcols[i], code));
    }
}

static void put_agg_genes(iv_buf_t *doc, const agg_t *a)
{
    const iv_meta_col_t *vix = a->var_meta ? iv_meta_index(a->var_meta, IV_AXIS_VAR) : NULL;
    for (int64_t j = 0; j < a->n_var && !doc->oom; j++) {
        int64_t gi = a->sv.all ? j : a->ugenes ? a->ugenes[a->gene_at[j]] : a->sv.idx[j];
        iv_buf_printf(doc, j ? ",{\"index\":%" PRId64 ",\"name\":" : "{\"index\":%" PRId64 ",\"name\":", gi);
        const char *nm = vix ? vr_col_get(vix, gi) : NULL;
        if (nm) iv_buf_json_str(doc, nm);
        else iv_buf_puts(doc, "null");
        iv_buf_puts(doc, "}");
    }
}

/* The document without its values: groups, then genes. */
static void agg_document(iv_buf_t *doc, const agg_t *a)
{
    iv_buf_puts(doc, "{\"group_by\":[");
    for (size_t g = 0; g < a->n_gb; g++) {
        if (g) iv_buf_puts(doc, ",");
        iv_buf_json_str(doc, a->gcols[g]->name);
    }
    iv_buf_puts(doc, "],\"stats\":[");
    for (size_t s = 0; s < a->n_st; s++)
        iv_buf_printf(doc, s ? ",\"%s\"" : "\"%s\"", iv_stat_name(a->stat_bits[s]));
    iv_buf_puts(doc, "],\"matrix\":");
    iv_buf_json_str(doc, a->p.qr.matrix ? a->p.qr.matrix : "X");
    iv_buf_printf(doc, ",\"ddof\":%d,\"served_by\":\"%s\",\"n_cells\":%" PRId64 ",\"groups\":[",
                  (int)a->ddof, iv_query_orient(a->q) == IV_IVCSR ? "cells" : "genes", a->n_obs);
    for (int64_t g = 0; g < a->n_groups; g++) {
        iv_buf_puts(doc, g ? ",{\"key\":[" : "{\"key\":[");
        put_group_key(doc, a, g);
        iv_buf_printf(doc, "],\"n_cells\":%" PRId64 "}", a->n_cells[g]);
    }
    iv_buf_puts(doc, "],\"genes\":[");
    put_agg_genes(doc, a);
    iv_buf_puts(doc, "]");
}

/* The answer: the document and the values, in JSON or the binary form
 * (enc_viewer.h). */
static int agg_encode(iv_vreq_t *r, const agg_t *a, iv_err_t *err)
{
    iv_buf_t doc;
    iv_buf_init(&doc);
    agg_document(&doc, a);
    const char *names[IV_STAT_COUNT];
    for (size_t s = 0; s < a->n_st; s++) names[s] = iv_stat_name(a->stat_bits[s]);
    iv_agg_table_t t = {.doc = doc.data, .doc_len = doc.len, .n_stats = a->n_st, .stats = names,
                        .n_groups = a->n_groups, .n_genes = a->n_var, .values = a->vals};
    iv_enc_agg(&r->out, a->fmt, &t, r->json_bytes);
    r->ctype = a->fmt == IV_FMT_BINARY ? MEDIA_AGG : "application/json";
    int rc = 0;
    if (doc.oom || r->out.oom) rc = iv_fail(err, IV_ENOMEM, "out of memory building the result");
    else if (a->fmt == IV_FMT_JSON && r->out.len > r->json_bytes)
        rc = iv_fail(err, IV_ETOO_LARGE, "the result exceeds the JSON limit of %zu bytes; ask for " MEDIA_AGG,
                     r->json_bytes);
    iv_buf_free(&doc);
    return rc;
}

int vr_run_aggregate(iv_vreq_t *r, iv_err_t *err)
{
    if (!r->meta) return iv_fail(err, IV_EBAD_SELECTION, "the dataset's metadata could not be loaded");
    static const char *const keys[] = {"group_by", "stats", "ddof"};
    agg_t a;
    memset(&a, 0, sizeof a);
    a.p.keys = keys;
    a.p.n = 3;
    a.p.with_matrix = 1;
    a.mds = r->ds;
    a.var_meta = r->meta;
    a.in = iv_dataset_info(r->ds);
    a.ddof = 1;
    int rc = agg_request(r, &a, err);
    if (rc == 0) rc = agg_compute(r, &a, err);
    if (rc == 0) rc = agg_encode(r, &a, err);
    agg_free(&a);
    return rc;
}
