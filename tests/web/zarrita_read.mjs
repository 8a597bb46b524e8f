// Reads an ivserve Zarr store with zarrita (Vitessce's Zarr library), as
// Vitessce does: the whole X/indptr, then only the X/indices and X/data
// elements of one gene's range (CSC), and an obs categorical column
// (codes + vlen-utf8 categories).  Prints one JSON object.
//
//   node zarrita_read.mjs NPM_DIR STORE_URL GENE_INDEX OBS_COLUMN
//
// NPM_DIR is tests/web/npm_setup.sh's folder (zarrita is installed there);
// STORE_URL may carry a query string (?token=...), which zarrita repeats
// on every request.
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [npmDir, url, geneArg, column] = process.argv.slice(2);
const zarr = await import(pathToFileURL(join(npmDir, "node_modules/zarrita/dist/src/index.js")).href);

const store = new zarr.FetchStore(url);
const root = zarr.root(store);
const open = (p) => zarr.open(root.resolve(p), { kind: "array" });

const gene = Number(geneArg);
const indptr = await zarr.get(await open("X/indptr"));
const a = Number(indptr.data[gene]), b = Number(indptr.data[gene + 1]);
const indices = await zarr.get(await open("X/indices"), [zarr.slice(a, b)]);
const data = await zarr.get(await open("X/data"), [zarr.slice(a, b)]);
const xattrs = (await zarr.open(root.resolve("X"), { kind: "group" })).attrs;
const codes = await zarr.get(await open(`obs/${column}/codes`));
const cats = await zarr.get(await open(`obs/${column}/categories`));

console.log(JSON.stringify({
  encoding: xattrs["encoding-type"],
  shape: xattrs.shape,
  indices: Array.from(indices.data, Number),
  data: Array.from(data.data, Number),
  codes: Array.from(codes.data, Number),
  categories: Array.from(cats.data),
}));
