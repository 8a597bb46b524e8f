"""Deliberately broken files must be refused cleanly.

Every case starts from a valid file written by ivref.write_iv and tells one
lie (a corrupt zstd chunk, a stream with a varint too many or too few,
pointers going backwards or past the end, wrong lengths or attrs, missing
datasets...).  `ivserve check` and `ivserve export` must both exit with
status exactly 1 (a crash by signal shows as a negative status), print an
`ivserve: error:` line naming the file, and name the failed check with a
keyword.  The unmodified base file must pass, so each failure is the lie's.
"""

import os

import numpy as np
import pytest

import ivref

N_ROWS, N_COLS = 40, 60


def base_matrix():
    rng = np.random.default_rng(99)
    return ivref.random_csr(rng, N_ROWS, N_COLS, 700, np.int32, empty_row_frac=0.1)


BASE_OPTS = dict(compression="zstd", chunk_len=64)


def enc():
    return ivref.pack(base_matrix())


def last_varint_start(packed):
    ends = np.flatnonzero(packed < 0x80)
    return int(ends[-2]) + 1 if ends.shape[0] > 1 else 0


# --- zstd chunk mutators: (k, frame, raw) -> stored bytes

def truncate_chunk(k, frame, raw):
    return frame[:len(frame) // 2] if k == 1 else frame


def flip_bit_checksummed(k, frame, raw):
    # With a content checksum any flipped payload bit is detected, so the
    # outcome does not depend on where the flip lands.
    if k != 2:
        return frame
    import zstandard
    f = bytearray(zstandard.ZstdCompressor(level=1, write_checksum=True,
                                           write_content_size=True).compress(raw))
    f[len(f) // 2] ^= 0x10
    return bytes(f)


def flip_magic(k, frame, raw):
    return bytes([frame[0] ^ 0x01]) + frame[1:] if k == 0 else frame


def short_content(k, frame, raw):
    # A well-formed frame that decodes to fewer bytes than the chunk holds.
    import zstandard
    return zstandard.ZstdCompressor(level=1).compress(raw[:-5]) if k == 1 else frame


def long_content(k, frame, raw):
    import zstandard
    return zstandard.ZstdCompressor(level=1).compress(raw + b"\x00" * 9) if k == 1 else frame


def trailing_garbage(k, frame, raw):
    return frame + b"\x13\x37\x00\xff" if k == 0 else frame


def missing_length_frame(k, frame, raw):
    # A frame without content size that decompresses to too many bytes.
    import zstandard
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=False)
    return cctx.compress(raw * 3) if k == 0 else frame


def lie_packed(fn):
    e = enc()
    return {"packed": fn(e["packed"].copy(), e)}


def one_too_many(p, e):
    return np.append(p, np.uint8(0))


def one_too_few(p, e):
    return p[:last_varint_start(p)]


def unterminated(p, e):
    p[-1] |= 0x80
    return p


def index_past_end(p, e):
    # Replace the last varint with a delta that lands past n_minor.
    return np.concatenate((p[:last_varint_start(p)],
                           ivref.encode_varints(np.array([N_COLS + 3], np.uint64))))


def huge_varint(p, e):
    # An 11-byte varint cannot be a 64-bit value.
    return np.concatenate((p[:last_varint_start(p)],
                           np.array([0xFF] * 10 + [0x01], np.uint8)))


def major_backwards():
    m = enc()["major_ptr"].copy()
    i = int(np.flatnonzero(np.diff(m) > 1)[0]) + 1
    m[i] = m[i + 1] + 1
    return {"major_ptr": m}


def value_backwards():
    v = enc()["value_ptr"].copy()
    v[5], v[6] = v[6], v[5]
    return {"value_ptr": v}


def with_array(name, fn):
    e = enc()
    return {name: fn(e[name].copy())}


# name: (lies for write_iv, keywords the error must contain (a tuple: any one
# of its alternatives; matched without the file's name), extra write_iv
# options).  The keywords follow the engine's messages: they name the
# dataset or attribute and the failed check.
CASES = {
    "zstd_truncated_chunk": (dict(chunk_mutator=truncate_chunk), ["chunk", ("zstd", "corrupt")],
                             BASE_OPTS),
    "zstd_bit_flip": (dict(chunk_mutator=flip_bit_checksummed),
                      ["chunk", ("checksum", "corrupt")], BASE_OPTS),
    "zstd_bad_magic": (dict(chunk_mutator=flip_magic), ["chunk", ("zstd", "corrupt")], BASE_OPTS),
    "zstd_chunk_decodes_short": (dict(chunk_mutator=short_content), ["chunk", ("size", "bytes")],
                                 BASE_OPTS),
    "zstd_chunk_decodes_long": (dict(chunk_mutator=long_content),
                                ["chunk", ("size", "capacity", "decodes to")], BASE_OPTS),
    "zstd_chunk_trailing_garbage": (dict(chunk_mutator=trailing_garbage),
                                    ["chunk", ("zstd", "corrupt")], BASE_OPTS),
    "zstd_chunk_no_size_too_long": (dict(chunk_mutator=missing_length_frame),
                                    ["chunk", ("size", "capacity")], BASE_OPTS),
    "varint_one_too_many": (lambda: lie_packed(one_too_many), ["varint"], {}),
    "varint_one_too_few": (lambda: lie_packed(one_too_few), ["varint"], {}),
    "varint_unterminated": (lambda: lie_packed(unterminated), ["varint"], {}),
    "varint_too_long": (lambda: lie_packed(huge_varint), ["varint"], {}),
    "index_ge_n_minor": (lambda: lie_packed(index_past_end), ["index", "n_minor"], {}),
    "varint_one_too_many_zstd": (lambda: lie_packed(one_too_many), ["varint"], BASE_OPTS),
    "varint_unterminated_zstd": (lambda: lie_packed(unterminated), ["varint"], BASE_OPTS),
    "major_ptr_backwards": (major_backwards, ["major_ptr", "backwards"], {}),
    "major_ptr_past_end": (lambda: with_array("major_ptr", lambda m: np.append(m[:-1], m[-1] + 7)),
                           ["major_ptr"], {}),
    "major_ptr_not_from_zero": (lambda: with_array("major_ptr", lambda m: m + 1),
                                ["major_ptr"], {}),
    "major_ptr_short": (lambda: with_array("major_ptr", lambda m: m[:-1]), ["major_ptr"], {}),
    "major_ptr_negative": (lambda: with_array("major_ptr",
                                              lambda m: np.where(np.arange(m.size) == 3, -5, m)),
                           ["major_ptr"], {}),
    "value_ptr_backwards": (value_backwards, ["value_ptr", "backwards"], {}),
    "value_ptr_past_end": (lambda: with_array("value_ptr", lambda v: np.append(v[:-1], v[-1] + 10)),
                           ["value_ptr"], {}),
    "value_ptr_short": (lambda: with_array("value_ptr", lambda v: v[:-1]),
                        ["value_ptr", "values"], {}),
    "values_long": (lambda: with_array("values", lambda v: np.append(v, v[:1])),
                    ["value_ptr", "values"], {}),
    "major_ptr_float": (lambda: with_array("major_ptr", lambda m: m.astype(np.float64)),
                        ["major_ptr", "integer"], {}),
    "value_ptr_float": (lambda: with_array("value_ptr", lambda v: v.astype(np.float32)),
                        ["value_ptr", "integer"], {}),
    "value_ptr_ptr_dtype_zstd": (lambda: with_array("value_ptr", lambda v: v[:-2]),
                                 ["value_ptr", "values"], BASE_OPTS),
    "encoding_version": (dict(attrs={"encoding-version": "0.2.0"}), ["encoding-version"], {}),
    "encoding_type": (dict(attrs={"encoding-type": "ivcsx"}), ["encoding-type"], {}),
    "no_encoding_version": (dict(del_attrs=["encoding-version"]), ["encoding-version"], {}),
    "no_encoding_type": (dict(del_attrs=["encoding-type"]), ["encoding-type"], {}),
    "no_shape": (dict(del_attrs=["shape"]), ["shape"], {}),
    "shape_three_dims": (dict(attrs={"shape": np.array([N_ROWS, N_COLS, 1])}), ["shape"], {}),
    "shape_negative": (dict(attrs={"shape": np.array([-N_ROWS, N_COLS])}), ["shape"], {}),
    "shape_rows_disagree": (dict(attrs={"shape": np.array([N_ROWS + 1, N_COLS])}),
                            ["major_ptr"], {}),
    "shape_cols_too_few": (dict(attrs={"shape": np.array([N_ROWS, 5])}),
                           ["minor"], {}),
    "no_packed_indices": (dict(skip=["packed_indices"]), ["packed_indices", "missing"], {}),
    "no_values": (dict(skip=["values"]), ["values", "missing"], {}),
    "no_value_ptr": (dict(skip=["value_ptr"]), ["value_ptr", "missing"], {}),
    "no_major_ptr": (dict(skip=["major_ptr"]), ["major_ptr", "missing"], {}),
    "packed_not_uint8": (dict(packed_dtype=np.int32), ["packed_indices", "uint8"], {}),
    "values_strings": (lambda: {"values": np.array([b"x"] * enc()["values"].shape[0])},
                       ["values", "type"], {}),
}


def write_case(workdir, name):
    lies, _, opts = CASES[name]
    if callable(lies):
        lies = lies()
    path = os.path.join(workdir, name + ".h5ad")
    ivref.write_iv(path, base_matrix(), **opts, **lies)
    return path


def test_base_file_is_valid(ivserve, workdir):
    for opts in ({}, BASE_OPTS):
        path = os.path.join(workdir, "base.h5ad")
        ivref.write_iv(path, base_matrix(), **opts)
        assert np.array_equal(ivref.read_iv(path).toarray(), base_matrix().toarray())
        ivserve.assert_ok(ivserve.check(path))
        out = os.path.join(workdir, "base.npz")
        ivserve.assert_ok(ivserve.export(path, out))
        assert ivref.compare_npz(out, ivref.expected(base_matrix())) is None


def test_reference_reader_refuses_the_stream_lies(workdir):
    # The lies are real: the independent reader refuses the ones it checks.
    for name in ("varint_one_too_many", "varint_one_too_few", "varint_unterminated",
                 "index_ge_n_minor", "major_ptr_backwards", "value_ptr_backwards",
                 "value_ptr_short", "zstd_truncated_chunk", "zstd_chunk_decodes_short"):
        path = write_case(workdir, name)
        with pytest.raises(Exception):
            ivref.read_iv(path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_refused(ivserve, workdir, name):
    path = write_case(workdir, name)
    keywords = CASES[name][1]
    ivserve.assert_error(ivserve.check(path, timeout=60), path, *keywords)
    out = os.path.join(workdir, "out.npz")
    ivserve.assert_error(ivserve.export(path, out, timeout=60), path, *keywords)


def test_not_hdf5_and_truncated_files(ivserve, workdir):
    good = os.path.join(workdir, "good.h5ad")
    ivref.write_iv(good, base_matrix(), **BASE_OPTS)
    blob = open(good, "rb").read()
    cases = {"empty.h5ad": b"", "text.h5ad": b"this is not an HDF5 file\n" * 100,
             "half.h5ad": blob[:len(blob) // 2], "head.h5ad": blob[:600]}
    for fname, data in cases.items():
        path = os.path.join(workdir, fname)
        with open(path, "wb") as fh:
            fh.write(data)
        ivserve.assert_error(ivserve.check(path, timeout=60), path)
        ivserve.assert_error(ivserve.export(path, os.path.join(workdir, "o.npz"), timeout=60), path)
    missing = os.path.join(workdir, "does_not_exist.h5ad")
    ivserve.assert_error(ivserve.check(missing), missing)


def test_missing_group(ivserve, workdir):
    path = os.path.join(workdir, "grp.h5ad")
    ivref.write_iv(path, base_matrix(), group="counts")
    ivserve.assert_ok(ivserve.check(path, "--group", "counts"))
    ivserve.assert_error(ivserve.check(path), path, "group", "'X'")
    ivserve.assert_error(ivserve.check(path, "--group", "nosuchgroup"), path,
                         "group", "nosuchgroup")


def test_column_stored_in_two_groups(ivserve, workdir):
    # Row 0 holds column 5 in both its value groups.  Every count and index
    # is in range, but the start-up pass finds the repeat and refuses the
    # file, naming the slice (the decode paths refuse such a row too, as a
    # second line: test_transpose, fuzz_index).
    import scipy.sparse as sp
    X = sp.csr_matrix((np.array([1, 1, 2, 3], np.int32),
                       np.array([2, 5, 7, 0]), np.array([0, 3, 4])), shape=(2, 10))
    e = ivref.pack(X)
    assert list(e["packed"]) == [2, 2, 7, 0]
    path = os.path.join(workdir, "twice.h5ad")
    ivref.write_iv(path, X, packed=np.array([2, 2, 5, 0], np.uint8))
    ivserve.assert_error(ivserve.check(path), path, "slice 0 stores minor index 5 twice")
    out = os.path.join(workdir, "twice.npz")
    for obs, var in ((None, None), ("0", None), ("1,0", "0:10"), ("0", "5,2"), ("1", None)):
        ivserve.assert_error(ivserve.export(path, out, obs=obs, var=var), path, "twice")


def test_group_past_n_minor_only_across_chunks(ivserve, workdir):
    """A value group of 30 one-byte varints of delta 3 in a 100-column file,
    in 8-byte chunks: its last index is 119, but its parts hold 32, 32, 32
    and 24 of that sum, and it stays inside n_minor without its first part.
    Only joining every part across chunks finds the lie; the same group
    with delta 2 (last index 89) is accepted."""
    import scipy.sparse as sp
    for deltas, ok in ((3, False), (2, True)):
        X = sp.csr_matrix((np.ones(30, np.float32), np.arange(30), [0, 30]), shape=(1, 100))
        packed = np.full(30, deltas, np.uint8)
        path = os.path.join(workdir, "spanning_group_%d.h5ad" % deltas)
        ivref.write_iv(path, X, compression="zstd", chunk_len=8, packed=packed)
        if ok:
            ivserve.assert_ok(ivserve.check(path))
        else:
            ivserve.assert_error(ivserve.check(path), path, "group", "n_minor")
