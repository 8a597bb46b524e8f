#!/bin/sh
# Fetches the npm packages the Zarr client tests use (tests/python/
# test_zarr_clients.py) into a cache folder, once: later runs find them
# there and do nothing.
#
#   vitessce@4.0.8   its ESM bundle dist/index.min.js, which imports only
#                    react and react-dom (npm pack + unpack: no dependency
#                    install, the bundle carries the rest)
#   react@18, react-dom@18   their UMD files, that the test page loads
#   zarrita          npm install --no-save, for the node reader
#
# The folder is $IVSERVE_NPM_CACHE, else ~/.cache/ivserve-npm.  Prints the
# folder on its last line.  Needs the npm registry (CI has it).
set -eu
DIR=${IVSERVE_NPM_CACHE:-$HOME/.cache/ivserve-npm}
mkdir -p "$DIR"
cd "$DIR"

# unpack NAME SPEC FILE: npm pack SPEC into NAME/ unless NAME/FILE exists.
unpack() {
    if [ -f "$1/$3" ]; then return 0; fi
    rm -rf "$1" "$1.tmp"
    mkdir "$1.tmp"
    tgz=$(npm pack --silent --pack-destination "$1.tmp" "$2" | tail -n 1)
    tar -xzf "$1.tmp/$tgz" -C "$1.tmp"
    mv "$1.tmp/package" "$1"
    rm -rf "$1.tmp"
    test -f "$1/$3"
}

unpack vitessce vitessce@4.0.8 dist/index.min.js
unpack react react@18 umd/react.production.min.js
unpack react-dom react-dom@18 umd/react-dom.production.min.js

if [ ! -f node_modules/zarrita/package.json ]; then
    [ -f package.json ] || printf '{"name":"ivserve-npm-cache","private":true}\n' > package.json
    npm install --no-save --no-audit --no-fund --silent zarrita >/dev/null
    test -f node_modules/zarrita/package.json
fi
echo "$DIR"
