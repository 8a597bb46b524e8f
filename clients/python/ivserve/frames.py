"""obs / var tables rebuilt as pandas DataFrames from the server's description.

The dataset document lists every column with its type ("categorical",
"int", "float", "bool", "string"), the file's encoding ("nullable-integer",
"string-array", ...), the stored numeric dtype, and for categoricals the
categories in their stored order and whether they are ordered.  Values
come column by column from GET .../obs/{column}, paged by offset/limit,
with missing values as JSON null.  The pandas dtype follows from both, as
anndata chooses it when it reads the file: categoricals keep their
category order, nullable integers and booleans become pandas' masked
"Int64" / "boolean" arrays, plain ones numpy arrays in the stored width.
Columns the server computed from the matrix (total_counts, n_genes, ...)
are left out unless asked for: they are not in the file.
"""
import math

import numpy as np
import pandas as pd

_NULLABLE_INT = {"int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
                 "uint8": "UInt8", "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64"}


def _numeric_categories(names, values):
    """Categories of a categorical whose categories are numbers: the server
    sends the rows' values as numbers and the category names formatted."""
    if all(n in ("True", "False") for n in names):
        return pd.Index([n == "True" for n in names], dtype=bool)
    nums = [float(n) for n in names]
    if all(not any(c in n for c in ".eEn") for n in names) and \
            all(math.isfinite(x) and x == int(x) for x in nums):
        return pd.Index([int(n) for n in names], dtype=np.int64)
    return pd.Index(nums, dtype=np.float64)


def column_series(spec, values, index):
    """A pandas Series for one column from its schema entry and its values
    (a list with None for missing ones)."""
    kind, enc = spec["type"], spec.get("encoding", "")
    dtype = spec.get("dtype")
    name = spec["name"]
    if kind == "categorical":
        names = [c["name"] for c in spec.get("categories", [])]
        # The distinct Python types first (one pass in C), not a test per row.
        types = set(map(type, values))
        numeric = any(issubclass(t, (int, float)) and not issubclass(t, bool) for t in types)
        if numeric:
            cats = _numeric_categories(names, values)
            lookup = {float(c): c for c in cats} if cats.dtype != bool else None
            if lookup is not None:
                values = [None if v is None else lookup.get(float(v), v) for v in values]
            else:
                values = [None if v is None else bool(v) for v in values]
        else:
            cats = pd.Index(names, dtype=object)
        arr = pd.Categorical(values, categories=cats, ordered=bool(spec.get("ordered")))
        return pd.Series(arr, index=index, name=name)
    if kind == "int":
        if enc.startswith("nullable") or spec.get("null_count", 0) > 0:
            arr = pd.array(values, dtype=_NULLABLE_INT.get(dtype or "int64", "Int64"))
        else:
            arr = np.asarray(values, dtype=np.int64).astype(dtype or "int64", copy=False)
        return pd.Series(arr, index=index, name=name)
    if kind == "float":
        # None becomes NaN, the missing value of a float column.
        arr = np.array(values, dtype=np.float64).astype(dtype or "float64", copy=False)
        return pd.Series(arr, index=index, name=name)
    if kind == "bool":
        if enc.startswith("nullable") or spec.get("null_count", 0) > 0:
            return pd.Series(pd.array(values, dtype="boolean"), index=index, name=name)
        return pd.Series(np.asarray(values, dtype=bool), index=index, name=name)
    if kind == "string":
        if enc.startswith("nullable"):
            return pd.Series(pd.array(values, dtype="string"), index=index, name=name)
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return pd.Series(arr, index=index, name=name)
    raise ValueError(f"column {name!r} has an unknown type {kind!r}")


def make_index(names, index_name):
    """The DataFrame index: anndata names it after the stored index column
    unless that column is called "_index"."""
    arr = np.empty(len(names), dtype=object)
    arr[:] = names
    return pd.Index(arr, dtype=object, name=None if index_name in (None, "_index") else index_name)
