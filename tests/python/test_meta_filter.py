"""Differential test of the filter evaluator against pandas.

Random tables (categoricals with missing values, ints, floats with NaN,
bools, strings with quotes, nullable integers and booleans, awkward column
names) are written with anndata; thousands of random filter trees are
written both as where strings and as JSON, evaluated by the C side (the
`--eval` mode of the unit-test executable test_filter) and by pandas, and
the selected rows must agree exactly.

The pandas reference spells out the documented semantics: a comparison,
`in` or `not in` on a missing value is false (pandas' own result for ==, <,
isin on NaN; for != and not in we add `& notna()`), `not` is the plain
complement.
"""

import json
import os
import random
import subprocess

import h5py
import numpy as np
import pandas as pd
import pytest


def eval_exe():
    binp = os.environ.get("IVSERVE_BIN")
    if not binp:
        pytest.skip("IVSERVE_BIN not set (run through ctest)")
    exe = os.path.join(os.path.dirname(binp), "tests", "test_filter")
    if not os.path.exists(exe):
        pytest.skip("test_filter executable not built: %s" % exe)
    return exe


def write_table(df, path):
    """obs = df as written by anndata's element writer (which, unlike
    write_h5ad, keeps string columns as strings); var a small frame."""
    from anndata.experimental import write_elem
    with h5py.File(path, "w") as f:
        write_elem(f, "obs", df)
        write_elem(f, "var", pd.DataFrame(index=["g0", "g1"]))


def run_filters(path, lines, tmp_path, axis="obs"):
    fp = tmp_path / "filters.txt"
    fp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = subprocess.run([eval_exe(), "--eval", str(path), axis, str(fp)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert len(out) == len(lines)
    return out


def decode_bits(line, n):
    assert line.startswith("OK "), line
    _, count, hexs = (line.split(" ") + [""])[:3]
    rows = np.zeros(n, bool)
    for w in range(len(hexs) // 16):
        word = int(hexs[16 * w:16 * w + 16], 16)
        for j in range(64):
            if word >> j & 1:
                rows[w * 64 + j] = True
    assert rows.sum() == int(count)
    return rows


CATS = ["B cell", "NK cell", "CD4 T", "it's", "mono\\cyte", "DC"]
STRS = ["alpha", "beta", "gamma", "O'Neil", "x y", "", "zeta"]


def make_table(rng, n):
    cat = pd.Categorical(rng.choice(CATS + [None], n, p=[0.15] * 6 + [0.1]), categories=CATS)
    f = rng.normal(100, 50, n).round(2)
    f[rng.random(n) < 0.1] = np.nan
    ni = pd.array(rng.integers(-3, 4, n), dtype="Int64")
    ni[rng.random(n) < 0.15] = None
    nb = pd.array(rng.random(n) < 0.5, dtype="boolean")
    nb[rng.random(n) < 0.2] = None
    df = pd.DataFrame({
        "cell_type": cat,
        "sample": pd.Categorical(rng.choice(["s1", "s2", "s3"], n)),
        "total_counts": rng.integers(0, 20000, n),
        "pct": f,
        "is_doublet": rng.random(n) < 0.3,
        "note": rng.choice(STRS, n).astype(object),
        "batch": ni,
        "flag": nb,
        "my col": rng.integers(0, 5, n).astype(np.int16),
        "res.0.8": rng.integers(0, 3, n).astype(np.int64),
    }, index=["c%d" % i for i in range(n)])
    return df


def q(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def colref(c):
    return "`%s`" % c if " " in c else c


NUMERIC = {"total_counts": "int", "pct": "float", "batch": "int", "my col": "int",
           "res.0.8": "int"}


def rand_num(rng, df, c):
    s = df[c].dropna()
    if len(s) and rng.random() < 0.5:
        v = s.iloc[int(rng.integers(0, len(s)))]
        return int(v) if NUMERIC[c] == "int" else float(v)
    if NUMERIC[c] == "int" and rng.random() < 0.7:
        return int(rng.integers(-5, 20001)) if c == "total_counts" else int(rng.integers(-4, 6))
    return float(np.round(rng.normal(0, 1) * 1000, 3))


def lit_where(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return q(v)
    return repr(v)


OPS = [("==", "eq", lambda s, v: s == v), ("!=", "ne", lambda s, v: s != v),
       ("<", "lt", lambda s, v: s < v), ("<=", "le", lambda s, v: s <= v),
       (">", "gt", lambda s, v: s > v), (">=", "ge", lambda s, v: s >= v)]


def truthy(x):
    return pd.Series(x).fillna(False).astype(bool).to_numpy()


def rand_leaf(rng, df):
    """(where, json, rows) for one random leaf."""
    c = rng.choice(list(df.columns))
    s = df[c]
    notna = s.notna().to_numpy()
    kind = rng.random()
    if kind < 0.08:
        return ("%s is null" % colref(c), {"column": c, "is_null": True}, ~notna)
    if kind < 0.12:
        return ("%s is not null" % colref(c), {"column": c, "is_null": False}, notna)
    if c in ("is_doublet", "flag"):
        if rng.random() < 0.4:
            return (colref(c), None, truthy(s))
        v = bool(rng.random() < 0.5)
        sym, name, fn = OPS[int(rng.integers(0, 2))]
        return ("%s %s %s" % (colref(c), sym, lit_where(v)), {"column": c, name: v},
                truthy(fn(s, v)) & notna)
    if c in ("cell_type", "sample"):
        cats = list(s.cat.categories)
        if rng.random() < 0.5:
            vals = list(rng.choice(cats, int(rng.integers(0, 4))))
            vals = [str(x) for x in vals]
            w = "%s %sin [%s]" % (colref(c), "not " if rng.random() < 0.3 else "",
                                  ", ".join(q(x) for x in vals))
            rows = truthy(s.isin(vals)) & notna
            neg = " not in " in w
            # `not in` is false on missing values, like !=.
            return (w, {"column": c, "not_in" if neg else "in": vals},
                    (~rows & notna) if neg else rows)
        v = str(rng.choice(cats))
        sym, name, fn = OPS[int(rng.integers(0, 2))]
        return ("%s %s %s" % (colref(c), sym, q(v)), {"column": c, name: v},
                truthy(fn(s, v)) & notna)
    if c == "note":
        if rng.random() < 0.3:
            vals = [str(x) for x in rng.choice(STRS + ["nope"], int(rng.integers(1, 4)))]
            rows = truthy(s.isin(vals)) & notna
            if rng.random() < 0.3:
                return ("%s not in [%s]" % (c, ", ".join(q(x) for x in vals)),
                        {"column": c, "not_in": vals}, ~rows & notna)
            return ("%s in [%s]" % (c, ", ".join(q(x) for x in vals)), {"column": c, "in": vals},
                    rows)
        v = str(rng.choice(STRS + ["delta"]))
        sym, name, fn = OPS[int(rng.integers(0, 6))]
        return ("%s %s %s" % (c, sym, q(v)), {"column": c, name: v}, truthy(fn(s, v)) & notna)
    # numeric
    if rng.random() < 0.2:
        vals = [rand_num(rng, df, c) for _ in range(int(rng.integers(1, 6)))]
        rows = truthy(s.isin(vals)) & notna
        if rng.random() < 0.3:
            return ("%s not in [%s]" % (colref(c), ", ".join(lit_where(x) for x in vals)),
                    {"column": c, "not_in": vals}, ~rows & notna)
        return ("%s in [%s]" % (colref(c), ", ".join(lit_where(x) for x in vals)),
                {"column": c, "in": vals}, rows)
    v = rand_num(rng, df, c)
    sym, name, fn = OPS[int(rng.integers(0, 6))]
    if rng.random() < 0.2 and sym in ("<", "<=", ">", ">="):
        # literal on the left
        flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[sym]
        return ("%s %s %s" % (lit_where(v), flipped, colref(c)), {"column": c, name: v},
                truthy(fn(s, v)) & notna)
    return ("%s %s %s" % (colref(c), sym, lit_where(v)), {"column": c, name: v},
            truthy(fn(s, v)) & notna)


def rand_tree(rng, df, depth=0):
    r = rng.random()
    if depth >= 4 or r < 0.4:
        return rand_leaf(rng, df)
    if r < 0.55:
        w, j, rows = rand_tree(rng, df, depth + 1)
        return ("not (%s)" % w, {"not": j} if j else None, ~rows)
    k = int(rng.integers(2, 4))
    kids = [rand_tree(rng, df, depth + 1) for _ in range(k)]
    is_and = rng.random() < 0.5
    word = " and " if is_and else " or "
    if rng.random() < 0.3:
        word = " && " if is_and else " || "
    rows = kids[0][2].copy()
    for kid in kids[1:]:
        rows = (rows & kid[2]) if is_and else (rows | kid[2])
    js = [kid[1] for kid in kids]
    j = {"and" if is_and else "or": js} if all(x is not None for x in js) else None
    return (word.join("(%s)" % kid[0] for kid in kids), j, rows)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_filters_match_pandas(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n = 1000 + seed * 37   # not a multiple of 64: the tail word is exercised
    df = make_table(rng, n)
    path = tmp_path / "t.h5ad"
    write_table(df, path)
    trees = [rand_tree(rng, df) for _ in range(1500)]
    lines, refs = [], []
    for w, j, rows in trees:
        lines.append("W " + w)
        refs.append((w, rows))
        if j is not None:
            lines.append("J " + json.dumps(j))
            refs.append((json.dumps(j), rows))
    out = run_filters(path, lines, tmp_path)
    n_nonempty = 0
    for (text, rows), line in zip(refs, out):
        assert line.startswith("OK"), (text, line)
        got = decode_bits(line, n)
        bad = np.nonzero(got != rows)[0]
        assert len(bad) == 0, (text, bad[:10].tolist(), df.iloc[bad[:3]].to_dict("records"))
        n_nonempty += 0 < rows.sum() < n
    # The generator must produce informative filters, not all-or-nothing ones.
    assert n_nonempty > len(refs) // 3


BAD = [
    ("cel_type == 'B cell'", 422, ["unknown obs column 'cel_type'", "cell_type"]),
    ("cell_type == 'B cells'", 422, ["unknown category 'B cells'", "'B cell'"]),
    ("cell_type in ['NK cel', 'DC']", 422, ["'NK cel'", "'NK cell'"]),
    ("total_counts > 'x'", 422, ["total_counts", "int", "string"]),
    ("note < 5", 422, ["note", "string", "number"]),
    ("pct", 422, ["pct", "not booleans"]),
    ("total_counts >", 400, ["position 14"]),
    ("(is_doublet", 400, ["position 11", "')'"]),
    ("is_doublet and and flag", 400, ["position 15"]),
    ("cell_type in ['a',", 400, ["position 18"]),
    ("`unterminated", 400, ["unterminated column name"]),
]


def test_bad_filters_status_and_message(tmp_path):
    rng = np.random.default_rng(7)
    df = make_table(rng, 100)
    path = tmp_path / "t.h5ad"
    write_table(df, path)
    out = run_filters(path, ["W " + w for w, _, _ in BAD], tmp_path)
    for (w, status, words), line in zip(BAD, out):
        assert line.startswith("ERR %d " % status), (w, line)
        for word in words:
            assert word in line, (w, word, line)
    # The var axis has its own columns.
    out = run_filters(path, ["W cell_type == 'DC'"], tmp_path, axis="var")
    assert out[0].startswith("ERR 422") and "unknown var column" in out[0]


def test_not_in_is_false_on_missing(tmp_path):
    """`not in` / "not_in" never select a missing value (as != does not),
    while `not (... in ...)` is the complement and does; for every column
    kind with missing values: categorical, nullable int, float NaN,
    nullable bool."""
    rng = np.random.default_rng(11)
    df = make_table(rng, 300)
    path = tmp_path / "t.h5ad"
    write_table(df, path)
    cases = [("cell_type", "'B cell'", "B cell"), ("batch", "1", 1), ("pct", "1.5", 1.5),
             ("flag", "true", True)]
    lines, refs = [], []
    for c, lw, lj in cases:
        s = df[c]
        notna = s.notna().to_numpy()
        assert (~notna).any(), c   # the column must hold missing values
        isin = truthy(s.isin([lj])) & notna
        lines += ["W %s not in [%s]" % (c, lw),
                  "J " + json.dumps({"column": c, "not_in": [lj]}),
                  "W %s != %s" % (c, lw),
                  "W not (%s in [%s])" % (c, lw),
                  "J " + json.dumps({"not": {"column": c, "in": [lj]}})]
        refs += [~isin & notna, ~isin & notna, ~isin & notna, ~isin, ~isin]
    out = run_filters(path, lines, tmp_path)
    for text, rows, line in zip(lines, refs, out):
        got = decode_bits(line, len(df))
        assert (got == rows).all(), (text, np.nonzero(got != rows)[0][:10].tolist())


def test_costly_filter_is_refused_before_it_runs(tmp_path):
    """A filter whose evaluation would visit more than 2^28 rows (rows x
    terms) is refused with 413 before it runs, where before it took a
    worker for seconds; a smaller one on the same table runs."""
    n = 300_000
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"k": rng.integers(0, 1000, n)}, index=["c%d" % i for i in range(n)])
    path = tmp_path / "big.h5ad"
    write_table(df, path)
    many = " or ".join("k == %d" % i for i in range(1000))      # 1000 x 300,000 > 2^28
    few = " or ".join("k == %d" % i for i in range(50))
    many_json = json.dumps({"or": [{"column": "k", "eq": i} for i in range(1000)]})
    out = run_filters(path, ["W " + many, "J " + many_json, "W " + few], tmp_path)
    for line in out[:2]:
        assert line.startswith("ERR 413 ") and "too costly" in line, line[:300]
    got = decode_bits(out[2], n)
    assert (got == (df["k"] < 50).to_numpy()).all()
