#!/bin/sh
# Builds {{name}}.wasm with componentize-py (pip install
# componentize-py=={{componentize_py}}; or set COMPONENTIZE_PY) against the
# world `plugin` of wit/0.4.0/plugin.wit (wasmwatch:plugin/plugin@0.4.0, the
# one the SDK in sdk/ speaks) and pins its SHA-256 in wasmwatch.yaml.
set -eu
cd "$(dirname "$0")"
if [ ! -f wit/0.4.0/plugin.wit ]; then
    echo "build.sh: wit/0.4.0/plugin.wit is missing: sdk/ speaks wasmwatch:plugin/plugin@0.4.0" >&2
    exit 1
fi
PYTHONDONTWRITEBYTECODE=1 "${COMPONENTIZE_PY:-componentize-py}" -d wit/0.4.0 -w plugin \
    componentize -p sdk -p . app -o {{name}}.wasm
