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

    g = c.query("pbmc", var=["CD3E"], by="var")   # gene rows: g.matrix is the CSC
    g.matrix        # scipy.sparse.csc_matrix of X[obs, :][:, var] (cells x genes)
    g.var           # var index of each gene column
    d = c.query("pbmc", var=["CD3E", "MS4A1"], dense=True)
    d.dense         # numpy array (genes x selected cells), zero where nothing is stored

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
    def __init__(self, matrix, obs, obs_names=None, var=None, dense=None, dropped=None):
        self.matrix, self.obs, self.obs_names = matrix, obs, obs_names
        self.var, self.dense, self.dropped = var, dense, dropped


def _by_var(shape, ids, indptr_parts, index_parts, data_parts, dtype):
    """Gene rows (the result's CSC) as a Result."""
    m, var = _assemble((shape[1], shape[0]), ids, indptr_parts, index_parts, data_parts, dtype)
    csc = sp.csc_matrix((m.data, m.indices, m.indptr), shape=tuple(shape))
    return Result(csc, None, var=var)


def _dense(shape, ids, rows, dtype):
    """Dense gene rows as a Result."""
    var = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    d = np.concatenate(rows) if rows else np.zeros((0, shape[0]), dtype)
    return Result(None, None, var=var, dense=d.reshape(len(var), shape[0]))


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


def _parse_binary(buf, by_var=False, dense=False):
    """Parses a whole binary stream (bytes); raises ServerError on an error trailer."""
    mv = memoryview(buf)
    if len(mv) < 40 or bytes(mv[:4]) != b"IVQS":
        raise ValueError("not an ivserve binary stream")
    version, rows, cols = struct.unpack_from("<Iqq", mv, 4)
    if version != 1:
        raise ValueError(f"unknown stream version {version}")
    vdt = np.dtype(bytes(mv[24:32]).rstrip(b"\0").decode())
    idt = np.dtype(bytes(mv[32:40]).rstrip(b"\0").decode())
    pos, parts, kinds, dense_rows = 40, ([], [], [], []), set(), []
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
        if kind not in (1, 3, 4):
            raise ValueError(f"unknown frame kind {kind}")
        kinds.add(kind)
        if kind == 4:
            ids = np.frombuffer(mv, dtype=np.int64, count=n, offset=pos)
            pos += ids.nbytes
            vals = np.frombuffer(mv, dtype=vdt, count=n * nnz, offset=pos)
            pos += vals.nbytes
            parts[0].append(ids)
            dense_rows.append(vals.reshape(n, nnz))
            continue
        for arr_dt, count, dest in ((np.int64, n, 0), (np.int64, n + 1, 1), (idt, nnz, 2), (vdt, nnz, 3)):
            a = np.frombuffer(mv, dtype=arr_dt, count=count, offset=pos)
            pos += a.nbytes
            parts[dest].append(a)
    if len(kinds) > 1:
        raise ValueError("a stream mixes block kinds")
    if not kinds:
        # No block: the frames cannot say what the rows were; the request can.
        kinds = {4} if dense else {3} if by_var else {1}
    if kinds == {4}:
        return _dense((rows, cols), parts[0], dense_rows, vdt)
    if kinds == {3}:
        return _by_var((rows, cols), *parts, vdt)
    m, obs = _assemble((rows, cols), *parts, vdt)
    return Result(m, obs)


def _json_values(vals, dtype):
    return np.array([np.nan if v is None else v for v in vals], dtype=dtype)


def _parse_ndjson(text):
    shape, dtype, idt, parts = None, None, None, ([], [], [], [])
    ended, by_var, dense, dense_rows = False, False, False, []
    for line in text.splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        t = o.get("type")
        if t == "header":
            shape, dtype, idt = o["shape"], np.dtype(o["dtype"]), np.dtype(o["index_dtype"])
            by_var, dense = o.get("by") == "var", bool(o.get("dense"))
        elif t == "block" and dense:
            parts[0].append(np.array(o["var"], np.int64))
            dense_rows.append(np.array([_json_values(r, dtype) for r in o["data"]], dtype)
                              .reshape(len(o["var"]), shape[0]))
        elif t == "block":
            parts[0].append(np.array(o["var" if by_var else "obs"], np.int64))
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
    if dense:
        return _dense(shape, parts[0], dense_rows, dtype)
    if by_var:
        return _by_var(shape, *parts, dtype)
    m, obs = _assemble(tuple(shape), *parts, dtype)
    return Result(m, obs)


def _parse_json(doc):
    if isinstance(doc, (bytes, str)):
        doc = json.loads(doc)
    dtype = np.dtype(doc["dtype"])
    shape = tuple(doc["shape"])
    if doc.get("dense"):
        rows = [np.array([_json_values(r, dtype) for r in doc["data"]], dtype)
                .reshape(len(doc["var"]), shape[0])]
        return _dense(shape, [np.array(doc["var"], np.int64)], rows, dtype)
    parts = ([np.array(doc["var" if doc.get("by") == "var" else "obs"], np.int64)],
             [np.array(doc["indptr"], np.int64)], [np.array(doc["indices"], np.int64)],
             [_json_values(doc["data"], dtype)])
    if doc.get("by") == "var":
        return _by_var(shape, *parts, dtype)
    m = sp.csr_matrix((parts[3][0], parts[2][0], parts[1][0]), shape=shape)
    return Result(m, parts[0][0])


def _pair(res):
    """(matrix, ids): the CSR and obs indices, the CSC and var indices (by
    var), or the dense array and var indices (dense)."""
    if res.dense is not None:
        return res.dense, res.var
    return res.matrix, res.obs if res.var is None else res.var


def parse_binary(buf):
    """Parses a whole binary stream (bytes) into (matrix, ids); raises
    ServerError on an error trailer."""
    return _pair(_parse_binary(buf))


def parse_ndjson(text):
    return _pair(_parse_ndjson(text))


def parse_json(doc):
    return _pair(_parse_json(doc))


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

    def _body(self, obs, var, by=None, dense=False):
        body = {}
        if by is not None:
            body["by"] = by
        if dense:
            body["dense"] = True
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

    def query(self, ds, obs=None, var=None, format="binary", by=None, dense=False, names=True):
        """by="var" gives gene rows (Result.matrix is the CSC of the result,
        Result.var the gene of each column); dense=True gives
        Result.dense, one row of values per gene over the selected cells.
        Cell rows carry Result.obs_names (names=False skips fetching them)."""
        r = self.s.post(
            f"{self.base}/v1/datasets/{ds}/query",
            json=self._body(obs, var, by, dense),
            headers={"Accept": MEDIA[format]},
            timeout=self.timeout,
        )
        self._check(r)
        if format == "binary":
            res = _parse_binary(r.content, by == "var" or dense, dense)
        elif format == "ndjson":
            res = _parse_ndjson(r.text)
        else:
            res = _parse_json(r.content)
        dropped = r.headers.get("X-Ivserve-Dropped-Names")
        res.dropped = json.loads(dropped) if dropped else None
        if names and res.obs is not None and res.var is None and res.dense is None:
            try:
                allnames = self.obs_names(ds)
            except ServerError:
                allnames = None  # names are a convenience: the matrix still stands
            if allnames is not None:
                res.obs_names = allnames[res.obs]
        return res
