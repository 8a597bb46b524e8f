"""LZF (HDF5 filter 32000), as h5py and anndata write it for
compression="lzf": a file whose X (CSR), obs strings, categories and obsm
are all LZF-compressed is packed (both orientations), the packed file
passes `ivserve check`, and `ivserve export` of it gives exactly the
matrix (values, dtype, explicit zeros), obs and obsm.  The data mixes
chunks LZF shrinks with chunks it cannot (random floats), which h5py
stores raw with the filter's mask bit set; h5py leaves the chunk size out
of cd_values for variable-length strings, so those chunks are measured.
"""

import os

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from ivref import load_npz_raw

N_OBS, N_VAR = 300, 120


def lzf_adata():
    rng = np.random.default_rng(23)
    X = sp.random(N_OBS, N_VAR, density=0.08, format="csr", random_state=23, dtype=np.float32)
    X.data[::3] = np.round(X.data[::3] * 10)      # repeated values LZF shrinks
    X.data[5] = 0.0                               # an explicit stored zero
    X.data[7] = -2.5
    X.sort_indices()
    kinds = np.array(["B cell", "T cell", "NK cell", "monocyte"])
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(kinds[rng.integers(0, 4, N_OBS)]),
        "barcode": ["AACG-%d" % (i * 7) for i in range(N_OBS)],
        "n_genes": rng.integers(100, 5000, N_OBS),
    }, index=["cell%04d" % i for i in range(N_OBS)])
    var = pd.DataFrame(index=["GENE%d" % i for i in range(N_VAR)])
    obsm = {"X_pca": rng.normal(size=(N_OBS, 8)), "X_umap": rng.normal(size=(N_OBS, 2))}
    return ad.AnnData(X, obs=obs, var=var, obsm=obsm)


@pytest.fixture(scope="module")
def lzf_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lzf") / "scanpy_lzf.h5ad")
    a = lzf_adata()
    a.write_h5ad(path, compression="lzf")
    # The elements the test is about really are LZF.
    with h5py.File(path, "r") as f:
        for name in ("X/data", "X/indices", "X/indptr", "obs/barcode", "obs/cell_type/categories",
                     "obs/_index", "obsm/X_pca"):
            assert f[name].compression == "lzf", name
        masks = {}
        for name in ("X/data", "obsm/X_pca"):
            d = f[name].id
            masks[name] = {d.read_direct_chunk(d.get_chunk_info(i).chunk_offset)[0]
                           for i in range(d.get_num_chunks())}
    return path, a, masks


def assert_same_obs(got, want):
    assert list(got.obs_names) == list(want.obs_names)
    assert list(got.var_names) == list(want.var_names)
    assert list(got.obs["barcode"]) == list(want.obs["barcode"])
    assert list(got.obs["cell_type"]) == list(want.obs["cell_type"])
    assert list(got.obs["cell_type"].cat.categories) == list(want.obs["cell_type"].cat.categories)
    assert np.array_equal(got.obs["n_genes"].to_numpy(), want.obs["n_genes"].to_numpy())
    for k in ("X_pca", "X_umap"):
        assert np.array_equal(np.asarray(got.obsm[k]), want.obsm[k]), k


@pytest.mark.parametrize("layout", ["ivcsr", "ivcsc"])
def test_pack_then_export_exact(ivserve, workdir, lzf_file, layout):
    src, a, _ = lzf_file
    packed = os.path.join(workdir, "packed.h5ad")
    ivserve.assert_ok(ivserve.run("pack", src, packed, "--layout", layout, "--threads", "2",
                                  "--quiet"))
    proc = ivserve.check(packed)
    ivserve.assert_ok(proc)
    assert "obs: %d rows" % N_OBS in proc.stdout, proc.stdout
    assert not [n for n in os.listdir(workdir) if ".tmp" in n]

    out = os.path.join(workdir, "out.h5ad")
    ivserve.assert_ok(ivserve.export(packed, out))
    b = ad.read_h5ad(out)
    assert b.X.dtype == np.float32
    got, want = sp.csr_matrix(b.X), a.X
    assert got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data.view(np.uint32), want.data.view(np.uint32))
    assert_same_obs(b, a)

    npz = os.path.join(workdir, "out.npz")
    ivserve.assert_ok(ivserve.export(packed, npz, obs="5,0,299", var="3:40"))
    raw = load_npz_raw(npz)
    sub = want[[5, 0, 299], :][:, 3:40]
    assert np.array_equal(raw["indptr"], sub.indptr)
    assert np.array_equal(raw["data"], sub.data)


def test_both_kinds_of_chunk_are_in_the_file(lzf_file):
    """X/data's chunks are LZF streams (mask 0); obsm/X_pca's random
    floats do not shrink, so h5py stored them raw with the filter skipped
    (mask bit 0 set): the exact export above read both kinds."""
    _, _, masks = lzf_file
    assert masks == {"X/data": {0}, "obsm/X_pca": {1}}, masks


def test_export_of_the_lzf_source_is_refused_for_its_layout_only(ivserve, workdir, lzf_file):
    """The unpacked source reads (no filter error): `check` refuses it for
    being CSR, pointing to `ivserve pack`, not for its compression."""
    src, _, _ = lzf_file
    proc = ivserve.check(src)
    assert proc.returncode == 1
    assert "filter" not in proc.stderr, proc.stderr
    assert "csr_matrix" in proc.stderr, proc.stderr
