"""The web viewer in a real browser (Debian's chromium, headless, driven by
python3-selenium) against a real ivserve on a generated dataset that has an
embedding (obsm/X_umap, see viewerdata.py).

What is checked, through the page's DOM and its test hook window.__ivTest
(web/viewer/app.js), always against the API's own answers and, where the
file gives one, the numbers written into the file:
  * the files are served with their media types, strong ETags (SHA-256 of
    the file), 304 on If-None-Match, and a gzip copy that unpacks to them;
  * the scatter drew exactly n_cells points, at the coordinates the obsm
    route returns, and the pixel at an isolated cell has that cell's colour
    (WebGL and the canvas 2D fallback);
  * colouring by a categorical column gives one colour a category, the
    legend's; colouring by a gene found through the search box gives each
    sampled cell the ramp colour of the value the query route returns;
  * a box drawn with the mouse selects exactly the cells inside it counted
    here; the downloaded .npz and the shown curl command both give the
    API's answer for those cells; a lasso selects the cells inside it;
  * the dot plot's numbers equal the aggregate route's (and pandas');
  * a server error is shown; a bearer token typed into the page opens a
    server that needs one; the page works behind nginx under /ivserve/.

Screenshots of every view go to <build>/test-output/viewer/.

Parts that need routes a server may not have yet (obsm, var/search,
aggregate) are marked xfail with the reason when the server lacks the
route, and fail when it has the route and the page disagrees with it.
A missing browser is a failure that says what to install, never a skip.
"""

import gzip
import hashlib
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "proto", "python"))

import ivclient  # noqa: E402
import viewerdata  # noqa: E402
from ivprocess import ServerProcess, free_port, write_config  # noqa: E402

WEB = os.path.join(REPO, "web")
BIN = os.environ.get("IVSERVE_BIN", os.path.join(REPO, "build", "ivserve"))
OUT = os.path.join(os.path.dirname(os.path.abspath(BIN)), "test-output", "viewer")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
N_CELLS, N_GENES = 3000, 60
DS = "viewer"
MEDIA_ARRAY = "application/vnd.ivserve.array"

# The numeric ramp of web/viewer/colors.js, restated: (t, r, g, b).
RAMP = [(0.00, 48, 18, 90), (0.25, 44, 90, 160), (0.50, 32, 150, 140), (0.75, 140, 200, 60),
        (1.00, 250, 230, 40)]


# A gene's non-expressing cells (web/viewer/expression.js ZERO), restated.
ZERO = [215, 215, 215]


def ramp_color(t):
    t = 0.0 if not t >= 0 else min(t, 1.0)
    i = 1
    while i < len(RAMP) - 1 and t > RAMP[i][0]:
        i += 1
    a, b = RAMP[i - 1], RAMP[i]
    f = (t - a[0]) / (b[0] - a[0])
    return [math.floor(a[c] + (b[c] - a[c]) * f + 0.5) for c in (1, 2, 3)]


class Server(ServerProcess):
    """A real ivserve on one dataset (plus extra flags)."""

    def __init__(self, tmp, path, extra=()):
        cfg = write_config(tmp, {"datasets": [{"id": DS, "path": path}]})
        super().__init__(tmp, ["--config", cfg, "--threads", "2", *extra], binary=BIN)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("viewer")
    path = str(d / "viewer.h5ad")
    X, obs, umap = viewerdata.make_dataset(path, N_CELLS, N_GENES)
    return {"dir": str(d), "path": path, "X": X, "obs": obs, "umap": umap}


@pytest.fixture(scope="module")
def srv(data):
    s = Server(data["dir"], data["path"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def outdir():
    os.makedirs(OUT, exist_ok=True)
    return OUT


@pytest.fixture(scope="module")
def browser(data):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("python3-selenium")
    if missing:
        pytest.fail("the browser tests need Debian's chromium, chromium-driver and python3-selenium "
                    "(scripts/setup.sh installs them); missing: %s" % ", ".join(missing))
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # SwiftShader gives headless Chromium a software WebGL.
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--use-angle=swiftshader",
              "--enable-unsafe-swiftshader", "--window-size=1400,900", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    downloads = os.path.join(data["dir"], "downloads")
    os.makedirs(downloads, exist_ok=True)
    opts.add_experimental_option("prefs", {"download.default_directory": downloads,
                                           "download.prompt_for_download": False})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_script_timeout(60)
    drv.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
    drv.downloads = downloads
    yield drv
    drv.quit()


# ---- helpers ------------------------------------------------------------------

def wait_for(drv, js, timeout=30, what=None):
    """Polls the expression js (a `return ...` body) until it is truthy."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = drv.execute_script(js)
        except Exception as e:  # the page may still be loading its modules
            last = "error: %s" % e
        if last and not (isinstance(last, str) and last.startswith("error:")):
            return last
        time.sleep(0.1)
    msgs = drv.execute_script("return window.__ivTest ? __ivTest.messages() : 'no hook'")
    raise AssertionError("timed out waiting for %s (last %r); page messages: %r" % (what or js, last, msgs))


def next_frames(drv):
    """Returns after two animation frames, so that a draw the page asked
    for (requestAnimationFrame) has run before pixels are read."""
    drv.execute_async_script("const done = arguments[arguments.length - 1];"
                             "requestAnimationFrame(() => requestAnimationFrame(() => done(true)));")


def idle(drv, timeout=30):
    wait_for(drv, "return window.__ivTest && __ivTest.busy() === 0", timeout, "the page to be idle")
    next_frames(drv)


def open_page(drv, url, n=N_CELLS):
    drv.get(url)
    wait_for(drv, "return window.__ivTest && __ivTest.points() === %d && __ivTest.busy() === 0" % n,
             60, "the scatter to draw %d points" % n)


def shot(drv, outdir, name):
    drv.save_screenshot(os.path.join(outdir, name + ".png"))


def api_doc(srv):
    return requests.get(srv.url + "/v1/datasets/" + DS, timeout=10).json()


def need_obsm(srv):
    if "obsm" not in api_doc(srv):
        pytest.xfail("this ivserve has no obsm route (the dataset document lists no obsm): "
                     "the scatter cannot be drawn")


def need_route(srv, method, path, body=None):
    r = requests.request(method, srv.url + "/v1/datasets/" + DS + path, json=body, timeout=30)
    if r.status_code == 404 and "no such path" in r.text or \
            (path.startswith("/var/search") and r.status_code in (404, 422) and "search" in r.text
             and "column" in r.text):
        pytest.xfail("this ivserve has no %s %s route: %s" % (method, path.split("?")[0], r.text[:200]))
    return r


def parse_ivar(buf):
    """The obsm route's binary array (proto/enc_viewer.h) as (ids, values)."""
    assert buf[:4] == b"IVAR", buf[:16]
    ver, rows, cols = struct.unpack_from("<Iqq", buf, 4)
    assert ver == 1
    dt = np.dtype(buf[24:32].rstrip(b"\0").decode())
    flags = struct.unpack_from("<I", buf, 32)[0]
    pos, ids = 40, None
    if flags & 1:
        ids = np.frombuffer(buf, np.int64, rows, pos)
        pos += 8 * rows
    return ids, np.frombuffer(buf, dt, rows * cols, pos).reshape(rows, cols)


def api_umap(srv):
    r = requests.get(srv.url + "/v1/datasets/%s/obsm/X_umap?dtype=float32" % DS,
                     headers={"Accept": MEDIA_ARRAY}, timeout=30)
    assert r.status_code == 200, r.text
    return parse_ivar(r.content)[1]


def api_gene(srv, gene):
    res = ivclient.Client(srv.url).query(DS, var={"names": [gene]}, format="binary")
    return np.asarray(res.matrix.todense()).ravel().astype(np.float64)


def drag(drv, path):
    """Presses the mouse at path[0] (CSS pixels of the scatter), moves through
    the rest and releases at the last point."""
    from selenium.webdriver.common.action_chains import ActionChains
    ov = drv.find_element("id", "overlay")
    w, h = drv.execute_script("return __ivTest.canvasSize()")
    ac = ActionChains(drv, duration=20)
    x0, y0 = path[0]
    ac.move_to_element_with_offset(ov, int(round(x0 - w / 2)), int(round(y0 - h / 2))).click_and_hold()
    px, py = int(round(x0)), int(round(y0))
    for x, y in path[1:]:
        nx, ny = int(round(x)), int(round(y))
        ac.move_by_offset(nx - px, ny - py)
        px, py = nx, ny
    ac.release().perform()


# ---- the files -----------------------------------------------------------------

def web_files():
    out = ["index.html"]
    for name in sorted(os.listdir(os.path.join(WEB, "viewer"))):
        out.append("viewer/" + name)
    return out


CTYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}


def test_files_served_with_type_etag_304_and_gzip(srv):
    files = web_files()
    assert "viewer/app.js" in files
    for rel in files:
        body = open(os.path.join(WEB, rel), "rb").read()
        tag = '"%s"' % hashlib.sha256(body).hexdigest()[:32]
        url = srv.url + "/" + rel
        r = requests.get(url, headers={"Accept-Encoding": "identity"}, timeout=10)
        assert r.status_code == 200, (rel, r.status_code)
        assert r.headers["Content-Type"] == CTYPES[os.path.splitext(rel)[1]], rel
        assert r.headers["ETag"] == tag, rel
        assert r.content == body, rel
        assert "Content-Encoding" not in r.headers
        r = requests.get(url, headers={"If-None-Match": tag, "Accept-Encoding": "identity"}, timeout=10)
        assert r.status_code == 304 and r.content == b"", rel
        r = requests.get(url, headers={"If-None-Match": '"x", W/%s' % tag, "Accept-Encoding": "identity"},
                         timeout=10)
        assert r.status_code == 304, rel
        r = requests.get(url, headers={"If-None-Match": '"%s"' % ("0" * 32),
                                       "Accept-Encoding": "identity"}, timeout=10)
        assert r.status_code == 200, rel
        raw = requests.get(url, headers={"Accept-Encoding": "gzip"}, stream=True, timeout=10)
        zipped = raw.raw.read(decode_content=False)
        if raw.headers.get("Content-Encoding") == "gzip":
            assert gzip.decompress(zipped) == body, rel
            assert raw.headers["ETag"] == tag[:-1] + '-gz"', rel
            assert len(zipped) < len(body)
        else:
            assert zipped == body and len(body) < 200, rel  # only tiny files go uncompressed
        assert "Accept-Encoding" in raw.headers.get("Vary", "")
        r = requests.get(url, headers={"Accept-Encoding": "gzip;q=0"}, timeout=10)
        assert "Content-Encoding" not in r.headers and r.content == body, rel
    index = open(os.path.join(WEB, "index.html"), "rb").read()
    r = requests.get(srv.url + "/", headers={"Accept-Encoding": "identity"}, timeout=10)
    assert r.status_code == 200 and r.content == index
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    r = requests.head(srv.url + "/viewer/app.js", timeout=10)
    assert r.status_code == 200 and r.content == b""
    r = requests.get(srv.url + "/viewer/nope.js", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = requests.get(srv.url + "/viewer/../index.html", timeout=10)
    assert r.status_code in (200, 404)  # requests folds the dots; the raw path is checked below
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /viewer/../viewer/app.js HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 404"), reply[:100]
    r = requests.post(srv.url + "/viewer/app.js", data=b"x", timeout=10)
    assert r.status_code == 405 and "GET" in r.headers["Allow"]
    # The API is untouched by the viewer's routes.
    assert requests.get(srv.url + "/v1/datasets", timeout=10).status_code == 200


# ---- the scatter -----------------------------------------------------------------

def isolated_cells(xy_screen, min_dist, k=5):
    """Up to k cells whose nearest neighbour on screen is at least min_dist
    pixels away, inside the canvas (so their pixel shows their own colour)."""
    out = []
    for i in np.argsort(-np.abs(xy_screen[:, 0] - np.median(xy_screen[:, 0]))):
        d = np.hypot(*(xy_screen - xy_screen[i]).T)
        d[i] = np.inf
        if d.min() >= min_dist:
            out.append(int(i))
            if len(out) == k:
                break
    return out


def check_scatter(drv, srv, data, renderer):
    assert drv.execute_script("return __ivTest.renderer()") == renderer
    assert drv.execute_script("return __ivTest.points()") == N_CELLS
    umap = api_umap(srv)
    assert umap.shape == (N_CELLS, 2)
    np.testing.assert_array_equal(umap, data["umap"])  # the API serves what the file holds
    rng = np.random.default_rng(5)
    sample = sorted(set(rng.choice(N_CELLS, 60, replace=False).tolist()) | {0, N_CELLS - 1})
    got = np.array(drv.execute_script("return __ivTest.coords(arguments[0])", sample), dtype=np.float64)
    np.testing.assert_array_equal(got, umap[sample].astype(np.float64))
    # Pixels: an isolated cell's centre shows its colour, so the points are
    # drawn where the coordinates say.
    screen = np.array(drv.execute_script(
        "const n = __ivTest.nCells(), c = __ivTest.coords([...Array(n).keys()]);"
        "return c.map(([x, y]) => __ivTest.dataToScreen(x, y));"))
    w, h = drv.execute_script("return __ivTest.canvasSize()")
    inside = (screen[:, 0] > 10) & (screen[:, 0] < w - 10) & (screen[:, 1] > 10) & (screen[:, 1] < h - 10)
    assert inside.all(), "after fitting, every cell is on the canvas"
    size = drv.execute_script("return __ivTest.pointSize()")
    cells = isolated_cells(screen, size + 3)
    assert cells, "no isolated cell to look at"
    colors = drv.execute_script("return __ivTest.colors(arguments[0])", cells)
    next_frames(drv)
    for i, col in zip(cells, colors):
        px = drv.execute_script("return __ivTest.pixel(arguments[0], arguments[1])", *screen[i].tolist())
        assert px[:3] == col[:3], (i, px, col, screen[i].tolist())
    # Background where no cell is: the canvas corner.
    assert drv.execute_script("return __ivTest.pixel(2, 2)")[:3] == [255, 255, 255]


def test_scatter_draws_every_cell_at_api_coordinates(browser, srv, data, outdir):
    need_obsm(srv)
    open_page(browser, srv.url + "/?renderer=webgl")
    check_scatter(browser, srv, data, "webgl")
    shot(browser, outdir, "scatter_webgl")


def test_software_webgl_draws_on_the_cpu(browser, srv, data, outdir):
    """Headless Chromium's WebGL is SwiftShader, a software rasterizer:
    unless renderer=webgl asks for it, the page draws with the canvas 2D
    context, and says why."""
    need_obsm(srv)
    open_page(browser, srv.url + "/")
    name = browser.execute_script("return __ivTest.glName()")
    assert "swiftshader" in name.lower(), name
    assert "software WebGL" in browser.execute_script("return __ivTest.glSkipped()")
    check_scatter(browser, srv, data, "canvas2d")


def test_scatter_canvas_fallback(browser, srv, data, outdir):
    need_obsm(srv)
    open_page(browser, srv.url + "/?renderer=canvas")
    check_scatter(browser, srv, data, "canvas2d")
    shot(browser, outdir, "scatter_canvas2d")


def test_colour_by_categorical_column(browser, srv, data, outdir):
    need_obsm(srv)
    from selenium.webdriver.support.ui import Select
    open_page(browser, srv.url + "/")
    Select(browser.find_element("id", "color-obs")).select_by_value("cell_type")
    wait_for(browser, "return __ivTest.colorInfo().kind === 'categorical' && __ivTest.busy() === 0")
    col = requests.get(srv.url + "/v1/datasets/%s/obs/cell_type" % DS, timeout=10).json()
    names = [c["name"] for c in col["categories"]]
    assert names == list(data["obs"].cell_type.cat.categories)
    items = browser.find_elements("css selector", "#legend .legend-item")
    assert [e.get_attribute("data-category") for e in items] == names
    counts = [int(e.find_element("css selector", ".legend-count").text.replace(",", "")) for e in items]
    assert counts == [c["count"] for c in col["categories"]]
    swatch = {}
    for e in items:
        rgb = e.find_element("css selector", ".swatch").value_of_css_property("background-color")
        swatch[e.get_attribute("data-category")] = [int(v) for v in rgb[rgb.index("(") + 1:-1].split(",")[:3]]
    assert len({tuple(v) for v in swatch.values()}) == len(names), "categories share a colour"
    sample = list(range(0, N_CELLS, 37))
    colors = browser.execute_script("return __ivTest.colors(arguments[0])", sample)
    labels = data["obs"].cell_type.astype(str).to_numpy()
    for i, c in zip(sample, colors):
        assert c[:3] == swatch[labels[i]], (i, labels[i], c)
    shot(browser, outdir, "colour_cell_type")
    # A category picked in the legend is a selection of exactly its cells.
    items[1].click()
    wait_for(browser, "return __ivTest.selection() && __ivTest.selection().kind === 'categories'")
    assert browser.execute_script("return __ivTest.selection().count") == col["categories"][1]["count"]
    idx = browser.execute_script("return __ivTest.selectionIndices()")
    assert idx == np.flatnonzero(labels == names[1]).tolist()
    shot(browser, outdir, "select_category")


def test_gene_search_autocomplete(browser, srv, outdir):
    need_obsm(srv)
    r = need_route(srv, "GET", "/var/search?q=cd3&limit=12")
    assert r.status_code == 200, r.text
    want = [x["name"] for x in r.json()["results"]]
    assert set(want) == {"CD3E", "CD3D", "CD3G"}
    open_page(browser, srv.url + "/")
    box = browser.find_element("id", "gene")
    box.send_keys("cd3")
    wait_for(browser, "return !document.getElementById('gene-list').hidden")
    idle(browser)
    got = browser.execute_script(
        "return [...document.querySelectorAll('#gene-list li')].map(li => li.dataset.name)")
    assert got == want
    shot(browser, outdir, "gene_search")


def test_colour_by_gene_matches_query_values(browser, srv, data, outdir):
    need_obsm(srv)
    from selenium.webdriver.common.keys import Keys
    open_page(browser, srv.url + "/")
    gene = "CD79A"
    box = browser.find_element("id", "gene")
    box.clear()
    box.send_keys(gene + Keys.ENTER)
    wait_for(browser, "return __ivTest.colorInfo().kind === 'gene' && __ivTest.colorInfo().name === %r"
             " && __ivTest.busy() === 0" % gene)
    vals = api_gene(srv, gene)
    col = viewerdata.gene_names(N_GENES).index(gene)
    np.testing.assert_array_equal(vals, data["X"][:, col].toarray().ravel())  # API equals the file
    lo, hi = vals.min(), vals.max()
    assert hi > lo
    info = browser.execute_script("return __ivTest.colorInfo()")
    assert (info["lo"], info["hi"]) == (lo, hi)
    rng = np.random.default_rng(9)
    sample = sorted(set(rng.choice(N_CELLS, 150, replace=False).tolist())
                    | set(np.flatnonzero(vals == hi)[:3].tolist()) | set(np.flatnonzero(vals == lo)[:3].tolist()))
    colors = browser.execute_script("return __ivTest.colors(arguments[0])", sample)
    for i, c in zip(sample, colors):
        # Cells that do not express the gene get the light neutral colour
        # (web/viewer/expression.js ZERO), the others the ramp.
        want = ZERO if vals[i] == 0 else ramp_color((vals[i] - lo) / (hi - lo))
        assert max(abs(a - b) for a, b in zip(c[:3], want)) <= 1, (i, vals[i], c, want)
    # Cells with different values get different colours (the ramp is not flat).
    assert ramp_color(0) != ramp_color(1)
    bar = browser.find_element("css selector", "#legend .colorbar-labels").text.split()
    assert [float(x) for x in bar] == [lo, hi]
    shot(browser, outdir, "colour_gene")


# ---- selection -------------------------------------------------------------------

def test_box_selection_count_download_and_curl(browser, srv, data, outdir):
    need_obsm(srv)
    for f in os.listdir(browser.downloads):
        os.remove(os.path.join(browser.downloads, f))
    open_page(browser, srv.url + "/")
    umap = api_umap(srv).astype(np.float64)
    # A box over part of one blob (cell_type 0's centre is at (6, 0)).
    want = (4.8, 6.9, -1.3, 0.9)
    p0 = browser.execute_script("return __ivTest.dataToScreen(%r, %r)" % (want[0], want[3]))
    p1 = browser.execute_script("return __ivTest.dataToScreen(%r, %r)" % (want[1], want[2]))
    browser.find_element("id", "tool-box").click()
    drag(browser, [p0, ((p0[0] + p1[0]) / 2, (p0[1] + p1[1]) / 2), p1])
    sel = wait_for(browser, "return __ivTest.selection()", what="a selection")
    assert sel["kind"] == "box"
    b = sel["box"]
    scale = browser.execute_script("return __ivTest.view().scale")
    for got, w in zip((b["x0"], b["x1"], b["y0"], b["y1"]), want):
        assert abs(got - w) <= 3 / scale, (b, want)  # where the mouse went, to a few pixels
    inside = (umap[:, 0] >= b["x0"]) & (umap[:, 0] <= b["x1"]) & (umap[:, 1] >= b["y0"]) & (umap[:, 1] <= b["y1"])
    count = int(inside.sum())
    assert 50 < count < N_CELLS // 2
    assert sel["count"] == count
    assert browser.find_element("id", "sel-count").text.replace(",", "") == str(count)
    idx = browser.execute_script("return __ivTest.selectionIndices()")
    assert idx == np.flatnonzero(inside).tolist()
    shot(browser, outdir, "select_box")

    # The download: an .npz that scipy reads, equal to the API's answer.
    browser.find_element("id", "sel-download").click()
    deadline = time.time() + 30
    files = []
    while time.time() < deadline:
        files = [f for f in os.listdir(browser.downloads) if f.endswith(".npz")]
        if files and not any(f.endswith(".crdownload") for f in os.listdir(browser.downloads)):
            break
        time.sleep(0.2)
    assert files, "no .npz was downloaded; page messages: %r" % browser.execute_script("return __ivTest.messages()")
    path = os.path.join(browser.downloads, files[0])
    got = sp.load_npz(path)
    api = ivclient.Client(srv.url).query(DS, obs={"index": idx}, format="binary")
    assert got.shape == api.matrix.shape == (count, N_GENES)
    assert got.dtype == api.matrix.dtype == np.int32
    assert (got != api.matrix).nnz == 0
    assert (got != data["X"][idx]).nnz == 0
    with np.load(path) as z:
        assert z["obs"].tolist() == idx
        assert z["indices"].dtype == np.int32 and z["indptr"].dtype == np.int64

    # The curl command, run as shown, answers the same cells.
    cmd = browser.execute_script("return __ivTest.curl()")
    assert cmd.startswith("curl ") and "/v1/datasets/%s/query" % DS in cmd
    run = subprocess.run(["bash", "-c", cmd.replace("-o selection.ivqs", "-o -")], capture_output=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    m, obs = ivclient.parse_binary(run.stdout)
    assert (sp.csr_matrix(m) != data["X"][idx]).nnz == 0
    assert np.asarray(obs).tolist() == idx

    browser.find_element("id", "sel-clear").click()
    wait_for(browser, "return __ivTest.selection() === null")


def test_lasso_selection_count(browser, srv, outdir):
    need_obsm(srv)
    open_page(browser, srv.url + "/")
    umap = api_umap(srv).astype(np.float64)
    browser.find_element("id", "tool-lasso").click()
    # A triangle around the middle of the picture and across two blobs.
    tri = [(-3.0, 6.5), (6.5, 5.0), (1.0, -2.0)]
    pts = [browser.execute_script("return __ivTest.dataToScreen(%r, %r)" % p) for p in tri]
    path = []
    for a, b in zip(pts, pts[1:] + pts[:1]):
        for t in np.linspace(0, 1, 8, endpoint=False):
            path.append((a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t))
    drag(browser, path)
    sel = wait_for(browser, "return __ivTest.selection()", what="a lasso selection")
    assert sel["kind"] == "lasso"
    poly = np.array(sel["points"], dtype=np.float64)
    assert len(poly) >= 3
    # Even-odd rule, as numpy expressions, over the polygon the page used.
    x, y = umap[:, 0], umap[:, 1]
    inside = np.zeros(len(x), bool)
    for (xa, ya), (xb, yb) in zip(poly, np.roll(poly, 1, axis=0)):
        cross = (ya > y) != (yb > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            xint = (xb - xa) * (y - ya) / (yb - ya) + xa
        inside ^= cross & (x < xint)
    assert 20 < inside.sum() < N_CELLS
    assert sel["count"] == int(inside.sum())
    shot(browser, outdir, "select_lasso")


# ---- dot plot ----------------------------------------------------------------------

def test_dot_plot_matches_aggregate_route(browser, srv, data, outdir):
    need_obsm(srv)
    genes = ["CD3E", "MS4A1", "NKG7", "LYZ", "G0003"]
    r = need_route(srv, "POST", "/aggregate", {"var": {"names": genes}, "group_by": ["cell_type"],
                                               "stats": ["mean", "frac_nonzero"]})
    assert r.status_code == 200, r.text
    agg = r.json()
    from selenium.webdriver.support.ui import Select
    open_page(browser, srv.url + "/")
    browser.find_element("id", "dot-genes").send_keys(", ".join(genes))
    Select(browser.find_element("id", "dot-group")).select_by_value("cell_type")
    browser.find_element("id", "dot-draw").click()
    got = wait_for(browser, "const d = __ivTest.dotplot(); return d.genes.length ? d : null",
                   what="the dot plot")
    assert got["genes"] == [g["name"] for g in agg["genes"]] == genes
    assert got["groups"] == [" / ".join(g["key"]) for g in agg["groups"]]
    assert got["mean"] == agg["values"]["mean"]
    assert got["frac"] == agg["values"]["frac_nonzero"]
    # And the route agrees with pandas on the file's numbers.
    X, labels = data["X"], data["obs"].cell_type.astype(str).to_numpy()
    names = viewerdata.gene_names(N_GENES)
    for gi, grp in enumerate(got["groups"]):
        rows = np.flatnonzero(labels == grp)
        for gj, g in enumerate(genes):
            v = X[rows, names.index(g)].toarray().ravel()
            assert got["mean"][gi][gj] == pytest.approx(v.mean(), rel=1e-12)
            assert got["frac"][gi][gj] == pytest.approx((v != 0).mean(), rel=1e-12)
    assert len(browser.find_elements("css selector", "#dotplot circle.dot")) == len(genes) * len(got["groups"])
    shot(browser, outdir, "dot_plot")


# ---- errors, token, prefix ---------------------------------------------------------

def test_server_error_is_shown(browser, srv, outdir):
    need_obsm(srv)
    from selenium.webdriver.common.keys import Keys
    open_page(browser, srv.url + "/")
    r = requests.post(srv.url + "/v1/datasets/%s/query" % DS, json={"var": {"names": ["NO_SUCH_GENE"]}},
                      timeout=10)
    assert r.status_code == 422
    server_msg = r.json()["error"]["message"]
    box = browser.find_element("id", "gene")
    box.send_keys("NO_SUCH_GENE" + Keys.ENTER)
    wait_for(browser, "return __ivTest.messages().length > 0 && __ivTest.busy() === 0")
    text = browser.find_element("id", "messages").text
    assert server_msg in text, (server_msg, text)
    assert "422" in text
    assert browser.find_elements("css selector", "#messages .msg.error")
    shot(browser, outdir, "error_message")


def test_error_shown_without_embedding_route_or_data(browser, data, outdir, tmp_path):
    """A dataset without obsm still opens: the page says there is nothing to
    draw instead of staying blank."""
    path = str(tmp_path / "noumap.h5ad")
    shutil.copy(data["path"], path)
    with h5py.File(path, "a") as f:
        del f["obsm"]
    s = Server(str(tmp_path), path)
    try:
        browser.get(s.url + "/")
        wait_for(browser, "return window.__ivTest && __ivTest.dataset() && __ivTest.busy() === 0")
        note = browser.find_element("id", "scatter-note")
        assert note.is_displayed()
        assert "embedding" in note.text or "obsm" in note.text, note.text
        assert browser.execute_script("return __ivTest.points()") == 0
        shot(browser, outdir, "no_embedding")
    finally:
        assert s.stop() == 0


def test_bearer_token(browser, data, outdir, tmp_path):
    s = Server(str(tmp_path), data["path"], extra=["--token", "s3cret-token"])
    try:
        assert requests.get(s.url + "/v1/datasets", timeout=10).status_code == 401
        assert requests.get(s.url + "/", timeout=10).status_code == 200  # the page itself is public
        browser.get(s.url + "/")
        browser.execute_script("sessionStorage.clear()")
        browser.get(s.url + "/")
        wait_for(browser, "return window.__ivTest && __ivTest.messages().length > 0 && __ivTest.busy() === 0")
        assert "token" in browser.find_element("id", "messages").text.lower()
        shot(browser, outdir, "token_needed")
        need_obsm_doc = requests.get(s.url + "/v1/datasets/" + DS, timeout=10,
                                     headers={"Authorization": "Bearer s3cret-token"}).json()
        browser.find_element("id", "token").send_keys("s3cret-token")
        browser.find_element("css selector", "#token-form button").click()
        if "obsm" not in need_obsm_doc:
            wait_for(browser, "return __ivTest.dataset() === %r" % DS)
            pytest.xfail("the token opened the dataset, but this ivserve has no obsm route to draw")
        wait_for(browser, "return __ivTest.points() === %d && __ivTest.busy() === 0" % N_CELLS, 60)
        assert browser.execute_script("return sessionStorage.getItem('ivserve.token')") == "s3cret-token"
        assert "token" not in browser.find_element("id", "messages").text.lower()  # the complaint went away
        shot(browser, outdir, "token_accepted")
    finally:
        browser.execute_script("sessionStorage.clear()")
        assert s.stop() == 0


def test_behind_path_prefix(browser, srv, data, outdir, tmp_path):
    """nginx serves ivserve under /ivserve/: every URL of the page is
    relative, so the page, its modules and the API calls all go through
    the prefix."""
    need_obsm(srv)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(nginx, os.X_OK):
        pytest.fail("nginx is missing (package nginx-light, installed by scripts/setup.sh)")
    port = free_port()
    root = str(tmp_path / "nginx")
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    conf = os.path.join(root, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""daemon off; pid %(r)s/nginx.pid; error_log %(r)s/logs/error.log;
events { worker_connections 64; }
http {
  access_log %(r)s/logs/access.log;
  client_body_temp_path %(r)s/body; proxy_temp_path %(r)s/proxy; fastcgi_temp_path %(r)s/fcgi;
  uwsgi_temp_path %(r)s/uwsgi; scgi_temp_path %(r)s/scgi;
  server {
    listen 127.0.0.1:%(p)d;
    location /ivserve/ { proxy_pass http://127.0.0.1:%(u)d/; proxy_http_version 1.1; }
  }
}
""" % {"r": root, "p": port, "u": srv.port})
    proc = subprocess.Popen([nginx, "-p", root, "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if requests.get("http://127.0.0.1:%d/ivserve/" % port, timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            pytest.fail("nginx did not start: %s" % proc.stderr.read1(4000) if proc.poll() is not None else "")
        open_page(browser, "http://127.0.0.1:%d/ivserve/" % port)
        check_scatter(browser, srv, data, "canvas2d")
        log = open(os.path.join(root, "logs", "access.log")).read()
        assert "/ivserve/v1/datasets/%s/obsm/X_umap" % DS in log
        assert "/ivserve/viewer/app.js" in log
        shot(browser, outdir, "behind_prefix")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
