#!/bin/bash
# A round trip through the standard format at any size (the 2^31+ case of
# the pack/export issue: --cells 3000000 gives 2.18e9 stored values): a
# synthetic IVCSR atlas, `export` to a standard CSR .h5ad (B), `pack` it
# back (C), `check` C, `export` C again (D), and B and D compared element
# by element (compare_csr_h5ad.py).  Each step is timed with its peak RSS.
#
#   benchmarks/bench_roundtrip.sh --bin DIR --data DIR [--cells N] [--threads T]
#
# DIR holds ivserve (and on the 16-core machine the libraries it needs, on
# LD_LIBRARY_PATH).  Disk: about 9 x (stored values) bytes in --data.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin= data= cells=3000000 threads=$(nproc)
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --data) data=$2; shift 2 ;;
        --cells) cells=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "bench_roundtrip.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$bin" ] && [ -n "$data" ] || { echo "bench_roundtrip.sh: --bin and --data are required" >&2; exit 2; }
py=${PYTHON:-python3}
iv=$bin/ivserve
mkdir -p "$data"
A=$data/rt_atlas.h5ad
[ -f "$A" ] || "$py" "$here/gen_atlas.py" --cells "$cells" -o "$A" | tail -1
step() { local name=$1; shift; /usr/bin/time -f "$name %e s, peak %M KB" "$@" 2>&1 | tail -2; }
rm -f "$data"/rt_B.h5ad "$data"/rt_C.h5ad "$data"/rt_D.h5ad
step export "$iv" export "$A" --threads "$threads" -o "$data/rt_B.h5ad"
step pack "$iv" pack "$data/rt_B.h5ad" "$data/rt_C.h5ad" --threads "$threads"
/usr/bin/time -f "check %e s, peak %M KB" "$iv" check "$data/rt_C.h5ad" --threads "$threads" 2>&1 \
    | grep -E "^(layout|chunk index|open time|index build|nnz):|^check "
step export_again "$iv" export "$data/rt_C.h5ad" --threads "$threads" -o "$data/rt_D.h5ad"
"$py" "$here/compare_csr_h5ad.py" "$data/rt_B.h5ad" "$data/rt_D.h5ad"
rm -f "$data"/rt_B.h5ad "$data"/rt_C.h5ad "$data"/rt_D.h5ad
