// Violins of the coloured gene, one per category of a column: each is the
// histogram of the category's expressing cells (histogramsByCategory in
// expression.js), mirrored about the category's centre line, its width at
// a bin proportional to the bin's share of the category's expressing
// cells (the widest bin of each violin spans the column).  Cells at 0 are
// not in the shape; the fraction that expresses is written under it, as
// the dot plot shows it.  Drawn on a canvas; geometry() gives where each
// bin was drawn so that tests can read the pixels back.

import { cssColor } from './colors.js';

const TOP = 16, BOTTOM = 46, LEFT = 48;

export function drawViolins(canvas, h, labels, colors, title) {
  const dpr = window.devicePixelRatio || 1;
  const k = labels.length;
  const colW = Math.max(28, Math.min(90, Math.floor((canvas.parentElement.clientWidth - LEFT - 10) / Math.max(k, 1))));
  const w = LEFT + colW * k + 10, height = 220;
  canvas.style.width = w + 'px';
  canvas.style.height = height + 'px';
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, w, height);
  const nb = h.bins, plotH = height - TOP - BOTTOM, binH = plotH / nb;
  const geom = { colW, binH, centres: [], halfWidths: [], binY: [] };
  for (let b = 0; b < nb; b++) geom.binY.push(TOP + plotH - (b + 0.5) * binH);
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillStyle = '#1d2329';
  ctx.textAlign = 'right';
  ctx.fillText(fmt(h.hi), LEFT - 4, TOP + 8);
  ctx.fillText(fmt(h.lo), LEFT - 4, TOP + plotH);
  ctx.textAlign = 'left';
  ctx.fillText(title, LEFT, 11);
  for (let c = 0; c < k; c++) {
    const cx = LEFT + colW * c + colW / 2, counts = h.counts[c];
    const most = Math.max(...counts);
    const half = counts.map((v) => (most ? Math.max(v ? 0.5 : 0, (v / most) * (colW / 2 - 3)) : 0));
    geom.centres.push(cx);
    geom.halfWidths.push(half);
    ctx.fillStyle = cssColor(colors[c]);
    for (let b = 0; b < nb; b++) {
      if (!counts[b]) continue;
      const y = TOP + plotH - (b + 1) * binH;
      ctx.fillRect(cx - half[b], y, 2 * half[b], binH);
    }
    ctx.fillStyle = '#1d2329';
    ctx.textAlign = 'center';
    const pct = h.cells[c] ? (100 * h.expressing[c]) / h.cells[c] : 0;
    ctx.fillText(pct.toFixed(0) + '%', cx, TOP + plotH + 14);
    ctx.save();
    ctx.translate(cx, TOP + plotH + 22);
    ctx.rotate(-Math.PI / 8);
    ctx.textAlign = 'right';
    ctx.fillText(String(labels[c]).slice(0, 16), 6, 6);
    ctx.restore();
  }
  return geom;
}

function fmt(v) {
  if (!Number.isFinite(v)) return 'n/a';
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2);
}
