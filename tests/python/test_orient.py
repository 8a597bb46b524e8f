"""Both orientations through `ivserve export --orient cells|genes|auto`.

The file's own orientation and the other one (built in memory from the
decoded stream, or read from a companion file that holds the same matrix
the other way) must give byte-identical answers for every selection, asked
as cell rows (CSR) and as gene rows (`--by var`, written as the CSC of the
same result), and both must equal ivref.expected().  The random matrices
are those of test_export_diff.py (every dtype, NaN groups, explicit zeros,
shuffled groups, empty rows, 0-row and 0-nnz matrices); the shared
fixtures come in both orientations and serve as companions of each other.
"""

import json
import os

import numpy as np
import pytest

import ivref
from test_export_diff import CASES, build_case, group_args
from testscale import scaled

# Gene axes of millions make the copy as long as the gene axis; the
# differential cases below keep to axes a server would transpose.
ORIENT_CASES = sorted(n for n, c in CASES.items() if c[1] <= 200_000 and c[2] <= 200_000)
# Selections a case asks for: up to 60, at least 24 (the six fixed ones and
# random ones of every kind) under the sanitizers' IV_TEST_SCALE; each case
# still runs its six batches (three orientations, by obs and by var).
MOST_SELECTIONS, LEAST_SELECTIONS = 60, 24


def npz_bytes(path):
    z = ivref.load_npz_raw(path)
    return {k: (z[k].dtype.str, z[k].shape, z[k].tobytes()) for k in sorted(z)}


def csc_expected(X, obs, var):
    """expected() as gene rows: the CSC of X[obs][:, var]."""
    exp = ivref.expected(X, obs, var)
    return exp.tocsc(), exp


def compare_csc(path, exp_csr):
    z = ivref.load_npz_raw(path)
    fmt = z["format"].item()
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt != "csc":
        return "format %r" % fmt
    if tuple(int(x) for x in z["shape"]) != tuple(exp_csr.shape):
        return "shape %s != %s" % (tuple(z["shape"]), exp_csr.shape)
    # Gene rows of the result, built from the canonical CSR by a stable
    # sort on the column: cell positions ascending within each gene.
    coo_r = np.repeat(np.arange(exp_csr.shape[0]), np.diff(exp_csr.indptr))
    order = np.lexsort((coo_r, exp_csr.indices))
    indptr = np.zeros(exp_csr.shape[1] + 1, np.int64)
    np.cumsum(np.bincount(exp_csr.indices, minlength=exp_csr.shape[1]), out=indptr[1:])
    if not np.array_equal(z["indptr"], indptr):
        return "indptr differs"
    if not np.array_equal(z["indices"], coo_r[order]):
        return "indices differ"
    want = np.ascontiguousarray(exp_csr.data[order])
    if z["data"].dtype != want.dtype or z["data"].tobytes() != want.tobytes():
        return "data differs"
    return None


def run_batch(ivserve, path, group, sels, workdir, tag, *extra):
    listing = os.path.join(workdir, "batch_%s.tsv" % tag)
    with open(listing, "w") as fh:
        for obs, var in sels:
            fh.write("%s\t%s\n" % (ivref.batch_field(obs), ivref.batch_field(var)))
    outdir = os.path.join(workdir, "out_%s" % tag)
    os.makedirs(outdir)
    proc = ivserve.run("export", path, *group_args(group), "--batch", listing, "-o", outdir,
                       "--threads", 2, *extra)
    ivserve.assert_ok(proc)
    return outdir


@pytest.mark.parametrize("name", ORIENT_CASES)
def test_both_orientations_byte_identical(ivserve, workdir, name):
    rng, X, path, group, n_queries = build_case(workdir, name)
    sels = [(None, None), ([], []), ([], None), (None, []), (None, [0] if X.shape[1] else []),
            ([0] if X.shape[0] else [], None)]
    while len(sels) < scaled(min(n_queries, MOST_SELECTIONS), LEAST_SELECTIONS):
        sels.append((ivref.random_selection(rng, X.shape[0]),
                     ivref.random_selection(rng, X.shape[1])))
    for by in ("obs", "var"):
        outs = {o: run_batch(ivserve, path, group, sels, workdir, "%s_%s" % (o, by),
                             "--orient", o, "--by", by)
                for o in ("cells", "genes", "auto")}
        failures = []
        for k, (obs, var) in enumerate(sels):
            f = "q%d.npz" % k
            ref = npz_bytes(os.path.join(outs["cells"], f))
            for o in ("genes", "auto"):
                if npz_bytes(os.path.join(outs[o], f)) != ref:
                    failures.append("q%d by %s: %s differs from cells" % (k, by, o))
            if by == "obs":
                err = ivref.compare_npz(os.path.join(outs["cells"], f), ivref.expected(X, obs, var))
            else:
                err = compare_csc(os.path.join(outs["cells"], f), ivref.expected(X, obs, var))
            if err:
                failures.append("q%d by %s obs=%s var=%s: %s" % (
                    k, by, ivref.batch_field(obs)[:60], ivref.batch_field(var)[:60], err))
        assert not failures, "\n".join(failures[:10])


def fixture_pairs(fixtures_dir):
    with open(os.path.join(fixtures_dir, "manifest.json")) as fh:
        items = json.load(fh)
    by_exp = {}
    for it in items:
        by_exp.setdefault(it["expected"], {}).setdefault(it["orientation"], []).append(it)
    return [(e, o["ivcsr"][0], o["ivcsc"][0]) for e, o in sorted(by_exp.items())
            if "ivcsr" in o and "ivcsc" in o]


def read_expected(path):
    import h5py
    import scipy.sparse as sp
    with h5py.File(path, "r") as f:
        shape = tuple(int(x) for x in f.attrs["shape"])
        return sp.csr_matrix((f["data"][()], f["indices"][()], f["indptr"][()]), shape=shape)


def test_fixture_companions(ivserve, fixtures_dir, workdir):
    """Each fixture matrix stored both ways: either file serves with the
    other as its companion, and every answer equals the expected matrix
    whichever orientation serves it."""
    pairs = fixture_pairs(fixtures_dir)
    assert pairs, "the manifest lists no matrix in both orientations"
    rng = np.random.default_rng(7)
    for exp_rel, csr_it, csc_it in pairs:
        X = read_expected(os.path.join(fixtures_dir, exp_rel))
        csr = os.path.join(fixtures_dir, csr_it["file"])
        csc = os.path.join(fixtures_dir, csc_it["file"])
        sels = [(None, None), (None, [3 % X.shape[1]]), ([1 % X.shape[0]], None)]
        for _ in range(25):
            sels.append((ivref.random_selection(rng, X.shape[0]),
                         ivref.random_selection(rng, X.shape[1])))
        for main, comp in ((csr, csc), (csc, csr)):
            tag = os.path.basename(main)
            outs = {o: run_batch(ivserve, main, "X", sels, workdir, "%s_%s" % (tag, o),
                                 "--companion", comp, "--orient", o)
                    for o in ("cells", "genes")}
            for k, (obs, var) in enumerate(sels):
                f = "q%d.npz" % k
                a = os.path.join(outs["cells"], f)
                assert npz_bytes(a) == npz_bytes(os.path.join(outs["genes"], f)), (tag, k)
                err = ivref.compare_npz(a, ivref.expected(X, obs, var),
                                        data_dtype=ivref.load_npz_raw(a)["data"].dtype)
                assert err is None, "%s q%d: %s" % (tag, k, err)


def test_companion_of_another_matrix_is_refused(ivserve, fixtures_dir, workdir):
    pairs = fixture_pairs(fixtures_dir)
    assert len(pairs) >= 2
    a, b = pairs[0][1], pairs[1][2]   # one matrix's IVCSR, another's IVCSC
    path = os.path.join(fixtures_dir, a["file"])
    out = os.path.join(workdir, "x.npz")
    proc = ivserve.run("export", path, "--companion", os.path.join(fixtures_dir, b["file"]),
                       "--orient", "genes", "-o", out)
    assert proc.returncode == 1, proc.stderr
    assert "is not the other orientation" in proc.stderr, proc.stderr


def test_orient_flag_is_checked(ivserve, workdir):
    _, X, path, _, _ = build_case(workdir, "csr_raw_int32")
    out = os.path.join(workdir, "x.npz")
    proc = ivserve.run("export", path, "--orient", "sideways", "-o", out)
    assert proc.returncode == 2, proc.stderr
