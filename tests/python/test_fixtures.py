"""The real fixture files through the real binary.

For every file of the fixtures' manifests: `ivserve check` succeeds and
reports the manifest's shape and nnz, `ivserve export` of everything equals
the expected canonical CSR, and random selections (single exports and one
batch) equal numpy indexing of the expected matrix.  Skips with a message
when the fixtures folder is absent.
"""

import json
import os
import re

import h5py
import numpy as np
import pytest

import ivref
from conftest import fixtures_path


def manifest_entries():
    root = fixtures_path()
    if root is None:
        return []
    out = []
    for sub in ("", "real"):
        mpath = os.path.join(root, sub, "manifest.json")
        if os.path.exists(mpath):
            with open(mpath) as fh:
                for entry in json.load(fh):
                    out.append((os.path.join(root, sub), entry))
    return out


ENTRIES = manifest_entries()
IDS = [e["file"] for _, e in ENTRIES]


def load_expected(folder, entry):
    with h5py.File(os.path.join(folder, entry["expected"]), "r") as f:
        shape = tuple(int(x) for x in f.attrs["shape"])
        return ivref.make_csr(f["data"][...], f["indices"][...], f["indptr"][...], shape)


def value_dtype(path, group="X"):
    # The dtype is in the dataset header, readable without the filter plugin.
    with h5py.File(path, "r") as f:
        return f[group]["values"].dtype


def test_fixtures_present(fixtures_dir):
    assert ENTRIES, "manifest.json lists no files in %s" % fixtures_dir


@pytest.mark.parametrize("folder,entry", ENTRIES, ids=IDS)
def test_check_reports_shape_and_nnz(ivserve, folder, entry):
    path = os.path.join(folder, entry["file"])
    proc = ivserve.check(path)
    ivserve.assert_ok(proc)
    out = proc.stdout
    n_rows, n_cols = entry["shape"]
    assert re.search(r"\b%d\s*(x|×|,)\s*%d\b" % (n_rows, n_cols), out), \
        "shape %dx%d not in: %s" % (n_rows, n_cols, out)
    assert re.search(r"nnz\D{0,8}\b%d\b" % entry["nnz"], out), \
        "nnz %d not in: %s" % (entry["nnz"], out)
    if "n_unique" in entry:
        assert re.search(r"\b%d\b" % entry["n_unique"], out), out


@pytest.mark.parametrize("folder,entry", ENTRIES, ids=IDS)
def test_export_all_equals_expected(ivserve, workdir, folder, entry):
    path = os.path.join(folder, entry["file"])
    exp = load_expected(folder, entry)
    assert exp.shape == tuple(entry["shape"]) and exp.nnz == entry["nnz"]
    out = os.path.join(workdir, "all.npz")
    ivserve.assert_ok(ivserve.export(path, out))
    err = ivref.compare_npz(out, exp, data_dtype=value_dtype(path))
    assert err is None, err


def random_selections(rng, n_rows, n_cols, count):
    """(obs, var) pairs in numpy form; None means all."""
    sels = [(None, None), ([], None), (None, []), ([0], None), ([n_rows - 1], [n_cols - 1])]
    while len(sels) < count:
        k = rng.integers(0, 4)
        if k == 0:
            obs = rng.integers(0, n_rows, rng.integers(1, min(n_rows, 40) + 1)).tolist()
        elif k == 1:
            a = int(rng.integers(0, n_rows))
            obs = list(range(a, int(rng.integers(a, n_rows + 1))))
        elif k == 2:
            obs = None
        else:
            obs = sorted(set(rng.integers(0, n_rows, 10).tolist()))
        j = rng.integers(0, 3)
        if j == 0:
            var = None
        elif j == 1:
            var = rng.integers(0, n_cols, rng.integers(1, min(n_cols, 60) + 1)).tolist()
        else:
            a = int(rng.integers(0, n_cols))
            var = list(range(a, min(n_cols, a + int(rng.integers(1, 500)))))
        sels.append((obs, var))
    return sels


@pytest.mark.parametrize("folder,entry", ENTRIES, ids=IDS)
def test_export_selections(ivserve, workdir, folder, entry):
    path = os.path.join(folder, entry["file"])
    exp_all = load_expected(folder, entry)
    vdt = value_dtype(path)
    n_rows, n_cols = entry["shape"]
    rng = np.random.default_rng(sum(map(ord, entry["file"])))
    sels = random_selections(rng, n_rows, n_cols, 40)
    # A few through single exports (threads and stride varied) ...
    for k, (obs, var) in enumerate(sels[:4]):
        out = os.path.join(workdir, "s%d.npz" % k)
        proc = ivserve.export(path, out, ivref.format_sel(obs), ivref.format_sel(var),
                              "--threads", 1 + k % 3, "--stride", 1 + 7 * k)
        ivserve.assert_ok(proc)
        err = ivref.compare_npz(out, ivref.expected(exp_all, obs, var), data_dtype=vdt)
        assert err is None, "obs=%r var=%r: %s" % (obs, var, err)
    # ... and all of them through one batch run.
    listing = os.path.join(workdir, "batch.tsv")
    with open(listing, "w") as fh:
        for obs, var in sels:
            fh.write("%s\t%s\n" % (ivref.batch_field(obs), ivref.batch_field(var)))
    outdir = os.path.join(workdir, "batch")
    os.makedirs(outdir)
    ivserve.assert_ok(ivserve.run("export", path, "--batch", listing, "-o", outdir))
    for k, (obs, var) in enumerate(sels):
        err = ivref.compare_npz(os.path.join(outdir, "q%d.npz" % k),
                                ivref.expected(exp_all, obs, var), data_dtype=vdt)
        assert err is None, "query %d obs=%r var=%r: %s" % (k, obs, var, err)


@pytest.mark.parametrize("folder,entry", ENTRIES, ids=IDS)
def test_reference_reader_agrees_where_it_can(folder, entry):
    # The pure-Python reader handles raw, gzip and zstd files (not Blosc2);
    # where it can, it must agree with the expected matrix.  This keeps the
    # reference honest against files written by the real libraries.
    codec = entry.get("codec", "blosc2")
    if codec not in ("raw", "gzip", "zstd"):
        pytest.skip("reference reader has no %s decoder" % codec)
    path = os.path.join(folder, entry["file"])
    got = ivref.read_iv(path)
    exp = load_expected(folder, entry)
    assert np.array_equal(got.indptr, exp.indptr)
    assert np.array_equal(got.indices, exp.indices)
    assert np.array_equal(got.data.astype(np.float64), exp.data)
