#!/bin/bash
# Engine benchmark in one command: generates the synthetic atlas (IVCSR and
# a standard CSR copy) under benchmarks/data/ if missing, builds
# bench_engine in Release, and runs it with the anndata baseline.
#
#   benchmarks/run_engine.sh [--cells N] [--threads T] [--reps R] [--build DIR]
#                            [-- extra bench_engine flags]
#
# Defaults: 200,000 cells (1,260,000 is the full atlas size), every online
# CPU, 3 repetitions, build folder build-bench.  The table goes to stdout
# and to benchmarks/data/engine_<cells>.txt.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cells=200000
threads=$(nproc)
reps=3
build=
py=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --cells) cells=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "run_engine.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

. "$here/common.sh"
bench_enter_root build-bench
iv="$data/atlas_$cells.h5ad"
csr="$data/atlas_$cells.csr.h5ad"
bench_ensure_atlas "$iv" "$csr"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIV_BENCH=ON -DIV_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target bench_engine >&2

bin="$build/benchmarks/bench_engine"
[ -x "$bin" ] || { echo "run_engine.sh: $bin was not built (IV_BENCH?)" >&2; exit 1; }

# Both files into the OS page cache first: the benchmark times decoding,
# with the page cache warm, and a file half evicted by an earlier run (the
# 1,260,000-cell CSR copy is 7.4 GB) would time the disk instead.
cat "$iv" "$csr" > /dev/null

"$bin" "$iv" --threads "$threads" --reps "$reps" --csr "$csr" \
    --baseline benchmarks/anndata_baseline.py --python "$py" --sel-dir "$data/sel_$cells" "$@" \
    | tee "$data/engine_$cells.txt"
