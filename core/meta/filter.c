/*
 * Filter trees: building, formatting, compiling against a meta, and
 * evaluating to row bitmaps (see filter.h).
 *
 * Why compile and evaluate are separate: every way a filter can be wrong
 * (an unknown column or category, a literal of the wrong type) is found
 * once, before any row is touched, so the server can answer 422 from the
 * loop thread and hand a program that cannot fail to a worker.  Compiling
 * also turns each leaf into the cheapest test its column allows: labels
 * of a categorical become a byte table indexed by code, so `in` with ten
 * thousand labels costs one hash per label plus one table load per row;
 * `in` on strings probes a hash set; numeric `in` binary-searches a
 * sorted array.  Leaves write 64 rows a word and inner nodes combine
 * words, so evaluation is a handful of sequential passes over columns.
 *
 * Those passes are also why a filter's cost is bounded before compiling:
 * each leaf is a pass over every row, so a request body of a few
 * megabytes (a hundred thousand `eq` terms) would cost a worker tens of
 * seconds on a large axis.  iv_filter_cost() estimates rows x leaves from
 * the tree alone, and compile refuses past IV_FILTER_MAX_COST.  Expression
 * arrays grow by doubling for the same reason: parsing stays linear in
 * the body whatever the allocator does with realloc.
 */
#include "filter.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "names.h"

#define MAX_DEPTH IV_FILTER_MAX_DEPTH

/* ------------------------------------------------------------ expressions */

const char *iv_cmp_symbol(iv_cmp_t c)
{
    static const char *s[] = {"==", "!=", "<", "<=", ">", ">="};
    return (unsigned)c < 6 ? s[c] : "?";
}

iv_expr_t *iv_expr_new(iv_expr_op_t op, const char *column)
{
    iv_expr_t *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    e->op = op;
    e->pos = -1;
    if (column) {
        e->column = strdup(column);
        if (!e->column) {
            free(e);
            return NULL;
        }
    }
    return e;
}

/* Grows *arr (of *cap elements of size sz) to hold at least need, doubling,
 * so that n appends make O(log n) reallocations and copy O(n) bytes. */
static int grow(void **arr, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 4;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / sz) return IV_ENOMEM;
        nc *= 2;
    }
    void *p = realloc(*arr, nc * sz);
    if (!p) return IV_ENOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

int iv_expr_add_kid(iv_expr_t *e, iv_expr_t *kid)
{
    void *k = e->kids;
    if (grow(&k, &e->cap_kids, e->n_kids + 1, sizeof(*e->kids)) < 0) return IV_ENOMEM;
    e->kids = k;
    e->kids[e->n_kids++] = kid;
    return 0;
}

int iv_expr_add_lit(iv_expr_t *e, const iv_lit_t *lit)
{
    void *l = e->lits;
    if (grow(&l, &e->cap_lits, e->n_lits + 1, sizeof(*e->lits)) < 0) return IV_ENOMEM;
    e->lits = l;
    iv_lit_t c = *lit;
    if (lit->kind == IV_LIT_STR) {
        c.str = strdup(lit->str ? lit->str : "");
        if (!c.str) return IV_ENOMEM;
    } else {
        c.str = NULL;
    }
    e->lits[e->n_lits++] = c;
    return 0;
}

size_t iv_expr_count(const iv_expr_t *e)
{
    if (!e) return 0;
    size_t n = 1;
    for (size_t i = 0; i < e->n_kids; i++) n += iv_expr_count(e->kids[i]);
    return n;
}

void iv_expr_free(iv_expr_t *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->n_kids; i++) iv_expr_free(e->kids[i]);
    for (size_t i = 0; i < e->n_lits; i++) free(e->lits[i].str);
    free(e->kids);
    free(e->lits);
    free(e->column);
    free(e);
}

/* Appends to a bounded buffer, counting what would have been written. */
typedef struct out {
    char *buf;
    size_t cap, len;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->len + 1 < o->cap) o->buf[o->len] = s[i];
        o->len++;
    }
    if (o->cap) o->buf[o->len < o->cap ? o->len : o->cap - 1] = '\0';
}

static void puts_(out_t *o, const char *s)
{
    put(o, s, strlen(s));
}

static int is_keyword(const char *s)
{
    /* inf and nan read as numbers where a value may stand, so a column
     * of that name needs quoting too. */
    static const char *kw[] = {"and", "or", "not", "in", "is", "null", "true", "false",
                               "inf", "nan", NULL};
    for (int i = 0; kw[i]; i++)
        if (strcasecmp(s, kw[i]) == 0) return 1;
    return 0;
}

static void put_column(out_t *o, const char *c)
{
    int plain = (isalpha((unsigned char)c[0]) || c[0] == '_') && !is_keyword(c);
    for (const char *p = c; plain && *p; p++)
        plain = isalnum((unsigned char)*p) || *p == '_' || *p == '.';
    if (plain) {
        puts_(o, c);
        return;
    }
    put(o, "`", 1);
    for (const char *p = c; *p; p++) {
        if (*p == '`' || *p == '\\') put(o, "\\", 1);
        put(o, p, 1);
    }
    put(o, "`", 1);
}

/* A number as the where syntax reads it back: integers plain, floats
 * with the fewest digits that round-trip and a '.0' when they would
 * read as an integer. */
static void put_num(out_t *o, const iv_lit_t *l)
{
    char b[48];
    if (l->is_int) snprintf(b, sizeof b, "%lld", (long long)l->i);
    else if (isnan(l->num)) snprintf(b, sizeof b, "nan");
    else if (isinf(l->num)) snprintf(b, sizeof b, "%sinf", l->num < 0 ? "-" : "");
    else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(b, sizeof b, "%.*g", prec, l->num);
            if (strtod(b, NULL) == l->num) break;
        }
        if (!strpbrk(b, ".eE")) strcat(b, ".0");
    }
    puts_(o, b);
}

/* A string quoted, its quotes, backslashes, newlines and tabs escaped. */
static void put_quoted(out_t *o, const char *str)
{
    put(o, "'", 1);
    for (const char *p = str; *p; p++) {
        if (*p == '\'' || *p == '\\') put(o, "\\", 1);
        if (*p == '\n') puts_(o, "\\n");
        else if (*p == '\t') puts_(o, "\\t");
        else put(o, p, 1);
    }
    put(o, "'", 1);
}

static void put_lit(out_t *o, const iv_lit_t *l)
{
    switch (l->kind) {
    case IV_LIT_BOOL: puts_(o, l->b ? "true" : "false"); return;
    case IV_LIT_NUM: put_num(o, l); return;
    case IV_LIT_STR: put_quoted(o, l->str); return;
    }
}

static void fmt(out_t *o, const iv_expr_t *e);

/* and/or: the operands in parentheses, or the identity when there are
 * none. */
static void fmt_junction(out_t *o, const iv_expr_t *e)
{
    if (e->n_kids == 0) {
        puts_(o, e->op == IV_EXPR_AND ? "true" : "false");
        return;
    }
    put(o, "(", 1);
    for (size_t i = 0; i < e->n_kids; i++) {
        if (i) puts_(o, e->op == IV_EXPR_AND ? " and " : " or ");
        fmt(o, e->kids[i]);
    }
    put(o, ")", 1);
}

/* in / not in with its list of values. */
static void fmt_in(out_t *o, const iv_expr_t *e)
{
    put(o, "(", 1);
    put_column(o, e->column);
    puts_(o, e->op == IV_EXPR_NOT_IN ? " not in [" : " in [");
    for (size_t i = 0; i < e->n_lits; i++) {
        if (i) puts_(o, ", ");
        put_lit(o, &e->lits[i]);
    }
    puts_(o, "])");
}

static void fmt(out_t *o, const iv_expr_t *e)
{
    switch (e->op) {
    case IV_EXPR_AND:
    case IV_EXPR_OR:
        fmt_junction(o, e);
        return;
    case IV_EXPR_NOT:
        puts_(o, "not ");
        if (e->n_kids) fmt(o, e->kids[0]);
        return;
    case IV_EXPR_CMP:
        put(o, "(", 1);
        put_column(o, e->column);
        put(o, " ", 1);
        puts_(o, iv_cmp_symbol(e->cmp));
        put(o, " ", 1);
        if (e->n_lits) put_lit(o, &e->lits[0]);
        put(o, ")", 1);
        return;
    case IV_EXPR_IN:
    case IV_EXPR_NOT_IN:
        fmt_in(o, e);
        return;
    case IV_EXPR_IS_NULL:
        put(o, "(", 1);
        put_column(o, e->column);
        puts_(o, " is null)");
        return;
    case IV_EXPR_TRUTH:
        put_column(o, e->column);
        return;
    case IV_EXPR_CONST:
        puts_(o, e->n_lits && e->lits[0].b ? "true" : "false");
        return;
    }
}

size_t iv_expr_format(const iv_expr_t *e, char *buf, size_t cap)
{
    out_t o = {buf, cap, 0};
    if (cap) buf[0] = '\0';
    fmt(&o, e);
    return o.len;
}

/* ------------------------------------------------------------- suggestions */

/* Edit distance of two strings, ASCII case folded, each cut at 64 bytes
 * (suggestions only need to be near, not exact).  With bound >= 0, stops
 * as soon as the distance must exceed bound and returns bound + 1: a row's
 * minimum never decreases, so an unknown label checked against 200,000
 * categories costs a few rows per category, not 64 x 64 cells. */
static int edit_distance(const char *a, const char *b, int bound)
{
    int la = (int)strnlen(a, 64), lb = (int)strnlen(b, 64);
    int row[65];
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int v = diag + cost;
            if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
            if (up + 1 < v) v = up + 1;
            row[j] = v;
            diag = up;
        }
        if (bound >= 0) {
            int lo = row[0];
            for (int j = 1; j <= lb; j++)
                if (row[j] < lo) lo = row[j];
            if (lo > bound) return bound + 1;
        }
    }
    return row[lb];
}

typedef const char *(*name_at_fn)(const void *ctx, int64_t i);

/* Keeps candidate i at distance d among the three nearest so far (best,
 * their distances bd, nearest first; a tie keeps the earlier). */
static void keep_nearest(int64_t best[3], int bd[3], int64_t i, int d)
{
    for (int k = 0; k < 3; k++) {
        if (d < bd[k]) {
            for (int m = 2; m > k; m--) bd[m] = bd[m - 1], best[m] = best[m - 1];
            bd[k] = d;
            best[k] = i;
            return;
        }
    }
}

/* Writes "; did you mean 'x', 'y'?" with up to three candidates close to
 * want, or nothing when none is close. */
static void suggest(char *buf, size_t cap, const char *want, int64_t n, name_at_fn at,
                    const void *ctx)
{
    int64_t best[3] = {-1, -1, -1};
    int bd[3] = {1 << 30, 1 << 30, 1 << 30};
    int limit = (int)strnlen(want, 64) / 3;
    if (limit < 2) limit = 2;
    if (n > 200000) n = 200000;
    buf[0] = '\0';
    for (int64_t i = 0; i < n; i++) {
        const char *c = at(ctx, i);
        int d = edit_distance(want, c, limit);
        if (d > limit) {
            if (!strcasestr(c, want)) continue;
            d = edit_distance(want, c, -1);  /* a substring: rank by its whole distance */
        }
        keep_nearest(best, bd, i, d);
    }
    if (best[0] < 0) return;
    /* A name that differs only in case is what was meant: the others,
     * however near, would only hide it. */
    if (bd[0] == 0)
        for (int k = 1; k < 3; k++)
            if (bd[k] > 0) best[k] = -1;
    size_t len = (size_t)snprintf(buf, cap, "; did you mean ");
    for (int k = 0; k < 3 && best[k] >= 0 && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s'%.60s'", k ? ", " : "",
                                at(ctx, best[k]));
    if (len < cap) snprintf(buf + len, cap - len, "?");
}

typedef struct colctx {
    const iv_meta_t *m;
    iv_axis_t axis;
} colctx_t;

static const char *col_name_at(const void *ctx, int64_t i)
{
    const colctx_t *c = ctx;
    size_t nc = iv_meta_n_cols(c->m, c->axis);
    if ((size_t)i < nc) return iv_meta_col(c->m, c->axis, (size_t)i)->name;
    return iv_meta_index(c->m, c->axis)->name;
}

static const char *cat_at(const void *ctx, int64_t i)
{
    return iv_meta_col_cat(ctx, i);
}

/* Writes "; its categories are 'a', 'b'" when a column has few enough
 * categories to read in one line and none was near the unknown one. */
static void list_categories(char *buf, size_t cap, const iv_meta_col_t *col)
{
    buf[0] = '\0';
    if (col->n_cats < 1 || col->n_cats > 12) return;
    size_t len = (size_t)snprintf(buf, cap, "; its categories are ");
    for (int64_t k = 0; k < col->n_cats && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s'%.40s'", k ? ", " : "",
                                iv_meta_col_cat(col, k));
}

/* ----------------------------------------------------------------- program */

typedef struct strset {
    const char **keys;
    uint32_t mask;
} strset_t;

typedef struct fnode {
    iv_expr_op_t op;
    const iv_meta_col_t *col;
    iv_cmp_t cmp;
    int neg;              /* NOT_IN: the set test is inverted (missing stays false) */
    int const_val;
    /* leaf tests, by column type */
    uint8_t *code_ok;     /* categorical: n_cats bytes, 1 = matches (eq/ne/in/order) */
    int64_t ilit;         /* INT cmp with an integer literal */
    double dlit;          /* numeric cmp */
    int use_int;
    const char *slit;     /* STRING cmp (owned copy) */
    char *slit_own;
    int64_t *iset;        /* sorted int64 set (INT in) */
    double *dset;         /* sorted double set (FLOAT/BOOL in) */
    size_t n_set;
    strset_t sset;        /* STRING in */
    char **sown;          /* owned label copies of sset */
    size_t n_sown;
    struct fnode **kids;
    size_t n_kids;
} fnode_t;

struct iv_fprog {
    const iv_meta_t *m;
    iv_axis_t axis;
    int64_t n;
    int depth;
    fnode_t *root;
};

static void node_free(fnode_t *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n_kids; i++) node_free(f->kids[i]);
    free(f->kids);
    free(f->code_ok);
    free(f->slit_own);
    free(f->iset);
    free(f->dset);
    free(f->sset.keys);
    for (size_t i = 0; i < f->n_sown; i++) free(f->sown[i]);
    free(f->sown);
    free(f);
}

void iv_filter_free(iv_fprog_t *p)
{
    if (!p) return;
    node_free(p->root);
    free(p);
}

int64_t iv_filter_n_rows(const iv_fprog_t *p)
{
    return p->n;
}

typedef struct cctx {
    const iv_meta_t *m;
    iv_axis_t axis;
    iv_err_t *err;
    int max_depth;
} cctx_t;

static const char *axis_name(iv_axis_t a)
{
    return a == IV_AXIS_VAR ? "var" : "obs";
}

/* " (at position N)" when the node came from a where string. */
static void at_pos(char *b, size_t cap, const iv_expr_t *e)
{
    if (e->pos >= 0) snprintf(b, cap, " (at position %lld)", (long long)e->pos);
    else b[0] = '\0';
}

static const char *lit_kind_name(const iv_lit_t *l)
{
    return l->kind == IV_LIT_STR ? "a string" : l->kind == IV_LIT_BOOL ? "a boolean" : "a number";
}

static int mismatch(cctx_t *c, const iv_expr_t *e, const iv_meta_col_t *col, const iv_lit_t *l)
{
    char pos[48], lit[96];
    at_pos(pos, sizeof pos, e);
    out_t o = {lit, sizeof lit, 0};
    put_lit(&o, l);
    return iv_fail(c->err, IV_EBAD_FILTER, "%s column '%s' holds %s values; it cannot be "
                   "compared with %s (%s)%s", axis_name(c->axis), col->name,
                   iv_col_type_name(col->type), lit_kind_name(l), lit, pos);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Category code of a literal, or -1 when absent.  hash (optional) holds
 * the categories when there are many. */
static int64_t find_cat(const iv_meta_col_t *col, const iv_names_t *hash, const iv_lit_t *l)
{
    if (l->kind == IV_LIT_NUM) {
        if (!col->cats_numeric) return -1;
        for (int64_t k = 0; k < col->n_cats; k++)
            if (col->cat_num[k] == l->num) return k;
        return -1;
    }
    if (l->kind == IV_LIT_BOOL) {
        const char *s = l->b ? "True" : "False";
        for (int64_t k = 0; k < col->n_cats; k++)
            if (strcmp(iv_meta_col_cat(col, k), s) == 0) return k;
        return -1;
    }
    if (hash) return iv_names_find(hash, l->str, strlen(l->str));
    for (int64_t k = 0; k < col->n_cats; k++)
        if (strcmp(iv_meta_col_cat(col, k), l->str) == 0) return k;
    return -1;
}

static int strset_build(strset_t *s, const iv_lit_t *lits, size_t n)
{
    uint64_t size = 16;
    while (size < (uint64_t)n * 2) size <<= 1;
    s->keys = calloc(size, sizeof(char *));
    if (!s->keys) return IV_ENOMEM;
    s->mask = (uint32_t)(size - 1);
    for (size_t i = 0; i < n; i++) {
        const char *k = lits[i].str;
        uint32_t j = (uint32_t)iv_names_hash(k, strlen(k), 0) & s->mask;
        while (s->keys[j] && strcmp(s->keys[j], k) != 0) j = (j + 1) & s->mask;
        s->keys[j] = k;
    }
    return 0;
}

static int strset_has(const strset_t *s, const char *k)
{
    uint32_t j = (uint32_t)iv_names_hash(k, strlen(k), 0) & s->mask;
    while (s->keys[j]) {
        if (strcmp(s->keys[j], k) == 0) return 1;
        j = (j + 1) & s->mask;
    }
    return 0;
}

static int compile_node(cctx_t *c, const iv_expr_t *e, int depth, fnode_t **out);

/* Whether literal l may be compared with a column of col's type. */
static int lit_suits(const iv_meta_col_t *col, const iv_lit_t *l)
{
    switch (col->type) {
    case IV_COL_INT:
    case IV_COL_FLOAT:
        return l->kind == IV_LIT_NUM;
    case IV_COL_BOOL:
        return l->kind != IV_LIT_STR;
    case IV_COL_STRING:
        return l->kind == IV_LIT_STR;
    case IV_COL_CATEGORICAL:
        if (l->kind == IV_LIT_NUM && !col->cats_numeric) return 0;
        if (l->kind == IV_LIT_STR && col->cats_numeric) return 0;
        return 1;
    }
    return 1;
}

/* The leaf's column, or NULL with an error naming the closest columns. */
static const iv_meta_col_t *resolve_column(cctx_t *c, const iv_expr_t *e, const char *pos)
{
    const iv_meta_col_t *col = iv_meta_find_col(c->m, c->axis, e->column);
    if (col) return col;
    char sug[300];
    colctx_t cc = {c->m, c->axis};
    suggest(sug, sizeof sug, e->column, (int64_t)iv_meta_n_cols(c->m, c->axis) + 1,
            col_name_at, &cc);
    iv_fail(c->err, IV_EBAD_FILTER, "unknown %s column '%.100s'%s%s", axis_name(c->axis),
            e->column, sug, pos);
    return NULL;
}

/* The error for a literal that names no category of col. */
static int unknown_category(cctx_t *c, const iv_meta_col_t *col, const iv_lit_t *l,
                            const char *pos)
{
    char lit[96], sug[300];
    out_t o = {lit, sizeof lit, 0};
    put_lit(&o, l);
    if (l->kind == IV_LIT_STR)
        suggest(sug, sizeof sug, l->str, col->n_cats, cat_at, col);
    else
        sug[0] = '\0';
    if (!sug[0]) list_categories(sug, sizeof sug, col);
    return iv_fail(c->err, IV_EBAD_FILTER, "unknown category %s of %s column '%s'%s%s", lit,
                   axis_name(c->axis), col->name, sug, pos);
}

/* Ordered categoricals compare by category position, as pandas does;
 * equality is the same code.  Fills ok[j] for every code j against k. */
static void fill_code_cmp(uint8_t *ok, int64_t n_cats, iv_cmp_t cmp, int64_t k)
{
    for (int64_t j = 0; j < n_cats; j++) {
        int r;
        switch (cmp) {
        case IV_CMP_EQ: r = j == k; break;
        case IV_CMP_NE: r = j != k; break;
        case IV_CMP_LT: r = j < k; break;
        case IV_CMP_LE: r = j <= k; break;
        case IV_CMP_GT: r = j > k; break;
        default: r = j >= k; break;
        }
        ok[j] = (uint8_t)r;
    }
}

/* Marks in f->code_ok the codes the leaf's literals select. */
static int mark_codes(cctx_t *c, const iv_expr_t *e, fnode_t *f, int is_set, const char *pos)
{
    const iv_meta_col_t *col = f->col;
    iv_names_t *hash = NULL;
    if (col->n_cats > 16 && e->n_lits > 4 && !col->cats_numeric) {
        int rc = iv_names_build(col->n_cats, cat_at, col, &hash, c->err);
        if (rc < 0) return rc;
    }
    int rc = 0;
    for (size_t i = 0; i < e->n_lits && rc == 0; i++) {
        int64_t k = find_cat(col, hash, &e->lits[i]);
        if (k < 0)
            rc = unknown_category(c, col, &e->lits[i], pos);
        else if (is_set)
            f->code_ok[k] = 1;
        else
            fill_code_cmp(f->code_ok, col->n_cats, e->cmp, k);
    }
    iv_names_free(hash);
    return rc;
}

/* A categorical leaf becomes a byte table indexed by code. */
static int compile_categorical(cctx_t *c, const iv_expr_t *e, fnode_t *f, int is_set,
                               int ordering, const char *pos)
{
    const iv_meta_col_t *col = f->col;
    IV_RETURN_IF(ordering && !col->ordered, c->err, IV_EBAD_FILTER,
                 "%s column '%s' is an unordered categorical; '%s' needs an order "
                 "(use ==, != or in)%s", axis_name(c->axis), col->name, iv_cmp_symbol(e->cmp),
                 pos);
    f->code_ok = calloc((size_t)(col->n_cats ? col->n_cats : 1), 1);
    IV_RETURN_IF(!f->code_ok, c->err, IV_ENOMEM, "filter: out of memory");
    int rc = mark_codes(c, e, f, is_set, pos);
    /* The table is indexed by present codes only, so inverting it
     * leaves missing values (code -1) false. */
    if (rc == 0 && f->neg)
        for (int64_t j = 0; j < col->n_cats; j++) f->code_ok[j] = !f->code_ok[j];
    f->neg = 0;
    return rc;
}

/* A string leaf becomes a hash set (in) or one owned literal. */
static int compile_string(cctx_t *c, const iv_expr_t *e, fnode_t *f, int is_set)
{
    if (!is_set) {
        f->slit_own = strdup(e->lits[0].str);
        IV_RETURN_IF(!f->slit_own, c->err, IV_ENOMEM, "filter: out of memory");
        f->slit = f->slit_own;
        return 0;
    }
    f->sown = calloc(e->n_lits ? e->n_lits : 1, sizeof(char *));
    IV_RETURN_IF(!f->sown, c->err, IV_ENOMEM, "filter: out of memory");
    IV_RETURN_IF(strset_build(&f->sset, e->lits, e->n_lits) < 0, c->err, IV_ENOMEM,
                 "filter: out of memory");
    /* The set points at the expression's strings; own copies so
     * the expression may be freed after compile. */
    for (uint32_t j = 0; j <= f->sset.mask; j++) {
        if (!f->sset.keys[j]) continue;
        char *d = strdup(f->sset.keys[j]);
        IV_RETURN_IF(!d, c->err, IV_ENOMEM, "filter: out of memory");
        f->sown[f->n_sown++] = d;
        f->sset.keys[j] = d;
    }
    return 0;
}

/* Numeric `in` on an integer column: a sorted array of the literals. */
static int build_int_set(cctx_t *c, const iv_expr_t *e, fnode_t *f)
{
    size_t n = e->n_lits;
    f->iset = malloc((n ? n : 1) * sizeof(int64_t));
    IV_RETURN_IF(!f->iset, c->err, IV_ENOMEM, "filter: out of memory");
    /* Only integral literals can equal an integer. */
    for (size_t i = 0; i < n; i++) {
        const iv_lit_t *l = &e->lits[i];
        if (l->is_int) f->iset[f->n_set++] = l->i;
        else if (l->num == floor(l->num) && fabs(l->num) < 9.2e18)
            f->iset[f->n_set++] = (int64_t)l->num;
    }
    qsort(f->iset, f->n_set, sizeof(int64_t), cmp_i64);
    return 0;
}

/* Numeric `in` on a float or boolean column: a sorted array of the
 * literals, NaN left out. */
static int build_dbl_set(cctx_t *c, const iv_expr_t *e, fnode_t *f)
{
    size_t n = e->n_lits;
    f->dset = malloc((n ? n : 1) * sizeof(double));
    IV_RETURN_IF(!f->dset, c->err, IV_ENOMEM, "filter: out of memory");
    for (size_t i = 0; i < n; i++) {
        const iv_lit_t *l = &e->lits[i];
        double v = l->kind == IV_LIT_BOOL ? (double)l->b : l->num;
        if (!isnan(v)) f->dset[f->n_set++] = v;
    }
    qsort(f->dset, f->n_set, sizeof(double), cmp_dbl);
    return 0;
}

/* An int, float or boolean leaf becomes a sorted set or one literal. */
static int compile_number(cctx_t *c, const iv_expr_t *e, fnode_t *f, int is_set)
{
    if (is_set) return f->col->type == IV_COL_INT ? build_int_set(c, e, f)
                                                  : build_dbl_set(c, e, f);
    const iv_lit_t *l = &e->lits[0];
    f->dlit = l->kind == IV_LIT_BOOL ? (double)l->b : l->num;
    f->use_int = f->col->type == IV_COL_INT && l->is_int;
    f->ilit = l->i;
    return 0;
}

static int compile_leaf(cctx_t *c, const iv_expr_t *e, fnode_t *f)
{
    char pos[48];
    at_pos(pos, sizeof pos, e);
    IV_RETURN_IF(!e->column, c->err, IV_EBAD_FILTER, "filter leaf without a column%s", pos);
    const iv_meta_col_t *col = resolve_column(c, e, pos);
    if (!col) return IV_EBAD_FILTER;
    f->col = col;
    if (e->op == IV_EXPR_IS_NULL) return 0;
    if (e->op == IV_EXPR_TRUTH) {
        IV_RETURN_IF(col->type != IV_COL_BOOL, c->err, IV_EBAD_FILTER,
                     "%s column '%s' holds %s values, not booleans; compare it with a value%s",
                     axis_name(c->axis), col->name, iv_col_type_name(col->type), pos);
        return 0;
    }
    IV_RETURN_IF(e->op == IV_EXPR_CMP && e->n_lits != 1, c->err, IV_EBAD_FILTER,
                 "comparison on '%s' needs exactly one value%s", col->name, pos);
    /* not_in compiles to the `in` tables with the test inverted. */
    int is_set = e->op == IV_EXPR_IN || e->op == IV_EXPR_NOT_IN;
    f->neg = e->op == IV_EXPR_NOT_IN;
    int ordering = e->op == IV_EXPR_CMP && e->cmp >= IV_CMP_LT;
    for (size_t i = 0; i < e->n_lits; i++)
        if (!lit_suits(col, &e->lits[i])) return mismatch(c, e, col, &e->lits[i]);
    switch (col->type) {
    case IV_COL_CATEGORICAL: return compile_categorical(c, e, f, is_set, ordering, pos);
    case IV_COL_STRING: return compile_string(c, e, f, is_set);
    case IV_COL_INT:
    case IV_COL_FLOAT:
    case IV_COL_BOOL: return compile_number(c, e, f, is_set);
    }
    return 0;
}

static int compile_node(cctx_t *c, const iv_expr_t *e, int depth, fnode_t **out)
{
    *out = NULL;
    IV_RETURN_IF(depth > MAX_DEPTH, c->err, IV_EBAD_FILTER, "filter nested deeper than %d",
                 MAX_DEPTH);
    if (depth > c->max_depth) c->max_depth = depth;
    fnode_t *f = calloc(1, sizeof(*f));
    IV_RETURN_IF(!f, c->err, IV_ENOMEM, "filter: out of memory");
    f->op = e->op;
    f->cmp = e->cmp;
    int rc = 0;
    switch (e->op) {
    case IV_EXPR_AND:
    case IV_EXPR_OR:
    case IV_EXPR_NOT:
        if (e->op == IV_EXPR_NOT && e->n_kids != 1) {
            rc = iv_fail(c->err, IV_EBAD_FILTER, "'not' takes exactly one operand");
            break;
        }
        f->kids = calloc(e->n_kids ? e->n_kids : 1, sizeof(*f->kids));
        if (!f->kids) {
            rc = iv_fail(c->err, IV_ENOMEM, "filter: out of memory");
            break;
        }
        for (size_t i = 0; i < e->n_kids && rc == 0; i++) {
            rc = compile_node(c, e->kids[i], depth + 1, &f->kids[i]);
            if (rc == 0) f->n_kids++;
        }
        break;
    case IV_EXPR_CONST:
        f->const_val = e->n_lits > 0 && e->lits[0].kind == IV_LIT_BOOL && e->lits[0].b;
        break;
    case IV_EXPR_CMP:
    case IV_EXPR_IN:
    case IV_EXPR_NOT_IN:
    case IV_EXPR_IS_NULL:
    case IV_EXPR_TRUTH:
        rc = compile_leaf(c, e, f);
        break;
    default:
        rc = iv_fail(c->err, IV_EBAD_FILTER, "unknown filter operation %d", (int)e->op);
    }
    if (rc < 0) {
        node_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

static int64_t sat_add(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static int64_t cost_node(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e, int64_t n,
                         int depth)
{
    /* Deeper trees fail to compile with their own message; stop before
     * the stack does. */
    if (depth > MAX_DEPTH) return 0;
    int64_t c = 1 + n / 64;
    switch (e->op) {
    case IV_EXPR_AND:
    case IV_EXPR_OR:
    case IV_EXPR_NOT:
        for (size_t i = 0; i < e->n_kids && c < INT64_MAX; i++)
            c = sat_add(c, cost_node(m, axis, e->kids[i], n, depth + 1));
        return c;
    case IV_EXPR_CONST: return c;
    default: break;
    }
    const iv_meta_col_t *col = m && e->column ? iv_meta_find_col(m, axis, e->column) : NULL;
    int64_t w = col && col->type == IV_COL_STRING ? 4 : 1;
    int64_t rows = n > INT64_MAX / w ? INT64_MAX : n * w;
    c = sat_add(c, rows);
    if (col && col->type == IV_COL_CATEGORICAL) c = sat_add(c, col->n_cats);
    return sat_add(c, (int64_t)e->n_lits);
}

int64_t iv_filter_cost(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e, int64_t n_rows)
{
    return e ? cost_node(m, axis, e, n_rows < 0 ? 0 : n_rows, 0) : 0;
}

int iv_filter_compile(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e,
                      iv_fprog_t **out, iv_err_t *err)
{
    *out = NULL;
    IV_RETURN_IF(!e, err, IV_EBAD_FILTER, "empty filter");
    /* Bound the work before building anything: a request body of a few
     * megabytes can hold a hundred thousand terms, each a pass over every
     * row. */
    int64_t cost = iv_filter_cost(m, axis, e, iv_meta_n_rows(m, axis));
    IV_RETURN_IF(cost > IV_FILTER_MAX_COST, err, IV_ETOO_LARGE,
                 "filter too costly: %zu terms over %lld %s rows come to about %lld row visits; "
                 "the limit is %lld (use 'in' lists rather than many comparisons)",
                 iv_expr_count(e), (long long)iv_meta_n_rows(m, axis), axis_name(axis),
                 (long long)cost, (long long)IV_FILTER_MAX_COST);
    iv_fprog_t *p = calloc(1, sizeof(*p));
    IV_RETURN_IF(!p, err, IV_ENOMEM, "filter: out of memory");
    cctx_t c = {m, axis, err, 0};
    int rc = compile_node(&c, e, 0, &p->root);
    if (rc < 0) {
        free(p);
        return rc;
    }
    p->m = m;
    p->axis = axis;
    p->n = iv_meta_n_rows(m, axis);
    p->depth = c.max_depth;
    *out = p;
    return 0;
}

/* -------------------------------------------------------------- evaluation */

/* Builds the words of a leaf from a per-row predicate, 64 rows a word.
 * The macro keeps one tight loop per column type without a function
 * call per row. */
#define LEAF_LOOP(out, n, PRED)                                            \
    do {                                                                   \
        size_t nw_ = iv_bitmap_words(out);                                 \
        for (size_t w_ = 0; w_ < nw_; w_++) {                              \
            int64_t base_ = (int64_t)w_ * 64;                              \
            int64_t lim_ = (n) - base_ < 64 ? (n) - base_ : 64;            \
            uint64_t bits_ = 0;                                            \
            for (int64_t j_ = 0; j_ < lim_; j_++) {                        \
                int64_t i = base_ + j_;                                    \
                bits_ |= (uint64_t)((PRED) != 0) << j_;                    \
            }                                                              \
            (out)->w[w_] = bits_;                                          \
        }                                                                  \
    } while (0)

static int cmp_ok(iv_cmp_t c, int s)
{
    switch (c) {
    case IV_CMP_EQ: return s == 0;
    case IV_CMP_NE: return s != 0;
    case IV_CMP_LT: return s < 0;
    case IV_CMP_LE: return s <= 0;
    case IV_CMP_GT: return s > 0;
    default: return s >= 0;
    }
}

static int in_i64(const int64_t *set, size_t n, int64_t v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && set[lo] == v;
}

static int in_dbl(const double *set, size_t n, double v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && set[lo] == v;
}

#define NUM_CMP_LOOP(out, n, VAL, LIT)                                       \
    switch (f->cmp) {                                                        \
    case IV_CMP_EQ: LEAF_LOOP(out, n, (VAL) == (LIT)); break;                \
    case IV_CMP_NE: LEAF_LOOP(out, n, (VAL) != (LIT)); break;                \
    case IV_CMP_LT: LEAF_LOOP(out, n, (VAL) < (LIT)); break;                 \
    case IV_CMP_LE: LEAF_LOOP(out, n, (VAL) <= (LIT)); break;                \
    case IV_CMP_GT: LEAF_LOOP(out, n, (VAL) > (LIT)); break;                 \
    default: LEAF_LOOP(out, n, (VAL) >= (LIT)); break;                       \
    }

static void eval_leaf(const fnode_t *f, int64_t n, iv_bitmap_t *out)
{
    const iv_meta_col_t *c = f->col;
    int is_set = f->op == IV_EXPR_IN || f->op == IV_EXPR_NOT_IN, neg = f->neg;
    if (f->op == IV_EXPR_IS_NULL) {
        if (c->mask) LEAF_LOOP(out, n, c->mask[i]);
        else iv_bitmap_fill(out, 0);
        return;
    }
    switch (c->type) {
    case IV_COL_CATEGORICAL: {
        /* Missing codes (-1) never match: code_ok is indexed from 0. */
        const int32_t *codes = c->codes;
        const uint8_t *ok = f->code_ok;
        LEAF_LOOP(out, n, codes[i] >= 0 && ok[codes[i]]);
        return;
    }
    case IV_COL_BOOL: {
        const uint8_t *b = c->b;
        if (f->op == IV_EXPR_TRUTH) LEAF_LOOP(out, n, b[i]);
        else if (is_set) LEAF_LOOP(out, n, in_dbl(f->dset, f->n_set, (double)b[i]) != neg);
        else {
            double lit = f->dlit;
            NUM_CMP_LOOP(out, n, (double)b[i], lit);
        }
        break;
    }
    case IV_COL_INT: {
        const int64_t *v = c->i64;
        if (is_set) {
            LEAF_LOOP(out, n, in_i64(f->iset, f->n_set, v[i]) != neg);
        } else if (f->use_int) {
            int64_t lit = f->ilit;
            NUM_CMP_LOOP(out, n, v[i], lit);
        } else {
            double lit = f->dlit;
            NUM_CMP_LOOP(out, n, (double)v[i], lit);
        }
        break;
    }
    case IV_COL_FLOAT: {
        const double *v = c->f64;
        double lit = f->dlit;
        if (is_set) LEAF_LOOP(out, n, in_dbl(f->dset, f->n_set, v[i]) != neg);
        else NUM_CMP_LOOP(out, n, v[i], lit);
        break;
    }
    case IV_COL_STRING:
        if (is_set)
            LEAF_LOOP(out, n, strset_has(&f->sset, iv_meta_col_str(c, i)) != neg);
        else
            LEAF_LOOP(out, n, cmp_ok(f->cmp, strcmp(iv_meta_col_str(c, i), f->slit)));
        break;
    }
    /* Missing values never match a comparison (nor `ne`, nor `not in`):
     * clear them. */
    if (c->mask) {
        size_t nw = iv_bitmap_words(out);
        for (size_t w = 0; w < nw; w++) {
            uint64_t mbits = 0;
            int64_t base = (int64_t)w * 64, lim = n - base < 64 ? n - base : 64;
            for (int64_t j = 0; j < lim; j++) mbits |= (uint64_t)(c->mask[base + j] != 0) << j;
            out->w[w] &= ~mbits;
        }
    }
}

/* tmp holds one scratch bitmap per tree level below this node. */
static void eval_node(const fnode_t *f, int64_t n, iv_bitmap_t *out, iv_bitmap_t *tmp)
{
    switch (f->op) {
    case IV_EXPR_AND:
    case IV_EXPR_OR:
        if (f->n_kids == 0) {
            iv_bitmap_fill(out, f->op == IV_EXPR_AND);
            return;
        }
        eval_node(f->kids[0], n, out, tmp);
        for (size_t i = 1; i < f->n_kids; i++) {
            eval_node(f->kids[i], n, tmp, tmp + 1);
            if (f->op == IV_EXPR_AND) iv_bitmap_and(out, tmp);
            else iv_bitmap_or(out, tmp);
        }
        return;
    case IV_EXPR_NOT:
        eval_node(f->kids[0], n, out, tmp);
        iv_bitmap_not(out);
        return;
    case IV_EXPR_CONST:
        iv_bitmap_fill(out, f->const_val);
        return;
    default:
        eval_leaf(f, n, out);
        return;
    }
}

int iv_filter_eval(const iv_fprog_t *p, iv_bitmap_t *out, iv_err_t *err)
{
    IV_RETURN_IF(out->n != p->n, err, IV_EINVALID_ARG, "filter: bitmap of %lld rows for %lld",
                 (long long)out->n, (long long)p->n);
    int levels = p->depth + 1;
    iv_bitmap_t *tmp = calloc((size_t)levels, sizeof(*tmp));
    IV_RETURN_IF(!tmp, err, IV_ENOMEM, "filter: out of memory");
    int rc = 0;
    for (int i = 0; i < levels; i++) {
        if (iv_bitmap_init(&tmp[i], p->n) < 0) {
            rc = iv_fail(err, IV_ENOMEM, "filter: out of memory for %lld rows", (long long)p->n);
            break;
        }
    }
    if (rc == 0) eval_node(p->root, p->n, out, tmp);
    for (int i = 0; i < levels; i++) iv_bitmap_free(&tmp[i]);
    free(tmp);
    return rc;
}

int iv_filter_select(const iv_fprog_t *p, int64_t **idx, int64_t *n, iv_err_t *err)
{
    *idx = NULL;
    *n = 0;
    iv_bitmap_t b;
    IV_RETURN_IF(iv_bitmap_init(&b, p->n) < 0, err, IV_ENOMEM, "filter: out of memory");
    int rc = iv_filter_eval(p, &b, err);
    if (rc == 0 && iv_bitmap_to_index(&b, idx, n) < 0)
        rc = iv_fail(err, IV_ENOMEM, "filter: out of memory");
    iv_bitmap_free(&b);
    return rc;
}
