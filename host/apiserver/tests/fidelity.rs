//! Where the server once differed from kube-apiserver in ways a controller
//! would notice (issue 22): type-checked bodies, validation of built-in
//! kinds, immutable fields, finalizers while deleting, create with a
//! version, JSON patches that do not apply, Deployment generations, Lease
//! updates, list and watch options, history per kind.

mod common;

use common::{Http, Watch, cm, get, http, post, put, send};
use serde_json::{Value, json};
use wasmwatch_apiserver::Config;

fn msg(r: &common::Resp) -> String {
    r.body["message"].as_str().unwrap_or_default().to_string()
}

fn fields(r: &common::Resp) -> Vec<String> {
    r.body["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["field"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn patch(h: &Http, url: &str, ty: &str, body: Value) -> common::Resp {
    send(h, "PATCH", url, ty, Some(&body)).await
}

const MERGE: &str = "application/merge-patch+json";

fn deployment(name: &str, selector: Value, labels: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"selector": selector,
            "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
}

#[tokio::test]
async fn bodies_of_the_wrong_json_types_are_400_cannot_be_handled() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let cms = format!("{base}/api/v1/namespaces/default/configmaps");
    let r = post(
        &h,
        &cms,
        &json!({"metadata": {"name": "a"}, "data": {"a": 1}}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    assert!(
        msg(&r).starts_with("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: data.a"),
        "{}",
        msg(&r)
    );
    let r = post(
        &h,
        &cms,
        &json!({"metadata": {"name": "a", "labels": ["a"]}}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", msg(&r));
    assert!(msg(&r).contains("metadata.labels"), "{}", msg(&r));

    let deps = format!("{base}/apis/apps/v1/namespaces/default/deployments");
    let mut d = deployment(
        "d",
        json!({"matchLabels": {"app": "d"}}),
        json!({"app": "d"}),
    );
    d["spec"]["replicas"] = json!("two");
    let r = post(&h, &deps, &d).await;
    assert_eq!(r.status, 400);
    assert!(
        msg(&r).contains("cannot be handled as a Deployment: spec.replicas"),
        "{}",
        msg(&r)
    );

    let leases = format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases");
    let r = post(
        &h,
        &leases,
        &json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": "15"}}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(msg(&r).contains("spec.leaseDurationSeconds"), "{}", msg(&r));

    // Through a patch too, and nothing is stored.
    assert_eq!(post(&h, &cms, &cm("b", &[("k", "v")])).await.status, 201);
    let r = patch(&h, &format!("{cms}/b"), MERGE, json!({"data": {"k": 2}})).await;
    assert_eq!(r.status, 400, "{}", msg(&r));
    assert_eq!(get(&h, &format!("{cms}/b")).await.body["data"]["k"], "v");
}

#[tokio::test]
async fn built_in_kinds_are_validated_like_kube_apiserver() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let deps = format!("{base}/apis/apps/v1/namespaces/default/deployments");
    let r = post(
        &h,
        &deps,
        &deployment(
            "d",
            json!({"matchLabels": {"app": "d"}}),
            json!({"app": "e"}),
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (422, Some("Invalid"))
    );
    assert!(
        msg(&r).starts_with(
            "Deployment.apps \"d\" is invalid: spec.template.metadata.labels: Invalid value"
        ),
        "{}",
        msg(&r)
    );
    assert!(msg(&r).contains("`selector` does not match template `labels`"));
    let mut no_selector = deployment("d", Value::Null, json!({"app": "d"}));
    no_selector["spec"]["template"]["spec"]["containers"] = json!([]);
    let r = post(&h, &deps, &no_selector).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        fields(&r),
        ["spec.selector", "spec.template.spec.containers"]
    );
    let sts = format!("{base}/apis/apps/v1/namespaces/default/statefulsets");
    let mut s = deployment(
        "s",
        json!({"matchLabels": {"app": "s"}}),
        json!({"app": "s"}),
    );
    s["kind"] = json!("StatefulSet");
    assert_eq!(post(&h, &sts, &s).await.status, 201);

    let pods = format!("{base}/api/v1/namespaces/default/pods");
    let r = post(&h, &pods, &json!({"metadata": {"name": "p"}, "spec": {}})).await;
    assert_eq!(
        (r.status, fields(&r)),
        (422, vec!["spec.containers".to_string()])
    );
    let r = post(
        &h,
        &pods,
        &json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .await;
    assert_eq!(
        (r.status, fields(&r)),
        (422, vec!["spec.containers[0].image".to_string()])
    );

    let slices = format!("{base}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices");
    let r = post(
        &h,
        &slices,
        &json!({"metadata": {"name": "s"}, "endpoints": []}),
    )
    .await;
    assert_eq!(
        (r.status, fields(&r)),
        (422, vec!["addressType".to_string()])
    );
    let r = post(
        &h,
        &slices,
        &json!({"metadata": {"name": "s"}, "addressType": "IPv5", "endpoints": []}),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueNotSupported"
    );

    let events = format!("{base}/apis/events.k8s.io/v1/namespaces/default/events");
    let r = post(
        &h,
        &events,
        &json!({"metadata": {"name": "e"}, "type": "Normal", "reason": "Hi"}),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        fields(&r),
        [
            "eventTime",
            "reportingController",
            "reportingInstance",
            "action"
        ]
    );
    let r = post(
        &h,
        &events,
        &json!({"metadata": {"name": "e"}, "type": "Normal", "reason": "Hi", "action": "Do",
            "eventTime": "2026-12-05T12:00:00.000000Z", "reportingController": "wasmwatch.io/x",
            "reportingInstance": "x-0"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", msg(&r));
}

#[tokio::test]
async fn immutable_fields_and_finalizers_of_deleting_objects_are_refused() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let deps = format!("{base}/apis/apps/v1/namespaces/default/deployments");
    let d = deployment(
        "d",
        json!({"matchLabels": {"app": "d"}}),
        json!({"app": "d", "v": "1"}),
    );
    assert_eq!(post(&h, &deps, &d).await.status, 201);
    let r = patch(
        &h,
        &format!("{deps}/d"),
        MERGE,
        json!({"spec": {"selector": {"matchLabels": {"app": "d", "v": "1"}}}}),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(fields(&r), ["spec.selector"]);
    assert!(msg(&r).ends_with("field is immutable"), "{}", msg(&r));

    let cms = format!("{base}/api/v1/namespaces/default/configmaps");
    let mut frozen = cm("frozen", &[("k", "v")]);
    frozen["immutable"] = json!(true);
    assert_eq!(post(&h, &cms, &frozen).await.status, 201);
    let r = patch(
        &h,
        &format!("{cms}/frozen"),
        MERGE,
        json!({"data": {"k": "w"}}),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(fields(&r), ["data"]);
    assert!(msg(&r).contains("field is immutable when `immutable` is set"));
    let r = patch(
        &h,
        &format!("{cms}/frozen"),
        MERGE,
        json!({"immutable": false}),
    )
    .await;
    assert_eq!((r.status, fields(&r)), (422, vec!["immutable".to_string()]));
    // Metadata may still change.
    let r = patch(
        &h,
        &format!("{cms}/frozen"),
        MERGE,
        json!({"metadata": {"labels": {"a": "b"}}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", msg(&r));

    let secrets = format!("{base}/api/v1/namespaces/default/secrets");
    let s = json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}});
    assert_eq!(post(&h, &secrets, &s).await.status, 201);
    let r = patch(
        &h,
        &format!("{secrets}/s"),
        MERGE,
        json!({"type": "kubernetes.io/tls"}),
    )
    .await;
    assert_eq!((r.status, fields(&r)), (422, vec!["type".to_string()]));

    // A finalizer cannot be added once deletion started; removing the last deletes.
    let mut held = cm("held", &[]);
    held["metadata"]["finalizers"] = json!(["a.io/one"]);
    assert_eq!(post(&h, &cms, &held).await.status, 201);
    assert_eq!(common::delete(&h, &format!("{cms}/held")).await.status, 200);
    let r = patch(
        &h,
        &format!("{cms}/held"),
        MERGE,
        json!({"metadata": {"finalizers": ["a.io/one", "b.io/two"]}}),
    )
    .await;
    assert_eq!(
        (r.status, fields(&r)),
        (422, vec!["metadata.finalizers".to_string()])
    );
    assert!(
        msg(&r).contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        msg(&r)
    );
    let r = patch(
        &h,
        &format!("{cms}/held"),
        MERGE,
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(get(&h, &format!("{cms}/held")).await.status, 404);
}

#[tokio::test]
async fn json_patches_that_do_not_apply_are_422_not_500() {
    let server = common::start().await;
    let h = http();
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    assert_eq!(post(&h, &cms, &cm("a", &[("k", "v")])).await.status, 201);
    const JSON: &str = "application/json-patch+json";
    let r = patch(
        &h,
        &format!("{cms}/a"),
        JSON,
        json!([{"op": "test", "path": "/data/k", "value": "other"},
               {"op": "replace", "path": "/data/k", "value": "w"}]),
    )
    .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (422, Some("Invalid"))
    );
    let r = patch(
        &h,
        &format!("{cms}/a"),
        JSON,
        json!([{"op": "remove", "path": "/data/missing"}]),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(get(&h, &format!("{cms}/a")).await.body["data"]["k"], "v");
    let r = patch(
        &h,
        &format!("{cms}/a"),
        JSON,
        json!([{"op": "test", "path": "/data/k", "value": "v"},
               {"op": "replace", "path": "/data/k", "value": "w"}]),
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn deployments_count_annotation_changes_as_generations_stateful_sets_do_not() {
    let server = common::start().await;
    let h = http();
    let apps = format!("{}/apis/apps/v1/namespaces/default", server.url());
    let d = deployment(
        "d",
        json!({"matchLabels": {"app": "d"}}),
        json!({"app": "d"}),
    );
    assert_eq!(
        post(&h, &format!("{apps}/deployments"), &d).await.status,
        201
    );
    let mut s = d.clone();
    s["kind"] = json!("StatefulSet");
    assert_eq!(
        post(&h, &format!("{apps}/statefulsets"), &s).await.status,
        201
    );
    let annotate = json!({"metadata": {"annotations": {"a": "b"}}});
    let r = patch(
        &h,
        &format!("{apps}/deployments/d"),
        MERGE,
        annotate.clone(),
    )
    .await;
    assert_eq!(r.body["metadata"]["generation"], 2);
    let r = patch(&h, &format!("{apps}/statefulsets/d"), MERGE, annotate).await;
    assert_eq!(r.body["metadata"]["generation"], 1);
    let r = patch(
        &h,
        &format!("{apps}/deployments/d"),
        MERGE,
        json!({"metadata": {"labels": {"l": "x"}}}),
    )
    .await;
    assert_eq!(
        r.body["metadata"]["generation"], 2,
        "labels are not annotations"
    );
}

#[tokio::test]
async fn lease_puts_need_a_version_and_create_a_missing_name() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let leases = format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases");
    let lease = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
    // Create-on-update: a PUT of a missing Lease creates it.
    let r = put(&h, &format!("{leases}/l"), &lease).await;
    assert_eq!(r.status, 201, "{}", msg(&r));
    assert_eq!(r.body["spec"]["holderIdentity"], "a");
    // No unconditional update.
    let r = put(&h, &format!("{leases}/l"), &lease).await;
    assert_eq!(r.status, 422);
    assert_eq!(fields(&r), ["metadata.resourceVersion"]);
    assert!(
        msg(&r).starts_with("Lease.coordination.k8s.io \"l\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"),
        "{}",
        msg(&r)
    );
    let mut renewed = get(&h, &format!("{leases}/l")).await.body;
    renewed["spec"]["holderIdentity"] = json!("b");
    assert_eq!(put(&h, &format!("{leases}/l"), &renewed).await.status, 200);
    // ConfigMaps keep their rules: no create on PUT, unconditional updates allowed.
    let cms = format!("{base}/api/v1/namespaces/default/configmaps");
    assert_eq!(
        put(&h, &format!("{cms}/c"), &cm("c", &[])).await.status,
        404
    );
    post(&h, &cms, &cm("c", &[])).await;
    assert_eq!(
        put(&h, &format!("{cms}/c"), &cm("c", &[("a", "b")]))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn list_and_watch_options_are_checked_like_kube_apiserver() {
    let server = common::start().await;
    let h = http();
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    for (query, field) in [
        ("watch=true&sendInitialEvents=true", "resourceVersionMatch"),
        (
            "watch=true&resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch",
        ),
        (
            "watch=true&resourceVersion=1&resourceVersionMatch=Exact&sendInitialEvents=true",
            "resourceVersionMatch",
        ),
        ("resourceVersionMatch=NotOlderThan", "resourceVersionMatch"),
        (
            "resourceVersion=1&sendInitialEvents=true",
            "sendInitialEvents",
        ),
    ] {
        // Served as a watch, it would stream forever: bound the wait.
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            get(&h, &format!("{cms}?{query}")),
        )
        .await
        .unwrap_or_else(|_| panic!("{query}: served instead of refused"));
        assert_eq!(r.status, 422, "{query}: {}", msg(&r));
        assert_eq!(r.body["details"]["kind"], "ListOptions", "{query}");
        assert!(
            msg(&r).starts_with("ListOptions.meta.k8s.io \"\" is invalid"),
            "{query}: {}",
            msg(&r)
        );
        assert_eq!(fields(&r)[0], field, "{query}");
    }
    // The documented watch-list form is served.
    let mut w = Watch::open(
        &h,
        &format!("{cms}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
    )
    .await;
    let ev = w
        .next_within(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ev["type"], "BOOKMARK");
}

/// kube-apiserver keeps a watch cache per resource: a burst of Lease writes
/// does not expire the versions a ConfigMap watch resumes from.
#[tokio::test]
async fn history_is_kept_per_kind() {
    let server = common::start_with(Config::default().history(5)).await;
    let h = http();
    let base = server.url();
    let cms = format!("{base}/api/v1/namespaces/default/configmaps");
    post(&h, &cms, &cm("a", &[])).await;
    let from = server.resource_version();
    let changed = post(&h, &cms, &cm("b", &[])).await;
    let leases = format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases");
    for i in 0..20 {
        post(&h, &leases, &json!({"metadata": {"name": format!("l{i}")}})).await;
    }
    let mut w = Watch::open(&h, &format!("{cms}?watch=true&resourceVersion={from}")).await;
    let ev = w
        .next_within(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"], changed.body);
    let r = get(
        &h,
        &format!("{cms}?resourceVersion={from}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(r.status, 200, "an exact list at a version of this kind");
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    // The Leases' own history is what expired.
    let mut w = Watch::open(&h, &format!("{leases}?watch=true&resourceVersion={from}")).await;
    let ev = w
        .next_within(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["code"].as_i64()),
        (Some("ERROR"), Some(410))
    );
}

/// kube-apiserver defaults a workload's strategy; `kubectl rollout status`
/// refuses a StatefulSet or DaemonSet without one.
#[tokio::test]
async fn workload_strategies_are_defaulted_and_a_resent_spec_is_no_new_generation() {
    let server = common::start().await;
    let h = http();
    let apps = format!("{}/apis/apps/v1/namespaces/default", server.url());
    let d = deployment(
        "d",
        json!({"matchLabels": {"app": "d"}}),
        json!({"app": "d"}),
    );
    let mut s = d.clone();
    s["kind"] = json!("StatefulSet");
    let mut ds = d.clone();
    ds["kind"] = json!("DaemonSet");
    let r = post(&h, &format!("{apps}/deployments"), &d).await;
    assert_eq!(r.body["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(r.body["spec"]["progressDeadlineSeconds"], 600);
    let r = post(&h, &format!("{apps}/statefulsets"), &s).await;
    assert_eq!(
        r.body["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        0
    );
    let r = post(&h, &format!("{apps}/daemonsets"), &ds).await;
    assert_eq!(r.body["spec"]["updateStrategy"]["type"], "RollingUpdate");
    // The same spec again, without the defaults: nothing changes.
    let r = put(&h, &format!("{apps}/deployments/d"), &d).await;
    assert_eq!(r.status, 200, "{}", msg(&r));
    assert_eq!(r.body["metadata"]["generation"], 1);
}
