#!/usr/bin/python3
"""Memory a served dataset takes, by part, per stored value and per cell.

For each file, starts ivserve twice on it and reads what the process holds:

  full:  the default cache budget (the whole stream stays cached after the
         start-up pass when it fits) and the gene-major copy built in memory;
  bare:  cache_bytes 0 and transpose_bytes 0, so only the fixed parts.

and prints, from the dataset document's "memory" member, each part in
bytes, bytes per stored value (nnz) and bytes per cell, then the process's
anonymous resident memory (RssAnon) in both runs: the difference between
them, measured by the kernel, checks the reported cache and gene-major
parts.  The search indexes are built on first use; the script asks one obs
search so that they are counted.  A scipy CSR of the matrix in memory
(float32 data, int32 indices, int64 indptr), what anndata loads, is
printed for comparison.

Usage:
  /usr/bin/python3 benchmarks/bench_memory.py [--bin build/ivserve] FILE.h5ad ...
  /usr/bin/python3 benchmarks/bench_memory.py --cells 200000 --cells 20000
      (generates benchmarks/data/atlas_N.h5ad with gen_atlas.py when missing)
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARTS = ["pointers", "values", "index", "cache", "stream", "other_orientation", "scratch",
         "metadata", "obsm", "search"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.status, r.read()


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def serve(binary, path, threads, extra, tmp):
    """Starts ivserve on path with config keys `extra`; waits until the
    dataset and its other orientation are settled; returns (proc, url, doc)."""
    port = free_port()
    cfg = {"datasets": [{"id": "d", "path": os.path.abspath(path)}]}
    cfg.update(extra)
    cpath = os.path.join(tmp, "cfg%d.json" % port)
    with open(cpath, "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, "log%d.txt" % port), "w")
    proc = subprocess.Popen([binary, "--config", cpath, "--port", str(port), "--threads",
                             str(threads), "--access-log", "off"], stdout=log, stderr=log)
    url = "http://127.0.0.1:%d" % port
    deadline = time.time() + 1800
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("ivserve exited; see %s" % log.name)
        try:
            st, body = get(url + "/v1/datasets/d")
            doc = json.loads(body)
            # The document is rendered at load ("none") and again when the
            # other orientation is settled.
            settled = extra.get("transpose_bytes") == 0 or \
                doc["orientations"]["genes"]["state"] in ("ready", "skipped", "failed")
            if st == 200 and settled:
                # One search builds the obs names' index (counted in "search").
                try:
                    get(url + "/v1/datasets/d/obs/search?q=cell1&limit=1")
                except Exception:
                    pass
                _, body = get(url + "/v1/datasets/d")
                return proc, url, json.loads(body)
        except Exception:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("ivserve did not get ready in time")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(binary, path, threads):
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, full = serve(binary, path, threads, {}, tmp)
        anon_full = status_kb(proc.pid, "RssAnon") * 1024
        stop(proc)
        proc, url, bare = serve(binary, path, threads, {"cache_bytes": 0, "transpose_bytes": 0}, tmp)
        anon_bare = status_kb(proc.pid, "RssAnon") * 1024
        stop(proc)
    return full, anon_full, bare, anon_bare


def report(path, full, anon_full, bare, anon_bare):
    n_cells, n_genes = full["shape"]
    nnz = full["nnz"]
    mem = full["memory"]
    cells = full["orientations"]["cells"]
    genes = full["orientations"]["genes"]
    print("%s: %d cells x %d genes, nnz %d (%.1f per cell), packed stream %d bytes (%.3f per value), "
          "file %d bytes" % (os.path.relpath(path, ROOT), n_cells, n_genes, nnz, nnz / n_cells,
                             cells["stream_bytes"], cells["stream_bytes"] / nnz, os.path.getsize(path)))
    print("  gene-major copy: %s" % genes["state"])
    print("  %-18s %14s %12s %12s" % ("part", "bytes", "per value", "per cell"))
    total = 0
    for p in PARTS:
        b = mem[p]
        total += b
        print("  %-18s %14d %12.4f %12.2f" % (p, b, b / nnz, b / n_cells))
    print("  %-18s %14d %12.4f %12.2f" % ("total reported", total, total / nnz, total / n_cells))
    bare_total = sum(bare["memory"][p] for p in PARTS)
    print("  process RssAnon, full run:             %14d" % anon_full)
    print("  process RssAnon, no cache, no copy:    %14d (reported parts %d)" % (anon_bare, bare_total))
    print("  RssAnon difference (kernel)            %14d" % (anon_full - anon_bare))
    print("  reported cache + gene-major + scratch  %14d" % (
        mem["cache"] + mem["other_orientation"] + mem["scratch"]
        - bare["memory"]["cache"] - bare["memory"]["scratch"]))
    csr = nnz * 8 + (n_cells + 1) * 8
    print("  baseline: scipy CSR in memory (f32 data, i32 indices, i64 indptr) %d bytes "
          "(%.2f per value)" % (csr, csr / nnz))
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--cells", type=int, action="append", default=[],
                    help="use (generate when missing) benchmarks/data/atlas_N.h5ad")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "ivserve"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    files = list(a.files)
    for n in a.cells:
        p = os.path.join(ROOT, "benchmarks", "data", "atlas_%d.h5ad" % n)
        if not os.path.exists(p):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            subprocess.check_call([sys.executable, os.path.join(HERE, "gen_atlas.py"),
                                   "--cells", str(n), "-o", p])
        files.append(p)
    if not files:
        ap.error("name files or --cells N")
    for f in files:
        report(f, *measure(a.bin, f, a.threads))


if __name__ == "__main__":
    main()
