#!/usr/bin/python3
"""The Zarr store (GET /v1/datasets/{id}/zarr/{key}, docs/zarr.md) against
the real server, read by the real clients' request patterns.

Measures:
  * gene: on an atlas (benchmarks/gen_atlas.py), for --genes genes (half
    drawn uniformly, half the most expressed):
      - Vitessce's colour-by-gene: with X/indptr already read (Vitessce
        reads it once), the X/indices and X/data chunks overlapping the
        gene's [indptr[j], indptr[j+1]) fetched at once (--conns parallel
        keep-alive connections, as a browser does): ms from the first
        request to the last byte, requests and bytes per gene, and the
        server's CPU ms per gene; then the same for the last genes
        again, their chunks in the server's cache: this client's and the
        transport's own time, the floor under the first;
      - the same gene's column as zarr-python reads it (its chunks fetched
        at once over --conns connections, decompressed, cut to [a, b))
        without zarr-python, for a machine that has none (the 16-core
        one), ms per gene;
      - zarr-python (Debian's zarr 2.13 + fsspec HTTP), where installed:
        one gene column, X["indices"][a:b] and X["data"][a:b], ms per gene.
  * read_zarr: anndata.read_zarr of a --read-cells dataset (X, obs, var,
    obsm) over HTTP and of the same store copied to local disk key by key
    (the same chunks: compressed alike), with X compared equal; seconds
    each: the first HTTP read (every chunk decoded by the server) and the
    best of --reps after the copy (chunks possibly in the server's cache),
    and the server's CPU seconds during them (/proc: steadier than the
    seconds on a shared machine).  A tiny dataset (300 cells) is read
    over HTTP first, so that the first read does not also time the
    client's own start.
    To compare with uncompressed chunks, build with
    -DCMAKE_C_FLAGS=-DIV_ZARR_ZSTD_LEVEL=0.
    X's chunks are kept in the cache folder by the server's default
    (zarr_keep_entries): the read runs once they are, and the wait and
    the server's CPU for it are reported; --zarr-keep-entries 0 times the
    chunks decoded on request instead.

Usage:
  /usr/bin/python3 benchmarks/bench_zarr.py --bin build/ivserve \\
      --atlas benchmarks/data/atlas_200000.h5ad [--companion ATLAS.ivcsc.h5ad] \\
      [--read-cells 20000] [--genes 40] [--threads 16]
The --read-cells dataset is generated with gen_atlas.py into --work unless
it is there.  --companion names a gene-major copy of the atlas (else the
server builds one in memory before the gene runs).
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import zstandard  # noqa: E402

from ivprocess import ServerProcess, write_config  # noqa: E402

# zarr-python and fsspec are optional: a machine without them (the 16-core
# one) runs the gene part without the zarr-python row.
try:
    import fsspec  # noqa: E402
    import zarr  # noqa: E402
except ImportError:
    fsspec = zarr = None


class Consolidated(zarr.storage.ConsolidatedMetadataStore if zarr else object):
    """Metadata and listings from .zmetadata, chunks from the mapper: what
    zarr.open_consolidated builds, as one store for anndata 0.8's
    read_zarr (which calls zarr.open)."""

    def __init__(self, mapper):
        super().__init__(mapper)
        self.chunks = mapper

    def __getitem__(self, key):
        return self.meta_store[key] if key in self.meta_store else self.chunks[key]


class ConsolidatedHTTP(Consolidated):
    """The same over zarr's FSStore, whose getitems fetches a read's chunks
    concurrently (zarr 2.13 uses it when the store has one)."""

    def getitems(self, keys, **kw):
        return self.chunks.getitems(keys, **kw)


# Genes whose chunks are fetched a second time, from the server's chunk
# cache (their chunks, about 2.3 MB a gene at 1.26 M cells, fit its 48 MiB).
WARM_GENES = 10

# Cells of the dataset read once before the timed reads, and requests
# made at once then (bench_read_zarr).
WARM_CELLS = 300
WARM_REQUESTS = 256


def start(bin_, work, datasets, threads, keep_entries):
    cfg = write_config(work, {"datasets": datasets})
    keep = [] if keep_entries is None else ["--zarr-keep-entries", str(keep_entries)]
    return ServerProcess(work, ["--config", cfg, "--threads", str(threads)] + keep, binary=bin_,
                         ready_timeout=600)


# The server's default zarr_keep_entries (config.h, IV_ZARR_KEEP_ENTRIES).
DEFAULT_KEEP_ENTRIES = 64 << 20


def wait_zarr_kept(url, d, keep_entries, timeout=900):
    """Seconds until both orientations' X chunks of d are kept in the
    cache folder (docs/zarr.md, "X's chunks kept"); None when they will
    not be (a matrix over keep_entries, or a build before the keeping)."""
    limit = DEFAULT_KEEP_ENTRIES if keep_entries is None else keep_entries
    t0 = time.time()
    while time.time() - t0 < timeout:
        doc = requests.get("%s/v1/datasets/%s" % (url, d)).json()
        kept = doc.get("zarr_kept")
        if kept is None or doc["nnz"] > limit:
            return None
        if kept["csr"] and kept["csc"]:
            return time.time() - t0
        time.sleep(0.05)
    raise SystemExit("the Zarr X chunks of %s were not kept in %d s" % (d, timeout))


def wait_gene_major(url, d, timeout=900):
    t0 = time.time()
    while time.time() - t0 < timeout:
        doc = requests.get("%s/v1/datasets/%s" % (url, d)).json()
        if doc["orientation"] == "ivcsc" or doc["orientations"]["genes"]["state"] == "ready":
            return time.time() - t0
        time.sleep(0.5)
    raise SystemExit("the gene-major orientation of %s was not ready in %d s" % (d, timeout))


def pct(xs, q):
    return float(np.percentile(np.array(xs), q))


def chunk_array(body, zarray):
    """A chunk's bytes as the array's dtype, decompressed as its .zarray
    says (none or zstd)."""
    comp = zarray.get("compressor")
    if comp and comp["id"] == "zstd":
        body = zstandard.ZstdDecompressor().decompress(body)
    elif comp:
        raise SystemExit("bench_zarr: compressor %r not handled" % comp["id"])
    return np.frombuffer(body, np.dtype(zarray["dtype"]))


def bench_genes(url, n_genes, conns, server_pid):
    store = "%s/v1/datasets/atlas/zarr" % url
    meta = requests.get(store + "/.zmetadata").json()["metadata"]
    zi, zd = meta["X/indices/.zarray"], meta["X/data/.zarray"]
    C = zi["chunks"][0]
    isz = np.dtype(zi["dtype"]).itemsize
    dsz = np.dtype(zd["dtype"]).itemsize
    t0 = time.perf_counter()
    indptr = chunk_array(requests.get(store + "/X/indptr/0").content, meta["X/indptr/.zarray"])
    t_indptr = time.perf_counter() - t0
    nnz = np.diff(indptr)
    rng = np.random.default_rng(5)
    # Three disjoint sets of genes alike (half drawn uniformly, half among
    # the most expressed), one for each client pattern below, so that each
    # times the first touch of its genes' chunks and not a chunk another
    # pattern left in the server's cache.
    n_rand, n_top = n_genes // 2, n_genes - n_genes // 2
    top = list(np.argsort(nnz)[::-1][: 3 * n_top])
    rest = np.setdiff1d(np.arange(len(nnz)), top)
    rand = list(rng.choice(rest, 3 * n_rand, replace=False))
    sets = [rand[k * n_rand:(k + 1) * n_rand] + top[k::3] for k in range(3)]
    genes = sets[0]
    sessions = [requests.Session() for _ in range(conns)]
    pool = concurrent.futures.ThreadPoolExecutor(conns)

    def fetch(i, key):
        r = sessions[i % conns].get("%s/%s" % (store, key))
        r.raise_for_status()
        return r.content

    def gene_keys(j):
        a, b = int(indptr[j]), int(indptr[j + 1])
        ks = range(a // C, (b - 1) // C + 1) if b > a else range(0)
        return a, b, ks, ["X/indices/%d" % k for k in ks] + ["X/data/%d" % k for k in ks]

    # Vitessce's pattern, each gene's chunks touched for the first time.
    vit = []
    c0 = cpu_seconds(server_pid)
    for j in genes:
        a, b, ks, keys = gene_keys(j)
        t0 = time.perf_counter()
        sizes = [len(x) for x in pool.map(fetch, range(len(keys)), keys)]
        vit.append((time.perf_counter() - t0, len(keys), sum(sizes), b - a))
    cpu_first = (cpu_seconds(server_pid) - c0) / len(genes)
    # The same pattern again for the last WARM_GENES genes, whose chunks
    # the server's chunk cache now holds: what is left is this client and
    # the transport, the floor under the first touch's time.
    again = []
    c0 = cpu_seconds(server_pid)
    for j in genes[-WARM_GENES:]:
        a, b, ks, keys = gene_keys(j)
        t0 = time.perf_counter()
        list(pool.map(fetch, range(len(keys)), keys))
        again.append(time.perf_counter() - t0)
    cpu_again = (cpu_seconds(server_pid) - c0) / len(again)
    # What zarr-python does for X["indices"][a:b], X["data"][a:b] (fetch
    # the chunks at once, decompress, cut), without zarr-python, for a
    # machine that has none.
    bare = []
    for j in sets[1]:
        a, b, ks, keys = gene_keys(j)
        t0 = time.perf_counter()
        bodies = list(pool.map(fetch, range(len(keys)), keys))
        n = len(ks)
        idx = np.concatenate([chunk_array(x, zi) for x in bodies[:n]]) if n else np.zeros(0)
        dat = np.concatenate([chunk_array(x, zd) for x in bodies[n:]]) if n else np.zeros(0)
        lo = ks[0] * C if n else 0
        idx, dat = idx[a - lo:b - lo], dat[a - lo:b - lo]
        bare.append(time.perf_counter() - t0)
        assert len(idx) == len(dat) == b - a
    zp = []
    if zarr:
        g = zarr.open_consolidated(fsspec.get_mapper(store), mode="r")
        xi, xd = g["X"]["indices"], g["X"]["data"]
        for j in sets[2]:
            a, b = int(indptr[j]), int(indptr[j + 1])
            t0 = time.perf_counter()
            idx, dat = xi[a:b], xd[a:b]
            zp.append(time.perf_counter() - t0)
            assert len(idx) == len(dat) == b - a
    else:
        print("bench_zarr: no zarr-python here; its row is left out", file=sys.stderr)
    ms = [v[0] * 1e3 for v in vit]
    out = {
        "x_chunk_entries": C,
        "indptr_ms": t_indptr * 1e3, "indptr_bytes": int(indptr.nbytes),
        "genes": len(genes), "entries_per_gene_median": pct([v[3] for v in vit], 50),
        "entries_per_gene_max": int(max(v[3] for v in vit)),
        "vitessce_ms_median": pct(ms, 50), "vitessce_ms_p90": pct(ms, 90), "vitessce_ms_max": max(ms),
        "vitessce_requests_median": pct([v[1] for v in vit], 50),
        "vitessce_requests_max": max(v[1] for v in vit),
        "vitessce_bytes_median": pct([v[2] for v in vit], 50),
        "vitessce_bytes_max": max(v[2] for v in vit),
        "vitessce_bytes_over_needed_median": pct([v[2] / max(1, v[3] * (isz + dsz)) for v in vit], 50),
        "vitessce_server_cpu_ms_per_gene": cpu_first * 1e3,
        "vitessce_cached_ms_median": pct([z * 1e3 for z in again], 50),
        "vitessce_cached_server_cpu_ms_per_gene": cpu_again * 1e3,
        "gene_column_bare_ms_median": pct([z * 1e3 for z in bare], 50),
        "gene_column_bare_ms_p90": pct([z * 1e3 for z in bare], 90),
    }
    if zp:
        out["zarr_python_ms_median"] = pct([z * 1e3 for z in zp], 50)
        out["zarr_python_ms_p90"] = pct([z * 1e3 for z in zp], 90)
    return out


def copy_store(store, local):
    """Copies every key of the store (metadata of .zmetadata, every chunk)
    to a local directory store."""
    meta = requests.get(store + "/.zmetadata").json()["metadata"]
    s = requests.Session()
    os.makedirs(local, exist_ok=True)
    with open(os.path.join(local, ".zmetadata"), "w") as f:
        json.dump({"metadata": meta, "zarr_consolidated_format": 1}, f)
    for key, doc in meta.items():
        path = os.path.join(local, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f)
        if key.endswith("/.zarray"):
            arr = key[: -len("/.zarray")]
            grid = [(n + c - 1) // c for n, c in zip(doc["shape"], doc["chunks"])]
            for idx in np.ndindex(*grid):
                k = arr + "/" + ".".join(map(str, idx))
                with open(os.path.join(local, k), "wb") as f:
                    f.write(s.get(store + "/" + k).content)


def cpu_seconds(pid):
    """CPU seconds of process pid so far (Linux): its threads' run time
    in nanoseconds (/proc/PID/task/*/schedstat), else user + system time
    in clock ticks (10 ms: too coarse for one gene)."""
    try:
        ns = 0
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                ns += int(f.read().split()[0])
        return ns / 1e9
    except (OSError, ValueError, IndexError):
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_read_zarr(url, work, reps, csr, server_pid):
    import anndata
    sub = "/csr" if csr else ""
    store = "%s/v1/datasets/small/zarr%s" % (url, sub)
    local = os.path.join(work, "small_copy%s.zarr" % ("_csr" if csr else ""))
    # The client's first read_zarr over HTTP pays its own start (imports,
    # the HTTP session, code run once) which the local reads, made
    # later, do not: a read of the tiny dataset (its own chunk cache)
    # first, so that the first read times the server.
    t0 = time.perf_counter()
    warm = "%s/v1/datasets/warm/zarr%s" % (url, sub)
    anndata.read_zarr(ConsolidatedHTTP(zarr.storage.FSStore(warm)))
    # ... and as many requests at once as a read of X/data (absent keys:
    # 404s, no decode), which open the HTTP session's connections.
    zarr.storage.FSStore(warm).getitems(["X/data/%d" % (1000 + i) for i in range(WARM_REQUESTS)])
    t_warm = time.perf_counter() - t0
    # The first read, before anything else touched the store: the server
    # decodes every chunk (later reads may find them in its chunk cache).
    c0, t0 = cpu_seconds(server_pid), time.perf_counter()
    anndata.read_zarr(ConsolidatedHTTP(zarr.storage.FSStore(store)))
    t_first, c_first = time.perf_counter() - t0, cpu_seconds(server_pid) - c0
    if not os.path.exists(os.path.join(local, ".zmetadata")):
        copy_store(store, local)
    t_http, t_local, c_http = [], [], []
    for _ in range(reps):
        c0, t0 = cpu_seconds(server_pid), time.perf_counter()
        a = anndata.read_zarr(ConsolidatedHTTP(zarr.storage.FSStore(store)))
        t_http.append(time.perf_counter() - t0)
        c_http.append(cpu_seconds(server_pid) - c0)
        t0 = time.perf_counter()
        b = anndata.read_zarr(Consolidated(zarr.storage.DirectoryStore(local)))
        t_local.append(time.perf_counter() - t0)
    assert a.shape == b.shape and (a.X != b.X).nnz == 0
    assert a.obs.equals(b.obs) and a.var.equals(b.var)
    w = "read_zarr_%s_" % ("csr" if csr else "csc")
    return {"read_zarr_shape": list(a.shape), "read_zarr_nnz": int(a.X.nnz), w + "warm_up_s": t_warm,
            w + "http_first_s": t_first, w + "http_s": min(t_http), w + "local_s": min(t_local),
            w + "server_cpu_first_s": c_first, w + "server_cpu_s": min(c_http),
            w + "first_ratio": t_first / min(t_local), w + "ratio": min(t_http) / min(t_local),
            w + "x_bytes": sum(os.path.getsize(os.path.join(dp, f))
                               for dp, _, fs in os.walk(os.path.join(local, "X")) for f in fs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--atlas", help="gene runs on this atlas (skipped without)")
    ap.add_argument("--companion", help="a gene-major (IVCSC) copy of the atlas")
    ap.add_argument("--read-cells", type=int, default=20000, help="0: no read_zarr run")
    ap.add_argument("--genes", type=int, default=40)
    ap.add_argument("--conns", type=int, default=6, help="parallel connections (a browser's 6)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(HERE, "data"))
    ap.add_argument("--zarr-keep-entries", type=int,
                    help="the server's zarr_keep_entries (default: its own); 0: X's chunks "
                         "decoded on request, never kept")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench_zarr", dir=args.work)
    out = {"threads": args.threads}
    datasets = []
    if args.atlas:
        d = {"id": "atlas", "path": os.path.abspath(args.atlas)}
        if args.companion:
            d["companion"] = os.path.abspath(args.companion)
        datasets.append(d)
    if args.read_cells:
        small = os.path.join(args.work, "atlas_%d.h5ad" % args.read_cells)
        if not os.path.exists(small):
            subprocess.run([sys.executable, os.path.join(HERE, "gen_atlas.py"), "--cells",
                            str(args.read_cells), "-o", small], check=True)
        datasets.append({"id": "small", "path": small})
        tiny = os.path.join(args.work, "atlas_%d.h5ad" % WARM_CELLS)
        if not os.path.exists(tiny):
            subprocess.run([sys.executable, os.path.join(HERE, "gen_atlas.py"), "--cells",
                            str(WARM_CELLS), "-o", tiny], check=True)
        datasets.append({"id": "warm", "path": tiny})
    s = start(args.bin, tmp, datasets, args.threads, args.zarr_keep_entries)
    try:
        if args.atlas:
            out["gene_major_wait_s"] = wait_gene_major(s.url, "atlas")
            if args.zarr_keep_entries != 0:
                c0 = cpu_seconds(s.proc.pid)
                w = wait_zarr_kept(s.url, "atlas", args.zarr_keep_entries)
                if w is not None:
                    out["zarr_kept_wait_s_atlas"] = w
                    out["zarr_kept_server_cpu_s_atlas"] = cpu_seconds(s.proc.pid) - c0
            out.update(bench_genes(s.url, args.genes, args.conns, s.proc.pid))
        if args.read_cells:
            wait_gene_major(s.url, "small")
            wait_gene_major(s.url, "warm")
            if args.zarr_keep_entries != 0:
                # The first read below is the first after X's chunks are
                # kept: the server's CPU for keeping them is reported here.
                c0 = cpu_seconds(s.proc.pid)
                for d in ("small", "warm"):
                    w = wait_zarr_kept(s.url, d, args.zarr_keep_entries)
                    if w is not None:
                        out["zarr_kept_wait_s_" + d] = w
                out["zarr_kept_server_cpu_s"] = cpu_seconds(s.proc.pid) - c0
            for csr in (True, False):
                out.update(bench_read_zarr(s.url, tmp, args.reps, csr, s.proc.pid))
    finally:
        s.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
