"""The other orientation on disk and the memory budget (issue "ten million
cells"):

- with other_orientation "disk" the gene-major copy is packed once into
  the cache folder (STEM-KEY.ivcsc.h5ad with its note), served from there
  ("source": "cache"), and every gene-row answer is byte-identical to the
  one the in-memory copy gives; a second start finds the copy and packs
  nothing; a changed source gets a new copy;
- "auto" keeps a small dataset's copy in memory, as before;
- memory_bytes splits into parts that /metrics shows, each within the
  total, the caches at most 60%;
- a query whose working memory is more than the answers' part left is a
  503 with Retry-After before any work, while a small one is answered.
"""
import os
import re
import shutil
import subprocess
import time

import pytest
import requests

import test_autopack as autopack

BIN = os.environ.get("IVSERVE_BIN")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "pbmc_example.h5ad")


class Server(autopack.Server):
    """test_autopack's server (2 threads, its log, stop), without the
    access log, and the dataset document, the gene-major copy and
    /metrics as these tests read them."""

    def __init__(self, tmp, args, name="server"):
        super().__init__(tmp, [*args, "--access-log", "off"], name)

    def wait_other(self, ds, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.text()[-3000:]
            r = requests.get(self.url + "/v1/datasets/" + ds, timeout=10)
            if r.status_code == 200:
                o = r.json()["orientations"]["genes"]
                assert o["state"] not in ("failed", "skipped"), (o, self.text()[-3000:])
                if o["state"] == "ready":
                    return o
            time.sleep(0.05)
        raise AssertionError("no gene-major copy:\n" + self.text()[-3000:])

    def metrics(self):
        return requests.get(self.url + "/metrics", timeout=10).text


def gene_rows(srv, ds, sel):
    r = requests.post(srv.url + "/v1/datasets/%s/query" % ds, json={"var": sel, "by": "var"},
                      headers={"Accept": "application/vnd.ivserve.csr"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.content


SELECTIONS = [{"index": [0]}, {"index": [1499, 0, 7, 7, 300]}, {"index": list(range(0, 1500, 13))},
              {"index": []}]


def test_gene_major_copy_on_disk_is_served_and_found_again(tmp_path):
    if not os.path.exists(EXAMPLE):
        pytest.fail("the bundled example %s is missing" % EXAMPLE)
    src = str(tmp_path / "pbmc.h5ad")
    shutil.copy(EXAMPLE, src)
    cache = str(tmp_path / "cache")
    mem = Server(str(tmp_path), [src, "--cache-dir", cache, "--other-orientation", "memory"],
                 name="memory")
    try:
        assert mem.wait_other("pbmc")["source"] == "memory"
        want = [gene_rows(mem, "pbmc", s) for s in SELECTIONS]
    finally:
        assert mem.stop() == 0
    assert not os.path.exists(cache) or not [n for n in os.listdir(cache) if "ivcsc" in n]

    disk = Server(str(tmp_path), [src, "--cache-dir", cache, "--other-orientation", "disk"],
                  name="disk")
    try:
        o = disk.wait_other("pbmc")
        assert o["source"] == "cache", o
        got = [gene_rows(disk, "pbmc", s) for s in SELECTIONS]
        assert got == want
        # The copy answered them: one gene's answer says so.
        one = requests.post(disk.url + "/v1/datasets/pbmc/count",
                            json={"var": {"index": [3]}, "by": "var"}).json()
        assert one["orientation"] == "genes", one
    finally:
        assert disk.stop() == 0
    copies = sorted(n for n in os.listdir(cache) if n.endswith(".ivcsc.h5ad"))
    assert len(copies) == 1 and copies[0].startswith("pbmc-"), os.listdir(cache)
    assert os.path.exists(os.path.join(cache, copies[0] + ".src"))
    assert "writing its gene-major orientation" in disk.text()
    stamp = os.stat(os.path.join(cache, copies[0])).st_mtime_ns

    again = Server(str(tmp_path), [src, "--cache-dir", cache, "--other-orientation", "disk"],
                   name="again")
    try:
        assert again.wait_other("pbmc")["source"] == "cache"
        assert [gene_rows(again, "pbmc", s) for s in SELECTIONS] == want
    finally:
        assert again.stop() == 0
    assert "writing its gene-major orientation" not in again.text()
    # Found, not rewritten, and a use does not move its time (its identity).
    assert os.stat(os.path.join(cache, copies[0])).st_mtime_ns == stamp

    # A changed source: a new copy under the new key; the stale one goes.
    with open(src, "r+b") as f:
        f.seek(0, 2)
        f.write(b"\0" * 4096)
    changed = Server(str(tmp_path), [src, "--cache-dir", cache, "--other-orientation", "disk"],
                     name="changed")
    try:
        changed.wait_other("pbmc")
        assert [gene_rows(changed, "pbmc", s) for s in SELECTIONS] == want
    finally:
        assert changed.stop() == 0
    now = sorted(n for n in os.listdir(cache) if n.endswith(".ivcsc.h5ad"))
    assert len(now) == 1 and now != copies, (copies, now)


def test_the_copys_pack_reads_the_kept_row_index(tmp_path, monkeypatch):
    """The pack that writes the gene-major copy opens the served file with
    the row index and pointer arrays the server's load kept in the cache
    folder (kept here whatever the size: IVSERVE_KEEP_MIN_BYTES=0), and
    says so in the server's log; the copy answers as the in-memory one.
    Without a kept index the pack makes its own, and says nothing of it."""
    src = str(tmp_path / "pbmc.h5ad")
    shutil.copy(EXAMPLE, src)
    mem = Server(str(tmp_path), [src, "--cache-dir", str(tmp_path / "c0"), "--other-orientation", "memory"],
                 name="memory")
    try:
        mem.wait_other("pbmc")
        want = [gene_rows(mem, "pbmc", s) for s in SELECTIONS]
    finally:
        assert mem.stop() == 0
    for keep, cache in (("0", "c1"), (None, "c2")):
        if keep is None:
            monkeypatch.delenv("IVSERVE_KEEP_MIN_BYTES", raising=False)
        else:
            monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", keep)
        disk = Server(str(tmp_path), [src, "--cache-dir", str(tmp_path / cache), "--other-orientation", "disk"],
                      name="disk" + cache)
        try:
            assert disk.wait_other("pbmc")["source"] == "cache"
            assert [gene_rows(disk, "pbmc", s) for s in SELECTIONS] == want
        finally:
            assert disk.stop() == 0
        log = disk.text()
        assert "the pack turned it around by engine" in log, log[-3000:]
        assert ("its row index read from the cache folder" in log) == (keep is not None), log[-3000:]


def test_auto_keeps_a_small_copy_in_memory(tmp_path):
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [EXAMPLE, "--cache-dir", cache])
    try:
        assert s.wait_other("pbmc_example")["source"] == "memory"
    finally:
        assert s.stop() == 0
    # Nothing written for a small dataset: no copy, no kept index.
    assert not os.path.exists(cache) or os.listdir(cache) == [], os.listdir(cache)


def metric(text, name, part):
    m = re.search(r'^%s\{part="%s"\} (\d+)$' % (name, part), text, re.M)
    assert m, text[-3000:]
    return int(m.group(1))


def test_memory_budget_parts_and_the_answers_share(tmp_path):
    total = 20 << 20
    s = Server(str(tmp_path), [EXAMPLE, "--memory-bytes", total, "--cache-dir",
                               str(tmp_path / "cache")])
    try:
        s.wait_other("pbmc_example")
        m = s.metrics()
        parts = {p: metric(m, "ivserve_memory_budget_bytes", p)
                 for p in ("total", "cache", "copies", "writes", "answers", "builds")}
        assert parts["total"] == total
        assert parts["cache"] == total // 10 * 6
        for p in ("copies", "writes", "answers", "builds"):
            assert parts[p] <= total // 10, parts
        assert sum(v for k, v in parts.items() if k != "total") <= total
        assert metric(m, "ivserve_memory_used_bytes", "total") > 0   # the process's resident bytes
        assert "memory budget %d bytes (memory_bytes)" % total in s.text()
        # 2 MiB for answers: one cell is answered, all cells of every gene
        # (258,848 values) are refused before any work, with Retry-After.
        small = requests.post(s.url + "/v1/datasets/pbmc_example/query",
                              json={"obs": {"index": [5]}}, timeout=30)
        assert small.status_code == 200, small.text
        big = requests.post(s.url + "/v1/datasets/pbmc_example/query", json={},
                            headers={"Accept": "application/vnd.ivserve.csr"}, timeout=30)
        assert big.status_code == 503, big.status_code
        assert big.headers.get("Retry-After") == "1"
        assert big.json()["error"]["code"] == "memory_budget", big.text
        # The reservation of the answered query was given back.
        assert metric(s.metrics(), "ivserve_memory_used_bytes", "answers") == 0
    finally:
        assert s.stop() == 0


def test_memory_bytes_is_checked():
    r = subprocess.run([BIN, "--memory-bytes", "lots", EXAMPLE], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "--memory-bytes" in r.stderr, r.stderr
    r = subprocess.run([BIN, "--other-orientation", "tape", EXAMPLE], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0 and "auto, memory or disk" in r.stderr, r.stderr


def stalled_query(url, body):
    """Sends a binary query on a socket that reads only the first bytes of
    the answer, so that the server's stream (and the memory it reserved)
    stays open until drain() reads the rest."""
    import json
    import socket
    host, port = url.split("//")[1].split(":")
    sk = socket.socket()
    sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sk.connect((host, int(port)))
    data = json.dumps(body).encode()
    sk.sendall(b"POST /v1/datasets/big/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Accept: application/vnd.ivserve.csr\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    head = sk.recv(12)
    assert head.startswith(b"HTTP/1.1 200"), head

    def drain():
        got = bytearray(head)
        while True:
            b = sk.recv(1 << 20)
            if not b:
                break
            got += b
        sk.close()
        return bytes(got)
    return drain


def one_answer_file(tmp_path, seed):
    """A 20,000 x 1,000 file and a body of half its cells: 2 million
    values, whose answer reserves blocks_ahead (3) blocks of 8 MiB;
    --memory-bytes 300 MB gives answers 30 MB, room for one such answer."""
    import numpy as np
    import scipy.sparse as sp
    import ivref
    rng = np.random.default_rng(seed)
    X = sp.random(20000, 1000, density=0.1, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.integers(1, 50, n)).astype(np.float32)
    path = str(tmp_path / "big.h5ad")
    ivref.write_iv(path, X)
    return path, {"obs": {"index": list(range(0, 20000, 2))}}


def test_a_query_waits_in_line_for_the_answers_memory(tmp_path):
    """With the answers' share holding one large answer, a second waits
    while the first is being read, and is answered in full once it ends;
    a query that waits past limits.answer_wait_ms is a 503, and with a
    wait of 0 it is a 503 at once."""
    import threading
    path, body = one_answer_file(tmp_path, 5)
    for wait_ms in (1000, 0):
        s = Server(str(tmp_path), [path, "--memory-bytes", 300 << 20, "--answer-wait-ms", wait_ms,
                                   "--blocks-ahead", 3, "--other-orientation", "memory"],
                   name="wait%d" % wait_ms)
        try:
            s.wait_other("big")
            q = s.url + "/v1/datasets/big/query"
            hdr = {"Accept": "application/vnd.ivserve.csr"}
            want = requests.post(q, json=body, headers=hdr, timeout=60)
            assert want.status_code == 200, want.text
            drain = stalled_query(s.url, body)
            got = {}

            def second():
                t = time.time()
                r = requests.post(q, json=body, headers=hdr, timeout=60)
                got.update(status=r.status_code, body=r.content, seconds=time.time() - t,
                           retry=r.headers.get("Retry-After"))
            th = threading.Thread(target=second)
            th.start()
            if wait_ms:
                time.sleep(0.5)
                assert th.is_alive(), got           # still waiting in line
                first = drain()
                th.join(60)
                assert got["status"] == 200 and got["body"] == want.content, got.get("status")
                assert got["seconds"] >= 0.45, got["seconds"]
                # The stalled answer was whole (chunked, so it ends with
                # the last chunk).
                assert len(first) > len(want.content) and first.endswith(b"\r\n0\r\n\r\n")
                # Past the wait: a 503 with Retry-After, after about the wait.
                drain = stalled_query(s.url, body)
                got.clear()
                th = threading.Thread(target=second)
                th.start()
                th.join(60)
                assert got["status"] == 503 and got["retry"] == "1", got.get("status")
                assert 0.9 <= got["seconds"] < 5, got["seconds"]
                drain()
            else:
                th.join(60)
                assert got["status"] == 503 and got["seconds"] < 0.9, (got.get("status"), got.get("seconds"))
                drain()
            assert metric(s.metrics(), "ivserve_memory_used_bytes", "answers") == 0
        finally:
            assert s.stop() == 0


def test_the_line_for_the_answers_memory_is_the_servers_not_a_loops(tmp_path):
    """With two connection loops, queries waiting for the answers' memory
    are started in arrival order across loops: B (on one loop) waits
    before C (on the other), and when A, on C's loop, ends, B is answered
    first.  Each loop taking what its own streams freed for its own
    waiters started C first."""
    import threading
    path, body = one_answer_file(tmp_path, 6)
    # Room for one answer, as above.  Three loops: loop 0 accepts, and
    # connections go to loops 1 and 2 in turn, so the consecutive
    # connections A, B, C sit on loops x, y, x.
    s = Server(str(tmp_path), [path, "--memory-bytes", 300 << 20, "--answer-wait-ms", 20000,
                               "--blocks-ahead", 3, "--other-orientation", "memory", "--loops", 3],
               name="line")
    try:
        s.wait_other("big")
        q = s.url + "/v1/datasets/big/query"
        hdr = {"Accept": "application/vnd.ivserve.csr"}
        want = requests.post(q, json=body, headers=hdr, timeout=60)
        assert want.status_code == 200, want.text
        drain = stalled_query(s.url, body)       # A
        done = []
        lock = threading.Lock()

        def ask(name):
            r = requests.post(q, json=body, headers=hdr, timeout=60)
            with lock:
                done.append((name, r.status_code, r.content == want.content))
        tb = threading.Thread(target=ask, args=("B",))
        tb.start()
        time.sleep(0.4)
        tc = threading.Thread(target=ask, args=("C",))
        tc.start()
        time.sleep(0.4)
        assert tb.is_alive() and tc.is_alive(), done   # both waiting in line
        drain()
        tb.join(60)
        tc.join(60)
        assert [d[0] for d in done] == ["B", "C"], done
        assert all(d[1] == 200 and d[2] for d in done), done
    finally:
        assert s.stop() == 0
