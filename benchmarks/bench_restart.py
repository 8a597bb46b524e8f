#!/usr/bin/python3
"""Restart time with the cache folder kept (issue 24), binaries alternating.

For each round and each binary: start `BIN --port P --cache-dir CACHE
--memory-bytes B --other-orientation disk --access-log off ATLAS`, poll
`GET /v1/datasets/ID` every 10 ms until `orientations.genes.state` is
`ready` (bench_scale.py's Srv.wait does the same), read the server's
/proc/PID/status and stat (VmHWM, RssAnon, RssFile; CPU of the server and
its waited-for reader processes), stop it, and print one line with the
`open` seconds of its start-up log.  The cache folder must already hold
the gene-major copy (one start of either binary writes it); binaries that
keep different files in it (kept arrays) share it.

Usage:
  /usr/bin/python3 benchmarks/bench_restart.py --atlas a1m.h5ad --cache DIR
      [--rounds 3] [--memory-bytes 4294967296] BIN [BIN ...]
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def one(binp, atlas, cache, memory, log_path):
    port = free_port()
    t0 = time.time()
    with open(log_path, "w") as log:
        p = subprocess.Popen([binp, "--port", str(port), "--cache-dir", cache, "--memory-bytes",
                              str(memory), "--other-orientation", "disk", "--access-log", "off",
                              atlas], stdout=log, stderr=log)
    ds = os.path.basename(atlas)[:-5]
    url = "http://127.0.0.1:%d/v1/datasets/%s" % (port, ds)
    ready = None
    try:
        while True:
            if p.poll() is not None:
                sys.exit("%s exited: see %s" % (binp, log_path))
            try:
                r = requests.get(url, timeout=5)
                if r.status_code == 200:
                    ready = ready or time.time() - t0
                    if r.json()["orientations"]["genes"]["state"] == "ready":
                        break
            except requests.RequestException:
                pass
            time.sleep(0.01)
        both = time.time() - t0
        with open("/proc/%d/status" % p.pid) as f:
            st = {l.split(":")[0]: int(l.split()[1]) for l in f
                  if l.startswith(("VmHWM", "RssAnon", "RssFile"))}
        with open("/proc/%d/stat" % p.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    with open(log_path) as f:
        m = re.search(r"open ([0-9.]+) s", f.read())
    return ("%s: ready %.2f s, both %.2f s, VmHWM %.0f MiB, RssAnon %.0f MiB, RssFile %.0f MiB, "
            "cpu %.2f s, open %s s" % (binp, ready, both, st["VmHWM"] / 1024, st["RssAnon"] / 1024,
                                        st["RssFile"] / 1024, cpu, m.group(1) if m else "?"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-bytes", type=int, default=4 << 30)
    ap.add_argument("bins", nargs="+")
    a = ap.parse_args()
    logs = tempfile.mkdtemp(prefix="ivserve-restart-")
    for r in range(a.rounds):
        for i, b in enumerate(a.bins):
            print(one(b, a.atlas, a.cache, a.memory_bytes, os.path.join(logs, "%d-%d.log" % (r, i))),
                  flush=True)
    print("logs in", logs)


if __name__ == "__main__":
    main()
