"""Damaged and lying .h5ad files for the hostile-file campaign.

`generate(folder, n, ivserve_bin)` writes n files into folder, built from
three valid bases (a scanpy-style CSR file with categoricals, an embedding
and uns; a dense file with a sparse layer; the CSR file packed by ivserve)
and returns [(name, path, kind)]. The kinds, in turn:

- byte damage below the HDF5 API: random bit flips, zeroed runs,
  truncations, damaged global heap objects, and bytes changed right after
  the signature of an object header, B-tree, local heap, symbol table
  node or fractal heap (the structures libhdf5 trusts most);
- lies told through the API, each a file HDF5 itself reads without
  complaint: giant declared shapes over a few stored bytes (a CSR of
  2^31 + 5 columns, dense matrices of 10^12 values with no chunk written,
  an embedding of 10^8 columns, an indptr of 10^9 entries), wrong dtypes
  (strings for values, floats for indices and pointers, a string shape),
  hostile names (non-UTF-8, 4,000 characters, control characters),
  duplicate categories and out-of-range codes.

The same n and seed give the same files.
"""

import os
import random
import subprocess

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

N_OBS, N_VAR = 120, 90
SIGNATURES = (b"OHDR", b"TREE", b"HEAP", b"SNOD", b"GCOL", b"FRHP", b"FHDB", b"BTHD", b"BTLF",
              b"OCHK", b"FSHD")


def _base_adata(seed=3):
    rng = np.random.default_rng(seed)
    X = sp.random(N_OBS, N_VAR, density=0.1, format="csr", dtype=np.float32, random_state=rng)
    X.data = np.floor(X.data * 20 + 1).astype(np.float32)
    obs = pd.DataFrame({
        "cell_type": pd.Categorical(rng.choice(["B", "T", "NK", "Mono"], N_OBS)),
        "n_genes": rng.integers(100, 2000, N_OBS),
        "score": rng.random(N_OBS).astype(np.float32),
        "sample": rng.choice(["s1", "s2"], N_OBS),
    }, index=["cell%d" % i for i in range(N_OBS)])
    var = pd.DataFrame({"gene_symbols": ["SYM%d" % j for j in range(N_VAR)]},
                       index=["gene%d" % j for j in range(N_VAR)])
    a = ad.AnnData(X=X, obs=obs, var=var)
    a.obsm["X_umap"] = rng.random((N_OBS, 2)).astype(np.float32)
    a.obsm["X_pca"] = rng.random((N_OBS, 5)).astype(np.float32)
    a.uns["cell_type_colors"] = np.array(["#ff0000", "#00ff00", "#0000ff", "#777777"])
    return a


def bases(folder, ivserve_bin):
    """The three valid files the damage starts from; {name: path}."""
    a = _base_adata()
    csr = os.path.join(folder, "base_csr.h5ad")
    a.write_h5ad(csr, compression="gzip")
    d = a.copy()
    d.layers["counts"] = d.X.copy()
    d.X = d.X.toarray()
    dense = os.path.join(folder, "base_dense.h5ad")
    d.write_h5ad(dense)
    packed = os.path.join(folder, "base_packed.h5ad")
    subprocess.run([ivserve_bin, "pack", csr, packed, "--quiet", "--threads", "1"], check=True,
                   capture_output=True, timeout=120)
    return {"csr": csr, "dense": dense, "packed": packed}


# ---- byte damage -----------------------------------------------------------

def _bitflips(rng, blob):
    b = bytearray(blob)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _zero_run(rng, blob):
    b = bytearray(blob)
    i, n = rng.randrange(len(b)), rng.choice([4, 16, 64, 512])
    b[i:i + n] = bytes(len(b[i:i + n]))
    return bytes(b)


def _truncate(rng, blob):
    return blob[:int(len(blob) * rng.uniform(0.05, 0.99))]


def _structure(rng, blob):
    """Changes bytes just past one HDF5 structure's signature: versions,
    sizes, addresses and counts that the library reads before any check."""
    hits = [i for s in SIGNATURES for i in _find_all(blob, s)]
    if not hits:
        return _bitflips(rng, blob)
    at = rng.choice(hits) + 4 + rng.randrange(28)
    b = bytearray(blob)
    for k in range(rng.randint(1, 4)):
        if at + k < len(b):
            b[at + k] = rng.choice([0x00, 0xff, 0x7f, 0x80, rng.randrange(256)])
    return bytes(b)


def _heap_object(rng, blob):
    """A global heap object's size field (vlen strings: obs names,
    categories) made huge or small."""
    cols = _find_all(blob, b"GCOL")
    if not cols:
        return _structure(rng, blob)
    c = rng.choice(cols)
    # The first object follows the 16-byte collection header: index (2),
    # refcount (2), reserved (4), size (8).
    off = c + 16 + 8
    b = bytearray(blob)
    if off + 8 <= len(b):
        b[off:off + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, (1 << 40).to_bytes(8, "little"),
                                     rng.randrange(1 << 16).to_bytes(8, "little")])
    return bytes(b)


def _find_all(blob, sig):
    out, i = [], blob.find(sig)
    while i >= 0:
        out.append(i)
        i = blob.find(sig, i + 1)
    return out


BYTE_DAMAGE = [_bitflips, _zero_run, _truncate, _structure, _heap_object]


# ---- lies through the API ---------------------------------------------------

def _copy(src, dst):
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())


def lie_giant_csr_cols(path):
    """(var goes, so that the lie reaches the matrix's reader.)"""
    with h5py.File(path, "r+") as f:
        f["X"].attrs["shape"] = np.array([N_OBS, (1 << 31) + 5], dtype=np.int64)
        del f["var"]


def lie_giant_csr_rows(path):
    """indptr declared 10^9 entries, one chunk written."""
    with h5py.File(path, "r+") as f:
        g = f["X"]
        del g["indptr"]
        d = g.create_dataset("indptr", shape=(10 ** 9 + 1,), dtype=np.int64, chunks=(1 << 16,),
                             compression="gzip")
        d[:4] = [0, 0, 0, 0]
        g.attrs["shape"] = np.array([10 ** 9, N_VAR], dtype=np.int64)
        del f["obs"]


def lie_dense_huge(path):
    with h5py.File(path, "r+") as f:
        del f["X"]
        f.create_dataset("X", shape=(10 ** 6, 10 ** 6), dtype=np.float32, chunks=(256, 256),
                         compression="gzip")
        f["X"].attrs["encoding-type"] = "array"
        f["X"].attrs["encoding-version"] = "0.2.0"


def lie_dense_square(path):
    with h5py.File(path, "r+") as f:
        del f["X"]
        d = f.create_dataset("X", shape=(200000, 200000), dtype=np.float32, chunks=(1024, 1024),
                             compression="gzip")
        d[0:4, 0:4] = 1
        d.attrs["encoding-type"] = "array"
        d.attrs["encoding-version"] = "0.2.0"


def lie_obsm_wide(path):
    with h5py.File(path, "r+") as f:
        del f["obsm/X_pca"]
        f["obsm"].create_dataset("X_pca", shape=(N_OBS, 10 ** 8), dtype=np.float32,
                                 chunks=(N_OBS, 4096), compression="gzip")


def lie_data_strings(path):
    with h5py.File(path, "r+") as f:
        n = f["X/data"].shape[0]
        del f["X/data"]
        f["X"].create_dataset("data", data=np.array([b"x"] * n))


def lie_indices_float(path):
    with h5py.File(path, "r+") as f:
        v = f["X/indices"][()]
        del f["X/indices"]
        f["X"].create_dataset("indices", data=v.astype(np.float64) + 0.5)


def lie_indptr_float(path):
    with h5py.File(path, "r+") as f:
        v = f["X/indptr"][()]
        del f["X/indptr"]
        f["X"].create_dataset("indptr", data=v.astype(np.float32))


def lie_indices_range(path):
    with h5py.File(path, "r+") as f:
        v = f["X/indices"][()]
        v[len(v) // 2] = 10 ** 6
        v[0] = -5
        f["X/indices"][...] = v


def lie_shape_string(path):
    with h5py.File(path, "r+") as f:
        f["X"].attrs["shape"] = "120 x 90"


def lie_names_bytes(path):
    with h5py.File(path, "r+") as f:
        n = f["obs/_index"].shape[0]
        names = [b"\xff\xfe cell %d" % i for i in range(n)]
        del f["obs/_index"]
        f["obs"].create_dataset("_index", data=np.array(names, dtype=object),
                                dtype=h5py.special_dtype(vlen=bytes))


def lie_names_long(path):
    with h5py.File(path, "r+") as f:
        n = f["var/_index"].shape[0]
        del f["var/_index"]
        f["var"].create_dataset("_index", data=["g" * 4000 + str(i) for i in range(n)],
                                dtype=h5py.string_dtype())


def lie_names_control(path):
    with h5py.File(path, "r+") as f:
        f["obs"].create_dataset("we\nird\x01\"col", data=np.arange(N_OBS))
        order = list(f["obs"].attrs["column-order"]) + ["we\nird\x01\"col"]
        f["obs"].attrs["column-order"] = np.array(order, dtype=object)


def lie_categories_duplicate(path):
    with h5py.File(path, "r+") as f:
        g = f["obs/cell_type"]
        cats = [c.decode() if isinstance(c, bytes) else c for c in g["categories"][()]]
        cats[-1] = cats[0]
        del g["categories"]
        g.create_dataset("categories", data=cats, dtype=h5py.string_dtype())


def lie_codes_range(path):
    with h5py.File(path, "r+") as f:
        c = f["obs/cell_type/codes"][()]
        c[3] = 100
        c[5] = -7
        f["obs/cell_type/codes"][...] = c


def lie_codes_float(path):
    with h5py.File(path, "r+") as f:
        c = f["obs/cell_type/codes"][()]
        del f["obs/cell_type/codes"]
        f["obs/cell_type"].create_dataset("codes", data=c.astype(np.float64))


def lie_obs_rows(path):
    """obs with fewer rows than X."""
    with h5py.File(path, "r+") as f:
        for name in list(f["obs"].keys()):
            if isinstance(f["obs"][name], h5py.Dataset):
                v = f["obs"][name][()][:10]
                dt = f["obs"][name].dtype
                del f["obs"][name]
                f["obs"].create_dataset(name, data=v, dtype=dt)


def lie_packed_shape(path):
    """A packed file's shape attribute past its arrays."""
    with h5py.File(path, "r+") as f:
        f["X"].attrs["shape"] = np.array([(1 << 40), (1 << 40)], dtype=np.int64)


def lie_packed_major_ptr(path):
    """major_ptr (stored with the project's codec, which h5py cannot read)
    replaced by a plain one of the same length whose offsets run past the
    stream."""
    with h5py.File(path, "r+") as f:
        n = f["X/major_ptr"].shape[0]
        del f["X/major_ptr"]
        f["X"].create_dataset("major_ptr", data=np.arange(n, dtype=np.int64) * 100003)


LIES = {  # name: (base, mutator)
    "giant_csr_cols": ("csr", lie_giant_csr_cols),
    "giant_csr_rows": ("csr", lie_giant_csr_rows),
    "dense_huge": ("dense", lie_dense_huge),
    "dense_square": ("dense", lie_dense_square),
    "obsm_wide": ("csr", lie_obsm_wide),
    "data_strings": ("csr", lie_data_strings),
    "indices_float": ("csr", lie_indices_float),
    "indptr_float": ("csr", lie_indptr_float),
    "indices_range": ("csr", lie_indices_range),
    "shape_string": ("csr", lie_shape_string),
    "names_bytes": ("csr", lie_names_bytes),
    "names_long": ("csr", lie_names_long),
    "names_control": ("csr", lie_names_control),
    "categories_duplicate": ("csr", lie_categories_duplicate),
    "codes_range": ("csr", lie_codes_range),
    "codes_float": ("csr", lie_codes_float),
    "obs_rows": ("csr", lie_obs_rows),
    "packed_shape": ("packed", lie_packed_shape),
    "packed_major_ptr": ("packed", lie_packed_major_ptr),
    "packed_names_bytes": ("packed", lie_names_bytes),
    "packed_categories_duplicate": ("packed", lie_categories_duplicate),
}


def generate(folder, n, ivserve_bin, seed=30):
    """n hostile files in folder (every lie once, the rest byte damage
    spread over the three bases); [(name, path, kind)]."""
    os.makedirs(folder, exist_ok=True)
    base = bases(folder, ivserve_bin)
    blobs = {k: open(p, "rb").read() for k, p in base.items()}
    out = []
    for name, (b, fn) in sorted(LIES.items()):
        if len(out) >= n:
            break
        path = os.path.join(folder, "lie_%s.h5ad" % name)
        _copy(base[b], path)
        fn(path)
        out.append((name, path, "lie"))
    rng = random.Random(seed)
    kinds = sorted(blobs)
    i = 0
    while len(out) < n:
        b = kinds[i % len(kinds)]
        fn = BYTE_DAMAGE[(i // len(kinds)) % len(BYTE_DAMAGE)]
        name = "%s_%s_%d" % (fn.__name__.lstrip("_"), b, i)
        path = os.path.join(folder, name + ".h5ad")
        with open(path, "wb") as f:
            f.write(fn(rng, blobs[b]))
        out.append((name, path, "bytes"))
        i += 1
    return out
