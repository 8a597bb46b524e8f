"""The R client package (clients/R) against a real server, run from ctest.

Installs the package into a temporary library with `R CMD INSTALL`,
starts ivserve on fixture files, writes what the R tests compare with
(each dataset's expected matrix as Matrix Market, the obs / var tables as
anndata reads them, and the rows pandas selects for a few where filters),
then runs clients/R/tests/testthat with testthat.  A missing Rscript is a
failure, not a skip: scripts/setup.sh installs R and the packages.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.io
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RPKG = os.path.join(REPO, "clients", "R")
sys.path.insert(0, HERE)

from conftest import fixtures_path  # noqa: E402

FIX = fixtures_path()
if FIX is None:
    pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): skipping",
                allow_module_level=True)

from client_data import make_types_dataset  # noqa: E402
from test_http_server import Server  # noqa: E402

DATASETS = [
    ("tiny_r", "tiny.ivcsr.blosc2-lz4.h5ad", "expected/tiny.csr.h5", "expected/tiny.meta.h5ad"),
    ("tiny_c", "tiny.ivcsc.blosc2-lz4.h5ad", "expected/tiny.csr.h5", "expected/tiny.meta.h5ad"),
    ("floaty", "floaty.ivcsr.gzip.h5ad", "expected/floaty.csr.h5", "expected/floaty.meta.h5ad"),
    ("pbmc_small", "real/pbmc_small.ivcsr.h5ad", "real/expected/pbmc_small.csr.h5",
     "real/expected/pbmc_small.meta.h5ad"),
]
DATASETS = [d for d in DATASETS if os.path.exists(os.path.join(FIX, d[1]))]


def json_value(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def table(df):
    cols = []
    for name in df.columns:
        s = df[name]
        if isinstance(s.dtype, pd.CategoricalDtype):
            kind = "categorical"
            vals = [None if pd.isna(x) else str(x) for x in s]
            extra = {"categories": [str(c) for c in s.cat.categories], "ordered": bool(s.cat.ordered)}
        else:
            k = s.dtype.kind if hasattr(s.dtype, "kind") else "O"
            kind = {"i": "int", "u": "int", "f": "float", "b": "bool"}.get(k, "string")
            vals = [json_value(x) for x in s.astype(object)]
            extra = {}
        cols.append(dict(name=name, kind=kind, values=vals, **extra))
    return {"index": [str(x) for x in df.index], "columns": cols}


def where_rows(ds_id, obs, var):
    """(obs filters, var filters): where strings and the 1-based rows pandas selects."""
    rows = lambda m: (np.flatnonzero(np.asarray(m, dtype=bool)) + 1).tolist()  # noqa: E731
    if ds_id == "pbmc_small":
        return ([{"where": "groups == 'g1' and nCount_RNA > 100",
                  "rows": rows((obs.groups == "g1") & (obs.nCount_RNA > 100))}],
                [{"where": "`vst.variable`", "rows": rows(var["vst.variable"])}])
    if ds_id == "types":
        return ([{"where": "count32 >= 50 and grade == 'high'",
                  "rows": rows((obs.count32 >= 50).fillna(False).to_numpy(dtype=bool)
                               & (obs.grade == "high").to_numpy())},
                 {"where": "maybe is null", "rows": rows(obs.maybe.isna())}],
                [{"where": "highly_variable", "rows": rows(var.highly_variable)}])
    return ([{"where": "cell_type in ['B cell', 'NK cell']",
              "rows": rows(obs.cell_type.isin(["B cell", "NK cell"]))},
             {"where": "age >= 40 and not is_doublet", "rows": rows((obs.age >= 40) & ~obs.is_doublet)},
             {"where": "batch is null", "rows": rows(obs.batch.isna())}],
            [{"where": "highly_variable", "rows": rows(var.highly_variable)}])


def fixture_data(exp, meta):
    with h5py.File(os.path.join(FIX, exp), "r") as h:
        shape = tuple(int(x) for x in h.attrs["shape"])
        m = sp.csr_matrix((h["data"][:], h["indices"][:], h["indptr"][:]), shape=shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = anndata.read_h5ad(os.path.join(FIX, meta))
    return m, a.obs, a.var


def write_expected(folder, ds_id, m, obs, var):
    os.makedirs(folder)
    scipy.io.mmwrite(os.path.join(folder, "matrix.mtx"), m, precision=17)
    for axis, df in (("obs", obs), ("var", var)):
        with open(os.path.join(folder, axis + ".json"), "w") as f:
            json.dump(table(df), f)
    o, v = where_rows(ds_id, obs, var)
    with open(os.path.join(folder, "wheres.json"), "w") as f:
        json.dump({"obs": o, "var": v}, f)


def write_layered(path, folder):
    """test_layers.py's data (X, layers counts and log, raw/X with raw/var
    of more genes) as a served file, and what the R test compares with:
    X, layers/counts and raw/X as Matrix Market, obsm arrays X_umap and
    X_pca (added to the file here), the obs, var and raw/var
    names, the raw genes the filter `mt` keeps and the stored entries of a
    few rows of raw/X (explicit zeros included), and the obs / var columns."""
    import test_layers
    from anndata.experimental import write_elem
    d = test_layers.write_client_file(path)
    os.makedirs(folder)
    def coo(m):  # float64 and 17 digits: every stored value read back exactly
        m = sp.csr_matrix(m)
        r = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
        return sp.coo_matrix((m.data.astype(np.float64), (r, m.indices.astype(np.int64))),
                             shape=m.shape)

    scipy.io.mmwrite(os.path.join(folder, "X.mtx"), coo(d["X"]), precision=17)
    scipy.io.mmwrite(os.path.join(folder, "counts.mtx"), coo(d["counts"]), precision=17)
    scipy.io.mmwrite(os.path.join(folder, "raw.mtx"), coo(d["raw"]), precision=17)
    # obsm arrays for ivs_obsm(), as_sce() and as_seurat(): float32 and float64.
    rng = np.random.default_rng(29)
    obsm = {"X_umap": rng.standard_normal((len(d["obs"]), 2)).astype(np.float32),
            "X_pca": rng.standard_normal((len(d["obs"]), 5))}
    with h5py.File(path, "a") as f:
        for k, v in obsm.items():
            write_elem(f, "obsm/" + k, v)
    with open(os.path.join(folder, "obsm.json"), "w") as f:
        json.dump({k: v.astype(np.float64).tolist() for k, v in obsm.items()}, f)
    rows = [7, 3, 3, 100]
    raw = sp.csr_matrix(d["raw"])
    with open(os.path.join(folder, "names.json"), "w") as f:
        json.dump({"obs": list(d["obs"].index), "var": list(d["var"].index),
                   "raw_var": list(d["raw_var"].index),
                   "raw_mt": (np.flatnonzero(d["raw_var"]["mt"].to_numpy()) + 1).tolist(),
                   "rows": [r + 1 for r in rows],
                   "raw_rows_nnz": int(sum(raw.indptr[r + 1] - raw.indptr[r] for r in rows)),
                   "cell_type": [str(x) for x in d["obs"]["cell_type"]],
                   "cell_types": [str(x) for x in d["obs"]["cell_type"].cat.categories],
                   "age": d["obs"]["age"].tolist(), "hv": d["var"]["hv"].tolist()}, f)


def test_r_client(ivserve, tmp_path):
    rscript = shutil.which("Rscript")
    r = shutil.which("R")
    assert rscript and r, "R is not installed (scripts/setup.sh installs r-base-core)"
    lib = tmp_path / "rlib"
    lib.mkdir()
    # Install from a copy, so that nothing is written into the source tree.
    src = tmp_path / "ivserve"
    shutil.copytree(RPKG, src)
    proc = subprocess.run([r, "CMD", "INSTALL", "--no-multiarch", f"--library={lib}", str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp_dir = tmp_path / "expected"
    served = []
    for ds_id, f, exp, meta in DATASETS:
        write_expected(str(exp_dir / ds_id), ds_id, *fixture_data(exp, meta))
        served.append({"id": ds_id, "path": os.path.abspath(os.path.join(FIX, f))})
    # Every metadata type the client rebuilds (numeric and ordered factors, NA).
    path = str(tmp_path / "types.h5ad")
    write_expected(str(exp_dir / "types"), "types", *make_types_dataset(path))
    served.append({"id": "types", "path": path})
    # Layers and raw/X (matrix =): test_layers.py's file, checked by its own R test.
    path = str(tmp_path / "layered.h5ad")
    write_layered(path, str(exp_dir / "layered"))
    srv = Server(str(tmp_path), datasets=served + [{"id": "layered", "path": path}])
    try:
        env = dict(os.environ, IVS_URL=srv.url, IVS_EXPECTED=str(exp_dir),
                   IVS_DATASETS=",".join(d["id"] for d in served), IVS_LAYERED="layered",
                   R_LIBS=str(lib))
        code = ("library(testthat); library(ivserve); "
                "res <- as.data.frame(test_dir(commandArgs(TRUE)[1], reporter = 'summary', "
                "stop_on_failure = TRUE, load_package = 'none', env = new.env(parent = asNamespace('ivserve')))); "
                "cat('\\nR tests:', sum(res$nb), 'expectations,', sum(res$failed), 'failed,', "
                "sum(res$skipped), 'skipped\\n'); "
                "if (sum(res$failed) || any(res$error) || sum(res$skipped)) quit(status = 1)")
        proc = subprocess.run([rscript, "-e", code, os.path.join(RPKG, "tests", "testthat")],
                              capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
        out = proc.stdout + proc.stderr
        print(out[-4000:])
        assert proc.returncode == 0, out[-6000:]
        assert "0 failed, 0 skipped" in out
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
