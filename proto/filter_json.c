/*
 * JSON filter objects to expression trees (see filter_json.h).
 *
 * The JSON form and the where string share one tree type and one
 * compiler, so the two front ends can only differ in syntax; everything
 * about columns and types is decided in core/meta/filter.c.  Errors name the
 * JSON path of the offending member so a client can find it in a large
 * generated filter.
 */
#include "filter_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH IV_FILTER_MAX_DEPTH

/* State of one parse: the nodes made so far, against IV_FILTER_MAX_NODES. */
typedef struct pstate {
    iv_err_t *err;
    size_t n_nodes;
} pstate_t;

/* Counts n new nodes; IV_ETOO_LARGE past the limit. */
static int count_nodes(pstate_t *st, size_t n, const char *path)
{
    st->n_nodes += n;
    if (st->n_nodes > IV_FILTER_MAX_NODES)
        return iv_fail(st->err, IV_ETOO_LARGE, "%s: the filter has more than %d terms", path,
                       IV_FILTER_MAX_NODES);
    return 0;
}

static int bad(iv_err_t *err, const char *path, const char *what)
{
    return iv_fail(err, IV_EBAD_REQUEST, "%s: %s", path, what);
}

static int oom(iv_err_t *err)
{
    return iv_fail(err, IV_ENOMEM, "filter: out of memory");
}

static int to_lit(const cJSON *v, iv_lit_t *l, iv_err_t *err, const char *path)
{
    memset(l, 0, sizeof(*l));
    if (cJSON_IsString(v)) {
        l->kind = IV_LIT_STR;
        l->str = v->valuestring;
        return 0;
    }
    if (cJSON_IsBool(v)) {
        l->kind = IV_LIT_BOOL;
        l->b = cJSON_IsTrue(v);
        return 0;
    }
    if (cJSON_IsNumber(v)) {
        l->kind = IV_LIT_NUM;
        l->num = v->valuedouble;
        /* JSON has one number type; integral values within 2^53 are kept
         * exact so that int64 columns compare as integers. */
        if (l->num == floor(l->num) && fabs(l->num) <= 9007199254740992.0) {
            l->is_int = 1;
            l->i = (int64_t)l->num;
        }
        return 0;
    }
    if (!path) return IV_EBAD_REQUEST;
    return bad(err, path, "expected a string, number or boolean");
}

static int parse_node(const cJSON *j, iv_expr_t **out, pstate_t *st, const char *path,
                      int depth);

static int parse_kids(const cJSON *arr, iv_expr_t *e, pstate_t *st, const char *path,
                      int depth)
{
    if (!cJSON_IsArray(arr)) return bad(st->err, path, "expected an array of filters");
    int i = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, arr)
    {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s[%d]", path, i++);
        iv_expr_t *kid = NULL;
        IV_TRY(parse_node(k, &kid, st, p2, depth + 1));
        if (iv_expr_add_kid(e, kid) < 0) {
            iv_expr_free(kid);
            return oom(st->err);
        }
    }
    return 0;
}

/* "in"/"not_in": [values] as one set leaf (NOT_IN is false on missing values). */
static int parse_set(const cJSON *m, const char *col, int neg, iv_expr_t **out, pstate_t *st,
                     const char *p2)
{
    *out = NULL;
    if (!cJSON_IsArray(m)) return bad(st->err, p2, "expected an array of values");
    iv_expr_t *e = iv_expr_new(neg ? IV_EXPR_NOT_IN : IV_EXPR_IN, col);
    if (!e) return oom(st->err);
    int rc = 0, i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, m)
    {
        if (i >= IV_FILTER_MAX_IN) {
            rc = iv_fail(st->err, IV_ETOO_LARGE, "%s: more than %d values", p2, IV_FILTER_MAX_IN);
            break;
        }
        /* The path is only formatted for an error: a list can hold a
         * million values. */
        iv_lit_t l;
        rc = to_lit(v, &l, NULL, NULL);
        if (rc < 0) {
            char p3[300];
            snprintf(p3, sizeof p3, "%.250s[%d]", p2, i);
            rc = to_lit(v, &l, st->err, p3);
        }
        i++;
        if (rc == 0 && iv_expr_add_lit(e, &l) < 0) rc = oom(st->err);
        if (rc < 0) break;
    }
    if (rc < 0) {
        iv_expr_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* Wraps *e in a NOT node; frees *e on failure. */
static int wrap_not(iv_expr_t **e, pstate_t *st, const char *path)
{
    int rc = count_nodes(st, 1, path);
    iv_expr_t *n = rc == 0 ? iv_expr_new(IV_EXPR_NOT, NULL) : NULL;
    if (rc == 0 && (!n || iv_expr_add_kid(n, *e) < 0)) rc = oom(st->err);
    if (rc < 0) {
        iv_expr_free(n);
        iv_expr_free(*e);
        *e = NULL;
        return rc;
    }
    *e = n;
    return 0;
}

/* The operator keys of a leaf: the comparisons (their iv_cmp_t order),
 * then in, not_in and is_null. */
static const char *const leaf_ops[] = {"eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "is_null"};
#define N_LEAF_OPS 9
#define N_CMP_OPS 6

/* The index of key in leaf_ops, or -1. */
static int leaf_op(const char *key)
{
    for (int k = 0; k < N_LEAF_OPS; k++)
        if (strcmp(key, leaf_ops[k]) == 0) return k;
    return -1;
}

/* One operator of a leaf on column col as its own node in *e. */
static int parse_leaf_op(const cJSON *m, const char *col, int op, iv_expr_t **e, pstate_t *st,
                         const char *p2)
{
    if (op >= 0 && op < N_CMP_OPS) {
        iv_lit_t l;
        IV_TRY(to_lit(m, &l, st->err, p2));
        *e = iv_expr_new(IV_EXPR_CMP, col);
        if (!*e || iv_expr_add_lit(*e, &l) < 0) return oom(st->err);
        (*e)->cmp = (iv_cmp_t)op;
        return 0;
    }
    if (op == 6 || op == 7) return parse_set(m, col, op == 7, e, st, p2);
    if (op == 8) {
        if (!cJSON_IsBool(m)) return bad(st->err, p2, "expected true or false");
        *e = iv_expr_new(IV_EXPR_IS_NULL, col);
        if (!*e) return oom(st->err);
        return cJSON_IsFalse(m) ? wrap_not(e, st, p2) : 0;
    }
    return bad(st->err, p2, "unknown operator (expected eq, ne, lt, le, gt, ge, in, not_in "
                            "or is_null)");
}

/* Key m of a leaf, added to all: "column" is counted (given twice is an
 * error), an operator given twice is an error, each operator one node.
 * Two equal keys: cJSON keeps both, other parsers one of them; a filter
 * must not mean different things to different clients. */
static int parse_leaf_key(const cJSON *m, const char *col, iv_expr_t *all, int *n_column,
                          unsigned *seen, pstate_t *st, const char *path)
{
    char p2[256];
    snprintf(p2, sizeof p2, "%.200s.%.40s", path, m->string);
    if (strcmp(m->string, "column") == 0)
        return ++*n_column > 1 ? bad(st->err, p2, "key given more than once") : 0;
    int op = leaf_op(m->string);
    if (op >= 0 && (*seen & (1u << op))) return bad(st->err, p2, "key given more than once");
    if (op >= 0) *seen |= 1u << op;
    IV_TRY(count_nodes(st, 1, p2));
    iv_expr_t *e = NULL;
    int rc = parse_leaf_op(m, col, op, &e, st, p2);
    if (rc == 0 && iv_expr_add_kid(all, e) < 0) rc = oom(st->err);
    if (rc < 0) iv_expr_free(e);
    return rc;
}

/* {"column": ..., op: value, ...}: one leaf per operator, joined by and. */
static int parse_leaf(const cJSON *j, iv_expr_t **out, pstate_t *st, const char *path)
{
    const cJSON *colj = cJSON_GetObjectItemCaseSensitive(j, "column");
    char p2[256];
    snprintf(p2, sizeof p2, "%.200s.column", path);
    if (!cJSON_IsString(colj)) return bad(st->err, p2, "expected a column name (string)");
    iv_expr_t *all = iv_expr_new(IV_EXPR_AND, NULL);
    if (!all) return oom(st->err);
    int rc = 0, n_column = 0;
    unsigned seen = 0;
    const cJSON *m;
    for (m = j->child; m && rc == 0; m = m->next)
        rc = parse_leaf_key(m, colj->valuestring, all, &n_column, &seen, st, path);
    if (rc == 0 && all->n_kids == 0) rc = bad(st->err, path, "a column needs an operator");
    if (rc < 0) {
        iv_expr_free(all);
        return rc;
    }
    if (all->n_kids == 1) {
        *out = all->kids[0];
        all->n_kids = 0;
        iv_expr_free(all);
    } else {
        *out = all;
    }
    return 0;
}

static int parse_node(const cJSON *j, iv_expr_t **out, pstate_t *st, const char *path,
                      int depth)
{
    *out = NULL;
    if (depth > MAX_DEPTH) return bad(st->err, path, "filter nested too deeply");
    if (!cJSON_IsObject(j)) return bad(st->err, path, "expected a filter object");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "and");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "or");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "not");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "column");
    int kinds = (a != NULL) + (o != NULL) + (n != NULL) + (c != NULL);
    if (kinds != 1 || (!c && (!j->child || j->child->next)))
        return bad(st->err, path, "expected exactly one of \"and\", \"or\", \"not\", \"column\"");
    char p2[256];
    if (c) return parse_leaf(j, out, st, path);
    if (n) {
        snprintf(p2, sizeof p2, "%.200s.not", path);
        iv_expr_t *kid = NULL;
        IV_TRY(parse_node(n, &kid, st, p2, depth + 1));
        IV_TRY(wrap_not(&kid, st, p2));
        *out = kid;
        return 0;
    }
    snprintf(p2, sizeof p2, "%.200s.%s", path, a ? "and" : "or");
    IV_TRY(count_nodes(st, 1, p2));
    iv_expr_t *e = iv_expr_new(a ? IV_EXPR_AND : IV_EXPR_OR, NULL);
    if (!e) return oom(st->err);
    int rc = parse_kids(a ? a : o, e, st, p2, depth);
    if (rc < 0) {
        iv_expr_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int iv_filter_json_parse(const cJSON *j, iv_expr_t **out, iv_err_t *err)
{
    pstate_t st = {err, 0};
    return parse_node(j, out, &st, "filter", 0);
}
