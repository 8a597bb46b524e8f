"""What a newcomer meets in the first hour (issue 23), against the real
binary and the bundled example:

  * the example (examples/pbmc_example.h5ad, made by examples/make_example.py)
    has an embedding obsm/X_umap (cells x 2) and categorical cell types, and
    the server serves both, so the viewer opens on a drawn scatter;
  * `ivserve help`, `-h` and `--help` list every command, exit 0;
  * errors name the right spelling: var=NAME -> var_names=, where= ->
    obs_where=, an unknown category -> the close ones (or all of a short
    list), a taken port -> --port / IVSERVE_PORT;
  * the start-up log does not say "all datasets loaded" when one failed;
  * the README's Python client install, run as written (a venv in a
    temporary folder instead of ~/ivs), installs a client that queries the
    example server.
"""

import os
import re
import shlex
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from ivprocess import BIN, ServerProcess  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "pbmc_example.h5ad")
DS = "pbmc_example"
COMMANDS = ("serve", "check", "pack", "export", "token-hash")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(str(tmp_path_factory.mktemp("srv")), [EXAMPLE])
    yield s
    assert s.stop() == 0


def err_message(r):
    return r.json()["error"]["message"]


# ---- the example draws a picture ---------------------------------------------

def test_example_file_has_embedding_and_cell_types():
    with h5py.File(EXAMPLE, "r") as f:
        n_obs = f["obs/_index"].shape[0]
        umap = f["obsm/X_umap"]
        assert umap.shape == (n_obs, 2) and umap.dtype == np.float32
        xy = umap[()]
        assert np.isfinite(xy).all() and (xy.std(0) > 0).all()
        for col in ("cell_type", "cluster"):
            g = f["obs/" + col]
            assert g.attrs["encoding-type"] == "categorical"
            assert g["codes"].shape == (n_obs,)
            assert col in list(f["obs"].attrs["column-order"])
    # The committed example stays small enough to ship in the repository.
    assert os.path.getsize(EXAMPLE) < 1 << 20


def test_server_serves_embedding_and_cell_types(server):
    base = server.url + "/v1/datasets/" + DS
    doc = requests.get(base, timeout=10).json()
    n_obs = doc["shape"][0]
    umap = [a for a in doc["obsm"] if a["name"] == "X_umap"]
    # The viewer draws the first servable obsm array named like umap.
    assert umap and umap[0]["shape"] == [n_obs, 2] and umap[0]["servable"]
    cols = {c["name"]: c for c in doc["obs"]["columns"]}
    assert cols["cell_type"]["type"] == "categorical"
    assert cols["cluster"]["type"] == "categorical"
    got = requests.get(base + "/obsm/X_umap?format=json", timeout=10).json()
    with h5py.File(EXAMPLE, "r") as f:
        want = f["obsm/X_umap"][()]
    assert np.array_equal(np.asarray(got["values"], np.float32).reshape(want.shape), want)
    ct = requests.get(base + "/obs/cell_type?values=true", timeout=10).json()
    assert len(ct["values"]) == n_obs and len(ct["categories"]) == 8
    # The clusters were found from the counts alone; they recover the
    # simulated cell types they are named after.
    cl = requests.get(base + "/obs/cluster?values=true", timeout=10).json()
    agree = np.mean(np.asarray(cl["values"]) == np.asarray(ct["values"]))
    assert agree > 0.9


# ---- help --------------------------------------------------------------------

@pytest.mark.parametrize("arg", ["help", "--help", "-h"])
def test_help_lists_every_command(arg):
    r = subprocess.run([BIN, arg], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for cmd in COMMANDS:
        assert any(re.match(r"  %s\b" % re.escape(cmd), ln) for ln in lines), (cmd, r.stdout)
    # Then the server's options, as before.
    assert "--port N" in r.stdout and "--config FILE" in r.stdout


def test_serve_command_starts_the_server(tmp_path):
    s = ServerProcess(str(tmp_path), ["serve", EXAMPLE])
    try:
        assert requests.get(s.url + "/v1/datasets/" + DS, timeout=10).status_code == 200
    finally:
        assert s.stop() == 0


# ---- errors that name the right spelling --------------------------------------

def test_name_where_a_position_is_expected(server):
    q = server.url + "/v1/datasets/%s/query" % DS
    r = requests.get(q, params={"var": "CD3E"}, timeout=10)
    assert r.status_code in (400, 422) and "var_names=CD3E" in err_message(r)
    r = requests.get(q, params={"obs": "0:2", "var_names": "CD3E"}, timeout=10)
    assert r.status_code == 200
    r = requests.post(q, json={"var": {"index": ["CD3E"]}}, timeout=10)
    assert r.status_code in (400, 422) and '"names"' in err_message(r)


def test_where_points_to_obs_where(server):
    q = server.url + "/v1/datasets/%s/query" % DS
    r = requests.get(q, params={"where": "cell_type == 'B'"}, timeout=10)
    assert r.status_code in (400, 422) and "obs_where=" in err_message(r)
    r = requests.post(q, json={"where": "cell_type == 'B'"}, timeout=10)
    assert r.status_code in (400, 422) and '"obs": {"where"' in err_message(r)
    r = requests.get(q, params={"obs_where": "cell_type == 'B'", "var": "0:3"}, timeout=10)
    assert r.status_code == 200


def test_unknown_category_lists_close_ones(server):
    q = server.url + "/v1/datasets/%s/query" % DS
    # Differs only in case: that one alone is offered.
    msg = err_message(requests.get(q, params={"obs_where": "cell_type == 'b'"}, timeout=10))
    assert "did you mean 'B'?" in msg
    msg = err_message(requests.get(q, params={"obs_where": "cell_type == 'cd14 mono'"}, timeout=10))
    assert "did you mean 'CD14 Mono'?" in msg
    # Near by edit distance.
    msg = err_message(requests.get(q, params={"obs_where": "cell_type == 'CD8T'"}, timeout=10))
    assert "did you mean" in msg and "'CD8 T'" in msg
    # Nothing near, few categories: all of them.
    msg = err_message(requests.get(q, params={"obs_where": "cell_type == 'B cell'"}, timeout=10))
    assert "its categories are 'CD4 T', 'CD8 T', 'NK', 'B'," in msg
    # The JSON filter says the same.
    r = requests.post(q, json={"obs": {"filter": {"column": "cell_type", "eq": "b"}}}, timeout=10)
    assert r.status_code in (400, 422) and "did you mean 'B'?" in err_message(r)


def test_port_in_use_names_the_setting(tmp_path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        port = s.getsockname()[1]
        r = subprocess.run([BIN, "--port", str(port), EXAMPLE], capture_output=True, text=True,
                           timeout=60)
    finally:
        s.close()
    assert r.returncode != 0
    assert "Address already in use" in r.stderr
    assert "--port" in r.stderr and "IVSERVE_PORT" in r.stderr


# ---- the start-up log ----------------------------------------------------------

def wait_for(server, pattern, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, server.log_text())
        if m:
            return m
        time.sleep(0.05)
    raise AssertionError("log never matched %r:\n%s" % (pattern, server.log_text()))


def test_log_counts_failed_loads(tmp_path):
    missing = str(tmp_path / "missing.h5ad")
    s = ServerProcess(str(tmp_path), ["--readyz", "any", EXAMPLE, missing])
    try:
        m = wait_for(s, r"(\d+) of (\d+) datasets loaded, (\d+) failed \(([^)]*)\)")
        assert m.groups() == ("1", "2", "1", "missing")
        assert "all datasets loaded" not in s.log_text()
    finally:
        assert s.stop() == 0


def test_log_says_all_loaded_when_all_did(server):
    wait_for(server, r"all datasets loaded: 1 of 1")


# ---- the README's Python client install, as written -----------------------------

def readme_client_section():
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    start = text.index("### Python (`clients/python`")
    return text[start:text.index("\n### ", start + 1)]


def test_readme_client_install_route(server, tmp_path):
    sec = readme_client_section()
    # The shell commands: the indented lines of the section.
    cmds = [ln.strip() for ln in sec.splitlines() if ln.startswith("    ") and
            ("venv" in ln or "pip install" in ln)]
    assert len(cmds) == 2 and cmds[0].startswith("python3 -m venv"), cmds
    venv = str(tmp_path / "ivs")
    env = dict(os.environ)
    # No network here: pip must find everything installed (the README says
    # the route works offline); PIP_NO_INDEX makes a missing piece an error
    # instead of a download attempt.
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    for cmd in cmds:
        argv = [a.replace("~/ivs", venv) for a in shlex.split(cmd)]
        if argv[0] == "python3":
            argv[0] = "/usr/bin/python3"  # Debian's, as the README's reader has
        r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    # The README's example, run by the venv's Python from outside the
    # repository, so that it imports the installed package.
    code = sec[sec.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    assert "http://127.0.0.1:8080" in code
    code = code.replace("http://127.0.0.1:8080", server.url)
    check = ("\nimport os\nassert os.path.realpath(ivserve.__file__).startswith("
             "os.path.realpath(%r))\n"
             "assert b.to_scipy().shape[1] == 3 and b.to_scipy().shape[0] > 0\n"
             "assert ds.obsm['X_umap'].shape == (ds.shape[0], 2)\n"
             "print('client ok', ds.shape)\n" % venv)
    r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code + check],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "client ok (2000, 1500)" in r.stdout
