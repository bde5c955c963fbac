#!/bin/sh
# Builds {{name}}.wasm with componentize-js (installed by npm from
# package.json) for the world wasmwatch:plugin/plugin@0.4.0
# (wit/0.4.0/plugin.wit, the one sdk/ imports) and pins its SHA-256 in
# wasmwatch.yaml.
set -eu
cd "$(dirname "$0")"
if [ ! -f wit/0.4.0/plugin.wit ]; then
    echo "build.sh: wit/0.4.0/plugin.wit is missing: sdk/ imports wasmwatch:plugin/host@0.4.0" >&2
    exit 1
fi
[ -d node_modules/@bytecodealliance/componentize-js ] || npm install --no-audit --no-fund
node node_modules/@bytecodealliance/componentize-js/src/cli.js app.js \
    --wit wit/0.4.0 --world-name plugin --disable http fetch-event --out {{name}}.wasm
