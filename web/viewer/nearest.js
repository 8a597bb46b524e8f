// Which cell is under the cursor: a uniform grid over the embedding's
// bounds (about 8 cells a bucket), its cells listed bucket by bucket by a
// counting sort, built once per embedding in O(n).  A lookup scans only
// the buckets within the search radius, so hovering stays far under a
// frame's 16 ms at a million cells, where a scan of every cell does not.

export class NearestIndex {
  constructor(xy, n) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (let i = 0; i < n; i++) {
      const x = xy[2 * i], y = xy[2 * i + 1];
      if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y;
    }
    if (!(x0 <= x1)) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    const g = Math.max(1, Math.min(2048, Math.ceil(Math.sqrt(n / 8))));
    this.g = g;
    this.x0 = x0; this.y0 = y0;
    this.wx = (x1 - x0) / g || 1;
    this.wy = (y1 - y0) / g || 1;
    this.xy = xy;
    const bucket = new Uint32Array(n), start = new Uint32Array(g * g + 1);
    for (let i = 0; i < n; i++) {
      const b = this.cell(xy[2 * i], xy[2 * i + 1]);
      bucket[i] = b;
      start[b + 1]++;
    }
    for (let b = 0; b < g * g; b++) start[b + 1] += start[b];
    const fill = start.slice(0, g * g), items = new Uint32Array(n);
    for (let i = 0; i < n; i++) items[fill[bucket[i]]++] = i;
    this.start = start;
    this.items = items;
  }

  col(x) { return Math.min(this.g - 1, Math.max(0, Math.floor((x - this.x0) / this.wx))); }
  row(y) { return Math.min(this.g - 1, Math.max(0, Math.floor((y - this.y0) / this.wy))); }
  cell(x, y) { return this.row(y) * this.g + this.col(x); }

  // The nearest cell to (x, y) within r (data units) for which ok(i) is
  // true (ok may be null); -1 when there is none.  Ties go to the later
  // cell in draw order when rank (cell -> draw position) is given.
  nearest(x, y, r, ok, rank) {
    const c0 = this.col(x - r), c1 = this.col(x + r), r0 = this.row(y - r), r1 = this.row(y + r);
    let best = -1, bestD = r * r;
    for (let row = r0; row <= r1; row++) {
      for (let c = c0; c <= c1; c++) {
        const b = row * this.g + c;
        for (let k = this.start[b]; k < this.start[b + 1]; k++) {
          const i = this.items[k];
          const dx = this.xy[2 * i] - x, dy = this.xy[2 * i + 1] - y, d = dx * dx + dy * dy;
          if (d > bestD || (ok && !ok(i))) continue;
          if (d < bestD || best < 0 || (rank && rank[i] > rank[best])) { best = i; bestD = d; }
        }
      }
    }
    return best;
  }
}
