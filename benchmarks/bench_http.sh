#!/bin/bash
# HTTP benchmark of the server on the synthetic atlas, in one command:
# generates benchmarks/data/atlas_N.h5ad if missing, builds ivserve in
# Release, starts it on that file and measures
#   - small queries with wrk (1, 8 and 64 connections): one random cell x
#     50 genes, and 1-100 random cells x 50 random genes; req/s, p50, p99;
#   - the whole matrix as a binary stream (application/vnd.ivserve.csr),
#     downloaded with curl to /dev/null, best of R runs, next to nginx
#     serving a static file of exactly the same size with sendfile, same
#     client, runs interleaved; bytes/s, rows/s and the ratio;
#   - the server's memory (VmRSS, RssAnon, VmHWM) before, during and after
#     each stream, a half-matrix stream and a slow reader;
#   - one 300-random-cell query through curl, Python's urllib (GET, POST)
#     and a kept-alive http.client connection (bench_clients.py).
#
#   benchmarks/bench_http.sh [--cells N] [--runs R] [--port P] [--build DIR]
#                            [--duration S] [--slow-rate RATE] [--slow-seconds S]
#                            [-- extra ivserve flags, e.g. --blocks-ahead 8]
#
# Defaults: 200,000 cells, 3 runs, port 18080 (nginx gets P+1), build
# folder build-httpbench, 5 s per wrk run, slow reader 20M for 5 s; the
# server runs with its defaults and the access log off.  Not a ctest
# test.  On a shared machine wrap it in the lock file that every benchmark
# there shares, so that measurements never overlap:
#   flock "$LOCK" benchmarks/bench_http.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cells=200000
runs=3
port=18080
build=
duration=5
slow_rate=20M
slow_seconds=5
py=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --cells) cells=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --slow-rate) slow_rate=$2; shift 2 ;;
        --slow-seconds) slow_seconds=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "bench_http.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for v in "$cells" "$runs" "$port" "$duration" "$slow_seconds"; do
    case "$v" in ''|*[!0-9]*) echo "bench_http.sh: not a number: '$v'" >&2; exit 2 ;; esac
done
[ "$runs" -ge 1 ] || { echo "bench_http.sh: --runs must be >= 1" >&2; exit 2; }
for tool in wrk curl nginx cmake; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
        { echo "bench_http.sh: $tool is not installed" >&2; exit 1; }
done
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

. "$here/common.sh"
bench_enter_root build-httpbench
file="$data/atlas_$cells.h5ad"
id="atlas_$cells"
nport=$((port + 1))
base="http://127.0.0.1:$port"
binary='Accept: application/vnd.ivserve.csr'

bench_ensure_atlas "$file"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIV_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target ivserve >&2
bin="$build/ivserve"
[ -x "$bin" ] || { echo "bench_http.sh: $bin was not built" >&2; exit 1; }
# The build folder as printed: relative when it lies inside the repository.
shown_bin=${bin#"$root"/}

# Everything the script starts is killed on exit, and the temporary
# folder (the saved stream, nginx's config and logs) removed.
tmp=$(mktemp -d)
srv_pid= ngx_pid= smp_pid=
cleanup() {
    for p in $smp_pid $ngx_pid $srv_pid; do
        kill "$p" 2>/dev/null || true
    done
    for p in $smp_pid $ngx_pid $srv_pid; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
    echo "bench_http.sh: $*" >&2
    for log in "$tmp/ivserve.log" "$tmp/nginx-error.log"; do
        [ -s "$log" ] && { echo "--- last lines of ${log##*/}:" >&2; tail -n 5 "$log" >&2; }
    done
    exit 1
}

port_free() {
    ! curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$1/" 2>/dev/null
}
port_free "$port" || die "port $port is already in use (--port)"
port_free "$nport" || die "port $nport (nginx, --port + 1) is already in use"

# ---------------------------------------------------------------- server
# The access log is off: one JSON line per request would measure stderr
# more than the server at tens of thousands of small requests a second.
"$bin" --port "$port" --access-log off --log-format text "$@" "$file" \
    >"$tmp/ivserve.log" 2>&1 &
srv_pid=$!
ready=
for _ in $(seq 600); do
    kill -0 "$srv_pid" 2>/dev/null || die "ivserve exited during start-up"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz" || true)" = 200 ]; then
        ready=1
        break
    fi
    sleep 0.1
done
[ -n "$ready" ] || die "ivserve not ready after 60 s"

# Shape and nnz of the dataset, for the checks and the rows/s figure.
read -r n_cells n_genes nnz < <(curl -s "$base/v1/datasets/$id" |
    "$py" -c 'import json,sys; d=json.load(sys.stdin); s=d["shape"]; print(s[0], s[1], d["nnz"])') ||
    die "cannot read the dataset's shape from /v1/datasets/$id"
extra_flags="$*"
workers=$(sed -n 's/.*with \([0-9]*\) workers.*/\1/p' "$tmp/ivserve.log" | head -n 1)

load_start=$(cut -d' ' -f1 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain -- core proto server config CMakeLists.txt 2>/dev/null)" ]; then
    commit="$commit (with uncommitted changes in the sources)"
fi

# One gauge of /metrics, e.g. ivserve_cache_bytes.
metric() {
    curl -s "$base/metrics" | awk -v k="$1" '$1 == k { print $2; exit }'
}
# The row-index pass at start-up decompresses every chunk and leaves them
# in the engine's cache (up to its budget), so no download here is cold.
cache_start=$(metric ivserve_cache_bytes)

# -------------------------------------------------------------- memory
# Sampling /proc/PID/status every 50 ms gives the curve; VmHWM, reset
# through clear_refs before each case, gives the exact peak between
# samples.  RssAnon is the server's own memory (heap: chunk cache, blocks
# in flight); VmRSS also counts the pages of the mapped file it touched.
mem_now() {   # prints "VmRSS RssAnon VmHWM" in kB
    local k v _ rss=0 anon=0 hwm=0
    while read -r k v _; do
        case "$k" in
            VmRSS:) rss=$v ;;
            RssAnon:) anon=$v ;;
            VmHWM:) hwm=$v ;;
        esac
    done <"/proc/$srv_pid/status"
    echo "$rss $anon $hwm"
}
sampler() {   # appends "VmRSS RssAnon" lines to $1 until killed
    while :; do
        read -r r a _ < <(mem_now) || break
        echo "$r $a" >>"$1"
        sleep 0.05
    done
}
case_begin() {   # resets the high-water mark, records "before", starts sampling
    echo 5 >"/proc/$srv_pid/clear_refs" 2>/dev/null || true
    read -r m_before_rss m_before_anon _ < <(mem_now)
    : >"$tmp/samples"
    sampler "$tmp/samples" &
    smp_pid=$!
}
case_end() {   # $1 = label, $2 = result bytes; appends a row to the memory table
    local hwm peak_rss peak_anon after_rss after_anon
    read -r _ _ hwm < <(mem_now)
    kill "$smp_pid" 2>/dev/null || true
    wait "$smp_pid" 2>/dev/null || true
    smp_pid=
    read -r peak_rss peak_anon < <(awk 'BEGIN{r=0;a=0} $1>r{r=$1} $2>a{a=$2} END{print r, a}' "$tmp/samples")
    sleep 0.5
    read -r after_rss after_anon _ < <(mem_now)
    awk -v l="$1" -v b="$2" -v br="$m_before_rss" -v ba="$m_before_anon" \
        -v pr="$peak_rss" -v pa="$peak_anon" -v h="$hwm" -v ar="$after_rss" -v aa="$after_anon" \
        -v n="$(wc -l <"$tmp/samples")" 'BEGIN {
        printf "  %-34s %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %+7.0f %9.1f %4d\n", l,
            br/1e3, ba/1e3, pr/1e3, pa/1e3, h/1e3, ar/1e3, aa/1e3, (pa-ba)/1e3, b/1e6, n }' >>"$tmp/memtable"
}

# ------------------------------------------------- stream: check, save
# The first download (engine cache cold) is saved: its header and trailer
# are checked against the dataset, and the same bytes become nginx's
# static file, so both servers send exactly the same number of bytes.
mkdir -p "$tmp/www"
stream="$tmp/www/stream.bin"
query="$base/v1/datasets/$id/query"
case_begin
read -r code cold_bytes cold_s < <(curl -s -H "$binary" -o "$stream" \
    -w '%{http_code} %{size_download} %{time_total}\n' "$query") || die "curl of the stream failed"
case_end "first stream (saved to a file)" "$cold_bytes"
[ "$code" = 200 ] || die "whole-matrix query answered HTTP $code"
"$py" - "$stream" "$n_cells" "$n_genes" "$nnz" <<'EOF' || die "the saved stream is not a complete, ok IVQS stream"
import os, struct, sys
path, rows, cols, nnz = sys.argv[1], *map(int, sys.argv[2:])
size = os.path.getsize(path)
with open(path, "rb") as f:
    head = f.read(40)
    assert size >= 40 + 28 and head[:4] == b"IVQS", "no IVQS header"
    ver, hr, hc = struct.unpack_from("<Iqq", head, 4)
    assert (ver, hr, hc) == (1, rows, cols), f"header {ver} {hr}x{hc}"
    # An ok stream ends with a trailer whose error text is empty.
    f.seek(size - 28)
    kind, status, tr, tn, elen = struct.unpack("<IIqqI", f.read(28))
    assert (kind, status, elen) == (2, 0, 0), f"trailer kind {kind} status {status}"
    assert (tr, tn) == (rows, nnz), f"trailer rows {tr} nnz {tn}, dataset {rows} {nnz}"
EOF

# ----------------------------------------------------------- small queries
# A wrk script that picks random cells: each thread pre-builds a pool of
# requests from its own seed (so runs are repeatable and the client spends
# its time on the socket, not in Lua), and checks that every body is a
# complete NDJSON answer ending in an ok "end" line.
cat >"$tmp/small.lua" <<'EOF'
local threads, counter = {}, 0
function setup(thread)
    counter = counter + 1
    thread:set("tid", counter)
    table.insert(threads, thread)
end
function init(args)
    local id, ncells, ngenes, mode = args[1], tonumber(args[2]), tonumber(args[3]), args[4]
    math.randomseed(1000 + tid)
    reqs, nreq, next_req, bad = {}, 4096, 0, 0
    for i = 1, nreq do
        local obs, var = {}, nil
        if mode == "one" then
            obs[1] = math.random(0, ncells - 1)
            local g = math.random(0, ngenes - 50)
            var = g .. ":" .. (g + 50)
        else
            for k = 1, math.random(1, 100) do obs[k] = math.random(0, ncells - 1) end
            local genes, seen = {}, {}
            while #genes < 50 do
                local g = math.random(0, ngenes - 1)
                if not seen[g] then seen[g] = true; genes[#genes + 1] = g end
            end
            var = table.concat(genes, ",")
        end
        reqs[i] = wrk.format("GET", "/v1/datasets/" .. id .. "/query?obs=" ..
                             table.concat(obs, ",") .. "&var=" .. var)
    end
end
function request()
    next_req = next_req % nreq + 1
    return reqs[next_req]
end
function response(status, headers, body)
    -- Other statuses are counted by wrk itself (summary.errors.status).
    if status == 200 and not string.find(body, '"type":"end","status":"ok"', 1, true) then
        bad = bad + 1
    end
end
function done(summary, latency, requests)
    local nbad = 0
    for _, t in ipairs(threads) do nbad = nbad + t:get("bad") end
    local e = summary.errors
    io.write(string.format("IVRESULT %d %d %.1f %.1f %d %d %d\n", summary.requests,
        summary.duration, latency:percentile(50), latency:percentile(99),
        e.status, nbad, e.connect + e.read + e.write + e.timeout))
end
EOF

small_rows=
small_bad=0
for mode in one many; do
    for conns in 1 8 64; do
        thr=2
        [ "$conns" = 1 ] && thr=1
        out=$(wrk -t"$thr" -c"$conns" -d"${duration}s" -s "$tmp/small.lua" "$base" \
              -- "$id" "$n_cells" "$n_genes" "$mode" 2>&1) || die "wrk failed: $out"
        line=$(grep '^IVRESULT' <<<"$out") || die "no result from wrk: $out"
        read -r _ nreq dur_us p50 p99 non2xx nbad errs <<<"$line"
        if [ "$mode" = one ]; then label="1 random cell, 50 genes (a:a+50)"; else label="1-100 random cells, 50 random genes"; fi
        small_rows+=$(awk -v l="$label" -v c="$conns" -v t="$thr" -v n="$nreq" -v d="$dur_us" \
            -v p50="$p50" -v p99="$p99" -v x="$non2xx" -v b="$nbad" -v e="$errs" 'BEGIN {
            printf "  %-36s %5d %3d %9.0f %8.2f %8.2f %9d %6d %6d %6d\n",
                l, c, t, n / (d / 1e6), p50 / 1e3, p99 / 1e3, n, x, b, e }')$'\n'
        small_bad=$((small_bad + non2xx + nbad))
    done
done

# ------------------------------------------------- curl vs Python clients
# The same few hundred cells through curl and Python's own HTTP clients:
# a Python user should see the server curl sees.
client_rows=$("$py" "$here/bench_clients.py" "$base" "$id" "$n_cells" --runs "$((runs * 10))") ||
    die "bench_clients.py failed"

# ------------------------------------------------------------------ nginx
# A single nginx process (master_process off: no privilege drop, so it can
# read the temporary folder) with sendfile, every path in the temporary
# folder, serving the saved stream.
cat >"$tmp/nginx.conf" <<EOF
master_process off;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/octet-stream;
    client_body_temp_path $tmp/body;
    proxy_temp_path $tmp/proxy;
    fastcgi_temp_path $tmp/fastcgi;
    uwsgi_temp_path $tmp/uwsgi;
    scgi_temp_path $tmp/scgi;
    server {
        listen 127.0.0.1:$nport;
        root $tmp/www;
    }
}
EOF
"$nginx_bin" -p "$tmp" -e "$tmp/nginx-error.log" -c "$tmp/nginx.conf" >"$tmp/nginx.out" 2>&1 &
ngx_pid=$!
ready=
for _ in $(seq 100); do
    kill -0 "$ngx_pid" 2>/dev/null || die "nginx exited during start-up: $(cat "$tmp/nginx.out")"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-0 "http://127.0.0.1:$nport/stream.bin" || true)" = 206 ]; then
        ready=1
        break
    fi
    sleep 0.1
done
[ -n "$ready" ] || die "nginx not ready after 10 s"

# ------------------------------------------------------ stream throughput
# Runs interleave (ivserve, nginx, ivserve, ...) so that both see the same
# background load; the best run of each is the least disturbed one.  The
# ivserve runs are warm (the first download filled the chunk cache).
best_iv= best_ng= times_iv= times_ng=
for r in $(seq "$runs"); do
    case_begin
    read -r code bytes secs < <(curl -s -H "$binary" -o /dev/null \
        -w '%{http_code} %{size_download} %{time_total}\n' "$query") || die "curl of the stream failed"
    case_end "warm stream, run $r" "$bytes"
    [ "$code" = 200 ] && [ "$bytes" = "$cold_bytes" ] ||
        die "ivserve run $r: HTTP $code, $bytes bytes (first run: $cold_bytes)"
    times_iv+="$secs "
    best_iv=$(awk -v a="$secs" -v b="$best_iv" 'BEGIN{print (b == "" || a < b) ? a : b}')

    read -r code bytes secs < <(curl -s -o /dev/null \
        -w '%{http_code} %{size_download} %{time_total}\n' "http://127.0.0.1:$nport/stream.bin") ||
        die "curl of nginx failed"
    [ "$code" = 200 ] && [ "$bytes" = "$cold_bytes" ] ||
        die "nginx run $r: HTTP $code, $bytes bytes (expected $cold_bytes)"
    times_ng+="$secs "
    best_ng=$(awk -v a="$secs" -v b="$best_ng" 'BEGIN{print (b == "" || a < b) ? a : b}')
done

# -------------------------------------------------- memory: more cases
# Half the cells: if memory were proportional to the result, the peak
# above the start would be about half of the whole matrix's.
half=$((n_cells / 2))
case_begin
read -r code bytes _ < <(curl -s -H "$binary" -o /dev/null \
    -w '%{http_code} %{size_download} %{time_total}\n' "$query?obs=0:$half") || die "curl of the half stream failed"
case_end "half the cells (obs=0:$half)" "$bytes"
[ "$code" = 200 ] || die "half-matrix query answered HTTP $code"

# A slow reader cut off after a few seconds: the server must hold only
# blocks_ahead encoded blocks for it, and drop the stream when it goes.
case_begin
read -r code bytes _ < <(curl -s -H "$binary" -o /dev/null --limit-rate "$slow_rate" \
    --max-time "$slow_seconds" -w '%{http_code} %{size_download} %{time_total}\n' "$query" || true)
case_end "slow reader ${slow_rate}B/s, cut after ${slow_seconds} s" "$bytes"
[ "$code" = 200 ] || die "slow-reader query answered HTTP $code"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz")" = 200 ] ||
    die "ivserve not ready after the slow reader went away"
# The cut stream must be dropped, not left decoding for nobody.
dropped=
for _ in $(seq 50); do
    if [ "$(metric ivserve_active_streams)" = 0 ]; then dropped=1; break; fi
    sleep 0.1
done
[ -n "$dropped" ] || die "the slow reader's stream is still active 5 s after it went away"
cache_end=$(metric ivserve_cache_bytes)

load_end=$(cut -d' ' -f1 /proc/loadavg)

# ------------------------------------------------------------------ table
shown_file=$file
awk -v f="$shown_file" -v c="$n_cells" -v g="$n_genes" -v z="$nnz" -v bin="$shown_bin" \
    -v w="${workers:-?}" -v commit="$commit" -v l0="$load_start" -v l1="$load_end" \
    -v cpus="$(nproc)" -v runs="$runs" -v dur="$duration" -v extra="$extra_flags" \
    -v c0="$cache_start" -v c1="$cache_end" 'BEGIN {
    print "ivserve HTTP benchmark"
    printf "file      %s\n", f
    printf "matrix    %d cells x %d genes, nnz %d\n", c, g, z
    printf "server    %s at commit %s, %s workers, access log off%s\n", bin, commit, w,
        extra == "" ? ", other settings default" : ", flags " extra
    printf "cache     engine chunk cache %.0f MB after start-up (the row-index pass fills it), %.0f MB at the end\n",
        c0 / 1e6, c1 / 1e6
    printf "load      1-min load average %s at start, %s at end, %d CPUs online\n", l0, l1, cpus
    printf "\n[small queries: wrk, %d s each, NDJSON, engine cache warm]\n", dur
    printf "  %-36s %5s %3s %9s %8s %8s %9s %6s %6s %6s\n", "query", "conns", "thr", "req/s", "p50 ms",
        "p99 ms", "requests", "non2xx", "badbody", "sockerr"
}'
printf '%s' "$small_rows"
echo "  (requests from a pool of 4096 per wrk thread, fixed seeds; badbody = 200 without an ok end line)"

awk -v bytes="$cold_bytes" -v rows="$n_cells" -v biv="$best_iv" -v bng="$best_ng" -v cold="$cold_s" \
    -v tiv="$times_iv" -v tng="$times_ng" -v runs="$runs" 'BEGIN {
    printf "\n[whole matrix: binary stream vs nginx sendfile of a file of the same size; curl to /dev/null, best of %d]\n", runs
    printf "  %-30s %12s %8s %8s %11s   %s\n", "server", "bytes", "best s", "MB/s", "rows/s", "all runs (s)"
    printf "  %-30s %12d %8.3f %8.0f %11.0f   %s\n", "ivserve (engine cache warm)", bytes, biv, bytes / biv / 1e6, rows / biv, tiv
    printf "  %-30s %12d %8.3f %8.0f %11s   %s\n", "nginx 1 process, sendfile on", bytes, bng, bytes / bng / 1e6, "-", tng
    printf "  %-30s %12d %8.3f %8.0f %11.0f   %s\n", "ivserve first run, to a file", bytes, cold, bytes / cold / 1e6, rows / cold, "(not in the best)"
    printf "  ratio ivserve / nginx: %.2f of nginx'"'"'s bytes/s (target >= 0.50: %s)\n", bng / biv,
        (bng / biv >= 0.5 ? "met" : "not met")
}'
echo "  check: first stream saved and parsed: header $n_cells x $n_genes, trailer ok with rows $n_cells, nnz $nnz;"
echo "         every timed download (ivserve and nginx) HTTP 200 with exactly $cold_bytes bytes"

printf '\n[one query, several clients: curl vs Python urllib and http.client, engine cache warm]\n'
printf '%s\n' "$client_rows"

printf '\n[ivserve memory, MB (10^6 bytes): VmRSS and RssAnon before, sampled peak (every 50 ms), VmHWM, after (0.5 s later)]\n'
printf '  %-34s %6s %6s %6s %6s %6s %6s %6s %7s %9s %4s\n' "case" "rss0" "anon0" "rssmax" "anonmx" "hwm" \
    "rss1" "anon1" "anon+" "result MB" "smp"
cat "$tmp/memtable"
echo "  anon+ = peak RssAnon minus RssAnon before; VmRSS includes the mapped file's touched pages,"
echo "  RssAnon is the heap (engine chunk cache, blocks in flight); VmHWM is reset before each case;"
echo "  smp = samples taken; the slow reader's stream was dropped (active streams 0) after it went away"

if [ "$small_bad" -ne 0 ]; then
    echo "bench_http.sh: $small_bad small queries failed (non-2xx or incomplete body)" >&2
    exit 1
fi
