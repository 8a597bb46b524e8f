"""Datasets for the viewer's browser tests and its benchmark: an IVCSR
.h5ad written by ivref (the test-only reference writer), with obs columns
written by anndata's own element writer and an embedding obsm/X_umap
written with h5py in anndata's array encoding.

add_umap() gives any .h5ad (also one from benchmarks/gen_atlas.py) an
embedding: one Gaussian blob per category of a column, so the picture
has structure and box selections hit a known set of cells.
"""

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

import ivref

CELL_TYPES = ["B cell", "T cell", "NK cell", "Monocyte", "Platelet"]
# Named genes first (the search and dot-plot tests use them), then G0001...
NAMED_GENES = ["CD3E", "CD3D", "CD3G", "CD79A", "MS4A1", "NKG7", "GNLY", "LYZ", "PPBP", "CD14"]


def gene_names(n_genes):
    return NAMED_GENES[:n_genes] + ["G%04d" % i for i in range(n_genes - len(NAMED_GENES))]


def write_umap(path, coords):
    """Writes coords (n x k float32) as obsm/X_umap in anndata's encoding
    (obsm a dict group, the element an array), replacing any obsm."""
    with h5py.File(path, "a") as f:
        if "obsm" in f:
            del f["obsm"]
        g = f.create_group("obsm")
        g.attrs["encoding-type"] = "dict"
        g.attrs["encoding-version"] = "0.1.0"
        d = g.create_dataset("X_umap", data=np.ascontiguousarray(coords, dtype=np.float32))
        d.attrs["encoding-type"] = "array"
        d.attrs["encoding-version"] = "0.2.0"


def blob_coords(codes, rng, n_groups):
    """One blob per group around a circle, spread 0.6 (float32)."""
    ang = 2 * np.pi * np.arange(n_groups) / max(n_groups, 1)
    centres = np.stack([6 * np.cos(ang), 6 * np.sin(ang)], axis=1)
    xy = centres[np.clip(codes, 0, n_groups - 1)] + rng.normal(0, 1.1, (codes.shape[0], 2))
    return xy.astype(np.float32)


def add_umap(path, column="cell_type", seed=7):
    """Gives an existing .h5ad an obsm/X_umap grouped by a categorical obs column."""
    from anndata.experimental import read_elem
    with h5py.File(path, "r") as f:
        obs = read_elem(f["obs"])
    codes = obs[column].cat.codes.to_numpy()
    write_umap(path, blob_coords(codes, np.random.default_rng(seed), len(obs[column].cat.categories)))


def ensembl_ids(n_genes):
    return ["ENSG%011d" % (1000 + i) for i in range(n_genes)]


def make_dataset(path, n_cells=3000, n_genes=60, seed=11, symbols=None):
    """Writes the test dataset and returns (X csr int32, obs DataFrame, umap float32).

    Expression depends on the cell type (each type raises two of the named
    genes), so the dot plot has something to show; about 8 % of entries are
    stored.  With symbols="feature_name" (or another column name) the var
    index holds Ensembl-style ids (ensembl_ids) and that column the gene
    symbols (gene_names), as CELLxGENE's files do."""
    from anndata.experimental import write_elem
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, len(CELL_TYPES), n_cells)
    X = ivref.random_csr(rng, n_cells, n_genes, int(0.08 * n_cells * n_genes), dtype=np.int32,
                         negative=False).tolil()
    for k in range(len(CELL_TYPES)):
        cells = np.flatnonzero(codes == k)
        for g in (2 * k, 2 * k + 1):
            if g < n_genes:
                hit = cells[rng.random(cells.shape[0]) < 0.7]
                X[hit, g] = rng.integers(1, 12, hit.shape[0])
    X = sp.csr_matrix(X, dtype=np.int32)
    # random_csr plants the dtype's largest value once; counts stay small here.
    X.data = np.minimum(X.data, 20).astype(np.int32)
    X.sort_indices()
    names = np.array(["cell%05d" % i for i in range(n_cells)], dtype=object)
    ivref.write_iv(path, X, compression="zstd", chunk_len=4096, obs=names,
                   var=np.array(gene_names(n_genes), dtype=object), rng=rng)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical.from_codes(codes, CELL_TYPES),
        "batch": pd.Categorical.from_codes(rng.integers(0, 3, n_cells), ["b1", "b2", "b3"]),
        "n_counts": np.asarray(X.sum(axis=1)).ravel().astype(np.float64),
    }, index=pd.Index(names, name="_index"))
    with h5py.File(path, "a") as f:
        del f["obs"]
        write_elem(f, "obs", obs)
        if symbols:
            del f["var"]
            write_elem(f, "var", pd.DataFrame({symbols: pd.Categorical(gene_names(n_genes))},
                                              index=pd.Index(ensembl_ids(n_genes), name="_index")))
    umap = blob_coords(codes, rng, len(CELL_TYPES))
    write_umap(path, umap)
    return X, obs, umap
