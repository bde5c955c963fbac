//! Every fault as a client sees it, through the library API and over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::{Watch, cm, get, http, post, put, send};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmwatch_apiserver::Failure;

const T: Duration = Duration::from_secs(5);

fn api_code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn injected_500s_and_429s() {
    let server = common::start().await;
    let h = http();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());

    server.faults().fail_next(2, Failure::Internal);
    for _ in 0..2 {
        let r = get(&h, &url).await;
        assert_eq!(r.status, 500);
        assert_eq!(r.body["reason"], "InternalError");
        assert_eq!(r.body["kind"], "Status");
    }
    assert_eq!(get(&h, &url).await.status, 200);

    server.faults().fail_next(
        1,
        Failure::TooManyRequests {
            retry_after_seconds: 7,
        },
    );
    let r = get(&h, &url).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "7");
    assert_eq!(r.body["reason"], "TooManyRequests");
    assert_eq!(r.body["details"]["retryAfterSeconds"], 7);

    // kube-rs without its retry layer sees the errors as API errors.
    let mut cfg = server.kube_config();
    cfg.default_retry = false;
    let api: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(cfg).unwrap());
    server.faults().fail_next(1, Failure::Internal);
    assert_eq!(
        api_code(api.list(&Default::default()).await.unwrap_err()),
        (500, "InternalError".into())
    );
    server.faults().fail_next(
        1,
        Failure::TooManyRequests {
            retry_after_seconds: 1,
        },
    );
    assert_eq!(
        api_code(api.list(&Default::default()).await.unwrap_err()),
        (429, "TooManyRequests".into())
    );
    // kube-rs's default client retries 429 after Retry-After, like client-go.
    let retrying: Api<ConfigMap> = Api::default_namespaced(server.client().unwrap());
    server.faults().fail_next(
        2,
        Failure::TooManyRequests {
            retry_after_seconds: 0,
        },
    );
    retrying.list(&Default::default()).await.unwrap();
    assert_eq!(
        get(&h, &url).await.status,
        200,
        "both failures were consumed by retries"
    );

    // Over HTTP.
    let r = post(
        &h,
        &format!("{}/_faults/fail", server.url()),
        &json!({"count": 1, "code": 429, "retryAfterSeconds": 2}),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = get(&h, &url).await;
    assert_eq!(
        (r.status, r.headers["retry-after"].to_str().unwrap()),
        (429, "2")
    );
    post(
        &h,
        &format!("{}/_faults/fail", server.url()),
        &json!({"count": 1}),
    )
    .await;
    assert_eq!(get(&h, &url).await.status, 500);
    assert_eq!(get(&h, &url).await.status, 200);
}

#[tokio::test]
async fn injected_latency_is_measurable() {
    let server = common::start().await;
    let h = http();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    get(&h, &url).await;
    server.faults().set_latency(Duration::from_millis(150));
    let t = Instant::now();
    get(&h, &url).await;
    assert!(t.elapsed() >= Duration::from_millis(150));
    server.faults().reset();
    let t = Instant::now();
    get(&h, &url).await;
    assert!(t.elapsed() < Duration::from_millis(150));

    post(
        &h,
        &format!("{}/_faults/latency", server.url()),
        &json!({"millis": 120}),
    )
    .await;
    let t = Instant::now();
    get(&h, &url).await;
    assert!(t.elapsed() >= Duration::from_millis(120));
    post(&h, &format!("{}/_faults/reset", server.url()), &json!({})).await;
}

#[tokio::test]
async fn closed_watches_end_cleanly_and_compaction_gives_410() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    post(&h, &coll, &cm("a", &[])).await;
    let rv = server.resource_version();
    let mut w1 = Watch::open(&h, &format!("{coll}?watch=true&resourceVersion={rv}")).await;
    let mut w2 = Watch::open(
        &h,
        &format!("{base}/api/v1/configmaps?watch=true&resourceVersion={rv}"),
    )
    .await;
    server.faults().close_watches();
    assert!(w1.next_within(T).await.is_none());
    assert!(w2.next_within(T).await.is_none());

    // Resuming from the same version works...
    let mut w = Watch::open(&h, &format!("{coll}?watch=true&resourceVersion={rv}")).await;
    post(&h, &coll, &cm("b", &[])).await;
    assert_eq!(
        w.next_within(T).await.unwrap()["object"]["metadata"]["name"],
        "b"
    );
    // ...and the HTTP endpoint closes it too.
    post(&h, &format!("{base}/_faults/close-watches"), &json!({})).await;
    assert!(w.next_within(T).await.is_none());

    // After compaction every earlier version is gone: 410 on resume.
    let before = server.resource_version();
    server.faults().compact_history();
    let mut w = Watch::open(&h, &format!("{coll}?watch=true&resourceVersion={before}")).await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["code"].as_i64()),
        (Some("ERROR"), Some(410))
    );
    assert!(w.next_within(T).await.is_none());
    // Via HTTP as well, after a new write.
    post(&h, &coll, &cm("c", &[])).await;
    let before = server.resource_version();
    post(&h, &format!("{base}/_faults/compact"), &json!({})).await;
    let mut w = Watch::open(&h, &format!("{coll}?watch=true&resourceVersion={before}")).await;
    assert_eq!(
        w.next_within(T).await.unwrap()["object"]["reason"],
        "Expired"
    );
}

async fn wait_until_accepting(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + T;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "server came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn refused_connections_look_like_a_down_server() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().unwrap());
    api.list(&Default::default()).await.unwrap();
    let mut w = Watch::open(
        &h,
        &format!(
            "{coll}?watch=true&resourceVersion={}",
            server.resource_version()
        ),
    )
    .await;

    server
        .faults()
        .refuse_connections(Duration::from_millis(400))
        .await;
    let e = tokio::net::TcpStream::connect(server.addr())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    // The open watch was cut off.
    assert!(w.next_within(T).await.is_none());
    // kube-rs sees a transport error, not an API error.
    match api.list(&Default::default()).await.unwrap_err() {
        kube::Error::Api(s) => panic!("expected a connection error, got API status {s:?}"),
        other => eprintln!("kube-rs error while down (expected): {other}"),
    }

    wait_until_accepting(server.addr()).await;
    api.list(&Default::default()).await.unwrap();
    assert_eq!(get(&h, &coll).await.status, 200);

    // Over HTTP: the fault request itself is answered, then the server is down.
    let r = post(
        &h,
        &format!("{base}/_faults/refuse"),
        &json!({"millis": 300}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(tokio::net::TcpStream::connect(server.addr()).await.is_err());
    wait_until_accepting(server.addr()).await;
}

#[tokio::test]
async fn forced_conflict_on_next_write_to_a_named_object() {
    let server = common::start().await;
    let h = http();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().unwrap());
    let obj: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "target"}, "data": {"a": "1"}}))
            .unwrap();
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();

    server
        .faults()
        .conflict_next_write("configmaps", "default", "target");
    // Other objects are unaffected.
    api.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();
    // The named object gets exactly one 409, even with the right version.
    let e = api
        .replace("target", &PostParams::default(), &created)
        .await
        .unwrap_err();
    assert_eq!(api_code(e), (409, "Conflict".into()));
    api.replace("target", &PostParams::default(), &created)
        .await
        .unwrap();

    // Over HTTP, for a patch.
    let base = server.url();
    post(
        &h,
        &format!("{base}/_faults/conflict"),
        &json!({"resource": "configmaps", "namespace": "default", "name": "target"}),
    )
    .await;
    let url = format!("{base}/api/v1/namespaces/default/configmaps/target");
    let p = json!({"data": {"b": "2"}});
    let r = send(&h, "PATCH", &url, "application/merge-patch+json", Some(&p)).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    assert_eq!(
        r.body["message"],
        "Operation cannot be fulfilled on configmaps \"target\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let r = send(&h, "PATCH", &url, "application/merge-patch+json", Some(&p)).await;
    assert_eq!(r.status, 200);
    // PUT with an empty resourceVersion is an unconditional update.
    let mut body = r.body.clone();
    body["metadata"]["resourceVersion"] = json!("");
    assert_eq!(put(&h, &url, &body).await.status, 200);
}
