/*
 * Dataset and count documents (see enc_dataset.h), written with iv_buf as
 * the other encoders here are: the members keep one order, so that a
 * document's ETag changes only when its data does.
 */
#include "enc_dataset.h"

#include <inttypes.h>
#include <string.h>

#include "encode.h"

void iv_enc_ds_summary(iv_buf_t *b, const char *id, const char *title,
                       const iv_dataset_info_t *in, int with_indices_dtype)
{
    iv_buf_puts(b, "{\"id\":");
    iv_buf_json_str(b, id);
    iv_buf_puts(b, ",\"title\":");
    iv_buf_json_str(b, title ? title : id);
    iv_buf_printf(b, ",\"shape\":[%" PRId64 ",%" PRId64 "],\"orientation\":\"%s\",\"nnz\":%" PRId64
                  ",\"dtype\":\"%s\"",
                  in->n_rows, in->n_cols, in->orient == IV_IVCSR ? "ivcsr" : "ivcsc", in->nnz,
                  iv_wire_dtype_name(in->value_dtype));
    if (with_indices_dtype)
        iv_buf_printf(b, ",\"indices_dtype\":\"%s\"", iv_wire_dtype_name(in->indices_dtype));
    iv_buf_puts(b, ",\"codec\":");
    iv_buf_json_str(b, in->codec);
    iv_buf_puts(b, ",\"ready\":true");
}

void iv_enc_orientations(iv_buf_t *b, iv_dataset_t *ds, int other_cached)
{
    static const char *const state[] = {"none", "building", "ready", "skipped", "failed"};
    iv_orient_status_t st;
    iv_dataset_orientations(ds, &st);
    iv_buf_puts(b, ",\"orientations\":{");
    for (int o = 0; o < 2; o++) {
        int own = (iv_orient_t)o == st.file_orient;
        iv_buf_printf(b, "%s\"%s\":{", o ? "," : "", o == IV_IVCSR ? "cells" : "genes");
        if (own || st.other_state == IV_OTHER_READY)
            iv_buf_printf(b, "\"state\":\"ready\",\"source\":\"%s\",\"bytes\":%zu,"
                          "\"stream_bytes\":%" PRIu64, own ? "file" : st.other_source != IV_SRC_FILE ? "memory"
                          : other_cached ? "cache" : "companion", st.bytes[o], st.stream_bytes[o]);
        else
            iv_buf_printf(b, "\"state\":\"%s\"", state[st.other_state]);
        if (!own && st.other_state == IV_OTHER_READY)
            iv_buf_printf(b, ",\"seconds\":%.3f", st.other_seconds);
        if (own && st.plain)
            iv_buf_printf(b, ",\"plain_copy\":\"%s\"", st.plain == 1 ? "ready" : "dropped");
        if (own && st.wide)
            iv_buf_printf(b, ",\"wide_copy\":\"%s\"", st.wide == 1 ? "ready" : "dropped");
        iv_buf_puts(b, "}");
    }
    iv_buf_puts(b, "}");
}

/* Messages about a file hold at most this much of its path ("%.160s"). */
#define PATH_IN_MSG 160

/* Which of the served paths msg goes on with at p, as far as messages
 * hold it (PATH_IN_MSG bytes): its index, *n the bytes matched; -1 when
 * none. */
static int path_at(const char *p, const char *const paths[2], size_t *n)
{
    for (int i = 0; i < 2; i++) {
        if (!paths[i] || !paths[i][0]) continue;
        *n = strlen(paths[i]);
        if (*n > PATH_IN_MSG) *n = PATH_IN_MSG;
        if (strncmp(p, paths[i], *n) == 0) return i;
    }
    return -1;
}

char *iv_enc_file_msg(iv_dataset_t *ds, const char *msg, char *out, size_t cap)
{
    const char *paths[2] = {NULL, NULL};
    iv_file_t *f = iv_dataset_file(ds);
    iv_dataset_t *o = iv_dataset_other(ds);
    iv_file_t *fo = o ? iv_dataset_file(o) : NULL;
    if (f) paths[0] = iv_file_path(f);
    if (fo) paths[1] = iv_file_path(fo);
    size_t w = 0;
    if (!cap) return out;
    for (const char *p = msg; *p;) {
        size_t n;
        int i = path_at(p, paths, &n);
        if (i < 0) {
            if (w + 1 < cap) out[w++] = *p;
            p++;
            continue;
        }
        /* The path becomes its file name. */
        const char *base = strrchr(paths[i], '/');
        for (base = base ? base + 1 : paths[i]; *base && w + 1 < cap; base++) out[w++] = *base;
        p += n;
    }
    out[w] = '\0';
    return out;
}

void iv_enc_file_state(iv_buf_t *b, iv_dataset_t *ds)
{
    char msg[480], shown[480];
    iv_file_state_t st = iv_dataset_file_state(ds, msg, sizeof msg);
    iv_buf_printf(b, ",\"file\":{\"state\":\"%s\"", iv_file_state_name(st));
    if (st != IV_FILE_OK) {
        iv_buf_puts(b, ",\"message\":");
        iv_buf_json_str(b, iv_enc_file_msg(ds, msg, shown, sizeof shown));
    }
    iv_buf_puts(b, "}");
}

void iv_enc_count(iv_buf_t *b, const iv_query_t *q, int64_t nnz, double total, iv_dataset_t *ds,
                  const char *dropped)
{
    int64_t rows = iv_query_n_rows(q), cols = iv_query_n_cols(q), nb = iv_query_n_blocks(q);
    int64_t out_rows = rows;
    if (iv_query_by_var(q)) {
        /* Gene rows: the result's shape is still cells x genes. */
        rows = cols;
        cols = out_rows;
    }
    const char *cells = "n_cells", *genes = "n_genes";
    iv_buf_printf(b,
                  "{\"shape\":[%" PRId64 ",%" PRId64 "],\"%s\":%" PRId64 ",\"%s\":%" PRId64
                  ",\"nnz\":%" PRId64 ",\"total_counts\":%.17g,\"bytes\":{\"binary\":%" PRId64
                  "},\"blocks\":%" PRId64 ",\"exact\":true",
                  rows, cols, cells, rows, genes, cols, nnz, total,
                  iv_enc_binary_size(out_rows, nb, nnz, iv_query_index_size(q), iv_query_dtype(q)), nb);
    iv_buf_printf(b, ",\"orientation\":\"%s\"", iv_query_orient(q) == IV_IVCSR ? "cells" : "genes");
    if (ds) iv_enc_orientations(b, ds, 0);
    if (dropped) {
        iv_buf_puts(b, ",\"dropped\":");
        iv_buf_puts(b, dropped);
    }
    iv_buf_puts(b, "}");
}
