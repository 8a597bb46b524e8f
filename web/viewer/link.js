// The view as URL parameters, so that a copied link reopens it: which
// dataset and embedding, the colouring (an obs column or genes, with the
// clip), hidden categories, numeric range filters, the selection (a box
// or lasso in data coordinates, or categories by name), the camera, the
// pinned cell and the violins' column.  Names travel as they are (URL
// encoding does the quoting); lists are repeated parameters, so no
// separator has to be kept out of category names.
//
//   ?dataset=ID&embedding=X_umap&color=cell_type | &gene=CD3E&gene=CD3D
//   &clip=99&hidecol=cell_type&hide=B%20cell&filter=n_counts:10:200
//   &sel=box:x0,y0,x1,y1 | sel=lasso:x,y,x,y,... | sel=cat:COLUMN&selcat=NAME...
//   &view=cx,cy,scale&pin=INDEX&violin=COLUMN

const nums = (s) => s.split(',').map(Number);
const finite = (a) => a.every(Number.isFinite);

export function readLink(params) {
  const out = {
    dataset: params.get('dataset') || null,
    embedding: params.get('embedding') || null,
    color: params.get('color') || null,
    genes: params.getAll('gene').filter(Boolean),
    clip: params.has('clip') ? Number(params.get('clip')) : 100,
    hideCol: params.get('hidecol') || null,
    hide: params.getAll('hide'),
    filters: [],
    sel: null,
    view: null,
    pin: params.has('pin') ? Number(params.get('pin')) : -1,
    violin: params.get('violin') || null,
  };
  if (!(out.clip > 0 && out.clip <= 100)) out.clip = 100;
  for (const f of params.getAll('filter')) {
    const m = /^(.*):([^:]*):([^:]*)$/.exec(f);
    if (!m) continue;
    const lo = m[2] === '' ? -Infinity : Number(m[2]), hi = m[3] === '' ? Infinity : Number(m[3]);
    if (!Number.isNaN(lo) && !Number.isNaN(hi)) out.filters.push({ column: m[1], lo, hi });
  }
  const sel = params.get('sel') || '';
  if (sel.startsWith('box:')) {
    const v = nums(sel.slice(4));
    if (v.length === 4 && finite(v)) out.sel = { kind: 'box', x0: v[0], y0: v[1], x1: v[2], y1: v[3] };
  } else if (sel.startsWith('lasso:')) {
    const v = nums(sel.slice(6));
    if (v.length >= 6 && v.length % 2 === 0 && finite(v)) {
      const points = [];
      for (let k = 0; k < v.length; k += 2) points.push([v[k], v[k + 1]]);
      out.sel = { kind: 'lasso', points };
    }
  } else if (sel.startsWith('cat:')) {
    out.sel = { kind: 'categories', column: sel.slice(4), names: params.getAll('selcat') };
  }
  const view = nums(params.get('view') || '');
  if (view.length === 3 && finite(view) && view[2] > 0) out.view = { cx: view[0], cy: view[1], scale: view[2] };
  return out;
}

// The parameters of a view (the fields readLink returns); extra keeps
// parameters the page does not own (renderer=canvas).
export function writeLink(v, extra) {
  const p = new URLSearchParams();
  if (v.dataset) p.set('dataset', v.dataset);
  if (v.embedding) p.set('embedding', v.embedding);
  if (v.color) p.set('color', v.color);
  for (const g of v.genes || []) p.append('gene', g);
  if (v.clip && v.clip < 100) p.set('clip', String(v.clip));
  if (v.hideCol && v.hide && v.hide.length) {
    p.set('hidecol', v.hideCol);
    for (const h of v.hide) p.append('hide', h);
  }
  for (const f of v.filters || []) {
    p.append('filter', f.column + ':' + (Number.isFinite(f.lo) ? f.lo : '') + ':' + (Number.isFinite(f.hi) ? f.hi : ''));
  }
  const s = v.sel;
  if (s && s.kind === 'box') p.set('sel', 'box:' + [s.x0, s.y0, s.x1, s.y1].join(','));
  else if (s && s.kind === 'lasso') p.set('sel', 'lasso:' + s.points.map((q) => q[0] + ',' + q[1]).join(','));
  else if (s && s.kind === 'categories') {
    p.set('sel', 'cat:' + s.column);
    for (const n of s.names) p.append('selcat', n);
  }
  if (v.view) p.set('view', [v.view.cx, v.view.cy, v.view.scale].join(','));
  if (v.pin >= 0) p.set('pin', String(v.pin));
  if (v.violin) p.set('violin', v.violin);
  for (const [k, val] of extra || []) p.set(k, val);
  return p;
}
