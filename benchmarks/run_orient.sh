#!/bin/bash
# Both orientations in one command: generates the synthetic atlas under
# benchmarks/data/ if missing, builds bench_engine in Release and runs its
# --orient-only part: the gene-major copy built in memory (time, memory
# against the packed stream) and 1 gene x all cells, 50 genes x all cells,
# 50 genes x 10% of the cells, 1 cell x all genes through the cell-major
# file, the gene-major copy and the planner's choice, as cell rows and as
# gene rows, warm, engine only.
#
#   benchmarks/run_orient.sh [--cells N] [--threads T] [--reps R] [--build DIR]
#
# Defaults: 200,000 cells, every online CPU, 3 repetitions, build folder
# build-bench.  The table goes to stdout and benchmarks/data/orient_<cells>.txt.
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
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "run_orient.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

. "$here/common.sh"
bench_enter_root build-bench
iv="$data/atlas_$cells.h5ad"
bench_ensure_atlas "$iv"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIV_BENCH=ON -DIV_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target bench_engine >&2
bin="$build/benchmarks/bench_engine"
[ -x "$bin" ] || { echo "run_orient.sh: $bin was not built (IV_BENCH?)" >&2; exit 1; }

cat "$iv" > /dev/null
{
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg) at start, $(nproc) CPUs online"
    "$bin" "$iv" --threads "$threads" --reps "$reps" --orient-only
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg) at end"
} | tee "$data/orient_$cells.txt"
