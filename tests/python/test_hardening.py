"""Hardening: no request of at most 8 MB, on any route, makes the server
hold more than a bounded amount of memory, however its index lists
repeat an element.

Each request below names a result that duplicates make huge from a small
body (one gene listed 500,000 times, one cell 4,000,000 times).  The
answer is either exact (streamed in bounded blocks, or computed over the
distinct elements and repeated) or a 413 naming max_answer_bytes, and the
server's peak resident memory while it runs (VmHWM, reset before each
request through /proc/PID/clear_refs) grows by at most GROWTH plus the
write budget the test sets, plus PER_INDEX bytes for each index the body
lists: the parsed JSON holds 64 bytes a number (cJSON's node) and the
selection itself a few copies of 8 bytes an index, whatever the answer.  Under a sanitizer the resident figures say
nothing (shadow memory, quarantine), so there only the answers are
checked.  Dense gene rows cost their size in CPU whatever is stored, so
a dense answer past max_answer_bytes and larger than the whole matrix
dense must be refused within seconds, and one within either is exact.
"""
import json
import os
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import viewerdata  # noqa: E402
from ivprocess import ServerProcess, listening_port, write_config  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN")
MIB = 1 << 20
N_CELLS = 2000
N_GENES = 60
WRITE_BUDGET = 16 * MIB
GROWTH = 64 * MIB
PER_INDEX = 96


def sanitized():
    with open(BIN, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("hard"))
    path = os.path.join(tmp, "hard.h5ad")
    X, obs, _ = viewerdata.make_dataset(path, n_cells=N_CELLS, n_genes=N_GENES)
    pca = np.random.default_rng(3).standard_normal((N_CELLS, 50)).astype(np.float32)
    with h5py.File(path, "a") as f:
        d = f["obsm"].create_dataset("X_pca", data=pca)
        d.attrs["encoding-type"] = "array"
        d.attrs["encoding-version"] = "0.2.0"
    cfg = {"datasets": [{"id": "hard", "path": path}],
           "limits": {"write_budget_bytes": WRITE_BUDGET}}
    srv = ServerProcess(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"],
                        ready_timeout=60, stop_timeout=30)
    # The gene-major copy: the transposed paths need it.
    deadline = time.time() + 60
    while time.time() < deadline:
        doc = requests.get(srv.url + "/v1/datasets/hard", timeout=10).json()
        if doc["orientations"]["genes"]["state"] == "ready":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("gene-major copy never ready: %s" % doc)
    yield srv, X, obs, pca
    srv.stop()


def reset_peak(srv):
    with open("/proc/%d/clear_refs" % srv.proc.pid, "w") as f:
        f.write("5")
    return srv.status_kb("VmRSS") * 1024


def growth(srv, base):
    return srv.status_kb("VmHWM") * 1024 - base


def check_growth(srv, base, what, n_indices):
    if sanitized():
        return
    g = growth(srv, base)
    bound = GROWTH + WRITE_BUDGET + PER_INDEX * n_indices
    assert g <= bound, "%s: peak resident memory grew %.1f MB (bound %.1f MB)" % (
        what, g / MIB, bound / MIB)


def post(srv, route, body, **kw):
    data = json.dumps(body, separators=(",", ":"))
    assert len(data) <= 8 * MIB, len(data)
    return requests.post("%s/v1/datasets/hard/%s" % (srv.url, route), data=data,
                         headers={"Content-Type": "application/json"}, timeout=300, **kw)


def test_count_of_a_gene_listed_500000_times(env):
    srv, X, _, _ = env
    n = 500_000
    base = reset_peak(srv)
    r = post(srv, "count", {"var": {"index": [0] * n}})
    assert r.status_code == 200, r.text
    assert r.json()["nnz"] == X[:, 0].nnz * n
    check_growth(srv, base, "count", n)


def test_count_by_cell_through_the_gene_major_copy(env):
    # A cell repeated as rows, with few genes: the planner turns the
    # gene-major copy around, over the distinct cells only.
    srv, X, _, _ = env
    n = 1_000_000
    base = reset_peak(srv)
    r = post(srv, "count", {"obs": {"index": [7] * n}, "var": {"index": [0, 1]}})
    assert r.status_code == 200, r.text
    assert r.json()["nnz"] == X[7, :2].nnz * n
    check_growth(srv, base, "count by cell", n)


def test_streamed_query_of_one_gene_listed_500000_times(env):
    # The answer is ~1 GB; read and count it as it streams.
    srv, X, _, _ = env
    n = 500_000
    base = reset_peak(srv)
    r = post(srv, "query", {"var": {"index": [0] * n}, "format": "binary"}, stream=True)
    assert r.status_code == 200, r.text
    got = 0
    for chunk in r.iter_content(1 << 20):
        got += len(chunk)
    # Every stored value of gene 0, n times: an int32 index and an int32 value each.
    assert got >= X[:, 0].nnz * n * 8
    check_growth(srv, base, "query", n)


def test_unread_queries_hold_no_more_than_the_write_budget(env):
    # Two clients ask for the ~1 GB answer and never read it.
    srv, _, _, _ = env
    body = json.dumps({"var": {"index": [0] * 500_000}, "format": "binary"}, separators=(",", ":")).encode()
    base = reset_peak(srv)
    socks = []
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"POST /v1/datasets/hard/query HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
    time.sleep(3)
    check_growth(srv, base, "unread queries", 2 * 500_000)
    for s in socks:
        s.close()
    # The server is still answering.
    assert requests.get(srv.url + "/v1/datasets/hard/query?obs=0:5&var=0:3&format=json",
                        timeout=30).status_code == 200


def test_embedding_of_a_cell_listed_4000000_times_is_refused(env):
    srv, _, _, pca = env
    base = reset_peak(srv)
    r = post(srv, "obsm/X_pca", {"obs": {"index": [0] * 4_000_000}, "format": "binary"})
    assert r.status_code == 413, r.text[:300]
    assert "max_answer_bytes" in r.text
    check_growth(srv, base, "obsm", 4_000_000)
    # A selection no larger than the array is served, duplicates kept.
    sel = [5, 5, 1999, 0] * 500
    r = post(srv, "obsm/X_pca", {"obs": {"index": sel}, "format": "json"})
    assert r.status_code == 200, r.text[:300]
    assert np.array_equal(np.array(r.json()["values"], dtype=np.float32), pca[sel])


def test_aggregate_of_a_gene_listed_1000000_times(env):
    srv, X, obs, _ = env
    base = reset_peak(srv)
    r = post(srv, "aggregate", {"var": {"index": [0] * 1_000_000}, "group_by": "cell_type",
                                "stats": ["mean"], "format": "binary"})
    assert r.status_code == 413, r.text[:300]
    assert "max_answer_bytes" in r.text
    check_growth(srv, base, "aggregate", 1_000_000)
    # A few repeats are answered, each repeat the gene's own figures.
    genes = [3, 0, 3, 3, 59]
    r = post(srv, "aggregate", {"var": {"index": genes}, "group_by": "cell_type", "stats": ["sum"]})
    assert r.status_code == 200, r.text[:300]
    doc = r.json()
    assert [g["index"] for g in doc["genes"]] == genes
    codes = obs["cell_type"].cat.codes.to_numpy()
    dense = X.toarray()
    for gi, g in enumerate(doc["groups"]):
        k = list(obs["cell_type"].cat.categories).index(g["key"][0])
        want = dense[codes == k][:, genes].sum(axis=0)
        assert np.array_equal(np.array(doc["values"]["sum"][gi]), want)


# ---------------------------------------------------------------- dense answers

def dense_rows(r):
    """(var ids, genes x cells int array) of a dense by-var answer, NDJSON
    or binary (int32 values), checked to end well."""
    if r.headers["Content-Type"].startswith("application/x-ndjson"):
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert lines[0]["dense"] is True and lines[-1]["status"] == "ok", lines[-1]
        var = [v for b in lines[1:-1] for v in b["var"]]
        data = [row for b in lines[1:-1] for row in b["data"]]
        return var, np.array(data, dtype=np.int64).reshape(len(var), lines[0]["shape"][0])
    body = r.content
    assert body[:4] == b"IVQS"
    cells = int(np.frombuffer(body, "<i8", 1, 8)[0])
    pos, var, rows = 40, [], []
    while True:
        kind = int(np.frombuffer(body, "<u4", 1, pos)[0])
        n, m = np.frombuffer(body, "<i8", 2, pos + 8).tolist()
        pos += 24
        if kind == 2:
            break
        assert kind == 4 and m == cells
        var += np.frombuffer(body, "<i8", n, pos).tolist()
        pos += 8 * n
        rows.append(np.frombuffer(body, "<i4", n * cells, pos).reshape(n, cells))
        pos += 4 * n * cells
    assert np.frombuffer(body, "<u4", 1, pos - 20)[0] == 0, "error trailer"
    return var, np.concatenate(rows).astype(np.int64)


def test_dense_answer_of_a_gene_listed_200000_times_is_refused_at_once(env):
    # 0.4 MB of body, 800 MB of NDJSON zeros and numbers: refused before
    # any decode or encode, in every encoding.
    srv, X, _, _ = env
    n = 200_000
    for fmt in ("ndjson", "binary", "json"):
        base = reset_peak(srv)
        t0 = time.time()
        r = post(srv, "query", {"var": {"index": [0] * n}, "dense": True, "format": fmt})
        took = time.time() - t0
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"]["code"] == "too_large"
        assert "max_answer_bytes" in r.text and str(64 * MIB) in r.text, r.text
        assert took < 3, "%s: refused after %.2f s" % (fmt, took)
        check_growth(srv, base, "dense " + fmt, n)
    # Under the limit, duplicates kept: exact.
    genes = [0, 5, 0, 59, 7] * 80
    for fmt in ("ndjson", "binary"):
        r = post(srv, "query", {"var": {"index": genes}, "obs": {"range": [100, 1900]},
                                "dense": True, "format": fmt})
        assert r.status_code == 200, r.text[:300]
        var, got = dense_rows(r)
        assert var == genes
        assert np.array_equal(got, X[100:1900][:, genes].toarray().T)


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory):
    """A 1,000 x 40 int32 dataset served with max_answer_bytes at its
    least (64 KiB): its whole matrix dense takes 80,000 bytes of NDJSON at
    two bytes a value, 160,000 in binary."""
    tmp = str(tmp_path_factory.mktemp("dense"))
    path = os.path.join(tmp, "dense.h5ad")
    X, _, _ = viewerdata.make_dataset(path, n_cells=1000, n_genes=40, seed=9)
    cfg = {"datasets": [{"id": "hard", "path": path}], "limits": {"max_answer_bytes": 65536}}
    srv = ServerProcess(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"],
                        ready_timeout=60, stop_timeout=30)
    deadline = time.time() + 60
    while requests.get(srv.url + "/v1/datasets/hard", timeout=10).json()[
            "orientations"]["genes"]["state"] != "ready":
        assert time.time() < deadline, "gene-major copy never ready"
        time.sleep(0.1)
    yield srv, X
    srv.stop()


def test_dense_answer_past_the_limit_but_within_the_whole_matrix_is_served(small_limit):
    srv, X = small_limit
    every = list(range(40))
    for fmt, per in (("ndjson", 2), ("binary", 4)):
        # Every gene once: past 64 KiB, but the whole matrix's own size.
        assert 40 * 1000 * per > 65536
        r = post(srv, "query", {"var": {"index": every[::-1]}, "dense": True, "format": fmt})
        assert r.status_code == 200, r.text[:300]
        var, got = dense_rows(r)
        assert var == every[::-1] and np.array_equal(got, X[:, every[::-1]].toarray().T)
        # One gene more than the matrix has: refused, the figures named.
        r = post(srv, "query", {"var": {"index": every + [3]}, "dense": True, "format": fmt})
        assert r.status_code == 413, r.text[:300]
        assert "41 genes x 1000 cells" in r.text and str(41 * 1000 * per) in r.text
        assert "65536" in r.text and "max_answer_bytes" in r.text
        # The same selection as sparse gene rows streams as before.
        r = post(srv, "query", {"var": {"index": every + [3]}, "by": "var", "format": fmt})
        assert r.status_code == 200, r.text[:300]
    # Duplicates under the limit: 30 genes x 1,000 cells x 2 bytes.
    genes = [3, 3, 0, 39] * 7 + [1, 1]
    r = post(srv, "query", {"var": {"index": genes}, "dense": True, "format": "ndjson"})
    assert r.status_code == 200, r.text[:300]
    var, got = dense_rows(r)
    assert var == genes and np.array_equal(got, X[:, genes].toarray().T)
    # A count is no dense answer.
    r = post(srv, "count", {"var": {"index": [0] * 100_000}, "dense": True})
    assert r.status_code == 200, r.text[:300]


# ---------------------------------------------------------------- cancellation

@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    """A larger dataset whose aggregates over a long cell list take
    seconds, served with a short shutdown grace."""
    tmp = str(tmp_path_factory.mktemp("heavy"))
    path = os.path.join(tmp, "heavy.h5ad")
    X, obs, _ = viewerdata.make_dataset(path, n_cells=100_000, n_genes=200, seed=5)
    cfg = {"datasets": [{"id": "heavy", "path": path}],
           "limits": {"shutdown_grace_ms": 2000}}
    srv = ServerProcess(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"],
                        ready_timeout=120, stop_timeout=30)
    yield srv, X
    srv.stop()


def heavy_body(seed):
    cells = np.random.default_rng(seed).integers(0, 100_000, 1_200_000).tolist()
    return json.dumps({"obs": {"index": cells}, "group_by": "cell_type",
                       "stats": ["mean", "var", "max"], "format": "binary"},
                      separators=(",", ":")).encode()


def send_and_leave(port, path, body):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body)
    return s


def test_abandoned_aggregates_stop_and_shutdown_keeps_its_grace(heavy):
    srv, X = heavy
    url = srv.url + "/v1/datasets/heavy/aggregate"
    body = heavy_body(1)
    # One aggregate answered whole, for its duration.
    t0 = time.time()
    r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=300)
    full = time.time() - t0
    assert r.status_code == 200, r.text[:300]
    assert full >= 0.3, "the aggregate took %.2f s: too light to show anything" % full
    # Three clients send it and leave at once.
    socks = [send_and_leave(srv.port, "/v1/datasets/heavy/aggregate", heavy_body(s)) for s in (2, 3, 4)]
    time.sleep(0.3)
    for s in socks:
        s.close()
    time.sleep(0.3)
    t0 = time.time()
    r = requests.get(srv.url + "/v1/datasets/heavy/query?obs=0:5&var=0:20&format=json", timeout=60)
    took = time.time() - t0
    assert r.status_code == 200
    assert np.array_equal(np.array(r.json()["indptr"]), X[0:5, 0:20].indptr)
    # The latency is a release-build goal: under a sanitizer each
    # abandoned request's JSON parse (8 MB, not cancellable once begun)
    # takes seconds, the computation it would cancel being no longer.
    if not sanitized():
        assert took <= 0.1 + 0.02 * full, "a 5-cell query behind abandoned aggregates took %.3f s" % took
    # Work cancelled shows in the metrics.
    m = requests.get(srv.url + "/metrics", timeout=10).text
    assert "ivserve_jobs_cancelled_total" in m
    # Aggregates in flight at SIGTERM: the server exits within its grace.
    socks = [send_and_leave(srv.port, "/v1/datasets/heavy/aggregate", heavy_body(s)) for s in (5, 6, 7)]
    time.sleep(0.3)
    t0 = time.time()
    rc = srv.stop()
    took = time.time() - t0
    for s in socks:
        s.close()
    assert rc == 0, srv.log_text()[-2000:]
    # Under a sanitizer the requests' parses in flight (see above) may
    # outlast the grace by their length.
    assert took <= 2.0 + (6.0 if sanitized() else 1.0), "SIGTERM took %.1f s against a 2 s grace" % took


# ---------------------------------------------------------------- names of protected datasets

def protected_setup(tmp, readyz):
    path = os.path.join(tmp, "small.h5ad")
    viewerdata.make_dataset(path, n_cells=300, n_genes=20)
    broken = os.path.join(tmp, "broken.h5ad")
    with open(broken, "wb") as f:
        f.write(b"not an hdf5 file" * 64)
    return {"readyz": readyz,
            "datasets": [{"id": "openatlas", "path": path},
                         {"id": "secretatlas", "path": path, "tokens": ["s3cret"]},
                         {"id": "hiddenbroken", "path": broken, "tokens": ["s3cret"]},
                         {"id": "openbroken", "path": broken}]}


def test_protected_ids_stay_out_of_metrics(tmp_path):
    tmp = str(tmp_path)
    cfg = protected_setup(tmp, "any")
    srv = ServerProcess(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"], ready_timeout=60)
    try:
        # Every dataset settled: two failed and two loaded (with readyz
        # "any" the server is ready after the first, and a slow build may
        # see the broken ones fail before the good ones load).
        deadline = time.time() + 60
        while time.time() < deadline:
            text = requests.get(srv.url + "/metrics").text
            if 'ivserve_datasets{state="failed"} 2' in text and 'ivserve_datasets{state="ready"} 2' in text:
                break
            time.sleep(0.05)
        anon = requests.get(srv.url + "/metrics", timeout=10)
        assert anon.status_code == 200
        assert 'dataset="openatlas"' in anon.text
        assert "secretatlas" not in anon.text and "hiddenbroken" not in anon.text
        # The server-wide gauges still count every dataset.
        assert 'ivserve_datasets{state="ready"} 2' in anon.text
        assert 'ivserve_datasets{state="failed"} 2' in anon.text
        tok = requests.get(srv.url + "/metrics", headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert 'dataset="secretatlas"' in tok.text
    finally:
        srv.stop()


def test_protected_ids_stay_out_of_readyz(tmp_path):
    # Under "all" the server stays unready and /readyz names what is not
    # ready: only the datasets the client may know.
    tmp = str(tmp_path)
    cfg = protected_setup(tmp, "all")
    log = open(os.path.join(tmp, "log.txt"), "a+")
    proc = subprocess.Popen([BIN, "--config", write_config(tmp, cfg), "--threads", "2", "--port", "0"],
                            stdout=log, stderr=log)
    try:
        url = "http://127.0.0.1:%d/readyz" % listening_port(log.name, proc)
        deadline = time.time() + 30
        r = requests.get(url, timeout=10)
        # Settled: both broken datasets failed and both good ones loaded
        # (the protected good one may load after the broken ones fail).
        while time.time() < deadline and not ("failed: " in r.text and "2 of 4 datasets ready" in r.text):
            time.sleep(0.05)
            r = requests.get(url, timeout=10)
        assert r.status_code == 503
        assert "openbroken" in r.text and "hiddenbroken" not in r.text, r.text
        assert "1 protected not named" in r.text, r.text
        r = requests.get(url, headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert "hiddenbroken" in r.text, r.text
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


# ---------------------------------------------------------------- writers never replace their input

def test_export_and_pack_refuse_to_write_over_their_input(tmp_path):
    import hashlib
    tmp = str(tmp_path)
    path = os.path.join(tmp, "in.h5ad")
    viewerdata.make_dataset(path, n_cells=200, n_genes=20)
    link = os.path.join(tmp, "link.h5ad")
    os.symlink(path, link)
    hard = os.path.join(tmp, "hard.h5ad")
    os.link(path, hard)

    def digest():
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    before = digest()
    for cmd in ([BIN, "export", path, "--obs", "0:5", "-o", path],
                [BIN, "export", path, "--obs", "0:5", "-o", link],
                [BIN, "export", link, "--obs", "0:5", "-o", hard],
                [BIN, "pack", path, path, "--quiet"],
                [BIN, "pack", link, hard, "--quiet"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, (cmd, p.returncode, p.stderr)
        assert "the output is the input" in p.stderr, p.stderr
        assert digest() == before, cmd
    assert sorted(os.listdir(tmp)) == ["hard.h5ad", "in.h5ad", "link.h5ad"]
    # Another output is written as before.
    out = os.path.join(tmp, "out.h5ad")
    p = subprocess.run([BIN, "export", link, "--obs", "0:5", "-o", out], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    with h5py.File(out, "r") as f:
        assert f["X"].attrs["shape"][0] == 5
