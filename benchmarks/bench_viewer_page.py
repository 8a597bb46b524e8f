#!/usr/bin/python3
"""Viewer timing in a real browser: page load to the first full scatter,
and re-colouring by a new gene, on the synthetic atlas with an embedding.

  /usr/bin/python3 benchmarks/bench_viewer_page.py [--cells 200000] [--runs 5]
                                              [--build build] [--port P]
                                              [-- extra ivserve flags]

Uses benchmarks/data/atlas_N.h5ad (made by gen_atlas.py when missing) and
writes a copy, atlas_N_umap.h5ad, that has obsm/X_umap (one blob per cell
type, tests/python/viewerdata.py).  Starts `BUILD/ivserve` on it (2
worker threads, access log off) and headless Chromium (SwiftShader WebGL,
as in the tests), then measures with the page's own clock
(performance.now(), whose zero is the navigation start):

  load      navigation start -> the first frame that drew every cell
            (the page loads its modules, lists the datasets, reads the
            dataset document and the float32 embedding, then draws);
  recolour  the Enter key in the gene box -> two animation frames after
            the new colours were handed to the scatter (the query route
            answers that gene for every cell, the page makes the colours,
            the frame is drawn), each run a different gene;
  frame     one redraw of every cell after a small pan, waited for by
            reading a pixel back (what panning and zooming cost);
  hover     one hover look-up: the cell under the cursor found among the
            drawn cells, its ring drawn, its card filled (mean over 400
            positions across the scatter; the obs row that follows is a
            request, timed separately as "cell row");
  after DCL the first full scatter counted from DOMContentLoaded (the
            page's modules loaded) rather than from navigation start.

--data PATH uses an .h5ad that already has obsm/X_umap instead.  At a
million cells and more, pass `-- --other-orientation disk` (and let the
server pack its gene-major copy once): without it a gene is read from the
cell-major stream, seconds per gene.

Baselines measured in the same run with Python's requests on the same
server: the API requests the page makes for each, without the browser
(dataset list + document + embedding; the gene's binary query).  The
difference is the browser's own cost (modules, parsing, colours, drawing).
Prints best and median of R runs.  Not a ctest test.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import viewerdata  # noqa: E402


def ensure_data(cells):
    data = os.path.join(HERE, "data")
    os.makedirs(data, exist_ok=True)
    atlas = os.path.join(data, "atlas_%d.h5ad" % cells)
    if not os.path.exists(atlas):
        print("generating %s" % os.path.relpath(atlas, ROOT), file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(HERE, "gen_atlas.py"), "--cells", str(cells),
                        "-o", atlas], check=True)
    umap = os.path.join(data, "atlas_%d_umap.h5ad" % cells)
    if not os.path.exists(umap):
        shutil.copy(atlas, umap + ".tmp")
        viewerdata.add_umap(umap + ".tmp", "cell_type")
        os.replace(umap + ".tmp", umap)
    return umap


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    return statistics.median(xs)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--data", default=None, help="an .h5ad with obsm/X_umap (instead of the generated atlas)")
    ap.add_argument("--renderer", default=None, help="the page's renderer= parameter (webgl or canvas; "
                    "default: the page's own choice)")
    ap.add_argument("server_args", nargs="*", help="after --: extra ivserve flags")
    a = ap.parse_args(argv)
    path = a.data or ensure_data(a.cells)
    ds = os.path.splitext(os.path.basename(path))[0]
    port = a.port or free_port()
    url = "http://127.0.0.1:%d" % port
    tmp = tempfile.mkdtemp(prefix="bench_viewer")
    srv = subprocess.Popen([os.path.join(a.build, "ivserve"), "--port", str(port), "--threads", "2",
                            "--access-log", "off", *a.server_args, path], stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(tmp, "server.log"), "w"))
    drv = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if srv.poll() is not None:
                sys.exit("ivserve exited: " + open(os.path.join(tmp, "server.log")).read()[-2000:])
            time.sleep(0.1)
        doc = requests.get(url + "/v1/datasets/" + ds, timeout=10).json()
        if "obsm" not in doc:
            sys.exit("this ivserve has no obsm route: the viewer cannot draw (build the merged server)")
        with h5py.File(path, "r") as f:
            genes = [g.decode() if isinstance(g, bytes) else g for g in f["var"]["_index"][:200]]
        # Genes that many cells express, so the colours change every run.
        genes = genes[: 2 * a.runs + 2]

        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.keys import Keys
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-angle=swiftshader",
                    "--enable-unsafe-swiftshader", "--window-size=1400,900", "--force-device-scale-factor=1"):
            opts.add_argument(arg)
        drv = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                               options=opts)

        def wait(js, timeout=60):
            t = time.time()
            while time.time() - t < timeout:
                v = drv.execute_script(js)
                if v:
                    return v
                time.sleep(0.02)
            raise RuntimeError("timeout: %s; messages %r" % (js, drv.execute_script(
                "return window.__ivTest && __ivTest.messages()")))

        page = url + "/?dataset=" + ds + ("&renderer=" + a.renderer if a.renderer else "")
        load, recolor, frame, renderer, hover, after_dcl, row = [], [], [], None, [], [], []
        parts = {}  # the re-colour's stages (app.js timings)
        drv.get(page)  # warm-up: the first start of the browser's caches
        wait("return window.__ivTest && __ivTest.timings().firstScatter")
        for r in range(a.runs):
            drv.get("about:blank")
            drv.get(page)
            t = wait("return window.__ivTest && __ivTest.timings().firstScatter")
            assert drv.execute_script("return __ivTest.points()") == a.cells
            renderer = drv.execute_script("return __ivTest.renderer()")
            load.append(t)
            after_dcl.append(t - drv.execute_script(
                "return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
            wait("return __ivTest.busy() === 0")
            frame.append(drv.execute_script("return __ivTest.drawTime(10)")["ms"])
            hv = drv.execute_script(
                "if (!__ivTest.hoverTime) return null;"  # a page from before hover details
                "const [w, h] = __ivTest.canvasSize(), p = [];"
                "for (let k = 0; k < 400; k++) p.push([(k * 37) % w, (k * 53) % h]);"
                "return __ivTest.hoverTime(p)")
            if hv is not None:
                hover.append(hv)
            t0 = time.perf_counter()
            s0 = requests.get(url + "/v1/datasets/%s/obs?offset=%d&limit=1" % (ds, 1000 + r), timeout=10)
            row.append((time.perf_counter() - t0) * 1000)
            assert s0.status_code == 200
            for g in (genes[2 * r], genes[2 * r + 1]):
                box = drv.find_element("id", "gene")
                box.clear()
                box.send_keys(g + Keys.ENTER)
                wait("const t = __ivTest.timings(); return t.recolorGene === %s && __ivTest.busy() === 0 "
                     "&& t.recolor" % json.dumps(g))
                tm = drv.execute_script("return __ivTest.timings()")
                recolor.append(tm["recolor"])
                for k in ("geneFetch", "geneParse", "geneColors", "geneUpload", "geneFrame"):
                    parts.setdefault(k, []).append(tm.get(k, float("nan")))

        # Baselines: the same API requests without the browser.
        s = requests.Session()
        api_load, api_gene = [], []
        for r in range(a.runs):
            t0 = time.perf_counter()
            s.get(url + "/v1/datasets").json()
            s.get(url + "/v1/datasets/" + ds).json()
            b = s.get(url + "/v1/datasets/%s/obsm/X_umap?dtype=float32" % ds,
                      headers={"Accept": "application/vnd.ivserve.array"}).content
            api_load.append((time.perf_counter() - t0) * 1000)
            assert len(b) == 40 + 8 * a.cells
            for g in (genes[2 * r], genes[2 * r + 1]):
                t0 = time.perf_counter()
                q = s.post(url + "/v1/datasets/%s/query" % ds, json={"var": {"names": [g]}, "by": "var"},
                           headers={"Accept": "application/vnd.ivserve.csr"}).content
                api_gene.append((time.perf_counter() - t0) * 1000)
                assert q[:4] == b"IVQS"

        print("viewer timing: %s, %d cells, %s renderer, %d runs (load: %d, recolour: %d genes)%s"
              % (ds, a.cells, renderer, a.runs, len(load), len(recolor),
                 ", ivserve " + " ".join(a.server_args) if a.server_args else ""))
        print("load average: %s" % open("/proc/loadavg").read().split()[:3])
        print("%-44s %10s %10s" % ("what", "best ms", "median ms"))
        rows = [("page load -> first full scatter", load), ("  baseline: its API requests (requests)", api_load),
                ("re-colour by a new gene", recolor), ("  baseline: the gene's query (requests)", api_gene),
                ("one frame while panning (drawn, read back)", frame),
                ("first full scatter after DOMContentLoaded", after_dcl),
                ("hover look-up (cell found, ring, card)", hover),
                ("cell row: GET obs?offset=i&limit=1", row)]
        for name, xs in rows:
            if xs:
                print("%-44s %10.1f %10.1f" % (name, min(xs), median(xs)))
        print("re-colour stages, median ms: " + ", ".join("%s %.1f" % (k, median(v)) for k, v in parts.items()))
    finally:
        if drv is not None:
            drv.quit()
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(20)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
