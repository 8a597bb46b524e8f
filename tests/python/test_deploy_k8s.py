"""deploy/k8s/: the manifests parse (python3-yaml) and agree with each other,
with the image and with the server.

  * kinds present; the Service selects the Deployment's pods and targets a
    port the container declares;
  * the ConfigMap's config.json is mounted where the container's --config
    points, and the container port is the config's port, on all addresses;
  * probes: readiness GET /readyz, liveness GET /healthz, on that port;
  * the data volume is mounted read-only (and its claim too), and every
    dataset path of the config lies under it;
  * memory requests and limits are set, and the limit covers the config's
    cache budget; the grace period outlasts limits.shutdown_grace_ms; the
    pod runs as the Dockerfile's numeric user, read-only, no capabilities;
  * the server itself, started with the ConfigMap's config (the data mount
    mapped to a folder holding the bundled example, the port swapped for a
    free one), accepts every key, and answers the probe paths with 200
    and the list with the configured datasets.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests
import yaml
from ivprocess import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(REPO, "deploy", "k8s")
EXAMPLES = os.path.join(REPO, "examples")
BIN = os.environ.get("IVSERVE_BIN", os.path.join(REPO, "build", "ivserve"))


def load_all():
    docs = []
    for name in sorted(os.listdir(K8S)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, name)) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


@pytest.fixture(scope="module")
def k8s():
    docs = load_all()
    by_kind = {}
    for d in docs:
        assert "apiVersion" in d and "kind" in d and d.get("metadata", {}).get("name"), d
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "Service", "ConfigMap", "PersistentVolumeClaim"):
        assert len(by_kind.get(kind, [])) == 1, "deploy/k8s/ should hold one %s" % kind
    dep = by_kind["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    return {"dep": dep, "pod": pod, "ctr": ctr, "svc": by_kind["Service"][0],
            "cm": by_kind["ConfigMap"][0], "pvc": by_kind["PersistentVolumeClaim"][0]}


def mount_of(k8s, volume_kind):
    """(volume, mount) of the pod's volume of that kind."""
    vols = [v for v in k8s["pod"]["volumes"] if volume_kind in v]
    assert len(vols) == 1, "want one %s volume" % volume_kind
    mounts = [m for m in k8s["ctr"]["volumeMounts"] if m["name"] == vols[0]["name"]]
    assert len(mounts) == 1
    return vols[0], mounts[0]


def config_of(k8s):
    """The config file the container reads, and where it reads it."""
    args = k8s["ctr"].get("args", [])
    assert "--config" in args, "the container does not pass --config: %s" % args
    path = args[args.index("--config") + 1]
    vol, mount = mount_of(k8s, "configMap")
    assert vol["configMap"]["name"] == k8s["cm"]["metadata"]["name"]
    assert os.path.dirname(path) == mount["mountPath"].rstrip("/"), (path, mount)
    key = os.path.basename(path)
    assert key in k8s["cm"]["data"], "ConfigMap has no key %s" % key
    return json.loads(k8s["cm"]["data"][key])


def container_port(k8s, ref):
    for p in k8s["ctr"]["ports"]:
        if ref in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    raise AssertionError("port %r is not one of the container's" % ref)


def test_ports_and_service(k8s):
    cfg = config_of(k8s)
    port = cfg.get("port", 8080)
    assert [p["containerPort"] for p in k8s["ctr"]["ports"]] == [port]
    assert cfg.get("listen") == "0.0.0.0", "a pod's server must listen on all addresses"
    labels = k8s["dep"]["spec"]["template"]["metadata"]["labels"]
    sel = k8s["svc"]["spec"]["selector"]
    assert sel and all(labels.get(k) == v for k, v in sel.items())
    assert k8s["dep"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for p in k8s["svc"]["spec"]["ports"]:
        assert container_port(k8s, p["targetPort"]) == port


def test_probes(k8s):
    port = config_of(k8s).get("port", 8080)
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = k8s["ctr"][probe]["httpGet"]
        assert get["path"] == path, (probe, get)
        assert container_port(k8s, get["port"]) == port


def test_read_only_data_and_paths(k8s):
    vol, mount = mount_of(k8s, "persistentVolumeClaim")
    assert mount.get("readOnly") is True and vol["persistentVolumeClaim"].get("readOnly") is True
    assert vol["persistentVolumeClaim"]["claimName"] == k8s["pvc"]["metadata"]["name"]
    assert k8s["pvc"]["spec"]["accessModes"] == ["ReadOnlyMany"]
    root = mount["mountPath"].rstrip("/") + "/"
    for d in config_of(k8s)["datasets"]:
        assert d["path"].startswith(root), "dataset %s is outside the data volume" % d["id"]
    _, cmount = mount_of(k8s, "configMap")
    assert cmount.get("readOnly") is True


def mem_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    assert m, "memory quantity %r" % q
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return int(m.group(1)) * mult


def test_resources_security_and_grace(k8s):
    cfg = config_of(k8s)
    res = k8s["ctr"]["resources"]
    req, lim = mem_bytes(res["requests"]["memory"]), mem_bytes(res["limits"]["memory"])
    assert 0 < req <= lim
    # One cache per dataset today (cache_bytes each); the limit must hold
    # the caches with room for the rest of the process.
    cache = cfg.get("cache_bytes", 1 << 30) * len(cfg["datasets"])
    assert lim >= cache + (256 << 20), "memory limit %d below the caches' %d" % (lim, cache)
    grace = cfg.get("limits", {}).get("shutdown_grace_ms", 10000) / 1000
    assert k8s["pod"]["terminationGracePeriodSeconds"] > grace
    sc, psc = k8s["ctr"]["securityContext"], k8s["pod"]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert psc["runAsNonRoot"] is True
    user = re.search(r"^USER (\d+)", open(os.path.join(REPO, "Dockerfile")).read(), re.M)
    assert user, "the Dockerfile's USER is not numeric (runAsNonRoot cannot check a name)"
    assert psc["runAsUser"] == int(user.group(1))


def test_server_runs_the_configmap(k8s, tmp_path):
    if not os.access(BIN, os.X_OK):
        pytest.fail("IVSERVE_BIN is not set to an executable ivserve binary")
    cfg = config_of(k8s)
    _, mount = mount_of(k8s, "persistentVolumeClaim")
    root = mount["mountPath"].rstrip("/") + "/"
    data = tmp_path / "data"
    data.mkdir()
    for d in cfg["datasets"]:
        name = d["path"][len(root):]
        src = os.path.join(EXAMPLES, os.path.basename(name))
        assert os.path.exists(src), "no file for dataset %s (%s) in examples/" % (d["id"], name)
        os.symlink(src, data / name)
        d["path"] = str(data / name)
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    port = free_port()
    log = open(tmp_path / "server.log", "w+")
    # Only the listen address and port are overridden (a test must not
    # listen on every address of the machine, nor on a fixed port).
    proc = subprocess.Popen([BIN, "--config", str(cfg_path), "--listen", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=log)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 30
        while True:
            try:
                if requests.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail("the server refused the ConfigMap's config:\n" + log.read()[-3000:])
            time.sleep(0.1)
        for path in (k8s["ctr"]["livenessProbe"]["httpGet"]["path"],
                     k8s["ctr"]["readinessProbe"]["httpGet"]["path"]):
            while requests.get(url + path, timeout=2).status_code != 200:
                assert time.time() < deadline, "%s never answered 200" % path
                time.sleep(0.1)
        ids = [d["id"] for d in requests.get(url + "/v1/datasets", timeout=5).json()["datasets"]]
        assert sorted(ids) == sorted(d["id"] for d in cfg["datasets"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
    assert rc == 0
