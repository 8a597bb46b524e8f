"""GET .../obsp, GET|POST .../obsp/{name} and the Python client's ds.obsp /
to_anndata().obsp against anndata's own subset.

A file is written by anndata 0.8 with obsp elements of every kind the
server reads: csr float32 with explicit zeros, csr float64, csr int32
values, csc float64, a dense float32 array, an empty csr, and one whose
indices and indptr h5py rewrites as int64.  `ivserve pack` makes the
served copy (obsp copied as it is).  Each element's answer, for random
cell lists with duplicates in no order, masks, ranges, names, where
filters, the empty selection and all cells, must equal
anndata.read_h5ad(file)[sel].copy().obsp[name]: the same format (csr,
csc, ndarray), dtype and shape, and indptr, indices and data bit for bit
once anndata's indices are sorted (scipy's column indexing may leave them
unsorted; the server sorts them; explicit zeros are kept by both).  The
errors: an unknown element 404, the query's selection errors, a gene
selection 422; a file whose obsp lies (pointers past the entries or
falling, an index past the cells, a shape that is not cells x cells, a
1-D array) answers a clear error per element and the server keeps
serving.  The real fixtures' obsp groups (empty) are listed as empty.
"""
import io
import os
import shutil
import sys
import warnings

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "clients", "python"))

import ivserve  # noqa: E402
from ivserve import wire  # noqa: E402
from conftest import fixtures_path  # noqa: E402
from ivprocess import BIN, ServerProcess, write_config  # noqa: E402

N = 70
# The row of big_index's wrong entry (set by lie()).
BIG_ROW = []
# The big dataset's graph (set by env).
BIG_GRAPH = []
TYPES = np.array(["B", "T", "NK"])


def graph(rng, density, dtype, fmt="csr", zeros=True):
    m = sp.random(N, N, density=density, format="csr", dtype=np.float64, random_state=rng)
    m.data = (m.data * 100).astype(dtype) if np.dtype(dtype).kind == "i" else m.data.astype(dtype)
    if zeros and m.nnz:
        m.data[::7] = 0  # explicit zeros, kept by anndata and the server
    return m.asformat(fmt)


def write_file(path):
    rng = np.random.default_rng(5)
    a = anndata.AnnData(X=sp.random(N, 9, density=0.3, format="csr", dtype=np.float32, random_state=3))
    a.obs_names = ["c%d" % i for i in range(N)]
    a.var_names = ["g%d" % j for j in range(9)]
    a.obs["cell_type"] = pd.Categorical(TYPES[rng.integers(0, 3, N)])
    a.obs["score"] = rng.normal(size=N)
    a.obsp["connectivities"] = graph(7, 0.2, np.float32)
    a.obsp["distances"] = graph(8, 0.1, np.float64, zeros=False)
    a.obsp["counts"] = graph(9, 0.15, np.int32)
    a.obsp["by_col"] = graph(10, 0.2, np.float64, "csc")
    a.obsp["dense"] = rng.normal(size=(N, N)).astype(np.float32) * (rng.random((N, N)) < 0.5)
    a.obsp["empty"] = sp.csr_matrix((N, N), dtype=np.float32)
    a.obsp["wide_idx"] = graph(11, 0.1, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_h5ad(path)
    # int64 indices and pointers, as large graphs are written.
    with h5py.File(path, "r+") as f:
        g = f["obsp/wide_idx"]
        for k in ("indices", "indptr"):
            v = g[k][()].astype(np.int64)
            del g[k]
            g.create_dataset(k, data=v)
        assert g["indices"].dtype == np.int64


def write_big(path, n=30000, k=6):
    """A graph of n cells, k entries a row: selected rows far apart are
    read with pointers and entries in several pieces."""
    rng = np.random.default_rng(23)
    a = anndata.AnnData(X=sp.random(n, 3, density=0.2, format="csr", dtype=np.float32, random_state=4))
    cols = np.sort(rng.integers(0, n, (n, k)), axis=1).ravel()
    g = sp.csr_matrix((rng.random(n * k).astype(np.float32), cols, np.arange(0, n * k + 1, k)), shape=(n, n))
    g.sum_duplicates()
    a.obsp["knn"] = g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_h5ad(path)
    return g


def lie(path):
    """Elements that contradict themselves, beside a good one."""
    with h5py.File(path, "r+") as f:
        g = f["obsp"]
        for name in list(g):
            if name != "connectivities":
                del g[name]

        def copy_as(name):
            f.copy("obsp/connectivities", "obsp/" + name)
            return g[name]

        e = copy_as("past_end")
        p = e["indptr"][()]
        p[-1] = len(e["indices"]) + 5
        e["indptr"][...] = p
        e = copy_as("falls")
        p = e["indptr"][()]
        p[10] = p[11] + 1
        e["indptr"][...] = p
        e = copy_as("big_index")
        i = e["indices"][()]
        i[3] = N
        e["indices"][...] = i
        BIG_ROW.append(int(np.searchsorted(e["indptr"][()], 3, side="right")) - 1)
        e = copy_as("bad_shape")
        e.attrs["shape"] = np.array([N + 1, N + 1])
        g.create_dataset("vector", data=np.arange(N, dtype=np.float64))


@pytest.fixture(scope="module")
def env(ivserve, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("obsp"))
    plain = os.path.join(tmp, "plain.h5ad")
    write_file(plain)
    packed = os.path.join(tmp, "packed.h5ad")
    ivserve.assert_ok(ivserve.run("pack", plain, packed))
    lies = os.path.join(tmp, "lies.h5ad")
    shutil.copy(packed, lies)
    lie(lies)
    big_plain, big = os.path.join(tmp, "big_plain.h5ad"), os.path.join(tmp, "big.h5ad")
    big_graph = write_big(big_plain)
    ivserve.assert_ok(ivserve.run("pack", big_plain, big))
    BIG_GRAPH.append(big_graph)
    datasets = [{"id": "g", "path": packed}, {"id": "lies", "path": lies}, {"id": "big", "path": big}]
    fix = fixtures_path()
    real = os.path.join(fix, "real", "pbmc_small.ivcsr.h5ad") if fix else None
    real = real if real and os.path.exists(real) else None
    if real:
        datasets.append({"id": "pbmc", "path": real})
    s = ServerProcess(tmp, ["--config", write_config(tmp, {"datasets": datasets}), "--threads", "2"], binary=BIN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = anndata.read_h5ad(plain)
    yield s, full, real, plain
    assert s.stop() == 0, s.log_text()[-3000:]


def subset(full, sel):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return full[sel].copy()


def same(got, want, where):
    """got equals anndata's want: format, dtype, shape, arrays bit for bit."""
    if sp.issparse(want):
        assert sp.issparse(got) and got.format == want.format, (where, type(got), want.format)
        w = want.copy()
        w.sort_indices()
        assert got.dtype == w.dtype and got.shape == w.shape, (where, got.dtype, got.shape, w.dtype, w.shape)
        assert np.array_equal(got.indptr, w.indptr), where
        assert np.array_equal(got.indices, w.indices), where
        assert got.data.tobytes() == w.data.tobytes(), where
    else:
        assert isinstance(got, np.ndarray), (where, type(got))
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, want.dtype)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), where


def decode(body):
    reader = wire.StreamReader(io.BytesIO(body))
    h = reader.read_header()
    return wire.assemble(h, list(reader.blocks()))


def selections():
    """(wire selection object or None, what anndata indexes with)."""
    rng = np.random.default_rng(17)
    out = [(None, slice(None)), ({"index": []}, np.zeros(0, np.int64)),
           ({"range": [5, 31]}, np.arange(5, 31))]
    for k in (1, 6, 40, 150):
        idx = rng.integers(0, N, k)
        idx[: k // 3] = idx[k // 3: 2 * (k // 3)]  # duplicates
        out.append(({"index": idx.tolist()}, idx))
    mask = rng.random(N) < 0.4
    out.append(({"mask": mask.tolist()}, mask))
    names = ["c%d" % i for i in (33, 2, 2, 69, 0)]
    out.append(({"names": names}, [int(n[1:]) for n in names]))
    return out


def test_list_matches_the_file(env):
    s, _, _, plain = env
    r = requests.get(s.url + "/v1/datasets/g/obsp")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    got = {e["name"]: e for e in r.json()["obsp"]}
    with h5py.File(plain, "r") as f:
        names = sorted(f["obsp"])
        for name in names:
            e, o = got[name], f["obsp"][name]
            assert e["servable"] is True and e["shape"] == [N, N], e
            if isinstance(o, h5py.Dataset):
                assert e["format"] == "array" and e["dtype"] == str(o.dtype) and e["nnz"] == N * N
            else:
                assert e["format"] == o.attrs["encoding-type"]
                assert e["dtype"] == str(o["data"].dtype) and e["nnz"] == len(o["data"]), e
    assert sorted(got) == names
    assert requests.get(s.url + "/v1/datasets/g/obsp", headers={"If-None-Match": r.headers["ETag"]}).status_code == 304


def test_route_equals_anndata_subset(env):
    s, full, _, _ = env
    ds_url = s.url + "/v1/datasets/g/obsp/"
    for wsel, asel in selections():
        want = subset(full, asel)
        for name in full.obsp:
            if wsel is None:
                r = requests.get(ds_url + name, headers={"Accept": wire.MEDIA_TYPE})
            else:
                r = requests.post(ds_url + name, json={"obs": wsel}, headers={"Accept": wire.MEDIA_TYPE})
            assert r.status_code == 200, (name, wsel, r.text)
            assert r.headers["Content-Type"] == wire.MEDIA_TYPE
            X, ids = decode(r.content)
            w = want.obsp[name]
            rows = np.arange(N)[asel] if not isinstance(asel, list) else np.asarray(asel)
            assert np.array_equal(ids, rows), (name, wsel)
            w_csr = sp.csr_matrix(w) if not sp.issparse(w) else w.tocsr()
            # The stream is the CSR of the same matrix: every value of a
            # dense array, the csc's transposed back.
            assert X.shape == w.shape and X.dtype == w.dtype, (name, wsel)
            if isinstance(w, np.ndarray):
                dense = np.zeros(X.shape, X.dtype)
                dense[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] = X.data
                assert X.nnz == w.size and dense.tobytes() == np.ascontiguousarray(w).tobytes(), (name, wsel)
            else:
                same(X, w_csr, "%s %s" % (name, wsel))


def test_where_filters_and_json(env):
    s, full, _, _ = env
    obs = full.obs
    for expr, keep in (("cell_type == 'B'", obs["cell_type"] == "B"),
                       ("score > 0 and cell_type != 'NK'", (obs["score"] > 0) & (obs["cell_type"] != "NK"))):
        pos = np.flatnonzero(keep.to_numpy())
        want = subset(full, pos).obsp["connectivities"]
        r = requests.post(s.url + "/v1/datasets/g/obsp/connectivities", json={"obs": {"where": expr}},
                          headers={"Accept": wire.MEDIA_TYPE})
        X, ids = decode(r.content)
        assert np.array_equal(ids, pos)
        same(X, want, expr)
    # JSON: the /query document's form.
    idx = [4, 60, 4, 9]
    doc = requests.post(s.url + "/v1/datasets/g/obsp/distances", json={"obs": {"index": idx}, "format": "json"}).json()
    w = subset(full, idx).obsp["distances"]
    w.sort_indices()
    assert doc["shape"] == [4, 4] and doc["dtype"] == "float64" and doc["obs"] == idx
    assert doc["indptr"] == w.indptr.tolist() and doc["indices"] == w.indices.tolist()
    assert doc["data"] == w.data.tolist()
    # ETag: the same body is answered 304 before any work; another is not.
    u = s.url + "/v1/datasets/g/obsp/distances"
    r = requests.post(u, json={"obs": {"index": idx}})
    assert requests.post(u, json={"obs": {"index": idx}},
                         headers={"If-None-Match": r.headers["ETag"]}).status_code == 304
    assert requests.post(u, json={"obs": {"index": idx[:2]}},
                         headers={"If-None-Match": r.headers["ETag"]}).status_code == 200
    # GET with the query string's selection.
    r = requests.get(s.url + "/v1/datasets/g/obsp/by_col?obs=3,1,1,50&format=binary")
    X, ids = decode(r.content)
    same(X, subset(full, [3, 1, 1, 50]).obsp["by_col"].tocsr(), "GET by_col")


def test_far_apart_rows_of_a_larger_graph(env):
    """30,000 cells: rows thousands apart (pointers and entries read in
    several pieces), rows near each other (one span), all cells."""
    s = env[0]
    g = BIG_GRAPH[0]
    n = g.shape[0]
    rng = np.random.default_rng(3)
    sels = [rng.integers(0, n, 40), np.array([n - 1, 0, 15000, 0, 29998]),
            np.sort(rng.choice(n, 3000, replace=False)), np.arange(9000, 9500)[::-1], None]
    for sel in sels:
        u = s.url + "/v1/datasets/big/obsp/knn"
        if sel is None:
            r = requests.get(u, headers={"Accept": wire.MEDIA_TYPE})
            want = g.copy()
        else:
            r = requests.post(u, json={"obs": {"index": sel.tolist()}}, headers={"Accept": wire.MEDIA_TYPE})
            want = g[sel][:, sel]
        assert r.status_code == 200, r.text
        X, ids = decode(r.content)
        assert np.array_equal(ids, np.arange(n) if sel is None else sel)
        same(X, want.tocsr(), "big %s" % (None if sel is None else len(sel)))


def test_client_obsp_and_to_anndata(env):
    s, full, _, _ = env
    ds = ivserve.connect(s.url)["g"]
    assert sorted(ds.obsp) == sorted(full.obsp)
    for name in full.obsp:
        same(ds.obsp[name], full.obsp[name], "ds.obsp[%s]" % name)
    for _, asel in selections()[1:]:
        key = asel if not isinstance(asel, np.ndarray) or asel.dtype != bool else np.flatnonzero(asel)
        if isinstance(key, np.ndarray) and len(key) == 0:
            key = []
        a = ds[key].to_anndata(uns=False)
        want = subset(full, asel)
        assert sorted(a.obsp) == sorted(want.obsp)
        for name in want.obsp:
            same(a.obsp[name], want.obsp[name], "to_anndata %s" % name)
    b = ds.where("cell_type == 'T'").to_anndata(uns=False, obsp=["distances"])
    assert list(b.obsp) == ["distances"]
    same(b.obsp["distances"], subset(full, (full.obs["cell_type"] == "T").to_numpy()).obsp["distances"], "where")
    assert len(ds[:3].to_anndata(uns=False, obsp=False).obsp) == 0
    with pytest.raises(ivserve.IvserveError):
        ds.obsp["nope"]


def test_errors(env):
    s = env[0]
    u = s.url + "/v1/datasets/g/obsp/"
    cases = [("GET", "nope", None, 404, "not_found"),
             ("POST", "nope", {"obs": {"index": [1]}}, 404, "not_found"),
             ("POST", "connectivities", {"obs": {"index": [N]}}, 422, "out_of_range"),
             ("POST", "connectivities", {"obs": {"index": [-1]}}, 422, "out_of_range"),
             ("POST", "connectivities", {"obs": {"names": ["zz"]}}, 422, "unknown_name"),
             ("POST", "connectivities", {"obs": {"where": "nope == 1"}}, 422, None),
             ("POST", "connectivities", {"var": {"index": [1]}}, 422, "bad_selection"),
             ("POST", "connectivities", {"matrix": "X"}, 422, "bad_selection")]
    for method, name, body, status, code in cases:
        r = requests.request(method, u + name, json=body)
        assert r.status_code == status, (name, body, r.status_code, r.text)
        if code:
            assert r.json()["error"]["code"] == code, r.text
    r = requests.post(u + "connectivities", data=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    assert requests.get(s.url + "/v1/datasets/g/obsp?x=1").status_code == 400
    assert requests.get(s.url + "/v1/datasets/nope/obsp").status_code == 404
    assert requests.post(s.url + "/v1/datasets/g/obsp", json={}).status_code == 405


def test_lying_elements_are_clear_errors(env):
    s = env[0]
    u = s.url + "/v1/datasets/lies/obsp"
    listed = {e["name"]: e for e in requests.get(u).json()["obsp"]}
    assert listed["bad_shape"]["servable"] is False and "shape" in listed["bad_shape"]["reason"]
    assert listed["vector"]["servable"] is False and "1-dimensional" in listed["vector"]["reason"]
    for name, status, words in (("past_end", 500, ("indptr", "past")), ("falls", 500, ("indptr", "below")),
                                ("big_index", 500, ("outside",)), ("bad_shape", 422, ("shape",)),
                                ("vector", 422, ("not served",))):
        for body in (None, {"obs": {"index": list(range(N - 1, -1, -1)) + [BIG_ROW[0]]}}):
            r = requests.request("POST" if body else "GET", u + "/" + name, json=body)
            assert r.status_code == status, (name, r.status_code, r.text)
            msg = r.json()["error"]["message"]
            assert all(w in msg for w in words), (name, msg)
    # Only the selected rows are read: rows without the wrong index serve.
    others = [r for r in range(N) if r != BIG_ROW[0]]
    r = requests.post(u + "/big_index", json={"obs": {"index": others}}, headers={"Accept": wire.MEDIA_TYPE})
    assert r.status_code == 200, r.text
    assert requests.post(u + "/big_index", json={"obs": {"index": [BIG_ROW[0]]}}).status_code == 500
    r = requests.get(u + "/connectivities", headers={"Accept": wire.MEDIA_TYPE})
    assert r.status_code == 200 and decode(r.content)[0].shape == (N, N)
    assert s.proc.poll() is None
    assert requests.get(s.url + "/healthz").status_code == 200


def test_real_fixture_obsp(env):
    s, real = env[0], env[2]
    if real is None:
        pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): no real fixture to list")
    with h5py.File(real, "r") as f:
        want = sorted(f["obsp"]) if "obsp" in f else []
    got = requests.get(s.url + "/v1/datasets/pbmc/obsp").json()["obsp"]
    assert [e["name"] for e in got] == want
    ds = ivserve.connect(s.url)["pbmc"]
    assert sorted(ds.obsp) == want
    assert sorted(ds[:5].to_anndata(uns=False).obsp.keys()) == want
