// Readers of ivserve's binary answers and a writer of scipy's .npz, all
// over ArrayBuffers.  Every length is checked against the buffer before
// it is read, so a cut or wrong answer is an Error, never a wrong picture.
//
//   IVQS  the query stream (server/README-server.md): a 40-byte header,
//         blocks of CSR rows, a trailer with a status.
//   IVAR  a dense array (obsm rows): a 40-byte header, optional row ids,
//         then the values row-major.

const DTYPES = {
  '<f4': [Float32Array, 4], '<f8': [Float64Array, 8], '<i1': [Int8Array, 1], '|i1': [Int8Array, 1],
  '<u1': [Uint8Array, 1], '|u1': [Uint8Array, 1], '<i2': [Int16Array, 2], '<u2': [Uint16Array, 2],
  '<i4': [Int32Array, 4], '<u4': [Uint32Array, 4], '<i8': [BigInt64Array, 8], '<u8': [BigUint64Array, 8],
};

function need(buf, pos, n, what) {
  if (pos < 0 || n < 0 || pos + n > buf.byteLength) {
    throw new Error('the answer is cut short (' + what + ' at byte ' + pos + ')');
  }
}

function descr(u8, off) {
  let s = '';
  for (let i = 0; i < 8 && u8[off + i]; i++) s += String.fromCharCode(u8[off + i]);
  return s;
}

// A little-endian i64 as a Number (exact below 2^53, which every count and
// index here is).
function i64(dv, pos) {
  const lo = dv.getUint32(pos, true);
  const hi = dv.getInt32(pos + 4, true);
  return hi * 4294967296 + lo;
}

// n values of dtype d at pos, as a typed array (copied when unaligned).
function typed(buf, pos, n, d) {
  const spec = DTYPES[d];
  if (!spec) throw new Error('unsupported value type ' + d);
  const [T, size] = spec;
  need(buf, pos, n * size, d + ' values');
  if (pos % size === 0) return new T(buf, pos, n);
  return new T(buf.slice(pos, pos + n * size));
}

function i64s(buf, dv, pos, n) {
  need(buf, pos, n * 8, 'int64 array');
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = i64(dv, pos + 8 * i);
  return out;
}

function toNumbers(a) {
  if (a instanceof BigInt64Array || a instanceof BigUint64Array) return Float64Array.from(a, Number);
  return a;
}

// The IVQS stream as {rows, cols, valueDtype, indexDtype, blocks:[{obs, indptr, indices, values}]}.
export function parseIvqs(buf) {
  const dv = new DataView(buf);
  const u8 = new Uint8Array(buf);
  need(buf, 0, 40, 'header');
  if (descr(u8, 0).slice(0, 4) !== 'IVQS') throw new Error('not an ivserve query stream');
  if (dv.getUint32(4, true) !== 1) throw new Error('unknown query stream version');
  const out = { rows: i64(dv, 8), cols: i64(dv, 16), valueDtype: descr(u8, 24), indexDtype: descr(u8, 32),
                blocks: [] };
  let pos = 40;
  for (;;) {
    need(buf, pos, 24, 'block header');
    const kind = dv.getUint32(pos, true);
    const status = dv.getUint32(pos + 4, true);
    const n = i64(dv, pos + 8);
    const nnz = i64(dv, pos + 16);
    pos += 24;
    if (kind === 2) {
      if (status !== 0) {
        need(buf, pos, 4, 'trailer');
        const len = dv.getUint32(pos, true);
        need(buf, pos + 4, len, 'trailer message');
        let msg = 'the query failed with status ' + status;
        try { msg = JSON.parse(new TextDecoder().decode(u8.subarray(pos + 4, pos + 4 + len))).error.message; }
        catch (e) { /* keep the status */ }
        throw new Error(msg);
      }
      return out;
    }
    if (n < 0 || nnz < 0) throw new Error('bad block in the query stream');
    if (kind === 4) {
      // Dense gene rows ("dense": true): n genes, each nnz (= the
      // selected cells) values in the selection's order.
      const ids = i64s(buf, dv, pos, n); pos += 8 * n;
      const vals = toNumbers(typed(buf, pos, n * nnz, out.valueDtype)); pos += n * nnz * DTYPES[out.valueDtype][1];
      out.blocks.push({ dense: true, ids, cols: nnz, values: vals });
      continue;
    }
    if (kind !== 1 && kind !== 3) throw new Error('unknown block kind ' + kind + ' in the query stream');
    const obs = i64s(buf, dv, pos, n); pos += 8 * n;
    const indptr = i64s(buf, dv, pos, n + 1); pos += 8 * (n + 1);
    const indices = toNumbers(typed(buf, pos, nnz, out.indexDtype)); pos += nnz * DTYPES[out.indexDtype][1];
    const rawValues = typed(buf, pos, nnz, out.valueDtype); pos += nnz * DTYPES[out.valueDtype][1];
    // Kind 3 ("by": "var") has gene rows: obs then holds var indices and
    // indices the positions of cells in the selection.
    out.blocks.push({ byVar: kind === 3, obs, indptr, indices, values: toNumbers(rawValues), rawValues });
  }
}

// One column (gene) of a parsed stream as a dense Float32Array over nObs
// cells: cells without a stored entry are 0.
// Gene-row blocks (dense or sparse) are for an all-cell selection, so a
// position in the selection is the cell.
export function denseColumn(parsed, nObs, col = 0) {
  const v = new Float32Array(nObs);
  let geneRow = 0;
  for (const b of parsed.blocks) {
    if (b.dense) {
      for (let r = 0; r < b.ids.length; r++, geneRow++) {
        if (geneRow === col) v.set(b.values.subarray(r * b.cols, r * b.cols + Math.min(b.cols, nObs)));
      }
      continue;
    }
    if (b.byVar) {
      for (let r = 0; r < b.obs.length; r++, geneRow++) {
        if (geneRow !== col) continue;
        for (let k = b.indptr[r]; k < b.indptr[r + 1]; k++) v[b.indices[k]] = b.values[k];
      }
      continue;
    }
    for (let r = 0; r < b.obs.length; r++) {
      for (let k = b.indptr[r]; k < b.indptr[r + 1]; k++) {
        if (b.indices[k] === col) v[b.obs[r]] = b.values[k];
      }
    }
  }
  return v;
}

// The IVAR dense array as {rows, cols, dtype, ids, values (Float32Array)}.
export function parseIvar(buf) {
  const dv = new DataView(buf);
  const u8 = new Uint8Array(buf);
  need(buf, 0, 40, 'header');
  if (descr(u8, 0).slice(0, 4) !== 'IVAR') throw new Error('not an ivserve array');
  if (dv.getUint32(4, true) !== 1) throw new Error('unknown array version');
  const rows = i64(dv, 8), cols = i64(dv, 16), dtype = descr(u8, 24), flags = dv.getUint32(32, true);
  let pos = 40, ids = null;
  if (flags & 1) { ids = i64s(buf, dv, pos, rows); pos += 8 * rows; }
  const raw = typed(buf, pos, rows * cols, dtype);
  const values = raw instanceof Float32Array ? raw : Float32Array.from(toNumbers(raw));
  return { rows, cols, dtype, ids, values };
}

// ---- .npz (what scipy.sparse.save_npz writes; scipy.sparse.load_npz reads it)

function npy(descrStr, shape, bytes) {
  const shp = shape.length === 0 ? '()' : shape.length === 1 ? '(' + shape[0] + ',)' : '(' + shape.join(', ') + ')';
  let head = "{'descr': '" + descrStr + "', 'fortran_order': False, 'shape': " + shp + ', }';
  // The header is padded with spaces and a newline so that the data starts
  // at a multiple of 64 bytes, as numpy writes it.
  const total = Math.ceil((10 + head.length + 1) / 64) * 64;
  head = head + ' '.repeat(total - 10 - head.length - 1) + '\n';
  const out = new Uint8Array(total + bytes.byteLength);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0], 0);
  out[8] = head.length & 0xff; out[9] = head.length >> 8;
  for (let i = 0; i < head.length; i++) out[10 + i] = head.charCodeAt(i);
  out.set(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), total);
  return out;
}

let crcTable = null;
function crc32(u8) {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < u8.length; i++) c = crcTable[(c ^ u8[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// A zip archive of stored (uncompressed) members, as numpy.savez writes.
function zip(members) {
  const enc = new TextEncoder();
  const parts = [], central = [];
  let off = 0;
  for (const [name, data] of members) {
    const nm = enc.encode(name), crc = crc32(data);
    const lh = new DataView(new ArrayBuffer(30));
    lh.setUint32(0, 0x04034b50, true); lh.setUint16(4, 20, true); lh.setUint16(6, 0, true);
    lh.setUint16(8, 0, true); lh.setUint16(10, 0, true); lh.setUint16(12, 0x21, true);
    lh.setUint32(14, crc, true); lh.setUint32(18, data.length, true); lh.setUint32(22, data.length, true);
    lh.setUint16(26, nm.length, true); lh.setUint16(28, 0, true);
    const ch = new DataView(new ArrayBuffer(46));
    ch.setUint32(0, 0x02014b50, true); ch.setUint16(4, 20, true); ch.setUint16(6, 20, true);
    ch.setUint16(12, 0, true); ch.setUint16(14, 0x21, true);
    ch.setUint32(16, crc, true); ch.setUint32(20, data.length, true); ch.setUint32(24, data.length, true);
    ch.setUint16(28, nm.length, true); ch.setUint32(42, off, true);
    parts.push(new Uint8Array(lh.buffer), nm, data);
    central.push(new Uint8Array(ch.buffer), nm);
    off += 30 + nm.length + data.length;
  }
  const cdLen = central.reduce((s, p) => s + p.length, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true); end.setUint16(8, members.length, true);
  end.setUint16(10, members.length, true); end.setUint32(12, cdLen, true); end.setUint32(16, off, true);
  if (off + cdLen > 0xffffffff) throw new Error('the selection is too large for a browser-made .npz (4 GiB)');
  return new Blob([...parts, ...central, new Uint8Array(end.buffer)], { type: 'application/octet-stream' });
}

// The parsed IVQS stream as a CSR .npz: data in the answer's value dtype,
// indices int32, indptr int64, plus obs.npy (int64 cell positions, which
// scipy ignores) so the rows can be traced back to cells.
export function csrNpz(parsed) {
  let nnz = 0, rows = 0;
  for (const b of parsed.blocks) { nnz += b.values.length; rows += b.obs.length; }
  const [VT, vsize] = DTYPES[parsed.valueDtype];
  const data = new VT(nnz);
  const indices = new Int32Array(nnz);
  const indptr = new BigInt64Array(rows + 1);
  const obs = new BigInt64Array(rows);
  let k = 0, r = 0;
  for (const b of parsed.blocks) {
    data.set(b.rawValues, k);
    for (let i = 0; i < b.indices.length; i++) indices[k + i] = b.indices[i];
    for (let i = 0; i < b.obs.length; i++) {
      obs[r + i] = BigInt(b.obs[i]);
      indptr[r + i + 1] = BigInt(k + b.indptr[i + 1]);
    }
    k += b.values.length; r += b.obs.length;
  }
  const shape = new BigInt64Array([BigInt(rows), BigInt(parsed.cols)]);
  const fmt = new Uint8Array([0x63, 0x73, 0x72]);  // b'csr', as save_npz stores it
  const vdescr = vsize === 1 ? '|' + parsed.valueDtype.slice(1) : parsed.valueDtype;
  return zip([
    ['indices.npy', npy('<i4', [nnz], indices)],
    ['indptr.npy', npy('<i8', [rows + 1], indptr)],
    ['format.npy', npy('|S3', [], fmt)],
    ['shape.npy', npy('<i8', [2], shape)],
    ['data.npy', npy(vdescr, [nnz], data)],
    ['obs.npy', npy('<i8', [rows], obs)],
  ]);
}
