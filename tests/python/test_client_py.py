"""The Python client package (clients/python, `import ivserve`) against a real server.

Starts ivserve on fixture files of both orientations, integer and float
values, synthetic and real metadata, and checks: every selection form
(ints, slices of every shape, ranges, boolean masks, int and name lists,
Ellipsis, where filters, composed queries) gives exactly numpy's
X[rows][:, cols] of the expected matrix, as scipy CSR and as numpy, with
the file's value dtype; obs / var DataFrames and to_anndata() equal
anndata's own reading of the metadata twin, column by column, dtypes and
categories included, rows in the selection's order; count; streamed blocks
read incrementally; errors as IvserveError; the progress bar; tokens;
hostile binary frames (sizes past their bounds, frames cut after
declaring a gigabyte, read directly and from a fake HTTP server) refused
with the client's own error and tracemalloc's peak bounded by what
arrived; and that `pip install --no-build-isolation` of the package
works offline.

The package is imported from the source tree (clients/python on sys.path),
so the suite needs no install step.
"""
import io
import os
import shutil
import subprocess
import sys
import types
import warnings

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PKG = os.path.join(REPO, "clients", "python")
sys.path.insert(0, HERE)
sys.path.insert(0, PKG)

import ivserve  # noqa: E402
from ivserve import IvserveError, Where  # noqa: E402
from ivserve import wire  # noqa: E402

from conftest import fixtures_path  # noqa: E402

FIX = fixtures_path()
if FIX is None:
    pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): skipping",
                allow_module_level=True)

from test_http_server import Server  # noqa: E402

# (dataset id, file, expected matrix, metadata twin), relative to the fixtures.
DATASETS = [
    ("tiny_r", "tiny.ivcsr.blosc2-lz4.h5ad", "expected/tiny.csr.h5", "expected/tiny.meta.h5ad"),
    ("tiny_c", "tiny.ivcsc.blosc2-lz4.h5ad", "expected/tiny.csr.h5", "expected/tiny.meta.h5ad"),
    ("floaty", "floaty.ivcsr.gzip.h5ad", "expected/floaty.csr.h5", "expected/floaty.meta.h5ad"),
    ("wide_c", "wide.ivcsc.zstd.h5ad", "expected/wide.csr.h5", "expected/wide.meta.h5ad"),
    ("chunky", "chunky.ivcsr.zstd.h5ad", "expected/chunky.csr.h5", "expected/chunky.meta.h5ad"),
    ("pbmc_small", "real/pbmc_small.ivcsr.h5ad", "real/expected/pbmc_small.csr.h5",
     "real/expected/pbmc_small.meta.h5ad"),
    ("visium", "real/seurat_visium_testdata.ivcsr.h5ad",
     "real/expected/seurat_visium_testdata.csr.h5", "real/expected/seurat_visium_testdata.meta.h5ad"),
]
DATASETS = [d for d in DATASETS if os.path.exists(os.path.join(FIX, d[1]))]
IDS = [d[0] for d in DATASETS]
SYNTHETIC = [d for d in IDS if d in ("tiny_r", "tiny_c", "floaty", "wide_c", "chunky")]


@pytest.fixture(scope="module")
def srv(ivserve, tmp_path_factory):
    ds = [{"id": d, "path": os.path.abspath(os.path.join(FIX, f))} for d, f, _, _ in DATASETS]
    s = Server(str(tmp_path_factory.mktemp("client")), datasets=ds)
    yield s
    assert s.stop() == 0, s.log_text()[-3000:]


@pytest.fixture(scope="module")
def client(srv):
    return ivserve.connect(srv.url)


_CACHE = {}
_SPARSE = {}


def stored(ds_id, rows, cols):
    """Stored values (explicit zeros included) of the expected selection."""
    ref(ds_id)
    return _SPARSE[ds_id][rows][:, cols].nnz


def ref(ds_id):
    """(dense expected matrix in the file's value dtype, anndata obs, var)."""
    if ds_id not in _CACHE:
        _, f, exp, meta = next(d for d in DATASETS if d[0] == ds_id)
        with h5py.File(os.path.join(FIX, f), "r") as h:
            vdt = h["X"]["values"].dtype
        with h5py.File(os.path.join(FIX, exp), "r") as h:
            shape = tuple(int(x) for x in h.attrs["shape"])
            m = sp.csr_matrix((h["data"][:], h["indices"][:], h["indptr"][:]), shape=shape)
        dense = m.toarray()
        assert np.array_equal(dense.astype(vdt).astype(dense.dtype), dense, equal_nan=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = anndata.read_h5ad(os.path.join(FIX, meta))
        _CACHE[ds_id] = (dense.astype(vdt), a.obs, a.var)
        _SPARSE[ds_id] = m
    return _CACHE[ds_id]


def np_rows(key, n, names):
    """The row numbers numpy (and pandas, for names) gives for key."""
    if key is None or key is Ellipsis:
        return np.arange(n)
    if isinstance(key, str):
        key = [key]
    if isinstance(key, (pd.Series, pd.Index)):
        key = key.to_numpy()
    arr = np.asarray(key) if not isinstance(key, slice) else None
    if arr is not None and arr.size and (arr.dtype.kind in "US" or arr.dtype == object):
        pos = names.get_indexer(arr)
        assert (pos >= 0).all()
        return pos
    if arr is not None and arr.size == 0:
        return np.zeros(0, np.int64)
    out = np.arange(n)[key]
    return np.atleast_1d(out)


def assert_same(got, want):
    """Exact equality (NaN where NaN), shape and dtype included."""
    if sp.issparse(got):
        assert isinstance(got, sp.csr_matrix)
        got = got.toarray()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f")


def selections(n_obs, n_var, obs_names, var_names, rng):
    """(obs key, var key) pairs covering every form."""
    ints = rng.integers(-n_obs, n_obs, 12)
    gints = rng.integers(-n_var, n_var, 15)
    mask = rng.random(n_obs) < 0.3
    gmask = rng.random(n_var) < 0.2
    onames = [obs_names[i] for i in rng.integers(0, n_obs, 6)] + [obs_names[0], obs_names[0]]
    vnames = [var_names[i] for i in rng.integers(0, n_var, 7)] + [var_names[-1]] * 2
    return [
        (None, None),
        (3, None), (-1, None), (np.int64(n_obs // 2), 0), (0, -1),
        (slice(None, None), slice(None, None)),
        (slice(5, None), slice(None, 7)),
        (slice(None, -3), slice(-10, None)),
        (slice(-7, -2), slice(2, -2, 3)),
        (slice(None, None, 2), slice(None, None, -1)),
        (slice(None, None, -3), slice(1, None, 5)),
        (slice(-2, 1, -2), slice(-1, -40, -7)),
        (slice(4, 4), None), (slice(10, 2), None),
        (slice(0, n_obs + 50), slice(-10 * n_var, None)),   # out-of-range ends clip, as numpy
        (range(2, 9), range(n_var - 1, 0, -4)),
        (ints.tolist(), gints.tolist()),
        (ints, gints.astype(np.int32)),
        ([], None), (None, []),
        (mask, gmask), (mask.tolist(), None), (pd.Series(mask), pd.Series(gmask)),
        (onames, vnames), (np.array(onames), None), (pd.Index(onames), pd.Index(vnames)),
        (obs_names[1], var_names[2]),
        (Ellipsis, vnames[:3]),
        # long increasing lists travel as masks (chunky's obs, wide's var)
        (np.delete(np.arange(n_obs), [1, n_obs // 2]), np.arange(0, n_var, 3)),
    ]


@pytest.mark.parametrize("ds_id", IDS)
def test_selection_forms_equal_numpy(client, ds_id):
    dense, obs, var = ref(ds_id)
    ds = client[ds_id]
    assert ds.shape == dense.shape
    assert list(ds.obs_names) == list(obs.index) and list(ds.var_names) == list(var.index)
    rng = np.random.default_rng(sum(map(ord, ds_id)))
    n, g = dense.shape
    for ok, vk in selections(n, g, list(obs.index), list(var.index), rng):
        rows, cols = np_rows(ok, n, obs.index), np_rows(vk, g, var.index)
        want = dense[rows][:, cols]
        q = ds[ok, vk] if vk is not None else ds[ok]
        X, got_rows = q.fetch()
        assert_same(X, want)
        assert np.array_equal(got_rows, rows), (ok, vk)
        assert_same(q.to_numpy(), want)
        cnt = q.count()
        assert (cnt["n_cells"], cnt["n_genes"], cnt["nnz"]) == (len(rows), len(cols), stored(ds_id, rows, cols))
    # The Ellipsis and one-key forms, and ds.query() with keywords.
    assert_same(ds[...].to_scipy(), dense)
    assert_same(ds.query(var=[1, 0]).to_scipy(), dense[:, [1, 0]])


def test_compress_asks_for_gzip_and_reads_it(srv):
    """compress=True asks for gzip result streams and reads them to the
    same matrices; by default the client asks for identity (gzip costs
    twice the CPU on both sides for a third of the bytes)."""
    encodings = []

    def record(r, *args, **kw):
        if r.request.path_url.endswith("/query"):
            encodings.append(r.headers.get("Content-Encoding"))

    for compress in (False, True):
        c = ivserve.connect(srv.url, compress=compress)
        c.session.hooks["response"].append(record)
        for ds_id in IDS:
            dense, _, _ = ref(ds_id)
            assert_same(c[ds_id][...].to_scipy(), dense)
            rows = np.random.default_rng(5).integers(0, dense.shape[0], 40)
            X, got = c[ds_id][rows.tolist()].fetch()
            assert_same(X, dense[rows])
            assert np.array_equal(got, rows)
        assert encodings == [("gzip" if compress else None)] * (2 * len(IDS)), encodings
        encodings.clear()


@pytest.mark.parametrize("ds_id", IDS)
def test_composed_queries_equal_numpy(client, ds_id):
    dense, obs, var = ref(ds_id)
    ds = client[ds_id]
    n, g = dense.shape
    rows = np.arange(n)[::-2]
    cols = np.arange(g)[1::3]
    q = ds[::-2, 1::3]
    assert_same(q[3:, [0, -1, 0]].to_scipy(), dense[rows[3:]][:, cols[[0, -1, 0]]])
    assert_same(q[[-1, 0]].to_scipy(), dense[rows[[-1, 0]]][:, cols])
    m = np.zeros(len(rows), bool)
    m[::3] = True
    assert_same(q[m, :2].to_numpy(), dense[rows[m]][:, cols[:2]])
    # names among the selected rows
    nm = [obs.index[rows[2]], obs.index[rows[0]]]
    assert_same(q[nm].to_numpy(), dense[rows[[2, 0]]][:, cols])
    outside = next(i for i in range(n) if i not in set(rows.tolist()))
    with pytest.raises(IvserveError) as e:
        q[[obs.index[outside]]]
    assert e.value.code == "unknown_name"


def filters_for(ds_id, obs):
    """(where string, pandas mask) pairs for the dataset's obs."""
    if ds_id in SYNTHETIC:
        return [
            ("cell_type in ['B cell', 'NK cell']", obs.cell_type.isin(["B cell", "NK cell"])),
            ("age >= 40 and age < 70 and not is_doublet", (obs.age >= 40) & (obs.age < 70) & ~obs.is_doublet),
            ("batch is null", obs.batch.isna()),
        ]
    if ds_id == "pbmc_small":
        return [("groups == 'g1' and nCount_RNA > 100", (obs.groups == "g1") & (obs.nCount_RNA > 100))]
    return [("in_tissue == 1 and array_row < 30", (obs.in_tissue == 1) & (obs.array_row < 30))]


@pytest.mark.parametrize("ds_id", IDS)
def test_where_equals_pandas(client, ds_id):
    dense, obs, var = ref(ds_id)
    ds = client[ds_id]
    for expr, mask in filters_for(ds_id, obs):
        rows = np.flatnonzero(np.asarray(mask, dtype=bool))
        assert 0 < len(rows) < len(obs) or "is null" in expr
        q = ds.where(expr)
        X, got = q.fetch()
        assert np.array_equal(got, rows), expr
        assert_same(X, dense[rows])
        assert q.shape == (len(rows), dense.shape[1])
        # Where as a key, combined with genes; a where narrowing a selection.
        assert_same(ds[Where(expr), [2, 0]].to_numpy(), dense[rows][:, [2, 0]])
        assert_same(q[1::2, -3:].to_numpy(), dense[rows[1::2]][:, dense.shape[1] - 3:])
        sub = ds[::3].where(expr)
        keep = np.arange(len(obs))[::3]
        keep = keep[np.asarray(mask, dtype=bool)[keep]]
        assert np.array_equal(sub.fetch()[1], keep)
        assert ds.count(obs=Where(expr))["n_cells"] == len(rows)
    if ds_id in SYNTHETIC:
        # Two obs wheres are and-ed; a var where selects genes.
        both = ds.where("age >= 40").where("not is_doublet")
        m = (obs.age >= 40) & ~obs.is_doublet
        assert np.array_equal(both.fetch()[1], np.flatnonzero(m.to_numpy()))
        hv = np.flatnonzero(var.highly_variable.to_numpy())
        assert_same(ds.where(var="highly_variable").to_scipy(), dense[:, hv])


def frame_equal(got, want):
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_categorical=True)
    for c in want.columns:
        if isinstance(want[c].dtype, pd.CategoricalDtype):
            assert list(got[c].cat.categories) == list(want[c].cat.categories), c
            assert got[c].cat.ordered == want[c].cat.ordered


@pytest.mark.parametrize("ds_id", IDS)
def test_obs_var_frames_equal_anndata(client, ds_id):
    _, obs, var = ref(ds_id)
    ds = client[ds_id]
    frame_equal(ds.obs, obs)
    frame_equal(ds.var, var)
    assert ds.columns("obs") == list(obs.columns)
    # The schema names the stored width of int and float columns (what
    # lets the frames come back as float32 / int8 where the file has them).
    for axis, frame in (("obs", obs), ("var", var)):
        for c in ds.info[axis]["columns"]:
            if c["type"] in ("int", "float") and c["name"] in frame.columns:
                want = frame[c["name"]].dtype
                assert c["dtype"] == (want.numpy_dtype.name if hasattr(want, "numpy_dtype") else want.name)
    # Computed columns (of the stored major axis) only when asked for;
    # total_counts equals the matrix' sums.
    dense = ref(ds_id)[0]
    axis = "obs" if ds.info["orientation"] == "ivcsr" else "var"
    full = ds.read_frame(axis, computed=True)
    plain = ds.obs if axis == "obs" else ds.var
    assert "total_counts" in full.columns and "total_counts" not in plain.columns
    assert np.allclose(full.total_counts.to_numpy(dtype=np.float64),
                       np.nansum(dense.astype(np.float64), axis=1 if axis == "obs" else 0))
    assert list(ds.read_frame("obs", columns=[obs.columns[1]]).columns) == [obs.columns[1]]


def as_anndata_subset(df):
    """A subset table as anndata leaves it: categories no row uses dropped
    (test_to_anndata_equals_anndata_subset checks this against anndata)."""
    df = df.copy()
    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].cat.remove_unused_categories()
    return df


@pytest.mark.parametrize("ds_id", IDS)
def test_to_anndata_equals_anndata(client, ds_id):
    dense, obs, var = ref(ds_id)
    ds = client[ds_id]
    n, g = dense.shape
    rng = np.random.default_rng(7)
    idx = rng.integers(0, n, 25).tolist() + [0, 0]
    gidx = rng.permutation(g)[: min(g, 40)]
    expr, mask = filters_for(ds_id, obs)[0]
    cases = [
        (ds[:, :], np.arange(n), np.arange(g)),
        (ds[idx, gidx], np.asarray(idx), gidx),
        (ds[::-1, list(var.index[[3, 1, 3]])], np.arange(n)[::-1], np.array([3, 1, 3])),
        (ds.where(expr)[:, 2:9], np.flatnonzero(np.asarray(mask, bool)), np.arange(2, 9)),
    ]
    if ds_id in SYNTHETIC:
        cases.append((ds.where("cell_type == 'B cell'", var="highly_variable"),
                      np.flatnonzero((obs.cell_type == "B cell").to_numpy()),
                      np.flatnonzero(var.highly_variable.to_numpy())))
        cases.append((ds[:5, {"names": list(var.gene_ids.iloc[[4, 2]]), "by": "gene_ids"}],
                      np.arange(5), np.array([4, 2])))
    for q, rows, cols in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # duplicate obs names
            ad = q.to_anndata()
        assert isinstance(ad, anndata.AnnData)
        assert isinstance(ad.X, sp.csr_matrix)
        assert_same(ad.X, dense[rows][:, cols])
        frame_equal(ad.obs, as_anndata_subset(obs.iloc[rows]))
        frame_equal(ad.var, as_anndata_subset(var.iloc[cols]))
        assert len(ad.obsm) == 0  # this server serves no obsm arrays
    ad = ds[:3].to_anndata(computed=True)
    assert "total_counts" in list(ad.obs.columns) + list(ad.var.columns)


def test_count(client):
    dense, obs, _ = ref(IDS[0])
    ds = client[IDS[0]]
    c = ds.count(obs=slice(5, None), var=[0, 3, 3])
    want = dense[5:][:, [0, 3, 3]]
    assert c["shape"] == list(want.shape) and c["nnz"] == stored(IDS[0], np.arange(5, len(dense)), [0, 3, 3])
    assert c["total_counts"] == pytest.approx(float(want.sum()))
    assert ds.count()["nnz"] == ds.nnz == _SPARSE[IDS[0]].nnz


def test_datasets_and_info(client):
    listed = {d["id"]: d for d in client.datasets()}
    assert set(listed) == set(IDS)
    assert set(client) == set(IDS)
    for ds_id in IDS:
        ds = client[ds_id]
        assert tuple(listed[ds_id]["shape"]) == ds.shape
        assert ds.dtype == ref(ds_id)[0].dtype
    assert "tiny_r" in repr(client["tiny_r"])


@pytest.mark.parametrize("ds_id", [d for d in ("wide_c", "chunky") if d in IDS])
def test_iter_blocks_streams(client, srv, ds_id):
    dense, _, _ = ref(ds_id)
    ds = client[ds_id]
    blocks = list(ds.iter_blocks())
    assert len(blocks) >= 2, "the fixture's whole matrix should span several blocks"
    X = sp.vstack([b.X for b in blocks]).tocsr()
    assert_same(X, dense)
    assert np.array_equal(np.concatenate([b.obs for b in blocks]), np.arange(dense.shape[0]))
    sel = list(ds.iter_blocks(obs=slice(None, None, -1), var=slice(0, 500)))
    assert_same(sp.vstack([b.X for b in sel]).tocsr(), dense[::-1, :500])
    # The reader takes the stream frame by frame: when the first block is
    # handed out, no byte past it has been read.
    body = requests.post(f"{srv.url}/v1/datasets/{ds_id}/query", json={},
                         headers={"Accept": wire.MEDIA_TYPE}).content

    class Counting(io.BytesIO):
        high = 0

        def readinto(self, b):
            k = super().readinto(b)
            Counting.high = max(Counting.high, self.tell())
            return k

    src = Counting(body)
    it = wire.StreamReader(src).blocks()
    first = next(it)
    n0, k0 = first.X.shape[0], first.X.nnz
    idx_size = 4 if dense.shape[1] < 2 ** 31 else 8
    first_end = 40 + 24 + 8 * n0 + 8 * (n0 + 1) + (idx_size + dense.dtype.itemsize) * k0
    assert Counting.high == first_end < len(body)
    rest = list(it)
    assert Counting.high == len(body) and len(rest) == len(blocks) - 1


def test_progress_bar(client, monkeypatch):
    calls = []

    class FakeBar:
        def __init__(self, total, **kw):
            calls.append(("new", total))

        def update(self, n):
            calls.append(("update", n))

        def close(self):
            calls.append(("close", None))

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    ds = client["chunky" if "chunky" in IDS else IDS[0]]
    n = ds.shape[0]
    ds[:].to_scipy(progress=True)
    assert calls[0] == ("new", n) and calls[-1] == ("close", None)
    assert sum(x for k, x in calls if k == "update") == n
    calls.clear()
    ds[:].to_scipy()  # small result: no bar by default
    assert calls == []
    monkeypatch.setattr("ivserve.progress.AUTO_ROWS", 10)
    ds[:].to_scipy()  # large enough, but stderr is not a terminal here: no bar
    assert calls == []
    monkeypatch.setattr("ivserve.progress._terminal", lambda: True)
    ds[:].to_scipy()
    assert calls and calls[0] == ("new", n)
    calls.clear()
    ds[:].to_scipy(progress=False)
    assert calls == []


def test_errors(client, srv):
    ds = client[IDS[0]]
    n, g = ds.shape
    with pytest.raises(IvserveError) as e:
        client["no_such_dataset"]
    assert (e.value.status, e.value.code) == (404, "not_found")
    assert "no_such_dataset" in e.value.message
    with pytest.raises(IvserveError) as e:
        ds.where("cell_typ == 'B cell'" if IDS[0] in SYNTHETIC else "nope == 1").to_scipy()
    assert e.value.status == 422 and e.value.code == "bad_filter"
    with pytest.raises(IvserveError) as e:
        ds.where("age >=").count()
    assert e.value.status == 400 and "position" in e.value.message
    with pytest.raises(IvserveError) as e:
        ds[["NOPE_CELL"]].to_scipy()
    assert e.value.status == 422 and e.value.code == "unknown_name"
    for key in (n, -n - 1, [0, n], np.zeros(n + 1, bool)):
        with pytest.raises(IvserveError) as e:
            ds[key]
        assert e.value.code == "bad_selection" and "obs" in e.value.message
    with pytest.raises(IvserveError) as e:
        ds[:, g]
    assert "var" in e.value.message
    with pytest.raises(IvserveError) as e:
        ds.obsm["X_umap"]
    assert e.value.status == 404
    with pytest.raises(IvserveError) as e:
        ivserve.connect("http://127.0.0.1:1", timeout=2).datasets()
    assert e.value.status is None and e.value.code == "connection"
    with pytest.raises(TypeError):
        ds[1.5]


def _stream(blocks, trailer_status=0, msg=b"", rows=None, nnz=None, cols=4):
    """A binary stream of int32 values built by hand."""
    import struct
    total_rows = sum(len(o) for o, _ in blocks)
    out = bytearray(struct.pack("<4sIqq8s8s", b"IVQS", 1, total_rows, cols, b"<i4", b"<i4"))
    knnz = 0
    for obs, m in blocks:
        m = sp.csr_matrix(m)
        out += struct.pack("<IIqq", 1, 0, len(obs), m.nnz)
        out += np.asarray(obs, "<i8").tobytes() + m.indptr.astype("<i8").tobytes()
        out += m.indices.astype("<i4").tobytes() + m.data.astype("<i4").tobytes()
        knnz += m.nnz
    out += struct.pack("<IIqqI", 2, trailer_status, total_rows if rows is None else rows,
                       knnz if nnz is None else nnz, len(msg)) + msg
    return bytes(out)


def test_stream_reader_checks():
    m = np.array([[0, 1, 0, 2], [3, 0, 0, 0]], np.int32)
    good = _stream([([5, 2], m)])
    r = wire.StreamReader(io.BytesIO(good))
    h = r.read_header()
    X, obs = wire.assemble(h, list(r.blocks()))
    assert_same(X, m) and list(obs) == [5, 2]
    for cut in (10, 40, 70, len(good) - 3):
        with pytest.raises(IvserveError) as e:
            list(wire.StreamReader(io.BytesIO(good[:cut])).blocks())
        assert e.value.code == "truncated"
    err = _stream([([5, 2], m)], trailer_status=503,
                  msg=b'{"error":{"code":"overloaded","message":"try later"}}')
    with pytest.raises(IvserveError) as e:
        list(wire.StreamReader(io.BytesIO(err)).blocks())
    assert (e.value.status, e.value.code, e.value.message) == (503, "overloaded", "try later")
    with pytest.raises(IvserveError) as e:
        list(wire.StreamReader(io.BytesIO(_stream([([5, 2], m)], nnz=7))).blocks())
    assert e.value.code == "bad_stream"
    bad = bytearray(good)
    bad[0:4] = b"NOPE"
    with pytest.raises(IvserveError):
        wire.StreamReader(io.BytesIO(bytes(bad))).read_header()
    # A block claiming more rows than the header announced is refused
    # before anything is allocated for it.
    import struct
    huge = good[:40] + struct.pack("<IIqq", 1, 0, 1 << 40, 1 << 40)
    with pytest.raises(IvserveError) as e:
        list(wire.StreamReader(io.BytesIO(huge)).blocks())
    assert e.value.code == "bad_stream"


def _hostile(rows, cols, n, nnz, follow=b"", indptr=None):
    """A stream header and one block frame declaring n rows and nnz values
    of int32, its ids and pointers (indptr, default [0, ..., 0, nnz]), then
    follow and nothing else."""
    import struct
    ptr = indptr if indptr is not None else [0] * n + [nnz]
    return (struct.pack("<4sIqq8s8s", b"IVQS", 1, rows, cols, b"<i4", b"<i4") +
            struct.pack("<IIqq", 1, 0, n, nnz) + struct.pack("<%dq" % n, *range(n)) +
            struct.pack("<%dq" % (n + 1), *ptr) + follow)


def _read_peak(data):
    """(the IvserveError reading data raised, tracemalloc's peak bytes)."""
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(IvserveError) as e:
            list(wire.StreamReader(io.BytesIO(data)).blocks())
        return e.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_stream_reader_refuses_lying_sizes():
    # nnz 2**61 with matching pointers: the frame's size overflowed
    # bytearray (OverflowError) before; now its bytes pass no bound.
    for cols, why in ((4, "columns announced"), (1 << 40, "columns announced"),
                      (1 << 62, "max_frame_bytes")):
        err, peak = _read_peak(_hostile(1, cols, 1, 1 << 61))
        assert err.code == "bad_stream", err
        assert why in err.message, err.message
        assert peak < 1 << 20
    # More values than the block's rows times the columns.
    err, _ = _read_peak(_hostile(3, 4, 2, 9))
    assert err.code == "bad_stream" and "9 values" in err.message
    # One row holding more values than there are columns.
    err, _ = _read_peak(_hostile(2, 4, 2, 6, b"\0" * 48, indptr=[0, 5, 6]))
    assert err.code == "bad_stream" and "columns" in err.message
    # The cap is the reader's to set.
    m = sp.random(300, 50, density=0.3, format="csr", random_state=1, dtype=np.float64)
    m.data = np.round(m.data * 100)
    data = _stream([(list(range(300)), m.astype(np.int32))], cols=50)
    with pytest.raises(IvserveError) as e:
        list(wire.StreamReader(io.BytesIO(data), max_frame_bytes=4096).blocks())
    assert e.value.code == "bad_stream" and "4096" in e.value.message


def test_stream_reader_cut_frame_allocates_what_arrived():
    # A frame declaring 1 GiB of indices and values within every bound
    # (2**40 columns announced), then cut: the reader fails having held
    # what arrived plus a piece, not the declared gigabyte.
    nnz = 1 << 27
    for arrived in (0, 100_000, 3 * wire.READ_PIECE + 12345):
        err, peak = _read_peak(_hostile(1, 1 << 40, 1, nnz, b"\7" * arrived))
        assert err.code == "truncated", err
        assert "%d of %d bytes" % (arrived, 4 * nnz) in err.message
        assert peak <= arrived + 2 * wire.READ_PIECE, (arrived, peak)
    # A block of 2**24 rows (as many as the header announced) cut inside
    # its row ids.
    import struct
    rows = 1 << 24
    data = _hostile(rows, 1, 0, 0)[:40] + struct.pack("<IIqq", 1, 0, rows, 0) + b"\0" * 1000
    err, peak = _read_peak(data)
    assert err.code == "truncated" and "1000 of %d bytes" % (8 * rows) in err.message
    assert peak <= 2 * wire.READ_PIECE


def test_stream_reader_reads_large_blocks_in_pieces():
    # A true block larger than a piece reads back exactly.
    rng = np.random.default_rng(2)
    m = sp.random(2000, 400, density=0.5, format="csr", random_state=3)
    m.data = rng.integers(-9, 9, m.nnz).astype(np.float64)
    m = m.astype(np.int32)
    obs = rng.permutation(2000).tolist()
    data = _stream([(obs[:1500], m[:1500]), (obs[1500:], m[1500:])], cols=400)
    assert len(data) > 3 * wire.READ_PIECE
    r = wire.StreamReader(io.BytesIO(data))
    X, got_obs = wire.assemble(r.read_header(), list(r.blocks()))
    assert_same(X, m.toarray()) and list(got_obs) == obs


class _FakeServer:
    """An HTTP server in a thread with one dataset, "fake", whose query
    answer is body, sent as close-delimited, with a Content-Length past
    its end, or as one chunk longer than what is sent (mode)."""

    def __init__(self, body, shape):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                doc = json.dumps({"shape": list(shape), "nnz": 1, "dtype": "int32"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", wire.MEDIA_TYPE)
                if fake.mode == "length":
                    self.send_header("Content-Length", str(len(body) + 1000))
                elif fake.mode == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write((b"%x\r\n" % (len(body) + 1000) if fake.mode == "chunked" else b"") + body)
                self.close_connection = True

        self.mode = "close"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["close", "length", "chunked"])
def test_client_against_a_lying_server(mode):
    import tracemalloc
    nnz = 1 << 27
    arrived = 2 * wire.READ_PIECE
    cases = [(_hostile(1, 1 << 40, 1, nnz, b"\1" * arrived), "truncated"),
             (_hostile(1, 1 << 40, 1, 1 << 61), "bad_stream")]
    for body, code in cases:
        fake = _FakeServer(body, (1, 1 << 40))
        fake.mode = mode
        try:
            ds = ivserve.connect(fake.url, timeout=30)["fake"]
            tracemalloc.start()
            try:
                with pytest.raises(IvserveError) as e:
                    ds[:].to_scipy()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        finally:
            fake.close()
        assert e.value.code == code, e.value
        assert peak <= arrived + 4 * wire.READ_PIECE, (mode, code, peak)


def test_obsm_binary_parser():
    """The dense-array encoding of GET .../obsm/{name} (application/
    vnd.ivserve.array), built by hand: this branch's server has no obsm
    route, so the real answers are checked where it has one."""
    from ivserve.client import _array_from_binary, _array_from_json
    import struct
    a = np.arange(12, dtype=np.float32).reshape(6, 2) / 3
    head = lambda rows, cols, dt, flags: struct.pack("<4sIqq8sII", b"IVAR", 1, rows, cols, dt, flags, 0)  # noqa: E731
    assert_same(_array_from_binary(head(6, 2, b"<f4", 0) + a.astype("<f4").tobytes(), "X_umap"), a)
    ids = np.array([5, 0, 3], "<i8").tobytes()
    got = _array_from_binary(head(3, 2, b"<f8", 1) + ids + a[[5, 0, 3]].astype("<f8").tobytes(), "X_pca")
    assert_same(got, a[[5, 0, 3]].astype(np.float64))
    body = head(6, 2, b"<f4", 0) + a.astype("<f4").tobytes()
    for bad in (body[:-1], body[:30], b"IVQS" + body[4:], body + b"\0"):
        with pytest.raises(IvserveError):
            _array_from_binary(bad, "X_umap")
    doc = {"name": "X_umap", "shape": [2, 2], "dtype": "float32", "values": [[1.5, None], [0, 2]]}
    got = _array_from_json(doc, "X_umap")
    assert got.dtype == np.float32 and np.isnan(got[0, 1]) and got[1, 1] == 2


def test_obsm_and_aggregate(srv, tmp_path):
    """obsm arrays and grouped statistics of a dataset written here.  A server that lists obsm in
    the dataset document serves GET .../obsm/{name}: the arrays must equal
    what was written, in their dtype, and to_anndata() must carry their
    rows in the selection's order.  A server without the route (this
    branch's) answers 404, which must reach the caller as IvserveError."""
    import ivref
    from anndata.experimental import write_elem
    rng = np.random.default_rng(3)
    n, g = 120, 30
    X = sp.random(n, g, density=0.2, format="csr", random_state=3,
                  data_rvs=lambda k: rng.integers(1, 50, k)).astype(np.float64)
    obs = pd.DataFrame({"cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], n))},
                       index=["cell%d" % i for i in range(n)])
    var = pd.DataFrame({"gene_ids": ["E%d" % i for i in range(g)]}, index=["g%d" % i for i in range(g)])
    arrays = {"X_umap": rng.standard_normal((n, 2)).astype(np.float32),
              "X_pca": rng.standard_normal((n, 5)), "ints": rng.integers(0, 9, (n, 3)).astype(np.int32)}
    path = str(tmp_path / "emb.h5ad")
    ivref.write_iv(path, X, orientation="ivcsr", value_dtype="int32", obs=False, var=False)
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        grp = f.create_group("obsm")
        for k, v in arrays.items():
            grp.create_dataset(k, data=v)
    s = Server(str(tmp_path), datasets=[{"id": "emb", "path": path}])
    try:
        ds = ivserve.connect(s.url)["emb"]
        sel = [7, 3, 3, 119, 0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ad = ds[sel, ::2].to_anndata()
        assert_same(ad.X, X.toarray().astype(np.int32)[sel][:, ::2])
        if "obsm" in ds.info:
            assert sorted(ds.obsm.keys()) == sorted(arrays)
            for k, v in arrays.items():
                assert_same(ds.obsm[k], v)
                assert_same(ad.obsm[k], v[sel])
        else:
            assert len(ds.obsm) == 0 and len(ad.obsm) == 0
            with pytest.raises(IvserveError) as e:
                ds.obsm["X_umap"]
            assert e.value.status == 404
        # Grouped statistics, from the same branch of the server as obsm.
        rows = [7, 3, 3, 119, 0] + list(range(20, 100))
        genes = [4, 0, 4, 29]
        stats = ["sum", "mean", "var", "nnz", "frac_nonzero", "max"]
        if "obsm" in ds.info:
            got = ds.aggregate("cell_type", stats, obs=rows, var=genes)
            D = pd.DataFrame(X.toarray()[rows][:, genes])
            key = obs.cell_type.iloc[rows].reset_index(drop=True)
            grp = D.groupby(key, observed=True, sort=True)
            want = {"sum": grp.sum(), "mean": grp.mean(), "var": grp.var(ddof=1), "max": grp.max(),
                    "nnz": (D != 0).groupby(key, observed=True).sum(),
                    "frac_nonzero": (D != 0).groupby(key, observed=True).mean()}
            order = [c for c in obs.cell_type.cat.categories if c in set(key)]
            assert list(got["n_cells"].index) == order
            assert list(got["n_cells"]) == [int((key == c).sum()) for c in order]
            for st in stats:
                assert list(got[st].columns) == [var.index[i] for i in genes]
                w = want[st].loc[order].to_numpy(dtype=np.float64)
                if st == "var":
                    np.testing.assert_allclose(got[st].to_numpy(), w, rtol=1e-12, atol=1e-12)
                else:
                    assert np.array_equal(got[st].to_numpy(), w), st
        else:
            with pytest.raises(IvserveError) as e:
                ds.aggregate("cell_type", stats)
            assert e.value.status == 404
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_metadata_types_equal_anndata(srv, tmp_path):
    """Numeric, ordered and partly missing categoricals, nullable booleans
    and integers, narrow ints and float32 with NaN, a named index: the
    frames and to_anndata() equal anndata's reading of the same file."""
    from client_data import make_types_dataset
    path = str(tmp_path / "types.h5ad")
    X, obs, var = make_types_dataset(path)
    s = Server(str(tmp_path), datasets=[{"id": "types", "path": path}])
    try:
        ds = ivserve.connect(s.url)["types"]
        frame_equal(ds.obs, obs)
        frame_equal(ds.var, var)
        assert ds.obs.index.name == "barcode"
        rows = [9, 0, 0, 77, 119, 50]
        ad = ds[rows, ::-1].to_anndata()
        assert_same(ad.X, X.toarray().astype(np.int32)[rows][:, ::-1])
        frame_equal(ad.obs, as_anndata_subset(obs.iloc[rows]))
        frame_equal(ad.var, as_anndata_subset(var.iloc[::-1]))
        m = (obs.count32 >= 50).fillna(False).to_numpy(dtype=bool) & (obs.grade == "high").to_numpy()
        q = ds.where("count32 >= 50 and grade == 'high'")
        assert np.array_equal(q.fetch()[1], np.flatnonzero(m))
    finally:
        assert s.stop() == 0, s.log_text()[-3000:]


def test_token(srv, tmp_path):
    d = DATASETS[0]
    s = Server(str(tmp_path), datasets=[{"id": d[0], "path": os.path.abspath(os.path.join(FIX, d[1]))}],
               cfg_extra={"tokens": ["s3cret"]})
    try:
        with pytest.raises(IvserveError) as e:
            ivserve.connect(s.url).datasets()
        assert e.value.status == 401
        with pytest.raises(IvserveError) as e:
            ivserve.connect(s.url, token="wrong").datasets()
        assert e.value.status == 401  # a wrong token is 401 invalid_token (RFC 6750)
        c = ivserve.connect(s.url, token="s3cret")
        assert_same(c[d[0]][:4, :3].to_scipy(), ref(d[0])[0][:4, :3])
    finally:
        assert s.stop() == 0


def test_pip_install_offline(tmp_path, srv):
    """pip builds and installs the package with the system's setuptools,
    without an index, and the installed copy works."""
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                           "--no-index", "--target", str(target), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    code = ("import ivserve, sys; assert ivserve.__file__.startswith(sys.argv[1]), ivserve.__file__;"
            "c = ivserve.connect(sys.argv[2]); print(c[sys.argv[3]].shape)")
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", code, str(target), srv.url, IDS[0]],
                          capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(ref(IDS[0])[0].shape)


# ---------------------------------------------------------------- layers and raw

@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    """test_layers.py's file: X, layers counts (IVCSC int32) and log, raw/X
    with raw/var (more genes than var, X's in reverse order first)."""
    import test_layers
    tmp = str(tmp_path_factory.mktemp("client_layers"))
    path = os.path.join(tmp, "layered.h5ad")
    d = test_layers.write_client_file(path)
    s = Server(tmp, datasets=[{"id": "L", "path": path}])
    yield s, d
    assert s.stop() == 0, s.log_text()[-3000:]


def _dense(m):
    return np.asarray(sp.csr_matrix(m).toarray(), dtype=np.float64)


def test_matrix_argument_selects_layers_and_raw(layered):
    """matrix= reads a layer or raw/X: keys of every form index that
    matrix (raw/X's var keys, names and masks are raw/var's), composed
    queries keep it, count and aggregate take it, and to_anndata gives
    raw/X's genes their raw/var names."""
    s, d = layered
    ds = ivserve.connect(s.url)["L"]
    assert list(ds.matrices)[:1] == ["X"] and {"layers/counts", "layers/log", "raw/X"} <= set(ds.matrices)
    counts, raw = d["counts"], d["raw"]
    raw_names = list(d["raw_var"].index)
    obs = [7, 3, 3, 100]
    # A layer: same genes as X.
    got = ds.query(obs, slice(2, 9), matrix="layers/counts").to_scipy()
    assert got.dtype == np.int32
    assert np.array_equal(_dense(got), _dense(counts)[obs][:, 2:9])
    q = ds.query(matrix="layers/counts")[obs, ["gene4", "gene1"]]
    assert q.matrix == "layers/counts"
    assert np.array_equal(_dense(q.to_scipy()), _dense(counts)[obs][:, [4, 1]])
    # raw/X: more genes, its own names; a mask over raw's genes.
    mask = np.zeros(raw.shape[1], bool)
    mask[[0, 40, 44]] = True
    got = ds.query(obs, mask, matrix="raw/X").to_scipy()
    assert got.shape == (4, 3) and np.array_equal(_dense(got), _dense(raw)[obs][:, [0, 40, 44]])
    want_names = [raw_names[-1], "gene0"]
    got = ds.query(obs, want_names, matrix="raw/X").to_scipy()
    assert np.array_equal(_dense(got), _dense(raw)[obs][:, [raw_names.index(n) for n in want_names]])
    ad = ds.query(obs, want_names, matrix="raw/X").to_anndata(obsm=False)
    assert list(ad.var_names) == want_names and list(ad.obs_names) == ["cell%d" % i for i in obs]
    # Composed: a second key over the first's raw genes.
    sub = ds.query(obs, slice(30, 45), matrix="raw/X")[:, [raw_names[44], raw_names[31]]]
    assert np.array_equal(_dense(sub.to_scipy()), _dense(raw)[obs][:, [44, 31]])
    c = ds.count(obs, None, matrix="raw/X")
    assert c["n_genes"] == raw.shape[1] and c["nnz"] == sp.csr_matrix(raw)[obs].nnz
    agg = ds.aggregate("cell_type", ["sum"], var=["gene2", raw_names[-1]], matrix="raw/X")
    cols = [raw_names.index("gene2"), raw.shape[1] - 1]
    dense = _dense(raw)[:, cols]
    for g, row in agg["sum"].iterrows():
        sel = (d["obs"]["cell_type"] == g).values
        np.testing.assert_allclose(row.values, dense[sel].sum(axis=0), rtol=1e-12)
    with pytest.raises(IvserveError) as e:
        ds.query(obs, matrix="layers/nope")
    assert e.value.code == "unknown_matrix"


# -- issue 29: anndata's own subset, pandas query operators, var_by, Python exceptions --

@pytest.fixture(scope="module")
def full(ivserve, tmp_path_factory):
    """test_layers.py's file (X, layers counts and log, raw/X with raw/var)
    plus obsm arrays, a var categorical and an obs categorical with a
    category no cell uses; and the same data as an in-memory AnnData, which
    is what anndata.read_h5ad gives for a file in anndata's own layout."""
    import ivref
    import test_layers
    from anndata.experimental import write_elem
    tmp = str(tmp_path_factory.mktemp("client_full"))
    path = os.path.join(tmp, "full.h5ad")
    d = test_layers.make_data()
    rng = np.random.default_rng(29)
    n, g = d["X"].shape
    d["obs"]["condition"] = pd.Categorical(rng.choice(["ctrl", "stim"], n), categories=["ctrl", "stim", "none"])
    d["var"]["kind"] = pd.Categorical(rng.choice(["a", "b", "c"], g))
    d["var"]["symbol"] = ["SYM%d" % i for i in range(g)]
    obsm = {"X_umap": rng.standard_normal((n, 2)).astype(np.float32), "X_pca": rng.standard_normal((n, 4))}
    ivref.write_with_layers(path, d["X"], "ivcsr", obs=False, var=False,
                            layers={"counts": (d["counts"], "ivcsc"), "log": (d["log"], "ivcsr")},
                            raw=(d["raw"], "ivcsc"))
    with h5py.File(path, "a") as f:
        write_elem(f, "obs", d["obs"])
        write_elem(f, "var", d["var"])
        write_elem(f, "raw/var", d["raw_var"])
        for k, v in obsm.items():
            write_elem(f, "obsm/" + k, v)
    def csr(m):  # int32 index arrays, as anndata writes and reads them (0.8 mis-slices int64 indptr)
        return sp.csr_matrix((m.data, m.indices.astype(np.int32), m.indptr.astype(np.int32)), shape=m.shape)

    want = anndata.AnnData(X=csr(d["X"]), obs=d["obs"], var=d["var"], obsm=obsm,
                           layers={"counts": csr(d["counts"]), "log": csr(d["log"])}, dtype=d["X"].dtype)
    want.raw = anndata.AnnData(X=csr(d["raw"]), var=d["raw_var"], dtype=d["raw"].dtype)
    s = Server(tmp, datasets=[{"id": "F", "path": path}])
    yield s, want
    assert s.stop() == 0, s.log_text()[-3000:]


def test_to_anndata_equals_anndata_subset(full):
    """to_anndata(layers=True, raw=True) equals adata[obs, var].copy() of
    the same data, element by element (anndata's assert_equal): X,
    layers, raw (every raw gene, the selected cells), obsm, obs and var
    with the categories no selected row uses dropped, as anndata drops them."""
    from anndata.tests.helpers import assert_equal
    s, want = full
    ds = ivserve.connect(s.url)["F"]
    n, g = want.shape
    b_or_t = np.flatnonzero(want.obs["cell_type"].isin(["B", "T"]).to_numpy())
    cases = [(b_or_t, slice(None)), ([7, 3, 3, 100], [4, 0, 29]), (slice(10, 60, 3), np.arange(g) % 2 == 0),
             (np.flatnonzero(want.obs["condition"] == "ctrl"), np.arange(g)[::-1])]
    for obs_sel, var_sel in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = ds[obs_sel, var_sel].to_anndata(layers=True, raw=True)
            exp = want[obs_sel, var_sel].copy()
        assert set(got.layers) == {"counts", "log"}
        for col in ("cell_type", "condition"):
            assert list(got.obs[col].cat.categories) == list(exp.obs[col].cat.categories)
        assert "none" not in list(got.obs["condition"].cat.categories)
        assert_equal(got.X, exp.X)
        for k in exp.layers:
            assert_equal(got.layers[k], exp.layers[k])
        assert_equal(got.obs, exp.obs)
        assert_equal(got.var, exp.var)
        for k in exp.obsm:
            assert_equal(got.obsm[k], exp.obsm[k])
        assert_equal(got.raw.X, exp.raw.X)
        assert_equal(got.raw.var, exp.raw.var)
        assert_equal(got, exp)
    # Layers by name; none by default; an unknown layer is a KeyError.
    ad = ds[[1, 2], :].to_anndata(layers=["log"])
    assert list(ad.layers) == ["log"] and ad.raw is None
    assert len(ds[[1, 2], :].to_anndata().layers) == 0
    with pytest.raises(KeyError):
        ds[[1, 2], :].to_anndata(layers=["nope"])


def test_where_accepts_pandas_operators(full):
    """&, |, ~ and parentheses as pandas query reads them, next to and/or/not;
    quoted strings keep their & | ~; the rows equal DataFrame.query's."""
    s, want = full
    ds = ivserve.connect(s.url)["F"]
    obs = want.obs
    exprs = ["cell_type == 'B' & age > 40", "(cell_type == 'NK') | (age < 30)",
             "~(cell_type == 'T') & condition == 'stim'", "cell_type == 'B' and ~(age >= 50) | condition == 'ctrl'",
             "age > 30 && cell_type != 'B'"]
    for expr in exprs:
        got = ds.where(expr).to_anndata(obsm=False).obs_names
        assert list(got) == list(obs.query(expr.replace("&&", "&")).index), expr
    # Inside quotes the characters are data, not operators.
    assert ivserve.selection.where_text("name == 'a&b|~c' & x") == "name == 'a&b|~c'  and  x"
    assert ivserve.selection.where_text("`odd|col` | y") == "`odd|col`  or  y"
    q = ds.where("cell_type == 'B'").where("age > 40 | age < 25")
    want_rows = obs.query("cell_type == 'B' & (age > 40 | age < 25)").index
    assert list(q.to_anndata(obsm=False).obs_names) == list(want_rows)
    got = ds[ivserve.Where("~(cell_type == 'B')"), :].to_anndata(obsm=False).obs_names
    assert list(got) == list(obs.query("~(cell_type == 'B')").index)


def test_var_by_column_and_case_insensitive_names(full):
    """ds.var_by(col) selects genes by that column's values (exact, else a
    unique case-insensitive match, as the server does); var_names stay
    the var index; composed queries use the column too."""
    s, want = full
    ds = ivserve.connect(s.url)["F"]
    X = want.X.toarray()
    by = ds.var_by("symbol")
    ad = by[[0, 5], ["SYM7", "sym2"]].to_anndata(obsm=False)
    assert list(ad.var_names) == ["gene7", "gene2"]
    assert np.array_equal(ad.X.toarray(), X[[0, 5]][:, [7, 2]])
    sub = by[:, ["SYM9", "SYM3", "SYM1"]][[4], ["SYM1", "sym9"]]
    assert np.array_equal(sub.to_scipy().toarray(), X[[4]][:, [1, 9]])
    # The index, case-insensitively, in the Python client as in the server.
    ad = ds[[1], ["GENE4", "Gene11"]].to_anndata(obsm=False)
    assert list(ad.var_names) == ["gene4", "gene11"]
    with pytest.raises(KeyError):
        ds.var_by("no_such_column")
    with pytest.raises(KeyError):
        by[:, ["NOPE"]].to_anndata()


def test_python_exceptions(full):
    """Missing names are KeyErrors, positions out of range IndexErrors, and
    both still IvserveErrors with their codes."""
    s, want = full
    ds = ivserve.connect(s.url)["F"]
    n, g = want.shape
    with pytest.raises(KeyError) as e:
        ds.obsm["missing"]
    assert isinstance(e.value, IvserveError) and "missing" in str(e.value)
    with pytest.raises(KeyError) as e:
        ds[["NOPE_CELL"], :].to_scipy()
    assert e.value.code == "unknown_name"
    with pytest.raises(KeyError):
        ds[:, ["NOPE_GENE"]].to_anndata()
    with pytest.raises(KeyError):
        ds.read_frame("obs", ["nope"])
    with pytest.raises(KeyError):
        ds.query(matrix="layers/nope")
    for key in (n, -n - 1, [0, n], np.zeros(n + 1, bool)):
        with pytest.raises(IndexError) as e:
            ds[key]
        assert isinstance(e.value, IvserveError) and e.value.code == "bad_selection"
    with pytest.raises(IndexError):
        ds[:, g]
    with pytest.raises(IndexError):
        ds[[1, 2, 3]][5]


def _welch(a, b):
    """scipy's Welch t-test, with scanpy's reading of its NaN (score 0, p 1)."""
    from scipy import stats
    t, p = stats.ttest_ind(a, b, equal_var=False, axis=0)
    bad = ~np.isfinite(t) & np.isnan(t)
    return np.where(bad, 0.0, t), np.where(bad, 1.0, p)


def test_diffexp_and_rank_genes_groups(full):
    """ds.diffexp and ds.rank_genes_groups: scanpy's rank_genes_groups_df
    columns, best score first, t-test scores and p-values equal to scipy's
    Welch test on the same cells (log1p off, so on the stored values)."""
    s, want = full
    ds = ivserve.connect(s.url)["F"]
    X = want.X.toarray().astype(np.float64)
    names = np.asarray(want.var_names)
    ct = want.obs["cell_type"].to_numpy()
    cols = ["names", "scores", "logfoldchanges", "pvals", "pvals_adj", "pct_nz_group",
            "pct_nz_reference", "mean_group", "mean_reference"]
    df = ds.diffexp("cell_type == 'B'", log1p=False)
    assert list(df.columns) == cols and len(df) == X.shape[1]
    assert np.all(np.diff(df["scores"].to_numpy()) <= 0)
    t, p = _welch(X[ct == "B"], X[ct != "B"])
    order = {n: i for i, n in enumerate(names)}
    idx = [order[n] for n in df["names"]]
    np.testing.assert_allclose(df["scores"].to_numpy(), t[idx], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(df["pvals"].to_numpy(), p[idx], rtol=1e-8, atol=1e-300)
    np.testing.assert_allclose(df["pct_nz_group"].to_numpy(), (X[ct == "B"] != 0).mean(0)[idx], rtol=1e-12)
    np.testing.assert_allclose(df["mean_reference"].to_numpy(), X[ct != "B"].mean(0)[idx], rtol=1e-9)
    # Two groups by any key form; top_n keeps both ends of the ranking.
    b, t_rows = np.flatnonzero(ct == "B"), np.flatnonzero(ct == "T")
    df = ds.diffexp(b, ivserve.Where("cell_type == 'T'"), log1p=False, top_n=3)
    assert len(df) == 6
    t, p = _welch(X[b], X[t_rows])
    full_order = np.argsort(-t, kind="stable")
    assert set(df["names"][:3]) == set(names[full_order[:3]])
    # One group against the rest, for every category: rank_genes_groups_df.
    rg = ds.rank_genes_groups("cell_type", log1p=False)
    assert list(rg.columns) == ["group"] + cols
    assert list(pd.unique(rg["group"])) == [c for c in want.obs["cell_type"].cat.categories if (ct == c).any()]
    for grp, part in rg.groupby("group", sort=False):
        t, p = _welch(X[ct == grp], X[ct != grp])
        idx = [order[n] for n in part["names"]]
        np.testing.assert_allclose(part["scores"].to_numpy(), t[idx], rtol=1e-9, atol=1e-12)
        assert np.all(np.diff(part["scores"].to_numpy()) <= 0)
    rg = ds.rank_genes_groups("cell_type", method="wilcoxon", reference="T", groups=["B"], var=[0, 3, 5])
    assert set(rg["group"]) == {"B"} and sorted(rg["names"]) == sorted(names[[0, 3, 5]])
    with pytest.raises(IvserveError) as e:
        ds.rank_genes_groups("age")
    assert e.value.status in (400, 422)
