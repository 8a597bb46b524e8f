"""obs / var rows by a selection: POST .../obs, .../var, .../obs/{column},
.../var/{column} with the query route's selection object in the body.

Against pandas' own obs.iloc[positions] / var.loc[names] of the fixtures'
metadata twins (read by anndata), value by value: index lists unordered
and with duplicates, ranges, masks, names (repeated, by a column, missing
ignored), where filters alone and over an index list (the list's order
kept), paging over the selection, CSV; the rows are the rows POST .../query
selects for the same object; errors are /query's (status and code) for the
same bad selection, plus the route's own; ETag / 304 as the GET form.  And
the Python client's to_anndata() of a subset (which now fetches only those
rows) against anndata's own subset of the twin, dtypes and categories
included, with the request it sends checked.
"""
import math
import os
import sys
import warnings

import anndata
import numpy as np
import pandas as pd
import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "clients", "python"))

from conftest import fixtures_path  # noqa: E402

FIX = fixtures_path()
if FIX is None:
    pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): skipping",
                allow_module_level=True)

import ivserve  # noqa: E402
from test_http_server import Server  # noqa: E402

DATASETS = {"tiny": ("tiny.ivcsr.blosc2-lz4.h5ad", "expected/tiny.meta.h5ad"),
            "chunky": ("chunky.ivcsr.zstd.h5ad", "expected/chunky.meta.h5ad")}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    ds = [{"id": k, "path": os.path.join(FIX, f)} for k, (f, _) in DATASETS.items()]
    s = Server(str(tmp_path_factory.mktemp("rows")), datasets=ds)
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


_TWINS = {}


def twin(ds_id):
    if ds_id not in _TWINS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _TWINS[ds_id] = anndata.read_h5ad(os.path.join(FIX, DATASETS[ds_id][1]))
    return _TWINS[ds_id]


def post(srv, ds_id, path, body, **kw):
    return requests.post(f"{srv.url}/v1/datasets/{ds_id}/{path}", json=body, **kw)


def json_value(v):
    """A pandas cell as the JSON answer writes it: missing as None,
    numpy scalars as Python numbers."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(float(v)) else float(v)
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    return v


def want_rows(df):
    """The table answer's rows for a pandas frame (every column)."""
    out = []
    for name, row in zip(df.index, df.itertuples(index=False)):
        r = {"_index": name}
        r.update({c: json_value(v) for c, v in zip(df.columns, row)})
        out.append(r)
    return out


def table(srv, ds_id, axis, sel, **members):
    """Every row of POST .../{axis} for sel, paged by 7 to cross pages."""
    rows, offset, total = [], 0, None
    while total is None or offset < total:
        r = post(srv, ds_id, axis, dict({axis: sel, "offset": offset, "limit": 7}, **members))
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["offset"] == offset and doc["axis"] == axis
        total = doc["total"]
        assert len(doc["rows"]) == min(7, total - offset)
        rows.extend(doc["rows"])
        offset += len(doc["rows"])
    return rows


def query_positions(srv, ds_id, sel):
    """The obs rows POST .../query selects for sel (JSON answer)."""
    r = post(srv, ds_id, "query", {"obs": sel, "var": {"index": [0]}, "format": "json"})
    assert r.status_code == 200, r.text
    return list(r.json()["obs"])


RNG = np.random.default_rng(29)


def obs_cases(obs):
    n = len(obs)
    perm = RNG.permutation(n)[: n // 2]
    dup = np.concatenate([perm[:9], perm[:9][::-1], [perm[0]] * 3])
    mask = RNG.random(n) < 0.4
    return [
        ("index unordered", {"index": perm.tolist()}, perm),
        ("index duplicates", {"index": dup.tolist()}, dup),
        ("range", {"range": [3, n - 2]}, np.arange(3, n - 2)),
        ("mask", {"mask": mask.tolist()}, np.nonzero(mask)[0]),
        ("names repeated", {"names": list(obs.index[dup])}, dup),
        ("empty", {"index": []}, np.zeros(0, np.int64)),
    ]


@pytest.mark.parametrize("ds_id", list(DATASETS))
def test_obs_rows_equal_pandas_iloc(srv, ds_id):
    obs = twin(ds_id).obs
    for label, sel, pos in obs_cases(obs):
        got = table(srv, ds_id, "obs", sel, columns=list(obs.columns))
        assert got == want_rows(obs.iloc[pos]), label
        # The same rows, in the same order, as the query route selects.
        if len(pos):
            assert query_positions(srv, ds_id, sel) == [int(p) for p in pos], label


def test_where_alone_and_over_an_index_list(srv):
    obs = twin("chunky").obs
    ct = obs["cell_type"].astype(str).to_numpy()
    where = "cell_type == 'B cell' and age > 40"
    keep = (ct == "B cell") & (obs["age"].to_numpy() > 40)
    got = table(srv, "chunky", "obs", {"where": where}, columns=["cell_type", "age"])
    assert got == want_rows(obs.iloc[np.nonzero(keep)[0]][["cell_type", "age"]])
    # Over an index list: the list's order and repeats, the rows the filter keeps.
    idx = np.concatenate([RNG.permutation(len(obs))[:300], [5, 5, 5]])
    pos = idx[keep[idx]]
    sel = {"index": idx.tolist(), "where": where}
    got = table(srv, "chunky", "obs", sel, columns=["cell_type", "age"])
    assert got == want_rows(obs.iloc[pos][["cell_type", "age"]])
    assert query_positions(srv, "chunky", sel) == [int(p) for p in pos]


def test_var_rows_by_names_and_by_column(srv):
    var = twin("tiny").var
    names = [var.index[7], var.index[2], var.index[7], var.index[0]]
    got = table(srv, "tiny", "var", {"names": names})
    assert got == want_rows(var.loc[names])
    ids = list(var["gene_ids"].iloc[[4, 4, 1]])
    got = table(srv, "tiny", "var", {"names": ids + ["nope"], "by": "gene_ids", "missing": "ignore"},
                columns="gene_ids,highly_variable")
    assert got == want_rows(var.iloc[[4, 4, 1]][["gene_ids", "highly_variable"]])
    r = post(srv, "tiny", "var", {"var": {"names": ["nope", names[0]], "missing": "ignore"}})
    assert r.status_code == 200 and '"nope"' in r.headers["X-Ivserve-Dropped-Names"]


def test_column_route_values_and_counts(srv):
    obs = twin("chunky").obs
    pos = np.concatenate([RNG.permutation(len(obs))[:500], [0, 0]])
    for col in ("cell_type", "age", "batch", "n_counts_reported", "is_doublet"):
        r = post(srv, "chunky", f"obs/{col}", {"obs": {"index": pos.tolist()}, "values": True})
        assert r.status_code == 200, r.text
        doc = r.json()
        want = obs[col].iloc[pos]
        assert doc["values"] == [json_value(v) for v in want], col
        assert doc["selected"] == len(pos) and doc["n_rows"] == len(obs)
        if col == "cell_type":
            counts = want.value_counts()
            assert {c["name"]: c["count"] for c in doc["categories"]} == \
                {str(k): int(counts.get(k, 0)) for k in obs[col].cat.categories}


def test_csv_and_every_row_without_a_selection(srv):
    obs = twin("tiny").obs
    r = post(srv, "tiny", "obs", {"obs": {"index": [4, 1, 4]}, "columns": ["age", "sample"], "format": "csv"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    lines = r.text.splitlines()
    assert lines[0] == "_index,age,sample"
    assert lines[1:] == [f"{obs.index[i]},{obs['age'].iloc[i]},{obs['sample'].iloc[i]}" for i in (4, 1, 4)]
    # No selection: every row; no columns: every column, the computed ones too (as GET).
    doc = post(srv, "tiny", "obs", {"limit": 100000}).json()
    assert doc["columns"][: len(obs.columns) + 1] == ["_index"] + list(obs.columns)
    doc = post(srv, "tiny", "obs", {"limit": 100000, "columns": list(obs.columns)}).json()
    assert doc["total"] == len(obs) and doc["rows"] == want_rows(obs)


@pytest.mark.parametrize("sel", [
    {"index": [0, 10**6]},
    {"index": [-1]},
    {"mask": [True, False]},
    {"names": ["no such cell"]},
    {"where": "no_such_column == 1"},
    {"where": "age >"},
    {"index": [1], "range": [0, 2]},
    {"bogus": 1},
    "not an object",
])
def test_bad_selection_is_the_query_routes_error(srv, sel):
    q = post(srv, "tiny", "query", {"obs": sel, "format": "json"})
    r = post(srv, "tiny", "obs", {"obs": sel})
    assert 400 <= q.status_code < 500
    assert r.status_code == q.status_code, (r.text, q.text)
    assert r.json()["error"]["code"] == q.json()["error"]["code"]
    c = post(srv, "tiny", "obs/age", {"obs": sel})
    assert c.status_code == q.status_code and c.json()["error"]["code"] == q.json()["error"]["code"]


@pytest.mark.parametrize("path,body,status", [
    ("obs", {"var": {"index": [0]}}, 422),
    ("var", {"obs": {"index": [0]}}, 422),
    ("obs", {"obs": {"index": [0]}, "values": True}, 400),
    ("obs/age", {"obs": {"index": [0]}, "columns": ["age"]}, 400),
    ("obs", {"obs": {"index": [0]}, "columns": ["nope"]}, 422),
    ("obs", {"obs": {"index": [0]}, "columns": [1]}, 400),
    ("obs", {"obs": {"index": [0]}, "limit": 100001}, 400),
    ("obs", {"obs": {"index": [0]}, "offset": -1}, 400),
    ("obs", {"obs": {"index": [0]}, "format": "xml"}, 406),
    ("obs", {"obs": {"index": [0]}, "by": "var"}, 400),
    ("obs/nope", {"obs": {"index": [0]}}, 404),
    ("obs/nope", {"obs": {"index": [10**6]}}, 404),
])
def test_route_errors(srv, path, body, status):
    r = post(srv, "tiny", path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


def test_bad_bodies_and_parameters_in_the_url(srv):
    u = f"{srv.url}/v1/datasets/tiny/obs"
    r = requests.post(u, data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    r = requests.post(u + "?limit=3", json={"obs": {"index": [0]}})
    assert r.status_code == 400 and "body" in r.json()["error"]["message"]


def test_etag_revalidation(srv):
    body = {"obs": {"index": [3, 1, 3]}, "columns": ["age"]}
    a = post(srv, "tiny", "obs", body)
    assert a.status_code == 200 and a.headers["ETag"]
    r = post(srv, "tiny", "obs", body, headers={"If-None-Match": a.headers["ETag"]})
    assert r.status_code == 304
    other = post(srv, "tiny", "obs", dict(body, obs={"index": [3, 1]}))
    assert other.headers["ETag"] != a.headers["ETag"] and len(other.json()["rows"]) == 2


class _Recorder(requests.Session):
    """A session that notes each request's method, path and JSON body."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def request(self, method, url, **kw):
        self.seen.append((method, url.split("/v1/datasets/", 1)[-1].split("?")[0], kw.get("json")))
        return super().request(method, url, **kw)


def anndata_subset(ds_id, obs_pos, var_pos):
    a = twin(ds_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a[obs_pos][:, var_pos].copy()


@pytest.mark.parametrize("kind", ["index", "mask", "where", "names"])
def test_client_to_anndata_fetches_only_the_selected_rows(srv, kind):
    a = twin("chunky")
    n = a.n_obs
    if kind == "index":
        key = np.concatenate([RNG.permutation(n)[:200], [7, 7]])
        pos = key
    elif kind == "mask":
        key = RNG.random(n) < 0.1
        pos = np.nonzero(key)[0]
    elif kind == "names":
        pos = RNG.permutation(n)[:50]
        key = list(a.obs.index[pos])
    else:
        key = None
        pos = np.nonzero((a.obs["condition"] == "SLE").to_numpy())[0]
    vpos = np.array([9, 3, 3, 0])
    session = _Recorder()
    ds = ivserve.connect(srv.url, session=session)["chunky"]
    q = ds.where("condition == 'SLE'")[:, vpos] if kind == "where" else ds[key, vpos]
    got = q.to_anndata(uns=False, obsm=False)
    want = anndata_subset("chunky", pos, vpos)
    pd.testing.assert_frame_equal(got.obs, want.obs)
    pd.testing.assert_frame_equal(got.var, want.var)
    posts = {p: body for m, p, body in session.seen if m == "POST" and p in ("chunky/obs", "chunky/var")}
    assert set(posts) == {"chunky/obs", "chunky/var"}
    assert posts["chunky/obs"]["obs"] == q.obs and posts["chunky/var"]["var"] == q.var
    # No whole column and no names page was read (.../obsp, the obsp list, is no table).
    assert not [p for m, p, _ in session.seen if m == "GET" and (p in ("chunky/obs", "chunky/var") or
                                                                p.startswith(("chunky/obs/", "chunky/var/")))]


def test_client_whole_tables_held_are_not_fetched_again(srv):
    session = _Recorder()
    ds = ivserve.connect(srv.url, session=session)["chunky"]
    ds.obs, ds.var
    before = len(session.seen)
    got = ds[[5, 1, 5], [2, 2]].to_anndata(uns=False, obsm=False)
    assert not [s for s in session.seen[before:] if s[1] in ("chunky/obs", "chunky/var")]
    want = anndata_subset("chunky", [5, 1, 5], [2, 2])
    pd.testing.assert_frame_equal(got.obs, want.obs)
    pd.testing.assert_frame_equal(got.var, want.var)
