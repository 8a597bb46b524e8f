"""Failed datasets and the /readyz policy, against real server processes.

A dataset that fails to load stays in /v1/datasets with state "failed" and
the error; a query on it is a 503 naming the failure; /readyz under the
default policy "all" is 503 while any configured dataset is failed (or
loading), under "any" 200 once one is ready.  The policy comes from the
config key `readyz`, `--readyz` or IVSERVE_READYZ, and a reload applies a
new one.
"""
import json
import os
import signal
import time

import pytest
import requests

from test_reload import Srv  # noqa: E402  (Srv starts the real binary)


@pytest.fixture
def servers():
    started = []
    yield started
    for s in started:
        rc = s.stop()
        assert rc == 0, "exit %s:\n%s" % (rc, s.log_text()[-4000:])


def junk_file(tmp):
    p = os.path.join(tmp, "junk.h5ad")
    with open(p, "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 4000)
    return p


def cfg_with_failures(fixtures_dir, tmp, **extra):
    cfg = {"datasets": [
        {"id": "good", "path": os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"), "title": "Good"},
        {"id": "missing", "path": os.path.join(tmp, "missing.h5ad"), "title": "Gone"},
        {"id": "junk", "path": junk_file(tmp)},
    ]}
    cfg.update(extra)
    return cfg


def test_failed_datasets_are_listed_with_the_error(ivserve, fixtures_dir, tmp_path, servers):
    tmp = str(tmp_path)
    srv = Srv(ivserve.path, tmp, cfg_with_failures(fixtures_dir, tmp), wait="settled")
    servers.append(srv)
    listed = {d["id"]: d for d in srv.datasets()}
    assert list(listed) == ["good", "missing", "junk"]
    assert listed["good"]["state"] == "ready" and listed["good"]["ready"] is True
    for name in ("missing", "junk"):
        d = listed[name]
        assert d["state"] == "failed" and d["ready"] is False, d
        assert d["error"].startswith("dataset '%s' failed to load: " % name), d
    assert listed["missing"]["title"] == "Gone"
    assert "missing.h5ad" in listed["missing"]["error"]
    assert "No such file" in listed["missing"]["error"]
    # The server's folders are not shown to clients.
    assert tmp not in json.dumps(list(listed.values()))
    # Queries on a failed dataset: 503 naming the failure, not 404.
    for path in ("/v1/datasets/missing/count", "/v1/datasets/missing", "/v1/datasets/junk/query",
                 "/v1/datasets/junk/obs"):
        r = requests.get(srv.url + path)
        assert r.status_code == 503, (path, r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] == "dataset_failed" and "failed to load" in err["message"], err
        assert "Retry-After" not in r.headers
    r = requests.post(srv.url + "/v1/datasets/missing/count", json={})
    assert r.status_code == 503 and "missing.h5ad" in r.json()["error"]["message"]
    # Expect: 100-continue is refused on the headers the same way.
    r = requests.post(srv.url + "/v1/datasets/junk/count", data=b"{}",
                      headers={"Expect": "100-continue", "Content-Type": "application/json"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "dataset_failed"
    assert requests.get(srv.url + "/v1/datasets/nope/count").status_code == 404
    # The good one serves.
    assert requests.post(srv.url + "/v1/datasets/good/count", json={}).json()["nnz"] == 227
    metrics = requests.get(srv.url + "/metrics").text
    assert 'ivserve_datasets{state="failed"} 2' in metrics, metrics
    # Default policy "all": failed datasets keep it not ready, and say which.
    r = requests.get(srv.url + "/readyz")
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert "1 of 3" in msg and "missing" in msg and "junk" in msg and '"all"' in msg, msg


@pytest.mark.parametrize("how", ["config", "flag", "env"])
def test_readyz_any_is_ready_with_one_dataset_loaded(ivserve, fixtures_dir, tmp_path, servers,
                                                     how):
    tmp = str(tmp_path)
    extra = {"readyz": "any"} if how == "config" else {}
    srv = Srv(ivserve.path, tmp, cfg_with_failures(fixtures_dir, tmp, **extra), wait="settled",
              extra_args=["--readyz", "any"] if how == "flag" else [],
              env={"IVSERVE_READYZ": "any"} if how == "env" else None)
    servers.append(srv)
    r = requests.get(srv.url + "/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "policy": "any", "ready": 1, "loading": 0, "failed": 2}


def test_readyz_all_with_every_dataset_loaded(ivserve, fixtures_dir, tmp_path, servers):
    srv = Srv(ivserve.path, str(tmp_path), {"datasets": [
        {"id": "a", "path": os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad")},
        {"id": "b", "path": os.path.join(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad")}]})
    servers.append(srv)
    r = requests.get(srv.url + "/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "policy": "all", "ready": 2, "loading": 0, "failed": 0}


def test_readyz_any_with_nothing_loaded_is_not_ready(ivserve, tmp_path, servers):
    tmp = str(tmp_path)
    srv = Srv(ivserve.path, tmp, {"datasets": [{"id": "j", "path": junk_file(tmp)}],
                                  "readyz": "any"}, wait="settled")
    servers.append(srv)
    r = requests.get(srv.url + "/readyz")
    assert r.status_code == 503 and "0 of 1" in r.json()["error"]["message"], r.text


def test_reload_changes_the_policy_and_retries_failed_datasets(ivserve, fixtures_dir, tmp_path,
                                                               servers):
    tmp = str(tmp_path)
    cfg = cfg_with_failures(fixtures_dir, tmp)
    srv = Srv(ivserve.path, tmp, cfg, wait="settled")
    servers.append(srv)
    assert requests.get(srv.url + "/readyz").status_code == 503
    cfg["readyz"] = "any"
    srv.write_cfg(cfg)
    r = srv.reload()
    assert r.status_code == 200, r.text
    # Failed datasets are tried again (still failing), the good one kept.
    s = r.json()
    assert sorted(f["id"] for f in s["failed"]) == ["junk", "missing"] and s["unchanged"] == 1, s
    assert requests.get(srv.url + "/readyz").status_code == 200
    # The missing file appears: a reload loads it; back to "all", ready
    # once the junk one is dropped.
    os.symlink(os.path.join(fixtures_dir, "tiny.ivcsc.blosc2-lz4.h5ad"),
               os.path.join(tmp, "missing.h5ad"))
    cfg["datasets"] = cfg["datasets"][:2]
    del cfg["readyz"]
    srv.write_cfg(cfg)
    srv.proc.send_signal(signal.SIGHUP)
    # /readyz was 200 under "any" before the signal: wait for the reload's end.
    deadline = time.time() + 30
    while "reload (SIGHUP) done" not in srv.log_text():
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    r = requests.get(srv.url + "/readyz")
    assert r.status_code == 200 and r.json()["policy"] == "all", r.text
    listed = srv.datasets()
    assert [(d["id"], d["state"]) for d in listed] == [("good", "ready"), ("missing", "ready")]


def test_bad_readyz_value_is_a_start_up_error(ivserve, fixtures_dir):
    proc = ivserve.run("--readyz", "most", os.path.join(fixtures_dir, "tiny.ivcsr.raw.h5ad"),
                       timeout=30)
    assert proc.returncode == 2 and "--readyz" in proc.stderr and "all" in proc.stderr, proc.stderr
