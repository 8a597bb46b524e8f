/*
 * Viewer wire forms (see enc_viewer.h).
 *
 * The binary array form is a fixed header and the values exactly as a
 * typed array wants them (a browser maps it with one Float32Array over
 * the body past the header), so the server's work is a gather into the
 * buffer; the JSON forms exist for tools and small selections and are
 * bounded by the server's JSON limit.
 */
#include "enc_viewer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "encode.h"

static void put_rows(iv_buf_t *b, const iv_dense_t *d, int64_t lo, int64_t hi)
{
    iv_buf_puts(b, "\"ids\":[");
    for (int64_t r = lo; r < hi; r++)
        iv_buf_printf(b, r > lo ? ",%" PRId64 : "%" PRId64, d->ids ? d->ids[r] : r);
    iv_buf_puts(b, "],\"values\":[");
    for (int64_t r = lo; r < hi && !b->oom; r++) {
        iv_buf_puts(b, r > lo ? ",[" : "[");
        for (int64_t j = 0; j < d->n_cols; j++) {
            if (j) iv_buf_append(b, ",", 1);
            iv_enc_json_value(b, d->dtype, d->values, r * d->n_cols + j);
        }
        iv_buf_puts(b, "]");
    }
    iv_buf_puts(b, "]");
}

static void put_head(iv_buf_t *b, const iv_dense_t *d)
{
    iv_buf_puts(b, "\"name\":");
    iv_buf_json_str(b, d->name);
    iv_buf_printf(b, ",\"axis\":\"%s\",\"shape\":[%" PRId64 ",%" PRId64 "],\"dtype\":\"%s\"", d->axis,
                  d->n_rows, d->n_cols, iv_dtype_name(d->dtype));
}

void iv_enc_dense(iv_buf_t *b, iv_fmt_t f, const iv_dense_t *d)
{
    size_t vbytes = (size_t)d->n_rows * (size_t)d->n_cols * iv_dtype_size(d->dtype);
    if (f == IV_FMT_BINARY) {
        if (iv_buf_reserve(b, IV_ARRAY_HEADER_BYTES + (d->ids ? (size_t)d->n_rows * 8 : 0) + vbytes) != 0)
            return;
        char descr[8] = {0};
        const char *ds = iv_wire_descr(d->dtype);
        memcpy(descr, ds, strlen(ds) < 8 ? strlen(ds) : 8);
        iv_buf_append(b, IV_ARRAY_MAGIC, 4);
        iv_buf_u32le(b, 1);
        iv_buf_i64le(b, d->n_rows);
        iv_buf_i64le(b, d->n_cols);
        iv_buf_append(b, descr, 8);
        iv_buf_u32le(b, d->ids ? 1u : 0u);
        iv_buf_u32le(b, 0);
        /* The project builds for little-endian hosts only (x86-64, arm64
         * in its usual mode), so arrays go out as they lie in memory. */
        if (d->ids) iv_buf_append(b, d->ids, (size_t)d->n_rows * 8);
        iv_buf_append(b, d->values, vbytes);
        return;
    }
    if (f == IV_FMT_NDJSON) {
        iv_buf_puts(b, "{\"type\":\"header\",");
        put_head(b, d);
        iv_buf_puts(b, "}\n");
        for (int64_t lo = 0; lo < d->n_rows && !b->oom; lo += IV_ENC_ROWS_LINE) {
            int64_t hi = d->n_rows - lo < IV_ENC_ROWS_LINE ? d->n_rows : lo + IV_ENC_ROWS_LINE;
            iv_buf_puts(b, "{\"type\":\"rows\",");
            put_rows(b, d, lo, hi);
            iv_buf_puts(b, "}\n");
        }
        iv_buf_printf(b, "{\"type\":\"end\",\"status\":\"ok\",\"rows\":%" PRId64 "}\n", d->n_rows);
        return;
    }
    iv_buf_puts(b, "{");
    put_head(b, d);
    iv_buf_puts(b, ",");
    put_rows(b, d, 0, d->n_rows);
    iv_buf_puts(b, "}");
}

/* The IVAG form: the document is padded with zero bytes so that the
 * values start 8-aligned for a Float64Array over the body. */
static void put_agg_binary(iv_buf_t *b, const iv_agg_table_t *t)
{
    size_t n_vals = (size_t)t->n_groups * (size_t)t->n_genes * t->n_stats;
    iv_buf_append(b, IV_AGG_MAGIC, 4);
    iv_buf_u32le(b, 1);
    iv_buf_i64le(b, (int64_t)t->doc_len + 1);
    iv_buf_append(b, t->doc, t->doc_len);
    iv_buf_puts(b, "}");
    static const char zeros[8] = {0};
    if (b->len % 8) iv_buf_append(b, zeros, 8 - b->len % 8);
    iv_buf_append(b, t->values, n_vals * sizeof *t->values);
}

static void put_agg_json(iv_buf_t *b, const iv_agg_table_t *t, size_t json_limit)
{
    size_t per = (size_t)t->n_groups * (size_t)t->n_genes;
    iv_buf_append(b, t->doc, t->doc_len);
    iv_buf_puts(b, ",\"values\":{");
    for (size_t s = 0; s < t->n_stats && !b->oom; s++) {
        iv_buf_printf(b, s ? ",\"%s\":[" : "\"%s\":[", t->stats[s]);
        for (int64_t g = 0; g < t->n_groups && !b->oom; g++) {
            iv_buf_puts(b, g ? ",[" : "[");
            for (int64_t j = 0; j < t->n_genes; j++) {
                if (j) iv_buf_append(b, ",", 1);
                iv_enc_json_value(b, IV_DT_FLOAT64, t->values + s * per, g * t->n_genes + j);
            }
            iv_buf_puts(b, "]");
        }
        iv_buf_puts(b, "]");
        if (b->len > json_limit) break;
    }
    iv_buf_puts(b, "}}");
}

void iv_enc_agg(iv_buf_t *b, iv_fmt_t f, const iv_agg_table_t *t, size_t json_limit)
{
    if (f == IV_FMT_BINARY) put_agg_binary(b, t);
    else put_agg_json(b, t, json_limit);
}
