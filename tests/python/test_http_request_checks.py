"""Request checks of proto/ and core/ seen through the real server.

The answers a client gets for: integers past INT64_MAX in a query string,
`not_in` on a column with missing values, a key given twice, `\\u0000` in a
string, request bytes that are not UTF-8 echoed in an error, and a filter
too costly or too large to run.  Every error body must be valid JSON (a
strict UTF-8 decode, then json.loads).
"""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import h5py
import pytest

from conftest import fixtures_path
from ivprocess import listening_port  # noqa: E402

BIN = os.environ.get("IVSERVE_BIN")
FILE = "tiny.ivcsr.raw.h5ad"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not BIN:
        pytest.fail("IVSERVE_BIN not set (run through ctest)")
    fix = fixtures_path()
    if not fix:
        pytest.skip("shared fixtures folder not found")
    tmp = tmp_path_factory.mktemp("srv")
    log = open(tmp / "log.txt", "a+")
    proc = subprocess.Popen([BIN, "--port", "0", "--threads", "2",
                             os.path.join(fix, FILE)], stdout=log, stderr=log)
    port = listening_port(tmp / "log.txt", proc)
    url = "http://127.0.0.1:%d" % port
    deadline = time.time() + 30
    while True:
        assert proc.poll() is None, "server exited: " + open(tmp / "log.txt").read()
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.time() < deadline, "server not ready"
        time.sleep(0.05)
    # The one dataset's id, whatever the rule that names it.
    with urllib.request.urlopen(url + "/v1/datasets", timeout=5) as r:
        doc = json.loads(r.read())
    items = doc["datasets"] if isinstance(doc, dict) else doc
    yield url + "/v1/datasets/" + items[0]["id"]
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def call(url, body=None, method=None):
    """(status, parsed JSON) of a request; the body must be strict UTF-8 JSON."""
    data = body if isinstance(body, (bytes, type(None))) else body.encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    return status, json.loads(raw.decode("utf-8", errors="strict"))


def batch_column():
    with h5py.File(os.path.join(fixtures_path(), FILE), "r") as f:
        g = f["obs/batch"]
        return g["values"][:], g["mask"][:].astype(bool)


def test_huge_query_string_integer_is_422_naming_it(server):
    for qs in ["obs=9999999999999999999", "obs=9223372036854775808", "obs=0:99999999999999999999"]:
        status, doc = call(server + "/query?" + qs + "&format=json")
        assert status == 422, (qs, status, doc)
        msg = doc["error"]["message"]
        assert "99999" in msg or "9223372036854775808" in msg, (qs, msg)
        assert "-" not in msg, (qs, msg)   # no wrapped negative index


def test_not_in_is_false_on_missing(server):
    values, missing = batch_column()
    assert missing.any()
    v = int(values[~missing][0])
    want_not_in = int(((values != v) & ~missing).sum())
    want_complement = int((~((values == v) & ~missing)).sum())
    for sel in [{"filter": {"column": "batch", "not_in": [v]}},
                {"where": "batch not in [%d]" % v},
                {"filter": {"column": "batch", "ne": v}}]:
        status, doc = call(server + "/count", json.dumps({"obs": sel}))
        assert status == 200, (sel, doc)
        assert doc["n_cells"] == want_not_in, (sel, doc["n_cells"], want_not_in)
    for sel in [{"filter": {"not": {"column": "batch", "in": [v]}}},
                {"where": "not (batch in [%d])" % v}]:
        status, doc = call(server + "/count", json.dumps({"obs": sel}))
        assert status == 200 and doc["n_cells"] == want_complement, (sel, doc)


def test_duplicate_keys_and_nul_are_400(server):
    cases = [('{"obs":{"index":[1]},"obs":{"index":[2]}}', "'obs'"),
             ('{"obs":{"filter":{"column":"batch","eq":1,"eq":2}}}', "more than once"),
             ('{"obs":{"names":["AAACF7C9AF85-0\\u0000junk"]}}', "u0000")]
    for body, word in cases:
        status, doc = call(server + "/count", body)
        assert status == 400, (body, status, doc)
        assert word in doc["error"]["message"], (body, doc)


def test_error_echoing_bad_utf8_is_valid_json(server):
    # An unknown parameter named by bytes that are not UTF-8, and a where
    # string whose echoed value is cut in the middle of a character.
    status, doc = call(server + "/query?%FF%FE=1")
    assert status == 422, doc
    assert "\ufffd" in doc["error"]["message"]
    status, doc = call(server + "/query?obs=1," + "a" + "%C3%A9" * 30)
    assert status == 422, doc
    status, doc = call(server + "/count", b'{"obs":{"names":["\xff\xfe"]}}')
    assert status in (400, 404, 422), doc


def test_filter_limits_are_413(server):
    many = {"or": [{"column": "age", "eq": i % 50} for i in range(100001)]}
    status, doc = call(server + "/count", json.dumps({"obs": {"filter": many}}))
    assert status == 413 and doc["error"]["code"] == "too_large", (status, doc)
    assert "100000 terms" in doc["error"]["message"]
    status, doc = call(server + "/count",
                       json.dumps({"obs": {"filter": {"column": "age", "in": list(range(1000001))}}}))
    assert status == 413 and "values" in doc["error"]["message"], (status, doc)
    # Within the limits, the same kinds of filter run.
    ok = {"or": [{"column": "age", "eq": i} for i in range(1000)]}
    status, doc = call(server + "/count", json.dumps({"obs": {"filter": ok}}))
    assert status == 200, doc
