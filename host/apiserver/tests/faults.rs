//! Every fault as a client sees it, through the library API and over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::{Watch, cm, get, http, post, put, send};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmwatch_apiserver::{Failure, FaultAnswer, RequestFault};

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

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
    }))
    .unwrap()
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec.as_ref()?.holder_identity.as_deref()
}

fn rule(verb: &str, name_prefix: &str, skip: u32, answer: FaultAnswer) -> RequestFault {
    RequestFault {
        verb: Some(verb.into()),
        resource: "leases".into(),
        namespace: Some("default".into()),
        name_prefix: Some(name_prefix.into()),
        skip,
        answer,
    }
}

/// The stored lease `name` in `default`, as the server has it.
fn stored(server: &wasmwatch_apiserver::ServerHandle, name: &str) -> Option<serde_json::Value> {
    server.get("leases.coordination.k8s.io", "default", name)
}

/// The codes the request log recorded for `verb` on the lease `name`.
fn logged(server: &wasmwatch_apiserver::ServerHandle, verb: &str, name: &str) -> Vec<u16> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.verb == verb && r.resource == "leases" && r.name.as_deref() == Some(name))
        .map(|r| r.code)
        .collect()
}

/// A transport error (no answer), not an API status.
fn assert_connection_error(e: kube::Error) {
    if let kube::Error::Api(s) = e {
        panic!("expected a connection error, got API status {s:?}");
    }
}

#[tokio::test]
async fn the_third_matching_update_is_forbidden_and_changes_nothing() {
    let server = common::start().await;
    let api: Api<Lease> = Api::default_namespaced(server.client().unwrap());
    let pp = PostParams::default();
    let mut saved = Vec::new();
    for name in ["save-a", "save-b", "save-c", "other"] {
        saved.push(api.create(&pp, &lease(name, "old")).await.unwrap());
    }
    server
        .faults()
        .fail_nth(rule("update", "save-", 2, FaultAnswer::Status(403)));

    // Not counted: another name, another verb.
    let mut other = saved[3].clone();
    other.spec.as_mut().unwrap().holder_identity = Some("new".into());
    api.replace("other", &pp, &other).await.unwrap();
    api.patch(
        "save-c",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"leaseTransitions": 1}})),
    )
    .await
    .unwrap();
    let current_c = api.get("save-c").await.unwrap();

    // Counted: the first two pass, the third is refused.
    let mut results = Vec::new();
    for l in [&saved[0], &saved[1], &current_c] {
        let mut l = l.clone();
        l.spec.as_mut().unwrap().holder_identity = Some("new".into());
        results.push(
            api.replace(l.metadata.name.as_deref().unwrap(), &pp, &l)
                .await,
        );
    }
    assert_eq!(holder(results[0].as_ref().unwrap()), Some("new"));
    assert_eq!(holder(results[1].as_ref().unwrap()), Some("new"));
    let kube::Error::Api(s) = results.pop().unwrap().unwrap_err() else {
        panic!("expected an API error");
    };
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        "leases.coordination.k8s.io \"save-c\" is forbidden: User \"system:anonymous\" cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\""
    );
    let c = stored(&server, "save-c").unwrap();
    assert_eq!(c["spec"]["holderIdentity"], "old");
    assert_eq!(
        c["metadata"]["resourceVersion"].as_str(),
        current_c.metadata.resource_version.as_deref(),
        "the refused update changed nothing"
    );
    assert_eq!(logged(&server, "update", "save-c"), [403]);

    // One-shot: the same update now passes.
    assert_eq!(server.faults().request_faults_left(), 0);
    let mut l = current_c.clone();
    l.spec.as_mut().unwrap().holder_identity = Some("new".into());
    api.replace("save-c", &pp, &l).await.unwrap();
    assert_eq!(logged(&server, "update", "save-c"), [403, 200]);
}

#[tokio::test]
async fn a_create_matched_by_the_name_in_its_body_fails_with_500() {
    let server = common::start().await;
    let api: Api<Lease> = Api::default_namespaced(server.client().unwrap());
    let pp = PostParams::default();
    server
        .faults()
        .fail_nth(rule("create", "new-", 0, FaultAnswer::Status(500)));
    api.create(&pp, &lease("old-1", "a")).await.unwrap();
    let e = api.create(&pp, &lease("new-1", "a")).await.unwrap_err();
    assert_eq!(api_code(e), (500, "InternalError".into()));
    assert!(
        stored(&server, "new-1").is_none(),
        "the create was not applied"
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.verb == "create" && r.resource == "leases" && r.code == 500),
        "the injected 500 is in the request log"
    );
    api.create(&pp, &lease("new-1", "a")).await.unwrap();
}

#[tokio::test]
async fn a_dropped_request_is_not_applied_and_the_client_sees_a_connection_error() {
    let server = common::start().await;
    let api: Api<Lease> = Api::default_namespaced(server.client().unwrap());
    let pp = PostParams::default();
    let created = api.create(&pp, &lease("drop-me", "old")).await.unwrap();
    server
        .faults()
        .fail_nth(rule("update", "drop-", 0, FaultAnswer::Drop));
    let mut l = created.clone();
    l.spec.as_mut().unwrap().holder_identity = Some("new".into());
    assert_connection_error(api.replace("drop-me", &pp, &l).await.unwrap_err());
    let s = stored(&server, "drop-me").unwrap();
    assert_eq!(s["spec"]["holderIdentity"], "old");
    assert_eq!(
        s["metadata"]["resourceVersion"].as_str(),
        created.metadata.resource_version.as_deref()
    );
    // Recorded without a status: no answer was sent.
    assert_eq!(logged(&server, "update", "drop-me"), [0]);
    // The same write goes through now.
    assert_eq!(
        holder(&api.replace("drop-me", &pp, &l).await.unwrap()),
        Some("new")
    );
}

#[tokio::test]
async fn drop_after_applies_the_write_yet_the_client_sees_an_error() {
    let server = common::start().await;
    let api: Api<Lease> = Api::default_namespaced(server.client().unwrap());
    let pp = PostParams::default();
    let created = api.create(&pp, &lease("lost-answer", "old")).await.unwrap();
    server
        .faults()
        .fail_nth(rule("update", "lost-", 0, FaultAnswer::DropAfter));
    let mut l = created.clone();
    l.spec.as_mut().unwrap().holder_identity = Some("new".into());
    assert_connection_error(api.replace("lost-answer", &pp, &l).await.unwrap_err());
    let s = stored(&server, "lost-answer").unwrap();
    assert_eq!(s["spec"]["holderIdentity"], "new", "the write happened");
    assert_ne!(
        s["metadata"]["resourceVersion"].as_str(),
        created.metadata.resource_version.as_deref()
    );
    assert_eq!(logged(&server, "update", "lost-answer"), [0]);
    // A retry of the same write from the old version now conflicts.
    let e = api.replace("lost-answer", &pp, &l).await.unwrap_err();
    assert_eq!(api_code(e), (409, "Conflict".into()));

    // A create too: the object exists, the client saw no answer.
    server
        .faults()
        .fail_nth(rule("create", "lost-", 0, FaultAnswer::DropAfter));
    assert_connection_error(api.create(&pp, &lease("lost-2", "a")).await.unwrap_err());
    assert!(stored(&server, "lost-2").is_some());
}

#[tokio::test]
async fn the_request_fault_endpoint_arms_rules() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let arm = format!("{base}/_faults/request");
    let coll = format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases");
    let obj = |name: &str| json!({"metadata": {"name": name}, "spec": {"holderIdentity": "a"}});

    // Two rules at once: the 2nd update of x-*, and any create of y-*.
    let r = post(
        &h,
        &arm,
        &json!({"verb": "update", "resource": "leases", "namespace": "default",
                "namePrefix": "x-", "skip": 1, "answer": {"status": 403}}),
    )
    .await;
    assert_eq!((r.status, &r.body["fault"]), (200, &json!("request")));
    post(
        &h,
        &arm,
        &json!({"verb": "create", "resource": "leases", "namePrefix": "y-",
                "answer": {"status": 403}}),
    )
    .await;
    assert_eq!(server.faults().request_faults_left(), 2);

    let created = post(&h, &coll, &obj("x-1")).await;
    assert_eq!(created.status, 201);
    let url = format!("{coll}/x-1");
    let first = put(&h, &url, &created.body).await;
    assert_eq!(first.status, 200);
    let second = put(&h, &url, &first.body).await;
    assert_eq!(second.status, 403);
    assert_eq!(
        second.body,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases.coordination.k8s.io \"x-1\" is forbidden: User \"system:anonymous\" cannot update resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\"",
            "reason": "Forbidden",
            "details": {"name": "x-1", "group": "coordination.k8s.io", "kind": "leases"},
            "code": 403
        })
    );
    // A create's RBAC denial names no object, as kube-apiserver's does.
    let r = post(&h, &coll, &obj("y-1")).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body["message"],
        "leases.coordination.k8s.io is forbidden: User \"system:anonymous\" cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\""
    );
    assert!(
        server
            .get("leases.coordination.k8s.io", "default", "y-1")
            .is_none()
    );
    assert_eq!(server.faults().request_faults_left(), 0);
    assert_eq!(put(&h, &url, &first.body).await.status, 200);

    // 409 on a delete (the object stays) and 503 on a list.
    post(
        &h,
        &arm,
        &json!({"verb": "delete", "resource": "leases", "answer": {"status": 409}}),
    )
    .await;
    let r = common::delete(&h, &url).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    assert!(
        server
            .get("leases.coordination.k8s.io", "default", "x-1")
            .is_some()
    );
    post(
        &h,
        &arm,
        &json!({"verb": "list", "resource": "leases", "answer": {"status": 503}}),
    )
    .await;
    let r = get(&h, &coll).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    assert_eq!(get(&h, &coll).await.status, 200);

    // Drop over HTTP: the connection closes without an answer.
    post(
        &h,
        &arm,
        &json!({"resource": "leases", "namePrefix": "x-", "answer": "drop"}),
    )
    .await;
    let req = hyper::Request::get(&url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert!(h.request(req).await.is_err(), "no answer");
    assert_eq!(get(&h, &url).await.status, 200);

    // Reset clears armed rules; bad rules are refused.
    post(
        &h,
        &arm,
        &json!({"resource": "leases", "answer": "dropAfter"}),
    )
    .await;
    assert_eq!(server.faults().request_faults_left(), 1);
    post(&h, &format!("{base}/_faults/reset"), &json!({})).await;
    assert_eq!(server.faults().request_faults_left(), 0);
    assert_eq!(get(&h, &url).await.status, 200);
    for bad in [
        json!({"resource": "leases", "answer": {"status": 418}}),
        json!({"resource": "leases", "verb": "put", "answer": "drop"}),
        json!({"resource": "leases", "name": "x-1", "answer": "drop"}),
        json!({"resource": "leases"}),
    ] {
        assert_eq!(post(&h, &arm, &bad).await.status, 400, "{bad}");
    }
    assert_eq!(server.faults().request_faults_left(), 0);
}
