"""Small Python client for the ivserve HTTP API.

Turns any of the three response encodings (binary application/vnd.ivserve.csr,
application/x-ndjson, application/json) into a scipy.sparse.csr_matrix plus
the original obs index of every row.  Needs numpy, scipy and requests.

    from ivclient import Client
    c = Client("http://127.0.0.1:8080")
    res = c.query("pbmc", obs=range(0, 100), var=["CD3E", "MS4A1"])
    res.matrix      # scipy.sparse.csr_matrix, rows in the requested order
    res.obs         # numpy int64 array: obs index of each row
    res.obs_names   # names of those rows when the server's metadata has them, else None

Names come from the dataset's obs index, fetched once per dataset and
client (paged through GET .../obs/{index}) and cached; pass names=False to
query() to skip that.  Names the server dropped (missing="ignore") or
matched only by ignoring case are in res.dropped, the parsed
X-Ivserve-Dropped-Names header (None when it was not sent).
"""
import base64
import json
import struct

import numpy as np
import requests
import scipy.sparse as sp

MEDIA = {
    "binary": "application/vnd.ivserve.csr",
    "ndjson": "application/x-ndjson",
    "json": "application/json",
}


class ServerError(Exception):
    """An error answered by the server, or reported in a stream's trailer."""

    def __init__(self, status, code, message):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class Result:
    def __init__(self, matrix, obs, obs_names=None, dropped=None):
        self.matrix, self.obs, self.obs_names, self.dropped = matrix, obs, obs_names, dropped


def selection(sel, axis_len=None):
    """A selection object from Python values: None (all), a range or slice,
    a list/array of ints, a boolean numpy array (sent as a base64 mask), a
    list of strings (names) or a dict passed through."""
    if sel is None:
        return None
    if isinstance(sel, dict):
        return sel
    if isinstance(sel, range) and sel.step == 1:
        return {"range": [sel.start, sel.stop]}
    if isinstance(sel, slice):
        start, stop, step = sel.indices(axis_len if axis_len is not None else sel.stop)
        if step == 1:
            return {"range": [start, stop]}
        return {"index": list(range(start, stop, step))}
    arr = np.asarray(sel)
    if arr.dtype == bool:
        bits = np.packbits(arr.astype(np.uint8), bitorder="little")
        return {"mask": base64.b64encode(bits.tobytes()).decode()}
    if arr.dtype.kind in "US" or (arr.dtype == object and len(arr) and isinstance(arr.flat[0], str)):
        return {"names": [str(x) for x in arr]}
    return {"index": [int(x) for x in arr.ravel()]}


def _assemble(shape, obs_parts, indptr_parts, index_parts, data_parts, dtype):
    rows, cols = shape
    if indptr_parts:
        offs, ip = 0, [np.zeros(1, np.int64)]
        for p in indptr_parts:
            ip.append(p[1:] + offs)
            offs += int(p[-1])
        indptr = np.concatenate(ip)
        indices = np.concatenate(index_parts) if index_parts else np.zeros(0, np.int32)
        data = np.concatenate(data_parts) if data_parts else np.zeros(0, dtype)
        obs = np.concatenate(obs_parts)
    else:
        indptr = np.zeros(rows + 1, np.int64)
        indices, data, obs = np.zeros(0, np.int32), np.zeros(0, dtype), np.zeros(0, np.int64)
    m = sp.csr_matrix((data, indices, indptr), shape=(rows, cols))
    return m, obs.astype(np.int64)


def parse_binary(buf):
    """Parses a whole binary stream (bytes); raises ServerError on an error trailer."""
    mv = memoryview(buf)
    if len(mv) < 40 or bytes(mv[:4]) != b"IVQS":
        raise ValueError("not an ivserve binary stream")
    version, rows, cols = struct.unpack_from("<Iqq", mv, 4)
    if version != 1:
        raise ValueError(f"unknown stream version {version}")
    vdt = np.dtype(bytes(mv[24:32]).rstrip(b"\0").decode())
    idt = np.dtype(bytes(mv[32:40]).rstrip(b"\0").decode())
    pos, parts = 40, ([], [], [], [])
    while True:
        if pos + 24 > len(mv):
            raise ValueError("stream ended without a trailer (truncated)")
        kind, status, n, nnz = struct.unpack_from("<IIqq", mv, pos)
        pos += 24
        if kind == 2:
            (ml,) = struct.unpack_from("<I", mv, pos)
            msg = bytes(mv[pos + 4 : pos + 4 + ml])
            if status != 0:
                err = json.loads(msg)["error"]
                raise ServerError(status, err["code"], err["message"])
            break
        if kind != 1:
            raise ValueError(f"unknown frame kind {kind}")
        for arr_dt, count, dest in ((np.int64, n, 0), (np.int64, n + 1, 1), (idt, nnz, 2), (vdt, nnz, 3)):
            a = np.frombuffer(mv, dtype=arr_dt, count=count, offset=pos)
            pos += a.nbytes
            parts[dest].append(a)
    return _assemble((rows, cols), *parts, vdt)


def _json_values(vals, dtype):
    return np.array([np.nan if v is None else v for v in vals], dtype=dtype)


def parse_ndjson(text):
    shape, dtype, idt, parts = None, None, None, ([], [], [], [])
    ended = False
    for line in text.splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        t = o.get("type")
        if t == "header":
            shape, dtype, idt = o["shape"], np.dtype(o["dtype"]), np.dtype(o["index_dtype"])
        elif t == "block":
            parts[0].append(np.array(o["obs"], np.int64))
            parts[1].append(np.array(o["indptr"], np.int64))
            parts[2].append(np.array(o["indices"], idt))
            parts[3].append(_json_values(o["data"], dtype))
        elif t == "end":
            if o["status"] != "ok":
                e = o["error"]
                raise ServerError(o.get("http_status", 500), e["code"], e["message"])
            ended = True
    if shape is None or not ended:
        raise ValueError("NDJSON stream is truncated")
    return _assemble(tuple(shape), *parts, dtype)


def parse_json(doc):
    if isinstance(doc, (bytes, str)):
        doc = json.loads(doc)
    dtype = np.dtype(doc["dtype"])
    m = sp.csr_matrix(
        (_json_values(doc["data"], dtype), np.array(doc["indices"], np.int64), np.array(doc["indptr"], np.int64)),
        shape=tuple(doc["shape"]),
    )
    return m, np.array(doc["obs"], np.int64)


class Client:
    def __init__(self, base_url, token=None, session=None, timeout=60):
        self.base = base_url.rstrip("/")
        self.s = session or requests.Session()
        self.timeout = timeout
        if token:
            self.s.headers["Authorization"] = f"Bearer {token}"
        self._obs_names = {}

    def _check(self, r):
        if r.status_code >= 400:
            try:
                e = r.json()["error"]
                raise ServerError(r.status_code, e["code"], e["message"])
            except (ValueError, KeyError):
                raise ServerError(r.status_code, "http", r.text[:200])
        return r

    def datasets(self):
        return self._check(self.s.get(f"{self.base}/v1/datasets", timeout=self.timeout)).json()["datasets"]

    def dataset(self, ds):
        return self._check(self.s.get(f"{self.base}/v1/datasets/{ds}", timeout=self.timeout)).json()

    def _body(self, obs, var):
        body = {}
        if obs is not None:
            body["obs"] = selection(obs)
        if var is not None:
            body["var"] = selection(var)
        return body

    def count(self, ds, obs=None, var=None):
        r = self.s.post(f"{self.base}/v1/datasets/{ds}/count", json=self._body(obs, var), timeout=self.timeout)
        return self._check(r).json()

    def obs_names(self, ds, page=100000):
        """Every obs name of dataset ds as a numpy object array (cached), or
        None when the server has no obs metadata for it."""
        if ds in self._obs_names:
            return self._obs_names[ds]
        doc = self.dataset(ds)
        frame = doc.get("obs")
        if not frame or not frame.get("index"):
            self._obs_names[ds] = None
            return None
        col = requests.utils.quote(frame["index"], safe="")
        names, offset = [], 0
        while True:
            r = self.s.get(f"{self.base}/v1/datasets/{ds}/obs/{col}",
                           params={"offset": offset, "limit": page}, timeout=self.timeout)
            vals = self._check(r).json()["values"]
            names.extend(vals)
            offset += len(vals)
            if len(vals) < page or offset >= frame["n_rows"]:
                break
        arr = np.array(names, dtype=object)
        self._obs_names[ds] = arr
        return arr

    def query(self, ds, obs=None, var=None, format="binary", names=True):
        r = self.s.post(
            f"{self.base}/v1/datasets/{ds}/query",
            json=self._body(obs, var),
            headers={"Accept": MEDIA[format]},
            timeout=self.timeout,
        )
        self._check(r)
        if format == "binary":
            m, rows = parse_binary(r.content)
        elif format == "ndjson":
            m, rows = parse_ndjson(r.text)
        else:
            m, rows = parse_json(r.content)
        dropped = r.headers.get("X-Ivserve-Dropped-Names")
        dropped = json.loads(dropped) if dropped else None
        obs_names = None
        if names:
            try:
                allnames = self.obs_names(ds)
            except ServerError:
                allnames = None  # names are a convenience: the matrix still stands
            if allnames is not None:
                obs_names = allnames[rows]
        return Result(m, rows, obs_names, dropped)
