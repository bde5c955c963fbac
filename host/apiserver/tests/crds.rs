//! CustomResourceDefinitions: a custom resource is served only while its CRD
//! exists, as on kube-apiserver.

mod common;

use std::time::Duration;

use common::{Kubectl, Watch, get, http, post, start_with};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use wasmwatch_apiserver::Config;

/// Argo Rollouts' CRD, trimmed the way a project's install YAML looks.
const ROLLOUT_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: rollouts.argoproj.io
  labels:
    app.kubernetes.io/name: argo-rollouts
spec:
  group: argoproj.io
  names:
    kind: Rollout
    listKind: RolloutList
    plural: rollouts
    shortNames:
    - ro
    singular: rollout
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    additionalPrinterColumns:
    - name: Desired
      type: integer
      jsonPath: .spec.replicas
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.HPAReplicas
"#;

const ROLLOUT: &str = r#"
apiVersion: argoproj.io/v1alpha1
kind: Rollout
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
"#;

fn group_names(apis: &Value) -> Vec<String> {
    apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap().to_string())
        .collect()
}

/// Without preinstalled CRDs, Rollouts are an unknown path until
/// `kubectl apply` creates their CRD; deleting the CRD deletes the Rollouts
/// (a watch sees them go, then ends) and they are unknown again.
#[tokio::test]
async fn custom_resources_are_served_only_while_their_crd_exists() {
    let server = start_with(Config::default().preinstalled_crds(false)).await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let h = http();
    let base = server.url();
    let gv = format!("{base}/apis/argoproj.io/v1alpha1");
    let coll = format!("{gv}/namespaces/default/rollouts");

    // Not served: exactly an unknown path (kube-apiserver's plain-text 404
    // outside the built-in groups).
    let unknown = get(&h, &format!("{base}/apis/nothing.example.com/v1")).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.body, "404 page not found\n");
    assert_eq!(unknown.headers["content-type"], "text/plain; charset=utf-8");
    for url in [
        gv.clone(),
        format!("{base}/apis/argoproj.io"),
        format!("{coll}/web"),
        coll.clone(),
        format!("{gv}/rollouts"),
        format!("{coll}?watch=true"),
    ] {
        let r = get(&h, &url).await;
        assert_eq!(r.status, 404, "{url}: {}", r.body);
        assert_eq!(r.body, unknown.body, "{url}");
    }
    let r = post(&h, &coll, &serde_yaml::from_str(ROLLOUT).unwrap()).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let apis = get(&h, &format!("{base}/apis")).await.body;
    let groups = group_names(&apis);
    assert!(!groups.contains(&"argoproj.io".to_string()), "{groups:?}");
    assert!(groups.contains(&"apiextensions.k8s.io".to_string()));
    let openapi = get(&h, &format!("{base}/openapi/v3")).await.body;
    assert!(openapi["paths"].get("apis/argoproj.io/v1alpha1").is_none());
    let o = k.run(&["get", "rollouts"]).await;
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(
        o.stderr
            .contains("the server doesn't have a resource type \"rollouts\""),
        "{}",
        o.stderr
    );
    assert!(k.ok(&["get", "crd"]).await.is_empty());

    // kubectl creates the CRD: established at once, Rollouts served.
    let crd = k.file("crd.yaml", ROLLOUT_CRD);
    let out = k.ok(&["apply", "-f", &crd]).await;
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/rollouts.argoproj.io created"),
        "{out}"
    );
    let out = k.ok(&["apply", "-f", &crd]).await;
    assert!(out.contains("unchanged"), "{out}");
    let stored = k.get_json(&["crd", "rollouts.argoproj.io"]).await;
    let conditions = stored["status"]["conditions"].as_array().unwrap();
    for ty in ["Established", "NamesAccepted"] {
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == ty && c["status"] == "True"),
            "{ty}: {conditions:?}"
        );
    }
    assert_eq!(
        stored["status"]["acceptedNames"]["shortNames"],
        json!(["ro"])
    );
    assert_eq!(stored["status"]["acceptedNames"]["kind"], "Rollout");
    assert_eq!(stored["status"]["storedVersions"], json!(["v1alpha1"]));
    let r = get(&h, &gv).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "rollouts" && r["kind"] == "Rollout")
    );
    let apis = get(&h, &format!("{base}/apis")).await.body;
    assert!(group_names(&apis).contains(&"argoproj.io".to_string()));
    assert_eq!(
        get(&h, &format!("{base}/apis/argoproj.io")).await.status,
        200
    );
    let openapi = get(&h, &format!("{base}/openapi/v3")).await.body;
    assert!(openapi["paths"].get("apis/argoproj.io/v1alpha1").is_some());
    // Still only the Rollouts: CloneSets have no CRD.
    assert_eq!(
        get(&h, &format!("{base}/apis/apps.kruise.io/v1alpha1"))
            .await
            .status,
        404
    );

    let rollout = k.file("rollout.yaml", ROLLOUT);
    let out = k.ok(&["apply", "-f", &rollout]).await;
    assert!(out.contains("rollout.argoproj.io/web created"), "{out}");
    let got = k.get_json(&["rollout", "web"]).await;
    assert_eq!(got["spec"]["replicas"], 2);
    assert!(k.ok(&["get", "ro"]).await.contains("web"));
    let list = get(&h, &coll).await;
    assert_eq!(list.status, 200);
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // Deleting the CRD: the Rollout goes first (a watch opened before sees
    // it), then the CRD; the watch ends and the path is unknown again.
    let mut watch = Watch::open(&h, &format!("{coll}?watch=true&resourceVersion={rv}")).await;
    let mut crd_watch = Watch::open(
        &h,
        &format!("{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions?watch=true&resourceVersion={rv}"),
    )
    .await;
    let out = k.ok(&["delete", "crd", "rollouts.argoproj.io"]).await;
    assert!(out.contains("deleted"), "{out}");
    let ev = watch.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(ev["type"], "DELETED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["name"], "web");
    let rollout_rv: u64 = ev["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rollout_rv > rv.parse().unwrap());
    assert!(
        watch.next_within(Duration::from_secs(5)).await.is_none(),
        "the watch ends when its resource is no longer served"
    );
    let ev = crd_watch.next_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(ev["type"], "DELETED", "{ev}");
    assert_eq!(ev["object"]["metadata"]["name"], "rollouts.argoproj.io");
    let crd_rv: u64 = ev["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(crd_rv > rollout_rv);

    for url in [gv.clone(), format!("{coll}/web"), coll.clone()] {
        let r = get(&h, &url).await;
        assert_eq!(r.status, 404, "{url}: {}", r.body);
        assert_eq!(r.body, unknown.body, "{url}");
    }
    let apis = get(&h, &format!("{base}/apis")).await.body;
    assert!(!group_names(&apis).contains(&"argoproj.io".to_string()));
    assert!(k.ok(&["get", "crd"]).await.is_empty());

    // Created again, the resource is back and empty.
    k.ok(&["apply", "-f", &crd]).await;
    let list = get(&h, &coll).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["items"], json!([]));
}

fn crd(name: &str, group: &str, plural: &str, kind: &str, scope: &str, version: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": name },
        "spec": {
            "group": group,
            "names": { "plural": plural, "kind": kind },
            "scope": scope,
            "versions": [{
                "name": version, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object" } },
            }],
        },
    })
}

/// A CRD for a type the server cannot serve, or one not named
/// `<plural>.<group>`, is 422 Invalid saying why.
#[tokio::test]
async fn crds_for_unknown_types_or_with_wrong_names_are_invalid() {
    let server = start_with(Config::default().preinstalled_crds(false)).await;
    let h = http();
    let crds = format!(
        "{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        server.url()
    );
    let invalid = async |body: Value, field: &str, words: &[&str]| {
        let r = post(&h, &crds, &body).await;
        assert_eq!(r.status, 422, "{}", r.body);
        assert_eq!(r.body["reason"], "Invalid");
        assert_eq!(r.body["details"]["kind"], "CustomResourceDefinition");
        assert_eq!(r.body["details"]["group"], "apiextensions.k8s.io");
        assert_eq!(r.body["details"]["causes"][0]["field"], field, "{}", r.body);
        let message = r.body["message"].as_str().unwrap();
        assert!(
            message.starts_with("CustomResourceDefinition.apiextensions.k8s.io"),
            "{message}"
        );
        for w in words {
            assert!(message.contains(w), "{w:?} not in {message}");
        }
    };

    // A type the server does not know: the message names what it can serve.
    invalid(
        crd(
            "widgets.example.com",
            "example.com",
            "widgets",
            "Widget",
            "Namespaced",
            "v1",
        ),
        "spec",
        &[
            "widgets.example.com/v1",
            "rollouts.argoproj.io/v1alpha1",
            "clonesets.apps.kruise.io/v1alpha1",
            "secretproviderclasses.secrets-store.csi.x-k8s.io/v1",
            "secretproviderclasspodstatuses.secrets-store.csi.x-k8s.io/v1",
        ],
    )
    .await;
    // A known type at a version the server does not serve.
    invalid(
        crd(
            "rollouts.argoproj.io",
            "argoproj.io",
            "rollouts",
            "Rollout",
            "Namespaced",
            "v2",
        ),
        "spec",
        &["rollouts.argoproj.io/v2", "rollouts.argoproj.io/v1alpha1"],
    )
    .await;
    // The wrong kind or scope for a known type.
    invalid(
        crd(
            "rollouts.argoproj.io",
            "argoproj.io",
            "rollouts",
            "Rollin",
            "Namespaced",
            "v1alpha1",
        ),
        "spec.names.kind",
        &["\"Rollin\"", "\"Rollout\""],
    )
    .await;
    invalid(
        crd(
            "rollouts.argoproj.io",
            "argoproj.io",
            "rollouts",
            "Rollout",
            "Cluster",
            "v1alpha1",
        ),
        "spec.scope",
        &["\"Cluster\"", "\"Namespaced\""],
    )
    .await;
    // kube-apiserver's name rule, and its own checks.
    invalid(
        crd(
            "rollouts",
            "argoproj.io",
            "rollouts",
            "Rollout",
            "Namespaced",
            "v1alpha1",
        ),
        "metadata.name",
        &[r#"metadata.name: Invalid value: "rollouts": must be spec.names.plural+"."+spec.group"#],
    )
    .await;
    invalid(
        crd(
            "x.argoproj.io",
            "argoproj.io",
            "rollouts",
            "Rollout",
            "Sideways",
            "v1alpha1",
        ),
        "spec.scope",
        &[r#"Unsupported value: "Sideways": supported values: "Cluster", "Namespaced""#],
    )
    .await;
    let mut no_schema = crd(
        "rollouts.argoproj.io",
        "argoproj.io",
        "rollouts",
        "Rollout",
        "Namespaced",
        "v1alpha1",
    );
    no_schema["spec"]["versions"][0]
        .as_object_mut()
        .unwrap()
        .remove("schema");
    invalid(
        no_schema,
        "spec.versions[0].schema.openAPIV3Schema",
        &["schemas are required"],
    )
    .await;

    // Nothing was stored and nothing is served.
    let r = get(&h, &crds).await;
    assert_eq!(r.body["items"], json!([]));
    let r = get(&h, &format!("{}/apis/argoproj.io/v1alpha1", server.url())).await;
    assert_eq!(r.status, 404);

    // The well-formed one is accepted, with defaults and status.
    let ok = crd(
        "rollouts.argoproj.io",
        "argoproj.io",
        "rollouts",
        "Rollout",
        "Namespaced",
        "v1alpha1",
    );
    let r = post(&h, &crds, &ok).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["spec"]["names"]["singular"], "rollout");
    assert_eq!(r.body["spec"]["names"]["listKind"], "RolloutList");
    assert_eq!(r.body["status"]["acceptedNames"], r.body["spec"]["names"]);
    assert_eq!(r.body["metadata"]["generation"], 1);
    let r = post(&h, &crds, &ok).await;
    assert_eq!(r.status, 409, "{}", r.body);
}

/// By default every custom type's CRD exists from the start, well-formed
/// (kube-rs decodes them) and listed by `kubectl get crd`.
#[tokio::test]
async fn crds_are_preinstalled_by_default() {
    let server = start_with(Config::default()).await;
    let client = server.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let list = crds.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = list
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "clonesets.apps.kruise.io",
            "rollouts.argoproj.io",
            "secretproviderclasses.secrets-store.csi.x-k8s.io",
            "secretproviderclasspodstatuses.secrets-store.csi.x-k8s.io",
        ]
    );
    for c in &list.items {
        let established = c
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        assert!(established, "{c:?}");
        assert_eq!(c.spec.versions.len(), 1);
        let v = &c.spec.versions[0];
        assert!(v.served && v.storage);
        assert_eq!(
            v.schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| s.x_kubernetes_preserve_unknown_fields),
            Some(true)
        );
    }
    let ro = list
        .items
        .iter()
        .find(|c| c.spec.group == "argoproj.io")
        .unwrap();
    assert_eq!(ro.spec.scope, "Namespaced");
    assert_eq!(ro.spec.names.short_names, Some(vec!["ro".to_string()]));
    assert!(
        ro.spec.versions[0]
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some())
    );
    let podstatus = list
        .items
        .iter()
        .find(|c| c.spec.names.kind == "SecretProviderClassPodStatus")
        .unwrap();
    assert!(podstatus.spec.versions[0].subresources.is_none());

    // Every custom group is served.
    let h = http();
    for gv in [
        "argoproj.io/v1alpha1",
        "apps.kruise.io/v1alpha1",
        "secrets-store.csi.x-k8s.io/v1",
    ] {
        let r = get(&h, &format!("{}/apis/{gv}", server.url())).await;
        assert_eq!(r.status, 200, "{gv}");
    }

    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let out = k.ok(&["get", "crd"]).await;
    assert!(out.starts_with("NAME"), "{out}");
    for n in &names {
        assert!(out.contains(n.as_str()), "{n}: {out}");
    }
    // The Secrets Store types are served, with their status a plain field.
    let spcps = k.file(
        "spcps.yaml",
        r#"
apiVersion: secrets-store.csi.x-k8s.io/v1
kind: SecretProviderClassPodStatus
metadata:
  name: web-0-default-vault
status:
  podName: web-0
  secretProviderClassName: vault
  mounted: true
"#,
    );
    k.ok(&["apply", "-f", &spcps]).await;
    let got = k
        .get_json(&["secretproviderclasspodstatus", "web-0-default-vault"])
        .await;
    assert_eq!(got["status"]["mounted"], true);
    assert!(got["metadata"].get("generation").is_none());
}

/// A CRD held by a finalizer stays (its resource served) until the
/// finalizer is removed; then its objects go with it.
#[tokio::test]
async fn a_crd_held_by_a_finalizer_goes_with_its_objects_when_released() {
    let server = start_with(Config::default()).await;
    let h = http();
    let base = server.url();
    let crd = format!(
        "{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clonesets.apps.kruise.io"
    );
    let coll = format!("{base}/apis/apps.kruise.io/v1alpha1/namespaces/default/clonesets");
    let r = post(
        &h,
        &coll,
        &json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                "metadata": {"name": "c"}, "spec": {"replicas": 1}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let merge = async |url: &str, patch: Value| {
        common::send(
            &h,
            "PATCH",
            url,
            "application/merge-patch+json",
            Some(&patch),
        )
        .await
    };
    let r = merge(
        &crd,
        json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = common::delete(&h, &crd).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body["metadata"]["deletionTimestamp"].is_string(),
        "{}",
        r.body
    );
    assert_eq!(get(&h, &format!("{coll}/c")).await.status, 200);

    let r = merge(&crd, json!({"metadata": {"finalizers": null}})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(&h, &crd).await.status, 404);
    assert_eq!(get(&h, &format!("{coll}/c")).await.status, 404);
    assert!(
        server
            .get("clonesets.apps.kruise.io", "default", "c")
            .is_none()
    );
    // The other custom resources are still served.
    let r = get(
        &h,
        &format!("{base}/apis/argoproj.io/v1alpha1/namespaces/default/rollouts"),
    )
    .await;
    assert_eq!(r.status, 200);
}
