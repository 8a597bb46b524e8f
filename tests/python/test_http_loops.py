"""The server with several event loops (--loops): connections are handed to
the loops in turn, each loop owns its connections, and what the loops share
(datasets, reloads, metrics, the write budget, shutdown) behaves as with
one loop.  Run by every build, the sanitizer ones included, so that the
hand-offs between loops are checked for races and leaks.

Also the small-query path: a query of a few rows is prepared and encoded in
its set-up job (one hand-off instead of three); its answer must be the
same as the regular path's.
"""
import os
import signal
import socket
import threading
import time

import numpy as np
import requests

from test_http_server import FILES, FIX, Server, ds_id, expected, same  # noqa: F401
from test_http_conn import BIG, STALL_PATH, metric, read_responses, request, wait_metric

import ivclient  # noqa: E402  (test_http_server put proto/python on the path)

LOOPS = "3"


def loops_server(tmp_path, *args, **kw):
    return Server(str(tmp_path), extra_args=["--loops", LOOPS, *args], **kw)


def test_start_line_names_the_loops(tmp_path):
    s = loops_server(tmp_path)
    try:
        assert "and 3 event loops" in s.log_text()
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_many_connections_spread_over_loops_are_exact(tmp_path):
    """12 clients at once, each on its own connection (so every loop gets
    several), pipelining a stream after a stream and a small query: every
    answer is exact, and /metrics counts every connection once."""
    s = loops_server(tmp_path)
    try:
        eb = expected(BIG)
        small = FILES[0]
        es = expected(small)
        before = metric(s.url, "ivserve_connections_total")
        errors = []

        def worker(i):
            try:
                c = socket.create_connection(("127.0.0.1", s.port))
                row = i % es.shape[0]
                reqs = (request("GET", f"/v1/datasets/{ds_id(BIG)}/query",
                                ["Accept: application/vnd.ivserve.csr"]) +
                        request("GET", f"/v1/datasets/{ds_id(BIG)}/query",
                                ["Accept: application/vnd.ivserve.csr"]) +
                        request("GET", f"/v1/datasets/{ds_id(small)}/query?obs={row}",
                                ["Accept: application/vnd.ivserve.csr"], close=True))
                c.sendall(reqs)
                rs = read_responses(c, ["GET"] * 3, timeout=60)
                c.close()
                assert [r.status for r in rs] == [200, 200, 200], [r.status for r in rs]
                for r in rs[:2]:
                    mat, _ = ivclient.parse_binary(r.body)
                    same(mat, eb)
                mat, obs = ivclient.parse_binary(rs[2].body)
                same(mat, es[[row]])
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(180)
        assert not errors, errors[:3]
        # Each worker's connection, and this test's own /metrics request.
        after = wait_metric(s.url, "ivserve_open_connections", lambda v: v <= 1)
        assert after <= 1
        got = metric(s.url, "ivserve_connections_total")
        # The two /metrics requests above each opened a connection too.
        assert got - before == 12 + 2, (before, got)
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_admin_reload_is_answered_on_the_clients_loop(tmp_path):
    """A reload runs on the control loop; the admin request's answer comes
    back to the connection's own loop, whichever it is: several clients in
    turn (so on different loops) each get their summary, or 409 while
    another one runs."""
    tiny = next(m for m in FILES if m["file"].startswith("tiny.ivcsr.raw"))
    wide = next(m for m in FILES if m["file"].startswith("wide.ivcsr.zstd"))
    ds = [{"id": "a", "path": os.path.join(FIX, tiny["file"])}]
    s = loops_server(tmp_path, datasets=ds)
    try:
        import json
        for k in range(4):
            more = ds + ([{"id": "w", "path": os.path.join(FIX, wide["file"])}] if k % 2 == 0 else [])
            with open(s.cfg_path, "w") as f:
                json.dump({"datasets": more}, f)
            r = requests.post(s.url + "/v1/admin/reload", timeout=60)
            assert r.status_code == 200, r.text
            summary = r.json()
            if k % 2 == 0:
                assert summary["added"] == ["w"], summary
            else:
                assert summary["removed"] == ["w"], summary
            ids = sorted(d["id"] for d in requests.get(s.url + "/v1/datasets").json()["datasets"])
            assert ids == (["a", "w"] if k % 2 == 0 else ["a"]), ids
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_sigterm_stops_every_loop(tmp_path):
    """SIGTERM with a stream under way on one loop and idle connections on
    the others: idle ones are closed, the stream finishes, the server
    exits 0."""
    s = loops_server(tmp_path, datasets=[{"id": "big", "path": os.path.join(FIX, BIG["file"])}])
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(5)]
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(request("GET", "/v1/datasets/big/query", ["Accept: application/vnd.ivserve.csr"]))
    c.settimeout(20)
    first = c.recv(100)
    assert first.startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    data = [first]
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        data.append(b)
    body = b"".join(data)
    assert body.endswith(b"0\r\n\r\n"), body[-40:]
    for i in idle:
        i.settimeout(10)
        assert i.recv(10) == b""  # closed by the server
        i.close()
    c.close()
    assert s.proc.wait(20) == 0


def test_write_budget_spans_the_loops(tmp_path):
    """Slow readers on some loops fill the one write budget: a large answer
    on another loop is refused (503) while they are recent, and once they
    stalled past the slow-reader time their own loops cut them, so the
    next large answer goes out."""
    s = Server(str(tmp_path), extra_args=["--loops", LOOPS, "--write-budget-bytes", str(1 << 20),
                                          "--max-json-bytes", "100000000",
                                          "--write-timeout-ms", "30000"],
               datasets=[{"id": "d", "path": os.path.join(FIX, BIG["file"])}])
    try:
        url = f"{s.url}/v1/datasets/d/query?format=json"
        full = len(requests.get(url).content)
        # The slow readers ask for answers larger than the kernel can ever
        # take, so that only a cut frees their part of the budget.
        assert len(requests.get(s.url + STALL_PATH).content) > 8 << 20
        slows = []
        for _ in range(3):  # one on each loop
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", s.port))
            c.sendall(request("GET", STALL_PATH) * 2)
            slows.append(c)
        assert wait_metric(s.url, "ivserve_queued_write_bytes", lambda v: v >= 1 << 20) >= 1 << 20
        deadline = time.time() + 20
        ok = False
        while time.time() < deadline:
            r = requests.get(url, timeout=30)
            if r.status_code == 200:
                assert len(r.content) == full
                ok = True
                break
            assert r.status_code == 503 and "Retry-After" in r.headers
            time.sleep(0.3)
        assert ok
        assert metric(s.url, "ivserve_write_budget_cuts_total") >= 1
        for c in slows:
            c.close()
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_small_queries_equal_the_regular_path(tmp_path):
    """Rows asked for alone (the set-up job answers them) and the same rows
    inside a query too large for that path (prepare and block jobs) give
    the same values, in every encoding and with gzip."""
    s = loops_server(tmp_path)
    try:
        c = ivclient.Client(s.url)
        rng = np.random.default_rng(5)
        # A file of each codec family and orientation is enough here: the
        # other suites ask every file for small selections.
        for m in FILES[::3]:
            e = expected(m)
            n_obs, n_var = e.shape
            big_rows = rng.integers(0, n_obs, 4200).tolist()  # past the small-query bound
            whole = c.query(ds_id(m), obs=big_rows, format="binary").matrix
            same(whole, e[big_rows])
            for k in range(2):
                i = int(rng.integers(0, 4200))
                genes = sorted(set(rng.integers(0, n_var, 7).tolist()))
                for fmt in ("binary", "ndjson"):
                    one = c.query(ds_id(m), obs=[big_rows[i]], var=genes, format=fmt).matrix
                    same(one, e[[big_rows[i]]][:, genes])
                    same(one, whole[[i]][:, genes])
        # gzip, through the raw socket: the one-write answer is a valid member.
        import gzip
        m = FILES[0]
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(request("GET", f"/v1/datasets/{ds_id(m)}/query?obs=1,2", [
            "Accept: application/vnd.ivserve.csr", "Accept-Encoding: gzip"], close=True))
        rs = read_responses(sock, ["GET"])
        sock.close()
        assert rs[0].status == 200 and rs[0].headers.get("content-encoding") == "gzip"
        mat, _ = ivclient.parse_binary(gzip.decompress(rs[0].body))
        same(mat, expected(m)[[1, 2]])
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_pauses_accepting(tmp_path):
    """A server out of file descriptors does not spin on the connection it
    cannot take (the listening socket stays readable): it logs, pauses
    accepting, and serves again once descriptors are free."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        s = loops_server(tmp_path, datasets=[{"id": "a", "path": os.path.join(FIX, FILES[0]["file"])}])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        clients = []
        for _ in range(80):
            c = socket.socket()
            c.settimeout(5)
            c.connect(("127.0.0.1", s.port))  # the kernel's backlog takes it
            clients.append(c)
        deadline = time.time() + 10
        while "cannot accept a connection" not in s.log_text() and time.time() < deadline:
            time.sleep(0.05)
        assert "cannot accept a connection" in s.log_text()
        t0 = cpu_seconds(s.proc.pid)
        time.sleep(1.0)
        assert cpu_seconds(s.proc.pid) - t0 < 0.5  # not spinning
        for c in clients:
            c.close()
        deadline = time.time() + 10
        ok = False
        while time.time() < deadline and not ok:
            try:
                ok = requests.get(s.url + "/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                time.sleep(0.1)
        assert ok
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]
