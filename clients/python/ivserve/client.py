"""Client, Dataset and Query: the objects a user holds.

A Dataset is one served matrix with its obs and var tables.  Indexing it
(ds[obs, var], ds.where(...)) builds a Query, which holds only the two
selections: nothing is fetched until a result is asked for (to_scipy,
to_numpy, to_anndata, iter_blocks, count, shape).  A Query indexed again
composes numpy-style: the selection it already has is resolved to row
numbers (by the server, for names and filters) and the new key picks
among them, so ds.where("cell_type == 'B cell'")[:10, ["CD3E"]] means
the first ten B cells.

Results are always two-dimensional (an int key keeps its axis, as
anndata does).  Rows come in the selection's order, duplicates kept; the
obs and var rows of to_anndata() follow the same order.  Metadata tables
and obsm arrays are fetched once per Dataset and reused.
"""
import copy
import inspect
import io
import json
import struct
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import numpy as np
import requests
import urllib3

from . import frames, selection, uns as uns_doc, wire
from .progress import bar as progress_bar
from .errors import IvserveError, IvserveKeyError, make_error

# Rows a page of a metadata column asks for; halved when the server says
# the page is past its JSON limit (413).
_COLUMN_PAGE = 1_000_000
# The table route serves at most this many rows a page.
_TABLE_PAGE = 100_000


def connect(url, token=None, timeout=60, session=None, compress=False):
    """A Client for the server at url (http://host:port), sending token as
    a bearer token when given.  compress=True asks for gzip result streams:
    about a third of the bytes, for twice the CPU on both sides, so worth
    it on slow links only; by default results come uncompressed."""
    return Client(url, token=token, timeout=timeout, session=session, compress=compress)


class Client:
    def __init__(self, url, token=None, timeout=60, session=None, compress=False):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.compress = compress
        self.session = session or requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def __repr__(self):
        return f"ivserve.Client({self.url!r})"

    # -- HTTP -------------------------------------------------------------

    def request(self, method, path, stream=False, **kw):
        """One request; an error answer or a failed connection raises
        IvserveError.  path starts with /."""
        try:
            r = self.session.request(method, self.url + path, timeout=self.timeout,
                                     stream=stream, **kw)
        except requests.RequestException as e:
            raise IvserveError(None, "connection", f"{method} {path}: {e}") from None
        if r.status_code >= 400:
            try:
                body = r.content
                err = json.loads(body)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "http", r.text[:500]
            finally:
                r.close()
            raise make_error(r.status_code, code, message)
        return r

    def get_json(self, path, **params):
        r = self.request("GET", path, params=params or None)
        try:
            return r.json()
        except ValueError:
            raise IvserveError(r.status_code, "bad_answer", f"GET {path}: the answer is not JSON") from None

    # -- datasets ---------------------------------------------------------

    def datasets(self):
        """The served datasets, as the server lists them: a list of dicts
        with id, title, shape, orientation, nnz, dtype, codec, ready."""
        return self.get_json("/v1/datasets")["datasets"]

    def dataset(self, ds_id):
        """The Dataset ds_id (404 from the server is an IvserveError)."""
        return Dataset(self, ds_id)

    def __getitem__(self, ds_id):
        return self.dataset(ds_id)

    def __iter__(self):
        return iter(d["id"] for d in self.datasets())


class Dataset:
    """One served dataset.  ds[obs, var] and ds.where() give Queries."""

    def __init__(self, client, ds_id):
        self.client = client
        self.id = ds_id
        self.path = "/v1/datasets/" + quote(ds_id, safe="")
        self.info = client.get_json(self.path)
        self.shape = tuple(int(x) for x in self.info["shape"])
        self._frames = {}
        self._names = {}
        # Column values fetched ahead by _prefetch, taken by read_frame.
        self._raw_columns = {}
        self.obsm = Arrays(self, "obsm")
        self.varm = Arrays(self, "varm")
        self.obsp = Graphs(self)
        self._var_by = None
        self._uns = None

    def __repr__(self):
        return (f"<ivserve.Dataset {self.id!r}: {self.shape[0]} cells x {self.shape[1]} genes, "
                f"{self.info.get('nnz')} stored values>")

    @property
    def nnz(self):
        return int(self.info["nnz"])

    @property
    def dtype(self):
        return np.dtype(self.info["dtype"])

    def _axis_len(self, axis, matrix=None):
        shape = self._matrix_shape(matrix)
        return shape[0] if axis == "obs" else shape[1]

    # -- matrices ---------------------------------------------------------

    @property
    def matrices(self):
        """The matrices this dataset serves, by name ("X", "layers/NAME",
        "raw/X"): each its entry of the dataset document (shape, nnz,
        dtype, orientation, servable)."""
        listed = self.info.get("matrices") or [{"name": "X", "shape": list(self.shape), "servable": True}]
        return {m["name"]: m for m in listed}

    def _matrix_shape(self, matrix):
        if matrix in (None, "X"):
            return self.shape
        m = self.matrices.get(matrix)
        if m is None:
            raise IvserveKeyError(404, "unknown_matrix",
                               f"dataset {self.id!r} has no matrix {matrix!r}; it has {list(self.matrices)}")
        return tuple(int(x) for x in m["shape"])

    @staticmethod
    def _var_axis(matrix):
        """The table of a matrix's genes: raw/X's are raw/var's, every other's var's."""
        return "raw/var" if matrix == "raw/X" else "var"

    def _schema(self, axis):
        doc = self.info.get(axis)
        if not doc:
            raise IvserveError(None, "no_metadata", f"dataset {self.id!r} lists no {axis} columns")
        return doc

    # -- metadata ---------------------------------------------------------

    def columns(self, axis="obs", computed=False):
        """Names of the obs or var columns (the computed ones when asked)."""
        return [c["name"] for c in self._schema(axis)["columns"] if computed or not c.get("computed")]

    def names(self, axis="obs"):
        """The obs, var or raw/var names (the DataFrame index), fetched once."""
        if axis not in self._names:
            schema = {} if axis == "raw/var" else self._schema(axis)
            out, offset, total = [], 0, None
            while total is None or offset < total:
                page = self.client.get_json(f"{self.path}/{axis}", columns="", offset=offset,
                                            limit=_TABLE_PAGE, format="json")
                total = int(page["total"])
                rows = page["rows"]
                if not rows and offset < total:
                    raise IvserveError(None, "bad_answer", f"{axis} table page at {offset} is empty")
                out.extend(r["_index"] for r in rows)
                offset += len(rows)
            self._names[axis] = frames.make_index(out, schema.get("index"))
        return self._names[axis]

    @property
    def obs_names(self):
        return self.names("obs")

    @property
    def var_names(self):
        return self.names("var")

    def _column_values(self, axis, name):
        """Every value of one column (categorical labels row by row), paged."""
        path = f"{self.path}/{axis}/{quote(name, safe='')}"
        values, offset, limit, total = [], 0, _COLUMN_PAGE, None
        while total is None or offset < total:
            try:
                page = self.client.get_json(path, offset=offset, limit=limit, values="true")
            except IvserveError as e:
                if e.status == 413 and limit > 1:
                    limit //= 2
                    continue
                raise
            total = int(page.get("selected", page.get("n_rows", 0)))
            vals = page.get("values", [])
            if not vals and offset < total:
                raise IvserveError(None, "bad_answer", f"{axis} column {name!r} page at {offset} is empty")
            values.extend(vals)
            offset += len(vals)
        return values

    def read_frame(self, axis="obs", columns=None, computed=False):
        """The obs or var table as a pandas DataFrame: columns (default all
        the file's, plus the computed ones when computed=True) in the
        server's order, each in the dtype anndata would give it."""
        import pandas as pd

        schema = self._schema(axis)
        specs = {c["name"]: c for c in schema["columns"]}
        if columns is None:
            columns = [c["name"] for c in schema["columns"] if computed or not c.get("computed")]
        else:
            columns = [columns] if isinstance(columns, str) else list(columns)
            unknown = [c for c in columns if c not in specs]
            if unknown:
                raise IvserveKeyError(None, "unknown_column", f"{axis} has no column(s) {unknown}")
        index = self.names(axis)
        cached = self._frames.setdefault(axis, {})
        series = {}
        for name in columns:
            if name not in cached:
                vals = self._raw_columns.pop((axis, name), None)
                if vals is None:
                    vals = self._column_values(axis, name)
                if len(vals) != len(index):
                    raise IvserveError(None, "bad_answer",
                                       f"{axis} column {name!r} has {len(vals)} values for {len(index)} rows")
                cached[name] = frames.column_series(specs[name], vals, index)
            series[name] = cached[name]
        return pd.DataFrame(series, index=index.copy(), columns=columns)

    def _prefetch(self, pool, axis, computed):
        """Starts fetching, in the thread pool, what read_frame(axis) will
        need and does not hold yet (the names, each column's values); returns
        the futures, whose result() raises a fetch's error."""
        if axis == "raw/var" or not self.info.get(axis):
            return []
        futures = []
        if axis not in self._names:
            futures.append(pool.submit(self.names, axis))
        cached = self._frames.get(axis, {})
        for name in self.columns(axis, computed):
            if name not in cached and (axis, name) not in self._raw_columns:
                futures.append(pool.submit(self._fetch_column, axis, name))
        return futures

    def _fetch_column(self, axis, name):
        self._raw_columns[(axis, name)] = self._column_values(axis, name)

    def _holds(self, axis, computed):
        """Whether the whole table (names and every column read_frame
        would give) has been fetched already."""
        cached = self._frames.get(axis, {})
        return axis in self._names and all(name in cached or (axis, name) in self._raw_columns
                                           for name in self.columns(axis, computed))

    def _frame_rows(self, axis, wire_sel, computed):
        """The rows of the obs or var table that the query selection
        wire_sel picks, as read_frame(axis, computed=computed).iloc of its
        positions would give them (rows in the selection's order,
        duplicates repeated, the same dtypes and categories), fetched from
        POST .../{axis}: the server resolves the selection as the query
        route does and sends only those rows, in pages of _TABLE_PAGE.
        None when the server takes no POST there (an older server): the
        caller fetches the whole table instead."""
        import pandas as pd

        schema = self._schema(axis)
        specs = {c["name"]: c for c in schema["columns"]}
        columns = [c["name"] for c in schema["columns"] if computed or not c.get("computed")]
        body = {axis: wire_sel, "columns": columns, "format": "json", "limit": _TABLE_PAGE}
        rows, offset, total = [], 0, None
        while total is None or offset < total:
            try:
                r = self.client.request("POST", f"{self.path}/{axis}", json=dict(body, offset=offset))
            except IvserveError as e:
                if e.status == 405 and total is None:
                    return None
                raise
            try:
                page = r.json()
            except ValueError:
                raise IvserveError(r.status_code, "bad_answer", f"POST {axis}: the answer is not JSON") from None
            total = int(page["total"])
            if not page["rows"] and offset < total:
                raise IvserveError(None, "bad_answer", f"{axis} table page at {offset} is empty")
            rows.extend(page["rows"])
            offset += len(page["rows"])
        # Built on row numbers and indexed after: names may repeat, and
        # pandas will not align columns on an index with duplicates.
        at = pd.RangeIndex(len(rows))
        series = {name: frames.column_series(specs[name], [row[name] for row in rows], at)
                  for name in columns}
        df = pd.DataFrame(series, index=at, columns=columns)
        df.index = frames.make_index([row["_index"] for row in rows], schema.get("index"))
        return df

    def _frame_or_bare(self, axis, computed):
        """The table, or one without columns indexed by row number when
        the server has no metadata for the dataset (it lists no columns)."""
        import pandas as pd

        if axis == "raw/var":
            # raw/var's columns are not in the dataset document: its names only.
            return pd.DataFrame(index=self.names(axis).copy())
        if not self.info.get(axis):
            n = self._axis_len(axis)
            return pd.DataFrame(index=pd.Index([str(i) for i in range(n)], dtype=object))
        return self.read_frame(axis, computed=computed)

    def _raw_var_frame(self):
        """raw/var with its columns as the table route serves them (typed
        by pandas from the JSON values), fetched once."""
        import pandas as pd

        if "raw/var:full" not in self._frames:
            rows, offset, total = [], 0, None
            while total is None or offset < total:
                page = self.client.get_json(f"{self.path}/raw/var", offset=offset, limit=_TABLE_PAGE,
                                            format="json")
                total = int(page["total"])
                if not page["rows"] and offset < total:
                    raise IvserveError(None, "bad_answer", "raw/var table page is empty")
                rows.extend(page["rows"])
                offset += len(page["rows"])
            df = pd.DataFrame(rows)
            df = df.set_index("_index") if len(df.columns) else pd.DataFrame(index=pd.Index([], dtype=object))
            df.index.name = None
            self._frames["raw/var:full"] = df
        return self._frames["raw/var:full"].copy()

    def _uns_fetch(self):
        if self._uns is None:
            self._uns = uns_doc.decode(self.client.get_json(self.path + "/uns"))
        return self._uns

    @property
    def uns(self):
        """The file's uns as anndata.read_h5ad gives it (a dict; numpy
        scalars and arrays of the file's dtypes, str, nested dicts), for
        what the server serves: scalars, 1-D arrays and dicts of them.
        Fetched once; each call returns a copy of its own."""
        return copy.deepcopy(self._uns_fetch()[0])

    @property
    def uns_skipped(self):
        """The uns elements the server leaves out, [(path, reason)]."""
        return list(self._uns_fetch()[1])

    @property
    def obs(self):
        """The obs table (the file's columns; computed ones via read_frame)."""
        return self.read_frame("obs")

    @property
    def var(self):
        return self.read_frame("var")

    # -- selections -------------------------------------------------------

    def _wire(self, key, axis, matrix=None):
        w = selection.to_wire(key, self._axis_len(axis, matrix), axis)
        if axis == "var" and self._var_by and w is not None and "names" in w and "by" not in w:
            w = dict(w, by=self._var_by)
        return w

    def var_by(self, column):
        """This dataset with genes named by a var column instead of the
        var index: ds.var_by("gene_symbols")[:, ["CD3E", "MS4A1"]] selects
        the genes whose gene_symbols are CD3E and MS4A1 (the first row of a
        value listed twice; exact match first, else a unique
        case-insensitive one, as the server matches names).  Results keep
        the var index as var_names, as scanpy's var_names do.  The column
        must hold strings (or be categorical).  Caches are shared with ds."""
        if column not in self.columns("var", computed=True):
            raise IvserveKeyError(None, "unknown_column", f"var has no column {column!r}")
        other = copy.copy(self)
        other._var_by = column
        return other

    def _var_keys(self, matrix=None):
        """The strings var names are matched against: the var_by column's
        values, or the genes' index."""
        import pandas as pd

        if self._var_by and self._var_axis(matrix) == "var":
            return pd.Index([str(v) for v in self._column_values("var", self._var_by)])
        return self.names(self._var_axis(matrix))

    def query(self, obs=None, var=None, matrix=None):
        """A Query of obs and var keys (any form ds[obs, var] takes) of
        matrix: X (None), "layers/NAME" or "raw/X" (whose genes, names
        and var keys are raw/var's)."""
        return Query(self, self._wire(obs, "obs", matrix), self._wire(var, "var", matrix), matrix)

    def __getitem__(self, key):
        obs, var = _split_key(key)
        return self.query(obs, var)

    def where(self, obs=None, var=None, matrix=None):
        """A Query of the cells (obs) and genes (var) matching where
        expressions in the server's grammar, e.g.
        ds.where("cell_type == 'B cell' and n_genes > 200", var="highly_variable")."""
        return Query(self, None if obs is None else {"where": selection.where_text(obs)},
                     None if var is None else {"where": selection.where_text(var)}, matrix)

    def count(self, obs=None, var=None, matrix=None):
        """The server's count of a selection: shape, n_cells, n_genes, nnz,
        total_counts and the binary size, without fetching values."""
        return self.query(obs, var, matrix).count()

    def iter_blocks(self, obs=None, var=None, progress=None, matrix=None):
        """Blocks of a selection as they arrive (see Query.iter_blocks)."""
        return self.query(obs, var, matrix).iter_blocks(progress=progress)

    def aggregate(self, group_by, stats=("mean", "frac_nonzero"), obs=None, var=None, ddof=1,
                  matrix=None):
        """Grouped statistics of the selected genes over groups of cells, on
        servers with the aggregate route: group_by names one or more
        categorical obs columns; stats are among sum, mean, var, nnz,
        frac_nonzero, max.  Returns a dict: each statistic as a DataFrame
        (one row per observed group, in category order; one column per
        gene), and "n_cells" as a Series over the same groups."""
        import pandas as pd

        group_by = [group_by] if isinstance(group_by, str) else list(group_by)
        body = {"group_by": group_by, "stats": list(stats), "ddof": ddof}
        if matrix not in (None, "X"):
            body["matrix"] = matrix
        o, v = self._wire(obs, "obs", matrix), self._wire(var, "var", matrix)
        if o is not None:
            body["obs"] = o
        if v is not None:
            body["var"] = v
        r = self.client.request("POST", f"{self.path}/aggregate", json=body,
                                headers={"Accept": AGG_MEDIA_TYPE})
        doc, values = _aggregate_from_binary(r.content)
        keys = [tuple(g["key"]) for g in doc["groups"]]
        index = (pd.MultiIndex.from_tuples(keys, names=group_by) if len(group_by) > 1
                 else pd.Index([k[0] for k in keys], name=group_by[0]))
        genes = pd.Index([g["name"] for g in doc["genes"]])
        out = {st: pd.DataFrame(values[st], index=index, columns=genes) for st in doc["stats"]}
        out["n_cells"] = pd.Series([int(g["n_cells"]) for g in doc["groups"]], index=index,
                                   name="n_cells")
        return out

    # -- differential expression ------------------------------------------

    def _group_wire(self, key, what):
        """A group of cells for diffexp: a where string, or any obs key."""
        if isinstance(key, str):
            return {"where": selection.where_text(key)}
        w = self._wire(key, "obs")
        if w is None:
            raise IvserveError(None, "bad_selection", f"{what}: select some cells, not all of them")
        return w

    def _diffexp(self, body, method, top_n, log1p, var):
        body["method"] = method
        body["log1p"] = log1p
        if top_n is not None:
            body["top_n"] = int(top_n)
        v = self._wire(var, "var")
        if v is not None:
            body["var"] = v
        return self.client.request("POST", f"{self.path}/diffexp", json=body).json()

    def diffexp(self, group1, group2="rest", method="t-test", top_n=None, log1p="auto", var=None):
        """Marker genes of one group of cells against another (or the rest),
        on servers with the diffexp route: Welch's t-test or the Wilcoxon
        rank-sum test, as scanpy's rank_genes_groups computes them.  group1
        and group2 are where strings ("cell_type == 'B'") or obs keys of any
        form ds[...] takes; group2 "rest" is every other cell.  top_n keeps
        that many genes from each end of the ranking (None: all); log1p
        "auto" lets the server decide from the values (counts get log1p,
        as scanpy expects log data), True or False forces it.  Returns a
        DataFrame with scanpy's rank_genes_groups_df columns, best score
        first: names, scores, logfoldchanges, pvals, pvals_adj, then
        pct_nz_group and pct_nz_reference (the fractions of cells
        expressing), mean_group and mean_reference."""
        body = {"group1": self._group_wire(group1, "group1"),
                "group2": "rest" if isinstance(group2, str) and group2 == "rest"
                else self._group_wire(group2, "group2")}
        doc = self._diffexp(body, method, top_n, log1p, var)
        return _genes_frame(doc["genes"], None)

    def rank_genes_groups(self, group_by, method="t-test", reference="rest", groups=None, top_n=None,
                          log1p="auto", var=None):
        """scanpy's rank_genes_groups(adata, group_by, method=, reference=,
        groups=) done by the server, as sc.get.rank_genes_groups_df gives
        it: one DataFrame of every tested group (column "group", in
        category order) with names, scores, logfoldchanges, pvals,
        pvals_adj, pct_nz_group, pct_nz_reference, mean_group and
        mean_reference, each group's genes best score first.  See diffexp()
        for top_n, log1p and var."""
        import pandas as pd

        body = {"group_by": group_by, "reference": reference}
        if groups is not None:
            body["groups"] = [groups] if isinstance(groups, str) else list(groups)
        doc = self._diffexp(body, method, top_n, log1p, var)
        parts = [_genes_frame(g["genes"], g["key"][0]) for g in doc["groups"]]
        if not parts:
            return _genes_frame([], "")[0:0]
        return pd.concat(parts, ignore_index=True)

    # -- resolving selections to row numbers ------------------------------

    def _obs_positions(self, wire_sel):
        pos = selection.positions(wire_sel, self.shape[0])
        if pos is not None:
            return pos
        # Names and filters are the server's to resolve: the same selection
        # with no genes streams just the row numbers.
        q = Query(self, wire_sel, {"index": []})
        parts = [b.obs for b in q.iter_blocks(progress=False)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _lookup(self, names, by, axis="var"):
        """Row numbers of names in the index (by None) or in column by of
        the genes' table (var or raw/var), -1 where none, matched as the
        server matches them (selection.match_names)."""
        if by is None:
            keys = list(self.names(axis))
        else:
            keys = self._column_values(axis, by)
        return selection.match_names(names, keys)

    def _var_positions(self, wire_sel, matrix=None):
        """Column numbers of a var selection of matrix, in the result's
        order.  The server returns none for a result's columns, so names
        are looked up here as the server does; a filter is resolved through
        the genes' table (by name), which needs their names to be unique."""
        n = self._axis_len("var", matrix)
        axis = self._var_axis(matrix)
        pos = selection.positions(wire_sel, n)
        if pos is not None:
            return pos
        base = {k: v for k, v in wire_sel.items() if k not in ("where", "filter")}
        if "names" in base:
            found = self._lookup(base["names"], base.get("by"), axis)
            unknown = [nm for nm, i in zip(base["names"], found) if i < 0]
            if unknown and base.get("missing") != "ignore":
                raise IvserveKeyError(422, "unknown_name", f"var names not found: {unknown[:10]}")
            pos = np.asarray([i for i in found if i >= 0], dtype=np.int64)
        else:
            pos = selection.positions(base or None, n)
            if pos is None:
                raise IvserveError(None, "bad_selection", f"cannot resolve the var selection {wire_sel}")
        if "where" in wire_sel or "filter" in wire_sel:
            keep = self._var_filter(wire_sel, axis)
            pos = pos[keep[pos]]
        return pos

    def _var_filter(self, wire_sel, axis="var"):
        """A boolean mask over the genes' table (var or raw/var) of a
        selection's filter part."""
        params = {}
        if "filter" in wire_sel:
            raise IvserveError(None, "unsupported",
                               "to_anndata() of a var JSON filter is not supported; use a where string")
        params["where"] = wire_sel["where"]
        names = self.names(axis)
        if not names.is_unique:
            raise IvserveError(None, "ambiguous",
                               "var names are not unique, so the genes a var where selects cannot be "
                               "placed; select genes by index, mask or range instead")
        matched, offset, total = [], 0, None
        while total is None or offset < total:
            page = self.client.get_json(f"{self.path}/{axis}", columns="", offset=offset,
                                        limit=_TABLE_PAGE, **params)
            total = int(page["total"])
            if not page["rows"] and offset < total:
                raise IvserveError(None, "bad_answer", "var table page is empty")
            matched.extend(r["_index"] for r in page["rows"])
            offset += len(page["rows"])
        mask = np.zeros(len(names), dtype=bool)
        mask[names.get_indexer(matched)] = True
        return mask

    def _post(self, route, obs, var, stream=False, headers=None, matrix=None):
        body = {}
        if matrix not in (None, "X"):
            body["matrix"] = matrix
        if obs is not None:
            body["obs"] = obs
        if var is not None:
            body["var"] = var
        return self.client.request("POST", f"{self.path}/{route}", json=body, stream=stream,
                                   headers=headers)


def _split_key(key):
    if not isinstance(key, tuple):
        return key, None
    if len(key) == 2 and key[0] is Ellipsis:
        return None, key[1]
    if len(key) == 2 and key[1] is Ellipsis:
        return key[0], None
    if len(key) == 1:
        return key[0], None
    if len(key) != 2:
        raise IndexError(f"a dataset has two axes; {len(key)} keys were given")
    return key


class Query:
    """A selection of cells and genes of a Dataset; fetches nothing until a
    result is asked for."""

    def __init__(self, ds, obs, var, matrix=None):
        self.ds = ds
        self.obs = obs
        self.var = var
        self.matrix = None if matrix == "X" else matrix
        ds._matrix_shape(self.matrix)   # an unknown matrix fails here, not at the first fetch

    def __repr__(self):
        m = f" matrix={self.matrix!r}" if self.matrix else ""
        return f"<ivserve.Query {self.ds.id!r}{m} obs={_short(self.obs)} var={_short(self.var)}>"

    # -- composing --------------------------------------------------------

    def __getitem__(self, key):
        okey, vkey = _split_key(key)
        ds = self.ds
        obs, var = self.obs, self.var
        if not _is_all(okey):
            if obs is None:
                obs = ds._wire(okey, "obs", self.matrix)
            else:
                pos = ds._obs_positions(obs)
                names = ds.names("obs")[pos] if _has_names(okey) else None
                obs = {"index": selection.subselect(pos, okey, names, "obs").tolist()}
        if not _is_all(vkey):
            if var is None:
                var = ds._wire(vkey, "var", self.matrix)
            else:
                pos = ds._var_positions(var, self.matrix)
                names = ds._var_keys(self.matrix)[pos] if _has_names(vkey) else None
                var = {"index": selection.subselect(pos, vkey, names, "var").tolist()}
        return Query(ds, obs, var, self.matrix)

    def where(self, obs=None, var=None):
        """This selection further restricted by where expressions."""
        return Query(self.ds, _and_where(self.obs, obs), _and_where(self.var, var), self.matrix)

    # -- answers ----------------------------------------------------------

    def count(self):
        """The server's count of this selection (a dict)."""
        return self.ds._post("count", self.obs, self.var, matrix=self.matrix).json()

    @property
    def shape(self):
        c = self.count()
        return (int(c["n_cells"]), int(c["n_genes"]))

    def _stream(self, progress):
        """Reads this selection's result stream: yields its header, then
        each block as it arrives."""
        r = self.ds._post("query", self.obs, self.var, stream=True, matrix=self.matrix,
                          headers={"Accept": wire.MEDIA_TYPE,
                                   "Accept-Encoding": "gzip" if self.ds.client.compress
                                   else "identity"})
        try:
            # The socket's bytes, read frame by frame; chunking is undone by
            # urllib3.  A gzip answer is read through requests' decoded
            # chunks: urllib3 1.x's raw.read(n) returns b"" before the end
            # whenever n compressed bytes decode to nothing yet, which would
            # read as a cut stream.
            if r.headers.get("Content-Encoding"):
                reader = wire.StreamReader(_Chunks(r.iter_content(chunk_size=1 << 20)))
            else:
                r.raw.decode_content = True
                reader = wire.StreamReader(r.raw)
            h = reader.read_header()
            yield h
            bar = progress_bar(h.rows, progress, self.ds.id)
            try:
                for b in reader.blocks():
                    bar.update(b.X.shape[0])
                    yield b
            finally:
                bar.close()
        except urllib3.exceptions.ProtocolError as e:
            # A chunked answer cut inside a chunk: urllib3 says so itself
            # rather than return b"" as it does at a cut between frames.
            raise IvserveError(None, "truncated", f"the result stream was cut: {e}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            raise IvserveError(None, "connection", f"reading the result stream: {e}") from None
        finally:
            r.close()

    def iter_blocks(self, progress=None):
        """Yields Block(obs, X) as blocks arrive, X a csr_matrix of up to
        64 Ki rows; memory is one block, whatever the result's size.
        progress: True / False / None (a tqdm bar for large results when
        tqdm is installed)."""
        stream = self._stream(progress)
        next(stream)
        yield from stream

    def fetch(self, progress=None):
        """(X, obs): the whole result as a csr_matrix and the dataset row of
        each of its rows."""
        stream = self._stream(progress)
        header = next(stream)
        return wire.assemble(header, list(stream))

    def to_scipy(self, progress=None):
        """The result as a scipy.sparse.csr_matrix (cells x genes)."""
        return self.fetch(progress)[0]

    def to_numpy(self, progress=None):
        """The result as a dense numpy array."""
        return self.fetch(progress)[0].toarray()

    def __array__(self, dtype=None):
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def to_anndata(self, obsm=True, computed=False, progress=None, layers=(), raw=False, uns=True,
                   obsp=True):
        """The result as an AnnData equal to anndata's own subset of the
        file, adata[obs, var].copy(), for the elements asked for:

        X (csr, the file's dtype); obs and var rows in the selection's
        order, categoricals without the categories no selected row uses
        (as anndata leaves them after subsetting); obsm arrays the server
        serves (obsm=True: all; a list: those; False: none); layers
        (True: every layer the server can serve; a list of names without
        "layers/"), the same cells and genes of each; raw=True: raw/X of
        the same cells and every raw gene, with raw/var (its columns as
        the table route gives them: categoricals come as strings).
        computed=True adds the server's computed obs / var columns.
        uns=True: the file's uns whole, as a subset keeps it (ds.uns: what
        the server serves of it; ds.uns_skipped names the rest).  obsp
        (True: every element the server serves; a list: those; False:
        none): each among the selected cells, P[obs][:, obs], in the
        file's format (csr_matrix, csc_matrix or a dense array)."""
        import anndata

        ds = self.ds
        var_axis = ds._var_axis(self.matrix)
        # A selected subset's rows of obs and var come from the server, which
        # resolves the selection as it did for the matrix (POST .../obs with
        # the same selection object); a whole table comes column by column
        # and is kept.  Either way the requests run on a few threads while
        # this one reads the matrix.
        by_sel = {ax: sel for ax, sel in (("obs", self.obs), (var_axis, self.var))
                  if sel is not None and ax != "raw/var" and ds.info.get(ax) and not ds._holds(ax, computed)}
        with ThreadPoolExecutor(max_workers=4) as pool:
            rows = {ax: pool.submit(ds._frame_rows, ax, sel, computed) for ax, sel in by_sel.items()}
            ahead = [f for ax in ("obs", var_axis) if ax not in by_sel for f in ds._prefetch(pool, ax, computed)]
            X, obs_pos = self.fetch(progress)
            for f in ahead:
                f.result()
            rows = {ax: f.result() for ax, f in rows.items()}
        obs = _table_rows(ds, rows.get("obs"), "obs", lambda: obs_pos, X.shape[0], computed)
        var = _table_rows(ds, rows.get(var_axis), var_axis, lambda: ds._var_positions(self.var, self.matrix),
                          X.shape[1], computed)
        arrays = {}
        names = list(ds.obsm.keys()) if obsm is True else list(obsm or [])
        for name in names:
            arrays[name] = ds.obsm[name][obs_pos]
        obs_wire = selection._index_wire(np.asarray(obs_pos, dtype=np.int64), ds.shape[0])
        layer_names = ([m[len("layers/"):] for m, e in ds.matrices.items()
                        if m.startswith("layers/") and e.get("servable", True)]
                       if layers is True else list(layers or []))
        mats, var_pos = {}, None
        for name in layer_names:
            m = "layers/" + name
            if m not in ds.matrices or not ds.matrices[m].get("servable", True):
                raise IvserveKeyError(None, "unknown_matrix",
                                      f"dataset {ds.id!r} serves no layer {name!r}; it serves "
                                      f"{[k for k in ds.matrices if k.startswith('layers/')]}")
            if var_pos is None:
                var_pos = ds._var_positions(self.var, self.matrix)
            var_wire = selection._index_wire(np.asarray(var_pos, dtype=np.int64), ds._axis_len("var", m))
            mats[name] = Query(ds, obs_wire, var_wire, m).to_scipy(progress=False)
        kw = {}
        if raw:
            if "raw/X" not in ds.matrices:
                raise IvserveKeyError(None, "unknown_matrix", f"dataset {ds.id!r} has no raw/X")
            kw["raw"] = {"X": Query(ds, obs_wire, None, "raw/X").to_scipy(progress=False),
                         "var": ds._raw_var_frame()}
        if "dtype" in inspect.signature(anndata.AnnData.__init__).parameters:
            # anndata before 0.9 casts X to float32 unless told the dtype.
            kw["dtype"] = X.dtype
        if uns:
            kw["uns"] = ds.uns
        graphs = {name: ds.obsp.fetch(name, obs_wire)
                  for name in (ds.obsp.keys() if obsp is True else list(obsp or []))}
        return anndata.AnnData(X=X, obs=obs, var=var, obsm=arrays or None, layers=mats or None,
                               obsp=graphs or None, **kw)


def _genes_frame(genes, group):
    """A diffexp answer's genes as rank_genes_groups_df's columns."""
    import pandas as pd

    cols = {"names": [g["name"] for g in genes]}
    for out, key in (("scores", "score"), ("logfoldchanges", "logfoldchange"), ("pvals", "pval"),
                     ("pvals_adj", "pval_adj"), ("pct_nz_group", "frac1"),
                     ("pct_nz_reference", "frac2"), ("mean_group", "mean1"),
                     ("mean_reference", "mean2")):
        cols[out] = np.asarray([np.nan if g[key] is None else g[key] for g in genes], dtype=np.float64)
    df = pd.DataFrame(cols)
    if group is not None:
        df.insert(0, "group", pd.Series([str(group)] * len(genes), dtype=object))
    return df


def _table_rows(ds, fetched, axis, positions, n, computed):
    """obs or var of a result of n rows: the rows fetched by selection
    (Dataset._frame_rows), else the whole table's rows at positions()
    (fetched once and kept), without unused categories."""
    if fetched is None:
        fetched = ds._frame_or_bare(axis, computed).iloc[positions()]
    if len(fetched) != n:
        raise IvserveError(None, "bad_answer", f"the result has {n} rows of {axis}; its table gives {len(fetched)}")
    return _drop_unused(fetched)


def _drop_unused(df):
    """df with the unused categories of its categorical columns removed,
    as anndata's subsetting leaves them."""
    import pandas as pd

    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].cat.remove_unused_categories()
    return df


class _Chunks:
    """read(n) over an iterator of non-empty byte chunks; b"" only at the
    end."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.buf = b""
        self.pos = 0

    def read(self, n):
        while self.pos >= len(self.buf):
            self.buf = next(self.chunks, None)
            self.pos = 0
            if self.buf is None:
                self.buf = b""
                return b""
        out = self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        return out


def _is_all(key):
    return key is None or key is Ellipsis or (isinstance(key, slice) and key == slice(None))


def _has_names(key):
    if isinstance(key, str):
        return True
    arr = selection._array(key) if not isinstance(key, (slice, range, int, np.integer)) else None
    return arr is not None and selection._is_names(arr)


def _and_where(sel, expr):
    if expr is None:
        return sel
    expr = selection.where_text(expr)
    if sel is None:
        return {"where": expr}
    sel = dict(sel)
    sel["where"] = f"({sel['where']}) and ({expr})" if "where" in sel else expr
    return sel


def _short(sel):
    if sel is None:
        return "all"
    s = json.dumps(sel)
    return s if len(s) <= 60 else s[:57] + "..."


class Arrays:
    """ds.obsm / ds.varm: the per-cell (per-gene) arrays the server lists
    (embeddings such as X_umap), fetched whole on first use from
    GET .../obsm/{name} and kept; a name the server does not serve (or a
    server without the route) is an IvserveError."""

    def __init__(self, ds, kind):
        self.ds = ds
        self.kind = kind
        self._cache = {}

    def _listing(self):
        """{name: entry} from the dataset document's list ("obsm": [{"name",
        "shape", "dtype", "servable", ...}]), in its order; empty when the
        server lists none."""
        listed = self.ds.info.get(self.kind)
        return {e["name"]: e for e in listed or [] if isinstance(e, dict) and "name" in e}

    def keys(self):
        """Names of the arrays the server can serve."""
        return [k for k, e in self._listing().items() if e.get("servable", True)]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __contains__(self, name):
        return name in self.keys()

    def __repr__(self):
        return f"{self.kind}: {self.keys()}"

    def __getitem__(self, name):
        if name not in self._cache and name not in self.keys():
            raise IvserveKeyError(404, "not_found",
                                  f"dataset {self.ds.id!r} serves no {self.kind} array {name!r}; "
                                  f"it serves {self.keys()}")
        if name not in self._cache:
            self._cache[name] = self._fetch(name)
        return self._cache[name]

    def _fetch(self, name):
        path = f"{self.ds.path}/{self.kind}/{quote(name, safe='')}"
        r = self.ds.client.request("GET", path, headers={"Accept": ARRAY_MEDIA_TYPE})
        ctype = r.headers.get("Content-Type", "")
        body = r.content
        if "json" in ctype:
            return _array_from_json(json.loads(body), name)
        return _array_from_binary(body, name)


class Graphs:
    """ds.obsp: the cell x cell matrices the server lists
    (GET .../obsp, asked on first use), each read as anndata reads it:
    ds.obsp[name] is the whole matrix (fetched once and kept), and
    ds.obsp.fetch(name, obs) the matrix among a selection of cells,
    P[obs][:, obs].  A csr_matrix element comes as a csr_matrix, a
    csc_matrix as a csc_matrix, a dense array as a numpy array; indices
    are sorted.  A name the server does not serve is an IvserveKeyError;
    a server without the route lists nothing."""

    def __init__(self, ds):
        self.ds = ds
        self._list = None
        self._cache = {}

    def _listing(self):
        """{name: entry} of GET .../obsp ("name", "format", "shape",
        "dtype", "nnz", "servable", "reason")."""
        if self._list is None:
            try:
                doc = self.ds.client.get_json(self.ds.path + "/obsp")
            except IvserveError as e:
                if e.status != 404 or e.code != "not_found":
                    raise
                doc = {}  # a server from before the route
            self._list = {e["name"]: e for e in doc.get("obsp") or [] if isinstance(e, dict) and "name" in e}
        return self._list

    def keys(self):
        """Names of the elements the server can serve."""
        return [k for k, e in self._listing().items() if e.get("servable")]

    def listed(self):
        """Every element the server lists, servable or not, with its reason."""
        return [dict(e) for e in self._listing().values()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __contains__(self, name):
        return name in self.keys()

    def __repr__(self):
        return f"obsp: {self.keys()}"

    def __getitem__(self, name):
        if name not in self._cache:
            self._cache[name] = self.fetch(name)
        m = self._cache[name]
        return m.copy()

    def fetch(self, name, obs=None):
        """Element name among the cells of obs, a selection object as
        /query takes it (None: every cell)."""
        entry = self._listing().get(name)
        if entry is None or not entry.get("servable"):
            why = f" ({entry.get('reason')})" if entry else ""
            raise IvserveKeyError(404, "not_found", f"dataset {self.ds.id!r} serves no obsp element "
                                  f"{name!r}{why}; it serves {self.keys()}")
        path = f"{self.ds.path}/obsp/{quote(name, safe='')}"
        headers = {"Accept": wire.MEDIA_TYPE}
        if obs is None:
            r = self.ds.client.request("GET", path, headers=headers)
        else:
            r = self.ds.client.request("POST", path, json={"obs": obs}, headers=headers)
        reader = wire.StreamReader(io.BytesIO(r.content))
        header = reader.read_header()
        X, _ = wire.assemble(header, list(reader.blocks()))
        if entry.get("format") == "csc_matrix":
            return X.tocsc()
        if entry.get("format") == "array":
            # Assigned, not summed as toarray() does (0.0 + -0.0 is 0.0):
            # every value of the file's array is in the answer.
            out = np.zeros(X.shape, dtype=X.dtype)
            out[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] = X.data
            return out
        return X


# Dense arrays (obsm / varm rows), binary, little-endian:
#   header 40 B: "IVAR" | u32 version (1) | i64 rows | i64 cols | char[8] dtype
#                | u32 flags (bit 0: an i64 row id per row follows) | u32 0
#   i64 ids[rows] (flag bit 0 only) | values[rows * cols], row-major
ARRAY_MEDIA_TYPE = "application/vnd.ivserve.array"
_ARRAY_HEADER = struct.Struct("<4sIqq8sII")


def _array_from_json(doc, name):
    vals = doc.get("values")
    if vals is None or "shape" not in doc or "dtype" not in doc:
        raise IvserveError(None, "bad_answer", f"obsm {name!r}: the JSON answer lacks values, shape or dtype")
    dt = np.dtype(doc["dtype"])
    # Non-finite floats are null in JSON: NaN is the closest reading.
    arr = np.array(vals, dtype=np.float64 if dt.kind == "f" else dt)
    return arr.astype(dt, copy=False).reshape(tuple(int(x) for x in doc["shape"]))


def _array_from_binary(body, name):
    """A binary dense-array answer as a numpy array (rows x cols)."""
    if len(body) < _ARRAY_HEADER.size:
        raise IvserveError(None, "truncated", f"obsm {name!r}: {len(body)} bytes, no header")
    magic, version, rows, cols, raw, flags, _ = _ARRAY_HEADER.unpack_from(body, 0)
    if magic != b"IVAR" or version != 1:
        raise IvserveError(None, "bad_stream", f"obsm {name!r}: not an ivserve array (version 1)")
    try:
        dt = np.dtype(raw.rstrip(b"\0").decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        raise IvserveError(None, "bad_stream", f"obsm {name!r}: bad dtype {raw!r}") from None
    if rows < 0 or cols < 0 or dt.kind not in "biuf":
        raise IvserveError(None, "bad_stream", f"obsm {name!r}: bad shape or dtype in the header")
    off = _ARRAY_HEADER.size + (8 * rows if flags & 1 else 0)
    size = rows * cols * dt.itemsize
    if len(body) != off + size:
        raise IvserveError(None, "truncated" if len(body) < off + size else "bad_stream",
                           f"obsm {name!r}: {len(body)} bytes for a {rows} x {cols} {dt} array")
    arr = np.frombuffer(body, dtype=dt, count=rows * cols, offset=off)
    return arr.reshape(rows, cols).astype(dt.newbyteorder("="))


# Grouped statistics, binary: "IVAG" | u32 version (1) | u64 json_len | the
# JSON document without "values" | zero bytes to a multiple of 8 | per stat
# in the document's "stats" order, f64 values[groups * genes], group-major.
AGG_MEDIA_TYPE = "application/vnd.ivserve.aggregate"


def _aggregate_from_binary(body):
    if len(body) < 16 or body[:4] != b"IVAG":
        raise IvserveError(None, "bad_stream", "not an ivserve aggregate answer")
    version, jlen = struct.unpack_from("<IQ", body, 4)
    if version != 1 or jlen > len(body) - 16:
        raise IvserveError(None, "bad_stream", "bad aggregate header")
    try:
        doc = json.loads(body[16:16 + jlen])
        ng, nv, stats = len(doc["groups"]), len(doc["genes"]), list(doc["stats"])
    except (ValueError, KeyError, TypeError):
        raise IvserveError(None, "bad_stream", "bad aggregate document") from None
    pos = (16 + jlen + 7) // 8 * 8
    if len(body) != pos + 8 * ng * nv * len(stats):
        raise IvserveError(None, "bad_stream", "aggregate values do not match the document")
    values = {}
    for st in stats:
        values[st] = np.frombuffer(body, dtype="<f8", count=ng * nv, offset=pos).reshape(ng, nv)
        pos += 8 * ng * nv
    return doc, values
