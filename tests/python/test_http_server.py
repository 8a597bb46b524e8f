"""Integration tests: start the real ivserve on loopback and talk HTTP to it.

Compares query results in every encoding with the fixtures' expected
matrices and numpy indexing; checks error statuses, keep-alive and
pipelining, concurrency, disconnects, slow readers, slowloris and SIGTERM.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
import ivclient  # noqa: E402
from ivprocess import ServerProcess, write_config  # noqa: E402

FIX = os.environ.get("IV_FIXTURES", os.path.join(HERE, "..", "..", "..", "shared", "fixtures"))
BIN = os.environ.get("IVSERVE_BIN", os.path.join(HERE, "..", "..", "build", "ivserve"))

if not os.path.isdir(FIX):
    print(f"fixtures folder {FIX} is absent: skipping the server tests")
    pytest.skip("fixtures absent", allow_module_level=True)
if not os.path.exists(BIN):
    print(f"ivserve binary {BIN} is absent: skipping the server tests")
    pytest.skip("binary absent", allow_module_level=True)

MANIFEST = json.load(open(os.path.join(FIX, "manifest.json")))
FILES = [m for m in MANIFEST if os.path.exists(os.path.join(FIX, m["file"]))]


def ds_id(m):
    return m["file"][: -len(".h5ad")] if m["file"].endswith(".h5ad") else m["file"]


class Server(ServerProcess):
    """The server over the fixtures (or `datasets`), 2 workers."""

    def __init__(self, tmp, extra_args=(), cfg_extra=None, datasets=None, ready=None):
        cfg = {"datasets": datasets if datasets is not None else
               [{"id": ds_id(m), "path": os.path.join(FIX, m["file"])} for m in FILES]}
        cfg.update(cfg_extra or {})
        self.cfg_path = write_config(tmp, cfg)
        super().__init__(tmp, ["--config", self.cfg_path, "--threads", "2", *extra_args],
                         binary=BIN, ready=ready)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("srv")), extra_args=["--max-json-bytes", "2000000"])
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


def expected(m):
    with h5py.File(os.path.join(FIX, m["expected"]), "r") as f:
        shape = tuple(int(x) for x in f.attrs["shape"])
        return sp.csr_matrix((f["data"][:], f["indices"][:], f["indptr"][:]), shape=shape)


def same(a, b):
    assert a.shape == b.shape
    a = sp.csr_matrix(a, dtype=np.float64)
    b = sp.csr_matrix(b, dtype=np.float64)
    d = (a != b)
    # NaN != NaN: compare NaN positions separately.
    ad, bd = a.toarray(), b.toarray()
    assert np.array_equal(np.isnan(ad), np.isnan(bd))
    assert np.array_equal(np.nan_to_num(ad, nan=0.0), np.nan_to_num(bd, nan=0.0)), d.nnz


@pytest.mark.parametrize("m", FILES, ids=[ds_id(m) for m in FILES])
def test_whole_matrix_binary_equals_expected(srv, m):
    c = ivclient.Client(srv.url)
    res = c.query(ds_id(m), format="binary")
    exp = expected(m)
    same(res.matrix, exp)
    assert np.array_equal(res.obs, np.arange(exp.shape[0]))
    cnt = c.count(ds_id(m))
    assert cnt["nnz"] == exp.nnz and cnt["shape"] == list(exp.shape)


@pytest.mark.parametrize("fmt", ["binary", "ndjson", "json"])
@pytest.mark.parametrize("m", FILES, ids=[ds_id(m) for m in FILES])
def test_random_selections_every_encoding(srv, m, fmt):
    c = ivclient.Client(srv.url)
    exp = expected(m)
    rng = np.random.default_rng(abs(hash((m["file"], fmt))) % 2**32)
    n_obs, n_var = exp.shape
    for trial in range(4):
        obs = rng.integers(0, n_obs, size=int(rng.integers(0, min(n_obs, 40) + 1)))
        if trial == 0:
            var_sel, var_idx = None, np.arange(n_var)
        elif trial == 1:
            mask = rng.random(n_var) < 0.3
            var_sel, var_idx = mask, np.flatnonzero(mask)
        elif trial == 2:
            a = int(rng.integers(0, n_var))
            b = int(rng.integers(a, n_var + 1))
            var_sel, var_idx = range(a, b), np.arange(a, b)
        else:
            var_idx = rng.integers(0, n_var, size=int(rng.integers(1, 30)))
            var_sel = var_idx
        res = c.query(ds_id(m), obs=obs, var=var_sel, format=fmt)
        same(res.matrix, exp[obs][:, var_idx])
        assert np.array_equal(res.obs, obs)
        cnt = c.count(ds_id(m), obs=obs, var=var_sel)
        assert cnt["nnz"] == exp[obs][:, var_idx].nnz


def test_get_query_string_and_curl(srv):
    m = FILES[0]
    exp = expected(m)
    out = subprocess.run(["curl", "-s", "-S", f"{srv.url}/v1/datasets/{ds_id(m)}/query?obs=3,1,3&var=0:10"],
                         capture_output=True, check=True, timeout=30).stdout.decode()
    # curl sends Accept: */* and must get NDJSON, never binary.
    mat, obs = ivclient.parse_ndjson(out)
    same(mat, exp[[3, 1, 3]][:, :10])
    out = subprocess.run(["curl", "-s", "-S", "-d", '{"obs":{"range":[2,5]}}',
                          "-H", "Accept: application/json", f"{srv.url}/v1/datasets/{ds_id(m)}/query"],
                         capture_output=True, check=True, timeout=30).stdout
    mat, obs = ivclient.parse_json(out)
    same(mat, exp[2:5])


def err(r):
    j = r.json()
    assert set(j) == {"error"} and {"code", "message"} <= set(j["error"])
    return j["error"]


def test_error_statuses(srv):
    u = srv.url
    d = ds_id(FILES[0])
    n_obs = FILES[0]["shape"][0]
    assert requests.get(f"{u}/v1/datasets/nope/query").status_code == 404
    assert requests.get(f"{u}/v1/datasets/..%2Fetc/query").status_code == 404
    assert requests.get(f"{u}/nowhere").status_code == 404
    r = requests.delete(f"{u}/v1/datasets/{d}/query")
    assert r.status_code == 405 and "POST" in r.headers["Allow"]
    r = requests.get(f"{u}/v1/datasets/{d}/query", headers={"Accept": "text/html"})
    assert r.status_code == 406 and err(r)["code"] == "not_acceptable"
    r = requests.post(f"{u}/v1/datasets/{d}/query", data="{\"obs\":", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and err(r)["code"] == "bad_json"
    r = requests.post(f"{u}/v1/datasets/{d}/query", json={"obs": {"index": [0, n_obs]}})
    assert r.status_code == 422 and str(n_obs) in err(r)["message"]
    r = requests.post(f"{u}/v1/datasets/{d}/query", json={"obs": {"colour": 1}})
    assert r.status_code == 422 and "colour" in err(r)["message"]
    r = requests.post(f"{u}/v1/datasets/{d}/query", data=b"<x/>", headers={"Content-Type": "application/xml"})
    assert r.status_code == 415
    r = requests.post(f"{u}/v1/datasets/{d}/query", json={"var": {"names": ["no-such-gene-xyz"]}})
    assert r.status_code == 422, r.text
    assert "no-such-gene-xyz" in err(r)["message"] or err(r)["code"] == "unsupported"
    # A body over the limit is refused from its Content-Length, before it is
    # sent (uploading all of it races the server's close and may end in a
    # reset on the client side, which would test the kernel, not the server).
    port = int(u.rsplit(":", 1)[1])
    resp = raw(port, (f"POST /v1/datasets/{d}/query HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {9 << 20}\r\n\r\n").encode(),
               timeout=5)
    assert resp.startswith(b"HTTP/1.1 413"), resp[:200]
    # The JSON encoding refuses results past its limit and points to the others.
    big = max(FILES, key=lambda m: m["nnz"])
    r = requests.get(f"{u}/v1/datasets/{ds_id(big)}/query", headers={"Accept": "application/json"})
    assert r.status_code == 413 and "ndjson" in err(r)["message"]
    # After all that, the server still answers.
    assert requests.get(f"{u}/healthz").status_code == 200


def test_names_selection(srv):
    m = next((m for m in FILES if "expected_meta" in m), None)
    if m is None:
        pytest.skip("no fixture with metadata")
    import anndata
    ad = anndata.read_h5ad(os.path.join(FIX, m["expected_meta"]), backed=None)
    genes = list(ad.var_names[:5])[::-1]
    cells = list(ad.obs_names[[4, 0]])
    c = ivclient.Client(srv.url)
    try:
        res = c.query(ds_id(m), obs=cells, var=genes)
    except ivclient.ServerError as e:
        assert e.status == 422 and e.code == "unsupported"
        return
    exp = expected(m)
    same(res.matrix, exp[[4, 0]][:, [4, 3, 2, 1, 0]])


def test_dataset_document_etag_and_head(srv):
    d = ds_id(FILES[0])
    r = requests.get(f"{srv.url}/v1/datasets/{d}")
    assert r.status_code == 200
    doc = r.json()
    assert doc["shape"] == FILES[0]["shape"] and doc["nnz"] == FILES[0]["nnz"]
    et = r.headers["ETag"]
    assert requests.get(f"{srv.url}/v1/datasets/{d}", headers={"If-None-Match": et}).status_code == 304
    h = requests.head(f"{srv.url}/v1/datasets/{d}")
    assert h.status_code == 200 and h.content == b"" and int(h.headers["Content-Length"]) == len(r.content)
    lst = requests.get(f"{srv.url}/v1/datasets").json()["datasets"]
    assert {x["id"] for x in lst} == {ds_id(m) for m in FILES}


def raw(port, data, read_until_close=True, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    chunks = []
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    except socket.timeout:
        pass
    s.close()
    return b"".join(chunks)


def test_keepalive_and_pipelining_in_order(srv):
    d = ds_id(FILES[0])
    reqs = (f"GET /v1/datasets/{d}/count HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET /v1/datasets/{d}/query?obs=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            f"POST /v1/datasets/{d}/count HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n{{\"obs\":{{"
            f"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").encode()
    out = raw(srv.port, reqs)
    statuses = [int(x) for x in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]
    assert statuses == [200, 404, 200, 400, 200], out[:2000]
    # Byte-at-a-time delivery of a request still works.
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    for ch in b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n":
        s.send(bytes([ch]))
    resp = s.recv(4096)
    s.close()
    assert resp.startswith(b"HTTP/1.1 200")


def test_bad_http_gets_400_and_close(srv):
    out = raw(srv.port, b"\x00\x01garbage\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")
    out = raw(srv.port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431")


def test_32_concurrent_clients_mixed(srv):
    big = max(FILES, key=lambda m: m["nnz"])
    small = FILES[0]
    eb, es = expected(big), expected(small)
    errors = []

    def worker(i):
        try:
            c = ivclient.Client(srv.url)
            for k in range(3):
                if (i + k) % 4 == 0:
                    res = c.query(ds_id(big), format="binary")
                    same(res.matrix, eb)
                else:
                    rows = [(i * 7 + k) % es.shape[0]]
                    res = c.query(ds_id(small), obs=rows, var=range(0, es.shape[1]), format="ndjson")
                    same(res.matrix, es[rows])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors[:3]


def test_disconnect_mid_stream_and_slow_reader(srv):
    big = max(FILES, key=lambda m: m["nnz"])
    req = (f"GET /v1/datasets/{ds_id(big)}/query HTTP/1.1\r\nHost: x\r\n"
           f"Accept: application/x-ndjson\r\n\r\n").encode()
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(req)
        s.recv(1000)
        s.close()  # gone mid-stream
    # A slow reader: connects, reads a little now and then.
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(req)
    s.recv(100)
    rss0 = srv.rss_kb()
    t0 = time.time()
    # The server stays responsive meanwhile.
    for _ in range(20):
        assert requests.get(srv.url + "/v1/datasets/" + ds_id(FILES[0]) + "/query?obs=0", timeout=5).status_code == 200
    assert time.time() - t0 < 10
    time.sleep(0.5)
    assert srv.rss_kb() - rss0 < 64 * 1024
    s.close()
    time.sleep(0.3)
    metrics = requests.get(srv.url + "/metrics").text
    assert "ivserve_requests_total" in metrics and "ivserve_open_connections" in metrics


def test_disconnect_during_query_setup(srv):
    # The set-up of a query (parsing, names, lookup tables) runs on a
    # worker; a client that sends a large selection and leaves at once must
    # leave nothing behind: the stream is detached and freed (the module's
    # teardown checks a clean exit, leak-free under the sanitizers).
    big = max(FILES, key=lambda m: m["nnz"])
    rng = np.random.default_rng(5)
    idx = rng.integers(0, big["shape"][0], 200_000).tolist()
    body = json.dumps({"obs": {"index": idx}}).encode()
    req = (f"POST /v1/datasets/{ds_id(big)}/query HTTP/1.1\r\nHost: x\r\n"
           f"Content-Type: application/json\r\nAccept: application/vnd.ivserve.csr\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(req)
        s.close()
    # Meanwhile and afterwards the server answers, and the same selection
    # through a client that stays is exact.
    assert requests.get(srv.url + "/healthz", timeout=5).status_code == 200
    c = ivclient.Client(srv.url)
    res = c.query(ds_id(big), obs=idx[:5000], format="binary")
    same(res.matrix, expected(big)[idx[:5000], :])
    deadline = time.time() + 10
    while time.time() < deadline:
        metrics = requests.get(srv.url + "/metrics").text
        if re.search(r"^ivserve_active_streams 0$", metrics, re.M):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("streams still active: " + metrics[-2000:])


def test_slowloris_cut_off(tmp_path):
    s = Server(str(tmp_path), extra_args=["--header-timeout-ms", "400"], datasets=[
        {"id": "t", "path": os.path.join(FIX, FILES[0]["file"])}])
    try:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.time()
        got = b""
        try:
            for _ in range(20):
                c.sendall(b"X-a: b\r\n")  # trickle, never finish
                time.sleep(0.1)
                c.setblocking(False)
                try:
                    got += c.recv(4096)
                except BlockingIOError:
                    pass
                c.setblocking(True)
                if got:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert time.time() - t0 < 3
        assert got.startswith(b"HTTP/1.1 408"), got
        assert requests.get(s.url + "/healthz").status_code == 200
    finally:
        assert s.stop() == 0


def test_tokens_and_cors(tmp_path):
    p = os.path.join(FIX, FILES[0]["file"])
    s = Server(str(tmp_path), cfg_extra={"tokens": ["g1"], "cors_origins": ["http://app.example"]},
               datasets=[{"id": "open", "path": p}, {"id": "priv", "path": p, "tokens": ["p1"]}])
    try:
        u = s.url
        assert requests.get(f"{u}/v1/datasets/open").status_code == 401
        # A wrong token is 401 (RFC 6750 invalid_token); a valid one without access 403.
        assert requests.get(f"{u}/v1/datasets/open", headers={"Authorization": "Bearer bad"}).status_code == 401
        assert requests.get(f"{u}/v1/datasets/open", headers={"Authorization": "Bearer g1"}).status_code == 200
        assert requests.get(f"{u}/v1/datasets/priv", headers={"Authorization": "Bearer p1"}).status_code == 200
        assert requests.get(f"{u}/v1/datasets/open", headers={"Authorization": "Bearer p1"}).status_code == 403
        r = requests.options(f"{u}/v1/datasets/open/query", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
        assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
        r = requests.get(f"{u}/healthz", headers={"Origin": "http://evil.example"})
        assert "Access-Control-Allow-Origin" not in r.headers
    finally:
        assert s.stop() == 0


def test_sigterm_during_stream_finishes_it(tmp_path):
    big = max(FILES, key=lambda m: m["nnz"])
    s = Server(str(tmp_path), datasets=[{"id": "big", "path": os.path.join(FIX, big["file"])}])
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(b"GET /v1/datasets/big/query HTTP/1.1\r\nHost: x\r\nAccept: application/vnd.ivserve.csr\r\n\r\n")
    first = c.recv(100)
    assert first.startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    data = [first]
    c.settimeout(20)
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        data.append(b)
    c.close()
    body = b"".join(data)
    body = body[body.index(b"\r\n\r\n") + 4:]
    # De-chunk.
    out, pos = bytearray(), 0
    while True:
        e = body.index(b"\r\n", pos)
        n = int(body[pos:e], 16)
        if n == 0:
            break
        out += body[e + 2:e + 2 + n]
        pos = e + 2 + n + 2
    mat, obs = ivclient.parse_binary(bytes(out))
    same(mat, expected(big))
    assert s.proc.wait(20) == 0
