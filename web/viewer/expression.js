// Expression made readable, as scanpy draws it: cells that do not express
// the gene (value exactly 0) get one light neutral colour and are drawn
// first, and expressing cells are drawn on top of them in value order, so
// the highest values are never buried under non-expressing cells drawn
// later in the file.  The ramp runs from the smallest value to a clip: the
// largest value, or a chosen percentile of the expressing cells (a few
// outliers would otherwise push every other cell to the dark end).
//
// The draw order is an exact sort: each value's float32 bits, flipped so
// that unsigned order is numeric order, are sorted by a stable LSD radix
// sort (three passes of 11 bits).  That is O(n) whatever the values, where
// a comparison sort of a million cells takes most of a second, and ties
// keep file order, so the same data always gives the same picture.

import { MISSING, RAMP } from './colors.js';

// Cells that do not express: light, neutral, darker than the page's white
// so that they still show where cells are.
export const ZERO = [215, 215, 215];

// The clip choices offered: 100 = the largest value.
export const CLIPS = [100, 99.9, 99.5, 99, 98, 95, 90];

// Sorts idx (cell indices) in place, stably, by the float32 key of each
// cell in vals.  tmp is scratch space of idx's length.
function radixSortByValue(idx, vals, tmp) {
  const m = idx.length;
  const bits = new Uint32Array(vals.buffer, vals.byteOffset, vals.length);
  const keys = new Uint32Array(m);
  for (let k = 0; k < m; k++) {
    const b = bits[idx[k]];
    // Positive floats order as their bits; negative ones in reverse.
    keys[k] = b & 0x80000000 ? ~b >>> 0 : (b | 0x80000000) >>> 0;
  }
  const tkeys = new Uint32Array(m);
  const count = new Uint32Array(2048);
  let src = idx, dst = tmp, ks = keys, kd = tkeys;
  for (let shift = 0; shift < 33; shift += 11) {
    count.fill(0);
    for (let k = 0; k < m; k++) count[(ks[k] >>> shift) & 2047]++;
    // A digit that every key shares (the low bits of small integer counts,
    // say) moves nothing: the pass is skipped.
    if (m && count[(ks[0] >>> shift) & 2047] === m) continue;
    let sum = 0;
    for (let d = 0; d < 2048; d++) { const c = count[d]; count[d] = sum; sum += c; }
    for (let k = 0; k < m; k++) {
      const pos = count[(ks[k] >>> shift) & 2047]++;
      dst[pos] = src[k];
      kd[pos] = ks[k];
    }
    [src, dst] = [dst, src];
    [ks, kd] = [kd, ks];
  }
  if (src !== idx) idx.set(src);
}

// The order cells are drawn in: missing (NaN) and zero cells first, in
// file order, then the others by value, ascending.  vals: Float32Array.
// Also returns the sorted values of the expressing (non-zero, finite)
// cells' count and the first expressing position in the order.
export function expressionOrder(vals) {
  const n = vals.length;
  const order = new Uint32Array(n);
  let z = 0, e = 0, zeros = 0;
  for (let i = 0; i < n; i++) { const v = vals[i]; if (v === 0) zeros++; else if (v !== v) z++; }
  z += zeros;
  e = z;
  let zk = 0;
  for (let i = 0; i < n; i++) {
    const v = vals[i];
    if (v === 0 || v !== v) order[zk++] = i; else order[e++] = i;
  }
  const expressing = order.subarray(z);
  radixSortByValue(expressing, vals, new Uint32Array(expressing.length));
  return { order, firstExpressing: z, zeros };
}

// The clip value: the nearest-rank pct-th percentile of the expressing
// cells' values (the value at rank ceil(pct/100 * m) of the m sorted), or
// the largest value for 100.
export function clipValue(vals, order, firstExpressing, pct) {
  const m = order.length - firstExpressing;
  if (!m) return 0;
  const rank = pct >= 100 ? m : Math.max(1, Math.ceil((pct / 100) * m));
  return vals[order[firstExpressing + rank - 1]];
}

// Per-cell RGBA of a gene: ZERO for 0, MISSING for NaN, else the ramp over
// [lo, hi] (hi the clip; values above it take the ramp's end).  Cells are
// visited in draw order, so the ramp is computed once per distinct value
// (counts have a few dozen) and each colour stays exact.
export function expressionColors(vals, lo, hi, order, firstExpressing) {
  const n = vals.length, out = new Uint8Array(4 * n), span = hi - lo, last = RAMP.length - 1;
  const zero = (ZERO[0] | ZERO[1] << 8 | ZERO[2] << 16 | 255 << 24) >>> 0;
  const missing = (MISSING[0] | MISSING[1] << 8 | MISSING[2] << 16 | 255 << 24) >>> 0;
  const words = new Uint32Array(out.buffer);   // little-endian: R G B A from the low byte
  for (let k = 0; k < firstExpressing; k++) { const i = order[k]; words[i] = vals[i] === 0 ? zero : missing; }
  let prev = NaN, word = 0;
  for (let k = firstExpressing; k < n; k++) {
    const i = order[k], v = vals[i];
    if (v !== prev) {
      prev = v;
      let t = span > 0 ? (v - lo) / span : 1;
      if (t > 1) t = 1; else if (t < 0) t = 0;
      let j = 1;
      while (j < last && t > RAMP[j][0]) j++;
      const a = RAMP[j - 1], b = RAMP[j], f = (t - a[0]) / (b[0] - a[0]);
      word = (Math.floor(a[1] + (b[1] - a[1]) * f + 0.5) | Math.floor(a[2] + (b[2] - a[2]) * f + 0.5) << 8 |
              Math.floor(a[3] + (b[3] - a[3]) * f + 0.5) << 16 | 255 << 24) >>> 0;
    }
    words[i] = word;
  }
  return out;
}

// Everything the scatter needs for one gene (or gene set) vector.
// lo and the largest value come from the sort: the first and last
// expressing cells, and 0 where some cell is 0.
export function colourExpression(vals, clipPct) {
  const { order, firstExpressing, zeros } = expressionOrder(vals);
  const n = vals.length;
  let lo = Infinity, max = -Infinity;
  if (firstExpressing < n) { lo = vals[order[firstExpressing]]; max = vals[order[n - 1]]; }
  if (zeros) { lo = Math.min(lo, 0); max = Math.max(max, 0); }
  if (lo === Infinity) { lo = 0; max = 0; }
  const hi = clipPct >= 100 ? max : clipValue(vals, order, firstExpressing, clipPct);
  return { rgba: expressionColors(vals, lo, hi, order, firstExpressing), order, firstExpressing, lo, hi, max };
}

// The mean of several genes' vectors, cell by cell (a gene set score).
export function meanOf(vectors) {
  const n = vectors[0].length, out = new Float32Array(n), k = vectors.length;
  const acc = new Float64Array(n);
  for (const v of vectors) for (let i = 0; i < n; i++) acc[i] += v[i];
  for (let i = 0; i < n; i++) out[i] = acc[i] / k;
  return out;
}

// Histograms of the expressing cells per category, for the violins: BINS
// equal bins from the smallest to the largest non-zero value (bin b holds
// a <= v < a + (b+1) w; the largest value goes to the last bin), or, when
// every value is a whole number and they span fewer than BINS, one bin per
// whole number (bin v - a: counts would otherwise leave empty stripes),
// with each category's cell count and expressing count.  codes:
// Int32Array (-1 = missing, left out).  visible: optional Uint8Array mask.
export const BINS = 32;

export function histogramsByCategory(vals, codes, nCats, visible) {
  let a = Infinity, b = -Infinity;
  for (let i = 0; i < vals.length; i++) {
    const v = vals[i];
    if (v !== 0 && v === v && (!visible || visible[i])) { if (v < a) a = v; if (v > b) b = v; }
  }
  if (a === Infinity) { a = 0; b = 0; }
  const span = b - a;
  let whole = span < BINS;
  for (let i = 0; whole && i < vals.length; i++) {
    const v = vals[i];
    if (v === v && v !== Math.floor(v) && (!visible || visible[i])) whole = false;
  }
  const nb = whole ? span + 1 : BINS;
  const counts = [], cells = new Array(nCats).fill(0), expressing = new Array(nCats).fill(0);
  for (let k = 0; k < nCats; k++) counts.push(new Array(nb).fill(0));
  for (let i = 0; i < vals.length; i++) {
    const k = codes[i];
    if (k < 0 || k >= nCats || (visible && !visible[i])) continue;
    cells[k]++;
    const v = vals[i];
    if (v === 0 || v !== v) continue;
    expressing[k]++;
    const bin = whole ? v - a : span > 0 ? Math.min(BINS - 1, Math.floor(((v - a) / span) * BINS)) : 0;
    counts[k][bin]++;
  }
  return { lo: a, hi: b, bins: nb, whole, counts, cells, expressing };
}
