#!/bin/sh
# Builds {{name}}.wasm with componentize-py (pip install
# componentize-py=={{componentize_py}}; or set COMPONENTIZE_PY) and pins its
# SHA-256 in wasmwatch.yaml.
set -eu
cd "$(dirname "$0")"
PYTHONDONTWRITEBYTECODE=1 "${COMPONENTIZE_PY:-componentize-py}" -d wit -w plugin \
    componentize -p sdk -p . app -o {{name}}.wasm
