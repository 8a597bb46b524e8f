#!/usr/bin/python3
"""Opening a packed file of many chunks: the chunk table read from the
B-tree in one walk (what `ivserve check` does now) against one HDF5 lookup
a chunk (what the loader did before, timed here through h5py's
get_chunk_info_by_coord, the same HDF5 call), in the same run.

Packs a synthetic CSR matrix with --chunk-bytes B for each B, then, per
file: the chunk count, `ivserve check`'s open time (the whole load: the
reader child, pointers, chunk table) and the per-chunk lookups' time over
the first --probe chunks, scaled to all of them (each lookup walks the
index from its start, so the whole table costs n^2 / 2 steps: the scale
is quadratic), and their ratio.

Usage:
  /usr/bin/python3 benchmarks/bench_chunk_index.py --bin build/ivserve
      [--cells 20000] [--chunk-bytes 16384,4096,1024,256] [--probe 3000]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import ivref  # noqa: E402


def write_csr(path, X):
    with h5py.File(path, "w") as f:
        ivref.write_plain_sparse(f, "X", X)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/ivserve")
    ap.add_argument("--cells", type=int, default=20000)
    ap.add_argument("--genes", type=int, default=5000)
    ap.add_argument("--per-cell", type=int, default=700)
    ap.add_argument("--chunk-bytes", default="16384,4096,1024,256")
    ap.add_argument("--probe", type=int, default=3000)
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    X = ivref.random_csr(rng, args.cells, args.genes, args.cells * args.per_cell, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "csr.h5ad")
        write_csr(src, X)
        print("matrix: %d x %d, nnz %d" % (X.shape[0], X.shape[1], X.nnz))
        print("%-12s %9s %14s %22s %9s" % ("chunk bytes", "chunks", "check open s",
                                            "per-chunk lookups s", "ratio"))
        for cb in [int(x) for x in args.chunk_bytes.split(",")]:
            out = os.path.join(tmp, "p%d.h5ad" % cb)
            subprocess.run([args.bin, "pack", src, out, "--chunk-bytes", str(cb), "--quiet"],
                           check=True, capture_output=True)
            proc = subprocess.run([args.bin, "check", out], check=True, capture_output=True,
                                  text=True)
            info = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
            open_s = float(info["open time"].split()[0])
            with h5py.File(out, "r") as f:
                ds = f["X/packed_indices"]
                d, cl = ds.id, ds.chunks[0]
                n = d.get_num_chunks()
                k = min(n, args.probe)
                t = time.perf_counter()
                for i in range(k):
                    d.get_chunk_info_by_coord((i * cl,))
                dt = time.perf_counter() - t
            scaled = dt * (n / k) ** 2 if k else 0.0
            print("%-12d %9d %14.3f %22s %9s" % (
                cb, n, open_s, "%.3f%s" % (scaled, "" if k == n else " (scaled)"),
                "%.2fx" % (scaled / open_s) if open_s > 0 else "-"))
            assert info.get("chunk index") == "B-tree, read in one walk", info


if __name__ == "__main__":
    main()
