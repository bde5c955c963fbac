//! `wasmwatch plugin new`: each language's project builds with its real
//! toolchain (cargo, componentize-py from PyPI, componentize-js from npm),
//! passes its own `plugin test` case and `validate`, as an author would run
//! them after `plugin new`.
use std::path::Path;
use std::process::{Command, Output};

use wasmwatch_testkit::{plugin_target_dir, tools_dir};

fn wasmwatch(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .current_dir(dir)
        .args(args)
        .env("RUST_LOG", "error")
        // `plugin test` and `validate` compile the component once.
        .env("WASMWATCH_CACHE_DIR", dir.join(".wasmwatch-cache"))
        .output()
        .expect("run wasmwatch")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn new_build_test(lang: &str, name: &str) {
    let parent = tempfile::tempdir().unwrap();
    let out = wasmwatch(parent.path(), &["plugin", "new", "--lang", lang, name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let project = parent.path().join(name);
    let manifest = std::fs::read_to_string(project.join("wasmwatch.yaml")).unwrap();
    assert!(manifest.contains(&format!("sha256: \"{}\"", "0".repeat(64))));

    let build = Command::new(project.join("build.sh"))
        .current_dir(&project)
        // Rust: share the plugins' dependency builds (wit-bindgen, serde).
        .env("CARGO_TARGET_DIR", plugin_target_dir().join("scaffold"))
        .env(
            "COMPONENTIZE_PY",
            tools_dir().join("python/bin/componentize-py"),
        )
        .output()
        .expect("run build.sh");
    assert!(
        build.status.success(),
        "{lang}: build.sh failed:\n{}\n{}",
        text(&build.stdout),
        text(&build.stderr)
    );
    assert!(project.join(format!("{name}.wasm")).is_file());
    let manifest = std::fs::read_to_string(project.join("wasmwatch.yaml")).unwrap();
    assert!(
        !manifest.contains(&"0".repeat(64)),
        "{lang}: build.sh did not pin the module:\n{manifest}"
    );

    let out = wasmwatch(
        &project,
        &[
            "plugin",
            "test",
            "--manifest",
            "wasmwatch.yaml",
            "--plugin",
            name,
            "tests",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{lang}: {stdout}{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("1 case(s): 1 passed, 0 failed"),
        "{lang}: {stdout}"
    );
    let out = wasmwatch(&project, &["validate", "wasmwatch.yaml"]);
    assert!(
        out.status.success(),
        "{lang}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(&format!("plugin {name}: ok")),
        "{lang}: {}",
        text(&out.stdout)
    );
}

#[test]
fn a_new_rust_plugin_builds_and_passes_its_test() {
    new_build_test("rust", "hello-rust");
}

#[test]
fn a_new_python_plugin_builds_and_passes_its_test() {
    new_build_test("python", "hello-python");
}

#[test]
fn a_new_js_plugin_builds_and_passes_its_test() {
    new_build_test("js", "hello-js");
}

#[test]
fn plugin_new_refuses_a_bad_name_and_an_existing_folder() {
    let parent = tempfile::tempdir().unwrap();
    let out = wasmwatch(
        parent.path(),
        &["plugin", "new", "--lang", "rust", "My_Plugin"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("\"My_Plugin\" is not a valid plugin name"),
        "{}",
        text(&out.stderr)
    );
    std::fs::create_dir(parent.path().join("taken")).unwrap();
    std::fs::write(parent.path().join("taken/keep.txt"), "mine").unwrap();
    let out = wasmwatch(parent.path(), &["plugin", "new", "--lang", "js", "taken"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("already exists and is not empty"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(parent.path().join("taken/keep.txt")).unwrap(),
        "mine"
    );
}
