"""Reference implementation of the IVCSR/IVCSC layout, for tests only.

This module is deliberately independent of the C engine: it uses h5py, numpy,
scipy and zstandard and nothing from the project, so that the differential
tests compare two implementations written from the format description rather
than one implementation against itself.

It provides
  * write_iv()   encode a scipy sparse matrix into an .h5ad file holding an
                 IVCSR/IVCSC group (uncompressed, gzip or zstd chunks), with
                 hooks ("lies") that produce deliberately broken files;
  * write_with_layers()  X plus packed layers/NAME and raw/X, plain
                 csr_matrix and dense layers, in one file;
  * read_iv()    a pure-Python decoder of the same layout, used to test the
                 writer, not the engine;
  * expected()   the numpy-semantics answer X[obs, :][:, var] as canonical CSR,
                 built by hand so explicit stored zeros survive;
  * helpers to format selections for the command line and to load an .npz
    written by `ivserve export` without letting scipy change its dtypes.

Everything is vectorized with numpy (no Python loop per stored entry) so the
benchmark generator can reuse the encoder on millions of entries.
"""

import numpy as np
import scipy.sparse as sp

try:
    import h5py
except ImportError:  # pragma: no cover - Debian's python3-h5py is a dependency
    h5py = None

ZSTD_FILTER_ID = 32015
ENCODING_VERSION = "0.1.0"
ARRAY_ATTRS = {"encoding-type": "array", "encoding-version": "0.2.0"}


# ---------------------------------------------------------------- varints

def varint_lengths(values):
    """Bytes each unsigned LEB128 varint of `values` (uint64) takes."""
    v = np.asarray(values, dtype=np.uint64)
    n = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        n += v >= np.uint64(1 << (7 * k))
    return n


def encode_varints(values):
    """Unsigned LEB128 encoding of a uint64 array, as one uint8 array.

    Each byte position j of every varint is filled in one vectorized step, so
    the cost is ten numpy passes whatever the number of values.
    """
    v = np.asarray(values, dtype=np.uint64)
    lens = varint_lengths(v)
    starts = np.zeros(v.shape[0], dtype=np.int64)
    if v.shape[0] > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    total = int(lens.sum()) if v.shape[0] else 0
    out = np.zeros(total, dtype=np.uint8)
    for j in range(int(lens.max()) if v.shape[0] else 0):
        m = lens > j
        byte = ((v[m] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= np.where(lens[m] > j + 1, 0x80, 0).astype(np.uint8)
        out[starts[m] + j] = byte
    return out


def decode_varints(buf):
    """Decodes a stream of unsigned LEB128 varints into uint64.

    Raises ValueError when the last varint is unterminated or one is longer
    than ten bytes (it cannot fit 64 bits).
    """
    b = np.asarray(buf, dtype=np.uint8)
    if b.shape[0] == 0:
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if ends.shape[0] == 0 or ends[-1] != b.shape[0] - 1:
        raise ValueError("varint: unterminated last varint")
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    if lens.max() > 10:
        raise ValueError("varint: longer than 10 bytes")
    vid = np.repeat(np.arange(ends.shape[0]), lens)
    pos = np.arange(b.shape[0]) - np.repeat(starts, lens)
    part = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    out = np.zeros(ends.shape[0], dtype=np.uint64)
    np.add.at(out, vid, part)  # bit fields are disjoint, so + is |
    return out


# ---------------------------------------------------------------- encoding

def _coo_entries(X):
    """(rows, cols, data) of every stored entry of X, explicit zeros kept."""
    X = sp.csr_matrix(X) if not sp.issparse(X) else X
    X = X.tocsr()
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()  # only sums duplicates; stored zeros stay stored
    indptr = np.asarray(X.indptr, dtype=np.int64)
    rows = np.repeat(np.arange(X.shape[0], dtype=np.int64), np.diff(indptr))
    cols = np.asarray(X.indices, dtype=np.int64)
    return rows, cols, np.asarray(X.data)


def pack(X, orientation="ivcsr", shuffle_groups=False, value_dtype=None, rng=None):
    """Encodes X into the four IVCSR/IVCSC arrays (FORMAT.md section 2).

    Returns a dict with major_ptr, values, value_ptr (int64), packed (uint8),
    n_major, n_minor.  Groups of one major slice are in ascending value order
    (NaNs last, each its own group), or in a random order per slice when
    shuffle_groups is set.
    """
    if orientation not in ("ivcsr", "ivcsc"):
        raise ValueError("orientation must be ivcsr or ivcsc")
    n_rows, n_cols = X.shape
    rows, cols, data = _coo_entries(X)
    if value_dtype is not None:
        data = data.astype(value_dtype)
    if orientation == "ivcsr":
        major, minor, n_major, n_minor = rows, cols, n_rows, n_cols
    else:
        major, minor, n_major, n_minor = cols, rows, n_cols, n_rows
    nnz = data.shape[0]
    # Sort by slice, then value (NaN sorts last), then minor index.
    order = np.lexsort((minor, data, major))
    major, minor, data = major[order], minor[order], data[order]
    # A new group starts at a new slice or a new value; NaN != NaN, so every
    # NaN starts its own group as the format requires.
    new = np.ones(nnz, dtype=bool)
    if nnz > 1:
        new[1:] = (major[1:] != major[:-1]) | ~(data[1:] == data[:-1])
    gstart = np.flatnonzero(new)
    n_groups = gstart.shape[0]
    gid = np.cumsum(new) - 1
    gmajor = major[gstart]
    if shuffle_groups and n_groups:
        rng = np.random.default_rng(rng)
        key = rng.permutation(n_groups)
        order = np.lexsort((np.arange(nnz), key[gid], major))
        major, minor, data, gid = major[order], minor[order], data[order], gid[order]
        new = np.ones(nnz, dtype=bool)
        if nnz > 1:
            new[1:] = gid[1:] != gid[:-1]
        gstart = np.flatnonzero(new)
        gmajor = major[gstart]
    values = data[gstart]
    value_ptr = np.append(gstart, nnz).astype(np.int64)
    counts = np.bincount(gmajor, minlength=n_major) if n_groups else np.zeros(n_major, np.int64)
    major_ptr = np.zeros(n_major + 1, dtype=np.int64)
    np.cumsum(counts, out=major_ptr[1:])
    # Deltas: d0 = idx0 and dk = idx_k - idx_(k-1) - 1 inside a group.
    deltas = minor.copy()
    if nnz > 1:
        inner = ~new[1:]
        deltas[1:][inner] = minor[1:][inner] - minor[:-1][inner] - 1
    packed = encode_varints(deltas.astype(np.uint64))
    return dict(major_ptr=major_ptr, values=values, value_ptr=value_ptr, packed=packed,
                n_major=n_major, n_minor=n_minor)


def default_indices_dtype(n_minor):
    if n_minor <= np.iinfo(np.int16).max:
        return "int16"
    if n_minor <= np.iinfo(np.int32).max:
        return "int32"
    return "int64"


def zstd_chunks(raw, chunk_len, level=1):
    """Yields (offset, frame bytes) for each chunk of raw, the last padded
    with zeros to the full chunk length as HDF5 stores it."""
    import zstandard
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    raw = np.ascontiguousarray(raw)
    for off in range(0, raw.shape[0], chunk_len):
        part = raw[off:off + chunk_len]
        if part.shape[0] < chunk_len:
            part = np.concatenate((part, np.zeros(chunk_len - part.shape[0], raw.dtype)))
        yield off, cctx.compress(part.tobytes()), part.tobytes()


def write_array(group, name, arr, compression=None, chunk_len=None, chunk_mutator=None,
                level=1):
    """Writes one 1-D array as an anndata `array` element.

    compression None writes a contiguous dataset (chunk_len ignored unless
    given, then a chunked unfiltered one); 'gzip' uses h5py's deflate; 'zstd'
    creates filter 32015 and writes every chunk with write_direct_chunk, after
    passing it through chunk_mutator(k, frame, raw) -> bytes when given.
    """
    arr = np.ascontiguousarray(arr)
    n = arr.shape[0]
    if compression is None and chunk_len is None:
        d = group.create_dataset(name, data=arr)
    else:
        cl = int(chunk_len or max(1, min(n, 65536)))
        kw = dict(shape=(n,), dtype=arr.dtype, chunks=(cl,))
        if cl > n:
            kw["maxshape"] = (None,)  # HDF5 wants chunk <= max dims
        if compression == "gzip":
            kw.update(compression="gzip", compression_opts=4)
        elif compression == "zstd":
            kw.update(compression=ZSTD_FILTER_ID, compression_opts=(level,),
                      allow_unknown_filter=True)
        elif compression is not None:
            raise ValueError("compression must be None, 'gzip' or 'zstd'")
        d = group.create_dataset(name, **kw)
        if compression == "zstd":
            for k, (off, frame, raw) in enumerate(zstd_chunks(arr, cl, level)):
                if chunk_mutator is not None:
                    frame = chunk_mutator(k, frame, raw)
                    if frame is None:
                        continue  # the mutator dropped the chunk
                d.id.write_direct_chunk((off,), frame, 0)
        elif n:
            d[...] = arr
    for k, v in ARRAY_ATTRS.items():
        d.attrs[k] = v
    return d


def _write_names(group, name, names):
    d = group.create_dataset(name, data=np.asarray(names, dtype=object),
                             dtype=h5py.string_dtype("utf-8"))
    d.attrs["encoding-type"] = "string-array"
    d.attrs["encoding-version"] = "0.2.0"


def write_dataframe(f, name, index, columns=None):
    """Minimal anndata dataframe: string index `_index` plus numeric columns."""
    g = f.create_group(name)
    g.attrs["encoding-type"] = "dataframe"
    g.attrs["encoding-version"] = "0.2.0"
    g.attrs["_index"] = "_index"
    columns = columns or {}
    g.attrs["column-order"] = np.array(list(columns), dtype=object) if columns else \
        np.zeros(0, dtype=h5py.string_dtype("utf-8"))
    _write_names(g, "_index", index)
    for col, values in columns.items():
        write_array(g, col, np.asarray(values))
    return g


# Names of the lies write_iv understands (see its docstring).
LIES = ("major_ptr", "values", "value_ptr", "packed", "attrs", "del_attrs", "skip",
        "chunk_mutator", "packed_dtype")

META_LIMIT = 100_000  # obs/var names are only generated up to this length


def write_iv(path, X, orientation="ivcsr", compression=None, chunk_len=None, group="X",
             shuffle_groups=False, value_dtype=None, obs=None, var=None, rng=None,
             ptr_dtype=np.int64, ptr_chunk_len=None, indices_dtype=None, level=1, mode="w",
             **lies):
    """Writes X (scipy sparse, rows = cells) as an .h5ad with an IVCSR/IVCSC
    group named `group` and returns the packed arrays (dict from pack()).

    group may be a path ("layers/counts", "raw/X"): the groups above it are
    created (tagged as anndata dicts when new).  mode "a" adds the group to
    an existing file and writes nothing else (no obs, var or file attrs).

    obs / var: None = generated names ("cell0", "gene0", ...) when the axis is
    at most META_LIMIT long, else no dataframe; False = no dataframe; a
    sequence of names = that index.

    lies (for bad-file tests), applied after a correct encoding:
      major_ptr, values, value_ptr, packed = replacement arrays;
      attrs = dict of X attrs to set (overrides); del_attrs = attr names to
      drop; skip = dataset names not to write; chunk_mutator(k, frame, raw)
      -> bytes|None rewrites zstd chunks of packed_indices; packed_dtype =
      dtype to store packed_indices in.
    """
    unknown = set(lies) - set(LIES)
    if unknown:
        raise TypeError("unknown lies: %s" % sorted(unknown))
    enc = pack(X, orientation, shuffle_groups, value_dtype, rng)
    arrays = {
        "major_ptr": np.asarray(enc["major_ptr"]).astype(ptr_dtype),
        "values": enc["values"],
        "value_ptr": np.asarray(enc["value_ptr"]).astype(ptr_dtype),
        "packed_indices": enc["packed"],
    }
    for lie, name in (("major_ptr", "major_ptr"), ("values", "values"),
                      ("value_ptr", "value_ptr"), ("packed", "packed_indices")):
        if lie in lies:
            arrays[name] = np.asarray(lies[lie])
    if "packed_dtype" in lies:
        arrays["packed_indices"] = arrays["packed_indices"].astype(lies["packed_dtype"])
    n_rows, n_cols = X.shape
    attrs = {
        "encoding-type": orientation,
        "encoding-version": ENCODING_VERSION,
        "shape": np.array([n_rows, n_cols], dtype=np.int64),
        "indices_dtype": indices_dtype or default_indices_dtype(enc["n_minor"]),
    }
    attrs.update(lies.get("attrs", {}))
    for a in lies.get("del_attrs", ()):
        attrs.pop(a, None)
    skip = set(lies.get("skip", ()))
    if mode not in ("w", "a"):
        raise ValueError("mode must be 'w' or 'a'")
    with h5py.File(path, mode) as f:
        if mode == "w":
            f.attrs["encoding-type"] = "anndata"
            f.attrs["encoding-version"] = "0.1.0"
            for axis, names, n, prefix in (("obs", obs, n_rows, "cell"),
                                           ("var", var, n_cols, "gene")):
                if names is False or (names is None and n > META_LIMIT):
                    continue
                if names is None:
                    names = np.char.add(prefix, np.arange(n).astype(str)).astype(object)
                write_dataframe(f, axis, names)
        _parent_groups(f, group)
        g = f.create_group(group)
        for k, v in attrs.items():
            g.attrs[k] = v
        for name, arr in arrays.items():
            if name in skip:
                continue
            if name == "packed_indices":
                write_array(g, name, arr, compression, chunk_len,
                            lies.get("chunk_mutator"), level)
            else:
                write_array(g, name, arr, compression, ptr_chunk_len, None, level)
    return enc


def _parent_groups(f, path):
    """Creates the groups above path that do not exist yet, as anndata
    dict elements (what anndata writes for `layers` and `raw`)."""
    parts = path.split("/")[:-1]
    for k in range(len(parts)):
        name = "/".join(parts[:k + 1])
        if name not in f:
            g = f.create_group(name)
            g.attrs["encoding-type"] = "dict" if name != "raw" else "raw"
            g.attrs["encoding-version"] = "0.1.0"


def write_plain_sparse(f, path, X, fmt="csr"):
    """Writes X as an anndata csr_matrix / csc_matrix group at path of the
    open h5py file f (the unpacked form a lab's file often holds)."""
    X = sp.csr_matrix(X) if fmt == "csr" else sp.csc_matrix(X)
    _parent_groups(f, path)
    g = f.create_group(path)
    g.attrs["encoding-type"] = fmt + "_matrix"
    g.attrs["encoding-version"] = "0.1.0"
    g.attrs["shape"] = np.array(X.shape, dtype=np.int64)
    write_array(g, "data", X.data)
    write_array(g, "indices", X.indices)
    write_array(g, "indptr", X.indptr)
    return g


def write_with_layers(path, X, orientation="ivcsr", layers=None, raw=None, plain=None,
                      dense=None, **kw):
    """One file holding X and other matrices, as anndata lays them out.

    layers: {name: (matrix, orientation[, value_dtype])} packed into
    layers/NAME; raw: (matrix, orientation[, value_dtype]) packed into
    raw/X (its var frame, raw/var, is the caller's to write: it may have
    more genes than var); plain: {name: matrix} written as csr_matrix
    layers; dense: {name: 2-D array} written as dense layers.  kw goes to
    write_iv for X.  Returns {matrix name: pack() dict} of the packed ones.
    """
    out = {"X": write_iv(path, X, orientation=orientation, **kw)}
    for name, spec in (layers or {}).items():
        m, o = spec[0], spec[1]
        vd = spec[2] if len(spec) > 2 else None
        out["layers/" + name] = write_iv(path, m, orientation=o, group="layers/" + name,
                                         value_dtype=vd, mode="a")
    if raw is not None:
        vd = raw[2] if len(raw) > 2 else None
        out["raw/X"] = write_iv(path, raw[0], orientation=raw[1], group="raw/X", value_dtype=vd,
                                mode="a")
    with h5py.File(path, "a") as f:
        for name, m in (plain or {}).items():
            write_plain_sparse(f, "layers/" + name, m)
        for name, a in (dense or {}).items():
            _parent_groups(f, "layers/" + name)
            write_array(f, "layers/" + name, np.asarray(a))
    return out


# ---------------------------------------------------------------- decoding

def read_array(dset):
    """Reads a 1-D dataset; zstd (32015) chunks are decompressed here because
    Debian's h5py has no plugin for that filter."""
    plist = dset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    if ZSTD_FILTER_ID not in filters:
        return dset[...]
    if filters != [ZSTD_FILTER_ID]:
        raise ValueError("read_array: unsupported filter pipeline %r" % filters)
    import zstandard
    n = dset.shape[0]
    cl = dset.chunks[0]
    out = np.zeros(n, dtype=dset.dtype)
    raw = out.view(np.uint8)
    isz = dset.dtype.itemsize
    dctx = zstandard.ZstdDecompressor()
    for off in range(0, n, cl):
        try:
            mask, frame = dset.id.read_direct_chunk((off,))
        except Exception:
            continue  # chunk never written: fill value 0
        if mask & 1:
            chunk = frame
        else:
            # One frame exactly, as the HDF5 filter's ZSTD_decompress over
            # the whole stored chunk accepts: trailing bytes are an error.
            obj = dctx.decompressobj()
            chunk = obj.decompress(frame)
            if obj.unused_data or not obj.eof:
                raise ValueError("zstd chunk at %d: not exactly one whole frame" % off)
        if len(chunk) != cl * isz:
            raise ValueError("zstd chunk at %d decodes to %d bytes, not %d"
                             % (off, len(chunk), cl * isz))
        take = min(cl, n - off) * isz
        raw[off * isz:off * isz + take] = np.frombuffer(chunk, np.uint8)[:take]
    return out


def unpack(major_ptr, values, value_ptr, packed, n_rows, n_cols, orientation):
    """Inverse of pack(): the canonical CSR (rows = cells), validating the
    arrays the way a careful reader must."""
    major_ptr = np.asarray(major_ptr, dtype=np.int64)
    value_ptr = np.asarray(value_ptr, dtype=np.int64)
    n_major, n_minor = (n_rows, n_cols) if orientation == "ivcsr" else (n_cols, n_rows)
    n_groups = values.shape[0]
    if major_ptr.shape[0] != n_major + 1:
        raise ValueError("major_ptr: length %d, expected %d" % (major_ptr.shape[0], n_major + 1))
    if value_ptr.shape[0] != n_groups + 1:
        raise ValueError("value_ptr: length %d, expected %d" % (value_ptr.shape[0], n_groups + 1))
    if major_ptr[0] != 0 or major_ptr[-1] != n_groups or np.any(np.diff(major_ptr) < 0):
        raise ValueError("major_ptr: not monotone from 0 to n_unique")
    if value_ptr[0] != 0 or np.any(np.diff(value_ptr) <= 0):
        raise ValueError("value_ptr: not strictly increasing from 0")
    d = decode_varints(packed)
    nnz = int(value_ptr[-1])
    if d.shape[0] != nnz:
        raise ValueError("varint count %d != nnz %d" % (d.shape[0], nnz))
    sizes = np.diff(value_ptr)
    gid = np.repeat(np.arange(n_groups), sizes)
    # idx = prev + 1 + d with prev = -1 at each group start: a cumulative sum
    # of (d + 1) restarted at every group.
    steps = d.astype(np.int64) + 1
    cs = np.cumsum(steps)
    base = np.concatenate(([0], cs))[value_ptr[:-1]]
    minor = cs - np.repeat(base, sizes) - 1
    if nnz and minor.max() >= n_minor:
        raise ValueError("index %d >= n_minor %d" % (minor.max(), n_minor))
    gmajor = np.repeat(np.arange(n_major), np.diff(major_ptr))
    major = gmajor[gid]
    data = np.asarray(values)[gid]
    rows, cols = (major, minor) if orientation == "ivcsr" else (minor, major)
    order = np.lexsort((cols, rows))
    rows, cols, data = rows[order], cols[order], data[order]
    if nnz > 1 and np.any((rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])):
        raise ValueError("duplicate (row, col) entry")
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return make_csr(data, cols, indptr, (n_rows, n_cols))


def read_iv(path, group="X"):
    """Pure-Python reader of an IVCSR/IVCSC group: canonical CSR, rows = cells."""
    with h5py.File(path, "r") as f:
        g = f[group]
        enc = g.attrs["encoding-type"]
        enc = enc.decode() if isinstance(enc, bytes) else str(enc)
        ver = g.attrs["encoding-version"]
        ver = ver.decode() if isinstance(ver, bytes) else str(ver)
        if ver != ENCODING_VERSION:
            raise ValueError("encoding-version %r" % ver)
        n_rows, n_cols = (int(x) for x in g.attrs["shape"])
        if g["packed_indices"].dtype != np.uint8:
            raise ValueError("packed_indices: dtype %s, not uint8" % g["packed_indices"].dtype)
        return unpack(read_array(g["major_ptr"]), read_array(g["values"]),
                      read_array(g["value_ptr"]), read_array(g["packed_indices"]),
                      n_rows, n_cols, enc)


# ---------------------------------------------------------------- expected

def make_csr(data, indices, indptr, shape):
    """A csr_matrix that holds exactly these arrays (scipy may otherwise
    change index dtypes); explicit zeros are never dropped by construction."""
    m = sp.csr_matrix(shape, dtype=np.asarray(data).dtype)
    m.data = np.asarray(data)
    m.indices = np.asarray(indices, dtype=np.int32)
    m.indptr = np.asarray(indptr, dtype=np.int64)
    return m


def assert_csr_equal(got, want):
    """got and want hold the same entries, explicit zeros included, compared
    as float64 CSR with sorted indices (a NaN never equals: for matrices
    without NaNs)."""
    import scipy.sparse as sp
    g, w = sp.csr_matrix(got, dtype=np.float64), sp.csr_matrix(want, dtype=np.float64)
    g.sort_indices()
    w.sort_indices()
    assert g.shape == w.shape
    assert np.array_equal(g.indptr, w.indptr)
    assert np.array_equal(g.indices, w.indices)
    assert np.array_equal(g.data, w.data)


def canonical(X):
    """Canonical CSR of X with stored zeros kept and int32/int64 arrays."""
    rows, cols, data = _coo_entries(X)
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=X.shape[0]), out=indptr[1:])
    return make_csr(data, cols, indptr, X.shape)


def resolve(sel, n):
    """A selection (None = all, or a sequence of ints) as an int64 array,
    validated against the axis length n."""
    if sel is None:
        return np.arange(n, dtype=np.int64)
    a = np.asarray(sel, dtype=np.int64).reshape(-1)
    if a.shape[0] and (a.min() < 0 or a.max() >= n):
        raise IndexError("selection out of range")
    return a


def expected(X, obs_sel=None, var_sel=None, value_dtype=None):
    """numpy semantics of X[obs, :][:, var] as canonical CSR (indptr int64,
    indices int32, data in X's dtype or value_dtype), explicit zeros kept.

    Built by hand from the stored entries instead of scipy's fancy indexing
    so that nothing (zeros, duplicates, order) depends on scipy internals.
    """
    rows, cols, data = _coo_entries(X)
    if value_dtype is not None:
        data = data.astype(value_dtype)
    n_rows, n_cols = X.shape
    obs = resolve(obs_sel, n_rows)
    indptr_in = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr_in[1:])
    # Rows: concatenate the entry ranges of the selected rows in order.
    lens = indptr_in[obs + 1] - indptr_in[obs]
    total = int(lens.sum())
    out_row = np.repeat(np.arange(obs.shape[0], dtype=np.int64), lens)
    if total:
        shift = indptr_in[obs] - np.concatenate(([0], np.cumsum(lens)[:-1]))
        src = np.repeat(shift, lens) + np.arange(total, dtype=np.int64)
    else:
        src = np.zeros(0, dtype=np.int64)
    e_cols, e_data = cols[src], data[src]
    if var_sel is None:
        # All genes: no renumbering (and no arange over a huge gene axis).
        indptr = np.zeros(obs.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        return make_csr(e_data, e_cols, indptr, (obs.shape[0], n_cols))
    var = resolve(var_sel, n_cols)
    # Columns: each entry is copied once per position of its column in var.
    vorder = np.argsort(var, kind="stable")
    vsorted = var[vorder]
    lo = np.searchsorted(vsorted, e_cols, "left")
    hi = np.searchsorted(vsorted, e_cols, "right")
    reps = hi - lo
    n_out = int(reps.sum())
    r_row = np.repeat(out_row, reps)
    r_data = np.repeat(e_data, reps)
    within = np.arange(n_out, dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    r_col = vorder[np.repeat(lo, reps) + within] if n_out else np.zeros(0, np.int64)
    order = np.lexsort((r_col, r_row))
    indptr = np.zeros(obs.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(r_row, minlength=obs.shape[0]), out=indptr[1:])
    return make_csr(r_data[order], r_col[order], indptr, (obs.shape[0], var.shape[0]))


# ---------------------------------------------------------------- random inputs

def random_csr(rng, n_rows, n_cols, nnz, dtype=np.int32, nan_frac=0.0, zero_frac=0.0,
               negative=True, empty_row_frac=0.0):
    """A random canonical CSR with nnz unique coordinates and few distinct
    values (so (slice, value) groups of several entries form).

    Floats are multiples of 0.5 (never -0.0), optionally with NaNs; ints are
    small, negative when the dtype and `negative` allow; zero_frac of the
    entries become explicit stored zeros; empty_row_frac of the rows are
    kept empty."""
    allowed = np.ones(n_rows, dtype=bool)
    if empty_row_frac and n_rows:
        allowed = rng.random(n_rows) >= empty_row_frac
    cand_rows = np.flatnonzero(allowed)
    space = cand_rows.shape[0] * n_cols
    nnz = int(min(nnz, space))
    if nnz:
        flat = rng.choice(space, size=nnz, replace=False) if space < 4 * nnz + 1000 \
            else np.unique(rng.integers(0, space, nnz + nnz // 8 + 8))[:nnz]
        rng.shuffle(flat)
        flat = flat[:nnz]
        nnz = flat.shape[0]
        r, cols = np.divmod(flat.astype(np.int64), n_cols)
        rows = cand_rows[r]
    else:
        rows = cols = np.zeros(0, dtype=np.int64)
    dt = np.dtype(dtype)
    lo = -5 if (negative and dt.kind != "u") else 1
    if dt.kind == "f":
        data = (rng.integers(2 * lo, 12, nnz) * 0.5).astype(dt)
        data[data == 0] = 1
        if nan_frac:
            data[rng.random(nnz) < nan_frac] = np.nan
    else:
        data = rng.integers(lo, 9, nnz).astype(dt)
        data[data == 0] = 1
        if nnz:  # the dtype's extremes must survive too
            data[rng.integers(0, nnz)] = np.iinfo(dt).max
            if dt.kind == "i" and negative:
                data[rng.integers(0, nnz)] = np.iinfo(dt).min
    if zero_frac:
        data[rng.random(nnz) < zero_frac] = 0
    order = np.lexsort((cols, rows))
    indptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return make_csr(data[order], cols[order], indptr, (n_rows, n_cols))


def random_selection(rng, n, max_len=60):
    """One selection of an axis of length n in numpy form (None = all):
    empty, one element, all (implicit and explicit), ranges, reversed,
    sorted subsets, unsorted with duplicates, and mixtures of those."""
    if n == 0:
        return None if rng.random() < 0.5 else []
    kind = int(rng.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1:
        return []
    if kind == 2:
        return [int(rng.integers(0, n))]
    if kind == 3:
        return list(range(n)) if n <= 100_000 else None
    a = int(rng.integers(0, n))
    b = int(rng.integers(a, min(n, a + 4 * max_len) + 1))
    if kind == 4:
        return list(range(a, b))
    if kind == 5:
        return list(range(b - 1, a - 1, -1))
    if kind == 6:
        return sorted(set(rng.integers(0, n, int(rng.integers(1, max_len + 1))).tolist()))
    if kind == 7:
        return rng.integers(0, n, int(rng.integers(1, max_len + 1))).tolist()
    sel = []
    for _ in range(int(rng.integers(1, 5))):
        if rng.random() < 0.5:
            c = int(rng.integers(0, n))
            sel += list(range(c, min(n, c + int(rng.integers(1, 20)))))
        else:
            sel += rng.integers(0, n, int(rng.integers(1, 6))).tolist()
    return sel


# ---------------------------------------------------------------- CLI helpers

def format_sel(sel):
    """Command-line form of a selection: None -> None (flag absent), else
    comma-separated indices with runs of consecutive ascending indices
    written as half-open ranges a:b."""
    if sel is None:
        return None
    a = [int(x) for x in sel]
    parts = []
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[j + 1] == a[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append("%d:%d" % (a[i], a[j] + 1))
        else:
            parts.extend(str(x) for x in a[i:j + 1])
        i = j + 1
    return ",".join(parts)


def batch_field(sel):
    """One side of a --batch line: `*` for all, else format_sel (may be '')."""
    return "*" if sel is None else format_sel(sel)


def load_npz_raw(path):
    """The arrays of a save_npz-style CSR file exactly as stored."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def compare_npz(path, exp, data_dtype=None):
    """Returns None when the .npz at path holds exactly exp (a CSR from
    expected(): same format, shape, dtypes, indptr, indices and data bytes,
    so NaN positions and payloads must match too), else a description.

    data_dtype: the dtype the file must store when it differs from exp's
    (the fixtures' expected matrices are float64); the stored data is then
    cast to exp's dtype before the byte comparison."""
    z = load_npz_raw(path)
    want_dtype = np.dtype(data_dtype) if data_dtype is not None else exp.data.dtype
    for key in ("format", "shape", "data", "indices", "indptr"):
        if key not in z:
            return "missing array %r (has %s)" % (key, sorted(z))
    fmt = z["format"].item()
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt != "csr":
        return "format %r" % fmt
    if tuple(int(x) for x in z["shape"]) != tuple(exp.shape):
        return "shape %s != %s" % (tuple(z["shape"]), exp.shape)
    for key, want in (("indptr", np.dtype(np.int64)), ("indices", np.dtype(np.int32)),
                      ("data", want_dtype)):
        got = z[key].dtype
        if got.newbyteorder("=") != want.newbyteorder("=") or got.kind != want.kind:
            return "%s dtype %s != %s" % (key, got, want)
    if not np.array_equal(z["indptr"], exp.indptr):
        return "indptr differs (first at %d)" % _first_diff(z["indptr"], exp.indptr)
    if not np.array_equal(z["indices"], exp.indices):
        return "indices differ (first at %d)" % _first_diff(z["indices"], exp.indices)
    a = np.ascontiguousarray(z["data"]).astype(exp.data.dtype, copy=False)
    if a.shape != exp.data.shape or a.tobytes() != np.ascontiguousarray(exp.data).tobytes():
        return "data differs (first at %d)" % _first_diff(a.view(np.uint8), exp.data.view(np.uint8))
    return None


def _first_diff(a, b):
    n = min(a.shape[0], b.shape[0])
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if d.shape[0] else n
