/*
 * libFuzzer target for the where-string parser: any bytes must parse or
 * fail cleanly, and whatever parses must format to a string that parses
 * back to the same form (the formatter and parser agree).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "filter.h"
#include "where.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iv_err_t e = {0};
    iv_expr_t *x = NULL;
    if (iv_where_parse((const char *)data, size, &x, &e) < 0) {
        if (x) abort();
        return 0;
    }
    size_t need = iv_expr_format(x, NULL, 0);
    char *a = malloc(need + 1);
    iv_expr_format(x, a, need + 1);
    iv_expr_t *y = NULL;
    iv_err_t e2 = {0};
    /* Re-parsing can only fail on nesting depth, which formatting adds. */
    if (iv_where_parse(a, need, &y, &e2) == 0) {
        size_t need2 = iv_expr_format(y, NULL, 0);
        char *b = malloc(need2 + 1);
        iv_expr_format(y, b, need2 + 1);
        if (need2 != need || memcmp(a, b, need) != 0) abort();
        free(b);
        iv_expr_free(y);
    } else if (!strstr(e2.msg, "nested")) {
        abort();
    }
    free(a);
    iv_expr_free(x);
    return 0;
}
