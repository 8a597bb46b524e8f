"""POST /v1/datasets/{id}/diffexp against scipy, through a real server.

Datasets are random sparse matrices written here as packed .h5ad in both
orientations (cell-major: the route transposes in chunks; gene-major: it
reads gene rows directly), with integer and float values, and genes made
to hit the edge cases: a gene with no entries, a gene equal in every cell,
a gene stored in every cell, a gene of explicit stored zeros only.  Groups
of one cell, of every other cell, one-versus-rest of every category and
against a reference category are compared gene by gene with
scipy.stats.ttest_ind(equal_var=False) and scipy.stats.mannwhitneyu(
method="asymptotic", use_continuity=False), the Wilcoxon z-score the way
scanpy computes it, and Benjamini-Hochberg from a numpy reference here.
Where scipy answers NaN (no variance, a group of one cell for the t-test)
the route answers score 0 and p-value 1, as scanpy does.  The real
fixtures, when present, are compared the same way.
"""
import json
import os
import sys
import warnings

import h5py
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from anndata.experimental import write_elem  # noqa: E402

import ivref  # noqa: E402
from conftest import fixtures_path  # noqa: E402
from test_http_server import Server  # noqa: E402

N_OBS, N_VAR = 300, 40
TYPES = ["B", "T", "NK", "mono", "solo", "unused"]


def make_data(seed, kind):
    rng = np.random.default_rng(seed)
    X = sp.random(N_OBS, N_VAR, density=0.25, format="lil", random_state=seed,
                  data_rvs=lambda n: rng.integers(1, 6, n)).astype(np.float64)
    X[:, 0] = 0                           # a gene with no entries
    X[:, 1] = 3                           # equal in every cell
    X[:, 2] = rng.integers(1, 4, (N_OBS, 1))  # stored in every cell, many ties
    X = sp.csr_matrix(X)
    if kind == "float32":
        X.data = (X.data * rng.random(X.data.shape[0]) - 1.5).astype(np.float32).astype(np.float64)
        X[:, 1] = sp.csr_matrix(np.full((N_OBS, 1), 0.25))
    X = sp.csr_matrix(X)
    X.sort_indices()
    # gene 3: explicit stored zeros only
    coo = X.tocoo()
    keep = coo.col != 3
    rows = np.concatenate([coo.row[keep], np.arange(0, N_OBS, 7)])
    cols = np.concatenate([coo.col[keep], np.full(len(range(0, N_OBS, 7)), 3)])
    vals = np.concatenate([coo.data[keep], np.zeros(len(range(0, N_OBS, 7)))])
    X = sp.csr_matrix((vals, (rows, cols)), shape=(N_OBS, N_VAR))
    X.sort_indices()
    ct = rng.choice(TYPES[:4], N_OBS)
    ct[17] = "solo"
    obs = pd.DataFrame({"cell_type": pd.Categorical(ct, categories=TYPES)},
                       index=["cell%d" % i for i in range(N_OBS)])
    obs.loc[obs.index[[5, 6]], "cell_type"] = np.nan
    var = pd.DataFrame(index=["G%d" % i for i in range(N_VAR)])
    return X, obs, var


def write_dataset(path, X, obs, var, orientation, value_dtype):
    ivref.write_iv(path, X, orientation=orientation, value_dtype=value_dtype, obs=False, var=False)
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)


CASES = [("ivcsr", "int32"), ("ivcsc", "int32"), ("ivcsc", "float32"), ("ivcsr", "float32")]
IDS = ["%s_%s" % c for c in CASES]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("diffexp"))
    data, ds = {}, []
    for k, (orient, dt) in enumerate(CASES):
        d = make_data(40 + k, dt)
        path = os.path.join(tmp, "d_%s_%s.h5ad" % (orient, dt))
        write_dataset(path, *d, orientation=orient, value_dtype=np.dtype(dt))
        data["%s_%s" % (orient, dt)] = d
        ds.append({"id": "%s_%s" % (orient, dt), "path": path})
    # Genes with more distinct values than the engine's counting table
    # holds (512): the gated scratch and the sort.
    rng = np.random.default_rng(5)
    Xm = sp.random(1500, 6, density=0.7, format="csr", random_state=5,
                   data_rvs=lambda n: rng.random(n) * 10 - 2).astype(np.float32).astype(np.float64)
    om = pd.DataFrame({"cell_type": pd.Categorical(rng.choice(["a", "b", "c"], 1500))},
                      index=["m%d" % i for i in range(1500)])
    path = os.path.join(tmp, "many.h5ad")
    write_dataset(path, Xm, om, pd.DataFrame(index=["M%d" % i for i in range(6)]), "ivcsc",
                  np.dtype("float32"))
    data["many"] = (Xm, om, None)
    ds.append({"id": "many", "path": path})
    fix = fixtures_path()
    real = os.path.join(fix, "real") if fix else None
    if real and os.path.isdir(real):
        for name in ("pbmc_small", "seurat_visium_testdata"):
            p = os.path.join(real, name + ".ivcsr.h5ad")
            if os.path.exists(p):
                ds.append({"id": name, "path": p})
    s = Server(tmp, datasets=ds)
    yield s, data
    assert s.stop() == 0, s.log_text()[-3000:]


# ---------------------------------------------------------------- reference

def bh(p):
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    order = np.argsort(p, kind="stable")
    q = p[order] * n / np.arange(1, n + 1)
    q = np.minimum.accumulate(q[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(q, 1.0)
    return out


def ref_gene(a, b, method):
    """(score, pval) of one gene; scanpy's 0 and 1 where scipy gives NaN."""
    if method == "t-test" and np.ptp(a) == 0 and np.ptp(b) == 0:
        # Both sides constant: no variance, exactly.  scipy's means of n
        # equal values may differ by an ulp and give a t of any size
        # from a variance of 1e-32; the route answers what is exact: t
        # infinite (null in JSON) with p 0 where the values differ, else
        # scipy's NaN, reported as scanpy does (0 and 1).
        return (np.inf if a[0] != b[0] else 0.0), (0.0 if a[0] != b[0] else 1.0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if method == "t-test":
            t, p = stats.ttest_ind(a, b, equal_var=False)
        else:
            n1, n2 = len(a), len(b)
            ranks = stats.rankdata(np.concatenate([a, b]))
            tc = stats.tiecorrect(ranks)
            n = n1 + n2
            t = (ranks[:n1].sum() - n1 * (n + 1) / 2.0) / np.sqrt(tc * n1 * n2 * (n + 1) / 12.0)
            p = stats.mannwhitneyu(a, b, method="asymptotic", use_continuity=False,
                                   alternative="two-sided").pvalue
    if np.isnan(t) or np.isnan(p):
        return 0.0, 1.0
    return float(t), float(p)


def reference(Y, m1, m2, method):
    rows = []
    for j in range(Y.shape[1]):
        a, b = Y[m1, j], Y[m2, j]
        score, p = ref_gene(a, b, method)
        mean1, mean2 = a.mean(), b.mean()
        rows.append(dict(index=j, score=score, pval=p, mean1=mean1, mean2=mean2,
                         frac1=np.mean(a != 0), frac2=np.mean(b != 0),
                         logfoldchange=np.log2((np.expm1(mean1) + 1e-9) / (np.expm1(mean2) + 1e-9))))
    adj = bh([r["pval"] for r in rows])
    for r, q in zip(rows, adj):
        r["pval_adj"] = q
    return rows


def close(got, exp, rtol, what, atol=1e-300):
    if exp is None or not np.isfinite(exp):
        assert got is None, (what, got, exp)
        return
    assert got is not None, (what, got, exp)
    assert abs(got - exp) <= rtol * abs(exp) + atol, (what, got, exp, abs(got - exp) / max(abs(exp), 1e-300))


def check_genes(genes, ref, method, var_idx=None):
    """Every reference gene is in the answer with equal numbers, sorted by score."""
    byidx = {g["index"]: g for g in genes}
    idx = list(range(len(ref))) if var_idx is None else list(var_idx)
    assert sorted(byidx) == sorted(set(idx))
    scores = [g["score"] if g["score"] is not None else np.inf for g in genes]
    assert all(x >= y for x, y in zip(scores, scores[1:])), scores
    tol = 1e-10 if method == "t-test" else 1e-9
    for k, j in enumerate(idx):
        g, r = byidx[j], ref[k]
        close(g["score"], r["score"], tol, ("score", j))
        close(g["pval"], r["pval"], tol, ("pval", j))
        close(g["pval_adj"], r["pval_adj"], 1e-9, ("pval_adj", j))
        for key in ("mean1", "mean2", "frac1", "frac2"):
            close(g[key], r[key], 1e-12, (key, j), atol=1e-15)
        # numpy's mean of n equal values may be an ulp off: a fold change
        # of 1e-16 where the exact one is 0
        close(g["logfoldchange"], r["logfoldchange"], 1e-9, ("lfc", j), atol=1e-12)


def post(s, ds, body):
    return requests.post(s.url + "/v1/datasets/%s/diffexp" % ds, json=body)


# ---------------------------------------------------------------- two groups

@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
@pytest.mark.parametrize("ds", IDS)
def test_group_vs_rest_matches_scipy(env, ds, method):
    s, data = env
    X, obs, var = data[ds]
    D = X.toarray()
    integer = ds.endswith("int32")
    Y = np.log1p(D) if integer else D
    m1 = (obs["cell_type"] == "B").to_numpy()
    r = post(s, ds, {"group1": {"where": "cell_type == 'B'"}, "group2": "rest", "method": method})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["method"] == method and doc["log1p"] is integer
    assert doc["n_group1"] == m1.sum() and doc["n_group2"] == N_OBS - m1.sum()
    assert doc["genes"][0]["name"].startswith("G")
    check_genes(doc["genes"], reference(Y, m1, ~m1, method), method)


@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
@pytest.mark.parametrize("ds", ["ivcsr_int32", "ivcsc_float32"])
def test_explicit_groups_one_cell_and_log1p(env, ds, method):
    s, data = env
    X, obs, var = data[ds]
    D = X.toarray()
    rng = np.random.default_rng(7)
    # One cell against a random group; then a random group against another.
    g1 = [11]
    g2 = sorted(rng.choice(np.arange(20, N_OBS), 120, replace=False).tolist())
    for log1p in (False, True):
        Y = np.log1p(np.abs(D)) if log1p else D
        body = {"group1": {"index": g1}, "group2": {"index": g2}, "method": method, "log1p": log1p}
        if log1p:
            # log1p of negative floats is not asked: take a dataset's absolute values? no:
            # ask only on integer data.
            if not ds.endswith("int32"):
                continue
            Y = np.log1p(D)
        r = post(s, ds, body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["log1p"] is log1p and doc["n_group1"] == 1 and doc["n_group2"] == 120
        m1 = np.zeros(N_OBS, bool)
        m1[g1] = True
        m2 = np.zeros(N_OBS, bool)
        m2[g2] = True
        check_genes(doc["genes"], reference(Y, m1, m2, method), method)
    a = sorted(rng.choice(N_OBS, 90, replace=False).tolist())
    b = sorted(set(range(N_OBS)) - set(a))[:150]
    r = post(s, ds, {"group1": {"index": a}, "group2": {"index": b}, "method": method,
                     "log1p": False, "var": {"range": [2, 30]}})
    assert r.status_code == 200, r.text
    m1 = np.isin(np.arange(N_OBS), a)
    m2 = np.isin(np.arange(N_OBS), b)
    check_genes(r.json()["genes"], reference(D[:, 2:30], m1, m2, method), method, range(2, 30))


def test_top_n_and_min_frac(env):
    s, data = env
    X, obs, var = data["ivcsc_int32"]
    Y = np.log1p(X.toarray())
    m1 = (obs["cell_type"] == "T").to_numpy()
    ref = reference(Y, m1, ~m1, "wilcoxon")
    order = sorted(range(N_VAR), key=lambda j: (-ref[j]["score"], j))
    r = post(s, "ivcsc_int32", {"group1": {"where": "cell_type == 'T'"}, "method": "wilcoxon", "top_n": 5})
    genes = r.json()["genes"]
    assert [g["index"] for g in genes] == order[:5] + order[-5:]
    r = post(s, "ivcsc_int32", {"group1": {"where": "cell_type == 'T'"}, "method": "wilcoxon",
                                "min_frac": 0.3})
    kept = [j for j in order if max(ref[j]["frac1"], ref[j]["frac2"]) >= 0.3]
    assert 0 < len(kept) < N_VAR
    assert [g["index"] for g in r.json()["genes"]] == kept


# ---------------------------------------------------------------- one versus rest

@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
@pytest.mark.parametrize("ds", ["ivcsr_int32", "ivcsc_float32"])
def test_each_type_vs_rest_and_vs_reference(env, ds, method):
    s, data = env
    X, obs, var = data[ds]
    D = X.toarray()
    Y = np.log1p(D) if ds.endswith("int32") else D
    ct = obs["cell_type"]
    r = post(s, ds, {"group_by": "cell_type", "reference": "rest", "method": method})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["group_by"] == "cell_type" and doc["reference"] == "rest" and doc["method"] == method
    # every category with cells, in category order ("unused" has none)
    assert [g["key"] for g in doc["groups"]] == [["B"], ["T"], ["NK"], ["mono"], ["solo"]]
    for g in doc["groups"]:
        m1 = (ct == g["key"][0]).to_numpy()
        assert g["n_cells"] == m1.sum()
        # the rest holds every other cell, those with no category included
        check_genes(g["genes"], reference(Y, m1, ~m1, method), method)
    r = post(s, ds, {"group_by": "cell_type", "reference": "T", "groups": ["B", "NK", "T"],
                     "method": method})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["reference"] == "T" and [g["key"] for g in doc["groups"]] == [["B"], ["NK"]]
    m2 = (ct == "T").to_numpy()
    for g in doc["groups"]:
        m1 = (ct == g["key"][0]).to_numpy()
        check_genes(g["genes"], reference(Y, m1, m2, method), method)


def parse_binary(buf):
    """The binary answer: the document and, per gene list, its columns."""
    import struct
    assert buf[:4] == b"IVDE"
    version, jlen = struct.unpack_from("<Iq", buf, 4)
    assert version == 1
    doc = json.loads(buf[16:16 + jlen])
    pos = 16 + jlen
    pos += (-pos) % 8
    lists = doc["groups"] if "groups" in doc else [doc]
    for g in lists:
        n = g["n_genes"]
        idx = np.frombuffer(buf, "<i8", n, pos)
        pos += 8 * n
        cols = np.frombuffer(buf, "<f8", 8 * n, pos).reshape(8, n)
        pos += 64 * n
        g["genes"] = [dict(index=int(idx[k]), **{c: (float(cols[i][k]) if np.isfinite(cols[i][k]) else None)
                                                 for i, c in enumerate(["score", "logfoldchange", "pval",
                                                                        "pval_adj", "mean1", "mean2",
                                                                        "frac1", "frac2"])})
                      for k in range(n)]
    assert pos == len(buf)
    return doc


@pytest.mark.parametrize("body", [
    {"group1": {"where": "cell_type == 'NK'"}, "method": "wilcoxon", "top_n": 4},
    {"group_by": "cell_type", "method": "t-test"},
])
def test_binary_equals_json(env, body):
    s, data = env
    u = s.url + "/v1/datasets/ivcsc_int32/diffexp"
    j = requests.post(u, json=body).json()
    r = requests.post(u, json=body, headers={"Accept": "application/vnd.ivserve.diffexp"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/vnd.ivserve.diffexp"
    b = parse_binary(r.content)
    for lj, lb in zip(j.get("groups", [j]), b.get("groups", [b])):
        assert [g["index"] for g in lj["genes"]] == [g["index"] for g in lb["genes"]]
        for gj, gb in zip(lj["genes"], lb["genes"]):
            for k in ("score", "logfoldchange", "pval", "pval_adj", "mean1", "mean2", "frac1", "frac2"):
                assert gj[k] == gb[k], (k, gj, gb)
        assert len(lb["genes"]) == (8 if "top_n" in body else N_VAR)
    skip = ("genes", "groups", "n_genes")
    assert {k: v for k, v in j.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
def test_many_distinct_values(env, method):
    s, data = env
    X, obs, _ = data["many"]
    D = X.toarray()
    assert min(len(np.unique(D[:, j])) for j in range(D.shape[1])) > 600
    r = post(s, "many", {"group_by": "cell_type", "method": method, "log1p": False})
    assert r.status_code == 200, r.text
    for g in r.json()["groups"]:
        m1 = (obs["cell_type"] == g["key"][0]).to_numpy()
        check_genes(g["genes"], reference(D, m1, ~m1, method), method)
    r = post(s, "many", {"group_by": "cell_type", "reference": "a", "method": method, "log1p": False})
    for g in r.json()["groups"]:
        m1 = (obs["cell_type"] == g["key"][0]).to_numpy()
        check_genes(g["genes"], reference(D, m1, (obs["cell_type"] == "a").to_numpy(), method), method)


def test_dry_run(env):
    s, data = env
    X, obs, var = data["ivcsr_int32"]
    r = post(s, "ivcsr_int32", {"group1": {"index": [1, 2, 3]}, "group2": {"index": [4, 9]},
                                "var": {"index": [0, 5, 7]}, "dry_run": True})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["dry_run"] is True and doc["n_cells"] == 5 and doc["n_genes"] == 3
    r = post(s, "ivcsr_int32", {"group_by": "cell_type", "dry_run": True})
    assert r.json()["n_cells"] == N_OBS and r.json()["n_groups"] == 5 and r.json()["n_genes"] == N_VAR


def test_errors(env):
    s, data = env
    bad = [
        ({"group_by": "no_such_column"}, 422),
        ({"group_by": "cell_type", "reference": "no_such_type"}, 422),
        ({"group_by": "cell_type", "groups": ["B", "nope"]}, 422),
        ({"group_by": "cell_type", "groups": ["unused"]}, 422),
        ({"group1": {"where": "cell_type == 'unused'"}}, 422),
        ({"group1": {"where": "cell_type == 'nope'"}}, 422),
        ({"group1": {"range": [0, N_OBS]}, "group2": "rest"}, 422),
        ({"group1": {"index": [1, 2]}, "group2": {"index": [2, 3]}}, 422),
        ({"group1": {"index": [N_OBS + 5]}}, 422),
        ({"group1": {"index": [1]}, "method": "anova"}, 400),
        ({"group1": {"index": [1]}, "top_n": -1}, 400),
        ({"group1": {"index": [1]}, "log1p": "maybe"}, 400),
        ({"group1": {"index": [1]}, "min_frac": 2}, 400),
        ({"group1": {"index": [1]}, "colour": "red"}, 400),
        ({"group1": [1, 2]}, 400),
        ({}, 400),
        ({"group1": {"index": [1]}, "group_by": "cell_type"}, 400),
    ]
    for body, status in bad:
        r = post(s, "ivcsr_int32", body)
        assert r.status_code == status, (body, r.status_code, r.text)
        assert "error" in r.json(), r.text
    r = requests.post(s.url + "/v1/datasets/ivcsr_int32/diffexp", data=b"{not json")
    assert r.status_code == 400
    r = requests.get(s.url + "/v1/datasets/ivcsr_int32/diffexp")
    assert r.status_code in (400, 405)


# ---------------------------------------------------------------- real fixtures

def read_real(name):
    fix = fixtures_path()
    path = os.path.join(fix, "real", name + ".ivcsr.h5ad") if fix else None
    if not path or not os.path.exists(path):
        pytest.skip("real fixtures absent (IV_FIXTURES or ../shared/fixtures/real)")
    from anndata.experimental import read_elem
    # The matrix from the fixture's uncompressed copy (its packed chunks
    # need an HDF5 filter plugin h5py may lack).
    with h5py.File(os.path.join(fix, "real", "expected", name + ".csr.h5"), "r") as f:
        shape = tuple(int(x) for x in f.attrs["shape"])
        X = sp.csr_matrix((f["data"][:], f["indices"][:], f["indptr"][:]), shape=shape)
    with h5py.File(os.path.join(fix, "real", "expected", name + ".meta.h5ad"), "r") as f:
        obs = read_elem(f["obs"])
    return X.toarray().astype(np.float64), obs


@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
def test_real_pbmc_small(env, method):
    s, _ = env
    D, obs = read_real("pbmc_small")
    Y = np.log1p(D)
    r = post(s, "pbmc_small", {"group_by": "groups", "method": method})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["log1p"] is True
    col = obs["groups"].astype(str).to_numpy()
    assert len(doc["groups"]) >= 2
    for g in doc["groups"]:
        m1 = col == g["key"][0]
        check_genes(g["genes"], reference(Y, m1, ~m1, method), method)


def test_real_visium(env):
    s, _ = env
    D, obs = read_real("seurat_visium_testdata")
    Y = np.log1p(D)
    m1 = (obs["array_row"] < 30).to_numpy()
    for method in ("t-test", "wilcoxon"):
        r = post(s, "seurat_visium_testdata", {"group1": {"where": "array_row < 30"}, "method": method})
        assert r.status_code == 200, r.text
        check_genes(r.json()["genes"], reference(Y, m1, ~m1, method), method)
