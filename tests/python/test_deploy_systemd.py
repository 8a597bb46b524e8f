"""deploy/systemd/ivserve.service, checked as far as a machine without a
running systemd allows:

  * `systemd-analyze verify` accepts the unit with no warning at all (it
    warns about unknown keys and system-call groups but still exits 0, so
    any output is a failure); the ExecStart binary is replaced by the built
    one, since verify also checks that the binary exists;
  * `systemd-analyze security --offline=true` rates its exposure at most 2.0
    ("OK");
  * every option of ExecStart is one that `ivserve --help` lists, and the
    unit has the promised pieces (EnvironmentFile, ExecReload sending
    SIGHUP, read-only data, no capabilities, a memory limit);
  * the server run with ExecStart's own arguments (the config path swapped
    for a copy of config/example.json pointing at the bundled dataset) and
    a token from the environment, as EnvironmentFile gives it, serves
    queries under strace; every system call it and its HDF5 reader
    processes make is allowed by the unit's SystemCallFilter lines, as
    `systemd-analyze syscall-filter` expands them.  A call the filter
    refuses would fail with EPERM in production, far from any test.

systemd-analyze missing is a failure that names the package (scripts/
setup.sh installs systemd and strace), not a skip.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import pytest
import requests
from ivprocess import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
UNIT = os.path.join(REPO, "deploy", "systemd", "ivserve.service")
EXAMPLE_CFG = os.path.join(REPO, "config", "example.json")
EXAMPLE = os.path.join(REPO, "examples", "pbmc_example.h5ad")
BIN = os.environ.get("IVSERVE_BIN", os.path.join(REPO, "build", "ivserve"))
TOKEN = "lab-token-7f3a"


def tool(name):
    path = shutil.which(name) or os.path.join("/usr/bin", name)
    if not os.access(path, os.X_OK):
        pytest.fail("%s is missing (Debian package %s, installed by scripts/setup.sh)" % (
            name, {"systemd-analyze": "systemd"}.get(name, name)))
    return path


def unit_entries():
    """[(section, key, value)] in file order (keys may repeat)."""
    out, section = [], None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            out.append((section, key.strip(), value.strip()))
    return out


def values(key):
    return [v for s, k, v in unit_entries() if k == key and s == "Service"]


def one(key):
    v = values(key)
    assert len(v) == 1, "%s appears %d times in the unit" % (key, len(v))
    return v[0]


@pytest.fixture(scope="module")
def analyze():
    return tool("systemd-analyze")


@pytest.fixture
def unit_here(tmp_path):
    """The unit with ExecStart's binary replaced by the built one."""
    if not os.access(BIN, os.X_OK):
        pytest.fail("IVSERVE_BIN is not set to an executable ivserve binary")
    text = open(UNIT).read()
    exe = shlex.split(one("ExecStart"))[0]
    assert exe.startswith("/"), "ExecStart needs an absolute path: %s" % exe
    path = tmp_path / "ivserve.service"
    path.write_text(text.replace("ExecStart=" + exe, "ExecStart=" + os.path.abspath(BIN)))
    return str(path)


def test_verify_is_clean(analyze, unit_here):
    r = subprocess.run([analyze, "verify", unit_here], capture_output=True, text=True, timeout=60)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 0 and not out, "systemd-analyze verify: exit %d\n%s" % (r.returncode, out)


def test_security_exposure(analyze, unit_here):
    r = subprocess.run([analyze, "security", "--offline=true", unit_here], capture_output=True,
                       text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
    assert m, "no exposure level in:\n%s%s" % (r.stdout[-2000:], r.stderr[-2000:])
    assert float(m.group(1)) <= 2.0, "exposure %s is over 2.0:\n%s" % (m.group(1), r.stdout)


def test_unit_has_the_promised_pieces():
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    assert values("EnvironmentFile"), "no EnvironmentFile for the tokens"
    assert one("NoNewPrivileges") == "yes"
    assert one("ProtectSystem") == "strict"
    assert one("CapabilityBoundingSet") == ""
    assert one("PrivateTmp") == "yes"
    assert one("DynamicUser") == "yes" or values("User")
    assert values("ReadOnlyPaths"), "no ReadOnlyPaths for the data"
    assert values("MemoryMax") and values("SystemCallFilter")
    # The stop timeout must outlast the server's own drain.
    grace = json.load(open(EXAMPLE_CFG))["limits"]["shutdown_grace_ms"] / 1000
    assert float(one("TimeoutStopSec").rstrip("s")) > grace


def test_exec_start_options_exist():
    r = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    known = set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout + r.stderr))
    args = shlex.split(one("ExecStart"))[1:]
    opts = [a.split("=")[0] for a in args if a.startswith("--")]
    assert opts, "ExecStart passes no option"
    for o in opts:
        assert o in known, "ExecStart option %s is not in ivserve --help" % o


def expand(analyze, groups, seen=None):
    """The system calls of SystemCallFilter words (names and @groups)."""
    seen = set() if seen is None else seen
    out = set()
    for g in groups:
        if not g.startswith("@"):
            out.add(g)
            continue
        if g in seen:
            continue
        seen.add(g)
        r = subprocess.run([analyze, "syscall-filter", g], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, "systemd-analyze syscall-filter %s: %s" % (g, r.stderr)
        names = [ln.strip() for ln in r.stdout.splitlines()[1:]
                 if ln.strip() and not ln.strip().startswith("#")]
        out |= expand(analyze, names, seen)
    return out


def allowed_syscalls(analyze):
    allow, deny = None, set()
    for line in values("SystemCallFilter"):
        words = line.split()
        if words[0].startswith("~"):
            deny |= expand(analyze, [words[0][1:]] + words[1:])
        else:
            allow = (allow or set()) | expand(analyze, words)
    assert allow, "SystemCallFilter has no allow list"
    return allow - deny


def test_syscalls_within_filter(analyze, tmp_path):
    strace = tool("strace")
    allowed = allowed_syscalls(analyze)
    cfg = json.load(open(EXAMPLE_CFG))
    port = free_port()
    cfg.update(port=port, access_log=str(tmp_path / "access.log"), threads=2)
    cfg["datasets"] = [{"id": "pbmc", "path": EXAMPLE, "title": "PBMC example"}]
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    argv = shlex.split(one("ExecStart"))
    args = [str(cfg_path) if a.endswith(".json") else a for a in argv[1:]]
    assert str(cfg_path) in args, "ExecStart does not pass a --config file: %s" % argv
    summary = tmp_path / "strace.txt"
    env = dict(os.environ, IVSERVE_TOKENS=TOKEN)
    # LeakSanitizer cannot run under ptrace; in a sanitized build the leak
    # check is the other tests' job (a release binary ignores this).
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([strace, "-f", "-qq", "-c", "-o", str(summary), BIN] + args,
                            env=env, stdout=log, stderr=log)
    url = "http://127.0.0.1:%d" % port
    auth = {"Authorization": "Bearer " + TOKEN}
    try:
        deadline = time.time() + 60
        while True:
            try:
                if requests.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            time.sleep(0.2)
        # The token from the environment is the one the server asks for.
        assert requests.get(url + "/v1/datasets", timeout=10).status_code == 401
        assert requests.get(url + "/v1/datasets", headers=auth, timeout=10).status_code == 200
        # Wait for the gene-major copy (built on the workers after load).
        while True:
            doc = requests.get(url + "/v1/datasets/pbmc", headers=auth, timeout=10).json()
            state = doc.get("orientations", {}).get("genes", {}).get("state")
            if state in ("ready", "skipped", "failed") or time.time() > deadline:
                break
            time.sleep(0.2)
        for path, kw in [
                ("/v1/datasets/pbmc/query", {"headers": dict(auth, Accept="application/vnd.ivserve.csr")}),
                ("/v1/datasets/pbmc/query?obs=0:50&var=0:30&format=ndjson", {"headers": auth}),
                ("/v1/datasets/pbmc/query?var=3,1,2&by=var&format=json", {"headers": auth}),
                ("/v1/datasets/pbmc/obs?format=csv&limit=100", {"headers": auth}),
                ("/metrics", {"headers": auth}),
                ("/openapi.json", {})]:
            r = requests.get(url + path, timeout=30, **kw)
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
        r = requests.post(url + "/v1/datasets/pbmc/count", json={"obs": {"range": [0, 100]}},
                          headers=auth, timeout=30)
        assert r.status_code == 200, r.text[:300]
    finally:
        # SIGTERM to the server itself: strace, signalled, would kill it.
        try:
            with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
                kids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            kids = []
        for pid in kids[:1]:
            os.kill(pid, signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.seek(0)
        out = log.read()
        log.close()
    assert rc == 0, "server exit %d:\n%s" % (rc, out[-3000:])
    used = set()
    for line in summary.read_text().splitlines():
        m = re.match(r"\s*[0-9.]+\s+[0-9.]+\s+\d+\s+\d+\s+(?:\d+\s+)?([a-z_0-9]+)$", line)
        if m and m.group(1) != "total":
            used.add(m.group(1))
    assert len(used) > 20, "strace summary unreadable:\n" + summary.read_text()[:2000]
    # execve is strace starting the server (allowed anyway).
    refused = sorted(used - allowed)
    assert not refused, "system calls the unit's SystemCallFilter refuses: %s" % refused
