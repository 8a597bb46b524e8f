"""`ivserve pack` and `ivserve export -o OUT.h5ad`, end to end.

Round trips are exact: a matrix packed from any input (the shared fixtures,
and generated CSR, CSC and dense files of every value dtype with empty rows
and columns, explicit zeros, NaN, -0.0, one row, one column, unsorted and
compressed inputs) is read back by the format's Python reference reader
(ivref.read_iv) and by `ivserve export -o .h5ad` + anndata.read_h5ad, and
both must hold the input's entries bit for bit.  IVCSR -> IVCSC -> IVCSR
gives the same matrix datasets byte for byte; every element that pack
copies must equal the input's, raw chunk bytes included.  Bad inputs end
with exit status 1, one error line, and no output file (nor a temporary).
"""

import json
import os
import shutil
import warnings

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

import ivref
from conftest import fixtures_path

anndata = pytest.importorskip("anndata")

MATRIX = ("major_ptr", "values", "value_ptr", "packed_indices")
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64")


# ---------------------------------------------------------------- helpers

def fixture_cases():
    root = fixtures_path()
    if root is None:
        return []
    out = []
    for sub in ("", "real"):
        man = os.path.join(root, sub, "manifest.json")
        if os.path.exists(man):
            for m in json.load(open(man)):
                out.append(dict(m, path=os.path.join(root, sub, m["file"]),
                                expected_path=os.path.join(root, sub, m["expected"]),
                                meta_path=os.path.join(root, sub, m["expected_meta"])))
    return out


FIXTURES = fixture_cases()


def need_fixtures():
    if not FIXTURES:
        pytest.skip("shared fixtures not found (../shared/fixtures)")


def expected_csr(path):
    with h5py.File(path, "r") as f:
        return ivref.make_csr(f["data"][...], f["indices"][...], f["indptr"][...],
                              tuple(int(x) for x in f.attrs["shape"]))


def pack(ivserve, src, out, *args):
    proc = ivserve.run("pack", src, out, "--threads", "2", *args, timeout=300)
    ivserve.assert_ok(proc)
    return proc


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_csr_equal(got, want, dtype=None):
    """got (any scipy sparse) holds exactly want's entries (canonical CSR):
    same positions, same value bits, explicit zeros included."""
    got = ivref.canonical(got)
    assert got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr), "row pointers differ"
    assert np.array_equal(got.indices, want.indices), "column indices differ"
    wd = want.data if dtype is None else want.data.astype(dtype)
    assert same_bits(got.data, wd), "values differ (%s vs %s)" % (got.data[:8], wd[:8])


def matrix_arrays(path, group="X"):
    with h5py.File(path, "r") as f:
        g = f[group]
        return {k: ivref.read_array(g[k]) for k in MATRIX}, dict(g.attrs)


def export_h5ad(ivserve, path, out, *args):
    ivserve.assert_ok(ivserve.run("export", path, *args, "-o", out, timeout=300))
    ad = anndata.read_h5ad(out)
    # indptr and indices in one type, as scipy makes them (int32 at these
    # sizes): backed mode hands them to scipy's indexing, which refuses a
    # mix, so a gene column read backed must equal the one read whole.
    with h5py.File(out, "r") as f:
        if "X/indptr" in f:
            assert f["X/indptr"].dtype == f["X/indices"].dtype == np.int32, \
                (f["X/indptr"].dtype, f["X/indices"].dtype)
    if ad.n_vars:
        cols = sorted({0, ad.n_vars // 2, ad.n_vars - 1})
        backed = anndata.read_h5ad(out, backed="r")
        got = backed.X[:, cols]
        backed.file.close()
        want = ad.X[:, cols]
        g, w = sp.csr_matrix(got), sp.csr_matrix(want)
        g.sort_indices()
        w.sort_indices()
        assert np.array_equal(g.indptr, w.indptr) and np.array_equal(g.indices, w.indices)
        assert g.data.tobytes() == w.data.tobytes(), "backed and whole reads differ"
    return ad


def compare_h5_objects(a, b, where):
    """Every attribute and dataset below a and b equal: types, shapes,
    filters and, for chunked datasets, every stored chunk byte for byte
    (so compressed columns compare without a decoder)."""
    assert sorted(a.attrs.keys()) == sorted(b.attrs.keys()), where
    for k in a.attrs:
        va, vb = a.attrs[k], b.attrs[k]
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and np.array_equal(va, vb), (where, k)
        else:
            assert type(va) == type(vb) and va == vb, (where, k)
    if isinstance(a, h5py.Group):
        assert isinstance(b, h5py.Group), where
        assert sorted(a.keys()) == sorted(b.keys()), where
        for k in a:
            compare_h5_objects(a[k], b[k], where + "/" + k)
        return
    assert isinstance(b, h5py.Dataset), where
    assert a.dtype == b.dtype and a.shape == b.shape and a.chunks == b.chunks, where
    pa, pb = a.id.get_create_plist(), b.id.get_create_plist()
    fa = [pa.get_filter(i)[:3] for i in range(pa.get_nfilters())]
    fb = [pb.get_filter(i)[:3] for i in range(pb.get_nfilters())]
    assert fa == fb, where
    if a.chunks is None:
        assert np.array_equal(a[()], b[()]), where
        return
    n = a.id.get_num_chunks()
    assert n == b.id.get_num_chunks(), where
    for i in range(n):
        info = a.id.get_chunk_info(i)
        ma, ca = a.id.read_direct_chunk(info.chunk_offset)
        mb, cb = b.id.read_direct_chunk(info.chunk_offset)
        assert ma == mb and ca == cb, (where, info.chunk_offset)


def no_leftovers(folder, keep=()):
    left = [n for n in os.listdir(folder) if n not in keep]
    assert not left, "left behind: %s" % left


# ---------------------------------------------------------------- fixtures

@pytest.mark.parametrize("case", FIXTURES or [None], ids=lambda c: c["file"] if c else "none")
def test_fixture_round_trip(ivserve, tmp_path, case):
    need_fixtures()
    exp = expected_csr(case["expected_path"])
    src = case["path"]
    r, c = str(tmp_path / "r.h5ad"), str(tmp_path / "c.h5ad")
    pack(ivserve, src, r)
    pack(ivserve, src, c, "--layout", "ivcsc")
    for path, orient in ((r, "ivcsr"), (c, "ivcsc")):
        ivserve.assert_ok(ivserve.check(path))
        got = ivref.read_iv(path)  # the reference reader reads what pack wrote
        assert_csr_equal(got, exp, dtype=got.dtype)
        assert np.array_equal(got.data.astype(np.float64), exp.data)
        _, attrs = matrix_arrays(path)
        assert attrs["encoding-type"] == orient and attrs["encoding-version"] == "0.1.0"
        assert list(attrs["shape"]) == list(exp.shape) and attrs["shape"].dtype == np.int64
    # IVCSC -> IVCSR -> IVCSC -> IVCSR: the same matrix datasets, byte for byte.
    c2, r2 = str(tmp_path / "c2.h5ad"), str(tmp_path / "r2.h5ad")
    pack(ivserve, r, c2, "--layout", "ivcsc")
    pack(ivserve, c2, r2, "--layout", "ivcsr")
    for a, b in ((r, r2), (c, c2)):
        (xa, ta), (xb, tb) = matrix_arrays(a), matrix_arrays(b)
        for k in MATRIX:
            assert same_bits(xa[k], xb[k]), (a, b, k)
        with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
            for k in MATRIX:
                compare_h5_objects(fa["X"][k], fb["X"][k], k)
    # Export: a standard AnnData file with the same matrix and metadata.
    ad = export_h5ad(ivserve, c, str(tmp_path / "e.h5ad"))
    assert sp.issparse(ad.X) and ad.X.format == "csr"
    assert_csr_equal(ad.X, exp, dtype=ad.X.dtype)
    meta = anndata.read_h5ad(case["meta_path"])
    assert list(ad.obs_names) == list(meta.obs_names)
    assert list(ad.var_names) == list(meta.var_names)
    assert ad.obs.equals(meta.obs) and ad.var.equals(meta.var)


@pytest.mark.parametrize("case", FIXTURES or [None], ids=lambda c: c["file"] if c else "none")
def test_fixture_metadata_copied_bit_for_bit(ivserve, tmp_path, case):
    need_fixtures()
    out = str(tmp_path / "o.h5ad")
    pack(ivserve, case["path"], out, "--layout", "ivcsc")
    with h5py.File(case["path"], "r") as a, h5py.File(out, "r") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for k in a.attrs:
            assert a.attrs[k] == b.attrs[k]
        for k in a:
            if k != "X":
                compare_h5_objects(a[k], b[k], k)


def test_fixture_sorted_groups_match_the_reference_writer(ivserve, tmp_path):
    """The zstd fixtures (ascending group order, written by the format's own
    package) come out of pack with identical matrix datasets."""
    need_fixtures()
    cases = [c for c in FIXTURES if c.get("group_order") == "sorted" and c["codec"] == "zstd"]
    assert cases
    for c in cases:
        out = str(tmp_path / "o.h5ad")
        pack(ivserve, c["path"], out, "--layout", c["orientation"])
        (xa, _), (xb, _) = matrix_arrays(c["path"]), matrix_arrays(out)
        for k in MATRIX:
            assert same_bits(xa[k].astype(xb[k].dtype), xb[k]), (c["file"], k)


def test_fixture_export_subset(ivserve, tmp_path):
    need_fixtures()
    case = next(c for c in FIXTURES if c["file"].startswith("wide.ivcsr.zstd"))
    exp = expected_csr(case["expected_path"])
    meta = anndata.read_h5ad(case["meta_path"])
    obs, var = [5, 3, 3, 299, 0], [19999, 2, 7, 2]
    ad = export_h5ad(ivserve, case["path"], str(tmp_path / "s.h5ad"),
                     "--obs", ivref.format_sel(obs), "--var", ivref.format_sel(var))
    assert_csr_equal(ad.X, ivref.expected(exp, obs, var), dtype=ad.X.dtype)
    assert list(ad.obs_names) == list(meta.obs_names[obs])
    assert list(ad.var_names) == list(meta.var_names[var])
    # As anndata's own subset leaves them: the unused categories dropped.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = meta[obs].obs
    for col in meta.obs.columns:
        a, b = ad.obs[col], want[col]
        assert a.dtype == b.dtype, col
        if hasattr(a, "cat"):
            assert list(a.cat.categories) == list(b.cat.categories), col
        assert a.reset_index(drop=True).equals(b.reset_index(drop=True)), col
    # By names, and by a filter on obs.
    names = list(meta.var_names[[10, 4]])
    ad = export_h5ad(ivserve, case["path"], str(tmp_path / "n.h5ad"), "--var", ",".join(names))
    assert list(ad.var_names) == names
    assert_csr_equal(ad.X, ivref.expected(exp, None, [10, 4]), dtype=ad.X.dtype)
    cat = str(meta.obs["cell_type"].iloc[0])
    ad = export_h5ad(ivserve, case["path"], str(tmp_path / "w.h5ad"),
                     "--where", "cell_type == '%s'" % cat, "--var", "0:5")
    rows = np.flatnonzero((meta.obs["cell_type"] == cat).to_numpy())
    assert ad.n_obs == rows.shape[0] > 0
    assert_csr_equal(ad.X, ivref.expected(exp, rows, range(5)), dtype=ad.X.dtype)


# ---------------------------------------------------------------- generated

def random_matrix(rng, shape, dtype, density=0.3):
    X = ivref.random_csr(rng, shape[0], shape[1], int(shape[0] * shape[1] * density), dtype,
                         nan_frac=0.05 if np.dtype(dtype).kind == "f" else 0.0, zero_frac=0.1,
                         empty_row_frac=0.2)
    if shape[1] > 3:  # an empty column
        keep = X.indices != 1
        X = ivref.canonical(sp.csr_matrix((X.data[keep], X.indices[keep], np.concatenate(
            ([0], np.cumsum([keep[a:b].sum() for a, b in zip(X.indptr[:-1], X.indptr[1:])])))),
            shape=X.shape))
    if np.dtype(dtype).kind == "f" and X.nnz > 2:
        X.data[0] = -0.0  # kept apart from 0.0
    return X


def write_h5ad(path, X, kind, compression=None):
    """X (canonical CSR) as anndata writes it: csr, csc or dense X."""
    if kind == "csr":
        M = X
    elif kind == "csc":
        M = X.tocsc()
        M.has_sorted_indices = True
    else:
        M = X.toarray()
    ad = anndata.AnnData(X=M, dtype=X.dtype)
    ad.obs_names = ["c%d" % i for i in range(X.shape[0])]
    ad.var_names = ["g%d" % i for i in range(X.shape[1])]
    ad.obsm["X_pca"] = np.arange(X.shape[0] * 2, dtype=np.float32).reshape(-1, 2)
    ad.uns["note"] = "hello"
    ad.write_h5ad(path, compression=compression)


def dense_expected(X):
    """What a dense input packs to: every entry whose bits are not all zero."""
    D = X.toarray()
    nz = D.view(np.dtype("u%d" % D.dtype.itemsize)) != 0
    r, c = np.nonzero(nz)
    indptr = np.zeros(X.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=X.shape[0]), out=indptr[1:])
    return ivref.make_csr(D[r, c], c, indptr, X.shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["csr", "csc", "dense"])
def test_generated_round_trip(ivserve, tmp_path, dtype, kind):
    rng = np.random.default_rng([7, DTYPES.index(dtype), len(kind)])
    # One row and one column for a few dtypes (the suite runs on 2 cores).
    shapes = ((37, 23), (1, 40), (40, 1)) if dtype in ("int8", "uint16", "float64") else ((37, 23),)
    for shape in shapes:
        X = random_matrix(rng, shape, dtype)
        src = str(tmp_path / "in.h5ad")
        write_h5ad(src, X, kind, compression="gzip" if dtype in ("int16", "float32") else None)
        want = dense_expected(X) if kind == "dense" else X
        for layout in ("ivcsr", "ivcsc"):
            out = str(tmp_path / ("%s.h5ad" % layout))
            pack(ivserve, src, out, "--layout", layout)
            assert_csr_equal(ivref.read_iv(out), want)
            ad = export_h5ad(ivserve, out, str(tmp_path / "e.h5ad"))
            assert ad.X.dtype == np.dtype(dtype)
            assert_csr_equal(ad.X, want)
            assert list(ad.obs_names) == ["c%d" % i for i in range(shape[0])]
            assert np.array_equal(ad.obsm["X_pca"], np.arange(shape[0] * 2).reshape(-1, 2))


def test_unsorted_csr_and_big_values(ivserve, tmp_path):
    """Unsorted column indices within rows are sorted; int64/uint64 extremes
    and every NaN payload survive."""
    rng = np.random.default_rng(3)
    X = ivref.random_csr(rng, 50, 70, 900, np.float64, nan_frac=0.1)
    X.data[3] = np.frombuffer(np.uint64(0x7ff8000000000123).tobytes(), np.float64)[0]
    X.data[4] = np.frombuffer(np.uint64(0xfff0000000000001).tobytes(), np.float64)[0]
    src = str(tmp_path / "u.h5ad")
    write_h5ad(src, X, "csr")
    with h5py.File(src, "r+") as f:  # reverse every row's entries in the file
        ind, dat, ptr = f["X/indices"][...], f["X/data"][...], f["X/indptr"][...]
        for a, b in zip(ptr[:-1], ptr[1:]):
            ind[a:b], dat[a:b] = ind[a:b][::-1].copy(), dat[a:b][::-1].copy()
        f["X/indices"][...], f["X/data"][...] = ind, dat
    out = str(tmp_path / "o.h5ad")
    pack(ivserve, src, out)
    assert_csr_equal(ivref.read_iv(out), X)
    for dt in ("int64", "uint64"):
        info = np.iinfo(dt)
        Y = sp.csr_matrix(np.array([[info.max, 0, info.min, info.max - 1], [0, 0, 0, 0],
                                    [info.min + 1, 1, 0, info.max]], dtype=dt))
        write_h5ad(src, ivref.canonical(Y), "csr")
        pack(ivserve, src, out, "--layout", "ivcsc")
        assert_csr_equal(ivref.read_iv(out), ivref.canonical(Y))


def test_empty_and_all_zero_matrices(ivserve, tmp_path):
    for shape in ((5, 4), (0, 3), (3, 0)):
        X = sp.csr_matrix(shape, dtype=np.float32)
        src = str(tmp_path / "z.h5ad")
        write_h5ad(src, ivref.canonical(X), "csr")
        for layout in ("ivcsr", "ivcsc"):
            out = str(tmp_path / "o.h5ad")
            pack(ivserve, src, out, "--layout", layout)
            got = ivref.read_iv(out)
            assert got.shape == shape and got.nnz == 0


def test_bands_threads_codecs_chunks_agree(ivserve, tmp_path):
    """A transposition in many bands (tiny memory budget) or one, on one
    thread or several (the count and scatter split a slab into as many
    parts, in bands that do not start at slice 0 too), gives the same
    datasets; every codec reads back the same."""
    rng = np.random.default_rng(11)
    X = ivref.random_csr(rng, 3000, 900, 300_000, np.float32)
    src = str(tmp_path / "in.h5ad")
    write_h5ad(src, X, "csr")
    ref = str(tmp_path / "ref.h5ad")
    pack(ivserve, src, ref, "--layout", "ivcsc")
    xr, _ = matrix_arrays(ref)
    banded = str(tmp_path / "b.h5ad")
    proc = ivserve.run("pack", src, banded, "--layout", "ivcsc", "--memory-mb", "1",
                       "--threads", "1")
    ivserve.assert_ok(proc)
    assert "in 4 passes" in proc.stdout or "passes" in proc.stdout
    assert int(proc.stdout.split(" pass")[0].rsplit(" ", 1)[1]) > 2, proc.stdout
    xb, _ = matrix_arrays(banded)
    for k in MATRIX:
        assert same_bits(xr[k], xb[k]), k
    assert_csr_equal(ivref.read_iv(ref), X)
    for threads, memory in (("4", "1"), ("5", None), ("1", None)):
        out = str(tmp_path / ("t%s.h5ad" % threads))
        extra = ("--memory-mb", memory) if memory else ()
        ivserve.assert_ok(ivserve.run("pack", src, out, "--layout", "ivcsc", "--threads", threads,
                                      *extra))
        xt, _ = matrix_arrays(out)
        for k in MATRIX:
            assert same_bits(xr[k], xt[k]), (threads, memory, k)
    for codec, fid in (("none", None), ("deflate:6", 1), ("zstd:5", 32015)):
        out = str(tmp_path / "k.h5ad")
        pack(ivserve, src, out, "--codec", codec, "--chunk-bytes", "20000")
        assert_csr_equal(ivref.read_iv(out), X)
        ivserve.assert_ok(ivserve.check(out))
        with h5py.File(out, "r") as f:
            d = f["X/packed_indices"]
            assert d.chunks == (20000,)
            pl = d.id.get_create_plist()
            filters = [pl.get_filter(i) for i in range(pl.get_nfilters())]
            if fid is None:
                assert filters == []
            else:
                assert [x[0] for x in filters] == [fid]
                assert list(filters[0][2]) == [int(codec.split(":")[1])]


def test_zstd_chunks_are_single_frames_with_content_size(ivserve, tmp_path):
    """What the HDF5 Zstandard plugin reads: one frame per chunk, content
    size in its header, decoding to the full chunk length."""
    zstandard = pytest.importorskip("zstandard")
    rng = np.random.default_rng(5)
    X = ivref.random_csr(rng, 400, 500, 40_000, np.int32)
    src, out = str(tmp_path / "in.h5ad"), str(tmp_path / "o.h5ad")
    write_h5ad(src, X, "csr")
    pack(ivserve, src, out, "--chunk-bytes", "4096")
    with h5py.File(out, "r") as f:
        for name in MATRIX:
            d = f["X"][name]
            cl = d.chunks[0] * d.dtype.itemsize
            for i in range(d.id.get_num_chunks()):
                _, frame = d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset)
                params = zstandard.get_frame_parameters(frame)
                assert params.content_size == cl


def test_layers_and_raw(ivserve, tmp_path):
    rng = np.random.default_rng(9)
    X = ivref.random_csr(rng, 30, 20, 200, np.float32)
    L = ivref.random_csr(rng, 30, 20, 150, np.int32)
    R = ivref.random_csr(rng, 30, 25, 300, np.float32)
    ad = anndata.AnnData(X=X)
    ad.layers["counts"] = L
    ad.layers["other"] = X.copy()
    ad.var_names = ["g%d" % i for i in range(20)]
    raw = anndata.AnnData(X=R)
    raw.var_names = ["r%d" % i for i in range(25)]
    ad.raw = raw
    src = str(tmp_path / "in.h5ad")
    ad.write_h5ad(src)
    out = str(tmp_path / "l.h5ad")
    proc = pack(ivserve, src, out, "--matrix", "layers/counts")
    assert_csr_equal(ivref.read_iv(out), ivref.canonical(L))
    with h5py.File(out, "r") as f:
        assert list(f["layers"].keys()) == ["other"]
    assert "not carried over from the input: X" in proc.stdout
    out2 = str(tmp_path / "g.h5ad")
    pack(ivserve, src, out2, "--matrix", "layers/counts", "--group", "counts")
    with h5py.File(out2, "r") as f:
        assert f["X"].attrs["encoding-type"] == "csr_matrix"  # kept, unchanged
        assert f["counts"].attrs["encoding-type"] == "ivcsr"
    assert_csr_equal(ivref.read_iv(out2, group="counts"), ivref.canonical(L))
    out3 = str(tmp_path / "r.h5ad")
    pack(ivserve, src, out3, "--matrix", "raw/X", "--layout", "ivcsc")
    assert_csr_equal(ivref.read_iv(out3), ivref.canonical(R))
    with h5py.File(out3, "r") as f:
        assert "raw" not in f and "layers" not in f
        assert [x.decode() for x in f["var/_index"][...]] == ["r%d" % i for i in range(25)]
    ivserve.assert_ok(ivserve.check(out3))


def test_layout_both_names_and_progress_lines(ivserve, tmp_path):
    rng = np.random.default_rng(2)
    X = ivref.random_csr(rng, 200, 50, 3000, np.float32)
    src = str(tmp_path / "in.h5ad")
    write_h5ad(src, X, "csr")
    proc = ivserve.run("pack", src, str(tmp_path / "atlas.h5ad"), "--layout", "both")
    ivserve.assert_ok(proc)
    assert sorted(os.listdir(tmp_path)) == ["atlas.ivcsc.h5ad", "atlas.ivcsr.h5ad", "in.h5ad"]
    for name, orient in (("atlas.ivcsr.h5ad", "ivcsr"), ("atlas.ivcsc.h5ad", "ivcsc")):
        _, attrs = matrix_arrays(str(tmp_path / name))
        assert attrs["encoding-type"] == orient
        assert_csr_equal(ivref.read_iv(str(tmp_path / name)), X)
    # Not a terminal: one line per 10% step reached, ending at 100%.
    lines = [l for l in proc.stderr.splitlines() if "ivserve: pack" in l]
    assert lines and lines[-1].split(": ")[2].startswith("100%"), proc.stderr
    assert len(lines) <= 20


# ---------------------------------------------------------------- bad inputs

def bad(ivserve, tmp_path, src, *keywords, args=()):
    outdir = tmp_path / "out"
    outdir.mkdir(exist_ok=True)
    out = str(outdir / "o.h5ad")
    proc = ivserve.run("pack", src, out, *args)
    ivserve.assert_error(proc, src, *keywords)
    no_leftovers(str(outdir))
    return proc


def test_bad_truncated_input(ivserve, tmp_path):
    rng = np.random.default_rng(4)
    src = str(tmp_path / "in.h5ad")
    write_h5ad(src, ivref.random_csr(rng, 2000, 300, 60_000, np.float32), "csr")
    data = open(src, "rb").read()
    cut = str(tmp_path / "cut.h5ad")
    with open(cut, "wb") as f:
        f.write(data[:len(data) * 2 // 3])
    bad(ivserve, tmp_path, cut)


def test_bad_unsupported_encoding_and_strings(ivserve, tmp_path):
    src = str(tmp_path / "enc.h5ad")
    with h5py.File(src, "w") as f:
        g = f.create_group("X")
        g.attrs["encoding-type"] = "awkward-array"
        g.attrs["encoding-version"] = "0.1.0"
    bad(ivserve, tmp_path, src, "awkward-array")
    src2 = str(tmp_path / "str.h5ad")
    with h5py.File(src2, "w") as f:
        f.create_dataset("X", data=np.array([["a", "b"], ["c", "d"]], dtype=object),
                         dtype=h5py.string_dtype())
    bad(ivserve, tmp_path, src2, "strings")
    src3 = str(tmp_path / "bool.h5ad")
    with h5py.File(src3, "w") as f:
        f.create_dataset("X", data=np.ones((3, 3), dtype=np.float16))
    bad(ivserve, tmp_path, src3, "float16")
    bad(ivserve, tmp_path, src, "layers/none", args=("--matrix", "layers/none"))


def test_bad_duplicates_and_indices(ivserve, tmp_path):
    src = str(tmp_path / "dup.h5ad")
    X = sp.csr_matrix(np.eye(4, dtype=np.float32))
    write_h5ad(src, ivref.canonical(X), "csr")
    with h5py.File(src, "r+") as f:
        ind = f["X/indices"][...]
        ind[2] = 1  # row 2 now holds column 1 ... once; make row 1 hold it twice
        ptr = f["X/indptr"][...]
        ind[ptr[1]] = 1
        f["X/indices"][...] = ind
    with h5py.File(src, "r+") as f:
        f["X/indptr"][...] = np.array([0, 1, 3, 3, 4])
        f["X/indices"][...] = np.array([0, 1, 1, 3])
    for layout in ("ivcsr", "ivcsc"):
        bad(ivserve, tmp_path, src, "twice", args=("--layout", layout))
    with h5py.File(src, "r+") as f:
        f["X/indices"][...] = np.array([0, 1, 9, 3])
    bad(ivserve, tmp_path, src, "indices")


def test_bad_output_folder_and_export_extension(ivserve, tmp_path):
    rng = np.random.default_rng(1)
    src = str(tmp_path / "in.h5ad")
    write_h5ad(src, ivref.random_csr(rng, 20, 10, 50, np.float32), "csr")
    missing = str(tmp_path / "nope" / "o.h5ad")
    proc = ivserve.run("pack", src, missing)
    ivserve.assert_error(proc, missing, "folder")
    assert not os.path.exists(os.path.dirname(missing))
    out = str(tmp_path / "p.h5ad")
    pack(ivserve, src, out)
    for name in ("o.txt", "exported", "o.h5"):
        target = str(tmp_path / name)
        proc = ivserve.run("export", out, "-o", target)
        ivserve.assert_error(proc, target, "extension")
        assert not os.path.exists(target)
    # An existing OUT survives a failed pack untouched.
    before = open(out, "rb").read()
    proc = ivserve.run("pack", str(tmp_path / "absent.h5ad"), out)
    assert proc.returncode == 1 and open(out, "rb").read() == before


def test_columns_past_int32(ivserve, tmp_path):
    """A sparse synthetic CSR with 3e9 columns (int64 indices, 5-byte
    varints): IVCSR keeps every index; indices_dtype becomes int64.  (The
    2^31+ stored values case is not run here: its streams take gigabytes.)"""
    n_cols = 3_000_000_000
    cols = np.array([0, 5, 2**31 - 1, 2**31, 2**31 + 7, n_cols - 1], dtype=np.int64)
    src = str(tmp_path / "wide.h5ad")
    with h5py.File(src, "w") as f:
        g = f.create_group("X")
        g.attrs["encoding-type"] = "csr_matrix"
        g.attrs["encoding-version"] = "0.1.0"
        g.attrs["shape"] = np.array([3, n_cols], dtype=np.int64)
        g["indptr"] = np.array([0, 4, 4, 6], dtype=np.int64)
        g["indices"] = np.concatenate((cols[:4], cols[4:]))
        g["data"] = np.array([1, 2, 3, 4, 5, 6], dtype=np.float32)
    out = str(tmp_path / "o.h5ad")
    pack(ivserve, src, out)
    x, attrs = matrix_arrays(out)
    assert attrs["indices_dtype"] == "int64" and list(attrs["shape"]) == [3, n_cols]
    # ivref's CSR holds int32 indices, so decode the arrays here the way
    # ivref.unpack does, in int64.
    d = ivref.decode_varints(x["packed_indices"]).astype(np.int64)
    vp = x["value_ptr"].astype(np.int64)
    sizes = np.diff(vp)
    cs = np.cumsum(d + 1)
    minor = cs - np.repeat(np.concatenate(([0], cs))[vp[:-1]], sizes) - 1
    rows = np.repeat(np.repeat(np.arange(3), np.diff(x["major_ptr"])), sizes)
    vals = np.repeat(x["values"], sizes)
    order = np.lexsort((minor, rows))
    assert np.array_equal(rows[order], [0, 0, 0, 0, 2, 2])
    assert np.array_equal(minor[order], cols)
    assert np.array_equal(vals[order], np.arange(1, 7, dtype=np.float32))
    assert max(len(ivref.encode_varints(np.array([c], np.uint64))) for c in cols) == 5
    ivserve.assert_ok(ivserve.check(out))


def test_export_index_dtype(ivserve, tmp_path):
    """`export --index-dtype int64` writes indptr and indices as int64, the
    types a matrix past 2^31 stored values gets (its own run takes tens of
    gigabytes): anndata reads the file whole and backed, and pack reads it
    back to the same matrix.  int32 and auto give int32 here; anything else,
    or the option with .npz output, is refused."""
    X = random_matrix(np.random.default_rng(31), (53, 29), "float32")
    # The reference in one index type: scipy's indexing refuses a mix.
    X64 = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)), shape=X.shape)
    src = str(tmp_path / "in.h5ad")
    write_h5ad(src, X, "csr")
    iv = str(tmp_path / "iv.h5ad")
    pack(ivserve, src, iv)
    for name, want_dt in (("int64", np.int64), ("int32", np.int32), ("auto", np.int32)):
        out = str(tmp_path / ("e_%s.h5ad" % name))
        ivserve.assert_ok(ivserve.run("export", iv, "--index-dtype", name, "-o", out))
        with h5py.File(out, "r") as f:
            assert f["X/indptr"].dtype == f["X/indices"].dtype == want_dt, \
                (name, f["X/indptr"].dtype, f["X/indices"].dtype)
        ad = anndata.read_h5ad(out)
        assert_csr_equal(ad.X, X)
        backed = anndata.read_h5ad(out, backed="r")
        rows, cols = [2, 9, 40], [0, 7, 28]
        got_rows, got_cols = sp.csr_matrix(backed.X[rows]), sp.csr_matrix(backed.X[:, cols])
        backed.file.close()
        assert_csr_equal(got_rows, ivref.canonical(X64[rows]))
        assert_csr_equal(got_cols, ivref.canonical(X64[:, cols]))
        again = str(tmp_path / ("p_%s.h5ad" % name))
        pack(ivserve, out, again)
        assert_csr_equal(ivref.read_iv(again), X)
    proc = ivserve.run("export", iv, "--index-dtype", "int16", "-o", str(tmp_path / "x.h5ad"))
    assert proc.returncode != 0 and "--index-dtype takes auto, int32 or int64" in proc.stderr
    proc = ivserve.run("export", iv, "--index-dtype", "int64", "-o", str(tmp_path / "x.npz"))
    assert proc.returncode == 1 and "applies to .h5ad output" in proc.stderr
    assert not os.path.exists(str(tmp_path / "x.npz"))
