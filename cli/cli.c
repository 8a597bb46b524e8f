/*
 * `ivserve check FILE` and `ivserve export FILE ... -o OUT.npz`.
 *
 * export decodes with the same engine and worker pool as the server, keeps
 * the blocks of one query in memory (the output) and writes them as a
 * scipy.sparse.save_npz file without concatenating them.  Batch mode runs
 * many selections against one opened dataset, for differential tests.
 */
#include "cli.h"
#include "cli_export.h"
#include "cli_pack.h"
#include "cli_token.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "dataset.h"
#include "filecheck.h"
#include "h5guard.h"
#include "meta.h"
#include "npz.h"
#include "pack.h"
#include "pool.h"
#include "query.h"
#include "transpose.h"
#include "version.h"

struct cli_opts {
    const char *file, *group, *obs, *var, *out, *batch, *where, *var_where;
    unsigned threads;
    uint32_t stride;
    long long cache_mb;
    int major_axis;
    const char *orient;       /* export --orient cells|genes|auto, or NULL */
    const char *companion;    /* export --companion FILE */
    int by_var;               /* export --by var */
    int index_bits;           /* export --index-dtype: 0 = auto, 32, 64 */
};

static int usage(void)
{
    fprintf(stderr,
            "usage: ivserve check FILE [--group G] [--threads N] [--stride K]\n"
            "       ivserve export FILE [--group G] [--obs SEL] [--var SEL] [--threads N]\n"
            "                      [--stride K] [--cache-mb N] [--where EXPR] [--var-where EXPR]\n"
            "                      [--orient cells|genes|auto] [--companion FILE] [--by obs|var]\n"
            "                      [--index-dtype auto|int32|int64] -o OUT.npz|OUT.h5ad\n"
            "       ivserve export FILE --batch LIST -o DIR\n"
            "       ivserve pack IN.h5ad OUT.h5ad [options]   (ivserve pack --help)\n"
            "SEL: comma-separated indices and half-open ranges, e.g. 5,3,3,10:20, or names\n"
            "     (CD3E,MS4A1); '' = none.  EXPR: a filter, e.g. \"cell_type == 'B' and n_genes > 500\"\n");
    return 2;
}

int iv_cli_is_command(const char *name)
{
    return name && (strcmp(name, "check") == 0 || strcmp(name, "export") == 0 ||
                    strcmp(name, "pack") == 0 || strcmp(name, "token-hash") == 0);
}

/* The options that take a string, by the field that keeps it. */
static const struct {
    const char *flag;
    size_t field;
} string_opts[] = {
    {"--group", offsetof(struct cli_opts, group)},
    {"--obs", offsetof(struct cli_opts, obs)},
    {"--var", offsetof(struct cli_opts, var)},
    {"-o", offsetof(struct cli_opts, out)},
    {"--output", offsetof(struct cli_opts, out)},
    {"--batch", offsetof(struct cli_opts, batch)},
    {"--where", offsetof(struct cli_opts, where)},
    {"--var-where", offsetof(struct cli_opts, var_where)},
    {"--orient", offsetof(struct cli_opts, orient)},
    {"--companion", offsetof(struct cli_opts, companion)},
};

/* Takes option a with its value v: 1 when a is an option with a value. */
static int set_value_opt(struct cli_opts *o, const char *a, const char *v)
{
    for (size_t k = 0; k < sizeof string_opts / sizeof *string_opts; k++)
        if (strcmp(a, string_opts[k].flag) == 0) {
            *(const char **)((char *)o + string_opts[k].field) = v;
            return 1;
        }
    if (strcmp(a, "--threads") == 0) o->threads = (unsigned)strtoul(v, NULL, 10);
    else if (strcmp(a, "--stride") == 0) o->stride = (uint32_t)strtoul(v, NULL, 10);
    else if (strcmp(a, "--cache-mb") == 0) o->cache_mb = strtoll(v, NULL, 10);
    else if (strcmp(a, "--by") == 0)
        o->by_var = strcmp(v, "var") == 0 ? 1 : strcmp(v, "obs") == 0 ? 0 : -1;
    else if (strcmp(a, "--index-dtype") == 0)
        o->index_bits = !strcmp(v, "int32") ? 32 : !strcmp(v, "int64") ? 64 : !strcmp(v, "auto") ? 0 : -1;
    else return 0;
    return 1;
}

static int check_opts(const struct cli_opts *o)
{
    if (!o->file) {
        fprintf(stderr, "ivserve: missing FILE\n");
        return -1;
    }
    if (o->by_var < 0 || (o->orient && strcmp(o->orient, "cells") && strcmp(o->orient, "genes") &&
                          strcmp(o->orient, "auto"))) {
        fprintf(stderr, "ivserve: --orient takes cells, genes or auto; --by takes obs or var\n");
        return -1;
    }
    if (o->index_bits < 0) {
        fprintf(stderr, "ivserve: --index-dtype takes auto, int32 or int64\n");
        return -1;
    }
    return 0;
}

static int parse_opts(int argc, char **argv, struct cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cache_mb = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--genes-major") == 0) {
            o->major_axis = 1;
        } else if (v && set_value_opt(o, a, v)) {
            i++;
        } else if (a[0] == '-' || o->file) {
            fprintf(stderr, "ivserve: unknown or incomplete argument '%s'\n", a);
            return -1;
        } else {
            o->file = a;
        }
    }
    return check_opts(o);
}

/*
 * export --orient: the orientation that serves (cells, genes, or the
 * planner's choice); the one the file lacks is read from --companion or
 * built in memory first, with no budget.
 */
static int export_orient(const struct cli_opts *o, iv_pool_t *pool, iv_dataset_t *ds,
                         iv_pick_t *pick)
{
    *pick = IV_PICK_AUTO;
    if (!o->orient && !o->companion) return 0;
    iv_err_t err = {0};
    int rc;
    if (o->companion) {
        iv_dataset_opts_t dopts;
        iv_dataset_opts_init(&dopts);
        dopts.pool = pool;
        rc = iv_dataset_attach_other(ds, o->companion, &dopts, &err);
    } else {
        iv_transpose_opts_t to = {.budget = UINT64_MAX, .pool = pool};
        rc = iv_dataset_build_other(ds, &to, &err);
    }
    if (rc < 0) {
        fprintf(stderr, "ivserve: error: %s\n", err.msg);
        return -1;
    }
    if (o->orient && !strcmp(o->orient, "cells")) *pick = IV_PICK_CELLS;
    if (o->orient && !strcmp(o->orient, "genes")) *pick = IV_PICK_GENES;
    return 0;
}

static int open_dataset(const struct cli_opts *o, iv_pool_t *pool, iv_dataset_t **ds)
{
    iv_dataset_opts_t dopts;
    iv_dataset_opts_init(&dopts);
    if (o->group) dopts.group = o->group;
    dopts.index_stride = o->stride;
    if (o->cache_mb >= 0) dopts.cache_bytes = (size_t)o->cache_mb << 20;
    dopts.pool = pool;
    iv_err_t err = {0};
    if (iv_dataset_open(o->file, &dopts, ds, &err) < 0) {
        fprintf(stderr, "ivserve: error: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Rows of an axis whose index name also names an earlier row: lookups by
 * name give the first of them.  -1 when it cannot be counted. */
static int64_t count_duplicate_names(iv_meta_t *m, iv_axis_t axis)
{
    const iv_meta_col_t *ix = iv_meta_index(m, axis);
    int64_t n = ix->n, dup = 0;
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    int64_t *rows = malloc((size_t)(n ? n : 1) * sizeof *rows);
    iv_err_t err = {0};
    if (!names || !rows) dup = -1;
    for (int64_t i = 0; dup >= 0 && i < n; i++)
        names[i] = ix->mask && ix->mask[i] ? "" : iv_meta_col_str(ix, i);
    if (dup >= 0 && iv_meta_find_names(m, axis, NULL, names, n, 1, rows, NULL, &err) < 0) dup = -1;
    for (int64_t i = 0; dup >= 0 && i < n; i++) dup += rows[i] != i;
    free(names);
    free(rows);
    return dup;
}

/*
 * The metadata, read and checked as the server's load reads it
 * (iv_meta_load, then the computed columns).  A file the server would
 * leave out fails here with the server's message; metadata in an
 * unsupported encoding is reported, not failed, since the server then
 * serves the matrix without names.  Returns 0 or 1.
 */
static int check_meta(const struct cli_opts *o, iv_dataset_t *ds, iv_pool_t *pool)
{
    iv_meta_t *m = NULL;
    iv_err_t err = {0};
    if (iv_meta_load(o->file, o->group, &m, &err) != 0 ||
        iv_meta_add_computed(m, ds, pool, &err) != 0) {
        iv_meta_free(m);
        if (err.code == IV_EUNSUPPORTED) {
            printf("metadata: not loaded (%s); the server serves the matrix without names\n",
                   err.msg);
            return 0;
        }
        fprintf(stderr, "ivserve: error: %s\n", err.msg);
        return 1;
    }
    for (int a = 0; a < 2; a++) {
        iv_axis_t axis = a ? IV_AXIS_VAR : IV_AXIS_OBS;
        const iv_meta_col_t *ix = iv_meta_index(m, axis);
        int64_t dup = count_duplicate_names(m, axis);
        printf("%s: %" PRId64 " rows, %zu columns, index '%s'", a ? "var" : "obs",
               iv_meta_n_rows(m, axis), iv_meta_n_cols(m, axis), ix->name);
        if (dup > 0)
            printf(" (%" PRId64 " duplicated names: a lookup by name gives the first row)", dup);
        printf("\n");
    }
    iv_meta_stats_t st;
    iv_meta_stats(m, &st);
    printf("metadata load: %.3f s, %zu bytes\n", st.load_seconds, st.bytes);
    iv_meta_free(m);
    return 0;
}

static int cmd_check(const struct cli_opts *o, iv_pool_t *pool)
{
    iv_dataset_t *ds;
    if (open_dataset(o, pool, &ds) < 0) return 1;
    const iv_dataset_info_t *in = iv_dataset_info(ds);
    iv_cache_stats_t cs;
    iv_dataset_cache_stats(ds, &cs);
    printf("file: %s\n", in->path);
    printf("group: %s (%s)\n", in->group, in->orient == IV_IVCSR ? "ivcsr" : "ivcsc");
    printf("shape: %" PRId64 " x %" PRId64 "\n", in->n_rows, in->n_cols);
    printf("nnz: %" PRId64 "\n", in->nnz);
    printf("unique values: %" PRId64 " groups\n", in->n_unique);
    printf("value dtype: %s\n", iv_dtype_name(in->value_dtype));
    printf("indices dtype: %s\n", iv_dtype_name(in->indices_dtype));
    printf("codec: %s\n", in->codec);
    printf("layout: %s, %" PRIu64 " chunks of %" PRIu64 " bytes\n",
           in->chunked ? "chunked" : "contiguous", in->n_chunks, in->chunk_len);
    if (in->chunk_index[0]) printf("chunk index: %s\n", in->chunk_index);
    printf("stream size: %" PRIu64 " bytes (%" PRIu64 " stored)\n", in->stream_bytes,
           in->stored_bytes);
    printf("row index: every %u slices, %zu bytes\n", in->index_stride, in->index_bytes);
    printf("cache: %zu of %zu bytes used\n", cs.used, cs.budget);
    printf("open time: %.3f s\n", in->open_seconds);
    printf("index build: %.3f s\n", in->index_seconds);
    int rc = check_meta(o, ds, pool);
    iv_dataset_close(ds);
    return rc;
}

struct decode_job {
    iv_query_t *q;
    iv_block_t *blocks;
    int *rcs;
    iv_err_t *errs;
};

static void decode_one(void *arg, size_t i)
{
    iv_h5guard_beat();
    struct decode_job *j = arg;
    j->rcs[i] = iv_query_decode_block(j->q, (int64_t)i, &j->blocks[i], &j->errs[i]);
}

/* Decodes all nb blocks of q on the pool; the first error wins. */
static int decode_blocks(iv_query_t *q, iv_pool_t *pool, iv_block_t *blocks, int64_t nb,
                         iv_err_t *err)
{
    struct decode_job j = {q, blocks, calloc((size_t)(nb ? nb : 1), sizeof(int)),
                           calloc((size_t)(nb ? nb : 1), sizeof(iv_err_t))};
    int rc = 0;
    if (!j.rcs || !j.errs) {
        rc = iv_fail(err, IV_ENOMEM, "out of memory");
    } else {
        iv_pool_parallel_for(pool, (size_t)nb, 0, decode_one, &j);
        for (int64_t b = 0; b < nb && rc == 0; b++)
            if (j.rcs[b] < 0) rc = iv_fail(err, j.rcs[b], "%s", j.errs[b].msg);
    }
    free(j.rcs);
    free(j.errs);
    return rc;
}

/* The decoded blocks as the parts of one CSR matrix, not concatenated:
 * the whole indptr, and each block's indices and data by reference. */
struct result_parts {
    int64_t n_rows, n_cols, nnz, nb;
    int isz;
    iv_dtype_t dt;
    int64_t *indptr;
    const void **ip, **dp;
    size_t *il, *dl;
};

static void parts_free(struct result_parts *r)
{
    free(r->indptr);
    free(r->ip);
    free(r->dp);
    free(r->il);
    free(r->dl);
}

static int parts_gather(iv_query_t *q, const iv_block_t *blocks, int64_t nb,
                        struct result_parts *r, iv_err_t *err)
{
    size_t nbs = (size_t)(nb ? nb : 1);
    *r = (struct result_parts){.n_rows = iv_query_n_rows(q), .n_cols = iv_query_n_cols(q),
                               .nb = nb, .isz = iv_query_index_size(q), .dt = iv_query_dtype(q)};
    r->indptr = malloc((size_t)(r->n_rows + 1) * sizeof *r->indptr);
    r->ip = calloc(nbs, sizeof *r->ip);
    r->dp = calloc(nbs, sizeof *r->dp);
    r->il = calloc(nbs, sizeof *r->il);
    r->dl = calloc(nbs, sizeof *r->dl);
    if (!r->indptr || !r->ip || !r->dp || !r->il || !r->dl) {
        parts_free(r);
        return iv_fail(err, IV_ENOMEM, "out of memory");
    }
    r->indptr[0] = 0;
    for (int64_t b = 0; b < nb; b++) {
        const iv_block_t *bl = &blocks[b];
        for (int64_t i = 0; i < bl->n_rows; i++) r->indptr[bl->row0 + i + 1] = r->nnz + bl->indptr[i + 1];
        r->nnz += bl->nnz;
        r->ip[b] = bl->indices;
        r->il[b] = (size_t)bl->nnz * (size_t)r->isz;
        r->dp[b] = bl->data;
        r->dl[b] = (size_t)bl->nnz * iv_dtype_size(r->dt);
    }
    return 0;
}

/* The five arrays of scipy.sparse.save_npz; 1 when one fails.  Gene rows
 * (csc) are the CSC of the result (cells x genes). */
static int npz_add_arrays(iv_npz_t *z, const struct result_parts *r, int csc)
{
    int64_t shape[2] = {csc ? r->n_cols : r->n_rows, csc ? r->n_rows : r->n_cols};
    int64_t n_nnz[1] = {r->nnz}, n_ptr[1] = {r->n_rows + 1}, n_shape[1] = {2};
    const void *ptr[1] = {r->indptr}, *fmt[1] = {csc ? "csc" : "csr"}, *shp[1] = {shape};
    size_t ptr_len[1] = {(size_t)(r->n_rows + 1) * sizeof *r->indptr}, fmt_len[1] = {3},
           shp_len[1] = {sizeof shape};
    int werr = iv_npz_add(z, "indices", r->isz == 4 ? "<i4" : "<i8", 1, n_nnz, (size_t)r->nb,
                          r->ip, r->il) != 0;
    werr |= iv_npz_add(z, "indptr", "<i8", 1, n_ptr, 1, ptr, ptr_len) != 0;
    werr |= iv_npz_add(z, "format", "|S3", 0, NULL, 1, fmt, fmt_len) != 0;
    werr |= iv_npz_add(z, "shape", "<i8", 1, n_shape, 1, shp, shp_len) != 0;
    werr |= iv_npz_add(z, "data", iv_dtype_descr(r->dt), 1, n_nnz, (size_t)r->nb, r->dp, r->dl) != 0;
    return werr;
}

/* Writes OUT.npz under a temporary name and renames it, as the .h5ad is:
 * OUT is the old file or the whole new one, never a part. */
static int write_npz(const char *out_path, const struct result_parts *r, int csc, iv_err_t *err)
{
    char tmp[4200];
    iv_pack_temp_name(out_path, tmp, sizeof tmp);
    iv_h5guard_temp(tmp);
    FILE *f = fopen(tmp, "wb");
    int werr = !f;
    if (f) {
        iv_npz_t *z = iv_npz_begin(f);
        werr = !z;
        if (z) {
            werr |= npz_add_arrays(z, r, csc);
            werr |= iv_npz_finish(z) != 0;
        }
        werr |= fclose(f) != 0;
    }
    int e = errno;
    if (!werr && rename(tmp, out_path) != 0) {
        werr = 1;
        e = errno;
    }
    if (werr) unlink(tmp);
    iv_h5guard_temp(NULL);
    if (werr) return iv_fail(err, IV_EIO, "%s: cannot write: %s", out_path, strerror(e));
    return 0;
}

/* The result as a standard AnnData file: CSR X plus the subset metadata. */
static int write_h5ad(iv_dataset_t *ds, const char *out_path, const struct result_parts *r,
                      int index_bits, const iv_sel_t *obs, const iv_sel_t *var, iv_err_t *err)
{
    const iv_dataset_info_t *di = iv_dataset_info(ds);
    return iv_cli_write_h5ad(di->path, out_path, r->n_rows, r->n_cols, di->n_rows, di->n_cols,
                             r->indptr, r->nnz, (size_t)r->nb, r->ip, r->il, r->isz, r->dp,
                             r->dl, r->dt, index_bits, obs, var, err);
}

/* Runs one query and writes OUT.npz or OUT.h5ad; returns 0 or 1 (error
 * printed): query, decode, gather the parts, write. */
static int export_one(iv_dataset_t *ds, iv_pool_t *pool, const iv_sel_t *obs, const iv_sel_t *var,
                      int major_axis, iv_pick_t pick, int by_var, int index_bits,
                      const char *out_path, int h5ad)
{
    iv_err_t err = {0};
    iv_query_t *q = NULL;
    iv_query_opts_t qo = {.axis = major_axis ? IV_OUT_MAJOR : by_var ? IV_OUT_VARS : IV_OUT_ROWS,
                          .pick = pick};
    iv_block_t *blocks = NULL;
    int64_t nb = 0;
    int rc = -1;
    struct result_parts parts;
    if (iv_query_new(ds, obs, var, &qo, &q, &err) < 0 || iv_query_prepare(q, pool, &err) < 0)
        goto report;
    nb = iv_query_n_blocks(q);
    blocks = calloc((size_t)(nb ? nb : 1), sizeof *blocks);
    if (!blocks) {
        iv_fail(&err, IV_ENOMEM, "out of memory");
        goto report;
    }
    if (decode_blocks(q, pool, blocks, nb, &err) < 0 || parts_gather(q, blocks, nb, &parts, &err) < 0)
        goto report;
    rc = h5ad ? write_h5ad(ds, out_path, &parts, index_bits, obs, var, &err)
              : write_npz(out_path, &parts, by_var && !major_axis, &err);
    parts_free(&parts);
report:
    if (rc) fprintf(stderr, "ivserve: error: %s\n", err.msg[0] ? err.msg : "export failed");
    for (int64_t b = 0; b < nb && blocks; b++) iv_block_free(&blocks[b]);
    free(blocks);
    iv_query_free(q);
    return rc ? 1 : 0;
}

/* 1 (message printed) when out names the input or its companion. */
static int out_is_input(const struct cli_opts *o, const char *out)
{
    const char *in = iv_file_same(out, o->file) ? o->file
                     : iv_file_same(out, o->companion) ? o->companion : NULL;
    if (!in) return 0;
    fprintf(stderr, "ivserve: error: %s: the output is the input %s; writing it would replace what "
            "is read (choose another -o)\n", out, in);
    return 1;
}

/* The extension of the file name path ends in ("" when none). */
static const char *out_extension(const char *path)
{
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    return dot && (!slash || dot > slash) ? dot : "";
}

/* The output format comes from the extension; anything else is an error
 * rather than a guess.  *h5ad: 1 for .h5ad, 0 for .npz (and --batch).
 * Returns 0 or 1 (message printed). */
static int check_output(const struct cli_opts *o, int *h5ad)
{
    *h5ad = 0;
    if (o->batch && o->index_bits) {
        fprintf(stderr, "ivserve: error: --index-dtype applies to .h5ad output, not --batch\n");
        return 1;
    }
    if (o->batch) return 0;
    const char *ext = out_extension(o->out);
    *h5ad = strcmp(ext, ".h5ad") == 0;
    if (!*h5ad && strcmp(ext, ".npz") != 0) {
        fprintf(stderr, "ivserve: error: %s: unknown output extension (use .npz for "
                "scipy.sparse.save_npz or .h5ad for AnnData)\n", o->out);
        return 1;
    }
    if (!*h5ad && o->index_bits) {
        fprintf(stderr, "ivserve: error: --index-dtype applies to .h5ad output (a .npz holds "
                "int64 indptr and the engine's indices)\n");
        return 1;
    }
    if (*h5ad && (o->major_axis || o->by_var)) {
        fprintf(stderr, "ivserve: error: .h5ad output is CSR by cells; drop --genes-major "
                "and --by var\n");
        return 1;
    }
    return 0;
}

/* One query: both selections parsed and resolved (cli_export.h), then
 * exported to out.  Returns 0 or 1 (message printed). */
static int export_sel(const struct cli_opts *o, iv_dataset_t *ds, iv_pool_t *pool, iv_pick_t pick,
                      const char *obs_sel, const char *obs_where, const char *var_sel,
                      const char *var_where, const char *out, int h5ad)
{
    const iv_dataset_info_t *di = iv_dataset_info(ds);
    iv_psel_t obs, var;
    int rc = 1;
    if (iv_cli_select(o->file, o->group, IV_AXIS_OBS, obs_sel, obs_where, di->n_rows, &obs) < 0)
        return 1;
    if (iv_cli_select(o->file, o->group, IV_AXIS_VAR, var_sel, var_where, di->n_cols, &var) == 0) {
        iv_sel_t ov = iv_psel_view(&obs), vv = iv_psel_view(&var);
        rc = export_one(ds, pool, &ov, &vv, o->major_axis, pick, o->by_var, o->index_bits, out,
                        h5ad);
        iv_psel_free(&var);
    }
    iv_psel_free(&obs);
    return rc;
}

/* One line of a --batch list, OBS<TAB>VAR, exported to DIR/q<k>.npz. */
static int export_batch_line(const struct cli_opts *o, iv_dataset_t *ds, iv_pool_t *pool,
                             iv_pick_t pick, char *line, long k)
{
    char *tab = strchr(line, '\t');
    if (!tab) {
        fprintf(stderr, "ivserve: error: %s line %ld: expected OBS<TAB>VAR\n", o->batch, k + 1);
        return 1;
    }
    *tab = '\0';
    char path[4096];
    snprintf(path, sizeof path, "%s/q%ld.npz", o->out, k);
    if (out_is_input(o, path)) return 1;
    return export_sel(o, ds, pool, pick, line, NULL, tab + 1, NULL, path, 0);
}

static int export_batch(const struct cli_opts *o, iv_dataset_t *ds, iv_pool_t *pool,
                        iv_pick_t pick)
{
    FILE *f = fopen(o->batch, "r");
    if (!f) {
        fprintf(stderr, "ivserve: error: %s: %s\n", o->batch, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (long k = 0; rc == 0 && (len = getline(&line, &cap, f)) >= 0; k++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        rc = export_batch_line(o, ds, pool, pick, line, k);
    }
    free(line);
    fclose(f);
    return rc;
}

/* export: the output checked, the dataset opened (and its other
 * orientation, when asked for), then one query or a batch of them. */
static int cmd_export(const struct cli_opts *o, iv_pool_t *pool)
{
    if (!o->out) {
        fprintf(stderr, "ivserve: error: export needs -o OUT\n");
        return 2;
    }
    int h5ad;
    if (check_output(o, &h5ad) || (!o->batch && out_is_input(o, o->out))) return 1;
    if (h5ad) {
        /* The output copies obs and var: refuse what anndata cannot read. */
        iv_err_t verr = {0};
        if (iv_meta_validate_file(o->file, o->group, &verr) < 0) {
            fprintf(stderr, "ivserve: error: %s\n", verr.msg);
            return 1;
        }
    }
    iv_dataset_t *ds;
    if (open_dataset(o, pool, &ds) < 0) return 1;
    iv_pick_t pick;
    int rc = 1;
    if (export_orient(o, pool, ds, &pick) == 0)
        rc = o->batch ? export_batch(o, ds, pool, pick)
                      : export_sel(o, ds, pool, pick, o->obs, o->where, o->var, o->var_where,
                                   o->out, h5ad);
    iv_dataset_close(ds);
    return rc;
}

/* check and export, in the guarded child (see h5guard.h). */
struct guarded {
    int argc;
    char **argv;
    struct cli_opts *o;
};

static int run_check_export(void *arg)
{
    struct guarded *g = arg;
    iv_pool_t *pool = NULL;
    unsigned threads = g->o->threads;
    if (threads != 1) {
        pool = iv_pool_create(threads ? threads - 1 : 0, 0);
        if (!pool) {
            fprintf(stderr, "ivserve: error: cannot start worker threads\n");
            return 1;
        }
    }
    int rc = strcmp(g->argv[1], "check") == 0 ? cmd_check(g->o, pool) : cmd_export(g->o, pool);
    iv_pool_destroy(pool);
    return rc;
}

static int run_pack(void *arg)
{
    struct guarded *g = arg;
    return iv_cli_pack_main(g->argc, g->argv);
}

/* pack's input (its first operand), for the guard's message. */
static const char *pack_input(int argc, char **argv)
{
    static const char *const valued[] = {"--layout", "--matrix", "--group", "--codec",
                                         "--chunk-bytes", "--threads", "--memory-mb", "--progress-fd"};
    for (int i = 2; i < argc; i++) {
        int takes = 0;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) takes |= !strcmp(argv[i], valued[k]);
        if (takes) i++;
        else if (argv[i][0] != '-') return argv[i];
    }
    return "the input";
}

int iv_cli_main(int argc, char **argv)
{
    struct cli_opts o;
    if (argc < 2 || !iv_cli_is_command(argv[1])) return usage();
    struct guarded g = {argc, argv, &o};
    /* The commands that read HDF5 in this process run in a child, so that
     * a damaged input is an error message, never a signal (h5guard.h). */
    if (strcmp(argv[1], "pack") == 0) {
        /* Started by the server (autopack.h): end with the thread that
         * started it, so that a server killed outright leaves no pack. */
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--progress-fd")) {
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                if (getppid() == 1) return 128 + SIGTERM;
            }
        return iv_h5guard_run(pack_input(argc, argv), run_pack, &g);
    }
    if (strcmp(argv[1], "token-hash") == 0) return iv_cli_token_main(argc, argv);
    if (parse_opts(argc, argv, &o) < 0) return usage();
    return iv_h5guard_run(o.file ? o.file : "the input", run_check_export, &g);
}
