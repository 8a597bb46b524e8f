"""Both orientations over HTTP: the gene-major (or cell-major) copy built
after load, companion files, gene-row answers ("by": "var") and dense gene
vectors ("dense": true) in the three encodings, the orientations in the
dataset document and in /count."""
import json
import os
import time

import numpy as np
import pytest
import requests
import scipy.sparse as sp

from test_http_server import FILES, FIX, Server, ds_id, expected, ivclient, same


def wait_other(url, d, want="ready", timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        doc = requests.get(f"{url}/v1/datasets/{d}").json()
        other = "genes" if doc["orientation"] == "ivcsr" else "cells"
        if doc["orientations"][other]["state"] == want:
            return doc
        time.sleep(0.05)
    raise AssertionError("orientation of %s never became %s: %s" % (d, want, doc))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("orient")))
    for m in FILES:
        wait_other(s.url, ds_id(m))
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


def test_document_reports_both_orientations(srv):
    for m in FILES:
        doc = requests.get(f"{srv.url}/v1/datasets/{ds_id(m)}").json()
        o = doc["orientations"]
        own = "cells" if doc["orientation"] == "ivcsr" else "genes"
        other = "genes" if own == "cells" else "cells"
        assert o[own]["state"] == "ready" and o[own]["source"] == "file", o
        assert o[other]["state"] == "ready" and o[other]["source"] == "memory", o
        assert o[other]["bytes"] > 0 and o[other]["stream_bytes"] > 0, o
    assert "orientation ready" in srv.log_text()


@pytest.mark.parametrize("fmt", ["binary", "ndjson", "json"])
@pytest.mark.parametrize("m", FILES, ids=[ds_id(m) for m in FILES])
def test_by_var_and_dense_every_encoding(srv, m, fmt):
    c = ivclient.Client(srv.url)
    exp = expected(m)
    n_obs, n_var = exp.shape
    rng = np.random.default_rng(abs(hash((m["file"], fmt, "var"))) % 2**32)
    for trial in range(4):
        obs = None if trial == 0 else rng.integers(0, n_obs, size=int(rng.integers(0, min(n_obs, 40) + 1)))
        var = [int(rng.integers(0, n_var))] if trial < 2 else rng.integers(0, n_var, size=int(rng.integers(0, 12)))
        obs_idx = np.arange(n_obs) if obs is None else obs
        want = exp[obs_idx][:, var]
        res = c.query(ds_id(m), obs=obs, var=var, format=fmt, by="var")
        assert sp.isspmatrix_csc(res.matrix), type(res.matrix)
        same(res.matrix.tocsr(), want)
        assert np.array_equal(res.var, np.asarray(var, np.int64))
        # Within each gene, cell positions ascend.
        for j in range(res.matrix.shape[1]):
            seg = res.matrix.indices[res.matrix.indptr[j]:res.matrix.indptr[j + 1]]
            assert np.all(np.diff(seg) > 0)
        d = c.query(ds_id(m), obs=obs, var=var, format=fmt, dense=True)
        assert d.dense.shape == (len(var), len(obs_idx))
        dense_want = want.toarray().T
        assert np.array_equal(np.isnan(d.dense), np.isnan(dense_want))
        assert np.array_equal(np.nan_to_num(d.dense.astype(np.float64)), np.nan_to_num(dense_want))
        # The cell-row answer is unchanged.
        r = c.query(ds_id(m), obs=obs, var=var, format=fmt)
        same(r.matrix, want)


def test_count_reports_the_serving_orientation(srv):
    c = ivclient.Client(srv.url)
    for m in FILES:
        exp = expected(m)
        # Gene rows: the gene-major copy decodes one gene, the file all of
        # them.  (As cell rows, a 60-cell fixture is cheaper to scan than
        # to transpose, and the planner says so.)
        one_gene = requests.post(f"{srv.url}/v1/datasets/{ds_id(m)}/count",
                                 json={"var": {"index": [0]}, "by": "var"}).json()
        one_cell = c.count(ds_id(m), obs=[0])
        assert one_gene["nnz"] == exp[:, [0]].nnz and one_cell["nnz"] == exp[[0]].nnz
        assert one_gene["orientation"] == "genes", one_gene
        assert one_cell["orientation"] == "cells", one_cell
        assert one_gene["orientations"]["cells"]["bytes"] > 0
        assert one_gene["orientations"]["genes"]["bytes"] > 0


def test_dense_needs_by_var(srv):
    d = ds_id(FILES[0])
    r = requests.post(f"{srv.url}/v1/datasets/{d}/query", json={"by": "obs", "dense": True})
    assert r.status_code == 400, r.text
    r = requests.post(f"{srv.url}/v1/datasets/{d}/query", json={"by": "genes"})
    assert r.status_code == 400, r.text
    r = requests.get(f"{srv.url}/v1/datasets/{d}/query?var=1&by=var&dense=true&format=json")
    assert r.status_code == 200 and r.json()["dense"] is True, r.text


def test_budget_skip_and_companion(tmp_path):
    pairs = {}
    for m in FILES:
        pairs.setdefault(m["expected"], {})[m["orientation"]] = m
    both = [p for p in pairs.values() if "ivcsr" in p and "ivcsc" in p]
    assert both, "no fixture in both orientations"
    a, b = both[0]["ivcsr"], both[0]["ivcsc"]
    other = [p for p in pairs.values() if p is not both[0] and "ivcsc" in p][0]["ivcsc"]
    datasets = [
        {"id": "skip", "path": os.path.join(FIX, a["file"]), "transpose_bytes": 16},
        {"id": "comp", "path": os.path.join(FIX, a["file"]), "companion": os.path.join(FIX, b["file"])},
        {"id": "wrong", "path": os.path.join(FIX, a["file"]),
         "companion": os.path.join(FIX, other["file"])},
    ]
    s = Server(str(tmp_path), datasets=datasets)
    try:
        doc = wait_other(s.url, "skip", "skipped")
        assert "bytes" not in doc["orientations"]["genes"]
        doc = wait_other(s.url, "comp")
        assert doc["orientations"]["genes"]["source"] == "companion"
        wait_other(s.url, "wrong", "failed")
        log = s.log_text()
        assert "skipped" in log and "is not the other orientation" in log, log[-2000:]
        c = ivclient.Client(s.url)
        exp = expected(a)
        # Served all the same: the file's orientation, or the companion.
        for d in ("skip", "comp", "wrong"):
            same(c.query(d, var=[1]).matrix, exp[:, [1]])
            same(c.query(d, var=[1], by="var").matrix.tocsr(), exp[:, [1]])
        for d, want in (("skip", "cells"), ("comp", "genes")):
            cnt = requests.post(f"{s.url}/v1/datasets/{d}/count",
                                json={"var": {"index": [1]}, "by": "var"}).json()
            assert cnt["orientation"] == want, cnt
            assert cnt["n_cells"] == exp.shape[0] and cnt["n_genes"] == 1, cnt
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
