#!/bin/sh
# Builds {{name}}.wasm (needs: rustup target add wasm32-wasip2) and pins its
# SHA-256 in wasmwatch.yaml.
set -eu
cd "$(dirname "$0")"
cargo build --release --target wasm32-wasip2
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" {{name}}.wasm
