"""Integration tests of the connection life cycle: pipelining of every kind of
response after every other, timeouts (header, compute, write), polite
closes, the delivered tail of a Connection: close stream, strict HTTP
parsing and the smaller protocol rules (Expect, TRACE, HEAD, 431, 505).

Each test here was written against a defect of issue 9 and fails on the
server before its fix.
"""
import json
import os
import re
import socket
import time

import numpy as np
import pytest
import requests

from test_http_server import FILES, FIX, Server, ds_id, expected, same  # noqa: F401

import ivclient  # noqa: E402  (test_http_server put proto/python on the path)

BIG = max(FILES, key=lambda m: m["nnz"])
SMALL = FILES[0]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # A short write timeout makes a hung response fail the test quickly
    # instead of waiting for the default minute.
    s = Server(str(tmp_path_factory.mktemp("conn")),
               extra_args=["--max-json-bytes", "4000000", "--write-timeout-ms", "4000"])
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


# ---- a small HTTP/1.1 response reader ------------------------------------

class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body


def read_responses(sock, methods, timeout=15):
    """Reads one response per entry of methods (the request methods, in
    order: HEAD responses have no body) from sock; returns the Resp list,
    shorter when the connection ended or went silent first."""
    sock.settimeout(timeout)
    buf = bytearray()
    out = []
    eof = False

    def need(n):
        nonlocal eof
        while len(buf) < n and not eof:
            try:
                b = sock.recv(1 << 16)
            except (socket.timeout, ConnectionResetError):
                b = b""
            if not b:
                eof = True
            buf.extend(b)
        return len(buf) >= n

    def find(sep, start=0):
        nonlocal eof
        while True:
            i = buf.find(sep, start)
            if i >= 0:
                return i
            if eof:
                return -1
            try:
                b = sock.recv(1 << 16)
            except (socket.timeout, ConnectionResetError):
                b = b""
            if not b:
                eof = True
            buf.extend(b)

    for m in methods:
        while True:
            e = find(b"\r\n\r\n")
            if e < 0:
                return out
            head = bytes(buf[:e]).decode("latin-1")
            del buf[:e + 4]
            lines = head.split("\r\n")
            status = int(lines[0].split()[1])
            hdrs = {}
            for line in lines[1:]:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
            if status != 100:
                break
        body = b""
        if m != "HEAD" and status not in (204, 304):
            if "content-length" in hdrs:
                n = int(hdrs["content-length"])
                if not need(n):
                    return out
                body = bytes(buf[:n])
                del buf[:n]
            elif hdrs.get("transfer-encoding") == "chunked":
                parts = []
                while True:
                    e = find(b"\r\n")
                    if e < 0:
                        return out
                    n = int(bytes(buf[:e]), 16)
                    del buf[:e + 2]
                    if not need(n + 2):
                        return out
                    assert bytes(buf[n:n + 2]) == b"\r\n", "chunk not followed by CRLF"
                    parts.append(bytes(buf[:n]))
                    del buf[:n + 2]
                    if n == 0:
                        break
                body = b"".join(parts)
            else:
                while not eof:
                    need(len(buf) + 1)
                body = bytes(buf)
                buf.clear()
        out.append(Resp(status, hdrs, body))
    return out


def request(method, path, headers=(), body=b"", close=False):
    h = [f"{method} {path} HTTP/1.1", "Host: x"] + list(headers)
    if body:
        h.append(f"Content-Length: {len(body)}")
    if close:
        h.append("Connection: close")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + body


BIN = "Accept: application/vnd.ivserve.csr"


def stream_req(close=False):
    return request("GET", f"/v1/datasets/{ds_id(BIG)}/query", [BIN], close=close)


def check_stream(resp):
    assert resp.status == 200, (resp.status, resp.body[:300])
    mat, _ = ivclient.parse_binary(resp.body)
    same(mat, expected(BIG))


# ---- 1: pipelined requests after a stream and before one ------------------

FIRSTS = {
    "stream": ("GET", stream_req(), check_stream),
    "count": ("GET", request("GET", f"/v1/datasets/{ds_id(BIG)}/count?var=0:7"),
              lambda r: (r.status == 200 and json.loads(r.body)["shape"][1] == 7) or
              pytest.fail(f"count: {r.status} {r.body[:200]}")),
    "head_stream": ("HEAD", request("HEAD", f"/v1/datasets/{ds_id(BIG)}/query", [BIN]),
                    lambda r: r.status == 200 or pytest.fail(str(r.status))),
    "json": ("GET", request("GET", f"/v1/datasets/{ds_id(SMALL)}/query?obs=0:5&format=json"),
             lambda r: (r.status == 200 and json.loads(r.body)) or pytest.fail(str(r.status))),
    "metadata": ("GET", request("GET", f"/v1/datasets/{ds_id(BIG)}/obs?limit=50"),
                 lambda r: r.status in (200, 422) or pytest.fail(str(r.status))),
    "error": ("GET", request("GET", "/v1/datasets/no-such-dataset/query"),
              lambda r: r.status == 404 or pytest.fail(str(r.status))),
}


@pytest.mark.parametrize("first", sorted(FIRSTS))
def test_pipelined_pair_then_stream(srv, first):
    """Two requests in one TCP write: the second, a binary stream, is answered
    in full after whatever the first was."""
    m1, r1, check1 = FIRSTS[first]
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(r1 + stream_req(close=True))
    got = read_responses(s, [m1, "GET"])
    s.close()
    assert len(got) == 2, f"{len(got)} of 2 responses arrived"
    check1(got[0])
    check_stream(got[1])


@pytest.mark.parametrize("second", ["count", "json", "metadata", "error", "head_stream"])
def test_pipelined_stream_then_other(srv, second):
    m2, r2, check2 = FIRSTS[second]
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(stream_req() + r2 + request("GET", "/healthz", close=True))
    got = read_responses(s, ["GET", m2, "GET"])
    s.close()
    assert len(got) == 3, f"{len(got)} of 3 responses arrived"
    check_stream(got[0])
    check2(got[1])
    assert got[2].status == 200


def test_pipelined_many_streams(srv):
    """Five streams back to back, with small selections in between."""
    reqs, methods = b"", []
    for i in range(5):
        reqs += stream_req()
        reqs += request("GET", f"/v1/datasets/{ds_id(BIG)}/query?obs={i}", [BIN])
        methods += ["GET", "GET"]
    reqs += request("GET", "/healthz", close=True)
    methods.append("GET")
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(reqs)
    got = read_responses(s, methods, timeout=30)
    s.close()
    assert len(got) == len(methods)
    e = expected(BIG)
    for i in range(5):
        check_stream(got[2 * i])
        mat, _ = ivclient.parse_binary(got[2 * i + 1].body)
        same(mat, e[[i]])
