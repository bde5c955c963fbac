#!/bin/sh
# Builds {{name}}.wasm with componentize-js (installed by npm from
# package.json) and pins its SHA-256 in wasmwatch.yaml.
set -eu
cd "$(dirname "$0")"
[ -d node_modules/@bytecodealliance/componentize-js ] || npm install --no-audit --no-fund
node node_modules/@bytecodealliance/componentize-js/src/cli.js app.js \
    --wit wit --world-name plugin --disable http fetch-event --out {{name}}.wasm
