/*
 * The .h5ad of a selection (see h5ad_export.h), in four steps called in
 * order by iv_api_export_h5ad: decode the blocks on the pool, gather
 * them into one CSR (pointers joined, the blocks' arrays used in place),
 * write the file in an h5iso child, then open it and remove it.
 *
 * Why a folder of its own: the writer names its temporary file after the
 * process that writes it (the child) and renames it at the end, so a
 * child that dies leaves a name the parent cannot guess.  Writing inside
 * a fresh mkdtemp folder makes the clean-up "remove what the folder
 * holds, then the folder", whatever the child left.  Once the finished
 * file is open it is unlinked at once: from then on the bytes live only
 * as long as the descriptor, so a client that leaves or a server that
 * stops leaves nothing behind.
 */
#include "h5ad_export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "anndata_write.h"
#include "h5iso.h"

/* ---- decode ------------------------------------------------------------- */

typedef struct decode_ctx {
    iv_query_t *q;
    iv_block_t *blocks;
    int *rcs;
    iv_err_t *errs;
} decode_ctx_t;

static void decode_one(void *arg, size_t i)
{
    decode_ctx_t *d = arg;
    d->rcs[i] = iv_query_decode_block(d->q, (int64_t)i, &d->blocks[i], &d->errs[i]);
}

/* Every block of q, decoded on the pool (the caller takes part). */
static int decode_blocks(iv_query_t *q, iv_pool_t *pool, iv_block_t *blocks, int64_t nb, iv_err_t *err)
{
    size_t n = (size_t)(nb ? nb : 1);
    decode_ctx_t d = {q, blocks, calloc(n, sizeof(int)), calloc(n, sizeof(iv_err_t))};
    int rc = 0;
    if (!d.rcs || !d.errs) rc = iv_fail(err, IV_ENOMEM, "out of memory decoding the selection");
    else iv_pool_parallel_for(pool, (size_t)nb, 0, decode_one, &d);
    for (int64_t b = 0; rc == 0 && b < nb; b++)
        if (d.rcs[b] < 0) rc = iv_fail(err, d.rcs[b], "%s", d.errs[b].msg);
    free(d.rcs);
    free(d.errs);
    return rc;
}

/* ---- gather ------------------------------------------------------------- */

/* The writer's view of the decoded blocks: one indptr, and each block's
 * indices and values where the decode left them. */
typedef struct parts {
    iv_adw_x_t x;
    int64_t *indptr;
    const void **ip, **dp;
    size_t *il, *dl;
} parts_t;

static void parts_free(parts_t *p)
{
    free(p->indptr);
    free(p->ip);
    free(p->dp);
    free(p->il);
    free(p->dl);
}

static int parts_gather(iv_query_t *q, const iv_dataset_info_t *di, const iv_block_t *blocks, int64_t nb,
                        parts_t *p, iv_err_t *err)
{
    size_t n = (size_t)(nb ? nb : 1);
    int64_t rows = iv_query_n_rows(q);
    memset(p, 0, sizeof *p);
    p->indptr = malloc((size_t)(rows + 1) * sizeof *p->indptr);
    p->ip = calloc(n, sizeof *p->ip);
    p->dp = calloc(n, sizeof *p->dp);
    p->il = calloc(n, sizeof *p->il);
    p->dl = calloc(n, sizeof *p->dl);
    if (!p->indptr || !p->ip || !p->dp || !p->il || !p->dl) {
        parts_free(p);
        return iv_fail(err, IV_ENOMEM, "out of memory gathering the selection");
    }
    int isz = iv_query_index_size(q);
    iv_dtype_t dt = iv_query_dtype(q);
    int64_t nnz = 0;
    p->indptr[0] = 0;
    for (int64_t b = 0; b < nb; b++) {
        const iv_block_t *bl = &blocks[b];
        for (int64_t i = 0; i < bl->n_rows; i++) p->indptr[bl->row0 + i + 1] = nnz + bl->indptr[i + 1];
        nnz += bl->nnz;
        p->ip[b] = bl->indices;
        p->il[b] = (size_t)bl->nnz * (size_t)isz;
        p->dp[b] = bl->data;
        p->dl[b] = (size_t)bl->nnz * iv_dtype_size(dt);
    }
    p->x = (iv_adw_x_t){
        .n_rows = rows, .n_cols = iv_query_n_cols(q), .nnz = nnz, .src_rows = di->n_rows,
        .src_cols = di->n_cols, .indptr = p->indptr, .n_parts = (size_t)nb,
        .indices = (const void *const *)p->ip, .indices_bytes = p->il, .index_size = isz,
        .data = (const void *const *)p->dp, .data_bytes = p->dl, .dtype = dt, .index_bits = 0,
    };
    return 0;
}

/* ---- write (in an h5iso child) ------------------------------------------ */

typedef struct write_ctx {
    const char *src, *out;
    const iv_adw_x_t *x;
    const iv_sel_t *obs, *var;
} write_ctx_t;

/* The child: the writer, its list of elements left out as the answer. */
static int write_child(void *arg, iv_h5iso_out_t *o, iv_err_t *err)
{
    write_ctx_t *w = arg;
    char skipped[1024] = "";
    iv_h5iso_stage(o, "writing the export");
    IV_TRY(iv_anndata_write(w->src, w->out, w->x, w->obs, w->var, skipped, sizeof skipped, err));
    return iv_h5iso_put(o, skipped, strlen(skipped));
}

/* Removes what dir holds (the finished file, or what a dead child left)
 * and dir itself. */
static void dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4400];
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Opens the finished file for reading; the caller removes it. */
static int open_result(const char *out, int *fd, int64_t *size, iv_err_t *err)
{
    struct stat st;
    *fd = open(out, O_RDONLY | O_CLOEXEC);
    if (*fd < 0 || fstat(*fd, &st) != 0) {
        int e = errno;
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return iv_fail(err, IV_EIO, "cannot open the written export: %s", strerror(e));
    }
    *size = (int64_t)st.st_size;
    return 0;
}

static int write_file(iv_dataset_t *ds, const parts_t *p, const iv_sel_t *obs, const iv_sel_t *var,
                      const char *tmpdir, int *fd, int64_t *size, iv_err_t *err)
{
    char dir[4096], out[4200];
    if (snprintf(dir, sizeof dir, "%s/ivserve-export-XXXXXX", tmpdir) >= (int)sizeof dir)
        return iv_fail(err, IV_EIO, "the temporary folder's name is too long");
    if (!mkdtemp(dir))
        return iv_fail(err, IV_EIO, "cannot make a temporary folder for the export in %s: %s", tmpdir,
                       strerror(errno));
    snprintf(out, sizeof out, "%s/export.h5ad", dir);
    const char *src = iv_dataset_info(ds)->path;
    write_ctx_t w = {src, out, &p->x, obs, var};
    iv_h5iso_result_t res;
    int rc = iv_h5iso_run(src, write_child, &w, NULL, NULL, &res, err);
    if (rc == 0) {
        iv_h5iso_result_free(&res);
        rc = open_result(out, fd, size, err);
    }
    dir_remove(dir);
    return rc;
}

int iv_api_export_h5ad(iv_dataset_t *ds, iv_query_t *q, iv_pool_t *pool, const iv_sel_t *obs,
                       const iv_sel_t *var, const char *tmpdir, const atomic_int *cancel, int *fd,
                       int64_t *size, iv_err_t *err)
{
    *fd = -1;
    *size = 0;
    IV_TRY(iv_query_prepare(q, pool, err));
    int64_t nb = iv_query_n_blocks(q);
    iv_block_t *blocks = calloc((size_t)(nb ? nb : 1), sizeof *blocks);
    if (!blocks) return iv_fail(err, IV_ENOMEM, "out of memory for the export's blocks");
    parts_t p;
    memset(&p, 0, sizeof p);
    int rc = decode_blocks(q, pool, blocks, nb, err);
    if (rc == 0 && cancel && atomic_load(cancel)) rc = iv_fail(err, IV_ECANCELLED, "cancelled");
    if (rc == 0) rc = parts_gather(q, iv_dataset_info(ds), blocks, nb, &p, err);
    if (rc == 0) rc = write_file(ds, &p, obs, var, tmpdir, fd, size, err);
    parts_free(&p);
    for (int64_t b = 0; b < nb; b++) iv_block_free(&blocks[b]);
    free(blocks);
    return rc;
}
