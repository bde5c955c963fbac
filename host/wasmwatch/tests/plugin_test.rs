//! `wasmwatch plugin test`: golden files. The bundled plugins' cases
//! (plugins/<plugin>/tests) are the behaviour every twin in another
//! language must match: [`golden`] runs them against any built component.
use std::path::{Path, PathBuf};
use std::process::Output;

use wasmwatch_testkit::{pin, repo_root};

/// With the shared artifact cache: the Python and JavaScript twins are
/// compiled once, not by every test at once (see cli.rs).
fn wasmwatch(args: &[&str]) -> Output {
    wasmwatch_testkit::wasmwatch_command(Path::new(env!("CARGO_BIN_EXE_wasmwatch")))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run wasmwatch")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A manifest with the plugin `name` built as `component` (a testkit
/// component name: `http-refresh`, `python/http-refresh`, `js/...`), with
/// the bundled plugin's config and grants, so that the verdicts in the
/// golden files hold for every twin.
fn manifest(dir: &Path, name: &str, component: &str) -> PathBuf {
    let rest = match name {
        "http-refresh" => "    config: {strategy: refresh}\n    capabilities: {refresh: [shop]}\n",
        "rollout-restart" => {
            "    config: {reloadOnCreate: false, reloadOnDelete: false}\n    capabilities: {restart: [shop]}\n"
        }
        other => panic!("no golden cases for {other}"),
    };
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: {name}\n    module: {{module:{component}}}\n    sha256: {{sha256:{component}}}\n    limits: {{memory: 256Mi, timeout: 5s}}\n{rest}"
    );
    let path = dir.join("wasmwatch.yaml");
    std::fs::write(&path, pin(&yaml)).unwrap();
    path
}

/// Runs the golden cases of the bundled plugin `name` against `component`
/// and asserts that every case passes.
pub fn golden(name: &str, component: &str) {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(dir.path(), name, component);
    let cases = repo_root().join("plugins").join(name).join("tests");
    let out = wasmwatch(&[
        "plugin",
        "test",
        "--manifest",
        m.to_str().unwrap(),
        "--plugin",
        name,
        cases.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{component}: {stdout}\n{}",
        text(&out.stderr)
    );
    let count = std::fs::read_dir(&cases)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".event.yaml")
        })
        .count();
    assert!(count >= 5, "{count} cases in {}", cases.display());
    assert!(
        stdout.contains(&format!("{count} case(s): {count} passed, 0 failed")),
        "{component}: {stdout}"
    );
}

#[test]
fn the_bundled_rust_plugins_match_their_golden_files() {
    golden("http-refresh", "http-refresh");
    golden("rollout-restart", "rollout-restart");
}

#[test]
fn the_python_http_refresh_matches_the_rust_golden_files() {
    golden("http-refresh", "python/http-refresh");
}

#[test]
fn the_js_rollout_restart_matches_the_rust_golden_files() {
    golden("rollout-restart", "js/rollout-restart");
}

/// Copies the http-refresh cases to a temporary folder (to change them).
/// `plugin test` of http-refresh (manifest `m`) over the cases in `dir`.
fn test_http_refresh(m: &Path, dir: &Path) -> Output {
    wasmwatch(&[
        "plugin",
        "test",
        "--manifest",
        m.to_str().unwrap(),
        "--plugin",
        "http-refresh",
        dir.to_str().unwrap(),
    ])
}

fn copied_cases() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let from = repo_root().join("plugins/http-refresh/tests");
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

#[test]
fn a_changed_decision_fails_with_a_diff_and_update_records_it() {
    let cases = copied_cases();
    let m = manifest(cases.path(), "http-refresh", "http-refresh");
    let golden = cases.path().join("labels.expected.json");
    let original = std::fs::read_to_string(&golden).unwrap();
    std::fs::write(&golden, original.replace("/manage/refresh", "/old/refresh")).unwrap();
    std::fs::remove_file(cases.path().join("by-name.expected.json")).unwrap();
    let args = |update: bool| {
        let mut a = vec![
            "plugin".to_string(),
            "test".into(),
            "--manifest".into(),
            m.display().to_string(),
            "--plugin".into(),
            "http-refresh".into(),
            cases.path().display().to_string(),
        ];
        if update {
            a.push("--update".into());
        }
        a
    };
    let run = |update: bool| {
        let a = args(update);
        wasmwatch(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let out = run(false);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("ok   apps-annotation"), "{stdout}");
    assert!(
        stdout.contains("FAIL labels: the plugin's decision differs from"),
        "{stdout}"
    );
    assert!(
        stdout.contains("-        \"path\": \"/old/refresh\",")
            && stdout.contains("+        \"path\": \"/manage/refresh\","),
        "{stdout}"
    );
    assert!(
        stdout.contains("FAIL by-name: no golden file") && stdout.contains("with --update"),
        "{stdout}"
    );
    assert!(stdout.contains("6 case(s): 4 passed, 2 failed"), "{stdout}");

    let out = run(true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&golden).unwrap(), original);
    assert!(cases.path().join("by-name.expected.json").exists());
    let out = run(false);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn an_expected_error_is_a_golden_outcome_too() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: failing\n    module: {module:misbehave}\n    sha256: {sha256:misbehave}\n    config: {mode: error}\n";
    let m = dir.path().join("m.yaml");
    std::fs::write(&m, pin(yaml)).unwrap();
    let cases = dir.path().join("cases");
    std::fs::create_dir(&cases).unwrap();
    std::fs::copy(
        repo_root().join("plugins/http-refresh/tests/by-name.event.yaml"),
        cases.join("one.event.yaml"),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec![
            "plugin",
            "test",
            "--manifest",
            m.to_str().unwrap(),
            "--plugin",
            "failing",
        ];
        a.extend_from_slice(extra);
        a.push(cases.to_str().unwrap());
        wasmwatch(&a)
    };
    assert!(run(&["--update"]).status.success());
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cases.join("one.expected.json")).unwrap())
            .unwrap();
    let error = golden["error"].as_str().expect("an error golden file");
    assert!(error.contains("failing"), "{error}");
    assert!(run(&[]).status.success());
}

#[test]
fn bad_invocations_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(dir.path(), "http-refresh", "http-refresh");
    let out = test_http_refresh(&m, dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no test cases: expected files named NAME.event.yaml"),
        "{}",
        text(&out.stderr)
    );
    let out = wasmwatch(&[
        "plugin",
        "test",
        "--manifest",
        m.to_str().unwrap(),
        "--plugin",
        "nope",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        text(&out.stderr).contains("no plugin named \"nope\""),
        "{}",
        text(&out.stderr)
    );
}

/// A case the manifest's `events` filter never selects is still tested, with
/// a note saying the plugin would never get it in `run` (as `plugin run`
/// says for one event).
#[test]
fn a_case_the_filter_never_selects_is_noted() {
    let cases = copied_cases();
    let m = manifest(cases.path(), "http-refresh", "http-refresh");
    // Only Secrets reach the plugin now: every ConfigMap case is unselected.
    let yaml = std::fs::read_to_string(&m).unwrap();
    std::fs::write(
        &m,
        yaml.replace(
            "    config: {strategy: refresh}",
            "    events: {kinds: [Secret]}\n    config: {strategy: refresh}",
        ),
    )
    .unwrap();
    let out = test_http_refresh(&m, cases.path());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        stderr.contains("note: labels: plugin \"http-refresh\" would never get this event"),
        "{stderr}"
    );
}

/// A case the plugin's own prefilter rejects (http-refresh declares
/// `usedBySpringService`; `no-service` names an app without a Service) is
/// still tested, with a note that the host would not call the plugin for
/// it, as `run --dry-run` says; the cases it admits get no such note.
#[test]
fn a_case_the_plugin_s_prefilter_rejects_is_noted() {
    let cases = copied_cases();
    let m = manifest(cases.path(), "http-refresh", "http-refresh");
    let out = test_http_refresh(&m, cases.path());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", text(&out.stdout));
    assert!(
        stderr.contains(
            "note: no-service: the host would not call plugin \"http-refresh\" for this event (it fails the plugin's prefilter usedBySpringService); tested anyway"
        ),
        "{stderr}"
    );
    for admitted in ["labels", "by-name", "apps-annotation"] {
        assert!(
            !stderr.contains(&format!("note: {admitted}: the host would not call")),
            "{admitted}: {stderr}"
        );
    }
}
