"""gzip on query answers (/query): each block compressed on a worker as one
piece of a single gzip member (proto/gzip_stream.c).

The gzip-decoded answer must equal the identity answer byte for byte, in
every encoding (binary, NDJSON, JSON), for cell rows and gene rows, on
files of both orientations, decoded by Python's gzip module and by zlib.
Accept-Encoding is negotiated (q=0, `*`, `identity;q=0`, br alone), HEAD
says what GET would send, an error after the first block still ends the
member properly with the error in the trailer, and clients that stop
reading cost nothing lasting.
"""
import gzip
import json
import os
import socket
import subprocess
import time
import zlib

import numpy as np
import pytest
import requests

import ivref
from test_http_server import BIN, FILES, FIX, Server, ds_id

MEDIA = {"binary": "application/vnd.ivserve.csr", "ndjson": "application/x-ndjson",
         "json": "application/json"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("gzip")))
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


def raw_query(url, d, body, accept_encoding, method="POST"):
    """The answer's bytes as sent (chunking removed, nothing decoded)."""
    h = {"Content-Type": "application/json"}
    if accept_encoding is not None:
        h["Accept-Encoding"] = accept_encoding
    else:
        h["Accept-Encoding"] = ""  # requests would otherwise offer gzip itself
    r = requests.request(method, f"{url}/v1/datasets/{d}/query", data=json.dumps(body), headers=h,
                         stream=True, timeout=60)
    data = r.raw.read(decode_content=False)
    return r, data


def vary_has_accept_encoding(r):
    return "accept-encoding" in [v.strip().lower() for v in r.headers.get("Vary", "").split(",")]


def gunzip_both(data):
    """Decoded by Python's gzip module and by zlib (which checks the CRC and
    the length and says whether bytes follow the member); both must agree."""
    a = gzip.decompress(data)
    z = zlib.decompressobj(wbits=31)
    b = z.decompress(data) + z.flush()
    assert z.eof and z.unused_data == b"", "the member did not end where the body did"
    assert a == b
    return a


def selections(m, rng):
    n_obs, n_var = m["shape"]
    yield {}  # everything
    yield {"obs": {"index": [int(x) for x in rng.integers(0, n_obs, size=min(n_obs, 37))]},
           "var": {"index": [int(x) for x in rng.integers(0, n_var, size=min(n_var, 300))]}}
    yield {"obs": {"range": [n_obs // 3, n_obs]}}


@pytest.mark.parametrize("by", ["obs", "var"])
@pytest.mark.parametrize("fmt", ["binary", "ndjson", "json"])
@pytest.mark.parametrize("m", FILES, ids=[ds_id(m) for m in FILES])
def test_gzip_equals_identity(srv, m, fmt, by):
    rng = np.random.default_rng(abs(hash((m["file"], fmt, by))) % 2**32)
    for sel in selections(m, rng):
        body = dict(sel, format=fmt, by=by)
        r0, ident = raw_query(srv.url, ds_id(m), body, "identity")
        assert r0.status_code == 200, ident[:300]
        assert "Content-Encoding" not in r0.headers
        assert vary_has_accept_encoding(r0), r0.headers
        r1, gz = raw_query(srv.url, ds_id(m), body, "gzip")
        assert r1.status_code == 200, gz[:300]
        assert r1.headers.get("Content-Encoding") == "gzip"
        assert vary_has_accept_encoding(r1), r1.headers
        assert r1.headers["Content-Type"] == r0.headers["Content-Type"] == MEDIA[fmt]
        assert gz[:3] == b"\x1f\x8b\x08"
        assert gunzip_both(gz) == ident
        if fmt == "json":
            # A whole document: sent with its (compressed) length.
            assert int(r1.headers["Content-Length"]) == len(gz)
        else:
            assert r1.headers.get("Transfer-Encoding") == "chunked"


def test_gzip_shrinks_and_decodes_to_the_matrix(srv):
    """The compressed stream is smaller, and the client library reads the
    matrix from it (requests decodes Content-Encoding itself)."""
    big = max(FILES, key=lambda m: m["nnz"])
    body = {"format": "ndjson"}
    _, ident = raw_query(srv.url, ds_id(big), body, "identity")
    _, gz = raw_query(srv.url, ds_id(big), body, "gzip")
    assert len(gz) < len(ident) / 2, (len(gz), len(ident))
    r = requests.post(f"{srv.url}/v1/datasets/{ds_id(big)}/query", json=body,
                      headers={"Accept-Encoding": "gzip"}, timeout=60)
    assert r.headers["Content-Encoding"] == "gzip" and r.content == ident
    lines = r.content.decode().splitlines()
    assert json.loads(lines[-1]) == {"type": "end", "status": "ok", "rows": big["shape"][0],
                                     "nnz": big["nnz"]}


@pytest.mark.parametrize("ae,coded", [
    (None, False),
    ("", False),
    ("gzip", True),
    ("GZIP", True),
    ("gzip;q=0", False),
    ("gzip; q=0", False),
    ("gzip;q=0.001", True),
    ("*", True),
    ("*;q=0", False),
    ("*, gzip;q=0", False),
    ("identity;q=0", True),      # identity refused and gzip not: gzip
    ("identity;q=0, gzip;q=0", False),  # nothing acceptable: the header is disregarded
    ("br", False),               # br is not offered for query answers
    ("br;q=1, gzip;q=0.5", True),
    ("deflate, gzip;q=0.8", True),
    ("compress", False),
])
def test_accept_encoding_variants(srv, ae, coded):
    m = FILES[0]
    h = {"Accept": "application/x-ndjson"}
    h["Accept-Encoding"] = "" if ae is None else ae
    r = requests.get(f"{srv.url}/v1/datasets/{ds_id(m)}/query?obs=0:5", headers=h, stream=True, timeout=30)
    data = r.raw.read(decode_content=False)
    assert r.status_code == 200
    assert vary_has_accept_encoding(r)
    if coded:
        assert r.headers.get("Content-Encoding") == "gzip", (ae, r.headers)
        data = gunzip_both(data)
    else:
        assert "Content-Encoding" not in r.headers, (ae, r.headers)
    assert json.loads(data.decode().splitlines()[0])["type"] == "header"


@pytest.mark.parametrize("fmt", ["binary", "ndjson", "json"])
def test_head_says_what_get_sends(srv, fmt):
    m = FILES[0]
    for ae, ce in (("gzip", "gzip"), ("identity", None)):
        h = {"Accept": MEDIA[fmt], "Accept-Encoding": ae}
        url = f"{srv.url}/v1/datasets/{ds_id(m)}/query?obs=0:10"
        rh = requests.head(url, headers=h, timeout=30)
        rg = requests.get(url, headers=h, stream=True, timeout=30)
        rg.raw.read(decode_content=False)
        assert rh.status_code == rg.status_code == 200
        assert rh.headers.get("Content-Encoding") == rg.headers.get("Content-Encoding") == ce
        assert vary_has_accept_encoding(rh)
        assert rh.headers["Content-Type"] == rg.headers["Content-Type"]
        assert rh.content == b""


def test_errors_before_the_stream_are_plain(srv):
    """An error known before the first byte is an ordinary JSON error
    answer, never compressed."""
    m = FILES[0]
    r, data = raw_query(srv.url, ds_id(m), {"obs": {"index": [10 ** 9]}, "format": "ndjson"}, "gzip")
    assert r.status_code == 422
    assert "Content-Encoding" not in r.headers
    assert json.loads(data)["error"]["code"] == "out_of_range"


def test_count_is_not_compressed(srv):
    m = FILES[0]
    r = requests.post(f"{srv.url}/v1/datasets/{ds_id(m)}/count", json={},
                      headers={"Accept-Encoding": "gzip"}, stream=True, timeout=30)
    data = r.raw.read(decode_content=False)
    assert "Content-Encoding" not in r.headers
    assert json.loads(data)["nnz"] == m["nnz"]


def test_level_setting(tmp_path):
    """gzip_level 0 turns compression of query answers off; another level
    gives another (valid) member of the same body."""
    m = max(FILES, key=lambda m: m["nnz"])
    path = os.path.join(FIX, m["file"])
    outs = {}
    for level in (0, 6):
        s = Server(str(tmp_path), extra_args=["--gzip-level", str(level)], datasets=[{"id": "d", "path": path}])
        try:
            r, data = raw_query(s.url, "d", {"format": "binary"}, "gzip")
            assert r.status_code == 200
            outs[level] = (r.headers.get("Content-Encoding"), data)
        finally:
            assert s.stop() == 0
    assert outs[0][0] is None
    assert outs[6][0] == "gzip"
    assert gunzip_both(outs[6][1]) == outs[0][1]
    # Out of range: a start-up error that names the setting.
    for args, env in ((["--gzip-level", "10"], {}), ([], {"IVSERVE_GZIP_LEVEL": "-1"})):
        p = subprocess.run([BIN, *args, path], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, **env))
        assert p.returncode != 0 and "gzip" in (p.stderr + p.stdout).lower(), (args, env, p.stderr)
    s = Server(str(tmp_path), cfg_extra={"gzip_level": 3}, datasets=[{"id": "d", "path": path}])
    try:
        r, data = raw_query(s.url, "d", {"format": "binary"}, "gzip")
        assert r.headers.get("Content-Encoding") == "gzip" and gunzip_both(data) == outs[0][1]
    finally:
        assert s.stop() == 0


def read_all(sock):
    out = []
    while True:
        try:
            b = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not b:
            break
        out.append(b)
    return b"".join(out)


def dechunk(resp):
    """(headers text, body) of one chunked HTTP/1.1 answer."""
    head, rest = resp.split(b"\r\n\r\n", 1)
    body = []
    while True:
        line, rest = rest.split(b"\r\n", 1)
        n = int(line, 16)
        if n == 0:
            break
        body.append(rest[:n])
        assert rest[n:n + 2] == b"\r\n"
        rest = rest[n + 2:]
    return head.decode(), b"".join(body)


def test_error_mid_stream_ends_the_member(tmp_path):
    """The file is cut short on disk while a slow client reads a stream of
    it (one worker, one block ahead, no chunk cache): a later block fails
    after the first went out, the error travels in the trailer, and the
    gzip member still ends properly around it (zlib checks its CRC and
    length)."""
    path = str(tmp_path / "victim.h5ad")
    rng = np.random.default_rng(7)
    X = ivref.random_csr(rng, 6000, 3000, 2_000_000, np.int32)
    ivref.write_iv(path, X, compression="zstd")
    s = Server(str(tmp_path), datasets=[{"id": "v", "path": path}], cfg_extra={"transpose_bytes": 0},
               extra_args=["--threads", "1", "--blocks-ahead", "1", "--cache-bytes", "0"])
    try:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        c.sendall(b"GET /v1/datasets/v/query HTTP/1.1\r\nHost: x\r\nAccept: application/x-ndjson\r\n"
                  b"Accept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        first = c.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        time.sleep(0.3)
        with open(path, "r+b") as f:  # cut short in place, as a crashed copy would leave it
            f.truncate(4096)
        c.settimeout(30)
        head, body = dechunk(first + read_all(c))
        c.close()
        assert "Content-Encoding: gzip" in head, head
        text = gunzip_both(body).decode()
        lines = text.splitlines()
        assert json.loads(lines[0])["type"] == "header"
        end = json.loads(lines[-1])
        assert end["type"] == "end" and end["status"] == "error", end
        assert 0 < end["rows"] < 6000, end  # some blocks went out before the error
        assert requests.get(s.url + "/healthz", timeout=5).status_code == 200
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_client_stops_reading(srv):
    big = max(FILES, key=lambda m: m["nnz"])
    req = (f"GET /v1/datasets/{ds_id(big)}/query HTTP/1.1\r\nHost: x\r\n"
           f"Accept: application/x-ndjson\r\nAccept-Encoding: gzip\r\n\r\n").encode()
    for _ in range(10):
        c = socket.create_connection(("127.0.0.1", srv.port))
        c.sendall(req)
        assert c.recv(1000).startswith(b"HTTP/1.1 200")
        c.close()  # gone mid-stream
    # One that stays but never reads past the first bytes.
    c = socket.create_connection(("127.0.0.1", srv.port))
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.sendall(req)
    c.recv(100)
    t0 = time.time()
    for _ in range(10):
        r = requests.get(f"{srv.url}/v1/datasets/{ds_id(FILES[0])}/query?obs=0",
                         headers={"Accept-Encoding": "gzip"}, timeout=5)
        assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
    assert time.time() - t0 < 10
    c.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        text = requests.get(srv.url + "/metrics", timeout=5).text
        if "\nivserve_active_streams 0" in text:
            break
        time.sleep(0.1)
    assert "\nivserve_active_streams 0" in text
