// The dot plot: one row per group, one column per gene; a dot's area
// grows with the fraction of the group's cells that express the gene and
// its colour is the group's mean on the ramp over all dots.  Each dot
// keeps the numbers it shows (data-mean, data-frac) exactly as the server
// sent them, so what is drawn can be read back and compared.

import { cssColor, rampColor } from './colors.js';

const NS = 'http://www.w3.org/2000/svg';

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

// table: {genes: [names], groups: [labels], mean: [[groups x genes]], frac: [[...]], groupBy}
export function drawDotPlot(box, table) {
  box.textContent = '';
  const { genes, groups, mean, frac } = table;
  // Dots shrink (to 14 px) so that a dozen or more groups fit the panel's
  // height without scrolling.
  const top = 70, room = (box.clientHeight || 0) - top - 36;
  const cell = Math.max(14, Math.min(26, room > 0 ? Math.floor(room / Math.max(groups.length, 1)) : 26));
  const left = 12 + 7 * Math.max(4, ...groups.map((g) => String(g).length));
  const w = left + cell * genes.length + 160, h = Math.max(top + cell * groups.length + 20, top + 146);
  const svg = el('svg', { width: w, height: h, viewBox: `0 0 ${w} ${h}`, id: 'dotplot-svg' });
  let lo = Infinity, hi = -Infinity;
  for (const row of mean) for (const v of row) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (lo === Infinity) { lo = 0; hi = 0; }
  genes.forEach((g, j) => {
    const x = left + cell * j + cell / 2;
    svg.appendChild(el('text', { x, y: top - 8, transform: `rotate(-45 ${x} ${top - 8})` }, g));
  });
  groups.forEach((grp, i) => {
    const y = top + cell * i + cell / 2;
    svg.appendChild(el('text', { x: left - 6, y: y + 4, 'text-anchor': 'end' }, String(grp)));
    genes.forEach((g, j) => {
      const m = mean[i][j], f = frac[i][j];
      const t = hi > lo ? (m - lo) / (hi - lo) : 0;
      const r = Number.isFinite(f) ? Math.sqrt(Math.max(0, Math.min(1, f))) * (cell / 2 - 1) : 0;
      const c = el('circle', {
        cx: left + cell * j + cell / 2, cy: y, r: r.toFixed(2),
        fill: Number.isFinite(m) ? cssColor(rampColor(t)) : '#ccc', class: 'dot',
        'data-group': String(grp), 'data-gene': g, 'data-mean': String(m), 'data-frac': String(f),
      });
      c.appendChild(el('title', {}, `${g} in ${grp}: mean ${fmt(m)}, expressed in ${fmt(100 * f)}% of cells`));
      svg.appendChild(c);
    });
  });
  // Legends: dot size for 25/50/100 %, colour for the mean's range.
  const lx = left + cell * genes.length + 30;
  svg.appendChild(el('text', { x: lx, y: top }, '% expressing'));
  [0.25, 0.5, 1].forEach((f, k) => {
    const y = top + 20 + 24 * k;
    svg.appendChild(el('circle', { cx: lx + 10, cy: y, r: (Math.sqrt(f) * (cell / 2 - 1)).toFixed(2), fill: '#888' }));
    svg.appendChild(el('text', { x: lx + 28, y: y + 4 }, String(f * 100)));
  });
  const gy = top + 110;
  svg.appendChild(el('text', { x: lx, y: gy }, 'mean'));
  for (let k = 0; k < 20; k++) {
    svg.appendChild(el('rect', { x: lx + 5 * k, y: gy + 6, width: 5, height: 10, fill: cssColor(rampColor(k / 19)) }));
  }
  svg.appendChild(el('text', { x: lx, y: gy + 30 }, fmt(lo)));
  svg.appendChild(el('text', { x: lx + 100, y: gy + 30, 'text-anchor': 'end' }, fmt(hi)));
  box.appendChild(svg);
}

function fmt(v) {
  if (!Number.isFinite(v)) return 'n/a';
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2);
}

// What the plot shows, read back from the drawn dots.
export function readDotPlot(box) {
  const out = { genes: [], groups: [], mean: [], frac: [] };
  const dots = box.querySelectorAll('circle.dot');
  for (const d of dots) {
    const g = d.getAttribute('data-gene'), grp = d.getAttribute('data-group');
    let j = out.genes.indexOf(g);
    if (j < 0) { j = out.genes.length; out.genes.push(g); }
    let i = out.groups.indexOf(grp);
    if (i < 0) { i = out.groups.length; out.groups.push(grp); out.mean.push([]); out.frac.push([]); }
    out.mean[i][j] = parseFloat(d.getAttribute('data-mean'));
    out.frac[i][j] = parseFloat(d.getAttribute('data-frac'));
  }
  return out;
}
