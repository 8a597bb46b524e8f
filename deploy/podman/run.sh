#!/usr/bin/env bash
# Builds the Dockerfile's image with Debian's podman and no registry, runs
# it, queries it and stops it: the check that the image works, run by hand
# (it takes minutes, so it is not part of scripts/test.sh).
#
#   deploy/podman/run.sh            build, run, check, stop (exit 0 = all good)
#   KEEP=1 deploy/podman/run.sh     leave the container running afterwards
#
# Steps, each timed:
#  1. the base image: a `debootstrap --variant=minbase bookworm` root,
#     imported as localhost/ivserve-base:bookworm.  The root's tarball is
#     cached in $IVSERVE_CACHE (default ~/.cache/ivserve) and the image in
#     podman's store, so only the first run pays for debootstrap.
#  2. `podman build --isolation chroot --format docker` of the Dockerfile
#     (the docker format keeps HEALTHCHECK; OCI drops it).
#  3. `podman run --runtime runc --cgroup-manager=cgroupfs --network host`
#     with explicit --ulimit values (runc cannot raise a limit past the
#     caller's hard limit, and podman's defaults ask for more than a
#     sandbox grants), a read-only root, no capabilities, and examples/
#     mounted read-only at /data.  Periodic health checks need systemd
#     timers, absent here: the check is run once by hand instead.
#  4. checks: /readyz, the dataset list, a query and the whole matrix as a
#     binary stream compared byte for byte with a server run directly from
#     build/ivserve on the same file, the image's HEALTHCHECK, a non-root
#     user, a read-only data volume; then `podman stop` (SIGTERM) must end
#     the server with status 0.
#
# Needs: podman, runc, debootstrap (scripts/setup.sh installs them), root
# (debootstrap and podman's rootful store), curl, cmake for build/ivserve.
set -euo pipefail
cd "$(dirname "$0")/../.."

BASE_IMAGE=localhost/ivserve-base:bookworm
IMAGE=${IMAGE:-localhost/ivserve:dev}
NAME=ivserve-check-$$
CACHE=${IVSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ivserve}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DS=pbmc_example

say() { printf '[run.sh %5ss] %s\n' "$SECONDS" "$*"; }
die() { printf 'run.sh: error: %s\n' "$*" >&2; exit 1; }

for tool in podman runc debootstrap curl cmake; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/setup.sh installs it)"
done
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and podman's rootful store need it)"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Explicit limits at or under this shell's hard limits: runc sets them in
# the container and fails with "error setting rlimit" when asked for more.
hard_or() { local h; h=$(ulimit -H "$1"); [ "$h" = unlimited ] || [ "$h" -ge "$2" ] && echo "$2" || echo "$h"; }
NOFILE=$(hard_or -n 16384)
NPROC=$(hard_or -u 4096)

# 1. The base image.
t0=$SECONDS
if podman image exists "$BASE_IMAGE"; then
  say "base image $BASE_IMAGE already in podman's store"
else
  mkdir -p "$CACHE"
  tarball="$CACHE/bookworm-minbase.tar"
  if [ ! -s "$tarball" ]; then
    root=$(mktemp -d "$CACHE/root.XXXXXX")
    say "debootstrap --variant=minbase bookworm from $MIRROR (a few minutes)"
    debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { rm -rf "$root"; die "debootstrap failed, see $CACHE/debootstrap.log"; }
    # apt in the image must clean up after itself as it does in debian:12-slim.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "importing $tarball as $BASE_IMAGE"
  podman import --quiet "$tarball" "$BASE_IMAGE" >/dev/null
fi
t_base=$((SECONDS - t0))

# 2. The image.
t0=$SECONDS
say "podman build --isolation chroot -t $IMAGE"
podman build --quiet --isolation chroot --format docker --build-arg BASE="$BASE_IMAGE" \
  -t "$IMAGE" . >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log"; die "podman build failed (log: $CACHE/build.log)"; }
t_build=$((SECONDS - t0))
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "image $IMAGE: $((size / 1000000)) MB"

# The server run directly, for the bytes to compare with.
if [ ! -x build/ivserve ]; then
  say "building build/ivserve for the direct server"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)" --target ivserve >/dev/null
fi
work=$(mktemp -d)
direct_pid=""
cleanup() {
  [ -n "$direct_pid" ] && kill "$direct_pid" 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then podman rm -f -t 5 "$NAME" >/dev/null 2>&1 || true; fi
  # podman's complaints about systemd health-check timers (see above) are
  # noise here; anything else it said is shown.
  grep -v 'systemd connection' "$work/podman.log" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
dport=$(free_port)
build/ivserve --port "$dport" --access-log off examples/$DS.h5ad 2>"$work/direct.log" &
direct_pid=$!

# 3. The container.
port=$(free_port)
t0=$SECONDS
say "podman run (port $port, nofile $NOFILE, nproc $NPROC)"
podman run -d --name "$NAME" --runtime runc --cgroup-manager=cgroupfs --network host \
  --ulimit nofile="$NOFILE:$NOFILE" --ulimit nproc="$NPROC:$NPROC" \
  --read-only --cap-drop=all --security-opt no-new-privileges \
  --health-interval=disable \
  -e IVSERVE_LISTEN=127.0.0.1 -e IVSERVE_PORT="$port" \
  -v "$PWD/examples:/data:ro" "$IMAGE" /data/$DS.h5ad >/dev/null 2>>"$work/podman.log"

wait_ready() {  # URL what
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}
c="http://127.0.0.1:$port"
d="http://127.0.0.1:$dport"
wait_ready "$c" || { podman logs "$NAME" | tail -20; die "the container did not become ready"; }
t_ready=$((SECONDS - t0))
wait_ready "$d" || { tail -20 "$work/direct.log"; die "the direct server did not become ready"; }

# 4. Checks.
fail=0
check() { if eval "$2"; then say "ok: $1"; else say "FAILED: $1"; fail=1; fi; }
curl -sf "$c/v1/datasets" >"$work/list.json"
check "the dataset list names $DS" "grep -q '\"id\": *\"$DS\"' '$work/list.json'"
q='{"obs":{"index":[5,0,3,3,99]},"var":{"range":[0,200]},"format":"binary"}'
for side in c d; do
  url=${!side}
  curl -sf -X POST -H 'Content-Type: application/json' -d "$q" "$url/v1/datasets/$DS/query" >"$work/q.$side"
  curl -sf -H 'Accept: application/vnd.ivserve.csr' "$url/v1/datasets/$DS/query" >"$work/all.$side"
done
check "a query's binary answer equals the direct server's ($(stat -c %s "$work/q.c") bytes)" \
  "[ -s '$work/q.c' ] && cmp -s '$work/q.c' '$work/q.d'"
check "the whole matrix stream equals the direct server's ($(stat -c %s "$work/all.c") bytes)" \
  "[ -s '$work/all.c' ] && cmp -s '$work/all.c' '$work/all.d'"
check "HEALTHCHECK passes (podman healthcheck run)" "podman healthcheck run '$NAME' >/dev/null 2>&1"
uid=$(podman exec "$NAME" id -u)
check "the server runs as a non-root user (uid $uid)" "[ '$uid' != 0 ]"
check "the data volume is read-only" "! podman exec '$NAME' touch /data/.w 2>/dev/null"
check "the runtime stage has no compiler or headers" \
  "! podman exec '$NAME' sh -c 'command -v cc || ls /usr/include/hdf5*' >/dev/null 2>&1"

if [ -n "${KEEP:-}" ]; then
  say "KEEP=1: container $NAME left running on $c"
else
  t0=$SECONDS
  podman stop -t 20 "$NAME" >/dev/null 2>>"$work/podman.log"
  status=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
  check "podman stop ends the server cleanly (exit status $status)" "[ '$status' = 0 ]"
  t_stop=$((SECONDS - t0))
  say "timings: base image ${t_base}s, build ${t_build}s, start to ready ${t_ready}s, stop ${t_stop}s"
fi
[ "$fail" = 0 ] || die "some checks failed"
say "all checks passed"
