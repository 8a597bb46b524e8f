#!/usr/bin/env python3
"""Builds against each other on the query loads, alternating on one atlas.

The 16-core runs of docs/scale.md compare builds this way: a machine's
speed drifts by a fifth within minutes, so each build is restarted in
turn, round after round, on the same atlas and cache folder, and only
figures of one run are compared.  The steps:
  1. a first start with the first build (the copies written to the cache
     folder, unless it holds them already);
  2. for each round, for each build: a restart with the cache folder
     kept (the plain copy on, as it is by default at 10 M cells), the
     plain copy's outcome awaited, 4 s of 4 connections to warm
     the caches, then wrk with the eight bodies of 10,000 random cells x
     the same 2,000 random genes at 1, 16 and 64 connections (wrk -t1,
     -t8, -t16), and 1 random cell x 50 genes at 64 connections; the
     server's VmHWM after them.
Prints one line per build, round and case: req/s, p50 and p99 in ms,
the engine's time a request (the server's decode seconds over the load,
from /metrics, divided by the requests: steadier than req/s when the
machine drifts, and blind to the HTTP side; "-" for a load whose
queries are answered in their set-up job, as one cell's are, which the
counter leaves out), and failed requests.  A BIN may carry flags of its own, in one argument
("build/ivserve --wide-copy off"), to compare one build's settings.

  benchmarks/bench_ab_loads.py --atlas ATLAS.h5ad --cache DIR --wrk PATH
      [--memory-bytes 8589934592] [--threads 16] [--rounds 2] [--seconds 8]
      BIN [BIN ...]
"""
import argparse
import atexit
import os
import requests
import tempfile

from bench_scale import WRK_LUA, Srv, hwm, load_bodies, run_wrk, stop_all, wait_copy

# (label, wrk threads, connections, bodies): the loads of one build's turn.
CASES = (("10k x 2000, 1 connection", 1, 1, "10k x 2000"),
         ("10k x 2000, 16 connections", 8, 16, "10k x 2000"),
         ("10k x 2000, 64 connections", 16, 64, "10k x 2000"),
         ("1 x 50, 64 connections", 16, 64, "1 x 50"))


def decode_seconds(url):
    """The server's ivserve_decode_seconds_total."""
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("ivserve_decode_seconds_total "):
            return float(line.split()[1])
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--cache", required=True, help="cache folder, kept between the builds' turns")
    ap.add_argument("--wrk", required=True)
    ap.add_argument("--memory-bytes", type=int, default=8 << 30)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--port", type=int, default=18391)
    ap.add_argument("bins", nargs="+")
    a = ap.parse_args()
    atexit.register(stop_all)
    os.makedirs(a.cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ivserve-ab-")
    lua = os.path.join(work, "load.lua")
    with open(lua, "w") as f:
        f.write(WRK_LUA)
    # The cell queries read the plain copy, as they do at 10 M cells by
    # default (a stream larger than the caches' part of the budget).
    extra = ("--threads", str(a.threads), "--plain-copy", "on")
    arms = [b.split() for b in a.bins]
    names = ["%d:%s%s" % (i, os.path.basename(os.path.dirname(os.path.abspath(b[0]))) or b[0],
                          "".join(" " + f for f in b[1:])) for i, b in enumerate(arms)]

    def wait_copies(arm, s):
        wait_copy(arm[0], s, "--plain-copy", "plain copy of its stream")
        if " ".join(arm[1:]).find("--wide-copy off") < 0:
            wait_copy(arm[0], s, "--wide-copy", "wide copy of its indices")

    s = Srv(arms[0][0], a.atlas, a.cache, a.port, a.memory_bytes, extra + tuple(arms[0][1:]),
            os.path.join(work, "first.log"))
    ready, both, src = s.wait()
    wait_copies(arms[0], s)
    n_cells, n_genes = requests.get(s.url + "/v1/datasets/" + s.id).json()["shape"]
    s.stop()
    print("atlas %s: %d x %d; first start with %s: ready %.2f s, both orientations %.2f s (%s)"
          % (os.path.basename(a.atlas), n_cells, n_genes, names[0], ready, both, src))
    bodies = load_bodies(work, n_cells, n_genes)

    for rnd in range(1, a.rounds + 1):
        for name, arm in zip(names, arms):
            binp = arm[0]
            s = Srv(binp, a.atlas, a.cache, a.port, a.memory_bytes, extra + tuple(arm[1:]),
                    os.path.join(work, "r%d-%s.log" % (rnd, name.split(":")[0])))
            s.wait()
            wait_copies(arm, s)
            run_wrk(a.wrk, lua, s.url, s.id, 4, 4, 4, bodies["10k x 2000"])   # warm the caches
            for label, t, c, kind in CASES:
                d0 = decode_seconds(s.url)
                rps, p50, p99, bad = run_wrk(a.wrk, lua, s.url, s.id, t, c, a.seconds, bodies[kind])
                spent = decode_seconds(s.url) - d0
                engine = "%6.2f ms" % (spent / max(rps * a.seconds, 1) * 1e3) if spent > 0 else "     -   "
                print("round %d  %-24s  %-27s  %10.1f req/s  p50 %7.1f ms  p99 %7.1f ms  engine %s  %d failed"
                      % (rnd, name, label, rps, p50, p99, engine, bad), flush=True)
            print("round %d  %-24s  %-27s  %10.2f GB" % (rnd, name, "VmHWM after the loads", hwm(s.p.pid) / 1e9),
                  flush=True)
            s.stop()
    print("logs in", work)


if __name__ == "__main__":
    main()
