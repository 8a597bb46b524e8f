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

static const char *ops[] = {"eq", "ne", "lt", "le", "gt", "ge"};

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

/* {"column": ..., op: value, ...}: one leaf per operator, joined by and. */
static int parse_leaf(const cJSON *j, iv_expr_t **out, pstate_t *st, const char *path)
{
    const cJSON *colj = cJSON_GetObjectItemCaseSensitive(j, "column");
    char p2[256];
    snprintf(p2, sizeof p2, "%.200s.column", path);
    if (!cJSON_IsString(colj)) return bad(st->err, p2, "expected a column name (string)");
    const char *col = colj->valuestring;
    iv_expr_t *all = iv_expr_new(IV_EXPR_AND, NULL);
    if (!all) return oom(st->err);
    int rc = 0, n_column = 0;
    unsigned seen = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, j)
    {
        snprintf(p2, sizeof p2, "%.200s.%.40s", path, m->string);
        /* Two equal keys: cJSON keeps both, other parsers one of them; a
         * filter must not mean different things to different clients. */
        if (strcmp(m->string, "column") == 0) {
            if (++n_column > 1) {
                rc = bad(st->err, p2, "key given more than once");
                break;
            }
            continue;
        }
        int bit = -1;
        for (int k = 0; k < 6 && bit < 0; k++)
            if (strcmp(m->string, ops[k]) == 0) bit = k;
        if (bit < 0 && strcmp(m->string, "in") == 0) bit = 6;
        if (bit < 0 && strcmp(m->string, "not_in") == 0) bit = 7;
        if (bit < 0 && strcmp(m->string, "is_null") == 0) bit = 8;
        if (bit >= 0 && (seen & (1u << bit))) {
            rc = bad(st->err, p2, "key given more than once");
            break;
        }
        if (bit >= 0) seen |= 1u << bit;
        iv_expr_t *e = NULL;
        int op = -1;
        for (int k = 0; k < 6; k++)
            if (strcmp(m->string, ops[k]) == 0) op = k;
        rc = count_nodes(st, 1, p2);
        if (rc < 0) break;
        if (op >= 0) {
            iv_lit_t l;
            rc = to_lit(m, &l, st->err, p2);
            if (rc == 0) {
                e = iv_expr_new(IV_EXPR_CMP, col);
                if (!e || iv_expr_add_lit(e, &l) < 0) rc = oom(st->err);
                else e->cmp = (iv_cmp_t)op;
            }
        } else if (strcmp(m->string, "in") == 0 || strcmp(m->string, "not_in") == 0) {
            rc = parse_set(m, col, m->string[0] == 'n', &e, st, p2);
        } else if (strcmp(m->string, "is_null") == 0) {
            if (!cJSON_IsBool(m)) {
                rc = bad(st->err, p2, "expected true or false");
            } else {
                e = iv_expr_new(IV_EXPR_IS_NULL, col);
                if (!e) rc = oom(st->err);
                if (rc == 0 && cJSON_IsFalse(m)) rc = wrap_not(&e, st, p2);
            }
        } else {
            rc = bad(st->err, p2, "unknown operator (expected eq, ne, lt, le, gt, ge, in, not_in "
                                  "or is_null)");
        }
        if (rc == 0 && iv_expr_add_kid(all, e) < 0) rc = oom(st->err);
        if (rc < 0) {
            iv_expr_free(e);
            break;
        }
    }
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
