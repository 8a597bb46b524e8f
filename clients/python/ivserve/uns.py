"""The dataset's uns, from GET /v1/datasets/{id}/uns, as anndata reads it.

The server's document (docs/uns.md) nests dicts as JSON objects and gives
every element as {"dtype", "shape", "data"}; an object is an element when
its "dtype" is a string (a dict's members are all objects).  decode()
rebuilds what anndata.read_h5ad puts in adata.uns for the same file:
numeric and bool scalars as numpy scalars of the dtype (np.int64,
np.float32, np.bool_), string scalars as str, numeric and bool arrays as
numpy arrays of the dtype, string arrays as numpy object arrays of str.
Floats come back bit for bit (the server writes the digits that read back
to the same float32 / float64); NaN and the infinities come as the
strings "NaN", "Infinity", "-Infinity".
"""
import numpy as np

from .errors import IvserveError

_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _bad(what):
    return IvserveError(None, "bad_answer", f"the uns document: {what}")


def _float(x, path):
    if isinstance(x, str):
        if x not in _NONFINITE:
            raise _bad(f"{path}: {x!r} is not a number")
        return _NONFINITE[x]
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise _bad(f"{path}: {x!r} is not a number")
    return float(x)


def _element(v, path):
    dtype, shape, data = v.get("dtype"), v.get("shape"), v.get("data")
    if shape == []:
        items = [data]
    elif isinstance(shape, list) and len(shape) == 1 and isinstance(data, list) and len(data) == shape[0]:
        items = data
    else:
        raise _bad(f"{path}: shape {shape!r} does not fit its data")
    if dtype == "str":
        if not all(isinstance(s, str) for s in items):
            raise _bad(f"{path}: a str element holds a non-string")
        if shape == []:
            return items[0]
        a = np.empty(len(items), dtype=object)
        a[:] = items
        return a
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise _bad(f"{path}: unknown dtype {dtype!r}") from None
    if dt.kind == "f":
        items = [_float(x, path) for x in items]
    elif dt.kind == "b":
        if not all(isinstance(x, bool) for x in items):
            raise _bad(f"{path}: a bool element holds a non-bool")
    elif dt.kind in "iu":
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            raise _bad(f"{path}: an integer element holds a non-integer")
    else:
        raise _bad(f"{path}: unexpected dtype {dtype!r}")
    try:
        a = np.array(items, dtype=dt)
    except OverflowError:
        raise _bad(f"{path}: a value does not fit {dtype}") from None
    return a[0] if shape == [] else a


def _dict(obj, path):
    out = {}
    for k, v in obj.items():
        p = f"{path}/{k}" if path else k
        if not isinstance(v, dict):
            raise _bad(f"{p}: neither a dict nor an element")
        out[k] = _element(v, p) if isinstance(v.get("dtype"), str) else _dict(v, p)
    return out


def decode(doc):
    """(uns dict, skipped list of (path, reason)) of the server's document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("uns"), dict):
        raise _bad("no uns object")
    skipped = [(s["path"], s["reason"]) for s in doc.get("skipped", [])]
    return _dict(doc["uns"], ""), skipped
