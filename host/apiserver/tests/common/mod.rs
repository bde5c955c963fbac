//! Shared helpers: a raw HTTP client for exact wire-level assertions.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use wasmwatch_apiserver::{Config, Server, ServerHandle};

pub type Http = Client<HttpConnector, Full<Bytes>>;

pub fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn start() -> ServerHandle {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> ServerHandle {
    Server::start(config).await.expect("server starts")
}

/// A plain JSON response.
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Value,
}

pub async fn send(
    http: &Http,
    method: &str,
    url: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Resp {
    let body = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = http.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub async fn get(http: &Http, url: &str) -> Resp {
    send(http, "GET", url, "application/json", None).await
}

/// What kubectl sends when it prints columns.
pub const ACCEPT_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// A GET with an Accept header; the body as raw bytes and parsed.
pub async fn get_accept(http: &Http, url: &str, accept: &str) -> (Resp, Bytes) {
    let req = Request::builder()
        .method("GET")
        .uri(url)
        .header("accept", accept)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (
        Resp {
            status,
            headers,
            body,
        },
        bytes,
    )
}

pub async fn post(http: &Http, url: &str, body: &Value) -> Resp {
    send(http, "POST", url, "application/json", Some(body)).await
}

pub async fn put(http: &Http, url: &str, body: &Value) -> Resp {
    send(http, "PUT", url, "application/json", Some(body)).await
}

pub async fn delete(http: &Http, url: &str) -> Resp {
    send(http, "DELETE", url, "application/json", None).await
}

/// An open watch: reads newline-delimited JSON events.
pub struct Watch {
    resp: Response<Incoming>,
    buf: Vec<u8>,
    done: bool,
}

impl Watch {
    pub async fn open(http: &Http, url: &str) -> Watch {
        Self::open_accept(http, url, "application/json").await
    }

    pub async fn open_accept(http: &Http, url: &str, accept: &str) -> Watch {
        let req = Request::builder()
            .uri(url)
            .header("accept", accept)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = http.request(req).await.expect("watch request");
        assert_eq!(resp.status(), 200, "watch {url}");
        Watch {
            resp,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next event, or None when the stream ended (cleanly or not).
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("event is JSON"));
            }
            if self.done {
                return None;
            }
            match self.resp.body_mut().frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => self.done = true,
            }
        }
    }

    /// The next event within `d`, panicking on timeout.
    pub async fn next_within(&mut self, d: Duration) -> Option<Value> {
        tokio::time::timeout(d, self.next())
            .await
            .expect("watch event in time")
    }
}

/// (type, name, resourceVersion) of an event.
pub fn summary(ev: &Value) -> (String, String, String) {
    (
        ev["type"].as_str().unwrap_or_default().to_string(),
        ev["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

pub fn cm(name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": data,
    })
}

/// kubectl (an independent client) against a server, as a subprocess: the
/// one on PATH (tests/prepare installs Debian's kubernetes-client).
pub fn kubectl_path() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    })
}

/// kubectl with its own kubeconfig for one server.
pub struct Kubectl {
    pub bin: std::path::PathBuf,
    pub dir: tempfile::TempDir,
}

/// What one kubectl run printed.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    /// `None` (with a loud note) when kubectl is not installed.
    pub fn new(server: &ServerHandle) -> Option<Kubectl> {
        let Some(bin) = kubectl_path() else {
            eprintln!(
                "\n!!!!!!!! SKIPPING kubectl tests: kubectl is not installed (Debian package kubernetes-client) !!!!!!!!\n"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        server
            .write_kubeconfig(dir.path().join("kubeconfig"))
            .unwrap();
        Some(Kubectl { bin, dir })
    }

    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        c
    }

    pub async fn run(&self, args: &[&str]) -> Out {
        let out = tokio::time::timeout(Duration::from_secs(30), self.command(args).output())
            .await
            .expect("kubectl finished in time")
            .expect("kubectl runs");
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs kubectl, which must succeed; returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert_eq!(
            o.code, 0,
            "kubectl {args:?} failed: {}{}",
            o.stdout, o.stderr
        );
        o.stdout
    }

    pub async fn get_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).unwrap()
    }

    /// Writes a file beside the kubeconfig; returns its path.
    pub fn file(&self, name: &str, content: &(impl AsRef<[u8]> + ?Sized)) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_string()
    }
}
