"""Layers and raw as selectable matrices of a dataset, over HTTP.

One generated file holds X (IVCSR), two packed layers (counts: IVCSC
int32, log: IVCSR float64), a plain csr_matrix layer and a dense layer
(listed, not servable), and raw/X (IVCSC float32) with raw/var, which has
more genes than var.  A second file has X only.  Every answer is compared
with numpy's M[obs, :][:, var] of the matrix asked for (ivref.expected,
exact, explicit zeros kept), in every selection form the query route
takes (index, range, mask, names, where, by var), through POST bodies and
query strings, in the three encodings, and through /count.
"""
import base64
import json
import os
import sys

import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))

from anndata.experimental import write_elem  # noqa: E402

import ivclient  # noqa: E402
import ivref  # noqa: E402
from test_http_server import Server  # noqa: E402

N_OBS, N_VAR, N_RAW = 240, 30, 45
MEDIA = {"binary": "application/vnd.ivserve.csr", "ndjson": "application/x-ndjson",
         "json": "application/json"}


def make_data():
    rng = np.random.default_rng(7)
    X = ivref.random_csr(rng, N_OBS, N_VAR, 1500, dtype=np.float32, zero_frac=0.02)
    counts = ivref.random_csr(rng, N_OBS, N_VAR, 1800, dtype=np.int32, empty_row_frac=0.05)
    log = ivref.random_csr(rng, N_OBS, N_VAR, 900, dtype=np.float64)
    raw = ivref.random_csr(rng, N_OBS, N_RAW, 2600, dtype=np.float32, zero_frac=0.01)
    plain = ivref.random_csr(rng, N_OBS, N_VAR, 300, dtype=np.float32)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], N_OBS)),
        "age": rng.integers(20, 80, N_OBS),
    }, index=["cell%d" % i for i in range(N_OBS)])
    var = pd.DataFrame({"hv": rng.integers(0, 2, N_VAR).astype(bool)},
                       index=["gene%d" % i for i in range(N_VAR)])
    # raw/var: X's genes are a subset of raw's, in another order, plus more.
    raw_names = ["gene%d" % i for i in range(N_VAR)][::-1] + \
        ["rgene%d" % i for i in range(N_RAW - N_VAR)]
    raw_var = pd.DataFrame({"mt": np.arange(N_RAW) % 3 == 0}, index=raw_names)
    return dict(X=X, counts=counts, log=log, raw=raw, plain=plain, obs=obs, var=var,
                raw_var=raw_var, dense=rng.standard_normal((N_OBS, N_VAR)))


def write_client_file(path):
    """make_data()'s X, layers counts (IVCSC int32) and log, and raw/X with
    raw/var, written as the client tests serve them; returns the data."""
    import h5py
    d = make_data()
    ivref.write_with_layers(path, d["X"], "ivcsr", obs=False, var=False,
                            layers={"counts": (d["counts"], "ivcsc"), "log": (d["log"], "ivcsr")},
                            raw=(d["raw"], "ivcsc"))
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", d["obs"])
        write_elem(f, "var", d["var"])
        write_elem(f, "raw/var", d["raw_var"])
    return d


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("layers"))
    d = make_data()
    path = os.path.join(tmp, "layered.h5ad")
    packs = ivref.write_with_layers(
        path, d["X"], "ivcsr", obs=False, var=False,
        layers={"counts": (d["counts"], "ivcsc"), "log": (d["log"], "ivcsr")},
        raw=(d["raw"], "ivcsc"), plain={"spliced": d["plain"]}, dense={"dense": d["dense"]})
    import h5py
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", d["obs"])
        write_elem(f, "var", d["var"])
        write_elem(f, "raw/var", d["raw_var"])
    only_x = os.path.join(tmp, "plain.h5ad")
    ivref.write_iv(only_x, d["X"], "ivcsr")
    s = Server(tmp, datasets=[{"id": "L", "path": path}, {"id": "P", "path": only_x}])
    yield s, d, packs
    assert s.stop() == 0, s.log_text()[-3000:]


MATRICES = {"X": "X", "layers/counts": "counts", "layers/log": "log", "raw/X": "raw"}


def want(d, matrix, obs=None, var=None):
    return ivref.expected(d[MATRICES[matrix]], obs, var)


def same(got, exp):
    """Exact equality of two sparse results, stored zeros included."""
    got, exp = sp.csr_matrix(got), sp.csr_matrix(exp)
    assert got.shape == exp.shape, (got.shape, exp.shape)
    got.sort_indices()
    exp.sort_indices()
    assert np.array_equal(got.indptr, exp.indptr)
    assert np.array_equal(got.indices, exp.indices)
    assert np.array_equal(got.data.astype(np.float64), exp.data.astype(np.float64))


def post(s, path, body, fmt="binary"):
    return requests.post(s.url + path, data=json.dumps(body),
                         headers={"Content-Type": "application/json", "Accept": MEDIA[fmt]})


def parse(r, fmt):
    assert r.status_code == 200, r.text[:500]
    if fmt == "binary":
        return ivclient.parse_binary(r.content)
    if fmt == "ndjson":
        return ivclient.parse_ndjson(r.text)
    return ivclient.parse_json(r.content)


def mask_b64(bits):
    return base64.b64encode(np.packbits(np.asarray(bits, bool), bitorder="little").tobytes()).decode()


@pytest.mark.parametrize("fmt", ["binary", "ndjson", "json"])
@pytest.mark.parametrize("matrix", list(MATRICES))
def test_each_matrix_every_selection(env, matrix, fmt):
    s, d, _ = env
    n_var = N_RAW if matrix == "raw/X" else N_VAR
    rng = np.random.default_rng(abs(hash((matrix, fmt))) % 2**32)
    obs_idx = rng.integers(0, N_OBS, 50)          # any order, duplicates
    var_idx = rng.integers(0, n_var, 12)
    obs_mask = rng.random(N_OBS) < 0.3
    cases = [
        ({}, None, None),
        ({"obs": {"index": obs_idx.tolist()}}, obs_idx, None),
        ({"obs": {"index": obs_idx.tolist()}, "var": {"index": var_idx.tolist()}}, obs_idx, var_idx),
        ({"obs": {"range": [10, 90]}, "var": {"range": [n_var - 20, n_var]}},
         np.arange(10, 90), np.arange(n_var - 20, n_var)),
        ({"obs": {"mask": mask_b64(obs_mask)}}, np.flatnonzero(obs_mask), None),
        ({"obs": {"names": ["cell%d" % i for i in obs_idx[:9]]}}, obs_idx[:9], None),
        ({"obs": {"where": "cell_type == 'B' and age >= 40"}},
         np.flatnonzero((d["obs"].cell_type == "B").values & (d["obs"].age >= 40).values), None),
    ]
    names = list(d["raw_var"].index if matrix == "raw/X" else d["var"].index)
    gsel = var_idx[:7]
    cases.append(({"var": {"names": [names[i] for i in gsel]}}, None, gsel))
    if matrix == "raw/X":
        mt = np.flatnonzero(d["raw_var"].mt.values)
        cases.append(({"var": {"where": "mt"}}, None, mt))
    else:
        hv = np.flatnonzero(d["var"].hv.values)
        cases.append(({"var": {"where": "hv"}}, None, hv))
    for body, o, v in cases:
        b = dict(body, matrix=matrix)
        m, ids = parse(post(s, "/v1/datasets/L/query", b, fmt), fmt)
        same(m, want(d, matrix, o, v))
        if o is not None:
            assert np.array_equal(ids, o), body
    # Gene rows (the other orientation of the answer) over the same matrix.
    r = post(s, "/v1/datasets/L/query", {"matrix": matrix, "obs": {"index": obs_idx.tolist()},
                                         "var": {"index": var_idx.tolist()}, "by": "var",
                                         "format": fmt}, fmt)
    assert r.status_code == 200, r.text[:300]
    if fmt == "binary":
        res = ivclient._parse_binary(r.content, True, False)
    elif fmt == "ndjson":
        res = ivclient._parse_ndjson(r.text)
    else:
        res = ivclient._parse_json(r.content)
    same(res.matrix.tocsr(), want(d, matrix, obs_idx, var_idx))


@pytest.mark.parametrize("matrix", list(MATRICES))
def test_query_string_and_count(env, matrix):
    s, d, _ = env
    n_var = N_RAW if matrix == "raw/X" else N_VAR
    u = s.url + "/v1/datasets/L/query"
    r = requests.get(u, params={"matrix": matrix, "obs": "3,7,3,200", "var": "%d:%d" % (2, n_var)},
                     headers={"Accept": MEDIA["binary"]})
    m, ids = parse(r, "binary")
    same(m, want(d, matrix, [3, 7, 3, 200], np.arange(2, n_var)))
    # /count: nnz and the sum of the selected values, by decode (no
    # computed-column shortcut for a layer) and with every gene selected.
    for body, o, v in (({}, None, None), ({"obs": {"range": [5, 60]}}, np.arange(5, 60), None),
                       ({"var": {"index": [1, 4, 4]}}, None, [1, 4, 4])):
        r = requests.post(s.url + "/v1/datasets/L/count", json=dict(body, matrix=matrix))
        assert r.status_code == 200, r.text
        c = r.json()
        e = want(d, matrix, o, v)
        assert c["nnz"] == e.nnz and c["shape"] == list(e.shape), (c, e.shape)
        assert c["total_counts"] == float(np.sum(e.data.astype(np.float64))), c
    r = requests.get(s.url + "/v1/datasets/L/count", params={"matrix": matrix, "obs": "1:5"})
    assert r.status_code == 200 and r.json()["nnz"] == want(d, matrix, np.arange(1, 5)).nnz


def test_raw_has_its_own_var(env):
    s, d, _ = env
    # An index past X's genes is in range for raw/X only.
    r = post(s, "/v1/datasets/L/query", {"var": {"index": [N_RAW - 1]}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "out_of_range", r.text
    m, _ = parse(post(s, "/v1/datasets/L/query", {"matrix": "raw/X", "var": {"index": [N_RAW - 1]}}),
                 "binary")
    same(m, want(d, "raw/X", None, [N_RAW - 1]))
    # A gene of raw/var only; the same name in X is unknown.
    r = post(s, "/v1/datasets/L/query", {"var": {"names": ["rgene3"]}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_name", r.text
    m, _ = parse(post(s, "/v1/datasets/L/query", {"matrix": "raw/X", "var": {"names": ["rgene3", "gene0"]}}),
                 "binary")
    idx = [list(d["raw_var"].index).index("rgene3"), list(d["raw_var"].index).index("gene0")]
    assert idx[1] == N_VAR - 1  # raw/var lists X's genes reversed: the lookup is raw's own
    same(m, want(d, "raw/X", None, idx))
    # A var column of X only is unknown to raw/X's filter.
    r = post(s, "/v1/datasets/L/query", {"matrix": "raw/X", "var": {"where": "hv"}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_filter", r.text


def test_unknown_and_unservable_matrices(env):
    s, _, _ = env
    for ds, body_m in (("L", "layers/nope"), ("P", "layers/counts"), ("P", "raw/X"), ("L", "x")):
        for r in (post(s, "/v1/datasets/%s/query" % ds, {"matrix": body_m}),
                  requests.post(s.url + "/v1/datasets/%s/count" % ds, json={"matrix": body_m}),
                  requests.get(s.url + "/v1/datasets/%s/query" % ds, params={"matrix": body_m})):
            assert r.status_code == 404, r.text
            e = r.json()["error"]
            assert e["code"] == "unknown_matrix", e
            assert body_m in e["message"] and "available: X" in e["message"], e
    msg = post(s, "/v1/datasets/L/query", {"matrix": "layers/nope"}).json()["error"]["message"]
    for name in ("layers/counts", "layers/log", "layers/spliced", "layers/dense", "raw/X"):
        assert name in msg, msg
    assert "layers/" not in requests.post(s.url + "/v1/datasets/P/count",
                                          json={"matrix": "nope"}).json()["error"]["message"]
    # Listed, not servable: a plain csr_matrix and a dense array.
    for name, word in (("layers/spliced", "csr_matrix"), ("layers/dense", "dense array")):
        r = post(s, "/v1/datasets/L/query", {"matrix": name})
        assert r.status_code == 422, r.text
        assert name in r.json()["error"]["message"] and word in r.json()["error"]["message"]
    # Bad values are 400 and name the key.
    for bad in (5, "", None, ["X"]):
        r = post(s, "/v1/datasets/L/query", {"matrix": bad})
        assert r.status_code == 400 and "matrix" in r.json()["error"]["message"], (bad, r.text)
    r = requests.get(s.url + "/v1/datasets/L/query", params=[("matrix", "X"), ("matrix", "raw/X")])
    assert r.status_code == 400 and "more than once" in r.json()["error"]["message"], r.text
    # "X" by name is the default matrix.
    a = post(s, "/v1/datasets/L/query", {"matrix": "X", "obs": {"range": [0, 9]}}).content
    b = post(s, "/v1/datasets/L/query", {"obs": {"range": [0, 9]}}).content
    assert a == b


@pytest.mark.parametrize("name", list(MATRICES))
def test_aggregate_over_each_matrix(env, name):
    """/aggregate reads the matrix asked for, as /query does: the sums,
    means, maxima and counts equal pandas' groupby over that matrix's
    selection; raw/X's genes are raw/var's (names resolved there, more
    genes than X); the document names the matrix."""
    from test_http_viewer import check_aggregate, reference
    s, d, _ = env
    # float64 (the server sums in float64), canonical index dtypes for scipy
    M = sp.csr_matrix(d[MATRICES[name]].toarray().astype(np.float64))
    names = list(d["raw_var"].index) if name == "raw/X" else list(d["var"].index)
    stats = ["sum", "mean", "max", "nnz", "frac_nonzero"]
    exact = name == "layers/counts"
    body = {"group_by": ["cell_type"], "stats": stats}
    if name != "X":
        body["matrix"] = name
    r = post(s, "/v1/datasets/L/aggregate", body, "json")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["matrix"] == name
    assert [g["name"] for g in doc["genes"]] == names
    check_aggregate(doc, reference(M, d["obs"], np.arange(N_OBS), np.arange(M.shape[1]),
                                   ["cell_type"]), stats, exact)
    # A selection by names (the last only raw/var has) and a query string.
    genes = [names[-1], names[0], names[-1]]
    obs_idx = [5, 5, 17] + list(range(60, 200))
    q = {"obs": ",".join(map(str, obs_idx)), "var_names": ",".join(genes),
         "group_by": "cell_type", "stats": "sum,max"}
    if name != "X":
        q["matrix"] = name
    r = requests.get(s.url + "/v1/datasets/L/aggregate", params=q)
    assert r.status_code == 200, r.text
    check_aggregate(r.json(), reference(M, d["obs"], obs_idx, [names.index(g) for g in genes],
                                        ["cell_type"]), ["sum", "max"], exact)


def test_aggregate_matrix_errors(env):
    """An unknown or unservable matrix is refused as /query refuses it, and
    a gene index past X's end is in range only for raw/X."""
    s, _, _ = env
    body = {"group_by": ["cell_type"], "stats": ["sum"]}
    r = post(s, "/v1/datasets/L/aggregate", dict(body, matrix="layers/nope"), "json")
    assert r.status_code == 404, r.text
    r = post(s, "/v1/datasets/L/aggregate", dict(body, matrix="layers/dense"), "json")
    assert r.status_code == 422, r.text
    r = post(s, "/v1/datasets/L/aggregate", dict(body, var={"index": [N_RAW - 1]}), "json")
    assert r.status_code == 422, r.text
    r = post(s, "/v1/datasets/L/aggregate", dict(body, matrix="raw/X", var={"index": [N_RAW - 1]}), "json")
    assert r.status_code == 200 and r.json()["genes"][0]["index"] == N_RAW - 1, r.text
    r = post(s, "/v1/datasets/P/aggregate", dict(body, matrix="layers/counts"), "json")
    assert r.status_code == 404, r.text


def test_raw_var_table_and_columns(env):
    """raw/X's genes are served as the var pages are: /raw/var (the table,
    with where filters and paging), /raw/var/COLUMN and /raw/var/search; a
    dataset without raw answers 404, and so does an unknown column."""
    s, d, _ = env
    rv = d["raw_var"]
    doc = requests.get(s.url + "/v1/datasets/L/raw/var", params={"limit": 1000}).json()
    assert doc["total"] == N_RAW
    assert [x["_index"] for x in doc["rows"]] == list(rv.index)
    assert [x["mt"] for x in doc["rows"]] == [bool(v) for v in rv.mt]
    page = requests.get(s.url + "/v1/datasets/L/raw/var",
                        params={"where": "mt", "offset": 2, "limit": 3}).json()
    want = list(rv.index[rv.mt.values])
    assert page["total"] == len(want) and [x["_index"] for x in page["rows"]] == want[2:5]
    col = requests.get(s.url + "/v1/datasets/L/raw/var/mt").json()
    assert col["values"] == [bool(v) for v in rv.mt], col
    # X's var pages are unchanged, and differ.
    x = requests.get(s.url + "/v1/datasets/L/var", params={"limit": 1000}).json()
    assert [r["_index"] for r in x["rows"]] == list(d["var"].index)
    # Search over raw/var's names: rgene* exist only there.
    r = requests.get(s.url + "/v1/datasets/L/raw/var/search", params={"q": "rgene1", "limit": 50}).json()
    assert r["axis"] == "raw/var" and r["total"] == sum(n.startswith("rgene1") for n in rv.index)
    assert r["results"][0] == {"index": list(rv.index).index("rgene1"), "name": "rgene1", "match": "exact"}
    assert all(rv.index[h["index"]] == h["name"] for h in r["results"])
    x = requests.get(s.url + "/v1/datasets/L/var/search", params={"q": "rgene1"}).json()
    assert x["total"] == 0, x
    g = requests.get(s.url + "/v1/datasets/L/raw/var/search", params={"q": "gene3"}).json()
    assert g["results"][0]["index"] == list(rv.index).index("gene3"), g
    for path in ("/v1/datasets/P/raw/var", "/v1/datasets/L/raw/var/nope", "/v1/datasets/P/raw/var/mt",
                 "/v1/datasets/P/raw/var/search?q=a"):
        r = requests.get(s.url + path)
        assert r.status_code == 404, (path, r.text)


def test_document_lists_matrices(env):
    s, d, packs = env
    doc = requests.get(s.url + "/v1/datasets/L").json()
    mx = {m["name"]: m for m in doc["matrices"]}
    assert [m["name"] for m in doc["matrices"]][0] == "X" and mx["X"]["primary"] is True
    assert set(mx) == {"X", "layers/counts", "layers/dense", "layers/log", "layers/spliced", "raw/X"}
    for name, orient, dt in (("X", "ivcsr", "float32"), ("layers/counts", "ivcsc", "int32"),
                             ("layers/log", "ivcsr", "float64"), ("raw/X", "ivcsc", "float32")):
        m = mx[name]
        M = d[MATRICES[name]]
        assert m["servable"] is True and m["shape"] == list(M.shape) and m["nnz"] == M.nnz, m
        assert m["orientation"] == orient and m["dtype"] == dt, m
        assert m["stream_bytes"] == packs[name]["packed"].shape[0], m
        assert m["index_bytes"] > 0
    assert mx["raw/X"]["var"] == "raw/var"
    assert mx["layers/spliced"]["servable"] is False and "csr_matrix" in mx["layers/spliced"]["reason"]
    assert mx["layers/spliced"]["encoding"] == "csr_matrix"
    assert mx["layers/spliced"]["shape"] == [N_OBS, N_VAR]
    assert mx["layers/dense"]["servable"] is False and mx["layers/dense"]["shape"] == [N_OBS, N_VAR]
    # X's own summary is unchanged: the document's shape is X's.
    assert doc["shape"] == [N_OBS, N_VAR]
    # A file without layers lists X alone.
    doc = requests.get(s.url + "/v1/datasets/P").json()
    assert [m["name"] for m in doc["matrices"]] == ["X"]


def test_memory_counts_every_matrix(env):
    s, _, packs = env
    mem = requests.get(s.url + "/v1/datasets/L").json()["memory"]
    # Pointer arrays of every packed matrix: 8 bytes an entry.
    ptr = sum((p["major_ptr"].shape[0] + p["value_ptr"].shape[0]) * 8 for p in packs.values())
    assert mem["pointers"] == ptr, (mem, ptr)
    x = packs["X"]
    mem_p = requests.get(s.url + "/v1/datasets/P").json()["memory"]
    assert mem_p["pointers"] == (x["major_ptr"].shape[0] + x["value_ptr"].shape[0]) * 8
    # Caches fill with the layers' chunks after a query over each.
    for m in ("layers/counts", "layers/log", "raw/X"):
        assert requests.post(s.url + "/v1/datasets/L/count", json={"matrix": m, "var": {"index": [0]}}).ok
    mem = requests.get(s.url + "/v1/datasets/L").json()["memory"]
    assert mem["index"] > mem_p["index"]
    met = requests.get(s.url + "/metrics").text
    line = [ln for ln in met.splitlines()
            if ln.startswith("ivserve_dataset_memory_bytes") and 'dataset="L"' in ln and 'part="pointers"' in ln]
    assert line and float(line[0].split()[-1]) == ptr, line
    # The process-wide cache gauge holds the layers' chunks too: it equals
    # the sum of every dataset's cache part.
    caches = [float(ln.split()[-1]) for ln in met.splitlines()
              if ln.startswith("ivserve_dataset_memory_bytes") and 'part="cache"' in ln]
    total = [float(ln.split()[-1]) for ln in met.splitlines() if ln.startswith("ivserve_cache_bytes ")]
    assert total and total[0] == sum(caches) and total[0] > 0, (total, caches)


# ---------------------------------------------------------------- ivserve pack --layers

@pytest.mark.parametrize("layout", ["ivcsr", "ivcsc"])
def test_pack_layers_keeps_them_servable(ivserve, tmp_path, layout):
    """A lab's file (X, layers and raw/X as plain csr_matrix / dense) packed
    with --layers: every layer and raw/X becomes a packed group at its own
    path, served as a matrix equal to the input; raw/var and the other
    members are kept."""
    import h5py
    d = make_data()
    src = str(tmp_path / "lab.h5ad")
    with h5py.File(src, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        ivref.write_plain_sparse(f, "X", d["X"])
        ivref.write_plain_sparse(f, "layers/counts", d["counts"], "csc")
        ivref.write_plain_sparse(f, "layers/log", d["log"])
        ivref.write_array(f, "layers/dense", np.asarray(d["dense"]))
        ivref.write_plain_sparse(f, "raw/X", d["raw"])
        write_elem(f, "obs", d["obs"])
        write_elem(f, "var", d["var"])
        write_elem(f, "raw/var", d["raw_var"])
        f.create_group("uns").attrs["encoding-type"] = "dict"
    out = str(tmp_path / "packed.h5ad")
    proc = ivserve.run("pack", src, out, "--layers", "--layout", layout, "--threads", "2")
    ivserve.assert_ok(proc)
    assert "layers packed: layers/counts, layers/dense, layers/log, raw/X" in proc.stdout, proc.stdout
    with h5py.File(out, "r") as f:
        for g in ("X", "layers/counts", "layers/log", "layers/dense", "raw/X"):
            assert f[g].attrs["encoding-type"] == layout, g
        assert f["layers"].attrs["encoding-type"] == "dict"
        assert f["raw/var"].attrs["_index"] == "_index"  # raw/var kept
        assert "uns" in f
    # Without --layers the layers stay as they were (copied, not servable).
    plain_out = str(tmp_path / "plain.h5ad")
    ivserve.assert_ok(ivserve.run("pack", src, plain_out, "--layout", layout, "--threads", "2"))
    with h5py.File(plain_out, "r") as f:
        assert f["layers/counts"].attrs["encoding-type"] == "csc_matrix"
    # --layers goes with X only.
    bad = ivserve.run("pack", src, str(tmp_path / "b.h5ad"), "--layers", "--matrix", "layers/log")
    assert bad.returncode != 0 and "--layers" in bad.stderr, bad.stderr
    s = Server(str(tmp_path), datasets=[{"id": "K", "path": out}, {"id": "Q", "path": plain_out}])
    try:
        doc = requests.get(s.url + "/v1/datasets/K").json()
        assert all(m["servable"] for m in doc["matrices"]), doc["matrices"]
        rng = np.random.default_rng(3)
        obs_idx = rng.integers(0, N_OBS, 40)
        for matrix, M in (("X", d["X"]), ("layers/counts", d["counts"]), ("layers/log", d["log"]),
                          ("layers/dense", sp.csr_matrix(d["dense"])), ("raw/X", d["raw"])):
            n_var = M.shape[1]
            var_idx = rng.integers(0, n_var, 9)
            m, _ = parse(post(s, "/v1/datasets/K/query", {"matrix": matrix}), "binary")
            same(m, ivref.expected(M))
            m, _ = parse(post(s, "/v1/datasets/K/query", {"matrix": matrix, "obs": {"index": obs_idx.tolist()},
                                                          "var": {"index": var_idx.tolist()}}), "binary")
            same(m, ivref.expected(M, obs_idx, var_idx))
        m, _ = parse(post(s, "/v1/datasets/K/query", {"matrix": "raw/X", "var": {"names": ["rgene2"]}}),
                     "binary")
        same(m, ivref.expected(d["raw"], None, [list(d["raw_var"].index).index("rgene2")]))
        mx = {m["name"]: m for m in requests.get(s.url + "/v1/datasets/Q").json()["matrices"]}
        assert mx["layers/counts"]["servable"] is False and "csc_matrix" in mx["layers/counts"]["reason"]
        assert mx["raw/X"]["servable"] is False
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_config_group_may_be_a_layer_path(env, tmp_path):
    """A dataset's configured group may name a layer ("layers/counts"):
    it is then that dataset's X.  Paths that climb or are absolute are
    refused at load, naming the group."""
    _, d, _ = env
    path = os.path.join(os.path.dirname(env[0].log.name), "layered.h5ad")
    s = Server(str(tmp_path), cfg_extra={"readyz": "any"}, datasets=[
        {"id": "C", "path": path, "group": "layers/counts"},
        {"id": "B1", "path": path, "group": "layers/../X"},
        {"id": "B2", "path": path, "group": "/X"},
        {"id": "B3", "path": path, "group": "layers/missing"}])
    try:
        m, _ = parse(post(s, "/v1/datasets/C/query", {"obs": {"range": [0, 50]}}), "binary")
        same(m, ivref.expected(d["counts"], np.arange(50)))
        for ds in ("B1", "B2", "B3"):
            r = requests.get(s.url + "/v1/datasets/" + ds)
            for _ in range(100):
                if r.status_code != 503 or r.json()["error"]["code"] != "not_ready":
                    break
                import time
                time.sleep(0.05)
                r = requests.get(s.url + "/v1/datasets/" + ds)
            assert r.status_code == 503 and r.json()["error"]["code"] == "dataset_failed", r.text
            assert "no group" in r.json()["error"]["message"], r.text
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
