#!/usr/bin/python3
"""Differential expression over HTTP against scipy's per-gene loop.

On an atlas from benchmarks/gen_atlas.py (cell_type column, 33,000 genes),
served with its gene-major copy built in memory, measures (median of
--reps, answer read):
  * Welch's t-test, B cells against the rest, every gene;
  * the Wilcoxon rank-sum test, B cells against the rest, every gene;
  * the Wilcoxon test of each cell type against the rest, one request;
and, for the same one-versus-rest comparison, scipy's per-gene loop
(scipy.stats.mannwhitneyu(method="asymptotic", use_continuity=False) on
each gene's dense column, the loop scanpy-style tools run) over
--scipy-genes genes drawn at random, extrapolated to every gene, with
the route's scores and p-values for those genes compared against it.

Answers are trimmed with top_n (every gene is computed and ranked; only
the top_n of each end is sent), since every gene of every type in JSON
would be ~100 MB of text that measures the encoder, not the test.

Memory: the server's VmRSS is sampled every 2 ms during each request; the
largest rise over the RSS before the request is reported next to the
bound 64 MB + 16 B per selected cell, with VmHWM before and after.

Usage:
  /usr/bin/python3 benchmarks/bench_diffexp.py --bin build/ivserve \\
      --atlas benchmarks/data/atlas_200000.h5ad [--threads 2] [--scipy-genes 100] \\
      --csr benchmarks/data/atlas_200000.csr.h5ad
(the standard CSR copy gen_atlas.py --csr-h5ad writes, read for scipy).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time
import http.client
import warnings

import numpy as np


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, False

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, proc_status(self.pid, "VmRSS"))
            time.sleep(0.002)


def cpu_seconds(pid):
    """The process's user + system CPU time: on a machine shared with other
    work, the cost of a request that wall time (waiting for a core) hides."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(conn, path, body):
    t0 = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise SystemExit("HTTP %d: %s" % (r.status, data[:300]))
    return dt, json.loads(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--csr", required=True, help="the same matrix as a standard CSR .h5ad (gen_atlas.py "
                    "--csr-h5ad), read for scipy")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top-n", type=int, default=100)
    ap.add_argument("--scipy-genes", type=int, default=100)
    ap.add_argument("--group", default="B")
    a = ap.parse_args()

    port = free_port()
    cmd = [a.bin, "--port", str(port), "--listen", "127.0.0.1", "--log-format", "text",
           "--max-json-bytes", str(1 << 30), a.atlas]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        ds = os.path.splitext(os.path.basename(a.atlas))[0]
        conn = None
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise SystemExit("server exited: %s" % proc.stderr.read().decode()[-2000:])
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
                conn.request("GET", "/v1/datasets")
                doc = json.loads(conn.getresponse().read())
                items = doc.get("datasets", doc) if isinstance(doc, dict) else doc
                ds = items[0]["id"]
                conn.request("GET", "/v1/datasets/" + ds)
                d = json.loads(conn.getresponse().read())
                st = d.get("orientations", {}).get("genes", {}).get("state")
                if st in ("ready", "skipped", "failed"):
                    break
            except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        n_cells, n_genes = d["shape"]
        print("dataset %s: %d cells x %d genes, gene-major copy %s after %.1f s; server threads %s"
              % (ds, n_cells, n_genes, st, time.time() - t0, a.threads or "default"))
        path = "/v1/datasets/%s/diffexp" % ds
        where = {"where": "cell_type == '%s'" % a.group}
        cases = [
            ("t-test, %s vs rest" % a.group, {"group1": where, "method": "t-test", "top_n": a.top_n}),
            ("wilcoxon, %s vs rest" % a.group, {"group1": where, "method": "wilcoxon", "top_n": a.top_n}),
            ("wilcoxon, each type vs rest", {"group_by": "cell_type", "method": "wilcoxon", "top_n": a.top_n}),
        ]
        # One untimed pass first: it fills the server's chunk cache (server
        # state, not the request's memory) and the page cache.
        w_dt, _ = request(conn, path, {"group1": where, "method": "t-test", "top_n": 1})
        print("warm-up pass (t-test): %.3f s; VmRSS after %.1f MB" % (w_dt, proc_status(proc.pid, "VmRSS") / 1e6))
        results = {}
        for name, body in cases:
            times, rises, cpus = [], [], []
            hwm0 = proc_status(proc.pid, "VmHWM")
            for _ in range(a.reps):
                before = proc_status(proc.pid, "VmRSS")
                s = Sampler(proc.pid)
                s.start()
                c0 = cpu_seconds(proc.pid)
                dt, doc = request(conn, path, body)
                cpus.append(cpu_seconds(proc.pid) - c0)
                s.stop = True
                s.join()
                times.append(dt)
                rises.append(max(0, s.peak - before))
            hwm1 = proc_status(proc.pid, "VmHWM")
            n_sel = n_cells  # every cell is in the comparison (group + rest)
            bound = 64e6 + 16 * n_sel
            results[name] = (statistics.median(times), doc)
            print("%-32s median %8.3f s (runs %s), server CPU %.2f s a run; RSS rise max %.1f MB "
                  "(bound %.1f MB); VmHWM %.1f -> %.1f MB"
                  % (name, statistics.median(times), " ".join("%.3f" % t for t in times),
                     statistics.median(cpus), max(rises) / 1e6, bound / 1e6, hwm0 / 1e6, hwm1 / 1e6))
        # scipy's per-gene loop on a random subset of genes, each type vs rest
        rng = np.random.default_rng(0)
        genes = np.sort(rng.choice(n_genes, min(a.scipy_genes, n_genes), replace=False))
        ct, cols = load_scipy_data(a, genes)
        from scipy import stats
        types = [g["key"][0] for g in results["wilcoxon, each type vs rest"][1]["groups"]]
        t0 = time.perf_counter()
        ref = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for t in types:
                m = ct == t
                for k, j in enumerate(genes):
                    x = cols[:, k]
                    ref[(t, j)] = stats.mannwhitneyu(x[m], x[~m], method="asymptotic",
                                                     use_continuity=False).pvalue
        dt_scipy = time.perf_counter() - t0
        per_all = dt_scipy / len(genes) * n_genes
        ours = results["wilcoxon, each type vs rest"][0]
        print("scipy mannwhitneyu loop: %d genes x %d types in %.1f s -> %.0f s for all %d genes "
              "(extrapolated); route %.2f s: %.0fx faster" % (len(genes), len(types), dt_scipy, per_all,
                                                                n_genes, ours, per_all / ours))
        # equal results: the route with var = the subset, every gene sent
        # (a new connection: the first one idled out during scipy's loop)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        _, doc = request(conn, path, {"group_by": "cell_type", "method": "wilcoxon",
                                      "var": {"index": genes.tolist()}})
        worst = 0.0
        for g in doc["groups"]:
            for e in g["genes"]:
                p = ref[(g["key"][0], e["index"])]
                if np.isnan(p):
                    p = 1.0
                if p > 0:
                    worst = max(worst, abs(e["pval"] - p) / p)
        print("route vs scipy on those genes: largest relative p-value difference %.2e" % worst)
    finally:
        proc.terminate()
        proc.wait()


def load_scipy_data(a, genes):
    """cell_type (from the atlas' obs) and the genes' dense columns (cells x
    genes, float64, from the standard CSR copy)."""
    import h5py
    import scipy.sparse as sp
    from anndata.experimental import read_elem
    with h5py.File(a.atlas, "r") as f:
        ct = read_elem(f["obs"])["cell_type"].astype(str).to_numpy()
    with h5py.File(a.csr, "r") as f:
        g = f["X"]
        X = sp.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]), shape=tuple(g.attrs["shape"]))
    return ct, X[:, genes].toarray().astype(np.float64)


if __name__ == "__main__":
    main()
