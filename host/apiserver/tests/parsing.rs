//! Request parsing as kube-apiserver does it: body media types (415 for the
//! unknown ones), the label selector grammar, and deeply nested bodies (a
//! quick 400, never a hang).

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Http, Resp, cm, get, http, post, send};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};

const BODY_TYPES_415: &str = "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf";

/// A request with a raw body and an optional Content-Type.
async fn send_raw(
    http: &Http,
    method: &str,
    url: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Resp {
    let mut req = Request::builder().method(method).uri(url);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req.body(Full::new(body.into())).unwrap();
    let resp = http.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    Resp {
        status,
        headers,
        body,
    }
}

fn configmaps(server: &wasmwatch_apiserver::ServerHandle) -> String {
    format!("{}/api/v1/namespaces/default/configmaps", server.url())
}

#[tokio::test]
async fn create_with_an_unknown_media_type_is_415() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    let body = serde_json::to_vec(&cm("plain", &[("k", "v")])).unwrap();
    for ct in [
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-yaml",
        "text/yaml",
        "application/merge-patch+json",
        "application/cbor",
        "application/json-seq",
        "*/*",
        "application",
        "application/json/x",
        "application/json; charset",
    ] {
        let r = send_raw(&h, "POST", &coll, Some(ct), body.clone()).await;
        assert_eq!(r.status, 415, "{ct}: {}", r.body);
        assert_eq!(
            r.body,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": BODY_TYPES_415,
                "reason": "UnsupportedMediaType",
                "code": 415,
            }),
            "{ct}"
        );
    }
    // Refused before reading the body, as kube-apiserver does.
    let r = send_raw(&h, "POST", &coll, Some("text/plain"), Vec::new()).await;
    assert_eq!(r.status, 415);
    assert_eq!(get(&h, &format!("{coll}/plain")).await.status, 404);

    // Replace and delete bodies are negotiated the same way.
    assert_eq!(post(&h, &coll, &cm("x", &[])).await.status, 201);
    let r = send_raw(&h, "PUT", &format!("{coll}/x"), Some("text/plain"), body).await;
    assert_eq!(
        (r.status, r.body["message"].as_str()),
        (415, Some(BODY_TYPES_415))
    );
    let opts = br#"{"kind":"DeleteOptions","apiVersion":"v1"}"#;
    let r = send_raw(
        &h,
        "DELETE",
        &format!("{coll}/x"),
        Some("text/plain"),
        &opts[..],
    )
    .await;
    assert_eq!(
        (r.status, r.body["message"].as_str()),
        (415, Some(BODY_TYPES_415))
    );
    assert_eq!(get(&h, &format!("{coll}/x")).await.status, 200);

    // A patch must carry a patch type (its own 415), and patches still work.
    let r = send(
        &h,
        "PATCH",
        &format!("{coll}/x"),
        "text/plain",
        Some(&json!({})),
    )
    .await;
    assert_eq!(r.status, 415);
    assert_eq!(r.body["reason"], "UnsupportedMediaType");
    let patch = json!({"data": {"k": "patched"}});
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let r = send(&h, "PATCH", &format!("{coll}/x"), ct, Some(&patch)).await;
        assert_eq!(r.status, 200, "{ct}: {}", r.body);
        assert_eq!(r.body["data"]["k"], "patched");
    }
}

#[tokio::test]
async fn json_yaml_and_no_content_type_are_accepted() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    let json_body = |name: &str| serde_json::to_vec(&cm(name, &[("k", "v")])).unwrap();
    for (name, ct) in [
        ("json", Some("application/json")),
        ("json-charset", Some("application/json; charset=utf-8")),
        ("json-upper", Some("Application/JSON")),
        ("no-type", None),
        ("empty-type", Some("")),
    ] {
        let r = send_raw(&h, "POST", &coll, ct, json_body(name)).await;
        assert_eq!(r.status, 201, "{ct:?}: {}", r.body);
        assert_eq!(r.body["data"]["k"], "v");
    }
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: yaml\ndata:\n  k: v\n";
    let r = send_raw(&h, "POST", &coll, Some("application/yaml"), yaml).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["data"]["k"], "v");
    // JSON is YAML too.
    let r = send_raw(
        &h,
        "POST",
        &coll,
        Some("application/yaml"),
        json_body("yaml-json"),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
}

#[tokio::test]
async fn label_selector_grammar_is_kubes() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    for (name, labels) in [
        ("web3", json!({"app": "web", "n": "3"})),
        ("api10", json!({"app": "api", "n": "10"})),
        ("text", json!({"app": "web", "n": "many"})),
        ("bare", json!({})),
    ] {
        let mut o = cm(name, &[]);
        o["metadata"]["labels"] = labels;
        assert_eq!(post(&h, &coll, &o).await.status, 201);
    }
    let names = |r: &Resp| -> Vec<String> {
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    let list = |sel: &str| {
        let url = format!("{coll}?labelSelector={}", enc(sel));
        let h = h.clone();
        async move { get(&h, &url).await }
    };
    for (sel, want) in [
        ("app in(web)", vec!["text", "web3"]),
        ("app notin(web)", vec!["api10", "bare"]),
        ("app in(web,api),n>2", vec!["api10", "web3"]),
        ("n>2", vec!["api10", "web3"]),
        ("n<5", vec!["web3"]),
        ("n>3", vec!["api10"]),
        ("n>2,n<10", vec!["web3"]),
        ("app=web,!n", vec![]),
        ("!app", vec!["bare"]),
        ("app==api", vec!["api10"]),
        ("app!=web", vec!["api10", "bare"]),
    ] {
        assert_eq!(names(&list(sel).await), want, "{sel}");
    }
    for (sel, message) in [
        (
            "app in web",
            "unable to parse requirement: found 'web' expected: '('",
        ),
        ("app=web x", "found 'x', expected: ',' or 'end of string'"),
        (
            "n>two",
            "unable to parse requirement: values[0]: Invalid value: \"two\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        (
            "a b",
            "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'",
        ),
    ] {
        let r = list(sel).await;
        assert_eq!(r.status, 400, "{sel}");
        assert_eq!(
            r.body,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": "BadRequest",
                "code": 400,
            }),
            "{sel}"
        );
    }
    // Watches parse the same grammar.
    let r = get(
        &h,
        &format!("{coll}?watch=true&labelSelector={}", enc("app in web")),
    )
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn kubectl_label_selectors_without_blanks() {
    let server = common::start().await;
    let Some(k) = common::Kubectl::new(&server) else {
        return;
    };
    let h = http();
    let coll = configmaps(&server);
    for (name, n) in [("one", "1"), ("five", "5"), ("nine", "9")] {
        let mut o = cm(name, &[]);
        o["metadata"]["labels"] = json!({"app": "web", "n": n});
        assert_eq!(post(&h, &coll, &o).await.status, 201);
    }
    let stdout = k
        .ok(&[
            "get",
            "configmaps",
            "-l",
            "app in(web),n>2,n<9",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(stdout.trim(), "configmap/five");
}

/// POST a body and expect a 400 with `message`, answered quickly.
async fn expect_quick_400(h: &Http, url: &str, ct: &str, body: String, message: &str) {
    let len = body.len();
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        send_raw(h, "POST", url, Some(ct), body),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer within 5 s to a {len}-byte {ct} body ({message})"));
    let took = started.elapsed();
    eprintln!("{ct} {len} bytes: {} in {took:?}", r.status);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["reason"], "BadRequest");
    assert_eq!(r.body["message"], message);
    assert!(took < Duration::from_secs(2), "{message}: took {took:?}");
}

const PAST_LIMIT: &str = "error decoding YAML: yaml: exceeded max depth of 10000";

#[tokio::test]
async fn deep_yaml_is_refused_quickly() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    let n = 100_000;
    let yaml = "application/yaml";
    for body in [
        "[".repeat(n) + &"]".repeat(n),
        "{a: ".repeat(n) + "1" + &"}".repeat(n),
        "{\"a\": ".repeat(n) + "1" + &"}".repeat(n),
        "[a, ".repeat(n) + &"]".repeat(n),
        "[".repeat(n),
        "{".repeat(n),
        "- ".repeat(n) + "x\n",
        "? ".repeat(n) + "x\n",
        "[".repeat(10_001) + &"]".repeat(10_001),
    ] {
        expect_quick_400(&h, &coll, yaml, body, PAST_LIMIT).await;
    }
    // go-yaml names the line when it is not the first.
    let body = format!("apiVersion: v1\nkind: ConfigMap\nx: {}", "{a: ".repeat(n));
    let message = "error decoding YAML: yaml: line 3: exceeded max depth of 10000";
    expect_quick_400(&h, &coll, yaml, body, message).await;
    let body = format!("data:\n  k:\n{}", "  - ".repeat(n));
    let message = "error decoding YAML: yaml: line 3: exceeded max depth of 10000";
    expect_quick_400(&h, &coll, yaml, body, message).await;
    // Within go-yaml's limit but past serde_yaml's (128 levels).
    let body = "{a: ".repeat(10_000) + &"}".repeat(10_000);
    let message = "error decoding YAML: recursion limit exceeded at line 1 column 513";
    expect_quick_400(&h, &coll, yaml, body, message).await;
    let body = format!("x:\n  y: {}", "[".repeat(200));
    let message = "error decoding YAML: recursion limit exceeded at line 2 column 134";
    expect_quick_400(&h, &coll, yaml, body, message).await;
}

#[tokio::test]
async fn deep_json_is_refused_quickly() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    let n = 100_000;
    let json = "application/json";
    let past =
        "couldn't get version/kind; json parse error: invalid character '[' exceeded max depth";
    expect_quick_400(&h, &coll, json, "[".repeat(n) + &"]".repeat(n), past).await;
    let past =
        "couldn't get version/kind; json parse error: invalid character '{' exceeded max depth";
    let body = "{\"a\":".repeat(n) + "1" + &"}".repeat(n);
    expect_quick_400(&h, &coll, json, body, past).await;
    let body = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"x\":{}",
        "[".repeat(200)
    );
    let message = "couldn't get version/kind; json parse error: recursion limit exceeded at line 1 column 169";
    expect_quick_400(&h, &coll, json, body, message).await;
}

#[tokio::test]
async fn brackets_in_scalars_and_comments_are_not_nesting() {
    let server = common::start().await;
    let h = http();
    let coll = configmaps(&server);
    let n = 20_000;
    let open = "[".repeat(n);
    let braces = "{".repeat(n);
    let yaml = format!(
        "# a comment {open}
apiVersion: v1
kind: ConfigMap
metadata:
  name: brackets # {braces}
  annotations:
    note: plain text [with {{brackets}} and \"quotes' inside
      a continuation line [
      {braces}
x:
  flow: {{a: \"{open}\", b: ['{braces}', \"x\" ], c: [[[1]]]}} # {open}
  json: {{\"k\":\"{braces}\",\"l\":[\"]]]\"]}}
data:
  double: \"{open}\\\" {braces}\"
  single: '{open}'' {braces}'
  literal: |
    {open}
      {braces}

    {open}
  folded: >-
    {braces}
  after: ok
"
    );
    let r = send_raw(&h, "POST", &coll, Some("application/yaml"), yaml).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let data = &r.body["data"];
    assert_eq!(data["double"], format!("{open}\" {braces}"));
    assert_eq!(data["single"], format!("{open}' {braces}"));
    assert_eq!(data["literal"], format!("{open}\n  {braces}\n\n{open}\n"));
    assert_eq!(data["folded"], braces);
    assert_eq!(data["after"], "ok");
    assert_eq!(
        r.body["metadata"]["annotations"]["note"],
        format!(
            "plain text [with {{brackets}} and \"quotes' inside a continuation line [ {braces}"
        )
    );

    // 120 levels of flow nesting (plus the top-level mapping) are fine.
    let deep = "[".repeat(120) + &"]".repeat(120);
    let yaml = format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep}}\nx: {deep}\n");
    let r = send_raw(&h, "POST", &coll, Some("application/yaml"), yaml).await;
    assert_eq!(r.status, 201, "{}", r.body);

    // Brackets inside JSON strings are not nesting either.
    let body = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "json-brackets"},
        "data": {"k": "[".repeat(n), "l": "{".repeat(n)},
    });
    let r = send(&h, "POST", &coll, "application/json", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.body);
}
