//! [`NamespaceWatch`]: which namespaces' objects are delivered
//! (`watch.ignoreNamespaces`, `watch.namespaceSelector`), kept up to date by
//! a watch of Namespaces. The rules are `wasmwatch_core::scope::NamespaceScope`'s;
//! this is their shell.
//!
//! With a selector, one `kube::runtime::watcher` on Namespaces with that
//! label selector (the API server sends `ADDED` when a namespace gains the
//! labels and `DELETED` when it loses them), with the watcher's default
//! backoff, feeds the scope behind a `RwLock`; [`NamespaceWatch::admits`]
//! only takes the read lock. Without one, nothing is watched and the
//! ignored names are all there is. Needs RBAC list and watch on
//! `namespaces` (cluster-scoped) only with a selector.
use std::pin::pin;
use std::sync::{Arc, PoisonError, RwLock};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;
use wasmwatch_core::scope::{NamespaceEvent, NamespaceScope, ScopeChange};

/// The namespace scope, and the watch that keeps it (stopped on drop).
pub struct NamespaceWatch {
    scope: Arc<RwLock<NamespaceScope>>,
    synced: watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NamespaceWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceWatch")
            .field("scope", &*self.read())
            .finish_non_exhaustive()
    }
}

impl NamespaceWatch {
    /// Holds `scope`, and when it has a selector starts watching Namespaces
    /// with it. Must be called inside a tokio runtime.
    pub fn start(client: Client, scope: NamespaceScope) -> Arc<NamespaceWatch> {
        let (synced_tx, synced) = watch::channel(scope.is_synced());
        let selector = scope.selector().map(|s| s.as_str().to_string());
        let scope = Arc::new(RwLock::new(scope));
        let task = selector.map(|selector| {
            let span = tracing::info_span!("namespace-watch", selector = %selector);
            tokio::spawn(run(Api::all(client), selector, scope.clone(), synced_tx).instrument(span))
        });
        Arc::new(NamespaceWatch {
            scope,
            synced,
            task,
        })
    }

    /// Whether objects of `namespace` are delivered.
    pub fn admits(&self, namespace: &str) -> bool {
        self.read().admits(namespace)
    }

    /// Resolves once the first list of Namespaces is in (at once without a
    /// selector).
    pub async fn ready(&self) {
        let mut synced = self.synced.clone();
        // Err only once the task is gone, which happens only after drop.
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Whether the first list of Namespaces is in.
    pub fn is_ready(&self) -> bool {
        *self.synced.borrow()
    }

    /// The namespaces the selector matches now.
    pub fn selected(&self) -> Vec<String> {
        self.read().selected().map(str::to_string).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, NamespaceScope> {
        self.scope.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for NamespaceWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Applies the watch's events to `scope`, forever (errors are logged and
/// retried with the watcher's default backoff).
async fn run(
    api: Api<Namespace>,
    selector: String,
    scope: Arc<RwLock<NamespaceScope>>,
    synced: watch::Sender<bool>,
) {
    let config = watcher::Config::default().labels(&selector);
    let mut stream = pin!(watcher::watcher(api, config).default_backoff());
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(
                    %error,
                    "cannot watch namespaces (watch.namespaceSelector needs list and watch on namespaces); retrying with backoff"
                );
                continue;
            }
        };
        let (changes, is_synced) = {
            let mut scope = scope.write().unwrap_or_else(PoisonError::into_inner);
            let changes = apply(&mut scope, &event);
            (changes, scope.is_synced())
        };
        for change in changes {
            match change {
                ScopeChange::Entered(ns) => {
                    tracing::info!(namespace = %ns, "namespace in scope: its objects' changes are delivered from now on")
                }
                ScopeChange::Left(ns) => {
                    tracing::info!(namespace = %ns, "namespace out of scope: its objects' changes are no longer delivered")
                }
            }
        }
        if is_synced {
            synced.send_if_modified(|s| !std::mem::replace(s, true));
        }
    }
}

fn apply(scope: &mut NamespaceScope, event: &Event<Namespace>) -> Vec<ScopeChange> {
    let empty = Default::default();
    let name = |ns: &Namespace| ns.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => scope.handle(NamespaceEvent::ListStart),
        Event::InitApply(ns) => scope.handle(NamespaceEvent::Listed {
            name: &name(ns),
            labels: ns.metadata.labels.as_ref().unwrap_or(&empty),
        }),
        Event::InitDone => scope.handle(NamespaceEvent::ListDone),
        Event::Apply(ns) => scope.handle(NamespaceEvent::Applied {
            name: &name(ns),
            labels: ns.metadata.labels.as_ref().unwrap_or(&empty),
        }),
        Event::Delete(ns) => scope.handle(NamespaceEvent::Deleted { name: &name(ns) }),
    }
}
