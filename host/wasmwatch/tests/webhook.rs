//! Issue 20's webhook and alert modes of the bundled rollout-restart, end
//! to end: `wasmwatch run` against the test API server, a real HTTP server
//! receiving the POSTs.
//! - webhook mode (Reloader's `--webhook-url`): one POST describing the
//!   change and the workload it would restart, and no Deployment patched;
//! - alert mode (Reloader's `ALERT_ON_RELOAD`): the Deployment restarted,
//!   and one Slack-format alert about it.
mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::data_digest;

/// One request the hook received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    content_type: Option<String>,
    body: String,
}

/// A webhook receiver: records every request, answers 200.
#[derive(Clone)]
struct Hook {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Hook {
    async fn start() -> Hook {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hook = Hook {
            addr: listener.local_addr().unwrap(),
            received: Default::default(),
        };
        let h = hook.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                        let mut lines = head.lines();
                        let mut start = lines.next().unwrap_or("").split_whitespace();
                        let (method, path) = (
                            start.next().unwrap_or("").to_string(),
                            start.next().unwrap_or("").to_string(),
                        );
                        let header = |name: &str| {
                            head.lines().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                            })
                        };
                        let length: usize = header("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        while buf.len() < head_end + length {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let body =
                            String::from_utf8_lossy(&buf[head_end..head_end + length]).to_string();
                        h.received.lock().unwrap().push(Received {
                            method,
                            path,
                            content_type: header("content-type"),
                            body,
                        });
                        buf.drain(..head_end + length);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        hook
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

fn manifest(config: &str, capabilities: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: false}}
plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    config: {config}
    capabilities: {capabilities}
    delivery: {{retries: 3, backoffInitial: 100ms, backoffMax: 1s}}
"
    )
}

/// (generation, pod-template annotations) of Deployment `shop/orders`.
async fn orders(client: &kube::Client) -> (i64, BTreeMap<String, String>) {
    deployment_state(client, "shop", "orders").await
}

/// ConfigMap `shop/orders` (`v: 1`) and a Deployment `orders` using it,
/// annotated `reloader.stakater.com/auto: "true"`, and a replica watching
/// them. The replica, once its watches are open (the lookups' eight and
/// the ConfigMaps').
async fn shop(e: &TestEnv) -> Replica {
    let c = &e.client;
    workload(
        c,
        "shop",
        "Deployment",
        "orders",
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "orders"}}]}]}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders"}, "data": {"v": "1"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    replica_watching(e, 9).await
}

/// Sets `v` of ConfigMap `shop/orders`; the object as patched.
async fn change_orders(client: &kube::Client, v: &str) -> ConfigMap {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    let patch = serde_json::json!({"data": {"v": v}});
    cms.patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
}

fn digest_of(v: &str) -> String {
    let data = BTreeMap::from([("v".to_string(), DataValue::Text(v.to_string()))]);
    data_digest(&data, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mode_posts_the_change_and_patches_no_deployment() {
    let hook = Hook::start().await;
    let url = hook.url("/hooks/reload");
    let e = test_env(
        &manifest(
            &format!("{{mode: webhook, webhook: {{url: \"{url}\"}}}}"),
            &format!("{{http: [\"{}\"]}}", hook.url("/hooks/")),
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    let replica = shop(&e).await;
    let (generation, annotations) = orders(c).await;
    let cm = change_orders(c, "2").await;
    eventually(Duration::from_secs(10), "the webhook POST", || async {
        !hook.received().is_empty()
    })
    .await;
    // Anything that would follow (a restart, a second call) has its chance.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = hook.received();
    assert_eq!(received.len(), 1, "one POST per change: {received:?}");
    let r = &received[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/hooks/reload")
    );
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    let uid = cm.metadata.uid.unwrap();
    let rv = cm.metadata.resource_version.unwrap();
    assert_eq!(
        r.body,
        format!(
            r#"{{"kind":"ConfigMap","namespace":"shop","name":"orders","uid":"{uid}","resourceVersion":"{rv}","change":"modified","digest":"{}","changedKeys":["v"],"workloads":[{{"kind":"Deployment","namespace":"shop","name":"orders"}}]}}"#,
            digest_of("2")
        )
    );
    assert_eq!(
        orders(c).await,
        (generation, annotations),
        "webhook mode patched the Deployment"
    );
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_mode_restarts_and_posts_a_slack_alert_per_workload() {
    let hook = Hook::start().await;
    let url = hook.url("/services/T0/B0/x");
    let e = test_env(
        &manifest(
            &format!(
                "{{mode: alert, alert: {{url: \"{url}\", sink: slack, additionalInfo: \"cluster <eu-1>\"}}}}"
            ),
            &format!("{{restart: [shop], http: [\"{}\"]}}", hook.url("/services/")),
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    let replica = shop(&e).await;
    let (generation, _) = orders(c).await;
    change_orders(c, "2").await;
    let hash = format!("configmap/orders:{}", digest_of("2"));
    eventually(Duration::from_secs(10), "the restart", || async {
        orders(c)
            .await
            .1
            .get("config-hash.wasmwatch.io/configmap.orders")
            == Some(&hash)
    })
    .await;
    eventually(Duration::from_secs(10), "the alert", || async {
        !hook.received().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(orders(c).await.0, generation + 1, "one rollout");
    let received = hook.received();
    assert_eq!(received.len(), 1, "one alert per workload: {received:?}");
    let r = &received[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/services/T0/B0/x")
    );
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        r.body,
        r#"{"attachments":[{"author_name":"Reloader","color":"good","text":"cluster \u003ceu-1\u003e : Reloader detected changes in *orders* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *orders* of type *Deployment* in namespace *shop*"}]}"#
    );
    drop(replica);
}
