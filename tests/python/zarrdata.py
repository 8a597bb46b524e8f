"""Datasets and a server for the Zarr store tests (test_zarr.py,
test_zarr_clients.py): packed matrices in both orientations with obs and
var frames holding every column kind anndata 0.8 writes (categorical,
string, int, float, bool, nullable integer and boolean) and obsm/varm
arrays, written with ivref (matrix), anndata's write_elem (frames) and
h5py (arrays)."""
import os
import sys
import time

import h5py
import numpy as np
import pandas as pd
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from anndata.experimental import write_elem  # noqa: E402

import ivref  # noqa: E402
from ivprocess import ServerProcess, write_config  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN", os.path.join(HERE, "..", "..", "build", "ivserve"))
TYPES = ["B cell", "T cell", "NK cell", "monocyte", "unused"]


def make_data(seed, n_obs, n_var, dtype, density=0.15):
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_var, density=density, format="csr", random_state=seed,
                  data_rvs=lambda n: rng.integers(1, 50, n)).astype(np.float64)
    if dtype == "float32":
        X.data = (X.data * rng.random(X.data.shape[0]) - 3.0).astype(np.float32).astype(np.float64)
    X.data[::97] = 0.0  # explicit stored zeros are entries too
    X = X.astype(dtype)
    nint = pd.array(rng.integers(0, 9, n_obs), dtype="Int64")
    nint[::7] = pd.NA
    nbool = pd.array(rng.random(n_obs) < 0.5, dtype="boolean")
    nbool[::5] = pd.NA
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(TYPES[:4], n_obs), categories=TYPES),
        "batch": pd.Categorical(rng.choice(["b1", "b2", "b3"], n_obs)),
        "age": rng.integers(20, 80, n_obs),
        "score": rng.standard_normal(n_obs).astype(np.float32),
        "qc_pass": rng.random(n_obs) < 0.8,
        "donor": np.array(["donor%d" % i for i in rng.integers(0, 40, n_obs)], dtype=object),
        "n_int": nint,
        "n_bool": nbool,
    }, index=["cell%d" % i for i in range(n_obs)])
    obs.loc[obs.index[5], "batch"] = np.nan
    obs.loc[obs.index[3], "score"] = np.nan
    var = pd.DataFrame({
        "gene_ids": np.array(["ENSG%05d" % (i * 7) for i in range(n_var)], dtype=object),
        "highly_variable": rng.random(n_var) < 0.3,
        "means": rng.random(n_var),
    }, index=["GENE%04d" % i for i in range(n_var)])
    obsm = {"X_umap": rng.standard_normal((n_obs, 2)).astype(np.float32),
            "X_pca": rng.standard_normal((n_obs, 5))}
    varm = {"PCs": rng.standard_normal((n_var, 3))}
    return X, obs, var, obsm, varm


def write_dataset(path, X, obs, var, obsm, varm, orientation):
    ivref.write_iv(path, sp.csr_matrix(X), orientation=orientation, value_dtype=X.dtype,
                   obs=False, var=False)
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        for name, arrays in (("obsm", obsm), ("varm", varm)):
            g = f.create_group(name)
            g.attrs["encoding-type"] = "dict"
            g.attrs["encoding-version"] = "0.1.0"
            for k, v in arrays.items():
                g.create_dataset(k, data=v)


class Server(ServerProcess):
    def __init__(self, tmp, datasets, cfg_extra=None, extra_args=()):
        cfg = {"datasets": datasets}
        cfg.update(cfg_extra or {})
        super().__init__(tmp, ["--config", write_config(tmp, cfg), "--threads", "2", *extra_args],
                         binary=BIN)


def wait_both(url, ids, headers=None, timeout=60):
    """Waits until each dataset's other orientation is ready (X's chunks
    answer 503 until then)."""
    deadline = time.time() + timeout
    for d in ids:
        while True:
            doc = requests.get("%s/v1/datasets/%s" % (url, d), headers=headers).json()
            other = "genes" if doc["orientation"] == "ivcsr" else "cells"
            if doc["orientations"][other]["state"] == "ready":
                break
            assert time.time() < deadline, doc
            time.sleep(0.05)


def wait_kept(url, ids, headers=None, timeout=60, want=("csr", "csc")):
    """Waits until X's Zarr chunks of each dataset are kept in the cache
    folder (api/zarr_kept.h) for the orientations in want, and returns
    the documents' zarr_kept members."""
    deadline = time.time() + timeout
    out = {}
    for d in ids:
        while True:
            kept = requests.get("%s/v1/datasets/%s" % (url, d), headers=headers).json()["zarr_kept"]
            if all(kept[o] for o in want):
                out[d] = kept
                break
            assert time.time() < deadline, kept
            time.sleep(0.05)
    return out


def uns_entries():
    """uns as anndata 0.8 writes it: what the store serves (scalars, 1-D
    numeric and string arrays, nested dicts of those) and what it leaves
    out (a data frame, a 2-D array); the served part comes first."""
    served = {
        "title": "a test", "unicode": "na\u00efve \u2713", "empty": "",
        "n_pcs": 7, "ratio": 0.25, "flag": True, "small": np.float32(1.5),
        "ids": np.arange(4, dtype=np.int32), "weights": np.array([0.5, -1.0, 2.25]),
        "uint": np.array([1, 2, 300], dtype=np.uint16),
        "mask": np.array([True, False, True]),
        "names": np.array(["a", "b\u00e9ta", "", "c"], dtype=object),
        "neighbors": {"params": {"n_neighbors": 15, "method": "umap", "use_rep": "X_pca"},
                      "connectivities_key": "connectivities"},
        "cell_type_colors": np.array(["#1f77b4", "#ff7f0e", "#279e68"], dtype=object),
    }
    skipped = {"frame": pd.DataFrame({"a": [1, 2]}, index=["x", "y"]),
               "grid": np.arange(6.0).reshape(2, 3)}
    return served, skipped


def write_matrices(path, seed, n_obs, n_var, n_raw):
    """An .h5ad with X (IVCSR int32), obs and var as make_data's, layers
    `counts` (IVCSR int32) and `scaled` (IVCSC float32), raw/X (IVCSC
    float32, n_raw genes) with raw/var, and uns (uns_entries()).  Returns
    (X, obs, var, {layer: matrix}, raw X, raw var)."""
    X, obs, var, obsm, varm = make_data(seed, n_obs, n_var, "int32")
    rng = np.random.default_rng(seed + 100)
    counts = make_data(seed + 1, n_obs, n_var, "int32", density=0.1)[0]
    scaled = make_data(seed + 2, n_obs, n_var, "float32", density=0.12)[0]
    raw = make_data(seed + 3, n_obs, n_raw, "float32", density=0.1)[0]
    raw_var = pd.DataFrame({
        "mt": np.arange(n_raw) % 3 == 0,
        "kind": pd.Categorical(rng.choice(["coding", "lnc"], n_raw)),
    }, index=["RGENE%04d" % i for i in range(n_raw)])
    ivref.write_with_layers(path, sp.csr_matrix(X), "ivcsr", obs=False, var=False,
                            value_dtype=X.dtype,
                            layers={"counts": (sp.csr_matrix(counts), "ivcsr", np.int32),
                                    "scaled": (sp.csr_matrix(scaled), "ivcsc", np.float32)},
                            raw=(sp.csr_matrix(raw), "ivcsc", np.float32))
    served, skipped = uns_entries()
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        write_elem(f, "raw/var", raw_var)
        write_elem(f, "uns", dict(served, **skipped))
    return X, obs, var, {"counts": counts, "scaled": scaled}, raw, raw_var
