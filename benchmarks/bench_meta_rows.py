#!/usr/bin/python3
"""The obs part of to_anndata() alone: the whole table (names and every
column from the GET routes, then .iloc, the path before issue 29) against
the selected rows from POST .../obs (docs/meta-rows.md), on the synthetic
atlas, one server, alternating, a fresh Dataset each time; checks the two
frames equal.  Prints wall and client CPU per run and the POST answer's
size (identity and gzip).

Usage:
  /usr/bin/python3 benchmarks/bench_meta_rows.py --bin build/ivserve
      [--cells 200000] [--select 10000] [--runs 3] [--port 18094]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cells", type=int, default=200000)
    ap.add_argument("--select", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18094)
    a = ap.parse_args()
    import numpy as np
    import pandas as pd
    import requests
    import ivserve
    atlas = os.path.join(HERE, "data", f"atlas_{a.cells}.h5ad")
    if not os.path.exists(atlas):
        sys.exit(f"{atlas} is missing: benchmarks/bench_to_anndata.py generates it")
    tmp = tempfile.mkdtemp()
    url = f"http://127.0.0.1:{a.port}"
    srv = subprocess.Popen([a.bin, "--port", str(a.port), "--access-log", "off", "--cache-dir",
                            os.path.join(tmp, "cache"), atlas], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/readyz").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        ds_id = f"atlas_{a.cells}"
        rows = np.sort(np.random.default_rng(29).choice(a.cells, a.select, replace=False))
        wire = {"index": rows.tolist()}
        res = {"whole": [], "rows": []}
        for _ in range(a.runs):
            got = {}
            for k in res:
                ds = ivserve.connect(url, timeout=600)[ds_id]
                t, c = time.perf_counter(), time.process_time()
                got[k] = (ds.read_frame("obs").iloc[rows] if k == "whole"
                          else ds._frame_rows("obs", wire, False))
                res[k].append((time.perf_counter() - t, time.process_time() - c))
            pd.testing.assert_frame_equal(got["whole"], got["rows"])
        for k, v in res.items():
            print(f"obs {k:5s}  wall " + " ".join("%.3f" % w for w, _ in v) +
                  "   client CPU " + " ".join("%.3f" % c for _, c in v))
        body = {"obs": wire, "columns": ds.columns("obs"), "format": "json", "limit": 100000}
        u = f"{url}/v1/datasets/{ds_id}/obs"
        plain = requests.post(u, json=body, headers={"Accept-Encoding": "identity"}).content
        gz = requests.post(u, json=body, headers={"Accept-Encoding": "gzip"}, stream=True).raw.read(
            decode_content=False)
        print(f"POST .../obs answer for {a.select} rows: {len(plain)} bytes, {len(gz)} with gzip; "
              f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
