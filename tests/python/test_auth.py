"""Integration tests of bearer-token auth: the real server, real HTTP.

Tokens from a tokens file (names and SHA-256 hashes), the environment and
the config; the dataset list filtered per client; 401 (with
WWW-Authenticate) for a missing or wrong token and 403 for a valid one
without access; unknown dataset ids answering exactly as protected ones;
the optional /metrics token; --token kept out of /proc/PID/cmdline; the
token-hash helper; and the access log's client, token name and selection
in both formats.
"""
import hashlib
import json
import os
import socket
import subprocess
import time

import pytest
import requests

from test_http_server import BIN, FILES, FIX, Server  # noqa: F401

SMALL = os.path.join(FIX, FILES[0]["file"])
SHAPE = FILES[0]["shape"]


def sha(tok):
    return hashlib.sha256(tok.encode()).hexdigest()


def bearer(tok):
    return {"Authorization": "Bearer " + tok}


def write_tokens(tmp, lines, name="tokens.txt"):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("# test tokens: NAME SHA256 [SCOPE]\n\n")
        for line in lines:
            f.write(line + "\n")
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A server with a public dataset, one with its own plain token (emb),
    one opened by the file token bob (lab), and file tokens for metrics
    and admin; /metrics needs a token."""
    tmp = str(tmp_path_factory.mktemp("lab"))
    tf = write_tokens(tmp, ["bob %s dataset:lab" % sha("bob-secret"),
                            "prom %s metrics" % sha("prom-secret"),
                            "ops %s admin" % sha("ops-secret")])
    s = Server(tmp, cfg_extra={"tokens_file": tf, "metrics_auth": "token",
                               "cors_origins": ["http://app.example"]},
               datasets=[{"id": "pub", "path": SMALL, "title": "Open atlas"},
                         {"id": "emb", "path": SMALL, "title": "Embargoed atlas", "tokens": ["emb-secret"]},
                         {"id": "lab", "path": SMALL, "title": "Lab atlas"}],
               extra_args=["--access-log", os.path.join(tmp, "access.log")])
    s.access = os.path.join(tmp, "access.log")
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


def listed(s, headers=None):
    r = requests.get(s.url + "/v1/datasets", headers=headers or {})
    assert r.status_code == 200, r.text
    return r, [d["id"] for d in r.json()["datasets"]]


def test_list_shows_each_client_what_it_may_read(lab):
    r, ids = listed(lab)
    assert ids == ["pub"]
    # The list depends on the token: no shared cache may serve it to another client.
    assert "private" in r.headers["Cache-Control"] and "Authorization" in r.headers["Vary"]
    assert "Embargoed" not in r.text and "Lab atlas" not in r.text
    assert listed(lab, bearer("bob-secret"))[1] == ["pub", "lab"]
    assert listed(lab, bearer("emb-secret"))[1] == ["pub", "emb"]
    assert listed(lab, bearer("ops-secret"))[1] == ["pub"]   # admin reads nothing protected
    r = requests.get(lab.url + "/v1/datasets", headers=bearer("wrong"))
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == 'Bearer realm="ivserve", error="invalid_token"'


def test_401_for_missing_or_wrong_token_403_without_access(lab):
    u = lab.url + "/v1/datasets/"
    r = requests.get(u + "emb")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="ivserve"'
    assert r.json()["error"]["code"] == "unauthorized"
    r = requests.get(u + "emb", headers=bearer("emb-secre"))
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == 'Bearer realm="ivserve", error="invalid_token"'
    r = requests.get(u + "emb", headers=bearer("bob-secret"))
    assert r.status_code == 403 and "WWW-Authenticate" not in r.headers
    assert requests.get(u + "emb", headers=bearer("emb-secret")).status_code == 200
    assert requests.get(u + "lab", headers=bearer("bob-secret")).status_code == 200
    assert requests.get(u + "pub").status_code == 200
    assert requests.get(u + "pub", headers=bearer("bob-secret")).status_code == 200
    # A wrong token is refused even where none is needed (RFC 6750).
    assert requests.get(u + "pub", headers=bearer("nope")).status_code == 401
    # The query routes agree.
    q = requests.get(u + "lab/query", params={"obs": "0:3", "format": "json"}, headers=bearer("bob-secret"))
    assert q.status_code == 200, q.text
    assert requests.get(u + "lab/query", params={"obs": "0:3"}).status_code == 401
    assert requests.post(u + "emb/count", json={}, headers=bearer("bob-secret")).status_code == 403


@pytest.mark.parametrize("sub", ["", "/obs", "/query?obs=0:2", "/count", "/var/search?q=x"])
def test_unknown_id_answers_as_a_protected_one(lab, sub):
    u = lab.url + "/v1/datasets/"
    for hdr in ({}, bearer("bob-secret"), bearer("wrong")):
        a = requests.get(u + "emb" + sub, headers=hdr)
        b = requests.get(u + "no-such-dataset" + sub, headers=hdr)
        assert a.status_code in (401, 403)
        assert (a.status_code, a.content, a.headers.get("WWW-Authenticate")) == \
            (b.status_code, b.content, b.headers.get("WWW-Authenticate")), (sub, hdr)


def test_unknown_id_probe_with_expect_continue(lab):
    """The header-only checks (Expect: 100-continue) follow the same order."""
    def first(path, extra):
        c = socket.create_connection(("127.0.0.1", lab.port), timeout=5)
        c.sendall(("\r\n".join([f"POST {path} HTTP/1.1", "Host: x", "Content-Length: 2",
                                "Content-Type: application/json", "Expect: 100-continue", *extra])
                   + "\r\n\r\n").encode())
        c.settimeout(3)
        got = c.recv(4096).split(b"\r\n")[0]
        c.close()
        return got
    for extra in ([], ["Authorization: Bearer bob-secret"]):
        a = first("/v1/datasets/emb/count", extra)
        b = first("/v1/datasets/nothing-here/count", extra)
        assert a == b and a.split()[1] in (b"401", b"403"), (a, b)
    assert first("/v1/datasets/lab/count", ["Authorization: Bearer bob-secret"]).startswith(b"HTTP/1.1 100")


def test_global_reader_sees_404_and_anonymous_list_is_401(tmp_path):
    tf = write_tokens(str(tmp_path), ["alice %s read" % sha("alice-secret")])
    s = Server(str(tmp_path), cfg_extra={"tokens_file": tf}, datasets=[{"id": "a", "path": SMALL}])
    try:
        r = requests.get(s.url + "/v1/datasets")
        # Nothing is public: the client is told it needs a token.
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="ivserve"'
        assert requests.get(s.url + "/v1/datasets/nope").status_code == 401
        assert requests.get(s.url + "/v1/datasets/nope", headers=bearer("alice-secret")).status_code == 404
        assert listed(s, bearer("alice-secret"))[1] == ["a"]
        assert requests.get(s.url + "/metrics").status_code == 200   # metrics_auth defaults to open
        assert "auth: 1 tokens; 1 of 1 datasets need one" in s.log_text()
    finally:
        assert s.stop() == 0


def test_empty_tokens_file_is_warned_about(tmp_path):
    tf = write_tokens(str(tmp_path), [])
    s = Server(str(tmp_path), extra_args=["--token-file", tf], datasets=[{"id": "a", "path": SMALL}])
    try:
        assert requests.get(s.url + "/v1/datasets/a").status_code == 200   # open, and said so
        log = s.log_text()
        assert "holds no tokens" in log and "auth: 0 tokens; 0 of 1 datasets need one" in log, log
    finally:
        assert s.stop() == 0


def test_metrics_token_and_open_probes(lab):
    u = lab.url
    r = requests.get(u + "/metrics")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Bearer realm="ivserve"'
    assert requests.get(u + "/metrics", headers=bearer("wrong")).status_code == 401
    assert requests.get(u + "/metrics", headers=bearer("bob-secret")).status_code == 403
    r = requests.get(u + "/metrics", headers=bearer("prom-secret"))
    assert r.status_code == 200 and "ivserve_" in r.text
    assert requests.get(u + "/metrics", headers=bearer("ops-secret")).status_code == 200
    assert requests.get(u + "/healthz").status_code == 200
    assert requests.get(u + "/readyz").status_code == 200
    assert requests.get(u + "/openapi.json").status_code == 200


def test_cors_preflight_and_refusals_carry_cors(lab):
    r = requests.options(lab.url + "/v1/datasets/emb/query", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 204
    assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
    # A browser page must be able to read the 401 to ask for a token.
    r = requests.get(lab.url + "/v1/datasets/emb", headers={"Origin": "http://app.example"})
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "WWW-Authenticate" in r.headers["Access-Control-Expose-Headers"]
    # The viewer's page is not behind a token.
    assert requests.get(lab.url + "/").status_code == 200


def test_token_flag_is_scrubbed_from_cmdline(tmp_path):
    s = Server(str(tmp_path), extra_args=["--token", "flag-secret-123"], datasets=[{"id": "a", "path": SMALL}])
    try:
        with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
            cmd = f.read()
        assert b"--token" in cmd and b"flag-secret-123" not in cmd, cmd
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(s.proc.pid)], capture_output=True, text=True)
        assert "flag-secret-123" not in ps.stdout
        assert requests.get(s.url + "/v1/datasets/a", headers=bearer("flag-secret-123")).status_code == 200
        assert requests.get(s.url + "/v1/datasets/a").status_code == 401
        assert "--token is deprecated" in s.log_text()
    finally:
        assert s.stop() == 0
    # The help says so.
    h = subprocess.run([BIN, "--help"], capture_output=True, text=True)
    assert "--token-file" in h.stdout and "deprecated" in h.stdout


def test_tokens_from_environment_and_file_flag(tmp_path):
    tf = write_tokens(str(tmp_path), ["carol %s" % sha("carol-secret")])
    env = dict(os.environ, IVSERVE_TOKENS="env-secret")
    old = os.environ.copy()
    os.environ.update(env)
    try:
        s = Server(str(tmp_path), extra_args=["--token-file", tf], datasets=[{"id": "a", "path": SMALL}])
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        for tok in ("env-secret", "carol-secret"):
            assert requests.get(s.url + "/v1/datasets/a", headers=bearer(tok)).status_code == 200
        assert requests.get(s.url + "/v1/datasets/a", headers=bearer("x")).status_code == 401
        with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
            assert b"secret" not in f.read()
    finally:
        assert s.stop() == 0


def test_bad_tokens_file_is_refused_with_its_line(tmp_path):
    tf = write_tokens(str(tmp_path), ["alice %s" % sha("a"), "bob 12345"])
    p = subprocess.run([BIN, SMALL, "--token-file", tf, "--port", "0"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "tokens file" in p.stderr and "line 4" in p.stderr and "64 hex digits" in p.stderr, p.stderr


def test_token_hash_helper(tmp_path):
    p = subprocess.run([BIN, "token-hash", "dana", "dataset:a,metrics"], input="dana-secret\n",
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "dana %s dataset:a,metrics\n" % sha("dana-secret")
    tf = os.path.join(str(tmp_path), "t.txt")
    with open(tf, "w") as f:
        f.write(p.stdout)
    s = Server(str(tmp_path), extra_args=["--token-file", tf], datasets=[{"id": "a", "path": SMALL}])
    try:
        assert requests.get(s.url + "/v1/datasets/a", headers=bearer("dana-secret")).status_code == 200
    finally:
        assert s.stop() == 0
    for args, stdin in ((["token-hash", "bad name"], "x\n"), (["token-hash", "ok"], ""),
                        (["token-hash", "ok", "write"], "x\n"), (["token-hash", "ok"], " x\n")):
        p = subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True)
        assert p.returncode == 1 and "ivserve: error:" in p.stderr, (args, p.stderr)
    assert subprocess.run([BIN, "token-hash"], capture_output=True).returncode == 2


@pytest.mark.parametrize("stdin, why", [
    (b"abc\0def\n", "NUL"),                 # was hashed as "abc"
    (b"abc\0", "NUL"),
    (b"first\nsecond\n", "one line"),       # was the hash of "first"
    (b"tok\n\n", "one line"),
    (b"tok\r\nmore", "one line"),
    (b"", "no token"),
    (b"\n", "empty"),
    (b"\r\n", "empty"),
    (b"   \n", "blank"),
    (b"to\x7fk\n", "control"),
    (b"to\x1bk\n", "control"),
    (b"a\rb\n", "control"),
    (b" tok\n", "blank"),
    (b"x" * 5000 + b"\n", "longer"),
])
def test_token_hash_refuses_what_could_never_match(stdin, why):
    """token-hash reads all of stdin: one line (one trailing line end
    allowed), no NUL or control byte, not empty; anything else is refused
    with a message rather than hashed in part."""
    p = subprocess.run([BIN, "token-hash", "ok"], input=stdin, capture_output=True)
    assert p.returncode == 1, (stdin, p.stdout)
    assert p.stdout == b""
    assert b"ivserve: error:" in p.stderr and why.encode() in p.stderr, p.stderr


@pytest.mark.parametrize("stdin", [b"s3cret\n", b"s3cret", b"s3cret\r\n"])
def test_token_hash_takes_one_line_with_or_without_its_end(stdin):
    p = subprocess.run([BIN, "token-hash", "ok"], input=stdin, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == "ok %s\n" % sha("s3cret")


def log_lines(path, want, timeout=5):
    deadline = time.time() + timeout
    while True:
        with open(path) as f:
            lines = f.read().splitlines()
        if len(lines) >= want or time.time() > deadline:
            return lines
        time.sleep(0.05)


def test_access_log_json(tmp_path):
    log = os.path.join(str(tmp_path), "a.log")
    tf = write_tokens(str(tmp_path), ["bob %s dataset:lab" % sha("bob-secret")])
    s = Server(str(tmp_path), cfg_extra={"tokens_file": tf, "trusted_proxies": ["127.0.0.0/8"]},
               datasets=[{"id": "lab", "path": SMALL}],
               extra_args=["--access-log", log, "--log-format", "json"])
    try:
        h = dict(bearer("bob-secret"), **{"X-Forwarded-For": "6.6.6.6, 198.51.100.7"})
        r = requests.get(s.url + "/v1/datasets/lab/query", params={"obs": "0:5", "var": "1,2,3"},
                         headers=dict(h, Accept="application/vnd.ivserve.csr"))
        assert r.status_code == 200
        requests.get(s.url + "/v1/datasets/lab", headers=bearer("wrong"))
        requests.get(s.url + "/v1/datasets/lab")
    finally:
        assert s.stop() == 0
    lines = [json.loads(l) for l in log_lines(log, 3)]
    q = [e for e in lines if e["path"].startswith("/v1/datasets/lab/query")][0]
    assert q["client"] == "198.51.100.7" and q["peer"] == "127.0.0.1"
    assert q["token"] == "bob" and q["dataset"] == "lab"
    assert (q["cells"], q["genes"]) == (5, 3)
    assert q["status"] == 200 and q["bytes"] > len(r.content)   # the body and the head
    assert q["ms"] >= 0
    bad = [e for e in lines if e["status"] == 401]
    assert len(bad) == 2 and all(e["token"] is None and e["client"] == "127.0.0.1" for e in bad)
    assert all("peer" not in e for e in bad)
    text = open(log).read()
    assert "bob-secret" not in text and "wrong" not in text


def test_access_log_text_and_untrusted_proxy(tmp_path):
    log = os.path.join(str(tmp_path), "a.log")
    s = Server(str(tmp_path), cfg_extra={"tokens": ["plain-secret"]}, datasets=[{"id": "a", "path": SMALL}],
               extra_args=["--access-log", log, "--log-format", "text"])
    try:
        r = requests.post(s.url + "/v1/datasets/a/count", json={"obs": {"range": [0, 7]}},
                          headers=dict(bearer("plain-secret"), **{"X-Forwarded-For": "198.51.100.7"}))
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0
    line = [l for l in log_lines(log, 1) if "/count" in l][0]
    # No trusted proxies: the header is not believed.
    assert " client=127.0.0.1 " in line and "198.51.100.7" not in line
    assert " token=tokens[0] " in line and f" cells=7 genes={SHAPE[1]}" in line
    assert " 200 " in line and "plain-secret" not in open(log).read()
