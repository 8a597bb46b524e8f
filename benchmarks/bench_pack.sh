#!/bin/bash
# `ivserve pack` speed and the chunk-size table, in one command.
#
#   benchmarks/bench_pack.sh [--cells N] [--threads "1 2"] [--reps R]
#                            [--chunks "8192 16384 ..."] [--build DIR] [--no-baseline]
#
# Generates the synthetic atlas (IVCSR and its standard CSR copy) under
# benchmarks/data/ if missing, builds ivserve and bench_chunks in Release,
# then prints:
#  1. pack speed: the CSR copy to IVCSR and to IVCSC (zstd-1) with each
#     thread count: seconds, input MB/s (the CSR file's size over the
#     wall time), MB/s per thread, peak RSS (GNU time's max resident set);
#  2. the baselines measured in the same run (pack_baseline.py):
#     anndata.read_h5ad of the CSR file and the format's reference writer;
#  3. the chunk table: the IVCSR atlas re-packed with each --chunk-bytes,
#     stored size and ratio, and cold 1% / 0.1% random and 1% clustered
#     cell selections (bench_chunks, best of R).
# Output goes to stdout and benchmarks/data/pack_<cells>.txt.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cells=200000
threads="1 $(nproc)"
reps=5
chunks="8192 16384 32768 65536 131072 262144 1048576"
build=
baseline=1
py=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --cells) cells=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --chunks) chunks=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --no-baseline) baseline=0; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "bench_pack.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

. "$here/common.sh"
bench_enter_root build-bench
iv="$data/atlas_$cells.h5ad"
csr="$data/atlas_$cells.csr.h5ad"
bench_ensure_atlas "$iv" "$csr"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIV_BENCH=ON -DIV_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target ivserve bench_chunks >&2
bin="$build/ivserve"
out="$data/pack_$cells.txt"
tmp="$data/pack_tmp"
mkdir -p "$tmp"
cat "$iv" "$csr" > /dev/null

{
echo "== ivserve pack, $cells cells: $(basename "$csr") ($(( $(stat -c %s "$csr") / 1000000 )) MB) -> zstd-1"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(wall = elapsed; cpu = user + system, which a machine shared with other work"
echo " inflates less than wall; MB/s per CPU-second = input MB / cpu)"
printf "%-7s %-8s %9s %9s %10s %12s %14s %10s\n" layout threads "wall s" "cpu s" "MB/s" "MB/s/thread" "MB/cpu-second" "peak MB"
mb=$(( $(stat -c %s "$csr") ))
for layout in ivcsr ivcsc; do
    for t in $threads; do
        rm -f "$tmp/p.h5ad"
        /usr/bin/time -f "%e %U %S %M" -o "$tmp/time" "$bin" pack "$csr" "$tmp/p.h5ad" --layout "$layout" \
            --threads "$t" -q > "$tmp/summary"
        read -r secs usr sys kb < "$tmp/time"
        awk -v l="$layout" -v t="$t" -v s="$secs" -v u="$usr" -v y="$sys" -v kb="$kb" -v b="$mb" 'BEGIN {
            c = u + y
            printf "%-7s %-8s %9.2f %9.2f %10.1f %12.1f %14.1f %10.0f\n", l, t, s, c, b / 1e6 / s,
                   b / 1e6 / s / t, b / 1e6 / c, kb / 1024 }'
    done
    cat "$tmp/summary"
done
if [ "$baseline" = 1 ]; then
    echo
    echo "== baselines, same input (one Python process)"
    "$py" benchmarks/pack_baseline.py "$csr" "$tmp/ref.h5ad"
fi
echo
echo "== chunk size: $(basename "$iv") re-packed with --chunk-bytes C (zstd-1); cold selections, all genes, best of $reps"
files=()
for c in $chunks; do
    "$bin" pack "$iv" "$tmp/c$c.h5ad" --chunk-bytes "$c" -q > /dev/null
    files+=("$tmp/c$c.h5ad")
done
"$build/benchmarks/bench_chunks" "$iv" "${files[@]}" --threads "$(nproc)" --reps "$reps"
echo "(first row: the atlas as generated, h5py's chunk size)"
} | tee "$out"
rm -rf "$tmp"
