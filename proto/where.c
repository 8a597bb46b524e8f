/*
 * The "where" grammar (see where.h): a hand-written lexer and recursive
 * descent parser producing iv_expr_t trees.
 *
 * Hand-written because the grammar is tiny and the errors matter: every
 * message names the byte position and what was expected there, which a
 * generated parser makes hard.  The input is untrusted and not
 * NUL-terminated, so the lexer only reads through a bounds-checked peek;
 * nesting is capped so that deep parentheses or `not not not ...` cannot
 * exhaust the stack (the cap matches the evaluator's).
 */
#include "where.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_DEPTH IV_FILTER_MAX_DEPTH

typedef enum tok_kind {
    T_EOF, T_IDENT, T_BQ, T_STR, T_NUM, T_LP, T_RP, T_LB, T_RB, T_COMMA,
    T_OP, T_AND, T_OR, T_BANG, T_MINUS, T_PLUS
} tok_kind_t;

typedef struct tok {
    tok_kind_t kind;
    size_t pos, len;        /* bytes of the token in the input */
    iv_cmp_t cmp;           /* T_OP */
    char *text;             /* T_IDENT/T_BQ/T_STR: decoded, owned */
    double num;             /* T_NUM */
    int is_int;
    int64_t inum;
} tok_t;

typedef struct parser {
    const char *s;
    size_t len, i;
    tok_t t;                /* current token */
    iv_err_t *err;
    int depth;
    size_t n_nodes;         /* nodes made so far (IV_FILTER_MAX_NODES) */
    int too_large;          /* a limit was hit: the callers' IV_ENOMEM means it */
} parser_t;

static int peekc(const parser_t *p, size_t k)
{
    return p->i + k < p->len ? (unsigned char)p->s[p->i + k] : -1;
}

static const char *tok_desc(const tok_t *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case T_EOF: return "end of input";
    case T_IDENT: snprintf(buf, cap, "'%.40s'", t->text); return buf;
    case T_BQ: snprintf(buf, cap, "`%.40s`", t->text); return buf;
    case T_STR: snprintf(buf, cap, "string '%.40s'", t->text); return buf;
    case T_NUM: return "a number";
    default: break;
    }
    return "a symbol";
}

static int syntax(parser_t *p, size_t pos, const char *expected)
{
    char b[80];
    const char *found = "";
    if (pos == p->t.pos) {
        if (p->t.kind >= T_LP && p->t.kind <= T_PLUS) {
            snprintf(b, sizeof b, "'%.*s'", (int)p->t.len, p->s + p->t.pos);
            found = b;
        } else {
            found = tok_desc(&p->t, b, sizeof b);
        }
    }
    return iv_fail(p->err, IV_EBAD_REQUEST, "where: syntax error at position %zu: expected %s%s%s",
                   pos, expected, found[0] ? ", found " : "", found);
}

static void tok_clear(tok_t *t)
{
    free(t->text);
    memset(t, 0, sizeof(*t));
}

/* Reads a quoted string or backquoted name starting at p->i (the quote). */
static int lex_quoted(parser_t *p, int q, tok_t *t)
{
    size_t start = p->i;
    p->i++;
    /* Size the copy by this token, not by the rest of the input: a list
     * of a hundred thousand strings must not allocate megabytes each. */
    size_t end = p->i;
    while (end < p->len && p->s[end] != q) end += p->s[end] == '\\' ? 2 : 1;
    char *buf = malloc((end < p->len ? end : p->len) - start + 1);
    if (!buf) return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    size_t n = 0;
    for (;;) {
        int c = peekc(p, 0);
        if (c < 0) {
            free(buf);
            return iv_fail(p->err, IV_EBAD_REQUEST,
                           "where: syntax error at position %zu: unterminated %s", start,
                           q == '`' ? "column name" : "string");
        }
        if (c == 0) {
            free(buf);
            return iv_fail(p->err, IV_EBAD_REQUEST,
                           "where: syntax error at position %zu: NUL byte in a string", p->i);
        }
        p->i++;
        if (c == q) break;
        if (c == '\\') {
            int d = peekc(p, 0);
            if (d < 0) continue;
            p->i++;
            c = d == 'n' ? '\n' : d == 't' ? '\t' : d;
            if (c == 0) {
                free(buf);
                return iv_fail(p->err, IV_EBAD_REQUEST,
                               "where: syntax error at position %zu: NUL byte in a string",
                               p->i - 1);
            }
        }
        buf[n++] = (char)c;
    }
    buf[n] = '\0';
    t->kind = q == '`' ? T_BQ : T_STR;
    t->text = buf;
    t->pos = start;
    t->len = p->i - start;
    return 0;
}

/* Skips the digits at p->i; 1 when there was one. */
static int skip_digits(parser_t *p)
{
    size_t from = p->i;
    while (peekc(p, 0) >= 0 && isdigit(peekc(p, 0))) p->i++;
    return p->i > from;
}

/* Moves p->i over a number's text: sign, digits, fraction, exponent (an
 * 'e' not followed by digits is not part of it).  *frac: the text is not
 * a whole number's. */
static void scan_number(parser_t *p, int *frac)
{
    *frac = 0;
    if (peekc(p, 0) == '-' || peekc(p, 0) == '+') p->i++;
    skip_digits(p);
    if (peekc(p, 0) == '.') {
        *frac = 1;
        p->i++;
        skip_digits(p);
    }
    if (peekc(p, 0) == 'e' || peekc(p, 0) == 'E') {
        size_t save = p->i;
        p->i++;
        if (peekc(p, 0) == '-' || peekc(p, 0) == '+') p->i++;
        if (skip_digits(p)) *frac = 1;
        else p->i = save;
    }
}

static int lex_number(parser_t *p, tok_t *t)
{
    size_t start = p->i;
    int frac;
    scan_number(p, &frac);
    size_t n = p->i - start;
    char buf[128];
    if (n >= sizeof buf)
        return iv_fail(p->err, IV_EBAD_REQUEST,
                       "where: syntax error at position %zu: number too long", start);
    memcpy(buf, p->s + start, n);
    buf[n] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (end != buf + n || n == 0 || (n == 1 && (buf[0] == '.' || buf[0] == '-' || buf[0] == '+')))
        return iv_fail(p->err, IV_EBAD_REQUEST,
                       "where: syntax error at position %zu: bad number '%s'", start, buf);
    t->kind = T_NUM;
    t->num = v;
    t->pos = start;
    t->len = n;
    if (!frac) {
        errno = 0;
        long long iv = strtoll(buf, &end, 10);
        t->is_int = errno == 0 && end == buf + n;
        if (t->is_int) t->inum = iv;
    }
    /* A number running straight into a letter ("12abc") is a typo. */
    if (peekc(p, 0) >= 0 && (isalpha(peekc(p, 0)) || peekc(p, 0) == '_'))
        return iv_fail(p->err, IV_EBAD_REQUEST,
                       "where: syntax error at position %zu: bad number", start);
    return 0;
}

/* A name: letters, digits, '_' and '.'. */
static int lex_ident(parser_t *p, tok_t *t)
{
    size_t start = p->i;
    while (peekc(p, 0) >= 0 && (isalnum(peekc(p, 0)) || peekc(p, 0) == '_' || peekc(p, 0) == '.'))
        p->i++;
    t->len = p->i - start;
    t->text = malloc(t->len + 1);
    if (!t->text) return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    memcpy(t->text, p->s + start, t->len);
    t->text[t->len] = '\0';
    t->kind = T_IDENT;
    return 0;
}

/* c (d the character after it) starts a number: a digit, '.' before a
 * digit, or a sign before either. */
static int starts_number(int c, int d)
{
    return isdigit(c) || (c == '.' && d >= 0 && isdigit(d)) ||
           ((c == '-' || c == '+') && d >= 0 && (isdigit(d) || d == '.'));
}

/* The operator c (d after it) in t: 1 when it takes both characters, 0
 * one, -1 when c starts no operator. */
static int lex_operator(tok_t *t, int c, int d)
{
    switch (c) {
    case '=':
        t->kind = T_OP;
        t->cmp = IV_CMP_EQ;
        return d == '=';
    case '!':
        if (d != '=') {
            t->kind = T_BANG;
            return 0;
        }
        t->kind = T_OP;
        t->cmp = IV_CMP_NE;
        return 1;
    case '<':
        t->kind = T_OP;
        t->cmp = d == '=' ? IV_CMP_LE : d == '>' ? IV_CMP_NE : IV_CMP_LT;
        return d == '=' || d == '>';
    case '>':
        t->kind = T_OP;
        t->cmp = d == '=' ? IV_CMP_GE : IV_CMP_GT;
        return d == '=';
    case '&':
    case '|':
        if (d != c) return -1;
        t->kind = c == '&' ? T_AND : T_OR;
        return 1;
    default: return -1;
    }
}

/* A symbol or operator at c (d after it): 0 when read, 1 when c starts none. */
static int lex_symbol(parser_t *p, tok_t *t, int c, int d)
{
    static const char singles[] = "()[],-+";
    static const tok_kind_t single_kinds[] = {T_LP, T_RP, T_LB, T_RB, T_COMMA, T_MINUS, T_PLUS};
    const char *one = c ? strchr(singles, c) : NULL;
    t->len = 1;
    p->i++;
    if (one) {
        t->kind = single_kinds[one - singles];
        return 0;
    }
    int two = lex_operator(t, c, d);
    if (two < 0) return 1;
    if (two) {
        p->i++;
        t->len = 2;
    }
    return 0;
}

/* Advances to the next token. */
static int next(parser_t *p)
{
    tok_clear(&p->t);
    tok_t *t = &p->t;
    while (peekc(p, 0) >= 0 && isspace(peekc(p, 0))) p->i++;
    t->pos = p->i;
    int c = peekc(p, 0);
    if (c < 0) {
        t->kind = T_EOF;
        return 0;
    }
    int d = peekc(p, 1);
    if (isalpha(c) || c == '_') return lex_ident(p, t);
    if (starts_number(c, d)) return lex_number(p, t);
    if (c == '\'' || c == '"' || c == '`') return lex_quoted(p, c, t);
    if (lex_symbol(p, t, c, d) == 0) return 0;
    return iv_fail(p->err, IV_EBAD_REQUEST,
                   "where: syntax error at position %zu: unexpected character '%s%c'", t->pos,
                   (c < 32 || c > 126) ? "\\x" : "", (c < 32 || c > 126) ? '?' : c);
}

static int is_kw(const tok_t *t, const char *kw)
{
    return t->kind == T_IDENT && strcasecmp(t->text, kw) == 0;
}

static int is_reserved(const tok_t *t)
{
    static const char *kw[] = {"and", "or", "not", "in", "is", "null", "true", "false", NULL};
    for (int i = 0; kw[i]; i++)
        if (is_kw(t, kw[i])) return 1;
    return 0;
}

static int parse_or(parser_t *p, iv_expr_t **out);

static iv_expr_t *new_node(parser_t *p, iv_expr_op_t op, const char *col, size_t pos)
{
    if (++p->n_nodes > IV_FILTER_MAX_NODES) {
        p->too_large = 1;
        iv_fail(p->err, IV_ETOO_LARGE, "where: more than %d terms at position %zu",
                IV_FILTER_MAX_NODES, pos);
        return NULL;
    }
    iv_expr_t *e = iv_expr_new(op, col);
    if (e) e->pos = (int64_t)pos;
    else iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    return e;
}

/* Wraps e in a NOT node; frees e on failure. */
static int wrap_not(parser_t *p, iv_expr_t **e, size_t pos)
{
    iv_expr_t *n = new_node(p, IV_EXPR_NOT, NULL, pos);
    if (!n || iv_expr_add_kid(n, *e) < 0) {
        iv_expr_free(n);
        iv_expr_free(*e);
        *e = NULL;
        return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    }
    *e = n;
    return 0;
}

/* A literal at the current token: string, number (with sign, nan, inf)
 * or boolean.  Returns 1 when one was read, 0 when the token is not a
 * literal (nothing consumed), <0 on error. */
static int parse_literal(parser_t *p, iv_lit_t *l)
{
    memset(l, 0, sizeof(*l));
    tok_t *t = &p->t;
    if (t->kind == T_STR) {
        l->kind = IV_LIT_STR;
        l->str = t->text;
        t->text = NULL;
        int rc = next(p);
        if (rc < 0) {
            free(l->str);
            l->str = NULL;
            return rc;
        }
        return 1;
    }
    if (t->kind == T_NUM) {
        l->kind = IV_LIT_NUM;
        l->num = t->num;
        l->is_int = t->is_int;
        l->i = t->inum;
        IV_TRY(next(p));
        return 1;
    }
    if (is_kw(t, "true") || is_kw(t, "false")) {
        l->kind = IV_LIT_BOOL;
        l->b = is_kw(t, "true");
        IV_TRY(next(p));
        return 1;
    }
    int neg = 0;
    size_t pos = t->pos;
    if (t->kind == T_MINUS || t->kind == T_PLUS) {
        neg = t->kind == T_MINUS;
        IV_TRY(next(p));
        if (!is_kw(&p->t, "inf") && !is_kw(&p->t, "nan"))
            return syntax(p, p->t.pos, "'inf' or 'nan' after a sign");
        (void)pos;
    }
    if (is_kw(&p->t, "inf") || is_kw(&p->t, "nan")) {
        l->kind = IV_LIT_NUM;
        l->num = is_kw(&p->t, "inf") ? (neg ? -INFINITY : INFINITY) : NAN;
        IV_TRY(next(p));
        return 1;
    }
    return 0;
}

static int need_literal(parser_t *p, iv_lit_t *l, const char *after)
{
    size_t pos = p->t.pos;
    int rc = parse_literal(p, l);
    if (rc < 0) return rc;
    if (rc == 0) {
        char what[64];
        snprintf(what, sizeof what, "a value after %s", after);
        return syntax(p, pos, what);
    }
    return 0;
}

static iv_cmp_t flip(iv_cmp_t c)
{
    switch (c) {
    case IV_CMP_LT: return IV_CMP_GT;
    case IV_CMP_LE: return IV_CMP_GE;
    case IV_CMP_GT: return IV_CMP_LT;
    case IV_CMP_GE: return IV_CMP_LE;
    default: return c;
    }
}

/* column in [a, b, ...]  (or parentheses) */
static int parse_list(parser_t *p, iv_expr_t *e)
{
    tok_kind_t close;
    if (p->t.kind == T_LB) close = T_RB;
    else if (p->t.kind == T_LP) close = T_RP;
    else return syntax(p, p->t.pos, "'[' after 'in'");
    IV_TRY(next(p));
    while (p->t.kind != close) {
        if (e->n_lits >= IV_FILTER_MAX_IN)
            return iv_fail(p->err, IV_ETOO_LARGE, "where: more than %d values in the list at "
                           "position %zu", IV_FILTER_MAX_IN, p->t.pos);
        iv_lit_t l;
        IV_TRY(need_literal(p, &l, "'[' or ','"));
        int rc = iv_expr_add_lit(e, &l);
        free(l.str);
        if (rc < 0) return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
        if (p->t.kind == T_COMMA) IV_TRY(next(p));
        else if (p->t.kind != close)
            return syntax(p, p->t.pos, close == T_RB ? "',' or ']'" : "',' or ')'");
    }
    return next(p);
}

static int parse_unary(parser_t *p, iv_expr_t **out);

/*
 * Nesting: each parenthesis and each `not` is one level, counted once
 * where it opens, and at most MAX_DEPTH are open at once, the limit the
 * API documents.  They are the parser's only unbounded recursions, so the
 * count also bounds its stack (a few frames a level); the compiled tree's
 * depth is checked again by filter.c.
 */
static int too_deep(parser_t *p)
{
    return iv_fail(p->err, IV_EBAD_REQUEST, "where: expression nested deeper than %d at position %zu",
                   MAX_DEPTH, p->t.pos);
}

/* ( expression ) */
static int parse_paren(parser_t *p, iv_expr_t **out)
{
    if (++p->depth > MAX_DEPTH) return too_deep(p);
    int prc = next(p);
    if (prc == 0) prc = parse_or(p, out);
    p->depth--;
    IV_TRY(prc);
    if (p->t.kind != T_RP) {
        iv_expr_free(*out);
        *out = NULL;
        return syntax(p, p->t.pos, "')'");
    }
    int rc = next(p);
    if (rc < 0) {
        iv_expr_free(*out);
        *out = NULL;
    }
    return rc;
}

/* A literal with no operator after it: a boolean constant, or an error. */
static int parse_constant(parser_t *p, iv_lit_t *l, size_t pos, iv_expr_t **out)
{
    if (l->kind != IV_LIT_BOOL) {
        free(l->str);
        return syntax(p, p->t.pos, "a comparison operator after a value");
    }
    iv_expr_t *e = new_node(p, IV_EXPR_CONST, NULL, pos);
    if (!e || iv_expr_add_lit(e, l) < 0) {
        iv_expr_free(e);
        return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    }
    *out = e;
    return 0;
}

/* A comparison written value first ("500 < n_genes"): the operator is
 * flipped so that the node reads column first. */
static int parse_value_first(parser_t *p, iv_lit_t *l, size_t pos, iv_expr_t **out)
{
    iv_cmp_t cmp = flip(p->t.cmp);
    int rc = next(p);
    if (rc == 0 && p->t.kind != T_IDENT && p->t.kind != T_BQ)
        rc = syntax(p, p->t.pos, "a column name after the operator");
    if (rc == 0 && p->t.kind == T_IDENT && is_reserved(&p->t))
        rc = syntax(p, p->t.pos, "a column name (quote keywords with backquotes)");
    iv_expr_t *e = rc == 0 ? new_node(p, IV_EXPR_CMP, p->t.text, pos) : NULL;
    if (rc == 0 && (!e || iv_expr_add_lit(e, l) < 0)) rc = IV_ENOMEM;
    free(l->str);
    if (rc == 0) rc = next(p);
    if (rc < 0) {
        iv_expr_free(e);
        return rc == IV_ENOMEM ? iv_fail(p->err, IV_ENOMEM, "where: out of memory") : rc;
    }
    e->cmp = cmp;
    *out = e;
    return 0;
}

/* The token starts a literal: anything but a name, or true, false, inf,
 * nan. */
static int starts_value(const tok_t *t)
{
    return t->kind != T_IDENT || is_kw(t, "true") || is_kw(t, "false") || is_kw(t, "inf") ||
           is_kw(t, "nan");
}

/* What is not a column expression or `not`: ( ... ), a comparison
 * written value first, or a constant. */
static int parse_primary(parser_t *p, iv_expr_t **out)
{
    *out = NULL;
    tok_t *t = &p->t;
    size_t pos = t->pos;
    if (t->kind == T_LP) return parse_paren(p, out);
    if (starts_value(t)) {
        iv_lit_t l;
        int rc = parse_literal(p, &l);
        if (rc < 0) return rc;
        if (rc == 0) return syntax(p, pos, "a column name, a value, 'not' or '('");
        if (p->t.kind != T_OP) return parse_constant(p, &l, pos, out);
        return parse_value_first(p, &l, pos, out);
    }
    if (is_reserved(t))
        return syntax(p, pos, "a column name, a value, 'not' or '(' (quote keywords with "
                              "backquotes)");
    /* Identifiers go to parse_column_expr; nothing else reaches here. */
    return syntax(p, pos, "a column name, a value, 'not' or '('");
}

/* column OP value */
static int parse_compare(parser_t *p, const char *col, size_t pos, iv_expr_t **e)
{
    iv_cmp_t cmp = p->t.cmp;
    char after[8];
    snprintf(after, sizeof after, "'%s'", iv_cmp_symbol(cmp));
    iv_lit_t l;
    IV_TRY(next(p));
    IV_TRY(need_literal(p, &l, after));
    *e = new_node(p, IV_EXPR_CMP, col, pos);
    int rc = !*e || iv_expr_add_lit(*e, &l) < 0 ? iv_fail(p->err, IV_ENOMEM, "where: out of memory") : 0;
    free(l.str);
    if (rc == 0) (*e)->cmp = cmp;
    return rc;
}

/* column in [...] and column not in [...] */
static int parse_in(parser_t *p, const char *col, size_t pos, iv_expr_t **e)
{
    int neg = is_kw(&p->t, "not");
    IV_TRY(next(p));
    if (neg && !is_kw(&p->t, "in")) return syntax(p, p->t.pos, "'in' after 'not'");
    if (neg) IV_TRY(next(p));
    /* `not in` is its own test, false on missing values like `!=`;
     * `not (x in [...])` is the complement and includes them. */
    *e = new_node(p, neg ? IV_EXPR_NOT_IN : IV_EXPR_IN, col, pos);
    if (!*e) return IV_ENOMEM;
    return parse_list(p, *e);
}

/* column is [not] null (or none, nan) */
static int parse_is_null(parser_t *p, const char *col, size_t pos, iv_expr_t **e)
{
    IV_TRY(next(p));
    int neg = is_kw(&p->t, "not");
    if (neg) IV_TRY(next(p));
    if (!is_kw(&p->t, "null") && !is_kw(&p->t, "none") && !is_kw(&p->t, "nan"))
        return syntax(p, p->t.pos, "'null' after 'is'");
    IV_TRY(next(p));
    *e = new_node(p, IV_EXPR_IS_NULL, col, pos);
    if (!*e) return IV_ENOMEM;
    return neg ? wrap_not(p, e, pos) : 0;
}

/* What follows a column: a comparison, a list test, a null test, or
 * nothing (the column's truth). */
static int parse_column_tail(parser_t *p, const char *col, size_t pos, iv_expr_t **e)
{
    if (p->t.kind == T_OP) return parse_compare(p, col, pos, e);
    if (is_kw(&p->t, "in") || is_kw(&p->t, "not")) return parse_in(p, col, pos, e);
    if (is_kw(&p->t, "is")) return parse_is_null(p, col, pos, e);
    *e = new_node(p, IV_EXPR_TRUTH, col, pos);
    return *e ? 0 : IV_ENOMEM;
}

/* An expression that starts with a column. */
static int parse_column_expr(parser_t *p, iv_expr_t **out)
{
    *out = NULL;
    size_t pos = p->t.pos;
    char *col = p->t.text;
    p->t.text = NULL;
    iv_expr_t *e = NULL;
    int rc = next(p);
    if (rc == 0) rc = parse_column_tail(p, col, pos, &e);
    free(col);
    if (rc < 0) {
        iv_expr_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* The token is a column name: backquoted, or a name that is no keyword
 * and not inf or nan. */
static int starts_column(const tok_t *t)
{
    return t->kind == T_BQ || (t->kind == T_IDENT && !is_reserved(t) && !is_kw(t, "inf") &&
                               !is_kw(t, "nan"));
}

static int parse_unary(parser_t *p, iv_expr_t **out)
{
    *out = NULL;
    int rc;
    if (is_kw(&p->t, "not") || p->t.kind == T_BANG) {
        size_t pos = p->t.pos;
        if (++p->depth > MAX_DEPTH) return too_deep(p);
        rc = next(p);
        if (rc == 0) rc = parse_unary(p, out);
        if (rc == 0) rc = wrap_not(p, out, pos);
        p->depth--;
    } else if (starts_column(&p->t)) {
        rc = parse_column_expr(p, out);
    } else {
        rc = parse_primary(p, out);
    }
    return rc;
}

static int parse_chain(parser_t *p, iv_expr_t **out, int is_or);

/* The current token is the chain's operator: 'or'/'||' or 'and'/'&&'. */
static int at_chain_op(const tok_t *t, int is_or)
{
    return is_or ? (is_kw(t, "or") || t->kind == T_OR) : (is_kw(t, "and") || t->kind == T_AND);
}

/* One operand after the chain's operator, added to node. */
static int chain_operand(parser_t *p, iv_expr_t *node, int is_or)
{
    iv_expr_t *kid = NULL;
    IV_TRY(next(p));
    if (p->t.kind == T_EOF)
        return syntax(p, p->t.pos, is_or ? "an operand after 'or'" : "an operand after 'and'");
    IV_TRY(is_or ? parse_chain(p, &kid, 0) : parse_unary(p, &kid));
    if (iv_expr_add_kid(node, kid) < 0) {
        iv_expr_free(kid);
        return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    }
    return 0;
}

/* Left-assoc chains of one operator collect into one n-ary node. */
static int parse_chain(parser_t *p, iv_expr_t **out, int is_or)
{
    *out = NULL;
    iv_expr_t *first = NULL;
    IV_TRY(is_or ? parse_chain(p, &first, 0) : parse_unary(p, &first));
    if (!at_chain_op(&p->t, is_or)) {
        *out = first;
        return 0;
    }
    iv_expr_t *node = new_node(p, is_or ? IV_EXPR_OR : IV_EXPR_AND, NULL, p->t.pos);
    if (!node || iv_expr_add_kid(node, first) < 0) {
        iv_expr_free(node);
        iv_expr_free(first);
        return iv_fail(p->err, IV_ENOMEM, "where: out of memory");
    }
    while (at_chain_op(&p->t, is_or)) {
        int rc = chain_operand(p, node, is_or);
        if (rc < 0) {
            iv_expr_free(node);
            return rc;
        }
    }
    *out = node;
    return 0;
}

static int parse_or(parser_t *p, iv_expr_t **out)
{
    return parse_chain(p, out, 1);
}

int iv_where_parse(const char *s, size_t len, iv_expr_t **out, iv_err_t *err)
{
    *out = NULL;
    parser_t p = {s, len, 0, {0}, err, 0, 0, 0};
    int rc = next(&p);
    if (rc == 0 && p.t.kind == T_EOF) rc = syntax(&p, 0, "a filter expression");
    iv_expr_t *e = NULL;
    if (rc == 0) rc = parse_or(&p, &e);
    if (rc == 0 && p.t.kind != T_EOF) rc = syntax(&p, p.t.pos, "'and', 'or' or end of input");
    tok_clear(&p.t);
    /* new_node's callers report its NULL as out of memory; the message
     * recorded first says which limit it was. */
    if (rc < 0 && p.too_large) rc = IV_ETOO_LARGE;
    if (rc < 0) {
        iv_expr_free(e);
        return rc;
    }
    *out = e;
    return 0;
}
