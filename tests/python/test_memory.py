"""Memory: one decompressed-chunk cache budget for the whole process, and
each dataset's memory reported by part in its document and in /metrics.

The budget test serves twelve ids of one generated file (symbolic links)
whose packed stream is about 16 MB, so that the twelve caches would hold
about 190 MB without a shared budget, under a 64 MiB budget; every
dataset must still answer exactly, the caches must add up to at most the
budget, and the process's anonymous resident memory must stay below the
budget plus the parts reported as fixed, plus an allowance named below.
"""
import json
import os
import re
import sys
import time

import numpy as np
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
import ivclient  # noqa: E402
import ivref  # noqa: E402
from ivprocess import ServerProcess, write_config  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN")
FIX = os.environ.get("IV_FIXTURES", os.path.join(HERE, "..", "..", "..", "shared", "fixtures"))
MIB = 1 << 20
N_COPIES = 12
BUDGET = 64 * MIB
PARTS = ["pointers", "values", "index", "cache", "stream", "other_orientation", "scratch",
         "metadata", "obsm", "search"]
# Not part of the cache: what a dataset holds whatever the budget.
FIXED = [p for p in PARTS if p != "cache"]


def sanitized():
    """Whether the binary is built with a sanitizer: its resident memory then
    holds shadow memory and freed blocks in quarantine, and chunk buffers
    come from malloc instead of the arena, so a bound on it says nothing."""
    with open(BIN, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


class Server(ServerProcess):
    """ivserve with cfg, 2 workers; ready once no dataset is still loading."""

    def __init__(self, tmp, cfg, timeout=120):
        super().__init__(tmp, ["--config", write_config(tmp, cfg), "--threads", "2"],
                         ready_timeout=timeout, stop_timeout=30,
                         ready=lambda s: s.metric("ivserve_datasets", 'state="loading"') == 0)

    def metrics(self):
        r = requests.get(self.url + "/metrics", timeout=10)
        assert r.status_code == 200
        return r.text

    def metric(self, name, labels=""):
        for line in self.metrics().splitlines():
            if line.startswith(name) and labels in line and not line.startswith("#"):
                head, _, val = line.rpartition(" ")
                if head == name or head.startswith(name + "{"):
                    return float(val)
        return None

    def mem_parts(self):
        """{dataset: {part: bytes}} from /metrics."""
        out = {}
        for m in re.finditer(r'^ivserve_dataset_memory_bytes\{dataset="([^"]+)",part="([^"]+)"\} (\d+)$',
                             self.metrics(), re.M):
            out.setdefault(m.group(1), {})[m.group(2)] = int(m.group(3))
        return out

    def doc(self, ds):
        r = requests.get("%s/v1/datasets/%s" % (self.url, ds), timeout=10)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    """A 8000 x 4000 float32 matrix, half its entries stored (packed stream
    about 16 MB, zstd chunks of 256 KiB), and twelve links to it."""
    d = tmp_path_factory.mktemp("mem")
    rng = np.random.default_rng(14)
    n_rows, n_cols = 8000, 4000
    dense = np.where(rng.random((n_rows, n_cols)) < 0.5,
                     rng.integers(1, 9, (n_rows, n_cols)), 0).astype(np.float32)
    X = sp.csr_matrix(dense)
    del dense
    path = str(d / "atlas.h5ad")
    enc = ivref.write_iv(path, X, compression="zstd", chunk_len=256 << 10)
    links = []
    for i in range(N_COPIES):
        p = str(d / ("copy%02d.h5ad" % i))
        os.symlink(path, p)
        links.append(p)
    return {"dir": str(d), "X": X, "links": links, "stream": len(enc["packed"]),
            "n_unique": len(enc["values"])}


def copies_cfg(atlas, cache_bytes, ds_extra=None):
    ds = []
    for i, p in enumerate(atlas["links"]):
        e = {"id": "copy%02d" % i, "path": p}
        e.update((ds_extra or {}).get(i, {}))
        ds.append(e)
    # No gene-major copies: this test is about the cache (they are
    # reported, and tested, below).
    return {"datasets": ds, "cache_bytes": cache_bytes, "transpose_bytes": 0}


def check_answers(srv, atlas, seed):
    """Every dataset answers random cell selections exactly."""
    X = atlas["X"]
    rng = np.random.default_rng(seed)
    c = ivclient.Client(srv.url)
    for i in range(N_COPIES):
        obs = np.sort(rng.choice(X.shape[0], 400, replace=False))
        var = rng.choice(X.shape[1], 300, replace=False)
        res = c.query("copy%02d" % i, obs=obs.tolist(), var=var.tolist(), names=False)
        exp = X[obs, :][:, var]
        got = sp.csr_matrix(res.matrix)
        assert got.shape == exp.shape
        assert (got != exp).nnz == 0, "copy%02d differs" % i


def test_twelve_copies_stay_within_one_budget(atlas, tmp_path):
    assert atlas["stream"] * N_COPIES > 2.5 * BUDGET  # the budget binds
    cfg = copies_cfg(atlas, BUDGET, {0: {"cache_floor_bytes": 8 * MIB},
                                     1: {"cache_bytes": 2 * MIB}})
    srv = Server(str(tmp_path), cfg)
    try:
        check_answers(srv, atlas, 1)
        check_answers(srv, atlas, 2)
        assert srv.metric("ivserve_cache_budget_bytes") == BUDGET
        parts = srv.mem_parts()
        assert sorted(parts) == ["copy%02d" % i for i in range(N_COPIES)]
        cache = sum(p["cache"] for p in parts.values())
        # Nothing is pinned between requests: the caches are within the
        # budget, and the budget is used (every copy was just read).
        assert cache <= BUDGET
        assert cache >= BUDGET - 2 * (256 << 10) * N_COPIES
        assert parts["copy01"]["cache"] <= 2 * MIB
        assert parts["copy00"]["cache"] >= 8 * MIB
        d0, d1 = srv.doc("copy00")["memory"], srv.doc("copy01")["memory"]
        assert d0["cache_floor"] == 8 * MIB and d0["cache_cap"] is None
        assert d1["cache_cap"] == 2 * MIB and d1["cache_budget"] == BUDGET
        assert srv.metric("ivserve_cache_budget_evictions_total") is not None
        # Anonymous memory: the budget, the fixed parts, the process's own
        # (measured below on a server of one tiny dataset and no cache),
        # and per dataset up to 4 MiB: the two free chunk slots its arena
        # keeps and the unused rest of the 2 MiB transparent huge pages at
        # the ends of the arena range in use.  Without the shared budget
        # the twelve caches alone would be about 190 MB.
        fixed = sum(p[k] for p in parts.values() for k in FIXED)
        anon = srv.status_kb("RssAnon") * 1024
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
    base = Server(str(tmp_path), {"datasets": [{"id": "t", "path": atlas["links"][0],
                                                "cache_bytes": 0}],
                                  "cache_bytes": 0, "transpose_bytes": 0})
    try:
        check_base = base.status_kb("RssAnon") * 1024
        base_fixed = sum(base.mem_parts()["t"][k] for k in FIXED)
    finally:
        assert base.stop() == 0
    process_own = check_base - base_fixed
    bound = BUDGET + fixed + process_own + N_COPIES * 4 * MIB
    print("anonymous %d bytes: budget %d, fixed %d, process %d, bound %d"
          % (anon, BUDGET, fixed, process_own, bound))
    if sanitized():
        print("NOTE: sanitizer build: the bound on anonymous memory is not checked "
              "(the caches' accounting above is)")
        return
    assert anon <= bound
    assert anon < atlas["stream"] * N_COPIES  # what the old per-dataset caches took


def test_cutting_the_budget_shrinks_the_caches(atlas, tmp_path):
    small = 8 * MIB
    srv = Server(str(tmp_path), copies_cfg(atlas, small))
    try:
        check_answers(srv, atlas, 3)
        parts = srv.mem_parts()
        assert srv.metric("ivserve_cache_budget_bytes") == small
        assert sum(p["cache"] for p in parts.values()) <= small
        for i in range(N_COPIES):
            m = srv.doc("copy%02d" % i)["memory"]
            assert m["cache"] <= small and m["cache_budget"] == small
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]


def test_default_budget_is_half_of_available_memory(atlas, tmp_path):
    srv = Server(str(tmp_path), {"datasets": [{"id": "a", "path": atlas["links"][0]}],
                                 "transpose_bytes": 0})
    try:
        budget = srv.metric("ivserve_cache_budget_bytes")
        m = re.search(r"cache budget (\d+) bytes: 50% of (\d+) bytes available \((meminfo|cgroup)\)",
                      srv.log_text())
        assert m, srv.log_text()[-2000:]
        assert int(m.group(1)) == budget
        assert abs(int(m.group(1)) - int(m.group(2)) // 2) <= 1
        with open("/proc/meminfo") as f:
            avail = int(re.search(r"MemAvailable:\s+(\d+)", f.read()).group(1)) * 1024
        # Read at start; the machine's free memory moves meanwhile.
        assert 0.25 * avail <= budget <= 0.75 * avail
        # The whole stream fits: after the start-up pass it is all cached.
        assert srv.doc("a")["memory"]["cache"] == atlas["stream"]
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]


def test_parts_are_present_and_plausible(tmp_path):
    if not os.path.isdir(FIX):
        pytest.skip("fixtures folder %s is absent" % FIX)
    manifest = {m["file"]: m for m in json.load(open(os.path.join(FIX, "manifest.json")))}
    names = ["chunky.ivcsr.zstd.h5ad", "wide.ivcsr.blosc2-lz4.h5ad", "tiny.ivcsr.raw.h5ad"]
    cfg = {"datasets": [{"id": n[:-5], "path": os.path.join(FIX, n)} for n in names]}
    srv = Server(str(tmp_path), cfg)
    try:
        # Wait for the gene-major copies (built after load).
        deadline = time.time() + 60
        while time.time() < deadline:
            docs = {n[:-5]: srv.doc(n[:-5]) for n in names}
            # Final states only: before its build starts a copy is "none"
            # (slow under the sanitizers).
            if all(d["orientations"]["genes"]["state"] in ("ready", "skipped", "failed")
                   for d in docs.values()):
                break
            time.sleep(0.2)
        parts = srv.mem_parts()
        total = 0
        for n in names:
            m, d = manifest[n], docs[n[:-5]]
            mem = d["memory"]
            assert set(PARTS) <= set(mem), mem
            assert mem["total"] == sum(mem[p] for p in PARTS)
            # Document and /metrics agree on the parts that do not move.
            for p in FIXED:
                if p != "search":   # built on first use
                    assert parts[n[:-5]][p] == mem[p], p
            n_major = m["shape"][0]
            assert mem["pointers"] == (n_major + 1) * 8 + (m["n_unique"] + 1) * 8
            assert mem["values"] == m["n_unique"] * np.dtype(d["dtype"]).itemsize
            assert mem["index"] > 0
            assert mem["cache"] + mem["stream"] <= m["packed_bytes"]
            if m["codec"] == "raw":
                # Contiguous and uncompressed: read with pread in 1 MiB
                # pieces that go through the cache (no file mapping), so
                # nothing is held outside it.
                assert mem["stream"] == 0
            else:
                assert mem["cache"] > 0   # the start-up pass left it cached
            assert mem["metadata"] > 0
            genes = d["orientations"]["genes"]
            if genes["state"] == "ready":
                assert mem["other_orientation"] == genes["bytes"] > 0
            else:
                assert mem["other_orientation"] == 0
            total += mem["total"]
        assert any(docs[n[:-5]]["orientations"]["genes"]["state"] == "ready" for n in names)
        rss = srv.metric("ivserve_process_resident_bytes", 'kind="all"')
        anon = srv.metric("ivserve_process_resident_bytes", 'kind="anonymous"')
        assert 0 < anon <= rss
        lazy = srv.metric("ivserve_process_resident_bytes", 'kind="lazy_free"')
        assert lazy is not None and 0 <= lazy <= rss
        # Everything reported is memory the process holds.
        assert total <= anon or sanitized()
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]


def test_doc_etag_follows_the_memory(tmp_path, atlas):
    srv = Server(str(tmp_path), copies_cfg(atlas, 4 * MIB))
    try:
        c = ivclient.Client(srv.url)
        # Reading all of copy05 fills the 4 MiB budget with its chunks.
        c.query("copy05", obs=list(range(0, 8000, 3)), var=[0], names=False)
        r1 = requests.get(srv.url + "/v1/datasets/copy03", timeout=10)
        assert r1.json()["memory"]["cache"] == 0
        etag = r1.headers["ETag"]
        assert requests.get(srv.url + "/v1/datasets/copy03", headers={"If-None-Match": etag},
                            timeout=10).status_code == 304
        # Reading copy03 moves the budget to it: its document changes, and
        # the old ETag no longer matches.
        c.query("copy03", obs=list(range(0, 8000, 7)), var=[0], names=False)
        r2 = requests.get(srv.url + "/v1/datasets/copy03", headers={"If-None-Match": etag},
                          timeout=10)
        assert r2.status_code == 200 and r2.headers["ETag"] != etag
        assert r2.json()["memory"]["cache"] > 0
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
