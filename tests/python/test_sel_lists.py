"""One selection-list grammar for the query string and the command line
(docs/selection-lists.md): `obs=` over HTTP and `--obs` / `--batch` lines of
`ivserve export` go through the same parser (proto/request.c) and the same
resolver (iv_psel_resolve over iv_meta_resolve).

Checked here: a mixed list (`5,3,3,10:13`) over HTTP selects what the
equivalent JSON index list selects; on the command line, names and
positions of the same rows export the same matrix, and a batch line takes
names too; out-of-range items are refused with the parser's message."""

import os

import h5py
import numpy as np
import pytest
import requests

import ivref
from ivprocess import ServerProcess

FIXTURE = "tiny.ivcsr.blosc2-lz4.h5ad"


@pytest.fixture(scope="module")
def tiny(fixtures_dir):
    path = os.path.join(fixtures_dir, FIXTURE)
    if not os.path.exists(path):
        pytest.skip("fixture %s absent" % FIXTURE)
    with h5py.File(path, "r") as f:
        obs = [x.decode() for x in f["obs"][f["obs"].attrs["_index"]][:]]
        var = [x.decode() for x in f["var"][f["var"].attrs["_index"]][:]]
    return path, obs, var


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    s = ServerProcess(str(tmp_path_factory.mktemp("sel")), [tiny[0]])
    yield s
    s.stop()


def test_http_mixed_list_is_the_index_list(server, tiny):
    ds = os.path.basename(tiny[0])[:-len(".h5ad")]
    base = "%s/v1/datasets/%s/query" % (server.url, ds)
    got = requests.get(base + "?obs=5,3,3,10:13&var=7,0:4&format=json", timeout=30)
    assert got.status_code == 200, got.text
    want = requests.post(base, json={"obs": {"index": [5, 3, 3, 10, 11, 12]},
                                     "var": {"index": [7, 0, 1, 2, 3]}, "format": "json"},
                         timeout=30)
    assert want.status_code == 200, want.text
    assert got.json() == want.json()
    # The mixed list is checked item by item like any other.
    bad = requests.get(base + "?obs=5,3:%d" % (len(tiny[1]) + 1), timeout=30)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "out_of_range", bad.text
    assert "obs.range [3, %d) is not within [0, %d)" % (len(tiny[1]) + 1, len(tiny[1])) \
        in bad.json()["error"]["message"]


def test_cli_names_and_positions_export_the_same(ivserve, tiny, workdir):
    path, obs, var = tiny
    rows, cols = [4, 0, 4, 9], [3, 1]
    by_pos = os.path.join(workdir, "pos.npz")
    by_name = os.path.join(workdir, "name.npz")
    ivserve.assert_ok(ivserve.export(path, by_pos, "4,0,4,9", "3,1"))
    ivserve.assert_ok(ivserve.export(path, by_name, ",".join(obs[i] for i in rows),
                                     ",".join(var[j] for j in cols)))
    a, b = ivref.load_npz_raw(by_pos), ivref.load_npz_raw(by_name)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert tuple(a["shape"]) == (4, 2)


def test_cli_batch_lines_take_names(ivserve, tiny, workdir):
    path, obs, var = tiny
    out = os.path.join(workdir, "batch")
    os.mkdir(out)
    lst = os.path.join(workdir, "list.tsv")
    with open(lst, "w") as f:
        f.write("2,0:2\t%s\n" % ",".join(var[j] for j in (5, 2)))
        f.write("%s\t5,2\n" % ",".join(obs[i] for i in (2, 0, 1)))
    ivserve.assert_ok(ivserve.run("export", path, "--batch", lst, "-o", out))
    a = ivref.load_npz_raw(os.path.join(out, "q0.npz"))
    b = ivref.load_npz_raw(os.path.join(out, "q1.npz"))
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_cli_list_errors(ivserve, tiny, workdir):
    path, obs, _ = tiny
    n = len(obs)
    out = os.path.join(workdir, "bad.npz")
    cases = [("1,%d" % n, "obs.index[1] = %d is out of range [0, %d)" % (n, n)),
             ("0:%d" % (n + 1), "obs.range [0, %d) is not within [0, %d)" % (n + 1, n)),
             ("5:", "obs=5: is not START:STOP"),
             ("no_such_cell", "not found: 'no_such_cell'")]
    for sel, msg in cases:
        proc = ivserve.run("export", path, "--obs", sel, "-o", out)
        assert proc.returncode == 1, (sel, proc.stderr)
        assert "ivserve: error: obs selection: " in proc.stderr and msg in proc.stderr, \
            (sel, proc.stderr)
        assert not os.path.exists(out)
