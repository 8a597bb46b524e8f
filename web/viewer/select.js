// Which cells a box or a lasso encloses, in data coordinates.  Both keep
// the boundary (a cell exactly on an edge of a box is inside), compare the
// float32 coordinates the page drew as doubles, and return a byte mask
// over all cells plus its count.

export function selectBox(xy, n, box) {
  const x0 = Math.min(box.x0, box.x1), x1 = Math.max(box.x0, box.x1);
  const y0 = Math.min(box.y0, box.y1), y1 = Math.max(box.y0, box.y1);
  const mask = new Uint8Array(n);
  let count = 0;
  for (let i = 0; i < n; i++) {
    const x = xy[2 * i], y = xy[2 * i + 1];
    if (x >= x0 && x <= x1 && y >= y0 && y <= y1) { mask[i] = 1; count++; }
  }
  return { mask, count };
}

// Even-odd rule (a crossing count along +x); cells outside the polygon's
// bounding box are rejected first, which is most of them for a small lasso.
export function selectPolygon(xy, n, pts) {
  const mask = new Uint8Array(n);
  let count = 0;
  if (pts.length < 3) return { mask, count };
  let bx0 = Infinity, by0 = Infinity, bx1 = -Infinity, by1 = -Infinity;
  for (const [px, py] of pts) {
    bx0 = Math.min(bx0, px); bx1 = Math.max(bx1, px); by0 = Math.min(by0, py); by1 = Math.max(by1, py);
  }
  const m = pts.length;
  for (let i = 0; i < n; i++) {
    const x = xy[2 * i], y = xy[2 * i + 1];
    if (x < bx0 || x > bx1 || y < by0 || y > by1) continue;
    let inside = false;
    for (let a = 0, b = m - 1; a < m; b = a++) {
      const ya = pts[a][1], yb = pts[b][1];
      if ((ya > y) !== (yb > y) && x < (pts[b][0] - pts[a][0]) * (y - ya) / (yb - ya) + pts[a][0]) inside = !inside;
    }
    if (inside) { mask[i] = 1; count++; }
  }
  return { mask, count };
}

export function maskFromCodes(codes, picked) {
  const mask = new Uint8Array(codes.length);
  let count = 0;
  for (let i = 0; i < codes.length; i++) if (picked.has(codes[i])) { mask[i] = 1; count++; }
  return { mask, count };
}

// The selected cells' positions, ascending.
export function maskIndices(mask, count) {
  const idx = new Int32Array(count);
  let k = 0;
  for (let i = 0; i < mask.length; i++) if (mask[i]) idx[k++] = i;
  return idx;
}

// The mask as the API's base64 bit mask (bit i = cell i, least significant first).
export function maskBase64(mask) {
  const bytes = new Uint8Array((mask.length + 7) >> 3);
  for (let i = 0; i < mask.length; i++) if (mask[i]) bytes[i >> 3] |= 1 << (i & 7);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}
