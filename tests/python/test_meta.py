"""obs/var read by the C metadata reader equal what anndata reads.

The C side is the `--dump` mode of the unit-test executable test_meta (built
next to the binary, in <build>/tests/); it prints one JSON object per column.
The reference is anndata.experimental.read_elem on the fixtures'
uncompressed expected/<base>.meta.h5ad (Debian's h5py has no Blosc2 plugin),
while the C side reads the compressed fixture itself.

Encodings the fixtures lack (nullable strings, a string index stored as a
group, anndata 0.7 categoricals by object reference, fixed-length strings,
nullable booleans, numeric categories) are written here with h5py and
compared with the values the test wrote.
"""

import json
import math
import os
import subprocess

import h5py
import numpy as np
import pandas as pd
import pytest

from conftest import fixtures_path


def dump_exe():
    binp = os.environ.get("IVSERVE_BIN")
    if not binp:
        pytest.skip("IVSERVE_BIN not set (run through ctest)")
    exe = os.path.join(os.path.dirname(binp), "tests", "test_meta")
    if not os.path.exists(exe):
        pytest.skip("test_meta executable not built: %s" % exe)
    return exe


def dump(path, xgroup=None):
    args = [dump_exe(), "--dump", str(path)] + ([xgroup] if xgroup else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    cols = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return cols, p.stderr


def as_table(cols):
    out = {"obs": {}, "var": {}}
    for c in cols:
        assert "error" not in c, c
        out[c["axis"]][c["name"]] = c
    return out


def fixture_pairs():
    fx = fixtures_path()
    if fx is None:
        return []
    pairs = []
    for sub in ("", "real"):
        man = os.path.join(fx, sub, "manifest.json")
        if not os.path.exists(man):
            continue
        for e in json.load(open(man)):
            if e.get("expected_meta"):
                pairs.append((os.path.join(fx, sub, e["file"]),
                              os.path.join(fx, sub, e["expected_meta"])))
    return pairs


def norm_value(v):
    """A pandas cell as the dump writes it: None for missing."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def compare_series(name, s, c):
    vals = [norm_value(v) for v in s.tolist()]
    got = c["values"]
    assert len(got) == len(vals), name
    assert c["null_count"] == sum(v is None for v in vals), name
    for i, (a, b) in enumerate(zip(got, vals)):
        if isinstance(b, float) and a is not None:
            assert float(a) == b, (name, i, a, b)
        else:
            assert a == b, (name, i, a, b)
    if isinstance(s.dtype, pd.CategoricalDtype):
        assert c["type"] == "categorical", name
        cats = [str(x) for x in s.cat.categories]
        assert c["categories"] == cats, name
        counts = s.value_counts(sort=False).reindex(s.cat.categories).tolist()
        assert c["counts"] == counts, name
        assert c["ordered"] == bool(s.cat.ordered), name


def expected_type(s):
    if isinstance(s.dtype, pd.CategoricalDtype):
        return "categorical"
    if pd.api.types.is_bool_dtype(s.dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(s.dtype):
        return "int"
    if pd.api.types.is_float_dtype(s.dtype):
        return "float"
    return "string"


@pytest.mark.parametrize("pair", fixture_pairs() or [None],
                         ids=lambda p: os.path.basename(p[0]) if p else "none")
def test_fixture_meta_equals_anndata(pair):
    if pair is None:
        pytest.skip("fixtures folder absent")
    from anndata.experimental import read_elem
    fixture, meta = pair
    table = as_table(dump(fixture)[0])
    with h5py.File(meta, "r") as f:
        for axis in ("obs", "var"):
            df = read_elem(f[axis])
            got = table[axis]
            idx_name = f[axis].attrs["_index"]
            assert set(got) == set(df.columns) | {idx_name}, axis
            compare_series(axis + ".index", pd.Series(df.index), got[idx_name])
            for col in df.columns:
                s = df[col]
                assert got[col]["type"] == expected_type(s), (axis, col)
                compare_series(axis + "." + col, s, got[col])
            # Column order is the file's.
            order = [c for c in got if c != idx_name]
            assert order == list(df.columns)


def str_dtype():
    return h5py.string_dtype("utf-8")


def enc(obj, t, v="0.2.0"):
    obj.attrs["encoding-type"] = t
    obj.attrs["encoding-version"] = v


def write_frame(g, index_name, order):
    enc(g, "dataframe")
    g.attrs["_index"] = index_name
    g.attrs.create("column-order", np.array(order, dtype=object), dtype=str_dtype())


def test_newer_encodings(tmp_path):
    """nullable-string-array (also as the index), nullable-boolean,
    numeric categories, ordered categoricals, uint columns, NaN floats."""
    p = tmp_path / "new.h5ad"
    n = 6
    with h5py.File(p, "w") as f:
        obs = f.create_group("obs")
        write_frame(obs, "_index", ["nstr", "nbool", "numcat", "ordcat", "u", "fl", "fixed"])
        ix = obs.create_group("_index")
        enc(ix, "nullable-string-array", "0.1.0")
        ix.attrs["na-value"] = "NA"
        ix.create_dataset("values", data=np.array(["c%d" % i for i in range(n)], dtype=object),
                          dtype=str_dtype())
        ix.create_dataset("mask", data=np.zeros(n, bool))
        g = obs.create_group("nstr")
        enc(g, "nullable-string-array", "0.1.0")
        g.create_dataset("values", data=np.array(["a", "", "b", "x", "é", "z"], dtype=object),
                         dtype=str_dtype())
        g.create_dataset("mask", data=np.array([0, 0, 1, 0, 0, 1], bool))
        g = obs.create_group("nbool")
        enc(g, "nullable-boolean", "0.1.0")
        g.create_dataset("values", data=np.array([1, 0, 1, 1, 0, 0], bool))
        g.create_dataset("mask", data=np.array([0, 1, 0, 0, 0, 1], bool))
        g = obs.create_group("numcat")
        enc(g, "categorical")
        g.attrs["ordered"] = False
        g.create_dataset("categories", data=np.array([1.5, 2.0, 10.25]))
        g.create_dataset("codes", data=np.array([0, 1, 2, -1, 2, 2], np.int8))
        g = obs.create_group("ordcat")
        enc(g, "categorical")
        g.attrs["ordered"] = True
        g.create_dataset("categories", data=np.array([3, 1, 2], np.int64))
        g.create_dataset("codes", data=np.array([2, 1, 0, 0, 1, 2], np.int16))
        obs.create_dataset("u", data=np.array([0, 1, 2, 3, 4, 2**31 + 5], np.uint32))
        obs.create_dataset("fl", data=np.array([0.5, np.nan, -1e30, np.inf, 2, 3], np.float32))
        obs.create_dataset("fixed", data=np.array([b"ab", b"abcdefgh", b"", b"x y", b"q", b"zz"],
                                                  dtype="S8"))
        var = f.create_group("var")
        write_frame(var, "gene", [])
        var.create_dataset("gene", data=np.array(["g0", "g1"], dtype=object), dtype=str_dtype())
    t = as_table(dump(p)[0])
    o = t["obs"]
    assert o["_index"]["values"] == ["c%d" % i for i in range(n)]
    assert o["_index"]["index"] is True
    assert o["nstr"]["values"] == ["a", "", None, "x", "é", None]
    assert o["nstr"]["type"] == "string" and o["nstr"]["null_count"] == 2
    assert o["nbool"]["values"] == [True, None, True, True, False, None]
    assert o["nbool"]["type"] == "bool" and o["nbool"]["encoding"] == "nullable-boolean"
    assert o["numcat"]["categories"] == ["1.5", "2.0", "10.25"]
    assert o["numcat"]["cats_numeric"] is True
    assert o["numcat"]["values"] == ["1.5", "2.0", "10.25", None, "10.25", "10.25"]
    assert o["numcat"]["counts"] == [1, 1, 3]
    assert o["ordcat"]["ordered"] is True
    assert o["ordcat"]["categories"] == ["3", "1", "2"]
    assert o["ordcat"]["values"] == ["2", "1", "3", "3", "1", "2"]
    assert o["u"]["type"] == "int" and o["u"]["values"][-1] == 2**31 + 5
    fl = o["fl"]["values"]
    assert fl[0] == 0.5 and fl[1] is None and fl[3] == "inf" and o["fl"]["null_count"] == 1
    assert float(fl[2]) == float(np.float32(-1e30))
    assert o["fixed"]["values"] == ["ab", "abcdefgh", "", "x y", "q", "zz"]
    assert t["var"]["gene"]["values"] == ["g0", "g1"]
    assert list(t["var"]) == ["gene"]


def test_anndata07_layout(tmp_path):
    """anndata 0.7: no encoding attrs on columns, categoricals as codes
    datasets whose `categories` attribute is an object reference; the
    index a fixed-length string dataset; no var group at all."""
    p = tmp_path / "old.h5ad"
    with h5py.File(p, "w") as f:
        x = f.create_group("X")
        x.attrs["shape"] = np.array([4, 3], np.int64)
        obs = f.create_group("obs")
        obs.attrs["_index"] = "cell"
        obs.attrs["column-order"] = np.array(["ct", "n"], dtype=object).astype("S")
        obs.attrs["encoding-type"] = "dataframe"
        obs.attrs["encoding-version"] = "0.1.0"
        obs.create_dataset("cell", data=np.array([b"a", b"b", b"c", b"d"], dtype="S1"))
        cats = obs.create_group("__categories")
        cds = cats.create_dataset("ct", data=np.array(["T", "B"], dtype=object),
                                  dtype=str_dtype())
        codes = obs.create_dataset("ct", data=np.array([1, -1, 0, 1], np.int8))
        codes.attrs["categories"] = cds.ref
        obs.create_dataset("n", data=np.array([5, 6, 7, 8], np.int32))
    t = as_table(dump(p)[0])
    o = t["obs"]
    assert o["cell"]["values"] == ["a", "b", "c", "d"]
    assert o["ct"]["type"] == "categorical"
    assert o["ct"]["values"] == ["B", None, "T", "B"]
    assert o["ct"]["counts"] == [1, 2]
    assert o["n"]["values"] == [5, 6, 7, 8]
    # No var group: a range index of the matrix's column count.
    assert t["var"]["_index"]["values"] == ["0", "1", "2"]


@pytest.mark.parametrize("case", ["code_range", "missing_col", "length", "bad_encoding",
                                  "shape"])
def test_bad_files_are_refused(tmp_path, case):
    p = tmp_path / ("bad_%s.h5ad" % case)
    with h5py.File(p, "w") as f:
        x = f.create_group("X")
        x.attrs["shape"] = np.array([3 if case != "shape" else 4, 1], np.int64)
        obs = f.create_group("obs")
        write_frame(obs, "_index", ["c"])
        obs.create_dataset("_index", data=np.array(["a", "b", "c"], dtype=object),
                           dtype=str_dtype())
        if case == "code_range":
            g = obs.create_group("c")
            enc(g, "categorical")
            g.create_dataset("categories", data=np.array(["x"], dtype=object), dtype=str_dtype())
            g.create_dataset("codes", data=np.array([0, 1, 0], np.int8))
        elif case == "length":
            obs.create_dataset("c", data=np.arange(5))
        elif case == "bad_encoding":
            g = obs.create_group("c")
            enc(g, "awkward-array")
        elif case == "shape":
            obs.create_dataset("c", data=np.arange(3))
        var = f.create_group("var")
        write_frame(var, "_index", [])
        var.create_dataset("_index", data=np.array(["g"], dtype=object), dtype=str_dtype())
    cols, err = dump(p)
    assert len(cols) == 1 and "error" in cols[0], cols
    assert str(p) in err
    want = {"code_range": "code 1", "missing_col": "obs/c", "length": "5 elements",
            "bad_encoding": "awkward-array", "shape": "4"}[case]
    assert want in err, err


def write_invalid(path, case):
    """A valid packed file (ivref) whose obs or var then gets one thing
    anndata cannot read."""
    import scipy.sparse as sp
    import ivref
    X = sp.csr_matrix(np.arange(12, dtype=np.int32).reshape(4, 3))
    ivref.write_iv(str(path), X)
    bad = b"c\xff"   # not UTF-8
    with h5py.File(path, "r+") as f:
        obs = f["obs"]
        cols = ["ct"]
        if case == "unsupported_then_dup":
            g = obs.create_group("awk")
            enc(g, "awkward-array")
            cols = ["awk", "ct"]
        g = obs.create_group("ct")
        enc(g, "categorical")
        g.attrs["ordered"] = False
        cats = {"dup_category": ["T", "B", "T"], "unsupported_then_dup": ["B", "B"],
                "utf8_category": [b"T", bad]}.get(case, ["T", "B"])
        if case == "dup_numeric_category":
            g.create_dataset("categories", data=np.array([1.0, 2.5, 1.0]))
        else:
            g.create_dataset("categories", data=np.array(cats, dtype=object), dtype=str_dtype())
        codes = {"code_past_end": [0, 1, 2, 0], "code_below_missing": [0, -2, 1, -1]}
        g.create_dataset("codes", data=np.array(codes.get(case, [0, 1, 1, -1]), np.int8))
        if case == "utf8_value":
            obs.create_dataset("note", data=np.array([b"a", b"b", bad, b"d"], dtype=object),
                               dtype=str_dtype())
            cols.append("note")
        if case == "utf8_column_name":
            obs.create_dataset(bad, data=np.arange(4))
            cols.append(bad)
        obs.attrs.create("column-order", np.array([c.encode() if isinstance(c, str) else c
                                                   for c in cols], dtype=object),
                         dtype=str_dtype())
        if case in ("utf8_obs_name", "utf8_var_name"):
            ax = f["obs" if case == "utf8_obs_name" else "var"]
            names = [x for x in ax["_index"][...]]
            names[1] = bad
            del ax["_index"]
            ax.create_dataset("_index", data=np.array(names, dtype=object), dtype=str_dtype())
            enc(ax["_index"], "string-array")


INVALID = {
    "dup_category": "obs/ct/categories: category 'T' appears twice (at 0 and 2)",
    "dup_numeric_category": "obs/ct/categories: category '1.0' appears twice",
    "unsupported_then_dup": "obs/ct/categories: category 'B' appears twice",
    "utf8_category": "obs/ct/categories: category 1 is not valid UTF-8 (byte 0xff",
    "utf8_value": "obs/note: row 2 is not valid UTF-8",
    "utf8_column_name": "column name 1 is not valid UTF-8",
    "utf8_obs_name": "obs/_index: row 1 is not valid UTF-8",
    "utf8_var_name": "var/_index: row 1 is not valid UTF-8",
    "code_past_end": "code 2 at row 2 is outside the 2 categories",
    "code_below_missing": "code -2 at row 1 is outside the 2 categories",
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_metadata_anndata_cannot_read_is_refused(ivserve, tmp_path, case):
    """Duplicate categories, strings that are not UTF-8 (names, column
    names, categories, values) and codes past the categories: the loader
    refuses the file naming the element, so check fails it (and the server
    leaves it out, test_damaged), even when an element in an encoding the
    reader does not read comes first."""
    p = tmp_path / ("%s.h5ad" % case)
    write_invalid(p, case)
    cols, err = dump(p)
    assert len(cols) == 1 and "error" in cols[0], cols
    assert INVALID[case] in err, err
    proc = ivserve.check(p)
    ivserve.assert_error(proc, str(p), INVALID[case])
    # What pack and export call on their input.
    v = subprocess.run([dump_exe(), "--validate", str(p)], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.strip() != "ok" and INVALID[case] in v.stderr, v


def test_valid_metadata_with_an_unsupported_column_still_passes(ivserve, tmp_path):
    p = tmp_path / "awk.h5ad"
    write_invalid(p, "unsupported_then_dup")
    with h5py.File(p, "r+") as f:
        f["obs/ct/categories"][...] = np.array(["B", "T"], dtype=object)
    proc = ivserve.check(p)
    ivserve.assert_ok(proc)
    assert "metadata: not loaded" in proc.stdout and "awkward-array" in proc.stdout, proc.stdout
    v = subprocess.run([dump_exe(), "--validate", str(p)], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout == "ok\n", v
