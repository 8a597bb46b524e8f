"""Integration tests of the metadata side of the HTTP API.

Starts the real ivserve on a few fixtures and the example dataset and
checks: filters given as JSON trees and as where strings select exactly
the rows pandas selects on the same obs; query results under a filter
equal numpy indexing of the expected matrix; the column listing and the
category counts equal pandas; obs/var tables and single columns; names
looked up by another column, with missing names ignored and reported;
the count endpoint; and the exact status and message of bad filters.
"""
import io
import json
import os
import sys

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import requests
from anndata.experimental import read_elem

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))

FIX = os.environ.get("IV_FIXTURES", os.path.join(HERE, "..", "..", "..", "shared", "fixtures"))
BIN = os.environ.get("IVSERVE_BIN", os.path.join(HERE, "..", "..", "build", "ivserve"))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "pbmc_example.h5ad")

if not os.path.isdir(FIX):
    print(f"fixtures folder {FIX} is absent: skipping the metadata server tests")
    pytest.skip("fixtures absent", allow_module_level=True)
if not os.path.exists(BIN):
    print(f"ivserve binary {BIN} is absent: skipping the metadata server tests")
    pytest.skip("binary absent", allow_module_level=True)

import ivclient  # noqa: E402
from test_http_server import Server, ds_id, expected, same  # noqa: E402

MANIFEST = json.load(open(os.path.join(FIX, "manifest.json")))
WANT = {"tiny.ivcsr.blosc2-lz4.h5ad", "tiny.ivcsc.blosc2-lz4.h5ad", "wide.ivcsr.zstd.h5ad",
        "wide.ivcsc.zstd.h5ad", "chunky.ivcsr.zstd.h5ad"}
FILES = [m for m in MANIFEST if m["file"] in WANT and os.path.exists(os.path.join(FIX, m["file"]))
         and m.get("expected_meta")]
IDS = [ds_id(m) for m in FILES]

# (where string, JSON filter, pandas mask of the obs frame)
FILTERS = [
    ("cell_type in ['B cell', 'NK cell']", {"column": "cell_type", "in": ["B cell", "NK cell"]},
     lambda o: o.cell_type.isin(["B cell", "NK cell"])),
    ("age >= 40 and age < 70", {"column": "age", "ge": 40, "lt": 70},
     lambda o: (o.age >= 40) & (o.age < 70)),
    ("not is_doublet", {"not": {"column": "is_doublet", "eq": True}}, lambda o: ~o.is_doublet),
    ("batch is null", {"column": "batch", "is_null": True}, lambda o: o.batch.isna()),
    ("batch == 2 or condition == 'SLE'",
     {"or": [{"column": "batch", "eq": 2}, {"column": "condition", "eq": "SLE"}]},
     lambda o: (o.batch == 2).fillna(False).astype(bool) | (o.condition == "SLE")),
    ("n_counts_reported > 1500 and cell_type != 'platelet' and not (batch == 1)",
     {"and": [{"column": "n_counts_reported", "gt": 1500}, {"column": "cell_type", "ne": "platelet"},
              {"not": {"column": "batch", "eq": 1}}]},
     lambda o: (o.n_counts_reported > 1500) & (o.cell_type != "platelet")
     & ~(o.batch == 1).fillna(False).astype(bool)),
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    ds = [{"id": ds_id(m), "path": os.path.abspath(os.path.join(FIX, m["file"]))} for m in FILES]
    if os.path.exists(EXAMPLE):
        ds.append({"id": "pbmc", "path": os.path.abspath(EXAMPLE)})
    s = Server(str(tmp_path_factory.mktemp("meta")), datasets=ds)
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


_META = {}


def meta(m):
    if m["file"] not in _META:
        a = anndata.read_h5ad(os.path.join(FIX, m["expected_meta"]))
        _META[m["file"]] = (a.obs, a.var)
    return _META[m["file"]]


def url(srv, ds, sub=""):
    return f"{srv.url}/v1/datasets/{ds}{sub}"


def rows_of(mask):
    return np.flatnonzero(np.asarray(mask, dtype=bool))


@pytest.mark.parametrize("m", FILES, ids=IDS)
@pytest.mark.parametrize("k", range(len(FILTERS)))
def test_filter_query_equals_numpy(srv, m, k):
    where, tree, fn = FILTERS[k]
    obs, _ = meta(m)
    rows = rows_of(fn(obs))
    assert 0 < len(rows) < len(obs) or k == 3  # the filters must discriminate
    exp = expected(m)
    c = ivclient.Client(srv.url)
    for sel in ({"filter": tree}, {"where": where}):
        res = c.query(ds_id(m), obs=sel, format="binary")
        assert np.array_equal(res.obs, rows), (where, sel)
        same(res.matrix, exp[rows])
        cnt = c.count(ds_id(m), obs=sel)
        assert cnt["n_cells"] == len(rows) and cnt["n_genes"] == exp.shape[1]
        assert cnt["nnz"] == exp[rows].nnz
        assert cnt["total_counts"] == pytest.approx(float(exp[rows].sum()))
    # The GET form of a selection: obs_where in the query string ('+' is a space).
    r = requests.get(url(srv, ds_id(m), "/count") + "?obs_where=" +
                     requests.utils.quote(where, safe="").replace("%20", "+"))
    assert r.status_code == 200 and r.json()["n_cells"] == len(rows), r.text
    # The table endpoint selects the same rows by a where string.
    t = requests.get(url(srv, ds_id(m), "/obs"), params={"where": where, "limit": 100000,
                                                       "columns": "cell_type"}).json()
    assert t["total"] == len(rows)
    assert [r["_index"] for r in t["rows"]] == list(obs.index[rows])
    assert [r["cell_type"] for r in t["rows"]] == list(obs.cell_type.iloc[rows])


@pytest.mark.parametrize("m", FILES[:2], ids=IDS[:2])
def test_filter_combines_with_index_range_and_var(srv, m):
    obs, var = meta(m)
    exp = expected(m)
    mask = np.asarray(FILTERS[0][2](obs), dtype=bool)
    idx = list(range(len(obs) - 1, -1, -2)) + [1, 1]  # reversed, with duplicates
    keep = [i for i in idx if mask[i]]
    c = ivclient.Client(srv.url)
    res = c.query(ds_id(m), obs={"index": idx, "where": FILTERS[0][0]}, format="binary")
    assert list(res.obs) == keep
    same(res.matrix, exp[keep])
    res = c.query(ds_id(m), obs={"range": [5, 40], "filter": FILTERS[1][1]},
                  var={"where": "highly_variable"}, format="binary")
    r = [i for i in range(5, 40) if FILTERS[1][2](obs).iloc[i]]
    g = rows_of(var.highly_variable)
    assert list(res.obs) == r
    same(res.matrix, exp[r][:, g])
    # a mask and a filter intersect in file order
    pick = np.zeros(len(obs), dtype=bool)
    pick[::3] = True
    sel = dict(ivclient.selection(pick), where=FILTERS[0][0])
    res = c.query(ds_id(m), obs=sel, format="binary")
    assert list(res.obs) == list(rows_of(pick & mask))
    same(res.matrix, exp[rows_of(pick & mask)])
    # filter and where together are and-ed
    both = c.count(ds_id(m), obs={"filter": FILTERS[0][1], "where": FILTERS[1][0]})
    assert both["n_cells"] == int((FILTERS[0][2](obs) & FILTERS[1][2](obs)).sum())


@pytest.mark.parametrize("m", FILES[:2], ids=IDS[:2])
def test_names_by_column_and_missing(srv, m):
    _, var = meta(m)
    exp = expected(m)
    ids = [var.gene_ids.iloc[i] for i in (7, 2, 7)]
    c = ivclient.Client(srv.url)
    res = c.query(ds_id(m), var={"names": ids, "by": "gene_ids"}, format="binary")
    same(res.matrix, exp[:, [7, 2, 7]])
    r = requests.post(url(srv, ds_id(m), "/count"),
                      json={"var": {"names": ids + ["NOPE_1", "NOPE_2"], "by": "gene_ids"}})
    assert r.status_code == 422 and "NOPE_1" in r.json()["error"]["message"]
    r = requests.post(url(srv, ds_id(m), "/count"),
                      json={"var": {"names": [var.index[3], "NOPE_1"], "missing": "ignore"}})
    assert r.status_code == 200
    body = r.json()
    assert body["dropped"] == {"obs": [], "var": ["NOPE_1"]}
    assert body["n_genes"] == 1 and body["nnz"] == exp[:, [3]].nnz
    r = requests.post(url(srv, ds_id(m), "/query"), headers={"Accept": "application/x-ndjson"},
                      json={"var": {"names": [var.index[3], "NOPE_1"], "missing": "ignore"}})
    assert r.status_code == 200
    assert json.loads(r.headers["X-Ivserve-Dropped-Names"])["var"] == ["NOPE_1"]
    r = requests.post(url(srv, ds_id(m), "/count"), json={"var": {"names": ["x"], "by": "nocol"}})
    assert r.status_code == 422 and "nocol" in r.json()["error"]["message"]


@pytest.mark.parametrize("m", FILES, ids=IDS)
def test_schema_lists_columns_with_null_and_category_counts(srv, m):
    obs, var = meta(m)
    doc = requests.get(url(srv, ds_id(m))).json()
    for frame, listed in ((obs, doc["obs"]), (var, doc["var"])):
        cols = {c["name"]: c for c in listed["columns"]}
        for name in frame.columns:
            c = cols[name]
            s = frame[name]
            assert c["null_count"] == int(s.isna().sum()), name
            if isinstance(s.dtype, pd.CategoricalDtype):
                assert c["type"] == "categorical"
                vc = s.value_counts()
                assert {x["name"]: x["count"] for x in c["categories"]} == \
                    {str(k): int(v) for k, v in vc.items()}, name
    assert any(c["name"] == "total_counts" and c["computed"] for c in
               doc["obs" if m["orientation"] == "ivcsr" else "var"]["columns"])


@pytest.mark.parametrize("m", FILES[:1], ids=IDS[:1])
def test_columns_and_tables(srv, m):
    obs, var = meta(m)
    r = requests.get(url(srv, ds_id(m), "/obs/age")).json()
    assert r["type"] == "int" and r["values"] == [int(x) for x in obs.age]
    r = requests.get(url(srv, ds_id(m), "/obs/batch")).json()
    assert r["values"] == [None if pd.isna(x) else int(x) for x in obs.batch]
    assert r["null_count"] == int(obs.batch.isna().sum()) > 0
    r = requests.get(url(srv, ds_id(m), "/obs/cell_type"), params={"where": "age > 50"}).json()
    vc = obs.cell_type[obs.age > 50].value_counts()
    assert {x["name"]: x["count"] for x in r["categories"]} == {k: int(v) for k, v in vc.items()}
    r = requests.get(url(srv, ds_id(m), "/var/mean_counts"), params={"offset": 3, "limit": 4}).json()
    assert r["values"] == pytest.approx(list(var.mean_counts.iloc[3:7]))
    assert requests.get(url(srv, ds_id(m), "/obs/nope")).status_code == 404
    # CSV reads back into the same frame.
    r = requests.get(url(srv, ds_id(m), "/obs"), params={"format": "csv", "limit": 1000})
    assert r.headers["Content-Type"].startswith("text/csv")
    df = pd.read_csv(io.StringIO(r.text), index_col=0)
    assert list(df.index) == list(obs.index)
    assert list(df.cell_type) == list(obs.cell_type)
    assert np.allclose(df.n_counts_reported, obs.n_counts_reported.astype(float), rtol=1e-6)
    assert [None if pd.isna(x) else int(x) for x in df.batch] == \
        [None if pd.isna(x) else int(x) for x in obs.batch]
    # NDJSON by Accept, offset and limit.
    r = requests.get(url(srv, ds_id(m), "/obs"), params={"offset": 10, "limit": 5, "columns": "age"},
                     headers={"Accept": "application/x-ndjson"})
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert [x["_index"] for x in lines] == list(obs.index[10:15])
    assert [x["age"] for x in lines] == [int(a) for a in obs.age[10:15]]
    r = requests.get(url(srv, ds_id(m), "/var"), params={"limit": 3}).json()
    assert r["total"] == len(var) and [x["_index"] for x in r["rows"]] == list(var.index[:3])
    assert requests.get(url(srv, ds_id(m), "/obs"), params={"limit": 10**6}).status_code == 400
    assert requests.get(url(srv, ds_id(m), "/obs"), params={"columns": "zz"}).status_code == 422


@pytest.mark.parametrize("sel, status, words", [
    ({"where": "age >="}, 400, ["position"]),
    ({"where": "cell_type in ['B cell'"}, 400, ["position"]),
    ({"where": "agee >= 3"}, 422, ["agee", "age"]),
    ({"where": "cell_type == 'B cel'"}, 422, ["B cel", "B cell"]),
    ({"filter": {"column": "cell_typ", "in": ["B cell"]}}, 422, ["cell_typ", "cell_type"]),
    ({"filter": {"column": "age", "foo": 1}}, 400, ["foo"]),
    ({"filter": {"column": "age", "ge": "old"}}, 422, ["age"]),
    ({"where": 5}, 400, ["where"]),
    ({"by": "gene_ids"}, 422, ["names"]),
])
def test_bad_filters(srv, sel, status, words):
    m = FILES[0]
    for ep in ("/count", "/query"):
        r = requests.post(url(srv, ds_id(m), ep), json={"obs": sel})
        assert r.status_code == status, (sel, r.text)
        msg = r.json()["error"]["message"]
        for w in words:
            assert w in msg, (w, msg)
    if "where" in sel and isinstance(sel["where"], str):
        r = requests.get(url(srv, ds_id(m), "/obs"), params={"where": sel["where"]})
        assert r.status_code == status, r.text


def test_example_dataset(srv):
    if not os.path.exists(EXAMPLE):
        pytest.skip("example dataset absent")
    with h5py.File(EXAMPLE, "r") as f:
        obs = read_elem(f["obs"])
    cats = [c for c in obs.columns if isinstance(obs[c].dtype, pd.CategoricalDtype)]
    assert cats, "the example has a categorical obs column"
    col = cats[0]
    label = str(obs[col].value_counts().index[0])
    rows = rows_of(obs[col] == label)
    c = ivclient.Client(srv.url)
    whole = c.query("pbmc", format="binary").matrix.tocsr()
    w = f"`{col}` == '{label}'"
    res = c.query("pbmc", obs={"where": w}, format="binary")
    assert np.array_equal(res.obs, rows)
    same(res.matrix, whole[rows])
    cnt = c.count("pbmc", obs={"filter": {"column": col, "eq": label}})
    assert cnt["n_cells"] == len(rows) and cnt["nnz"] == whole[rows].nnz
    assert cnt["total_counts"] == pytest.approx(float(whole[rows].sum()))
    doc = requests.get(url(srv, "pbmc")).json()
    listed = {x["name"]: x for x in doc["obs"]["columns"]}[col]
    assert {x["name"]: x["count"] for x in listed["categories"]} == \
        {str(k): int(v) for k, v in obs[col].value_counts().items()}
