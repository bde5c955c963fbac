//! An OCI registry on loopback for tests: the CNCF distribution registry
//! (Debian's `docker-registry`, which `tests/prepare` installs), one per
//! [`Registry`], on a free port of 127.0.0.1 with its storage in a fresh
//! folder, plain HTTP or TLS (certificates from the caller), optionally with
//! basic auth (an htpasswd file with a bcrypt hash made here). Killed and
//! its folder removed on drop.
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
