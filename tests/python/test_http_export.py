"""POST|GET|HEAD /v1/datasets/{id}/export: the selection as a .h5ad.

A file written by anndata 0.8 (obs columns of every encoding the writer
subsets: categorical, float, int, bool, string; var columns; an obsm) is
packed with `ivserve pack` and served.  For random selections (index
lists in no order with duplicates, masks, ranges, names, where filters,
gene subsets, the empty selection, all cells) the downloaded file, read
by anndata.read_h5ad, must equal anndata.read_h5ad(plain)[obs][:, var]:
X bit for bit (scipy), obs and var names, and the obs / var columns with
their dtypes and categories as anndata leaves them after subsetting; and
the same as `ivserve export` writes for that selection.  Bad selections
get /query's 4xx JSON errors, a selection past limits.max_nnz a 413
naming the limit, and a client that leaves mid-download leaves no
temporary file, no open descriptor, and a server that goes on serving.
"""
import base64
import io
import os
import socket
import sys
import time
import warnings

import anndata
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ivprocess import BIN, ServerProcess, write_config  # noqa: E402

N, G = 300, 40
TYPES = np.array(["B", "T", "NK", "Mono"])


def write_file(path, n=N, g=G, density=0.3, seed=3):
    rng = np.random.default_rng(seed)
    X = sp.random(n, g, density=density, format="csr", dtype=np.float32, random_state=seed)
    X.data = np.round(X.data * 50).astype(np.float32) + 1
    a = anndata.AnnData(X=X)
    a.obs_names = ["cell%d" % i for i in range(n)]
    a.var_names = ["gene%d" % j for j in range(g)]
    a.obs["cell_type"] = pd.Categorical(TYPES[rng.integers(0, 4, n)])
    a.obs["score"] = rng.normal(size=n)
    a.obs["count"] = rng.integers(0, 1000, n).astype(np.int64)
    a.obs["ok"] = rng.random(n) < 0.5
    a.obs["label"] = ["L%d" % (i % 7) for i in range(n)]
    a.var["mean"] = rng.random(g).astype(np.float32)
    a.var["highly_variable"] = rng.random(g) < 0.3
    a.var["kind"] = pd.Categorical(np.array(["a", "b"])[rng.integers(0, 2, g)])
    # A category no cell has (dropped by every subset) and colors for
    # each category, as scanpy keeps them (trimmed alike by a subset).
    a.obs["group"] = pd.Categorical(np.array(["g0", "g1", "g2"])[rng.integers(0, 3, n)],
                                    categories=["g0", "never", "g1", "g2"])
    a.uns["group_colors"] = np.array(["#111111", "#222222", "#333333", "#444444"], dtype=object)
    a.uns["cell_type_colors"] = np.array(["#aa0000", "#00aa00", "#0000aa", "#aaaa00"], dtype=object)
    a.obsm["X_umap"] = rng.normal(size=(n, 2)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a.write_h5ad(path)


def read(data_or_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if isinstance(data_or_path, bytes):
            return anndata.read_h5ad(io.BytesIO(data_or_path))
        return anndata.read_h5ad(data_or_path)


@pytest.fixture(scope="module")
def env(ivserve, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("export"))
    plain, packed = os.path.join(tmp, "plain.h5ad"), os.path.join(tmp, "packed.h5ad")
    write_file(plain)
    ivserve.assert_ok(ivserve.run("pack", plain, packed))
    # A larger one for the download cut short: several MiB of X.
    big_plain, big = os.path.join(tmp, "big_plain.h5ad"), os.path.join(tmp, "big.h5ad")
    write_file(big_plain, n=20000, g=200, density=0.4, seed=9)
    ivserve.assert_ok(ivserve.run("pack", big_plain, big))
    cache = os.path.join(tmp, "cache")
    os.makedirs(cache)
    cfg = {"datasets": [{"id": "d", "path": packed}, {"id": "big", "path": big}], "cache_dir": cache}
    s = ServerProcess(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"], binary=BIN)
    small = ServerProcess(tmp, ["--config", write_config(tmp, {
        "datasets": [{"id": "d", "path": packed}, {"id": "big", "path": big}],
        "limits": {"max_nnz": 20000, "max_answer_bytes": 65536}})], binary=BIN)
    yield {"s": s, "small": small, "full": read(plain), "plain": plain, "packed": packed,
           "cache": cache, "tmp": tmp, "ivserve": ivserve}
    assert small.stop() == 0, small.log_text()[-3000:]
    assert s.stop() == 0, s.log_text()[-3000:]


def same_frame(got, want, what):
    assert list(got.index) == list(want.index), what
    assert list(got.columns) == list(want.columns), what
    for c in want.columns:
        g, w = got[c], want[c]
        if isinstance(w.dtype, pd.CategoricalDtype):
            # Only the categories the selected rows use, as anndata's
            # subset leaves them (core/matrix/anndata_write.h).
            assert g.dtype == w.dtype, (what, c, g.dtype, w.dtype)
            assert list(g.cat.categories) == list(w.cat.categories), (what, c)
            assert np.array_equal(g.cat.codes.to_numpy(), w.cat.codes.to_numpy()), (what, c)
        else:
            assert g.dtype == w.dtype, (what, c, g.dtype, w.dtype)
            assert np.array_equal(g.to_numpy(), w.to_numpy()), (what, c)


def same(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    gx = sp.csr_matrix(got.X)
    wx = sp.csr_matrix(want.X)
    assert gx.dtype == wx.dtype, what
    assert (gx != wx).nnz == 0, what
    same_frame(got.obs, want.obs, what + " obs")
    same_frame(got.var, want.var, what + " var")
    for k in ("group_colors", "cell_type_colors"):
        assert list(got.uns[k]) == list(want.uns[k]), (what, k, got.uns[k], want.uns[k])


def codes_on_disk(data_or_path):
    """Each categorical column's codes dtype as stored in the file."""
    import h5py
    f = h5py.File(io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else data_or_path, "r")
    with f:
        return {"%s/%s" % (ax, c): f[ax][c]["codes"].dtype.str for ax in ("obs", "var") for c in f[ax]
                if isinstance(f[ax][c], h5py.Group) and f[ax][c].attrs.get("encoding-type") == "categorical"}


def expected(full, obs, var):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return full[obs][:, var].copy()


def post(env, body, url_id="d", srv="s"):
    return requests.post(env[srv].url + "/v1/datasets/%s/export" % url_id, json=body, timeout=60)


def test_random_selections_equal_anndata_subset(env):
    full = env["full"]
    rng = np.random.default_rng(11)
    obs_names = np.array(full.obs_names)
    var_names = np.array(full.var_names)
    cases = []
    for k in range(4):
        o = rng.integers(0, N, rng.integers(1, 60))
        o = np.concatenate([o, o[:3]])  # duplicates, in no order
        v = rng.permutation(G)[:rng.integers(1, G)]
        cases.append(("index%d" % k, {"obs": {"index": o.tolist()}, "var": {"index": v.tolist()}}, o, v))
    mask = rng.random(N) < 0.3
    cases.append(("mask", {"obs": {"mask": mask.tolist()}}, np.flatnonzero(mask), np.arange(G)))
    # The viewer's form for large selections: base64 bits, LSB first.
    b64 = base64.b64encode(np.packbits(mask, bitorder="little").tobytes()).decode()
    cases.append(("mask64", {"obs": {"mask": b64}, "var": {"mask": (np.arange(G) % 3 == 0).tolist()}},
                  np.flatnonzero(mask), np.flatnonzero(np.arange(G) % 3 == 0)))
    cases.append(("range", {"obs": {"range": [20, 95]}, "var": {"range": [3, 17]}},
                  np.arange(20, 95), np.arange(3, 17)))
    on = rng.permutation(N)[:25]
    vn = rng.permutation(G)[:6]
    cases.append(("names", {"obs": {"names": obs_names[on].tolist()}, "var": {"names": var_names[vn].tolist()}},
                  on, vn))
    keep = ((full.obs["cell_type"] == "B") | (full.obs["score"] > 1)).to_numpy()
    cases.append(("where", {"obs": {"where": "cell_type == 'B' or score > 1"}, "var": {"index": [5, 1, 1]}},
                  np.flatnonzero(keep), np.array([5, 1, 1])))
    cases.append(("empty", {"obs": {"index": []}}, np.array([], dtype=np.int64), np.arange(G)))
    cases.append(("all", {}, np.arange(N), np.arange(G)))
    for what, body, o, v in cases:
        r = post(env, body)
        assert r.status_code == 200, (what, r.text[:300])
        assert r.headers["Content-Type"] == "application/x-hdf5"
        assert int(r.headers["Content-Length"]) == len(r.content)
        assert r.headers["Content-Disposition"] == 'attachment; filename="d_%d_cells.h5ad"' % len(o)
        want = expected(full, o, v)
        same(read(r.content), want, what)
        # The codes as anndata stores them for the subset (pandas' smallest
        # type for the categories kept).
        ref = os.path.join(env["tmp"], "ref_%s.h5ad" % what)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want.write_h5ad(ref)
        assert codes_on_disk(r.content) == codes_on_disk(ref), what


def test_get_head_and_cli_agree(env):
    full = env["full"]
    url = env["s"].url + "/v1/datasets/d/export?obs=7,3,3,100:110&var=2,0,9"
    o = np.array([7, 3, 3] + list(range(100, 110)))
    v = np.array([2, 0, 9])
    g = requests.get(url, timeout=60)
    assert g.status_code == 200, g.text[:300]
    got = read(g.content)
    same(got, expected(full, o, v), "GET")
    h = requests.head(url, timeout=60)
    assert h.status_code == 200 and h.content == b""
    assert int(h.headers["Content-Length"]) == len(g.content)
    assert h.headers["Content-Disposition"] == g.headers["Content-Disposition"]
    p = post(env, {"obs": {"index": o.tolist()}, "var": {"index": v.tolist()}})
    same(read(p.content), got, "POST = GET")
    out = os.path.join(env["tmp"], "cli.h5ad")
    iv = env["ivserve"]
    iv.assert_ok(iv.export(env["packed"], out, obs="7,3,3,100:110", var="2,0,9"))
    cli = read(out)
    same(got, cli, "CLI")
    for c in cli.obs.columns:  # the same writer: the same categories too
        assert got.obs[c].dtype == cli.obs[c].dtype, c
    # Another method is refused with Allow.
    r = requests.put(url, timeout=30)
    assert r.status_code == 405 and "POST" in r.headers.get("Allow", "")


def test_bad_selections_are_query_errors(env):
    for body, status in (({"obs": {"index": [N]}}, 422), ({"obs": {"names": ["nope"]}}, 422),
                         ({"obs": {"where": "nope == 1"}}, 422), ({"obs": [1, 2]}, 422),
                         ({"matrix": "layers/x"}, None)):
        r = post(env, body)
        q = requests.post(env["s"].url + "/v1/datasets/d/query", json=body, timeout=30)
        want = status or q.status_code
        assert r.status_code == want == q.status_code, (body, r.status_code, q.status_code, r.text)
        assert r.json()["error"]["code"] == q.json()["error"]["code"], body
    r = requests.post(env["s"].url + "/v1/datasets/d/export", data=b"{not json", timeout=30)
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(env["s"].url + "/v1/datasets/d/export", data=b"{}", headers={"Content-Type": "image/png"},
                      timeout=30)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media"
    r = requests.get(env["s"].url + "/v1/datasets/nope/export", timeout=30)
    assert r.status_code == 404 and "error" in r.json()


def test_too_large_is_413_naming_the_limit(env):
    # big: 200 genes, 40% stored: 300 cells hold about 24,000 values (past
    # max_nnz); 200 cells about 16,000, whose 8 bytes each pass 64 KiB.
    for obs, limit in (({"range": [0, 300]}, "limits.max_nnz"), ({"range": [0, 200]}, "limits.max_answer_bytes")):
        r = post(env, {"obs": obs}, url_id="big", srv="small")
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "too_large"
        assert limit in r.json()["error"]["message"], r.text
    r = post(env, {}, srv="small")  # 3,600 values: under both
    assert r.status_code == 200
    same(read(r.content), expected(env["full"], np.arange(N), np.arange(G)), "under the limits")


def open_exports(pid):
    """The server's open descriptors of export files (unlinked or not)."""
    out = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if "ivserve-export" in t:
            out.append(t)
    return out


def test_client_leaving_mid_download_leaves_nothing(env):
    s = env["s"]
    body = b'{"obs":{"range":[0,20000]}}'
    head = requests.head(s.url + "/v1/datasets/big/export", timeout=120)
    total = int(head.headers["Content-Length"])
    assert total > 8 << 20, total  # larger than the socket buffers hold
    for _ in range(2):
        c = socket.create_connection(("127.0.0.1", s.port))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        c.sendall(b"POST /v1/datasets/big/export HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while len(got) < 65536:
            chunk = c.recv(65536)
            assert chunk, "the server closed first"
            got += chunk
        assert b"200 OK" in got.split(b"\r\n")[0]
        # Mid-download: the file is open and already unlinked, and its
        # folder is gone.
        held = open_exports(s.proc.pid)
        assert held and all(t.endswith("(deleted)") for t in held), held
        assert [f for f in os.listdir(env["cache"]) if f.startswith("ivserve-export")] == []
        c.close()
    deadline = time.time() + 20
    while time.time() < deadline and open_exports(s.proc.pid):
        time.sleep(0.1)
    assert open_exports(s.proc.pid) == []
    assert [f for f in os.listdir(env["cache"]) if f.startswith("ivserve-export")] == []
    cut = [l for l in s.log_text().splitlines() if "/big/export" in l and "closed the connection" in l]
    assert len(cut) >= 2, "the access log does not show the cut downloads"
    r = post(env, {"obs": {"index": [4, 4]}})
    assert r.status_code == 200
    same(read(r.content), expected(env["full"], [4, 4], np.arange(G)), "after the cut")
