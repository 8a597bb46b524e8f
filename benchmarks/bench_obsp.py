#!/usr/bin/python3
"""The obsp route (docs/obsp.md) on a kNN-like graph: a file of --cells
cells whose obsp/connectivities holds --k entries a row (float32, int32
indices, written by anndata and packed), served by one server; times
POST .../obsp/connectivities for random cell lists of several sizes and
GET of all cells (wall per request, best of --runs, a fresh request
each time, no If-None-Match), the answer's bytes, and scipy's own
subset g[sel][:, sel] of the matrix already in memory; also how long
anndata.read_h5ad of the whole file takes (what a client without the
route reads to get any subset).  Each answer is checked equal to scipy's
subset.

Usage:
  /usr/bin/python3 benchmarks/bench_obsp.py --bin build/ivserve
      [--cells 1000000] [--k 15] [--runs 3] [--port 18095] [--dir DIR]
(--dir: the files are written there once and reused while they exist)
"""
import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))

from ivserve import wire  # noqa: E402


def write(path, n, k):
    import anndata

    rng = np.random.default_rng(1)
    X = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, 10, n).astype(np.int32),
                       np.arange(n + 1, dtype=np.int64)), shape=(n, 10))
    a = anndata.AnnData(X=X)
    a.obs_names = np.char.add("c", np.arange(n).astype(str))
    cols = np.sort(rng.integers(0, n, (n, k)), axis=1).ravel().astype(np.int32)
    g = sp.csr_matrix((rng.random(n * k, dtype=np.float32), cols, np.arange(0, n * k + 1, k, dtype=np.int64)),
                      shape=(n, n))
    g.sum_duplicates()
    a.obsp["connectivities"] = g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_h5ad(path)
    return g


def request(url, body):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Accept": wire.MEDIA_TYPE,
                                                          "Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read()
    return time.perf_counter() - t, raw


def decode(raw):
    reader = wire.StreamReader(io.BytesIO(raw))
    h = reader.read_header()
    return wire.assemble(h, list(reader.blocks()))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cells", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18095)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    tmp = args.dir or tempfile.mkdtemp(prefix="bench_obsp")
    plain, packed = os.path.join(tmp, "plain.h5ad"), os.path.join(tmp, "packed.h5ad")
    if not (args.dir and os.path.exists(packed)):  # --dir keeps the files for the next run
        write(plain, args.cells, args.k)
        subprocess.run([args.bin, "pack", plain, packed], check=True, capture_output=True)
    cfg = os.path.join(tmp, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"datasets": [{"id": "b", "path": packed}]}, f)
    srv = subprocess.Popen([args.bin, "--config", cfg, "--port", str(args.port), "--threads", "2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d/v1/datasets/b/obsp/connectivities" % args.port
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/readyz" % args.port, timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        import anndata
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = anndata.read_h5ad(plain).obsp["connectivities"]
        rng = np.random.default_rng(7)
        print("cells %d, entries %d; anndata.read_h5ad of the whole file %.3f s"
              % (args.cells, g.nnz, time.perf_counter() - t))
        for size in (100, 10_000, 100_000, None):
            sel = None if size is None else rng.integers(0, args.cells, size)
            body = None if sel is None else {"obs": {"index": sel.tolist()}}
            best, raw = min((request(url, body) for _ in range(args.runs)), key=lambda x: x[0])
            t = time.perf_counter()
            want = g if sel is None else g[sel][:, sel]
            t_scipy = time.perf_counter() - t
            want = want.tocsr()
            want.sort_indices()
            got = decode(raw)
            assert (got != want).nnz == 0 and got.nnz == want.nnz
            print("%-8s cells: route %.3f s, %d bytes, %d entries; scipy on the matrix in memory %.3f s"
                  % ("all" if size is None else size, best, len(raw), got.nnz, t_scipy))
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
