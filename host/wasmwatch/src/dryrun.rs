//! `wasmwatch run --dry-run`: what `run` would do, without doing it.
//!
//! The plugins answer their lookups from the same live caches as `run`
//! ([`KubeLookups`]: workloads, Services, EndpointSlices of the watched
//! namespaces), so they decide as the leader would. Watch loops (no
//! checkpoints: each starts from a baseline list, as `run` with HA off)
//! feed every change to the plugins whose `events` filter selects it; each
//! decision is printed as one JSON line on stdout, every action with its
//! verdict and what `run` would execute for it (`execute`; for a Service
//! refresh the URLs of the ready pods it would call, for a restart whether
//! the pod template would be patched). Nothing is executed: no executor,
//! no pipeline (so no debounce or coalescing either), no elector, no
//! checkpoint, no Event.
//!
//! The ready line is printed once the lookups' caches are filled and every
//! watch has taken its baseline: every change after it is shown.
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use wasmwatch_core::digest::reloader_hash;
use wasmwatch_core::{Action, Lookups, Manifest, ObjectKind};
use wasmwatch_exec::http::refresh_targets;
use wasmwatch_exec::workload::{
    LAST_RELOADED_FROM_ANNOTATION, hash_annotation_key, records_content, reloaded_from,
    reloader_hash_for, unkeyed_content_hash,
};
use wasmwatch_kube::lookups::KubeLookups;
use wasmwatch_kube::watchloop::{Output, WatchLoop, WatchTarget};
use wasmwatch_runtime::{Decision, Plugin, Runtime};

/// Loads the manifest and its plugins, then watches until `shutdown`.
pub async fn run(
    manifest_path: &Path,
    plugin_dirs: &[crate::plugin_dir::PluginDirMap],
    namespace: &str,
    cache_dir: Option<std::path::PathBuf>,
    registry: &wasmwatch_oci::RegistryOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut manifest = Manifest::from_file(manifest_path)?;
    crate::plugin_dir::apply_noting(&mut manifest, plugin_dirs);
    crate::oci::resolve_modules(&mut manifest, cache_dir.as_deref(), registry, None).await?;
    let client = kube::Client::try_default()
        .await
        .context("cannot configure the Kubernetes client")?;
    // The caches `run` builds, for the same namespaces.
    let lookups = KubeLookups::start_with(
        client.clone(),
        crate::run::watched_namespaces(&manifest),
        manifest.watch.field_selector(),
    );
    // The namespaces whose changes `run` delivers.
    let in_scope = wasmwatch_kube::namespaces::NamespaceWatch::start(
        client.clone(),
        wasmwatch_core::scope::NamespaceScope::of(&manifest.watch),
    );
    let runtime = Runtime::new(
        crate::run::runtime_config(cache_dir, manifest.plugins.len()),
        lookups.clone() as Arc<dyn Lookups>,
    )
    .map_err(|e| anyhow::anyhow!("cannot start the plugin runtime: {e:#}"))?;
    let mut plugins: Vec<Arc<Plugin>> = Vec::new();
    for entry in &manifest.plugins {
        plugins.push(Arc::new(runtime.load(entry, &manifest.base_dir).await?));
    }
    // The key `run` hashes Secrets with, so that restarts show the content
    // hash `run` would write; read only (the dry run creates nothing).
    let digest_key = if manifest.watch.watches(ObjectKind::Secret) {
        let ns = manifest.ha.namespace.as_deref().unwrap_or(namespace);
        let name = &manifest.watch.digest_key_secret;
        match wasmwatch_kube::digest_key::load(client.clone(), ns, name, false).await {
            Ok(Some(key)) => Some(key),
            Ok(None) => {
                eprintln!(
                    "note: no digest key Secret {ns}/{name} yet (`run` creates it): Secret \
                     digests below are plain SHA-256, not the keyed ones `run` writes"
                );
                None
            }
            Err(e) => anyhow::bail!("{e}"),
        }
    } else {
        None
    };
    tokio::pin!(shutdown);
    tokio::select! {
        _ = async { tokio::join!(lookups.ready(), in_scope.ready()) } => {}
        _ = &mut shutdown => return Ok(()),
    }

    // One loop per stream, its outputs tagged with the stream's number.
    let (tx, mut rx) = mpsc::channel::<(usize, Output)>(1024);
    let mut loops = Vec::new();
    for kind in &manifest.watch.object_kinds() {
        let custom = manifest.watch.custom(*kind).map(Arc::new);
        for scope in manifest.watch.scopes() {
            let target = WatchTarget {
                kind: *kind,
                scope,
                label_selector: manifest
                    .watch
                    .label_selector
                    .as_ref()
                    .map(|s| s.as_str().to_string()),
                field_selector: manifest.watch.field_selector(),
                metadata_changes: manifest.watch.metadata_changes,
                digest_key: match kind {
                    ObjectKind::Secret => digest_key.clone(),
                    _ => None,
                },
                // A dry run stores no index.
                remember: Default::default(),
                custom: custom.clone(),
            };
            let id = loops.len() / 2;
            let (loop_tx, mut loop_rx) = mpsc::channel(256);
            loops.push(tokio::spawn(
                WatchLoop::new(client.clone(), target, None).run(loop_tx),
            ));
            let tx = tx.clone();
            loops.push(tokio::spawn(async move {
                while let Some(o) = loop_rx.recv().await {
                    if tx.send((id, o)).await.is_err() {
                        return;
                    }
                }
            }));
        }
    }
    drop(tx);
    let watches = loops.len() / 2;
    // Each loop's first output is its baseline's version: from then on it
    // misses no change.
    let mut baselined = vec![false; watches];
    let mut early = Vec::new();
    while baselined.iter().any(|b| !b) {
        let output = tokio::select! {
            o = rx.recv() => o,
            _ = &mut shutdown => None,
        };
        let Some((id, output)) = output else {
            abort(&loops);
            return Ok(());
        };
        baselined[id] = true;
        early.push(output);
    }
    println!(
        "{}",
        json!({"ready": true, "plugins": plugins.len(), "watches": watches})
    );
    for output in early {
        show(&plugins, &lookups, &in_scope, output).await;
    }
    loop {
        let output = tokio::select! {
            o = rx.recv() => o,
            _ = &mut shutdown => break,
        };
        let Some((_, output)) = output else { break };
        show(&plugins, &lookups, &in_scope, output).await;
    }
    abort(&loops);
    Ok(())
}

fn abort(tasks: &[tokio::task::JoinHandle<()>]) {
    for t in tasks {
        t.abort();
    }
}

/// Prints what each selecting plugin decides about a change (none when
/// its namespace is out of scope).
async fn show(
    plugins: &[Arc<Plugin>],
    lookups: &KubeLookups,
    in_scope: &wasmwatch_kube::namespaces::NamespaceWatch,
    output: Output,
) {
    let Output::Change {
        event,
        resource_version,
    } = output
    else {
        return;
    };
    if !in_scope.admits(&event.object.namespace) {
        return;
    }
    let object = format!("{}/{}", event.object.namespace, event.object.name);
    let unkeyed = event
        .unkeyed_digest
        .as_ref()
        .map(|plain| (event.digest.clone(), plain.clone()));
    let reloader = (
        event.digest.clone(),
        reloader_hash(event.object.kind, &event.object.data),
    );
    let records = Records {
        unkeyed: unkeyed.as_ref(),
        reloader: &reloader,
    };
    for plugin in plugins.iter().filter(|p| p.filter().matches(&event)) {
        // What `run` does: a change failing a prefilter the plugin
        // declares costs no call.
        if let Some(condition) = plugin.skips(&event) {
            let line = json!({
                "object": object,
                "kind": event.object.kind.as_str(),
                "change": event.change,
                "resourceVersion": resource_version,
                "plugin": plugin.name(),
                "skipped": format!("fails the plugin's prefilter {condition}: not called"),
            });
            println!("{line}");
            continue;
        }
        let line = match plugin.handle(&event).await {
            Ok(decision) => json!({
                "object": object,
                "kind": event.object.kind.as_str(),
                "change": event.change,
                "resourceVersion": resource_version,
                "decision": with_execution(&decision, lookups, &records),
            }),
            Err(e) => json!({
                "object": object,
                "plugin": plugin.name(),
                "error": e.to_string(),
            }),
        };
        println!("{line}");
    }
}

/// What else records the event's content on a workload: (digest, plain
/// digest) when the digest is keyed, and (digest, Reloader's hash).
struct Records<'a> {
    unkeyed: Option<&'a (String, String)>,
    reloader: &'a (String, String),
}

/// The decision as JSON, each action with what `run` would execute for it.
fn with_execution(decision: &Decision, lookups: &KubeLookups, records: &Records<'_>) -> Value {
    let mut value = serde_json::to_value(decision).expect("a decision serialises");
    if let Some(actions) = value.get_mut("actions").and_then(Value::as_array_mut) {
        for (checked, entry) in decision.actions.iter().zip(actions) {
            let allowed = checked.verdict.is_allowed();
            entry["execute"] = json!(allowed);
            if allowed {
                execution(&checked.action, lookups, records, entry);
            }
        }
    }
    value
}

/// What the executors would do with an allowed action, from the caches
/// as they are now (at execution time they may have moved on).
fn execution(action: &Action, lookups: &KubeLookups, records: &Records<'_>, entry: &mut Value) {
    match action {
        Action::RefreshService {
            namespace,
            service,
            method,
            port,
            path,
            tls,
        } => match refresh_targets(lookups, namespace, service, *port, path, *tls) {
            Ok(targets) => {
                let method = format!("{method:?}").to_uppercase();
                let (calls, problems): (Vec<_>, Vec<_>) =
                    targets.into_iter().partition(|t| t.url.is_ok());
                entry["calls"] = calls
                    .into_iter()
                    .filter_map(|t| t.url.ok())
                    .map(|url| format!("{method} {url}"))
                    .collect();
                if !problems.is_empty() {
                    entry["problems"] = problems
                        .into_iter()
                        .filter_map(|t| t.url.err().map(|e| format!("{}: {e}", t.label)))
                        .collect();
                }
            }
            Err(e) => entry["problems"] = json!([e.to_string()]),
        },
        Action::Restart {
            workload,
            content_hash,
            ..
        } => match lookups.workload(workload) {
            // `run` reads the workload again before patching; the cache
            // says what it will most likely find.
            Some(info) => {
                let recorded = info
                    .template_annotations
                    .get(&hash_annotation_key(content_hash))
                    .map(String::as_str);
                let unkeyed = unkeyed_content_hash(content_hash, records.unkeyed);
                // Reloader's env-vars record is not cached; its
                // annotations record is.
                // Only without a record of ours (the newest decides).
                let by_reloader = recorded.is_none()
                    && reloader_hash_for(content_hash, Some(records.reloader)).is_some_and(
                        |hash| {
                            let record = info
                                .template_annotations
                                .get(LAST_RELOADED_FROM_ANNOTATION)
                                .map(String::as_str);
                            reloaded_from(record, content_hash, &workload.namespace, hash)
                        },
                    );
                entry["patch"] = json!(
                    !records_content(recorded, content_hash, unkeyed.as_deref()) && !by_reloader
                );
            }
            None => {
                entry["patch"] = json!(false);
                entry["problems"] = json!([format!(
                    "{:?} {}/{} is not in the cache: the restart would fail",
                    workload.kind, workload.namespace, workload.name
                )]);
            }
        },
        Action::Http { .. } | Action::Publish { .. } | Action::Event { .. } => {}
    }
}
