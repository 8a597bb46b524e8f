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

static int parse_opts(int argc, char **argv, struct cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cache_mb = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(flag) (strcmp(a, flag) == 0 && v && (i++, 1))
        if (OPT("--group")) o->group = v;
        else if (OPT("--obs")) o->obs = v;
        else if (OPT("--var")) o->var = v;
        else if (OPT("-o") || OPT("--output")) o->out = v;
        else if (OPT("--batch")) o->batch = v;
        else if (OPT("--where")) o->where = v;
        else if (OPT("--var-where")) o->var_where = v;
        else if (OPT("--threads")) o->threads = (unsigned)strtoul(v, NULL, 10);
        else if (OPT("--stride")) o->stride = (uint32_t)strtoul(v, NULL, 10);
        else if (OPT("--cache-mb")) o->cache_mb = strtoll(v, NULL, 10);
        else if (strcmp(a, "--genes-major") == 0) o->major_axis = 1;
        else if (OPT("--orient")) o->orient = v;
        else if (OPT("--companion")) o->companion = v;
        else if (OPT("--by")) o->by_var = strcmp(v, "var") == 0 ? 1 : strcmp(v, "obs") == 0 ? 0 : -1;
        else if (OPT("--index-dtype"))
            o->index_bits = !strcmp(v, "int32") ? 32 : !strcmp(v, "int64") ? 64 : !strcmp(v, "auto") ? 0 : -1;
        else if (a[0] == '-' || o->file) {
            fprintf(stderr, "ivserve: unknown or incomplete argument '%s'\n", a);
            return -1;
        } else o->file = a;
#undef OPT
    }
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

/* Parses SEL into a new index list.  "*" means all (returns 1). */
static int parse_sel(const char *s, const char *axis, iv_sel_t *sel, int64_t **buf)
{
    *buf = NULL;
    memset(sel, 0, sizeof *sel);
    if (s == NULL || strcmp(s, "*") == 0) {
        sel->all = 1;
        return 0;
    }
    size_t cap = 16, n = 0;
    int64_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long a = strtoll(p, &end, 10);
        if (end == p || errno) goto bad;
        long long b = a + 1;
        if (*end == ':') {
            const char *q = end + 1;
            b = strtoll(q, &end, 10);
            if (end == q || errno) goto bad;
            if (b < a || a < 0) goto bad;
        }
        if (a < 0) {
            fprintf(stderr, "ivserve: error: %s index %lld is negative\n", axis, a);
            free(v);
            return -1;
        }
        for (long long x = a; x < b; x++) {
            if (n == cap) {
                int64_t *nv = realloc(v, (cap *= 2) * sizeof *v);
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
            }
            v[n++] = x;
        }
        if (*end == ',') p = end + 1;
        else if (*end == '\0') p = end;
        else goto bad;
    }
    sel->n = (int64_t)n;
    sel->idx = v;
    *buf = v;
    return 0;
bad:
    fprintf(stderr, "ivserve: error: bad %s selection '%s' (expected e.g. 5,3,3,10:20)\n", axis, s);
    free(v);
    return -1;
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
static int check_meta(const struct cli_opts *o, iv_dataset_t *ds)
{
    iv_meta_t *m = NULL;
    iv_err_t err = {0};
    if (iv_meta_load(o->file, o->group, &m, &err) != 0 ||
        iv_meta_add_computed(m, ds, &err) != 0) {
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
    int rc = check_meta(o, ds);
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

/* Runs one query and writes OUT.npz; returns 0 or 1 (error printed). */
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
    int rc = 1;
    if (iv_query_new(ds, obs, var, &qo, &q, &err) < 0 || iv_query_prepare(q, pool, &err) < 0)
        goto report;
    nb = iv_query_n_blocks(q);
    blocks = calloc((size_t)(nb ? nb : 1), sizeof *blocks);
    if (!blocks) {
        iv_fail(&err, IV_ENOMEM, "out of memory");
        goto report;
    }
    {
        /* Decode all blocks on the pool; the first error wins. */
        struct decode_job j = {q, blocks, calloc((size_t)(nb ? nb : 1), sizeof(int)),
               calloc((size_t)(nb ? nb : 1), sizeof(iv_err_t))};
        if (!j.rcs || !j.errs) {
            free(j.rcs);
            free(j.errs);
            iv_fail(&err, IV_ENOMEM, "out of memory");
            goto report;
        }
        iv_pool_parallel_for(pool, (size_t)nb, 0, decode_one, &j);
        for (int64_t b = 0; b < nb; b++)
            if (j.rcs[b] < 0) {
                iv_fail(&err, j.rcs[b], "%s", j.errs[b].msg);
                break;
            }
        free(j.rcs);
        free(j.errs);
        if (err.code) goto report;
    }
    {
        int64_t nr = iv_query_n_rows(q), nc = iv_query_n_cols(q), nnz = 0;
        int isz = iv_query_index_size(q);
        iv_dtype_t dt = iv_query_dtype(q);
        int64_t *indptr = malloc((size_t)(nr + 1) * sizeof *indptr);
        const void **ip = calloc((size_t)(nb ? nb : 1), sizeof *ip);
        const void **dp = calloc((size_t)(nb ? nb : 1), sizeof *dp);
        size_t *il = calloc((size_t)(nb ? nb : 1), sizeof *il);
        size_t *dl = calloc((size_t)(nb ? nb : 1), sizeof *dl);
        if (!indptr || !ip || !dp || !il || !dl) {
            free(indptr); free(ip); free(dp); free(il); free(dl);
            iv_fail(&err, IV_ENOMEM, "out of memory");
            goto report;
        }
        indptr[0] = 0;
        for (int64_t b = 0; b < nb; b++) {
            iv_block_t *bl = &blocks[b];
            for (int64_t r = 0; r < bl->n_rows; r++) indptr[bl->row0 + r + 1] = nnz + bl->indptr[r + 1];
            nnz += bl->nnz;
            ip[b] = bl->indices;
            il[b] = (size_t)bl->nnz * (size_t)isz;
            dp[b] = bl->data;
            dl[b] = (size_t)bl->nnz * iv_dtype_size(dt);
        }
        if (h5ad) {
            /* A standard AnnData file: CSR X plus the subset metadata. */
            const iv_dataset_info_t *di = iv_dataset_info(ds);
            int r = iv_cli_write_h5ad(di->path, out_path, nr, nc, di->n_rows, di->n_cols, indptr,
                                      nnz, (size_t)nb, ip, il, isz, dp, dl, dt, index_bits, obs, var,
                                      &err);
            free(indptr); free(ip); free(dp); free(il); free(dl);
            if (r < 0) goto report;
            rc = 0;
            goto report;
        }
        /* Written under a temporary name and renamed, as the .h5ad is:
         * OUT is the old file or the whole new one, never a part. */
        char tmp[4200];
        iv_pack_temp_name(out_path, tmp, sizeof tmp);
        iv_h5guard_temp(tmp);
        FILE *f = fopen(tmp, "wb");
        int werr = !f;
        if (f) {
            iv_npz_t *z = iv_npz_begin(f);
            int64_t shape[2] = {nr, nc}, n1[1];
            const void *pp[1];
            size_t pl[1];
            werr = !z;
            if (z) {
                n1[0] = nnz;
                werr |= iv_npz_add(z, "indices", isz == 4 ? "<i4" : "<i8", 1, n1, (size_t)nb, ip, il) != 0;
                n1[0] = nr + 1;
                pp[0] = indptr;
                pl[0] = (size_t)(nr + 1) * sizeof *indptr;
                werr |= iv_npz_add(z, "indptr", "<i8", 1, n1, 1, pp, pl) != 0;
                /* Gene rows are the CSC of the result (cells x genes). */
                int csc = by_var && !major_axis;
                if (csc) {
                    shape[0] = nc;
                    shape[1] = nr;
                }
                pp[0] = csc ? "csc" : "csr";
                pl[0] = 3;
                werr |= iv_npz_add(z, "format", "|S3", 0, NULL, 1, pp, pl) != 0;
                pp[0] = shape;
                pl[0] = sizeof shape;
                n1[0] = 2;
                werr |= iv_npz_add(z, "shape", "<i8", 1, n1, 1, pp, pl) != 0;
                n1[0] = nnz;
                werr |= iv_npz_add(z, "data", iv_dtype_descr(dt), 1, n1, (size_t)nb, dp, dl) != 0;
                werr |= iv_npz_finish(z) != 0;
            }
            werr |= fclose(f) != 0;
        }
        free(indptr); free(ip); free(dp); free(il); free(dl);
        int e = errno;
        if (!werr && rename(tmp, out_path) != 0) {
            werr = 1;
            e = errno;
        }
        if (werr) unlink(tmp);
        iv_h5guard_temp(NULL);
        if (werr) {
            iv_fail(&err, IV_EIO, "%s: cannot write: %s", out_path, strerror(e));
            goto report;
        }
    }
    rc = 0;
report:
    if (rc) fprintf(stderr, "ivserve: error: %s\n", err.msg[0] ? err.msg : "export failed");
    for (int64_t b = 0; b < nb && blocks; b++) iv_block_free(&blocks[b]);
    free(blocks);
    iv_query_free(q);
    return rc;
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

static int cmd_export(const struct cli_opts *o, iv_pool_t *pool)
{
    if (!o->out) {
        fprintf(stderr, "ivserve: error: export needs -o OUT\n");
        return 2;
    }
    /* The output format comes from the extension; anything else is an
     * error rather than a guess. */
    int h5ad = 0;
    if (o->batch && o->index_bits) {
        fprintf(stderr, "ivserve: error: --index-dtype applies to .h5ad output, not --batch\n");
        return 1;
    }
    if (!o->batch) {
        const char *dot = strrchr(o->out, '.'), *slash = strrchr(o->out, '/');
        if (dot && (!slash || dot > slash) && strcmp(dot, ".h5ad") == 0) h5ad = 1;
        else if (!dot || (slash && dot < slash) || strcmp(dot, ".npz") != 0) {
            fprintf(stderr, "ivserve: error: %s: unknown output extension (use .npz for "
                    "scipy.sparse.save_npz or .h5ad for AnnData)\n", o->out);
            return 1;
        }
        if (!h5ad && o->index_bits) {
            fprintf(stderr, "ivserve: error: --index-dtype applies to .h5ad output (a .npz holds "
                    "int64 indptr and the engine's indices)\n");
            return 1;
        }
        if (h5ad && (o->major_axis || o->by_var)) {
            fprintf(stderr, "ivserve: error: .h5ad output is CSR by cells; drop --genes-major "
                    "and --by var\n");
            return 1;
        }
    }
    if (!o->batch && out_is_input(o, o->out)) return 1;
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
    if (export_orient(o, pool, ds, &pick) < 0) {
        iv_dataset_close(ds);
        return 1;
    }
    int rc = 0;
    if (!o->batch) {
        iv_sel_t obs, var;
        int64_t *ob = NULL, *vb = NULL;
        if (iv_cli_select(o->file, o->group, IV_AXIS_OBS, o->obs, o->where, &obs, &ob) < 0 ||
            iv_cli_select(o->file, o->group, IV_AXIS_VAR, o->var, o->var_where, &var, &vb) < 0)
            rc = 1;
        else rc = export_one(ds, pool, &obs, &var, o->major_axis, pick, o->by_var, o->index_bits,
                             o->out, h5ad);
        free(ob);
        free(vb);
    } else {
        FILE *f = fopen(o->batch, "r");
        if (!f) {
            fprintf(stderr, "ivserve: error: %s: %s\n", o->batch, strerror(errno));
            iv_dataset_close(ds);
            return 1;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        long k = 0;
        while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            char *tab = strchr(line, '\t');
            if (!tab) {
                fprintf(stderr, "ivserve: error: %s line %ld: expected OBS<TAB>VAR\n", o->batch, k + 1);
                rc = 1;
                break;
            }
            *tab = '\0';
            char path[4096];
            snprintf(path, sizeof path, "%s/q%ld.npz", o->out, k);
            iv_sel_t obs, var;
            int64_t *ob = NULL, *vb = NULL;
            if (out_is_input(o, path) || parse_sel(line, "obs", &obs, &ob) < 0 ||
                parse_sel(tab + 1, "var", &var, &vb) < 0)
                rc = 1;
            else rc = export_one(ds, pool, &obs, &var, o->major_axis, pick, o->by_var, o->index_bits,
                                 path, 0);
            free(ob);
            free(vb);
            k++;
        }
        free(line);
        fclose(f);
    }
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
