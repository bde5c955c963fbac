//! The namespace scope (`watch.ignoreNamespaces`, `watch.namespaceSelector`)
//! against the test API server: namespaces come into scope as they gain the
//! selector's labels and leave it as they lose them or are deleted, with no
//! restart; a watch that ends with its history gone relists and converges.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_core::scope::NamespaceScope;
use wasmwatch_kube::namespaces::NamespaceWatch;

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create(client: &Client, name: &str, labels: serde_json::Value) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn label(client: &Client, name: &str, labels: serde_json::Value) {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": labels}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn scope(ignored: &[&str], selector: &str) -> NamespaceScope {
    let ignored: Vec<String> = ignored.iter().map(|s| s.to_string()).collect();
    NamespaceScope::new(&ignored, Some(selector.parse().unwrap()))
}

#[tokio::test]
async fn namespaces_come_into_scope_and_leave_it_as_their_labels_change() {
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    create(&client, "shop", json!({"reloader": "enabled"})).await;
    create(&client, "billing", json!({})).await;
    create(&client, "kube-ops", json!({"reloader": "enabled"})).await;
    // Reloader's legacy form of `reloader=enabled`.
    let watch = NamespaceWatch::start(client.clone(), scope(&["kube-ops"], "reloader:enabled"));
    tokio::time::timeout(Duration::from_secs(10), watch.ready())
        .await
        .expect("the first list within 10 s");
    assert!(watch.is_ready());
    assert!(watch.admits("shop"));
    assert!(!watch.admits("billing"));
    assert!(!watch.admits("kube-ops"), "ignored, even when it matches");
    assert!(!watch.admits("default"));

    label(&client, "billing", json!({"reloader": "enabled"})).await;
    eventually("billing in scope", || watch.admits("billing")).await;
    label(&client, "shop", json!({"reloader": null})).await;
    eventually("shop out of scope", || !watch.admits("shop")).await;
    label(&client, "shop", json!({"reloader": "enabled"})).await;
    eventually("shop back in scope", || watch.admits("shop")).await;
    label(&client, "shop", json!({"reloader": "disabled"})).await;
    eventually("shop out again", || !watch.admits("shop")).await;

    // A new labelled namespace.
    create(&client, "late", json!({"reloader": "enabled"})).await;
    eventually("late in scope", || watch.admits("late")).await;

    // The watch ends and its history is gone: the next watch relists and
    // the scope converges on what is labelled now.
    server.faults().close_watches();
    label(&client, "billing", json!({"reloader": null})).await;
    create(&client, "newer", json!({"reloader": "enabled"})).await;
    server.faults().compact_history();
    eventually("the scope after the relist", || {
        !watch.admits("billing") && watch.admits("newer") && watch.admits("late")
    })
    .await;
    let mut selected = watch.selected();
    selected.sort();
    assert_eq!(selected, ["kube-ops", "late", "newer"]);
    drop(server);
}

#[tokio::test]
async fn without_a_selector_nothing_is_watched_and_only_the_ignored_are_out() {
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    let watch = NamespaceWatch::start(
        client.clone(),
        NamespaceScope::new(&["kube-system".into()], None),
    );
    assert!(watch.is_ready());
    watch.ready().await;
    assert!(watch.admits("anything"));
    assert!(!watch.admits("kube-system"));
    assert_eq!(server.open_watches(), 0);
    drop(server);
}
