"""The wide copy (issue 24; core/matrix/widefile.c): the gene indices of a
cell-major matrix kept as two-byte integers in the cache folder, read by
the cell queries that select genes instead of the packed stream's varints.

Checked here, against scipy, on a zstd-compressed file served with a
64 KiB cache (so that queries keep missing it):

- with --wide-copy on, the copy is written after the plain copy (which it
  decodes), the dataset document says it is read, the log says it was
  written, and random cell x gene selections (genes ascending, in any
  order, repeated; binary and JSON; cell and gene rows) are exactly the
  matrix's;
- a restart with the folder kept takes the copy and answers the same;
- a copy whose bytes change under the running server (its time put back,
  so that only the chunk checksums see it) is dropped and removed, and
  every answer, the one that met it included, stays exact;
- --wide-copy off writes none; auto writes one for a stream the cache
  folder keeps (IVSERVE_KEEP_MIN_BYTES lowered here) and none for a small
  one; a matrix of more than 65,536 genes never gets one.
"""
import glob
import os
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
    d = tmp_path_factory.mktemp("wide_src")
    rng = np.random.default_rng(2424)
    X = ivref.random_csr(rng, N_ROWS, N_COLS, NNZ, dtype=np.float32, zero_frac=0.01)
    X = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), shape=X.shape)
    path = str(d / "m.h5ad")
    ivref.write_iv(path, X, compression="zstd", chunk_len=16384)
    return X, path


class Server(ServerProcess):
    def __init__(self, tmp, path, cache, wide="on", plain="on"):
        super().__init__(tmp, ["--cache-dir", cache, "--cache-bytes", "65536", "--threads", "2",
                               "--plain-copy", plain, "--wide-copy", wide, "--other-orientation", "memory",
                               path], ready_timeout=120, stop_timeout=60, binary=BIN)
        self.id = os.path.basename(path)[:-5]

    def doc(self):
        r = requests.get(self.url + "/v1/datasets/" + self.id, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()


def copies(cache):
    return glob.glob(os.path.join(cache, "*.X.wide"))


def check_answers(srv, X, n_cols, rounds=9):
    c = ivclient.Client(srv.url)
    rng = np.random.default_rng(7)
    for k in range(rounds):
        obs = rng.integers(0, X.shape[0], 1 + int(rng.integers(0, 3000))).tolist()
        var = rng.integers(0, n_cols, 1 + int(rng.integers(0, 400)))
        if k % 3 == 0:
            var = np.unique(var)          # ascending, distinct
        elif k % 3 == 1:
            var = np.concatenate([var, var[:5]])   # repeated
        var = var.tolist()
        res = c.query(srv.id, obs=obs, var=var, format="binary" if k % 2 == 0 else "json", names=False)
        ivref.assert_csr_equal(res.matrix, X[obs][:, var])
    obs = rng.integers(0, X.shape[0], 500).tolist()
    res = c.query(srv.id, obs=obs, var=[3, 3, 700], by="var", format="binary")
    ivref.assert_csr_equal(res.matrix, X[obs][:, [3, 3, 700]])


def test_copy_written_read_and_kept(tmp_path, data):
    X, path = data
    cache = str(tmp_path / "cache")
    srv = Server(str(tmp_path), path, cache)
    try:
        srv.wait_logged("wide copy of its indices written")
        log = srv.log_text()
        assert log.index("plain copy of its stream written") < log.index("wide copy of its indices written")
        assert srv.doc()["orientations"]["cells"].get("wide_copy") == "ready"
        assert len(copies(cache)) == 1
        assert os.path.getsize(copies(cache)[0]) > 2 * X.nnz
        check_answers(srv, X, N_COLS)
    finally:
        assert srv.stop() == 0
    srv = Server(str(tmp_path), path, cache)
    try:
        srv.wait_logged("wide copy of its indices kept")
        assert srv.doc()["orientations"]["cells"].get("wide_copy") == "ready"
        assert "wide copy of its indices written" not in srv.log_text()
        check_answers(srv, X, N_COLS, rounds=3)
    finally:
        assert srv.stop() == 0


def test_copy_changed_under_the_server_is_dropped(tmp_path, data):
    X, path = data
    cache = str(tmp_path / "cache")
    srv = Server(str(tmp_path), path, cache)
    try:
        srv.wait_logged("wide copy of its indices written")
        at = copies(cache)[0]
        st = os.stat(at)
        # Every chunk of the copy's data changed (after its 4 KiB header),
        # so that the first query to read any of it meets the change.
        with open(at, "r+b") as f:
            for off in range(4096 + 7, 4096 + 2 * X.nnz, 4096):
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 1]))
        os.utime(at, ns=(st.st_atime_ns, st.st_mtime_ns))
        check_answers(srv, X, N_COLS)
        assert not os.path.exists(at)
    finally:
        assert srv.stop() == 0


def test_no_copy_when_off_small_or_too_many_genes(tmp_path, data, monkeypatch):
    X, path = data
    for wide, keep_min, want in (("off", "1", 0), ("auto", None, 0), ("auto", "1", 1)):
        if keep_min:
            monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", keep_min)
        else:
            monkeypatch.delenv("IVSERVE_KEEP_MIN_BYTES", raising=False)
        cache = str(tmp_path / ("cache_%s_%s" % (wide, keep_min)))
        srv = Server(str(tmp_path), path, cache, wide=wide, plain="off")
        try:
            if want:
                srv.wait_logged("wide copy of its indices written")
            else:
                deadline = time.time() + 60
                while srv.doc()["orientations"]["genes"]["state"] in ("none", "building"):
                    assert time.time() < deadline
                    time.sleep(0.1)
                time.sleep(0.5)
                assert "wide copy" not in srv.log_text()
            assert len(copies(cache)) == want
            check_answers(srv, X, N_COLS, rounds=3)
        finally:
            assert srv.stop() == 0
    # 70,000 genes: the indices do not fit two bytes.
    rng = np.random.default_rng(3)
    W = ivref.random_csr(rng, 3000, 70000, 200_000, dtype=np.float32)
    W = sp.csr_matrix((W.data, W.indices.astype(np.int64), W.indptr.astype(np.int64)), shape=W.shape)
    wpath = str(tmp_path / "wide_genes.h5ad")
    ivref.write_iv(wpath, W, compression="zstd", chunk_len=16384)
    monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", "1")
    cache = str(tmp_path / "cache_70k")
    srv = Server(str(tmp_path), wpath, cache, wide="on", plain="on")
    try:
        srv.wait_logged("plain copy of its stream written")
        time.sleep(0.5)
        assert "wide copy" not in srv.log_text()
        assert copies(cache) == []
        check_answers(srv, W, 70000, rounds=3)
    finally:
        assert srv.stop() == 0
