"""obs/var metadata kept in the cache folder (core/meta/metafile.h, issue
24): a start with --cache-dir keeps the HDF5 reader's answer for obs and
var beside the kept row index (STEM-KEY.X.meta); a restart maps it instead
of reading HDF5 again and answers every metadata route byte for byte as
the first start did, and as anndata reads the file.  A kept file that is
truncated, has a flipped byte, is of another format or was made for
another file is passed over, the log says why, and the metadata is read
from the file again (and kept again).

The obs names' lookups are built after the dataset is ready (a warm job),
so the first query by a cell's name right after ready must still answer
exactly.

The server keeps these for large streams only (64 MiB); IVSERVE_KEEP_MIN_BYTES=0
keeps the bundled example's.
"""
import glob
import os
import shutil

import h5py
import pytest
import requests
from anndata._io.specs import read_elem

from test_disk_orientation import EXAMPLE, Server
from test_kept_arrays import flip_byte

DS = "pbmc"
KEPT = "metadata mapped from the cache folder"
FIRST = "metadata read and kept in the cache folder"


def get(srv, path, **params):
    r = requests.get(srv.url + "/v1/datasets/%s/%s" % (DS, path), params=params, timeout=30)
    assert r.status_code == 200, (path, r.text)
    return r.content


def post(srv, path, body, accept="application/json"):
    r = requests.post(srv.url + "/v1/datasets/%s/%s" % (DS, path), json=body,
                      headers={"Accept": accept}, timeout=30)
    assert r.status_code == 200, (path, r.text)
    return r.content


def answers(srv, names):
    """Every answer that reads the metadata: the tables, a column, rows by
    a selection, queries by names and by a filter, the searches, and the
    computed columns."""
    csr = "application/vnd.ivserve.csr"
    return [
        # The first: names looked up right after ready, while the warm job
        # may still be building the obs names' hash.
        post(srv, "query", {"obs": {"names": [names[5], names[0], names[5]]},
                            "var": {"names": ["CD3E", "IL7R"]}}, csr),
        get(srv, "obs", limit=100000),
        get(srv, "var", limit=100000),
        get(srv, "obs/cell_type", limit=100000, values="true"),
        get(srv, "obs/total_counts", limit=100000),
        post(srv, "obs", {"obs": {"index": [7, 0, 7, 1999]}}),
        post(srv, "query", {"obs": {"where": "cell_type in ['B', 'CD4 T'] and total_counts > 500"}},
             csr),
        post(srv, "query", {"obs": {"where": "n_genes >= 300 and not is_doublet"},
                            "var": {"where": "not mito"}}, csr),
        get(srv, "obs/search", q=names[3][:6], limit=50),
        get(srv, "var/search", q="CD", limit=50),
    ]


def run(tmp, src, cache, name, names):
    s = Server(tmp, [src, "--cache-dir", cache, "--other-orientation", "memory"], name=name)
    try:
        s.wait(lambda: s.datasets()[DS]["state"] == "ready", what="ready")
        got = answers(s, names)
    finally:
        assert s.stop() == 0
    return got, s.text()


def kept_file(cache):
    found = glob.glob(os.path.join(cache, DS + "-*.X.meta"))
    assert len(found) == 1, os.listdir(cache)
    return found[0]


@pytest.fixture
def started(tmp_path, monkeypatch):
    if not os.path.exists(EXAMPLE):
        pytest.fail("the bundled example %s is missing" % EXAMPLE)
    monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", "0")
    src = str(tmp_path / (DS + ".h5ad"))
    shutil.copy(EXAMPLE, src)
    with h5py.File(src, "r") as f:
        obs = read_elem(f["obs"])
    names = list(obs.index)
    cache = str(tmp_path / "cache")
    want, log = run(str(tmp_path), src, cache, "first", names)
    assert log.count(FIRST) == 1, log[-3000:]
    assert KEPT not in log
    return str(tmp_path), src, cache, want, obs


def test_first_start_answers_as_anndata_reads_the_file(started):
    _, _, _, want, obs = started
    import json
    cells = json.loads(want[3])
    assert cells["values"] == [str(v) for v in obs["cell_type"]], list(cells)
    totals = json.loads(want[4])
    assert totals["values"] == [int(v) for v in obs["total_counts"]], list(totals)


def test_restart_maps_the_kept_metadata_and_answers_the_same(started):
    tmp, src, cache, want, obs = started
    path = kept_file(cache)
    stamp = os.stat(path).st_mtime_ns
    got, log = run(tmp, src, cache, "again", list(obs.index))
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, "answer %d differs after the restart" % i
    assert log.count(KEPT) == 1, log[-3000:]
    assert os.stat(path).st_mtime_ns == stamp   # mapped, not written again


@pytest.mark.parametrize("damage,why", [
    (lambda p: os.truncate(p, os.path.getsize(p) - 8), "truncated"),
    (lambda p: flip_byte(p, os.path.getsize(p) - 3), "damaged (checksum)"),   # in var
    (lambda p: flip_byte(p, 400), "damaged (checksum)"),                      # in obs
    (lambda p: flip_byte(p, 0), "another format"),
    (lambda p: os.truncate(p, 100), "truncated"),
])
def test_damaged_kept_metadata_is_read_again(started, damage, why):
    tmp, src, cache, want, obs = started
    damage(kept_file(cache))
    got, log = run(tmp, src, cache, "damaged", list(obs.index))
    assert got == want
    assert log.count("metadata read (kept one %s) and kept again" % why) == 1, log[-3000:]
    # Kept again whole: the next start maps it.
    got, log = run(tmp, src, cache, "mended", list(obs.index))
    assert got == want
    assert log.count(KEPT) == 1, log[-3000:]


def test_kept_metadata_of_another_file_is_not_taken(started):
    tmp, src, cache, want, obs = started
    path = kept_file(cache)
    with open(path, "rb") as f:
        old = f.read()
    # Touched: a new modification time, so a new key and a new kept file.
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    got, log = run(tmp, src, cache, "touched", list(obs.index))
    assert got == want
    fresh = [p for p in glob.glob(os.path.join(cache, DS + "-*.X.meta")) if p != path]
    assert len(fresh) == 1, os.listdir(cache)
    # The old file's answer under the new key: its header names another file.
    with open(fresh[0], "wb") as f:
        f.write(old)
    got, log = run(tmp, src, cache, "other", list(obs.index))
    assert got == want
    assert "metadata read (kept one made for another file or matrix) and kept again" in log, \
        log[-3000:]
