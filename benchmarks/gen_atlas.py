#!/usr/bin/python3
"""Synthetic single-cell atlas shaped like a lupus PBMC atlas, for benchmarks.

About 700 stored counts per cell over 33,000 genes with skewed gene
popularity (a few genes in almost every cell, most genes rare), counts mostly
1-3, cells grouped by sample (contiguous, 100 samples by default, half of
them SLE), cell types with their own marker genes.  Written as an IVCSR .h5ad
with zstd level-1 chunks (filter 32015) whose sizes are the ones h5py would
choose for each dataset, plus obs (cell_type, sample, condition, numeric QC
columns) and var written by anndata's own element writer.

With --csr-h5ad OUT the same matrix is also written as a standard anndata
CSR .h5ad (uncompressed, contiguous datasets, anndata's encoding attrs) to
compare against anndata's backed mode.

Why it is built this way: the matrix is generated and encoded in slabs of
cells, each slab fully vectorized with numpy (one sort per slab; the varint
encoder works one byte position at a time over the whole slab), so memory is
bounded by the slab and the per-cell arrays, not by the matrix.  The packed
stream's final length is only known at the end, but h5py's chunk size
depends on it, so the stream goes to a temporary raw file first and is
compressed chunk by chunk afterwards; the CSR copy does the same so that its
datasets can be contiguous, as anndata writes them.

Usage:
  /usr/bin/python3 benchmarks/gen_atlas.py [--cells 200000] [-o OUT.h5ad]
                                           [--csr-h5ad OUT_CSR.h5ad]
"""

import argparse
import os
import sys
import time

import h5py
import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import ivref  # noqa: E402

CELL_TYPES = [  # name, share of cells
    ("CD4 T", 0.28), ("CD8 T", 0.14), ("NK", 0.08), ("B", 0.11), ("CD14 Mono", 0.17),
    ("FCGR3A Mono", 0.07), ("cDC", 0.03), ("pDC", 0.02), ("Plasmablast", 0.02),
    ("Platelet", 0.03), ("Progenitor", 0.01), ("T prolif", 0.04),
]
MARKERS_PER_TYPE = 60
MARKER_FRACTION = 0.08     # share of a cell's draws that come from its markers
N_MITO = 13
TABLE = 1 << 22            # entries of the gene sampling table


def h5py_chunk(n, itemsize):
    """The chunk length h5py picks for a 1-D dataset of n elements."""
    try:
        from h5py._hl.filters import guess_chunk
        return int(guess_chunk((n,), None, itemsize)[0])
    except ImportError:  # private helper moved: its documented rule, restated
        base, cmin, cmax = 16 * 1024, 8 * 1024, 1024 * 1024
        size = max(n, 1) * itemsize
        target = min(max(base * 2 ** np.log10(size / 1048576.0), cmin), cmax)
        c = float(max(n, 1))
        while not ((c * itemsize < target or abs(c * itemsize - target) / target < 0.5)
                   and c * itemsize < cmax) and c > 1:
            c = np.ceil(c / 2.0)
        return int(c)


class Model:
    """Gene popularity, markers and per-cell labels, all from one seed."""

    def __init__(self, n_cells, n_genes, n_samples, per_cell, seed):
        rng = np.random.default_rng([seed, 0])
        self.n_cells, self.n_genes = n_cells, n_genes
        # Zipf-like popularity over a random gene order: the draw count per
        # cell is chosen so that about per_cell distinct genes remain.
        w = 1.0 / (np.arange(n_genes) + 30.0)
        rng.shuffle(w)
        self.mito = rng.choice(n_genes, N_MITO, replace=False)
        w[self.mito] = np.max(w) * 0.3
        # Inverse-CDF lookup table: a uniform integer picks a gene with its
        # popularity (to 1/TABLE precision), several times faster than a
        # binary search per draw.
        cdf = np.cumsum(w / w.sum())
        self.table = np.minimum(np.searchsorted(cdf, (np.arange(TABLE) + 0.5) / TABLE),
                                n_genes - 1).astype(np.int32)
        self.markers = rng.choice(n_genes, (len(CELL_TYPES), MARKERS_PER_TYPE))
        self.draws_mean = per_cell * 1.23
        share = np.array([s for _, s in CELL_TYPES])
        self.cell_type = rng.choice(len(CELL_TYPES), n_cells, p=share / share.sum()).astype(np.int8)
        self.sample = (np.arange(n_cells, dtype=np.int64) * n_samples
                       // max(n_cells, 1)).astype(np.int16)
        self.n_samples = n_samples
        self.seed = seed

    def slab(self, k, c0, c1):
        """Canonical entries of cells [c0, c1): sorted (cell, gene) keys as
        (cell_local, gene, count) arrays."""
        rng = np.random.default_rng([self.seed, 1, k])
        n = c1 - c0
        draws = np.clip(rng.lognormal(np.log(self.draws_mean), 0.35, n), 50, 6000).astype(np.int64)
        cell = np.repeat(np.arange(n, dtype=np.int64), draws)
        genes = self.table[rng.integers(0, TABLE, cell.shape[0])].astype(np.int64)
        m = rng.random(cell.shape[0]) < MARKER_FRACTION
        genes[m] = self.markers[self.cell_type[c0 + cell[m]],
                                rng.integers(0, MARKERS_PER_TYPE, int(m.sum()))]
        keys, mult = np.unique(cell * self.n_genes + genes, return_counts=True)
        cl, gene = np.divmod(keys, self.n_genes)
        # Counts: times drawn plus a geometric extra, so mostly 1-3.
        count = mult + rng.geometric(0.72, keys.shape[0]) - 1
        return cl, gene, count


def encode_slab(cl, gene, count, n, n_genes):
    """IVCSR arrays of one slab (local pointers): groups in ascending count
    order per cell, indices ascending inside a group."""
    # One sort on a packed key (cell, count, gene); the key needs
    # ceil(log2) bits for each field, checked rather than assumed.
    gbits = int(n_genes - 1).bit_length() or 1
    cbits = int(count.max()).bit_length() if count.shape[0] else 1
    if int(n).bit_length() + cbits + gbits > 63:
        raise ValueError("slab too large for the packed sort key")
    key = (cl << (cbits + gbits)) | (count << gbits) | gene
    key.sort()
    gene_s = key & ((1 << gbits) - 1)
    cnt_s = (key >> gbits) & ((1 << cbits) - 1)
    cell_s = key >> (cbits + gbits)
    nnz = key.shape[0]
    new = np.ones(nnz, dtype=bool)
    if nnz > 1:
        new[1:] = (cell_s[1:] != cell_s[:-1]) | (cnt_s[1:] != cnt_s[:-1])
    gstart = np.flatnonzero(new)
    groups_per_cell = np.bincount(cell_s[gstart], minlength=n)
    deltas = gene_s.copy()
    inner = ~new[1:]
    deltas[1:][inner] = gene_s[1:][inner] - gene_s[:-1][inner] - 1
    return groups_per_cell, cnt_s[gstart], gstart, ivref.encode_varints(deltas.astype(np.uint64))


def write_zstd_stream(g, name, arr, level=1):
    """arr (an array or a memmap of the temporary raw file) as a zstd
    dataset with h5py's chunk size."""
    n = arr.shape[0]
    ivref.write_array(g, name, arr, compression="zstd",
                      chunk_len=h5py_chunk(n, arr.dtype.itemsize), level=level)


def write_frames(path, model, stats, var_names):
    from anndata.experimental import write_elem
    n_cells = model.n_cells
    types = [t for t, _ in CELL_TYPES]
    samples = ["SLE%03d" % s if s % 2 else "HC%03d" % s for s in range(model.n_samples)]
    obs = pd.DataFrame({
        "cell_type": pd.Categorical.from_codes(model.cell_type, types),
        "sample": pd.Categorical.from_codes(model.sample, samples),
        "condition": pd.Categorical.from_codes((model.sample % 2).astype(np.int8),
                                               ["healthy", "SLE"]),
        "n_genes": stats["n_genes"].astype(np.int32),
        "total_counts": stats["total"].astype(np.int64),
        "pct_mito": (100.0 * stats["mito"] / np.maximum(stats["total"], 1)).astype(np.float32),
    }, index=np.char.add("cell", np.arange(n_cells).astype(str)))
    var = pd.DataFrame({
        "gene_ids": np.char.add("ENSG", np.char.zfill(np.arange(model.n_genes).astype(str), 11)),
        "feature_types": pd.Categorical(["Gene Expression"] * model.n_genes),
        "mito": np.isin(np.arange(model.n_genes), model.mito),
    }, index=var_names)
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        for name in ("layers", "obsm", "obsp", "varm", "varp", "uns"):
            write_elem(f, name, {})


def gene_names(model):
    numbers = np.char.zfill(np.arange(model.n_genes).astype(str), 5)
    names = np.char.add("GENE", numbers).astype(object)
    for i, g in enumerate(model.mito):
        names[g] = "MT-G%02d" % i
    real = ["CD3E", "CD4", "CD8A", "NKG7", "GNLY", "MS4A1", "CD79A", "LYZ", "CD14", "FCGR3A",
            "FCER1A", "CLEC4C", "JCHAIN", "PPBP", "CD34", "MKI67"]
    for t, g in enumerate(real[:len(CELL_TYPES)]):
        names[model.markers[t % len(CELL_TYPES), 0]] = g
    return names.astype(str)


_SLAB = {}  # the model and settings the slab workers read (inherited by fork)


def _make_slab(job):
    """One slab, generated and encoded (in a worker process when --jobs > 1):
    the arrays the writer needs and the slab's per-cell statistics."""
    k, c0 = job
    model, args = _SLAB["model"], _SLAB["args"]
    c1 = min(args.cells, c0 + args.slab)
    cl, gene, count = model.slab(k, c0, c1)
    gpc, vals, gstart, packed = encode_slab(cl, gene, count, c1 - c0, args.genes)
    is_mito = _SLAB["is_mito"]
    slab_stats = {
        "n_genes": np.bincount(cl, minlength=c1 - c0),
        "total": np.bincount(cl, weights=count, minlength=c1 - c0),
        "mito": np.bincount(cl[is_mito[gene]], weights=count[is_mito[gene]], minlength=c1 - c0),
    }
    csr_gene = gene.astype(np.int32) if args.csr_h5ad else None
    csr_count = count.astype(np.dtype(args.dtype)) if args.csr_h5ad else None
    return gpc, vals, gstart, packed, csr_gene, csr_count, slab_stats


class _Serial:
    """The pool's imap in this process, for --jobs 1."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, it):
        return map(fn, it)


def _slab_pool(jobs, model, args):
    """Slabs come back in order whatever the worker count, and each slab's
    random numbers depend only on its number, so the file is the same for
    any --jobs."""
    is_mito = np.zeros(args.genes, bool)
    is_mito[model.mito] = True
    _SLAB.update(model=model, args=args, is_mito=is_mito)
    if jobs <= 1:
        return _Serial()
    import multiprocessing
    return multiprocessing.get_context("fork").Pool(jobs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=200_000)
    ap.add_argument("--genes", type=int, default=33_000)
    ap.add_argument("--per-cell", type=int, default=700, help="mean stored counts per cell")
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slab", type=int, default=10_000, help="cells generated at once")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 16),
                    help="processes generating slabs (the file is the same for any count)")
    ap.add_argument("--dtype", default="float32", help="value dtype (anndata's usual float32)")
    ap.add_argument("-o", "--out", default=None)
    ap.add_argument("--csr-h5ad", default=None, help="also write a standard CSR .h5ad here")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(HERE, "data", "atlas_%d.h5ad" % args.cells)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    t0 = time.time()
    model = Model(args.cells, args.genes, args.samples, args.per_cell, args.seed)
    dtype = np.dtype(args.dtype)
    stats = {k: np.zeros(args.cells, np.int64) for k in ("n_genes", "total", "mito")}
    major_ptr = np.zeros(args.cells + 1, np.int64)
    values, value_ptr = [], []
    n_groups = nnz = 0
    tmp_packed = out + ".packed.tmp"
    tmp_idx = args.csr_h5ad + ".indices.tmp" if args.csr_h5ad else None
    tmp_dat = args.csr_h5ad + ".data.tmp" if args.csr_h5ad else None
    try:
        with open(tmp_packed, "wb") as fp, \
                (open(tmp_idx, "wb") if tmp_idx else open(os.devnull, "wb")) as fi, \
                (open(tmp_dat, "wb") if tmp_dat else open(os.devnull, "wb")) as fd:
            starts = list(range(0, args.cells, args.slab))
            with _slab_pool(args.jobs, model, args) as pool:
                for c0, res in zip(starts, pool.imap(_make_slab, enumerate(starts))):
                    c1 = min(args.cells, c0 + args.slab)
                    gpc, vals, gstart, packed, csr_gene, csr_count, slab_stats = res
                    np.cumsum(gpc, out=major_ptr[c0 + 1:c1 + 1])
                    major_ptr[c0 + 1:c1 + 1] += n_groups
                    values.append(vals.astype(dtype))
                    value_ptr.append(gstart + nnz)
                    packed.tofile(fp)
                    if tmp_idx:
                        csr_gene.tofile(fi)
                        csr_count.tofile(fd)
                    for name, v in slab_stats.items():
                        stats[name][c0:c1] = v
                    n_groups += vals.shape[0]
                    nnz += int(slab_stats["n_genes"].sum())
        t_gen = time.time()
        values = np.concatenate(values) if values else np.zeros(0, dtype)
        value_ptr = np.append(np.concatenate(value_ptr) if value_ptr else
                              np.zeros(0, np.int64), nnz).astype(np.int64)
        packed = np.memmap(tmp_packed, dtype=np.uint8, mode="r") if os.path.getsize(tmp_packed) \
            else np.zeros(0, np.uint8)
        with h5py.File(out, "w") as f:
            f.attrs["encoding-type"] = "anndata"
            f.attrs["encoding-version"] = "0.1.0"
            g = f.create_group("X")
            g.attrs["encoding-type"] = "ivcsr"
            g.attrs["encoding-version"] = ivref.ENCODING_VERSION
            g.attrs["shape"] = np.array([args.cells, args.genes], np.int64)
            g.attrs["indices_dtype"] = ivref.default_indices_dtype(args.genes)
            write_zstd_stream(g, "major_ptr", major_ptr)
            write_zstd_stream(g, "values", values)
            write_zstd_stream(g, "value_ptr", value_ptr)
            write_zstd_stream(g, "packed_indices", packed)
        stream_bytes = packed.shape[0]
        del packed
        var_names = gene_names(model)
        write_frames(out, model, stats, var_names)
        t_iv = time.time()
        if args.csr_h5ad:
            indptr = np.zeros(args.cells + 1, np.int64)
            np.cumsum(stats["n_genes"], out=indptr[1:])
            with h5py.File(args.csr_h5ad, "w") as f:
                f.attrs["encoding-type"] = "anndata"
                f.attrs["encoding-version"] = "0.1.0"
                g = f.create_group("X")
                g.attrs["encoding-type"] = "csr_matrix"
                g.attrs["encoding-version"] = "0.1.0"
                g.attrs["shape"] = np.array([args.cells, args.genes], np.int64)
                g.create_dataset("indptr", data=indptr)
                for name, tmp, dt in (("indices", tmp_idx, np.int32), ("data", tmp_dat, dtype)):
                    d = g.create_dataset(name, shape=(nnz,), dtype=dt)
                    if nnz:
                        src = np.memmap(tmp, dtype=dt, mode="r")
                        step = 1 << 24
                        for a in range(0, nnz, step):
                            d[a:a + step] = src[a:a + step]
                        del src
            write_frames(args.csr_h5ad, model, stats, var_names)
        t_end = time.time()
    finally:
        for tmp in (tmp_packed, tmp_idx, tmp_dat):
            if tmp and os.path.exists(tmp):
                os.remove(tmp)
    print("%s: %d cells x %d genes, nnz %d (%.1f per cell), %d groups, stream %d bytes, "
          "file %d bytes" % (out, args.cells, args.genes, nnz, nnz / max(args.cells, 1), n_groups,
                             stream_bytes, os.path.getsize(out)))
    print("time: generate+encode %.1fs, write ivcsr %.1fs%s, total %.1fs"
          % (t_gen - t0, t_iv - t_gen,
             ", write csr %.1fs" % (t_end - t_iv) if args.csr_h5ad else "", t_end - t0))


if __name__ == "__main__":
    main()
