// The viewer page: wires the dataset picker, the scatter, colouring,
// selection, the dot plot and messages together.  Everything the page
// shows comes from the API through api.js; anything that fails is shown
// as a message naming what was being done and what the server said.
//
// URL parameters (for links and tests): ?dataset=ID&embedding=NAME
// &renderer=canvas (force the canvas 2D fallback).

import { ApiError, absUrl, dsPath, fetchBinary, getJson, getToken, isMissingRoute, postJson, setToken } from './api.js';
import { categoricalColors, categoryColor, cssColor, numericColors, rampGradient } from './colors.js';
import { drawDotPlot, readDotPlot } from './dotplot.js';
import { csrNpz, denseColumn, parseIvar, parseIvqs } from './formats.js';
import { Scatter } from './scatter.js';
import { maskBase64, maskFromCodes, maskIndices, selectBox, selectPolygon } from './select.js';

const MEDIA_CSR = 'application/vnd.ivserve.csr';
const MEDIA_ARRAY = 'application/vnd.ivserve.array';
const PLAIN = [70, 90, 120];  // cells when nothing colours them

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
};

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

const scatter = new Scatter($('scatter'), $('overlay'), { forceCanvas: params.get('renderer') === 'canvas' });

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
                         codes: null, categories: null, selection: null });
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
  await loading;
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
  const co = $('color-obs'), dg = $('dot-group');
  co.textContent = '';
  dg.textContent = '';
  co.appendChild(new Option('(none)', ''));
  for (const c of obsColumns(doc)) {
    if (c.type === 'string') continue;  // names, not something to colour by
    co.appendChild(new Option(c.name + ' (' + c.type + ')', c.name));
    if (c.type === 'categorical') dg.appendChild(new Option(c.name, c.name));
  }
  if (!dg.options.length) dg.appendChild(new Option('(no categorical column)', ''));
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
  if (!state.base) setBase(uniform(got.rows), { kind: 'none' });
  else applyColors();
}

function uniform(n) {
  const c = new Uint8Array(4 * n);
  for (let i = 0; i < n; i++) { c[4 * i] = PLAIN[0]; c[4 * i + 1] = PLAIN[1]; c[4 * i + 2] = PLAIN[2]; c[4 * i + 3] = 255; }
  return c;
}

// ---- colouring --------------------------------------------------------------

function setBase(rgba, color) {
  state.base = rgba;
  state.color = color;
  applyColors();
  drawLegend();
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

async function colorByObs(name) {
  $('gene').value = '';
  if (!name) {
    state.codes = null;
    if (state.nObs) setBase(uniform(state.nObs), { kind: 'none' });
    return;
  }
  const col = obsColumns(state.doc).find((c) => c.name === name);
  const id = state.id, gen = state.generation;
  const t0 = performance.now();
  const res = await step('colouring by ' + name, () =>
    getJson(dsPath(id, '/obs/' + encodeURIComponent(name) + (col && col.type === 'categorical' ? '?values=true' : ''))));
  if (!res || gen !== state.generation) return;
  const n = res.values.length;
  if (n !== state.nObs) { message('obs column ' + name + ' has ' + n + ' values for ' + state.nObs + ' cells.'); return; }
  if (res.categories) {
    const index = new Map(res.categories.map((c, k) => [c.name, k]));
    const codes = new Int32Array(n);
    for (let i = 0; i < n; i++) { const k = index.get(res.values[i]); codes[i] = k === undefined ? -1 : k; }
    state.codes = codes;
    state.categories = res.categories;
    setBase(categoricalColors(codes, res.categories.length), { kind: 'categorical', name });
  } else {
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const x = res.values[i];
      v[i] = x === null ? NaN : typeof x === 'boolean' ? (x ? 1 : 0) : x;
    }
    state.codes = null;
    const { rgba, lo, hi } = numericColors(v);
    setBase(rgba, { kind: 'numeric', name, lo, hi });
  }
  state.timings.recolor = performance.now() - t0;
}

// One gene over every cell, dense.  The query route answers the column
// as CSR rows (one per cell that has an entry); cells it leaves out are 0.
// Servers that answer "dense": true send the gene as one vector of every
// cell's value (read from a gene-major copy when they hold one); older ones
// refuse the key, and the page then asks for CSR rows from then on.
let denseRefused = false;

async function geneVector(id, name) {
  const t0 = performance.now();
  let buf = null;
  if (!denseRefused) {
    try {
      ({ buf } = await fetchBinary(dsPath(id, '/query'), {
        method: 'POST', accept: MEDIA_CSR, body: { var: { names: [name] }, by: 'var', dense: true },
      }));
    } catch (e) {
      if (!(e instanceof ApiError && /unknown key '(by|dense)'/.test(e.message))) throw e;
      denseRefused = true;
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
  state.timings.geneDense = !denseRefused;
  state.timings.geneParse = performance.now() - t1;
  return v;
}

async function colorByGene(name) {
  name = name.trim();
  if (!name || !state.doc) return;
  $('color-obs').value = '';
  hideSuggestions();
  const id = state.id, gen = state.generation;
  const t0 = performance.now();
  const v = await step('colouring by gene ' + name, () => geneVector(id, name));
  if (!v || gen !== state.generation) return;
  const t1 = performance.now();
  const { rgba, lo, hi } = numericColors(v);
  const t2 = performance.now();
  state.codes = null;
  setBase(rgba, { kind: 'gene', name, lo, hi });
  const t3 = performance.now();
  await nextFrame();
  Object.assign(state.timings, { geneColors: t2 - t1, geneUpload: t3 - t2, geneFrame: performance.now() - t3 });
  state.timings.recolor = performance.now() - t0;
  state.timings.recolorGene = name;
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
    state.categories.slice(0, LEGEND_MAX).forEach((cat, k) => {
      const item = document.createElement('div');
      item.className = 'legend-item';
      item.dataset.category = cat.name;
      const sw = document.createElement('span');
      sw.className = 'swatch';
      sw.style.background = cssColor(categoryColor(k));
      const label = document.createElement('span');
      label.textContent = cat.name;
      const cnt = document.createElement('span');
      cnt.className = 'legend-count';
      cnt.textContent = fmtInt(cat.count);
      item.append(sw, label, cnt);
      item.onclick = () => toggleCategory(k, item);
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
  }
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
    res = await getJson(dsPath(state.id, '/var/search?q=' + encodeURIComponent(q) + '&limit=12'));
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
    li.textContent = r.name;
    const kind = document.createElement('span');
    kind.className = 'kind';
    kind.textContent = r.match;
    li.appendChild(kind);
    li.onmousedown = (ev) => { ev.preventDefault(); $('gene').value = r.name; colorByGene(r.name); };
    ul.appendChild(li);
  }
  ul.hidden = !res.results.length;
  $('gene').setAttribute('aria-expanded', String(!ul.hidden));
  activeSuggestion = -1;
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
}

function clearSelection() {
  state.selection = null;
  for (const el of document.querySelectorAll('.legend-item.picked')) el.classList.remove('picked');
  applyColors();
  updateSelectionUi();
}

function toggleCategory(k, item) {
  if (!state.codes) return;
  const picked = new Set(state.selection && state.selection.kind === 'categories' ? state.selection.picked : []);
  if (picked.has(k)) picked.delete(k); else picked.add(k);
  item.classList.toggle('picked', picked.has(k));
  if (!picked.size) { clearSelection(); return; }
  const { mask, count } = maskFromCodes(state.codes, picked);
  setSelection({ mask, count, kind: 'categories', picked: [...picked] });
}

function onShape(shape) {
  if (!state.xy) return;
  const r = shape.kind === 'box' ? selectBox(state.xy, state.nObs, shape) : selectPolygon(state.xy, state.nObs, shape.points);
  for (const el of document.querySelectorAll('.legend-item.picked')) el.classList.remove('picked');
  setSelection({ ...r, kind: shape.kind, box: shape.kind === 'box' ? shape : undefined, points: shape.points });
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
    const name = id + '_selection_' + s.count + '.npz';
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60000);
    state.downloads.push({ name, rows: parsed.rows, cols: parsed.cols, bytes: blob.size });
  });
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
scatter.onHover = ([x, y]) => { $('hover').textContent = x.toPrecision(4) + ', ' + y.toPrecision(4); };
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
