//! Validation, error shapes, server-set fields and discovery over raw HTTP.

mod common;

use common::{cm, delete, get, http, post, put, send};
use serde_json::json;

#[tokio::test]
async fn validation_errors_are_422_invalid() {
    let server = common::start().await;
    let h = http();
    let coll = format!("{}/api/v1/namespaces/default/configmaps", server.url());

    let r = post(&h, &coll, &cm("Bad_Name", &[])).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.body["reason"], "Invalid");
    assert_eq!(r.body["details"]["kind"], "ConfigMap");
    assert_eq!(r.body["details"]["causes"][0]["field"], "metadata.name");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value")
    );

    let big = "x".repeat(1024 * 1024);
    let r = post(&h, &coll, &cm("big", &[("a", &big)])).await;
    assert_eq!(r.status, 422);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("Too long: must have at most 1048576 bytes")
    );
    // Just under the limit is fine.
    let ok = "x".repeat(1024 * 1024 - 10);
    assert_eq!(
        post(&h, &coll, &cm("almost", &[("a", &ok)])).await.status,
        201
    );

    let mut annotated = cm("ann", &[]);
    annotated["metadata"]["annotations"] = json!({"a": "y".repeat(256 * 1024)});
    let r = post(&h, &coll, &annotated).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "metadata.annotations"
    );

    let secrets = format!("{}/api/v1/namespaces/default/secrets", server.url());
    let big = "x".repeat(1024 * 1024 + 1);
    let r = post(
        &h,
        &secrets,
        &json!({"metadata": {"name": "s"}, "stringData": {"k": big}}),
    )
    .await;
    assert_eq!(r.status, 422);

    let svc = format!("{}/api/v1/namespaces/default/services", server.url());
    let r = post(&h, &svc, &json!({"metadata": {"name": "a.b"}, "spec": {}})).await;
    assert_eq!(r.status, 422, "service names are DNS labels");
}

#[tokio::test]
async fn bad_requests_and_not_found_paths() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");

    let r = send(&h, "POST", &coll, "application/json", None).await;
    assert_eq!(r.status, 400);
    let r = post(
        &h,
        &coll,
        &json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    let r = post(
        &h,
        &coll,
        &json!({"metadata": {"name": "x", "namespace": "other"}}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = get(&h, &format!("{base}/api/v1/namespaces/default/widgets")).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
    let r = get(
        &h,
        &format!("{base}/apis/apps/v1/namespaces/default/deployments/nope"),
    )
    .await;
    assert_eq!(r.body["message"], "deployments.apps \"nope\" not found");
    assert_eq!(
        r.body["details"],
        json!({"name": "nope", "group": "apps", "kind": "deployments"})
    );
    let r = send(
        &h,
        "PATCH",
        &format!("{coll}/nope"),
        "application/merge-patch+json",
        Some(&json!({})),
    )
    .await;
    assert_eq!(r.status, 404);
    post(&h, &coll, &cm("x", &[])).await;
    let r = send(
        &h,
        "PATCH",
        &format!("{coll}/x"),
        "text/plain",
        Some(&json!({})),
    )
    .await;
    assert_eq!(r.status, 415);
    let r = put(&h, &format!("{coll}/y"), &cm("x", &[])).await;
    assert_eq!(r.status, 404, "PUT does not create");
    let r = put(&h, &format!("{coll}/x"), &cm("y", &[])).await;
    assert_eq!(r.status, 400, "name mismatch");
}

#[tokio::test]
async fn server_sets_metadata_and_delete_answers() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    let mut body = cm("", &[]);
    // A version on a create is refused, as etcd3's store does (a 500).
    body["metadata"] = json!({"generateName": "gen-", "uid": "mine", "resourceVersion": "42"});
    let r = post(&h, &coll, &body).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body["message"],
        "Internal error occurred: resourceVersion should not be set on objects to be created"
    );
    body["metadata"] = json!({"generateName": "gen-", "uid": "mine", "resourceVersion": ""});
    let r = post(&h, &coll, &body).await;
    assert_eq!(r.status, 201);
    let name = r.body["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("gen-") && name.len() == 9);
    assert_ne!(r.body["metadata"]["uid"], "mine");
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    assert!(
        r.body["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );

    let d = delete(&h, &format!("{coll}/{name}")).await;
    assert_eq!(d.body["kind"], "Status");
    assert_eq!(d.body["status"], "Success");

    // Finalizers: delete marks, removing the last finalizer deletes.
    let mut f = cm("fin", &[]);
    f["metadata"]["finalizers"] = json!(["example.com/hold"]);
    post(&h, &coll, &f).await;
    let d = delete(&h, &format!("{coll}/fin")).await;
    assert!(d.body["metadata"]["deletionTimestamp"].is_string());
    assert!(server.get("configmaps", "default", "fin").is_some());
    let r = send(
        &h,
        "PATCH",
        &format!("{coll}/fin"),
        "application/merge-patch+json",
        Some(&json!({"metadata": {"finalizers": null}})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(server.get("configmaps", "default", "fin").is_none());

    // Events in both groups.
    let ev = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "ConfigMap", "name": "x"}, "reason": "Changed", "type": "Normal"});
    assert_eq!(
        post(&h, &format!("{base}/api/v1/namespaces/default/events"), &ev)
            .await
            .status,
        201
    );
    let ev = json!({"metadata": {"name": "e2"}, "regarding": {"kind": "ConfigMap", "name": "x"}, "reason": "Changed", "type": "Normal", "action": "Refresh", "eventTime": "2025-01-01T00:00:00.000000Z", "reportingController": "wasmwatch", "reportingInstance": "a"});
    assert_eq!(
        post(
            &h,
            &format!("{base}/apis/events.k8s.io/v1/namespaces/default/events"),
            &ev
        )
        .await
        .status,
        201
    );
    let r = get(
        &h,
        &format!("{base}/api/v1/events?fieldSelector=involvedObject.name%3Dx"),
    )
    .await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn discovery_documents() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let r = get(&h, &format!("{base}/version")).await;
    assert_eq!(r.body["major"], "1");
    let r = get(&h, &format!("{base}/api")).await;
    assert_eq!(r.body["versions"], json!(["v1"]));
    assert_eq!(r.headers["content-type"], "application/json");
    let r = get(&h, &format!("{base}/apis")).await;
    let groups: Vec<&str> = r.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for g in [
        "apps",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
    ] {
        assert!(groups.contains(&g), "{g}");
    }
    let r = get(&h, &format!("{base}/apis/apps/v1")).await;
    let names: Vec<&str> = r.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"deployments") && names.contains(&"deployments/status"));
    let r = get(&h, &format!("{base}/api/v1")).await;
    assert!(
        r.body["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "configmaps" && r["shortNames"] == json!(["cm"]))
    );
}

/// batch/v1 Jobs and CronJobs and the custom resources (Argo Rollouts,
/// OpenKruise CloneSets), as kube-apiserver serves them: a Job's selector
/// and template labels generated from its uid, its pod template immutable,
/// a CronJob's schedule required, and no strategic merge patch of a custom
/// resource.
#[tokio::test]
async fn jobs_cronjobs_and_custom_resources() {
    let server = common::start().await;
    let h = http();
    let batch = format!("{}/apis/batch/v1/namespaces/default", server.url());
    let template = json!({"spec": {"restartPolicy": "Never",
                                   "containers": [{"name": "c", "image": "busybox"}]}});
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                     "spec": {"template": template}});
    let r = post(&h, &format!("{batch}/jobs"), &job).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let uid = r.body["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(
        r.body["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
        uid.as_str()
    );
    let labels = &r.body["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["job-name"], "j");
    assert_eq!(labels["controller-uid"], uid.as_str());
    assert_eq!(r.body["spec"]["backoffLimit"], 6);

    // A selector of its own without manualSelector is refused.
    let mut own = job.clone();
    own["metadata"]["name"] = json!("own");
    own["spec"]["selector"] = json!({"matchLabels": {"a": "b"}});
    let r = post(&h, &format!("{batch}/jobs"), &own).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("`selector` not auto-generated"),
        "{}",
        r.body
    );

    // The pod template cannot change.
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"a": "b"}}}}});
    let r = send(
        &h,
        "PATCH",
        &format!("{batch}/jobs/j"),
        "application/merge-patch+json",
        Some(&patch),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.template");

    let cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
                      "spec": {"jobTemplate": {"spec": {"template": template}}}});
    let r = post(&h, &format!("{batch}/cronjobs"), &cron).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.schedule");
    let mut cron = cron;
    cron["spec"]["schedule"] = json!("0 3 * * *");
    let r = post(&h, &format!("{batch}/cronjobs"), &cron).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 1);
    let r = send(
        &h,
        "PATCH",
        &format!("{batch}/cronjobs/cj"),
        "application/strategic-merge-patch+json",
        Some(&patch),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    for (path, kind) in [
        ("argoproj.io/v1alpha1", "Rollout"),
        ("apps.kruise.io/v1alpha1", "CloneSet"),
    ] {
        let plural = format!("{}s", kind.to_lowercase());
        let coll = format!("{}/apis/{path}/namespaces/default/{plural}", server.url());
        let obj = json!({"apiVersion": path, "kind": kind, "metadata": {"name": "w"},
                         "spec": {"template": template}});
        let r = post(&h, &coll, &obj).await;
        assert_eq!(r.status, 201, "{}", r.body);
        let r = send(
            &h,
            "PATCH",
            &format!("{coll}/w"),
            "application/strategic-merge-patch+json",
            Some(&patch),
        )
        .await;
        assert_eq!(r.status, 415, "{}", r.body);
        let r = send(
            &h,
            "PATCH",
            &format!("{coll}/w"),
            "application/merge-patch+json",
            Some(&patch),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["metadata"]["generation"], 2);
    }
}
