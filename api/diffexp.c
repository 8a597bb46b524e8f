/*
 * Differential expression requests (see diffexp.h).
 *
 * Design.  The request becomes one labelling of cells and one pass over
 * gene rows.  Each group's selection is parsed by the query route's
 * parser (proto/request.h) and resolved against the metadata by the
 * engine's resolver (core/meta/select.h), exactly as /query does; the
 * cells of the comparison (the "universe") are labelled, and the matrix
 * is read as gene rows restricted to them: the gene-major copy directly
 * when there is one, else the cell-major file transposed in chunks of
 * genes whose transposed entries fit a fixed budget.  Gene rows go to
 * core/meta/diffexp.c, one worker per part, parts claiming blocks in
 * turn; a gene's result does not depend on which thread computed it, so
 * the answer is the same on any number of threads.
 *
 * Memory.  Most genes need no scratch (their distinct values are
 * counted in a table); a gene with many needs 12 bytes per stored entry
 * for the engine's sort; the parts share a budget of 12 bytes per universe cell plus
 * SCRATCH_SLACK, taken and given back under a lock, so a gene stored in
 * every cell runs alone while sparse genes run side by side.  With the
 * labels (1 byte a cell in the engine; 4 while they are built) that is
 * 13 bytes per selected cell, plus the results (64 bytes per group and
 * gene), the blocks being decoded and, for a file without a gene-major
 * copy, one transposed chunk of genes (CHUNK_WORK_BYTES).
 */
#include "diffexp.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/meta/diffexp.h"
#include "query.h"
#include "request.h"
#include "select.h"

#define SCRATCH_SLACK ((size_t)8 << 20)
/* What a transposed chunk of genes may hold (cell-major files only). */
#define CHUNK_WORK_BYTES ((int64_t)48 << 20)
#define MAX_GROUPS 4096

/* ---- selections ----------------------------------------------------- */

/* One group's (or the genes') positions: all set (and no array) when
 * the selection is every element in order. */
typedef struct sel_pos {
    int64_t *idx;
    int64_t n;
    int all;
} sel_pos_t;

/* The SEL object sel as the obs or var of a request body, in b (a new
 * buffer); IV_ENOMEM with err set when it cannot be made. */
static int sel_body(iv_axis_t axis, const cJSON *sel, iv_buf_t *b, iv_err_t *err)
{
    iv_buf_init(b);
    char *sj = cJSON_PrintUnformatted(sel);
    if (!sj) return iv_fail(err, IV_ENOMEM, "out of memory");
    iv_buf_puts(b, axis == IV_AXIS_OBS ? "{\"obs\":" : "{\"var\":");
    iv_buf_puts(b, sj);
    iv_buf_puts(b, "}");
    free(sj);
    return b->oom ? iv_fail(err, IV_ENOMEM, "out of memory") : 0;
}

/* Resolves the SEL object sel on axis into positions, by the server's
 * parser and resolver (request.h iv_psel_resolve), as /query does; an
 * error's message gets the key prefixed. */
static int resolve_sel(const iv_api_diffexp_in_t *in, iv_axis_t axis, const char *key, const cJSON *sel,
                       sel_pos_t *out, iv_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(sel))
        return iv_fail(err, IV_EBAD_REQUEST, "%s must be a selection object ({\"where\": ...}, "
                       "{\"names\": [...]}, {\"index\": [...]}, ...)", key);
    const iv_dataset_info_t *info = iv_dataset_info(in->ds);
    iv_buf_t b;
    iv_qreq_t qr;
    if (sel_body(axis, sel, &b, err) != 0) {
        iv_buf_free(&b);
        return IV_ENOMEM;  /* said without the key */
    }
    int rc = iv_qreq_parse_json(b.data, b.len, info->n_rows, info->n_cols, &qr, err);
    iv_buf_free(&b);
    if (rc != 0) goto prefix;
    iv_psel_t *p = axis == IV_AXIS_OBS ? &qr.obs : &qr.var;
    if (p->kind == IV_PSEL_ALL && !p->filter) {
        out->all = 1;
    } else if ((rc = iv_psel_resolve(p, in->meta, axis, NULL, NULL, err)) == 0) {
        /* The positions are taken from the request. */
        out->idx = p->idx;
        out->n = p->n;
        p->idx = NULL;
    }
    iv_qreq_free(&qr);
    if (rc == 0) return 0;
prefix:;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return iv_fail(err, rc, "%s: %s", key, msg);
}

/* ---- the request ---------------------------------------------------- */

typedef struct req {
    iv_de_method_t method;
    int log1p;                /* -1 auto */
    int64_t top_n;
    double min_frac;
    int dry_run;
    /* two groups */
    const cJSON *group1, *group2;   /* group2 NULL: the rest */
    /* one versus rest */
    const iv_meta_col_t *col;
    int64_t ref_cat;                /* -1: the rest */
    const cJSON *groups;
    const cJSON *var;
} req_t;

static int check_req_keys(const cJSON *root, iv_err_t *err)
{
    static const char *const known[] = {"group1", "group2", "method", "top_n", "log1p", "var",
                                        "min_frac", "group_by", "reference", "groups", "dry_run"};
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        size_t k = 0;
        while (k < sizeof known / sizeof *known && strcmp(it->string, known[k])) k++;
        if (k == sizeof known / sizeof *known)
            return iv_fail(err, IV_EBAD_REQUEST, "unknown key '%.60s' (expected group1, group2, group_by, "
                           "reference, groups, method, top_n, log1p, var, min_frac, dry_run)", it->string);
    }
    return 0;
}

static int parse_method(const cJSON *m, req_t *q, iv_err_t *err)
{
    if (!m) return 0;
    if (cJSON_IsString(m) && !strcmp(m->valuestring, "t-test")) q->method = IV_DE_TTEST;
    else if (cJSON_IsString(m) && !strcmp(m->valuestring, "wilcoxon")) q->method = IV_DE_WILCOXON;
    else return iv_fail(err, IV_EBAD_REQUEST, "method must be \"t-test\" or \"wilcoxon\"");
    return 0;
}

static int parse_top_n(const cJSON *t, req_t *q, iv_err_t *err)
{
    if (!t) return 0;
    if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
        t->valuedouble > 1e12)
        return iv_fail(err, IV_EBAD_REQUEST, "top_n must be a non-negative integer");
    q->top_n = (int64_t)t->valuedouble;
    return 0;
}

static int parse_log1p(const cJSON *l, req_t *q, iv_err_t *err)
{
    if (!l) return 0;
    if (cJSON_IsBool(l)) q->log1p = cJSON_IsTrue(l);
    else if (!cJSON_IsString(l) || strcmp(l->valuestring, "auto"))
        return iv_fail(err, IV_EBAD_REQUEST, "log1p must be \"auto\", true or false");
    return 0;
}

static int parse_min_frac(const cJSON *f, req_t *q, iv_err_t *err)
{
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= 0 && f->valuedouble <= 1))
        return iv_fail(err, IV_EBAD_REQUEST, "min_frac must be a number in [0, 1]");
    q->min_frac = f->valuedouble;
    return 0;
}

static int parse_dry_run(const cJSON *d, req_t *q, iv_err_t *err)
{
    if (!d) return 0;
    if (!cJSON_IsBool(d)) return iv_fail(err, IV_EBAD_REQUEST, "dry_run must be true or false");
    q->dry_run = cJSON_IsTrue(d);
    return 0;
}

/* group1 and group2: group2 a selection, "rest" or absent (the rest). */
static int parse_two_groups(req_t *q, const cJSON *ref, iv_err_t *err)
{
    if (!q->group1) return iv_fail(err, IV_EBAD_REQUEST, "group1 (a selection) or group_by is required");
    if (ref || q->groups) return iv_fail(err, IV_EBAD_REQUEST, "reference and groups go with group_by");
    if (q->group2 && cJSON_IsString(q->group2)) {
        if (strcmp(q->group2->valuestring, "rest"))
            return iv_fail(err, IV_EBAD_REQUEST, "group2 must be a selection or \"rest\"");
        q->group2 = NULL;
    }
    return 0;
}

/* "reference": "rest" (ref_cat -1) or a category of the group_by column. */
static int parse_reference(const cJSON *ref, req_t *q, iv_err_t *err)
{
    if (ref && !cJSON_IsString(ref))
        return iv_fail(err, IV_EBAD_REQUEST, "reference must be \"rest\" or a category");
    if (!ref || !strcmp(ref->valuestring, "rest")) return 0;
    for (int64_t k = 0; k < q->col->n_cats && q->ref_cat < 0; k++)
        if (!strcmp(iv_meta_col_cat(q->col, k), ref->valuestring)) q->ref_cat = k;
    if (q->ref_cat < 0)
        return iv_fail(err, IV_EBAD_SELECTION, "reference: '%.80s' is not a category of %s",
                       ref->valuestring, q->col->name);
    return 0;
}

/* group_by (a categorical obs column), reference and groups. */
static int parse_group_by(const iv_api_diffexp_in_t *in, const cJSON *gb, const cJSON *ref, req_t *q,
                          iv_err_t *err)
{
    if (!cJSON_IsString(gb)) return iv_fail(err, IV_EBAD_REQUEST, "group_by must be an obs column name");
    if (!in->meta) return iv_fail(err, IV_ENO_METADATA, "the dataset's metadata is not available");
    q->col = iv_meta_find_col(in->meta, IV_AXIS_OBS, gb->valuestring);
    if (!q->col) return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs has no column '%.80s'", gb->valuestring);
    if (q->col->type != IV_COL_CATEGORICAL)
        return iv_fail(err, IV_EBAD_SELECTION, "group_by: obs column '%.80s' is not categorical",
                       gb->valuestring);
    IV_TRY(parse_reference(ref, q, err));
    if (q->groups && !cJSON_IsArray(q->groups))
        return iv_fail(err, IV_EBAD_REQUEST, "groups must be a list of categories");
    return 0;
}

/* The request body: keys checked, options in order, then the groups in
 * one of the two forms. */
static int parse_req(const iv_api_diffexp_in_t *in, const cJSON *root, req_t *q, iv_err_t *err)
{
    memset(q, 0, sizeof *q);
    q->method = IV_DE_TTEST;
    q->log1p = -1;
    q->ref_cat = -1;
    IV_TRY(check_req_keys(root, err));
    IV_TRY(parse_method(cJSON_GetObjectItemCaseSensitive(root, "method"), q, err));
    IV_TRY(parse_top_n(cJSON_GetObjectItemCaseSensitive(root, "top_n"), q, err));
    IV_TRY(parse_log1p(cJSON_GetObjectItemCaseSensitive(root, "log1p"), q, err));
    IV_TRY(parse_min_frac(cJSON_GetObjectItemCaseSensitive(root, "min_frac"), q, err));
    IV_TRY(parse_dry_run(cJSON_GetObjectItemCaseSensitive(root, "dry_run"), q, err));
    q->var = cJSON_GetObjectItemCaseSensitive(root, "var");
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(root, "group_by");
    q->group1 = cJSON_GetObjectItemCaseSensitive(root, "group1");
    q->group2 = cJSON_GetObjectItemCaseSensitive(root, "group2");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(root, "reference");
    q->groups = cJSON_GetObjectItemCaseSensitive(root, "groups");
    if (gb && (q->group1 || q->group2))
        return iv_fail(err, IV_EBAD_REQUEST, "give either group1 (and group2) or group_by, not both");
    return gb ? parse_group_by(in, gb, ref, q, err) : parse_two_groups(q, ref, err);
}

/* ---- labels --------------------------------------------------------- */

typedef struct labels {
    int32_t n_labels, n_tested, reference;
    int64_t *n_cells;          /* n_labels */
    int64_t *cat_of;           /* tested label -> category (one-vs-rest) */
    int32_t *label;            /* universe position -> label */
    int64_t *uidx;             /* universe rows (NULL: every row) */
    int64_t n_universe;
} labels_t;

static void labels_free(labels_t *lb)
{
    free(lb->n_cells);
    free(lb->cat_of);
    free(lb->label);
    free(lb->uidx);
}

/* From a row labelling (-1: outside) to the universe's positions. */
static int labels_compact(labels_t *lb, int32_t *row_label, int64_t n_rows, iv_err_t *err)
{
    int64_t nu = 0;
    for (int64_t i = 0; i < n_rows; i++) nu += row_label[i] >= 0;
    lb->n_universe = nu;
    if (nu == n_rows) {
        lb->label = row_label;
        return 0;
    }
    lb->uidx = malloc((size_t)(nu ? nu : 1) * sizeof *lb->uidx);
    if (!lb->uidx) {
        free(row_label);
        return iv_fail(err, IV_ENOMEM, "out of memory");
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n_rows; i++)
        if (row_label[i] >= 0) {
            lb->uidx[k] = i;
            row_label[k++] = row_label[i];
        }
    int32_t *shrunk = realloc(row_label, (size_t)(nu ? nu : 1) * sizeof *shrunk);
    lb->label = shrunk ? shrunk : row_label;
    return 0;
}

/* Labels rows: group1 0, group2 (NULL: every other row) 1, the rest -1;
 * a row in both groups is an error. */
static int label_two(int32_t *row, int64_t n_rows, const sel_pos_t *g1, const sel_pos_t *g2,
                     iv_err_t *err)
{
    for (int64_t i = 0; i < n_rows; i++) row[i] = g1->all ? 0 : -1;
    for (int64_t k = 0; k < g1->n; k++) row[g1->idx[k]] = 0;
    if (!g2) {
        for (int64_t i = 0; i < n_rows; i++)
            if (row[i] < 0) row[i] = 1;
        return 0;
    }
    int rc = 0;
    for (int64_t k = 0; k < (g2->all ? n_rows : g2->n) && rc == 0; k++) {
        int64_t i = g2->all ? k : g2->idx[k];
        if (row[i] == 0) rc = iv_fail(err, IV_EBAD_SELECTION, "group1 and group2 share cells "
                                      "(row %" PRId64 ")", i);
        row[i] = 1;
    }
    return rc;
}

/* Counts the two groups' cells; an empty group is an error. */
static int count_two(labels_t *lb, const int32_t *row, int64_t n_rows, const req_t *q, iv_err_t *err)
{
    for (int64_t i = 0; i < n_rows; i++)
        if (row[i] >= 0) lb->n_cells[row[i]]++;
    if (lb->n_cells[0] == 0 || lb->n_cells[1] == 0)
        return iv_fail(err, IV_EBAD_SELECTION, "%s selects no cells",
                       lb->n_cells[0] == 0 ? "group1" : q->group2 ? "group2" : "the rest (group2)");
    return 0;
}

/* group1 against group2 (or the rest): resolve both, label, count. */
static int labels_two(const iv_api_diffexp_in_t *in, const req_t *q, labels_t *lb, iv_err_t *err)
{
    int64_t n_rows = iv_dataset_info(in->ds)->n_rows;
    sel_pos_t g1, g2;
    int rc;
    if ((rc = resolve_sel(in, IV_AXIS_OBS, "group1", q->group1, &g1, err)) != 0) return rc;
    if (q->group2 && (rc = resolve_sel(in, IV_AXIS_OBS, "group2", q->group2, &g2, err)) != 0) {
        free(g1.idx);
        return rc;
    }
    int32_t *row = malloc((size_t)(n_rows ? n_rows : 1) * sizeof *row);
    lb->n_cells = calloc(2, sizeof *lb->n_cells);
    if (!row || !lb->n_cells) rc = iv_fail(err, IV_ENOMEM, "out of memory");
    if (rc == 0) rc = label_two(row, n_rows, &g1, q->group2 ? &g2 : NULL, err);
    free(g1.idx);
    if (q->group2) free(g2.idx);
    if (rc == 0) rc = count_two(lb, row, n_rows, q, err);
    if (rc != 0) {
        free(row);
        return rc;
    }
    lb->n_labels = 2;
    lb->n_tested = 1;
    lb->reference = -1;
    return labels_compact(lb, row, n_rows, err);
}

/* 1 when row i of the categorical column c has a category (code in
 * range and not masked). */
static inline int has_cat(const iv_meta_col_t *c, int64_t i)
{
    int32_t k = c->codes[i];
    return k >= 0 && k < c->n_cats && !(c->mask && c->mask[i]);
}

/* "groups": the listed categories are tested (the reference never);
 * each must exist and have cells. */
static int mark_listed(const req_t *q, const int64_t *count, int32_t *tested, iv_err_t *err)
{
    const iv_meta_col_t *c = q->col;
    const cJSON *g;
    cJSON_ArrayForEach(g, q->groups)
    {
        if (!cJSON_IsString(g)) return iv_fail(err, IV_EBAD_REQUEST, "groups must be a list of categories");
        int64_t k = 0;
        while (k < c->n_cats && strcmp(iv_meta_col_cat(c, k), g->valuestring)) k++;
        if (k == c->n_cats)
            return iv_fail(err, IV_EBAD_SELECTION, "groups: '%.80s' is not a category of %s", g->valuestring,
                           c->name);
        if (count[k] == 0)
            return iv_fail(err, IV_EBAD_SELECTION, "groups: category '%.80s' has no cells", g->valuestring);
        if (k != q->ref_cat) tested[k] = 0;
    }
    return 0;
}

/* Which categories are tested (tested[k] 0, others -1): those listed in
 * "groups", else every one with cells but the reference; then numbered
 * in category order into *nt labels. */
static int mark_tested(const req_t *q, const int64_t *count, int32_t *tested, int32_t *nt,
                       iv_err_t *err)
{
    int64_t nc = q->col->n_cats;
    for (int64_t k = 0; k < nc; k++) tested[k] = -1;
    if (q->groups) {
        IV_TRY(mark_listed(q, count, tested, err));
    } else {
        for (int64_t k = 0; k < nc; k++)
            if (count[k] > 0 && k != q->ref_cat) tested[k] = 0;
    }
    if (q->ref_cat >= 0 && count[q->ref_cat] == 0)
        return iv_fail(err, IV_EBAD_SELECTION, "reference: category '%.80s' has no cells",
                       iv_meta_col_cat(q->col, q->ref_cat));
    *nt = 0;
    for (int64_t k = 0; k < nc; k++)
        if (tested[k] == 0) tested[k] = (*nt)++;
    if (*nt == 0) return iv_fail(err, IV_EBAD_SELECTION, "group_by: no group to test");
    if (*nt > MAX_GROUPS) return iv_fail(err, IV_ETOO_LARGE, "group_by: more than %d groups", MAX_GROUPS);
    return 0;
}

/* Each row's label: its category's when tested, else the reference's
 * (nt) or, against the rest, nt for every other cell, a missing category
 * included (as scanpy). */
static void label_by(labels_t *lb, const req_t *q, const int32_t *tested, int32_t nt, int32_t *row,
                     int64_t n_rows)
{
    const iv_meta_col_t *c = q->col;
    for (int64_t k = 0; k < c->n_cats; k++)
        if (tested[k] >= 0) lb->cat_of[tested[k]] = k;
    for (int64_t i = 0; i < n_rows; i++) {
        int ok = has_cat(c, i);
        int32_t k = c->codes[i], l;
        if (ok && tested[k] >= 0) l = tested[k];
        else if (q->ref_cat >= 0) l = ok && k == q->ref_cat ? nt : -1;
        else l = nt;
        row[i] = l;
        if (l >= 0) lb->n_cells[l]++;
    }
}

/* nt tested groups and one more label: the reference, or every other cell. */
static int labels_alloc_by(labels_t *lb, const req_t *q, int32_t nt, iv_err_t *err)
{
    lb->n_tested = nt;
    lb->n_labels = nt + 1;
    lb->reference = q->ref_cat >= 0 ? nt : -1;
    lb->n_cells = calloc((size_t)lb->n_labels, sizeof *lb->n_cells);
    lb->cat_of = malloc((size_t)nt * sizeof *lb->cat_of);
    if (!lb->n_cells || !lb->cat_of) return iv_fail(err, IV_ENOMEM, "out of memory");
    return 0;
}

/* One group per category of group_by against the reference or the rest:
 * count the categories' cells, choose the tested ones, label the rows. */
static int labels_by(const iv_api_diffexp_in_t *in, const req_t *q, labels_t *lb, iv_err_t *err)
{
    const iv_meta_col_t *c = q->col;
    int64_t n_rows = iv_dataset_info(in->ds)->n_rows, nc = c->n_cats;
    if (c->n != n_rows) return iv_fail(err, IV_EBAD_SELECTION, "group_by: the column has %" PRId64 " rows, "
                                       "the matrix %" PRId64, c->n, n_rows);
    int64_t *count = calloc((size_t)(nc ? nc : 1), sizeof *count);
    int32_t *tested = malloc((size_t)(nc ? nc : 1) * sizeof *tested);
    int32_t *row = malloc((size_t)(n_rows ? n_rows : 1) * sizeof *row);
    int32_t nt = 0;
    int rc = !count || !tested || !row ? iv_fail(err, IV_ENOMEM, "out of memory") : 0;
    for (int64_t i = 0; rc == 0 && i < n_rows; i++)
        if (has_cat(c, i)) count[c->codes[i]]++;
    if (rc == 0) rc = mark_tested(q, count, tested, &nt, err);
    if (rc == 0) rc = labels_alloc_by(lb, q, nt, err);
    if (rc == 0) label_by(lb, q, tested, nt, row, n_rows);
    free(count);
    free(tested);
    if (rc != 0) {
        free(row);
        return rc;
    }
    return labels_compact(lb, row, n_rows, err);
}

/* ---- the pass ------------------------------------------------------- */

typedef struct pass {
    iv_query_t *q;
    iv_de_t *de;
    int64_t gene0;            /* the chunk's first gene (position in the var selection) */
    int64_t n_blocks;
    atomic_llong next;
    const atomic_int *cancel;
    atomic_int failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t budget, used;      /* the scratch gate */
    int rc;
    iv_err_t err;
} pass_t;

static void pass_fail(pass_t *ps, int rc, const iv_err_t *e)
{
    pthread_mutex_lock(&ps->mu);
    if (ps->rc == 0) {
        ps->rc = rc;
        ps->err = *e;
    }
    pthread_mutex_unlock(&ps->mu);
    atomic_store(&ps->failed, 1);
}

/* Grows w's scratch to hold nnz entries within the shared budget: the
 * scratch held is given back first, so a thread that waits holds none
 * and the gate cannot deadlock. */
static int gate_grow(pass_t *ps, iv_de_work_t *w, int64_t nnz)
{
    size_t held = iv_de_work_held(w), need = iv_de_scratch_bytes(ps->de, nnz);
    pthread_mutex_lock(&ps->mu);
    ps->used -= held;
    iv_de_work_drop(w);
    pthread_cond_broadcast(&ps->cv);
    while (ps->used > 0 && ps->used + need > ps->budget) pthread_cond_wait(&ps->cv, &ps->mu);
    ps->used += need;
    pthread_mutex_unlock(&ps->mu);
    if (iv_de_work_reserve(w, nnz) != 0) {
        pthread_mutex_lock(&ps->mu);
        ps->used -= need;
        pthread_cond_broadcast(&ps->cv);
        pthread_mutex_unlock(&ps->mu);
        return IV_ENOMEM;
    }
    return 0;
}

static void pass_part(void *arg, size_t part)
{
    (void)part;
    pass_t *ps = arg;
    iv_err_t e;
    iv_err_clear(&e);
    iv_de_work_t *w = iv_de_work_new(ps->de);
    if (!w) {
        iv_fail(&e, IV_ENOMEM, "out of memory");
        pass_fail(ps, IV_ENOMEM, &e);
        return;
    }
    iv_de_work_set_gated(w, 1);
    for (;;) {
        int64_t b = atomic_fetch_add(&ps->next, 1);
        if (b >= ps->n_blocks || atomic_load(&ps->failed)) break;
        if (ps->cancel && atomic_load_explicit(ps->cancel, memory_order_relaxed)) {
            iv_fail(&e, IV_ECANCELLED, "diffexp cancelled");
            pass_fail(ps, IV_ECANCELLED, &e);
            break;
        }
        iv_block_t blk;
        memset(&blk, 0, sizeof blk);
        int rc = iv_query_decode_block(ps->q, b, &blk, &e);
        for (int64_t r = 0; rc == 0 && r < blk.n_rows; r++) {
            int64_t lo = blk.indptr[r], nnz = blk.indptr[r + 1] - lo, j = ps->gene0 + blk.row0 + r;
            const char *ind = (const char *)blk.indices + (size_t)lo * (size_t)blk.index_size;
            const char *dat = (const char *)blk.data + (size_t)lo * iv_dtype_size(blk.dtype);
            int g = iv_de_gene(ps->de, w, j, nnz, ind, blk.index_size, dat, blk.dtype);
            if (g == IV_DE_NEED_SCRATCH) {
                /* Many distinct values: the scratch, within the budget. */
                if (gate_grow(ps, w, nnz) != 0)
                    rc = iv_fail(&e, IV_ENOMEM, "out of memory for a gene of %" PRId64 " entries", nnz);
                else
                    g = iv_de_gene(ps->de, w, j, nnz, ind, blk.index_size, dat, blk.dtype);
            }
            if (rc == 0 && g != 0) rc = iv_fail(&e, IV_ENOMEM, "out of memory");
        }
        iv_block_free(&blk);
        if (rc != 0) {
            pass_fail(ps, rc, &e);
            break;
        }
    }
    pthread_mutex_lock(&ps->mu);
    ps->used -= iv_de_work_held(w);
    pthread_cond_broadcast(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
    iv_de_work_free(w);
}

/* Whether log1p applies under "auto": integer storage, or float storage
 * whose first block holds only non-negative whole numbers (raw counts
 * written as float32, as most .h5ad files do). */
static int auto_log1p(iv_query_t *q, iv_err_t *err, int *out)
{
    iv_dtype_t dt = iv_query_dtype(q);
    if (dt != IV_DT_FLOAT32 && dt != IV_DT_FLOAT64) {
        *out = 1;
        return 0;
    }
    *out = 0;
    if (iv_query_n_blocks(q) == 0) return 0;
    iv_block_t blk;
    memset(&blk, 0, sizeof blk);
    IV_TRY(iv_query_decode_block(q, 0, &blk, err));
    int whole = 1;
    for (int64_t k = 0; k < blk.nnz && whole; k++) {
        double v = iv_dtype_get_f64(blk.dtype, blk.data, (size_t)k);
        whole = v >= 0 && v == floor(v) && v < 9007199254740992.0;
    }
    iv_block_free(&blk);
    *out = whole;
    return 0;
}

/* The query of genes [g0, g0 + n) of the var selection (vidx NULL: every
 * gene) over the universe's cells, prepared, with log1p decided. */
static int chunk_query(const iv_api_diffexp_in_t *in, iv_de_t *de, const iv_sel_t *so,
                       const int64_t *vidx, int64_t g0, int64_t n, int transposed, int *log1p,
                       iv_query_t **q, iv_err_t *err)
{
    iv_sel_t sv = {.all = vidx == NULL && g0 == 0 && n == iv_dataset_info(in->ds)->n_cols, .n = n,
                   .idx = vidx ? vidx + g0 : NULL};
    int64_t *range = NULL;
    if (!vidx && !sv.all) {
        range = malloc((size_t)n * sizeof *range);
        if (!range) return iv_fail(err, IV_ENOMEM, "out of memory");
        for (int64_t k = 0; k < n; k++) range[k] = g0 + k;
        sv.idx = range;
    }
    iv_query_opts_t qo = {.axis = IV_OUT_VARS, .max_work_bytes = transposed ? 4 * CHUNK_WORK_BYTES : 0};
    int rc = iv_query_new(in->ds, so, &sv, &qo, q, err);
    free(range);
    if (rc == 0) rc = iv_query_prepare(*q, in->pool, err);
    if (rc == 0 && *log1p < 0) rc = auto_log1p(*q, err, log1p);
    if (rc == 0) iv_de_set_log1p(de, *log1p);
    return rc;
}

/* Computes the gene rows of q (the first at gene0) on the pool: one part
 * per thread, parts claiming blocks in turn. */
static int run_pass(const iv_api_diffexp_in_t *in, iv_de_t *de, const iv_sel_t *so, iv_query_t *q,
                    int64_t gene0, iv_err_t *err)
{
    pass_t ps;
    memset(&ps, 0, sizeof ps);
    ps.q = q;
    ps.de = de;
    ps.gene0 = gene0;
    ps.n_blocks = iv_query_n_blocks(q);
    ps.cancel = in->cancel;
    atomic_init(&ps.next, 0);
    atomic_init(&ps.failed, 0);
    pthread_mutex_init(&ps.mu, NULL);
    pthread_cond_init(&ps.cv, NULL);
    ps.budget = iv_de_scratch_bytes(de, so->all ? iv_dataset_info(in->ds)->n_rows : so->n) + SCRATCH_SLACK;
    iv_err_clear(&ps.err);
    unsigned parts = in->pool ? iv_pool_threads(in->pool) + 1 : 1;
    if ((int64_t)parts > ps.n_blocks) parts = ps.n_blocks > 0 ? (unsigned)ps.n_blocks : 1;
    iv_pool_parallel_for(in->pool, parts, 0, pass_part, &ps);
    pthread_cond_destroy(&ps.cv);
    pthread_mutex_destroy(&ps.mu);
    if (ps.rc != 0) *err = ps.err;
    return ps.rc;
}

/* Runs the pass over genes [g0, g0 + n) of the var selection. */
static int run_chunk(const iv_api_diffexp_in_t *in, iv_de_t *de, const iv_sel_t *so, const int64_t *vidx,
                     int64_t g0, int64_t n, int transposed, int *log1p, iv_err_t *err)
{
    iv_query_t *q = NULL;
    int rc = chunk_query(in, de, so, vidx, g0, n, transposed, log1p, &q, err);
    if (rc == 0) rc = run_pass(in, de, so, q, g0, err);
    iv_query_free(q);
    return rc;
}

/* ---- the answer ----------------------------------------------------- */

typedef struct srt {
    double score;
    int64_t j;
} srt_t;

static int srt_cmp(const void *x, const void *y)
{
    const srt_t *a = x, *b = y;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return a->j < b->j ? -1 : a->j > b->j;
}

static void put_num(iv_buf_t *b, double v)
{
    if (isfinite(v)) iv_buf_printf(b, "%.17g", v);
    else iv_buf_puts(b, "null");
}

/* The genes of tested group g to send, in order: sorted by score, the
 * top_n of each end or all, those under min_frac on both sides left out.
 * *out (owned) holds positions in the var selection. */
static int pick_genes(const iv_de_t *de, int32_t g, int64_t n_genes, const req_t *q, int64_t **out,
                      int64_t *n_out)
{
    srt_t *v = malloc((size_t)(n_genes ? n_genes : 1) * sizeof *v);
    int64_t *pick = malloc((size_t)(n_genes ? n_genes : 1) * sizeof *pick);
    if (!v || !pick) {
        free(v);
        free(pick);
        return IV_ENOMEM;
    }
    int64_t n = 0, m = 0;
    for (int64_t j = 0; j < n_genes; j++) {
        const iv_de_row_t *r = iv_de_row(de, g, j);
        if (q->min_frac > 0 && r->frac1 < q->min_frac && r->frac2 < q->min_frac) continue;
        v[n++] = (srt_t){r->score, j};
    }
    qsort(v, (size_t)n, sizeof *v, srt_cmp);
    for (int64_t k = 0; k < n; k++)
        if (!(q->top_n > 0 && 2 * q->top_n < n && k >= q->top_n && k < n - q->top_n)) pick[m++] = v[k].j;
    free(v);
    *out = pick;
    *n_out = m;
    return 0;
}

static void put_name(iv_buf_t *b, const iv_meta_col_t *names, int64_t gi)
{
    if (names && gi < names->n && !(names->mask && names->mask[gi])) {
        if (names->type == IV_COL_CATEGORICAL) {
            int32_t c = names->codes[gi];
            if (c >= 0 && c < names->n_cats) {
                iv_buf_json_str(b, iv_meta_col_cat(names, c));
                return;
            }
        } else if (names->type == IV_COL_STRING) {
            iv_buf_json_str(b, iv_meta_col_str(names, gi));
            return;
        }
    }
    iv_buf_puts(b, "null");
}

/* The picked genes as a JSON array of objects. */
static void put_genes_json(iv_buf_t *b, const iv_de_t *de, int32_t g, const int64_t *pick, int64_t n,
                           const int64_t *vidx, const iv_meta_col_t *names)
{
    static const char *const k8[8] = {"score", "logfoldchange", "pval", "pval_adj",
                                      "mean1", "mean2", "frac1", "frac2"};
    iv_buf_puts(b, "[");
    for (int64_t k = 0; k < n && !b->oom; k++) {
        int64_t j = pick[k], gi = vidx ? vidx[j] : j;
        const iv_de_row_t *r = iv_de_row(de, g, j);
        iv_buf_printf(b, k ? ",{\"index\":%" PRId64 ",\"name\":" : "{\"index\":%" PRId64 ",\"name\":", gi);
        put_name(b, names, gi);
        const double f[8] = {r->score, r->lfc, r->pval, r->pval_adj, r->mean1, r->mean2, r->frac1, r->frac2};
        for (int i = 0; i < 8; i++) {
            iv_buf_printf(b, ",\"%s\":", k8[i]);
            put_num(b, f[i]);
        }
        iv_buf_puts(b, "}");
    }
    iv_buf_puts(b, "]");
}

/* The picked genes as columns: int64 index[n], then float64 score,
 * logfoldchange, pval, pval_adj, mean1, mean2, frac1, frac2 [n] each. */
static void put_genes_binary(iv_buf_t *b, const iv_de_t *de, int32_t g, const int64_t *pick, int64_t n,
                             const int64_t *vidx)
{
    for (int64_t k = 0; k < n; k++) iv_buf_i64le(b, vidx ? vidx[pick[k]] : pick[k]);
    for (int c = 0; c < 8; c++)
        for (int64_t k = 0; k < n; k++) {
            const iv_de_row_t *r = iv_de_row(de, g, pick[k]);
            const double f[8] = {r->score, r->lfc, r->pval, r->pval_adj, r->mean1, r->mean2, r->frac1, r->frac2};
            iv_buf_append(b, &f[c], sizeof f[c]);
        }
}

/* One request through its stages (see iv_api_diffexp). */
typedef struct de_run {
    req_t q;
    labels_t lb;
    sel_pos_t var;            /* the genes (idx owned; all: every gene) */
    int64_t n_var;
    iv_sel_t so;              /* the universe's cells (borrows lb.uidx) */
    int transposed;           /* gene rows come from the cell-major file */
    iv_de_t *de;
    int log1p;
} de_run_t;

/* Parse and resolve: the request read, the cells labelled, the genes
 * resolved and the orientation chosen: gene rows straight from a
 * gene-major copy, or a cell-major file turned around in chunks of genes. */
static int de_prepare(const iv_api_diffexp_in_t *in, const cJSON *root, de_run_t *r, iv_err_t *err)
{
    IV_TRY(parse_req(in, root, &r->q, err));
    if (!in->meta && (r->q.group1 || r->q.var))
        return iv_fail(err, IV_ENO_METADATA, "the dataset's metadata is not available");
    IV_TRY(r->q.col ? labels_by(in, &r->q, &r->lb, err) : labels_two(in, &r->q, &r->lb, err));
    if (r->q.var) IV_TRY(resolve_sel(in, IV_AXIS_VAR, "var", r->q.var, &r->var, err));
    else r->var.all = 1;
    r->n_var = r->var.all ? iv_dataset_info(in->ds)->n_cols : r->var.n;
    r->so = (iv_sel_t){.all = r->lb.uidx == NULL, .n = r->lb.n_universe, .idx = r->lb.uidx};
    iv_sel_t sv_all = {.all = r->var.all, .n = r->n_var, .idx = r->var.idx};
    r->transposed = iv_plan_orient(in->ds, &r->so, &sv_all, IV_OUT_VARS, NULL) == IV_IVCSR;
    return 0;
}

static const char *method_name(const req_t *q)
{
    return q->method == IV_DE_TTEST ? "t-test" : "wilcoxon";
}

static void put_dry_run(iv_buf_t *out, const de_run_t *r)
{
    iv_buf_printf(out, "{\"dry_run\":true,\"method\":\"%s\",\"n_cells\":%" PRId64 ",\"n_genes\":%" PRId64
                  ",\"n_groups\":%d,\"served_by\":\"%s\"}",
                  method_name(&r->q), r->lb.n_universe, r->n_var, (int)r->lb.n_tested,
                  r->transposed ? "cells" : "genes");
}

/* Genes per chunk: all at once unless the file must be transposed, then
 * as many as keep a chunk's transposed entries (about 12 bytes each)
 * within CHUNK_WORK_BYTES, estimated from the cells' stored entries. */
static int64_t chunk_genes(const iv_api_diffexp_in_t *in, const de_run_t *r)
{
    const iv_dataset_info_t *info = iv_dataset_info(in->ds);
    int64_t chunk = r->n_var ? r->n_var : 1;
    if (!r->transposed || r->n_var == 0) return chunk;
    int64_t nnz = 0;
    for (int64_t i = 0; i < (r->so.all ? info->n_rows : r->so.n); i++)
        nnz += iv_dataset_major_nnz(in->ds, r->so.all ? i : r->so.idx[i]);
    double share = (double)r->n_var / (double)(info->n_cols ? info->n_cols : 1);
    double bytes = 12.0 * (double)nnz * share;
    int64_t n_chunks = (int64_t)ceil(bytes / (double)CHUNK_WORK_BYTES);
    if (n_chunks > 1) chunk = (r->n_var + n_chunks - 1) / n_chunks;
    return chunk;
}

/* Compute: the statistics of every gene, chunk by chunk. */
static int de_compute(const iv_api_diffexp_in_t *in, de_run_t *r, iv_err_t *err)
{
    labels_t *lb = &r->lb;
    iv_de_spec_t spec = {.method = r->q.method, .log1p = r->q.log1p > 0, .n_labels = lb->n_labels,
                         .n_tested = lb->n_tested, .reference = lb->reference, .n_cells = lb->n_cells,
                         .label = lb->label, .n_universe = lb->n_universe, .n_genes = r->n_var};
    IV_TRY(iv_de_new(&spec, &r->de, err));
    if (lb->n_labels <= 127) {
        /* The engine holds the labels as bytes: 4 bytes a cell less. */
        free(lb->label);
        lb->label = NULL;
    }
    r->log1p = r->q.log1p;
    int64_t chunk = chunk_genes(in, r);
    int rc = 0;
    for (int64_t g0 = 0; g0 < r->n_var && rc == 0; g0 += chunk) {
        int64_t n = r->n_var - g0 < chunk ? r->n_var - g0 : chunk;
        rc = run_chunk(in, r->de, &r->so, r->var.idx, g0, n, r->transposed, &r->log1p, err);
    }
    if (r->log1p < 0) r->log1p = 0;  /* no gene selected: nothing was decided */
    return rc != 0 ? rc : iv_de_finish(r->de, err);
}

/* The document's opening, up to the first group. */
static void put_head(iv_buf_t *doc, const de_run_t *r)
{
    const req_t *q = &r->q;
    const char *log1p = r->log1p > 0 ? "true" : "false";
    if (q->col) {
        iv_buf_printf(doc, "{\"method\":\"%s\",\"log1p\":%s,\"group_by\":", method_name(q), log1p);
        iv_buf_json_str(doc, q->col->name);
        iv_buf_puts(doc, ",\"reference\":");
        iv_buf_json_str(doc, q->ref_cat >= 0 ? iv_meta_col_cat(q->col, q->ref_cat) : "rest");
        iv_buf_puts(doc, ",\"groups\":[");
    } else {
        iv_buf_printf(doc, "{\"method\":\"%s\",\"log1p\":%s,\"n_group1\":%" PRId64 ",\"n_group2\":%" PRId64 ",",
                      method_name(q), log1p, r->lb.n_cells[0], r->lb.n_cells[1]);
    }
}

/* Tested group g: its key (group_by), then its genes, in the document
 * (JSON) or as columns in bin (binary). */
static int put_group(iv_buf_t *doc, iv_buf_t *bin, const de_run_t *r, int32_t g,
                     const iv_meta_col_t *names, iv_err_t *err)
{
    const req_t *q = &r->q;
    if (q->col) {
        iv_buf_puts(doc, g ? ",{\"key\":[" : "{\"key\":[");
        iv_buf_json_str(doc, iv_meta_col_cat(q->col, r->lb.cat_of[g]));
        iv_buf_printf(doc, "],\"n_cells\":%" PRId64 ",", r->lb.n_cells[g]);
    }
    int64_t *pick = NULL, n_pick = 0;
    if (pick_genes(r->de, g, r->n_var, q, &pick, &n_pick) != 0)
        return iv_fail(err, IV_ENOMEM, "out of memory");
    if (bin) {
        iv_buf_printf(doc, "\"n_genes\":%" PRId64, n_pick);
        put_genes_binary(bin, r->de, g, pick, n_pick, r->var.idx);
    } else {
        iv_buf_puts(doc, "\"genes\":");
        put_genes_json(doc, r->de, g, pick, n_pick, r->var.idx, names);
    }
    free(pick);
    if (q->col) iv_buf_puts(doc, "}");
    return 0;
}

/* The binary answer: "IVDE", version 1, the document's length and the
 * document, padding to 8 bytes, then the columns. */
static void put_binary_frame(iv_buf_t *out, const iv_buf_t *prelude, const iv_buf_t *bin)
{
    static const char zeros[8] = {0};
    iv_buf_append(out, "IVDE", 4);
    iv_buf_u32le(out, 1);
    iv_buf_i64le(out, (int64_t)prelude->len);
    iv_buf_append(out, prelude->data, prelude->len);
    if (out->len % 8) iv_buf_append(out, zeros, 8 - out->len % 8);
    iv_buf_append(out, bin->data, bin->len);
}

/* A JSON answer grown past the route's limit is refused. */
static int check_json_limit(const iv_api_diffexp_in_t *in, const iv_buf_t *out, iv_err_t *err)
{
    if (in->json_bytes && out->len > in->json_bytes)
        return iv_fail(err, IV_ETOO_LARGE, "the answer exceeds the JSON limit of %zu bytes; ask for "
                       "fewer genes (top_n, var) or " IV_DIFFEXP_MEDIA, in->json_bytes);
    return 0;
}

/* Encode: the JSON document, or for binary the same document with
 * "n_genes" for each gene list, then the lists as columns
 * (put_genes_binary), group after group. */
static int de_encode(const iv_api_diffexp_in_t *in, const de_run_t *r, int binary, iv_buf_t *out,
                     iv_err_t *err)
{
    const iv_meta_col_t *names = in->meta ? iv_meta_index(in->meta, IV_AXIS_VAR) : NULL;
    iv_buf_t bin, prelude;
    iv_buf_init(&bin);
    iv_buf_init(&prelude);
    iv_buf_t *doc = binary ? &prelude : out;
    int rc = 0;
    put_head(doc, r);
    for (int32_t g = 0; g < r->lb.n_tested && rc == 0; g++) {
        rc = put_group(doc, binary ? &bin : NULL, r, g, names, err);
        if (rc == 0 && !binary) rc = check_json_limit(in, out, err);
    }
    iv_buf_puts(doc, r->q.col ? "]}" : "}");
    if (binary && rc == 0) put_binary_frame(out, &prelude, &bin);
    if (rc == 0 && (out->oom || prelude.oom || bin.oom)) rc = iv_fail(err, IV_ENOMEM, "out of memory building the answer");
    iv_buf_free(&prelude);
    iv_buf_free(&bin);
    return rc;
}

int iv_api_diffexp(const iv_api_diffexp_in_t *in, iv_buf_t *out, const char **ctype, iv_err_t *err)
{
    int binary = in->accept && strstr(in->accept, IV_DIFFEXP_MEDIA) != NULL;
    *ctype = "application/json";  /* errors and dry runs are JSON */
    cJSON *root = cJSON_ParseWithLength(in->body ? in->body : "", in->body_len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return iv_fail(err, IV_EBAD_JSON, "the request body must be a JSON object");
    }
    de_run_t r;
    memset(&r, 0, sizeof r);
    int rc = de_prepare(in, root, &r, err);
    if (rc == 0 && r.q.dry_run) put_dry_run(out, &r);
    else if (rc == 0 && (rc = de_compute(in, &r, err)) == 0 && (rc = de_encode(in, &r, binary, out, err)) == 0)
        *ctype = binary ? IV_DIFFEXP_MEDIA : "application/json";
    iv_de_free(r.de);
    labels_free(&r.lb);
    free(r.var.idx);
    cJSON_Delete(root);
    return rc;
}
