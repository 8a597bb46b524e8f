"""deploy/nginx/ivserve.conf, run for real: Debian's nginx (unprivileged,
its own prefix and temporary folders, free ports) in front of three
ivserve replicas that serve the same datasets.

The config under test is the repository's file itself; only the replicas'
addresses, the two listen ports and the certificate paths are substituted
(each substitution must match exactly once, so an edit that renames them
fails here instead of leaving part of the file untested).  A self-signed
certificate for 127.0.0.1 is made with openssl, and every request goes
through the TLS server block.

Checked:
  * nginx -t accepts the file; plain HTTP redirects to HTTPS;
  * the same bytes through nginx as from a replica directly: a query of
    each dataset and whole-matrix binary streams, the large one included;
  * one dataset always reaches the same replica (each replica writes its
    own access log), and the datasets are spread over more than one;
  * a slow, then stalled, client of a 48 MB stream keeps the replica's
    anonymous memory bounded, the replica's sent bytes stay far below the
    stream (back-pressure reaches ivserve: nginx does not spool) and nginx
    writes no temporary file; the stream then completes with the right
    bytes;
  * killing the replica of a dataset moves that dataset to another
    replica, answers stay correct, and datasets of the other replicas do
    not move (consistent hashing).
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time

import h5py
import numpy as np
import pytest
import requests
from ivprocess import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONF = os.path.join(REPO, "deploy", "nginx", "ivserve.conf")
EXAMPLE = os.path.join(REPO, "examples", "pbmc_example.h5ad")
BIN = os.environ.get("IVSERVE_BIN", os.path.join(REPO, "build", "ivserve"))
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
CSR = "application/vnd.ivserve.csr"
SMALL = ["pbmc_%s" % c for c in "abcdefgh"]   # one file under several ids
BIG = "big"                                    # 50,000 x 4,000 int64, 120 MB stream
N_REPLICAS = 3


def sanitizer():
    """'tsan' or 'asan' when the binary is built with that sanitizer."""
    with open(BIN, "rb") as f:
        data = f.read()
    return "tsan" if b"__tsan_init" in data else "asan" if b"__asan_init" in data else None


def rss_anon(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/%d/status" % pid)


def written(pid):
    """Bytes the process has passed to write and send calls so far (its
    sockets included): /proc/PID/io's wchar.  The server's own byte counter
    only counts a response once it has ended."""
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise AssertionError("no wchar in /proc/%d/io" % pid)


def metric(url, name):
    text = requests.get(url + "/metrics", timeout=10).text
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    assert m, "metric %s missing from %s/metrics" % (name, url)
    return float(m.group(1))


def write_big(tmp):
    """A 50,000 x 4,000 int64 matrix, 200 values a row (10 M values, a 120 MB
    binary stream: more than the loopback sockets between the replica, nginx
    and the client can hold, 32 + 4 + 4 MB with Debian's defaults), written as a plain anndata CSR file with h5py and packed
    by `ivserve pack`: seconds, where the Python reference writer takes a
    minute on a busy two-core machine."""
    n, g, k = 50000, 4000, 200
    rng = np.random.default_rng(14)
    base = np.sort(rng.choice(g, k, replace=False))
    idx = (base[None, :] + rng.integers(0, g, n)[:, None]) % g
    idx.sort(axis=1)
    csr = os.path.join(tmp, "big_csr.h5ad")
    with h5py.File(csr, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        x = f.create_group("X")
        x.attrs["encoding-type"] = "csr_matrix"
        x.attrs["encoding-version"] = "0.1.0"
        x.attrs["shape"] = np.array([n, g], np.int64)
        x["data"] = rng.integers(1, 50, n * k).astype(np.int64)
        x["indices"] = idx.reshape(-1).astype(np.int32)
        x["indptr"] = np.arange(n + 1, dtype=np.int64) * k
    out = os.path.join(tmp, "big.h5ad")
    r = subprocess.run([BIN, "pack", csr, out, "--threads", "2", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    os.unlink(csr)
    return out


class Replica:
    """One ivserve process with its own access log."""

    def __init__(self, tmp, k, cfg_path):
        self.k = k
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.access = os.path.join(tmp, "access%d.log" % k)
        self.log = open(os.path.join(tmp, "replica%d.log" % k), "w+")
        # AddressSanitizer keeps freed blocks in a quarantine (256 MB by
        # default) before reusing them, which the slow-client test would
        # count as growth; a small one keeps its bound about the server.
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8"
        self.proc = subprocess.Popen(
            [BIN, "--config", cfg_path, "--port", str(self.port), "--threads", "2",
             "--access-log", self.access],
            stdout=self.log, stderr=self.log, env=env)

    def wait_ready(self, deadline):
        while time.time() < deadline:
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        raise AssertionError("replica %d did not become ready:\n%s" % (self.k, self.log.read()[-3000:]))

    def hits(self, ds):
        """Requests for dataset ds in this replica's access log."""
        try:
            with open(self.access) as f:
                return sum(1 for line in f if json.loads(line).get("dataset") == ds)
        except FileNotFoundError:
            return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def nginx_conf(text, replica_ports, http_port, https_port, cert, key):
    """The deploy file with this test's ports and certificate."""
    def sub(pattern, repl, s):
        new, n = re.subn(pattern, repl, s)
        assert n == 1, "deploy/nginx/ivserve.conf: %r matched %d times, not once" % (pattern, n)
        return new
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+", text, re.M)
    assert len(servers) == N_REPLICAS, "the upstream should list %d replicas: %r" % (N_REPLICAS, servers)
    ports = iter(replica_ports)
    text = re.sub(r"(^\s*server 127\.0\.0\.1:)\d+", lambda m: m.group(1) + str(next(ports)), text,
                  flags=re.M)
    text = sub(r"listen 80;", "listen 127.0.0.1:%d;" % http_port, text)
    text = sub(r"listen 443 ssl", "listen 127.0.0.1:%d ssl" % https_port, text)
    text = sub(r"ssl_certificate\s+\S+;", "ssl_certificate %s;" % cert, text)
    text = sub(r"ssl_certificate_key\s+\S+;", "ssl_certificate_key %s;" % key, text)
    return text


def start_nginx(root, site):
    """nginx with its own prefix, logs and temporary folders, one worker,
    serving `site` (http-level text); returns the process once `nginx -t`
    has accepted the file."""
    for d in ("logs", "tmp"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    with open(os.path.join(root, "ivserve.conf"), "w") as f:
        f.write(site)
    main_conf = os.path.join(root, "nginx.conf")
    with open(main_conf, "w") as f:
        f.write("""daemon off; worker_processes 1; pid %(r)s/nginx.pid;
error_log %(r)s/logs/error.log info;
events { worker_connections 256; }
http {
  access_log %(r)s/logs/access.log;
  client_body_temp_path %(r)s/tmp/body; proxy_temp_path %(r)s/tmp/proxy;
  fastcgi_temp_path %(r)s/tmp/fcgi; uwsgi_temp_path %(r)s/tmp/uwsgi; scgi_temp_path %(r)s/tmp/scgi;
  include %(r)s/ivserve.conf;
}
""" % {"r": root})
    cmd = [NGINX, "-p", root, "-e", os.path.join(root, "logs", "error.log"), "-c", main_conf]
    t = subprocess.run(cmd + ["-t"], capture_output=True, text=True, timeout=30)
    assert t.returncode == 0, "nginx -t refused deploy/nginx/ivserve.conf:\n" + t.stderr
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_cert(root):
    """A self-signed certificate for 127.0.0.1."""
    cert, key = os.path.join(root, "cert.pem"), os.path.join(root, "key.pem")
    r = subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", cert], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return cert, key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not os.access(BIN, os.X_OK):
        pytest.fail("IVSERVE_BIN is not set to an executable ivserve binary")
    if not os.access(NGINX, os.X_OK):
        pytest.fail("nginx is missing (package nginx-light, installed by scripts/setup.sh)")
    tmp = str(tmp_path_factory.mktemp("deploy_nginx"))
    big = write_big(tmp)
    cfg = os.path.join(tmp, "ivserve.json")
    with open(cfg, "w") as f:
        # No gene-major copies: they are not what is tested, and building
        # them three times would take most of the start-up.
        json.dump({"datasets": [{"id": d, "path": EXAMPLE, "transpose_bytes": 0} for d in SMALL] +
                   [{"id": BIG, "path": big, "transpose_bytes": 0}]}, f)
    root = os.path.join(tmp, "nginx")
    os.makedirs(root)
    cert, key = make_cert(root)
    replicas, proc = [], None
    try:
        replicas = [Replica(tmp, k, cfg) for k in range(N_REPLICAS)]
        http_port, https_port = free_port(), free_port()
        with open(CONF) as f:
            site = nginx_conf(f.read(), [rp.port for rp in replicas], http_port, https_port, cert, key)
        proc = start_nginx(root, site)
        env = {"replicas": replicas, "nginx": proc, "root": root, "cert": cert,
               "https": "https://127.0.0.1:%d" % https_port, "https_port": https_port,
               "http": "http://127.0.0.1:%d" % http_port}
        # Generous: a ThreadSanitizer build loads the nine datasets of three
        # replicas in about a minute and a half on two busy cores.
        deadline = time.time() + 300
        for rp in replicas:
            rp.wait_ready(deadline)
        while True:
            try:
                requests.get(env["https"] + "/healthz", verify=cert, timeout=2)
                break
            except requests.ConnectionError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("nginx did not start:\n" +
                                open(os.path.join(root, "logs", "error.log")).read()[-3000:])
                time.sleep(0.1)
        yield env
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        codes = [(rp.k, rp.proc.returncode, rp.stop()) for rp in replicas]
    # Replicas still running at the end stop cleanly on SIGTERM (and, in a
    # sanitized build, without a leak report); the killed one is -9.
    for k, before, rc in codes:
        if before is None:
            with open(os.path.join(tmp, "replica%d.log" % k)) as f:
                assert rc == 0, "replica %d exit %s:\n%s" % (k, rc, f.read()[-3000:])


def via(env, method, path, **kw):
    r = requests.request(method, env["https"] + path, verify=env["cert"], timeout=60, **kw)
    return r


def direct(rp, method, path, **kw):
    return requests.request(method, rp.url + path, timeout=60, **kw)


def through_nginx(env, ds, requests_list):
    """Sends each (method, path, kwargs) of requests_list through nginx and
    returns the responses and the replica that served all of them, read from
    the replicas' access logs (written when a response ends, so waited for);
    fails when they reached more than one replica."""
    reps = env["replicas"]
    before = [rp.hits(ds) for rp in reps]
    out = [via(env, m, p, **kw) for m, p, kw in requests_list]
    deadline = time.time() + 10
    while True:
        delta = [rp.hits(ds) - b for rp, b in zip(reps, before)]
        if sum(delta) >= len(out) or time.time() > deadline:
            break
        time.sleep(0.05)
    holders = [k for k, d in enumerate(delta) if d]
    assert len(holders) == 1 and delta[holders[0]] == len(out), \
        "%d requests for %s through nginx reached the replicas as %s" % (len(out), ds, delta)
    return out, holders[0]


QUERY = {"obs": {"index": [7, 0, 3, 3, 1999]}, "var": {"range": [0, 400]}, "format": "binary"}


def test_redirect_and_status(cluster):
    r = requests.get(cluster["http"] + "/v1/datasets", allow_redirects=False, timeout=10)
    assert r.status_code == 301 and r.headers["Location"].startswith("https://"), r.headers
    r = via(cluster, "GET", "/v1/datasets")
    assert r.status_code == 200
    assert sorted(d["id"] for d in r.json()["datasets"]) == sorted(SMALL + [BIG])
    assert via(cluster, "GET", "/metrics").status_code == 404


def test_same_bytes_and_same_replica(cluster):
    reps = cluster["replicas"]
    owners = {}
    for ds in SMALL + [BIG]:
        path = "/v1/datasets/%s/query" % ds
        asks = [("POST", path, {"json": QUERY})] * 3
        if ds != BIG:   # the big one's whole stream is the next test's
            asks.append(("GET", path, {"headers": {"Accept": CSR}}))
        got, owners[ds] = through_nginx(cluster, ds, asks)
        for (m, p, kw), a in zip(asks, got):
            b = direct(reps[(owners[ds] + 1) % N_REPLICAS], m, p, **kw)
            assert a.status_code == 200 and b.status_code == 200, (a.text[:300], b.text[:300])
            assert a.headers["Content-Type"].startswith(CSR)
            assert len(a.content) > 1000 and a.content == b.content, (ds, m)
    assert len(set(owners.values())) > 1, "every dataset hashed to one replica: %s" % owners
    cluster["owners"] = owners


class SlowHTTPS(http.client.HTTPSConnection):
    """An HTTPS connection whose socket has a small receive buffer, so that
    the kernel does not read megabytes ahead for a client that does not."""

    def connect(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.settimeout(60)
        s.connect((self.host, self.port))
        self.sock = self._context.wrap_socket(s, server_hostname=self.host)


def nginx_temp_files(env):
    """Files under nginx's temporary folders, and descriptors of its
    processes open on them (a spooled response may be unlinked at once)."""
    tmp = os.path.join(env["root"], "tmp")
    found = [os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files]
    pids = [env["nginx"].pid]
    try:
        with open("/proc/%d/task/%d/children" % (pids[0], pids[0])) as f:
            pids += [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(tmp):
                found.append(target)
    return found


def test_whole_stream_and_slow_client(cluster):
    """The whole 120 MB matrix through nginx to a client that reads 32 KiB
    every 20 ms for 2 s, then nothing for 2 s, then the rest at full speed."""
    owners = cluster.get("owners") or pytest.fail("test_same_bytes_and_same_replica did not run")
    rp = cluster["replicas"][owners[BIG]]
    ref = direct(rp, "GET", "/v1/datasets/%s/query" % BIG, headers={"Accept": CSR})
    assert ref.status_code == 200 and len(ref.content) > 100_000_000
    total = len(ref.content)

    base_rss = rss_anon(rp.proc.pid)
    base_sent = written(rp.proc.pid)
    ctx = ssl.create_default_context(cafile=cluster["cert"])
    conn = SlowHTTPS("127.0.0.1", cluster["https_port"], context=ctx, timeout=60)
    conn.request("GET", "/v1/datasets/%s/query" % BIG, headers={"Accept": CSR})
    resp = conn.getresponse()
    assert resp.status == 200
    got, peak_rss, peak_sent, spooled = [], 0, 0, []
    t_end = time.time() + 2
    while time.time() < t_end:
        got.append(resp.read(32 << 10))
        time.sleep(0.02)
        peak_rss = max(peak_rss, rss_anon(rp.proc.pid))
    t_end = time.time() + 2
    while time.time() < t_end:
        time.sleep(0.2)
        peak_rss = max(peak_rss, rss_anon(rp.proc.pid))
        peak_sent = max(peak_sent, written(rp.proc.pid) - base_sent)
        spooled += nginx_temp_files(cluster)
    read_slowly = sum(map(len, got))
    active = metric(rp.url, "ivserve_active_streams")
    got.append(resp.read())
    conn.close()
    body = b"".join(got)
    print("stream %d bytes; read slowly %d; replica sent at most %d during the stall; "
          "RssAnon %.1f MB -> peak %.1f MB" % (total, read_slowly, peak_sent, base_rss / 1e6,
                                               peak_rss / 1e6))
    assert body == ref.content, "the stream through nginx differs (%d of %d bytes)" % (len(body), total)
    assert not spooled, "nginx spooled the response to temporary files: %s" % spooled[:3]
    # Back-pressure: the replica sent what the client read plus what the
    # sockets and nginx's buffer in between hold (at most ~41 MB here), and
    # its stream was still open, waiting on the client.
    assert active >= 1, "the replica had finished the stream while the client stalled"
    assert peak_sent < read_slowly + 48_000_000 and peak_sent < total * 0.6, \
        "replica sent %d of %d bytes to a client that read %d" % (peak_sent, total, read_slowly)
    # ThreadSanitizer's shadow memory (several bytes for each byte the
    # server touches) counts as anonymous memory; buffering the stream
    # would still cost it far more than this bound.
    bound = 32_000_000 * (6 if sanitizer() == "tsan" else 1)
    assert peak_rss - base_rss < bound, \
        "replica's anonymous memory grew by %.1f MB during a slow %d MB stream" % (
            (peak_rss - base_rss) / 1e6, total / 1e6)


def test_failover_moves_only_the_dead_replicas_datasets(cluster):
    owners = cluster.get("owners") or pytest.fail("test_same_bytes_and_same_replica did not run")
    reps = cluster["replicas"]
    # Kill (SIGKILL: no goodbye) the replica that holds the most datasets.
    victim = max(range(N_REPLICAS), key=lambda k: sum(1 for o in owners.values() if o == k))
    assert any(o == victim for o in owners.values())
    reps[victim].proc.kill()
    reps[victim].proc.wait()
    survivor = next(rp for rp in reps if rp.k != victim)
    for ds, o in sorted(owners.items()):
        path = "/v1/datasets/%s/query" % ds
        got, now = through_nginx(cluster, ds, [("POST", path, {"json": QUERY})] * 3)
        ref = direct(survivor, "POST", path, json=QUERY)
        for a in got:
            assert a.status_code == 200 and a.content == ref.content, (ds, a.status_code, a.text[:200])
        if o == victim:
            assert now != victim
        else:
            assert now == o, "%s moved from replica %d to %d when replica %d was killed" % (
                ds, o, now, victim)
