#!/usr/bin/env bash
# Fuzzing at depth: every libFuzzer target of tests/fuzz for a given time
# each, in libFuzzer's fork mode (one fork job a core), from the
# checked-in seeds and the corpus earlier runs left; prints each target's
# executions, corpus and findings, and exits non-zero on any finding.
#
#   scripts/fuzz_campaign.sh [SECONDS_PER_TARGET]   (default 600)
#
#   FUZZ_JOBS     fork jobs per target (default: nproc)
#   FUZZ_TARGETS  names to run (default: every tests/fuzz/fuzz_*.c)
#   FUZZ_OUT      logs and findings (default: build-fuzz/campaign)
#   FUZZ_NO_BUILD 1: run the targets already built (see below)
#
# The targets are built as scripts/test.sh builds them (clang, ASan +
# UBSan + libFuzzer, -DIV_FUZZ=ON, in build-fuzz).  The corpus of each
# target is build-fuzz/corpus/NAME, the folder test.sh's short runs use,
# so that a campaign's finds seed them; tests/fuzz/seeds/NAME is read only.
# Fork mode runs each job as a child process: a crash, timeout or
# out-of-memory in one is counted and its input kept (-ignore_crashes and
# friends), and the campaign goes on for the whole time, so one run
# collects every finding, each in FUZZ_OUT/findings/NAME/ as libFuzzer
# names it (crash-*, timeout-*, oom-*; those of earlier runs are left
# there and not counted).  Any of them fails the run, as in test.sh.  Executions are the sum over the finished fork jobs, read
# from the last status line ("#N: cov: ... corp: K exec/s E
# oom/timeout/crash: O/T/C ..."); the corpus is the files in the corpus
# folder at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-600}
JOBS=${FUZZ_JOBS:-$(nproc)}
OUT=${FUZZ_OUT:-build-fuzz/campaign}
# (0 would be libFuzzer's "no time limit".)
case "$SECS" in '' | *[!0-9]* | 0) echo "usage: $0 [SECONDS_PER_TARGET >= 1]" >&2; exit 2 ;; esac

# FUZZ_NO_BUILD=1 runs the targets already in build-fuzz (a machine with
# no clang or no build dependencies, given the binaries and their
# libraries on LD_LIBRARY_PATH).
if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_FUZZ=ON -DIV_TESTS=OFF \
    >/dev/null
  cmake --build build-fuzz -j"$JOBS" >/dev/null
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
  names=$FUZZ_TARGETS
else
  names=$(for src in tests/fuzz/fuzz_*.c; do basename "$src" .c; done)
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)   # libFuzzer's artifact prefix is used as given

echo "fuzz campaign: ${SECS}s a target, -fork=$JOBS, $(nproc) cores; logs and findings in $OUT"
printf '%-18s %14s %10s %8s %6s %8s %6s %9s\n' target executions exec/s corpus cov crashes ooms timeouts
failed=0
total_execs=0
for name in $names; do
  target="build-fuzz/tests/fuzz/$name"
  if [ ! -f "$target" ] || [ ! -x "$target" ]; then
    echo "$name: not built ($target)" >&2
    failed=1
    continue
  fi
  corpus="build-fuzz/corpus/$name"
  findings="$OUT/findings/$name"
  log="$OUT/$name.log"
  mkdir -p "$corpus" "$findings"
  # Findings of this run are the files newer than this mark (an earlier
  # run's stay where they are).
  stamp="$OUT/$name.start"
  : >"$stamp"
  seeds="tests/fuzz/seeds/$name"
  [ -d "$seeds" ] || seeds=""
  # UBSan halts so that undefined behaviour counts as a crash (known
  # findings awaiting a fix are listed in tests/fuzz/ubsan.supp).
  rc=0
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(pwd)/tests/fuzz/ubsan.supp \
    "$target" -fork="$JOBS" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" \
    "$corpus" ${seeds:+"$seeds"} >"$log" 2>&1 || rc=$?
  # The last status line of the fork driver; none when no job finished.
  last=$(grep -E '^#[0-9]+: cov: ' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^#([0-9]+): .*/\1/p' <<<"$last")
  cov=$(sed -nE 's/.* cov: ([0-9]+) .*/\1/p' <<<"$last")
  ooms=$(sed -nE 's#.* oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+) .*#\1#p' <<<"$last")
  timeouts=$(sed -nE 's#.* oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+) .*#\2#p' <<<"$last")
  crashes=$(sed -nE 's#.* oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+) .*#\3#p' <<<"$last")
  secs=$(sed -nE 's/^INFO: exiting: [0-9-]+ time: ([0-9]+)s.*/\1/p' "$log" | tail -1)
  execs=${execs:-0} cov=${cov:-0} ooms=${ooms:-0} timeouts=${timeouts:-0} crashes=${crashes:-0}
  files=$(find "$corpus" -maxdepth 1 -type f | wc -l)
  kept=$(find "$findings" -maxdepth 1 -type f -newer "$stamp" | wc -l)
  # Jobs still running at the end report after the last status line: a
  # kind's count is the larger of the counter and the files it left.
  for kind in crash oom timeout; do
    n=$(find "$findings" -maxdepth 1 -type f -name "$kind-*" -newer "$stamp" | wc -l)
    case $kind in
      crash) [ "$n" -le "$crashes" ] || crashes=$n ;;
      oom) [ "$n" -le "$ooms" ] || ooms=$n ;;
      timeout) [ "$n" -le "$timeouts" ] || timeouts=$n ;;
    esac
  done
  secs=${secs:-$SECS}
  rate=$((execs / (secs > 0 ? secs : 1)))
  printf '%-18s %14s %10s %8s %6s %8s %6s %9s\n' "$name" "$execs" "$rate" "$files" "$cov" \
    "$crashes" "$ooms" "$timeouts"
  total_execs=$((total_execs + execs))
  if [ "$crashes" -gt 0 ] || [ "$ooms" -gt 0 ] || [ "$timeouts" -gt 0 ] || [ "$kept" -gt 0 ]; then
    # The fork jobs' own reports are not kept: running a target on a
    # finding prints its report and stack again.
    echo "  $name: $kept findings kept in $findings; to see one: $target FILE"
    find "$findings" -maxdepth 1 -type f -newer "$stamp" | head -3 | sed 's/^/    /'
    failed=1
  elif [ -z "$last" ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; }; then
    # No status line at all, or libFuzzer itself failed: the run says nothing.
    echo "  $name: no fuzzing happened (exit $rc); see $log"
    tail -5 "$log" | sed 's/^/    /'
    failed=1
  fi
done
echo "fuzz campaign: $total_execs executions in all; $([ "$failed" -eq 0 ] && echo "no findings" || echo "FAILED")"
[ "$failed" -eq 0 ]
