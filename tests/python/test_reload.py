"""Reloading the configuration of a running server (SIGHUP and POST
/v1/admin/reload), against real server processes.

A reload adds, removes and replaces datasets while a slow stream runs on a
removed one: the stream ends with the same bytes as before the reload, the
removed dataset is released only after it, a connection opened before the
reload keeps working, and the summary names what changed.  A bad
configuration is refused and the datasets served are kept.  SIGHUP reopens
the access log (logrotate renames the file, then sends HUP), SIGUSR1 does
not kill the server.  Every server here must exit 0 on SIGTERM: under the
ASan build (IVSERVE_BIN=build-asan/ivserve) a leak makes that fail.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
import ivclient  # noqa: E402
from ivprocess import listening_port  # noqa: E402


class Srv:
    """One ivserve process started from a config file that a test rewrites
    between reloads."""

    def __init__(self, binary, tmp, cfg, extra_args=(), wait="ready", env=None):
        self.tmp = tmp
        self.cfg_path = os.path.join(tmp, "cfg.json")
        self.write_cfg(cfg)
        fd, self.log_path = tempfile.mkstemp(prefix="server", suffix=".log", dir=tmp)
        os.close(fd)
        self.log = open(self.log_path, "a+")
        self.proc = subprocess.Popen(
            [binary, "--config", self.cfg_path, "--port", "0", "--threads", "2",
             *extra_args], stdout=self.log, stderr=self.log,
            env=dict(os.environ, **(env or {})))
        self.port = listening_port(self.log_path, self.proc)
        self.url = "http://127.0.0.1:%d" % self.port
        self.wait(wait)

    def write_cfg(self, cfg):
        # Written to a temporary name and renamed: a reload never reads half a file.
        tmp = self.cfg_path + ".tmp"
        with open(tmp, "w") as f:
            if isinstance(cfg, str):
                f.write(cfg)
            else:
                json.dump(cfg, f)
        os.replace(tmp, self.cfg_path)

    def wait(self, what, timeout=60):
        """"ready": /readyz is 200; "settled": no dataset is loading."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, "server exited:\n" + self.log_text()[-3000:]
            try:
                if what == "ready":
                    if requests.get(self.url + "/readyz", timeout=2).status_code == 200:
                        return
                else:
                    ds = requests.get(self.url + "/v1/datasets", timeout=2).json()["datasets"]
                    if all(d["state"] != "loading" and "reload" not in d for d in ds):
                        return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise AssertionError("server not %s:\n%s" % (what, self.log_text()[-3000:]))

    def log_text(self):
        with open(self.log_path) as f:
            return f.read()

    def datasets(self):
        r = requests.get(self.url + "/v1/datasets", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["datasets"]

    def reload(self, **kw):
        return requests.post(self.url + "/v1/admin/reload", timeout=120, **kw)

    def metric(self, name):
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError("no metric " + name)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def servers():
    started = []
    yield started
    for s in started:
        rc = s.stop()
        assert rc == 0, "exit %s:\n%s" % (rc, s.log_text()[-4000:])


def expected_of(fixtures_dir, name):
    man = json.load(open(os.path.join(fixtures_dir, "manifest.json")))
    m = [m for m in man if m["file"] == name][0]
    with h5py.File(os.path.join(fixtures_dir, m["expected"]), "r") as f:
        shape = tuple(int(x) for x in f.attrs["shape"])
        return sp.csr_matrix((f["data"][:], f["indices"][:], f["indptr"][:]), shape=shape)


def assert_same(a, b):
    assert a.shape == b.shape
    assert (sp.csr_matrix(a, dtype=np.float64) != sp.csr_matrix(b, dtype=np.float64)).nnz == 0


@pytest.fixture(scope="module")
def big(ivserve, tmp_path_factory):
    """A packed matrix whose binary stream (about 12 MB) is far larger than
    what the loopback socket buffers hold, so that a client that stops
    reading keeps the stream running; and its matrix."""
    anndata = pytest.importorskip("anndata")
    tmp = str(tmp_path_factory.mktemp("big"))
    rng = np.random.default_rng(14)
    X = sp.random(12000, 1000, density=0.1, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.integers(1, 1000, n)).astype(np.int32)
    X.sort_indices()
    src = os.path.join(tmp, "src.h5ad")
    ad = anndata.AnnData(X=X, dtype=X.dtype)
    ad.obs_names = ["c%d" % i for i in range(X.shape[0])]
    ad.var_names = ["g%d" % i for i in range(X.shape[1])]
    ad.write_h5ad(src)
    out = os.path.join(tmp, "big.h5ad")
    ivserve.assert_ok(ivserve.run("pack", src, out, "--threads", "2", timeout=600))
    return out, X


def http10_get(port, path, rcvbuf=None):
    """A socket with an HTTP/1.0 request sent (the body ends at the close:
    no chunking to undo)."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET %s HTTP/1.0\r\nHost: x\r\nAccept: application/vnd.ivserve.csr\r\n\r\n"
               % path).encode())
    return s


def read_all(s):
    parts = []
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        parts.append(b)
    s.close()
    return b"".join(parts)


def body_of(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return body


def keepalive_get(s, path):
    """One request on a kept-alive raw connection; returns (status, body)."""
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        assert b, "connection closed"
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    n = int([l for l in lines if l.lower().startswith("content-length:")][0].split(":")[1])
    while len(rest) < n:
        b = s.recv(65536)
        assert b, "connection closed"
        rest += b
    return int(lines[0].split()[1]), rest[:n]


def test_reload_adds_removes_and_replaces_while_a_stream_runs_on_a_removed_dataset(
        ivserve, fixtures_dir, big, tmp_path, servers):
    big_path, X = big
    tmp = str(tmp_path)
    keep = os.path.join(tmp, "keep.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"), keep)
    chg = os.path.join(tmp, "chg.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsr.blosc2-lz4.h5ad"), chg)
    srv = Srv(ivserve.path, tmp, {"datasets": [
        {"id": "big", "path": big_path}, {"id": "keep", "path": keep},
        {"id": "chg", "path": chg}]}, extra_args=["--blocks-ahead", "1"])
    servers.append(srv)
    # The reference bytes of the whole matrix, read at full speed.
    ref = body_of(read_all(http10_get(srv.port, "/v1/datasets/big/query")))
    m, _ = ivclient.parse_binary(ref)
    assert_same(m, X)
    # A connection that stays open across the reload.
    ka = socket.create_connection(("127.0.0.1", srv.port))
    st, body = keepalive_get(ka, "/v1/datasets/keep/count")
    assert st == 200 and json.loads(body)["nnz"] == 227
    # A slow client: the stream starts, then the client stops reading.
    slow = http10_get(srv.port, "/v1/datasets/big/query", rcvbuf=4096)
    first = slow.recv(100)
    assert first.startswith(b"HTTP/1.1 200"), first
    time.sleep(0.5)
    assert srv.metric("ivserve_active_streams") == 1

    # big removed, keep unchanged, chg's file replaced by a rename (another
    # inode, another matrix), new added.
    repl = os.path.join(tmp, "chg.new")
    shutil.copy(os.path.join(fixtures_dir, "floaty.ivcsr.gzip.h5ad"), repl)
    os.replace(repl, chg)
    newp = os.path.join(tmp, "new.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad"), newp)
    srv.write_cfg({"datasets": [{"id": "keep", "path": keep}, {"id": "chg", "path": chg},
                                {"id": "new", "path": newp}]})
    r = srv.reload()
    assert r.status_code == 200, r.text
    summary = r.json()
    assert summary["added"] == ["new"] and summary["removed"] == ["big"], summary
    assert summary["reloaded"] == ["chg"] and summary["failed"] == [], summary
    assert summary["unchanged"] == 1, summary

    listed = srv.datasets()
    assert [d["id"] for d in listed] == ["keep", "chg", "new"], listed
    assert all(d["state"] == "ready" for d in listed), listed
    assert requests.get(srv.url + "/v1/datasets/big").status_code == 404
    c = ivclient.Client(srv.url)
    assert_same(c.query("chg", format="binary").matrix,
                expected_of(fixtures_dir, "floaty.ivcsr.gzip.h5ad"))
    assert_same(c.query("new", format="binary").matrix,
                expected_of(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad"))
    # The kept-alive connection was not touched.
    st, body = keepalive_get(ka, "/v1/datasets/keep/count")
    assert st == 200 and json.loads(body)["nnz"] == 227
    ka.close()

    # The removed dataset still serves its stream, and is not released yet.
    assert srv.metric("ivserve_active_streams") == 1
    assert "dataset big released" not in srv.log_text()
    got = body_of(first + read_all(slow))
    assert got == ref
    deadline = time.time() + 20
    while "dataset big released" not in srv.log_text():
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert srv.metric("ivserve_active_streams") == 0


def test_bad_config_is_refused_and_the_old_set_keeps_serving(ivserve, fixtures_dir, tmp_path,
                                                             servers):
    tmp = str(tmp_path)
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    good = {"datasets": [{"id": "a", "path": a}]}
    srv = Srv(ivserve.path, tmp, good)
    servers.append(srv)
    bad = [
        ("{not json", "not valid JSON"),
        (json.dumps({"datasets": [{"id": "a", "path": a}, {"id": "a", "path": a}]}),
         "both have the id"),
        (json.dumps({"datasets": [{"id": "a", "path": a}], "no_such_key": 1}), "no_such_key"),
        (json.dumps({"datasets": []}), "none configured"),
        (json.dumps({"datasets": [{"id": "a", "path": a}], "readyz": "some"}), "readyz"),
    ]
    for text, words in bad:
        srv.write_cfg(text)
        r = srv.reload()
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "bad_config" and words in r.json()["error"]["message"]
        assert [d["id"] for d in srv.datasets()] == ["a"]
        assert requests.post(srv.url + "/v1/datasets/a/count", json={}).json()["nnz"] == 227
    # SIGHUP with a bad file: a log line, the server alive and unchanged.
    srv.write_cfg("{not json")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while "reload (SIGHUP) refused" not in srv.log_text():
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert srv.proc.poll() is None
    assert [d["id"] for d in srv.datasets()] == ["a"]
    assert requests.get(srv.url + "/readyz").status_code == 200
    # A good file again: the reload goes through.
    srv.write_cfg({"datasets": [{"id": "a", "path": a}, {"id": "b", "path": a}]})
    r = srv.reload()
    assert r.status_code == 200 and r.json()["added"] == ["b"], r.text


def test_sighup_reloads_and_reopens_the_access_log(ivserve, fixtures_dir, tmp_path, servers):
    tmp = str(tmp_path)
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    alog = os.path.join(tmp, "access.log")
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "a", "path": a}], "access_log": alog})
    servers.append(srv)
    assert requests.get(srv.url + "/v1/datasets/a").status_code == 200
    # logrotate: rename, then HUP.
    os.rename(alog, alog + ".1")
    srv.write_cfg({"datasets": [{"id": "a", "path": a}, {"id": "b", "path": a}],
                   "access_log": alog})
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 30
    while "b" not in [d["id"] for d in srv.datasets() if d["state"] == "ready"]:
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert requests.get(srv.url + "/v1/datasets/b").status_code == 200
    deadline = time.time() + 10
    while not (os.path.exists(alog) and '"/v1/datasets/b"' in open(alog).read()):
        assert time.time() < deadline, "no new access log"
        time.sleep(0.05)
    old = open(alog + ".1").read()
    new = open(alog).read()
    assert '"/v1/datasets/a"' in old and '"/v1/datasets/b"' not in old
    assert '"/v1/datasets/a"' not in new
    for line in new.splitlines():
        json.loads(line)
    assert "reload (SIGHUP) done" in srv.log_text()


def test_sigusr1_does_not_kill(ivserve, fixtures_dir, tmp_path, servers):
    srv = Srv(ivserve.path, str(tmp_path),
              {"datasets": [{"id": "a", "path": os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")}]})
    servers.append(srv)
    srv.proc.send_signal(signal.SIGUSR1)
    deadline = time.time() + 10
    while "signal %d ignored" % signal.SIGUSR1 not in srv.log_text():
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert srv.proc.poll() is None
    assert requests.get(srv.url + "/healthz").status_code == 200


def test_changed_file_and_settings_are_reloaded_unchanged_ones_kept(ivserve, fixtures_dir,
                                                                   tmp_path, servers):
    tmp = str(tmp_path)
    p = os.path.join(tmp, "a.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"), p)
    cfg = {"datasets": [{"id": "a", "path": p}]}
    srv = Srv(ivserve.path, tmp, cfg)
    servers.append(srv)
    r = srv.reload()
    assert r.status_code == 200 and r.json()["unchanged"] == 1 and r.json()["reloaded"] == []
    # The same bytes with a new modification time: the identity changed.
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    r = srv.reload()
    assert r.json()["reloaded"] == ["a"], r.text
    # A title is a setting of the dataset.
    srv.write_cfg({"datasets": [{"id": "a", "path": p, "title": "Renamed"}]})
    r = srv.reload()
    assert r.json()["reloaded"] == ["a"], r.text
    assert srv.datasets()[0]["title"] == "Renamed"
    # Settings a reload does not apply are named in the log.
    srv.write_cfg({"datasets": [{"id": "a", "path": p, "title": "Renamed"}],
                   "cache_max_age": 5, "limits": {"max_rows": 1000}})
    r = srv.reload()
    assert r.json()["unchanged"] == 1, r.text
    assert ("take effect at the next start: cache_max_age, limits" in srv.log_text()), \
        srv.log_text()[-2000:]


def test_failed_replacement_keeps_the_old_one_serving(ivserve, fixtures_dir, tmp_path, servers):
    tmp = str(tmp_path)
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "a", "path": a}]})
    servers.append(srv)
    junk = os.path.join(tmp, "junk.h5ad")
    with open(junk, "wb") as f:
        f.write(b"not an HDF5 file" * 100)
    srv.write_cfg({"datasets": [{"id": "a", "path": junk}]})
    r = srv.reload()
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["reloaded"] == [] and [f["id"] for f in s["failed"]] == ["a"], s
    assert "junk.h5ad" in s["failed"][0]["error"]
    d = srv.datasets()[0]
    assert d["state"] == "ready" and "junk.h5ad" in d["reload_error"], d
    # Still the old file's matrix.
    assert_same(ivclient.Client(srv.url).query("a", format="binary").matrix,
                expected_of(fixtures_dir, "tiny.ivcsr.raw.h5ad"))
    # Fixed: the next reload swaps it in and clears the error.
    srv.write_cfg({"datasets": [{"id": "a", "path": os.path.join(fixtures_dir,
                                                                   "floaty.ivcsr.gzip.h5ad")}]})
    r = srv.reload()
    assert r.json()["reloaded"] == ["a"], r.text
    d = srv.datasets()[0]
    assert d["state"] == "ready" and "reload_error" not in d and d["shape"] == [150, 3000], d


def test_admin_reload_needs_an_admin_token(ivserve, fixtures_dir, tmp_path, servers):
    """POST /v1/admin/reload takes an admin token once the server has any
    token; reading tokens (global or a dataset's) get 403.  A reload applies
    the new configuration's tokens: a dataset's new token opens it, and a
    tokens file edited on disk is read again."""
    import hashlib
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    tokfile = os.path.join(str(tmp_path), "tokens")

    def write_tokens(lines):
        with open(tokfile, "w") as fh:
            for name, tok, scope in lines:
                fh.write("%s %s %s\n" % (name, hashlib.sha256(tok.encode()).hexdigest(), scope))

    write_tokens([("ops", "sekrit-admin", "admin")])
    srv = Srv(ivserve.path, str(tmp_path), {"datasets": [{"id": "a", "path": a}],
                                            "tokens": ["sekrit-global"], "tokens_file": tokfile})
    servers.append(srv)
    r = srv.reload()
    assert r.status_code == 401 and "Bearer" in r.headers.get("WWW-Authenticate", "")
    r = srv.reload(headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "invalid_token" in r.headers.get("WWW-Authenticate", "")
    assert srv.reload(headers={"Authorization": "Bearer sekrit-global"}).status_code == 403
    r = requests.get(srv.url + "/v1/admin/reload",
                     headers={"Authorization": "Bearer sekrit-admin"})
    assert r.status_code == 405 and "POST" in r.headers["Allow"]
    r = srv.reload(headers={"Authorization": "Bearer sekrit-admin"})
    assert r.status_code == 200 and r.json()["unchanged"] == 1, r.text
    # A dataset token does not open the admin route; after the reload it
    # opens its dataset, a prefix of it does not, and the global token
    # still reads everything.
    reader = "reader-only-and-longer-than-any-token-before"
    srv.write_cfg({"datasets": [{"id": "a", "path": a, "tokens": [reader]}],
                   "tokens": ["sekrit-global"], "tokens_file": tokfile})
    r = srv.reload(headers={"Authorization": "Bearer sekrit-admin"})
    assert r.status_code == 200 and r.json()["reloaded"] == ["a"], r.text
    assert srv.reload(headers={"Authorization": "Bearer " + reader}).status_code == 403
    for tok, want in ((reader, 200), (reader[:11], 401), ("sekrit-global", 200)):
        r = requests.get(srv.url + "/v1/datasets/a", headers={"Authorization": "Bearer " + tok})
        assert r.status_code == want, (tok, r.status_code)
    # The tokens file rotated: the old admin token stops working at once.
    write_tokens([("ops2", "new-admin-token", "admin")])
    r = srv.reload(headers={"Authorization": "Bearer sekrit-admin"})
    assert r.status_code == 200, r.text
    assert srv.reload(headers={"Authorization": "Bearer sekrit-admin"}).status_code == 401
    r = srv.reload(headers={"Authorization": "Bearer new-admin-token"})
    assert r.status_code == 200 and r.json()["unchanged"] == 1, r.text


def test_reloads_under_queries_leave_nothing_behind(ivserve, fixtures_dir, tmp_path, servers):
    """Many reloads flipping a dataset between two files while queries run
    on it: every answer is one file's matrix or the other's, never an error
    or a mix, and the server exits clean (no leak under ASan)."""
    tmp = str(tmp_path)
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    b = os.path.join(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad")
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "x", "path": a}]})
    servers.append(srv)
    exp = expected_of(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    assert (exp != expected_of(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad")).nnz == 0
    c = ivclient.Client(srv.url)
    for i in range(6):
        srv.write_cfg({"datasets": [{"id": "x", "path": b if i % 2 == 0 else a},
                                    {"id": "y%d" % i, "path": a}]})
        srv.proc.send_signal(signal.SIGHUP)
        for _ in range(5):
            assert_same(c.query("x", obs=[0, 5, 59], format="binary").matrix, exp[[0, 5, 59], :])
    deadline = time.time() + 60
    while [d["id"] for d in srv.datasets()] != ["x", "y5"]:
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    srv.wait("settled")
    assert_same(c.query("x", format="binary").matrix, exp)


def test_admin_client_that_leaves_does_not_stop_the_reload(ivserve, fixtures_dir, tmp_path,
                                                           servers):
    tmp = str(tmp_path)
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "a", "path": a}]})
    servers.append(srv)
    srv.write_cfg({"datasets": [{"id": "a", "path": a},
                                {"id": "w", "path": os.path.join(fixtures_dir,
                                                                 "wide.ivcsr.zstd.h5ad")}]})
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/admin/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    s.close()
    deadline = time.time() + 30
    while "reload (POST /v1/admin/reload) done" not in srv.log_text():
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert [(d["id"], d["state"]) for d in srv.datasets()] == [("a", "ready"), ("w", "ready")]
    # A second reload right after answers normally.
    r = srv.reload()
    assert r.status_code == 200 and r.json()["unchanged"] == 2, r.text


def test_changed_companion_file_is_reloaded(ivserve, fixtures_dir, tmp_path, servers):
    tmp = str(tmp_path)
    comp = os.path.join(tmp, "comp.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad"), comp)
    cfg = {"datasets": [{"id": "a", "path": os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"),
                         "companion": comp}]}
    srv = Srv(ivserve.path, tmp, cfg)
    servers.append(srv)
    assert srv.reload().json()["unchanged"] == 1
    st = os.stat(comp)
    os.utime(comp, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    r = srv.reload()
    assert r.json()["reloaded"] == ["a"], r.text
    deadline = time.time() + 30
    while True:
        o = requests.get(srv.url + "/v1/datasets/a").json()["orientations"]["genes"]
        if o["state"] == "ready":
            break
        assert time.time() < deadline, o
        time.sleep(0.05)
    assert o["source"] == "companion", o


def test_in_place_edit_with_its_mtime_put_back_is_reloaded(ivserve, fixtures_dir, tmp_path,
                                                           servers):
    """An edit in place whose modification time is set back (touch -r,
    os.utime) still changes the inode's change time, which no user can set
    back: the reload sees it and loads the new metadata."""
    tmp = str(tmp_path)
    p = os.path.join(tmp, "a.h5ad")
    shutil.copy(os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"), p)
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "a", "path": p}]})
    servers.append(srv)

    def ages():
        r = requests.get(srv.url + "/v1/datasets/a/obs/age", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["values"]

    before = ages()
    st = os.stat(p)
    time.sleep(0.05)   # the change time moves past the load's
    with h5py.File(p, "r+") as f:
        f["obs/age"][...] = f["obs/age"][...] + 1000
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(p)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns
    r = srv.reload()
    assert r.status_code == 200 and r.json()["reloaded"] == ["a"], r.text
    assert ages() == [a + 1000 for a in before]
    # Nothing changed since: kept.
    r = srv.reload()
    assert r.json()["unchanged"] == 1 and r.json()["reloaded"] == [], r.text


def spawn_with_pending(binary, tmp, cfg, sig):
    """Starts the server with sig already sent: the child blocks it before
    exec (a blocked signal stays pending across exec), so it is waiting
    when the server's first instruction runs, the earliest a signal can
    arrive, whatever the machine's timing.  A server that never takes it
    ignores it; one that takes it before its handlers are in place dies of
    the default action."""
    cfg_path = os.path.join(tmp, "cfg.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    log_path = os.path.join(tmp, "server.log")
    log = open(log_path, "w")

    def block_then_send():
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
        os.kill(os.getpid(), sig)

    proc = subprocess.Popen([binary, "--config", cfg_path, "--port", "0", "--threads", "2"],
                            stdout=log, stderr=log, preexec_fn=block_then_send)
    log.close()
    return proc, log_path


def test_sigterm_at_start_is_a_graceful_stop(ivserve, fixtures_dir, tmp_path):
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    proc, log_path = spawn_with_pending(ivserve.path, str(tmp_path),
                                        {"datasets": [{"id": "a", "path": a}]}, signal.SIGTERM)
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "still running 30 s after SIGTERM"
    log = open(log_path).read()
    assert rc == 0, (rc, log[-3000:])
    assert "signal %d: no new connections" % signal.SIGTERM in log and "stopped" in log, log[-3000:]


def test_sighup_at_start_reloads_and_does_not_kill(ivserve, fixtures_dir, tmp_path):
    a = os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")
    proc, log_path = spawn_with_pending(ivserve.path, str(tmp_path),
                                        {"datasets": [{"id": "a", "path": a}]}, signal.SIGHUP)
    try:
        port = listening_port(log_path, proc)
        deadline = time.time() + 30
        while "reload (SIGHUP) done" not in open(log_path).read():
            assert proc.poll() is None, open(log_path).read()[-3000:]
            assert time.time() < deadline, open(log_path).read()[-3000:]
            time.sleep(0.05)
        deadline = time.time() + 30
        while requests.get("http://127.0.0.1:%d/readyz" % port, timeout=5).status_code != 200:
            assert time.time() < deadline
            time.sleep(0.05)
        r = requests.get("http://127.0.0.1:%d/v1/datasets/a" % port, timeout=5)
        assert r.status_code == 200, r.text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0, (rc, open(log_path).read()[-3000:])
