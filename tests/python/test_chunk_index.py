"""The chunk table of packed_indices, read from the file's B-tree in one
walk (core/h5/h5chunks.c) instead of one HDF5 lookup a chunk, which HDF5 1.10
answers by walking the index from its start (a 191,000-chunk file took
over 5 minutes to open).

- A packed file of thousands of small chunks (a B-tree of two levels)
  loads through the walk and exports exactly the input.
- The same matrix rewritten by h5py in three file-format versions: the
  earliest (version 1 object headers, what h5py and our writer make by
  default), 1.8 (version 2 object headers, "OHDR", with the same B-tree)
  and the latest (a chunk index of another kind, read through HDF5's
  lookups), the first two also after a user block: `check` names the way
  the table was read, and every one exports the same matrix.
- A damaged leaf (a chunk listed twice, a chunk off its boundary) is a
  clean error naming the chunk index, never a wrong matrix.
"""

import struct

import h5py
import numpy as np
import scipy.sparse as sp

import ivref

SHAPE = (2000, 300)


def matrix():
    rng = np.random.default_rng(21)
    return ivref.random_csr(rng, SHAPE[0], SHAPE[1], 120_000, np.float32)


def write_csr(path, X):
    with h5py.File(path, "w") as f:
        ivref.write_plain_sparse(f, "X", X)


def packed(ivserve, tmp_path, X, chunk_bytes=64):
    src, out = str(tmp_path / "csr.h5ad"), str(tmp_path / "packed.h5ad")
    write_csr(src, X)
    ivserve.assert_ok(ivserve.run("pack", src, out, "--chunk-bytes", chunk_bytes, "--threads", 2))
    return out


def check_lines(ivserve, path):
    proc = ivserve.check(path)
    ivserve.assert_ok(proc)
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)


def exported(ivserve, path, tmp_path, name):
    out = str(tmp_path / (name + ".h5ad"))
    ivserve.assert_ok(ivserve.export(path, out))
    with h5py.File(out, "r") as f:
        g = f["X"]
        return sp.csr_matrix((g["data"][()], g["indices"][()], g["indptr"][()]),
                             shape=tuple(g.attrs["shape"]))


def assert_same(got, want):
    got, want = ivref.canonical(got), ivref.canonical(want)
    assert got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data.view(np.uint32), want.data.view(np.uint32))


def rewrite(src, dst, libver, userblock=0):
    """src's X again, chunk for chunk (the stored bytes copied as they are),
    in a file of format version libver, after a user block of that many
    bytes (HDF5's addresses then count from its end)."""
    with h5py.File(src, "r") as f, \
            h5py.File(dst, "w", libver=libver, userblock_size=userblock) as o:
        for k, v in f.attrs.items():
            o.attrs[k] = v
        g, h = f["X"], o.create_group("X")
        for k, v in g.attrs.items():
            h.attrs[k] = v
        for name, d in g.items():
            pl = d.id.get_create_plist()
            fid, _, opts, _ = pl.get_filter(0)
            e = h.create_dataset(name, shape=d.shape, dtype=d.dtype, chunks=d.chunks,
                                 maxshape=(None,), compression=fid, compression_opts=tuple(opts),
                                 allow_unknown_filter=True)
            for k, v in d.attrs.items():
                e.attrs[k] = v
            for i in range(d.id.get_num_chunks()):
                info = d.id.get_chunk_info(i)
                mask, data = d.id.read_direct_chunk(info.chunk_offset)
                e.id.write_direct_chunk(info.chunk_offset, data, mask)


def test_many_chunks_load_through_one_walk(ivserve, tmp_path):
    X = matrix()
    path = packed(ivserve, tmp_path, X)
    info = check_lines(ivserve, path)
    n_chunks = int(info["layout"].split(", ")[1].split()[0])
    assert n_chunks > 2000, info["layout"]  # leaves of 64 entries: a two-level tree
    assert info["chunk index"] == "B-tree, read in one walk"
    with h5py.File(path, "r") as f:  # every chunk's stored size, as HDF5 says
        d = f["X/packed_indices"].id
        stored = sum(d.get_chunk_info(i).size for i in range(d.get_num_chunks()))
    assert info["stream size"].endswith("(%d stored)" % stored), info["stream size"]
    assert_same(exported(ivserve, path, tmp_path, "e"), X)


def test_every_header_version_gives_the_same_matrix(ivserve, tmp_path):
    X = matrix()
    src = packed(ivserve, tmp_path, X, chunk_bytes=256)
    ways = [("earliest", 0, "B-tree, read in one walk"), ("earliest", 1024, "B-tree, read in one walk"),
            ("v108", 0, "B-tree, read in one walk"), ("v108", 512, "B-tree, read in one walk"),
            ("latest", 0, "HDF5 lookups, one a chunk")]
    for libver, userblock, way in ways:
        name = "v_%s_%d" % (libver, userblock)
        path = str(tmp_path / (name + ".h5ad"))
        rewrite(src, path, libver, userblock)
        head = open(path, "rb").read()
        if libver != "earliest":
            assert b"OHDR" in head  # version 2 object headers are what the walk must read
        assert check_lines(ivserve, path)["chunk index"] == way, name
        assert_same(exported(ivserve, path, tmp_path, name + "_out"), X)


def leaf_of(blob, chunk_addr):
    """File offset of the B-tree leaf (TREE, type 1, level 0) whose children
    include chunk_addr; keys of 24 bytes (size, mask, two offsets)."""
    i = blob.find(b"TREE\x01\x00")
    while i >= 0:
        n = struct.unpack_from("<H", blob, i + 6)[0]
        for k in range(n):
            if struct.unpack_from("<Q", blob, i + 24 + k * 32 + 24)[0] == chunk_addr:
                return i, n
        i = blob.find(b"TREE\x01\x00", i + 1)
    raise AssertionError("no leaf holds the chunk")


def test_damaged_leaf_is_a_clear_error(ivserve, tmp_path):
    X = matrix()
    path = packed(ivserve, tmp_path, X, chunk_bytes=256)
    with h5py.File(path, "r") as f:
        d = f["X/packed_indices"]
        chunk_len = d.chunks[0]
        first = d.id.get_chunk_info(0).byte_offset
    blob = open(path, "rb").read()
    leaf, n = leaf_of(blob, first)
    assert n >= 3
    key = lambda k: leaf + 24 + k * 32  # noqa: E731
    off1 = struct.unpack_from("<Q", blob, key(1) + 8)[0]
    cases = {
        "twice": (key(2) + 8, struct.pack("<Q", off1), "twice"),
        "boundary": (key(1) + 8, struct.pack("<Q", off1 + 1), "boundary"),
        "signature": (leaf, b"TREX", "chunk index"),
    }
    for name, (at, patch, word) in cases.items():
        bad = bytearray(blob)
        bad[at:at + len(patch)] = patch
        p = str(tmp_path / ("bad_%s.h5ad" % name))
        open(p, "wb").write(bytes(bad))
        ivserve.assert_error(ivserve.check(p), p, "chunk index", word)
    assert chunk_len == 256
