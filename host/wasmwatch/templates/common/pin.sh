sum=$(sha256sum {{name}}.wasm 2>/dev/null || shasum -a 256 {{name}}.wasm)
sum=${sum%% *}
sed "s/^    sha256: .*/    sha256: \"$sum\"/" wasmwatch.yaml > wasmwatch.yaml.new
mv wasmwatch.yaml.new wasmwatch.yaml
echo "built {{name}}.wasm, sha256 $sum (pinned in wasmwatch.yaml)"
