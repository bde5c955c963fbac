//! `wasmwatch run --dry-run`: the event flow without executors. Watch loops
//! (no checkpoints: each starts from a baseline list) feed every change to the
//! plugins whose `events` filter selects it; each decision is printed as one
//! JSON line on stdout. Nothing is executed: the executors and the delivery
//! pipeline are the next step (issue 5), leader election and checkpoints
//! are wired in with them (issue 4).
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::mpsc;
use wasmwatch_core::{Manifest, StaticLookups};
use wasmwatch_kube::watchloop::{Output, WatchLoop, WatchTarget};
use wasmwatch_runtime::{Plugin, Runtime, RuntimeConfig};

/// Loads the manifest and its plugins, then watches until `shutdown`.
pub async fn run(
    manifest_path: &Path,
    cache_dir: Option<std::path::PathBuf>,
    registry: &wasmwatch_oci::RegistryOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut manifest = Manifest::from_file(manifest_path)?;
    crate::oci::resolve_modules(&mut manifest, cache_dir.as_deref(), registry, None).await?;
    let runtime = Runtime::new(
        RuntimeConfig {
            cache_dir,
            ..Default::default()
        },
        Arc::new(StaticLookups::default()),
    )
    .map_err(|e| anyhow::anyhow!("cannot start the plugin runtime: {e:#}"))?;
    let mut plugins: Vec<Arc<Plugin>> = Vec::new();
    for entry in &manifest.plugins {
        plugins.push(Arc::new(runtime.load(entry, &manifest.base_dir).await?));
    }
    let client = kube::Client::try_default()
        .await
        .context("cannot configure the Kubernetes client")?;

    let (tx, mut rx) = mpsc::channel::<Output>(1024);
    let mut loops = Vec::new();
    for kind in &manifest.watch.kinds {
        for scope in manifest.watch.scopes() {
            let target = WatchTarget {
                kind: *kind,
                scope,
                label_selector: manifest
                    .watch
                    .label_selector
                    .as_ref()
                    .map(|s| s.as_str().to_string()),
                metadata_changes: manifest.watch.metadata_changes,
            };
            loops.push(tokio::spawn(
                WatchLoop::new(client.clone(), target, None).run(tx.clone()),
            ));
        }
    }
    drop(tx);
    println!(
        "{}",
        serde_json::json!({"ready": true, "plugins": plugins.len(), "watches": loops.len()})
    );
    tokio::pin!(shutdown);
    loop {
        let output = tokio::select! {
            o = rx.recv() => o,
            _ = &mut shutdown => break,
        };
        let Some(Output::Change {
            event,
            resource_version,
        }) = output
        else {
            if output.is_none() {
                break;
            }
            continue;
        };
        for plugin in plugins.iter().filter(|p| p.filter().matches(&event)) {
            let line = match plugin.handle(&event).await {
                Ok(decision) => serde_json::json!({
                    "object": format!("{}/{}", event.object.namespace, event.object.name),
                    "kind": event.object.kind.as_str(),
                    "change": event.change,
                    "resourceVersion": resource_version,
                    "decision": decision,
                }),
                Err(e) => serde_json::json!({
                    "object": format!("{}/{}", event.object.namespace, event.object.name),
                    "plugin": plugin.name(),
                    "error": e.to_string(),
                }),
            };
            println!("{line}");
        }
    }
    for l in loops {
        l.abort();
    }
    Ok(())
}
