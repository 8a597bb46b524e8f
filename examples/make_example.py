#!/usr/bin/python3
"""Writes examples/pbmc_example.h5ad: a small, realistic IVCSR example.

2,000 synthetic PBMCs x 1,500 genes (~100-200 stored counts per cell, counts
mostly 1-3), eight cell types with their textbook marker genes (CD3E, MS4A1,
NKG7, LYZ, ...), six samples from two conditions.  obs and var are written by
anndata itself (categoricals, string arrays, bools, ints, floats) so any
anndata reader understands them; the X group is then added in the IVCSR
layout by the project's Python reference writer (tests/python/ivref.py),
with zstd chunks (filter 32015) so that no Blosc2 plugin is needed.

So that the viewer opens on a picture, the file also holds an embedding,
obsm/X_umap, and a clustering, obs/cluster, computed here from the counts
alone (embed()): log-normalised counts, the genes that co-vary with another
gene, PCA by numpy's SVD, k-means on the components (clusters named after
the cell type whose markers they express, when one stands out) and a
force-directed layout of the components' nearest-neighbour graph.  It is
not UMAP (no umap package is used); it is stored under the name that
scanpy, cellxgene and the viewer look for.  obs/cell_type is the simulated
truth, which the clusters recover almost exactly.

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
# The embedding (embed()): its own random generators, so the counts and obs
# columns above do not change with it.
N_PCS = 20
N_CLUSTERS = 8
N_NEIGHBOURS = 15
LAYOUT_STEPS = 100
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


# ---- the embedding and clusters, from the counts alone -----------------------
# Each stage is a function; embed() calls them in order.

def log_normalise(X):
    """Counts per 10,000 of each cell's total, log1p, dense float64."""
    dense = np.zeros(X.shape)
    dense[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] = X.data
    return np.log1p(dense / np.maximum(dense.sum(1, keepdims=True), 1) * 1e4)


def covarying_genes(Y, min_r=0.2):
    """Genes seen in at least 1% of the cells whose values correlate
    (Pearson r >= min_r) with another gene's.  With ~130 counts a cell, a
    marker is one or two counts, so variance alone (scanpy's highly
    variable genes) ranks the sampling noise of common genes with them;
    markers of one cell type co-occur, noise does not (|r| ~ 0.05 here)."""
    seen = np.flatnonzero((Y > 0).mean(0) >= 0.01)
    Z = Y[:, seen] - Y[:, seen].mean(0)
    Z /= np.maximum(np.sqrt((Z ** 2).sum(0)), 1e-12)
    R = Z.T @ Z
    np.fill_diagonal(R, 0)
    return seen[R.max(0) >= min_r]


def pca(Y, k):
    """The first k principal components of Y's genes scaled to unit variance."""
    Z = (Y - Y.mean(0)) / np.maximum(Y.std(0), 1e-12)
    U, S, Vt = np.linalg.svd(Z, full_matrices=False)
    k = min(k, S.shape[0])
    # A component's sign is arbitrary; make each one's largest loading
    # positive so that the result does not depend on the LAPACK build.
    flip = np.sign(Vt[np.arange(k), np.abs(Vt[:k]).argmax(1)])
    return U[:, :k] * S[:k] * flip


def kmeans(P, k, rng, restarts=10, steps=100):
    """Lloyd's k-means from k-means++ starts; the best of the restarts."""
    best = None
    for _ in range(restarts):
        C = [P[rng.integers(P.shape[0])]]
        d = ((P - C[0]) ** 2).sum(1)
        for _ in range(1, k):
            C.append(P[rng.choice(P.shape[0], p=d / d.sum())])
            d = np.minimum(d, ((P - C[-1]) ** 2).sum(1))
        C = np.array(C)
        labels = None
        for _ in range(steps):
            new = ((P[:, None, :] - C[None]) ** 2).sum(2).argmin(1)
            if labels is not None and np.array_equal(new, labels):
                break
            labels = new
            C = np.array([P[labels == j].mean(0) if (labels == j).any() else C[j]
                          for j in range(k)])
        inertia = ((P - C[labels]) ** 2).sum()
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    return best[1]


def name_clusters(Y, labels, genes):
    """A name a cluster: the cell type whose markers its cells express most
    often, when that share is at least 0.3 and 1.5x the next type's and no
    other cluster takes the name; else cluster_N."""
    index = {g: i for i, g in enumerate(genes)}
    names = []
    for j in range(labels.max() + 1):
        cells = Y[labels == j]
        share = {t: (cells[:, [index[g] for g in markers]] > 0).mean()
                 for t, (_, markers) in CELL_TYPES.items()}
        top = sorted(share, key=share.get, reverse=True)
        ok = share[top[0]] >= 0.3 and share[top[0]] >= 1.5 * share[top[1]]
        names.append(top[0] if ok else "cluster_%d" % j)
    for j, n in enumerate(names):
        if names.count(n) > 1:
            names[j] = "cluster_%d" % j
    return names


def nearest_neighbours(P, k):
    sq = (P ** 2).sum(1)
    d = sq[:, None] + sq[None] - 2 * P @ P.T
    np.fill_diagonal(d, np.inf)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def force_layout(P, nbr, steps, rng):
    """Springs along the neighbour graph's edges, every pair of cells
    pushing apart as 1/distance, steps that shrink as it cools.  Starts at
    the first two components plus a little noise: cells with the same
    counts pattern have the same components, and would never part."""
    n = P.shape[0]
    xy = (P[:, :2] / np.abs(P[:, :2]).max() * 10.0).astype(np.float32)
    xy += rng.normal(0, 0.5, xy.shape).astype(np.float32)
    i = np.repeat(np.arange(n), nbr.shape[1])
    j = nbr.ravel()
    for s in range(steps):
        diff = xy[:, None, :] - xy[None]
        d2 = (diff ** 2).sum(2) + np.float32(0.05)
        push = (diff / d2[:, :, None]).sum(1) * np.float32(20.0 / n)
        e = xy[j] - xy[i]
        pull = np.zeros_like(xy)
        np.add.at(pull, i, e)
        np.add.at(pull, j, -e)
        step = push + np.float32(0.02) * pull
        norm = np.sqrt((step ** 2).sum(1, keepdims=True))
        xy += step / np.maximum(norm, 1e-9) * np.minimum(norm, 0.3 * (1.0 - s / steps) + 0.005)
    return xy


def embed(X, genes):
    """(n x 2 float32 layout, cluster categorical) from the counts X."""
    Y = log_normalise(X)
    P = pca(Y[:, covarying_genes(Y)], N_PCS)
    labels = kmeans(P, N_CLUSTERS, np.random.default_rng(SEED + 1))
    names = name_clusters(Y, labels, genes)
    # Clusters listed in the order of the cell types they are named after.
    order = sorted(range(len(names)), key=lambda j: (list(CELL_TYPES).index(names[j])
                                                     if names[j] in CELL_TYPES else 99, j))
    recode = np.empty(len(order), np.int64)
    recode[order] = np.arange(len(order))
    cluster = pd.Categorical.from_codes(recode[labels], [names[j] for j in order])
    xy = force_layout(P, nearest_neighbours(P, N_NEIGHBOURS), LAYOUT_STEPS,
                      np.random.default_rng(SEED + 2))
    return xy.astype(np.float32), cluster


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
    xy, cluster = embed(X, genes)
    obs["cluster"] = cluster
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
        write_elem(f, "obsm", {"X_umap": xy})
        for name in ("layers", "obsp", "varm", "varp", "uns"):
            write_elem(f, name, {})
    size = os.path.getsize(out)
    print("%s: %d cells x %d genes, nnz %d (%.1f per cell), %d bytes"
          % (out, N_CELLS, N_GENES, X.nnz, X.nnz / N_CELLS, size))
    agree = (np.asarray(obs["cluster"]) == np.asarray(obs["cell_type"])).mean()
    print("clusters: %s; %.1f%% of cells in the cluster named after their cell type"
          % (", ".join(cluster.categories), 100 * agree))


if __name__ == "__main__":
    main(sys.argv)
