/*
 * The "where" string grammar, as users know it from TileDB-SOMA value
 * filters, parsed into an iv_expr_t tree (see filter.h):
 *
 *   expr    := or
 *   or      := and (("or" | "||") and)*
 *   and     := unary (("and" | "&&") unary)*
 *   unary   := ("not" | "!") unary | primary
 *   primary := "(" expr ")" | "true" | "false"
 *            | column op literal | literal op column
 *            | column ["not"] "in" "[" literal ("," literal)* [","] "]"
 *            | column "is" ["not"] "null"
 *            | column                      (a bool column)
 *   op      := "==" | "=" | "!=" | "<" | "<=" | ">" | ">="
 *   column  := identifier [A-Za-z_][A-Za-z0-9_.]* | `backquoted name`
 *   literal := 'string' | "string" (backslash escapes \\ \' \" \n \t)
 *            | number (int or float, optional sign, exponent; nan, inf)
 *            | true | false | True | False
 *
 * Keywords are case-insensitive.  Parenthesised lists "(a, b)" are
 * accepted for `in` as well.  `column not in [...]` is its own test
 * (IV_EXPR_NOT_IN: false on missing values, like `!=`), while
 * `not (column in [...])` is the complement.  Trees stop at the limits of
 * filter.h (more nodes or list values: IV_ETOO_LARGE).  Errors are IV_EBAD_REQUEST naming the byte
 * position and what was expected.  Pure function of its input; any thread.
 */
#ifndef IV_WHERE_H
#define IV_WHERE_H

#include <stddef.h>

#include "error.h"
#include "filter.h"

/* Parses s[0..len) (need not be NUL-terminated); *out owned by caller. */
int iv_where_parse(const char *s, size_t len, iv_expr_t **out, iv_err_t *err);

#endif /* IV_WHERE_H */
