// The viewer page: wires the dataset picker, the scatter, colouring,
// selection, the dot plot and messages together.  Everything the page
// shows comes from the API through api.js; anything that fails is shown
// as a message naming what was being done and what the server said.
//
// URL parameters: the whole view (link.js: dataset, embedding, colouring,
// genes, clip, hidden categories, filters, selection, camera, pinned
// cell), kept up to date as the view changes, and &renderer=canvas or
// &renderer=webgl (force the canvas 2D drawing, or WebGL even where it is
// a software rasterizer: scatter.js).
//
// What is drawn: the colouring gives each cell a colour and, for a gene,
// an order (zeros first, expressing cells on top by value: expression.js);
// the filters (hidden categories of one column, numeric ranges) give a
// visible mask; the scatter draws the visible cells in that order.  A
// selection is the cells of its shape (box, lasso, categories) that are
// visible, recomputed from the shape when the filters change.

import { ApiError, absUrl, dsPath, fetchBinary, getJson, getToken, isMissingRoute, postJson, setToken } from './api.js';
import { categoricalColors, categoryColor, cssColor, numericColors, rampGradient } from './colors.js';
import { drawDotPlot, readDotPlot } from './dotplot.js';
import { CLIPS, ZERO, colourExpression, histogramsByCategory, meanOf } from './expression.js';
import { csrNpz, denseColumn, parseIvar, parseIvqs } from './formats.js';
import { readLink, writeLink } from './link.js';
import { drawMarkers, readMarkers } from './markers.js';
import { NearestIndex } from './nearest.js';
import { Scatter } from './scatter.js';
import { drawViolins } from './violin.js';
import { maskBase64, maskFromCodes, maskIndices, selectBox, selectPolygon } from './select.js';

const MEDIA_CSR = 'application/vnd.ivserve.csr';
const MEDIA_ARRAY = 'application/vnd.ivserve.array';
const PLAIN = [70, 90, 120];  // cells when nothing colours them
// Columns that datasets name their gene symbols in, first found wins
// (?symbols=COLUMN names another).
const SYMBOL_COLUMNS = ['feature_name', 'gene_symbols', 'gene_short_name', 'gene_name'];

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

const state = {
  id: null, doc: null, nObs: 0, xy: null, embedding: null,
  base: null,         // RGBA of the colouring, before selection dimming
  shown: null,        // RGBA handed to the scatter
  color: { kind: 'none' },
  codes: null, categories: null,
  selection: null,    // {mask, count, kind, box?, categories?}
  busy: 0, generation: 0,
  timings: {}, downloads: [], messages: [],
  values: null,       // the coloured gene's (or gene set's) values, Float32Array
  order: null,        // the colouring's draw order (Uint32Array), null = file order
  clip: 100,
  columns: new Map(), // obs column name -> {codes, categories} or {values} (fetched once)
  hidden: { column: null, names: new Set() },   // hidden categories of one column
  ranges: [],         // numeric filters [{column, lo, hi, values}]
  visible: null,      // Uint8Array mask, null = every cell
  shownCount: 0,
  nearest: null, hovered: -1, pinned: -1,
  symbolCol: null, symbols: null,   // var column of gene symbols, its values by gene position
  violin: null,       // {column, geom, hist}
  restoring: false,
  groups: { a: null, b: null },   // kept selections for markers: {obs, count}
};
const link = readLink(params);

// The first requests leave before the scatter sets up WebGL (which takes
// a while with a software renderer), so the network and the set-up overlap.
const early = {
  list: getJson('v1/datasets').then((v) => ({ v }), (e) => ({ e })),
  doc: params.get('dataset') ? getJson(dsPath(params.get('dataset'))).then((v) => ({ v }), (e) => ({ e })) : null,
};

// A request started early, or a fresh one once that was used.
function earlyOr(key, fn) {
  const p = early[key];
  early[key] = null;
  return p ? p.then((r) => { if (r.e) throw r.e; return r.v; }) : fn();
}

const scatter = new Scatter($('scatter'), $('overlay'), {
  forceCanvas: params.get('renderer') === 'canvas', forceGl: params.get('renderer') === 'webgl',
});

// ---- messages -------------------------------------------------------------

function message(text, kind = 'error') {
  const box = $('messages');
  const d = document.createElement('div');
  d.className = 'msg ' + kind;
  d.textContent = text;
  const close = document.createElement('button');
  close.textContent = '×';
  close.title = 'dismiss';
  close.onclick = () => d.remove();
  d.prepend(close);
  box.appendChild(d);
  while (box.children.length > 6) box.firstChild.remove();
  state.messages.push({ kind, text });
}

function describe(e) {
  if (e instanceof ApiError) {
    const where = e.status ? ' (HTTP ' + e.status + (e.code ? ', ' + e.code : '') + ')' : '';
    return e.message + where;
  }
  return e && e.message ? e.message : String(e);
}

function fail(what, e) {
  if (e instanceof ApiError && e.status === 401) {
    message(what + ': this server needs a bearer token; enter it in the Token field above. (' + e.message + ')');
    $('token').focus();
    return;
  }
  if (e instanceof ApiError && e.status === 403) {
    message(what + ': the token does not open this resource (' + e.message + ')');
    return;
  }
  message(what + ': ' + describe(e));
}

// Runs an async step, counting it as busy (the test hook waits on that)
// and turning any failure into a message.
async function step(what, fn) {
  state.busy++;
  try {
    return await fn();
  } catch (e) {
    fail(what, e);
    return undefined;
  } finally {
    state.busy--;
  }
}

function note(text) {
  const n = $('scatter-note');
  n.textContent = text || '';
  n.hidden = !text;
}

// ---- datasets ---------------------------------------------------------------

async function loadDatasets() {
  const sel = $('dataset');
  const list = await step('listing the datasets', () => earlyOr('list', () => getJson('v1/datasets')));
  sel.textContent = '';
  if (!list) {
    sel.appendChild(new Option('(none)', ''));
    return;
  }
  // The list loaded: a token complaint shown earlier is answered.
  for (const m of [...$('messages').children]) if (/bearer token|token does not open/.test(m.textContent)) m.remove();
  const ready = list.datasets.filter((d) => d.ready !== false);
  for (const d of ready) sel.appendChild(new Option(d.title && d.title !== d.id ? d.title + ' (' + d.id + ')' : d.id, d.id));
  if (!ready.length) {
    sel.appendChild(new Option('(no dataset ready)', ''));
    message('The server has no dataset ready yet.', 'info');
    return;
  }
  const want = params.get('dataset');
  sel.value = ready.some((d) => d.id === want) ? want : ready[0].id;
  await openDataset(sel.value);
}

function fmtInt(n) { return Number(n).toLocaleString('en-US'); }

async function openDataset(id) {
  const gen = ++state.generation;
  Object.assign(state, { id, doc: null, nObs: 0, xy: null, base: null, shown: null, color: { kind: 'none' },
                         codes: null, categories: null, selection: null, values: null, order: null,
                         columns: new Map(), hidden: { column: null, names: new Set() }, ranges: [],
                         visible: null, nearest: null, hovered: -1, pinned: -1, symbolCol: null,
                         symbols: null, violin: null, groups: { a: null, b: null } });
  showPinned();
  drawFilters();
  $('violin-box').hidden = true;
  $('markers-box').hidden = true;
  state.timings = { start: performance.now() };
  updateSelectionUi();
  $('legend').textContent = '';
  $('dotplot').textContent = '';
  state.timings.opening = performance.now();
  const doc = await step('opening dataset ' + id, () =>
    (id === params.get('dataset') ? earlyOr('doc', () => getJson(dsPath(id))) : getJson(dsPath(id))));
  state.timings.docLoaded = performance.now();
  if (!doc || gen !== state.generation) return;
  state.doc = doc;
  state.nObs = doc.shape[0];
  $('shape').textContent = fmtInt(doc.shape[0]) + ' cells × ' + fmtInt(doc.shape[1]) + ' genes, ' +
    fmtInt(doc.nnz) + ' stored (' + doc.dtype + ', ' + doc.orientation + ')';
  // The embedding is asked for first; the side panel fills while it loads.
  fillEmbeddings(doc);
  const emb = $('embedding').value;
  const loading = emb ? loadEmbedding(emb, gen) : null;
  fillInfo(doc);
  fillColumnPickers(doc);
  findSymbols(doc);
  await loading;
  if (gen !== state.generation) return;
  if (!state.restored && (id === link.dataset || !link.dataset)) await restoreLink(gen);
  state.restored = true;
  saveLink();
}

function obsColumns(doc) { return doc.obs && doc.obs.columns ? doc.obs.columns : []; }

function fillInfo(doc) {
  const t = document.createElement('table');
  const row = (k, v) => {
    const tr = t.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  };
  row('id', doc.id);
  row('codec', doc.codec);
  for (const c of obsColumns(doc)) {
    let v = c.type;
    if (c.categories) {
      const cats = c.categories.slice(0, 8).map((x) => x.name + ' (' + fmtInt(x.count) + ')').join(', ');
      v += ', ' + c.categories.length + ' categories: ' + cats + (c.categories.length > 8 ? ', …' : '');
    }
    if (c.null_count) v += ', ' + fmtInt(c.null_count) + ' missing';
    row('obs.' + c.name, v);
  }
  $('info').textContent = '';
  $('info').appendChild(t);
}

function fillColumnPickers(doc) {
  const co = $('color-obs'), dg = $('dot-group'), fc = $('filter-col'), vb = $('violin-by');
  for (const s of [co, dg, fc, vb]) s.textContent = '';
  co.appendChild(new Option('(none)', ''));
  for (const c of obsColumns(doc)) {
    if (c.type === 'string') continue;  // names, not something to colour by
    co.appendChild(new Option(c.name + ' (' + c.type + ')', c.name));
    if (c.type === 'categorical') {
      dg.appendChild(new Option(c.name, c.name));
      vb.appendChild(new Option(c.name, c.name));
    } else if (c.type !== 'bool' && c.type !== 'boolean') {
      fc.appendChild(new Option(c.name, c.name));
    }
  }
  // A grouping of one category says nothing: the first column with two or
  // more is the default.
  const useful = obsColumns(doc).find((c) => c.type === 'categorical' && c.categories && c.categories.length > 1);
  if (useful) { dg.value = useful.name; vb.value = useful.name; }
  if (!dg.options.length) dg.appendChild(new Option('(no categorical column)', ''));
  if (!fc.options.length) fc.appendChild(new Option('(no numeric column)', ''));
}

// The var column holding gene symbols, if the dataset has one; its values
// are read once so that search results show symbol and name side by side.
function findSymbols(doc) {
  const cols = doc.var && doc.var.columns ? doc.var.columns : [];
  const want = params.get('symbols');
  const c = cols.find((x) => x.name === want) ||
    SYMBOL_COLUMNS.map((n) => cols.find((x) => x.name === n && x.type !== 'numeric')).find(Boolean);
  state.symbolCol = c ? c.name : null;
  if (!c) return;
  const id = state.id, gen = state.generation;
  step('reading the gene symbols (' + c.name + ')', async () => {
    const res = await getJson(dsPath(id, '/var/' + encodeURIComponent(c.name) + (c.type === 'categorical' ? '?values=true' : '')));
    if (gen === state.generation) state.symbols = res.values;
  });
}

function fillEmbeddings(doc) {
  const sel = $('embedding');
  sel.textContent = '';
  note('');
  if (!('obsm' in doc)) {
    note('This ivserve does not list embeddings: it has no obsm route (GET v1/datasets/{id}/obsm/{name}). ' +
         'Upgrade the server to draw the scatter; colouring needs it too.');
    message('No embedding route on this server (the dataset document has no "obsm" list).');
    return;
  }
  const usable = doc.obsm.filter((a) => a.servable !== false && a.shape && a.shape[1] >= 2);
  for (const a of usable) sel.appendChild(new Option(a.name + ' (' + a.shape[1] + ' columns)', a.name));
  if (!usable.length) {
    note(doc.obsm_error ? 'The embeddings could not be read: ' + doc.obsm_error
      : 'This dataset has no embedding (an obsm array of two or more columns) to draw.');
    return;
  }
  const want = params.get('embedding');
  const pref = usable.find((a) => a.name === want) || usable.find((a) => /umap/i.test(a.name)) || usable[0];
  sel.value = pref.name;
}

async function loadEmbedding(name, gen = state.generation) {
  const id = state.id;
  const got = await step('loading the embedding ' + name, async () => {
    const { buf } = await fetchBinary(dsPath(id, '/obsm/' + encodeURIComponent(name) + '?dtype=float32'),
                                      { accept: MEDIA_ARRAY });
    state.timings.embeddingFetched = performance.now();
    return parseIvar(buf);
  });
  if (!got || gen !== state.generation) return;
  if (got.rows !== state.nObs) {
    message('The embedding ' + name + ' has ' + got.rows + ' rows for ' + state.nObs + ' cells.');
    return;
  }
  let xy = got.values;
  if (got.cols !== 2) {
    xy = new Float32Array(2 * got.rows);
    for (let i = 0; i < got.rows; i++) { xy[2 * i] = got.values[got.cols * i]; xy[2 * i + 1] = got.values[got.cols * i + 1]; }
  }
  state.xy = xy;
  state.embedding = name;
  state.timings.embeddingLoaded = performance.now();
  scatter.setPoints(xy, got.rows);
  // The hover index waits until the first frame is out (or the first hover).
  state.nearest = null;
  setTimeout(() => nearestIndex(), 250);
  if (!state.base) setBase(uniform(got.rows), { kind: 'none' });
  else applyColors();
  updateOrder();
  saveLink();
}

function uniform(n) {
  const c = new Uint8Array(4 * n);
  for (let i = 0; i < n; i++) { c[4 * i] = PLAIN[0]; c[4 * i + 1] = PLAIN[1]; c[4 * i + 2] = PLAIN[2]; c[4 * i + 3] = 255; }
  return c;
}

// ---- colouring --------------------------------------------------------------

function setBase(rgba, color, order = null) {
  state.base = rgba;
  state.color = color;
  state.order = order;
  applyColors();
  updateOrder();
  drawLegend();
  drawViolin();
  drawGroups();
  saveLink();
}

// The cells the scatter draws, in order: the colouring's order (file
// order without one) less the cells the filters hide.
function updateOrder() {
  if (!state.xy) return;
  const vis = state.visible, ord = state.order, n = state.nObs;
  if (!vis) {
    scatter.setOrder(ord);
    state.shownCount = n;
  } else {
    const out = new Uint32Array(n);
    let m = 0;
    if (ord) { for (let k = 0; k < ord.length; k++) if (vis[ord[k]]) out[m++] = ord[k]; }
    else for (let i = 0; i < n; i++) if (vis[i]) out[m++] = i;
    scatter.setOrder(out.subarray(0, m));
    state.shownCount = m;
  }
  $('shown-count').textContent = fmtInt(state.shownCount) + (vis ? ' of ' + fmtInt(n) : '');
  if (state.hovered >= 0 && vis && !vis[state.hovered]) setHover(-1);
}

// The colours drawn: the colouring, with unselected cells faded toward
// light grey while a selection exists.
function applyColors() {
  if (!state.base || !state.xy) return;
  const sel = state.selection;
  if (!sel) {
    state.shown = state.base;
  } else {
    const b = state.base, out = new Uint8Array(b.length), m = sel.mask;
    for (let i = 0; i < m.length; i++) {
      const k = 4 * i;
      if (m[i]) { out[k] = b[k]; out[k + 1] = b[k + 1]; out[k + 2] = b[k + 2]; } else {
        out[k] = (b[k] + 3 * 225) >> 2; out[k + 1] = (b[k + 1] + 3 * 225) >> 2; out[k + 2] = (b[k + 2] + 3 * 225) >> 2;
      }
      out[k + 3] = 255;
    }
    state.shown = out;
  }
  scatter.setColors(state.shown);
}

// An obs column's values, fetched once per dataset: a categorical as codes
// (-1 = missing) and its categories, anything else as numbers (NaN =
// missing, booleans 0/1).
async function obsColumn(name) {
  if (state.columns.has(name)) return state.columns.get(name);
  const col = obsColumns(state.doc).find((c) => c.name === name);
  const res = await getJson(dsPath(state.id, '/obs/' + encodeURIComponent(name) +
                                   (col && col.type === 'categorical' ? '?values=true' : '')));
  const n = res.values.length;
  if (n !== state.nObs) throw new Error('obs column ' + name + ' has ' + n + ' values for ' + state.nObs + ' cells');
  let out;
  if (res.categories) {
    const index = new Map(res.categories.map((c, k) => [c.name, k]));
    const codes = new Int32Array(n);
    for (let i = 0; i < n; i++) { const k = index.get(res.values[i]); codes[i] = k === undefined ? -1 : k; }
    out = { codes, categories: res.categories };
  } else {
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const x = res.values[i];
      v[i] = x === null ? NaN : typeof x === 'boolean' ? (x ? 1 : 0) : x;
    }
    out = { values: v };
  }
  state.columns.set(name, out);
  return out;
}

async function colorByObs(name) {
  $('gene').value = '';
  state.values = null;
  if (!name) {
    state.codes = null;
    if (state.nObs) setBase(uniform(state.nObs), { kind: 'none' });
    return;
  }
  const gen = state.generation;
  const t0 = performance.now();
  const col = await step('colouring by ' + name, () => obsColumn(name));
  if (!col || gen !== state.generation) return;
  if (col.codes) {
    state.codes = col.codes;
    state.categories = col.categories;
    // The violins follow the categorical column last coloured by.
    if ([...$('violin-by').options].some((o) => o.value === name)) $('violin-by').value = name;
    setBase(categoricalColors(col.codes, col.categories.length), { kind: 'categorical', name });
  } else {
    state.codes = null;
    const { rgba, lo, hi } = numericColors(col.values);
    setBase(rgba, { kind: 'numeric', name, lo, hi });
  }
  state.timings.recolor = performance.now() - t0;
}

// One gene over every cell, dense.  The page asks for the gene's stored
// entries only (`by: "var"`: one row, the cells that have an entry, read
// from a gene-major copy when the server holds one) and writes them into a
// zeroed vector itself.  "dense": true would send every cell's value: at
// 1,260,000 cells a 5 MB answer the server zeroes and sends for a gene
// stored in a few thousand cells (16-27 ms on the server against 0.4-4 ms,
// and more bytes than the entries for every gene stored in fewer than
// half the cells).  Servers older than `by` refuse the key, and the page
// then asks for CSR rows (one per cell that has an entry) from then on.
let byVarRefused = false;

async function geneVector(id, name) {
  const t0 = performance.now();
  let buf = null;
  if (!byVarRefused) {
    try {
      ({ buf } = await fetchBinary(dsPath(id, '/query'), {
        method: 'POST', accept: MEDIA_CSR, body: { var: { names: [name] }, by: 'var' },
      }));
    } catch (e) {
      if (!(e instanceof ApiError && /unknown key 'by'/.test(e.message))) throw e;
      byVarRefused = true;
    }
  }
  if (!buf) {
    ({ buf } = await fetchBinary(dsPath(id, '/query'), {
      method: 'POST', accept: MEDIA_CSR, body: { var: { names: [name] } },
    }));
  }
  const t1 = performance.now();
  const v = denseColumn(parseIvqs(buf), state.nObs, 0);
  state.timings.geneFetch = t1 - t0;
  state.timings.geneParse = performance.now() - t1;
  return v;
}

// A typed gene to the var index name the query route takes: the name
// itself when the index has it, else the gene whose symbol it is (exact,
// any case).  An unknown name is passed on as it is, for the server's own
// error.  Servers without var/search take names as typed.
async function resolveGene(id, token) {
  if (searchMissing) return { name: token, symbol: null };
  const q = (by) => getJson(dsPath(id, '/var/search?q=' + encodeURIComponent(token) + '&limit=2' +
                                   (by ? '&by=' + encodeURIComponent(by) : '')));
  try {
    const r = await q(null);
    const hit = r.results.find((x) => x.match === 'exact' && x.name === token) ||
                r.results.find((x) => x.match === 'exact');
    if (hit) return { name: hit.name, symbol: symbolOf(hit.index) };
    if (state.symbolCol) {
      const s = await q(state.symbolCol);
      const h = s.results.find((x) => x.match === 'exact');
      if (h) return { name: h.name, symbol: h.value };
    }
  } catch (e) {
    if (!(e instanceof ApiError && (e.status === 404 || e.status === 422))) throw e;
  }
  return { name: token, symbol: null };
}

function symbolOf(index) {
  return state.symbols && index >= 0 && index < state.symbols.length ? state.symbols[index] : null;
}

// The gene box: one name colours by that gene; several (commas or spaces)
// by their mean, cell by cell.
async function colorByGene(text) {
  const tokens = text.split(/[\s,;]+/).filter(Boolean);
  if (!tokens.length || !state.doc) return;
  $('color-obs').value = '';
  hideSuggestions();
  const id = state.id, gen = state.generation;
  const t0 = performance.now();
  const got = await step('colouring by gene ' + tokens.join(', '), async () => {
    const genes = await Promise.all(tokens.map((t) => resolveGene(id, t)));
    const vecs = await Promise.all(genes.map((g) => geneVector(id, g.name)));
    return { genes, v: vecs.length === 1 ? vecs[0] : meanOf(vecs) };
  });
  if (!got || gen !== state.generation) return;
  state.values = got.v;
  state.codes = null;
  const label = got.genes.map((g) => (g.symbol && g.symbol !== g.name ? g.symbol : g.name));
  const t1 = performance.now();
  showGene({
    kind: 'gene', name: label.length === 1 ? label[0] : 'mean of ' + label.join(', '),
    genes: got.genes.map((g) => g.name), symbols: got.genes.map((g) => g.symbol),
  });
  const t3 = performance.now();
  await nextFrame();
  Object.assign(state.timings, { geneColors: state.timings.geneColors, geneUpload: t3 - t1 - state.timings.geneColors,
                                 geneFrame: performance.now() - t3 });
  state.timings.recolor = performance.now() - t0;
  state.timings.recolorGene = tokens.join(',');
}

// Colours and order of the gene vector in state.values, with the clip.
function showGene(color) {
  const t0 = performance.now();
  const { rgba, order, firstExpressing, lo, hi, max } = colourExpression(state.values, state.clip);
  state.timings.geneColors = performance.now() - t0;
  setBase(rgba, { ...color, lo, hi, max, clip: state.clip, expressing: state.nObs - firstExpressing }, order);
}

function nextFrame() {
  return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
}

function drawLegend() {
  const box = $('legend');
  box.textContent = '';
  const c = state.color;
  if (c.kind === 'categorical') {
    // A column of thousands of categories (barcodes, say) would make a
    // legend nobody reads and a slow page: the first LEGEND_MAX are listed.
    const LEGEND_MAX = 300;
    const hidden = state.hidden.column === c.name ? state.hidden.names : new Set();
    const shown = categoryCounts();
    state.categories.slice(0, LEGEND_MAX).forEach((cat, k) => {
      const item = document.createElement('div');
      item.className = 'legend-item' + (hidden.has(cat.name) ? ' hidden-cat' : '');
      item.dataset.category = cat.name;
      const eye = document.createElement('input');
      eye.type = 'checkbox';
      eye.className = 'legend-show';
      eye.checked = !hidden.has(cat.name);
      eye.title = 'show or hide these cells';
      eye.onclick = (e) => { e.stopPropagation(); setHidden(c.name, cat.name, !eye.checked); };
      const sw = document.createElement('span');
      sw.className = 'swatch';
      sw.style.background = cssColor(categoryColor(k));
      const label = document.createElement('span');
      label.className = 'legend-label';
      label.textContent = cat.name;
      const only = document.createElement('button');
      only.type = 'button';
      only.className = 'legend-only';
      only.textContent = 'only';
      only.title = 'show only this category';
      only.onclick = (e) => { e.stopPropagation(); showOnly(c.name, cat.name); };
      const cnt = document.createElement('span');
      cnt.className = 'legend-count';
      // Cells shown of the category's cells, when filters hide some.
      cnt.textContent = shown && shown[k] !== cat.count ? fmtInt(shown[k]) + ' / ' + fmtInt(cat.count) : fmtInt(cat.count);
      item.append(eye, sw, label, only, cnt);
      item.onclick = () => toggleCategory(k, item);
      if (state.selection && state.selection.kind === 'categories' && state.selection.picked.includes(k)) {
        item.classList.add('picked');
      }
      box.appendChild(item);
    });
    if (state.categories.length > LEGEND_MAX) {
      const more = document.createElement('div');
      more.className = 'muted small';
      more.textContent = '… and ' + fmtInt(state.categories.length - LEGEND_MAX) + ' more categories';
      box.appendChild(more);
    }
  } else if (c.kind === 'numeric' || c.kind === 'gene') {
    const title = document.createElement('div');
    title.textContent = c.name;
    if (c.kind === 'gene' && c.genes && c.genes.length === 1 && c.symbols[0] && c.symbols[0] !== c.genes[0]) {
      title.textContent = c.symbols[0] + ' (' + c.genes[0] + ')';
    }
    const bar = document.createElement('div');
    bar.className = 'colorbar';
    bar.style.background = rampGradient();
    const labels = document.createElement('div');
    labels.className = 'colorbar-labels';
    const lo = document.createElement('span'), hi = document.createElement('span');
    lo.textContent = String(+c.lo.toPrecision(4));
    hi.textContent = String(+c.hi.toPrecision(4));
    labels.append(lo, hi);
    box.append(title, bar, labels);
    if (c.kind === 'gene') {
      const z = document.createElement('div');
      z.className = 'small legend-zero';
      const sw = document.createElement('span');
      sw.className = 'swatch';
      sw.style.display = 'inline-block';
      sw.style.background = cssColor(ZERO);
      z.append(sw, ' 0 (not expressed): ' + fmtInt(state.nObs - c.expressing) + ' cells, drawn below the ' +
               fmtInt(c.expressing) + ' expressing' + (c.clip < 100 ? '; clipped at the ' + c.clip +
               'th percentile of expressing cells (max ' + (+c.max.toPrecision(4)) + ')' : ''));
      box.appendChild(z);
    }
  }
}

// Cells shown per category of the coloured column (null without filters).
function categoryCounts() {
  if (!state.visible || !state.codes) return null;
  const out = new Array(state.categories.length).fill(0), v = state.visible, codes = state.codes;
  for (let i = 0; i < codes.length; i++) if (v[i] && codes[i] >= 0) out[codes[i]]++;
  return out;
}

// ---- violins ------------------------------------------------------------------

async function drawViolin() {
  const c = state.color, box = $('violin-box'), by = $('violin-by').value;
  if (c.kind !== 'gene' || !state.values || !by) { box.hidden = true; state.violin = null; return; }
  box.hidden = false;
  const vals = state.values, gen = state.generation;
  const col = await step('grouping the violins by ' + by, () => obsColumn(by));
  if (!col || !col.codes || gen !== state.generation || vals !== state.values) return;
  const hist = histogramsByCategory(vals, col.codes, col.categories.length, state.visible);
  const labels = col.categories.map((x) => x.name);
  const colors = labels.map((_, k) => categoryColor(k));
  const geom = drawViolins($('violin'), hist, labels, colors, c.name + ' by ' + by + ' (expressing cells; % expressing)');
  state.violin = { column: by, labels, hist, geom, colors };
  saveLink();
}

// ---- gene search --------------------------------------------------------------

let searchTimer = 0, searchSeq = 0, searchMissing = false, activeSuggestion = -1;

function hideSuggestions() {
  $('gene-list').hidden = true;
  $('gene').setAttribute('aria-expanded', 'false');
  activeSuggestion = -1;
}

async function suggest(q) {
  const seq = ++searchSeq;
  if (!q || !state.id || searchMissing) { hideSuggestions(); return; }
  let res;
  try {
    state.busy++;
    // The index and the symbol column are searched together; a gene found
    // by both is listed once, where its better match puts it.
    const base = dsPath(state.id, '/var/search?q=' + encodeURIComponent(q) + '&limit=12');
    const [byName, bySymbol] = await Promise.all([
      getJson(base),
      state.symbolCol ? getJson(base + '&by=' + encodeURIComponent(state.symbolCol)) : null,
    ]);
    res = { results: mergeResults(byName.results, bySymbol ? bySymbol.results : [], 12) };
  } catch (e) {
    if (e instanceof ApiError && (e.status === 404 || e.status === 422) && !searchMissing) {
      // An older server routes /var/search to the column "search".
      searchMissing = true;
      message('Gene search is not available on this server (GET v1/datasets/{id}/var/search: ' + describe(e) +
              '); type an exact gene name and press Enter.', 'info');
    } else if (!searchMissing) {
      fail('searching genes', e);
    }
    hideSuggestions();
    return;
  } finally {
    state.busy--;
  }
  if (seq !== searchSeq) return;
  const ul = $('gene-list');
  ul.textContent = '';
  for (const r of res.results) {
    const li = document.createElement('li');
    li.setAttribute('role', 'option');
    li.dataset.name = r.name;
    if (r.symbol !== null && r.symbol !== undefined && r.symbol !== r.name) {
      // Both: the symbol first (what people type), the index name beside it.
      li.dataset.symbol = r.symbol;
      const sym = document.createElement('span');
      sym.className = 'gene-sym';
      sym.textContent = r.symbol;
      const alt = document.createElement('span');
      alt.className = 'alt';
      alt.textContent = r.name;
      li.append(sym, alt);
    } else {
      li.textContent = r.name;
    }
    const kind = document.createElement('span');
    kind.className = 'kind';
    kind.textContent = r.match + (r.by === 'symbol' ? ' (' + state.symbolCol + ')' : '');
    li.appendChild(kind);
    li.onmousedown = (ev) => { ev.preventDefault(); $('gene').value = r.name; colorByGene(r.name); };
    ul.appendChild(li);
  }
  ul.hidden = !res.results.length;
  $('gene').setAttribute('aria-expanded', String(!ul.hidden));
  activeSuggestion = -1;
}

const MATCH_RANK = { exact: 0, prefix: 1, substring: 2 };

// Index results and symbol results as one list: {index, name, symbol,
// match, by}, best match kind first, index before symbol within a kind.
function mergeResults(byName, bySymbol, limit) {
  const seen = new Map();
  const add = (r, by, symbol) => {
    const prev = seen.get(r.index);
    if (prev && MATCH_RANK[prev.match] <= MATCH_RANK[r.match]) return;
    seen.set(r.index, { index: r.index, name: r.name, symbol, match: r.match, by });
  };
  for (const r of byName) add(r, 'name', symbolOf(r.index));
  for (const r of bySymbol) add(r, 'symbol', r.value);
  const all = [...seen.values()];
  const order = (r) => (MATCH_RANK[r.match] ?? 3) * 2 + (r.by === 'symbol' ? 1 : 0);
  all.sort((a, b) => order(a) - order(b));
  return all.slice(0, limit);
}

function moveSuggestion(d) {
  const items = $('gene-list').querySelectorAll('li');
  if (!items.length) return;
  activeSuggestion = (activeSuggestion + d + items.length) % items.length;
  items.forEach((li, i) => li.classList.toggle('active', i === activeSuggestion));
  $('gene').value = items[activeSuggestion].dataset.name;
}

// ---- selection ----------------------------------------------------------------

function setSelection(sel) {
  state.selection = sel;
  applyColors();
  updateSelectionUi();
  saveLink();
}

function clearSelection() {
  state.selection = null;
  for (const el of document.querySelectorAll('.legend-item.picked')) el.classList.remove('picked');
  applyColors();
  updateSelectionUi();
  saveLink();
}

// Cells of a mask that the filters hide are not selected.
function onlyVisible(r) {
  const v = state.visible;
  if (!v) return r;
  let count = 0;
  for (let i = 0; i < r.mask.length; i++) { if (r.mask[i] && !v[i]) r.mask[i] = 0; count += r.mask[i]; }
  return { mask: r.mask, count };
}

function selectCategories(column, picked) {
  const col = state.columns.get(column);
  return onlyVisible(maskFromCodes(col.codes, new Set(picked)));
}

function toggleCategory(k, item) {
  if (!state.codes) return;
  const column = state.color.name;
  const same = state.selection && state.selection.kind === 'categories' && state.selection.column === column;
  const picked = new Set(same ? state.selection.picked : []);
  if (picked.has(k)) picked.delete(k); else picked.add(k);
  if (!same) for (const el of document.querySelectorAll('.legend-item.picked')) el.classList.remove('picked');
  item.classList.toggle('picked', picked.has(k));
  if (!picked.size) { clearSelection(); return; }
  setSelection({ ...selectCategories(column, [...picked]), kind: 'categories', column, picked: [...picked] });
}

function shapeMask(shape) {
  const r = shape.kind === 'box' ? selectBox(state.xy, state.nObs, shape) : selectPolygon(state.xy, state.nObs, shape.points);
  return onlyVisible(r);
}

function onShape(shape) {
  if (!state.xy) return;
  for (const el of document.querySelectorAll('.legend-item.picked')) el.classList.remove('picked');
  setSelection({ ...shapeMask(shape), kind: shape.kind, box: shape.kind === 'box' ? shape : undefined, points: shape.points });
}

// The selection again from its shape, after the filters changed.
function recomputeSelection() {
  const s = state.selection;
  if (!s) return;
  const r = s.kind === 'categories' ? selectCategories(s.column, s.picked)
    : shapeMask(s.kind === 'box' ? s.box : { kind: 'lasso', points: s.points });
  setSelection({ ...s, mask: r.mask, count: r.count });
}

// ---- filters --------------------------------------------------------------------
// Hidden categories (of one column at a time: hiding in another column's
// legend starts afresh) and numeric ranges; together the visible mask.

function setHidden(column, name, hide) {
  if (state.hidden.column !== column) state.hidden = { column, names: new Set() };
  if (hide) state.hidden.names.add(name); else state.hidden.names.delete(name);
  filtersChanged();
}

function showOnly(column, name) {
  const col = state.columns.get(column);
  state.hidden = { column, names: new Set(col.categories.map((c) => c.name).filter((n) => n !== name)) };
  filtersChanged();
}

async function addRange(column, lo, hi) {
  const gen = state.generation;
  const col = await step('filtering on ' + column, () => obsColumn(column));
  if (!col || gen !== state.generation) return;
  if (!col.values) { message(column + ' is not numeric: hide its categories in the legend instead.', 'info'); return; }
  state.ranges = state.ranges.filter((r) => r.column !== column);
  state.ranges.push({ column, lo, hi, values: col.values });
  filtersChanged();
}

function removeRange(column) {
  state.ranges = state.ranges.filter((r) => r.column !== column);
  filtersChanged();
}

function computeVisible() {
  const h = state.hidden, n = state.nObs;
  const hiddenCodes = [];
  if (h.column && h.names.size && state.columns.has(h.column)) {
    const col = state.columns.get(h.column);
    col.categories.forEach((c, k) => { if (h.names.has(c.name)) hiddenCodes.push(k); });
  }
  if (!hiddenCodes.length && !state.ranges.length) return null;
  const vis = new Uint8Array(n).fill(1);
  if (hiddenCodes.length) {
    const codes = state.columns.get(h.column).codes, hide = new Uint8Array(state.columns.get(h.column).categories.length);
    for (const k of hiddenCodes) hide[k] = 1;
    for (let i = 0; i < n; i++) if (codes[i] >= 0 && hide[codes[i]]) vis[i] = 0;
  }
  for (const r of state.ranges) {
    // NaN (missing) fails both comparisons: a range filter hides it.
    const v = r.values;
    for (let i = 0; i < n; i++) if (!(v[i] >= r.lo && v[i] <= r.hi)) vis[i] = 0;
  }
  return vis;
}

function filtersChanged() {
  state.visible = computeVisible();
  updateOrder();
  recomputeSelection();
  drawLegend();
  drawFilters();
  drawViolin();
  saveLink();
}

function drawFilters() {
  const ul = $('filters');
  ul.textContent = '';
  const h = state.hidden;
  if (h.column && h.names.size) {
    const li = document.createElement('li');
    li.dataset.kind = 'categories';
    li.textContent = h.column + ': ' + h.names.size + ' hidden';
    const x = document.createElement('button');
    x.type = 'button';
    x.textContent = 'show all';
    x.onclick = () => { state.hidden = { column: null, names: new Set() }; filtersChanged(); };
    li.appendChild(x);
    ul.appendChild(li);
  }
  for (const r of state.ranges) {
    const li = document.createElement('li');
    li.dataset.kind = 'range';
    li.dataset.column = r.column;
    li.textContent = (Number.isFinite(r.lo) ? r.lo + ' ≤ ' : '') + r.column + (Number.isFinite(r.hi) ? ' ≤ ' + r.hi : '');
    const x = document.createElement('button');
    x.type = 'button';
    x.textContent = '×';
    x.title = 'remove this filter';
    x.onclick = () => removeRange(r.column);
    li.appendChild(x);
    ul.appendChild(li);
  }
}

function readBound(id, dflt) {
  const t = $(id).value.trim();
  if (!t) return dflt;
  const v = Number(t);
  return Number.isFinite(v) ? v : NaN;
}

// ---- hover and pinned cell ------------------------------------------------------
// The cell under the cursor is found in the grid index (nearest.js) among
// the cells drawn; its ring and position show at once, its obs row (one
// row of GET .../obs) follows when the cursor rests a moment.

const rowCache = new Map();
let hoverTimer = 0, hoverSeq = 0;

function nearestIndex() {
  if (!state.nearest && state.xy) {
    const t0 = performance.now();
    state.nearest = new NearestIndex(state.xy, state.nObs);
    state.timings.nearestIndex = performance.now() - t0;
  }
  return state.nearest;
}

function cellAt(d) {
  if (!d || !nearestIndex()) return -1;
  const r = (scatter.pointSize() / 2 + 3) / scatter.view.scale;
  const vis = state.visible;
  return state.nearest.nearest(d[0], d[1], r, vis ? (i) => vis[i] === 1 : null, null);
}

async function obsRow(i) {
  if (rowCache.has(i)) return rowCache.get(i);
  const res = await getJson(dsPath(state.id, '/obs?offset=' + i + '&limit=1'));
  const row = res.rows && res.rows[0];
  if (!row) throw new Error('the obs table has no row ' + i);
  if (rowCache.size > 500) rowCache.delete(rowCache.keys().next().value);
  rowCache.set(i, row);
  return row;
}

function rowTable(i, row) {
  const t = document.createElement('table');
  const add = (k, v) => { const tr = t.insertRow(); tr.insertCell().textContent = k; tr.insertCell().textContent = v; };
  add('cell', '#' + i + (row ? ' ' + row[state.doc.obs.index || '_index'] : ''));
  if (state.values && state.color.kind === 'gene') add(state.color.name, String(+state.values[i].toPrecision(5)));
  if (row) for (const k of Object.keys(row)) if (k !== (state.doc.obs.index || '_index')) add(k, row[k] === null ? 'NA' : String(row[k]));
  return t;
}

function rings() {
  const out = [];
  if (state.pinned >= 0) out.push({ i: state.pinned, color: PIN_RING });
  if (state.hovered >= 0 && state.hovered !== state.pinned) out.push({ i: state.hovered, color: HOVER_RING });
  scatter.setRings(out);
}
const HOVER_RING = 'rgb(20,20,20)', PIN_RING = 'rgb(220,40,40)';

function setHover(i, p) {
  const card = $('hover-card');
  state.hovered = i;
  rings();
  clearTimeout(hoverTimer);
  if (i < 0) { card.hidden = true; return; }
  card.hidden = false;
  card.style.left = Math.min(p[0] + 14, scatter.canvas.clientWidth - 240) + 'px';
  card.style.top = (p[1] + 14) + 'px';
  card.textContent = '';
  card.dataset.cell = String(i);
  card.appendChild(rowTable(i, rowCache.get(i)));
  if (rowCache.has(i)) { card.dataset.loaded = String(i); return; }
  const seq = ++hoverSeq;
  hoverTimer = setTimeout(async () => {
    const row = await step('reading cell ' + i, () => obsRow(i));
    if (!row || seq !== hoverSeq || state.hovered !== i) return;
    card.textContent = '';
    card.appendChild(rowTable(i, row));
    card.dataset.loaded = String(i);
  }, 60);
}

function onHover(d, p) {
  const t0 = performance.now();
  const i = d ? cellAt(d) : -1;
  if (i !== state.hovered || i >= 0) setHover(i, p);
  state.timings.hover = performance.now() - t0;
}

async function pin(i) {
  state.pinned = i;
  rings();
  showPinned();
  saveLink();
  if (i < 0) return;
  const row = await step('reading cell ' + i, () => obsRow(i));
  if (row && state.pinned === i) showPinned(row);
}

function showPinned(row) {
  const box = $('cell-pinned');
  box.textContent = '';
  box.dataset.cell = String(state.pinned);
  if (state.pinned < 0 || !state.doc) {
    const m = document.createElement('span');
    m.className = 'muted';
    m.textContent = 'Click a cell to pin its details here.';
    box.appendChild(m);
    return;
  }
  box.appendChild(rowTable(state.pinned, row));
  if (row) box.dataset.loaded = String(state.pinned);
  const x = document.createElement('button');
  x.type = 'button';
  x.id = 'unpin';
  x.textContent = 'Unpin';
  x.onclick = () => pin(-1);
  box.appendChild(x);
}

// ---- links ------------------------------------------------------------------------

let linkTimer = 0;

function currentLink() {
  const c = state.color, s = state.selection, h = state.hidden;
  const v = {
    dataset: state.id, embedding: state.embedding,
    color: c.kind === 'categorical' || c.kind === 'numeric' ? c.name : null,
    genes: c.kind === 'gene' ? c.genes : [],
    clip: c.kind === 'gene' ? state.clip : 100,
    hideCol: h.column, hide: [...h.names],
    filters: state.ranges.map((r) => ({ column: r.column, lo: r.lo, hi: r.hi })),
    sel: null,
    view: scatter.userMoved ? { ...scatter.view } : null,
    pin: state.pinned,
    violin: state.violin ? state.violin.column : null,
  };
  if (s && s.kind === 'box') v.sel = { kind: 'box', x0: s.box.x0, y0: s.box.y0, x1: s.box.x1, y1: s.box.y1 };
  else if (s && s.kind === 'lasso') v.sel = { kind: 'lasso', points: s.points };
  else if (s && s.kind === 'categories') {
    v.sel = { kind: 'categories', column: s.column, names: s.picked.map((k) => state.columns.get(s.column).categories[k].name) };
  }
  const extra = params.get('renderer') ? [['renderer', params.get('renderer')]] : [];
  if (params.get('symbols')) extra.push(['symbols', params.get('symbols')]);
  return '?' + writeLink(v, extra).toString();
}

// The address bar follows the view (replaceState: no history entry per
// pan); a moment after the last change, as panning changes it per frame.
function saveLink() {
  if (state.restoring || !state.restored) return;
  clearTimeout(linkTimer);
  linkTimer = setTimeout(() => {
    const q = currentLink();
    if (q !== location.search) history.replaceState(null, '', location.pathname + q);
  }, 150);
}

// The view of the page's own URL, once the dataset and its embedding are
// loaded: filters first (the selection keeps only visible cells), then the
// colouring, the selection, the camera, the pinned cell.
async function restoreLink(gen) {
  state.restoring = true;
  try {
    state.clip = link.clip;
    $('clip').value = String(link.clip);
    if (link.violin && [...$('violin-by').options].some((o) => o.value === link.violin)) $('violin-by').value = link.violin;
    for (const f of link.filters) {
      const col = await step('filtering on ' + f.column, () => obsColumn(f.column));
      if (col && col.values) state.ranges.push({ column: f.column, lo: f.lo, hi: f.hi, values: col.values });
    }
    if (link.hideCol && link.hide.length && (await step('reading ' + link.hideCol, () => obsColumn(link.hideCol)))) {
      state.hidden = { column: link.hideCol, names: new Set(link.hide) };
    }
    if (gen !== state.generation) return;
    state.visible = computeVisible();
    drawFilters();
    updateOrder();
    if (link.color && obsColumns(state.doc).some((c) => c.name === link.color)) {
      $('color-obs').value = link.color;
      await colorByObs(link.color);
    } else if (link.genes.length) {
      $('gene').value = link.genes.join(', ');
      await colorByGene(link.genes.join(', '));
      // The box shows what a person types: symbols where the dataset has them.
      const c = state.color;
      if (c.kind === 'gene') $('gene').value = c.genes.map((g, k) => c.symbols[k] || g).join(', ');
    }
    if (gen !== state.generation) return;
    const s = link.sel;
    if (s && s.kind === 'categories') {
      const col = await step('reading ' + s.column, () => obsColumn(s.column));
      if (col && col.codes) {
        const picked = s.names.map((n) => col.categories.findIndex((c) => c.name === n)).filter((k) => k >= 0);
        if (picked.length) setSelection({ ...selectCategories(s.column, picked), kind: 'categories', column: s.column, picked });
        drawLegend();
      }
    } else if (s && s.kind === 'box') {
      const box = { kind: 'box', x0: Math.min(s.x0, s.x1), x1: Math.max(s.x0, s.x1), y0: Math.min(s.y0, s.y1), y1: Math.max(s.y0, s.y1) };
      setSelection({ ...shapeMask(box), kind: 'box', box });
    } else if (s && s.kind === 'lasso') {
      setSelection({ ...shapeMask({ kind: 'lasso', points: s.points }), kind: 'lasso', points: s.points });
    }
    if (link.view) {
      scatter.view = { ...link.view };
      scatter.userMoved = true;
      scatter.requestDraw();
    }
    if (link.pin >= 0 && link.pin < state.nObs) await pin(link.pin);
  } finally {
    state.restoring = false;
  }
}

// ---- cells list ---------------------------------------------------------------------
// The selected cells' obs rows as CSV, read page by page from the obs
// table (only the pages that hold selected cells).

function csvField(v) {
  const t = v === null || v === undefined ? '' : String(v);
  return /[",\n\r]/.test(t) ? '"' + t.replace(/"/g, '""') + '"' : t;
}

async function downloadCsv() {
  const s = state.selection;
  if (!s || !s.count) return;
  const id = state.id;
  await step('writing the cells list', async () => {
    const idx = maskIndices(s.mask, s.count), PAGE = 100000;
    let cols = null;
    const lines = [];
    for (let k = 0; k < idx.length;) {
      const start = idx[k];
      const res = await getJson(dsPath(id, '/obs?offset=' + start + '&limit=' + PAGE));
      if (!cols) { cols = res.columns; lines.push(['position', ...cols].map(csvField).join(',')); }
      while (k < idx.length && idx[k] < start + PAGE) {
        const row = res.rows[idx[k] - start];
        lines.push([idx[k], ...cols.map((c) => row[c])].map(csvField).join(','));
        k++;
      }
    }
    const blob = new Blob([lines.join('\n') + '\n'], { type: 'text/csv' });
    saveBlob(blob, id + '_cells_' + s.count + '.csv', { rows: s.count });
  });
}

// Hands blob to the browser as a download named name, and notes it in
// state.downloads with what `note` says of it (rows, cols).
function saveBlob(blob, name, note) {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  state.downloads.push({ name, ...note, bytes: blob.size });
}

// ---- selection as .h5ad ------------------------------------------------------------
// POST .../export writes the selection (X, obs and var rows and columns)
// as a .h5ad on the server; the page saves the server's bytes as they
// came, under the name the server gives in Content-Disposition.

function dispositionName(h, fallback) {
  const m = /filename="([^"]+)"/.exec(h || '');
  return m ? m[1] : fallback;
}

async function downloadH5ad() {
  const s = state.selection;
  if (!s || !s.count) return;
  const id = state.id;
  await step('writing the selection as .h5ad', async () => {
    const { buf, headers } = await fetchBinary(dsPath(id, '/export'), { method: 'POST', accept: 'application/x-hdf5', body: selectionBody() });
    const blob = new Blob([buf], { type: 'application/x-hdf5' });
    const name = dispositionName(headers.get('Content-Disposition'), id + '_' + s.count + '_cells.h5ad');
    saveBlob(blob, name, { rows: s.count });
  });
}

// The obs selection as the API takes it: an index list when it is short,
// else the base64 bit mask (n/8 bytes whatever the count).
function selectionBody() {
  const s = state.selection;
  const idx = maskIndices(s.mask, s.count);
  const listBytes = idx.length * 7;
  const maskBytes = Math.ceil(state.nObs / 6);
  return listBytes <= maskBytes ? { obs: { index: Array.from(idx) } } : { obs: { mask: maskBase64(s.mask) } };
}

function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

function curlCommand() {
  const url = absUrl(dsPath(state.id, '/query'));
  const parts = ['curl -sS -X POST ' + shellQuote(url), "-H 'Content-Type: application/json'",
                 "-H 'Accept: " + MEDIA_CSR + "'"];
  if (getToken()) parts.push('-H "Authorization: Bearer $IVSERVE_TOKEN"');
  parts.push('-d ' + shellQuote(JSON.stringify(selectionBody())), '-o selection.ivqs');
  return parts.join(' \\\n  ');
}

function updateSelectionUi() {
  const s = state.selection;
  $('sel-count').textContent = s ? fmtInt(s.count) : '0';
  const any = !!(s && s.count > 0);
  $('sel-download').disabled = !any;
  $('sel-copy').disabled = !any;
  $('sel-csv').disabled = !any;
  $('sel-h5ad').disabled = !any;
  $('keep-a').disabled = !any;
  $('keep-b').disabled = !any;
  drawGroups();
  $('sel-curl').value = any ? curlCommand() : '';
}

async function downloadSelection() {
  const s = state.selection;
  if (!s || !s.count) return;
  const id = state.id;
  await step('downloading the selection', async () => {
    const { buf } = await fetchBinary(dsPath(id, '/query'), { method: 'POST', accept: MEDIA_CSR, body: selectionBody() });
    const parsed = parseIvqs(buf);
    const blob = csrNpz(parsed);
    saveBlob(blob, id + '_selection_' + s.count + '.npz', { rows: parsed.rows, cols: parsed.cols });
  });
}

// ---- marker genes ------------------------------------------------------------------
// POST .../diffexp: group A (kept, or the selection now) against group B
// (kept) or the rest; or every category of the coloured column against
// the rest.  Groups travel as the query route's selections (selectionBody).

function drawGroups() {
  const g = state.groups, s = state.selection;
  $('group-a').textContent = g.a ? 'kept, ' + fmtInt(g.a.count) + ' cells'
    : s && s.count ? 'the selection, ' + fmtInt(s.count) + ' cells' : 'the selection (none yet)';
  $('group-b').textContent = g.b ? 'kept, ' + fmtInt(g.b.count) + ' cells' : 'the rest';
  $('de-run').disabled = !(g.a || (s && s.count));
  $('de-all').disabled = state.color.kind !== 'categorical';
  $('de-all').textContent = state.color.kind === 'categorical' ? 'Markers of every ' + state.color.name : 'Markers of every category';
}

function keepGroup(which) {
  const s = state.selection;
  if (!s || !s.count) return;
  state.groups[which] = { obs: selectionBody().obs, count: s.count };
  drawGroups();
}

async function runDiffexp(body, title) {
  const id = state.id, gen = state.generation;
  const res = await step('finding marker genes', async () => {
    try {
      return await postJson(dsPath(id, '/diffexp'), body);
    } catch (e) {
      if (isMissingRoute(e)) throw new Error('this ivserve has no diffexp route (POST v1/datasets/{id}/diffexp); upgrade the server');
      throw e;
    }
  });
  if (!res || gen !== state.generation) return;
  $('markers-box').hidden = false;
  drawMarkers($('markers'), res, title, symbolOf, (name) => { $('gene').value = name; colorByGene(name); });
  state.markers = res;
}

function markersOfA() {
  const g = state.groups, s = state.selection;
  const a = g.a || (s && s.count ? { obs: selectionBody().obs, count: s.count } : null);
  if (!a) return;
  runDiffexp({ group1: a.obs, group2: g.b ? g.b.obs : 'rest', method: $('de-method').value, top_n: 25 },
             'A (' + fmtInt(a.count) + ' cells) vs ' + (g.b ? 'B (' + fmtInt(g.b.count) + ' cells)' : 'the rest'));
}

function markersOfEvery() {
  if (state.color.kind !== 'categorical') return;
  const col = state.color.name;
  runDiffexp({ group_by: col, reference: 'rest', method: $('de-method').value, top_n: 10 },
             'every ' + col + ' vs the rest');
}

// ---- dot plot -------------------------------------------------------------------

async function drawDots() {
  const genes = $('dot-genes').value.split(/[\s,;]+/).filter(Boolean);
  const by = $('dot-group').value;
  if (!genes.length || !by) { message('Name one or more genes and a categorical column for the dot plot.', 'info'); return; }
  const id = state.id;
  const res = await step('drawing the dot plot', async () => {
    try {
      return await postJson(dsPath(id, '/aggregate'),
        { var: { names: genes }, group_by: [by], stats: ['mean', 'frac_nonzero'] });
    } catch (e) {
      if (isMissingRoute(e)) {
        throw new Error('this ivserve has no aggregate route (POST v1/datasets/{id}/aggregate); upgrade the server');
      }
      throw e;
    }
  });
  if (!res) return;
  const num = (x) => (x === null ? NaN : x);
  drawDotPlot($('dotplot'), {
    genes: res.genes.map((g) => g.name),
    groups: res.groups.map((g) => g.key.join(' / ')),
    mean: res.values.mean.map((r) => r.map(num)),
    frac: res.values.frac_nonzero.map((r) => r.map(num)),
  });
}

// ---- wiring ----------------------------------------------------------------------

function setTool(mode) {
  scatter.setMode(mode);
  for (const m of ['pan', 'box', 'lasso']) $('tool-' + m).classList.toggle('active', m === mode);
}

scatter.onSelect = onShape;
scatter.onHover = (d, p) => {
  $('hover').textContent = d ? d[0].toPrecision(4) + ', ' + d[1].toPrecision(4) : '';
  onHover(d, p);
};
scatter.onClick = (d) => pin(cellAt(d));
scatter.onView = () => { if (scatter.userMoved) saveLink(); };
scatter.onFrame = (n) => {
  if (n && n === state.nObs && state.timings.firstScatter === undefined && state.timings.start !== undefined) {
    state.timings.firstScatter = performance.now();
    performance.mark('iv-first-scatter');
  }
};

$('dataset').onchange = (e) => openDataset(e.target.value);
$('embedding').onchange = (e) => loadEmbedding(e.target.value);
$('color-obs').onchange = (e) => colorByObs(e.target.value);
$('tool-pan').onclick = () => setTool('pan');
$('tool-box').onclick = () => setTool('box');
$('tool-lasso').onclick = () => setTool('lasso');
$('reset-view').onclick = () => { scatter.userMoved = false; scatter.fit(); };
$('sel-clear').onclick = clearSelection;
$('sel-download').onclick = downloadSelection;
$('sel-csv').onclick = downloadCsv;
$('sel-h5ad').onclick = downloadH5ad;
$('keep-a').onclick = () => keepGroup('a');
$('keep-b').onclick = () => keepGroup('b');
$('groups-clear').onclick = () => { state.groups = { a: null, b: null }; drawGroups(); };
$('de-run').onclick = markersOfA;
$('de-all').onclick = markersOfEvery;
for (const c of CLIPS) $('clip').appendChild(new Option(c >= 100 ? 'max (no clip)' : c + 'th percentile', String(c)));
$('clip').onchange = (e) => {
  state.clip = Number(e.target.value);
  if (state.color.kind === 'gene' && state.values) showGene(state.color);
};
$('violin-by').onchange = () => drawViolin();
$('filter-add').onclick = () => {
  const col = $('filter-col').value, lo = readBound('filter-lo', -Infinity), hi = readBound('filter-hi', Infinity);
  if (!col) return;
  if (Number.isNaN(lo) || Number.isNaN(hi)) { message('The filter bounds must be numbers (or empty for no bound).', 'info'); return; }
  addRange(col, lo, hi);
};
$('copy-link').onclick = async () => {
  const url = location.origin + location.pathname + currentLink();
  try { await navigator.clipboard.writeText(url); message('Link copied: it reopens this view.', 'info'); }
  catch (e) { message('Copy this link to reopen the view: ' + url, 'info'); }
};
$('sel-copy').onclick = async () => {
  try { await navigator.clipboard.writeText($('sel-curl').value); message('curl command copied.', 'info'); }
  catch (e) { $('sel-curl').select(); message('Select the command and copy it (the clipboard is not available here).', 'info'); }
};
$('dot-draw').onclick = drawDots;
$('dot-genes').onkeydown = (e) => { if (e.key === 'Enter') drawDots(); };
$('token').value = getToken();
$('token-form').onsubmit = (e) => {
  e.preventDefault();
  setToken($('token').value.trim());
  loadDatasets();
};
const gene = $('gene');
gene.oninput = () => { clearTimeout(searchTimer); searchTimer = setTimeout(() => suggest(gene.value.trim()), 120); };
gene.onkeydown = (e) => {
  if (e.key === 'ArrowDown') { e.preventDefault(); moveSuggestion(1); }
  else if (e.key === 'ArrowUp') { e.preventDefault(); moveSuggestion(-1); }
  else if (e.key === 'Enter') { e.preventDefault(); clearTimeout(searchTimer); searchSeq++; colorByGene(gene.value); }
  else if (e.key === 'Escape') hideSuggestions();
};
gene.onblur = () => setTimeout(hideSuggestions, 150);

// ---- test hook ----------------------------------------------------------------------
// Reports what was drawn, so browser tests compare the picture's inputs
// with the API's answers (tests/python/test_viewer.py).

window.__ivTest = {
  busy: () => state.busy,
  dataset: () => state.id,
  renderer: () => scatter.renderer,
  glName: () => scatter.glName,
  glSkipped: () => scatter.glSkipped,
  nCells: () => state.nObs,
  points: () => scatter.drawnPoints,
  frames: () => scatter.frames,
  coords: (idx) => idx.map((i) => [state.xy[2 * i], state.xy[2 * i + 1]]),
  colors: (idx) => idx.map((i) => Array.from(state.shown.subarray(4 * i, 4 * i + 4))),
  colorInfo: () => ({ ...state.color }),
  dataToScreen: (x, y) => scatter.dataToScreen(x, y),
  pixel: (px, py) => scatter.readPixel(px, py),
  pointSize: () => scatter.pointSize(),
  canvasSize: () => [scatter.canvas.clientWidth, scatter.canvas.clientHeight],
  view: () => ({ ...scatter.view }),
  selection: () => (state.selection ? { count: state.selection.count, kind: state.selection.kind,
                                         box: state.selection.box ? { ...state.selection.box, screen: undefined } : null,
                                         points: state.selection.points || null }
                                      : null),
  selectionIndices: () => (state.selection ? Array.from(maskIndices(state.selection.mask, state.selection.count)) : []),
  curl: () => $('sel-curl').value,
  dotplot: () => readDotPlot($('dotplot')),
  messages: () => state.messages.slice(),
  timings: () => ({ ...state.timings }),
  downloads: () => state.downloads.slice(),
  // What the scatter draws, in order (cell indices), or null for every cell in file order.
  drawOrder: () => (scatter.order ? Array.from(scatter.order) : null),
  visibleCount: () => state.shownCount,
  overlayPixel: (px, py) => scatter.readOverlayPixel(px, py),
  hovered: () => state.hovered,
  pinned: () => state.pinned,
  link: () => currentLink(),
  markers: () => readMarkers($('markers')),
  violin: () => (state.violin ? { column: state.violin.column, labels: state.violin.labels, lo: state.violin.hist.lo,
                                  hi: state.violin.hist.hi, bins: state.violin.hist.bins,
                                  whole: state.violin.hist.whole, counts: state.violin.hist.counts,
                                  cells: state.violin.hist.cells, expressing: state.violin.hist.expressing,
                                  colors: state.violin.colors, geom: state.violin.geom } : null),
  violinPixel: (px, py) => {
    const c = $('violin'), dpr = window.devicePixelRatio || 1;
    return Array.from(c.getContext('2d').getImageData(Math.floor(px * dpr), Math.floor(py * dpr), 1, 1).data);
  },
  // Mean milliseconds of k full redraws (every drawn cell, waited for);
  // fileOrder draws every cell in file order instead, to measure what the
  // draw order costs.
  fullDrawTime: (k = 3, fileOrder = false) => {
    const keep = scatter.order;
    if (fileOrder) scatter.order = null;
    scatter.moveUntil = 0;
    const t0 = performance.now();
    for (let i = 0; i < k; i++) { scatter.draw(); scatter.readPixel(1, 1); }
    const ms = (performance.now() - t0) / k;
    scatter.order = keep;
    return { ms, points: scatter.drawnPoints };
  },
  // Milliseconds of k hover look-ups at the given CSS pixels (each finds
  // the cell, draws its ring and fills the card).
  hoverTime: (points) => {
    const t0 = performance.now();
    for (const p of points) onHover(scatter.screenToData(p[0], p[1]), p);
    return (performance.now() - t0) / points.length;
  },
  // Mean milliseconds of k redraws while panning, each waited for (a pixel
  // is read back), and the points each drew (the moving sample above
  // 400,000 cells); the view settles afterwards as after a real pan.
  drawTime: (k = 10) => {
    const t0 = performance.now();
    for (let i = 0; i < k; i++) {
      scatter.view.cx += 1e-3 / scatter.view.scale;
      scatter.moving();
      scatter.draw();
      scatter.readPixel(1, 1);
    }
    return { ms: (performance.now() - t0) / k, points: scatter.drawnPoints };
  },
};

loadDatasets();
