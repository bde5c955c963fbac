//! Protobuf bodies (`application/vnd.kubernetes.protobuf`): what kubectl's
//! imperative `create` commands send, and protobuf answers for clients that
//! prefer them, checked against k8s-pb's message types.

mod common;

use common::Kubectl;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Value, json};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What kubectl 1.32 sends on `create configmap|secret|namespace`.
const KUBECTL_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

struct Raw {
    status: u16,
    content_type: String,
    body: Bytes,
}

impl Raw {
    fn json(&self) -> Value {
        assert_eq!(self.content_type, "application/json", "{:?}", self.body);
        serde_json::from_slice(&self.body).unwrap()
    }

    /// The `runtime.Unknown` of a protobuf answer.
    fn unknown(&self) -> Unknown {
        assert_eq!(self.content_type, PROTOBUF, "{:?}", self.body);
        let rest = self.body.strip_prefix(b"k8s\0").expect("the k8s magic");
        Unknown::decode(rest).expect("a runtime.Unknown")
    }

    /// The protobuf answer's object, checking its type.
    fn object<T: Message + Default>(&self, api_version: &str, kind: &str) -> T {
        let u = self.unknown();
        assert_eq!(
            u.type_meta,
            Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            })
        );
        T::decode(u.raw.unwrap_or_default().as_slice()).expect("the object message")
    }
}

async fn raw(
    http: &common::Http,
    method: &str,
    url: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> Raw {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", content_type)
        .header("accept", accept)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = http.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Raw {
        status,
        content_type,
        body,
    }
}

/// A protobuf request body: the magic and a `runtime.Unknown` around `msg`.
fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(msg.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut body = b"k8s\0".to_vec();
    body.extend(u.encode_to_vec());
    body
}

/// Check the server-set metadata (uid, resourceVersion, creationTimestamp)
/// and return the object with them replaced by placeholders, for comparing
/// whole objects.
fn normalised(mut obj: Value) -> Value {
    let meta = obj["metadata"].as_object_mut().expect("metadata");
    let uid = meta.remove("uid").expect("uid");
    assert!(uid.as_str().is_some_and(|u| u.len() >= 32), "{uid}");
    let rv = meta.remove("resourceVersion").expect("resourceVersion");
    assert!(rv.as_str().unwrap().parse::<u64>().is_ok(), "{rv}");
    let ts = meta.remove("creationTimestamp").expect("creationTimestamp");
    assert!(
        ts.as_str().unwrap().parse::<jiff::Timestamp>().is_ok(),
        "{ts}"
    );
    obj
}

fn seconds(rfc3339: &Value) -> i64 {
    rfc3339
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_second()
}

#[tokio::test]
async fn kubectl_create_configmap_secret_namespace() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };

    let out = k
        .ok(&[
            "create",
            "configmap",
            "literal",
            "--from-literal=mode=blue",
            "--from-literal=empty=",
            "--from-literal=spaced=a b  c",
        ])
        .await;
    assert_eq!(out.trim(), "configmap/literal created");
    assert_eq!(
        normalised(server.get("configmaps", "default", "literal").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "literal", "namespace": "default"},
            "data": {"mode": "blue", "empty": "", "spaced": "a b  c"},
        })
    );

    // Text files go to data, other bytes to binaryData (base64 in JSON).
    let text = k.file("app.properties", b"a=1\nb=\xc3\xa9\n");
    let blob = k.file("blob.bin", &[0, 1, 2, 0xff, 0xfe, 0x80]);
    let out = k
        .ok(&[
            "create",
            "configmap",
            "files",
            "-n",
            "kube-public",
            &format!("--from-file={text}"),
            &format!("--from-file=renamed.bin={blob}"),
        ])
        .await;
    assert_eq!(out.trim(), "configmap/files created");
    assert_eq!(
        normalised(server.get("configmaps", "kube-public", "files").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "files", "namespace": "kube-public"},
            "data": {"app.properties": "a=1\nb=é\n"},
            "binaryData": {"renamed.bin": "AAEC//6A"},
        })
    );

    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=user=admin",
            "--from-literal=password=p@ss w0rd",
        ])
        .await;
    assert_eq!(out.trim(), "secret/creds created");
    assert_eq!(
        normalised(server.get("secrets", "default", "creds").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default"},
            "data": {"user": "YWRtaW4=", "password": "cEBzcyB3MHJk"},
            "type": "Opaque",
        })
    );
    let cert = k.file("tls.bin", &[0x30, 0x82, 0x00, 0xff]);
    k.ok(&[
        "create",
        "secret",
        "generic",
        "typed",
        "--type=example.com/custom",
        &format!("--from-file=cert={cert}"),
    ])
    .await;
    assert_eq!(
        normalised(server.get("secrets", "default", "typed").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "typed", "namespace": "default"},
            "data": {"cert": "MIIA/w=="},
            "type": "example.com/custom",
        })
    );

    let out = k.ok(&["create", "namespace", "team-a"]).await;
    assert_eq!(out.trim(), "namespace/team-a created");
    assert_eq!(
        normalised(server.get("namespaces", "", "team-a").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": "team-a",
                "labels": {"kubernetes.io/metadata.name": "team-a"},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        })
    );
    // The new namespace is usable, by protobuf creates too.
    k.ok(&["create", "configmap", "in-team", "-n", "team-a"])
        .await;
    assert_eq!(
        normalised(server.get("configmaps", "team-a", "in-team").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "in-team", "namespace": "team-a"},
        })
    );

    // kubectl decodes the protobuf answer and prints it: the same object.
    for (args, resource, ns, name) in [
        (
            &["create", "configmap", "printed", "--from-literal=k=v"][..],
            "configmaps",
            "default",
            "printed",
        ),
        (
            &[
                "create",
                "secret",
                "generic",
                "printed",
                "--from-literal=k=v",
            ][..],
            "secrets",
            "default",
            "printed",
        ),
        (
            &["create", "namespace", "printed"][..],
            "namespaces",
            "",
            "printed",
        ),
    ] {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let printed: Value = serde_json::from_str(&k.ok(&args).await).unwrap();
        assert_eq!(printed, server.get(resource, ns, name).unwrap(), "{args:?}");
    }

    // Every create was answered 201; a create that conflicts is a 409.
    let creates: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == "create")
        .collect();
    assert_eq!(creates.len(), 9);
    assert!(creates.iter().all(|r| r.code == 201), "{creates:?}");
}

#[tokio::test]
async fn protobuf_answers_round_trip_through_k8s_pb() {
    let server = common::start().await;
    let http = common::http();
    let url = server.url();

    // A protobuf create with every ObjectMeta field a client may set.
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("app".to_string(), "web".to_string());
    let mut annotations = std::collections::BTreeMap::new();
    annotations.insert("note".to_string(), "x: y".to_string());
    annotations.insert("empty".to_string(), String::new());
    let cm = core::ConfigMap {
        metadata: Some(meta::ObjectMeta {
            generate_name: Some("gen-".into()),
            labels,
            annotations,
            owner_references: vec![meta::OwnerReference {
                api_version: Some("apps/v1".into()),
                kind: Some("Deployment".into()),
                name: Some("web".into()),
                uid: Some("0b4b9e8a-4c2f-4a57-8a43-1b3c5d7e9f00".into()),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }],
            finalizers: vec!["example.com/keep".into()],
            // Go clients send these empty; they mean "unset".
            name: Some(String::new()),
            namespace: Some(String::new()),
            uid: Some(String::new()),
            resource_version: Some(String::new()),
            generation: Some(0),
            creation_timestamp: Some(meta::Time::default()),
            ..Default::default()
        }),
        immutable: Some(true),
        data: [("k".to_string(), "v".to_string())].into(),
        binary_data: [("b".to_string(), vec![0u8, 255])].into(),
    };
    let r = raw(
        &http,
        "POST",
        &format!("{url}/api/v1/namespaces/default/configmaps"),
        PROTOBUF,
        KUBECTL_ACCEPT,
        envelope("v1", "ConfigMap", &cm),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let created: core::ConfigMap = r.object("v1", "ConfigMap");
    let m = created.metadata.clone().unwrap();
    let name = m.name.clone().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let stored = server.get("configmaps", "default", &name).unwrap();
    assert_eq!(
        normalised(stored.clone()),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "generateName": "gen-",
                "namespace": "default",
                "labels": {"app": "web"},
                "annotations": {"note": "x: y", "empty": ""},
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "web",
                    "uid": "0b4b9e8a-4c2f-4a57-8a43-1b3c5d7e9f00",
                    "controller": true,
                    "blockOwnerDeletion": false,
                }],
                "finalizers": ["example.com/keep"],
            },
            "immutable": true,
            "data": {"k": "v"},
            "binaryData": {"b": "AP8="},
        })
    );
    // The answer is the stored object, field for field.
    assert_eq!(m.uid.as_deref(), stored["metadata"]["uid"].as_str());
    assert_eq!(
        m.resource_version.as_deref(),
        stored["metadata"]["resourceVersion"].as_str()
    );
    let ts = m.creation_timestamp.unwrap();
    assert_eq!(
        ts.seconds,
        Some(seconds(&stored["metadata"]["creationTimestamp"]))
    );
    assert_eq!(ts.nanos.unwrap_or(0), 0);
    assert_eq!(m.generate_name.as_deref(), Some("gen-"));
    assert_eq!(m.namespace.as_deref(), Some("default"));
    assert_eq!(m.labels, cm.metadata.as_ref().unwrap().labels);
    assert_eq!(m.annotations, cm.metadata.as_ref().unwrap().annotations);
    assert_eq!(
        m.owner_references,
        cm.metadata.as_ref().unwrap().owner_references
    );
    assert_eq!(m.finalizers, vec!["example.com/keep".to_string()]);
    assert_eq!(
        (created.immutable, &created.data, &created.binary_data),
        (Some(true), &cm.data, &cm.binary_data)
    );

    // A GET asking for protobuf answers the same message.
    let obj_url = format!("{url}/api/v1/namespaces/default/configmaps/{name}");
    let r = raw(&http, "GET", &obj_url, "", KUBECTL_ACCEPT, vec![]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.object::<core::ConfigMap>("v1", "ConfigMap"), created);
    // kube-apiserver's envelope: empty contentEncoding/contentType.
    let u = r.unknown();
    assert_eq!(
        (u.content_encoding.as_deref(), u.content_type.as_deref()),
        (Some(""), Some(""))
    );
    // JSON first, JSON only, no Accept, */*: JSON.
    for accept in [
        "application/json, application/vnd.kubernetes.protobuf",
        "application/json",
        "*/*",
        "",
    ] {
        let r = raw(&http, "GET", &obj_url, "", accept, vec![]).await;
        assert_eq!(r.json(), stored, "{accept}");
    }
    // A Table request stays JSON even when protobuf is listed first.
    let r = raw(
        &http,
        "GET",
        &obj_url,
        "",
        "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        vec![],
    )
    .await;
    assert_eq!(r.json()["kind"], "Table");

    // Secret: stringData merged into data, bytes both ways.
    let secret = core::Secret {
        metadata: Some(meta::ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        }),
        data: [("bin".to_string(), vec![0u8, 1, 0xff])].into(),
        string_data: [("user".to_string(), "admin".to_string())].into(),
        r#type: Some("kubernetes.io/basic-auth".into()),
        immutable: None,
    };
    let r = raw(
        &http,
        "POST",
        &format!("{url}/api/v1/namespaces/default/secrets"),
        PROTOBUF,
        "application/json",
        envelope("v1", "Secret", &secret),
    )
    .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json(), server.get("secrets", "default", "s").unwrap());
    assert_eq!(
        normalised(server.get("secrets", "default", "s").unwrap()),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "default"},
            "data": {"bin": "AAH/", "user": "YWRtaW4="},
            "type": "kubernetes.io/basic-auth",
        })
    );
    let r = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces/default/secrets/s"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    let got: core::Secret = r.object("v1", "Secret");
    assert_eq!(
        got.data,
        [
            ("bin".to_string(), vec![0u8, 1, 0xff]),
            ("user".to_string(), b"admin".to_vec())
        ]
        .into()
    );
    assert!(got.string_data.is_empty());
    assert_eq!(got.r#type.as_deref(), Some("kubernetes.io/basic-auth"));

    // Namespace and lists.
    let r = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces/default"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    let ns: core::Namespace = r.object("v1", "Namespace");
    assert_eq!(ns.metadata.unwrap().name.as_deref(), Some("default"));
    assert_eq!(ns.spec.unwrap().finalizers, vec!["kubernetes".to_string()]);
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));

    let r = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces/default/configmaps"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    let list: core::ConfigMapList = r.object("v1", "ConfigMapList");
    assert_eq!(list.items, vec![created.clone()]);
    let json_list = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces/default/configmaps"),
        "",
        "application/json",
        vec![],
    )
    .await
    .json();
    assert_eq!(
        list.metadata.unwrap().resource_version.as_deref(),
        json_list["metadata"]["resourceVersion"].as_str()
    );
    let r = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    let names: Vec<_> = r
        .object::<core::NamespaceList>("v1", "NamespaceList")
        .items
        .into_iter()
        .map(|n| n.metadata.unwrap().name.unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );

    // A delete answering a Status: protobuf too.
    let r = raw(
        &http,
        "DELETE",
        &format!("{url}/api/v1/namespaces/default/secrets/s"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    assert_eq!(r.status, 200);
    let st: meta::Status = r.object("v1", "Status");
    assert_eq!(st.status.as_deref(), Some("Success"));
    assert_eq!(st.details.unwrap().name.as_deref(), Some("s"));

    // Kinds not converted are answered as JSON, whatever the client prefers.
    let dep = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    });
    let r = raw(
        &http,
        "POST",
        &format!("{url}/apis/apps/v1/namespaces/default/deployments"),
        "application/json",
        KUBECTL_ACCEPT,
        serde_json::to_vec(&dep).unwrap(),
    )
    .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["spec"]["replicas"], 1);
    // A converted kind with a field the conversion does not know: JSON.
    let odd = json!({"metadata": {"name": "odd"}, "data": {"a": "b"}, "extra": {"kept": true}});
    let r = common::post(
        &http,
        &format!("{url}/api/v1/namespaces/default/configmaps"),
        &odd,
    )
    .await;
    assert_eq!(r.status, 201);
    let r = raw(
        &http,
        "GET",
        &format!("{url}/api/v1/namespaces/default/configmaps/odd"),
        "",
        KUBECTL_ACCEPT,
        vec![],
    )
    .await;
    assert_eq!(r.json()["extra"], json!({"kept": true}));
}

#[tokio::test]
async fn protobuf_body_of_an_unconverted_kind_is_415_naming_it() {
    let server = common::start().await;
    let http = common::http();
    let dep = apps::Deployment {
        metadata: Some(meta::ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = raw(
        &http,
        "POST",
        &format!(
            "{}/apis/apps/v1/namespaces/default/deployments",
            server.url()
        ),
        PROTOBUF,
        KUBECTL_ACCEPT,
        envelope("apps/v1", "Deployment", &dep),
    )
    .await;
    assert_eq!(r.status, 415);
    let st = r.json();
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["reason"], "UnsupportedMediaType");
    assert_eq!(st["code"], 415);
    let msg = st["message"].as_str().unwrap();
    assert!(
        msg.contains("Deployment") && msg.contains("apps/v1") && msg.contains("JSON"),
        "{msg}"
    );
    assert!(server.get("deployments.apps", "default", "web").is_none());
}

#[tokio::test]
async fn garbage_protobuf_body_is_400() {
    let server = common::start().await;
    let http = common::http();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let not_a_configmap = {
        let mut b = b"k8s\0".to_vec();
        b.extend(
            Unknown {
                type_meta: Some(TypeMeta {
                    api_version: Some("v1".into()),
                    kind: Some("ConfigMap".into()),
                }),
                raw: Some(vec![0x0a, 0xff, 0xff]),
                content_encoding: None,
                content_type: None,
            }
            .encode_to_vec(),
        );
        b
    };
    let no_kind = {
        let mut b = b"k8s\0".to_vec();
        b.extend(Unknown::default().encode_to_vec());
        b
    };
    for body in [
        b"this is not protobuf".to_vec(),
        b"{\"metadata\":{\"name\":\"x\"}}".to_vec(),
        b"k8s\0\xff\xff\xff\xff".to_vec(),
        not_a_configmap,
        no_kind,
    ] {
        let r = raw(&http, "POST", &url, PROTOBUF, KUBECTL_ACCEPT, body.clone()).await;
        assert_eq!(r.status, 400, "{body:?}: {:?}", r.body);
        let st = r.json();
        assert_eq!(st["reason"], "BadRequest", "{st}");
    }
    assert_eq!(server.snapshot("configmaps").unwrap().0.len(), 0);
}
