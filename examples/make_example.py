#!/usr/bin/python3
"""Writes examples/pbmc_example.h5ad: a small, realistic IVCSR example.

2,000 synthetic PBMCs x 1,500 genes (~100-200 stored counts per cell, counts
mostly 1-3), eight cell types with their textbook marker genes (CD3E, MS4A1,
NKG7, LYZ, ...), six samples from two conditions.  obs and var are written by
anndata itself (categoricals, string arrays, bools, ints, floats) so any
anndata reader understands them; the X group is then added in the IVCSR
layout by the project's Python reference writer (tests/python/ivref.py),
with zstd chunks (filter 32015) so that no Blosc2 plugin is needed.

Deterministic: the same seed gives the same bytes of every array.

Usage: /usr/bin/python3 examples/make_example.py [OUT.h5ad]
"""

import os
import sys

import h5py
import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import ivref  # noqa: E402

SEED = 20240611
N_CELLS, N_GENES = 2000, 1500

# Cell types, their share of the cells and marker genes (boosted in them).
CELL_TYPES = {
    "CD4 T": (0.30, ["CD3E", "CD3D", "IL7R", "CD4", "LTB"]),
    "CD8 T": (0.15, ["CD3E", "CD3D", "CD8A", "CD8B", "GZMK"]),
    "NK": (0.08, ["NKG7", "GNLY", "KLRD1", "PRF1", "GZMB"]),
    "B": (0.12, ["MS4A1", "CD79A", "CD79B", "CD19", "BANK1"]),
    "CD14 Mono": (0.18, ["LYZ", "CD14", "S100A8", "S100A9", "FCN1"]),
    "FCGR3A Mono": (0.08, ["FCGR3A", "MS4A7", "LST1", "AIF1", "IFITM3"]),
    "DC": (0.05, ["FCER1A", "CST3", "CLEC10A", "CD1C", "HLA-DQA1"]),
    "Platelet": (0.04, ["PPBP", "PF4", "GP9", "ITGA2B", "TUBB1"]),
}
HOUSEKEEPING = ["ACTB", "B2M", "MALAT1", "TMSB4X", "EEF1A1", "RPL13", "RPS27", "FTL", "FTH1",
                "GAPDH"]
MITO = ["MT-CO1", "MT-CO2", "MT-CO3", "MT-ND1", "MT-ND4", "MT-ATP6", "MT-CYB"]
SAMPLES = [("S1", "healthy"), ("S2", "healthy"), ("S3", "healthy"),
           ("S4", "SLE"), ("S5", "SLE"), ("S6", "SLE")]


def gene_names():
    named = []
    for _, markers in CELL_TYPES.values():
        named += [g for g in markers if g not in named]
    named += HOUSEKEEPING + MITO
    synthetic = ["GENE%04d" % i for i in range(N_GENES - len(named))]
    return np.array(named + synthetic, dtype=object)


def simulate(rng, genes):
    """Counts matrix (CSR, int32) plus per-cell labels."""
    types = list(CELL_TYPES)
    share = np.array([CELL_TYPES[t][0] for t in types])
    cell_type = rng.choice(len(types), N_CELLS, p=share / share.sum())
    sample = np.sort(rng.integers(0, len(SAMPLES), N_CELLS))  # cells grouped by sample
    index = {g: i for i, g in enumerate(genes)}
    # Skewed gene popularity: housekeeping and mitochondrial genes first.
    base = 1.0 / (np.arange(N_GENES) + 20.0) ** 0.8
    rng.shuffle(base[len(index) - len(MITO) - len(HOUSEKEEPING):])
    for _, markers in CELL_TYPES.values():
        for g in markers:  # rare outside their cell type
            base[index[g]] = 0.0005
    for g in HOUSEKEEPING:
        base[index[g]] = 0.05
    for g in MITO:
        base[index[g]] = 0.02
    rows, cols, vals = [], [], []
    for c in range(N_CELLS):
        w = base.copy()
        for g in CELL_TYPES[types[cell_type[c]]][1]:
            w[index[g]] += 0.08
        w /= w.sum()
        n = int(np.clip(rng.normal(130, 25), 90, 200))
        g = np.unique(rng.choice(N_GENES, size=n, replace=False, p=w))
        # Counts mostly 1-3, higher for the popular genes of this cell.
        counts = rng.geometric(np.clip(0.75 - 4.0 * w[g], 0.15, 0.9)).astype(np.int32)
        rows.append(np.full(g.shape[0], c, np.int64))
        cols.append(g)
        vals.append(counts)
    rows, cols, vals = map(np.concatenate, (rows, cols, vals))
    indptr = np.zeros(N_CELLS + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=N_CELLS), out=indptr[1:])
    X = ivref.make_csr(vals, cols, indptr, (N_CELLS, N_GENES))
    return X, cell_type, sample


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "pbmc_example.h5ad")
    rng = np.random.default_rng(SEED)
    genes = gene_names()
    X, cell_type, sample = simulate(rng, genes)
    nnz_per_cell = np.diff(X.indptr)
    totals = np.add.reduceat(X.data.astype(np.int64), X.indptr[:-1]) if X.nnz else \
        np.zeros(N_CELLS, np.int64)
    mito = np.isin(X.indices, [i for i, g in enumerate(genes) if g.startswith("MT-")])
    mito_counts = np.bincount(np.repeat(np.arange(N_CELLS), nnz_per_cell)[mito],
                              weights=X.data[mito], minlength=N_CELLS)
    types = list(CELL_TYPES)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical.from_codes(cell_type, types),
        "sample": pd.Categorical.from_codes(sample, [s for s, _ in SAMPLES]),
        "condition": pd.Categorical([SAMPLES[s][1] for s in sample],
                                    categories=["healthy", "SLE"]),
        "n_genes": nnz_per_cell.astype(np.int32),
        "total_counts": totals.astype(np.int64),
        "pct_mito": (100.0 * mito_counts / np.maximum(totals, 1)).astype(np.float32),
        "is_doublet": rng.random(N_CELLS) < 0.03,
    }, index=["%s_%s-1" % (SAMPLES[s][0], "".join(rng.choice(list("ACGT"), 12)))
              for s in sample])
    var = pd.DataFrame({
        "gene_ids": ["ENSG%011d" % (100000 + 37 * i) for i in range(N_GENES)],
        "feature_types": pd.Categorical(["Gene Expression"] * N_GENES),
        "mito": [g.startswith("MT-") for g in genes],
    }, index=genes.astype(str))

    ivref.write_iv(out, X, orientation="ivcsr", compression="zstd", chunk_len=16384,
                   ptr_chunk_len=4096, obs=False, var=False, level=3)
    from anndata.experimental import write_elem
    with h5py.File(out, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        for name in ("layers", "obsm", "obsp", "varm", "varp", "uns"):
            write_elem(f, name, {})
    size = os.path.getsize(out)
    print("%s: %d cells x %d genes, nnz %d (%.1f per cell), %d bytes"
          % (out, N_CELLS, N_GENES, X.nnz, X.nnz / N_CELLS, size))


if __name__ == "__main__":
    main(sys.argv)
