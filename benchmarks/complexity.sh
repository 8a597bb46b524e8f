#!/usr/bin/env bash
# The code-shape figures of the redesign issue, measured the same way each
# time: pmccabe's modified McCabe complexity (its first column) of every
# function in core, server, proto, config, api and cli, the share above 10
# and above 20, the largest, per folder, and the README's length.
#
#   benchmarks/complexity.sh [--top N] [REV]
#
# REV (a commit, e.g. HEAD~20) measures that commit's tree instead of the
# working tree, so a before/after pair comes from one command each.
# Needs pmccabe (Debian package pmccabe; apt-get install pmccabe).
set -euo pipefail
cd "$(dirname "$0")/.."
top=15
rev=""
while [ $# -gt 0 ]; do
  case "$1" in
    --top) top=$2; shift 2 ;;
    *) rev=$1; shift ;;
  esac
done
command -v pmccabe >/dev/null || { echo "pmccabe is not installed (apt-get install pmccabe)" >&2; exit 2; }
dirs="core server proto config api cli"
src=.
if [ -n "$rev" ]; then
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  git archive "$rev" $(for d in $dirs README.md; do git cat-file -e "$rev:$d" 2>/dev/null && echo "$d"; done) | tar -x -C "$src"
fi
files=$(cd "$src" && find $dirs -name '*.c' 2>/dev/null | sort)
(cd "$src" && pmccabe $files) >"${TMPDIR:-/tmp}/ivserve-pmccabe.$$"
out="${TMPDIR:-/tmp}/ivserve-pmccabe.$$"
echo "functions by folder (pmccabe modified McCabe, ${rev:-working tree}):"
awk '{ split($6, p, "/"); d = p[1]; n[d]++; N++;
       if ($1 > 10) { a[d]++; A++ } if ($1 > 20) { b[d]++; B++ } if ($1 > m[d]) m[d] = $1; if ($1 > M) M = $1 }
     END { printf "  %-8s %6s %8s %8s %5s\n", "folder", "funcs", ">10", ">20", "max";
           for (d in n) printf "  %-8s %6d %7.1f%% %7.1f%% %5d\n", d, n[d], 100 * a[d] / n[d], 100 * b[d] / n[d], m[d];
           printf "  %-8s %6d %7.1f%% %7.1f%% %5d\n", "all", N, 100 * A / N, 100 * B / N, M }' "$out"
echo "largest $top:"
sort -k1 -n -r "$out" | awk -v top="$top" 'NR <= top { printf "  %4d  %s %s\n", $1, $6, $7 }'
echo "README.md lines: $(wc -l <"$src/README.md")"
rm -f "$out"
