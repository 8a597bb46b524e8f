"""Files replaced under a running server (issue 14).

An administrator writes over a served .h5ad in place (cp, of a file of the
same size or another), truncates it, renames a new file over it or deletes
it, between queries and while a slow client holds a stream open.  Each time
the server must stay up (/healthz, and another dataset answering exactly),
the dataset must answer either exactly the matrix it loaded or a clear
error (503 file_changed), never other bytes (every row that arrives is
compared with numpy), and the change must be noticed: a log line and the
dataset document's "file" state.

The datasets are served with a 64 KiB cache, a few stored chunks, so that
queries keep reading chunks from the file instead of answering from memory.
"""
import json
import os
import shutil
import socket
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
from ivprocess import ServerProcess, write_config  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN", os.path.join(HERE, "..", "..", "build", "ivserve"))
if not os.path.exists(BIN):
    pytest.fail("IVSERVE_BIN is not set to an ivserve binary", pytrace=False)

N_ROWS, N_COLS, NNZ = 30000, 2000, 1_500_000
CHUNK = 16384
# The watcher looks every 2 s; a change is noticed within one interval.
NOTICE_S = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The matrices and their files, written once: A (the one served: raw
    chunks, one contiguous range, zstd chunks), B (A's rows reversed: as a raw file exactly A's size), D (a
    different matrix, zstd, another size), O (the other dataset)."""
    d = tmp_path_factory.mktemp("replace_src")
    rng = np.random.default_rng(14)

    def gen(*a, **kw):
        # One index dtype for indices and indptr, as scipy's slicing wants.
        X = ivref.random_csr(rng, *a, **kw)
        return sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)),
                             shape=X.shape)

    A = gen(N_ROWS, N_COLS, NNZ, dtype=np.int32)
    B = sp.csr_matrix(A[np.arange(N_ROWS - 1, -1, -1)])
    D = gen(N_ROWS // 2, N_COLS, NNZ // 3, dtype=np.int32)
    O = gen(500, 300, 6000, dtype=np.float32)
    out = {"A": A, "D": D, "O": O}
    for name, X, comp, cl in (("A.raw", A, None, CHUNK), ("B.raw", B, None, CHUNK),
                              ("A.contig", A, None, None), ("A.zstd", A, "zstd", CHUNK),
                              ("D.zstd", D, "zstd", CHUNK), ("O.zstd", O, "zstd", CHUNK)):
        path = str(d / (name + ".h5ad"))
        ivref.write_iv(path, X, compression=comp, chunk_len=cl)
        out[name] = path
    # The same-size cases need it: the raw files have arrays of equal lengths.
    assert os.path.getsize(out["A.raw"]) == os.path.getsize(out["B.raw"])
    assert os.path.getsize(out["A.zstd"]) != os.path.getsize(out["D.zstd"])
    return out


class Server(ServerProcess):
    """ivserve over {id: path} with a 64 KiB cache, so that queries read
    the file."""

    def __init__(self, tmp, datasets):
        cfg = {"datasets": [{"id": k, "path": v} for k, v in datasets.items()],
               "cache_bytes": 65536}
        super().__init__(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"],
                         ready_timeout=120, stop_timeout=60, binary=BIN)


assert_same = ivref.assert_csr_equal


def query(srv, ds, obs=None):
    """(matrix, None) on success, (None, (status, code, message)) on an
    error, whether it came as the status or in the stream's trailer."""
    c = ivclient.Client(srv.url)
    try:
        res = c.query(ds, obs=obs, format="binary")
        return res.matrix, None
    except ivclient.ServerError as e:
        return None, (e.status, e.code, str(e))


def old_or_clear_error(srv, A, obs, must_answer=False):
    """The victim answers exactly A[obs] or 503 file_changed; returns
    which ('ok' or 'error')."""
    m, err = query(srv, "victim", obs=obs)
    if err is None:
        want = A if obs is None else A[obs]
        assert_same(m, want)
        return "ok"
    assert not must_answer, "the loaded file is still open and must answer: %r" % (err,)
    assert err[0] == 503 and err[1] == "file_changed", err
    return "error"


def others_fine(srv, files):
    assert requests.get(srv.url + "/healthz", timeout=5).status_code == 200
    m, err = query(srv, "other")
    assert err is None, err
    assert_same(m, files["O"])


def doc_file(srv):
    r = requests.get(srv.url + "/v1/datasets/victim", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["file"]


def wait_state(srv, want):
    deadline = time.time() + NOTICE_S
    while True:
        f = doc_file(srv)
        if f["state"] == want:
            return f
        assert time.time() < deadline, "the document still says %r, not %r" % (f, want)
        time.sleep(0.2)


def log_lines(srv, state):
    needle = "dataset victim: file %s" % state
    return [l for l in srv.log_text().splitlines() if needle in l]


# ---- the changes -----------------------------------------------------------

def cp_over(src, dst):
    """What cp does to an existing target: the same inode, truncated and
    written again."""
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        fo.truncate(0)
        shutil.copyfileobj(fi, fo)


def cp_keep_mtime(src, dst):
    """A same-size write that puts the modification time back (cp -p,
    touch -r, rsync -t): only the chunk checksums can see it."""
    st = os.stat(dst)
    assert os.path.getsize(src) == st.st_size
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        shutil.copyfileobj(fi, fo)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def truncate_half(src, dst):
    os.truncate(dst, os.path.getsize(dst) // 2)


def rename_over(src, dst):
    tmp = dst + ".new"
    shutil.copyfile(src, tmp)
    os.rename(tmp, dst)


def delete(src, dst):
    os.unlink(dst)


# name: (victim file, replacement, change, state noticed, the old file stays readable)
CASES = {
    "cp_same_size": ("A.raw", "B.raw", cp_over, "changed", False),
    "cp_other_size": ("A.zstd", "D.zstd", cp_over, "changed", False),
    "cp_same_size_mtime_kept": ("A.raw", "B.raw", cp_keep_mtime, "changed", False),
    "truncate": ("A.contig", None, truncate_half, "changed", False),
    "truncate_chunked": ("A.zstd", None, truncate_half, "changed", False),
    "rename_over": ("A.zstd", "D.zstd", rename_over, "replaced", True),
    "delete": ("A.zstd", None, delete, "deleted", True),
}


def start(tmp, files, case):
    victim_src, repl, change, state, keeps = CASES[case]
    victim = os.path.join(tmp, "victim.h5ad")
    shutil.copyfile(files[victim_src], victim)
    srv = Server(tmp, {"victim": victim, "other": files["O.zstd"]})
    return srv, victim, (files[repl] if repl else None), change, state, keeps


def finish(srv, state):
    # The document can say it first (another rendering of it, e.g. when the
    # other orientation's build ends); the log line follows within a tick.
    deadline = time.time() + NOTICE_S
    while not log_lines(srv, state) and time.time() < deadline:
        time.sleep(0.2)
    assert len(log_lines(srv, state)) == 1, srv.log_text()[-3000:]
    code = srv.stop()
    assert code == 0, "exit %s\n%s" % (code, srv.log_text()[-3000:])


@pytest.mark.parametrize("case", list(CASES))
def test_change_between_queries(tmp_path, files, case):
    srv, victim, repl, change, state, keeps = start(str(tmp_path), files, case)
    try:
        A = files["A"]
        assert doc_file(srv) == {"state": "ok"}
        assert old_or_clear_error(srv, A, None, must_answer=True) == "ok"
        change(repl, victim)
        rng = np.random.default_rng(7)
        seen = set()
        # Straight after the change (before the watcher looked): the whole
        # matrix and random rows, each the old data exactly or the error.
        for k in range(6):
            obs = None if k % 3 == 0 else rng.choice(N_ROWS, 200, replace=False)
            seen.add(old_or_clear_error(srv, A, obs, must_answer=keeps))
            others_fine(srv, files)
        if not keeps:
            # The matrix cannot be read in full any more, and every read
            # of the file says so: the whole matrix never answered.
            assert "error" in seen
        f = wait_state(srv, state)
        assert "victim.h5ad" in f["message"]
        if keeps:
            assert "still open" in f["message"]
            for _ in range(3):
                assert old_or_clear_error(srv, A, None, must_answer=True) == "ok"
        else:
            # Noticed: refused up front, every query alike, until reloaded.
            for obs in (None, [0], list(range(0, N_ROWS, 97))):
                m, err = query(srv, "victim", obs=obs)
                assert m is None and err[0] == 503 and err[1] == "file_changed", err
                assert "reload" in err[2]
                # The file by its name, not where the server keeps it.
                assert os.path.dirname(victim) not in err[2] and "victim.h5ad" in err[2], err
            r = requests.post(srv.url + "/v1/datasets/victim/count", json={}, timeout=5)
            assert r.status_code == 503 and r.json()["error"]["code"] == "file_changed"
        others_fine(srv, files)
    except BaseException:
        srv.stop()
        raise
    finish(srv, state)


def test_changed_file_is_named_without_its_folder(tmp_path, files):
    """A 503 file_changed and the dataset document name the file by its
    base name, never the folder it is served from (a folder name with
    spaces, which the generic path shortening would cut at the first
    one); the log keeps the whole path."""
    folder = tmp_path / "served data" / "lab one"
    folder.mkdir(parents=True)
    victim = str(folder / "victim.h5ad")
    shutil.copyfile(files["A.zstd"], victim)
    srv = Server(str(tmp_path), {"victim": victim, "other": files["O.zstd"]})
    try:
        assert old_or_clear_error(srv, files["A"], [0], must_answer=True) == "ok"
        cp_over(files["D.zstd"], victim)
        f = wait_state(srv, "changed")
        shown = [f["message"]]
        m, err = query(srv, "victim", obs=[0])
        assert m is None and err[:2] == (503, "file_changed"), err
        shown.append(err[2])
        r = requests.post(srv.url + "/v1/datasets/victim/count", json={}, timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "file_changed", r.text
        shown.append(r.json()["error"]["message"])
        for msg in shown:
            assert "victim.h5ad" in msg and "reload" in msg, msg
            for part in ("served data", "lab one", str(tmp_path)):
                assert part not in msg, (part, msg)
        # The access log keeps the whole path (the watcher's line may come
        # later: the document can say "changed" first, finish() waits).
        refused = [json.loads(ln) for ln in srv.log_text().splitlines()
                   if ln.startswith("{") and '"status":503' in ln and '"dataset":"victim"' in ln]
        assert refused and all(victim in j["error"] for j in refused), refused
    except BaseException:
        srv.stop()
        raise
    finish(srv, "changed")


# ---- during a stream ---------------------------------------------------------

def read_all(sock, timeout=60):
    sock.settimeout(timeout)
    buf = bytearray()
    while True:
        b = sock.recv(1 << 16)
        if not b:
            return bytes(buf)
        buf.extend(b)


def dechunk(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    out, pos = bytearray(), 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            break   # cut short: what arrived is checked as it is
        n = int(body[pos:eol].split(b";")[0], 16)
        if n == 0:
            break
        out.extend(body[eol + 2:eol + 2 + n])
        pos = eol + 2 + n + 2
    return status, bytes(out)


def check_ndjson(text, A):
    """Every block that arrived equals A's rows; returns the end line (or
    None when the stream was cut) and the number of rows checked."""
    rows, end = 0, None
    for line in text.splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        if o["type"] == "block":
            obs = np.array(o["obs"], np.int64)
            m = sp.csr_matrix((np.array(o["data"], np.float64), np.array(o["indices"], np.int64),
                               np.array(o["indptr"], np.int64)), shape=(len(obs), N_COLS))
            assert_same(m, A[obs])
            rows += len(obs)
        elif o["type"] == "end":
            end = o
    return end, rows


@pytest.mark.parametrize("case", list(CASES))
def test_change_during_stream(tmp_path, files, case):
    srv, victim, repl, change, state, keeps = start(str(tmp_path), files, case)
    try:
        stream_case(srv, files, victim, repl, change, state, keeps)
    except BaseException:
        srv.stop()
        raise
    finish(srv, state)


def stream_case(srv, files, victim, repl, change, state, keeps):
    A = files["A"]
    req = ("GET /v1/datasets/victim/query HTTP/1.1\r\nHost: x\r\n"
           "Accept: application/x-ndjson\r\nConnection: close\r\n\r\n").encode()
    s = socket.socket()
    # A slow reader: a small receive window, read only a little at first.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(req)
    first = s.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first[:200]
    time.sleep(0.5)   # the server fills what it may send, then waits
    change(repl, victim)
    # The server stays up and other clients are served meanwhile.
    others_fine(srv, files)
    raw = first + read_all(s)
    s.close()
    status, body = dechunk(raw)
    assert status == 200
    end, rows = check_ndjson(body.decode(), A)
    assert end is not None, "the stream was cut without an end line"
    if keeps:
        assert end["status"] == "ok" and rows == N_ROWS, end
    else:
        # The rest of the matrix had to be read from the changed file.
        assert end["status"] != "ok", end
        assert end["error"]["code"] == "file_changed", end
        # A 5xx names no folder of the server's (the log has the path).
        assert os.path.dirname(victim) not in end["error"]["message"], end
        assert rows < N_ROWS
    wait_state(srv, state)
    others_fine(srv, files)
