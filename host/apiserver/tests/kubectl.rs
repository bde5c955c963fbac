//! kubectl (an independent client) against the server, as a subprocess.

mod common;

use common::Kubectl;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const CONFIGMAP: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  labels:
    app: web
data:
  mode: "blue"
"#;

const SECRET: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: app-secret
stringData:
  password: hunter2
"#;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        env:
        - {name: MODE, value: blue}
      - name: sidecar
        image: busybox:1
"#;

#[tokio::test]
async fn kubectl_apply_get_patch_label_annotate_rollout_delete() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };

    // apply (create), then apply a change (strategic patch computed by kubectl).
    let cm = k.file("cm.yaml", CONFIGMAP);
    assert!(
        k.ok(&["apply", "-f", &cm])
            .await
            .contains("configmap/app-config created")
    );
    let cm2 = k.file("cm2.yaml", &CONFIGMAP.replace("blue", "green"));
    assert!(
        k.ok(&["apply", "-f", &cm2])
            .await
            .contains("configmap/app-config configured")
    );
    let yaml = k
        .ok(&["get", "configmap", "app-config", "-o", "yaml"])
        .await;
    let v: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(v["data"]["mode"], "green");
    assert_eq!(v["metadata"]["labels"]["app"], "web");
    assert_eq!(
        server.get("configmaps", "default", "app-config").unwrap()["data"]["mode"],
        "green"
    );

    let secret = k.file("secret.yaml", SECRET);
    k.ok(&["apply", "-f", &secret]).await;
    let s = k.get_json(&["secret", "app-secret"]).await;
    assert_eq!(s["data"]["password"], "aHVudGVyMg==");
    assert_eq!(s["type"], "Opaque");

    let dep = k.file("dep.yaml", DEPLOYMENT);
    assert!(
        k.ok(&["apply", "-f", &dep])
            .await
            .contains("deployment.apps/web created")
    );
    let d = k.get_json(&["deployment", "web"]).await;
    assert_eq!(d["metadata"]["generation"], 1);

    // patch --type merge and strategic (containers merged by name).
    k.ok(&[
        "patch",
        "configmap",
        "app-config",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"extra":"1"}}"#,
    ])
    .await;
    assert_eq!(
        k.get_json(&["cm", "app-config"]).await["data"],
        json!({"mode": "green", "extra": "1"})
    );
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "--type",
        "strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.26"}]}}}}"#,
    ])
    .await;
    let d = k.get_json(&["deploy", "web"]).await;
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 2, "strategic merge kept the sidecar");
    assert_eq!(containers[0]["image"], "nginx:1.26");
    assert_eq!(containers[0]["env"][0]["value"], "blue");
    assert_eq!(d["metadata"]["generation"], 2);

    // label and annotate.
    k.ok(&["label", "configmap", "app-config", "tier=frontend"])
        .await;
    k.ok(&["annotate", "configmap", "app-config", "owner=team-a"])
        .await;
    let v = k.get_json(&["cm", "-l", "tier=frontend"]).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["items"][0]["metadata"]["annotations"]["owner"], "team-a");
    k.ok(&["label", "configmap", "app-config", "tier-"]).await;
    assert!(
        k.get_json(&["cm", "app-config"]).await["metadata"]["labels"]
            .get("tier")
            .is_none()
    );

    // rollout restart: kubectl patches the pod template annotation.
    k.ok(&["rollout", "restart", "deployment/web"]).await;
    let d = server.get("deployments.apps", "default", "web").unwrap();
    assert!(
        d["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
            .is_string(),
        "{d}"
    );
    assert_eq!(d["metadata"]["generation"], 3);

    // A missing object: kube-apiserver's NotFound message.
    let o = k.run(&["get", "configmap", "x"]).await;
    assert_ne!(o.code, 0);
    assert!(
        o.stderr
            .contains(r#"Error from server (NotFound): configmaps "x" not found"#),
        "{}",
        o.stderr
    );
    let o = k.run(&["get", "deployment", "nope"]).await;
    assert!(
        o.stderr
            .contains(r#"Error from server (NotFound): deployments.apps "nope" not found"#),
        "{}",
        o.stderr
    );

    // Invalid names are 422s.
    let bad = k.file("bad.yaml", &CONFIGMAP.replace("app-config", "Bad_Name"));
    let o = k.run(&["apply", "-f", &bad]).await;
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("is invalid"), "{}", o.stderr);

    // delete (kubectl waits for the object to be gone).
    assert!(
        k.ok(&["delete", "configmap", "app-config"])
            .await
            .contains("deleted")
    );
    assert!(server.get("configmaps", "default", "app-config").is_none());
    k.ok(&["delete", "-f", &dep]).await;
    assert!(server.get("deployments.apps", "default", "web").is_none());

    // Discovery-driven listing works across kinds.
    let out = k.ok(&["get", "namespaces", "-o", "name"]).await;
    assert!(out.contains("namespace/kube-system"), "{out}");
    k.ok(&["api-resources"]).await;
}

/// `kubectl scale` goes through the `/scale` subresource (autoscaling/v1
/// Scale, found in discovery); a label selector `in(...)` without a space
/// parses as kube's does.
#[tokio::test]
async fn kubectl_scale_changes_replicas_through_the_scale_subresource() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let dep = k.file("dep.yaml", DEPLOYMENT);
    k.ok(&["apply", "-f", &dep]).await;
    let sts = k.file(
        "sts.yaml",
        &DEPLOYMENT
            .replace("kind: Deployment", "kind: StatefulSet")
            .replace("name: web\nspec", "name: db\nspec"),
    );
    k.ok(&["apply", "-f", &sts]).await;
    let out = k.ok(&["scale", "deployment/web", "--replicas=5"]).await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    let d = server.get("deployments.apps", "default", "web").unwrap();
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["generation"], 2);
    k.ok(&["scale", "statefulset/db", "--replicas=0"]).await;
    let s = server.get("statefulsets.apps", "default", "db").unwrap();
    assert_eq!(s["spec"]["replicas"], 0);
    // A precondition on the current replicas, as kubectl checks it.
    let o = k
        .run(&[
            "scale",
            "deployment/web",
            "--current-replicas=2",
            "--replicas=1",
        ])
        .await;
    assert_ne!(o.code, 0, "{}", o.stdout);
    let scale: Value = serde_json::from_str(
        &k.ok(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/deployments/web/scale",
        ])
        .await,
    )
    .unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 5);
    assert_eq!(scale["status"]["selector"], "app=web");
    // The fixture's metadata has no labels (apps/v1 does not copy the
    // template's): label it, then select it without a blank before `(`.
    k.ok(&["label", "deployment", "web", "app=web"]).await;
    let out = k
        .ok(&["get", "deployments", "-l", "app in(web)", "-o", "name"])
        .await;
    assert_eq!(out.trim(), "deployment.apps/web");
}

#[tokio::test]
async fn kubectl_get_watch_sees_changes() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let client = server.client().unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::default_namespaced(client);
    let patch = |v: &str| json!({"data": {"v": v}});
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "w"}, "data": {"v": "1"}})).unwrap();
    api.create(&Default::default(), &cm).await.unwrap();

    let mut child = k
        .command(&[
            "get",
            "configmap",
            "-w",
            "-o",
            "jsonpath={.metadata.name}={.data.v}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let next = async |lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>| {
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("kubectl printed in time")
            .unwrap()
            .expect("kubectl still running")
    };
    assert_eq!(next(&mut lines).await, "w=1");
    for v in ["2", "3"] {
        api.patch("w", &Default::default(), &kube::api::Patch::Merge(patch(v)))
            .await
            .unwrap();
        assert_eq!(next(&mut lines).await, format!("w={v}"));
    }
    child.kill().await.unwrap();
}

/// The whitespace-separated cells of the line whose first cell is `first`.
fn row<'a>(out: &'a str, first: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{out}"))
}

/// The header line that starts with `first`, squeezed to single spaces.
fn header(out: &str, first: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(first))
        .unwrap_or_else(|| panic!("no header {first:?} in:\n{out}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn objects_to_print() -> String {
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
    format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: orders, labels: {{app: orders}}}}
data: {{greeting: hello, mode: blue}}
---
apiVersion: v1
kind: Secret
metadata: {{name: orders-db}}
stringData: {{password: hunter2}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: orders}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: orders}}}}
  template:
    metadata: {{labels: {{app: orders}}}}
    spec:
      containers:
      - {{name: app, image: "shop/orders:1.4"}}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {{name: wasmwatch-leader}}
spec: {{holderIdentity: replica-a, leaseDurationSeconds: 15}}
---
apiVersion: v1
kind: Event
metadata: {{name: orders.17f3a}}
involvedObject: {{apiVersion: apps/v1, kind: Deployment, name: orders, namespace: default}}
reason: Restarted
message: rolled out a restart for configmap/orders
type: Normal
source: {{component: wasmwatch}}
firstTimestamp: "{now}"
lastTimestamp: "{now}"
count: 1
"#
    )
}

#[tokio::test]
async fn kubectl_get_prints_the_columns_a_cluster_prints() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let file = k.file("objects.yaml", &objects_to_print());
    k.ok(&["apply", "-f", &file]).await;
    k.ok(&[
        "patch",
        "deployment",
        "orders",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"replicas":3,"readyReplicas":2,"updatedReplicas":3,"availableReplicas":2}}"#,
    ])
    .await;

    let out = k.ok(&["get", "events,cm,deploy,lease,secrets"]).await;
    eprintln!("{out}");
    assert_eq!(
        header(&out, "LAST SEEN"),
        "LAST SEEN TYPE REASON OBJECT MESSAGE"
    );
    let ev = out
        .lines()
        .find(|l| l.contains("Restarted"))
        .unwrap_or_else(|| panic!("{out}"));
    let ev: Vec<&str> = ev.split_whitespace().collect();
    assert!(ev[0].ends_with('s'), "LAST SEEN is an age: {ev:?}");
    assert_eq!(
        ev[1..].join(" "),
        "Normal Restarted deployment/orders rolled out a restart for configmap/orders"
    );
    assert_eq!(header(&out, "NAME  "), "NAME DATA AGE");
    assert_eq!(row(&out, "configmap/orders")[1], "2");
    assert_eq!(
        header(&out, "NAME                     READY"),
        "NAME READY UP-TO-DATE AVAILABLE AGE"
    );
    assert_eq!(row(&out, "deployment.apps/orders")[1..4], ["2/3", "3", "2"]);
    assert!(out.contains("HOLDER"), "{out}");
    assert_eq!(
        row(&out, "lease.coordination.k8s.io/wasmwatch-leader")[1],
        "replica-a"
    );
    assert!(
        out.contains("NAME               TYPE     DATA   AGE"),
        "{out}"
    );
    assert_eq!(row(&out, "secret/orders-db")[1..3], ["Opaque", "1"]);

    // Wide adds the priority-1 columns; -A the namespace (from the row's
    // object metadata); --show-labels the labels.
    let out = k.ok(&["get", "deploy", "-o", "wide"]).await;
    assert_eq!(
        header(&out, "NAME"),
        "NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR"
    );
    assert_eq!(
        row(&out, "orders")[5..],
        ["app", "shop/orders:1.4", "app=orders"]
    );
    let out = k.ok(&["get", "events", "-o", "wide"]).await;
    assert_eq!(
        header(&out, "LAST SEEN"),
        "LAST SEEN TYPE REASON OBJECT SUBOBJECT SOURCE MESSAGE FIRST SEEN COUNT NAME"
    );
    assert!(out.contains("wasmwatch"), "{out}");
    let out = k.ok(&["get", "cm", "-A", "--show-labels"]).await;
    assert_eq!(header(&out, "NAMESPACE"), "NAMESPACE NAME DATA AGE LABELS");
    assert_eq!(row(&out, "default")[1..3], ["orders", "2"]);
    assert!(out.contains("app=orders"), "{out}");
    // One object by name, and a label selector.
    let out = k.ok(&["get", "lease", "wasmwatch-leader"]).await;
    assert_eq!(header(&out, "NAME"), "NAME HOLDER AGE");
    let out = k
        .ok(&["get", "cm", "-l", "app=orders", "--no-headers"])
        .await;
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[tokio::test]
async fn kubectl_get_watch_prints_table_rows() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let client = server.client().unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::default_namespaced(client);
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "w"}, "data": {"a": "1"}})).unwrap();
    api.create(&Default::default(), &cm).await.unwrap();

    let mut child = k
        .command(&["get", "configmap", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("kubectl printed in time")
            .unwrap()
            .expect("kubectl still running")
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(next().await, ["NAME", "DATA", "AGE"]);
    assert_eq!(next().await[..2], ["w", "1"]);
    api.patch(
        "w",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"data": {"b": "2"}})),
    )
    .await
    .unwrap();
    assert_eq!(next().await[..2], ["w", "2"]);
    child.kill().await.unwrap();
}
