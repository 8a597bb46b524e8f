"""One query, several HTTP clients: curl, Python's urllib (GET and POST, a
new connection each, as urllib does) and http.client on a kept-alive
connection.  Prints min, p50 and p90 wall times over interleaved runs and
checks that every client got the same number of bytes.

    python3 benchmarks/bench_clients.py BASE_URL DATASET N_CELLS [--cells 300] [--runs 30]

Used by bench_http.sh; measures what a Python user sees next to curl for
a query of a few hundred random cells, all genes, binary encoding.
"""
import argparse
import http.client
import json
import random
import subprocess
import time
import urllib.parse
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("dataset")
    ap.add_argument("n_cells", type=int)
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    rng = random.Random(300)
    obs = sorted(rng.sample(range(a.n_cells), min(a.cells, a.n_cells)))
    path = f"/v1/datasets/{a.dataset}/query"
    get_url = a.base + path + "?obs=" + ",".join(map(str, obs))
    body = json.dumps({"obs": {"index": obs}}).encode()
    accept = "application/vnd.ivserve.csr"
    u = urllib.parse.urlsplit(a.base)
    keep = http.client.HTTPConnection(u.hostname, u.port)

    def curl_get():
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-H", "Accept: " + accept,
                              "-w", "%{time_total} %{size_download}", get_url],
                             capture_output=True, text=True, check=True).stdout.split()
        return float(out[0]), int(out[1])

    def urllib_get():
        t = time.perf_counter()
        n = len(urllib.request.urlopen(urllib.request.Request(get_url, headers={"Accept": accept})).read())
        return time.perf_counter() - t, n

    def urllib_post():
        t = time.perf_counter()
        req = urllib.request.Request(a.base + path, data=body,
                                     headers={"Accept": accept, "Content-Type": "application/json"})
        n = len(urllib.request.urlopen(req).read())
        return time.perf_counter() - t, n

    def keepalive_post():
        t = time.perf_counter()
        keep.request("POST", path, body=body, headers={"Accept": accept, "Content-Type": "application/json"})
        n = len(keep.getresponse().read())
        return time.perf_counter() - t, n

    clients = [("curl GET (time_total)", curl_get), ("urllib GET", urllib_get),
               ("urllib POST", urllib_post), ("http.client POST, kept alive", keepalive_post)]
    times = {name: [] for name, _ in clients}
    sizes = set()
    for name, f in clients:
        f()  # warm-up
    for _ in range(a.runs):
        for name, f in clients:
            dt, n = f()
            times[name].append(dt)
            sizes.add(n)
    if len(sizes) != 1:
        raise SystemExit(f"bench_clients.py: clients got different sizes: {sorted(sizes)}")
    print(f"  {len(obs)} random cells, all genes, binary, {sizes.pop()} bytes; {a.runs} runs each, interleaved")
    print(f"  {'client':32s} {'min ms':>8s} {'p50 ms':>8s} {'p90 ms':>8s}")
    for name, _ in clients:
        v = sorted(times[name])
        print(f"  {name:32s} {v[0] * 1e3:8.2f} {v[len(v) // 2] * 1e3:8.2f} {v[int(len(v) * 0.9)] * 1e3:8.2f}")


if __name__ == "__main__":
    main()
