"""Request checks of proto/ and core/ seen through the real server.

The answers a client gets for: integers past INT64_MAX in a query string,
`not_in` on a column with missing values, a key given twice, `\\u0000` in a
string, request bytes that are not UTF-8 echoed in an error, and a filter
too costly or too large to run; and (issue 30) Transfer-Encoding in an
HTTP/1.0 request, an absolute-form target, a content-encoded body, an
index of 2^64-1 and deeply nested where strings.  Every error body must be
valid JSON (a strict UTF-8 decode, then json.loads).
"""

import gzip
import json
import os
import re
import signal
import socket
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


# ---- issue 30: low-severity findings of the adversarial review ------------

def raw_exchange(url, request, timeout=10):
    """Sends request bytes on a new connection; returns (status, headers
    as a dict of lower-case names, body, closed) where closed says the
    server ended the connection after its answer."""
    hostport = url.split("/")[2]
    host, port = hostport.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        s.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            b = s.recv(65536)
            assert b, "connection closed before an answer: %r" % buf
            buf += b
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(body) < n:
            b = s.recv(65536)
            assert b, "answer cut short"
            body += b
        closed = False
        try:
            closed = s.recv(1) == b""
        except socket.timeout:
            pass
        return status, headers, body[:n], closed
    finally:
        s.close()


def host_of(url):
    return url.split("/")[2]


def test_transfer_encoding_in_http10_is_400_and_closes(server):
    """RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 request is faulty
    framing: 400 with the JSON error, and the connection closes."""
    path = "/" + server.split("/", 3)[3] + "/count"
    req = ("POST %s HTTP/1.0\r\nContent-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" % path).encode()
    status, headers, body, closed = raw_exchange(server, req)
    assert status == 400, (status, body)
    doc = json.loads(body)
    assert doc["error"]["code"] == "bad_request", doc
    assert "Transfer-Encoding" in doc["error"]["message"], doc
    assert headers.get("connection") == "close" and closed, headers
    # HTTP/1.1 chunked is still read.
    req = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
           "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" % (path, host_of(server))).encode()
    status, _, body, _ = raw_exchange(server, req)
    assert status == 200, (status, body)


def test_absolute_form_target_is_routed_by_its_path(server):
    """RFC 9112 3.2.2: GET http://host:port/v1/datasets answers as
    GET /v1/datasets."""
    host = host_of(server)
    dspath = "/" + server.split("/", 3)[3]
    for target, check in [("http://%s/v1/datasets" % host, lambda d: d["datasets"]),
                          ("http://%s%s/count?obs=1,2,3" % (host, dspath),
                           lambda d: d["n_cells"] == 3)]:
        req = ("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (target, host)).encode()
        status, _, body, _ = raw_exchange(server, req)
        assert status == 200, (target, status, body)
        assert check(json.loads(body)), (target, body)


def test_content_encoded_body_is_415(server):
    """A body in a content coding the server does not decode is 415
    Unsupported Media Type naming the coding, not a 400 about its JSON."""
    body = gzip.compress(b'{"obs":{"index":[1]}}')
    path = "/" + server.split("/", 3)[3] + "/count"
    for coding in ("gzip", "br", "GZIP, identity"):
        req = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
               "Content-Encoding: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
               % (path, host_of(server), coding, len(body))).encode() + body
        status, headers, out, _ = raw_exchange(server, req)
        assert status == 415, (coding, status, out)
        doc = json.loads(out)
        assert doc["error"]["code"] == "unsupported_media", doc
        assert "Content-Encoding" in doc["error"]["message"], doc
        assert headers.get("accept-encoding") == "identity", headers
    # Asked before the body (Expect: 100-continue): refused at once, no 100.
    req = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
           "Content-Encoding: gzip\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
           % (path, host_of(server), len(body))).encode()
    status, headers, out, _ = raw_exchange(server, req)
    assert status == 415 and json.loads(out)["error"]["code"] == "unsupported_media", (status, out)
    # identity is no coding at all: the body is read.
    plain = b'{"obs":{"index":[1]}}'
    req = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
           "Content-Encoding: identity\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % (path, host_of(server), len(plain))).encode() + plain
    status, _, out, _ = raw_exchange(server, req)
    assert status == 200 and json.loads(out)["n_cells"] == 1, (status, out)


def test_index_of_uint64_max_is_out_of_range(server):
    """2^64-1 as an index is out of range for the axis, with the message
    any index >= n gets, in a body and in a query string."""
    status, doc = call(server)
    n = doc["shape"][0]
    status, want = call(server + "/count", json.dumps({"obs": {"index": [n]}}))
    assert status == 422 and want["error"]["code"] == "out_of_range", want
    shape = re.escape("is out of range [0, %d)" % n)
    assert re.fullmatch(r"obs\.index\[0\] = %d " % n + shape, want["error"]["message"]), want
    for body in ('{"obs":{"index":[18446744073709551615]}}',
                 '{"obs":{"index":[0,18446744073709551615]}}'):
        status, doc = call(server + "/count", body)
        assert status == 422 and doc["error"]["code"] == "out_of_range", (body, doc)
        assert re.fullmatch(r"obs\.index\[\d\] = \S+ " + shape, doc["error"]["message"]), doc
        assert "-" not in doc["error"]["message"].split("=")[1].split()[0], doc
    status, doc = call(server + "/count", '{"obs":{"range":[0,18446744073709551615]}}')
    assert status == 422 and doc["error"]["code"] == "out_of_range", doc
    status, doc = call(server + "/count?obs=18446744073709551615")
    assert status == 422 and doc["error"]["code"] == "out_of_range", doc
    assert doc["error"]["message"] == "obs.index[0] = 18446744073709551615 " + \
        "is out of range [0, %d)" % n, doc


def test_where_nesting_counts_each_level_once(server):
    """256 levels of parentheses are allowed (the documented limit), 257
    are refused naming it; 200 levels of nested 'and' run."""
    for levels in (128, 200, 256):
        w = "(" * levels + "age >= 0" + ")" * levels
        status, doc = call(server + "/count", json.dumps({"obs": {"where": w}}))
        assert status == 200, (levels, doc)
        chain = "age >= 0 and (" * levels + "age >= 0" + ")" * levels
        status, doc = call(server + "/count", json.dumps({"obs": {"where": chain}}))
        assert status == 200, (levels, doc)
        nots = "not " * levels + "age < 0"
        status, doc = call(server + "/count", json.dumps({"obs": {"where": nots}}))
        assert status == 200, (levels, doc)
    w = "(" * 257 + "age >= 0" + ")" * 257
    status, doc = call(server + "/count", json.dumps({"obs": {"where": w}}))
    assert status == 400, doc
    assert "deeper than 256" in doc["error"]["message"], doc
