"""Integration tests of the viewer routes: obsm/varm arrays, name search and
grouped statistics, against a real server on generated datasets.

The datasets are written here (ivref.write_iv for the packed matrix,
anndata's write_elem for categorical obs columns, h5py for obsm/varm), in
both orientations, with integer and float values.  Expected answers come
from numpy and pandas on the same data; every request form (GET query
string, POST body, each encoding) is compared with them.
"""
import json
import re
import os
import struct
import time
import sys

import h5py
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))

from anndata.experimental import write_elem  # noqa: E402

import ivref  # noqa: E402
from test_http_server import Server  # noqa: E402

N_OBS, N_VAR = 700, 90
GENES = ["CD3E", "CD3D", "cd3g", "MS4A1", "CD79A", "NKG7", "GNLY", "LYZ", "CD14", "XCD3"] + \
    ["GENE%03d" % i for i in range(N_VAR - 10)]
TYPES = ["B cell", "T cell", "NK cell", "monocyte", "unused"]


def make_data(seed, dtype):
    rng = np.random.default_rng(seed)
    X = sp.random(N_OBS, N_VAR, density=0.2, format="csr", random_state=seed,
                  data_rvs=lambda n: rng.integers(1, 50, n)).astype(np.float64)
    if dtype == "float32":
        X.data = (X.data * rng.random(X.data.shape[0]) - 3.0).astype(np.float32).astype(np.float64)
    # A few explicit stored zeros: stored, but not "expressing".
    X.data[::97] = 0.0
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(TYPES[:4], N_OBS), categories=TYPES),
        "batch": pd.Categorical(rng.choice(["b1", "b2", "b3"], N_OBS)),
        "age": rng.integers(20, 80, N_OBS),
    }, index=["cell%d" % i for i in range(N_OBS)])
    obs.loc[obs.index[5], "batch"] = np.nan  # a missing group key
    var = pd.DataFrame({"gene_ids": ["ENSG%05d" % (i * 7) for i in range(N_VAR)]}, index=GENES)
    obsm = {
        "X_umap": rng.standard_normal((N_OBS, 2)).astype(np.float32),
        "X_pca": rng.standard_normal((N_OBS, 5)),  # float64
        "clusters_int": rng.integers(0, 9, (N_OBS, 3)).astype(np.int32),
    }
    varm = {"PCs": rng.standard_normal((N_VAR, 4))}
    return X, obs, var, obsm, varm


def write_dataset(path, X, obs, var, obsm, varm, orientation, value_dtype):
    ivref.write_iv(path, X, orientation=orientation, value_dtype=value_dtype, obs=False, var=False)
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        g = f.create_group("obsm")
        for k, v in obsm.items():
            g.create_dataset(k, data=v)
        g = f.create_group("varm")
        for k, v in varm.items():
            g.create_dataset(k, data=v)
        # A sparse element: listed, not served.
        s = f["obsm"].create_group("sparse_thing")
        s.attrs["encoding-type"] = "csr_matrix"
        s.attrs["encoding-version"] = "0.1.0"


CASES = [("ivcsr", "int32"), ("ivcsc", "int32"), ("ivcsr", "float32")]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("viewer"))
    data, ds = {}, []
    for k, (orient, dt) in enumerate(CASES):
        d = make_data(10 + k, dt)
        path = os.path.join(tmp, "v_%s_%s.h5ad" % (orient, dt))
        write_dataset(path, *d, orientation=orient, value_dtype=np.dtype(dt))
        name = "%s_%s" % (orient, dt)
        data[name] = d
        ds.append({"id": name, "path": path})
    s = Server(tmp, datasets=ds, extra_args=["--max-json-bytes", "3000000"],
               cfg_extra={"cors_origins": ["https://viewer.example"]})
    yield s, data
    assert s.stop() == 0, s.log_text()[-3000:]


IDS = ["%s_%s" % c for c in CASES]


# ---------------------------------------------------------------- obsm

def parse_array(buf):
    assert buf[:4] == b"IVAR"
    version, rows, cols = struct.unpack_from("<Iqq", buf, 4)
    assert version == 1
    dt = np.dtype(buf[24:32].rstrip(b"\0").decode())
    flags, = struct.unpack_from("<I", buf, 32)
    pos, ids = 40, None
    if flags & 1:
        ids = np.frombuffer(buf, np.int64, rows, pos)
        pos += 8 * rows
    vals = np.frombuffer(buf, dt, rows * cols, pos).reshape(rows, cols)
    assert pos + vals.nbytes == len(buf)
    return ids, vals


def test_document_lists_obsm_and_varm(env):
    s, data = env
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32").json()
    byname = {a["name"]: a for a in doc["obsm"]}
    assert byname["X_umap"]["shape"] == [N_OBS, 2] and byname["X_umap"]["dtype"] == "float32"
    assert byname["X_pca"]["shape"] == [N_OBS, 5] and byname["X_pca"]["dtype"] == "float64"
    assert byname["clusters_int"]["dtype"] == "int32"
    assert byname["sparse_thing"]["servable"] is False
    assert "csr_matrix" in byname["sparse_thing"]["reason"]
    assert [a["name"] for a in doc["varm"]] == ["PCs"] and doc["varm"][0]["shape"] == [N_VAR, 4]
    assert doc["viewer_bytes"]["arrays"] == N_OBS * (2 * 4 + 5 * 8 + 3 * 4) + N_VAR * 4 * 8


@pytest.mark.parametrize("ds", IDS)
def test_obsm_whole_binary(env, ds):
    s, data = env
    obsm = data[ds][3]
    r = requests.get(s.url + "/v1/datasets/%s/obsm/X_umap" % ds)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/vnd.ivserve.array"
    ids, vals = parse_array(r.content)
    assert ids is None and vals.dtype == np.float32
    assert np.array_equal(vals, obsm["X_umap"])


def test_obsm_selections_keep_order_and_duplicates(env):
    s, data = env
    X, obs, var, obsm, varm = data["ivcsr_int32"]
    url = s.url + "/v1/datasets/ivcsr_int32/obsm/X_pca"
    sel = [5, 3, 3, 699, 0]
    # Index list, as a query string and as a body.
    for r in (requests.get(url, params={"obs": ",".join(map(str, sel)), "format": "binary"}),
              requests.post(url, json={"obs": {"index": sel}, "format": "binary"})):
        assert r.status_code == 200, r.text
        ids, vals = parse_array(r.content)
        assert list(ids) == sel and vals.dtype == np.float64
        assert np.array_equal(vals, obsm["X_pca"][sel])
    # dtype=float32 converts float64 exactly as numpy's astype does.
    r = requests.post(url, json={"obs": {"range": [10, 20]}, "dtype": "float32", "format": "binary"})
    ids, vals = parse_array(r.content)
    assert vals.dtype == np.float32 and list(ids) == list(range(10, 20))
    assert np.array_equal(vals, obsm["X_pca"][10:20].astype(np.float32))
    # Names (with a duplicate) and a where filter, the query route's forms.
    r = requests.post(url, json={"obs": {"names": ["cell7", "cell2", "cell7"]}, "format": "json"})
    doc = r.json()
    assert doc["ids"] == [7, 2, 7] and doc["shape"] == [3, 5]
    assert np.array_equal(np.array(doc["values"]), obsm["X_pca"][[7, 2, 7]])
    r = requests.get(url, params={"obs_where": "cell_type == 'B cell' and age >= 50", "format": "json"})
    want = np.flatnonzero(((obs.cell_type == "B cell") & (obs.age >= 50)).values)
    doc = r.json()
    assert doc["ids"] == list(want)
    assert np.array_equal(np.array(doc["values"]), obsm["X_pca"][want])
    # A mask.
    mask = np.zeros(N_OBS, bool)
    mask[[1, 50, 600]] = True
    import base64
    b64 = base64.b64encode(np.packbits(mask, bitorder="little").tobytes()).decode()
    ids, vals = parse_array(requests.post(url, json={"obs": {"mask": b64}, "format": "binary"}).content)
    assert list(ids) == [1, 50, 600]


def test_obsm_ndjson_and_int_and_varm(env):
    s, data = env
    X, obs, var, obsm, varm = data["ivcsc_int32"]
    r = requests.get(s.url + "/v1/datasets/ivcsc_int32/obsm/clusters_int",
                     headers={"Accept": "application/x-ndjson"})
    assert r.headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(l) for l in r.text.splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["dtype"] == "int32"
    assert lines[-1] == {"type": "end", "status": "ok", "rows": N_OBS}
    vals = np.concatenate([np.array(l["values"]) for l in lines[1:-1]])
    ids = np.concatenate([np.array(l["ids"]) for l in lines[1:-1]])
    assert np.array_equal(vals, obsm["clusters_int"]) and np.array_equal(ids, np.arange(N_OBS))
    r = requests.get(s.url + "/v1/datasets/ivcsc_int32/varm/PCs",
                     params={"var_names": "LYZ,CD3E", "format": "json"})
    doc = r.json()
    assert doc["axis"] == "var" and doc["ids"] == [7, 0]
    assert np.array_equal(np.array(doc["values"]), varm["PCs"][[7, 0]])


def test_obsm_errors(env):
    s, _ = env
    base = s.url + "/v1/datasets/ivcsr_int32"
    r = requests.get(base + "/obsm/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = requests.get(base + "/obsm/sparse_thing")
    assert r.status_code == 422 and "not served" in r.json()["error"]["message"]
    r = requests.get(base + "/obsm/X_umap", params={"obs": "700"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "out_of_range"
    r = requests.get(base + "/obsm/X_umap", params={"var": "1"})
    assert r.status_code == 422 and "obs selection only" in r.json()["error"]["message"]
    r = requests.get(base + "/obsm/X_umap", params={"dtype": "int8"})
    assert r.status_code == 400
    r = requests.post(base + "/obsm/X_umap", data="[1,2]")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    r = requests.get(base + "/obsm/X_umap", params={"obs_names": "cell1,NOPE"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_name"
    r = requests.get(base + "/obsm/X_umap", params={"obs_names": "cell1,NOPE", "obs_missing": "ignore",
                                                   "format": "json"})
    assert r.status_code == 200 and r.json()["ids"] == [1]
    assert json.loads(r.headers["X-Ivserve-Dropped-Names"]) == {"obs": ["NOPE"], "var": []}
    r = requests.delete(base + "/obsm/X_umap")
    assert r.status_code == 405


# ---------------------------------------------------------------- search

def ranked(names, q):
    """The documented ranking, in Python: kind (exact, prefix, substring,
    ignoring case), exact case first, shorter first, earlier position
    first, row order."""
    ql = q.lower()
    keys = []
    for i, n in enumerate(names):
        pos = n.lower().find(ql)
        if pos < 0:
            continue
        kind = 2 if pos > 0 else (0 if len(n) == len(q) else 1)
        keys.append((kind, n[pos:pos + len(q)] != q, len(n), pos, i))
    return [k[-1] for k in sorted(keys)]


def test_var_search_ranking(env):
    s, data = env
    var = data["ivcsr_int32"][2]
    r = requests.get(s.url + "/v1/datasets/ivcsr_int32/var/search", params={"q": "CD3", "limit": 20})
    assert r.status_code == 200, r.text
    doc = r.json()
    got = [(h["name"], h["match"]) for h in doc["results"]]
    # Prefix matches (exact case first, then shorter, then file order), then substrings.
    assert got == [("CD3E", "prefix"), ("CD3D", "prefix"), ("cd3g", "prefix"), ("XCD3", "substring")]
    assert doc["total"] == 4
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/var/search", params={"q": "cd3e"}).json()
    assert doc["results"][0] == {"index": 0, "name": "CD3E", "match": "exact"}
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/var/search",
                       params={"q": "gene0", "limit": 3}).json()
    assert doc["total"] == 80 and [h["name"] for h in doc["results"]] == ["GENE000", "GENE001", "GENE002"]
    ids = list(var.gene_ids)
    for q in ("ensg00014", "0014", "G001"):
        doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/var/search",
                           params={"q": q, "by": "gene_ids", "limit": 5}).json()
        assert doc["by"] == "gene_ids"
        want = ranked(ids, q)
        assert doc["total"] == len(want)
        assert [(h["index"], h["value"], h["name"]) for h in doc["results"]] == \
            [(i, ids[i], GENES[i]) for i in want[:5]]
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/var/search",
                       params={"q": "ensg00014", "by": "gene_ids"}).json()
    assert doc["results"] == [{"index": 2, "name": "cd3g", "value": "ENSG00014", "match": "exact"}]


def test_obs_search_matches_python(env):
    s, data = env
    obs = data["ivcsr_int32"][1]
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/obs/search", params={"q": "LL69", "limit": 1000}).json()
    names = list(obs.index)
    want = ranked(names, "LL69")
    assert doc["total"] == len(want) == 11
    assert [h["index"] for h in doc["results"]] == want
    doc = requests.get(s.url + "/v1/datasets/ivcsr_int32/obs/search", params={"q": "LL69", "limit": 3}).json()
    assert [h["index"] for h in doc["results"]] == want[:3] and doc["total"] == 11


def test_search_errors(env):
    s, _ = env
    u = s.url + "/v1/datasets/ivcsr_int32/var/search"
    assert requests.get(u).status_code == 400
    assert requests.get(u, params={"q": "a", "limit": "0"}).status_code == 400
    assert requests.get(u, params={"q": "a", "limit": "1001"}).status_code == 400
    assert requests.get(u, params={"q": "a", "by": "nope"}).status_code == 422
    assert requests.get(u, params={"q": "a", "obs": "1"}).status_code == 400
    assert requests.post(u, json={}).status_code == 405
    doc = requests.get(u, params={"q": "zzzz"}).json()
    assert doc["total"] == 0 and doc["results"] == []


# ---------------------------------------------------------------- aggregate

def reference(X, obs, obs_idx, var_idx, group_by, ddof=1):
    """pandas on the dense selection: groups observed, NaN keys dropped."""
    D = X[obs_idx][:, var_idx].toarray()
    keys = obs.iloc[obs_idx][group_by].reset_index(drop=True)
    df = pd.DataFrame(D)
    grp = df.groupby([keys[c] for c in group_by], observed=True, dropna=True, sort=True)
    return {
        "sum": grp.sum(), "mean": grp.mean(), "var": grp.var(ddof=ddof),
        "nnz": (df != 0).groupby([keys[c] for c in group_by], observed=True, sort=True).sum(),
        "frac_nonzero": (df != 0).groupby([keys[c] for c in group_by], observed=True, sort=True).mean(),
        "max": grp.max(), "size": grp.size(),
        "cats": [list(obs[c].cat.categories) for c in group_by],
    }


def check_aggregate(doc, ref, stats, exact):
    """doc's groups are the observed key combinations in category-code order
    (pandas 1.5 with observed=True returns them in order of appearance, so
    the reference is reindexed rather than compared in its order)."""
    cats = ref["cats"]
    idx = list(ref["size"].index)
    keys = [list(k) if isinstance(k, tuple) else [k] for k in idx]
    want_keys = sorted(keys, key=lambda k: [cats[i].index(v) for i, v in enumerate(k)])
    assert [g["key"] for g in doc["groups"]] == want_keys
    order = [keys.index(k) for k in want_keys]
    assert [g["n_cells"] for g in doc["groups"]] == list(ref["size"].values[order])
    for st in stats:
        got = np.array(doc["values"][st], dtype=np.float64)
        want = ref[st].to_numpy(dtype=np.float64)[order]
        if exact and st != "var":
            assert np.array_equal(got, want), st
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=st)


ALL_STATS = ["sum", "mean", "var", "nnz", "frac_nonzero", "max"]


@pytest.mark.parametrize("ds", IDS)
def test_aggregate_matches_pandas(env, ds):
    s, data = env
    X, obs, var, obsm, varm = data[ds]
    exact = ds.endswith("int32")
    u = s.url + "/v1/datasets/%s/aggregate" % ds
    # Every cell and gene, one column.
    r = requests.post(u, json={"group_by": "cell_type", "stats": ALL_STATS})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["stats"] == ALL_STATS and doc["group_by"] == ["cell_type"]
    assert [g["name"] for g in doc["genes"]] == GENES
    check_aggregate(doc, reference(X, obs, np.arange(N_OBS), np.arange(N_VAR), ["cell_type"]),
                    ALL_STATS, exact)
    # Two columns, selections with duplicates and names, a where filter.
    obs_idx = [3, 3, 10, 600, 42, 5] + list(range(100, 400))
    genes = ["NKG7", "CD3E", "NKG7", "GENE050"]
    var_idx = [GENES.index(g) for g in genes]
    r = requests.post(u, json={"obs": {"index": obs_idx}, "var": {"names": genes},
                               "group_by": ["batch", "cell_type"], "stats": ["mean", "max", "var"],
                               "ddof": 0})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [g["index"] for g in doc["genes"]] == var_idx
    check_aggregate(doc, reference(X, obs, obs_idx, var_idx, ["batch", "cell_type"], ddof=0),
                    ["mean", "max", "var"], exact)
    r = requests.get(u, params={"obs_where": "age < 40", "var": "0:20", "group_by": "cell_type",
                                "stats": "nnz,frac_nonzero,sum"})
    assert r.status_code == 200, r.text
    sel = np.flatnonzero((obs.age < 40).values)
    check_aggregate(r.json(), reference(X, obs, sel, np.arange(20), ["cell_type"]),
                    ["nnz", "frac_nonzero", "sum"], exact)


@pytest.mark.parametrize("ds", IDS)
def test_aggregate_follows_the_planner(env, ds):
    """With both orientations ready, a few genes over every cell are summed
    from the gene-major slices and a few cells over every gene from the
    cell-major ones, whichever the file holds (the answer says which), and
    both equal pandas."""
    s, data = env
    X, obs, var, obsm, varm = data[ds]
    exact = ds.endswith("int32")
    for _ in range(300):
        o = requests.get(s.url + "/v1/datasets/" + ds).json().get("orientations", {})
        if o and all(v.get("state") == "ready" for v in o.values()):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the other orientation of %s was never ready" % ds)
    u = s.url + "/v1/datasets/%s/aggregate" % ds
    r = requests.post(u, json={"var": {"index": [1, 7]}, "group_by": "cell_type",
                               "stats": ["mean", "nnz"]})
    assert r.status_code == 200, r.text
    assert r.json()["served_by"] == "genes", r.json().get("served_by")
    check_aggregate(r.json(), reference(X, obs, np.arange(N_OBS), [1, 7], ["cell_type"]),
                    ["mean", "nnz"], exact)
    r = requests.post(u, json={"obs": {"index": [2, 9]}, "group_by": "cell_type",
                               "stats": ["sum"]})
    assert r.status_code == 200, r.text
    assert r.json()["served_by"] == "cells", r.json().get("served_by")
    check_aggregate(r.json(), reference(X, obs, [2, 9], np.arange(N_VAR), ["cell_type"]),
                    ["sum"], exact)


def parse_agg_binary(buf):
    assert buf[:4] == b"IVAG"
    version, jl = struct.unpack_from("<IQ", buf, 4)
    doc = json.loads(buf[16:16 + jl])
    pos = (16 + jl + 7) // 8 * 8
    ng, nv = len(doc["groups"]), len(doc["genes"])
    vals = {}
    for st in doc["stats"]:
        vals[st] = np.frombuffer(buf, np.float64, ng * nv, pos).reshape(ng, nv)
        pos += 8 * ng * nv
    assert pos == len(buf)
    doc["values"] = vals
    return doc


def test_aggregate_binary_equals_json(env):
    s, data = env
    X, obs, var, obsm, varm = data["ivcsc_int32"]
    u = s.url + "/v1/datasets/ivcsc_int32/aggregate"
    body = {"group_by": ["cell_type"], "stats": ["mean", "frac_nonzero"]}
    j = requests.post(u, json=body).json()
    r = requests.post(u, json=body, headers={"Accept": "application/vnd.ivserve.aggregate"})
    assert r.headers["Content-Type"] == "application/vnd.ivserve.aggregate"
    b = parse_agg_binary(r.content)
    for st in body["stats"]:
        assert np.array_equal(np.array(j["values"][st]), b["values"][st])
    check_aggregate(b, reference(X, obs, np.arange(N_OBS), np.arange(N_VAR), ["cell_type"]),
                    body["stats"], True)


def test_aggregate_errors(env):
    s, _ = env
    u = s.url + "/v1/datasets/ivcsr_int32/aggregate"
    cases = [
        ({"stats": ["mean"]}, 400, "group_by"),
        ({"group_by": "cell_type"}, 400, "stats"),
        ({"group_by": "cell_type", "stats": ["median"]}, 400, "median"),
        ({"group_by": "cell_type", "stats": ["mean", "mean"]}, 400, "twice"),
        ({"group_by": "age", "stats": ["mean"]}, 422, "not categorical"),
        ({"group_by": "nope", "stats": ["mean"]}, 422, "nope"),
        ({"group_by": "cell_type", "stats": ["mean"], "ddof": 2}, 400, "ddof"),
        ({"group_by": "cell_type", "stats": ["mean"], "var": {"names": ["NOPE"]}}, 422, "NOPE"),
        ({"group_by": "cell_type", "stats": ["mean"], "bogus": 1}, 422, "bogus"),
    ]
    r = requests.post(u, data=b"<xml/>", headers={"Content-Type": "application/xml"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media"
    for body, status, word in cases:
        r = requests.post(u, json=body)
        assert r.status_code == status, (body, r.text)
        assert word in r.json()["error"]["message"], (body, r.text)


# ---------------------------------------------------------------- names, CORS

def test_folded_names_are_reported(env):
    s, _ = env
    u = s.url + "/v1/datasets/ivcsr_int32"
    r = requests.post(u + "/count", json={"var": {"names": ["cd3e", "CD3D"]}})
    assert r.status_code == 200
    assert r.json()["dropped"] == {"obs": [], "var": [], "folded": {"obs": [], "var": ["cd3e"]}}
    r = requests.post(u + "/query", json={"var": {"names": ["ms4a1"]}, "format": "json"})
    assert json.loads(r.headers["X-Ivserve-Dropped-Names"])["folded"] == {"obs": [], "var": ["ms4a1"]}
    r = requests.post(u + "/query", json={"var": {"names": ["MS4A1"]}, "format": "json"})
    assert "X-Ivserve-Dropped-Names" not in r.headers


def test_cors_exposes_custom_headers(env):
    s, _ = env
    r = requests.post(s.url + "/v1/datasets/ivcsr_int32/count",
                      json={"var": {"names": ["CD3E", "NOPE"], "missing": "ignore"}},
                      headers={"Origin": "https://viewer.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "https://viewer.example"
    exposed = [h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")]
    assert "x-ivserve-dropped-names" in exposed and "etag" in exposed


def test_client_fills_obs_names(env):
    import ivclient
    s, data = env
    obs = data["ivcsr_int32"][1]
    c = ivclient.Client(s.url)
    for fmt in ("binary", "ndjson", "json"):
        res = c.query("ivcsr_int32", obs=[9, 2, 9], var=["cd3e"], format=fmt)
        assert list(res.obs_names) == ["cell9", "cell2", "cell9"]
        assert res.dropped == {"obs": [], "var": [], "folded": {"obs": [], "var": ["cd3e"]}}
    res = c.query("ivcsr_int32", obs={"where": "cell_type == 'NK cell'"})
    assert list(res.obs_names) == list(obs.index[(obs.cell_type == "NK cell").values])
    # Paging: a page shorter than the obs keeps fetching until every name is in.
    c2 = ivclient.Client(s.url)
    assert list(c2.obs_names("ivcsr_int32", page=64)) == list(obs.index)
    assert c.query("ivcsr_int32", obs=[1], names=False).obs_names is None


def brotli_decompress(data, size):
    import ctypes
    import ctypes.util
    lib = ctypes.CDLL(ctypes.util.find_library("brotlidec") or "libbrotlidec.so.1")
    out = ctypes.create_string_buffer(size + 1)
    n = ctypes.c_size_t(size + 1)
    ok = lib.BrotliDecoderDecompress(ctypes.c_size_t(len(data)), data, ctypes.byref(n), out)
    assert ok == 1, "brotli stream did not decode"
    return out.raw[:n.value]


def test_etag_304_and_gzip(env):
    import gzip as gz
    s, data = env
    u = s.url + "/v1/datasets/ivcsr_int32/obsm/X_pca"
    plain = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "Content-Encoding" not in plain.headers
    et = plain.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{16}"', et)
    assert plain.headers["Cache-Control"] == "public, max-age=604800"
    assert "Accept-Encoding" in plain.headers["Vary"]
    # The same request: the same tag; a match is a 304 with no body.
    again = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "identity"})
    assert again.headers["ETag"] == et
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "identity",
                                                           "If-None-Match": 'W/"x", ' + et})
    assert r.status_code == 304 and r.content == b"" and r.headers["ETag"] == et
    # Another request, another tag; a stale tag gets the full answer.
    other = requests.get(u, params={"format": "json", "obs": "1"}, headers={"Accept-Encoding": "identity"})
    assert other.headers["ETag"] != et
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "identity",
                                                           "If-None-Match": other.headers["ETag"]})
    assert r.status_code == 200 and r.content == plain.content
    # gzip: its own tag, and the bytes decompress to the identity body.
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "gzip"}, stream=True)
    raw = r.raw.read(decode_content=False)
    assert r.headers["Content-Encoding"] == "gzip" and r.headers["ETag"] != et
    assert len(raw) < len(plain.content) and gz.decompress(raw) == plain.content
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "gzip;q=0, deflate"})
    assert "Content-Encoding" not in r.headers and r.headers["ETag"] == et
    # br (preferred at equal q), checked with the system's libbrotlidec.
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "gzip, br"}, stream=True)
    raw = r.raw.read(decode_content=False)
    assert r.headers["Content-Encoding"] == "br" and r.headers["ETag"] not in (et,)
    assert brotli_decompress(raw, len(plain.content)) == plain.content
    r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "gzip, br;q=0.5"})
    assert r.headers["Content-Encoding"] == "gzip"
    gz_tag = r.headers["ETag"]
    # A client holding either body's tag gets a 304 naming it.
    for tag in (gz_tag, et):
        r = requests.get(u, params={"format": "json"}, headers={"Accept-Encoding": "gzip",
                                                               "If-None-Match": tag})
        assert r.status_code == 304 and r.headers["ETag"] == tag
    # Float arrays are not worth encoding: identity, and its tag.
    r = requests.get(u, params={"format": "binary"}, headers={"Accept-Encoding": "gzip, br"})
    assert "Content-Encoding" not in r.headers
    r2 = requests.get(u, params={"format": "binary"}, headers={"Accept-Encoding": "gzip, br",
                                                              "If-None-Match": r.headers["ETag"]})
    assert r2.status_code == 304
    # POST bodies are part of the request's identity too.
    a = requests.post(s.url + "/v1/datasets/ivcsr_int32/aggregate",
                      json={"group_by": "cell_type", "stats": ["mean"]})
    b = requests.post(s.url + "/v1/datasets/ivcsr_int32/aggregate",
                      json={"group_by": "cell_type", "stats": ["max"]})
    assert a.headers["ETag"] != b.headers["ETag"]
    r = requests.post(s.url + "/v1/datasets/ivcsr_int32/aggregate",
                      json={"group_by": "cell_type", "stats": ["mean"]},
                      headers={"If-None-Match": a.headers["ETag"]})
    assert r.status_code == 304
    # Errors are not cached.
    r = requests.get(s.url + "/v1/datasets/ivcsr_int32/obsm/nope")
    assert r.status_code == 404 and "ETag" not in r.headers


def test_cache_max_age_is_configurable(env, tmp_path):
    s0, _ = env
    path = json.load(open(s0.cfg_path))["datasets"][0]
    s = Server(str(tmp_path), datasets=[path], cfg_extra={"cache_max_age": 0, "tokens": ["t0k"]})
    try:
        r = requests.get(s.url + "/v1/datasets/%s/var/search" % path["id"], params={"q": "CD3"},
                         headers={"Authorization": "Bearer t0k"})
        assert r.status_code == 200 and r.headers["Cache-Control"] == "no-cache"
    finally:
        assert s.stop() == 0
    s = Server(str(tmp_path), datasets=[path], extra_args=["--cache-max-age", "60"],
               cfg_extra={"tokens": ["t0k"]})
    try:
        r = requests.get(s.url + "/v1/datasets/%s/var/search" % path["id"], params={"q": "CD3"},
                         headers={"Authorization": "Bearer t0k"})
        assert r.headers["Cache-Control"] == "private, max-age=60"
    finally:
        assert s.stop() == 0


def test_metadata_pages_are_cached_and_compressed(env):
    s, data = env
    var = data["ivcsr_int32"][2]
    u = s.url + "/v1/datasets/ivcsr_int32/var/gene_ids"
    plain = requests.get(u, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and plain.json()["values"] == list(var.gene_ids)
    r = requests.get(u, headers={"Accept-Encoding": "gzip"}, stream=True)
    raw = r.raw.read(decode_content=False)
    import gzip as gz
    assert r.headers["Content-Encoding"] == "gzip" and gz.decompress(raw) == plain.content
    assert len(raw) < len(plain.content) / 3
    r = requests.get(u, headers={"If-None-Match": plain.headers["ETag"], "Accept-Encoding": "identity"})
    assert r.status_code == 304
    t = requests.get(s.url + "/v1/datasets/ivcsr_int32/obs", params={"limit": 3, "format": "csv"})
    assert t.status_code == 200 and t.headers["Content-Type"].startswith("text/csv") and "ETag" in t.headers
    assert requests.get(s.url + "/v1/datasets/ivcsr_int32/obs/nope").status_code == 404
    # POST takes a selection (docs/meta-rows.md); an empty body is every row, as GET.
    post = requests.post(s.url + "/v1/datasets/ivcsr_int32/obs", headers={"Accept-Encoding": "identity"})
    got = requests.get(s.url + "/v1/datasets/ivcsr_int32/obs", headers={"Accept-Encoding": "identity"})
    assert post.status_code == 200 and post.json() == got.json()
