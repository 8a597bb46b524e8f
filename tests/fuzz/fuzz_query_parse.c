/* libFuzzer target: bytes as a query JSON body and as a query string.  A
 * JSON body is parsed twice, with its index arrays read ahead of cJSON
 * (proto/index_arrays.c) and by cJSON alone: the two must agree on the
 * outcome, the error and the selections. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "index_arrays.h"
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same_sel(const iv_psel_t *a, const iv_psel_t *b)
{
    if (a->kind != b->kind || a->n != b->n) __builtin_trap();
    if (a->kind == IV_PSEL_INDEX)
        for (int64_t i = 0; i < a->n; i++)
            if (a->idx[i] != b->idx[i]) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iv_qreq_t q, q2;
    iv_err_t e, e2;
    iv_err_clear(&e);
    iv_err_clear(&e2);
    int rc = iv_qreq_parse_json((const char *)data, size, 1000, 77, &q, &e);
    iv_index_arrays_enable(0);
    int rc2 = iv_qreq_parse_json((const char *)data, size, 1000, 77, &q2, &e2);
    iv_index_arrays_enable(1);
    if (rc != rc2 || e.code != e2.code || strcmp(e.msg, e2.msg)) __builtin_trap();
    if (rc == 0) {
        same_sel(&q.obs, &q2.obs);
        same_sel(&q.var, &q2.var);
        iv_sel_t s = iv_psel_view(&q.obs);  /* names selections carry no indices */
        for (int64_t i = 0; !s.all && s.idx && i < s.n; i++)
            if (s.idx[i] < 0 || s.idx[i] >= 1000) __builtin_trap();
        iv_qreq_free(&q);
        iv_qreq_free(&q2);
    }
    iv_err_clear(&e);
    if (iv_qreq_parse_query((const char *)data, size, 1000, 77, &q, &e) == 0) {
        iv_sel_t s = iv_psel_view(&q.var);
        for (int64_t i = 0; !s.all && s.idx && i < s.n; i++)
            if (s.idx[i] < 0 || s.idx[i] >= 77) __builtin_trap();
        iv_qreq_free(&q);
    }
    iv_fmt_from_accept(size ? "application/json;q=0.5, */*" : NULL);
    return 0;
}
