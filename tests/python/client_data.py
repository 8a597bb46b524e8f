"""A small dataset with every metadata type the clients rebuild, shared by
test_client_py.py and test_client_r.py.

Written here rather than taken from the shared fixtures, whose metadata
has only string categories and 64-bit columns: this one adds integer and
float categories, an ordered categorical, a categorical with missing
values, nullable booleans and int32, int8 and float32 with NaN, and an
index with a name (ivref.write_iv for the packed matrix, anndata's
write_elem for obs and var).
"""
import warnings

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

import ivref


def make_types_dataset(path, n=120, g=30, seed=3):
    """Writes the dataset to path; returns (X as csr of float64, obs, var)
    as anndata reads them back."""
    from anndata.experimental import read_elem, write_elem
    rng = np.random.default_rng(seed)
    X = sp.random(n, g, density=0.2, format="csr", random_state=seed,
                  data_rvs=lambda k: rng.integers(1, 50, k)).astype(np.float64)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], n)),
        "cluster": pd.Categorical(rng.integers(0, 4, n)),
        "score_cat": pd.Categorical(rng.choice([0.5, 1.0, 2.25], n)),
        "grade": pd.Categorical(rng.choice(["low", "mid", "high"], n),
                                categories=["low", "mid", "high"], ordered=True),
        "maybe": pd.Categorical(rng.choice(["x", "y", None], n)),
        "flag": pd.array(rng.choice([True, False, None], n), dtype="boolean"),
        "count32": pd.array(np.where(rng.random(n) < 0.2, None, rng.integers(0, 100, n)), dtype="Int32"),
        "small": rng.integers(-5, 5, n).astype(np.int8),
        "f32": np.where(rng.random(n) < 0.1, np.nan, rng.random(n)).astype(np.float32),
    }, index=["cell%d" % i for i in range(n)])
    obs.index.name = "barcode"
    var = pd.DataFrame({"gene_ids": ["E%d" % i for i in range(g)],
                        "highly_variable": rng.random(g) < 0.3},
                       index=["g%d" % i for i in range(g)])
    ivref.write_iv(path, X, orientation="ivcsr", value_dtype="int32", obs=False, var=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with h5py.File(path, "a") as f:
            write_elem(f, "obs", obs)
            write_elem(f, "var", var)
        with h5py.File(path, "r") as f:
            return X, read_elem(f["obs"]), read_elem(f["var"])
