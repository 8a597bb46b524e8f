#!/bin/bash
# The many-core HTTP table: each case over HTTP (response read to the end)
# next to the engine's own time for the same selection, measured in the
# same run.  Made for the 16-core benchmark machine, where nothing is
# built: it runs prebuilt binaries from one folder (see benchmarks/README.md,
# "16-core runs").
#
#   benchmarks/bench_http16.sh --bin DIR --file ATLAS.h5ad [--threads T]
#        [--duration S] [--port P] [--reps R] [-- extra ivserve flags]
#
# DIR holds ivserve, bench_select and wrk (and the libraries they need, on
# LD_LIBRARY_PATH).  Cases:
#   - 10,000 random cells x all genes, binary: 1 client (curl, best of R),
#     16 and 64 clients (wrk): req/s, p50, p99, GB/s in all;
#   - 1 random cell x 50 genes, 64 clients (wrk): req/s, p50, p99;
#   - gene queries: 1 gene x all cells, 50 genes x all cells, 50 genes x
#     B cells (a where filter), 1 cell x all genes: curl best of R; the
#     three gene queries again by gene ("by": "var");
#   - the transport floor: the 10,000-cell answer's bytes sent from memory
#     by a server that does no work, read by the same curl.
# The engine column is bench_select on the same selection with the same
# thread count (the where filter's cells passed as an index list).
set -euo pipefail

bin= file= threads=$(nproc) duration=5 port=18090 reps=5
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --file) file=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "bench_http16.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$bin" ] && [ -n "$file" ] || { echo "bench_http16.sh: --bin and --file are required" >&2; exit 2; }
for t in ivserve bench_select wrk; do
    [ -x "$bin/$t" ] || { echo "bench_http16.sh: $bin/$t missing" >&2; exit 1; }
done
py=${PYTHON:-python3}
id=$(basename "$file" .h5ad)
base="http://127.0.0.1:$port"
binary='Accept: application/vnd.ivserve.csr'
tmp=$(mktemp -d)
srv_pid=
cleanup() {
    [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

# ------------------------------------------------------------ selections
# Fixed seeds, so that the engine and HTTP runs ask for the same cells.
read -r n_cells n_genes < <("$py" - "$file" <<'EOF'
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    s = f["X"].attrs["shape"]
    print(int(s[0]), int(s[1]))
EOF
)
"$py" - "$n_cells" "$n_genes" "$tmp" <<'EOF'
import json, sys
import numpy as np
n, g, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(7)
cells = rng.integers(0, n, 10_000)
genes50 = rng.choice(g, 50, replace=False)
np.savetxt(f"{tmp}/cells10k.txt", cells, fmt="%d")
np.savetxt(f"{tmp}/genes50.txt", genes50, fmt="%d")
with open(f"{tmp}/cells10k.json", "w") as f:
    json.dump({"obs": {"index": cells.tolist()}}, f)
with open(f"{tmp}/genes50.csv", "w") as f:
    f.write(",".join(map(str, genes50)))
EOF
genes50=$(cat "$tmp/genes50.csv")
gene1=$(cut -d, -f1 <<<"$genes50")
cell1=$((n_cells / 3))

# ---------------------------------------------------------------- server
"$bin/ivserve" --port "$port" --threads "$threads" --access-log off --log-format text \
    "$@" "$file" >"$tmp/ivserve.log" 2>&1 &
srv_pid=$!
t0=$(date +%s.%N)
for _ in $(seq 1200); do
    kill -0 "$srv_pid" 2>/dev/null || { cat "$tmp/ivserve.log"; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz" || true)" = 200 ] && break
    sleep 0.05
done
ready_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
echo "server ready after ${ready_s} s (threads $threads, flags: ${*:-none})"
# Cell queries are served from here on; the gene-major copy is built after.
other_state=
for _ in $(seq 1200); do
    other_state=$(curl -s "$base/v1/datasets/$id" | "$py" -c '
import json, sys
o = json.load(sys.stdin).get("orientations", {})
states = [v.get("state", "none") for v in o.values()]
print(next((s for s in states if s != "ready"), "ready") if o else "absent")')
    case "$other_state" in ready|absent|skipped|failed) break ;; esac
    sleep 0.05
done
other_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
echo "both orientations: $other_state after ${other_s} s"
grep -iE 'ready|transpose|gene-major|orient' "$tmp/ivserve.log" | head -n 5 || true

# B cells, by the where filter, for the engine run.
curl -s "$base/v1/datasets/$id/obs?columns=_index&where=cell_type+%3D%3D+%27B%27&limit=100000&format=csv" \
    >/dev/null || true
"$py" - "$base" "$id" "$tmp/bcells.txt" <<'EOF'
import json, sys, urllib.request
base, id_, out = sys.argv[1:]
req = urllib.request.Request(f"{base}/v1/datasets/{id_}/count", method="POST",
    data=json.dumps({"obs": {"where": "cell_type == 'B'"}}).encode(),
    headers={"Content-Type": "application/json"})
n = json.load(urllib.request.urlopen(req))["n_cells"]
# The positions of the B cells: one query with no genes returns the obs ids.
req = urllib.request.Request(f"{base}/v1/datasets/{id_}/query", method="POST",
    data=json.dumps({"obs": {"where": "cell_type == 'B'"}, "var": {"index": []},
                     "format": "ndjson"}).encode(),
    headers={"Content-Type": "application/json"})
ids = []
for line in urllib.request.urlopen(req):
    d = json.loads(line)
    if d.get("type") == "block":
        ids.extend(d["obs"])
assert len(ids) == n, (len(ids), n)
with open(out, "w") as f:
    f.write("\n".join(map(str, ids)))
print(f"B cells: {n}")
EOF

# ---------------------------------------------------------- engine column
engine() {   # label, then bench_select flags; prints best ms (the planner's pick,
             # with the other orientation built in memory as the server does)
    "$bin/bench_select" "$file" --threads "$threads" --reps "$reps" --cache-mb 8192 --other \
        --label "$1" "${@:2}" | tee -a "$tmp/engine.txt" | awk '/^select/ {print $8}'
}
e_r10k=$(engine r10k --obs-file "$tmp/cells10k.txt")
e_c1g50=$(engine c1g50 --obs "$cell1" --var-file "$tmp/genes50.txt")
e_g1=$(engine g1 --var "$gene1")
e_g50=$(engine g50 --var-file "$tmp/genes50.txt")
e_g50b=$(engine g50b --obs-file "$tmp/bcells.txt" --var-file "$tmp/genes50.txt")
e_c1=$(engine c1 --obs "$cell1")
ev_g1=$(engine g1-var --var "$gene1" --by var)
ev_g50=$(engine g50-var --var-file "$tmp/genes50.txt" --by var)
ev_g50b=$(engine g50b-var --obs-file "$tmp/bcells.txt" --var-file "$tmp/genes50.txt" --by var)
# The same gene queries served by the cell-major file alone: the baseline
# the gene-major copy is measured against.
c_g1=$(engine g1-cells --var "$gene1" --pick cells)
c_g50=$(engine g50-cells --var-file "$tmp/genes50.txt" --pick cells)
c_g50b=$(engine g50b-cells --obs-file "$tmp/bcells.txt" --var-file "$tmp/genes50.txt" --pick cells)

# --------------------------------------------------------------- 1 client
curl_best() {   # extra curl args...; prints "best_ms bytes"
    local best= bytes= out
    for _ in $(seq "$reps"); do
        out=$(curl -s -o /dev/null -H "$binary" -w '%{http_code} %{size_download} %{time_total}' "$@")
        read -r code sz secs <<<"$out"
        [ "$code" = 200 ] || { echo "HTTP $code for $*" >&2; exit 1; }
        bytes=$sz
        best=$(awk -v a="$secs" -v b="$best" 'BEGIN{print (b == "" || a < b) ? a : b}')
    done
    awk -v b="$best" -v n="$bytes" 'BEGIN{printf "%.2f %d\n", b * 1e3, n}'
}
q="$base/v1/datasets/$id/query"
read -r h_r10k b_r10k < <(curl_best -X POST -H 'Content-Type: application/json' \
    --data-binary @"$tmp/cells10k.json" "$q")
read -r h_c1g50 b_c1g50 < <(curl_best "$q?obs=$cell1&var=$genes50")
read -r h_g1 b_g1 < <(curl_best "$q?var=$gene1")
read -r h_g50 b_g50 < <(curl_best "$q?var=$genes50")
read -r h_g50b b_g50b < <(curl_best "$q?obs_where=cell_type+%3D%3D+%27B%27&var=$genes50")
read -r h_c1 b_c1 < <(curl_best "$q?obs=$cell1")
# The same gene queries answered by gene ("by": "var": the CSC of the
# result, without an obs id and indptr entry for every cell).
read -r v_g1 vb_g1 < <(curl_best "$q?var=$gene1&by=var")
read -r v_g50 vb_g50 < <(curl_best "$q?var=$genes50&by=var")
read -r v_g50b vb_g50b < <(curl_best "$q?obs_where=cell_type+%3D%3D+%27B%27&var=$genes50&by=var")

# The transport floor: the 10,000-cell answer's bytes sent from memory by a
# server that does nothing else (one sendall per request), read by the same
# curl.  No server can hand one client these bytes faster on this machine.
curl -s -o "$tmp/r10k.bin" -X POST -H "$binary" -H 'Content-Type: application/json' \
    --data-binary @"$tmp/cells10k.json" "$q"
floor_port=$((port + 1))
"$py" - "$tmp/r10k.bin" "$floor_port" >"$tmp/floor.log" 2>&1 <<'EOF' &
import socket, sys
body = open(sys.argv[1], "rb").read()
head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.ivserve.csr\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
msg = memoryview(head + body)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[2])))
ls.listen(16)
print("listening", flush=True)
while True:
    c, _ = ls.accept()
    got = b""
    while b"\r\n\r\n" not in got:
        d = c.recv(65536)
        if not d:
            break
        got += d
    c.sendall(msg)
    c.close()
EOF
floor_pid=$!
for _ in $(seq 100); do grep -q listening "$tmp/floor.log" 2>/dev/null && break; sleep 0.05; done
read -r h_floor b_floor < <(curl_best "http://127.0.0.1:$floor_port/")
kill "$floor_pid" 2>/dev/null || true

# ------------------------------------------------------------- many clients
cat >"$tmp/post.lua" <<'EOF'
local f = io.open(os.getenv("IV_BODY"), "rb")
wrk.method = "POST"
wrk.path = os.getenv("IV_PATH")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/vnd.ivserve.csr"
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("IVRESULT %d %d %.1f %.1f %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, e.connect + e.read + e.write + e.timeout))
end
EOF
cat >"$tmp/small.lua" <<'EOF'
local threads, counter = {}, 0
function setup(thread)
    counter = counter + 1
    thread:set("tid", counter)
end
function init(args)
    local id, ncells, genes = args[1], tonumber(args[2]), args[3]
    math.randomseed(1000 + tid)
    reqs, nreq, next_req = {}, 4096, 0
    for i = 1, nreq do
        reqs[i] = wrk.format("GET", "/v1/datasets/" .. id .. "/query?obs=" ..
                             math.random(0, ncells - 1) .. "&var=" .. genes,
                             {Accept = "application/vnd.ivserve.csr"})
    end
end
function request()
    next_req = next_req % nreq + 1
    return reqs[next_req]
end
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("IVRESULT %d %d %.1f %.1f %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, e.connect + e.read + e.write + e.timeout))
end
EOF
wrk_run() {   # conns script [args]; prints "req/s p50ms p99ms errors"
    local conns=$1 script=$2 thr out line
    shift 2
    thr=$(( conns < threads ? conns : threads ))
    out=$(IV_BODY="$tmp/cells10k.json" IV_PATH="/v1/datasets/$id/query" "$bin/wrk" -t"$thr" -c"$conns" -d"${duration}s" \
          --timeout 30s -s "$script" "$base" -- "$@" 2>&1) || { echo "wrk failed: $out" >&2; exit 1; }
    line=$(grep '^IVRESULT' <<<"$out") || { echo "no wrk result: $out" >&2; exit 1; }
    read -r _ n dur p50 p99 non2xx errs <<<"$line"
    awk -v n="$n" -v d="$dur" -v a="$p50" -v b="$p99" -v e=$((non2xx + errs)) \
        'BEGIN{printf "%.0f %.2f %.2f %d\n", n / (d / 1e6), a / 1e3, b / 1e3, e}'
}
read -r w16_rps w16_p50 w16_p99 w16_err < <(wrk_run 16 "$tmp/post.lua")
read -r w64_rps w64_p50 w64_p99 w64_err < <(wrk_run 64 "$tmp/post.lua")
read -r s64_rps s64_p50 s64_p99 s64_err < <(wrk_run 64 "$tmp/small.lua" "$id" "$n_cells" "$genes50")

# ------------------------------------------------------------------ table
echo
echo "ivserve on $(nproc) CPUs: $n_cells cells x $n_genes genes ($file), $threads workers"
printf '%-44s %10s %10s %8s %12s %14s\n' "case (1 client, curl best of $reps)" "HTTP ms" "engine ms" \
    "ratio" "bytes" "cell-major ms"
row() { awk -v l="$1" -v h="$2" -v e="$3" -v b="$4" -v c="${5:--}" \
    'BEGIN{printf "%-44s %10.2f %10.2f %8.2f %12d %14s\n", l, h, e, (e > 0 ? h / e : 0), b, c}'; }
row "10,000 random cells x all genes" "$h_r10k" "$e_r10k" "$b_r10k"
row "1 cell x 50 genes" "$h_c1g50" "$e_c1g50" "$b_c1g50"
row "1 gene x all cells" "$h_g1" "$e_g1" "$b_g1" "$c_g1"
row "50 genes x all cells" "$h_g50" "$e_g50" "$b_g50" "$c_g50"
row "50 genes x B cells (where)" "$h_g50b" "$e_g50b" "$b_g50b" "$c_g50b"
row "1 cell x all genes" "$h_c1" "$e_c1" "$b_c1"
row "1 gene x all cells, by var" "$v_g1" "$ev_g1" "$vb_g1"
row "50 genes x all cells, by var" "$v_g50" "$ev_g50" "$vb_g50"
row "50 genes x B cells (where), by var" "$v_g50b" "$ev_g50b" "$vb_g50b"
awk -v h="$h_r10k" -v f="$h_floor" -v b="$b_floor" -v e="$e_r10k" \
    'BEGIN{printf "%-44s %10.2f %10s %8s %12d\n", "transport floor: the 10,000-cell bytes, no work", f, "-", "-", b;
           printf "  10,000 cells: HTTP / floor %.2f; floor / engine %.2f; 1.3 x engine = %.2f ms\n", h / f, f / e, 1.3 * e}'
echo "  (engine: bench_select, plan + prepare + decode every block on $threads threads, warm, best of $reps,"
echo "   orientation chosen by the planner; cell-major ms: the same selection forced onto the cell-major file;"
echo "   the B-cell engine run takes the filter's cells as an index list, so it leaves out the filter)"
echo
printf '%-44s %6s %10s %9s %9s %9s %7s\n' "case (wrk, ${duration} s)" "conns" "req/s" "p50 ms" "p99 ms" "GB/s" "errors"
awk -v r="$w16_rps" -v a="$w16_p50" -v b="$w16_p99" -v e="$w16_err" -v by="$b_r10k" \
    'BEGIN{printf "%-44s %6d %10.0f %9.2f %9.2f %9.2f %7d\n", "10,000 random cells x all genes", 16, r, a, b, r * by / 1e9, e}'
awk -v r="$w64_rps" -v a="$w64_p50" -v b="$w64_p99" -v e="$w64_err" -v by="$b_r10k" \
    'BEGIN{printf "%-44s %6d %10.0f %9.2f %9.2f %9.2f %7d\n", "10,000 random cells x all genes", 64, r, a, b, r * by / 1e9, e}'
awk -v r="$s64_rps" -v a="$s64_p50" -v b="$s64_p99" -v e="$s64_err" -v by="$b_c1g50" \
    'BEGIN{printf "%-44s %6d %10.0f %9.2f %9.2f %9.2f %7d\n", "1 random cell x 50 genes", 64, r, a, b, r * by / 1e9, e}'
echo
cat "$tmp/engine.txt"
grep -E 'VmHWM|VmRSS' "/proc/$srv_pid/status" || true
