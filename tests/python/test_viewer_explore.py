"""The viewer's exploring tools in a real browser (headless Chromium driven by
selenium, as tests/python/test_viewer.py does), against a real ivserve on a
dataset indexed by Ensembl-style ids with the symbols in var.feature_name
(viewerdata.make_dataset(symbols=...)).

Each test drives the page as a user would (typing, clicking, moving the
mouse) and judges what was drawn: pixels of the scatter, of the overlay
(rings) and of the violin canvas, besides the test hook's numbers, always
against numbers computed here from the file and the API:
  * a gene's zeros are drawn first in the neutral colour and expressing
    cells on top by value (a highest-value cell's pixel shows its colour);
    the clip is the nearest-rank percentile of the expressing cells;
  * several genes colour by their mean; the violins are the histograms of
    the expressing cells per category;
  * the gene box finds genes by symbol and by id and shows both;
  * hovering a cell shows its id and obs row, clicking pins it;
  * legend entries hide and show their cells ("only this" too); a numeric
    range hides cells outside it; counts follow;
  * the URL carries the view: opening it again draws the same picture.
"""

import os
import sys
import time

import numpy as np
import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import test_viewer as tv  # noqa: E402  (helpers and the browser set-up, not its tests)
import viewerdata  # noqa: E402
from ivprocess import write_config  # noqa: E402

N = tv.N_CELLS
DS = tv.DS
SYM = "feature_name"
NAMES = viewerdata.ensembl_ids(tv.N_GENES)
SYMBOLS = viewerdata.gene_names(tv.N_GENES)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("explore")
    path = str(d / "explore.h5ad")
    X, obs, umap = viewerdata.make_dataset(path, N, tv.N_GENES, symbols=SYM)
    return {"dir": str(d), "path": path, "X": X, "obs": obs, "umap": umap}


@pytest.fixture(scope="module")
def srv(data):
    s = tv.Server(data["dir"], data["path"])
    yield s
    assert s.stop() == 0


browser = tv.browser
outdir = tv.outdir


def gene_values(data, symbol):
    return data["X"][:, SYMBOLS.index(symbol)].toarray().ravel().astype(np.float64)


def type_genes(drv, text):
    from selenium.webdriver.common.keys import Keys
    box = drv.find_element("id", "gene")
    box.clear()
    box.send_keys(text + Keys.ENTER)
    tv.wait_for(drv, "return __ivTest.colorInfo().kind === 'gene' && __ivTest.busy() === 0", what="gene colours")
    tv.next_frames(drv)


def screen_of(drv, cells):
    return np.array(drv.execute_script(
        "return arguments[0].map(i => { const [x, y] = __ivTest.coords([i])[0]; return __ivTest.dataToScreen(x, y); })",
        [int(i) for i in cells]))


def all_screen(drv):
    return np.array(drv.execute_script(
        "const n = __ivTest.nCells(), c = __ivTest.coords([...Array(n).keys()]);"
        "return c.map(([x, y]) => __ivTest.dataToScreen(x, y));"))


def pixel(drv, p):
    """The canvas pixel at screen point p, read after any draw the page has
    already asked for (requestAnimationFrame) has run."""
    tv.next_frames(drv)
    return drv.execute_script("return __ivTest.pixel(arguments[0], arguments[1])", float(p[0]), float(p[1]))[:3]


def expected_order(v):
    z = np.flatnonzero(v == 0)
    e = np.flatnonzero(v != 0)
    return np.concatenate([z, e[np.argsort(v[e], kind="stable")]]).tolist()


def test_zeros_first_expressing_on_top_and_clip(browser, srv, data, outdir):
    tv.open_page(browser, srv.url + "/")
    type_genes(browser, "CD79A")  # a symbol: the index holds ids
    info = browser.execute_script("return __ivTest.colorInfo()")
    assert info["genes"] == [NAMES[SYMBOLS.index("CD79A")]] and info["name"] == "CD79A"
    v = gene_values(data, "CD79A")
    assert (v == 0).sum() > 500 and (v > 0).sum() > 300
    assert browser.execute_script("return __ivTest.drawOrder()") == expected_order(v)
    lo, hi = v.min(), v.max()
    assert (info["lo"], info["hi"]) == (lo, hi)
    cols = np.array(browser.execute_script("return __ivTest.colors([...Array(%d).keys()])" % N))[:, :3]
    assert (cols[v == 0] == tv.ZERO).all()
    for i in np.flatnonzero(v)[::7]:
        assert max(abs(a - b) for a, b in zip(cols[i], tv.ramp_color((v[i] - lo) / (hi - lo)))) <= 1
    # Pixels: every cell of the largest value is on top, in its own colour,
    # though the blobs overlap and many zero cells come later in the file.
    top = np.flatnonzero(v == hi)
    screen = screen_of(browser, top)
    want = tv.ramp_color(1.0)
    later_zero_near = 0
    all_xy = all_screen(browser)
    for i, p in zip(top, screen):
        assert max(abs(a - b) for a, b in zip(pixel(browser, p), want)) <= 1, (i, p)
        d = np.hypot(*(all_xy - p).T)
        later_zero_near += int(((d < 2) & (v == 0) & (np.arange(N) > i)).any())
    assert later_zero_near > 0, "the check needs a zero cell drawn over a top cell in file order"
    tv.shot(browser, outdir, "explore_zeros_first")

    # The clip: the 90th percentile (nearest rank) of the expressing cells.
    from selenium.webdriver.support.ui import Select
    Select(browser.find_element("id", "clip")).select_by_value("90")
    tv.wait_for(browser, "return __ivTest.colorInfo().clip === 90")
    info = browser.execute_script("return __ivTest.colorInfo()")
    e = np.sort(v[v != 0])
    clip = e[int(np.ceil(0.9 * len(e))) - 1]
    assert clip < hi and info["hi"] == clip
    cols = np.array(browser.execute_script("return __ivTest.colors([...Array(%d).keys()])" % N))[:, :3]
    for i in np.flatnonzero(v)[::5]:
        t = min(1.0, (v[i] - lo) / (clip - lo))
        assert max(abs(a - b) for a, b in zip(cols[i], tv.ramp_color(t))) <= 1
    assert "90th percentile" in browser.find_element("id", "legend").text


def test_gene_set_mean_and_violins(browser, srv, data, outdir):
    from selenium.webdriver.support.ui import Select
    tv.open_page(browser, srv.url + "/")
    type_genes(browser, "CD3E, CD3D MS4A1")
    v = np.float32((gene_values(data, "CD3E") + gene_values(data, "CD3D") + gene_values(data, "MS4A1")) / 3)
    vals = browser.execute_script("return __ivTest.colorInfo()")
    assert vals["genes"] == [NAMES[SYMBOLS.index(g)] for g in ("CD3E", "CD3D", "MS4A1")]
    assert vals["hi"] == pytest.approx(float(v.max()), rel=1e-6)
    assert browser.execute_script("return __ivTest.drawOrder()") == expected_order(v.astype(np.float64))
    Select(browser.find_element("id", "violin-by")).select_by_value("cell_type")
    vio = tv.wait_for(browser, "const v = __ivTest.violin(); return v && v.column === 'cell_type' && v",
                      what="the violins")
    labels = data["obs"].cell_type.astype(str).to_numpy()
    assert vio["labels"] == list(data["obs"].cell_type.cat.categories)
    nz = v[v != 0].astype(np.float64)
    a, b = nz.min(), nz.max()
    assert (vio["lo"], vio["hi"]) == pytest.approx((a, b), rel=1e-6)
    assert vio["bins"] == 32 and not vio["whole"]  # means of three counts are not whole numbers
    geom = vio["geom"]
    for k, name in enumerate(vio["labels"]):
        x = v[(labels == name) & (v != 0)].astype(np.float64)
        bins = np.minimum(31, np.floor((x - vio["lo"]) / (vio["hi"] - vio["lo"]) * 32)).astype(int)
        assert vio["counts"][k] == np.bincount(bins, minlength=32).tolist(), name
        assert vio["cells"][k] == int((labels == name).sum())
        assert vio["expressing"][k] == len(x)
        # Pixels: the widest bin is filled in the category's colour at the
        # centre line and white beyond its half width.
        bb = int(np.argmax(vio["counts"][k]))
        cx, y, half = geom["centres"][k], geom["binY"][bb], geom["halfWidths"][k][bb]
        got = browser.execute_script("return __ivTest.violinPixel(arguments[0], arguments[1])", cx, y)[:3]
        assert got == vio["colors"][k], (name, got)
        out = browser.execute_script("return __ivTest.violinPixel(arguments[0], arguments[1])", cx + half + 2, y)[:3]
        assert out == [255, 255, 255], (name, out)
    tv.shot(browser, outdir, "explore_violins")
    # One gene's counts are whole numbers: one bin per count.
    type_genes(browser, "NKG7")
    vio = tv.wait_for(browser, "const v = __ivTest.violin(); return v && v.whole && v", what="whole-number violins")
    c = gene_values(data, "NKG7")
    nz = c[c != 0]
    assert vio["bins"] == nz.max() - nz.min() + 1 and (vio["lo"], vio["hi"]) == (nz.min(), nz.max())
    for k, name in enumerate(vio["labels"]):
        x = c[(labels == name) & (c != 0)].astype(int) - int(nz.min())
        assert vio["counts"][k] == np.bincount(x, minlength=vio["bins"]).tolist(), name
        bb = int(np.argmax(vio["counts"][k]))
        got = browser.execute_script("return __ivTest.violinPixel(arguments[0], arguments[1])",
                                     vio["geom"]["centres"][k], vio["geom"]["binY"][bb])[:3]
        assert got == vio["colors"][k], (name, got)
    tv.shot(browser, outdir, "explore_violins_counts")


def test_search_by_symbol_shows_both(browser, srv, data, outdir):
    tv.open_page(browser, srv.url + "/")
    base = srv.url + "/v1/datasets/%s/var/search?q=cd3&limit=12" % DS
    by_sym = requests.get(base + "&by=" + SYM, timeout=10).json()["results"]
    assert {r["value"] for r in by_sym} == {"CD3E", "CD3D", "CD3G"}
    assert requests.get(base, timeout=10).json()["results"] == []  # the index has ids only
    box = browser.find_element("id", "gene")
    box.send_keys("cd3")
    tv.wait_for(browser, "return !document.getElementById('gene-list').hidden")
    tv.idle(browser)
    got = browser.execute_script("return [...document.querySelectorAll('#gene-list li')]"
                                 ".map(li => [li.dataset.symbol, li.dataset.name])")
    assert got == [[r["value"], r["name"]] for r in by_sym]
    text = browser.find_element("id", "gene-list").text
    for r in by_sym:
        assert r["value"] in text and r["name"] in text
    # And by id: the symbol is shown beside it.
    box.clear()
    box.send_keys(NAMES[7][:-1])
    tv.wait_for(browser, "return [...document.querySelectorAll('#gene-list li')].some(li => li.dataset.name === %r)"
                % NAMES[7])
    tv.idle(browser)
    sym = browser.execute_script("return document.querySelector('#gene-list li[data-name=\"%s\"]').dataset.symbol"
                                 % NAMES[7])
    assert sym == SYMBOLS[7]
    tv.shot(browser, outdir, "explore_search_symbol")
    browser.execute_script("document.querySelector('#gene-list li[data-name=\"%s\"]')"
                           ".dispatchEvent(new MouseEvent('mousedown', {bubbles: true}))" % NAMES[7])
    tv.wait_for(browser, "return __ivTest.colorInfo().name === %r && __ivTest.busy() === 0" % SYMBOLS[7])
    assert browser.execute_script("return __ivTest.colorInfo().genes") == [NAMES[7]]


def test_hover_shows_cell_and_click_pins(browser, srv, data, outdir):
    from selenium.webdriver.common.action_chains import ActionChains
    tv.open_page(browser, srv.url + "/")
    screen = all_screen(browser)
    size = browser.execute_script("return __ivTest.pointSize()")
    i = tv.isolated_cells(screen, size + 12, k=1)[0]
    w, h = browser.execute_script("return __ivTest.canvasSize()")
    ov = browser.find_element("id", "overlay")
    x, y = screen[i]
    ActionChains(browser).move_to_element_with_offset(ov, int(round(x - w / 2)), int(round(y - h / 2))).perform()
    tv.wait_for(browser, "return document.getElementById('hover-card').dataset.loaded === '%d'" % i,
                what="the hover card")
    assert browser.execute_script("return __ivTest.hovered()") == i
    row = requests.get(srv.url + "/v1/datasets/%s/obs?offset=%d&limit=1" % (DS, i), timeout=10).json()["rows"][0]
    assert row["_index"] == "cell%05d" % i
    card = browser.find_element("id", "hover-card").text
    assert "cell%05d" % i in card and "#%d" % i in card
    assert row["cell_type"] in card and str(row["batch"]) in card
    # The ring: dark pixels on the overlay around the cell, none at its centre.
    r = size / 2 + 3
    ring = browser.execute_script("return __ivTest.overlayPixel(arguments[0], arguments[1])", x + r, y)
    assert ring[3] > 100 and max(ring[:3]) < 60, ring
    assert browser.execute_script("return __ivTest.overlayPixel(arguments[0], arguments[1])", x, y)[3] == 0
    tv.shot(browser, outdir, "explore_hover")
    ActionChains(browser).click().perform()
    tv.wait_for(browser, "return document.getElementById('cell-pinned').dataset.loaded === '%d'" % i,
                what="the pinned cell")
    pinned = browser.find_element("id", "cell-pinned").text
    assert "cell%05d" % i in pinned and row["cell_type"] in pinned
    # Moving away: the hover ends, the pin stays, its ring red.
    ActionChains(browser).move_by_offset(0, 40).perform()
    time.sleep(0.2)
    ring = browser.execute_script("return __ivTest.overlayPixel(arguments[0], arguments[1])", x + r, y)
    assert ring[0] > 150 and ring[1] < 100 and ring[3] > 100, ring
    assert browser.execute_script("return __ivTest.pinned()") == i


def test_category_show_hide_only_and_range_filter(browser, srv, data, outdir):
    from selenium.webdriver.support.ui import Select
    tv.open_page(browser, srv.url + "/")
    Select(browser.find_element("id", "color-obs")).select_by_value("cell_type")
    tv.wait_for(browser, "return __ivTest.colorInfo().kind === 'categorical' && __ivTest.busy() === 0")
    labels = data["obs"].cell_type.astype(str).to_numpy()
    screen = all_screen(browser)
    size = browser.execute_script("return __ivTest.pointSize()")

    def deep(name):
        """Cells of a category with no cell of another within a few pixels."""
        own = np.flatnonzero(labels == name)
        other = screen[labels != name]
        out = [i for i in own if np.hypot(*(other - screen[i]).T).min() > size + 3]
        return out[:20]

    b_cells = deep("B cell")
    assert b_cells
    b_colour = pixel(browser, screen[b_cells[0]])
    assert b_colour != [255, 255, 255]
    item = browser.find_element("css selector", "#legend .legend-item[data-category='B cell']")
    item.find_element("css selector", "input.legend-show").click()
    tv.wait_for(browser, "return __ivTest.points() === %d" % (N - (labels == "B cell").sum()))
    for i in b_cells:
        assert pixel(browser, screen[i]) == [255, 255, 255], i
    assert browser.find_element("id", "shown-count").text.replace(",", "").startswith(str(N - (labels == "B cell").sum()))
    item = browser.find_element("css selector", "#legend .legend-item[data-category='B cell']")
    item.find_element("css selector", "input.legend-show").click()
    tv.wait_for(browser, "return __ivTest.points() === %d" % N)
    assert pixel(browser, screen[b_cells[0]]) == b_colour
    tv.shot(browser, outdir, "explore_hide_category")

    # Only NK cells.
    item = browser.find_element("css selector", "#legend .legend-item[data-category='NK cell']")
    item.find_element("css selector", ".legend-only").click()
    nk = labels == "NK cell"
    tv.wait_for(browser, "return __ivTest.points() === %d" % nk.sum())
    for i in b_cells:
        assert pixel(browser, screen[i]) == [255, 255, 255]
    nk_cells = deep("NK cell")
    assert pixel(browser, screen[nk_cells[0]]) != [255, 255, 255]
    counts = {e.get_attribute("data-category"): e.find_element("css selector", ".legend-count").text
              for e in browser.find_elements("css selector", "#legend .legend-item")}
    assert counts["B cell"] == "0 / %s" % format((labels == "B cell").sum(), ",")

    # A range on n_counts, with the category filter still on.
    nc = data["obs"].n_counts.to_numpy()
    lo, hi = float(np.percentile(nc, 25)), float(np.percentile(nc, 75))
    Select(browser.find_element("id", "filter-col")).select_by_value("n_counts")
    browser.find_element("id", "filter-lo").send_keys(repr(lo))
    browser.find_element("id", "filter-hi").send_keys(repr(hi))
    browser.find_element("id", "filter-add").click()
    want = nk & (nc >= lo) & (nc <= hi)
    tv.wait_for(browser, "return __ivTest.points() === %d" % want.sum(), what="the range filter")
    order = browser.execute_script("return __ivTest.drawOrder()")
    assert order == np.flatnonzero(want).tolist()
    tv.shot(browser, outdir, "explore_range_filter")
    browser.find_element("css selector", "#filters li[data-column='n_counts'] button").click()
    tv.wait_for(browser, "return __ivTest.points() === %d" % nk.sum())


def test_link_reopens_the_view(browser, srv, data, outdir):
    from selenium.webdriver.support.ui import Select
    tv.open_page(browser, srv.url + "/")
    Select(browser.find_element("id", "color-obs")).select_by_value("cell_type")
    tv.wait_for(browser, "return __ivTest.colorInfo().kind === 'categorical' && __ivTest.busy() === 0")
    item = browser.find_element("css selector", "#legend .legend-item[data-category='Platelet']")
    item.find_element("css selector", "input.legend-show").click()
    Select(browser.find_element("id", "filter-col")).select_by_value("n_counts")
    browser.find_element("id", "filter-lo").send_keys("3")
    browser.find_element("id", "filter-add").click()
    tv.idle(browser)
    type_genes(browser, "NKG7")
    Select(browser.find_element("id", "clip")).select_by_value("95")
    tv.wait_for(browser, "return __ivTest.colorInfo().clip === 95")
    # Zoom with the wheel, then a box over part of the picture.
    from selenium.webdriver.common.action_chains import ActionChains
    ov = browser.find_element("id", "overlay")
    browser.execute_script("arguments[0].dispatchEvent(new WheelEvent('wheel', {deltaY: -300, clientX: "
                           "arguments[0].getBoundingClientRect().left + 420, clientY: "
                           "arguments[0].getBoundingClientRect().top + 260, bubbles: true, cancelable: true}))", ov)
    time.sleep(0.4)
    browser.find_element("id", "tool-box").click()
    tv.drag(browser, [(300, 150), (420, 230), (520, 330)])
    sel = tv.wait_for(browser, "return __ivTest.selection()", what="a selection")
    assert sel["count"] > 20
    ActionChains(browser).perform()
    time.sleep(0.5)  # the address follows a moment after the last change
    url = browser.current_url
    assert "gene=" in url and "clip=95" in url and "hide=Platelet" in url and "sel=box" in url and "view=" in url
    before = {k: browser.execute_script("return __ivTest.%s" % js) for k, js in (
        ("order", "drawOrder()"), ("sel", "selectionIndices()"), ("view", "view()"), ("info", "colorInfo()"))}
    cells = np.array(before["order"])[::max(1, len(before["order"]) // 120)]
    spots = screen_of(browser, cells)
    pix_before = [pixel(browser, p) for p in spots]
    tv.shot(browser, outdir, "explore_link_before")
    browser.get("about:blank")
    browser.get(url)
    tv.wait_for(browser, "return window.__ivTest && __ivTest.colorInfo().kind === 'gene' && __ivTest.selection() "
                "&& __ivTest.busy() === 0", 60, "the view from the link")
    time.sleep(0.3)
    after = {k: browser.execute_script("return __ivTest.%s" % js) for k, js in (
        ("order", "drawOrder()"), ("sel", "selectionIndices()"), ("view", "view()"), ("info", "colorInfo()"))}
    assert after["view"] == before["view"]
    assert after["sel"] == before["sel"]
    assert after["order"] == before["order"]
    assert after["info"] == before["info"]
    pix_after = [pixel(browser, p) for p in spots]
    assert pix_after == pix_before
    tv.shot(browser, outdir, "explore_link_after")


def test_marker_genes_of_a_selection_and_of_every_category(browser, srv, data, outdir):
    from selenium.webdriver.support.ui import Select
    r = tv.need_route(srv, "POST", "/diffexp", {"group1": {"index": [0, 1, 2]}, "group2": "rest", "top_n": 1})
    assert r.status_code == 200, r.text
    tv.open_page(browser, srv.url + "/")
    Select(browser.find_element("id", "color-obs")).select_by_value("cell_type")
    tv.wait_for(browser, "return __ivTest.colorInfo().kind === 'categorical' && __ivTest.busy() === 0")
    labels = data["obs"].cell_type.astype(str).to_numpy()
    # A = the NK cells (a legend click), B = the monocytes.
    browser.find_element("css selector", "#legend .legend-item[data-category='NK cell'] .legend-label").click()
    tv.wait_for(browser, "return __ivTest.selection() && __ivTest.selection().count === %d"
                % (labels == "NK cell").sum())
    a_idx = browser.execute_script("return __ivTest.selectionIndices()")
    browser.find_element("id", "keep-a").click()
    browser.find_element("css selector", "#legend .legend-item[data-category='NK cell'] .legend-label").click()
    browser.find_element("css selector", "#legend .legend-item[data-category='Monocyte'] .legend-label").click()
    tv.wait_for(browser, "return __ivTest.selection() && __ivTest.selection().count === %d"
                % (labels == "Monocyte").sum())
    b_idx = browser.execute_script("return __ivTest.selectionIndices()")
    browser.find_element("id", "keep-b").click()
    assert "kept, %s cells" % format(len(a_idx), ",") in browser.find_element("id", "group-a").text
    browser.find_element("id", "de-run").click()
    got = tv.wait_for(browser, "const m = __ivTest.markers(); return m.length ? m : null", what="the marker table")
    api = requests.post(srv.url + "/v1/datasets/%s/diffexp" % DS, json={
        "group1": {"index": a_idx}, "group2": {"index": b_idx}, "method": "t-test", "top_n": 25}, timeout=30).json()
    assert api["n_group1"] == len(a_idx) and api["n_group2"] == len(b_idx)
    assert [g["name"] for g in got[0]["genes"]] == [g["name"] for g in api["genes"]]
    for g, w in zip(got[0]["genes"], api["genes"]):
        assert (g["score"], g["logfoldchange"], g["pval_adj"]) == (w["score"], w["logfoldchange"], w["pval_adj"])
    # Cell type k raises genes 2k and 2k + 1 (viewerdata): for NK cells
    # MS4A1 and NKG7, which lead the table.
    k = viewerdata.CELL_TYPES.index("NK cell")
    assert {got[0]["genes"][0]["name"], got[0]["genes"][1]["name"]} == {NAMES[2 * k], NAMES[2 * k + 1]}
    assert "NKG7" in browser.find_element("id", "markers").text
    tv.shot(browser, outdir, "explore_markers")
    # A click on a gene colours by it: the pixel of its top cell shows the ramp's end.
    top = got[0]["genes"][0]["name"]
    browser.find_element("id", "sel-clear").click()  # unselected cells are drawn faded
    tv.wait_for(browser, "return __ivTest.selection() === null")
    browser.find_element("css selector", "#markers tr.gene-row[data-name='%s']" % top).click()
    tv.wait_for(browser, "return __ivTest.colorInfo().kind === 'gene' && __ivTest.busy() === 0")
    assert browser.execute_script("return __ivTest.colorInfo().genes") == [top]
    v = gene_values(data, SYMBOLS[NAMES.index(top)])
    i = int(np.flatnonzero(v == v.max())[-1])
    p = screen_of(browser, [i])[0]
    assert max(abs(a - b) for a, b in zip(pixel(browser, p), tv.ramp_color(1.0))) <= 1

    # Every category of the coloured column against the rest.
    Select(browser.find_element("id", "color-obs")).select_by_value("cell_type")
    tv.wait_for(browser, "return __ivTest.colorInfo().kind === 'categorical' && __ivTest.busy() === 0")
    browser.find_element("id", "de-all").click()
    got = tv.wait_for(browser, "const m = __ivTest.markers(); return m.length > 1 ? m : null", what="every category")
    api = requests.post(srv.url + "/v1/datasets/%s/diffexp" % DS, json={
        "group_by": "cell_type", "reference": "rest", "method": "t-test", "top_n": 10}, timeout=30).json()
    assert [g["key"] for g in got] == [" / ".join(g["key"]) for g in api["groups"]]
    for g, w in zip(got, api["groups"]):
        assert [x["name"] for x in g["genes"]] == [x["name"] for x in w["genes"]]


def test_cells_list_csv(browser, srv, data, outdir):
    import pandas as pd
    for f in os.listdir(browser.downloads):
        os.remove(os.path.join(browser.downloads, f))
    tv.open_page(browser, srv.url + "/")
    browser.find_element("id", "tool-lasso").click()
    tv.drag(browser, [(250, 120), (600, 140), (560, 420), (260, 380), (250, 125)])
    sel = tv.wait_for(browser, "return __ivTest.selection()", what="a lasso selection")
    idx = browser.execute_script("return __ivTest.selectionIndices()")
    assert sel["count"] == len(idx) > 10
    browser.find_element("id", "sel-csv").click()
    deadline = time.time() + 30
    files = []
    while time.time() < deadline and not files:
        files = [f for f in os.listdir(browser.downloads) if f.endswith(".csv")]
        time.sleep(0.2)
    assert files, browser.execute_script("return __ivTest.messages()")
    got = pd.read_csv(os.path.join(browser.downloads, files[0]), keep_default_na=False)
    obs = data["obs"]
    assert got["position"].tolist() == idx
    assert got["_index"].tolist() == obs.index[idx].tolist()
    assert got["cell_type"].tolist() == obs.cell_type.astype(str).to_numpy()[idx].tolist()
    np.testing.assert_array_equal(got["n_counts"].to_numpy(np.float64), obs.n_counts.to_numpy()[idx])


def test_selection_h5ad(browser, srv, data, outdir):
    """Download .h5ad: the server's file (POST .../export of the selection
    the CSV download takes), saved under the server's name, read by
    anndata: X and obs rows of the selected cells, in order."""
    import anndata
    import scipy.sparse as sp
    for f in os.listdir(browser.downloads):
        os.remove(os.path.join(browser.downloads, f))
    tv.open_page(browser, srv.url + "/")
    browser.find_element("id", "tool-lasso").click()
    tv.drag(browser, [(250, 120), (600, 140), (560, 420), (260, 380), (250, 125)])
    sel = tv.wait_for(browser, "return __ivTest.selection()", what="a lasso selection")
    idx = browser.execute_script("return __ivTest.selectionIndices()")
    assert sel["count"] == len(idx) > 10
    browser.find_element("id", "sel-h5ad").click()
    want_name = "%s_%d_cells.h5ad" % (DS, len(idx))
    path = os.path.join(browser.downloads, want_name)
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(path) and
                                          not any(f.endswith(".crdownload") for f in os.listdir(browser.downloads))):
        time.sleep(0.2)
    assert os.path.exists(path), (os.listdir(browser.downloads), browser.execute_script("return __ivTest.messages()"))
    # The server's bytes, as they came.
    direct = requests.post(srv.url + "/v1/datasets/%s/export" % DS, json={"obs": {"index": idx}}, timeout=60)
    assert direct.status_code == 200
    with open(path, "rb") as f:
        assert len(f.read()) == int(direct.headers["Content-Length"])
    got = anndata.read_h5ad(path)
    obs = data["obs"]
    assert got.shape == (len(idx), data["X"].shape[1])
    assert (sp.csr_matrix(got.X) != data["X"][idx]).nnz == 0
    assert got.X.dtype == data["X"].dtype
    assert got.obs_names.tolist() == obs.index[idx].tolist()
    assert got.obs["cell_type"].astype(str).tolist() == obs.cell_type.astype(str).to_numpy()[idx].tolist()
    np.testing.assert_array_equal(got.obs["n_counts"].to_numpy(np.float64), obs.n_counts.to_numpy()[idx])


def test_draw_order_sort_is_exact_for_negative_nan_and_ties(browser, srv):
    """The radix sort behind the draw order (web/viewer/expression.js), run
    in the page on values a counts matrix never has: negatives, -0, NaN,
    subnormals, ties; against numpy's stable sort."""
    tv.open_page(browser, srv.url + "/")
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.normal(0, 3, 4000), np.zeros(500), [-0.0, np.nan, np.nan, 1e-42, -1e-42, 3e38, -3e38],
                        np.round(rng.normal(0, 2, 2000))]).astype(np.float32)
    rng.shuffle(v)
    got = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "import('./viewer/expression.js').then(m => {"
        "  const v = Float32Array.from(arguments[0], x => x === null ? NaN : x);"
        "  const r = m.colourExpression(v, 99);"
        "  done({order: Array.from(r.order), first: r.firstExpressing, lo: r.lo, hi: r.hi, max: r.max});"
        "}).catch(e => done({error: String(e)}));", [None if np.isnan(x) else float(x) for x in v])
    assert "error" not in got, got
    v64 = v.astype(np.float64)
    low = np.flatnonzero((v64 == 0) | np.isnan(v64))
    e = np.flatnonzero((v64 != 0) & ~np.isnan(v64))
    assert got["first"] == len(low)
    assert got["order"] == np.concatenate([low, e[np.argsort(v64[e], kind="stable")]]).tolist()
    assert got["lo"] == np.nanmin(v64) and got["max"] == np.nanmax(v64)
    srt = np.sort(v64[e])
    assert got["hi"] == srt[int(np.ceil(0.99 * len(srt))) - 1]
