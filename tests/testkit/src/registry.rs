//! An OCI registry on loopback for tests: the CNCF distribution registry
//! (Debian's `docker-registry`, which `tests/prepare` installs), one per
//! [`Registry`], on a free port of 127.0.0.1 with its storage in a fresh
//! folder, plain HTTP or TLS (certificates from the caller), optionally with
//! basic auth (an htpasswd file with a bcrypt hash made here). Killed and
//! its folder removed on drop.
//!
//! [`FakeRegistry`] is a registry that misbehaves where the real one cannot
//! (layer `urls` to a [`Witness`] listener, a manifest dribbled a byte at a
//! time, no answer at all, huge error bodies with forged log lines, huge
//! manifests), for the pull's bounds (host/oci/tests/hostile_registry.rs).
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::brokers::{Tls, binary, free_port};

/// A running (or stopped) registry.
pub struct Registry {
    port: u16,
    tls: bool,
    dir: PathBuf,
    child: Option<Child>,
}

impl Registry {
    /// A registry anyone may pull from and push to.
    pub fn start() -> Registry {
        Registry::launch(None, None)
    }

    /// A registry that answers only `user` with `password` (HTTP basic auth
    /// against an htpasswd file).
    pub fn with_basic_auth(user: &str, password: &str) -> Registry {
        Registry::launch(None, Some((user, password)))
    }

    /// A registry serving HTTPS with `tls`'s server certificate (which
    /// should name `127.0.0.1` or `localhost`), optionally with basic auth.
    pub fn with_tls(tls: &Tls, auth: Option<(&str, &str)>) -> Registry {
        Registry::launch(Some(tls), auth)
    }

    fn launch(tls: Option<&Tls>, auth: Option<(&str, &str)>) -> Registry {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("wasmwatch-registry-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("storage")).expect("create the registry folder");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.join("storage").display()
        );
        if let Some(tls) = tls {
            std::fs::write(dir.join("cert.pem"), &tls.cert_pem).expect("write cert.pem");
            std::fs::write(dir.join("key.pem"), &tls.key_pem).expect("write key.pem");
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("cert.pem").display(),
                dir.join("key.pem").display()
            ));
        }
        if let Some((user, password)) = auth {
            // Cost 4, the least bcrypt allows: tests need no slow hashes.
            let hash = bcrypt::hash(password, 4).expect("bcrypt");
            std::fs::write(dir.join("htpasswd"), format!("{user}:{hash}\n"))
                .expect("write htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: wasmwatch-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        std::fs::write(dir.join("config.yml"), config).expect("write the registry config");
        let mut registry = Registry {
            port,
            tls: tls.is_some(),
            dir,
            child: None,
        };
        registry.resume();
        registry
    }

    /// Starts it again after [`Registry::stop`], on the same port with the
    /// same content.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the registry is running");
        let log = std::fs::File::create(self.dir.join("registry.log")).expect("registry log");
        let child = Command::new(binary("docker-registry", &["/usr/bin"]))
            .arg("serve")
            .arg(self.dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.version_check() {
                assert!(
                    status == 200 || status == 401,
                    "the registry answers /v2/ with {status}"
                );
                return;
            }
            if let Some(exit) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("docker-registry exited ({exit}): {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("docker-registry did not answer within 20 s: {}", self.log());
    }

    /// The HTTP status of `GET /v2/`, if it answers.
    /// (With TLS: 200 once it accepts connections; the check does not speak TLS.)
    fn version_check(&self) -> Option<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        if self.tls {
            return Some(200);
        }
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    }

    /// Kills it (the content stays for [`Registry::resume`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `127.0.0.1:PORT`, as written in references and `--insecure-registry`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `oci://127.0.0.1:PORT/REPOSITORY_AND_TAG`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.host())
    }

    /// The registry's storage folder.
    pub fn storage(&self) -> PathBuf {
        self.dir.join("storage")
    }

    /// What the registry logged (requests included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// Its folder (config, log, storage).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a [`FakeRegistry`] does wrong.
#[derive(Debug, Clone)]
pub enum Misbehaviour {
    /// Nothing: it serves the artifact as a registry would.
    None,
    /// The manifest's layer lists these `urls`, and the blob answers 404
    /// (as a "non-distributable" layer would have it).
    LayerUrls(Vec<String>),
    /// The manifest (with its Content-Length) one byte per interval.
    DribbleManifest(Duration),
    /// Accepts connections and reads requests, never answers.
    Silent,
    /// The manifest request answers 500 with a body of this many bytes:
    /// lines that look like wasmwatch's own log lines.
    HugeError(usize),
    /// A manifest of this many bytes (a valid start, then padding), with or
    /// without a Content-Length (without: the body ends when the
    /// connection closes).
    HugeManifest { bytes: usize, content_length: bool },
}

/// A registry on loopback that misbehaves as told, where the real one
/// cannot: plain HTTP/1.1 on a free port of 127.0.0.1, serving one Wasm
/// artifact (manifest and blob) under any repository and tag. It records
/// the requests it gets and how many body bytes it managed to send.
pub struct FakeRegistry {
    server: Server,
    blob: Vec<u8>,
}

/// A loopback HTTP listener that records whether anyone came (the target
/// of a layer's `urls`); it answers every request with its body.
pub struct Witness {
    server: Server,
}

/// One answer, written by a connection thread.
enum Answer {
    Full {
        status: &'static str,
        content_type: &'static str,
        body: Vec<u8>,
    },
    Dribble(Vec<u8>, Duration),
    Silence,
    Generated {
        status: &'static str,
        line: fn(usize) -> String,
        start: Vec<u8>,
        bytes: usize,
        content_length: bool,
    },
}

type Route = dyn Fn(&str, &str) -> Answer + Send + Sync;

struct ServerState {
    requests: std::sync::Mutex<Vec<String>>,
    body_bytes: std::sync::atomic::AtomicU64,
    stop: std::sync::atomic::AtomicBool,
}

struct Server {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<ServerState>,
}

impl Server {
    fn start(route: Box<Route>) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let state = std::sync::Arc::new(ServerState {
            requests: Default::default(),
            body_bytes: Default::default(),
            stop: Default::default(),
        });
        let route: std::sync::Arc<Route> = std::sync::Arc::from(route);
        let s = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (s, route) = (s.clone(), route.clone());
                std::thread::spawn(move || serve_connection(stream, &s, &*route));
            }
        });
        Server { addr, state }
    }

    fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    fn body_bytes(&self) -> u64 {
        self.state
            .body_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.state
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves requests on one connection (keep-alive) until the client goes
/// or the server stops.
fn serve_connection(mut stream: TcpStream, state: &ServerState, route: &Route) {
    let stopped = || state.stop.load(std::sync::atomic::Ordering::Relaxed);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if stopped() {
                        return;
                    }
                }
                Err(_) => return,
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let mut words = head.split_whitespace();
        let (method, path) = (
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
        );
        state
            .requests
            .lock()
            .unwrap()
            .push(format!("{method} {path}"));
        let count = |n: usize| {
            state
                .body_bytes
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        };
        match route(&method, &path) {
            Answer::Full {
                status,
                content_type,
                body,
            } => {
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let body = if method == "HEAD" { &[][..] } else { &body[..] };
                if stream.write_all(body).is_err() {
                    return;
                }
                count(body.len());
            }
            Answer::Dribble(body, every) => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                     Content-Length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for byte in body {
                    std::thread::sleep(every);
                    if stopped() || stream.write_all(&[byte]).is_err() {
                        return;
                    }
                    count(1);
                }
            }
            Answer::Silence => {
                while !stopped() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return;
            }
            Answer::Generated {
                status,
                line,
                start,
                bytes,
                content_length,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
                );
                if content_length {
                    head.push_str(&format!("Content-Length: {bytes}\r\n\r\n"));
                } else {
                    head.push_str("Connection: close\r\n\r\n");
                }
                if stream.write_all(head.as_bytes()).is_err() || stream.write_all(&start).is_err() {
                    return;
                }
                count(start.len());
                let mut sent = start.len();
                let mut n = 0;
                let mut chunk = Vec::with_capacity(64 << 10);
                while sent < bytes && !stopped() {
                    chunk.clear();
                    while chunk.len() < 64 << 10 {
                        chunk.extend_from_slice(line(n).as_bytes());
                        n += 1;
                    }
                    chunk.truncate(bytes - sent);
                    if stream.write_all(&chunk).is_err() {
                        return;
                    }
                    sent += chunk.len();
                    count(chunk.len());
                }
                if !content_length {
                    return;
                }
            }
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

impl FakeRegistry {
    /// Serves `blob` as the one `application/wasm` layer of an artifact
    /// under every repository and tag, misbehaving as told.
    pub fn start(misbehaviour: Misbehaviour, blob: Vec<u8>) -> FakeRegistry {
        let config = b"{}".to_vec();
        let mut layer = serde_json::json!({
            "mediaType": "application/wasm",
            "digest": format!("sha256:{}", sha256_hex(&blob)),
            "size": blob.len(),
        });
        if let Misbehaviour::LayerUrls(urls) = &misbehaviour {
            layer["urls"] = serde_json::json!(urls);
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.wasm.config.v0+json",
                "digest": format!("sha256:{}", sha256_hex(&config)),
                "size": config.len(),
            },
            "layers": [layer],
        }))
        .expect("JSON");
        let blob_path = format!("/blobs/sha256:{}", sha256_hex(&blob));
        let (served_blob, served_config) = (blob.clone(), config);
        let route = move |_method: &str, path: &str| -> Answer {
            let ok = |content_type, body| Answer::Full {
                status: "200 OK",
                content_type,
                body,
            };
            let not_found = Answer::Full {
                status: "404 Not Found",
                content_type: "application/json",
                body:
                    br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#
                        .to_vec(),
            };
            if matches!(misbehaviour, Misbehaviour::Silent) {
                return Answer::Silence;
            }
            if path == "/v2/" {
                return ok("application/json", b"{}".to_vec());
            }
            if path.contains("/manifests/") {
                return match &misbehaviour {
                    Misbehaviour::DribbleManifest(every) => {
                        Answer::Dribble(manifest.clone(), *every)
                    }
                    Misbehaviour::HugeError(bytes) => Answer::Generated {
                        status: "500 Internal Server Error",
                        line: |n| {
                            format!(
                                "\n2026-01-01T00:00:00.000000Z ERROR wasmwatch: forged line {n}: plugin http-refresh: ok"
                            )
                        },
                        start: b"oops".to_vec(),
                        bytes: *bytes,
                        content_length: true,
                    },
                    Misbehaviour::HugeManifest {
                        bytes,
                        content_length,
                    } => Answer::Generated {
                        status: "200 OK",
                        line: |_| " ".repeat(64),
                        start: br#"{"schemaVersion":2,"layers":[],"padding":"#.to_vec(),
                        bytes: *bytes,
                        content_length: *content_length,
                    },
                    _ => ok(
                        "application/vnd.oci.image.manifest.v1+json",
                        manifest.clone(),
                    ),
                };
            }
            if path.ends_with(&blob_path) && !matches!(misbehaviour, Misbehaviour::LayerUrls(_)) {
                return ok("application/octet-stream", served_blob.clone());
            }
            if path.contains("/blobs/sha256:") && path.ends_with(&sha256_hex(&served_config)) {
                return ok("application/vnd.wasm.config.v0+json", served_config.clone());
            }
            not_found
        };
        FakeRegistry {
            server: Server::start(Box::new(route)),
            blob,
        }
    }

    /// `127.0.0.1:PORT`, as written in references and `--insecure-registry`.
    pub fn host(&self) -> String {
        self.server.addr.to_string()
    }

    /// `oci://127.0.0.1:PORT/REPOSITORY_AND_TAG`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.host())
    }

    /// The sha256 of the served component: the manifest's pin.
    pub fn sha256(&self) -> String {
        sha256_hex(&self.blob)
    }

    /// `METHOD path` of each request so far.
    pub fn requests(&self) -> Vec<String> {
        self.server.requests()
    }

    /// How many body bytes it has managed to send (a client that stops
    /// reading leaves a huge body unsent).
    pub fn body_bytes_sent(&self) -> u64 {
        self.server.body_bytes()
    }
}

impl Witness {
    /// A listener answering every request 200 with `body`.
    pub fn start(body: Vec<u8>) -> Witness {
        let route = move |_: &str, _: &str| Answer::Full {
            status: "200 OK",
            content_type: "application/octet-stream",
            body: body.clone(),
        };
        Witness {
            server: Server::start(Box::new(route)),
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    /// `METHOD path` of each request it got.
    pub fn requests(&self) -> Vec<String> {
        self.server.requests()
    }
}
