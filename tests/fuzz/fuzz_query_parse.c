/* libFuzzer target: bytes as a query JSON body and as a query string. */
#include <stddef.h>
#include <stdint.h>

#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iv_qreq_t q;
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_qreq_parse_json((const char *)data, size, 1000, 77, &q, &e) == 0) {
        iv_sel_t s = iv_psel_view(&q.obs);  /* names selections carry no indices */
        for (int64_t i = 0; !s.all && s.idx && i < s.n; i++)
            if (s.idx[i] < 0 || s.idx[i] >= 1000) __builtin_trap();
        iv_qreq_free(&q);
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
