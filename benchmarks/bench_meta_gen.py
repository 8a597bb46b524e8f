#!/usr/bin/python3
"""Synthetic obs/var for the metadata benchmark: 1,260,000 cells, 20 obs columns.

Columns mix every kind the evaluator has loops for: categoricals of 8 to
20,000 categories (the last one is what `in` with 10,000 labels runs on),
int and float QC metrics (floats with NaN), bools, nullable integers and
booleans, and strings.  Written with anndata's element writer, without
compression, so start-up time measures this project's reader and not a
codec.

Usage: /usr/bin/python3 benchmarks/bench_meta_gen.py [--cells N] -o OUT.h5ad
"""

import argparse

import h5py
import numpy as np
import pandas as pd
from anndata.experimental import write_elem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=1_260_000)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    n = a.cells
    rng = np.random.default_rng(0)

    def cat(prefix, k, p_missing=0.0):
        codes = rng.integers(0, k, n)
        if p_missing:
            codes[rng.random(n) < p_missing] = -1
        return pd.Categorical.from_codes(codes, ["%s%d" % (prefix, i) for i in range(k)])

    ni = pd.array(rng.integers(0, 8, n), dtype="Int64")
    ni[rng.random(n) < 0.05] = None
    nb = pd.array(rng.random(n) < 0.5, dtype="boolean")
    nb[rng.random(n) < 0.05] = None
    pct = rng.gamma(2.0, 2.0, n)
    pct[rng.random(n) < 0.01] = np.nan
    obs = pd.DataFrame({
        "cell_type": cat("type", 30),
        "sample": cat("donor", 100),
        "condition": cat("cond", 2),
        "batch_cat": cat("batch", 8, 0.02),
        "clone": cat("clone", 20000, 0.1),
        "leiden": cat("", 40),
        "total_counts": rng.poisson(2000, n).astype(np.int64),
        "n_genes_by_counts": rng.poisson(800, n).astype(np.int32),
        "pct_counts_mt": pct,
        "pct_counts_ribo": rng.random(n).astype(np.float32) * 40,
        "doublet_score": rng.random(n),
        "umap_1": rng.normal(0, 5, n).astype(np.float32),
        "age": rng.integers(18, 90, n).astype(np.int16),
        "is_doublet": rng.random(n) < 0.05,
        "passed_qc": rng.random(n) < 0.9,
        "batch": ni,
        "is_primary": nb,
        "barcode_suffix": rng.choice(["-1", "-2", "-3", "-4"], n).astype(object),
        "donor_sex": rng.choice(["female", "male"], n).astype(object),
        "size_factor": rng.lognormal(0, 0.3, n),
    }, index=pd.Index(["cell%07d" % i for i in range(n)]))
    var = pd.DataFrame({"gene_ids": ["ENSG%011d" % i for i in range(33000)]},
                       index=["G%d" % i for i in range(33000)])
    with h5py.File(a.out, "w") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)


if __name__ == "__main__":
    main()
