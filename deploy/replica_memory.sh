#!/usr/bin/env bash
# What one ivserve replica holds in memory per dataset, for sizing replicas
# (docs/operations.md, "Past one machine").  For each FILE.h5ad: start the server on it
# alone, wait until it is ready and its gene-major copy is built, read
# /proc/PID/status, stream the whole matrix once (binary, to /dev/null) and
# read the high-water mark; then the same with the gene-major copy turned
# off (--transpose-bytes 0) and the chunk cache turned off (--cache-bytes 0).
#
#   deploy/replica_memory.sh benchmarks/data/atlas_200000.h5ad [more.h5ad ...]
#   (benchmarks/gen_atlas.py --cells 200000 -o benchmarks/data/atlas_200000.h5ad makes one)
#
# Columns, MB (10^6 bytes): RssAnon (heap: index, metadata, caches, copies),
# RssFile (mapped file pages), VmHWM after the stream; then bytes per cell
# of RssAnon and of VmHWM.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${IVSERVE_BIN:-build/ivserve}
[ -x "$BIN" ] || { echo "replica_memory.sh: build $BIN first" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 FILE.h5ad ..." >&2; exit 2; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
field() { awk -v k="$2:" '$1 == k { print $2 * 1024 }' "/proc/$1/status"; }

measure() {  # FILE LABEL FLAGS...
  local file=$1 label=$2; shift 2
  local id; id=$(basename "$file" .h5ad)
  "$BIN" --port "$port" --threads 2 --access-log off "$@" "$file" 2>/dev/null &
  local pid=$!
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 200 ] && break; sleep 0.2
  done
  # The gene-major copy is built after the dataset is ready.
  for _ in $(seq 600); do
    curl -s "$url/v1/datasets/$id" | grep -q '"state":"building"' || break; sleep 0.2
  done
  local cells anon file_rss hwm
  cells=$(curl -s "$url/v1/datasets" | python3 -c 'import json,sys; print(json.load(sys.stdin)["datasets"][0]["shape"][0])')
  anon=$(field $pid RssAnon); file_rss=$(field $pid RssFile)
  curl -s -o /dev/null -H 'Accept: application/vnd.ivserve.csr' "$url/v1/datasets/$id/query"
  hwm=$(field $pid VmHWM)
  kill -TERM $pid; wait $pid || true
  awk -v id="$id" -v l="$label" -v c="$cells" -v a="$anon" -v f="$file_rss" -v h="$hwm" 'BEGIN {
    printf "%-22s %-36s %9d %9.1f %9.1f %9.1f %9.0f %8.0f\n", id, l, c, a/1e6, f/1e6, h/1e6, a/c, h/c }'
}

printf '%-22s %-36s %9s %9s %9s %9s %8s %8s\n' dataset settings cells RssAnon RssFile VmHWM anon/cell hwm/cell
for f in "$@"; do
  measure "$f" "defaults"
  measure "$f" "--transpose-bytes 0" --transpose-bytes 0
  measure "$f" "--transpose-bytes 0 --cache-bytes 0" --transpose-bytes 0 --cache-bytes 0
done
