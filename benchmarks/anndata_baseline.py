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

Then, unless --no-memory, the other usual habit in one more child: load
the whole matrix with anndata.read_h5ad (in memory) and subset it.

Output (--out): "open SECONDS", then one line per case:
    NAME[_genes] SECONDS PEAK_KB NNZ SUM HASH
then "memload SECONDS", one "memory NAME[_genes] SECONDS NNZ SUM HASH" per
case (subset time only) and "mempeak KB".  SECONDS are the best of --reps
runs (the least disturbed on a shared machine).

Usage:
  /usr/bin/python3 benchmarks/anndata_baseline.py --csr X.csr.h5ad --sel-dir DIR [--reps 3] --out F
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np
import scipy.sparse

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
    """Runs fn() (returning text) in a forked child; returns (the text,
    the child's peak RSS in kB)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn().encode()
            while out:
                out = out[os.write(w, out):]
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
    return b"".join(chunks).decode(), usage.ru_maxrss


def backed_case(adata, idx, genes):
    secs, (nnz, total, h) = one_case(adata, idx, genes)
    return "%r %d %r %d" % (secs, nnz, total, h)


def in_memory_cases(path, sels, genes, reps):
    """The other habit: load the whole matrix, then subset it in memory
    (scipy fancy indexing takes the rows in any order).  One load, then
    every case; lines "memload SECONDS" and "memory KEY SECONDS NNZ SUM HASH"."""
    import anndata
    t0 = time.perf_counter()
    X = anndata.read_h5ad(path).X
    # anndata 0.8 hands back an int64 indptr with int32 indices, a mix that
    # Debian's scipy 1.10 row indexing refuses ("Output dtype not compatible
    # with inputs"); rebuilding the matrix lets scipy pick one index dtype,
    # the usual fix, and its cost is counted in the load.
    X = scipy.sparse.csr_matrix((X.data, X.indices, X.indptr), shape=X.shape)
    lines = ["memload %r" % (time.perf_counter() - t0)]
    for name, idx in sels:
        for g in (None, genes):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                sub = X[idx]
                if g is not None:
                    sub = sub[:, g]
                times.append(time.perf_counter() - t0)
            nnz, total, h = checksum(sub)
            lines.append("memory %s %r %d %r %d" % (name + ("_genes" if g is not None else ""),
                                                    min(times), nnz, total, h))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csr", required=True)
    ap.add_argument("--sel-dir", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the load-everything-then-subset baseline")
    args = ap.parse_args(argv)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import anndata

    t0 = time.perf_counter()
    adata = anndata.read_h5ad(args.csr, backed="r")
    open_s = time.perf_counter() - t0
    genes = np.fromfile(os.path.join(args.sel_dir, "genes.i64"), dtype="<i8")
    lines = ["open %r" % open_s]
    sels = [(name, np.fromfile(os.path.join(args.sel_dir, name + ".i64"), dtype="<i8"))
            for name in CASES]
    for name, idx in sels:
        for g in (None, genes):
            key = name + ("_genes" if g is not None else "")
            times, peak, res = [], 0, None
            for _ in range(args.reps):
                text, maxrss = in_child(lambda: backed_case(adata, idx, g))
                secs, nnz, total, h = text.split()
                secs = float(secs)
                times.append(secs)
                peak = max(peak, maxrss)
                res = (int(nnz), float(total), int(h))
                if secs > SLOW_SECONDS:
                    break
            best = min(times)
            lines.append("%s %r %d %d %r %d" % (key, best, peak, res[0], res[1], res[2]))
            print("anndata %-22s %8.3f s  (%d run%s)" % (key, best, len(times),
                                                       "" if len(times) == 1 else "s"),
                  file=sys.stderr, flush=True)
    if not args.no_memory:
        text, maxrss = in_child(lambda: in_memory_cases(args.csr, sels, genes, args.reps))
        lines += text.splitlines()
        lines.append("mempeak %d" % maxrss)
        print("anndata in memory: %s" % lines[-len(sels) * 2 - 2], file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
