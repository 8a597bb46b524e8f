#!/usr/bin/env bash
# Installs every Debian package that ivserve's build, tests and benchmarks
# need. Safe to run any number of times: apt-get skips what is installed.
#   scripts/setup.sh           everything (build, tests, benchmarks)
#   scripts/setup.sh --build   what building the server needs, no more
#                              (the example server and the Docker image)
#   scripts/setup.sh --client  what the Python client's install needs
#                              (README, "Clients": python3 -m venv, pip)
#   scripts/setup.sh --build-tests  what building the tests needs: --build
#                              and python3 (ctest's Python tests find it
#                              when cmake configures); scripts/test.sh
#                              builds on these while the rest installs
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake pkg-config ca-certificates curl
  libuv1-dev libzstd-dev libhdf5-dev libcjson-dev libjemalloc-dev
  check liblz4-dev zlib1g-dev libbrotli-dev libisal-dev node-llhttp
)
# python3-venv: `python3 -m venv`, the README's client install route, is
# not in Debian's python3.
CLIENT_PKGS=(
  python3 python3-venv python3-pip python3-setuptools python3-wheel
  python3-numpy python3-scipy python3-pandas python3-requests python3-anndata
)
PKGS=(
  "${BUILD_PKGS[@]}" "${CLIENT_PKGS[@]}" git hdf5-tools
  clang libclang-rt-14-dev llvm
  python3-h5py python3-zstandard python3-pytest
  r-base-core r-cran-httr2 r-cran-matrix r-cran-jsonlite r-cran-testthat
  r-bioc-singlecellexperiment r-cran-seurat
  python3-zarr python3-fsspec python3-numcodecs python3-aiohttp
  wrk nginx-light
  systemd strace openssl python3-yaml
  podman runc debootstrap
  chromium chromium-driver python3-selenium
)

# npm (browser tests' npm packages): Debian's, unless a Node.js that brings
# its own npm is installed already (Debian's npm conflicts with that one).
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

case "${1:-}" in
  --build) PKGS=("${BUILD_PKGS[@]}") ;;
  --client) PKGS=("${CLIENT_PKGS[@]}") ;;
  --build-tests) PKGS=("${BUILD_PKGS[@]}" python3) ;;
  "") ;;
  *) echo "setup.sh: unknown argument $1 (expected --build, --build-tests, --client or nothing)" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
