"""Tests of the Python reference itself (ivref.py): the writer must produce
exactly the layout FORMAT.md section 2 describes, checked against hand-made
byte streams and by round trips through the independent reader.  No C code
is involved; the differential tests rely on this module being right."""


import h5py
import numpy as np
import pytest
import scipy.sparse as sp

import ivref


def same_csr(a, b):
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and a.data.dtype == b.data.dtype
            and a.data.tobytes() == b.data.tobytes())


def random_matrix(rng, n_rows, n_cols, nnz, dtype=np.int32, nan_frac=0.0, zero_frac=0.0):
    """Random COO with unique coordinates and small values (so groups form),
    converted to CSR keeping stored zeros."""
    nnz = min(nnz, n_rows * n_cols)
    flat = rng.choice(n_rows * n_cols, size=nnz, replace=False) if nnz else np.zeros(0, np.int64)
    rows, cols = np.divmod(flat, n_cols)
    kind = np.dtype(dtype).kind
    if kind == "f":
        data = (rng.integers(-4, 6, nnz) * 0.5).astype(dtype)
        data[rng.random(nnz) < nan_frac] = np.nan
    elif kind == "u":
        data = rng.integers(1, 9, nnz).astype(dtype)
    else:
        data = rng.integers(-5, 9, nnz).astype(dtype)
    data[data == 0] = 1
    data[rng.random(nnz) < zero_frac] = 0
    return ivref.make_csr(*_csr_arrays(rows, cols, data, n_rows), (n_rows, n_cols))


def _csr_arrays(rows, cols, data, n_rows):
    order = np.lexsort((cols, rows))
    indptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return data[order], cols[order], indptr


# ------------------------------------------------------------ varints

@pytest.mark.parametrize("value,encoded", [
    (0, [0x00]), (1, [0x01]), (127, [0x7F]), (128, [0x80, 0x01]), (300, [0xAC, 0x02]),
    (16383, [0xFF, 0x7F]), (16384, [0x80, 0x80, 0x01]), (2**21, [0x80, 0x80, 0x80, 0x01]),
    (2**28 - 1, [0xFF, 0xFF, 0xFF, 0x7F]), (2**28, [0x80, 0x80, 0x80, 0x80, 0x01]),
    (2**63, [0x80] * 9 + [0x01]),
])
def test_varint_known_bytes(value, encoded):
    got = ivref.encode_varints(np.array([value], dtype=np.uint64))
    assert got.tolist() == encoded
    assert ivref.decode_varints(got).tolist() == [value]


def test_varint_roundtrip_all_lengths():
    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 1 << (7 * k), 200, dtype=np.uint64) for k in range(1, 10)]
    v = np.concatenate(parts + [np.array([2**64 - 1], dtype=np.uint64)])
    rng.shuffle(v)
    enc = ivref.encode_varints(v)
    assert enc.shape[0] == int(ivref.varint_lengths(v).sum())
    assert np.array_equal(ivref.decode_varints(enc), v)


def test_varint_decoder_refuses_unterminated():
    with pytest.raises(ValueError, match="unterminated"):
        ivref.decode_varints(np.array([0x05, 0x81], dtype=np.uint8))


# ------------------------------------------------------------ layout by hand

def test_pack_layout_by_hand():
    # Row 0: values 2@1, 1@3, 2@4, 0(stored)@6 -> groups 0:[6], 1:[3], 2:[1,4]
    # Row 1: empty.  Row 2: 5@0, 5@200 -> one group [0,200].
    X = ivref.make_csr(np.array([2, 1, 2, 0, 5, 5], np.int32), np.array([1, 3, 4, 6, 0, 200]),
                       np.array([0, 4, 4, 6]), (3, 300))
    enc = ivref.pack(X)
    assert enc["major_ptr"].tolist() == [0, 3, 3, 4]
    assert enc["values"].tolist() == [0, 1, 2, 5]
    assert enc["value_ptr"].tolist() == [0, 1, 2, 4, 6]
    # deltas: [6], [3], [1, 4-1-1=2], [0, 200-0-1=199 -> 0xC7 0x01]
    assert enc["packed"].tolist() == [6, 3, 1, 2, 0, 0xC7, 0x01]


def test_pack_ivcsc_is_transpose():
    X = ivref.make_csr(np.array([3, 3, 1], np.int64), np.array([0, 2, 2]),
                       np.array([0, 2, 3]), (2, 3))
    enc = ivref.pack(X, "ivcsc")
    # Gene 0: cell 0 (3).  Gene 1: empty.  Gene 2: cell 1 (1), cell 0 (3).
    assert enc["major_ptr"].tolist() == [0, 1, 1, 3]
    assert enc["values"].tolist() == [3, 1, 3]
    assert enc["value_ptr"].tolist() == [0, 1, 2, 3]
    assert enc["packed"].tolist() == [0, 1, 0]


def test_nan_each_own_group_and_last():
    X = ivref.make_csr(np.array([np.nan, 1.0, np.nan, 1.0], np.float32),
                       np.array([0, 1, 2, 3]), np.array([0, 4]), (1, 4))
    enc = ivref.pack(X)
    v = enc["values"]
    assert v.shape[0] == 3 and v[0] == 1.0 and np.isnan(v[1]) and np.isnan(v[2])
    assert enc["value_ptr"].tolist() == [0, 2, 3, 4]
    assert enc["packed"].tolist() == [1, 1, 0, 2]


def test_shuffled_groups_same_matrix_other_order():
    rng = np.random.default_rng(3)
    X = random_matrix(rng, 30, 40, 500)
    a = ivref.pack(X)
    b = ivref.pack(X, shuffle_groups=True, rng=5)
    assert not np.array_equal(a["values"], b["values"])
    assert np.array_equal(a["major_ptr"], b["major_ptr"])
    for i in range(30):
        ga = slice(a["major_ptr"][i], a["major_ptr"][i + 1])
        gb = slice(b["major_ptr"][i], b["major_ptr"][i + 1])
        assert sorted(a["values"][ga].tolist()) == sorted(b["values"][gb].tolist())
    for k in range(a["values"].shape[0]):
        assert a["value_ptr"][k + 1] > a["value_ptr"][k]


# ------------------------------------------------------------ file round trips

CASES = [
    # name, n_rows, n_cols, nnz, dtype, extra
    ("small_int", 40, 30, 300, np.int32, {}),
    ("uint8", 25, 100, 400, np.uint8, {}),
    ("int8_neg", 25, 100, 400, np.int8, {}),
    ("int16", 10, 1000, 800, np.int16, {}),
    ("uint16", 10, 1000, 800, np.uint16, {}),
    ("uint32", 10, 1000, 800, np.uint32, {}),
    ("int64", 10, 1000, 800, np.int64, {}),
    ("uint64", 10, 1000, 800, np.uint64, {}),
    ("float32_nan", 30, 50, 600, np.float32, {"nan_frac": 0.1, "zero_frac": 0.05}),
    ("float64_zero", 30, 50, 600, np.float64, {"zero_frac": 0.1}),
    ("three_byte", 20, 2_000_000, 60, np.int32, {}),
    ("four_byte", 8, 40_000_000, 16, np.int32, {}),
    ("five_byte", 4, 2**29, 6, np.int32, {}),
    ("empty_rows", 50, 20, 5, np.int32, {}),
    ("zero_rows", 0, 20, 0, np.int32, {}),
    ("zero_nnz", 10, 20, 0, np.int32, {}),
    ("single_row", 1, 500, 200, np.float32, {}),
    ("single_gene", 300, 1, 120, np.int32, {}),
]


@pytest.mark.parametrize("name,n_rows,n_cols,nnz,dtype,extra", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("orientation,compression", [
    ("ivcsr", None), ("ivcsr", "gzip"), ("ivcsr", "zstd"), ("ivcsc", None), ("ivcsc", "zstd")])
def test_roundtrip(tmp_path, name, n_rows, n_cols, nnz, dtype, extra, orientation, compression):
    if orientation == "ivcsc" and n_cols > 10_000_000:
        pytest.skip("an IVCSC major_ptr over 10^7 genes is needlessly large for this test")
    rng = np.random.default_rng(len(name) * 1000 + nnz)
    X = random_matrix(rng, n_rows, n_cols, nnz, dtype, **extra)
    path = str(tmp_path / "m.h5ad")
    enc = ivref.write_iv(path, X, orientation=orientation, compression=compression,
                         chunk_len=5, shuffle_groups=(nnz % 2 == 0), rng=1)
    Y = ivref.read_iv(path)
    assert same_csr(Y, ivref.canonical(X))
    lens = ivref.varint_lengths(ivref.decode_varints(enc["packed"]))
    if name.endswith("_byte"):
        want = {"three_byte": 3, "four_byte": 4, "five_byte": 5}[name]
        if orientation == "ivcsr":
            assert lens.max() == want
    with h5py.File(path, "r") as f:
        g = f["X"]
        assert g.attrs["encoding-type"] == orientation
        assert g.attrs["encoding-version"] == "0.1.0"
        assert list(g.attrs["shape"]) == [n_rows, n_cols]
        for ds in ("major_ptr", "values", "value_ptr", "packed_indices"):
            assert g[ds].attrs["encoding-type"] == "array"
            assert g[ds].attrs["encoding-version"] == "0.2.0"
        assert g["packed_indices"].dtype == np.uint8
        assert g["values"].dtype == np.dtype(dtype)
        if compression == "zstd" and enc["packed"].shape[0]:
            assert g["packed_indices"].chunks == (5,)
            plist = g["packed_indices"].id.get_create_plist()
            assert plist.get_filter(0)[0] == ivref.ZSTD_FILTER_ID


def test_zstd_chunks_are_full_frames_with_content_size(tmp_path):
    import zstandard
    rng = np.random.default_rng(11)
    X = random_matrix(rng, 20, 300, 400)
    path = str(tmp_path / "z.h5ad")
    enc = ivref.write_iv(path, X, compression="zstd", chunk_len=64)
    n = enc["packed"].shape[0]
    with h5py.File(path, "r") as f:
        d = f["X/packed_indices"]
        for off in range(0, n, 64):
            mask, frame = d.id.read_direct_chunk((off,))
            assert mask == 0
            assert zstandard.get_frame_parameters(frame).content_size == 64
            raw = zstandard.ZstdDecompressor().decompress(frame)
            want = enc["packed"][off:off + 64].tobytes()
            assert raw[:len(want)] == want and raw[len(want):] == bytes(64 - len(want))


def test_pointer_dtypes_and_other_group(tmp_path):
    rng = np.random.default_rng(12)
    X = random_matrix(rng, 30, 60, 300)
    for ptr in (np.int32, np.uint32, np.int16, np.uint64):
        path = str(tmp_path / ("p%s.h5ad" % np.dtype(ptr).name))
        ivref.write_iv(path, X, ptr_dtype=ptr, group="counts")
        with h5py.File(path, "r") as f:
            assert "X" not in f
            assert f["counts/major_ptr"].dtype == np.dtype(ptr)
            assert f["counts/value_ptr"].dtype == np.dtype(ptr)
        assert same_csr(ivref.read_iv(path, group="counts"), ivref.canonical(X))


def test_value_dtype_cast(tmp_path):
    X = ivref.make_csr(np.array([1.0, 2.0, 1.0]), np.array([0, 1, 2]), np.array([0, 3]), (1, 3))
    path = str(tmp_path / "c.h5ad")
    ivref.write_iv(path, X, value_dtype=np.uint16)
    Y = ivref.read_iv(path)
    assert Y.data.dtype == np.uint16 and Y.data.tolist() == [1, 2, 1]


def test_metadata_frames(tmp_path):
    X = sp.csr_matrix(np.eye(3, 4, dtype=np.int32))
    path = str(tmp_path / "meta.h5ad")
    ivref.write_iv(path, X, var=["A", "B", "C", "D"])
    with h5py.File(path, "r") as f:
        assert f["obs"].attrs["encoding-type"] == "dataframe"
        assert f["obs"].attrs["_index"] == "_index"
        assert [s.decode() for s in f["obs/_index"][...]] == ["cell0", "cell1", "cell2"]
        assert [s.decode() for s in f["var/_index"][...]] == ["A", "B", "C", "D"]
    # anndata itself must read the dataframes back.
    from anndata.experimental import read_elem
    with h5py.File(path, "r") as f:
        assert list(read_elem(f["obs"]).index) == ["cell0", "cell1", "cell2"]
        assert list(read_elem(f["var"]).index) == ["A", "B", "C", "D"]


# ------------------------------------------------------------ expected()

def test_expected_matches_dense_indexing_and_keeps_zeros():
    rng = np.random.default_rng(21)
    X = random_matrix(rng, 40, 30, 400, np.float64, nan_frac=0.05, zero_frac=0.2)
    dense = X.toarray()
    stored = np.zeros(X.shape, bool)
    stored[np.repeat(np.arange(40), np.diff(X.indptr)), X.indices] = True
    for _ in range(200):
        obs = rng.integers(0, 40, rng.integers(0, 60))
        var = rng.integers(0, 30, rng.integers(0, 50))
        E = ivref.expected(X, obs, var)
        assert E.shape == (obs.shape[0], var.shape[0])
        assert E.indptr.dtype == np.int64 and E.indices.dtype == np.int32
        assert np.array_equal(E.toarray(), dense[obs][:, var], equal_nan=True)
        # Stored entries (zeros included) are exactly the stored input cells.
        assert E.nnz == int(stored[obs][:, var].sum())
        for r in range(E.shape[0]):
            row = E.indices[E.indptr[r]:E.indptr[r + 1]]
            assert np.all(np.diff(row) > 0)


def test_format_sel_roundtrip():
    rng = np.random.default_rng(5)
    for _ in range(300):
        sel = rng.integers(0, 30, rng.integers(0, 20)).tolist()
        if rng.random() < 0.5:
            sel += list(range(rng.integers(0, 20), rng.integers(20, 40)))
        text = ivref.format_sel(sel)
        back = []
        for part in filter(None, text.split(",")):
            if ":" in part:
                a, b = part.split(":")
                back += list(range(int(a), int(b)))
            else:
                back.append(int(part))
        assert back == sel


# ------------------------------------------------------------ compare_npz()

def test_compare_npz_detects_every_kind_of_difference(tmp_path):
    rng = np.random.default_rng(31)
    X = ivref.random_csr(rng, 12, 15, 150, np.float32, nan_frac=0.15, zero_frac=0.15)
    E = ivref.expected(X, [3, 1, 1, 7, 10, 11], [4, 0, 4, 9, 2, 13, 14])
    assert E.nnz > 5 and np.isnan(E.data).any() and (E.data == 0).any()
    path = str(tmp_path / "e.npz")

    def save(**over):
        arrays = dict(format=np.array("csr"), shape=np.array(E.shape), data=E.data,
                      indices=E.indices, indptr=E.indptr)
        arrays.update(over)
        np.savez(path, **arrays)
        return ivref.compare_npz(path, E)

    # scipy's own writer gives an equal file.
    sp.save_npz(path, E, compressed=False)
    assert ivref.compare_npz(path, E) is None
    assert save() is None
    assert "format" in save(format=np.array("csc"))
    assert "shape" in save(shape=np.array([E.shape[0], E.shape[1] + 1]))
    assert "dtype" in save(data=E.data.astype(np.float64))
    assert "dtype" in save(indices=E.indices.astype(np.int64))
    assert "dtype" in save(indptr=E.indptr.astype(np.int32))
    idx = E.indices.copy()
    idx[0] += 1
    assert "indices" in save(indices=idx)
    d = E.data.copy()
    z = int(np.flatnonzero(d == 0)[0])
    d[z] = 1.0  # an explicit zero turned into a value
    assert "data" in save(data=d)
    d = E.data.copy()
    nan = int(np.flatnonzero(np.isnan(d))[0])
    other = (nan + 1) % d.shape[0]
    d[nan], d[other] = d[other], d[nan]  # a NaN moved
    assert "data" in save(data=d)
    # A dropped explicit zero changes indptr, indices and data lengths.
    keep = np.ones(E.nnz, bool)
    keep[z] = False
    row = int(np.searchsorted(E.indptr, z, "right")) - 1
    ip = E.indptr.copy()
    ip[row + 1:] -= 1
    assert save(data=E.data[keep], indices=E.indices[keep], indptr=ip) is not None
