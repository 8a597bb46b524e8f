"""Ordinary .h5ad files served: the server packs a file whose X is a plain
csr_matrix, csc_matrix or dense array into its cache folder once, serves
the copy exactly, and finds it again at the next start.

- each kind of X (gzip'd CSR as scanpy writes it, CSC, dense) is served
  equal to anndata's own reading of the file, obs names included;
- the cache folder is created 0700 and holds STEM-KEY.ivcsr.h5ad with its
  note; a second start packs nothing;
- while the pack runs (held with SIGSTOP here, so the test sees it
  whatever the machine's speed) the dataset is "packing" with progress in
  /v1/datasets, /readyz names it, and a query is a 503 saying so;
- a changed source gets a new copy and the stale one is removed; the
  folder's byte bound evicts the least recently used copy not in use;
- SIGHUP after the source is replaced packs the new file in the
  background while the old copy keeps answering, then serves the new one;
- SIGTERM during a pack stops it within the grace and leaves no
  temporary file;
- --no-autopack refuses the file with the exact `ivserve pack` command.
"""
import json
import os
import signal
import subprocess
import time

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

from ivprocess import listening_port

BIN = os.environ.get("IVSERVE_BIN")


def make(path, n_obs=300, n_var=80, seed=1, kind="csr", compression="gzip"):
    rng = np.random.default_rng(seed)
    X = sp.random(n_obs, n_var, density=0.1, format="csr", dtype=np.float32, random_state=rng)
    X.data = np.floor(X.data * 30 + 1).astype(np.float32)
    obs = pd.DataFrame({"cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], n_obs))},
                       index=["c%d_%d" % (seed, i) for i in range(n_obs)])
    var = pd.DataFrame(index=["g%d" % j for j in range(n_var)])
    a = ad.AnnData(X=X if kind == "csr" else X.tocsc() if kind == "csc" else X.toarray(),
                   obs=obs, var=var)
    a.write_h5ad(path, compression=compression)
    return X.toarray()


class Server:
    # X's Zarr chunks are not kept (--zarr-keep-entries 0): these tests
    # count and bound the cache folder's packed copies, and the Zarr files
    # (test_zarr.py test_kept_x_chunks) would be counted with them.
    def __init__(self, tmp, args, name="server"):
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "a+")
        self.proc = subprocess.Popen([BIN, *map(str, args), "--port", "0", "--threads", "2",
                                      "--zarr-keep-entries", "0"],
                                     stdout=self.log, stderr=self.log)
        self.url = "http://127.0.0.1:%d" % listening_port(self.log_path, self.proc)

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def datasets(self):
        return {d["id"]: d for d in requests.get(self.url + "/v1/datasets", timeout=10).json()["datasets"]}

    def wait(self, pred, timeout=120, what="condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.text()[-3000:]
            v = pred()
            if v:
                return v
            time.sleep(0.05)
        raise AssertionError("%s never held:\n%s" % (what, self.text()[-3000:]))

    def settled(self, timeout=120):
        return self.wait(lambda: all(d["state"] not in ("loading", "packing")
                                     for d in self.datasets().values()), timeout, "settled")

    def matrix(self, ds, n_obs):
        r = requests.get("%s/v1/datasets/%s/query?obs=0:%d&format=json" % (self.url, ds, n_obs),
                         timeout=30)
        assert r.status_code == 200, r.text
        doc = r.json()
        out = np.zeros(tuple(doc["shape"]), dtype=np.float32)
        ip = doc["indptr"]
        for i in range(len(ip) - 1):
            out[i, doc["indices"][ip[i]:ip[i + 1]]] = doc["data"][ip[i]:ip[i + 1]]
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def copies(cache):
    return sorted(f for f in os.listdir(cache) if f.endswith(".ivcsr.h5ad"))


def pack_children(server_pid):
    """The pack processes the server started (the command's parent and its
    guarded child)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if len(cmd) > 1 and cmd[1] == b"pack":
            out.append((int(pid), ppid))
    mine = [p for p, pp in out if pp == server_pid]
    return mine + [p for p, pp in out if pp in mine]


@pytest.mark.parametrize("kind", ["csr", "csc", "dense"])
def test_ordinary_file_is_packed_once_and_served_exactly(tmp_path, kind):
    src = str(tmp_path / ("data_%s.h5ad" % kind))
    X = make(src, kind=kind)
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache])
    try:
        s.settled()
        ds = "data_%s" % kind
        assert s.datasets()[ds]["state"] == "ready", s.datasets()
        assert np.array_equal(s.matrix(ds, 300), X)
        r = requests.get(s.url + "/v1/datasets/%s/query?obs_names=c1_7,c1_2&var=3:9&format=json" % ds,
                         timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["obs"] == [7, 2]
        assert "packing it into" in s.text()
    finally:
        assert s.stop() == 0
    assert os.stat(cache).st_mode & 0o777 == 0o700
    made = copies(cache)
    assert len(made) == 1 and made[0].startswith("data_%s-" % kind), made
    assert os.path.exists(os.path.join(cache, made[0] + ".src"))
    stamp = os.stat(os.path.join(cache, made[0])).st_mtime_ns
    # Second start: the copy is found, nothing is packed.
    s = Server(str(tmp_path), [src, "--cache-dir", cache], name="second")
    try:
        s.settled()
        assert np.array_equal(s.matrix("data_%s" % kind, 300), X)
        assert "serving its packed copy" in s.text() and "packing it into" not in s.text()
    finally:
        assert s.stop() == 0
    assert copies(cache) == made
    assert os.stat(os.path.join(cache, made[0])).st_size > 0
    assert os.stat(os.path.join(cache, made[0])).st_mtime_ns >= stamp


def test_packing_is_shown_while_it_runs(tmp_path):
    src = str(tmp_path / "held.h5ad")
    # Large enough that the pack is still running when it is found (see
    # test_sigterm_during_a_pack_...); the first 2,000 rows are compared.
    X = make(src, n_obs=200000, n_var=300)[:2000]
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache])
    try:
        # Hold the pack where it is: the state must show, whatever the speed.
        kids = s.wait(lambda: pack_children(s.proc.pid), 60, "a pack process")
        for k in kids:
            os.kill(k, signal.SIGSTOP)
        try:
            d = s.wait(lambda: s.datasets()["held"] if s.datasets()["held"]["state"] == "packing"
                       else None, 30, "packing state")
            p = d["packing"]
            assert 0 <= p["fraction"] <= 1 and p["rows"] == 200000 and p["seconds"] >= 0, d
            r = requests.get(s.url + "/readyz", timeout=10)
            assert r.status_code == 503 and "held (packing" in r.text, r.text
            r = requests.get(s.url + "/v1/datasets/held/query?obs=0:2", timeout=10)
            assert r.status_code == 503 and "being packed" in r.text, r.text
        finally:
            for k in kids:
                os.kill(k, signal.SIGCONT)
        s.settled()
        assert np.array_equal(s.matrix("held", 2000), X)
    finally:
        assert s.stop() == 0


def test_changed_source_gets_a_new_copy_and_the_stale_one_goes(tmp_path):
    src = str(tmp_path / "ch.h5ad")
    make(src, seed=1)
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache])
    s.settled()
    assert s.stop() == 0
    first = copies(cache)
    X2 = make(src, seed=2)
    s = Server(str(tmp_path), [src, "--cache-dir", cache], name="again")
    try:
        s.settled()
        assert np.array_equal(s.matrix("ch", 300), X2)
    finally:
        assert s.stop() == 0
    now = copies(cache)
    assert len(now) == 1 and now != first, (first, now)
    assert sorted(os.listdir(cache)) == sorted(now + [n + ".src" for n in now])


def test_byte_bound_evicts_the_least_recent_copy_not_in_use(tmp_path):
    cache = str(tmp_path / "cache")
    a, b, c = (str(tmp_path / n) for n in ("a.h5ad", "b.h5ad", "c.h5ad"))
    make(a, seed=1)
    make(b, seed=2)
    Xc = make(c, seed=3)
    s = Server(str(tmp_path), [a, b, "--cache-dir", cache, "--cache-dir-bytes", "1"])
    s.settled()
    assert s.stop() == 0
    # Both were in use while served: the bound could evict neither.
    assert [f.split("-")[0] for f in copies(cache)] == ["a", "b"]
    s = Server(str(tmp_path), [c, "--cache-dir", cache, "--cache-dir-bytes", "1"], name="c")
    try:
        s.settled()
        assert np.array_equal(s.matrix("c", 300), Xc)
    finally:
        assert s.stop() == 0
    assert [f.split("-")[0] for f in copies(cache)] == ["c"]
    assert "2 least recently used" in s.text()


def test_replaced_source_is_repacked_while_the_old_copy_serves(tmp_path):
    src = str(tmp_path / "rep.h5ad")
    # 200,000 rows so that the repack runs long enough to be caught (a
    # 2,000-row file packed in 0.05 s, under the poll's interval); the
    # first 2,000 rows are compared.
    X1 = make(src, n_obs=200000, n_var=300, seed=1)[:2000]
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache])
    try:
        s.settled()
        new = str(tmp_path / "new.h5ad")
        X2 = make(new, n_obs=200000, n_var=300, seed=2)[:2000]
        os.rename(new, src)
        s.proc.send_signal(signal.SIGHUP)
        kids = s.wait(lambda: pack_children(s.proc.pid), 60, "the repack")
        for k in kids:
            os.kill(k, signal.SIGSTOP)
        try:
            # The old copy answers, whole, while the new one is packed.
            assert np.array_equal(s.matrix("rep", 2000), X1)
            assert s.datasets()["rep"].get("reload") == "loading", s.datasets()
        finally:
            for k in kids:
                os.kill(k, signal.SIGCONT)
        s.wait(lambda: np.array_equal(s.matrix("rep", 2000), X2), 120, "the new copy served")
    finally:
        assert s.stop() == 0


def test_sigterm_during_a_pack_stops_it_and_leaves_no_temporary_file(tmp_path):
    src = str(tmp_path / "big.h5ad")
    # Large enough that the pack (about 0.7 s here) is still running when
    # the test finds and stops it: a 2,000-row file packed in 0.05 s, so
    # on a quiet machine the copy was often done before the stop.
    make(src, n_obs=200000, n_var=300)
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache, "--shutdown-grace-ms", "2000"])
    kids = s.wait(lambda: pack_children(s.proc.pid), 60, "a pack process")
    for k in kids:
        os.kill(k, signal.SIGSTOP)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    for k in kids:
        os.kill(k, signal.SIGCONT)
    assert s.proc.wait(30) == 0, s.text()[-2000:]
    assert time.time() - t0 < 15
    deadline = time.time() + 10
    while time.time() < deadline and any(".tmp" in f for f in os.listdir(cache)):
        time.sleep(0.1)
    assert not [f for f in os.listdir(cache) if ".tmp" in f], os.listdir(cache)
    assert copies(cache) == []


def test_no_autopack_refuses_with_the_exact_command(tmp_path):
    src = str(tmp_path / "plain.h5ad")
    make(src)
    good = str(tmp_path / "good.h5ad")
    make(good, seed=5)
    subprocess.run([BIN, "pack", good, str(tmp_path / "good_packed.h5ad"), "--quiet"], check=True)
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, str(tmp_path / "good_packed.h5ad"), "--no-autopack",
                               "--cache-dir", cache])
    try:
        s.settled()
        d = s.datasets()
        assert d["good_packed"]["state"] == "ready"
        assert d["plain"]["state"] == "failed"
        err = d["plain"]["error"]
        assert "autopack is off" in err and "ivserve pack" in err and "plain.ivcsr.h5ad" in err, err
    finally:
        assert s.stop() == 0
    assert not os.path.exists(cache)


def test_replaced_source_is_noticed_without_a_reload(tmp_path):
    """The watcher sees the source of a packed copy change (every 2 s) and
    packs it again by itself; queries answer the old matrix until then."""
    src = str(tmp_path / "auto.h5ad")
    X1 = make(src, seed=1)
    cache = str(tmp_path / "cache")
    s = Server(str(tmp_path), [src, "--cache-dir", cache])
    try:
        s.settled()
        assert np.array_equal(s.matrix("auto", 300), X1)
        new = str(tmp_path / "new.h5ad")
        X2 = make(new, seed=2)
        os.rename(new, src)
        s.wait(lambda: np.array_equal(s.matrix("auto", 300), X2), 60, "the new copy served")
        assert "its source %s changed" % src in s.text()
        # Asked once: no second pack of the same file.
        time.sleep(5)
        assert s.text().count("packing it into") == 2, s.text()[-3000:]
    finally:
        assert s.stop() == 0
