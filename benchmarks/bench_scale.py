#!/usr/bin/env python3
"""Scale benchmark: both orientations on disk, restarts, one memory budget.

Runs, on one atlas (made by gen_atlas.py when --atlas does not exist):
  1. first start with an empty cache folder: time until cell queries are
     served, and until the gene-major copy is written to the cache folder
     and serving;
  2. a restart with the cache folder kept: time until both orientations
     serve;
  3. one gene x all cells by gene: warm (chunks cached; with requests'
     default gzip, and again not compressed), and cold (a fresh start,
     and the page cache dropped when run as root);
  4. a mixed load from --clients threads: 10,000 random cells x 2,000
     genes, and 1 cell x 50 genes (latency percentiles, requests/s); with
     --wrk, the same two cases again from wrk with --clients connections
     each (Python's threads share one interpreter lock, so their latencies
     and request rates measure the client as much as the server);
  5. peak RSS (VmHWM) of each server process, against --memory-bytes.
Baseline in the same run: the first start's figures are the baseline of
the restart's (ratio printed), and the in-memory copy
(--other-orientation memory) is measured too unless --no-memory-baseline.

  benchmarks/bench_scale.py --atlas ATLAS.h5ad [--cells N --jobs J]
      [--bin build/ivserve] [--memory-bytes 8589934592] [--clients 64]
      [--seconds 10] [--cache DIR] [--wrk PATH]
"""
import argparse
import atexit
import concurrent.futures as cf
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))


def hwm(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    return 0


def rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pss(pid):
    """Proportional set size: a page shared by n processes counts 1/n in
    each (the HDF5 reader children hand their results over in a memfd the
    server maps, which the RSS of both counts whole)."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree(pid):
    """pid and its descendants (the packer and HDF5 reader processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, t)) as f:
                    todo.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


class TreePeak:
    """The largest resident size of a process and its children together,
    sampled every 50 ms from another thread (VmHWM is one process's): the
    sum of their RSS, and of their PSS (shared pages counted once)."""

    def __init__(self, pid):
        import threading
        self.pid, self.peak, self.peak_pss, self.stop_ = pid, 0, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            procs = tree(self.pid)
            self.peak = max(self.peak, sum(rss(p) for p in procs))
            self.peak_pss = max(self.peak_pss, sum(pss(p) for p in procs))
            time.sleep(0.05)

    def stop(self):
        self.stop_ = True
        self.t.join()
        return self.peak


LIVE = []


def stop_all():
    for p in LIVE:
        if p.poll() is None:
            p.kill()


class Srv:
    def __init__(self, binp, atlas, cache, port, memory, extra=(), log="srv.log"):
        self.t0 = time.time()
        self.log = open(log, "w")
        self.log_path = log
        self.p = subprocess.Popen([binp, "--port", str(port), "--cache-dir", cache,
                                   "--memory-bytes", str(memory), "--access-log", "off",
                                   *extra, atlas], stdout=self.log, stderr=self.log)
        LIVE.append(self.p)
        self.tree = TreePeak(self.p.pid)
        self.url = "http://127.0.0.1:%d" % port
        self.id = os.path.basename(atlas)[:-5]

    def wait(self, timeout=3600):
        ready = both = None
        while time.time() - self.t0 < timeout:
            if self.p.poll() is not None:
                sys.exit("server exited: see its log")
            try:
                r = requests.get(self.url + "/v1/datasets/" + self.id, timeout=5)
                if r.status_code == 200:
                    d = r.json()
                    ready = ready or time.time() - self.t0
                    o = d["orientations"]["genes"]
                    if o["state"] == "ready":
                        both = time.time() - self.t0
                        return ready, both, o.get("source")
                    if o["state"] in ("failed", "skipped"):
                        sys.exit("gene-major copy %s" % o["state"])
            except requests.RequestException:
                pass
            time.sleep(0.02)
        sys.exit("timed out")

    def stop(self):
        peak = hwm(self.p.pid)
        self.tree_peak = self.tree.stop()
        self.tree_pss = self.tree.peak_pss
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(60)
        return peak


def wait_copy(binp, srv, flag, phrase, timeout=600):
    """Seconds from now until the server logs the outcome of the copy its
    log names with phrase (the plain copy, written after the gene-major
    copy; the wide copy, after the plain copy), and that outcome; (None,
    why) for a binary without the flag or when none comes."""
    r = subprocess.run([binp, "--help"], capture_output=True, text=True)
    if flag not in r.stdout + r.stderr:
        return None, "none (this build has no %s)" % flag
    t0 = time.time()
    while time.time() - t0 < timeout:
        with open(srv.log_path) as f:
            line = [ln for ln in f if phrase in ln]
        if line:
            return time.time() - t0, json.loads(line[0])["msg"].split(phrase + " ", 1)[1]
        time.sleep(0.1)
    return None, "none logged within %d s" % timeout


def one_gene(url, ds, gene, encoding=None):
    """ms for one gene by gene, binary; encoding None: requests' default
    Accept-Encoding (gzip, deflate), as a Python client asks."""
    headers = {"Accept": "application/vnd.ivserve.csr"}
    if encoding:
        headers["Accept-Encoding"] = encoding
    t = time.perf_counter()
    r = requests.post(url + "/v1/datasets/%s/query" % ds, json={"var": {"index": [gene]}, "by": "var"},
                      headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t) * 1e3


def drop_page_cache():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def mixed(url, ds, n_cells, n_genes, clients, seconds):
    rng = random.Random(7)
    big = [sorted(rng.sample(range(n_cells), 10000)) for _ in range(8)]
    genes2k = sorted(rng.sample(range(n_genes), 2000))
    lat = {"10k x 2000": [], "1 x 50": []}
    codes = {}
    stop = time.time() + seconds
    sess = [requests.Session() for _ in range(clients)]

    def worker(k):
        s = sess[k]
        r2 = random.Random(k)
        while time.time() < stop:
            if k % 8 == 0:
                body, kind = {"obs": {"index": big[r2.randrange(8)]}, "var": {"index": genes2k}}, "10k x 2000"
            else:
                body = {"obs": {"index": [r2.randrange(n_cells)]},
                        "var": {"index": sorted(r2.sample(range(n_genes), 50))}}
                kind = "1 x 50"
            t = time.perf_counter()
            r = s.post(url + "/v1/datasets/%s/query" % ds, json=body,
                       headers={"Accept": "application/vnd.ivserve.csr"}, timeout=120)
            _ = r.content
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            if r.status_code == 200:
                lat[kind].append((time.perf_counter() - t) * 1e3)

    with cf.ThreadPoolExecutor(clients) as ex:
        list(ex.map(worker, range(clients)))
    return lat, codes


WRK_LUA = r"""
local reqs, n, k, counter = {}, 0, 0, 0
function setup(thread)
    counter = counter + 1
    thread:set("tid", counter)
end
function init(args)
    local path = os.getenv("IV_PATH")
    local hdr = {["Content-Type"] = "application/json", Accept = "application/vnd.ivserve.csr"}
    if args[1] == "small" then
        local ncells, genes = tonumber(args[2]), args[3]
        math.randomseed(1000 + tid)
        for i = 1, 4096 do
            n = n + 1
            reqs[n] = wrk.format("GET", path .. "?obs=" .. math.random(0, ncells - 1) .. "&var=" .. genes,
                                 {Accept = "application/vnd.ivserve.csr"})
        end
    else
        for i = 1, #args do
            local f = io.open(args[i], "rb")
            n = n + 1
            reqs[n] = wrk.format("POST", path, hdr, f:read("*a"))
            f:close()
        end
    end
end
function request()
    k = k % n + 1
    return reqs[k]
end
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("IVRESULT %d %d %.1f %.1f %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, e.connect + e.read + e.write + e.timeout))
end
"""


def load_bodies(work, n_cells, n_genes):
    """The mixed load's wrk arguments, by case: the eight bodies of 10,000
    random cells x the same 2,000 random genes (written to work), and the
    1 x 50 case's (a random cell a request, 50 fixed genes)."""
    rng = random.Random(7)
    genes2k = sorted(rng.sample(range(n_genes), 2000))
    bodies = []
    for i in range(8):
        p = os.path.join(work, "big%d.json" % i)
        with open(p, "w") as f:
            json.dump({"obs": {"index": sorted(rng.sample(range(n_cells), 10000))},
                       "var": {"index": genes2k}}, f)
        bodies.append(p)
    genes50 = ",".join(map(str, sorted(rng.sample(range(n_genes), 50))))
    return {"10k x 2000": bodies, "1 x 50": ["small", str(n_cells), genes50]}


def run_wrk(wrk, lua, url, ds, threads, conns, seconds, args):
    """One wrk run of WRK_LUA: (req/s, p50 ms, p99 ms, failed requests)."""
    env = dict(os.environ, IV_PATH="/v1/datasets/%s/query" % ds)
    r = subprocess.run([wrk, "-t%d" % threads, "-c%d" % conns, "-d%ds" % max(1, int(seconds)),
                        "--timeout", "30s", "-s", lua, url, "--", *args],
                       env=env, capture_output=True, text=True, timeout=seconds + 120)
    line = [x for x in r.stdout.splitlines() if x.startswith("IVRESULT")]
    if r.returncode != 0 or not line:
        sys.exit("wrk failed: %s %s" % (r.stdout, r.stderr))
    _, n, dur, p50, p99, non2xx, errs = line[0].split()
    return int(n) / (int(dur) / 1e6), float(p50) / 1e3, float(p99) / 1e3, int(non2xx) + int(errs)


def wrk_cases(wrk, url, ds, n_cells, n_genes, clients, seconds, work):
    """The mixed load's two cases from wrk, one after the other: returns
    {case: (req/s, p50 ms, p99 ms, failed requests)}."""
    bodies = load_bodies(work, n_cells, n_genes)
    lua = os.path.join(work, "load.lua")
    with open(lua, "w") as f:
        f.write(WRK_LUA)
    return {kind: run_wrk(wrk, lua, url, ds, min(clients, os.cpu_count()), clients, seconds, args)
            for kind, args in bodies.items()}


def cells_query(url, ds, cells):
    t = time.perf_counter()
    r = requests.post(url + "/v1/datasets/%s/query" % ds, json={"obs": {"index": cells}},
                      headers={"Accept": "application/vnd.ivserve.csr"}, timeout=120)
    assert r.status_code == 200, r.text
    _ = r.content
    return (time.perf_counter() - t) * 1e3


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p / 100))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--cells", type=int, default=1000000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "ivserve"))
    ap.add_argument("--memory-bytes", type=int, default=8 << 30)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--port", type=int, default=18390)
    ap.add_argument("--no-memory-baseline", action="store_true")
    ap.add_argument("--wrk", default=None, help="wrk binary: run the two load cases from wrk too")
    a = ap.parse_args()
    atexit.register(stop_all)
    if not os.path.exists(a.atlas):
        subprocess.run([sys.executable, os.path.join(HERE, "gen_atlas.py"), "--cells", str(a.cells),
                        "--jobs", str(a.jobs), "-o", a.atlas], check=True)
    # A freshly generated atlas's pages are still going to disk: the first
    # start would share the disk with that writeback (measured: ready
    # 14.14 s and the copy 60.44 s after, against 10.44 s and 43.3 s on
    # the same kind of machine after a sync).
    subprocess.run(["sync"], check=False)
    cache = a.cache or tempfile.mkdtemp(prefix="ivserve-scale-")
    shutil.rmtree(cache, ignore_errors=True)
    work = tempfile.mkdtemp(prefix="ivserve-scale-logs-")
    rows = []

    s = Srv(a.bin, a.atlas, cache, a.port, a.memory_bytes, log=os.path.join(work, "first.log"))
    ready1, both1, src = s.wait()
    doc = requests.get(s.url + "/v1/datasets/" + s.id).json()
    n_cells, n_genes = doc["shape"]
    stream = doc["orientations"]["cells"]["stream_bytes"]
    plain_after, plain = wait_copy(a.bin, s, "--plain-copy", "plain copy of its stream")
    wide_after, wide = wait_copy(a.bin, s, "--wide-copy", "wide copy of its indices")
    g = [one_gene(s.url, s.id, 100 + i) for i in range(5)]
    warm = [one_gene(s.url, s.id, 100 + i) for i in range(5)]
    warm_id = [one_gene(s.url, s.id, 100 + i, "identity") for i in range(5)]
    lat, codes = mixed(s.url, s.id, n_cells, n_genes, a.clients, a.seconds)
    wrk = wrk_cases(a.wrk, s.url, s.id, n_cells, n_genes, a.clients, a.seconds, work) if a.wrk else {}
    peak1 = s.stop()
    tree1 = s.tree_peak
    tpss1 = s.tree_pss
    rows.append(("first start: ready for cell queries", "%.2f s" % ready1))
    rows.append(("first start: gene-major copy on disk and serving", "%.2f s after ready (%s)" % (both1 - ready1, src)))
    rows.append(("plain copy of the cell-major stream (cell queries read it): after the gene-major copy",
                 "%.2f s more (%s)" % (plain_after, plain) if plain_after is not None else plain))
    rows.append(("wide copy of the gene indices (cell queries that select genes read it): after the plain copy",
                 "%.2f s more (%s)" % (wide_after, wide) if wide_after is not None else wide))
    rows.append(("1 gene x all cells by gene, warm (median of 5)", "%.2f ms" % statistics.median(warm)))
    rows.append(("1 gene x all cells by gene, warm, not compressed (median of 5)",
                 "%.2f ms" % statistics.median(warm_id)))
    rows.append(("1 gene x all cells by gene, first read of each gene (median of 5)", "%.2f ms" % statistics.median(g)))

    s = Srv(a.bin, a.atlas, cache, a.port, a.memory_bytes, log=os.path.join(work, "restart.log"))
    ready2, both2, src2 = s.wait()
    peak2 = s.stop()
    tree2 = s.tree_peak
    tpss2 = s.tree_pss
    rows.append(("restart, cache folder kept: both orientations serving", "%.2f s (first start %.2f s: %.2fx)" % (both2, both1, both2 / both1)))

    dropped = drop_page_cache()
    s = Srv(a.bin, a.atlas, cache, a.port, a.memory_bytes, log=os.path.join(work, "cold.log"))
    s.wait()
    if not dropped:
        rows.append(("page cache", "not dropped (not root): the cold figure is a fresh chunk cache only"))
    cold = [one_gene(s.url, s.id, 2000 + 37 * i) for i in range(5)]
    rng = random.Random(11)
    sels = [sorted(rng.sample(range(n_cells), 10000)) for _ in range(5)]
    cold_cells = [cells_query(s.url, s.id, c) for c in sels]
    warm_cells = [cells_query(s.url, s.id, c) for c in sels]
    peak3 = s.stop()
    tree3 = s.tree_peak
    tpss3 = s.tree_pss
    rows.append(("1 gene x all cells by gene, fresh start%s (median of 5)" % (", page cache dropped" if dropped else ""),
                 "%.2f ms" % statistics.median(cold)))
    rows.append(("10,000 random cells x all genes, first read%s / again (median of 5)"
                 % (" after the page cache was dropped" if dropped else ""),
                 "%.1f / %.1f ms" % (statistics.median(cold_cells), statistics.median(warm_cells))))
    for kind, (rps, p50, p99, bad) in wrk.items():
        rows.append(("wrk, %d connections, %s: p50 / p99, req/s" % (a.clients, kind),
                     "%.1f / %.1f ms, %.0f req/s, %d failed" % (p50, p99, rps, bad)))
    for kind, v in lat.items():
        rows.append(("%d Python threads, %s: p50 / p99, req/s" % (a.clients, kind),
                     "%.1f / %.1f ms, %.0f req/s" % (pct(v, 50), pct(v, 99), len(v) / a.seconds)))
    rows.append(("answers by status in the mixed load", ", ".join("%d: %d" % kv for kv in sorted(codes.items()))))
    peak = max(peak1, peak2, peak3)
    rows.append(("peak RSS (VmHWM), first / restart / cold", "%.2f / %.2f / %.2f GiB (budget %.2f GiB, stream %.2f GB): %.2fx the budget"
                 % (peak1 / 2**30, peak2 / 2**30, peak3 / 2**30, a.memory_bytes / 2**30, stream / 1e9, peak / a.memory_bytes)))
    tpeak = max(tree1, tree2, tree3)
    rows.append(("peak RSS of the server and its child processes together (sampled every 50 ms), first / restart / cold",
                 "%.2f / %.2f / %.2f GiB: %.2fx the budget" % (tree1 / 2**30, tree2 / 2**30, tree3 / 2**30,
                                                             tpeak / a.memory_bytes)))
    ppeak = max(tpss1, tpss2, tpss3)
    rows.append(("the same as PSS (pages shared between them, such as the readers' result memfd, counted once)",
                 "%.2f / %.2f / %.2f GiB: %.2fx the budget" % (tpss1 / 2**30, tpss2 / 2**30, tpss3 / 2**30,
                                                             ppeak / a.memory_bytes)))

    if not a.no_memory_baseline:
        cache_m = tempfile.mkdtemp(prefix="ivserve-scale-mem-")
        # The copy in memory needs about the stream's size in the budget's
        # 10% for copies: the baseline gets a budget that holds it.
        big = max(a.memory_bytes, 12 * stream)
        s = Srv(a.bin, a.atlas, cache_m, a.port, big, extra=("--other-orientation", "memory",
                "--transpose-bytes", str(big)), log=os.path.join(work, "memory.log"))
        r3, b3, src3 = s.wait()
        warm_m = [one_gene(s.url, s.id, 100 + i) for i in range(5)]
        warm_m = [one_gene(s.url, s.id, 100 + i) for i in range(5)]
        peak_m = s.stop()
        shutil.rmtree(cache_m, ignore_errors=True)
        rows.append(("baseline, copy in memory (budget %.1f GiB): ready / copy / gene warm / VmHWM" % (big / 2**30),
                     "%.2f s / %.2f s after / %.2f ms / %.2f GiB (disk: %.2fx the time, %.2fx the peak)"
                     % (r3, b3 - r3, statistics.median(warm_m), peak_m / 2**30,
                        statistics.median(warm) / statistics.median(warm_m), peak1 / peak_m)))

    print("atlas %s: %d cells x %d genes, stream %.2f GB; memory_bytes %d; %d cores"
          % (a.atlas, n_cells, n_genes, stream / 1e9, a.memory_bytes, os.cpu_count()))
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print("%-*s  %s" % (w, k, v))
    if not a.cache:
        shutil.rmtree(cache, ignore_errors=True)
    print("logs in", work)


if __name__ == "__main__":
    main()
