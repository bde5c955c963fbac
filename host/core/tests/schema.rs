//! The manifest's JSON Schema: deploy/manifest.schema.json is what the Rust
//! types generate, and every example manifest in the repository validates
//! against it (and reads as a manifest).
use std::path::{Path, PathBuf};

use wasmwatch_core::Manifest;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("wit/plugin.wit").is_file())
        .expect("the repository root")
        .to_path_buf()
}

const SCHEMA: &str = "deploy/manifest.schema.json";

fn generated() -> String {
    serde_json::to_string_pretty(&Manifest::json_schema()).unwrap() + "\n"
}

/// Set WASMWATCH_UPDATE_SCHEMA=1 to rewrite the file (or run
/// `wasmwatch manifest schema > deploy/manifest.schema.json`).
#[test]
fn the_published_schema_is_current() {
    let path = repo().join(SCHEMA);
    let want = generated();
    if std::env::var_os("WASMWATCH_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{SCHEMA} is not what the manifest's Rust types generate; rewrite it with \
         `WASMWATCH_UPDATE_SCHEMA=1 cargo test -p wasmwatch-core --test schema` \
         or `wasmwatch manifest schema > {SCHEMA}`"
    );
}

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join(SCHEMA)).unwrap()).unwrap();
    jsonschema::draft7::new(&schema).expect("a valid draft-07 schema")
}

/// Files under `dir` (recursively, skipping build output and node_modules)
/// that are plugin manifests.
fn manifests_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !["node_modules", "target", ".git"].contains(&name.as_str()) {
                manifests_under(&p, out);
            }
        } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
            && std::fs::read_to_string(&p).is_ok_and(|t| t.contains("kind: PluginManifest"))
        {
            out.push(p);
        }
    }
}

/// The placeholders examples carry where a real pin or name goes.
fn filled(text: &str) -> String {
    let hex = "ab".repeat(32);
    let mut t = text
        .replace("{{zeros}}", &"0".repeat(64))
        .replace("{{name}}", "my-plugin")
        .replace("{{limits}}", "{memory: 16Mi, timeout: 100ms}")
        .replace("<64 hex digits>", &hex);
    while let Some(i) = t.find("SHA256_OF_") {
        let end = t[i..]
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .map_or(t.len(), |e| i + e);
        t.replace_range(i..end, &hex);
    }
    t
}

/// The manifest in README.md's "The plugin manifest" section.
fn readme_manifest() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme.find("## The plugin manifest").expect("the section")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = section[start..].find("```").unwrap() + start;
    section[start..end].to_string()
}

#[test]
fn every_example_manifest_validates_against_the_schema() {
    let root = repo();
    let mut files = Vec::new();
    for dir in ["deploy", "plugins", "tests", "host/wasmwatch/templates"] {
        manifests_under(&root.join(dir), &mut files);
    }
    files.sort();
    for want in [
        "deploy/base/manifest.yaml",
        "deploy/examples/manifest.yaml",
        "deploy/overlays/single-namespace/manifest.yaml",
        "tests/fixtures/bundled-plugins-manifest.yaml",
        "host/wasmwatch/templates/common/wasmwatch.yaml",
    ] {
        assert!(
            files.contains(&root.join(want)),
            "{want} not found among {files:?}"
        );
    }
    // Each manifest, also those inside a ConfigMap of a multi-document
    // file (deploy/install*.yaml).
    let mut examples: Vec<(String, String)> = Vec::new();
    for f in &files {
        let name = f.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let filled_text = filled(&text);
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&filled_text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        if docs.len() == 1 && docs[0]["kind"] == "PluginManifest" {
            examples.push((name, text));
            continue;
        }
        for (i, doc) in docs.iter().enumerate() {
            if doc["kind"] == "ConfigMap"
                && let Some(data) = doc["data"].as_mapping()
            {
                for (key, value) in data {
                    if let Some(v) = value
                        .as_str()
                        .filter(|v| v.contains("kind: PluginManifest"))
                    {
                        examples.push((format!("{name} (document {i}, {key:?})"), v.to_string()));
                    }
                }
            }
        }
    }
    examples.push(("README.md (The plugin manifest)".into(), readme_manifest()));
    assert!(examples.len() >= 6, "{examples:?}");

    let validator = validator();
    for (name, text) in examples {
        let text = filled(&text);
        let instance: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{name} does not validate against {SCHEMA}: {errors:#?}"
        );
        // And the host reads it (the schema does not say more than it).
        if let Err(e) = Manifest::parse(&text, Path::new(".")) {
            panic!("{name}: {e}");
        }
    }
}

/// The schema catches what editors should flag as it is typed, each at its
/// place: an unknown field, a duration without a unit, a kind misspelt, a
/// pin that is no SHA-256.
#[test]
fn the_schema_flags_mistakes_at_their_place() {
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [Configmap]}}
plugins:
  - name: p
    module: p.wasm
    sha256: nope
    capabilites: {{events: true}}
    limits: {{timeout: 100}}
  - name: q
    module: q.wasm
    sha256: {}
",
        "ab".repeat(32)
    );
    let instance: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    let validator = validator();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{} {e}", e.instance_path()))
        .collect();
    for want in [
        "/watch/kinds/0",
        "/plugins/0/sha256",
        "/plugins/0 Additional properties are not allowed ('capabilites'",
        "/plugins/0/limits/timeout",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "no error at {want}: {errors:#?}"
        );
    }
    assert_eq!(errors.len(), 4, "{errors:#?}");
}
