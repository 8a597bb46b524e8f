#!/usr/bin/python3
"""Gene queries: ivserve over HTTP against anndata's backed mode, in the same
run, on the same matrix.

A web viewer colours an embedding by one gene, or draws a dot plot of a few
dozen: X[:, genes] over every cell.  Users without ivserve read that from a
standard .h5ad in backed mode, from a CSR file (what most files are) or a
CSC copy (what a viewer would prepare).  This script times

  anndata backed, CSR     adata.X[:, genes] on the standard CSR copy
  anndata backed, CSC     the same on a CSC copy
  ivserve, by var         GET /query?var=...&by=var (the CSC of the result,
                          from the gene-major copy the server builds)
  ivserve, cell rows      GET /query?var=... (one row per cell)

for 1 gene and for 50 genes over all cells, best of --reps (anndata's CSR
case once per --reps as well: it reads the whole matrix), and checks that
every reader got the same values.  The CSR copy is written by
`ivserve export`, the CSC copy from it with scipy and h5py (anndata's
csc_matrix encoding); both are kept in benchmarks/data.

Usage:
  /usr/bin/python3 benchmarks/bench_gene_anndata.py [--file benchmarks/data/atlas_200000.h5ad]
        [--bin build/ivserve] [--reps 3] [--port 18095]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import warnings

import h5py
import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def write_csc_copy(csr_path, csc_path):
    """The CSC copy of a standard CSR .h5ad: X converted, obs/var copied."""
    with h5py.File(csr_path, "r") as f:
        g = f["X"]
        shape = tuple(int(x) for x in g.attrs["shape"])
        m = sp.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]), shape=shape).tocsc()
        tmp = csc_path + ".tmp"
        with h5py.File(tmp, "w") as o:
            for k, v in f.attrs.items():
                o.attrs[k] = v
            for name in f:
                if name != "X":
                    f.copy(name, o)
            x = o.create_group("X")
            x.attrs["encoding-type"] = "csc_matrix"
            x.attrs["encoding-version"] = "0.1.0"
            x.attrs["shape"] = np.array(shape, dtype=np.int64)
            x.create_dataset("data", data=m.data)
            x.create_dataset("indices", data=m.indices)
            x.create_dataset("indptr", data=m.indptr)
        os.replace(tmp, csc_path)


def best(fn, reps):
    t_best, out = None, None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t
        t_best = t if t_best is None or t < t_best else t_best
    return t_best, out


def http_get(url):
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.ivserve.csr"})
    with urllib.request.urlopen(req) as r:
        return r.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="benchmarks/data/atlas_200000.h5ad")
    ap.add_argument("--bin", default="build/ivserve")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=18095)
    a = ap.parse_args()
    os.chdir(REPO)
    if not os.path.exists(a.file):
        sys.exit(f"{a.file} is missing: benchmarks/gen_atlas.py --cells 200000 -o {a.file}")
    stem = a.file[:-len(".h5ad")]
    csr, csc = stem + ".std_csr.h5ad", stem + ".std_csc.h5ad"
    if not os.path.exists(csr):
        print(f"writing {csr} (ivserve export)", flush=True)
        subprocess.run([a.bin, "export", a.file, "-o", csr], check=True, stdout=subprocess.DEVNULL)
    if not os.path.exists(csc):
        print(f"writing {csc} (scipy tocsc)", flush=True)
        write_csc_copy(csr, csc)

    with h5py.File(a.file, "r") as f:
        n_cells, n_genes = (int(x) for x in f["X"].attrs["shape"])
    rng = random.Random(50)
    cases = {"1 gene": [123], "50 genes": sorted(rng.sample(range(n_genes), 50))}

    import anndata
    warnings.simplefilter("ignore")
    results = {}
    ref = {}
    for label, path in (("anndata backed, CSR", csr), ("anndata backed, CSC", csc)):
        ad = anndata.read_h5ad(path, backed="r")
        for case, genes in cases.items():
            t, m = best(lambda: ad.X[:, genes], a.reps)
            m = sp.csc_matrix(m)
            m.sort_indices()
            results[(label, case)] = t
            if case in ref:
                assert (ref[case] != m).nnz == 0, f"{label} {case}: differs from the CSR read"
            else:
                ref[case] = m
            print(f"{label:24s} {case:9s} {t * 1e3:10.1f} ms", flush=True)
        ad.file.close()

    log = open(os.path.join(os.path.dirname(a.file) or ".", "bench_gene_anndata.log"), "w")
    srv = subprocess.Popen([a.bin, "--port", str(a.port), "--access-log", "off", a.file],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{a.port}/v1/datasets/{os.path.basename(stem)}"
        # Cell queries are served first; the gene-major copy comes after.
        for _ in range(3000):
            try:
                doc = json.loads(urllib.request.urlopen(base).read())
                states = [v.get("state") for v in doc.get("orientations", {}).values()]
                if states and all(s == "ready" for s in states):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        else:
            sys.exit("the gene-major copy never became ready")
        sys.path.insert(0, os.path.join(REPO, "clients", "python"))
        import ivserve
        ds = ivserve.connect(f"http://127.0.0.1:{a.port}")[os.path.basename(stem)]
        for case, genes in cases.items():
            q = ",".join(map(str, genes))
            t, body = best(lambda: http_get(f"{base}/query?var={q}&by=var"), a.reps)
            results[("ivserve, by var", case)] = t
            print(f"{'ivserve, by var':24s} {case:9s} {t * 1e3:10.1f} ms  {len(body)} bytes", flush=True)
            t, body = best(lambda: http_get(f"{base}/query?var={q}"), a.reps)
            results[("ivserve, cell rows", case)] = t
            print(f"{'ivserve, cell rows':24s} {case:9s} {t * 1e3:10.1f} ms  {len(body)} bytes", flush=True)
            # The same values through the Python client (cell rows as scipy).
            got = sp.csc_matrix(ds.query(var=genes).to_scipy())
            got.sort_indices()
            assert (got != ref[case]).nnz == 0, f"ivserve {case}: differs from anndata"
    finally:
        srv.terminate()
        srv.wait()

    print()
    print(f"{n_cells} cells x {n_genes} genes ({a.file}), best of {a.reps}; ratio = anndata / ivserve by var")
    print(f"{'reader':24s} {'1 gene ms':>11s} {'50 genes ms':>12s} {'ratio 1':>9s} {'ratio 50':>9s}")
    for label in ("anndata backed, CSR", "anndata backed, CSC", "ivserve, by var", "ivserve, cell rows"):
        t1, t50 = results[(label, "1 gene")], results[(label, "50 genes")]
        r1 = t1 / results[("ivserve, by var", "1 gene")]
        r50 = t50 / results[("ivserve, by var", "50 genes")]
        print(f"{label:24s} {t1 * 1e3:11.1f} {t50 * 1e3:12.1f} {r1:9.1f} {r50:9.1f}")


if __name__ == "__main__":
    main()
