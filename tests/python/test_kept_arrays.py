"""Pointer arrays kept in the cache folder (core/matrix/indexfile.h,
issue 24): a start with --cache-dir keeps major_ptr, value_ptr and values
of the file and of its gene-major copy beside the kept row index
(STEM-KEY.GROUP.arrays); a restart maps them instead of reading them
through the HDF5 reader process and serves byte-identical answers, cells
and genes.  A kept file that is truncated, has a flipped byte or was made
for another file is ignored, the log says why, and the arrays are read
as before (then kept again).

The server keeps only large streams' files (64 MiB); IVSERVE_KEEP_MIN_BYTES=0
keeps the bundled example's.
"""
import glob
import os
import shutil

import pytest
import requests

from test_disk_orientation import EXAMPLE, Server, gene_rows

CELLS = [{"index": [0]}, {"index": [1999, 0, 7, 7, 300]}, {"range": [100, 900]}, {"index": []}]
GENES = [{"index": [0]}, {"index": [1499, 0, 7, 7, 300]}, {"index": list(range(0, 1500, 13))}]
MAPPED = "pointer arrays mapped from the cache folder"


def cell_rows(srv, ds, sel):
    r = requests.post(srv.url + "/v1/datasets/%s/query" % ds, json={"obs": sel},
                      headers={"Accept": "application/vnd.ivserve.csr"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.content


def answers(tmp, src, cache, name):
    """Starts a server, reads every answer of both orientations, stops it;
    returns the answers and its log."""
    s = Server(tmp, [src, "--cache-dir", cache, "--other-orientation", "disk"], name=name)
    try:
        o = s.wait_other("pbmc")
        assert o["source"] == "cache", o
        got = [cell_rows(s, "pbmc", c) for c in CELLS] + [gene_rows(s, "pbmc", g) for g in GENES]
    finally:
        assert s.stop() == 0
    return got, s.text()


def arrays_files(cache, old=()):
    """The source's and the gene-major copy's kept arrays (those of a
    source key in old left out: the sweep may not have removed them yet)."""
    src = [p for p in glob.glob(os.path.join(cache, "pbmc-*.X.arrays"))
           if ".ivcsc" not in p and p not in old]
    assert len(src) == 1, os.listdir(cache)
    stem = src[0][:-len(".X.arrays")]
    copy = glob.glob(stem + ".ivcsc*.X.arrays")
    assert len(copy) == 1, os.listdir(cache)
    return src[0], copy[0]


@pytest.fixture
def started(tmp_path, monkeypatch):
    if not os.path.exists(EXAMPLE):
        pytest.fail("the bundled example %s is missing" % EXAMPLE)
    monkeypatch.setenv("IVSERVE_KEEP_MIN_BYTES", "0")
    src = str(tmp_path / "pbmc.h5ad")
    shutil.copy(EXAMPLE, src)
    cache = str(tmp_path / "cache")
    want, log = answers(str(tmp_path), src, cache, "first")
    # Read at the first start (none kept yet), and kept for both.
    assert log.count("pointer arrays read (none kept)") == 2, log[-3000:]
    assert MAPPED not in log
    return str(tmp_path), src, cache, want


def test_restart_maps_the_kept_arrays_and_answers_the_same(started):
    tmp, src, cache, want = started
    x, copy = arrays_files(cache)
    stamp = os.stat(x).st_mtime_ns
    got, log = answers(tmp, src, cache, "again")
    assert got == want
    # Both orientations took theirs: the file's and the gene-major copy's.
    assert log.count(MAPPED) == 2, log[-3000:]
    assert "kept arrays ignored" not in log
    assert os.stat(x).st_mtime_ns == stamp   # mapped, not written again


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("damage,why", [
    (lambda p: os.truncate(p, os.path.getsize(p) - 8), "truncated"),
    (lambda p: flip_byte(p, os.path.getsize(p) - 64), "damaged"),      # in values
    (lambda p: flip_byte(p, 400), "damaged"),                           # in major_ptr
    (lambda p: flip_byte(p, 0), "another format"),
])
def test_damaged_kept_arrays_are_read_again(started, damage, why):
    tmp, src, cache, want = started
    x, copy = arrays_files(cache)
    damage(x)
    got, log = answers(tmp, src, cache, "damaged")
    assert got == want
    assert log.count("pointer arrays read (kept arrays ignored: %s)" % why) == 1, log[-3000:]
    assert log.count(MAPPED) == 1   # the gene-major copy's were whole
    # Kept again whole: the next start maps both.
    got, log = answers(tmp, src, cache, "mended")
    assert got == want
    assert log.count(MAPPED) == 2, log[-3000:]


def test_kept_arrays_of_another_file_are_not_taken(started):
    tmp, src, cache, want = started
    x, _ = arrays_files(cache)
    with open(x, "rb") as f:
        old = f.read()
    # Touched: a new modification time, so a new key and new kept files.
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    got, log = answers(tmp, src, cache, "touched")
    assert got == want
    x2, _ = arrays_files(cache, old=(x,))
    assert x2 != x
    # The old file's arrays under the new key: its header names another file.
    with open(x2, "wb") as f:
        f.write(old)
    got, log = answers(tmp, src, cache, "other")
    assert got == want
    assert "pointer arrays read (kept arrays ignored: made for another file or matrix)" in log, \
        log[-3000:]
