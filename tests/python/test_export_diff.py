"""Differential tests: `ivserve export` against the Python reference.

Seeded random matrices are written with ivref.write_iv in every variant the
format allows (orientation, no/gzip/zstd compression, chunks smaller and
larger than a row, 1- to 5-byte varints, empty rows, 0-row and 0-nnz
matrices, a single row or gene, every value dtype with negatives, NaN
groups, explicit zeros, shuffled group order, narrow pointer dtypes, a group
other than X).  Thousands of random selections go through batch mode (one
process, one index build per file) and a few through single exports with
different thread counts and index strides; every result must equal
ivref.expected() byte for byte: dtypes, indptr, indices and data including
NaN positions.
"""

import os

import numpy as np
import pytest

import ivref
from testscale import scaled

# name: (seed, n_rows, n_cols, nnz, value dtype, write_iv options, generator
# options, number of batch queries)
CASES = {
    "csr_raw_int32": (1, 200, 300, 6000, np.int32, {}, {}, 200),
    "csr_zstd_tiny_chunks": (2, 150, 400, 9000, np.int32,
                             dict(compression="zstd", chunk_len=16, ptr_chunk_len=7), {}, 200),
    "csr_zstd_huge_chunk_uint16": (3, 120, 500, 5000, np.uint16,
                                   dict(compression="zstd", chunk_len=1 << 20), {}, 150),
    "csr_gzip_float32_nan": (4, 100, 250, 4000, np.float32,
                             dict(compression="gzip", chunk_len=64),
                             dict(nan_frac=0.05, zero_frac=0.05), 200),
    "csc_raw_int32": (5, 180, 220, 5000, np.int32, dict(orientation="ivcsc"), {}, 200),
    "csc_zstd_float64_nan": (6, 160, 140, 4000, np.float64,
                             dict(orientation="ivcsc", compression="zstd", chunk_len=32),
                             dict(nan_frac=0.08, zero_frac=0.03), 200),
    "csc_gzip_int8": (7, 90, 300, 3000, np.int8,
                      dict(orientation="ivcsc", compression="gzip", chunk_len=100), {}, 150),
    "csr_shuffled_int64_zstd": (8, 140, 260, 5000, np.int64,
                                dict(compression="zstd", chunk_len=200, shuffle_groups=True),
                                {}, 150),
    "csc_shuffled_uint8": (9, 130, 170, 4000, np.uint8,
                           dict(orientation="ivcsc", shuffle_groups=True), {}, 150),
    "csr_uint32_ptr_int32": (10, 100, 200, 3000, np.uint32, dict(ptr_dtype=np.int32), {}, 100),
    "csr_uint64_ptr_uint32_gzip": (11, 100, 200, 3000, np.uint64,
                                   dict(ptr_dtype=np.uint32, compression="gzip", chunk_len=50),
                                   {}, 100),
    "csc_int16_ptr_uint64": (12, 80, 120, 2000, np.int16,
                             dict(orientation="ivcsc", ptr_dtype=np.uint64), {}, 100),
    "csr_explicit_zeros": (13, 60, 80, 1500, np.float32, {}, dict(zero_frac=0.4), 100),
    "csr_empty_rows_zstd": (14, 300, 60, 400, np.int32, dict(compression="zstd", chunk_len=8),
                            dict(empty_row_frac=0.6), 150),
    "csc_empty_genes": (15, 60, 300, 400, np.int32, dict(orientation="ivcsc"),
                        dict(empty_row_frac=0.5), 100),
    "csr_3byte_zstd": (16, 40, 2_000_000, 3000, np.int32, dict(compression="zstd", chunk_len=512),
                       {}, 120),
    # Huge gene axes with few entries: a gene selection must not cost time
    # or memory in the number of genes.
    "csr_4byte": (17, 30, 60_000_000, 200, np.int32, {}, {}, 80),
    "csr_5byte_zstd": (18, 12, 2**29 + 12345, 40, np.int32, dict(compression="zstd", chunk_len=9),
                       {}, 60),
    "csc_3byte_cells": (19, 2_000_000, 25, 2000, np.int32, dict(orientation="ivcsc"), {}, 30),
    "zero_rows": (20, 0, 50, 0, np.int32, {}, {}, 20),
    "zero_rows_csc_zstd": (21, 0, 40, 0, np.float32,
                           dict(orientation="ivcsc", compression="zstd", chunk_len=4), {}, 20),
    "zero_nnz": (22, 40, 50, 0, np.int32, dict(compression="zstd", chunk_len=16), {}, 40),
    "zero_nnz_csc": (23, 40, 50, 0, np.float64, dict(orientation="ivcsc"), {}, 40),
    "single_row": (24, 1, 2000, 900, np.float32, dict(compression="gzip", chunk_len=100),
                   dict(nan_frac=0.02), 60),
    "single_gene": (25, 2000, 1, 700, np.int32, {}, {}, 60),
    "single_gene_csc": (26, 2000, 1, 700, np.int16, dict(orientation="ivcsc"), {}, 60),
    "single_cell_csc": (27, 1, 500, 300, np.uint16, dict(orientation="ivcsc"), {}, 40),
    "dense_rows_group_counts": (28, 50, 64, 3200, np.uint8, dict(group="counts"), {}, 80),
}


# Multiplies every case's query count (about 3,000 queries at 1); the run
# stays well under a minute on two cores at 2.  Under the sanitizers
# (IV_TEST_SCALE < 1) a case runs fewer queries, at least LEAST_QUERIES
# (the four fixed ones and random ones of ivref.random_selection's nine
# kinds on each axis); every case keeps its file's variant (orientation,
# compression, chunking, varint lengths, dtypes, pointer dtypes) and the
# single exports all run.  At IV_TEST_SCALE=0.25 the ASan run takes 61 s
# of CPU instead of 78 (docs/ci.md).
QUERY_FACTOR = 2
LEAST_QUERIES = 40

VARINT_BYTES = {"csr_3byte_zstd": 3, "csr_4byte": 4, "csr_5byte_zstd": 5, "csc_3byte_cells": 3}


def build_case(workdir, name):
    seed, n_rows, n_cols, nnz, dtype, wopts, gopts, n_queries = CASES[name]
    rng = np.random.default_rng(seed)
    X = ivref.random_csr(rng, n_rows, n_cols, nnz, dtype, **gopts)
    path = os.path.join(workdir, name + ".h5ad")
    enc = ivref.write_iv(path, X, rng=seed, **wopts)
    if name in VARINT_BYTES:  # the case holds the varint length it is named for
        lens = ivref.varint_lengths(ivref.decode_varints(enc["packed"]))
        assert lens.max() == VARINT_BYTES[name], (name, lens.max())
    return rng, X, path, wopts.get("group", "X"), n_queries


def group_args(group):
    return [] if group == "X" else ["--group", group]


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_against_reference(ivserve, workdir, name):
    rng, X, path, group, n_queries = build_case(workdir, name)
    # The writer must have produced what it claims before the engine is
    # blamed for a difference.
    if X.shape[0] * X.shape[1] <= 10_000_000 or X.shape[0] < 100:
        got = ivref.read_iv(path, group)
        assert np.array_equal(got.indices, X.indices) and np.array_equal(got.indptr, X.indptr)
    sels = [(None, None), ([], []), ([], None), (None, [])]
    while len(sels) < scaled(n_queries * QUERY_FACTOR, LEAST_QUERIES):
        sels.append((ivref.random_selection(rng, X.shape[0]),
                     ivref.random_selection(rng, X.shape[1])))
    listing = os.path.join(workdir, "batch.tsv")
    with open(listing, "w") as fh:
        for obs, var in sels:
            fh.write("%s\t%s\n" % (ivref.batch_field(obs), ivref.batch_field(var)))
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir)
    proc = ivserve.run("export", path, *group_args(group), "--batch", listing, "-o", outdir)
    ivserve.assert_ok(proc)
    produced = sorted(os.listdir(outdir))
    assert produced == sorted("q%d.npz" % k for k in range(len(sels))), produced[:10]
    failures = []
    for k, (obs, var) in enumerate(sels):
        err = ivref.compare_npz(os.path.join(outdir, "q%d.npz" % k), ivref.expected(X, obs, var))
        if err:
            failures.append("q%d obs=%s var=%s: %s" % (k, ivref.batch_field(obs)[:80],
                                                        ivref.batch_field(var)[:80], err))
    assert not failures, "%d of %d queries differ:\n%s" % (len(failures), len(sels),
                                                           "\n".join(failures[:10]))


SINGLE = ["csr_zstd_tiny_chunks", "csc_zstd_float64_nan", "csr_shuffled_int64_zstd",
          "csr_empty_rows_zstd", "csr_gzip_float32_nan"]


@pytest.mark.parametrize("name", SINGLE)
def test_single_export_threads_and_stride(ivserve, workdir, name):
    """Thread count and index stride must not change a single byte."""
    rng, X, path, group, _ = build_case(workdir, name)
    n_rows, n_cols = X.shape
    queries = [(None, None),
               (rng.integers(0, n_rows, 50).tolist(), None),
               (list(range(n_rows - 1, -1, -2)), rng.integers(0, n_cols, 30).tolist())]
    for q, (obs, var) in enumerate(queries):
        exp = ivref.expected(X, obs, var)
        for threads, stride, cache in ((1, 1, None), (4, 1, None), (1, 3, 1), (4, 64, 1),
                                       (2, 1000, None)):
            out = os.path.join(workdir, "q%d_t%d_s%d.npz" % (q, threads, stride))
            extra = group_args(group) + ["--threads", threads, "--stride", stride]
            if cache is not None:
                extra += ["--cache-mb", cache]
            proc = ivserve.export(path, out, ivref.format_sel(obs), ivref.format_sel(var), *extra)
            ivserve.assert_ok(proc)
            err = ivref.compare_npz(out, exp)
            assert err is None, "query %d threads %d stride %d: %s" % (q, threads, stride, err)


@pytest.mark.parametrize("axis", ["--obs", "--var"])
def test_out_of_range_selection_is_an_error(ivserve, workdir, axis):
    _, X, path, _, _ = build_case(workdir, "csr_raw_int32")
    n = X.shape[0] if axis == "--obs" else X.shape[1]
    for sel in (str(n), "0,%d" % (n + 5), "%d:%d" % (n - 2, n + 1), "-1"):
        out = os.path.join(workdir, "bad.npz")
        proc = ivserve.run("export", path, axis, sel, "-o", out)
        assert proc.returncode == 1, "sel %s: exit %d %s" % (sel, proc.returncode, proc.stderr)
        assert "ivserve: error:" in proc.stderr
    # The last valid index is fine.
    out = os.path.join(workdir, "edge.npz")
    ivserve.assert_ok(ivserve.run("export", path, axis, str(n - 1), "-o", out))
    obs, var = ([n - 1], None) if axis == "--obs" else (None, [n - 1])
    assert ivref.compare_npz(out, ivref.expected(X, obs, var)) is None


def test_selection_syntax_examples(ivserve, workdir):
    """The contract's own example `5,3,3,10:20` and the empty selection."""
    _, X, path, _, _ = build_case(workdir, "csr_raw_int32")
    cases = [("5,3,3,10:20", "7,7,0:3,299"), ("", None), (None, ""), ("0:0", "4")]
    for k, (obs, var) in enumerate(cases):
        out = os.path.join(workdir, "syn%d.npz" % k)
        ivserve.assert_ok(ivserve.export(path, out, obs, var))

        def parse(text):
            if text is None:
                return None
            sel = []
            for part in filter(None, text.split(",")):
                if ":" in part:
                    a, b = part.split(":")
                    sel += list(range(int(a), int(b)))
                else:
                    sel.append(int(part))
            return sel
        err = ivref.compare_npz(out, ivref.expected(X, parse(obs), parse(var)))
        assert err is None, "obs=%r var=%r: %s" % (obs, var, err)


def test_rows_with_many_distinct_values_next_to_dense_rows(ivserve, workdir):
    """Rows with more value groups than the dense path takes (256) mixed
    with rows that take it, in one block and one worker: both paths share
    the worker's buffers (normalized float data looks like this)."""
    import scipy.sparse as sp
    rng = np.random.default_rng(31)
    n_cols = 2000
    rows = []
    for r in range(6):
        n = 600 if r % 2 else 100
        cols = np.sort(rng.choice(n_cols, n, replace=False))
        vals = (rng.permutation(n) + 0.5 if r % 2 else rng.integers(1, 6, n)).astype(np.float32)
        rows.append((cols, vals))
    indptr = np.cumsum([0] + [len(c) for c, _ in rows])
    X = sp.csr_matrix((np.concatenate([v for _, v in rows]), np.concatenate([c for c, _ in rows]),
                       indptr), shape=(len(rows), n_cols))
    path = os.path.join(workdir, "many_groups.h5ad")
    ivref.write_iv(path, X, compression="zstd", chunk_len=256)
    for obs, var in ((None, None), ([1, 0, 1, 2, 5, 4, 3], None), (None, [7, 3, 3, 1999])):
        for threads in (1, 2):
            out = os.path.join(workdir, "many_groups.npz")
            ivserve.assert_ok(ivserve.export(path, out, ivref.format_sel(obs), ivref.format_sel(var),
                                             "--threads", threads))
            err = ivref.compare_npz(out, ivref.expected(X, obs, var))
            assert err is None, "obs=%r var=%r threads %d: %s" % (obs, var, threads, err)


def test_every_slice_through_its_checkpoint(ivserve, workdir):
    """Rows asked for in reverse order make every row a seek to its
    checkpoint.  With chunks of 1 to 3 bytes and 2- and 3-byte varints,
    many slices start with a varint split across chunks, whose checkpoint
    must point into the earlier chunk; with a third of the rows empty,
    several checkpoints share that varint's rank."""
    rng = np.random.default_rng(47)
    for chunk_len in (1, 2, 3):
        X = ivref.random_csr(rng, 240, 300_000, 5000, dtype=np.int32, empty_row_frac=0.33)
        path = os.path.join(workdir, "split_%d.h5ad" % chunk_len)
        ivref.write_iv(path, X, compression="zstd", chunk_len=chunk_len)
        obs = list(range(X.shape[0] - 1, -1, -1))
        for stride in (1, 3):
            out = os.path.join(workdir, "split.npz")
            ivserve.assert_ok(ivserve.export(path, out, ivref.format_sel(obs), None,
                                             "--threads", 2, "--stride", stride))
            err = ivref.compare_npz(out, ivref.expected(X, obs))
            assert err is None, "chunk_len %d stride %d: %s" % (chunk_len, stride, err)


def test_empty_value_groups_anywhere(ivserve, workdir):
    """FORMAT lets value_ptr repeat an entry: a value group with no
    varints.  Empty groups inserted at random places (slice starts, right
    after a group that closes on a chunk's first byte, at checkpoints)
    change nothing in any result, whatever the chunk size and stride."""
    rng = np.random.default_rng(53)
    X = ivref.random_csr(rng, 120, 20000, 3000, dtype=np.int32)
    enc = ivref.pack(X)
    mp, values, vp = enc["major_ptr"].copy(), enc["values"].copy(), enc["value_ptr"].copy()
    for k in sorted(rng.choice(vp.size - 1, 80, replace=False), reverse=True):
        # A new empty group before group k, in the slice that holds group k.
        values = np.insert(values, k, values.dtype.type(7777))
        vp = np.insert(vp, k, vp[k])
        mp = np.where(mp > k, mp + 1, mp)
    obs = list(range(X.shape[0] - 1, -1, -1))
    for chunk_len in (1, 3, 64):
        path = os.path.join(workdir, "empty_groups_%d.h5ad" % chunk_len)
        ivref.write_iv(path, X, compression="zstd", chunk_len=chunk_len, major_ptr=mp,
                       values=values, value_ptr=vp)
        for sel, stride in ((None, 16), (obs, 1), (obs, 3)):
            out = os.path.join(workdir, "empty_groups.npz")
            ivserve.assert_ok(ivserve.export(path, out, ivref.format_sel(sel), None,
                                             "--threads", 2, "--stride", stride))
            err = ivref.compare_npz(out, ivref.expected(X, sel))
            assert err is None, "chunk_len %d stride %d: %s" % (chunk_len, stride, err)
