"""The plain copy of a compressed stream (issue 24; core/matrix/plainfile.c).

A server with --plain-copy on writes the served matrix's stream,
uncompressed, into its cache folder once it serves, and its cell queries
read that copy.  Checked here, against scipy on a zstd-compressed file
served with a 64 KiB cache (so that queries keep missing it):

- the dataset document says the copy is read, the log says it was
  written, and random cell selections (any order, duplicates, gene subsets,
  binary and JSON, cell and gene rows) are exactly the matrix's;
- a restart with the folder kept takes the copy (the log says "kept") and
  answers the same;
- a source written over in place is still never answered with other bytes:
  the watcher notices it and the dataset refuses (503 file_changed), though
  the queries read the copy;
- --plain-copy off writes no copy; by default (auto) a stream smaller than
  the cache folder's minimum gets none either.
"""
import glob
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
import ivclient  # noqa: E402
import ivref  # noqa: E402
from ivprocess import ServerProcess  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN", os.path.join(HERE, "..", "..", "build", "ivserve"))
if not os.path.exists(BIN):
    pytest.fail("IVSERVE_BIN is not set to an ivserve binary", pytrace=False)

N_ROWS, N_COLS, NNZ = 20000, 1500, 900_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain_src")
    rng = np.random.default_rng(24)
    X = ivref.random_csr(rng, N_ROWS, N_COLS, NNZ, dtype=np.float32, zero_frac=0.01)
    X = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), shape=X.shape)
    path = str(d / "m.h5ad")
    ivref.write_iv(path, X, compression="zstd", chunk_len=16384)
    other = ivref.random_csr(rng, N_ROWS // 2, N_COLS, NNZ // 3, dtype=np.float32)
    opath = str(d / "other.h5ad")
    ivref.write_iv(opath, other, compression="zstd", chunk_len=16384)
    return X, path, opath


class Server(ServerProcess):
    def __init__(self, tmp, path, cache, plain="on"):
        super().__init__(tmp, ["--cache-dir", cache, "--cache-bytes", "65536", "--threads", "2",
                               "--plain-copy", plain, "--other-orientation", "memory", path],
                         ready_timeout=120, stop_timeout=60, binary=BIN)
        self.id = os.path.basename(path)[:-5]

    def doc(self):
        r = requests.get(self.url + "/v1/datasets/" + self.id, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_jobs(self, plain=True):
        """Until the jobs after the load have ended: the other orientation,
        then (plain) the plain copy, written after it."""
        deadline = time.time() + 120
        while True:
            doc = self.doc()
            if doc["orientations"]["genes"]["state"] not in ("none", "building") and \
                    (not plain or "plain_copy" in doc["orientations"]["cells"]):
                return doc
            assert time.time() < deadline, self.log_text()[-3000:]
            time.sleep(0.1)


assert_same = ivref.assert_csr_equal


def check_answers(srv, X, rounds=6):
    c = ivclient.Client(srv.url)
    rng = np.random.default_rng(5)
    for k in range(rounds):
        obs = rng.integers(0, N_ROWS, 1 + int(rng.integers(0, 3000))).tolist()
        var = None if k % 3 == 0 else rng.integers(0, N_COLS, 1 + int(rng.integers(0, 400))).tolist()
        want = X[obs] if var is None else X[obs][:, var]
        res = c.query(srv.id, obs=obs, var=var, format="binary" if k % 2 == 0 else "json", names=False)
        assert_same(res.matrix, want)
    # Gene rows over a cell selection (the by-var output of the cell-major stream).
    obs = rng.integers(0, N_ROWS, 500).tolist()
    res = c.query(srv.id, obs=obs, var=[3, 3, 700], by="var", format="binary")
    assert_same(res.matrix, X[obs][:, [3, 3, 700]])


def copies(cache):
    return glob.glob(os.path.join(cache, "*.X.plain"))


def test_copy_written_read_and_kept(tmp_path, data):
    X, path, _ = data
    cache = str(tmp_path / "cache")
    srv = Server(str(tmp_path), path, cache)
    try:
        doc = srv.wait_jobs()
        assert doc["orientations"]["cells"].get("plain_copy") == "ready", doc["orientations"]
        log = srv.log_text()
        assert "plain copy of its stream written" in log
        # Written after the other orientation, which serves first.
        assert log.index("gene-major orientation ready") < log.index("plain copy of its stream written")
        assert len(copies(cache)) == 1
        check_answers(srv, X)
    finally:
        assert srv.stop() == 0
    srv = Server(str(tmp_path), path, cache)
    try:
        doc = srv.wait_jobs()
        assert doc["orientations"]["cells"].get("plain_copy") == "ready"
        assert "plain copy of its stream kept" in srv.log_text(), srv.log_text()[-2000:]
        check_answers(srv, X, rounds=3)
    finally:
        assert srv.stop() == 0


def test_source_changed_in_place_is_refused(tmp_path, data):
    X, path, opath = data
    victim = str(tmp_path / "victim.h5ad")
    shutil.copyfile(path, victim)
    cache = str(tmp_path / "cache")
    srv = Server(str(tmp_path), victim, cache)
    try:
        srv.wait_jobs()
        check_answers(srv, X, rounds=2)
        # What cp does: the same inode, truncated and written again.
        with open(opath, "rb") as fi, open(victim, "r+b") as fo:
            fo.truncate(0)
            shutil.copyfileobj(fi, fo)
        c = ivclient.Client(srv.url)
        deadline = time.time() + 10
        refused = False
        while time.time() < deadline and not refused:
            obs = list(range(0, N_ROWS, 7))
            try:
                res = c.query(srv.id, obs=obs, format="binary", names=False)
                assert_same(res.matrix, X[obs])  # the loaded matrix, exactly
            except ivclient.ServerError as e:
                assert e.status == 503 and e.code == "file_changed", e
                refused = True
            time.sleep(0.2)
        assert refused, "the changed source was never noticed"
    finally:
        assert srv.stop() == 0


def test_no_copy_when_off_or_small(tmp_path, data):
    X, path, _ = data
    for plain in ("off", "auto"):
        cache = str(tmp_path / ("cache_" + plain))
        srv = Server(str(tmp_path), path, cache, plain=plain)
        try:
            doc = srv.wait_jobs(plain=False)
            assert "plain_copy" not in doc["orientations"]["cells"]
            assert copies(cache) == []
            assert "plain copy" not in srv.log_text()
            check_answers(srv, X, rounds=2)
        finally:
            assert srv.stop() == 0


def stored_chunks(path):
    """Every stored chunk of the packed matrix's arrays, raw (as written)."""
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        for name in ("major_ptr", "value_ptr", "values", "packed_indices"):
            d = f["X"][name]
            n = d.id.get_num_chunks()
            out[name] = [d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset) for i in range(n)]
    return out


def pack_turned(src, out, *more):
    """`ivserve pack` of src into its gene-major orientation at out, in
    windows of 1 MiB (many of them); its report's "turned around by" line."""
    r = subprocess.run([BIN, "pack", src, out, "--layout", "ivcsc", "--matrix-only", "--threads", "2",
                        "--engine-window-kb", "1024", *more], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if "turned around by" in ln][0]


def test_pack_reads_the_copy_as_its_replica(tmp_path):
    """`ivserve pack` into the other orientation, given the served stream's
    plain copy (as the server gives it), reads it instead of writing a
    replica of its own, and writes the same file chunk for chunk; a copy
    of another file is passed over."""
    rng = np.random.default_rng(25)
    X = ivref.random_csr(rng, N_ROWS, N_COLS, NNZ, dtype=np.int32)
    X.data[:] = 1 + (X.data % 2 != 0)   # two values: few groups, so the windows resume
    X = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), shape=X.shape)
    path, other = str(tmp_path / "m.h5ad"), str(tmp_path / "o.h5ad")
    ivref.write_iv(path, X, compression="zstd", chunk_len=16384)
    ivref.write_iv(other, sp.csr_matrix(X[np.arange(N_ROWS - 1, -1, -1)]), compression="zstd", chunk_len=16384)
    found = {}
    for src in (path, other):
        cache = str(tmp_path / ("cache_" + os.path.basename(src)))
        srv = Server(str(tmp_path), src, cache)
        try:
            srv.wait_jobs()
        finally:
            assert srv.stop() == 0
        (found[src],) = copies(cache)

    own, reused, stale = (str(tmp_path / n) for n in ("own.h5ad", "reused.h5ad", "stale.h5ad"))
    how = pack_turned(path, own)
    assert "windows" in how and "plain copy" not in how, how
    assert int(how.split("engine, ")[1].split()[0]) > 2, how
    assert "input read from its plain copy" in pack_turned(path, reused, "--engine-replica-from", found[path])
    assert "plain copy" not in pack_turned(path, stale, "--engine-replica-from", found[other])
    want = stored_chunks(own)
    assert stored_chunks(reused) == want
    assert stored_chunks(stale) == want


def test_pack_reads_the_kept_row_index(tmp_path, monkeypatch):
    """`ivserve pack` into the other orientation, given the cache folder
    where the server kept the input's row index and pointer arrays (as the
    server gives it, --engine-index-from), reads them instead of making
    them again, and writes the same file chunk for chunk; a folder that
    holds another file's is passed over, and the folder gains nothing."""
    rng = np.random.default_rng(26)
    X = ivref.random_csr(rng, N_ROWS, N_COLS, NNZ, dtype=np.int32)
    X = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), shape=X.shape)
    path, other = str(tmp_path / "m.h5ad"), str(tmp_path / "o.h5ad")
    ivref.write_iv(path, X, compression="zstd", chunk_len=16384)
    ivref.write_iv(other, sp.csr_matrix(X[np.arange(N_ROWS - 1, -1, -1)]), compression="zstd", chunk_len=16384)
    # Kept whatever the stream's size (the default keeps those of 64 MiB up).
    monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", "0")
    caches = {}
    for src in (path, other):
        caches[src] = str(tmp_path / ("cache_" + os.path.basename(src)))
        srv = Server(str(tmp_path), src, caches[src], plain="off")
        try:
            srv.wait_jobs(plain=False)
        finally:
            assert srv.stop() == 0
        assert glob.glob(os.path.join(caches[src], "*.X.index")), os.listdir(caches[src])

    own, kept, stale = (str(tmp_path / n) for n in ("own.h5ad", "kept.h5ad", "stale.h5ad"))
    before = sorted(os.listdir(caches[path]))
    assert "cache folder" not in pack_turned(path, own)
    how = pack_turned(path, kept, "--engine-index-from", caches[path])
    assert "its row index read from the cache folder" in how, how
    assert "cache folder" not in pack_turned(path, stale, "--engine-index-from", caches[other])
    assert sorted(os.listdir(caches[path])) == before
    want = stored_chunks(own)
    assert stored_chunks(kept) == want
    assert stored_chunks(stale) == want


def test_copy_in_use_survives_a_sweep(tmp_path, data):
    """A plain copy being read is pinned: another dataset's pack sweeps a
    cache folder bounded to 1 byte, which removes every derived file not in
    use, and the copy stays."""
    X, path, opath = data
    cache = str(tmp_path / "cache")
    cfg_path = str(tmp_path / "cfg.json")

    def write_cfg(paths):
        cfg = {"datasets": [{"id": os.path.basename(p)[:-5], "path": p} for p in paths],
               "cache_dir": cache, "cache_dir_bytes": 1, "cache_bytes": 65536,
               "plain_copy": "on", "other_orientation": "disk", "threads": 2}
        with open(cfg_path + ".tmp", "w") as f:
            import json
            json.dump(cfg, f)
        os.replace(cfg_path + ".tmp", cfg_path)

    write_cfg([path])
    srv = ServerProcess(str(tmp_path), ["--config", cfg_path], ready_timeout=120, stop_timeout=60, binary=BIN)
    try:
        srv.wait_logged("plain copy of its stream written")
        (mine,) = copies(cache)
        write_cfg([path, opath])
        r = requests.post(srv.url + "/v1/admin/reload", timeout=120)
        assert r.status_code == 200, r.text
        srv.wait_logged("plain copy of its stream written", times=2)
        log = srv.log_text()
        assert os.path.exists(mine), "the copy in use was swept:\n" + log[-3000:]
        c = ivclient.Client(srv.url)
        obs = list(range(0, N_ROWS, 11))
        assert_same(c.query("m", obs=obs, format="binary", names=False).matrix, X[obs])
    finally:
        assert srv.stop() == 0
