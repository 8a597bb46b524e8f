/*
 * JSON filter objects to expression trees (see filter_json.h).
 *
 * The JSON form and the where string share one tree type and one
 * compiler, so the two front ends can only differ in syntax; everything
 * about columns and types is decided in core/filter.c.  Errors name the
 * JSON path of the offending member so a client can find it in a large
 * generated filter.
 */
#include "filter_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 256

static int bad(iv_err_t *err, const char *path, const char *what)
{
    return iv_fail(err, IV_EBAD_REQUEST, "%s: %s", path, what);
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
    return bad(err, path, "expected a string, number or boolean");
}

static const char *ops[] = {"eq", "ne", "lt", "le", "gt", "ge"};

static int parse_node(const cJSON *j, iv_expr_t **out, iv_err_t *err, const char *path,
                      int depth);

static int parse_kids(const cJSON *arr, iv_expr_t *e, iv_err_t *err, const char *path,
                      int depth)
{
    if (!cJSON_IsArray(arr)) return bad(err, path, "expected an array of filters");
    int i = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, arr)
    {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s[%d]", path, i++);
        iv_expr_t *kid = NULL;
        IV_TRY(parse_node(k, &kid, err, p2, depth + 1));
        if (iv_expr_add_kid(e, kid) < 0) {
            iv_expr_free(kid);
            return iv_fail(err, IV_ENOMEM, "filter: out of memory");
        }
    }
    return 0;
}

/* {"column": ..., op: value, ...}: one leaf per operator, joined by and. */
static int parse_leaf(const cJSON *j, iv_expr_t **out, iv_err_t *err, const char *path)
{
    const cJSON *colj = cJSON_GetObjectItemCaseSensitive(j, "column");
    char p2[256];
    snprintf(p2, sizeof p2, "%.200s.column", path);
    if (!cJSON_IsString(colj)) return bad(err, p2, "expected a column name (string)");
    const char *col = colj->valuestring;
    iv_expr_t *all = iv_expr_new(IV_EXPR_AND, NULL);
    if (!all) return iv_fail(err, IV_ENOMEM, "filter: out of memory");
    int rc = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, j)
    {
        if (strcmp(m->string, "column") == 0) continue;
        snprintf(p2, sizeof p2, "%.200s.%.40s", path, m->string);
        iv_expr_t *e = NULL;
        int op = -1;
        for (int k = 0; k < 6; k++)
            if (strcmp(m->string, ops[k]) == 0) op = k;
        if (op >= 0) {
            iv_lit_t l;
            rc = to_lit(m, &l, err, p2);
            if (rc == 0) {
                e = iv_expr_new(IV_EXPR_CMP, col);
                if (!e || iv_expr_add_lit(e, &l) < 0) rc = iv_fail(err, IV_ENOMEM, "out of memory");
                else e->cmp = (iv_cmp_t)op;
            }
        } else if (strcmp(m->string, "in") == 0 || strcmp(m->string, "not_in") == 0) {
            if (!cJSON_IsArray(m)) {
                rc = bad(err, p2, "expected an array of values");
            } else {
                e = iv_expr_new(IV_EXPR_IN, col);
                if (!e) rc = iv_fail(err, IV_ENOMEM, "out of memory");
                int i = 0;
                const cJSON *v;
                cJSON_ArrayForEach(v, m)
                {
                    if (rc < 0) break;
                    char p3[300];
                    snprintf(p3, sizeof p3, "%.250s[%d]", p2, i++);
                    iv_lit_t l;
                    rc = to_lit(v, &l, err, p3);
                    if (rc == 0 && iv_expr_add_lit(e, &l) < 0)
                        rc = iv_fail(err, IV_ENOMEM, "out of memory");
                }
                if (rc == 0 && m->string[0] == 'n') {
                    iv_expr_t *n = iv_expr_new(IV_EXPR_NOT, NULL);
                    if (!n || iv_expr_add_kid(n, e) < 0) {
                        iv_expr_free(n);
                        rc = iv_fail(err, IV_ENOMEM, "out of memory");
                    } else {
                        e = n;
                    }
                }
            }
        } else if (strcmp(m->string, "is_null") == 0) {
            if (!cJSON_IsBool(m)) {
                rc = bad(err, p2, "expected true or false");
            } else {
                e = iv_expr_new(IV_EXPR_IS_NULL, col);
                if (!e) rc = iv_fail(err, IV_ENOMEM, "out of memory");
                if (rc == 0 && cJSON_IsFalse(m)) {
                    iv_expr_t *n = iv_expr_new(IV_EXPR_NOT, NULL);
                    if (!n || iv_expr_add_kid(n, e) < 0) {
                        iv_expr_free(n);
                        rc = iv_fail(err, IV_ENOMEM, "out of memory");
                    } else {
                        e = n;
                    }
                }
            }
        } else {
            rc = bad(err, p2, "unknown operator (expected eq, ne, lt, le, gt, ge, in, not_in "
                              "or is_null)");
        }
        if (rc == 0 && iv_expr_add_kid(all, e) < 0) rc = iv_fail(err, IV_ENOMEM, "out of memory");
        if (rc < 0) {
            iv_expr_free(e);
            break;
        }
    }
    if (rc == 0 && all->n_kids == 0) rc = bad(err, path, "a column needs an operator");
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

static int parse_node(const cJSON *j, iv_expr_t **out, iv_err_t *err, const char *path,
                      int depth)
{
    *out = NULL;
    if (depth > MAX_DEPTH) return bad(err, path, "filter nested too deeply");
    if (!cJSON_IsObject(j)) return bad(err, path, "expected a filter object");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "and");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "or");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "not");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "column");
    int kinds = (a != NULL) + (o != NULL) + (n != NULL) + (c != NULL);
    if (kinds != 1 || (!c && cJSON_GetArraySize(j) != 1))
        return bad(err, path, "expected exactly one of \"and\", \"or\", \"not\", \"column\"");
    char p2[256];
    if (c) return parse_leaf(j, out, err, path);
    if (n) {
        snprintf(p2, sizeof p2, "%.200s.not", path);
        iv_expr_t *kid = NULL, *e;
        IV_TRY(parse_node(n, &kid, err, p2, depth + 1));
        e = iv_expr_new(IV_EXPR_NOT, NULL);
        if (!e || iv_expr_add_kid(e, kid) < 0) {
            iv_expr_free(e);
            iv_expr_free(kid);
            return iv_fail(err, IV_ENOMEM, "filter: out of memory");
        }
        *out = e;
        return 0;
    }
    snprintf(p2, sizeof p2, "%.200s.%s", path, a ? "and" : "or");
    iv_expr_t *e = iv_expr_new(a ? IV_EXPR_AND : IV_EXPR_OR, NULL);
    if (!e) return iv_fail(err, IV_ENOMEM, "filter: out of memory");
    int rc = parse_kids(a ? a : o, e, err, p2, depth);
    if (rc < 0) {
        iv_expr_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int iv_filter_json_parse(const cJSON *j, iv_expr_t **out, iv_err_t *err)
{
    return parse_node(j, out, err, "filter", 0);
}
