"""The OpenAPI document (GET /openapi.json, server/openapi.json) against the
real server.

Checks that the served document is the repository's file and a well-formed
OpenAPI 3.1 document whose references all resolve; that every route the
Python tests call (found by reading their string literals) is described;
and that every example in it (parameter examples of a GET, request-body
examples of a POST) is answered 200 with one of the media types the
document lists, and, for JSON, with a body that validates against the
documented schema (a small validator for the keywords the document uses).
"""
import io
import json
import os
import re
import sys
import tokenize

import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
REPO = os.path.dirname(os.path.dirname(HERE))
SPEC_FILE = os.path.join(REPO, "server", "openapi.json")

from test_http_server import Server  # noqa: E402
from test_http_viewer import make_data, write_dataset  # noqa: E402

METHODS = ("get", "post", "put", "delete", "patch", "head", "options")


@pytest.fixture(scope="module")
def spec():
    with open(SPEC_FILE) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("openapi"))
    path = os.path.join(tmp, "pbmc.h5ad")
    import numpy as np
    import pandas as pd
    import scipy.sparse as sp
    from anndata.experimental import write_elem
    import h5py
    import ivref
    d = make_data(3, "int32")
    write_dataset(path, *d, orientation="ivcsr", value_dtype=np.dtype("int32"))
    # raw/X and raw/var, for the raw/var routes' examples.
    n_obs, n_raw = d[0].shape[0], d[0].shape[1] + 5
    ivref.write_iv(path, sp.random(n_obs, n_raw, density=0.05, format="csr", dtype=np.float32,
                                   random_state=1), "ivcsc", group="raw/X", mode="a")
    with h5py.File(path, "a") as f:
        write_elem(f, "raw/var", pd.DataFrame({"mt": np.arange(n_raw) % 4 == 0},
                                              index=["rg%d" % i for i in range(n_raw)]))
        # A cell graph, for the obsp routes' examples.
        write_elem(f, "obsp/connectivities", sp.random(n_obs, n_obs, density=0.1, format="csr",
                                                       dtype=np.float32, random_state=2))
    s = Server(tmp, datasets=[{"id": "pbmc", "path": path}])
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


def resolve(spec, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        cur = spec
        for part in ref[2:].split("/"):
            cur = cur[part]
        node = cur
    return node


def test_served_document_is_the_file(srv, spec):
    r = requests.get(srv.url + "/openapi.json")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    assert r.json() == spec
    assert spec["openapi"] == "3.1.0" and spec["info"]["title"] == "ivserve"


def test_every_reference_resolves(spec):
    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                resolve(spec, node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(spec)
    for path, item in spec["paths"].items():
        for m, op in item.items():
            assert m in METHODS, (path, m)
            assert op.get("operationId") and op.get("responses"), (path, m)
            names = [resolve(spec, p)["name"] for p in op["parameters"] if resolve(spec, p)["in"] == "path"]
            assert sorted(names) == sorted(re.findall(r"{(\w+)}", path)), (path, m, names)


# Route words a path's first segment after the dataset id (or at the root) may have.
ROOT = {"v1", "healthz", "readyz", "metrics", "openapi.json"}
SUB = {"query", "count", "obs", "var", "obsm", "varm", "aggregate"}
# Literals the tests use on purpose for paths that do not exist.
NOT_ROUTES = set()


def called_paths():
    """Route-like string literals of the Python tests, as concrete paths: an
    f-string's {...} becomes a segment X; a fragment that starts with a
    dataset sub-route is put under /v1/datasets/X."""
    out = set()
    for name in sorted(os.listdir(HERE)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        with open(os.path.join(HERE, name)) as f:
            toks = tokenize.generate_tokens(io.StringIO(f.read()).readline)
            for t in toks:
                if t.type != tokenize.STRING:
                    continue
                m = re.match(r"^[rbf]*(['\"])(?:{[^}]*})?(/[^'\"?]*)", t.string)
                if not m:
                    continue
                lit = re.sub(r"{[^}]*}", "X", m.group(2)).replace("%s", "X")
                if lit.endswith("/") and lit != "/":
                    lit += "X"
                first = lit.split("/")[1]
                if lit in NOT_ROUTES:
                    continue
                if first in ROOT:
                    if first == "v1" and lit in ("/v1", "/v1/datasets/X/X"):
                        continue
                    out.add(lit)
                elif first in SUB:
                    out.add("/v1/datasets/X" + lit)
    return out


def template_regex(path):
    return re.compile("^" + re.sub(r"{\w+}", "[^/]+", re.escape(path).replace(r"\{", "{").replace(r"\}", "}")) + "$")


def test_every_called_route_is_described(spec):
    regs = [template_regex(p) for p in spec["paths"]]
    called = called_paths()
    assert "/v1/datasets/X/aggregate" in called and "/v1/datasets/X/query" in called
    missing = sorted(p for p in called if not any(r.match(p) for r in regs))
    assert not missing, "routes the tests call but the document does not describe: %s" % missing


def validate(spec, schema, value, where="$"):
    """Checks value against the subset of JSON Schema the document uses."""
    schema = resolve(spec, schema)
    if "oneOf" in schema:
        errors = []
        for s in schema["oneOf"]:
            try:
                validate(spec, s, value, where)
                break
            except AssertionError as e:
                errors.append(str(e))
        else:
            raise AssertionError("%s matches no alternative: %s" % (where, errors))
        return
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        py = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
        ok = False
        for ty in types:
            if ty == "integer":
                ok |= isinstance(value, int) and not isinstance(value, bool)
            elif ty == "number":
                ok |= isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok |= isinstance(value, py[ty])
        assert ok, "%s: %r is not %s" % (where, value, t)
    if "const" in schema:
        assert value == schema["const"], where
    if "enum" in schema:
        assert value in schema["enum"], "%s: %r not in %s" % (where, value, schema["enum"])
    if isinstance(value, dict):
        for k in schema.get("required", []):
            assert k in value, "%s: missing %s" % (where, k)
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                validate(spec, props[k], v, where + "." + k)
            elif isinstance(schema.get("additionalProperties"), dict):
                validate(spec, schema["additionalProperties"], v, where + "." + k)
            else:
                assert schema.get("additionalProperties", True) is not False, "%s: unexpected %s" % (where, k)
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value[:50]):
            validate(spec, schema["items"], v, "%s[%d]" % (where, i))


def examples(spec):
    """(method, path, params, body, operation) for every example."""
    out = []
    for path, item in spec["paths"].items():
        for m, op in item.items():
            params = [resolve(spec, p) for p in op["parameters"]]
            path_vals = {p["name"]: p.get("example") for p in params if p["in"] == "path"}
            concrete = path
            for k, v in path_vals.items():
                assert v is not None, "%s %s: path parameter %s has no example" % (m, path, k)
                concrete = concrete.replace("{%s}" % k, str(v))
            if m == "get":
                q = {p["name"]: p["example"] for p in params if p["in"] == "query" and "example" in p}
                missing = [p["name"] for p in params if p.get("required") and p["in"] == "query" and p["name"] not in q]
                assert not missing, "%s %s: required parameters without example: %s" % (m, path, missing)
                out.append((m, concrete, q, None, op))
            body = op.get("requestBody")
            if body:
                for media in body["content"].values():
                    for name, ex in media.get("examples", {}).items():
                        out.append((m, concrete, {}, ex["value"], op))
    return out


def test_every_example_is_answered_as_described(srv, spec):
    exs = examples(spec)
    assert len(exs) >= 20
    posts = sum(1 for e in exs if e[3] is not None)
    assert posts >= 6
    for m, path, params, body, op in exs:
        url = srv.url + path
        r = requests.request(m.upper(), url, params=params, json=body) if body is not None else \
            requests.request(m.upper(), url, params=params)
        what = "%s %s %s %s" % (m.upper(), path, params, body)
        assert r.status_code == 200, "%s -> %d %s" % (what, r.status_code, r.text[:300])
        resp = resolve(spec, op["responses"]["200"])
        ctype = r.headers["Content-Type"]
        assert ctype in resp["content"], "%s: %s not among %s" % (what, ctype, list(resp["content"]))
        if ctype == "application/json":
            validate(spec, resp["content"][ctype]["schema"], r.json())
        for h in resp.get("headers", {}):
            if h in ("ETag", "Cache-Control", "Vary"):
                assert h in r.headers, "%s: documented header %s not sent" % (what, h)
        if "304" in op["responses"]:
            again = requests.request(m.upper(), url, params=params, json=body,
                                     headers={"If-None-Match": r.headers["ETag"]})
            assert again.status_code == 304, "%s: If-None-Match -> %d" % (what, again.status_code)


def test_error_shape_is_described(srv, spec):
    err = spec["components"]["schemas"]["Error"]
    for path, params in (("/v1/datasets/nope", {}), ("/v1/datasets/pbmc/query", {"obs": "999999"}),
                         ("/v1/datasets/pbmc/aggregate", {"group_by": "x"})):
        r = requests.get(srv.url + path, params=params)
        assert r.status_code >= 400
        validate(spec, err, r.json())
