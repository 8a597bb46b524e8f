#!/usr/bin/python3
"""Baselines for benchmarks/bench_pack.sh: what the same conversion costs
with the Python tools, measured the same way (wall time, peak RSS).

  pack_baseline.py CSR.h5ad OUT.h5ad [--chunk-bytes N]

Prints two lines: anndata.read_h5ad of the standard CSR file (the whole
matrix into memory), then the format's reference writer (tests/python
ivref.write_iv, vectorized numpy, zstd level 1) writing IVCSR from the
loaded matrix.  Peak RSS is the process high-water mark after each step,
so the second includes the first's matrix.
"""
import argparse
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csr")
    ap.add_argument("out")
    ap.add_argument("--chunk-bytes", type=int, default=32768)
    a = ap.parse_args()
    import anndata
    import ivref
    size = os.path.getsize(a.csr) / 1e6
    t0, c0 = time.time(), time.process_time()
    ad = anndata.read_h5ad(a.csr)
    t1, c1 = time.time(), time.process_time()
    print("anndata.read_h5ad          %8.2f s wall %8.2f s cpu  %8.1f MB/cpu-s  peak %7.0f MB" % (
        t1 - t0, c1 - c0, size / (c1 - c0), peak_mb()))
    sys.stdout.flush()
    X = ad.X
    t2, c2 = time.time(), time.process_time()
    ivref.write_iv(a.out, X, "ivcsr", compression="zstd", chunk_len=a.chunk_bytes, obs=False,
                   var=False, ptr_chunk_len=65536)
    t3, c3 = time.time(), time.process_time()
    print("ivref.write_iv (zstd-1)    %8.2f s wall %8.2f s cpu  %8.1f MB/cpu-s  peak %7.0f MB"
          "  (read + write: %.2f s wall, %.2f s cpu)" % (
              t3 - t2, c3 - c2, size / (c3 - c2), peak_mb(), t3 - t0, c3 - c0))


if __name__ == "__main__":
    main()
