#!/usr/bin/python3
"""Viewer-route benchmark over HTTP (response read), against the real server.

Measures, median of --reps runs on one keep-alive connection:
  * an embedding of every cell as binary float32 (stored float32, and
    stored float64 converted per request), on a dataset of --umap-cells
    cells (the matrix of that dataset is nearly empty: only the obsm
    array matters);
  * grouped statistics on an atlas (benchmarks/gen_atlas.py): 50 genes by
    cell_type (mean + frac_nonzero) over all cells, and every gene (a
    pseudobulk table, binary), plus the baseline a viewer has without the
    route: one /count per cell type for one gene (sum only);
  * gene search over the atlas' gene names (33,000);
  * /healthz latency while the pseudobulk aggregate runs (the loop must
    not block: the work is on the workers).

Usage:
  /usr/bin/python3 benchmarks/bench_viewer.py --bin build/ivserve \\
      --atlas benchmarks/data/atlas_200000.h5ad [--umap-cells 1260000] [--threads 16]
The atlas gets an obsm/X_umap (float32) added when it has none.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import http.client
import urllib.parse

import h5py
import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import ivref  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ensure_umap_dataset(path, n):
    if os.path.exists(path):
        return
    rng = np.random.default_rng(1)
    rows = np.arange(0, n, 97)
    X = sp.csr_matrix((np.ones(rows.shape[0], np.int32), (rows, rows % 10)), shape=(n, 10))
    ivref.write_iv(path, X, obs=False, var=False)
    with h5py.File(path, "a") as f:
        g = f.create_group("obsm")
        g.create_dataset("X_umap", data=rng.standard_normal((n, 2)).astype(np.float32))
        g.create_dataset("X_umap64", data=rng.standard_normal((n, 2)))


def ensure_atlas_umap(path):
    with h5py.File(path, "a") as f:
        if "obsm" in f and "X_umap" in f["obsm"]:
            return
        n = f["obs"]["_index"].shape[0] if "_index" in f["obs"] else None
        n = n or int(f["X"].attrs["shape"][0])
        g = f["obsm"] if "obsm" in f else f.create_group("obsm")
        g.create_dataset("X_umap", data=np.random.default_rng(2).standard_normal((n, 2)).astype(np.float32))


class Http:
    """One keep-alive connection (the standard library only: the 16-core
    benchmark machine has no requests module)."""

    def __init__(self, port):
        self.port = port
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def req(self, method, path, params=None, body=None, headers=None):
        if params:
            path += "?" + urllib.parse.urlencode(params)
        h = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        self.c.request(method, path, body=data, headers=h)
        r = self.c.getresponse()
        r.content = r.read()
        r.status_code = r.status
        r.json = lambda: json.loads(r.content)
        r.text = r.content[:300].decode(errors="replace")
        return r

    def get(self, path, **kw):
        return self.req("GET", path, **kw)

    def post(self, path, json=None, **kw):
        return self.req("POST", path, body=json, **kw)


def timed(fn, reps):
    ts = []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/ivserve")
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--umap-cells", type=int, default=1_260_000)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    a = ap.parse_args()
    os.makedirs(a.data, exist_ok=True)
    umap_path = os.path.join(a.data, "umap_%d.h5ad" % a.umap_cells)
    ensure_umap_dataset(umap_path, a.umap_cells)
    ensure_atlas_umap(a.atlas)
    port = free_port()
    cmd = [a.bin, "--port", str(port), "--access-log", "off", "--max-json-bytes", str(1 << 30)]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    cmd += [umap_path, a.atlas]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    try:
        t0 = time.time()
        while True:
            try:
                if Http(port).get("/readyz").status_code == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() - t0 > 600:
                raise SystemExit("server did not start")
            time.sleep(0.2)
        print("server ready in %.1f s (threads %s)" % (time.time() - t0, a.threads or "all cores"))
        s = Http(port)
        url = ""
        um = os.path.basename(umap_path)[:-5]
        at = os.path.basename(a.atlas)[:-5]
        doc = s.get(url + "/v1/datasets/" + at).json()
        n_cells, n_genes = doc["shape"]
        types = [c["name"] for c in next(c for c in doc["obs"]["columns"] if c["name"] == "cell_type")["categories"]]
        print("atlas %s: %d cells x %d genes, nnz %d, %d cell types; viewer memory %s" % (
            at, n_cells, n_genes, doc["nnz"], len(types), doc["viewer_bytes"]))
        rows = []

        def row(what, secs, extra=""):
            rows.append((what, secs * 1e3, extra))
            print("  %-62s %9.2f ms  %s" % (what, secs * 1e3, extra), flush=True)

        t, r = timed(lambda: s.get(url + "/v1/datasets/%s/obsm/X_umap" % um,
                                   headers={"Accept": "application/vnd.ivserve.array"}), a.reps)
        row("X_umap of %d cells, binary float32 (stored float32)" % a.umap_cells, t, "%.1f MB" % (len(r.content) / 1e6))
        t, r = timed(lambda: s.get(url + "/v1/datasets/%s/obsm/X_umap64" % um,
                                   params={"dtype": "float32", "format": "binary"}), a.reps)
        row("X_umap of %d cells, binary float32 (from float64)" % a.umap_cells, t, "%.1f MB" % (len(r.content) / 1e6))
        sel = np.random.default_rng(3).choice(a.umap_cells, a.umap_cells // 100, replace=False)
        t, r = timed(lambda: s.post(url + "/v1/datasets/%s/obsm/X_umap" % um,
                                    json={"obs": {"index": sel.tolist()}, "format": "binary"}), a.reps)
        row("X_umap of a 1%% random cell selection (index list body)", t, "%.1f MB" % (len(r.content) / 1e6))

        genes = list(range(0, n_genes, max(1, n_genes // 50)))[:50]
        body = {"var": {"index": genes}, "group_by": "cell_type", "stats": ["mean", "frac_nonzero"]}
        t, r = timed(lambda: s.post(url + "/v1/datasets/%s/aggregate" % at, json=body), a.reps)
        assert r.status_code == 200, r.text[:300]
        row("aggregate 50 genes by cell_type, mean+frac_nonzero, JSON", t)
        body1 = {"var": {"index": genes[:1]}, "group_by": "cell_type", "stats": ["mean", "frac_nonzero"]}
        t, r = timed(lambda: s.post(url + "/v1/datasets/%s/aggregate" % at, json=body1), a.reps)
        row("aggregate 1 gene by cell_type, mean+frac_nonzero", t)

        def per_type_counts():
            for ty in types:
                rr = s.post(url + "/v1/datasets/%s/count" % at,
                            json={"obs": {"filter": {"column": "cell_type", "eq": ty}}, "var": {"index": genes[:1]}})
                assert rr.status_code == 200
        t, _ = timed(per_type_counts, a.reps)
        row("baseline: %d /count requests (1 gene, one per cell type)" % len(types), t)

        bodyall = {"group_by": "cell_type", "stats": ["mean", "frac_nonzero"], "format": "binary"}
        stop = threading.Event()
        lat = []

        def probe():
            ps = Http(port)
            while not stop.is_set():
                t1 = time.perf_counter()
                ps.get(url + "/healthz")
                lat.append(time.perf_counter() - t1)
                time.sleep(0.002)
        th = threading.Thread(target=probe)
        th.start()
        t, r = timed(lambda: s.post(url + "/v1/datasets/%s/aggregate" % at, json=bodyall), max(3, a.reps // 2))
        stop.set()
        th.join()
        assert r.status_code == 200, r.text[:300]
        row("aggregate all %d genes by cell_type (pseudobulk), binary" % n_genes, t, "%.1f MB" % (len(r.content) / 1e6))
        if lat:
            row("  /healthz during it: max", max(lat), "median %.2f ms, %d probes" % (statistics.median(lat) * 1e3, len(lat)))

        for q in ("CD3", "gene0001", "MT-", "zzz"):
            t, r = timed(lambda: s.get(url + "/v1/datasets/%s/var/search" % at, params={"q": q}), a.reps * 3)
            row("var/search q=%s over %d names (HTTP round trip)" % (q, n_genes), t, "%d matches" % r.json()["total"])
        t, r = timed(lambda: s.get(url + "/healthz"), a.reps * 3)
        row("/healthz round trip (for scale)", t)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
