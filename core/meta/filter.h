/*
 * Metadata filters: an expression tree over the columns of one axis
 * (obs or var), compiled against a meta and evaluated to a row bitmap.
 *
 * Two front ends build the same tree: proto/filter_json.c (the JSON
 * "filter" object) and proto/where.c (the "where" string in TileDB-SOMA's
 * value-filter grammar).  iv_filter_compile() resolves every column and
 * literal once (unknown columns and categories, type mismatches are
 * IV_EBAD_FILTER naming them, with the closest existing names suggested),
 * so evaluation itself cannot fail except for memory.
 *
 * Semantics: two-valued logic.  A comparison, `in` or `not in` on a
 * missing value is false (as SQL and TileDB-SOMA; pandas agrees for ==,
 * <, ..., isin); `ne` and `not in` are false on missing values too, so
 * `x not in [1]` is `x != 1` for a one-element list.  `not` is the plain
 * complement, so `not (x == 1)` and `not (x in [1])` include rows where x
 * is missing.  `is_null` tests the column's mask.  A bare column is true
 * where a bool column is true.
 *
 * Limits: a tree holds at most IV_FILTER_MAX_NODES nodes, an `in` list at
 * most IV_FILTER_MAX_IN values, and nesting is at most IV_FILTER_MAX_DEPTH
 * levels; the parsers stop at these (IV_ETOO_LARGE, IV_EBAD_REQUEST for
 * depth) before building more.  Compiling also bounds the work of one
 * evaluation (about rows x leaves, see iv_filter_cost) by
 * IV_FILTER_MAX_COST, so that no filter a request body can hold costs a
 * worker more than a fraction of a second.
 *
 * Ownership: an expression tree owns its children, strings and literals
 * (iv_expr_free frees all).  A compiled filter borrows its meta (which
 * must outlive it) and owns its lookup tables; it is immutable, so any
 * number of threads may evaluate it concurrently.
 */
#ifndef IV_FILTER_H
#define IV_FILTER_H

#include <stddef.h>
#include <stdint.h>

#include "bitmap.h"
#include "error.h"
#include "meta.h"

typedef enum iv_expr_op {
    IV_EXPR_AND = 0,     /* all kids (no kids: true) */
    IV_EXPR_OR,          /* any kid (no kids: false) */
    IV_EXPR_NOT,         /* one kid */
    IV_EXPR_CMP,         /* column cmp lits[0] */
    IV_EXPR_IN,          /* column in lits[0..n_lits) */
    IV_EXPR_IS_NULL,     /* column is missing */
    IV_EXPR_TRUTH,       /* bare column: a bool column's true rows */
    IV_EXPR_CONST,       /* truth = the constant (lits[0], a bool) */
    IV_EXPR_NOT_IN,      /* column present and not in lits[0..n_lits) */
} iv_expr_op_t;

/* Nodes of one tree (leaves and inner nodes). */
#define IV_FILTER_MAX_NODES 100000
/* Values of one `in` / `not in` list. */
#define IV_FILTER_MAX_IN 1000000
/* Nesting levels (parentheses, not, and/or). */
#define IV_FILTER_MAX_DEPTH 256
/* Row visits of one evaluation (rows x leaves, string leaves weighted):
 * 2^28 visits are about a quarter of a second on one core. */
#define IV_FILTER_MAX_COST ((int64_t)1 << 28)

typedef enum iv_cmp { IV_CMP_EQ = 0, IV_CMP_NE, IV_CMP_LT, IV_CMP_LE, IV_CMP_GT, IV_CMP_GE } iv_cmp_t;

/* "==", "!=", "<", "<=", ">", ">=" */
const char *iv_cmp_symbol(iv_cmp_t c);

typedef enum iv_lit_kind { IV_LIT_NUM = 0, IV_LIT_STR, IV_LIT_BOOL } iv_lit_kind_t;

typedef struct iv_lit {
    iv_lit_kind_t kind;
    double num;           /* IV_LIT_NUM */
    int is_int;           /* IV_LIT_NUM written without fraction/exponent; i holds it */
    int64_t i;
    int b;                /* IV_LIT_BOOL */
    char *str;            /* IV_LIT_STR, owned, NUL-terminated UTF-8 */
} iv_lit_t;

typedef struct iv_expr {
    iv_expr_op_t op;
    char *column;         /* CMP, IN, IS_NULL, TRUTH; owned */
    iv_cmp_t cmp;         /* CMP */
    iv_lit_t *lits;       /* CMP: 1, IN/NOT_IN: n_lits, CONST: 1 bool; owned */
    size_t n_lits, cap_lits;
    struct iv_expr **kids;/* AND, OR: n_kids; NOT: 1; owned */
    size_t n_kids, cap_kids;
    int64_t pos;          /* byte position in a where string, -1 if none (errors) */
} iv_expr_t;

/* Builders.  Each returns NULL when out of memory; strings are copied.
 * iv_expr_add_kid/add_lit append to a node and return 0 or IV_ENOMEM
 * (on failure the kid is NOT taken: the caller still owns it).  Arrays
 * grow geometrically, so n appends cost O(n) in all. */
iv_expr_t *iv_expr_new(iv_expr_op_t op, const char *column);
int iv_expr_add_kid(iv_expr_t *e, iv_expr_t *kid);
int iv_expr_add_lit(iv_expr_t *e, const iv_lit_t *lit);
void iv_expr_free(iv_expr_t *e);

/* Nodes of the tree (every node counts one). */
size_t iv_expr_count(const iv_expr_t *e);

/* Writes the expression in the where grammar (a form iv_where_parse reads
 * back to an equal tree); truncates at cap.  Returns the full length. */
size_t iv_expr_format(const iv_expr_t *e, char *buf, size_t cap);

typedef struct iv_fprog iv_fprog_t;

/*
 * Resolves e against the columns of one axis of m.  Errors, all
 * IV_EBAD_FILTER with a message naming the problem: unknown column (with
 * suggestions), unknown category of a categorical (with suggestions),
 * a literal of the wrong type for the column, an ordering comparison on
 * an unordered categorical, a bare non-bool column, nesting deeper than
 * IV_FILTER_MAX_DEPTH.  A filter whose evaluation would cost more than
 * IV_FILTER_MAX_COST (iv_filter_cost) is IV_ETOO_LARGE, found before any
 * table is built.  e may be freed after compile returns.
 */
int iv_filter_compile(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e,
                      iv_fprog_t **out, iv_err_t *err);
void iv_filter_free(iv_fprog_t *p);

/* Estimated row visits of evaluating e on an axis of n_rows rows whose
 * columns m describes (NULL: every leaf weighs 1): each leaf visits every
 * row (string columns weigh 4, as a string compare or hash costs several
 * numeric ones) plus its column's categories, each inner node a word per
 * 64 rows.  Saturates at INT64_MAX. */
int64_t iv_filter_cost(const iv_meta_t *m, iv_axis_t axis, const iv_expr_t *e, int64_t n_rows);

/* Rows of the axis the program was compiled for. */
int64_t iv_filter_n_rows(const iv_fprog_t *p);

/* Evaluates into out (initialised by the caller with iv_filter_n_rows
 * bits; overwritten).  Thread-safe.  0 or IV_ENOMEM. */
int iv_filter_eval(const iv_fprog_t *p, iv_bitmap_t *out, iv_err_t *err);

/* Evaluates and returns the matching rows in file order (malloc'd; free()). */
int iv_filter_select(const iv_fprog_t *p, int64_t **idx, int64_t *n, iv_err_t *err);

#endif /* IV_FILTER_H */
