#!/usr/bin/env bash
# Installs the Debian packages, builds ivserve and serves the bundled
# example dataset on http://127.0.0.1:8080 (PORT=... to change it).
# Try:  curl 'http://127.0.0.1:8080/v1/datasets/pbmc_example/query?obs=0:5&var=0:20'
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target ivserve
echo "run_example: the viewer is at http://127.0.0.1:${PORT:-8080}/ (the example's embedding, obsm/X_umap)"
exec build/ivserve --port "${PORT:-8080}" examples/pbmc_example.h5ad "$@"
