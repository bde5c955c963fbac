//! Server-side printing: `meta.k8s.io/v1` Tables over raw HTTP, for lists,
//! single objects and watches, with the list semantics of the JSON answers.

mod common;

use std::time::Duration;

use common::{ACCEPT_TABLE, Watch, cm, get_accept, http, post, send};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(10);

fn names(table: &Value) -> Vec<String> {
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cells"][0].as_str().unwrap().to_string())
        .collect()
}

fn headers(table: &Value) -> Vec<(String, String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["type"].as_str().unwrap().to_string(),
                c["priority"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn list_and_get_answer_a_table_when_asked() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    let mut labelled = cm("a", &[("k1", "v"), ("k2", "v")]);
    labelled["metadata"]["labels"] = json!({"app": "web"});
    post(&h, &coll, &labelled).await;
    post(&h, &coll, &cm("b", &[])).await;
    post(&h, &coll, &cm("c", &[("k", "v")])).await;

    // Plain clients: byte for byte what they got before (no Accept, JSON).
    let (plain, plain_bytes) = get_accept(&h, &coll, "application/json").await;
    assert_eq!(plain.body["kind"], "ConfigMapList");
    let r = send(&h, "GET", &coll, "application/json", None).await;
    assert_eq!(r.body, plain.body);

    let (r, _) = get_accept(&h, &coll, ACCEPT_TABLE).await;
    assert_eq!(r.status, 200);
    let t = r.body;
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        t["metadata"]["resourceVersion"],
        plain.body["metadata"]["resourceVersion"]
    );
    assert_eq!(
        headers(&t),
        vec![
            ("Name".into(), "string".into(), 0),
            ("Data".into(), "string".into(), 0),
            ("Age".into(), "string".into(), 0),
        ]
    );
    let name_col = &t["columnDefinitions"][0];
    assert_eq!(name_col["format"], "name");
    assert!(
        name_col["description"]
            .as_str()
            .unwrap()
            .starts_with("Name must be unique")
    );
    assert_eq!(names(&t), ["a", "b", "c"]);
    let row = &t["rows"][0];
    assert_eq!(row["cells"][1], 2, "DATA counts the keys");
    let age = row["cells"][2].as_str().unwrap();
    assert!(age.ends_with('s') && age.len() <= 3, "{age}");
    // Default includeObject=Metadata: PartialObjectMetadata with the full metadata.
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        row["object"]["metadata"],
        plain.body["items"][0]["metadata"]
    );
    assert!(row["object"].get("data").is_none());
    assert!(!plain_bytes.is_empty());

    // includeObject=Object: the stored object; None: no object.
    let (r, _) = get_accept(&h, &format!("{coll}?includeObject=Object"), ACCEPT_TABLE).await;
    assert_eq!(r.body["rows"][0]["object"], plain.body["items"][0]);
    let (r, _) = get_accept(&h, &format!("{coll}?includeObject=None"), ACCEPT_TABLE).await;
    assert!(r.body["rows"][0]["object"].is_null());
    let (r, _) = get_accept(&h, &format!("{coll}?includeObject=All"), ACCEPT_TABLE).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["kind"], "Status");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("Unable to convert to Table as requested"),
        "{}",
        r.body
    );

    // Selectors filter rows like they filter items.
    let (r, _) = get_accept(&h, &format!("{coll}?labelSelector=app%3Dweb"), ACCEPT_TABLE).await;
    assert_eq!(names(&r.body), ["a"]);
    let (r, _) = get_accept(
        &h,
        &format!("{coll}?fieldSelector=metadata.name%21%3Da"),
        ACCEPT_TABLE,
    )
    .await;
    assert_eq!(names(&r.body), ["b", "c"]);

    // Paging: limit/continue and remainingItemCount in the Table's metadata.
    let (r, _) = get_accept(&h, &format!("{coll}?limit=2"), ACCEPT_TABLE).await;
    assert_eq!(names(&r.body), ["a", "b"]);
    assert_eq!(r.body["metadata"]["remainingItemCount"], 1);
    let token = r.body["metadata"]["continue"].as_str().unwrap().to_string();
    let (r, _) = get_accept(
        &h,
        &format!("{coll}?limit=2&continue={token}"),
        ACCEPT_TABLE,
    )
    .await;
    assert_eq!(names(&r.body), ["c"]);
    assert!(r.body["metadata"].get("continue").is_none());

    // An empty list is a Table with no rows.
    let (r, _) = get_accept(
        &h,
        &format!("{base}/api/v1/namespaces/kube-system/configmaps"),
        ACCEPT_TABLE,
    )
    .await;
    assert_eq!(r.body["rows"], json!([]));

    // A single object: a Table of one row, at the object's version.
    let (r, _) = get_accept(&h, &format!("{coll}/c"), ACCEPT_TABLE).await;
    assert_eq!(r.body["kind"], "Table");
    assert_eq!(names(&r.body), ["c"]);
    assert_eq!(r.body["rows"][0]["cells"][1], 1);
    let stored = server.get("configmaps", "default", "c").unwrap();
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    let (r, _) = get_accept(&h, &format!("{coll}/missing"), ACCEPT_TABLE).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["kind"], "Status");

    // v1beta1 when that is what the client prefers; other conversions are not served.
    let (r, _) = get_accept(
        &h,
        &coll,
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json",
    )
    .await;
    assert_eq!(r.body["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(
        r.body["rows"][0]["object"]["apiVersion"],
        "meta.k8s.io/v1beta1"
    );
    let (r, bytes) = get_accept(
        &h,
        &coll,
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json",
    )
    .await;
    assert_eq!(r.body["kind"], "ConfigMapList");
    assert_eq!(bytes, plain_bytes);
}

#[tokio::test]
async fn columns_and_cells_per_kind() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let ns = format!("{base}/api/v1/namespaces/default");
    let apps = format!("{base}/apis/apps/v1/namespaces/default");

    post(
        &h,
        &format!("{ns}/secrets"),
        &json!({"metadata": {"name": "s"}, "stringData": {"a": "1", "b": "2"}}),
    )
    .await;
    let (r, _) = get_accept(&h, &format!("{ns}/secrets"), ACCEPT_TABLE).await;
    let h_names: Vec<String> = headers(&r.body).into_iter().map(|c| c.0).collect();
    assert_eq!(h_names, ["Name", "Type", "Data", "Age"]);
    assert_eq!(
        &r.body["rows"][0]["cells"].as_array().unwrap()[..3],
        &[json!("s"), json!("Opaque"), json!(2)]
    );

    post(
        &h,
        &format!("{apps}/deployments"),
        &json!({
            "metadata": {"name": "orders"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "orders"}},
                "template": {
                    "metadata": {"labels": {"app": "orders"}},
                    "spec": {"containers": [
                        {"name": "app", "image": "shop/orders:1"},
                        {"name": "proxy", "image": "envoy:1"},
                    ]},
                },
            },
        }),
    )
    .await;
    let r = send(
        &h,
        "PATCH",
        &format!("{apps}/deployments/orders/status"),
        "application/merge-patch+json",
        Some(&json!({"status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, _) = get_accept(&h, &format!("{apps}/deployments"), ACCEPT_TABLE).await;
    assert_eq!(
        headers(&r.body),
        vec![
            ("Name".into(), "string".into(), 0),
            ("Ready".into(), "string".into(), 0),
            ("Up-to-date".into(), "string".into(), 0),
            ("Available".into(), "string".into(), 0),
            ("Age".into(), "string".into(), 0),
            ("Containers".into(), "string".into(), 1),
            ("Images".into(), "string".into(), 1),
            ("Selector".into(), "string".into(), 1),
        ]
    );
    let cells = r.body["rows"][0]["cells"].as_array().unwrap().clone();
    assert_eq!(
        cells[..4],
        [json!("orders"), json!("2/3"), json!(3), json!(2)]
    );
    assert_eq!(
        cells[5..],
        [
            json!("app,proxy"),
            json!("shop/orders:1,envoy:1"),
            json!("app=orders")
        ]
    );

    post(
        &h,
        &format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases"),
        &json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15}}),
    )
    .await;
    let (r, _) = get_accept(
        &h,
        &format!("{base}/apis/coordination.k8s.io/v1/namespaces/default/leases/leader"),
        ACCEPT_TABLE,
    )
    .await;
    let h_names: Vec<String> = headers(&r.body).into_iter().map(|c| c.0).collect();
    assert_eq!(h_names, ["Name", "Holder", "Age"]);
    assert_eq!(r.body["rows"][0]["cells"][1], "replica-a");

    // core/v1 and events.k8s.io/v1 events print the same columns.
    let earlier = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(25 * 60 + 30);
    let stamp = earlier.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    post(
        &h,
        &format!("{ns}/events"),
        &json!({
            "metadata": {"name": "orders.1"},
            "involvedObject": {"kind": "Deployment", "name": "orders", "namespace": "default"},
            "reason": "Restarted", "message": "restarted for configmap/orders", "type": "Normal",
            "source": {"component": "wasmwatch"},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 2,
        }),
    )
    .await;
    post(
        &h,
        &format!("{base}/apis/events.k8s.io/v1/namespaces/default/events"),
        &json!({
            "metadata": {"name": "cfg.1"},
            "regarding": {"kind": "ConfigMap", "name": "orders", "namespace": "default"},
            "reason": "Reloaded", "note": "3 pods refreshed", "type": "Normal",
            "eventTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string(),
            "reportingController": "wasmwatch.io/host", "reportingInstance": "replica-a",
            "action": "Refresh",
        }),
    )
    .await;
    let (core, _) = get_accept(&h, &format!("{ns}/events"), ACCEPT_TABLE).await;
    let (new, _) = get_accept(
        &h,
        &format!("{base}/apis/events.k8s.io/v1/namespaces/default/events"),
        ACCEPT_TABLE,
    )
    .await;
    let want = vec![
        ("Last Seen".to_string(), "string".to_string(), 0),
        ("Type".into(), "string".into(), 0),
        ("Reason".into(), "string".into(), 0),
        ("Object".into(), "string".into(), 0),
        ("Subobject".into(), "string".into(), 1),
        ("Source".into(), "string".into(), 1),
        ("Message".into(), "string".into(), 0),
        ("First Seen".into(), "string".into(), 1),
        ("Count".into(), "string".into(), 1),
        ("Name".into(), "string".into(), 1),
    ];
    assert_eq!(headers(&core.body), want);
    assert_eq!(headers(&new.body), want);
    assert_eq!(
        core.body["rows"][0]["cells"],
        json!([
            "25m",
            "Normal",
            "Restarted",
            "deployment/orders",
            "",
            "wasmwatch",
            "restarted for configmap/orders",
            "25m",
            2,
            "orders.1"
        ])
    );
    let c = &new.body["rows"][0]["cells"];
    assert_eq!(c[3], "configmap/orders");
    assert_eq!(c[5], "wasmwatch.io/host, replica-a");
    assert_eq!(c[6], "3 pods refreshed");
    assert_eq!(c[8], 1);

    // Namespaces, pods and services have their own printers too.
    let (r, _) = get_accept(
        &h,
        &format!("{base}/api/v1/namespaces/default"),
        ACCEPT_TABLE,
    )
    .await;
    assert_eq!(r.body["rows"][0]["cells"][1], "Active");
    post(
        &h,
        &format!("{ns}/services"),
        &json!({"metadata": {"name": "orders"}, "spec": {"selector": {"app": "orders"},
            "ports": [{"port": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    let (r, _) = get_accept(&h, &format!("{ns}/services/orders"), ACCEPT_TABLE).await;
    let h_names: Vec<String> = headers(&r.body).into_iter().map(|c| c.0).collect();
    assert_eq!(
        h_names,
        [
            "Name",
            "Type",
            "Cluster-IP",
            "External-IP",
            "Port(s)",
            "Age",
            "Selector"
        ]
    );
    let c = &r.body["rows"][0]["cells"];
    assert_eq!(c[1], "ClusterIP");
    assert_eq!(c[3], "<none>");
    assert_eq!(c[4], "8080/TCP");
    assert_eq!(c[6], "app=orders");
    post(
        &h,
        &format!("{ns}/pods"),
        &json!({"metadata": {"name": "orders-0"}, "spec": {"containers": [{"name": "app", "image": "x"}]}}),
    )
    .await;
    let (r, _) = get_accept(&h, &format!("{ns}/pods/orders-0"), ACCEPT_TABLE).await;
    let c = &r.body["rows"][0]["cells"];
    assert_eq!(c[1], "0/1");
    assert_eq!(c[2], "Pending");
    assert_eq!(c[3], "0");
}

#[tokio::test]
async fn watch_sends_table_rows_with_headers_once() {
    let server = common::start().await;
    let h = http();
    let base = server.url();
    let coll = format!("{base}/api/v1/namespaces/default/configmaps");
    post(&h, &coll, &cm("a", &[])).await;
    post(&h, &coll, &cm("b", &[("k", "v")])).await;

    let mut w = Watch::open_accept(&h, &format!("{coll}?watch=true"), ACCEPT_TABLE).await;
    let first = w.next_within(T).await.unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["kind"], "Table");
    assert_eq!(headers(&first["object"]).len(), 3);
    assert_eq!(names(&first["object"]), ["a"]);
    assert_eq!(
        first["object"]["rows"][0]["object"]["kind"],
        "PartialObjectMetadata"
    );
    let second = w.next_within(T).await.unwrap();
    assert!(second["object"]["columnDefinitions"].is_null(), "{second}");
    assert_eq!(names(&second["object"]), ["b"]);
    assert_eq!(second["object"]["rows"][0]["cells"][1], 1);

    let r = send(
        &h,
        "PATCH",
        &format!("{coll}/a"),
        "application/merge-patch+json",
        Some(&json!({"data": {"x": "1", "y": "2"}})),
    )
    .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(
        ev["object"]["rows"][0]["cells"],
        json!(["a", 2, ev["object"]["rows"][0]["cells"][2]])
    );
    assert_eq!(
        ev["object"]["metadata"]["resourceVersion"],
        r.body["metadata"]["resourceVersion"]
    );
    send(&h, "DELETE", &format!("{coll}/b"), "application/json", None).await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "DELETED");
    assert_eq!(names(&ev["object"]), ["b"]);

    // A selector watch with includeObject=Object: the transition to no longer
    // matching is a DELETED row carrying the whole object, in its previous
    // state (the one that matched), as kube-apiserver sends it.
    let mut w = Watch::open_accept(
        &h,
        &format!(
            "{coll}?watch=true&labelSelector=tier%3Dweb&includeObject=Object&resourceVersion={}",
            r.body["metadata"]["resourceVersion"].as_str().unwrap()
        ),
        ACCEPT_TABLE,
    )
    .await;
    let mut labelled = cm("c", &[]);
    labelled["metadata"]["labels"] = json!({"tier": "web"});
    post(&h, &coll, &labelled).await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(
        (ev["type"].as_str(), names(&ev["object"])),
        (Some("ADDED"), vec!["c".to_string()])
    );
    assert_eq!(ev["object"]["rows"][0]["object"]["kind"], "ConfigMap");
    assert_eq!(headers(&ev["object"]).len(), 3, "first event of this watch");
    send(
        &h,
        "PATCH",
        &format!("{coll}/c"),
        "application/merge-patch+json",
        Some(&json!({"metadata": {"labels": {"tier": "db"}}})),
    )
    .await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["type"], "DELETED");
    assert_eq!(
        ev["object"]["rows"][0]["object"]["metadata"]["labels"]["tier"],
        "web"
    );

    // Plain watches are unchanged.
    let mut w = Watch::open(&h, &format!("{coll}?watch=true")).await;
    let ev = w.next_within(T).await.unwrap();
    assert_eq!(ev["object"]["kind"], "ConfigMap");
}
