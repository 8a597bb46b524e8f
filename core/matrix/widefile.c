/*
 * The wide copy's writer (see widefile.h).
 */
#include "widefile.h"

#include <inttypes.h>
#include <string.h>

#include "cursor.h"
#include "dataset_impl.h"

struct wide_fill {
    iv_dataset_t *ds;
    iv_stream_t *src;
};

/* The last i in [0, n) with a[i] <= v (a rising, a[0] <= v). */
static int64_t last_at_most(const int64_t *a, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (a[mid] <= v) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Decoded from the start of the value group holding e0 (its deltas start
 * there), found through the row index of its slice. */
int iv_widefile_fill(const iv_dataset_t *ds, iv_stream_t *src, int64_t e0, int64_t e1, uint16_t *out,
                     iv_err_t *e)
{
    const int64_t *mp = ds->m.major_ptr, *vp = ds->m.value_ptr;
    int64_t n_minor = ds->m.n_minor;
    if (e0 < 0 || e0 >= e1 || e1 > ds->m.nnz)
        return e0 == e1 ? 0 : iv_fail(e, IV_EINVALID_ARG, "%s: no entries %" PRId64 "..%" PRId64, ds->where, e0, e1);
    int64_t g = last_at_most(vp, ds->m.n_unique, e0);
    int64_t s = last_at_most(mp, ds->m.n_major, g);
    uint64_t off, skip;
    iv_rowindex_locate(&ds->ri, mp, vp, s, &off, &skip);
    iv_cursor_t cur;
    iv_cursor_init(&cur, src);
    int rc = iv_cursor_seek(&cur, off, e);
    if (rc == 0) rc = iv_cursor_skip(&cur, skip + (uint64_t)(vp[g] - vp[mp[s]]), e);
    for (int64_t k = vp[g]; rc == 0 && k < e1; g++) {
        int64_t prev = -1;
        for (; rc == 0 && k < vp[g + 1] && k < e1; k++) {
            uint64_t d;
            if ((rc = iv_cursor_read(&cur, &d, e)) < 0) break;
            if (d >= (uint64_t)n_minor || prev + 1 + (int64_t)d >= n_minor) {
                rc = iv_fail(e, IV_ECORRUPT, "%s: value group %" PRId64 " has an index >= %" PRId64,
                             ds->where, g, n_minor);
                break;
            }
            prev += 1 + (int64_t)d;
            if (k >= e0) out[k - e0] = (uint16_t)prev;
        }
    }
    iv_cursor_done(&cur);
    return rc;
}

/* The copy's bytes [a, b): entries [a / 2, b / 2). */
static int wide_fill(void *ctx, uint64_t a, uint64_t b, uint8_t *buf, iv_err_t *e)
{
    const struct wide_fill *wf = ctx;
    return iv_widefile_fill(wf->ds, wf->src, (int64_t)(a / 2), (int64_t)(b / 2), (uint16_t *)(void *)buf, e);
}

int iv_widefile_save(const char *path, const iv_plainfile_for_t *f, iv_dataset_t *ds, iv_stream_t *src,
                     iv_pool_t *pool, const atomic_int *stop, iv_err_t *err)
{
    if (ds->m.n_minor > IV_WIDE_MAX_MINOR || f->length != 2 * (uint64_t)ds->m.nnz)
        return iv_fail(err, IV_EINTERNAL, "%s: no wide copy of %" PRId64 " minor elements, %" PRIu64 " bytes",
                       ds->where, ds->m.n_minor, f->length);
    struct wide_fill wf = {ds, src};
    return iv_plainfile_save_filled(path, f, wide_fill, &wf, pool, stop, err);
}
