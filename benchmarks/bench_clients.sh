#!/bin/bash
# The R client against the Python client on one large result, in one
# command: generates benchmarks/data/atlas_N.h5ad if missing, builds
# ivserve in Release, starts it on that file, installs clients/R into a
# temporary library and times the same selection (--select random cells
# of the atlas, sorted, every gene) fetched
#   - by Python: ds[cells, :].to_scipy() (clients/python), a csr_matrix;
#   - by R: ivs_query(client, id, obs = cells) (clients/R), a dgCMatrix
#     with the obs and var names as dimnames, and the same with
#     genes_by_cells = TRUE (its transpose, the stream's own layout);
# each in a fresh process per run, the two alternating, best of --runs,
# after one warm-up query in that process (the names, fetched once per
# client, are then cached in both).
# Prints both wall times and the client processes' CPU (user + sys; on a
# loaded machine the wall time mostly measures the load), the values
# fetched, and the ratios R / Python.
#
#   benchmarks/bench_clients.sh [--cells 200000] [--select 37843] [--runs 3]
#                               [--port 18090] [--build DIR]
#
# Not a ctest test.  On a shared machine wrap it in the benchmarks' lock:
#   flock "$LOCK" benchmarks/bench_clients.sh
# (bench_clients.py, a different script, compares HTTP libraries.)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cells=200000
select=37843
runs=3
port=18090
build=
py=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --cells) cells=$2; shift 2 ;;
        --select) select=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "bench_clients.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for v in "$cells" "$select" "$runs" "$port"; do
    case "$v" in ''|*[!0-9]*) echo "bench_clients.sh: not a number: '$v'" >&2; exit 2 ;; esac
done
[ "$select" -le "$cells" ] || { echo "bench_clients.sh: --select exceeds --cells" >&2; exit 2; }
command -v Rscript >/dev/null || { echo "bench_clients.sh: R is not installed" >&2; exit 1; }

. "$here/common.sh"
bench_enter_root build-clientbench
file="$data/atlas_$cells.h5ad"
id="atlas_$cells"
base="http://127.0.0.1:$port"
bench_ensure_atlas "$file"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIV_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target ivserve >&2
bin="$build/ivserve"

tmp=$(mktemp -d)
srv_pid=
cleanup() {
    [ -z "$srv_pid" ] || { kill "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; }
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$tmp/rlib"
cp -r clients/R "$tmp/ivserve"
R CMD INSTALL --no-multiarch --library="$tmp/rlib" "$tmp/ivserve" >"$tmp/install.log" 2>&1 ||
    { tail -n 20 "$tmp/install.log" >&2; exit 1; }

"$bin" --port "$port" --access-log off --log-format text --cache-dir "$tmp/cache" "$file" >"$tmp/ivserve.log" 2>&1 &
srv_pid=$!
for _ in $(seq 600); do
    kill -0 "$srv_pid" 2>/dev/null || { tail -n 5 "$tmp/ivserve.log" >&2; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz" || true)" = 200 ] && break
    sleep 0.1
done

# The selection: --select random cells (seed 29), sorted, 1-based for R.
"$py" -c "
import numpy as np, sys
rows = np.sort(np.random.default_rng(29).choice($cells, $select, replace=False))
np.savetxt(sys.argv[1], rows, fmt='%d')" "$tmp/rows.txt"

# Each client in a fresh process per run, the two alternating, so that
# both see the same load on a shared machine; inside the process one
# small warm-up query first (the names are then cached, as in a session).
cat >"$tmp/py.py" <<'PY'
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, ivserve
base, ds_id, rows_file = sys.argv[2], sys.argv[3], sys.argv[4]
rows = np.loadtxt(rows_file, dtype=np.int64)
ds = ivserve.connect(base, timeout=600)[ds_id]
ds[rows[:10], :].to_scipy(progress=False)
t, c = time.perf_counter(), time.process_time()
X = ds[rows, :].to_scipy(progress=False)
print(time.perf_counter() - t, X.shape[0], X.shape[1], X.nnz, time.process_time() - c)
PY
cat >"$tmp/r.R" <<'RS'
a <- commandArgs(TRUE)
suppressPackageStartupMessages(library(ivserve))
rows <- scan(a[3], quiet = TRUE) + 1
cl <- ivs_connect(a[1], timeout = 600)
invisible(ivs_query(cl, a[2], obs = rows[1:10]))
t <- proc.time()
X <- ivs_query(cl, a[2], obs = rows, genes_by_cells = a[4] == "t")
d <- proc.time() - t
if (a[4] == "t") X <- Matrix::t(X)  # shape for the check only, after the timing
cat(d[["elapsed"]], nrow(X), ncol(X), length(X@x), d[["user.self"]] + d[["sys.self"]], "\n")
RS
: >"$tmp/py.txt"
: >"$tmp/r.txt"
: >"$tmp/rt.txt"
for _ in $(seq "$runs"); do
    "$py" "$tmp/py.py" "$root/clients/python" "$base" "$id" "$tmp/rows.txt" >>"$tmp/py.txt"
    R_LIBS="$tmp/rlib" Rscript "$tmp/r.R" "$base" "$id" "$tmp/rows.txt" c >>"$tmp/r.txt"
    R_LIBS="$tmp/rlib" Rscript "$tmp/r.R" "$base" "$id" "$tmp/rows.txt" t >>"$tmp/rt.txt"
done
all_py=$(cut -d' ' -f1 "$tmp/py.txt" | tr '\n' ' ')
all_r=$(cut -d' ' -f1 "$tmp/r.txt" | tr '\n' ' ')
sort -n -o "$tmp/py.txt" "$tmp/py.txt"
sort -n -o "$tmp/r.txt" "$tmp/r.txt"
sort -n -o "$tmp/rt.txt" "$tmp/rt.txt"
read -r py_s py_r py_c py_nnz _ < <(head -n 1 "$tmp/py.txt")
read -r r_s r_r r_c r_nnz _ < <(head -n 1 "$tmp/r.txt")
py_cpu=$(cut -d' ' -f5 "$tmp/py.txt" | sort -n | head -n 1)
r_cpu=$(cut -d' ' -f5 "$tmp/r.txt" | sort -n | head -n 1)
read -r rt_s rt_r rt_c rt_nnz _ < <(head -n 1 "$tmp/rt.txt")
rt_cpu=$(cut -d' ' -f5 "$tmp/rt.txt" | sort -n | head -n 1)
[ "$py_r $py_c $py_nnz" = "$r_r $r_c $r_nnz" ] ||
    { echo "bench_clients.sh: the clients got different results: $py_r x $py_c ($py_nnz) vs $r_r x $r_c ($r_nnz)" >&2; exit 1; }
[ "$rt_r $rt_c $rt_nnz" = "$r_r $r_c $r_nnz" ] ||
    { echo "bench_clients.sh: genes_by_cells = TRUE got another result" >&2; exit 1; }
echo "atlas $cells cells, $select random cells x $py_c genes, $py_nnz values; best of $runs, $(nproc) cores"
printf '  %-40s %8s %14s\n' "" "wall s" "client CPU s"
printf '  %-40s %8.2f %14.2f\n' "Python ds[cells, :].to_scipy()" "$py_s" "$py_cpu" \
    "R ivs_query(client, id, obs = cells)" "$r_s" "$r_cpu" \
    "R ... genes_by_cells = TRUE" "$rt_s" "$rt_cpu"
"$py" -c "print('  R / Python (best): %.2fx wall, %.2fx client CPU (user + sys of the process); genes_by_cells: %.2fx wall, %.2fx CPU' % ($r_s / $py_s, $r_cpu / $py_cpu, $rt_s / $py_s, $rt_cpu / $py_cpu))"
echo "  every run (s): Python $all_py; R $all_r; load average $(cut -d' ' -f1-3 /proc/loadavg)"
