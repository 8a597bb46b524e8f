"""Dataset ids of files named on the command line, with the real server.

A file's id is its name without the folder and the `.h5ad` suffix, so that
two encodings (`a.ivcsr.h5ad`, `a.ivcsc.h5ad`) or two versions
(`lupus.v2.h5ad`, `lupus.v3.h5ad`) of one dataset are served side by side.
Two files that still give one id stop the start with an error that names
both files, without the usage text after it.
"""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import fixtures_path
from ivprocess import listening_port  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN")


def need():
    if not BIN:
        pytest.fail("IVSERVE_BIN not set (run through ctest)")
    fix = fixtures_path()
    if not fix:
        pytest.skip("shared fixtures folder not found")
    return fix


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


def test_ids_keep_dots_before_h5ad(tmp_path):
    fix = need()
    files = {"a.ivcsr.h5ad": "tiny.ivcsr.raw.h5ad", "a.ivcsc.h5ad": "tiny.ivcsc.blosc2-lz4.h5ad",
             "lupus.v2.h5ad": "tiny.ivcsr.blosc2-lz4.h5ad", "lupus.v3.h5ad": "tiny.ivcsr.raw.h5ad"}
    paths = []
    for name, src in files.items():
        p = tmp_path / name
        os.symlink(os.path.join(fix, src), p)
        paths.append(str(p))
    log = open(tmp_path / "log.txt", "a+")
    proc = subprocess.Popen([BIN, "--port", "0", "--threads", "2", *paths],
                            stdout=log, stderr=log)
    try:
        url = "http://127.0.0.1:%d" % listening_port(tmp_path / "log.txt", proc)
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, "server exited: " + open(tmp_path / "log.txt").read()
            try:
                if get(url + "/readyz")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.time() < deadline, "server not ready"
            time.sleep(0.05)
        status, body = get(url + "/v1/datasets")
        assert status == 200
        doc = json.loads(body)
        items = doc["datasets"] if isinstance(doc, dict) else doc
        ids = sorted(d["id"] for d in items)
        assert ids == ["a.ivcsc", "a.ivcsr", "lupus.v2", "lupus.v3"], ids
        # Each id answers for its own file.
        for i in ids:
            status, body = get(url + "/v1/datasets/" + i)
            assert status == 200, (i, body)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_duplicate_id_names_both_files_without_usage(tmp_path):
    fix = need()
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a = tmp_path / "one" / "lupus.v2.h5ad"
    b = tmp_path / "two" / "lupus.v2.h5ad"
    os.symlink(os.path.join(fix, "tiny.ivcsr.raw.h5ad"), a)
    os.symlink(os.path.join(fix, "tiny.ivcsr.raw.h5ad"), b)
    p = subprocess.run([BIN, "--port", "0", str(a), str(b)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert str(a) in p.stderr and str(b) in p.stderr, p.stderr
    assert "'lupus.v2'" in p.stderr, p.stderr
    assert "datasets[" not in p.stderr, p.stderr
    assert "usage:" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
