"""The Zarr store (GET|HEAD /v1/datasets/{id}/zarr/{key}) read by the real
Python clients: zarr-python 2 through fsspec's HTTP filesystem and
anndata's read_zarr, compared with the file read by h5py/anndata; chunks
compared byte for byte with what zarr-python writes for the same arrays
and chunking; 404s, HEAD, ETag/304 and tokens.

The datasets have more entries than one X chunk (IV_ZARR_X_CHUNK, 65,536)
so that chunk boundaries fall inside genes and cells.  The tests on the
shared server read X's chunks as kept in the cache folder (the server
keeps them for datasets this small, api/zarr_kept.h: the fixture waits
for them); test_kept_x_chunks compares them with a server that decodes
every chunk on request, across a restart and a damaged file.
"""
import glob
import os
import re
import sys
import time

import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import zarrdata  # noqa: E402

# The real clients are the point of these tests: their absence fails.
try:
    import aiohttp  # noqa: F401  (fsspec's HTTP filesystem)
    import fsspec
    import zarr
except ImportError as e:
    raise ImportError("the Zarr store tests need Debian's python3-zarr, python3-fsspec and "
                      "python3-aiohttp: %s" % e)
import anndata  # noqa: E402
from anndata.experimental import read_elem  # noqa: E402
from numcodecs import VLenUTF8, Zstd  # noqa: E402

N_OBS, N_VAR = 3000, 250     # ~112,000 entries: two X chunks, boundaries inside slices
N_RAW = 310                  # raw/X's genes (raw/var), more than X's
CASES = {"r_int": ("ivcsr", "int32", 1), "c_f32": ("ivcsc", "float32", 2)}
TOKEN = "zarr-secret-token"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("zarr"))
    data, ds = {}, []
    for name, (orient, dt, seed) in CASES.items():
        d = zarrdata.make_data(seed, N_OBS, N_VAR, dt)
        path = os.path.join(tmp, name + ".h5ad")
        zarrdata.write_dataset(path, *d, orientation=orient)
        data[name] = (path, d)
        ds.append({"id": name, "path": path})
    # Layers, raw and uns (zarrdata.write_matrices).
    path = os.path.join(tmp, "mx.h5ad")
    data["mx"] = (path, zarrdata.write_matrices(path, 4, N_OBS, N_VAR, N_RAW))
    ds.append({"id": "mx", "path": path})
    ds.append({"id": "locked", "path": data["r_int"][0], "tokens": [TOKEN]})
    s = zarrdata.Server(tmp, ds, cfg_extra={"cors_origins": ["https://vitessce.example"]})
    zarrdata.wait_both(s.url, list(CASES) + ["mx"])
    zarrdata.wait_kept(s.url, list(CASES) + ["mx"])
    yield s, data
    assert s.stop() == 0, s.log_text()[-3000:]


def store_url(s, name, csr=False):
    return "%s/v1/datasets/%s/zarr%s" % (s.url, name, "/csr" if csr else "")


def open_group(s, name, csr=False):
    return zarr.open_consolidated(fsspec.get_mapper(store_url(s, name, csr)), mode="r")


class FileFrames:
    """obs and var of the file as anndata reads them (its X is packed)."""

    def __init__(self, path):
        import h5py
        with h5py.File(path, "r") as f:
            self.obs = read_elem(f["obs"])
            self.var = read_elem(f["var"])


def file_adata(path):
    return FileFrames(path)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("csr", [False, True], ids=["csc", "csr"])
def test_x_equals_the_file(env, name, csr):
    s, data = env
    X = data[name][1][0]
    g = open_group(s, name, csr)
    x = g["X"]
    assert x.attrs["encoding-type"] == ("csr_matrix" if csr else "csc_matrix")
    assert list(x.attrs["shape"]) == [N_OBS, N_VAR]
    want = sp.csr_matrix(X) if csr else sp.csc_matrix(X)
    want.sort_indices()
    assert x["indptr"].dtype == np.int64 and x["indices"].dtype == np.int32
    assert x["data"].dtype == X.dtype
    assert x["indices"].chunks[0] < want.nnz  # several chunks
    for part in ("indptr", "indices", "data"):  # the compressor chosen (docs/zarr.md)
        assert x[part].compressor == Zstd(level=1), part
    assert np.array_equal(x["indptr"][:], want.indptr)
    assert np.array_equal(x["indices"][:], want.indices)
    assert np.array_equal(x["data"][:], want.data)


@pytest.mark.parametrize("name", list(CASES))
def test_one_gene_column_reads_only_its_range(env, name):
    s, data = env
    X = sp.csc_matrix(data[name][1][0])
    x = open_group(s, name)["X"]
    indptr = x["indptr"][:]
    for j in (0, 7, N_VAR // 2, N_VAR - 1):
        a, b = indptr[j], indptr[j + 1]
        col = np.zeros(N_OBS, X.dtype)
        col[x["indices"][a:b]] = x["data"][a:b]
        assert np.array_equal(col, X[:, j].toarray().ravel()), j


@pytest.mark.parametrize("name", list(CASES))
def test_obs_var_obsm_equal_the_file(env, name):
    s, data = env
    path, (X, obs, var, obsm, varm) = data[name]
    g = open_group(s, name)
    f = file_adata(path)
    for frame, want in (("obs", f.obs), ("var", f.var)):
        got = read_elem(g[frame])
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert list(got.columns) == list(want.columns)
    assert g["obs"]["cell_type"]["codes"].dtype == np.int8  # pandas' width, as anndata writes
    for k, v in obsm.items():
        assert g["obsm"][k].dtype == v.dtype
        assert np.array_equal(g["obsm"][k][:], v)
    assert np.array_equal(g["varm"]["PCs"][:], varm["PCs"])


@pytest.mark.parametrize("name", list(CASES))
def test_anndata_read_zarr_over_http(env, name):
    s, data = env
    path, (X, obs, var, obsm, varm) = data[name]
    # anndata 0.8's read_zarr lists groups through the store (zarr.open, not
    # open_consolidated): given the mapper alone, obsm would come back
    # empty; the consolidated store answers the listings from .zmetadata.
    a = anndata.read_zarr(consolidated(s, name))
    f = file_adata(path)
    assert a.shape == (N_OBS, N_VAR)
    assert isinstance(a.X, sp.csc_matrix)
    assert (a.X != sp.csc_matrix(X)).nnz == 0 and a.X.dtype == X.dtype
    pd.testing.assert_frame_equal(a.obs, f.obs, check_exact=True)
    pd.testing.assert_frame_equal(a.var, f.var, check_exact=True)
    assert sorted(a.obsm.keys()) == sorted(obsm)
    for k, v in obsm.items():
        assert np.array_equal(a.obsm[k], v)
    assert np.array_equal(a.varm["PCs"], varm["PCs"])
    csr = anndata.read_zarr(consolidated(s, name, csr=True))
    assert isinstance(csr.X, sp.csr_matrix) and (csr.X != sp.csr_matrix(X)).nnz == 0


class Consolidated(zarr.storage.ConsolidatedMetadataStore):
    """What zarr.open_consolidated builds, as one store for zarr.open (which
    anndata 0.8's read_zarr calls): metadata and listings from .zmetadata,
    chunks from the HTTP mapper."""

    def __init__(self, mapper):
        super().__init__(mapper)
        self.chunks = mapper

    def __getitem__(self, key):
        return self.meta_store[key] if key in self.meta_store else self.chunks[key]


class ConsolidatedHTTP(Consolidated):
    """The same over zarr's FSStore, whose getitems fetches a read's chunks
    concurrently (zarr 2.13 uses it when the store has one)."""

    def getitems(self, keys, **kw):
        return self.chunks.getitems(keys, **kw)


def consolidated(s, name, csr=False):
    return ConsolidatedHTTP(zarr.storage.FSStore(store_url(s, name, csr)))


def arrays_of(group, prefix=""):
    for k, v in group.items():
        if isinstance(v, zarr.Array):
            yield prefix + k, v
        else:
            yield from arrays_of(v, prefix + k + "/")


@pytest.mark.parametrize("name,csr", [("r_int", False), ("r_int", True), ("mx", False)],
                         ids=["csc", "csr", "layers_raw_uns"])
def test_chunks_are_what_zarr_python_writes(env, tmp_path, name, csr):
    """Every array of the store, written by zarr-python with the same
    dtype, shape, chunks, compressor and fill value into a local store:
    every chunk it writes is byte-identical to the one served."""
    s, data = env
    g = open_group(s, name, csr)
    local = zarr.open_group(str(tmp_path / "local.zarr"), mode="w")
    base = store_url(s, name, csr)
    sess = requests.Session()
    n_chunks = 0
    for key, arr in arrays_of(g):
        vals = arr[...]
        kw = {"object_codec": VLenUTF8()} if arr.dtype == object else {}
        out = local.create_dataset(key, shape=arr.shape, chunks=arr.chunks, dtype=arr.dtype,
                                   compressor=arr.compressor, fill_value=arr.fill_value, **kw)
        out[...] = vals
        for dirpath, _, files in os.walk(str(tmp_path / "local.zarr" / key)):
            for fn in files:
                if fn.startswith("."):
                    continue
                want = open(os.path.join(dirpath, fn), "rb").read()
                r = sess.get("%s/%s/%s" % (base, key, fn))
                assert r.status_code == 200, (key, fn, r.text)
                assert r.content == want, (key, fn, len(r.content), len(want))
                n_chunks += 1
    assert n_chunks >= 20


def test_absent_keys_are_404(env):
    s, _ = env
    base = store_url(s, "r_int")
    for key in ["nope", "X/nope/.zarray", "X/.zarray", "X/indices/.zgroup", "X/indices/2",
                "X/indices/-1", "X/indices/0.0", "X/indptr/1", "obsm/X_umap/0", "obsm/X_umap/0.1",
                "obsm/X_umap/1.0", "obs/.zarray", "obs/cell_type/codes/00x", ".zmetadata/x",
                "csr/csr/.zgroup", "obs/_index/.zgroup", "X/indices/99999999999999999999999"]:
        r = requests.get("%s/%s" % (base, key))
        assert r.status_code == 404, (key, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] in ("not_found",), r.text
    # An unknown id answers as a protected one would (a dataset here has a token).
    assert requests.get(s.url + "/v1/datasets/nope/zarr/.zgroup").status_code in (401, 404)
    # The index and groups are there.
    assert requests.get("%s/obsm/X_umap/0.0" % base).status_code == 200
    assert requests.get("%s/obs/.zgroup" % base).json() == {"zarr_format": 2}


def test_head_etag_cache_and_cors(env):
    s, _ = env
    url = store_url(s, "r_int") + "/X/indices/1"
    h = {"Origin": "https://vitessce.example"}
    g = requests.get(url, headers=h)
    assert g.status_code == 200 and g.headers["Content-Type"] == "application/octet-stream"
    assert "max-age=" in g.headers["Cache-Control"]
    assert g.headers["Access-Control-Allow-Origin"] == "https://vitessce.example"
    hd = requests.head(url, headers=h)
    assert hd.status_code == 200 and hd.content == b""
    assert hd.headers["Content-Length"] == str(len(g.content))
    assert hd.headers["ETag"] == g.headers["ETag"]
    nm = requests.get(url, headers={"If-None-Match": g.headers["ETag"]})
    assert nm.status_code == 304 and nm.content == b""
    other = requests.get(store_url(s, "r_int") + "/X/indices/0")
    assert other.headers["ETag"] != g.headers["ETag"]
    # Chunks go uncoded even when gzip is offered; metadata is encoded.
    gz = requests.get(url, headers={"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in gz.headers and gz.content == g.content
    zm = requests.get(store_url(s, "r_int") + "/.zmetadata", headers={"Accept-Encoding": "gzip"})
    assert zm.headers.get("Content-Encoding") == "gzip" and "obs/_index/.zarray" in zm.json()["metadata"]


def test_tokens_in_header_or_query(env):
    s, _ = env
    base = "%s/v1/datasets/locked/zarr" % s.url
    assert requests.get(base + "/.zgroup").status_code == 401
    assert requests.get(base + "/.zgroup?token=wrong").status_code == 401
    assert requests.get(base + "/.zgroup", headers={"Authorization": "Bearer " + TOKEN}).status_code == 200
    assert requests.get(base + "/.zgroup?token=" + TOKEN).status_code == 200
    r = requests.get(base + "/X/indices/0?token=" + TOKEN)
    assert r.status_code == 200 and "private" in r.headers["Cache-Control"]
    # The query form is the store's only: other routes want the header.
    assert requests.get(s.url + "/v1/datasets/locked?token=" + TOKEN).status_code == 401
    # zarr-python with the token in a header.
    g = zarr.open_consolidated(fsspec.get_mapper(
        base, client_kwargs={"headers": {"Authorization": "Bearer " + TOKEN}}), mode="r")
    assert g["X"]["indptr"][-1] == g["X"]["indices"].shape[0]


def test_x_chunks_wait_for_the_other_orientation(tmp_path):
    """Without the gene-major orientation (other_orientation budget 0: never
    built), X's csc chunks are refused with a clear error, metadata and the
    csr/ store are served."""
    d = zarrdata.make_data(3, 200, 30, "int32")
    path = str(tmp_path / "a.h5ad")
    zarrdata.write_dataset(path, *d, orientation="ivcsr")
    s = zarrdata.Server(str(tmp_path), [{"id": "a", "path": path, "transpose_bytes": 0}])
    try:
        base = store_url(s, "a")
        assert requests.get(base + "/X/indices/.zarray").status_code == 200
        r = requests.get(base + "/X/indices/0")
        assert r.status_code in (404, 503), r.text
        assert "gene-major" in r.json()["error"]["message"]
        if r.status_code == 503:
            assert "Retry-After" in r.headers
        g = zarr.open_consolidated(fsspec.get_mapper(store_url(s, "a", csr=True)), mode="r")
        assert np.array_equal(g["X"]["indices"][:], sp.csr_matrix(d[0]).indices)
    finally:
        assert s.stop() == 0


def x_chunks(url, name):
    """Every X/indices and X/data chunk of both stores of a dataset, by key."""
    sess, out = requests.Session(), {}
    for sub in ("", "/csr"):
        for arr in ("indices", "data"):
            for k in range(10000):
                key = "zarr%s/X/%s/%d" % (sub, arr, k)
                r = sess.get("%s/v1/datasets/%s/%s" % (url, name, key))
                if r.status_code == 404:
                    break
                assert r.status_code == 200, (key, r.text)
                out[key] = r.content
    return out


def test_kept_x_chunks(tmp_path):
    """X's chunks kept in the cache folder (zarr_keep_entries) are the
    chunks decoded on request (zarr_keep_entries 0), byte for byte; a
    restart takes the kept files instead of writing them; a file whose
    bytes were damaged after it was taken serves the decoded chunks, is
    removed, and is written again at the next start."""
    d = zarrdata.make_data(5, N_OBS, N_VAR, "int32")
    path = str(tmp_path / "k.h5ad")
    zarrdata.write_dataset(path, *d, orientation="ivcsr")
    ds = [{"id": "k", "path": path}]
    os.makedirs(str(tmp_path / "off"))
    off = zarrdata.Server(str(tmp_path / "off"), ds, extra_args=("--zarr-keep-entries", "0"))
    try:
        zarrdata.wait_both(off.url, ["k"])
        want = x_chunks(off.url, "k")
        assert len(want) >= 8
        doc = requests.get(off.url + "/v1/datasets/k").json()
        assert doc["zarr_kept"] == {"csr": None, "csc": None}
    finally:
        assert off.stop() == 0
    # csr's file is damaged in the second run: the third writes it again
    # and takes csc's.
    for run, how in enumerate([("written", "written"), ("kept", "kept"), ("written", "kept")]):
        s = zarrdata.Server(str(tmp_path), ds)
        try:
            zarrdata.wait_both(s.url, ["k"])
            kept = zarrdata.wait_kept(s.url, ["k"])["k"]
            assert kept["csr"] > 0 and kept["csc"] > 0
            log = s.log_text()
            assert "csr: %s" % how[0] in log and "csc: %s" % how[1] in log, log[-2000:]
            assert x_chunks(s.url, "k") == want
            if run == 1:
                # The last byte of the csr file (its last chunk's values),
                # changed under the running server.
                f = glob.glob(str(tmp_path / "ivserve-cache" / "k-*.X.zarr-csr"))
                assert len(f) == 1, os.listdir(str(tmp_path / "ivserve-cache"))
                with open(f[0], "r+b") as fh:
                    fh.seek(-1, os.SEEK_END)
                    b = fh.read(1)
                    fh.seek(-1, os.SEEK_END)
                    fh.write(bytes([b[0] ^ 0x5A]))
                assert x_chunks(s.url, "k") == want
                assert not os.path.exists(f[0])
                # /metrics says so at once; the log and the document at
                # the watcher's next tick (2 s).
                m = requests.get(s.url + "/metrics").text
                assert 'ivserve_dataset_zarr_kept_bytes{dataset="k",orientation="csr"} 0\n' in m, m
                assert 'ivserve_dataset_zarr_kept_bytes{dataset="k",orientation="csc"} %d\n' % kept["csc"] in m
                deadline = time.time() + 20
                while requests.get(s.url + "/v1/datasets/k").json()["zarr_kept"]["csr"] is not None:
                    assert time.time() < deadline, s.log_text()[-2000:]
                    time.sleep(0.1)
                now = requests.get(s.url + "/v1/datasets/k").json()["zarr_kept"]
                assert now == {"csr": None, "csc": kept["csc"]}, now
                assert "its kept Zarr X chunks (csr, " in s.log_text(), s.log_text()[-2000:]
        finally:
            assert s.stop() == 0


def keep_line(s):
    """The server's log line of the Zarr keep, once written."""
    deadline = time.time() + 30
    while "Zarr X chunks" not in s.log_text():
        assert time.time() < deadline, s.log_text()[-2000:]
        time.sleep(0.05)
    return [l for l in s.log_text().splitlines() if "Zarr X chunks" in l][0]


def metric(url, name):
    m = re.search(r"^%s (\d+)$" % re.escape(name), requests.get(url + "/metrics").text, re.M)
    assert m, name
    return int(m.group(1))


def test_kept_x_chunks_within_the_memory_budget(tmp_path):
    """The keep's memory comes out of the answers' share of the memory
    budget, and goes back to it: with a large budget the keep makes the
    pool's width of chunks at a time; with a share one byte short of that
    reservation, fewer chunks at a time, and the same chunks; with a share
    smaller than one chunk's, nothing is kept (a warning) and X's chunks
    are decoded on request."""
    d = zarrdata.make_data(7, N_OBS, N_VAR, "int32")
    path = str(tmp_path / "k.h5ad")
    zarrdata.write_dataset(path, *d, orientation="ivcsr")
    ds = [{"id": "k", "path": path}]
    want, runs = None, []
    answers = 'ivserve_memory_budget_bytes{part="answers"}'
    used = 'ivserve_memory_used_bytes{part="answers"}'
    for name, memory in (("wide", 1 << 30), ("narrow", None), ("none", 1 << 20)):
        if memory is None:
            memory = 10 * (runs[0][1] - 1) + 9  # the answers' share: a tenth
        os.makedirs(str(tmp_path / name))
        s = zarrdata.Server(str(tmp_path / name), ds, extra_args=("--memory-bytes", str(memory)))
        try:
            line = keep_line(s)
            share = metric(s.url, answers)
            assert share == memory // 10, share
            kept = requests.get(s.url + "/v1/datasets/k").json()["zarr_kept"]
            if name == "none":
                # (A budget this small skips the gene-major copy: the
                # cell-major store's chunks are the ones to compare.)
                assert '"level":"warn"' in line and "csr and csc: failed (the keep needs" in line, line
                assert kept == {"csr": None, "csc": None}, kept
                sess = requests.Session()
                for key in (k for k in want if k.startswith("zarr/csr/")):
                    r = sess.get("%s/v1/datasets/k/%s" % (s.url, key))
                    assert r.status_code == 200 and r.content == want[key], key
                continue
            zarrdata.wait_both(s.url, ["k"])
            kept = zarrdata.wait_kept(s.url, ["k"])["k"]
            got = x_chunks(s.url, "k")
            if want is None:
                want = got
            assert got == want
            m = re.search(r"(\d+) chunks? at a time, (\d+) bytes of the answers' memory reserved, "
                          r"(\d+) held by the parts", line)
            assert m, line
            width, reserved, held = (int(x) for x in m.groups())
            assert "csr: written" in line and "csc: written" in line, line
            assert 0 < held <= reserved <= share, line
            assert kept["csr"] > 0 and kept["csc"] > 0, kept
            assert metric(s.url, used) == 0
            runs.append((width, reserved))
        finally:
            assert s.stop() == 0
    (wide, r_wide), (narrow, r_narrow) = runs
    assert wide == 6 and 1 <= narrow < wide and r_narrow < r_wide, runs


def test_kept_x_chunks_without_a_cache_folder(tmp_path):
    """A cache folder that cannot be made (a file in its place): the keep
    fails with a warning, and X's chunks are decoded on request."""
    d = zarrdata.make_data(6, 400, 40, "int32")
    path = str(tmp_path / "k.h5ad")
    zarrdata.write_dataset(path, *d, orientation="ivcsr")
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    s = zarrdata.Server(str(tmp_path), [{"id": "k", "path": path}],
                        extra_args=("--cache-dir", str(blocker)))
    try:
        zarrdata.wait_both(s.url, ["k"])
        deadline = time.time() + 30
        while "Zarr X chunks" not in s.log_text():
            assert time.time() < deadline, s.log_text()[-2000:]
            time.sleep(0.05)
        line = [l for l in s.log_text().splitlines() if "Zarr X chunks" in l][0]
        assert '"level":"warn"' in line and "csr: failed" in line and "csc: failed" in line, line
        assert requests.get(s.url + "/v1/datasets/k").json()["zarr_kept"] == {"csr": None, "csc": None}
        g = open_group(s, "k", csr=True)
        assert np.array_equal(g["X"]["indices"][:], sp.csr_matrix(d[0]).indices)
    finally:
        assert s.stop() == 0


def sparse_equal(got, want, fmt):
    """got (a scipy matrix read back) holds want's entries in format fmt
    and dtype, stored zeros included."""
    want = sp.csr_matrix(want) if fmt == "csr" else sp.csc_matrix(want)
    want.sort_indices()
    assert got.format == fmt and got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data)


def test_layers_and_raw_equal_the_file(env):
    """layers/NAME in the orientation each is stored in (csr_matrix from
    IVCSR, csc_matrix from IVCSC), raw as anndata writes it (X, var,
    varm): read by zarr-python and by anndata.read_zarr, equal to the
    file; chunk boundaries fall inside slices (more than one chunk)."""
    s, data = env
    path, (X, obs, var, layers, raw, raw_var) = data["mx"]
    g = open_group(s, "mx")
    assert sorted(g["layers"].keys()) == ["counts", "scaled"]
    assert g["layers"]["counts"].attrs["encoding-type"] == "csr_matrix"
    assert g["layers"]["scaled"].attrs["encoding-type"] == "csc_matrix"
    assert g["raw"].attrs.asdict() == {"encoding-type": "raw", "encoding-version": "0.1.0"}
    assert g["layers"]["counts"]["indices"].nchunks > 1
    sparse_equal(read_elem(g["layers"]["counts"]), layers["counts"], "csr")
    sparse_equal(read_elem(g["layers"]["scaled"]), layers["scaled"], "csc")
    sparse_equal(read_elem(g["raw"]["X"]), raw, "csc")
    pd.testing.assert_frame_equal(read_elem(g["raw"]["var"]), raw_var, check_exact=True)
    for csr in (False, True):
        a = anndata.read_zarr(consolidated(s, "mx", csr))
        sparse_equal(a.X, X, "csr" if csr else "csc")
        assert sorted(a.layers.keys()) == ["counts", "scaled"]
        sparse_equal(a.layers["counts"], layers["counts"], "csr")
        sparse_equal(a.layers["scaled"], layers["scaled"], "csc")
        assert a.raw is not None and a.raw.shape == (N_OBS, N_RAW)
        sparse_equal(a.raw.X, raw, "csc")
        pd.testing.assert_frame_equal(a.raw.var, raw_var, check_exact=True)
    # The datasets without them: an empty layers group, no raw.
    g = open_group(s, "r_int")
    assert list(g["layers"].keys()) == [] and "raw" not in g
    assert requests.get(store_url(s, "r_int") + "/raw/.zgroup").status_code == 404


def uns_equal(got, want, where="uns"):
    assert sorted(got) == sorted(want), where
    for k, v in want.items():
        g, at = got[k], where + "/" + k
        if isinstance(v, dict):
            uns_equal(g, v, at)
        elif isinstance(v, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == v.dtype and g.shape == v.shape, at
            assert np.array_equal(g, v), at
        else:
            assert type(g) is type(v) or np.asarray(g).dtype == np.asarray(v).dtype, (at, g, v)
            assert g == v, (at, g, v)


def test_uns_equals_the_file(env, tmp_path):
    """uns entries the server reads (scalars, 1-D numeric, bool and string
    arrays, nested dicts) read back by zarr-python and anndata.read_zarr
    equal to the file's; a data frame and a 2-D array are left out; every
    uns node's .zattrs and .zarray are what anndata 0.8's write_zarr
    writes for the same entries (but the compressor: anndata's default
    blosc, the store's none; and a string array's fill value, null in the
    store as for its obs columns, 0 in anndata's)."""
    import h5py
    import json
    s, data = env
    path = data["mx"][0]
    served, skipped = zarrdata.uns_entries()
    with h5py.File(path, "r") as f:
        from_file = read_elem(f["uns"])
    assert set(skipped) <= set(from_file)
    for k in skipped:
        del from_file[k]
    uns_equal(from_file, served)  # the fixture is what it claims
    g = open_group(s, "mx")
    uns_equal(read_elem(g["uns"]), from_file)
    uns_equal(anndata.read_zarr(consolidated(s, "mx")).uns, from_file)
    # Metadata documents against anndata's own writer.
    local = anndata.AnnData(np.zeros((1, 1), np.float32))
    local.uns = dict(served)
    local.write_zarr(str(tmp_path / "a.zarr"))
    meta = requests.get(store_url(s, "mx") + "/.zmetadata").json()["metadata"]
    mine = {k: v for k, v in meta.items() if k.startswith("uns/")}
    theirs = {}
    for dirpath, _, files in os.walk(str(tmp_path / "a.zarr" / "uns")):
        for fn in files:
            if fn.startswith(".z"):
                rel = os.path.relpath(os.path.join(dirpath, fn), str(tmp_path / "a.zarr"))
                theirs[rel] = json.load(open(os.path.join(dirpath, fn)))
    assert sorted(mine) == sorted(theirs)
    for k, want in theirs.items():
        got = dict(mine[k])
        assert requests.get(store_url(s, "mx") + "/" + k).json() == got, k
        if k.endswith(".zarray"):
            want = dict(want, compressor=None)
            if want["dtype"] == "|O":
                want["fill_value"] = None
        assert got == want, (k, got, want)
    # Nothing of the data frame or the 2-D array, and the uns of a file without one is empty.
    assert requests.get(store_url(s, "mx") + "/uns/frame/.zgroup").status_code == 404
    assert requests.get(store_url(s, "mx") + "/uns/grid/.zarray").status_code == 404
    assert list(open_group(s, "r_int")["uns"].keys()) == []
