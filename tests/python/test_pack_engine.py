"""`ivserve pack` of a packed input into the other orientation: the
transpose engine (window by window, core/matrix/transpose.c) against the
count-and-bands path (`--transpose-engine off`), differentially.

For random matrices (every case below, both ways: IVCSR -> IVCSC and
IVCSC -> IVCSR) the engine's output, in one window and in many
(`--engine-window-kb`, a hidden test option), must equal the old path's
file: the four matrix arrays element by element, their stored chunks byte
for byte (same dtypes, chunking and codec), and the group's attributes.
Both must also hold the input's entries bit for bit (the format's
reference reader), so two paths wrong the same way do not pass.
"""

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

import ivref

anndata = pytest.importorskip("anndata")

MATRIX = ("major_ptr", "values", "value_ptr", "packed_indices")


def write_csr_h5ad(path, X):
    ad = anndata.AnnData(X=X, dtype=X.dtype)
    ad.obs_names = ["c%d" % i for i in range(X.shape[0])]
    ad.var_names = ["g%d" % i for i in range(X.shape[1])]
    ad.write_h5ad(path)


def pack(ivserve, src, out, *args):
    proc = ivserve.run("pack", src, out, "--threads", "2", "--matrix-only", *args, timeout=120)
    ivserve.assert_ok(proc)
    return proc.stdout


def float_specials(rng, X):
    """-0.0 and 0.0 in the same columns, NaNs of several payloads and signs
    (each NaN is a group of its own in the writer's order)."""
    d = X.data
    n = d.shape[0]
    if n < 8:
        return
    bits = d.view(np.uint32 if d.dtype == np.float32 else np.uint64)
    sign = np.uint32(0x80000000) if d.dtype == np.float32 else np.uint64(1 << 63)
    qnan = (0x7fc00000, 0x7fc00001, 0xffc00000, 0x7f800001) if d.dtype == np.float32 else \
        (0x7ff8000000000000, 0x7ff8000000000001, 0xfff8000000000000, 0x7ff0000000000001)
    at = rng.choice(n, size=n // 3, replace=False)
    third = len(at) // 3
    d[at[:third]] = 0.0
    bits[at[third:2 * third]] = sign          # -0.0
    for k, i in enumerate(at[2 * third:]):
        bits[i] = qnan[k % len(qnan)]


def random_case(seed, shape, dtype, density):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    X = ivref.random_csr(rng, shape[0], shape[1], int(shape[0] * shape[1] * density), dt,
                         zero_frac=0.1, empty_row_frac=0.2 if shape[0] > 1 else 0.0)
    if shape[1] > 3:  # an empty column; the explicit zeros elsewhere stay
        keep = X.indices != 1
        counts = np.add.reduceat(keep, X.indptr[:-1]) if X.nnz else np.zeros(shape[0], int)
        counts[np.diff(X.indptr) == 0] = 0
        X = sp.csr_matrix((X.data[keep], X.indices[keep], np.concatenate(([0], np.cumsum(counts)))),
                          shape=X.shape)
    X = ivref.canonical(X)
    if dt.kind == "f":
        float_specials(rng, X)
    return X


CASES = [
    ("int32", (400, 60), 0.3),
    ("float32", (300, 50), 0.4),
    ("float64", (200, 40), 0.3),
    ("int64", (150, 30), 0.3),
    ("uint16", (250, 45), 0.3),
    ("int8", (120, 20), 0.5),
    ("uint64", (100, 25), 0.4),    # values past 2^63 order as unsigned
    ("uint8", (80, 30), 0.5),
    ("float32", (1, 70), 0.6),     # a single row
    ("int32", (90, 1), 0.7),       # one column
    ("float32", (40, 30), 0.0),    # nothing stored
    ("int32", (0, 12), 0.0),       # no rows
    ("float64", (15, 0), 0.0),     # no columns
]


def case_id(c):
    return "%s-%dx%d" % (c[0], c[1][0], c[1][1])


def arrays_and_attrs(path):
    with h5py.File(path, "r") as f:
        g = f["X"]
        return {k: ivref.read_array(g[k]) for k in MATRIX}, dict(g.attrs)


def assert_same_file(a, b):
    """a's and b's matrix groups equal: arrays element by element (dtype
    and shape included), stored chunks and filters byte for byte, attrs."""
    (xa, ta), (xb, tb) = arrays_and_attrs(a), arrays_and_attrs(b)
    for k in MATRIX:
        assert xa[k].dtype == xb[k].dtype and xa[k].shape == xb[k].shape, (k, xa[k].dtype, xb[k].dtype)
        assert xa[k].tobytes() == xb[k].tobytes(), k
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert np.array_equal(np.asarray(ta[k]), np.asarray(tb[k])), k
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in MATRIX:
            da, db = fa["X"][k], fb["X"][k]
            assert da.chunks == db.chunks, k
            pa, pb = da.id.get_create_plist(), db.id.get_create_plist()
            assert [pa.get_filter(i)[:3] for i in range(pa.get_nfilters())] == \
                [pb.get_filter(i)[:3] for i in range(pb.get_nfilters())], k
            for i in range(da.id.get_num_chunks()):
                off = da.id.get_chunk_info(i).chunk_offset
                assert da.id.read_direct_chunk(off) == db.id.read_direct_chunk(off), (k, off)


def assert_holds(path, X):
    got = ivref.canonical(sp.csr_matrix(ivref.read_iv(path)))
    assert got.shape == X.shape
    assert np.array_equal(got.indptr, X.indptr) and np.array_equal(got.indices, X.indices)
    assert got.data.dtype == X.data.dtype and got.data.tobytes() == X.data.tobytes()


def windows_of(stdout):
    line = [ln for ln in stdout.splitlines() if "turned around by" in ln]
    assert len(line) == 1, stdout
    return line[0].split("turned around by ", 1)[1]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_engine_equals_old_path(ivserve, tmp_path, case):
    dtype, shape, density = case
    X = random_case([11, CASES.index(case)], shape, dtype, density)
    src = str(tmp_path / "in.h5ad")
    write_csr_h5ad(src, X)
    for first, second in (("ivcsr", "ivcsc"), ("ivcsc", "ivcsr")):
        packed = str(tmp_path / ("p.%s.h5ad" % first))
        pack(ivserve, src, packed, "--layout", first)
        old, one, many = (str(tmp_path / ("%s.%s.h5ad" % (n, second))) for n in ("old", "one", "many"))
        assert windows_of(pack(ivserve, packed, old, "--layout", second, "--transpose-engine", "off")) \
            == "count and bands (the engine off)"
        how_one = windows_of(pack(ivserve, packed, one, "--layout", second))
        out_slices = X.shape[0] if second == "ivcsr" else X.shape[1]
        assert how_one == ("engine, 1 window" if out_slices else "engine, 0 windows"), how_one
        how_many = windows_of(pack(ivserve, packed, many, "--layout", second, "--engine-window-kb", "1"))
        assert how_many.startswith("engine, ")
        if X.nnz > 2000:
            assert int(how_many.split()[1]) > 3, how_many
        assert_holds(old, X)
        assert_same_file(one, old)
        assert_same_file(many, old)


def test_engine_progress_and_codec_none(ivserve, tmp_path):
    """With --progress-fd the engine's windows report progress up to 1, and
    the codec and chunk options reach its arrays as the old path's."""
    X = random_case([12], (600, 80), "float32", 0.3)
    src, packed = str(tmp_path / "in.h5ad"), str(tmp_path / "p.h5ad")
    write_csr_h5ad(src, X)
    pack(ivserve, src, packed, "--layout", "ivcsr")
    opts = ("--layout", "ivcsc", "--codec", "none", "--chunk-bytes", "1000")
    old, new = str(tmp_path / "old.h5ad"), str(tmp_path / "new.h5ad")
    pack(ivserve, packed, old, *opts, "--transpose-engine", "off")
    proc = ivserve.run("pack", packed, new, "--threads", "2", "--matrix-only", *opts,
                       "--engine-window-kb", "2", "--quiet", "--progress-fd", "2", timeout=120)
    lines = proc.stderr.split("\n")
    ivserve.assert_ok(proc)
    prog = [ln.split() for ln in lines if ln.startswith("progress ")]
    assert prog and float(prog[-1][1]) == 1.0, lines[-3:]
    fr = [float(p[1]) for p in prog]
    assert fr == sorted(fr)
    assert int(prog[-1][2]) == int(prog[-1][3]) == X.shape[1]
    assert_same_file(new, old)
    assert_holds(new, X)


def test_engine_bad_option(ivserve, tmp_path):
    proc = ivserve.run("pack", "a.h5ad", str(tmp_path / "b.h5ad"), "--transpose-engine", "maybe")
    assert proc.returncode == 2 and "--transpose-engine" in proc.stderr
