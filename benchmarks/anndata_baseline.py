#!/usr/bin/python3
"""The anndata baseline of the engine benchmark: selections read the way
users read them today, from a standard CSR .h5ad in backed mode.

For each selection file NAME.i64 in --sel-dir (int64 cell indices in the
order the user wants them, written by bench_engine) and for all genes and
the gene subset in genes.i64:

    adata = anndata.read_h5ad(path, backed="r")     # once, timed apart
    order = np.argsort(idx)                         # backed CSR rows must be
    sub = adata.X[idx[order]]                       # sorted and unique: sort,
    sub = sub[inverse(order)]                       # read, restore the order
    sub = sub[:, genes]                             # (gene subset cases)

Each measurement runs in a forked child, so that its peak RSS (from
wait4's ru_maxrss, which includes the parent's resident pages the child
inherited) is that case's own.  The child also reports nnz, the sum of the
values and a position-weighted index hash computed exactly as bench_engine
computes them, so the benchmark can check both sides read the same matrix.

Output (--out): "open SECONDS", then one line per case:
    NAME[_genes] SECONDS PEAK_KB NNZ SUM HASH
SECONDS is the median over --reps runs.

Usage:
  /usr/bin/python3 benchmarks/anndata_baseline.py --csr X.csr.h5ad --sel-dir DIR [--reps 3] --out F
"""

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

CASES = ["random_0.1pct", "random_1pct", "random_10pct", "clustered_1pct"]
SLOW_SECONDS = 5.0   # one run of a case longer than this is not repeated


def checksum(m):
    """(nnz, value sum, hash) of a scipy CSR matrix, as bench_engine's."""
    m = m.tocsr()
    counts = np.diff(m.indptr)
    rows = np.repeat(np.arange(m.shape[0], dtype=np.uint64), counts)
    with np.errstate(over="ignore"):
        h = int(np.sum(rows * np.uint64(1000003) + m.indices.astype(np.uint64), dtype=np.uint64))
    # Counts are small integers: the float64 sum is exact in any order.
    return int(m.nnz), float(np.sum(m.data, dtype=np.float64)), h


def one_case(adata, idx, genes):
    t0 = time.perf_counter()
    order = np.argsort(idx, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    sub = adata.X[idx[order]]
    sub = sub[inverse]
    if genes is not None:
        sub = sub[:, genes]
    secs = time.perf_counter() - t0
    return secs, checksum(sub)


def in_child(fn):
    """Runs fn() in a forked child; returns (its result, child peak RSS kB)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            secs, (nnz, total, h) = fn()
            os.write(w, ("%r %d %r %d" % (secs, nnz, total, h)).encode())
            code = 0
        except BaseException as e:  # report, never return into the parent's code
            sys.stderr.write("anndata_baseline: %r\n" % (e,))
            code = 1
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("a baseline run failed")
    secs, nnz, total, h = b"".join(chunks).decode().split()
    return (float(secs), int(nnz), float(total), int(h)), usage.ru_maxrss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csr", required=True)
    ap.add_argument("--sel-dir", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import anndata

    t0 = time.perf_counter()
    adata = anndata.read_h5ad(args.csr, backed="r")
    open_s = time.perf_counter() - t0
    genes = np.fromfile(os.path.join(args.sel_dir, "genes.i64"), dtype="<i8")
    lines = ["open %r" % open_s]
    for name in CASES:
        idx = np.fromfile(os.path.join(args.sel_dir, name + ".i64"), dtype="<i8")
        for g in (None, genes):
            key = name + ("_genes" if g is not None else "")
            times, peak, res = [], 0, None
            for _ in range(args.reps):
                (secs, nnz, total, h), maxrss = in_child(lambda: one_case(adata, idx, g))
                times.append(secs)
                peak = max(peak, maxrss)
                res = (nnz, total, h)
                if secs > SLOW_SECONDS:
                    break
            med = statistics.median(times)
            lines.append("%s %r %d %d %r %d" % (key, med, peak, res[0], res[1], res[2]))
            print("anndata %-22s %8.3f s  (%d run%s)" % (key, med, len(times),
                                                       "" if len(times) == 1 else "s"),
                  file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
