"""Every HDF5 filter a user's .h5ad may carry, on each element it is met
on (X/data, an obs string column, a categorical's categories, obsm), through
`check`, `pack`, `export` and the server.

- The filters ivserve decodes (gzip, lzf, shuffle, zstd; Blosc2 through
  the shared fixtures) are served and packed exactly: the packed file
  passes `check` and its export equals the input, X's bits, obs and obsm.
  On X they are also put on the packed group's own arrays (packed_indices,
  values), which the server reads chunk by chunk through its own decoders.
- The ones it lacks (Blosc 32001, bitshuffle 32008, an unknown id 40000;
  written with write_direct_chunk and allow_unknown_filter, chunk bytes
  arbitrary) are refused cleanly by each command: exit status 1, an
  `ivserve: error:` line naming the element and the filter id, no
  temporary file left, never a signal.
- The server, given good and refused files (packed ones and ordinary ones
  it packs itself), leaves each refused one out with that error, serves
  the others exactly and stops cleanly.

zstd has no h5py writer here: its chunks are compressed with the python
zstandard module and stored with write_direct_chunk, as ivref.py does.
Variable-length strings are stored the same way: their raw chunk bytes
(the heap references) are taken from an uncompressed copy in the same
file first.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import requests
import scipy.sparse as sp
import zstandard

from conftest import fixtures_path
from ivprocess import listening_port
from ivref import read_array

N_OBS, N_VAR = 200, 60
ELEMENTS = ["X/data", "obs/barcode", "obs/cell_type/categories", "obsm/X_pca"]
DECODED = ["gzip", "lzf", "shuffle", "zstd"]
# name -> (filter id, cd_values) of the filters ivserve does not decode.
# A sanitizer build's reports (ASan exits 1 too, as a refusal does).
REPORTS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")
MISSING = {"blosc": (32001, (2, 2, 4, 0, 5, 1, 1)), "bitshuffle": (32008, (0, 2, 4, 0, 2)),
           "unknown": (40000, (1,))}


def source_adata():
    rng = np.random.default_rng(5)
    X = sp.random(N_OBS, N_VAR, density=0.1, format="csr", random_state=5, dtype=np.float32)
    X.data[::2] = np.round(X.data[::2] * 20)
    X.data[3] = 0.0
    X.sort_indices()
    kinds = np.array(["B cell", "T cell", "NK cell"])
    obs = pd.DataFrame({"cell_type": pd.Categorical(kinds[rng.integers(0, 3, N_OBS)]),
                        "barcode": ["ACGT-%d" % (3 * i) for i in range(N_OBS)]},
                       index=["cell%d" % i for i in range(N_OBS)])
    var = pd.DataFrame(index=["GENE%d" % j for j in range(N_VAR)])
    return ad.AnnData(X, obs=obs, var=var, obsm={"X_pca": rng.normal(size=(N_OBS, 4))})


def chunks_of(shape):
    """Several chunks along the first axis (the last one padded)."""
    return (max(1, min(shape[0], 48)),) + tuple(shape[1:])


def raw_chunks(f, name, data, chunks):
    """(offset, raw bytes) of every chunk of data as HDF5 stores it
    unfiltered in f: for strings, the heap references of this file."""
    tmp = name + "__raw"
    d = f.create_dataset(tmp, data=data, dtype=data.dtype if data.dtype != object
                         else h5py.string_dtype("utf-8"), chunks=chunks)
    out = []
    for i in range(d.id.get_num_chunks()):
        off = d.id.get_chunk_info(i).chunk_offset
        out.append((off, d.id.read_direct_chunk(off)[1]))
    del f[tmp]
    return out


def set_filter(path, name, filt):
    """Rewrites element `name` of the file at path with filter filt (a
    name of DECODED or MISSING), keeping its values and attributes."""
    with h5py.File(path, "a") as f:
        old = f[name]
        # ivref.read_array reads the zstd arrays `pack` writes.
        data = read_array(old) if old.ndim == 1 and old.dtype != object else old[()]
        attrs = dict(old.attrs)
        dtype = h5py.string_dtype("utf-8") if old.dtype == object else old.dtype
        del f[name]
        chunks = chunks_of(data.shape)
        kw = dict(shape=data.shape, dtype=dtype, chunks=chunks)
        if filt in ("gzip", "lzf", "shuffle"):
            kw.update(compression=None if filt == "shuffle" else filt, shuffle=filt == "shuffle")
            d = f.create_dataset(name, data=data, **kw)
        else:
            raw = raw_chunks(f, name, data, chunks)
            fid, cd = (32015, (1,)) if filt == "zstd" else MISSING[filt]
            d = f.create_dataset(name, compression=fid, compression_opts=cd,
                                 allow_unknown_filter=True, **kw)
            cctx = zstandard.ZstdCompressor(level=1, write_content_size=True)
            for off, b in raw:
                b = cctx.compress(b) if filt == "zstd" else b"\x02\x01not a real chunk" * 5
                d.id.write_direct_chunk(off, b, 0)
        for k, v in attrs.items():
            d.attrs[k] = v


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The plain source (anndata, no compression) and its packed copy."""
    d = tmp_path_factory.mktemp("filters_base")
    src = str(d / "plain.h5ad")
    a = source_adata()
    a.write_h5ad(src)
    packed = str(d / "plain.ivcsr.h5ad")
    ivs = os.environ["IVSERVE_BIN"]
    proc = subprocess.run([ivs, "pack", src, packed, "--quiet", "--threads", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return src, packed, a


def copy_with(base_path, workdir, stem, element, filt):
    path = os.path.join(workdir, stem + ".h5ad")
    shutil.copy(base_path, path)
    set_filter(path, element, filt)
    return path


def packed_element(element):
    """Where an element of the source lives in the packed file (X's
    arrays are packed_indices and values there)."""
    return ["X/packed_indices", "X/values"] if element == "X/data" else [element]


def assert_exact(out, a, unreadable=None):
    """The exported .h5ad holds a's matrix (bits and dtype), obs names,
    barcodes, cell types and X_pca.  unreadable: an element export copied
    unchanged with a filter Debian's h5py lacks (zstd), checked to be
    there with it; its values are asserted through the server."""
    with h5py.File(out, "r") as f:
        X = sp.csr_matrix((f["X/data"][()], f["X/indices"][()], f["X/indptr"][()]),
                          shape=tuple(f["X"].attrs["shape"]))
        assert X.dtype == np.float32 and X.shape == a.X.shape
        assert np.array_equal(X.indptr, a.X.indptr)
        assert np.array_equal(X.indices, a.X.indices)
        assert np.array_equal(X.data.view(np.uint32), a.X.data.view(np.uint32))
        assert list(f["obs/_index"].asstr()[()]) == list(a.obs_names)
        if unreadable:
            plist = f[unreadable].id.get_create_plist()
            assert plist.get_filter(0)[0] == 32015
        if unreadable != "obs/barcode":
            assert list(f["obs/barcode"].asstr()[()]) == list(a.obs["barcode"])
        if unreadable != "obs/cell_type/categories":
            cats = np.array(f["obs/cell_type/categories"].asstr()[()], dtype=object)
            assert list(cats[f["obs/cell_type/codes"][()]]) == list(a.obs["cell_type"])
        if unreadable != "obsm/X_pca":
            assert np.array_equal(f["obsm/X_pca"][()], a.obsm["X_pca"])


def zstd_copied(out, element):
    """The element when export copied it unchanged with zstd."""
    with h5py.File(out, "r") as f:
        plist = f[element].id.get_create_plist()
        ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    return element if 32015 in ids else None


def run(ivserve, *args):
    """One command; no sanitizer report on its stderr."""
    proc = ivserve.run(*args, timeout=120)
    for r in REPORTS:
        assert r not in proc.stderr, proc.stderr[-3000:]
    return proc


def no_temporaries(folder):
    left = [n for n in os.listdir(folder) if ".tmp" in n]
    assert not left, left


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("filt", DECODED)
def test_decoded_filter_is_packed_and_served_exactly(ivserve, workdir, base, filt, element):
    src, packed_plain, a = base
    path = copy_with(src, workdir, "in_" + filt, element, filt)
    packed = os.path.join(workdir, "packed.h5ad")
    ivserve.assert_ok(run(ivserve, "pack", path, packed, "--quiet", "--threads", "2"))
    ivserve.assert_ok(run(ivserve, "check", packed))
    out = os.path.join(workdir, "out.h5ad")
    ivserve.assert_ok(run(ivserve, "export", packed, "-o", out))
    assert_exact(out, a, zstd_copied(out, element) if element != "X/data" else None)
    # The filter on the packed file's own arrays: check and export read
    # them chunk by chunk (X) or through HDF5 (the rest).
    p2 = os.path.join(workdir, "packed_" + filt + ".h5ad")
    shutil.copy(packed_plain, p2)
    for name in packed_element(element):
        set_filter(p2, name, filt)
    ivserve.assert_ok(run(ivserve, "check", p2))
    out2 = os.path.join(workdir, "out2.h5ad")
    ivserve.assert_ok(run(ivserve, "export", p2, "-o", out2))
    assert_exact(out2, a, zstd_copied(out2, element) if element != "X/data" else None)
    no_temporaries(workdir)


def commands(path, workdir):
    return {
        "check": ["check", path],
        "pack": ["pack", path, os.path.join(workdir, "o.h5ad"), "--quiet", "--threads", "2"],
        "export_npz": ["export", path, "--threads", "2", "-o", os.path.join(workdir, "o.npz")],
        "export_h5ad": ["export", path, "--threads", "2", "-o", os.path.join(workdir, "o.h5ad")],
    }


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("filt", sorted(MISSING))
def test_missing_filter_is_refused_cleanly(ivserve, workdir, base, filt, element):
    src, packed_plain, _ = base
    fid = str(MISSING[filt][0])
    # The ordinary file: every command refuses it, naming element and filter.
    path = copy_with(src, workdir, "in_" + filt, element, filt)
    for what, args in commands(path, workdir).items():
        proc = run(ivserve, *args)
        text = ivserve.assert_error(proc, path, element, "filter " + fid)
        if filt != "unknown":
            assert "(%s)" % filt in text, (what, text)
        no_temporaries(workdir)
        assert not os.path.exists(os.path.join(workdir, "o.h5ad")), what
        assert not os.path.exists(os.path.join(workdir, "o.npz")), what
    # The packed file with the filter on the same element.
    p2 = os.path.join(workdir, "packed_" + filt + ".h5ad")
    shutil.copy(packed_plain, p2)
    name = packed_element(element)[0]
    set_filter(p2, name, filt)
    for what, args in commands(p2, workdir).items():
        proc = run(ivserve, *args)
        ivserve.assert_error(proc, p2, name, "filter " + fid)
        no_temporaries(workdir)


def test_blosc2_fixture_is_packed_and_checked(ivserve, workdir):
    """Blosc2 (32026) on X and on obs columns, as the fixtures' writer
    stores them: pack, check and export read them exactly."""
    fx = fixtures_path()
    if fx is None:
        pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): skipping")
    src = os.path.join(fx, "real", "pbmc_small.ivcsr.h5ad")
    with h5py.File(os.path.join(fx, "real", "expected", "pbmc_small.csr.h5"), "r") as f:
        want = sp.csr_matrix((f["data"][()], f["indices"][()], f["indptr"][()]),
                             shape=tuple(f.attrs["shape"]))
    with h5py.File(src, "r") as f:
        plist = f["obs/nCount_RNA"].id.get_create_plist()
        assert plist.get_filter(0)[0] == 32026
    ivserve.assert_ok(run(ivserve, "check", src))
    packed = os.path.join(workdir, "packed.h5ad")
    ivserve.assert_ok(run(ivserve, "pack", src, packed, "--quiet", "--threads", "2"))
    ivserve.assert_ok(run(ivserve, "check", packed))
    out = os.path.join(workdir, "out.h5ad")
    ivserve.assert_ok(run(ivserve, "export", src, "-o", out))
    got = sp.csr_matrix(ad.read_h5ad(out).X)
    assert (got != want).nnz == 0 and got.shape == want.shape


# ---------------------------------------------------------------- the server

def query_matrix(url, ds):
    r = requests.get("%s/v1/datasets/%s/query?obs=0:%d&format=json" % (url, ds, N_OBS), timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    out = np.zeros(tuple(doc["shape"]), dtype=np.float32)
    ip = doc["indptr"]
    for i in range(len(ip) - 1):
        out[i, doc["indices"][ip[i]:ip[i + 1]]] = doc["data"][ip[i]:ip[i + 1]]
    return out


def test_server_leaves_out_what_it_cannot_decode_and_serves_the_rest(ivserve, workdir, base):
    src, packed_plain, a = base
    want = a.X.toarray()
    good, bad = {}, {}
    # Packed files with a decoded filter on X's own arrays and on obs.
    for filt in DECODED:
        p = os.path.join(workdir, "good_%s.h5ad" % filt)
        shutil.copy(packed_plain, p)
        for name in ("X/packed_indices", "X/values", "obs/barcode", "obs/cell_type/categories",
                     "obsm/X_pca"):
            set_filter(p, name, filt)
        good["good_" + filt] = p
    # An ordinary lzf file the server packs itself.
    lzf = os.path.join(workdir, "plain_lzf.h5ad")
    a.write_h5ad(lzf, compression="lzf")
    good["plain_lzf"] = lzf
    # Missing filters on a packed file's X and obs, and on an ordinary
    # file (refused by the pack the server runs).
    for (filt, element) in (("blosc", "X/packed_indices"), ("bitshuffle", "obs/cell_type/categories"),
                            ("unknown", "obsm/X_pca")):
        p = os.path.join(workdir, "bad_%s.h5ad" % filt)
        shutil.copy(packed_plain, p)
        set_filter(p, element, filt)
        bad["bad_" + filt] = (p, element, MISSING[filt][0])
    p = copy_with(src, workdir, "bad_plain", "obs/barcode", "unknown")
    bad["bad_plain"] = (p, "obs/barcode", 40000)

    cache = os.path.join(workdir, "cache")
    log_path = os.path.join(workdir, "server.log")
    log = open(log_path, "a+")
    files = list(good.values()) + [v[0] for v in bad.values()]
    proc = subprocess.Popen([ivserve.path, *files, "--cache-dir", cache, "--port", "0",
                             "--threads", "2"], stdout=log, stderr=log)
    try:
        url = "http://127.0.0.1:%d" % listening_port(log_path, proc)
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, open(log_path).read()[-3000:]
            try:
                docs = {d["id"]: d for d in
                        requests.get(url + "/v1/datasets", timeout=5).json()["datasets"]}
                if docs and all(d["state"] not in ("loading", "packing") for d in docs.values()):
                    break
            except requests.ConnectionError:
                pass
            assert time.time() < deadline, open(log_path).read()[-3000:]
            time.sleep(0.05)
        states = {k: d["state"] for k, d in docs.items()}
        assert states == {**{k: "ready" for k in good}, **{k: "failed" for k in bad}}, states
        for ds in good:
            assert np.array_equal(query_matrix(url, ds), want), ds
            r = requests.get(url + "/v1/datasets/%s/query?obs_names=cell7,cell2&var=0:3&format=json"
                             % ds, timeout=10)
            assert r.status_code == 200 and r.json()["obs"] == [7, 2], r.text
            # The string column and the categories, through each filter.
            r = requests.get(url + "/v1/datasets/%s/obs/barcode" % ds,
                             params={"limit": N_OBS}, timeout=10)
            assert r.status_code == 200 and r.json()["values"] == list(a.obs["barcode"]), r.text
            r = requests.get(url + "/v1/datasets/%s/obs/cell_type" % ds, timeout=10)
            counts = a.obs["cell_type"].value_counts()
            assert {c["name"]: c["count"] for c in r.json()["categories"]} == \
                {k: int(v) for k, v in counts.items()}, r.text
        text = open(log_path, errors="replace").read()
        for ds, (path, element, fid) in bad.items():
            lines = [l for l in text.splitlines() if ds in l and element in l and
                     ("filter %d" % fid) in l]
            assert lines, (ds, text[-3000:])
            assert requests.get(url + "/v1/datasets/" + ds, timeout=10).status_code == 503
        no_temporaries(workdir)
        if os.path.isdir(cache):
            no_temporaries(cache)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
    text = open(log_path, errors="replace").read()
    assert rc == 0, text[-3000:]
    for r in REPORTS:
        assert r not in text, text[-3000:]
