"""Incremental reader of the binary result stream (application/vnd.ivserve.csr).

The stream is read from the HTTP response as it arrives, one frame at a
time, so that a caller iterating over blocks holds one block (at most
64 Ki rows / 256 Ki stored values on the server's side) plus the socket's
buffers, whatever the size of the whole result.  Every length read from
the stream is checked before any buffer is allocated for it: a block's
rows against the rows the header announced, its values against its rows
times the header's columns, and its bytes against max_frame_bytes (the
server's blocks are a few MB; a block of one row, the largest it sends
past 256 Ki values, holds one value per selected gene, tens of MB for the
few million genes an 8 MiB request can list).  What passes is still read in pieces of
READ_PIECE bytes, so that a frame that lies about its size within those
bounds, then stops, costs no more memory than the bytes that did arrive
plus one piece.  A damaged or hostile stream is an IvserveError
("bad_stream", or "truncated" for a cut one), never a huge allocation,
an OverflowError or an array that reads past its bytes.

    header  40 B: "IVQS" | u32 version | i64 rows | i64 cols | char[8] value dtype | char[8] index dtype
    block:  u32 1 | u32 0 | i64 n_rows | i64 nnz | i64 obs[n_rows] | i64 indptr[n_rows+1] | indices[nnz] | values[nnz]
    trailer: u32 2 | u32 status | i64 rows | i64 nnz | u32 len | JSON error (len bytes)
"""
import json
import struct
from collections import namedtuple

import numpy as np
import scipy.sparse as sp

from .errors import IvserveError

MEDIA_TYPE = "application/vnd.ivserve.csr"

_HEADER = struct.Struct("<4sIqq8s8s")
_FRAME = struct.Struct("<IIqq")
_VALUE_DTYPES = {"|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f4", "<f8"}
_INDEX_DTYPES = {"<i4", "<i8"}

# A trailer's message is a short JSON object; anything longer is damage.
_MAX_MESSAGE = 1 << 20
# The most one block frame may hold (ids, pointers, indices and values).
MAX_FRAME_BYTES = 1 << 31
# Reads longer than this go in pieces of this size (see the module's comment).
READ_PIECE = 1 << 20

Header = namedtuple("Header", "rows cols dtype index_dtype")

Block = namedtuple("Block", "obs X")
Block.__doc__ = """One block of a result as it arrived.

obs: int64 array, the dataset row (cell) index of each row of X.
X: scipy.sparse.csr_matrix of n_rows x (selected genes), in the stream's
value dtype, its indices as int32 (int64 past 2**31 - 1 columns)."""


def _bad(message):
    return IvserveError(None, "bad_stream", message)


class _Source:
    """Exact-length reads from a file-like object with readinto or read."""

    def __init__(self, raw):
        self.raw = raw
        self.bytes_read = 0

    def read_into(self, view):
        pos, n = 0, len(view)
        readinto = getattr(self.raw, "readinto", None)
        while pos < n:
            if readinto is not None:
                k = readinto(view[pos:])
            else:
                chunk = self.raw.read(n - pos)
                k = len(chunk) if chunk else 0
                view[pos:pos + k] = chunk
            if not k:
                return pos
            pos += k
        self.bytes_read += n
        return n

    def read(self, n, what):
        """Exactly n bytes (a bytearray), or IvserveError "truncated".
        Past READ_PIECE the bytes are read into pieces of that size and
        joined once all arrived, so a stream cut early has cost only what
        it sent plus one piece."""
        if n <= READ_PIECE:
            buf = bytearray(n)
            got = self.read_into(memoryview(buf))
            if got != n:
                self._cut(what, got, n)
            return buf
        pieces, got = [], 0
        while got < n:
            piece = bytearray(min(READ_PIECE, n - got))
            k = self.read_into(memoryview(piece))
            got += k
            if k != len(piece):
                del pieces, piece
                self._cut(what, got, n)
            pieces.append(piece)
        return bytearray().join(pieces)

    @staticmethod
    def _cut(what, got, n):
        raise IvserveError(None, "truncated",
                           f"the result stream was cut inside the {what} "
                           f"({got} of {n} bytes; no trailer)")

    def array(self, dtype, count, what):
        buf = self.read(int(count) * dtype.itemsize, what)
        return np.frombuffer(buf, dtype=dtype, count=int(count))


def _dtype(raw, allowed, what):
    name = raw.rstrip(b"\0").decode("ascii", "replace")
    if name not in allowed:
        raise _bad(f"unknown {what} dtype {name!r} in the stream header")
    return np.dtype(name)


class StreamReader:
    """Reads one binary result stream: header(), then blocks() until the
    trailer, which raises IvserveError when it reports a failure."""

    def __init__(self, raw, max_frame_bytes=MAX_FRAME_BYTES):
        self.src = _Source(raw)
        self.max_frame_bytes = max_frame_bytes
        self.header = None
        self.rows_seen = 0
        self.nnz_seen = 0

    def read_header(self):
        raw = self.src.read(_HEADER.size, "header")
        magic, version, rows, cols, vdt, idt = _HEADER.unpack(raw)
        if magic != b"IVQS":
            raise _bad("not an ivserve binary stream (no IVQS magic)")
        if version != 1:
            raise _bad(f"stream version {version} is not supported by this client (1)")
        if rows < 0 or cols < 0:
            raise _bad(f"negative shape {rows} x {cols} in the stream header")
        self.header = Header(rows, cols, _dtype(vdt, _VALUE_DTYPES, "value"),
                             _dtype(idt, _INDEX_DTYPES, "index"))
        return self.header

    def blocks(self):
        """Yields Block tuples as they arrive; returns after an ok trailer."""
        h = self.header or self.read_header()
        # scipy keeps int32 indices when they fit, as it builds matrices itself.
        it = np.int32 if h.cols <= np.iinfo(np.int32).max else np.int64
        while True:
            kind, status, n, nnz = _FRAME.unpack(self.src.read(_FRAME.size, "frame header"))
            if kind == 2:
                self._trailer(status, n, nnz)
                return
            if kind != 1:
                raise _bad(f"unknown frame kind {kind}")
            if n < 0 or nnz < 0 or n > h.rows - self.rows_seen:
                raise _bad(f"a block of {n} rows and {nnz} values does not fit the "
                           f"{h.rows} rows announced ({self.rows_seen} seen)")
            if nnz > n * h.cols:
                raise _bad(f"a block of {n} rows declares {nnz} values, more than its rows "
                           f"times the {h.cols} columns announced")
            size = 16 * n + 8 + nnz * (h.index_dtype.itemsize + h.dtype.itemsize)
            if size > self.max_frame_bytes:
                raise _bad(f"a block of {n} rows and {nnz} values takes {size} bytes, more "
                           f"than the {self.max_frame_bytes} a frame may hold (max_frame_bytes)")
            obs = self.src.array(np.dtype("<i8"), n, "block")
            indptr = self.src.array(np.dtype("<i8"), n + 1, "block")
            if indptr[0] != 0 or indptr[-1] != nnz or (n and np.any(np.diff(indptr) < 0)):
                raise _bad("a block's row pointers are not monotone from 0 to its nnz")
            if n and int(np.diff(indptr).max()) > h.cols:
                raise _bad("a block's row holds more values than the result has columns")
            indices = self.src.array(h.index_dtype, nnz, "block")
            values = self.src.array(h.dtype, nnz, "block")
            if nnz and (int(indices.min()) < 0 or int(indices.max()) >= h.cols):
                raise _bad("a block's column index is outside the result's columns")
            self.rows_seen += n
            self.nnz_seen += nnz
            bit = it if nnz <= np.iinfo(np.int32).max else np.int64
            X = sp.csr_matrix((values, indices.astype(bit, copy=False), indptr.astype(bit)),
                              shape=(n, h.cols))
            yield Block(obs.astype(np.int64, copy=False), X)

    def _trailer(self, status, rows, nnz):
        (length,) = struct.unpack("<I", self.src.read(4, "trailer"))
        if length > _MAX_MESSAGE:
            raise _bad(f"trailer message of {length} bytes")
        body = bytes(self.src.read(length, "trailer")) if length else b""
        if status != 0:
            code, message = "stream_error", body.decode("utf-8", "replace")
            try:
                err = json.loads(body)["error"]
                code, message = err.get("code", code), err.get("message", message)
            except (ValueError, KeyError, TypeError):
                pass
            raise IvserveError(status, code, message)
        if rows != self.rows_seen or nnz != self.nnz_seen or rows != self.header.rows:
            raise _bad(f"the trailer counts {rows} rows and {nnz} values; the stream "
                       f"carried {self.rows_seen} and {self.nnz_seen} "
                       f"of {self.header.rows} announced")


def assemble(header, blocks):
    """One csr_matrix and the obs positions from a list of Blocks."""
    rows, cols = header.rows, header.cols
    if not blocks:
        return (sp.csr_matrix((rows, cols), dtype=header.dtype), np.zeros(0, np.int64))
    nnz = sum(b.X.nnz for b in blocks)
    big = nnz > np.iinfo(np.int32).max or cols > np.iinfo(np.int32).max
    it = np.int64 if big else np.int32
    indptr = np.empty(rows + 1, dtype=it)
    indptr[0] = 0
    indices = np.empty(nnz, dtype=it)
    data = np.empty(nnz, dtype=header.dtype)
    obs = np.empty(rows, dtype=np.int64)
    r = v = 0
    for b in blocks:
        n, k = b.X.shape[0], b.X.nnz
        obs[r:r + n] = b.obs
        indptr[r + 1:r + n + 1] = b.X.indptr[1:] + v
        indices[v:v + k] = b.X.indices
        data[v:v + k] = b.X.data
        r += n
        v += k
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols)), obs
