// Colours: a categorical palette and a numeric ramp, both defined here as
// numbers so that tests (tests/python/test_viewer.py) can recompute the
// colour of any value independently of the page.

// The numeric ramp: five control points from dark violet through blue,
// teal and green to yellow (t in [0, 1], then r, g, b).  Perceived
// lightness rises along it, so larger values always look brighter.
export const RAMP = [
  [0.00, 48, 18, 90],
  [0.25, 44, 90, 160],
  [0.50, 32, 150, 140],
  [0.75, 140, 200, 60],
  [1.00, 250, 230, 40],
];

// Missing values (NaN) and cells outside a colouring.
export const MISSING = [200, 200, 200];

// The ramp's colour at t (clamped to [0, 1]); channels are rounded half up.
export function rampColor(t) {
  if (!(t >= 0)) t = 0;  // also NaN
  if (t > 1) t = 1;
  let i = 1;
  while (i < RAMP.length - 1 && t > RAMP[i][0]) i++;
  const a = RAMP[i - 1], b = RAMP[i];
  const f = (t - a[0]) / (b[0] - a[0]);
  return [1, 2, 3].map((c) => Math.floor(a[c] + (b[c] - a[c]) * f + 0.5));
}

// Category i's colour: hues a golden angle apart, so neighbours in the
// category order never look alike, with lightness and saturation stepping
// in a short cycle so that categories 8 or more apart still differ.
export function categoryColor(i) {
  const h = (i * 137.508 + 15) % 360;
  const s = [0.70, 0.55, 0.80][i % 3];
  const l = [0.48, 0.38, 0.58][Math.floor(i / 3) % 3];
  return hslToRgb(h, s, l);
}

function hslToRgb(h, s, l) {
  const c = (1 - Math.abs(2 * l - 1)) * s;
  const hp = h / 60;
  const x = c * (1 - Math.abs((hp % 2) - 1));
  let r = 0, g = 0, b = 0;
  if (hp < 1) [r, g, b] = [c, x, 0];
  else if (hp < 2) [r, g, b] = [x, c, 0];
  else if (hp < 3) [r, g, b] = [0, c, x];
  else if (hp < 4) [r, g, b] = [0, x, c];
  else if (hp < 5) [r, g, b] = [x, 0, c];
  else [r, g, b] = [c, 0, x];
  const m = l - c / 2;
  return [r, g, b].map((v) => Math.round((v + m) * 255));
}

export function cssColor(rgb) { return 'rgb(' + rgb[0] + ',' + rgb[1] + ',' + rgb[2] + ')'; }

// Per-cell RGBA for numeric values: the ramp over [lo, hi] (the smallest
// and largest finite values; all equal gives the ramp's start).
export function numericColors(values) {
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo === Infinity) { lo = 0; hi = 0; }
  // A lookup table of 1024 steps would be faster but would round values
  // to a step: the page colours every cell with its exact t instead.
  const n = values.length, out = new Uint8Array(n * 4), span = hi - lo;
  // rampColor inlined: this loop runs once per cell on every re-colour.
  const last = RAMP.length - 1;
  for (let i = 0; i < n; i++) {
    const v = values[i], k = 4 * i;
    out[k + 3] = 255;
    if (v !== v) { out[k] = MISSING[0]; out[k + 1] = MISSING[1]; out[k + 2] = MISSING[2]; continue; }
    const t = span > 0 ? (v - lo) / span : 0;
    let j = 1;
    while (j < last && t > RAMP[j][0]) j++;
    const a = RAMP[j - 1], b = RAMP[j], f = (t - a[0]) / (b[0] - a[0]);
    out[k] = Math.floor(a[1] + (b[1] - a[1]) * f + 0.5);
    out[k + 1] = Math.floor(a[2] + (b[2] - a[2]) * f + 0.5);
    out[k + 2] = Math.floor(a[3] + (b[3] - a[3]) * f + 0.5);
  }
  return { rgba: out, lo, hi };
}

// Per-cell RGBA for category codes (-1 = missing).
export function categoricalColors(codes, nCategories) {
  const pal = [];
  for (let k = 0; k < nCategories; k++) pal.push(categoryColor(k));
  const n = codes.length, out = new Uint8Array(n * 4);
  for (let i = 0; i < n; i++) {
    const k = codes[i];
    const c = k >= 0 && k < nCategories ? pal[k] : MISSING;
    out[4 * i] = c[0]; out[4 * i + 1] = c[1]; out[4 * i + 2] = c[2]; out[4 * i + 3] = 255;
  }
  return out;
}

// CSS gradient of the ramp, for the colour bar.
export function rampGradient() {
  return 'linear-gradient(to right, ' +
    RAMP.map((p) => cssColor(p.slice(1)) + ' ' + p[0] * 100 + '%').join(', ') + ')';
}
