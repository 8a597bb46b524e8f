// The marker gene table: what POST .../diffexp answered, one row per gene
// (score, log fold change, adjusted p, fraction expressing in each group),
// a heading row per group for "every category" answers.  A click on a
// gene row hands the gene's var name to onGene (the page colours by it).
// Each row keeps the numbers it shows exactly as the server sent them
// (data-*), so tests compare the table with the route's answer.

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return 'NA';
  if (!Number.isFinite(v)) return String(v);
  if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(2);
  return (+v.toPrecision(digits)).toString();
}

function geneRows(tbody, genes, symbolOf, onGene) {
  for (const g of genes) {
    const tr = tbody.insertRow();
    tr.className = 'gene-row';
    tr.dataset.name = g.name;
    tr.dataset.score = String(g.score);
    tr.dataset.logfoldchange = String(g.logfoldchange);
    tr.dataset.pvalAdj = String(g.pval_adj);
    const sym = symbolOf(g.index);
    const cells = [sym && sym !== g.name ? sym + ' (' + g.name + ')' : g.name, fmt(g.score), fmt(g.logfoldchange),
                   fmt(g.pval_adj, 2), fmt(100 * g.frac1, 3) + '%', fmt(100 * g.frac2, 3) + '%'];
    for (const c of cells) tr.insertCell().textContent = c;
    tr.title = 'colour by ' + g.name;
    tr.onclick = () => onGene(g.name);
  }
}

// res: the diffexp answer; title: what was compared.
export function drawMarkers(box, res, title, symbolOf, onGene) {
  box.textContent = '';
  const h = document.createElement('div');
  h.className = 'small';
  h.textContent = title + ' — ' + res.method + (res.log1p ? ', log1p values' : '');
  const t = document.createElement('table');
  const head = t.createTHead().insertRow();
  for (const c of ['gene', 'score', 'log2 FC', 'adj. p', '% in A', '% in B']) {
    const th = document.createElement('th');
    th.textContent = c;
    head.appendChild(th);
  }
  const body = t.createTBody();
  if (res.groups) {
    for (const g of res.groups) {
      const tr = body.insertRow();
      tr.className = 'group-row';
      tr.dataset.key = g.key.join(' / ');
      const td = tr.insertCell();
      td.colSpan = 6;
      td.textContent = g.key.join(' / ') + ' (' + g.n_cells + ' cells)';
      geneRows(body, g.genes, symbolOf, onGene);
    }
  } else {
    geneRows(body, res.genes, symbolOf, onGene);
  }
  box.append(h, t);
}

// What the table shows, read back: [{key|null, genes: [{name, score, logfoldchange, pval_adj}]}].
export function readMarkers(box) {
  const out = [];
  let cur = null;
  for (const tr of box.querySelectorAll('tbody tr')) {
    if (tr.classList.contains('group-row')) { cur = { key: tr.dataset.key, genes: [] }; out.push(cur); continue; }
    if (!cur) { cur = { key: null, genes: [] }; out.push(cur); }
    cur.genes.push({ name: tr.dataset.name, score: Number(tr.dataset.score),
                     logfoldchange: Number(tr.dataset.logfoldchange), pval_adj: Number(tr.dataset.pvalAdj) });
  }
  return out;
}
