//! `wasmwatch plugin new --lang rust|python|js NAME`: a ready plugin
//! project. It carries everything it builds from (the WIT contract and the
//! language's SDK, copied in from this binary), so it builds outside this
//! repository and offline once the language's toolchain is installed:
//!
//! ```text
//! NAME/
//!   wasmwatch.yaml              manifest entry (build.sh pins the sha256)
//!   build.sh                    builds NAME.wasm and pins it
//!   tests/example.event.yaml    a fixture event ...
//!   tests/example.expected.json ... and the decision expected for it
//!   wit/0.4.0/plugin.wit        the contract every SDK builds on (0.4.0)
//!   sdk/                        the language's SDK
//!   src/lib.rs | app.py | app.js, Cargo.toml | package.json
//! ```
//!
//! The templates live in host/wasmwatch/templates; the SDKs are the ones in
//! plugins/ (a unit test checks that every SDK file is embedded).
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The plugin languages `plugin new` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// componentize-py as tests/prepare installs it.
const COMPONENTIZE_PY: &str = "0.25.1";
/// componentize-js as plugins/js/package.json pins it.
const COMPONENTIZE_JS: &str = "0.23.0";
/// componentize-js imports it without declaring it (plugins/js/package.json).
const PREVIEW2_SHIM: &str = "0.25.0";

macro_rules! files {
    ($($dest:literal => $src:literal),* $(,)?) => {
        &[$(($dest, include_str!($src))),*]
    };
}

type Files = &'static [(&'static str, &'static str)];

const COMMON: Files = files![
    "wasmwatch.yaml" => "../templates/common/wasmwatch.yaml",
    "README.md" => "../templates/common/README.md",
    "tests/example.event.yaml" => "../templates/common/example.event.yaml",
    "tests/example.expected.json" => "../templates/common/example.expected.json",
    // The contract every SDK builds on (0.4.0).
    "wit/0.4.0/plugin.wit" => "../../../wit/0.4.0/plugin.wit",
];

const RUST: Files = files![
    "Cargo.toml" => "../templates/rust/Cargo.toml",
    ".cargo/config.toml" => "../templates/rust/cargo-config.toml",
    "src/lib.rs" => "../templates/rust/lib.rs",
    "sdk/src/lib.rs" => "../../../plugins/sdk/src/lib.rs",
    "sdk/src/action.rs" => "../../../plugins/sdk/src/action.rs",
    "sdk/src/spring.rs" => "../../../plugins/sdk/src/spring.rs",
];

/// The Rust SDK's manifest in a generated project (the repository's
/// inherits from the plugins workspace).
const RUST_SDK_MANIFEST: &str = r#"[package]
name = "wasmwatch-plugin-sdk"
description = "Bindings and small helpers for writing wasmwatch plugins in Rust"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
wit-bindgen = { version = "0.63", default-features = false, features = ["macros", "realloc", "std"] }
serde = { version = "1", features = ["derive"] }
serde_json = "1"
"#;

const PYTHON: Files = files![
    "app.py" => "../templates/python/app.py",
    "sdk/wasmwatch_plugin/__init__.py" => "../../../plugins/python/sdk/wasmwatch_plugin/__init__.py",
    "sdk/wasmwatch_plugin/action.py" => "../../../plugins/python/sdk/wasmwatch_plugin/action.py",
    "sdk/wasmwatch_plugin/config.py" => "../../../plugins/python/sdk/wasmwatch_plugin/config.py",
    "sdk/wasmwatch_plugin/error.py" => "../../../plugins/python/sdk/wasmwatch_plugin/error.py",
    "sdk/wasmwatch_plugin/event.py" => "../../../plugins/python/sdk/wasmwatch_plugin/event.py",
    "sdk/wasmwatch_plugin/spring.py" => "../../../plugins/python/sdk/wasmwatch_plugin/spring.py",
    "sdk/wasmwatch_plugin/py.typed" => "../../../plugins/python/sdk/wasmwatch_plugin/py.typed",
];

const JS: Files = files![
    "app.js" => "../templates/js/app.js",
    "package.json" => "../templates/js/package.json",
    "sdk/index.js" => "../../../plugins/js/sdk/index.js",
    "sdk/action.js" => "../../../plugins/js/sdk/action.js",
    "sdk/spring.js" => "../../../plugins/js/sdk/spring.js",
    "sdk/host.d.ts" => "../../../plugins/js/sdk/host.d.ts",
];

const BUILD_RUST: &str = include_str!("../templates/rust/build.sh");
const BUILD_PYTHON: &str = include_str!("../templates/python/build.sh");
const BUILD_JS: &str = include_str!("../templates/js/build.sh");
const PIN: &str = include_str!("../templates/common/pin.sh");

/// A plugin name as the manifest takes it: a DNS-1123 label.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "{name:?} is not a valid plugin name: use lowercase letters, digits and '-', starting with a letter (a DNS-1123 label, at most 63 characters), e.g. my-plugin"
        );
    }
    Ok(())
}

/// The files of a new project, with their content.
fn project(lang: Lang, name: &str) -> Vec<(String, String, bool)> {
    let (language, source, sdk_doc, limits, specific, build) = match lang {
        Lang::Rust => (
            "Rust",
            "src/lib.rs",
            "the crate wasmwatch-plugin-sdk",
            "{memory: 16Mi, timeout: 100ms}",
            RUST,
            BUILD_RUST,
        ),
        Lang::Python => (
            "Python",
            "app.py",
            "the package wasmwatch_plugin",
            "{memory: 128Mi, timeout: 1s}",
            PYTHON,
            BUILD_PYTHON,
        ),
        Lang::Js => (
            "JavaScript",
            "app.js",
            "sdk/index.js",
            "{memory: 64Mi, timeout: 1s}",
            JS,
            BUILD_JS,
        ),
    };
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{zeros}}", &"0".repeat(64))
            .replace("{{limits}}", limits)
            .replace("{{language}}", language)
            .replace("{{source}}", source)
            .replace("{{sdk_doc}}", sdk_doc)
            .replace("{{componentize_py}}", COMPONENTIZE_PY)
            .replace("{{componentize_js}}", COMPONENTIZE_JS)
            .replace("{{preview2_shim}}", PREVIEW2_SHIM)
    };
    let mut files: Vec<(String, String, bool)> = COMMON
        .iter()
        .chain(specific)
        .map(|(path, text)| {
            let text = if path.starts_with("sdk/") {
                // The SDK's own text stays as it is, but for where the
                // Rust SDK finds the WIT in the project.
                text.replace("path: \"../../wit/", "path: \"../wit/")
            } else {
                fill(text)
            };
            (path.to_string(), text, false)
        })
        .collect();
    if lang == Lang::Rust {
        files.push(("sdk/Cargo.toml".into(), RUST_SDK_MANIFEST.into(), false));
    }
    files.push(("build.sh".into(), fill(&format!("{build}{PIN}")), true));
    files
}

/// Writes the project `name` in `parent`; returns its folder.
pub fn new_project(lang: Lang, name: &str, parent: &Path) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let dir = parent.join(name);
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} already exists and is not empty; choose another name or folder",
            dir.display()
        );
    }
    for (path, text, executable) in project(lang, name) {
        let dest = dir.join(&path);
        if let Some(p) = dest.parent() {
            std::fs::create_dir_all(p).with_context(|| format!("cannot create {}", p.display()))?;
        }
        std::fs::write(&dest, text).with_context(|| format!("cannot write {}", dest.display()))?;
        if executable {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of an SDK folder in plugins/ is embedded, so a file added
    /// there cannot be missing from generated projects.
    #[test]
    fn every_sdk_file_is_embedded() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
        for (lang, dir, prefix) in [
            (Lang::Rust, "sdk/src", "sdk/src/"),
            (
                Lang::Python,
                "python/sdk/wasmwatch_plugin",
                "sdk/wasmwatch_plugin/",
            ),
            (Lang::Js, "js/sdk", "sdk/"),
        ] {
            let embedded: Vec<String> = project(lang, "x")
                .into_iter()
                .map(|(p, _, _)| p)
                .filter(|p| p.starts_with(prefix) && !p.ends_with("Cargo.toml"))
                .collect();
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if name == "__pycache__" {
                    continue;
                }
                let path = format!("{prefix}{name}");
                assert!(
                    embedded.contains(&path),
                    "{path} is not embedded ({lang:?})"
                );
            }
        }
    }

    #[test]
    fn the_pinned_toolchain_versions_are_the_repository_ones() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let package = std::fs::read_to_string(root.join("plugins/js/package.json")).unwrap();
        assert!(
            package.contains(&format!(
                "\"@bytecodealliance/componentize-js\": \"{COMPONENTIZE_JS}\""
            )),
            "{package}"
        );
        assert!(
            package.contains(&format!(
                "\"@bytecodealliance/preview2-shim\": \"{PREVIEW2_SHIM}\""
            )),
            "{package}"
        );
        let prepare = std::fs::read_to_string(root.join("tests/prepare")).unwrap();
        assert!(
            prepare.contains(&format!("COMPONENTIZE_PY_VERSION={COMPONENTIZE_PY}")),
            "tests/prepare"
        );
    }

    #[test]
    fn names_must_be_manifest_names() {
        for good in ["a", "my-plugin", "p2"] {
            check_name(good).unwrap();
        }
        for bad in ["", "My", "-a", "a-", "a_b", "2a", "a.b"] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains("not a valid plugin name"), "{err}");
        }
    }

    #[test]
    fn placeholders_are_all_filled() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for (path, text, _) in project(lang, "hello-there") {
                if path.starts_with("sdk/") {
                    continue;
                }
                assert!(
                    !text.contains("{{"),
                    "{path} ({lang:?}) keeps a placeholder"
                );
            }
        }
    }
}
