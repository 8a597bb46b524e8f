/*
 * The per-dataset state of the viewer routes (viewer.h, iv_vds_t): the
 * obsm/varm arrays, the search indexes of text columns (built ahead for
 * var, on first use for obs) and the Zarr store's cache.
 */
#include "viewer_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


const char *vr_col_get(const void *ctx, int64_t i)
{
    const iv_meta_col_t *c = ctx;
    if (c->mask && c->mask[i]) return NULL;
    if (c->type == IV_COL_CATEGORICAL) {
        int32_t k = c->codes[i];
        return k >= 0 && k < c->n_cats ? iv_meta_col_cat(c, k) : NULL;
    }
    return iv_meta_col_str(c, i);
}

/* Adds the built index s of col to v, which takes it (lock held by
 * caller); on error (out of memory) s is still the caller's and *out
 * NULL. */
static int search_add_locked(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                             iv_search_t *s, const iv_search_t **out, iv_err_t *err)
{
    *out = NULL;
    if (v->n_idx == v->cap_idx) {
        size_t nc = v->cap_idx ? v->cap_idx * 2 : 8;
        sidx_t *n = realloc(v->idx, nc * sizeof *n);
        if (!n) return iv_fail(err, IV_ENOMEM, "out of memory for a search index");
        v->idx = n;
        v->cap_idx = nc;
    }
    v->idx[v->n_idx++] = (sidx_t){axis, col, s};
    v->search_bytes += iv_search_bytes(s);
    *out = s;
    return 0;
}

/* The search index of a column, built on first use (lock held by caller;
 * the load's, before the dataset is shared). */
static int search_index_locked(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                               const iv_search_t **out, iv_err_t *err)
{
    for (size_t i = 0; i < v->n_idx; i++)
        if (v->idx[i].col == col) {
            *out = v->idx[i].s;
            return 0;
        }
    iv_search_t *s = NULL;
    IV_TRY(iv_search_build(col->n, vr_col_get, col, &s, err));
    int rc = search_add_locked(v, axis, col, s, out, err);
    if (rc < 0) iv_search_free(s);
    return rc;
}

/* The column's index in v, or NULL (lock held by caller). */
static const iv_search_t *search_found_locked(const iv_vds_t *v, const iv_meta_col_t *col)
{
    for (size_t i = 0; i < v->n_idx; i++)
        if (v->idx[i].col == col) return v->idx[i].s;
    return NULL;
}

/* search_index_locked for a worker: a missing index is built outside the
 * lock (ten million obs names take seconds, and the loop takes the lock
 * for the memory figures), then added unless another thread added one
 * meanwhile. */
int vr_search_index(iv_vds_t *v, iv_axis_t axis, const iv_meta_col_t *col,
                        const iv_search_t **out, iv_err_t *err)
{
    pthread_mutex_lock(&v->mu);
    *out = search_found_locked(v, col);
    pthread_mutex_unlock(&v->mu);
    if (*out) return 0;
    iv_search_t *built = NULL;
    IV_TRY(iv_search_build(col->n, vr_col_get, col, &built, err));
    pthread_mutex_lock(&v->mu);
    int rc = 0;
    *out = search_found_locked(v, col);
    if (!*out) rc = search_add_locked(v, axis, col, built, out, err);
    pthread_mutex_unlock(&v->mu);
    if (*out != built) iv_search_free(built);
    return rc;
}

int vr_is_text(const iv_meta_col_t *c)
{
    return c->type == IV_COL_STRING || c->type == IV_COL_CATEGORICAL;
}

iv_vds_t *iv_vds_load(const char *path, const iv_dataset_t *ds, iv_meta_t *meta)
{
    iv_vds_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    pthread_mutex_init(&v->mu, NULL);
    v->meta = meta;
    v->zcache = iv_zarr_cache_new();  /* NULL: every zarr chunk request decodes */
    struct stat st;
    if (stat(path, &st) == 0)
        snprintf(v->identity, sizeof v->identity, "%llx-%llx-%llx-%lld.%09ld",
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                 (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    iv_err_t e;
    iv_err_clear(&e);
    if (iv_marrays_load(path, in->n_rows, in->n_cols, &v->arrays, &e) != 0)
        snprintf(v->arrays_err, sizeof v->arrays_err, "%.250s", e.msg);
    if (meta) {
        /* var's names index and text columns are searched most and are
         * small enough to index ahead (a gene table's columns take a few
         * MB); obs's names (ten million at an atlas's size, seconds to
         * index) by iv_vds_warm once the dataset serves, other obs
         * columns on first use. */
        const iv_search_t *s;
        pthread_mutex_lock(&v->mu);
        const iv_meta_col_t *ix = iv_meta_index(meta, IV_AXIS_VAR);
        if (ix) search_index_locked(v, IV_AXIS_VAR, ix, &s, &e);
        for (size_t i = 0; i < iv_meta_n_cols(meta, IV_AXIS_VAR); i++) {
            const iv_meta_col_t *c = iv_meta_col(meta, IV_AXIS_VAR, i);
            if (vr_is_text(c)) search_index_locked(v, IV_AXIS_VAR, c, &s, &e);
        }
        pthread_mutex_unlock(&v->mu);
    }
    return v;
}

void iv_vds_warm(iv_vds_t *v)
{
    const iv_meta_col_t *ix = v && v->meta ? iv_meta_index(v->meta, IV_AXIS_OBS) : NULL;
    const iv_search_t *s;
    iv_err_t e;
    iv_err_clear(&e);
    if (ix) vr_search_index(v, IV_AXIS_OBS, ix, &s, &e);
}

/* The store as its requests see it (adapters.c, vr_run_zarr): only X's
 * chunks are read from it. */
static iv_zarr_src_t keep_src(iv_vds_t *v, iv_dataset_t *ds)
{
    return (iv_zarr_src_t){.ds = ds, .meta = v ? v->meta : NULL, .arrays = v ? v->arrays : NULL,
                           .cache = v ? v->zcache : NULL};
}

void iv_vds_keep_zarr(iv_vds_t *v, iv_dataset_t *ds, const iv_zarr_keep_in_t *in, iv_zarr_keep_out_t *out)
{
    iv_zarr_src_t src = keep_src(v, ds);
    iv_zarr_keep_x(&src, in, out);
}

size_t iv_vds_keep_zarr_bytes(iv_vds_t *v, iv_dataset_t *ds, size_t threads, size_t width)
{
    iv_zarr_src_t src = keep_src(v, ds);
    return iv_zarr_keep_bytes(&src, threads, width);
}

uint64_t iv_vds_zarr_kept(const iv_vds_t *v, int csr)
{
    uint64_t bytes;
    int dropped;
    iv_zarr_cache_kept_state(v ? v->zcache : NULL, csr, &bytes, &dropped);
    return dropped ? 0 : bytes;
}

const char *iv_vds_identity(const iv_vds_t *v)
{
    return v ? v->identity : "";
}

void iv_vds_free(iv_vds_t *v)
{
    if (!v) return;
    iv_marrays_free(v->arrays);
    iv_zarr_cache_free(v->zcache);
    for (size_t i = 0; i < v->n_idx; i++) iv_search_free(v->idx[i].s);
    free(v->idx);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

/* One obsm/varm element of the dataset document: its shape, dtype and
 * size when it is served, else why not. */
static void put_marray_entry(iv_buf_t *b, const iv_marray_t *a)
{
    iv_buf_json_str(b, a->name);
    iv_buf_puts(b, ",\"encoding\":");
    iv_buf_json_str(b, a->encoding);
    if (a->data) {
        iv_buf_printf(b, ",\"shape\":[%" PRId64 ",%" PRId64 "],\"dtype\":\"%s\",\"bytes\":%zu"
                         ",\"servable\":true}",
                      a->n_rows, a->n_cols, iv_dtype_name(a->dtype),
                      (size_t)a->n_rows * (size_t)a->n_cols * iv_dtype_size(a->dtype));
    } else {
        iv_buf_puts(b, ",\"servable\":false,\"reason\":");
        iv_buf_json_str(b, a->why);
        iv_buf_puts(b, "}");
    }
}

void iv_vds_doc(iv_buf_t *b, const iv_vds_t *v)
{
    const iv_marrays_t *s = v ? v->arrays : NULL;
    for (int ax = 0; ax < 2; ax++) {
        iv_axis_t axis = ax ? IV_AXIS_VAR : IV_AXIS_OBS;
        iv_buf_puts(b, ax ? ",\"varm\":[" : ",\"obsm\":[");
        int first = 1;
        for (size_t i = 0; s && i < s->n; i++) {
            if (s->a[i].axis != axis) continue;
            iv_buf_puts(b, first ? "{\"name\":" : ",{\"name\":");
            first = 0;
            put_marray_entry(b, &s->a[i]);
        }
        iv_buf_puts(b, "]");
    }
    if (v && v->arrays_err[0]) {
        iv_buf_puts(b, ",\"obsm_error\":");
        iv_buf_json_str(b, v->arrays_err);
    }
    size_t arrays = 0, search = 0;
    iv_vds_memory(v, &arrays, &search);
    iv_buf_printf(b, ",\"viewer_bytes\":{\"arrays\":%zu,\"search\":%zu}", s ? s->bytes : 0,
                  search);
    iv_buf_puts(b, ",\"zarr_kept\":{");
    for (int csr = 1; csr >= 0; csr--) {
        uint64_t bytes = iv_vds_zarr_kept(v, csr);
        iv_buf_puts(b, csr ? "\"csr\":" : ",\"csc\":");
        if (bytes) iv_buf_printf(b, "%" PRIu64, bytes);
        else iv_buf_puts(b, "null");
    }
    iv_buf_puts(b, "}");
}

void iv_vds_memory(const iv_vds_t *v, size_t *arrays, size_t *search)
{
    *arrays = v && v->arrays ? v->arrays->bytes : 0;
    *search = 0;
    if (!v) return;
    pthread_mutex_t *mu = (pthread_mutex_t *)&v->mu;   /* guards search_bytes */
    pthread_mutex_lock(mu);
    *search = v->search_bytes;
    pthread_mutex_unlock(mu);
}
