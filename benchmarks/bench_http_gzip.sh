#!/bin/bash
# The gzip goal of issue 12: a 1% random cell query (all genes) with
# Accept-Encoding: gzip against the same query without it, measured in the
# same run on one server, and /healthz latency while it runs (the loop is
# never blocked: compression runs on the workers).
#
#   benchmarks/bench_http_gzip.sh --bin DIR --file ATLAS.h5ad [--threads T]
#        [--duration S] [--port P] [--reps R] [--clients C]
#        [--formats "binary ndjson"] [-- extra ivserve flags]
#
# DIR holds ivserve and wrk (as for bench_http16.sh).  For each format and
# coding: 1 client (curl, best of R: ms and bytes on the wire), then C
# clients (wrk, default 16) for S seconds: req/s, p50, p99, MB/s of
# identity body delivered, while a probe asks /healthz every 20 ms
# (p50/p99/max ms, against the same probe on the idle server), and the
# server's CPU time per request.  The ratio column is gzip req/s over
# identity req/s (the goal is >= 0.5); cpu_ratio the same from CPU time.
set -euo pipefail

bin= file= threads=$(nproc) duration=10 port=18091 reps=5 clients=16 formats="binary ndjson"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --file) file=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --formats) formats=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "bench_http_gzip.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$bin" ] && [ -n "$file" ] || { echo "bench_http_gzip.sh: --bin and --file are required" >&2; exit 2; }
for t in ivserve wrk; do
    [ -x "$bin/$t" ] || { echo "bench_http_gzip.sh: $bin/$t missing" >&2; exit 1; }
done
py=${PYTHON:-python3}
id=$(basename "$file" .h5ad)
base="http://127.0.0.1:$port"
tmp=$(mktemp -d)
srv_pid= probe_pid=
cleanup() {
    [ -n "$probe_pid" ] && kill "$probe_pid" 2>/dev/null && wait "$probe_pid" 2>/dev/null
    [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

# The selection: 1% of the cells, drawn with a fixed seed.
read -r n_cells n_genes < <("$py" - "$file" "$tmp" <<'EOF'
import h5py, json, sys
import numpy as np
with h5py.File(sys.argv[1], "r") as f:
    s = f["X"].attrs["shape"]
n, g = int(s[0]), int(s[1])
cells = np.random.default_rng(12).integers(0, n, max(1, n // 100))
with open(sys.argv[2] + "/cells1pct.json", "w") as f:
    json.dump({"obs": {"index": cells.tolist()}}, f)
print(n, g)
EOF
)

"$bin/ivserve" --port "$port" --threads "$threads" --access-log off --log-format text \
    "$@" "$file" >"$tmp/ivserve.log" 2>&1 &
srv_pid=$!
for _ in $(seq 1200); do
    kill -0 "$srv_pid" 2>/dev/null || { cat "$tmp/ivserve.log"; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz" || true)" = 200 ] && break
    sleep 0.05
done
# Let the other orientation's build finish: it would load the workers.
for _ in $(seq 2400); do
    st=$(curl -s "$base/v1/datasets/$id" | "$py" -c '
import json, sys
o = json.load(sys.stdin).get("orientations", {})
print(next((v.get("state") for v in o.values() if v.get("state") not in ("ready", "skipped", "failed")), "done"))')
    [ "$st" = done ] && break
    sleep 0.05
done

srv_cpu() {   # the server's user + system CPU time so far, in clock ticks
    awk '{print $14 + $15}' "/proc/$srv_pid/stat"
}
probe() {   # prints one /healthz time in ms a line until killed
    while :; do
        curl -s -o /dev/null -w '%{time_total}\n' "$base/healthz" | awk '{printf "%.3f\n", $1 * 1e3}'
        sleep 0.02
    done
}
probe_stats() {   # file -> "p50 p99 max n"
    sort -n "$1" | awk '{a[NR] = $1} END {if (!NR) {print "0 0 0 0"; exit}
        i50 = int(NR * 0.5); if (i50 < 1) i50 = 1; i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
        printf "%.2f %.2f %.2f %d\n", a[i50], a[i99], a[NR], NR}'
}
probe >"$tmp/idle.txt" & probe_pid=$!
sleep 3
kill "$probe_pid"; wait "$probe_pid" 2>/dev/null || true; probe_pid=
read -r i50 i99 imax in_ < <(probe_stats "$tmp/idle.txt")

cat >"$tmp/post.lua" <<'EOF'
local f = io.open(os.getenv("IV_BODY"), "rb")
wrk.method = "POST"
wrk.path = os.getenv("IV_PATH")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = os.getenv("IV_ACCEPT")
wrk.headers["Accept-Encoding"] = os.getenv("IV_AE")
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("IVRESULT %d %d %.1f %.1f %d %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, e.connect + e.read + e.write + e.timeout, summary.bytes))
end
EOF

q="$base/v1/datasets/$id/query"
media() { case "$1" in binary) echo application/vnd.ivserve.csr ;; *) echo application/x-ndjson ;; esac; }
results=()
for fmt in $formats; do
    acc=$(media "$fmt")
    # The identity body's size, for MB/s of content delivered.
    ident_bytes=$(curl -s -o /dev/null -w '%{size_download}' -H "Accept: $acc" -H 'Accept-Encoding: identity' \
        -H 'Content-Type: application/json' --data-binary @"$tmp/cells1pct.json" "$q")
    for ae in identity gzip; do
        best= wire=
        for _ in $(seq "$reps"); do
            read -r code sz secs < <(curl -s -o /dev/null -H "Accept: $acc" -H "Accept-Encoding: $ae" \
                -H 'Content-Type: application/json' --data-binary @"$tmp/cells1pct.json" \
                -w '%{http_code} %{size_download} %{time_total}\n' "$q")
            [ "$code" = 200 ] || { echo "HTTP $code ($fmt, $ae)" >&2; exit 1; }
            wire=$sz
            best=$(awk -v a="$secs" -v b="$best" 'BEGIN{print (b == "" || a < b) ? a : b}')
        done
        probe >"$tmp/probe.txt" & probe_pid=$!
        cpu0=$(srv_cpu)
        out=$(IV_BODY="$tmp/cells1pct.json" IV_PATH="/v1/datasets/$id/query" IV_ACCEPT="$acc" IV_AE="$ae" \
              "$bin/wrk" -t"$(( clients < threads ? clients : threads ))" -c"$clients" -d"${duration}s" \
              --timeout 60s -s "$tmp/post.lua" "$base" 2>&1) || { echo "wrk failed: $out" >&2; exit 1; }
        cpu1=$(srv_cpu)
        kill "$probe_pid"; wait "$probe_pid" 2>/dev/null || true; probe_pid=
        line=$(grep '^IVRESULT' <<<"$out") || { echo "no wrk result: $out" >&2; exit 1; }
        read -r _ n dur p50 p99 non2xx errs bytes <<<"$line"
        read -r h50 h99 hmax hn < <(probe_stats "$tmp/probe.txt")
        rps=$(awk -v n="$n" -v d="$dur" 'BEGIN{printf "%.2f", n / (d / 1e6)}')
        results+=("$fmt $ae $rps $(awk -v a="$p50" -v b="$p99" 'BEGIN{printf "%.1f %.1f", a / 1e3, b / 1e3}') \
$(awk -v r="$rps" -v b="$ident_bytes" 'BEGIN{printf "%.1f", r * b / 1e6}') \
$(awk -v r="$bytes" -v d="$dur" 'BEGIN{printf "%.1f", r / (d / 1e6) / 1e6}') $((non2xx + errs)) \
$(awk -v b="$best" 'BEGIN{printf "%.1f", b * 1e3}') $wire $h50 $h99 $hmax $hn \
$(awk -v a="$cpu0" -v b="$cpu1" -v n="$n" -v t="$(getconf CLK_TCK)" 'BEGIN{printf("%.1f", (n > 0) ? (b - a) / t / n * 1e3 : 0)}')")
    done
done

echo
echo "ivserve on $(nproc) CPUs, $threads workers: $n_cells cells x $n_genes genes ($file)"
echo "query: $((n_cells / 100)) random cells (1%) x all genes, POST; wrk $clients clients ${duration} s;"
echo "/healthz probe every 20 ms (idle server: p50 $i50 ms, p99 $i99 ms, max $imax ms, n $in_)"
printf '%-7s %-9s %9s %8s %8s %10s %10s %6s %9s %11s %8s %8s %8s %5s %9s %7s %9s\n' format coding "req/s" \
    "p50 ms" "p99 ms" "body MB/s" "wire MB/s" errors "1cl ms" "wire bytes" "hz p50" "hz p99" "hz max" "hz n" \
    "cpu ms/r" ratio cpu_ratio
ident_rps= ident_cpu=
for r in "${results[@]}"; do
    read -r fmt ae rps p50 p99 bmb wmb err one wire h50 h99 hmax hn cpu <<<"$r"
    if [ "$ae" = identity ]; then ident_rps=$rps; ident_cpu=$cpu; fi
    ratio=$(awk -v a="$rps" -v b="$ident_rps" 'BEGIN{printf("%.2f", (b > 0) ? a / b : 0)}')
    cratio=$(awk -v a="$cpu" -v b="$ident_cpu" 'BEGIN{printf("%.2f", (a > 0) ? b / a : 0)}')
    printf '%-7s %-9s %9s %8s %8s %10s %10s %6s %9s %11s %8s %8s %8s %5s %9s %7s %9s\n' "$fmt" "$ae" "$rps" \
        "$p50" "$p99" "$bmb" "$wmb" "$err" "$one" "$wire" "$h50" "$h99" "$hmax" "$hn" "$cpu" "$ratio" "$cratio"
done
echo "(ratio: req/s over the same format's identity req/s; goal >= 0.5.  cpu ms/r: the server's CPU time"
echo " (user + system, all threads) per request during the wrk run; cpu_ratio: identity's over this one's,"
echo " the throughput ratio of a CPU-bound server, steady where other load makes req/s noisy.  body MB/s:"
echo " identity bytes delivered a second; wire MB/s: bytes on the wire; 1cl ms: one client, curl, best of $reps)"
grep -E 'VmHWM' "/proc/$srv_pid/status" || true
