#!/usr/bin/python3
"""Ordinary .h5ad files served (issue "any .h5ad in"): the server's own
packing against `ivserve pack` run alone, on a gzip'd scanpy-style file.

Steps, in one run so that the ratios compare like with like:
  1. gen_atlas.py writes the synthetic atlas as a plain CSR .h5ad; anndata
     reads it and writes it again as scanpy does with compression="gzip",
     with a 2-D embedding obsm/X_umap (the first page a viewer draws);
  2. `ivserve pack` of that file, alone (the baseline);
  3. the server started on the file with an empty cache folder: seconds
     until GET obsm/X_umap answers 200 (the page's data), and the pack
     time the server logs;
  4. the server started again on the same file and cache folder: seconds
     until /readyz is 200; then the server started on step 2's packed file
     alone, the same way.
Prints each time and the goal ratios: page <= pack alone + 2 s, the
server's pack <= 1.2x pack alone, second start <= 1.2x the packed file's.

Usage: IVSERVE_BIN=build/ivserve /usr/bin/python3 benchmarks/bench_autopack.py
           [--cells 200000] [--genes 33000] [--threads 2] [--work DIR]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import anndata as ad
import numpy as np
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from ivprocess import listening_port  # noqa: E402


def start(binary, args, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen([binary, *args, "--port", "0"], stdout=log, stderr=log)
    return proc, "http://127.0.0.1:%d" % listening_port(log_path, proc, timeout=600)


def until(url, timeout=3600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if requests.get(url, timeout=30).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.02)
    raise RuntimeError("no 200 from " + url)


def stop(proc):
    proc.terminate()
    proc.wait(60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200_000)
    ap.add_argument("--genes", type=int, default=33_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    binary = os.environ.get("IVSERVE_BIN") or os.path.join(HERE, "..", "build", "ivserve")
    work = a.work or tempfile.mkdtemp(prefix="bench_autopack_")
    os.makedirs(work, exist_ok=True)
    plain, gz = os.path.join(work, "plain.h5ad"), os.path.join(work, "atlas.h5ad")
    if not os.path.exists(gz):
        t = time.time()
        subprocess.run([sys.executable, os.path.join(HERE, "gen_atlas.py"), "--cells", str(a.cells),
                        "--genes", str(a.genes), "-o", os.path.join(work, "gen_packed.h5ad"),
                        "--csr-h5ad", plain], check=True)
        x = ad.read_h5ad(plain)
        rng = np.random.default_rng(0)
        x.obsm["X_umap"] = rng.standard_normal((x.n_obs, 2)).astype(np.float32)
        x.write_h5ad(gz, compression="gzip")
        del x
        os.unlink(plain)
        print("input: %s, %.0f MB, written in %.0f s" % (gz, os.path.getsize(gz) / 1e6, time.time() - t))
    alone = os.path.join(work, "alone.h5ad")
    t = time.time()
    subprocess.run([binary, "pack", gz, alone, "--quiet", "--threads", str(a.threads)], check=True,
                   stdout=subprocess.DEVNULL)
    pack_alone = time.time() - t
    print("pack alone: %.2f s" % pack_alone)

    cache = os.path.join(work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    args = [gz, "--cache-dir", cache, "--threads", str(a.threads)]
    log1 = os.path.join(work, "first.log")
    t = time.time()
    proc, url = start(binary, args, log1)
    until(url + "/v1/datasets/atlas/obsm/X_umap?format=binary")
    page = time.time() - t
    stop(proc)
    m = re.search(r"packed in ([0-9.]+) s", open(log1).read())
    server_pack = float(m.group(1)) if m else float("nan")
    print("first start: embedding answered after %.2f s; the server's pack %.2f s" % (page, server_pack))

    t = time.time()
    proc, url = start(binary, args, os.path.join(work, "second.log"))
    until(url + "/readyz")
    second = time.time() - t
    stop(proc)
    t = time.time()
    proc, url = start(binary, [alone, "--threads", str(a.threads)], os.path.join(work, "alone.log"))
    until(url + "/readyz")
    packed_start = time.time() - t
    stop(proc)
    print("second start ready: %.2f s; the packed file alone: %.2f s" % (second, packed_start))
    print("goal page <= pack alone + 2 s: %.2f <= %.2f: %s" %
          (page, pack_alone + 2, "met" if page <= pack_alone + 2 else "NOT met"))
    print("goal server pack <= 1.2x pack alone: %.2fx: %s" %
          (server_pack / pack_alone, "met" if server_pack <= 1.2 * pack_alone else "NOT met"))
    print("goal second start <= 1.2x packed alone: %.2fx: %s" %
          (second / packed_start, "met" if second <= 1.2 * packed_start else "NOT met"))


if __name__ == "__main__":
    main()
