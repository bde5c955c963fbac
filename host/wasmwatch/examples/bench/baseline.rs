//! The informer baseline of `bench compare` (issue 24): what Stakater
//! Reloader and Spring Cloud Kubernetes' configuration watcher do, written
//! the plain way with kube-rs. Bench code only, never part of the product.
//!
//! - a reflector (kube-rs `watcher` + `reflector`, default settings: pages of
//!   500, bookmarks, the default backoff) over every ConfigMap in every
//!   namespace, and one over every EndpointSlice;
//! - for each change of a ConfigMap labelled `spring.cloud.kubernetes.config=true`
//!   (every `Apply` from the watch: the initial list is not a change, as in
//!   both peers), the apps named in `spring.cloud.kubernetes.configmap.apps`
//!   (comma-separated), or else the app named like the ConfigMap;
//! - for each app, a bodyless `POST /actuator/refresh` (`Content-Length: 0`)
//!   to every ready endpoint (`conditions.ready` not false) of the
//!   EndpointSlices of its Service (`kubernetes.io/service-name`) in the
//!   ConfigMap's namespace, on the slice's first port; the POSTs run
//!   concurrently on one pooled HTTP/1.1 client (hyper-util's, as wasmwatch's
//!   executor uses), 10 s timeout; no retries, no Events, no rate limits.
//!
//! It runs as its own process (`bench __baseline`, the same binary), reads
//! `KUBECONFIG`, and prints one JSON line `{"ready": true}` once both
//! reflectors have listed, so that `bench compare` measures its CPU and RSS
//! through /proc exactly as it measures wasmwatch's.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_LENGTH;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};

const LABEL: &str = "spring.cloud.kubernetes.config";
const APPS: &str = "spring.cloud.kubernetes.configmap.apps";
const SERVICE_NAME: &str = "kubernetes.io/service-name";

type Http = Client<HttpConnector, Full<Bytes>>;

static FAILED: AtomicU64 = AtomicU64::new(0);

/// The baseline process: runs until killed.
pub async fn run() {
    let client = kube::Client::try_default()
        .await
        .expect("a kube client from KUBECONFIG");
    let (slices, writer) = reflector::store::<EndpointSlice>();
    let slice_events = reflector(
        writer,
        watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    );
    tokio::spawn(slice_events.for_each(|_| std::future::ready(())));
    if std::env::var_os("BASELINE_FLOOR").is_some() {
        return floor(client, slices).await;
    }
    let (configmaps, writer) = reflector::store::<ConfigMap>();
    let cm_events = reflector(
        writer,
        watcher(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    );
    // `BASELINE_SECRETS=1` (`bench state`): a reflector over every Secret
    // too, as Reloader keeps one when it watches Secrets; it only caches.
    let secrets = std::env::var_os("BASELINE_SECRETS").map(|_| {
        let (secrets, writer) = reflector::store::<Secret>();
        let events = reflector(
            writer,
            watcher(
                Api::<Secret>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        tokio::spawn(events.for_each(|_| std::future::ready(())));
        secrets
    });
    {
        let (slices, configmaps) = (slices.clone(), configmaps.clone());
        tokio::spawn(async move {
            let _ = slices.wait_until_ready().await;
            let _ = configmaps.wait_until_ready().await;
            if let Some(secrets) = secrets {
                let _ = secrets.wait_until_ready().await;
            }
            println!("{}", serde_json::json!({"ready": true, "baseline": true}));
        });
    }
    let http = http();
    futures_util::pin_mut!(cm_events);
    while let Some(event) = cm_events.next().await {
        let Ok(watcher::Event::Apply(cm)) = event else {
            continue;
        };
        refresh(&cm, &slices, &http);
    }
}

fn http() -> Http {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http()
}

/// `BASELINE_FLOOR=1` (issue 35): the least any watcher of every ConfigMap
/// pays, to weigh what a watcher could save at all. It reads the raw watch
/// stream (kube's client, the same HTTP path) line by line, finds the
/// resourceVersion to resume from and the label by a byte search, and
/// parses and refreshes only the labelled changes, as the informer does;
/// the others are dropped unparsed and nothing is stored. Not a correct
/// watcher (no relist, no store of ConfigMaps): a measuring stick only.
async fn floor(client: kube::Client, slices: reflector::Store<EndpointSlice>) {
    use futures_util::AsyncBufReadExt;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    let api = Api::<ConfigMap>::all(client.clone());
    let _ = slices.wait_until_ready().await;
    let mut rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .expect("list ConfigMaps")
        .metadata
        .resource_version
        .unwrap_or_default();
    println!("{}", serde_json::json!({"ready": true, "baseline": true}));
    let http = http();
    let label = memchr::memmem::Finder::new(br#""spring.cloud.kubernetes.config":"true""#);
    let version = memchr::memmem::Finder::new(br#""resourceVersion":""#);
    let mut line = Vec::new();
    loop {
        let request = kube::core::Request::new("/api/v1/configmaps")
            .watch(&WatchParams::default().timeout(290), &rv)
            .expect("a watch request");
        let body = match client.request_stream(request).await {
            Ok(body) => body,
            Err(e) => {
                eprintln!("floor: watch: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        futures_util::pin_mut!(body);
        loop {
            line.clear();
            match body.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(at) = version.find(&line) {
                let rest = &line[at + version.needle().len()..];
                if let Some(end) = memchr::memchr(b'"', rest) {
                    rv = String::from_utf8_lossy(&rest[..end]).into_owned();
                }
            }
            if label.find(&line).is_none() {
                continue;
            }
            if let Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm)) =
                serde_json::from_slice::<WatchEvent<ConfigMap>>(&line)
            {
                refresh(&cm, &slices, &http);
            }
        }
    }
}

/// The POSTs for a change of `cm`, if it is labelled.
fn refresh(cm: &ConfigMap, slices: &reflector::Store<EndpointSlice>, http: &Http) {
    if cm.labels().get(LABEL).map(String::as_str) != Some("true") {
        return;
    }
    let namespace = cm.namespace().unwrap_or_default();
    let apps: Vec<String> = match cm.annotations().get(APPS) {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect(),
        None => vec![cm.name_any()],
    };
    for app in &apps {
        for slice in slices.state() {
            if slice.metadata.namespace.as_deref() != Some(namespace.as_str())
                || slice.labels().get(SERVICE_NAME) != Some(app)
            {
                continue;
            }
            let Some(port) = slice
                .ports
                .as_ref()
                .and_then(|p| p.first())
                .and_then(|p| p.port)
            else {
                continue;
            };
            for ep in slice.endpoints.iter().flatten() {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                let Some(address) = ep.addresses.first() else {
                    continue;
                };
                let uri = if address.contains(':') {
                    format!("http://[{address}]:{port}/actuator/refresh")
                } else {
                    format!("http://{address}:{port}/actuator/refresh")
                };
                tokio::spawn(post(http.clone(), uri));
            }
        }
    }
}

async fn post(http: Http, uri: String) {
    let request = hyper::Request::post(&uri)
        .header(CONTENT_LENGTH, 0)
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let ok = match tokio::time::timeout(Duration::from_secs(10), http.request(request)).await {
        Ok(Ok(response)) => {
            let ok = response.status().is_success();
            // Drained, so that the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            ok
        }
        _ => false,
    };
    if !ok && FAILED.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!("baseline: POST {uri} failed (reported once)");
    }
}
