/*
 * The uns document (see uns_doc.h).
 *
 * Design.  uns.h hands the entries flattened, each group before its
 * members and a group's members together after it (the reader's walk is
 * depth first), so the nesting is rebuilt in one pass with a stack of the
 * dicts open: an entry closes the open dicts that are not its ancestors,
 * is written under its parent, and a dict entry opens a level.  An entry
 * whose parent is not in the list (a dict the reader left out at its
 * limits) is left out with it rather than placed elsewhere.
 *
 * Floats: JSON numbers read back as doubles (Python's json, JavaScript),
 * and a client makes a float32 by rounding that double.  So a float32 is
 * printed with the fewest digits (6 to 9) whose double rounds back to the
 * same float32, a float64 with the fewest (15 to 17) that read back to
 * the same double; %.17g of the float32's exact double is the fallback
 * that always holds.  The check is strtod, the same correctly rounded
 * conversion the clients make.
 */
#include "uns_doc.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dicts open at once: uns itself and IV_UNS_MAX_DEPTH levels. */
#define STACK_CAP (IV_UNS_MAX_DEPTH + 2)

typedef struct level {
    const char *path;         /* the dict's path below uns ("" for uns) */
    size_t len;
    int first;                /* no member written yet */
} level_t;

/* Writes the shortest of "%.{lo..hi}g" of v that reads back to v (as
 * float32 when is_f32), with ".0" added where printf gave an integer. */
static void put_float(iv_buf_t *b, double v, int is_f32)
{
    if (isnan(v)) {
        iv_buf_puts(b, "\"NaN\"");
        return;
    }
    if (isinf(v)) {
        iv_buf_puts(b, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        return;
    }
    char s[40];
    int lo = is_f32 ? 6 : 15, hi = is_f32 ? 9 : 17;
    for (int p = lo; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*g", p, v);
        double back = strtod(s, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) break;
        if (p == hi) p = 16;  /* the next round prints %.17g: exact for both */
    }
    iv_buf_puts(b, s);
    if (!strpbrk(s, ".eE")) iv_buf_puts(b, ".0");
}

/* Element i of a NUM entry. */
static void put_number(iv_buf_t *b, const iv_uns_entry_t *e, int64_t i)
{
    const void *d = e->data;
    switch (e->dtype) {
    case IV_DT_INT8: iv_buf_printf(b, "%d", ((const int8_t *)d)[i]); break;
    case IV_DT_INT16: iv_buf_printf(b, "%d", ((const int16_t *)d)[i]); break;
    case IV_DT_INT32: iv_buf_printf(b, "%" PRId32, ((const int32_t *)d)[i]); break;
    case IV_DT_INT64: iv_buf_printf(b, "%" PRId64, ((const int64_t *)d)[i]); break;
    case IV_DT_UINT8: iv_buf_printf(b, "%u", ((const uint8_t *)d)[i]); break;
    case IV_DT_UINT16: iv_buf_printf(b, "%u", ((const uint16_t *)d)[i]); break;
    case IV_DT_UINT32: iv_buf_printf(b, "%" PRIu32, ((const uint32_t *)d)[i]); break;
    case IV_DT_UINT64: iv_buf_printf(b, "%" PRIu64, ((const uint64_t *)d)[i]); break;
    case IV_DT_FLOAT32: put_float(b, ((const float *)d)[i], 1); break;
    case IV_DT_FLOAT64: put_float(b, ((const double *)d)[i], 0); break;
    default: iv_buf_puts(b, "null"); break;  /* uns.c sends no other dtype */
    }
}

static void put_value(iv_buf_t *b, const iv_uns_entry_t *e, int64_t i)
{
    if (e->kind == IV_UNS_BOOL) {
        iv_buf_puts(b, ((const uint8_t *)e->data)[i] ? "true" : "false");
    } else if (e->kind == IV_UNS_STR) {
        size_t len;
        iv_buf_json_str(b, iv_uns_str(e, i, &len));  /* no NUL inside: uns.c checked */
    } else {
        put_number(b, e, i);
    }
}

/* A scalar or 1-D array as {"dtype", "shape", "data"}; fails past max. */
static int put_element(iv_buf_t *b, const iv_uns_entry_t *e, size_t max, iv_err_t *err)
{
    const char *dt = e->kind == IV_UNS_BOOL ? "bool" : e->kind == IV_UNS_STR ? "str" : iv_dtype_name(e->dtype);
    iv_buf_printf(b, "{\"dtype\":\"%s\",", dt);
    if (e->scalar) {
        iv_buf_puts(b, "\"shape\":[],\"data\":");
        put_value(b, e, 0);
    } else {
        iv_buf_printf(b, "\"shape\":[%" PRId64 "],\"data\":[", e->n);
        for (int64_t i = 0; i < e->n; i++) {
            if (i) iv_buf_puts(b, ",");
            put_value(b, e, i);
            if (max && b->len > max) break;
        }
        iv_buf_puts(b, "]");
    }
    iv_buf_puts(b, "}");
    IV_RETURN_IF(max && b->len > max, err, IV_ETOO_LARGE,
                 "the uns document passes the JSON answer limit of %zu bytes (at uns/%s)", max, e->path);
    return 0;
}

/* Whether the dict at lv holds path p (directly or below). */
static int holds(const level_t *lv, const char *p)
{
    return lv->len == 0 || (!strncmp(p, lv->path, lv->len) && p[lv->len] == '/');
}

static int put_tree(iv_buf_t *b, const iv_uns_t *u, size_t max, iv_err_t *err)
{
    level_t st[STACK_CAP];
    int top = 0;
    st[0] = (level_t){"", 0, 1};
    iv_buf_puts(b, "{");
    for (size_t i = 0; u && i < u->n; i++) {
        const iv_uns_entry_t *e = &u->e[i];
        const char *slash = strrchr(e->path, '/');
        size_t plen = slash ? (size_t)(slash - e->path) : 0;
        while (top > 0 && !holds(&st[top], e->path)) {
            iv_buf_puts(b, "}");
            top--;
        }
        if (st[top].len != plen) continue;  /* its parent is not in the list */
        if (!st[top].first) iv_buf_puts(b, ",");
        st[top].first = 0;
        iv_buf_json_str(b, slash ? slash + 1 : e->path);
        iv_buf_puts(b, ":");
        if (e->kind != IV_UNS_DICT) {
            IV_TRY(put_element(b, e, max, err));
        } else if (top + 1 < STACK_CAP) {
            iv_buf_puts(b, "{");
            st[++top] = (level_t){e->path, strlen(e->path), 1};
        } else {
            iv_buf_puts(b, "{}");  /* deeper than the reader goes: its members are left out */
        }
    }
    for (; top >= 0; top--) iv_buf_puts(b, "}");
    return 0;
}

static void put_skipped(iv_buf_t *b, const iv_uns_t *u)
{
    iv_buf_puts(b, ",\"skipped\":[");
    for (size_t i = 0; u && i < u->n_skip; i++) {
        iv_buf_puts(b, i ? ",{\"path\":" : "{\"path\":");
        iv_buf_json_str(b, u->skip[i].path);
        iv_buf_puts(b, ",\"reason\":");
        iv_buf_json_str(b, u->skip[i].why);
        iv_buf_puts(b, "}");
    }
    iv_buf_printf(b, "],\"skipped_truncated\":%s", u && u->more_skipped ? "true" : "false");
}

int iv_api_uns_doc(const iv_uns_t *u, size_t max_bytes, iv_buf_t *out, iv_err_t *err)
{
    size_t start = out->len, max = max_bytes ? start + max_bytes : 0;
    iv_buf_puts(out, "{\"uns\":");
    IV_TRY(put_tree(out, u, max, err));
    put_skipped(out, u);
    iv_buf_puts(out, "}");
    IV_RETURN_IF(out->oom, err, IV_ENOMEM, "out of memory for the uns document");
    IV_RETURN_IF(max && out->len > max, err, IV_ETOO_LARGE,
                 "the uns document passes the JSON answer limit of %zu bytes", max_bytes);
    return 0;
}
