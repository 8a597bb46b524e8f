"""numpy-style keys turned into the server's selection objects.

A key is what a user writes between the brackets of ds[obs, var]: an int,
a slice (open-ended, negative, any step), a range, a boolean mask, a list
or array of ints or of names, a pandas Index or Series, a Where, Ellipsis
or None.  to_wire() checks it against the axis length the way numpy would
(negative indices counted from the end, out-of-range ones refused here,
with the axis named) and returns the JSON selection the query and count
routes take, or None for "all".  Contiguous selections go as a range and
masks as base64 bits, so the request stays small whatever the axis length.

positions() is the other half: the row numbers a selection stands for,
computed without the server where the key says them, which the client
needs to put obs and var rows beside a result in the selection's order.
"""
import base64
import numbers

import numpy as np
import pandas as pd

from .errors import IvserveError, IvserveIndexError, IvserveKeyError


class Where:
    """A filter in the server's where grammar (TileDB-SOMA value filters),
    for use as a key: ds[Where("cell_type == 'B cell'"), :]."""

    def __init__(self, expr):
        if not isinstance(expr, str):
            raise TypeError("a where expression is a string")
        self.expr = expr

    def __repr__(self):
        return f"Where({self.expr!r})"


def _bad(axis, message):
    return IvserveError(None, "bad_selection", f"{axis}: {message}")


def _out_of_range(axis, message):
    return IvserveIndexError(None, "bad_selection", f"{axis}: {message}")


def where_text(expr):
    """A where expression with pandas query's `&`, `|` and `~` written as
    the server's `and`, `or` and `not` (outside quoted strings and
    backquoted names; `&&` and `||` pass as they are).  In pandas query
    `&` and `|` bind as `and` and `or` do, so the meaning is kept."""
    if not isinstance(expr, str):
        raise TypeError("a where expression is a string")
    out, i, n, quote = [], 0, len(expr), None
    while i < n:
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\" and quote != "`" and i + 1 < n:
                out.append(expr[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
            out.append(c)
        elif c in "&|" and i + 1 < n and expr[i + 1] == c:
            out.append(c + c)
            i += 1
        elif c in "&|":
            out.append(" and " if c == "&" else " or ")
        elif c == "~":
            out.append(" not ")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _is_names(arr):
    if arr.dtype.kind in "US":
        return True
    if arr.dtype == object and arr.size:
        return all(isinstance(x, str) for x in arr.ravel())
    return False


def _slice_wire(start, stop, step):
    if step == 1:
        return {"range": [start, max(start, stop)]}
    return {"index": list(range(start, stop, step))}


def _ints(arr, n, axis):
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise _bad(axis, f"cannot index with an array of dtype {arr.dtype}")
    a = arr.astype(np.int64).ravel()
    bad = (a < -n) | (a >= n)
    if bad.any():
        raise _out_of_range(axis, f"index {int(a[bad][0])} is out of bounds for an axis of length {n}")
    return np.where(a < 0, a + n, a)


def _mask(arr, n, axis):
    if arr.shape != (n,):
        raise _out_of_range(axis, f"a boolean mask of length {arr.size} does not match the axis length {n}")
    return arr.astype(bool)


def _array(key):
    """key as a numpy array, or None when it is not array-like."""
    if isinstance(key, (pd.Series, pd.Index)):
        if isinstance(key.dtype, pd.BooleanDtype) or key.dtype == "boolean":
            if key.isna().any():
                raise TypeError("a boolean mask cannot contain missing values")
            return key.to_numpy(dtype=bool)
        return key.to_numpy()
    if isinstance(key, (list, tuple, np.ndarray, pd.api.extensions.ExtensionArray)):
        arr = np.asarray(key)
        if arr.ndim != 1:
            raise TypeError("selections are one-dimensional")
        return arr
    return None


def _fold(s):
    """ASCII lower case, as the server folds names (not str.lower's Unicode rules)."""
    return s.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def match_names(names, keys):
    """Row of each name among keys as the server finds it: the first row
    with exactly that string, else the row of the one distinct string
    equal to it up to ASCII case; -1 when none is (or several are)."""
    first, folded = {}, {}
    for i, k in enumerate(keys):
        k = str(k)
        if k not in first:
            first[k] = i
            f = _fold(k)
            folded[f] = -2 if f in folded else i
    out = []
    for n in names:
        n = str(n)
        i = first.get(n)
        if i is None:
            i = folded.get(_fold(n), -1)
            i = -1 if i < 0 else i
        out.append(i)
    return out


def to_wire(key, n, axis):
    """The server's selection object for key on an axis of length n, or
    None for the whole axis."""
    if key is None or key is Ellipsis:
        return None
    if isinstance(key, Where):
        return {"where": where_text(key.expr)}
    if isinstance(key, dict):
        return key
    if isinstance(key, slice):
        if key == slice(None):
            return None
        return _slice_wire(*key.indices(n))
    if isinstance(key, range):
        # A range is a sequence of ints (negative ones count from the end),
        # not a slice; a plain ascending one within the axis is sent as such.
        if key.step == 1 and 0 <= key.start and key.stop <= n:
            return {"range": [key.start, max(key.start, key.stop)]}
        return {"index": _ints(np.asarray(key, dtype=np.int64), n, axis).tolist()}
    if isinstance(key, (bool, np.bool_)):
        raise TypeError("a single boolean is not a selection; use a mask of the axis length")
    if isinstance(key, numbers.Integral):
        return {"index": _ints(np.asarray([key]), n, axis).tolist()}
    if isinstance(key, str):
        return {"names": [key]}
    arr = _array(key)
    if arr is None:
        raise TypeError(f"cannot select {axis} with a {type(key).__name__}")
    if arr.dtype == bool:
        bits = np.packbits(_mask(arr, n, axis).astype(np.uint8), bitorder="little")
        return {"mask": base64.b64encode(bits.tobytes()).decode("ascii")}
    if _is_names(arr):
        return {"names": [str(x) for x in arr]}
    return _index_wire(_ints(arr, n, axis), n)


def _index_wire(idx, n):
    """An index list, sent in its smallest exact form: a run as a range,
    a long strictly increasing list as a mask (the server keeps file
    order for a mask, which is that list's order), else the list, whose
    JSON costs about 7 bytes an index against n/6 bytes for a mask."""
    k = len(idx)
    if k > 1:
        d = np.diff(idx)
        if np.all(d == 1):
            return {"range": [int(idx[0]), int(idx[-1]) + 1]}
        if k > 1024 and np.all(d > 0) and n < 24 * k:
            bits = np.zeros(n, dtype=np.uint8)
            bits[idx] = 1
            packed = np.packbits(bits, bitorder="little")
            return {"mask": base64.b64encode(packed.tobytes()).decode("ascii")}
    return {"index": idx.tolist()}


def positions(wire, n):
    """Row numbers of a wire selection that says them itself (index,
    range, mask, all), or None when only the server can tell (names,
    filters)."""
    if wire is None:
        return np.arange(n, dtype=np.int64)
    if set(wire) - {"index", "range", "mask"}:
        return None
    if "index" in wire:
        return np.asarray(wire["index"], dtype=np.int64)
    if "range" in wire:
        a, b = wire["range"]
        return np.arange(a, b, dtype=np.int64)
    m = wire["mask"]
    if isinstance(m, str):
        bits = np.unpackbits(np.frombuffer(base64.b64decode(m), np.uint8), bitorder="little")
        return np.flatnonzero(bits[:n]).astype(np.int64)
    return np.flatnonzero(np.asarray(m, dtype=bool)).astype(np.int64)


def subselect(pos, key, names, axis):
    """Rows of a resolved selection (pos, the row numbers it stands for)
    picked by a further key, numpy-style on pos; names are looked up among
    the selected rows' names (names: the axis' names at pos)."""
    if key is None or key is Ellipsis or (isinstance(key, slice) and key == slice(None)):
        return pos
    if isinstance(key, (Where, dict)):
        raise TypeError("a filter applies to the whole dataset: use ds.where() or ds[...] "
                        "with the filter first")
    if isinstance(key, str):
        key = [key]
    if isinstance(key, (slice, numbers.Integral)) and not isinstance(key, (bool, np.bool_)):
        if isinstance(key, numbers.Integral):
            return pos[_ints(np.asarray([key]), len(pos), axis)]
        return pos[key]
    if isinstance(key, range):
        key = np.asarray(key)
    arr = _array(key)
    if arr is None:
        raise TypeError(f"cannot select {axis} with a {type(key).__name__}")
    if arr.dtype == bool:
        return pos[_mask(arr, len(pos), axis)]
    if _is_names(arr):
        found = match_names(arr, names)
        missing = [str(x) for x, i in zip(arr, found) if i < 0]
        if missing:
            raise IvserveKeyError(None, "unknown_name",
                                  f"{axis}: names not in the selection: {missing[:10]}")
        return pos[found]
    return pos[_ints(arr, len(pos), axis)]
