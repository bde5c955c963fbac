//! `wasmwatch plugin test`: runs one plugin over fixture events and compares
//! what it decides with golden files, for a plugin's own CI (like `kwctl
//! run` or `spin test`).
//!
//! A case is an event file `NAME.event.yaml` (the format of `plugin run
//! --event`: a ConfigMap or Secret, or the `{change, previous, replay,
//! object}` envelope). Beside it:
//! - `NAME.expected.json`: the golden decision, `{"actions": [...]}` with
//!   each action and the host's verdict exactly as `plugin run` prints them,
//!   or `{"error": "..."}` when the plugin is expected to fail with that
//!   message. `--update` (re)writes these from what the plugin does.
//! - `NAME.lookups.yaml` (optional): the Services, workloads and endpoints
//!   the plugin's lookups answer from; else `lookups.yaml` in the same
//!   folder; else nothing is found.
//!
//! The plugin is loaded (and compiled) once; every case runs in a fresh
//! sandbox like every event in the service. A case the host would never
//! hand the plugin (its manifest entry's `events` filter, or the plugin's
//! own prefilter, `wasmwatch:needs` `only`) is still run, with a note.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use wasmwatch_core::lookups::{Endpoint, Lookups, ServiceInfo, StaticLookups, WorkloadInfo};
use wasmwatch_core::{ChangeType, Manifest, ObjectKind};
use wasmwatch_runtime::{Runtime, RuntimeConfig};

const EVENT_SUFFIX: &str = ".event.yaml";

/// One fixture: its event file and where its golden file and lookups are.
struct Case {
    name: String,
    event: PathBuf,
    expected: PathBuf,
    lookups: Option<PathBuf>,
}

/// What a run found, for the summary line and the exit code.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub updated: usize,
}

/// Lookups the cases switch between without reloading the plugin.
#[derive(Default)]
struct CaseLookups(RwLock<StaticLookups>);

impl Lookups for CaseLookups {
    fn workloads_referencing(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Vec<WorkloadInfo> {
        self.0
            .read()
            .unwrap()
            .workloads_referencing(kind, namespace, name)
    }
    fn service(&self, namespace: &str, name: &str) -> Option<ServiceInfo> {
        self.0.read().unwrap().service(namespace, name)
    }
    fn services_with_labels(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<ServiceInfo> {
        self.0
            .read()
            .unwrap()
            .services_with_labels(namespace, labels)
    }
    fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        self.0.read().unwrap().ready_endpoints(namespace, service)
    }
}

/// Finds the cases in `paths`: event files given directly, and every
/// `*.event.yaml` in the folders given, sorted by path.
fn find_cases(paths: &[PathBuf]) -> anyhow::Result<Vec<Case>> {
    let mut events = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .with_context(|| format!("cannot list {}", path.display()))?;
            for entry in entries {
                let p = entry?.path();
                if p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(EVENT_SUFFIX))
                {
                    events.push(p);
                }
            }
        } else if path.is_file() {
            events.push(path.clone());
        } else {
            bail!("{}: no such file or folder", path.display());
        }
    }
    events.sort();
    events.dedup();
    if events.is_empty() {
        bail!(
            "no test cases: expected files named NAME{EVENT_SUFFIX} in {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    events
        .into_iter()
        .map(|event| {
            let file = event.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let Some(name) = file.strip_suffix(EVENT_SUFFIX) else {
                bail!(
                    "{}: an event file's name must end in {EVENT_SUFFIX} (its golden file is NAME.expected.json)",
                    event.display()
                );
            };
            let dir = event.parent().unwrap_or(Path::new("."));
            let own = dir.join(format!("{name}.lookups.yaml"));
            let shared = dir.join("lookups.yaml");
            let lookups = [own, shared].into_iter().find(|p| p.is_file());
            Ok(Case {
                name: name.to_string(),
                expected: dir.join(format!("{name}.expected.json")),
                event,
                lookups,
            })
        })
        .collect()
}

fn read_lookups(path: &Path) -> anyhow::Result<StaticLookups> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read lookups file {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("invalid lookups file {}", path.display()))
}

/// The golden form of one outcome.
fn outcome(result: Result<wasmwatch_runtime::Decision, wasmwatch_runtime::PluginError>) -> Value {
    match result {
        Ok(decision) => json!({ "actions": decision.actions }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// Runs the cases and prints one line per case (and a diff for a failed
/// one) to stdout.
pub fn run(
    manifest_path: &Path,
    plugin: &str,
    paths: &[PathBuf],
    update: bool,
    cache_dir: Option<PathBuf>,
    registry: &wasmwatch_oci::RegistryOptions,
) -> anyhow::Result<Summary> {
    let mut m = Manifest::from_file(manifest_path)?;
    crate::oci::resolve_modules_blocking(&mut m, cache_dir.as_deref(), registry, Some(plugin))?;
    let entry = crate::cli::manifest_plugin(&m, manifest_path, plugin)?;
    let cases = find_cases(paths)?;
    let lookups = Arc::new(CaseLookups::default());
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir,
            ..RuntimeConfig::default()
        },
        lookups.clone(),
    )
    .map_err(|e| anyhow::anyhow!("cannot start the plugin runtime: {e:#}"))?;
    let loaded = rt.load_blocking(entry, &m.base_dir)?;
    let mut summary = Summary::default();
    for case in &cases {
        let event = crate::event_file::read(&case.event, ChangeType::Modified)?;
        *lookups.0.write().unwrap() = match &case.lookups {
            Some(p) => read_lookups(p)?,
            None => StaticLookups::default(),
        };
        if !loaded.filter().matches(&event) {
            eprintln!(
                "note: {}: plugin {plugin:?} would never get this event (its manifest entry's `events` filter does not select it); tested anyway",
                case.name
            );
        }
        // What `run` and `run --dry-run` do with the plugin's own declared
        // prefilter, judged on this case's lookups: said, and the case is
        // still tested (its golden file records what the plugin decides).
        if let Some(condition) = loaded.skips(&event) {
            eprintln!(
                "note: {}: the host would not call plugin {plugin:?} for this event (it fails the plugin's prefilter {condition}); tested anyway",
                case.name
            );
        }
        let got = outcome(loaded.handle_blocking(&event));
        let got_text = format!("{}\n", serde_json::to_string_pretty(&got)?);
        if update {
            std::fs::write(&case.expected, &got_text)
                .with_context(|| format!("cannot write {}", case.expected.display()))?;
            println!("updated {}", case.expected.display());
            summary.updated += 1;
            continue;
        }
        let expected: Value = match std::fs::read_to_string(&case.expected) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("invalid golden file {}", case.expected.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!(
                    "FAIL {}: no golden file {} (record what the plugin does now with --update)",
                    case.name,
                    case.expected.display()
                );
                summary.failed += 1;
                continue;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", case.expected.display()));
            }
        };
        if expected == got {
            println!("ok   {}", case.name);
            summary.passed += 1;
        } else {
            let expected_text = format!("{}\n", serde_json::to_string_pretty(&expected)?);
            println!(
                "FAIL {}: the plugin's decision differs from {}",
                case.name,
                case.expected.display()
            );
            print!(
                "{}",
                similar::TextDiff::from_lines(&expected_text, &got_text)
                    .unified_diff()
                    .context_radius(3)
                    .header("expected", "got")
            );
            summary.failed += 1;
        }
    }
    if update {
        println!("{} golden file(s) written", summary.updated);
    } else {
        println!(
            "{} case(s): {} passed, {} failed",
            cases.len(),
            summary.passed,
            summary.failed
        );
    }
    Ok(summary)
}
