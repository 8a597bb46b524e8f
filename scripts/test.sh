#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test of ivserve:
#   1. the release build (warnings are errors) and, of its ctest suite,
#      every unit test (the query unit test with all its random
#      selections), the Python tests that step 2 leaves out (listed
#      there), and three end-to-end suites on the binary as shipped
#      (test_http_server, test_orient, test_client_py).  Every other
#      Python test (process-level: HTTP, CLI, damaged and hostile files)
#      runs once, in step 2: under ASan + UBSan it asserts everything it
#      asserts in the release build and also catches the reads out of
#      bounds and the undefined behaviour a release build would survive;
#      running it twice cost about six minutes of a two-core CI run;
#   2. the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#      (Debug, so asserts stay on, at -O1 as ASan's documentation advises:
#      heap overflows and signed overflows are caught as at -O0, inlined
#      frames are still named in reports, and the code runs faster; only a
#      load whose value is never used may be optimized away unchecked),
#      but for the deployment tests and the R client's (they check nginx,
#      systemd, manifests and R code; the C they run is the same as in the
#      HTTP tests), the browser tests (viewer, explore, Zarr clients: their
#      time is Chromium's and node's; the routes they call are the ones
#      test_http_viewer, test_diffexp and test_zarr run here) and the memory
#      test (it measures the server's resident memory, which ASan's
#      allocator and shadow change; the streams it runs are the HTTP tests');
#   3. the suite built with ThreadSanitizer, any race an error, over the
#      tests that have threads of their own to race: every unit test that
#      starts threads or uses the pool (pool, query, transpose, registry,
#      connections, gzip stream, HDF5 isolation; not the single-threaded
#      codec, metadata and filter tests) and the server's HTTP,
#      orientation, reload, replace and auth tests.  Left out
#      there are the HTTP connection test (three minutes under TSan, most
#      of it waiting out its timeouts; what it times out is one loop's
#      connections, whose hand-offs to the workers and to the other loops
#      test_http_server, test_http_loops and unit.test_conn run here),
#      the tests of file parsing, codecs, metadata, export,
#      clients and memory, the hardening test (its huge bodies take nine
#      minutes under TSan; its threads are the query, aggregate and
#      cancellation paths the HTTP tests run), the Zarr clients' test (its
#      C is the Zarr route test_zarr runs; its time is node and Chromium),
#      the hostile-file campaign, the HTTP gzip test (its threads are
#      the block and whole-document compression on the workers, which
#      every query of the HTTP tests runs: requests asks for gzip and the
#      server's default level is 1; the pieces compressed in parallel are
#      unit.test_gzip_stream's; the rest of it is the loop's, one thread),
#      the packing of
#      ordinary files and the first-run checks (processes, not threads:
#      their C is the writers' and the loaders', run by the other
#      tests), and the engine-level orientation test, whose
#      threads are the same pool and transpose paths the unit tests and
#      the HTTP orientation test already run, and which take minutes each
#      under TSan;
#   4. each libFuzzer target for a short while (FUZZ_SECONDS, default 10:
#      a regression run from the checked-in seeds; the long campaign, ten
#      million runs a target and more, is run on the 16-core machine),
#      as many at a time as there are cores.
# The unit query test runs a third of its random selections in the
# sanitizer builds (all of them in the release build), the unit transpose
# test a quarter of its repeated ids under TSan, and the sanitizer phases
# set IV_TEST_SCALE=$SANITIZER_SCALE (0.25): test_export_diff and
# test_orient run that share of their random selections there, never
# below a floor that keeps every case and selection kind
# (tests/python/testscale.py).  The TSan phase builds only the server and
# the unit tests it runs; the fuzz phase builds only the fuzz targets.
# The hostile-file campaign runs 36 files in the ASan phase (every lie and
# every damage kind once; IV_HOSTILE_FILES sets another count).
# The builds compile while the packages the tests alone need (R, Chromium,
# clang, podman, Python modules) install in the background; the tests start
# once both are done.
# Fixtures are read from ../shared/fixtures when present (tests that need
# them say so and skip otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
# The share of their random inputs that the tests of tests/python/testscale.py
# run in the sanitizer phases (each keeps a floor that runs all its cases).
SANITIZER_SCALE=${SANITIZER_SCALE:-0.25}
# The hostile-file campaign's files in the ASan phase: every lie, and one
# damaged file of each damage kind on each base file (the test's default,
# 48, adds 12 more damaged ones; its full campaign is 400).
HOSTILE_FILES=${IV_HOSTILE_FILES:-36}

# The packages the builds need first; the rest (R, Chromium, clang,
# podman, the Python test modules: minutes on a bare machine, mostly
# downloads and unpacking) install in the background while the release,
# ASan and TSan builds compile, and the tests wait for them.
scripts/setup.sh --build-tests
setup_log=$(mktemp)
scripts/setup.sh >"$setup_log" 2>&1 &
setup_pid=$!

echo "== builds: release, AddressSanitizer + UndefinedBehaviorSanitizer, ThreadSanitizer"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DIV_SANITIZE=ON \
  -DIV_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_TSAN=ON -DIV_WERROR=ON >/dev/null
# The server and the unit tests the TSan phase runs: every unit test but
# the single-threaded ones left out below (their executables would be
# built for nothing).
TSAN_SKIP_UNIT=(test_blosc2 test_meta test_filter)
tsan_targets=(ivserve)
for src in $(find tests/unit -name 'test_*.c' | sort); do
  name=$(basename "$src" .c)
  [[ " ${TSAN_SKIP_UNIT[*]} " == *" $name "* ]] || tsan_targets+=("$name")
done
cmake --build build-tsan -j"$JOBS" --target "${tsan_targets[@]}"

if ! wait "$setup_pid"; then
  cat "$setup_log"
  echo "setup: the packages the tests need could not be installed" >&2
  exit 1
fi
tail -1 "$setup_log"
rm -f "$setup_log"

echo "== release tests"
ctest --test-dir build --output-on-failure -j"$JOBS" \
  -R '^unit\.|test_deploy_|test_client_|py\.test_memory|py\.test_viewer|test_zarr_clients|py\.test_http_server$|py\.test_orient$'

echo "== AddressSanitizer + UndefinedBehaviorSanitizer tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:suppressions=$(pwd)/tests/asan.supp UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  IV_TEST_SCALE=$SANITIZER_SCALE IV_HOSTILE_FILES=$HOSTILE_FILES ctest --test-dir build-asan --output-on-failure -j"$JOBS" -E 'test_deploy_|test_client_r|py\.test_memory|py\.test_viewer|test_zarr_clients'

echo "== ThreadSanitizer tests"
tsan_skip_unit=$(printf '|unit\\.%s$' "${TSAN_SKIP_UNIT[@]}")
TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$(pwd)/tests/tsan.supp" \
  IV_TEST_SCALE=$SANITIZER_SCALE ctest --test-dir build-tsan --output-on-failure -j"$JOBS" \
  -E "test_export_diff|py\\.test_http_conn|test_deploy_|test_client_|py\\.test_viewer|test_badfiles|test_damaged|test_fixtures|test_reference|py\\.test_meta|test_pack|test_http_meta|py\\.test_orient|py\\.test_memory|test_hostile_files|test_autopack|test_first_run|test_filters|py\\.test_hardening|py\\.test_http_gzip|test_zarr_clients$tsan_skip_unit"

echo "== fuzz targets (${FUZZ_SECONDS}s each, $JOBS at a time)"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_FUZZ=ON -DIV_TESTS=OFF \
  >/dev/null
# The fuzz targets only (not the ivserve program, which no fuzzer runs).
fuzz_targets=()
for src in tests/fuzz/fuzz_*.c; do
  fuzz_targets+=("$(basename "$src" .c)")
done
cmake --build build-fuzz -j"$JOBS" --target "${fuzz_targets[@]}"
# One target's run, its output in build-fuzz/NAME.log and its exit status
# in build-fuzz/NAME.status.  The targets run $JOBS at a time (each is one
# process on one core, so each gets the FUZZ_SECONDS of a core it had when
# they ran one after another); the report below reads the statuses once
# all have ended, in the targets' order whatever order they ended in.
fuzz_one() {
  local target=$1 name corpus seeds rc
  name=$(basename "$target")
  corpus="build-fuzz/corpus/$name"
  mkdir -p "$corpus"
  # Checked-in seeds (read only: new inputs go to the first folder) lead
  # the fuzzer to inputs it would take long to find, such as 19-digit
  # integers; UBSan halts so that undefined behaviour fails the run (known
  # findings awaiting a fix are listed in tests/fuzz/ubsan.supp).
  seeds="tests/fuzz/seeds/$name"
  [ -d "$seeds" ] || seeds=""
  if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=tests/fuzz/ubsan.supp \
       "$target" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 "$corpus" \
       ${seeds:+"$seeds"} >"build-fuzz/$name.log" 2>&1; then
    rc=0
  else
    rc=$?
  fi
  echo "$rc" >"build-fuzz/$name.status"
}
targets=()
for target in build-fuzz/tests/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  targets+=("$target")
  rm -f "build-fuzz/$(basename "$target").status"
done
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait
fuzz_pass=0
fuzz_fail=0
for target in "${targets[@]}"; do
  name=$(basename "$target")
  corpus="build-fuzz/corpus/$name"
  if [ "$(cat "build-fuzz/$name.status" 2>/dev/null)" = 0 ]; then
    echo "fuzz $name: ok ($(grep -c . "$corpus"/* 2>/dev/null | wc -l) corpus inputs)"
    fuzz_pass=$((fuzz_pass + 1))
  else
    echo "fuzz $name: FAILED (exit status $(cat "build-fuzz/$name.status" 2>/dev/null || echo unknown))"
    tail -40 "build-fuzz/$name.log"
    fuzz_fail=$((fuzz_fail + 1))
  fi
done
echo "fuzz: $fuzz_pass passed, $fuzz_fail failed"
[ "$fuzz_fail" -eq 0 ]

echo "== all tests passed"
