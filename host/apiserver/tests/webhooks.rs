//! Mutating admission webhooks: real HTTPS webhooks (hyper + tokio-rustls,
//! certificates from an rcgen CA) called by the server on creates and
//! updates, as kube-apiserver calls them.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use common::{Http, Kubectl, Resp};
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use wasmwatch_apiserver::ServerHandle;

// --- a webhook server --------------------------------------------------------

/// A CA (its PEM, and the issuer to sign leaves with).
struct Ca {
    pem: String,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca {
            pem: issuer.pem(),
            issuer,
        }
    }

    /// `clientConfig.caBundle`: the PEM, base64.
    fn bundle(&self) -> String {
        B64.encode(&self.pem)
    }

    /// A TLS server configuration for 127.0.0.1 and localhost signed by this CA.
    fn server_config(&self) -> rustls::ServerConfig {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

/// What the webhook answers one AdmissionReview with.
enum Answer {
    /// `response` (its `uid` is filled in unless it has one).
    Response(Value),
    /// A raw HTTP answer.
    Raw(u16, &'static str),
}

type Handler = Arc<dyn Fn(Value) -> BoxFuture<'static, Answer> + Send + Sync>;

fn handler<F>(f: F) -> Handler
where
    F: Fn(&Value) -> Answer + Send + Sync + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |review| {
        let f = f.clone();
        Box::pin(async move { f(&review) })
    })
}

/// A running HTTPS webhook: every AdmissionReview it received.
struct Hook {
    ca: Ca,
    port: u16,
    reviews: Arc<Mutex<Vec<Value>>>,
}

impl Hook {
    async fn start(answer: Handler) -> Hook {
        let ca = Ca::new("webhook test CA");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(ca.server_config()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let reviews: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = reviews.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, answer, seen) = (acceptor.clone(), answer.clone(), seen.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (answer, seen) = (answer.clone(), seen.clone());
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let review: Value = serde_json::from_slice(&body).unwrap();
                            seen.lock().unwrap().push(review.clone());
                            let (code, out) = match answer(review.clone()).await {
                                Answer::Response(mut r) => {
                                    if r.get("uid").is_none() {
                                        r["uid"] = review["request"]["uid"].clone();
                                    }
                                    let out = json!({
                                        "apiVersion": review["apiVersion"],
                                        "kind": "AdmissionReview",
                                        "response": r,
                                    });
                                    (200, out.to_string())
                                }
                                Answer::Raw(code, body) => (code, body.to_string()),
                            };
                            let mut resp = hyper::Response::new(Full::new(Bytes::from(out)));
                            *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Hook { ca, port, reviews }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/mutate", self.port)
    }

    fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().unwrap().clone()
    }
}

fn allow() -> Answer {
    Answer::Response(json!({ "allowed": true }))
}

fn json_patch(ops: Value) -> Answer {
    Answer::Response(json!({
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": B64.encode(ops.to_string()),
    }))
}

/// A JSON Pointer token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The operation that sets `key` in the map at `map` (a JSON Pointer) of
/// `obj`, creating the map if it is missing.
fn set_in_map(obj: &Value, map: &str, key: &str, value: Value) -> Value {
    if obj.pointer(map).is_some_and(Value::is_object) {
        json!({"op": "add", "path": format!("{map}/{}", escape(key)), "value": value})
    } else {
        json!({"op": "add", "path": map, "value": {key: value}})
    }
}

// --- configurations ------------------------------------------------------------

const MWC_PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";

/// One webhook of a configuration: `rules` on `resources` of `group`,
/// calling `url` trusted through `ca_bundle`; `extra` is merged in.
fn webhook(name: &str, url: &str, ca_bundle: &str, rule: Value, extra: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "clientConfig": { "url": url, "caBundle": ca_bundle },
        "rules": [rule],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        hook[k] = v.clone();
    }
    hook
}

fn rule(operations: &[&str], group: &str, resources: &[&str]) -> Value {
    json!({
        "operations": operations,
        "apiGroups": [group],
        "apiVersions": ["v1"],
        "resources": resources,
    })
}

fn configuration(name: &str, hooks: Vec<Value>) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": { "name": name },
        "webhooks": hooks,
    })
}

async fn install(http: &Http, server: &ServerHandle, config: Value) {
    let r = common::post(http, &format!("{}{MWC_PATH}", server.url()), &config).await;
    assert_eq!(r.status, 201, "{}", r.body);
}

async fn send(http: &Http, method: &str, url: &str, content_type: &str, body: &Value) -> Resp {
    common::send(http, method, url, content_type, Some(body)).await
}

fn configmap(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "labels": labels },
        "data": { "k": "v" },
    })
}

async fn namespace(http: &Http, server: &ServerHandle, name: &str, labels: Value) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    let r = common::post(http, &format!("{}/api/v1/namespaces", server.url()), &ns).await;
    assert_eq!(r.status, 201, "{}", r.body);
}

fn outcomes(server: &ServerHandle) -> Vec<(String, String, String)> {
    server
        .webhook_calls()
        .into_iter()
        .map(|c| (c.webhook, c.name, c.outcome))
        .collect()
}

fn triple(webhook: &str, name: &str, outcome: &str) -> (String, String, String) {
    (webhook.into(), name.into(), outcome.into())
}

// --- the tests ---------------------------------------------------------------

const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

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
"#;

/// The use case: a restart records an annotation on the pod template; a
/// GitOps tool re-applying the workload from git drops it; the webhook puts
/// it back on UPDATE, so the template is unchanged, nothing is written and
/// there is no new generation (no rollout nobody asked for).
#[tokio::test]
async fn a_dropped_pod_template_annotation_is_put_back_without_a_new_generation() {
    let server = common::start().await;
    let Some(k) = Kubectl::new(&server) else {
        return;
    };
    let hook = Hook::start(handler(|review| {
        let req = &review["request"];
        if req["operation"] != "UPDATE" {
            return allow();
        }
        let at = |o: &Value| {
            o.pointer("/spec/template/metadata/annotations")
                .and_then(|a| a.get(RESTARTED_AT))
                .cloned()
        };
        match (at(&req["oldObject"]), at(&req["object"])) {
            (Some(old), None) => json_patch(json!([set_in_map(
                &req["object"],
                "/spec/template/metadata/annotations",
                RESTARTED_AT,
                old
            )])),
            _ => allow(),
        }
    }))
    .await;
    let config = configuration(
        "restart-records",
        vec![webhook(
            "restore.wasmwatch.io",
            &hook.url(),
            &hook.ca.bundle(),
            rule(&["CREATE", "UPDATE"], "apps", &["deployments"]),
            json!({}),
        )],
    );
    let out = k
        .ok(&["apply", "-f", &k.file("mwc.json", &config.to_string())])
        .await;
    assert!(out.contains("created"), "{out}");
    let listed = k.ok(&["get", "mutatingwebhookconfigurations"]).await;
    assert!(
        listed.contains("WEBHOOKS") && listed.contains("restart-records   1"),
        "{listed}"
    );

    let file = k.file("web.yaml", DEPLOYMENT);
    assert!(
        k.ok(&["apply", "-f", &file])
            .await
            .contains("deployment.apps/web created")
    );
    let restart = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: "2026-01-02T03:04:05Z"}}}}});
    k.ok(&["patch", "deployment", "web", "-p", &restart.to_string()])
        .await;
    let get = || async { k.get_json(&["deployment", "web"]).await };
    let restarted = get().await;
    assert_eq!(restarted["metadata"]["generation"], 2);
    let annotation =
        |d: &Value| d["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT].clone();
    assert_eq!(annotation(&restarted), "2026-01-02T03:04:05Z");

    // `kubectl apply` of the file from git again: kubectl's three-way merge
    // leaves alone what the file never had.
    k.ok(&["apply", "-f", &file]).await;
    let d = get().await;
    assert_eq!(annotation(&d), "2026-01-02T03:04:05Z");
    assert_eq!(d["metadata"]["generation"], 2);

    // A tool that replaces the whole object with git's (Argo CD's
    // Replace=true; `kubectl replace` would also rewrite kubectl's
    // last-applied annotation, and for a Deployment any annotation change
    // is a new generation) drops the annotation: the webhook puts it back,
    // and the write changes nothing.
    let mut replaced = d.clone();
    replaced["spec"]["template"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    server.clear_requests();
    let http = common::http();
    let url = format!(
        "{}/apis/apps/v1/namespaces/default/deployments/web",
        server.url()
    );
    let r = common::put(&http, &url, &replaced).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(annotation(&r.body), "2026-01-02T03:04:05Z");
    let after = get().await;
    assert_eq!(annotation(&after), "2026-01-02T03:04:05Z");
    assert_eq!(after["metadata"]["generation"], 2);
    assert_eq!(
        after["metadata"]["resourceVersion"], d["metadata"]["resourceVersion"],
        "nothing was written"
    );
    assert_eq!(
        outcomes(&server),
        vec![triple("restore.wasmwatch.io", "web", "patched")]
    );

    // A JSON patch removing it: the same.
    let remove = json!([{"op": "remove", "path": format!("/spec/template/metadata/annotations/{}", escape(RESTARTED_AT))}]);
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "--type=json",
        "-p",
        &remove.to_string(),
    ])
    .await;
    let after = get().await;
    assert_eq!(annotation(&after), "2026-01-02T03:04:05Z");
    assert_eq!(after["metadata"]["generation"], 2);

    // A real change from git still rolls out, the record kept.
    k.ok(&[
        "apply",
        "-f",
        &k.file("web2.yaml", &DEPLOYMENT.replace("nginx:1.25", "nginx:1.27")),
    ])
    .await;
    let after = get().await;
    assert_eq!(after["metadata"]["generation"], 3);
    assert_eq!(
        after["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    assert_eq!(annotation(&after), "2026-01-02T03:04:05Z");

    // What the webhook was sent.
    let reviews = hook.reviews();
    let create = &reviews[0];
    assert_eq!(create["apiVersion"], "admission.k8s.io/v1");
    let req = &create["request"];
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(
        req["kind"],
        json!({"group": "apps", "version": "v1", "kind": "Deployment"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "apps", "version": "v1", "resource": "deployments"})
    );
    assert_eq!(req["requestKind"], req["kind"]);
    assert_eq!(
        (req["namespace"].as_str(), req["name"].as_str()),
        (Some("default"), Some("web"))
    );
    assert_eq!(req["oldObject"], Value::Null);
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["options"]["kind"], "CreateOptions");
    assert_eq!(req["options"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(req["userInfo"]["username"], "system:admin");
    assert!(req.get("subResource").is_none());
    // Defaults applied, the server's own fields not set yet.
    assert_eq!(req["object"]["spec"]["strategy"]["type"], "RollingUpdate");
    assert!(req["object"]["metadata"].get("uid").is_none());
    let update = reviews
        .iter()
        .map(|r| &r["request"])
        .find(|r| r["options"]["kind"] == "UpdateOptions")
        .expect("the replace was reviewed");
    assert_eq!(update["operation"], "UPDATE");
    assert_eq!(update["oldObject"]["metadata"]["generation"], 2);
    assert_eq!(update["object"]["metadata"]["generation"], 2);
    assert_eq!(
        update["object"]["metadata"]["resourceVersion"],
        update["oldObject"]["metadata"]["resourceVersion"]
    );
    assert!(
        reviews
            .iter()
            .any(|r| r["request"]["options"]["kind"] == "PatchOptions")
    );
}

#[tokio::test]
async fn object_and_namespace_selectors_choose_the_writes_a_webhook_sees() {
    let server = common::start().await;
    let http = common::http();
    let hook = Hook::start(handler(|review| {
        let obj = &review["request"]["object"];
        json_patch(json!([set_in_map(
            obj,
            "/metadata/labels",
            "seen",
            json!("yes")
        )]))
    }))
    .await;
    install(
        &http,
        &server,
        configuration(
            "label",
            vec![webhook(
                "label.example.com",
                &hook.url(),
                &hook.ca.bundle(),
                rule(&["*"], "", &["configmaps"]),
                json!({
                    "objectSelector": {"matchLabels": {"inject": "yes"}},
                    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
                }),
            )],
        ),
    )
    .await;
    namespace(&http, &server, "team-a", json!({"team": "a"})).await;
    namespace(&http, &server, "team-b", json!({"team": "b"})).await;
    let url =
        |ns: &str, name: &str| format!("{}/api/v1/namespaces/{ns}/configmaps{name}", server.url());
    let labels = |r: &Resp| r.body["metadata"]["labels"].clone();

    let r = common::post(
        &http,
        &url("team-a", ""),
        &configmap("one", json!({"inject": "yes"})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(labels(&r), json!({"inject": "yes", "seen": "yes"}));
    let r = common::post(&http, &url("team-a", ""), &configmap("two", json!({}))).await;
    assert_eq!(labels(&r), json!({}), "no matching label");
    let r = common::post(
        &http,
        &url("team-b", ""),
        &configmap("three", json!({"inject": "yes"})),
    )
    .await;
    assert_eq!(
        labels(&r),
        json!({"inject": "yes"}),
        "namespace not selected"
    );

    // On UPDATE the webhook is called if the new or the old object matches.
    let merge = "application/merge-patch+json";
    let r = send(
        &http,
        "PATCH",
        &url("team-a", "/two"),
        merge,
        &json!({"metadata": {"labels": {"inject": "yes"}}}),
    )
    .await;
    assert_eq!(labels(&r), json!({"inject": "yes", "seen": "yes"}));
    let r = send(
        &http,
        "PATCH",
        &url("team-a", "/one"),
        merge,
        &json!({"metadata": {"labels": {"inject": null, "seen": null}}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(labels(&r), json!({"seen": "yes"}));

    // A dry run is admitted too (sideEffects: None), and nothing is stored.
    let r = common::post(
        &http,
        &format!("{}?dryRun=All", url("team-a", "")),
        &configmap("four", json!({"inject": "yes"})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(labels(&r), json!({"inject": "yes", "seen": "yes"}));
    assert!(server.get("configmaps", "team-a", "four").is_none());
    let calls = server.webhook_calls();
    assert_eq!(
        outcomes(&server),
        vec![
            triple("label.example.com", "one", "patched"),
            triple("label.example.com", "two", "patched"),
            triple("label.example.com", "one", "patched"),
            triple("label.example.com", "four", "patched"),
        ]
    );
    let ops: Vec<&str> = calls.iter().map(|c| c.operation.as_str()).collect();
    assert_eq!(ops, ["CREATE", "UPDATE", "UPDATE", "CREATE"]);
    assert!(calls[3].dry_run && !calls[0].dry_run);
    assert_eq!(
        (
            calls[0].configuration.as_str(),
            calls[0].resource.as_str(),
            calls[0].namespace.as_str()
        ),
        ("label", "configmaps", "team-a")
    );
    assert_eq!(hook.reviews()[3]["request"]["dryRun"], true);
}

#[tokio::test]
async fn a_denial_fails_the_write_with_the_webhooks_status() {
    let server = common::start().await;
    let http = common::http();
    let hook = Hook::start(handler(
        |review| match review["request"]["object"]["metadata"]["labels"]["deny"].as_str() {
            Some("plain") => Answer::Response(json!({"allowed": false})),
            Some("forbidden") => Answer::Response(json!({
                "allowed": false,
                "status": {"code": 403, "reason": "Forbidden", "message": "not in this namespace"},
            })),
            _ => allow(),
        },
    ))
    .await;
    install(
        &http,
        &server,
        configuration(
            "deny",
            vec![webhook(
                "deny.example.com",
                &hook.url(),
                &hook.ca.bundle(),
                rule(&["CREATE"], "", &["configmaps"]),
                json!({}),
            )],
        ),
    )
    .await;
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let r = common::post(&http, &url, &configmap("a", json!({"deny": "plain"}))).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "admission webhook \"deny.example.com\" denied the request without explanation"
    );
    assert_eq!(r.body["status"], "Failure");
    assert!(r.body.get("reason").is_none(), "{}", r.body);
    let r = common::post(&http, &url, &configmap("b", json!({"deny": "forbidden"}))).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (403, Some("Forbidden"))
    );
    assert_eq!(
        r.body["message"],
        "admission webhook \"deny.example.com\" denied the request: not in this namespace"
    );
    assert!(server.get("configmaps", "default", "a").is_none());
    assert!(server.get("configmaps", "default", "b").is_none());
    let r = common::post(&http, &url, &configmap("c", json!({}))).await;
    assert_eq!(r.status, 201);
    assert_eq!(
        outcomes(&server),
        vec![
            triple("deny.example.com", "a", "denied"),
            triple("deny.example.com", "b", "denied"),
            triple("deny.example.com", "c", "allowed"),
        ]
    );
    // kubectl shows the webhook's message.
    if let Some(k) = Kubectl::new(&server) {
        let cm = configmap("d", json!({"deny": "forbidden"}));
        let out = k
            .run(&["create", "-f", &k.file("d.json", &cm.to_string())])
            .await;
        assert_ne!(out.code, 0);
        assert!(
            out.stderr.contains(
                "admission webhook \"deny.example.com\" denied the request: not in this namespace"
            ),
            "{}",
            out.stderr
        );
    }
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Two webhooks for ConfigMaps, one `Fail` (for objects labelled
/// `policy=fail`) and one `Ignore` (`policy=ignore`), both calling `url`.
fn fail_and_ignore(name: &str, url: &str, ca_bundle: &str, extra: Value) -> Value {
    let hook = |policy: &str| {
        let mut more = json!({
            "failurePolicy": if policy == "fail" { "Fail" } else { "Ignore" },
            "objectSelector": {"matchLabels": {"policy": policy}},
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            more[k] = v.clone();
        }
        webhook(
            &format!("{name}-{policy}.example.com"),
            url,
            ca_bundle,
            rule(&["CREATE"], "", &["configmaps"]),
            more,
        )
    };
    configuration(name, vec![hook("fail"), hook("ignore")])
}

#[tokio::test]
async fn failure_policy_decides_when_the_webhook_cannot_be_reached() {
    let server = common::start().await;
    let http = common::http();
    let port = closed_port().await;
    let ca = Ca::new("unused");
    let url = format!("https://127.0.0.1:{port}/mutate");
    install(
        &http,
        &server,
        fail_and_ignore("down", &url, &ca.bundle(), json!({})),
    )
    .await;
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());

    let r = common::post(&http, &cms, &configmap("f", json!({"policy": "fail"}))).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (500, Some("InternalError"))
    );
    assert_eq!(
        r.body["message"],
        format!(
            "Internal error occurred: failed calling webhook \"down-fail.example.com\": failed to call webhook: Post \"https://127.0.0.1:{port}/mutate?timeout=10s\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        )
    );
    assert!(server.get("configmaps", "default", "f").is_none());
    let r = common::post(&http, &cms, &configmap("i", json!({"policy": "ignore"}))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        outcomes(&server),
        vec![
            triple("down-fail.example.com", "f", "failed"),
            triple("down-ignore.example.com", "i", "ignored"),
        ]
    );
    let ignored = &server.webhook_calls()[1];
    assert!(
        ignored
            .error
            .as_deref()
            .unwrap()
            .contains("connection refused"),
        "{ignored:?}"
    );

    // A service reference cannot be reached from here: a call failure.
    let svc = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "svc"},
        "webhooks": [{
            "name": "svc.example.com",
            "clientConfig": {"service": {"name": "hook", "namespace": "kube-system", "path": "/mutate"}},
            "rules": [rule(&["CREATE"], "", &["secrets"])],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    });
    install(&http, &server, svc).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let r = common::post(
        &http,
        &format!("{}/api/v1/namespaces/default/secrets", server.url()),
        &secret,
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body["message"],
        "Internal error occurred: failed calling webhook \"svc.example.com\": failed to call webhook: Post \"https://hook.kube-system.svc:443/mutate?timeout=10s\": service references are not reachable from this test API server (give clientConfig.url)"
    );
}

#[tokio::test]
async fn a_ca_bundle_that_did_not_sign_the_certificate_is_a_tls_failure() {
    let server = common::start().await;
    let http = common::http();
    let hook = Hook::start(handler(|review| {
        let obj = &review["request"]["object"];
        json_patch(json!([set_in_map(
            obj,
            "/metadata/labels",
            "seen",
            json!("yes")
        )]))
    }))
    .await;
    let other = Ca::new("another CA");
    install(
        &http,
        &server,
        fail_and_ignore("tls", &hook.url(), &other.bundle(), json!({})),
    )
    .await;
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let r = common::post(&http, &cms, &configmap("f", json!({"policy": "fail"}))).await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(
        r.body["message"],
        format!(
            "Internal error occurred: failed calling webhook \"tls-fail.example.com\": failed to call webhook: Post \"{}?timeout=10s\": tls: failed to verify certificate: x509: certificate signed by unknown authority",
            hook.url()
        )
    );
    let r = common::post(&http, &cms, &configmap("i", json!({"policy": "ignore"}))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.body["metadata"]["labels"],
        json!({"policy": "ignore"}),
        "not patched"
    );
    assert!(hook.reviews().is_empty(), "no request got through");

    // The right CA, by host name too (the certificate names localhost).
    let fixed = fail_and_ignore(
        "tls",
        &hook.url().replace("127.0.0.1", "localhost"),
        &hook.ca.bundle(),
        json!({}),
    );
    let url = format!("{}{MWC_PATH}/tls", server.url());
    let current = common::get(&http, &url).await.body;
    let mut fixed = fixed;
    fixed["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    let r = common::put(&http, &url, &fixed).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 2);
    let r = common::post(&http, &cms, &configmap("f2", json!({"policy": "fail"}))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["metadata"]["labels"]["seen"], "yes");

    // A bundle that is no PEM at all.
    let mut broken = fixed.clone();
    broken["metadata"]["resourceVersion"] = r.body["metadata"]["resourceVersion"].clone();
    let current = common::get(&http, &url).await.body;
    broken["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    for h in broken["webhooks"].as_array_mut().unwrap() {
        h["clientConfig"]["caBundle"] = json!(B64.encode("not a certificate"));
    }
    assert_eq!(common::put(&http, &url, &broken).await.status, 200);
    let r = common::post(&http, &cms, &configmap("f3", json!({"policy": "fail"}))).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body["message"],
        "Internal error occurred: failed calling webhook \"tls-fail.example.com\": could not get REST client: unable to load root certificates: unable to parse bytes as PEM block"
    );
}

#[tokio::test]
async fn a_webhook_slower_than_its_timeout_is_a_call_failure() {
    let server = common::start().await;
    let http = common::http();
    let answer: Handler = Arc::new(|_| {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            allow()
        })
    });
    let hook = Hook::start(answer).await;
    install(
        &http,
        &server,
        fail_and_ignore(
            "slow",
            &hook.url(),
            &hook.ca.bundle(),
            json!({"timeoutSeconds": 1}),
        ),
    )
    .await;
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let start = Instant::now();
    let r = common::post(&http, &cms, &configmap("f", json!({"policy": "fail"}))).await;
    let took = start.elapsed();
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(
        r.body["message"],
        format!(
            "Internal error occurred: failed calling webhook \"slow-fail.example.com\": failed to call webhook: Post \"{}?timeout=1s\": context deadline exceeded",
            hook.url()
        )
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let start = Instant::now();
    let r = common::post(&http, &cms, &configmap("i", json!({"policy": "ignore"}))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(
        outcomes(&server),
        vec![
            triple("slow-fail.example.com", "f", "failed"),
            triple("slow-ignore.example.com", "i", "ignored"),
        ]
    );
}

#[tokio::test]
async fn answers_that_are_not_valid_reviews_and_patches_that_do_not_apply() {
    let server = common::start().await;
    let http = common::http();
    let hook = Hook::start(handler(
        |review| match review["request"]["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or("")
        {
            n if n.starts_with("uid") => {
                Answer::Response(json!({"uid": "someone-else", "allowed": true}))
            }
            n if n.starts_with("status") => Answer::Raw(500, "boom"),
            n if n.starts_with("garbage") => Answer::Raw(200, "not json"),
            n if n.starts_with("nopatch") => {
                json_patch(json!([{"op": "remove", "path": "/metadata/labels/missing"}]))
            }
            n if n.starts_with("badtype") => {
                json_patch(json!([{"op": "replace", "path": "/data", "value": "not a map"}]))
            }
            _ => allow(),
        },
    ))
    .await;
    install(
        &http,
        &server,
        fail_and_ignore("odd", &hook.url(), &hook.ca.bundle(), json!({})),
    )
    .await;
    let cms = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let post = |name: &'static str, policy: &'static str| {
        let (http, cms) = (&http, &cms);
        async move { common::post(http, cms, &configmap(name, json!({"policy": policy}))).await }
    };
    let failed = |webhook: &str, why: &str| {
        format!("Internal error occurred: failed calling webhook \"{webhook}\": {why}")
    };

    let r = post("uid-f", "fail").await;
    assert_eq!(r.status, 500);
    let uid = hook.reviews().last().unwrap()["request"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        r.body["message"],
        failed(
            "odd-fail.example.com",
            &format!(
                "received invalid webhook response: expected response.uid=\"{uid}\", got \"someone-else\""
            )
        )
    );
    assert_eq!(post("uid-i", "ignore").await.status, 201);

    let r = post("status-f", "fail").await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body["message"],
        failed(
            "odd-fail.example.com",
            "failed to call webhook: an error on the server (\"boom\") has prevented the request from succeeding"
        )
    );
    assert_eq!(post("status-i", "ignore").await.status, 201);

    let r = post("garbage-f", "fail").await;
    assert_eq!(r.status, 500);
    assert!(
        r.body["message"].as_str().unwrap().starts_with(&failed(
            "odd-fail.example.com",
            "failed to call webhook: couldn't get version/kind; json parse error"
        )),
        "{}",
        r.body
    );
    assert_eq!(post("garbage-i", "ignore").await.status, 201);

    // A patch that does not apply fails the request whatever the policy.
    for policy in ["fail", "ignore"] {
        let r = common::post(
            &http,
            &cms,
            &configmap(&format!("nopatch-{policy}"), json!({"policy": policy})),
        )
        .await;
        assert_eq!(
            (r.status, r.body["reason"].as_str()),
            (500, Some("InternalError")),
            "{}",
            r.body
        );
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .starts_with("Internal error occurred: jsonpatch remove operation does not apply"),
            "{}",
            r.body
        );
        let r = common::post(
            &http,
            &cms,
            &configmap(&format!("badtype-{policy}"), json!({"policy": policy})),
        )
        .await;
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains("ConfigMap in version \"v1\" cannot be handled as a ConfigMap"),
            "{}",
            r.body
        );
    }
    let names: Vec<String> = server
        .webhook_calls()
        .into_iter()
        .filter(|c| c.outcome == "failed")
        .map(|c| c.name)
        .collect();
    assert_eq!(
        names,
        [
            "uid-f",
            "status-f",
            "garbage-f",
            "nopatch-fail",
            "badtype-fail",
            "nopatch-ignore",
            "badtype-ignore"
        ]
    );
}

#[tokio::test]
async fn status_and_scale_writes_call_only_the_webhooks_naming_them() {
    let server = common::start().await;
    let http = common::http();
    let hook = Hook::start(handler(|review| {
        let req = &review["request"];
        match req["subResource"].as_str() {
            // Caps replicas at 3.
            Some("scale") if req["object"]["spec"]["replicas"].as_i64() > Some(3) => {
                json_patch(json!([{"op": "replace", "path": "/spec/replicas", "value": 3}]))
            }
            Some("status") => json_patch(json!([set_in_map(
                &req["object"],
                "/status",
                "observedGeneration",
                json!(42)
            )])),
            _ => allow(),
        }
    }))
    .await;
    let (url, ca) = (hook.url(), hook.ca.bundle());
    install(
        &http,
        &server,
        configuration(
            "subresources",
            vec![
                webhook(
                    "main.example.com",
                    &url,
                    &ca,
                    rule(&["*"], "apps", &["deployments"]),
                    json!({}),
                ),
                webhook(
                    "status.example.com",
                    &url,
                    &ca,
                    rule(&["UPDATE"], "apps", &["deployments/status"]),
                    json!({}),
                ),
                webhook(
                    "scale.example.com",
                    &url,
                    &ca,
                    rule(&["UPDATE"], "apps", &["deployments/scale"]),
                    json!({}),
                ),
            ],
        ),
    )
    .await;
    let deploy: Value = serde_yaml::from_str(DEPLOYMENT).unwrap();
    let base = format!(
        "{}/apis/apps/v1/namespaces/default/deployments",
        server.url()
    );
    let r = common::post(&http, &base, &deploy).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = send(
        &http,
        "PATCH",
        &format!("{base}/web/status"),
        "application/merge-patch+json",
        &json!({"status": {"replicas": 2}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["status"],
        json!({"replicas": 2, "observedGeneration": 42})
    );
    let r = send(
        &http,
        "PATCH",
        &format!("{base}/web/scale"),
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 10}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["kind"], "Scale");
    assert_eq!(r.body["spec"]["replicas"], 3);
    assert_eq!(
        server.get("deployments.apps", "default", "web").unwrap()["spec"]["replicas"],
        3
    );
    let calls: Vec<(String, Option<String>, String)> = server
        .webhook_calls()
        .into_iter()
        .map(|c| (c.webhook, c.subresource, c.outcome))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("main.example.com".into(), None, "allowed".into()),
            (
                "status.example.com".into(),
                Some("status".into()),
                "patched".into()
            ),
            (
                "scale.example.com".into(),
                Some("scale".into()),
                "patched".into()
            ),
        ]
    );
    let scale_review = &hook.reviews()[2]["request"];
    assert_eq!(
        scale_review["kind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    );
    assert_eq!(scale_review["resource"]["resource"], "deployments");
    assert_eq!(scale_review["oldObject"]["spec"]["replicas"], 2);
}

#[tokio::test]
async fn a_webhook_may_write_to_the_server_while_it_is_called() {
    let server = common::start().await;
    let http = common::http();
    let cm_url = format!("{}/api/v1/namespaces/default/configmaps/race", server.url());
    let once = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let (url2, once2, calls2) = (cm_url.clone(), once.clone(), calls.clone());
    // On the first UPDATE, the webhook itself changes the object before
    // answering: the server, holding no lock, serves that write (calling
    // the webhook again), then finds its own candidate stale and computes
    // it again from the new object, as kube's GuaranteedUpdate does.
    let answer: Handler = Arc::new(move |review: Value| {
        let (url, once, calls) = (url2.clone(), once2.clone(), calls2.clone());
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if review["request"]["operation"] == "UPDATE" && !once.swap(true, Ordering::SeqCst) {
                let http = common::http();
                let r = common::send(
                    &http,
                    "PATCH",
                    &url,
                    "application/merge-patch+json",
                    Some(&json!({"data": {"from-webhook": "1"}})),
                )
                .await;
                assert_eq!(r.status, 200, "{}", r.body);
            }
            allow()
        })
    });
    let hook = Hook::start(answer).await;
    install(
        &http,
        &server,
        configuration(
            "race",
            vec![webhook(
                "race.example.com",
                &hook.url(),
                &hook.ca.bundle(),
                rule(&["UPDATE"], "", &["configmaps"]),
                json!({}),
            )],
        ),
    )
    .await;
    let r = common::post(
        &http,
        &format!("{}/api/v1/namespaces/default/configmaps", server.url()),
        &configmap("race", json!({})),
    )
    .await;
    assert_eq!(r.status, 201);
    let r = send(
        &http,
        "PATCH",
        &cm_url,
        "application/merge-patch+json",
        &json!({"data": {"from-client": "1"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["data"],
        json!({"k": "v", "from-webhook": "1", "from-client": "1"})
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the client's write, the webhook's, the retry"
    );
    assert_eq!(server.webhook_calls().len(), 3);
}

#[tokio::test]
async fn configurations_are_validated_and_defaulted() {
    let server = common::start().await;
    let http = common::http();
    let url = format!("{}{MWC_PATH}", server.url());
    let ca = B64.encode("unused");
    let good = |name: &str| {
        webhook(
            name,
            "https://127.0.0.1:9443/mutate",
            &ca,
            rule(&["CREATE"], "apps", &["deployments"]),
            json!({}),
        )
    };
    let refused = |hooks: Vec<Value>| {
        let (http, url) = (&http, &url);
        async move {
            let r = common::post(http, url, &configuration("bad", hooks)).await;
            assert_eq!(
                (r.status, r.body["reason"].as_str()),
                (422, Some("Invalid")),
                "{}",
                r.body
            );
            r.body["message"].as_str().unwrap().to_string()
        }
    };
    let without = |field: &str| {
        let mut h = good("a.example.com");
        h.as_object_mut().unwrap().remove(field);
        h
    };
    assert_eq!(
        refused(vec![without("sideEffects")]).await,
        "MutatingWebhookConfiguration.admissionregistration.k8s.io \"bad\" is invalid: webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"
    );
    assert_eq!(
        refused(vec![without("admissionReviewVersions")]).await,
        "MutatingWebhookConfiguration.admissionregistration.k8s.io \"bad\" is invalid: webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1"
    );
    assert!(
        refused(vec![good("example.com")])
            .await
            .ends_with("webhooks[0].name: Invalid value: \"example.com\": should be a domain with at least three segments separated by dots")
    );
    let mut neither = good("a.example.com");
    neither["clientConfig"] = json!({"caBundle": ca});
    let mut both = good("b.example.com");
    both["clientConfig"]["service"] = json!({"name": "s", "namespace": "n"});
    let msg = refused(vec![neither, both]).await;
    assert!(
        msg.contains(
            "webhooks[0].clientConfig: Required value: exactly one of url or service is required"
        ) && msg.contains(
            "webhooks[1].clientConfig: Required value: exactly one of url or service is required"
        ),
        "{msg}"
    );
    let mut http_url = good("a.example.com");
    http_url["clientConfig"]["url"] = json!("http://127.0.0.1:9443/mutate");
    assert!(
        refused(vec![http_url])
            .await
            .ends_with("webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]")
    );
    let mut others = good("a.example.com");
    others["failurePolicy"] = json!("Sometimes");
    others["timeoutSeconds"] = json!(31);
    let msg = refused(vec![others, good("a.example.com")]).await;
    for expected in [
        "webhooks[0].failurePolicy: Unsupported value: \"Sometimes\": supported values: \"Fail\", \"Ignore\"",
        "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
        "webhooks[1].name: Duplicate value: \"a.example.com\"",
    ] {
        assert!(msg.contains(expected), "{expected} in {msg}");
    }

    // kube's defaults, stored.
    let r = common::post(
        &http,
        &url,
        &configuration("good", vec![good("a.example.com")]),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let h = &r.body["webhooks"][0];
    assert_eq!(h["failurePolicy"], "Fail");
    assert_eq!(h["matchPolicy"], "Equivalent");
    assert_eq!(h["timeoutSeconds"], 10);
    assert_eq!(h["reinvocationPolicy"], "Never");
    assert_eq!(h["namespaceSelector"], json!({}));
    assert_eq!(h["objectSelector"], json!({}));
    assert_eq!(h["rules"][0]["scope"], "*");
    assert_eq!(r.body["metadata"]["generation"], 1);
    // Discovery lists the resource.
    let r = common::get(
        &http,
        &format!("{}/apis/admissionregistration.k8s.io/v1", server.url()),
    )
    .await;
    assert_eq!(
        r.body["resources"][0]["name"],
        "mutatingwebhookconfigurations"
    );
    assert_eq!(r.body["resources"][0]["namespaced"], false);
}
