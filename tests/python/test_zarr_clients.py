"""The Zarr store read by the JavaScript clients it is for, from npm:
zarrita (Vitessce's Zarr library) in node reads a CSC gene column and an
obs categorical column; the Vitessce 4.0.8 bundle in headless Chromium
draws a served dataset's UMAP coloured by a gene, with no JavaScript
error, and the colours change with the gene (judged from screenshots).

tests/web/npm_setup.sh fetches the packages once into a cache folder
(IVSERVE_NPM_CACHE, else npm-cache/ beside the binary); without the npm
registry these tests fail, saying so.  The Vitessce page is served by a
tiny http.server: React 18's UMD files, an import map pointing react,
react-dom, react-dom/client and react/jsx-runtime at modules that re-export
window.React / window.ReactDOM (built in the page from their keys), and
Vitessce's ESM bundle, which leaves only React out.
"""
import functools
import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import zarrdata  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
WEB = os.path.join(REPO, "tests", "web")
NPM_DIR = os.environ.get("IVSERVE_NPM_CACHE") or os.path.join(
    os.path.dirname(os.path.abspath(zarrdata.BIN)), "npm-cache")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
N_OBS, N_VAR = 4000, 60
TOKEN = "vitessce-token"


@pytest.fixture(scope="module")
def npm():
    if not shutil.which("npm") or not shutil.which("node"):
        pytest.fail("the client tests need node and npm (scripts/setup.sh installs them)")
    t0 = time.time()
    env = dict(os.environ, IVSERVE_NPM_CACHE=NPM_DIR)
    p = subprocess.run(["sh", os.path.join(WEB, "npm_setup.sh")], capture_output=True, text=True,
                       env=env, timeout=600)
    if p.returncode != 0:
        pytest.fail("tests/web/npm_setup.sh failed (is the npm registry reachable? CI has it): %s"
                    % (p.stderr[-2000:] or p.stdout[-2000:]))
    print("npm_setup.sh: %.1f s" % (time.time() - t0))
    return NPM_DIR


class Page(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def page_site(tmp_path_factory, npm):
    """A folder served over HTTP with the Vitessce page and the packages."""
    root = tmp_path_factory.mktemp("site")
    for name in ("vitessce", "react", "react-dom"):
        os.symlink(os.path.join(npm, name), str(root / name))
    shutil.copy(os.path.join(WEB, "vitessce.html"), str(root / "index.html"))
    httpd = socketserver.ThreadingTCPServer(("127.0.0.1", 0),
                                            functools.partial(Page, directory=str(root)))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture(scope="module")
def env(tmp_path_factory, page_site):
    tmp = str(tmp_path_factory.mktemp("zarrc"))
    d = zarrdata.make_data(7, N_OBS, N_VAR, "float32", density=0.3)
    path = os.path.join(tmp, "v.h5ad")
    zarrdata.write_dataset(path, *d, orientation="ivcsr")
    s = zarrdata.Server(tmp, [{"id": "v", "path": path}, {"id": "lock", "path": path, "tokens": [TOKEN]}],
                        cfg_extra={"cors_origins": [page_site]})
    zarrdata.wait_both(s.url, ["v"])
    yield s, d
    assert s.stop() == 0, s.log_text()[-3000:]


def zarrita(npm, url, gene, column):
    p = subprocess.run(["node", os.path.join(WEB, "zarrita_read.mjs"), npm, url, str(gene), column],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


@pytest.mark.parametrize("gene", [0, 17, N_VAR - 1])
def test_zarrita_reads_a_gene_and_an_obs_column(env, npm, gene):
    s, (X, obs, var, obsm, varm) = env
    got = zarrita(npm, "%s/v1/datasets/v/zarr" % s.url, gene, "cell_type")
    col = sp.csc_matrix(X)[:, gene]
    col.sort_indices()
    assert got["encoding"] == "csc_matrix" and got["shape"] == [N_OBS, N_VAR]
    assert got["indices"] == col.indices.tolist()
    assert np.array_equal(np.array(got["data"], np.float32), col.data)
    assert got["categories"] == list(obs["cell_type"].cat.categories)
    assert got["codes"] == obs["cell_type"].cat.codes.tolist()


def test_zarrita_repeats_the_token_of_the_store_url(env, npm):
    s, (X, obs, var, obsm, varm) = env
    got = zarrita(npm, "%s/v1/datasets/lock/zarr?token=%s" % (s.url, TOKEN), 3, "batch")
    assert got["codes"] == obs["batch"].cat.codes.tolist()
    p = subprocess.run(["node", os.path.join(WEB, "zarrita_read.mjs"), npm,
                        "%s/v1/datasets/lock/zarr" % s.url, "3", "batch"], capture_output=True, text=True)
    assert p.returncode != 0  # without it: 401, which zarrita reports


# ---- Vitessce in headless Chromium ------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("python3-selenium")
    if missing:
        pytest.fail("the browser tests need Debian's chromium, chromium-driver and python3-selenium; "
                    "missing: %s" % ", ".join(missing))
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-angle=swiftshader",
              "--enable-unsafe-swiftshader", "--window-size=1000,800", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_script_timeout(60)
    yield drv
    drv.quit()


# Draws the screenshot into a 2-D canvas and returns the plot's pixels
# (every 2nd one of the Vitessce root's box) as RGB triples.
PIXELS_JS = """
const [b64, done] = [arguments[0], arguments[arguments.length - 1]];
const img = new Image();
img.onload = () => {
  const r = document.getElementById('root').getBoundingClientRect();
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, img.width, img.height).data;
  const out = [];
  for (let y = Math.ceil(r.top); y < Math.min(r.bottom, img.height); y += 2)
    for (let x = Math.ceil(r.left); x < Math.min(r.right, img.width); x += 2) {
      const i = 4 * (y * img.width + x);
      out.push(d[i], d[i + 1], d[i + 2]);
    }
  done(out);
};
img.src = 'data:image/png;base64,' + b64;
"""


def pixels(drv):
    return np.array(drv.execute_async_script(PIXELS_JS, drv.get_screenshot_as_base64()),
                    np.int16).reshape(-1, 3)


def x_requests(s):
    return [json.loads(l) for l in s.log_text().splitlines()
            if '"path":"/v1/datasets/v/zarr/X/' in l]


def draw(drv, s, site, gene, timeout=60):
    """Opens the page for a gene and waits until Vitessce fetched that
    gene's X chunks and the picture stopped changing; returns the pixels
    and the X requests the gene made."""
    before = len(x_requests(s))
    url = "%s/index.html?store=%s&gene=%s" % (site, "%s/v1/datasets/v/zarr" % s.url, gene)
    drv.get(url)
    deadline = time.time() + timeout
    last, stable = None, 0
    while time.time() < deadline:
        errs = drv.execute_script("return window.__errors || []")
        assert not errs, errs
        reqs = x_requests(s)[before:]
        # The legend names the gene once its values are in; the chunks may
        # come from the browser's cache (Cache-Control) for a later gene.
        if drv.execute_script("return document.body.textContent.includes(arguments[0])", gene):
            px = pixels(drv)
            if last is not None and np.array_equal(px, last):
                stable += 1
                if stable >= 2:
                    return px, reqs
            else:
                stable = 0
            last = px
        time.sleep(0.3)
    raise AssertionError("Vitessce did not draw gene %s; page errors %r; log %r" % (
        gene, drv.execute_script("return window.__errors || []"), drv.get_log("browser")[-20:]))


def test_vitessce_colours_the_embedding_by_gene(env, browser, page_site):
    s, (X, obs, var, obsm, varm) = env
    genes = [var.index[5], var.index[40]]
    shots, costs = [], []
    for g in genes:
        px, reqs = draw(browser, s, page_site, g)
        shots.append(px)
        costs.append((len(reqs), sum(r["bytes"] for r in reqs)))
    errs = browser.execute_script("return window.__errors || []")
    # Vitessce probes .zarray on groups (a 404 it expects and says so).
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and
              "favicon" not in e["message"] and
              not re.search(r"/zarr/[^ ]*\.zarray - Failed to load resource: .* 404", e["message"])]
    assert not errs and not severe, (errs, severe)
    a, b = shots
    for px in shots:
        # Points are drawn: many pixels differ from the background (the most
        # frequent colour), in many colours.
        vals, counts = np.unique(px, axis=0, return_counts=True)
        bg = vals[np.argmax(counts)]
        pts = px[np.abs(px - bg).sum(axis=1) > 40]
        assert len(pts) > 500, len(pts)
        assert len(np.unique(pts, axis=0)) > 20
    # The colours change with the gene.
    changed = np.abs(a - b).sum(axis=1) > 30
    assert changed.sum() > 300, changed.sum()
    print("Vitessce colour-by-gene: X requests and bytes per gene: %s" % costs)
