//! Helpers shared by wasmwatch's tests.
//!
//! [`plugin`] gives the path of a plugin component built from `plugins/`,
//! building the plugins workspace (for wasm32-wasip2, release) once per test
//! process; cargo makes that a no-op when nothing changed. [`pin`] fills
//! `{module:NAME}` and `{sha256:NAME}` placeholders in a manifest template.
//! [`brokers`] starts RabbitMQ and nats-server on loopback (and makes test
//! certificates), [`nats_jwt`] writes NATS operator-mode JWTs and creds
//! files, [`registry`] an OCI registry.
#![forbid(unsafe_code)]

pub mod brokers;
pub mod nats_jwt;
pub mod registry;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// The repository's root: the nearest folder holding `wit/plugin.wit`, up
/// from the running test's package (cargo sets `CARGO_MANIFEST_DIR` when it
/// runs tests), else up from this crate's folder as compiled, else up from
/// the working folder (a benchmark run by hand). Not the compiled-in path
/// alone: a target folder shared between clones can keep a build of this
/// crate from another clone.
pub fn repo_root() -> PathBuf {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
        std::env::current_dir().ok(),
    ];
    starts
        .into_iter()
        .flatten()
        .flat_map(|start| start.ancestors().map(Path::to_path_buf).collect::<Vec<_>>())
        .find(|dir| dir.join("wit/plugin.wit").is_file())
        .and_then(|dir| dir.canonicalize().ok())
        .expect("the repository root (a folder with wit/plugin.wit) above the test's package")
}

/// Where plugin builds go: `$WASMWATCH_PLUGIN_TARGET_DIR`, else
/// `$CARGO_TARGET_DIR/plugins`, else `target/plugins`.
pub fn plugin_target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WASMWATCH_PLUGIN_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("plugins")
}

/// The compiled-artifact cache the tests share (`WASMWATCH_CACHE_DIR`):
/// artifacts are named by module digest and engine, so a module compiles
/// once, not once per test or replica start (a JavaScript component takes
/// tens of seconds in a debug build, a Python one ~10 s of all cores).
pub fn artifact_cache_dir() -> PathBuf {
    plugin_target_dir().join("artifact-cache")
}

/// The plugins built by another language's toolchain, slow to compile.
const TWINS: &[&str] = &["python/http-refresh", "js/rollout-restart"];

/// Compiles the Python and JavaScript twins into [`artifact_cache_dir`]
/// with the `wasmwatch` binary at `bin`, once per test process, before its
/// tests run the binary in parallel: a freshly built component is new to
/// the cache, and tests that each compiled the same 19 MB Python module at
/// once (~10 s of all cores each) starved one another's 100 ms config
/// checks (a CI failure). Panics with the binary's output if the compile
/// fails.
pub fn warm_artifact_cache(bin: &Path) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut manifest = String::from("apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n");
        for (i, c) in TWINS.iter().enumerate() {
            manifest.push_str(&format!(
                "  - name: warm-{i}\n    module: {{module:{c}}}\n    sha256: {{sha256:{c}}}\n    limits: {{timeout: 30s}}\n"
            ));
        }
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("warm.yaml");
        std::fs::write(&path, pin(&manifest)).expect("write the manifest");
        let out = Command::new(bin)
            .arg("validate")
            .arg(&path)
            .env("WASMWATCH_CACHE_DIR", artifact_cache_dir())
            .env("RUST_LOG", "error")
            .output()
            .expect("run wasmwatch validate");
        assert!(
            out.status.success(),
            "compiling {TWINS:?} into the artifact cache: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// The `wasmwatch` binary at `bin` as the CLI tests run it: with the shared
/// artifact cache, warmed first ([`warm_artifact_cache`]).
pub fn wasmwatch_command(bin: &Path) -> Command {
    warm_artifact_cache(bin);
    let mut cmd = Command::new(bin);
    cmd.env("WASMWATCH_CACHE_DIR", artifact_cache_dir());
    cmd
}

/// Builds plugins/ (a no-op when nothing changed). Caveat for a target
/// folder shared by two clones: cargo remembers `wit/plugin.wit` (outside
/// the plugins workspace) by the absolute path of the clone that built last,
/// so a WIT change in the other clone alone does not rebuild the plugins
/// that read it with `wit_bindgen::generate!`; touch their sources. A fresh
/// clone (CI) always rebuilds: its files are newer than the build.
fn build_plugins() -> PathBuf {
    let target = plugin_target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(repo_root().join("plugins"))
        .args(["build", "--release", "--quiet", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run cargo to build the plugins");
    assert!(
        status.success(),
        "building plugins/ for wasm32-wasip2 failed; is the target installed? (rustup target add wasm32-wasip2)"
    );
    target.join("wasm32-wasip2/release")
}

/// The built component `plugins/.../<crate>` as `<crate with _>.wasm`.
pub fn plugin(crate_name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let path = DIR
        .get_or_init(build_plugins)
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    assert!(path.exists(), "no plugin component at {}", path.display());
    path
}

/// Hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).expect("read file")))
}

/// A built component by name: `python/NAME` and `js/NAME` are built from
/// plugins/python and plugins/js, anything else is a crate of plugins/.
pub fn component(name: &str) -> PathBuf {
    if let Some(n) = name.strip_prefix("python/") {
        python_plugin(n)
    } else if let Some(n) = name.strip_prefix("js/") {
        js_plugin(n)
    } else {
        plugin(name)
    }
}

/// Replaces `{module:NAME}` with the built component's path and
/// `{sha256:NAME}` with its digest ([`component`] names).
pub fn pin(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let end = after.find('}').map(|e| e + 1);
        let token = end.map(|e| &after[1..e - 1]);
        match token.and_then(|t| t.split_once(':')) {
            Some(("module", name)) => out.push_str(&component(name).display().to_string()),
            Some(("sha256", name)) => out.push_str(&sha256_file(&component(name))),
            _ => {
                out.push('{');
                rest = &after[1..];
                continue;
            }
        }
        rest = &after[end.unwrap()..];
    }
    out.push_str(rest);
    out
}

/// Where the plugin toolchains of Python and JavaScript are installed
/// (tests/prepare): `$WASMWATCH_TOOLS`, else `/var/tmp/wasmwatch-tools`.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("WASMWATCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/wasmwatch-tools"))
}

/// Builds `plugins/<lang>/<name>` with `plugins/<lang>/build NAME OUT` into
/// the plugin target folder, once per test process and name. The build
/// scripts skip the work when the output is newer than every source.
fn build_with_script(lang: &str, name: &str) -> PathBuf {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{lang}/{name}");
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let out = plugin_target_dir()
        .join(lang)
        .join(format!("{}.wasm", name.replace(['-', '/'], "_")));
    std::fs::create_dir_all(out.parent().unwrap()).expect("create the plugin target folder");
    let script = repo_root().join("plugins").join(lang).join("build");
    let status = Command::new(&script)
        .arg(name)
        .arg(&out)
        .env("WASMWATCH_TOOLS", tools_dir())
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        status.success(),
        "building the {lang} plugin {name} failed; has tests/prepare installed the toolchain?"
    );
    assert!(
        out.exists(),
        "no component at {} after the build",
        out.display()
    );
    built.insert(key, out.clone());
    out
}

/// The component built from `plugins/python/<name>` (componentize-py).
pub fn python_plugin(name: &str) -> PathBuf {
    build_with_script("python", name)
}

/// The component built from `plugins/js/<name>` (componentize-js / jco).
pub fn js_plugin(name: &str) -> PathBuf {
    build_with_script("js", name)
}
