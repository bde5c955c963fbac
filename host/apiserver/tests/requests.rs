//! The request log: what kube-rs and raw HTTP clients did, as Kubernetes
//! authorization sees it.

mod common;

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use wasmwatch_apiserver::{Config, Failure, NonResourceRequest, Request};

/// (verb, group, resource, namespace, name) of each request.
fn summary(requests: &[Request]) -> Vec<(String, String, String, String, String)> {
    requests
        .iter()
        .map(|r| {
            (
                r.verb.clone(),
                r.group.clone(),
                r.rbac_resource(),
                r.namespace.clone().unwrap_or_else(|| "-".into()),
                r.name.clone().unwrap_or_else(|| "-".into()),
            )
        })
        .collect()
}

fn row(v: &str, g: &str, r: &str, ns: &str, n: &str) -> (String, String, String, String, String) {
    (v.into(), g.into(), r.into(), ns.into(), n.into())
}

#[tokio::test]
async fn every_kube_rs_verb_is_recorded_as_kubernetes_authorizes_it() {
    let server = common::start().await;
    let mut config = server.kube_config();
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static("requests-test"),
    ));
    let client = kube::Client::try_from(config).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "a"}, "data": {"k": "1"}})).unwrap();

    cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut got = cms.get("a").await.unwrap();
    got.data = Some([("k".to_string(), "2".to_string())].into());
    cms.replace("a", &PostParams::default(), &got)
        .await
        .unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "3"}})),
    )
    .await
    .unwrap();
    cms.list(&ListParams::default().labels("x=y"))
        .await
        .unwrap();
    Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(cms.get("missing").await.is_err());
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    cms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();

    // The elector's way of watching one Lease: a field selector on its name.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let mut stream = watcher(
        leases,
        watcher::Config::default().fields("metadata.name=leader"),
    )
    .boxed();
    let watching = tokio::spawn(async move { while stream.next().await.is_some() {} });
    tokio::time::timeout(Duration::from_secs(10), server.wait_for_watches(1))
        .await
        .unwrap();
    // A watch is recorded once its stream has started, just after it counts
    // as open.
    let start = std::time::Instant::now();
    while server.requests().len() < 11 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watching.abort();

    let requests = server.requests();
    assert_eq!(
        summary(&requests),
        vec![
            row("create", "", "configmaps", "default", "-"),
            row("get", "", "configmaps", "default", "a"),
            row("update", "", "configmaps", "default", "a"),
            row("patch", "", "configmaps", "default", "a"),
            row("list", "", "configmaps", "default", "-"),
            row("list", "", "configmaps", "-", "-"),
            row("get", "", "configmaps", "default", "missing"),
            row("delete", "", "configmaps", "default", "a"),
            row("deletecollection", "", "configmaps", "default", "-"),
            row(
                "list",
                "coordination.k8s.io",
                "leases",
                "kube-node-lease",
                "leader"
            ),
            row(
                "watch",
                "coordination.k8s.io",
                "leases",
                "kube-node-lease",
                "leader"
            ),
        ]
    );
    let codes: Vec<u16> = requests.iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [201, 200, 200, 200, 200, 200, 404, 200, 200, 200, 200]
    );
    assert!(
        requests
            .iter()
            .all(|r| r.user_agent.as_deref() == Some("requests-test")),
        "{requests:?}"
    );
    assert_eq!(
        requests.iter().filter(|r| r.is_write()).count(),
        5,
        "create, update, patch, delete, deletecollection"
    );
    assert!(server.non_resource_requests().is_empty());
    assert_eq!(server.requests_dropped(), 0);

    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn discovery_is_recorded_apart_and_faults_are_not_recorded() {
    let server = common::start().await;
    let h = common::http();
    let url = server.url();
    for path in ["/api", "/apis", "/apis/apps/v1", "/version", "/openapi/v3"] {
        assert_eq!(common::get(&h, &format!("{url}{path}")).await.status, 200);
    }
    // An injected failure is still a request (answered 500).
    server.faults().fail_next(1, Failure::Internal);
    let r = common::get(&h, &format!("{url}/api/v1/namespaces/default/secrets/s")).await;
    assert_eq!(r.status, 500);
    // Out of the API: not recorded.
    common::post(&h, &format!("{url}/_faults/reset"), &json!({})).await;
    // A subresource.
    let r = common::send(
        &h,
        "PATCH",
        &format!("{url}/apis/apps/v1/namespaces/default/deployments/d/status"),
        "application/merge-patch+json",
        Some(&json!({})),
    )
    .await;
    assert_eq!(r.status, 404);

    let non: Vec<NonResourceRequest> = server.non_resource_requests();
    let paths: Vec<(&str, &str, u16)> = non
        .iter()
        .map(|n| (n.verb.as_str(), n.path.as_str(), n.code))
        .collect();
    assert_eq!(
        paths,
        [
            ("get", "/api", 200),
            ("get", "/apis", 200),
            ("get", "/apis/apps/v1", 200),
            ("get", "/version", 200),
            ("get", "/openapi/v3", 200),
        ]
    );
    assert_eq!(
        summary(&server.requests()),
        vec![
            row("get", "", "secrets", "default", "s"),
            row("patch", "apps", "deployments/status", "default", "d"),
        ]
    );
    assert_eq!(
        server.requests().iter().map(|r| r.code).collect::<Vec<_>>(),
        [500, 404]
    );
    assert!(server.requests()[0].user_agent.is_none());
}

#[tokio::test]
async fn the_log_keeps_the_newest_requests_up_to_its_capacity() {
    let server = common::start_with(Config::default().request_log(2)).await;
    let h = common::http();
    for name in ["a", "b", "c"] {
        let url = format!(
            "{}/api/v1/namespaces/default/configmaps/{name}",
            server.url()
        );
        assert_eq!(common::get(&h, &url).await.status, 404);
    }
    let names: Vec<String> = server
        .requests()
        .into_iter()
        .filter_map(|r| r.name)
        .collect();
    assert_eq!(names, ["b", "c"]);
    assert_eq!(server.requests_dropped(), 1);

    let off = common::start_with(Config::default().request_log(0)).await;
    let url = format!("{}/api/v1/namespaces/default/configmaps", off.url());
    assert_eq!(common::get(&h, &url).await.status, 200);
    assert!(off.requests().is_empty() && off.requests_dropped() == 0);
}
