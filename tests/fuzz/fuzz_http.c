/* libFuzzer target: raw bytes through the HTTP request parser, fed in
 * pieces split where the first input byte says, as a socket would; each
 * complete request's Accept-Encoding through the content-coding choice. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "coding.h"
#include "http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t step = (size_t)data[0] % 64 + 1;
    data++;
    size--;
    iv_http_in_t in;
    iv_http_in_init(&in, 4096, 4096);
    size_t off = 0, end = 0;
    while (off < size) {
        if (end < off) end = off;
        end = end + step < size ? end + step : size;
        size_t used;
        iv_http_req_t *r;
        int rc = iv_http_in_feed(&in, (const char *)data + off, end - off, &used, &r);
        off += used;
        if (rc == 1) {
            /* The coding choice reads the header as sent. */
            (void)iv_coding_pick(r->hdr[IV_H_ACCEPT_ENCODING], IV_ANSWER_STREAM, 1);
            (void)iv_coding_pick(r->hdr[IV_H_ACCEPT_ENCODING], IV_ANSWER_DOCUMENT, 1);
            iv_http_req_free(r);
            free(r);
        } else if (rc < 0) {
            break;
        } else if (used == 0 && end == size) {
            break;
        }
    }
    iv_http_in_free(&in);
    return 0;
}
